//! `/health/live`, `/health/ready` and `/health/detailed`.
//!
//! None of them touches the broker: they report what the gateway already knows (the
//! lifecycle, each queue's last depth read and streak), so a probe can never hold a send's
//! slot or keep a failing request path looking healthy.

use std::collections::BTreeMap;
use std::time::SystemTime;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::json;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::auth::Permission;
use super::errors::ApiError;
use super::{authorize, AppState, RequestContext};
use crate::admission::breaker::BreakerState;
use crate::admission::{BackendRole, Lane};
use crate::lifecycle::{GatewayState, NotAdmitting};
use sendgate_wire::Drain;

pub async fn live() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn ready(
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let gateway_state = state.lifecycle.state();
    if gateway_state == GatewayState::Running {
        return Ok(HttpResponse::Ok()
            .json(json!({"status": "ready", "gateway_state": gateway_state.as_str()})));
    }
    let why = match gateway_state {
        GatewayState::Starting => NotAdmitting::Starting,
        _ => NotAdmitting::Draining {
            retry_after: state
                .lifecycle
                .drain_status()
                .map(|d| d.remaining)
                .unwrap_or_default(),
        },
    };
    Err(context.error(why.into()))
}

#[derive(Serialize)]
struct Detailed {
    status: &'static str,
    gateway_state: &'static str,
    version: &'static str,
    pid: u32,
    drain: Option<Drain>,
    queues: BTreeMap<String, QueueHealth>,
    backends: BTreeMap<&'static str, BackendHealth>,
}

#[derive(Serialize)]
struct QueueHealth {
    backlog: Option<u64>,
    limit: u64,
    consecutive_failures: u32,
    fail_closed: bool,
    last_read_ok_at: Option<String>,
}

#[derive(Serialize)]
struct BackendHealth {
    kind: &'static str,
    breaker: &'static str,
    sends_in_flight: usize,
    max_in_flight: usize,
    /// The last health probe of the admin plane; it never moves the breaker.
    probe: Option<Probe>,
    /// The fallback's own per-queue capacity (the primary's is the top-level `queues`).
    #[serde(skip_serializing_if = "Option::is_none")]
    queues: Option<BTreeMap<String, QueueHealth>>,
}

#[derive(Serialize)]
struct Probe {
    ok: bool,
    at: Option<String>,
    error: Option<String>,
}

pub async fn detailed(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(
        &req,
        &context,
        &state,
        Permission::Observe,
        "read the gateway's health",
    )?;

    let gateway_state = state.lifecycle.state();
    let queues = queues_of(state.dispatcher.primary());
    let mut degraded = gateway_state != GatewayState::Running
        || queues.values().any(|q| q.consecutive_failures > 0);
    let mut backends = BTreeMap::new();
    for route in state.dispatcher.lanes() {
        let health = backend_health(route, &state);
        degraded |=
            route.role == BackendRole::Primary && health.breaker != BreakerState::Closed.as_str();
        backends.insert(route.role.as_str(), health);
    }
    let drain = state.lifecycle.drain_status().map(|d| Drain {
        remaining_s: (d.remaining.as_secs_f64() * 10.0).round() / 10.0,
        in_flight: d.in_flight,
    });
    Ok(HttpResponse::Ok().json(Detailed {
        status: if degraded { "degraded" } else { "ok" },
        gateway_state: gateway_state.as_str(),
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        drain,
        queues,
        backends,
    }))
}

/// Each queue's capacity state on `route`, as its gate last saw it.
fn queues_of(route: &Lane) -> BTreeMap<String, QueueHealth> {
    route
        .gates()
        .map(|gate| {
            let s = gate.snapshot();
            let health = QueueHealth {
                backlog: s.backlog,
                limit: s.limit,
                consecutive_failures: s.consecutive_failures,
                fail_closed: s.fail_closed,
                last_read_ok_at: s.last_read_ok_at.and_then(rfc3339),
            };
            (gate.queue().to_string(), health)
        })
        .collect()
}

fn backend_health(route: &Lane, state: &AppState) -> BackendHealth {
    let in_flight = state.dispatcher.in_flight();
    BackendHealth {
        kind: route.kind(),
        breaker: route.breaker.state().as_str(),
        sends_in_flight: in_flight.current(),
        max_in_flight: in_flight.max(),
        probe: route.last_probe().map(|p| Probe {
            ok: p.ok,
            at: rfc3339(p.at),
            error: p.error,
        }),
        queues: (route.role == BackendRole::Fallback).then(|| queues_of(route)),
    }
}

fn rfc3339(t: SystemTime) -> Option<String> {
    OffsetDateTime::from(t).format(&Rfc3339).ok()
}
