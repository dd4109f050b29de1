//! `/health/live`, `/health/ready` and `/health/detailed`.
//!
//! None of them touches the broker: they report what the gateway already knows (the
//! lifecycle, each queue's last depth read and streak), so a probe can never hold a send's
//! slot or keep a failing request path looking healthy.

use std::collections::BTreeMap;
use std::time::SystemTime;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::auth::Permission;
use super::context::RequestContext;
use super::errors::ApiError;
use super::schema;
use super::state::{authorize, AppState};
use crate::admission::breaker::BreakerState;
use crate::admission::drain::DrainRate;
use crate::admission::fair::tally::{Reason, WINDOW_S};
use crate::admission::fair::TenantView;
use crate::admission::{BackendRole, Dispatcher, Lane};
use crate::config::OverridesLapse;
use crate::coordination::Coordination;
use crate::lifecycle::{GatewayState, NotAdmitting};
use crate::settings::overrides::Key;
use crate::settings::{default_value, RuntimeSettings};
use sendgate_wire::{Drain, ErrorBody};

/// `GET /health/live`'s body.
#[derive(Serialize, ToSchema)]
pub struct Live {
    #[schema(schema_with = schema::word_ok)]
    status: &'static str,
}

/// `GET /health/ready`'s body when running (fields alphabetical, as before it was typed).
#[derive(Serialize, ToSchema)]
pub struct Ready {
    /// Always `running` here; otherwise the answer is a 503.
    gateway_state: GatewayState,
    #[schema(schema_with = schema::word_ready)]
    status: &'static str,
}

#[utoipa::path(
    get,
    path = "/health/live",
    tag = "health",
    operation_id = "live",
    summary = "The process serves HTTP",
    security(()),
    responses(
        (status = 200, description = "Always, while the process serves HTTP.", body = Live),
        (status = 403, description = "`forbidden_host` (open mode, a Host that is not loopback).", body = ErrorBody),
    )
)]
pub async fn live() -> HttpResponse {
    HttpResponse::Ok().json(Live { status: "ok" })
}

#[utoipa::path(
    get,
    path = "/health/ready",
    tag = "health",
    operation_id = "ready",
    summary = "The gateway admits sends (state `running`)",
    security(()),
    responses(
        (status = 200, description = "Running.", body = Ready),
        (status = 403, description = "`forbidden_host` (open mode, a Host that is not loopback).", body = ErrorBody),
        (status = 503, description = "`starting`, or `draining` (with `retry_after_s`).", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds, at least 1: the drain window left, or 1 while starting."))),
    )
)]
pub async fn ready(
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let gateway_state = state.lifecycle.state();
    if gateway_state == GatewayState::Running {
        return Ok(HttpResponse::Ok().json(Ready {
            gateway_state,
            status: "ready",
        }));
    }
    let why = match gateway_state {
        GatewayState::Starting => NotAdmitting::Starting,
        _ => NotAdmitting::Draining {
            retry_after: state.lifecycle.drain_retry_after(),
        },
    };
    Err(context.error(why.into()))
}

/// `GET /health/detailed`'s body.
#[derive(Serialize, ToSchema)]
pub struct Detailed {
    /// `degraded` when not running, a depth read is failing, the primary's breaker is
    /// not closed, or its store's writes fail.
    #[schema(schema_with = schema::health_status)]
    status: &'static str,
    gateway_state: GatewayState,
    version: &'static str,
    pid: u32,
    /// `null` unless draining.
    drain: Option<Drain>,
    /// The primary's capacity state, by queue.
    queues: BTreeMap<String, QueueHealth>,
    /// `primary`, and `fallback` when one is configured.
    #[schema(schema_with = schema::backends)]
    backends: BTreeMap<&'static str, BackendHealth>,
    /// Whether this replica shares the ceiling with the fleet right now.
    coordination: CoordinationState,
    /// The runtime settings (`/admin/settings`): where they are kept and what is overridden.
    settings: SettingsState,
}

#[derive(Serialize, ToSchema)]
pub struct SettingsState {
    /// `file` (local mode: `SENDGATE_DATA_DIR/settings.json`) or `redis` (fleet mode).
    #[schema(schema_with = schema::settings_store)]
    store: &'static str,
    /// `false` while the fleet's hash cannot be read: this replica keeps the overrides it
    /// last saw.
    ok: bool,
    last_error: Option<String>,
    /// `SENDGATE_OVERRIDES_LAPSE`: `config_change` (an override lapses at the first start-up
    /// with another value of its variable) or `never`.
    #[schema(schema_with = schema::overrides_lapse)]
    lapse: &'static str,
    /// Every value overridden at runtime, by setting (`queues.{queue}.{field}`,
    /// `force_backend`): its value, the variable it overrides, the variable's value now and
    /// when it was made, the key that set it and when.
    overridden: BTreeMap<String, OverriddenValue>,
    /// The overrides this start-up dropped because their variable's value had changed.
    lapsed: BTreeMap<String, LapsedValue>,
}

/// What `/health/detailed` says of the overrides: `setting → {value, variable, configured,
/// made_against, differs, by, at}`.
fn overridden(
    settings: &RuntimeSettings,
    dispatcher: &Dispatcher,
) -> BTreeMap<String, OverriddenValue> {
    settings
        .overrides()
        .to_flat()
        .into_iter()
        .filter_map(|(name, stored)| {
            let key = Key::parse_flat(&name)?;
            let configured = default_value(&key, dispatcher);
            Some((
                name,
                OverriddenValue {
                    differs: stored.value != configured,
                    value: stored.value,
                    variable: key.variable().name,
                    configured,
                    made_against: stored.configured,
                    by: stored.by,
                    at: stored.at,
                },
            ))
        })
        .collect()
}

fn lapsed(settings: &RuntimeSettings) -> BTreeMap<String, LapsedValue> {
    settings
        .lapsed()
        .into_iter()
        .map(|l| {
            (
                l.key.flat(),
                LapsedValue {
                    value: l.value,
                    variable: l.key.variable().name,
                    configured: l.configured,
                    made_against: l.stamp.configured.unwrap_or(Value::Null),
                    by: l.stamp.by,
                    at: l.stamp.at,
                },
            )
        })
        .collect()
}

/// One override dropped at start-up on `/health/detailed`.
#[derive(Serialize, ToSchema)]
pub struct LapsedValue {
    /// The override's value.
    value: Value,
    variable: &'static str,
    /// The variable's value now.
    configured: Value,
    /// The variable's value when the override was made.
    made_against: Value,
    by: String,
    #[schema(format = DateTime)]
    at: String,
}

/// One overridden value on `/health/detailed`.
#[derive(Serialize, ToSchema)]
pub struct OverriddenValue {
    value: Value,
    /// The variable it overrides.
    variable: &'static str,
    /// The variable's value now: what removing the override restores.
    configured: Value,
    /// Whether the override's value differs from `configured`.
    differs: bool,
    /// The variable's value when the override was made (`null` when stored by a build that
    /// did not keep it: such an override never lapses).
    made_against: Option<Value>,
    /// The API key's name that set it (`anonymous` without keys).
    by: String,
    /// RFC 3339.
    #[schema(format = DateTime)]
    at: String,
}

#[derive(Serialize, ToSchema)]
pub struct CoordinationState {
    /// `redis` while the replica shares the fleet's ceiling; `local` while it keeps its own
    /// (configured so, or Redis not answering).
    #[schema(schema_with = schema::coordination_mode)]
    mode: &'static str,
    /// `false` while Redis is configured but not answering (the replica runs local).
    ok: bool,
    /// When the current mode began. RFC 3339.
    #[schema(format = DateTime)]
    since: Option<String>,
    /// Why the replica is local: the last failed Redis call. `null` while in the fleet.
    last_error: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct QueueHealth {
    /// The backlog the ceiling decides by: the last depth read plus the sends counted since
    /// (in a fleet, the fleet's estimate); `null` before the first good read.
    backlog: Option<u64>,
    /// The last good depth read itself (in a fleet, the fleet's read in force); `null`
    /// before the first (in a fleet, while the fleet's read is not a good one).
    depth_read: Option<DepthReadHealth>,
    limit: u64,
    consecutive_failures: u32,
    /// Refusing now: the gate is on and the streak is at its threshold with the backlog unknown.
    fail_closed: bool,
    /// RFC 3339.
    #[schema(format = DateTime)]
    last_read_ok_at: Option<String>,
    /// Messages a second the queue's consumers were measured to take (smoothed over
    /// successive depth reads); `null` until drain has been observed.
    #[schema(minimum = 0)]
    drain_rate_per_s: Option<f64>,
    /// While the queue refuses at its ceiling: the backlog at or below which sends are
    /// admitted again (`SENDGATE_RESUME_BELOW` × `limit`, at most `limit` − 1); `null` otherwise.
    refusing_until_backlog: Option<u64>,
    /// The fail-closed gate is on (`SERVICEBUS_SEND_FAILCLOSED`), refusing or not.
    fail_closed_enabled: bool,
    /// The streak at which the gate, when on, refuses (`SERVICEBUS_SEND_FAILCLOSED_STREAK`).
    #[schema(minimum = 1)]
    streak_threshold: u32,
    /// The places promised to producers refused for room, outstanding (contract section 2,
    /// "Claiming a place"); `null` in a fleet, where none is kept.
    promised: Option<PromisedHealth>,
    /// Each tenant this queue has answered since start-up (the keys file's tenants; open
    /// mode: the one tenant `open`), in the keys file's order; empty before any send.
    tenants: Vec<TenantHealth>,
}

/// The places a queue's gate promised and has not seen claimed nor lapse.
#[derive(Serialize, ToSchema)]
pub struct PromisedHealth {
    /// Promises outstanding (at most 65,536).
    promises: u64,
    /// Their units: room a fresh send leaves them, at most half the ceiling.
    units: u64,
}

/// A depth read as the admin plane answered it.
#[derive(Serialize, ToSchema)]
pub struct DepthReadHealth {
    /// The backlog it showed.
    backlog: u64,
    /// Seconds since it was made, to a thousandth.
    #[schema(minimum = 0)]
    age_s: f64,
}

/// One tenant of a queue: its rates over the last 10 seconds (the current one included),
/// in units (a batch's entries) a second, to a tenth.
#[derive(Serialize, ToSchema)]
pub struct TenantHealth {
    /// The tenant's name (the keys file's `tenant`, or the key's name).
    name: String,
    #[schema(minimum = 1, maximum = 1000)]
    weight: u32,
    /// Its part of the room this round offers, as the share rule computes it now (0–1;
    /// 0 when it has not asked in this round or the last).
    #[schema(minimum = 0, maximum = 1)]
    share: f64,
    #[schema(minimum = 0)]
    admitted_per_s: f64,
    /// By reason: `queue_full` (the ceiling), `criticality`, `tenant_share`, `tenant_quota`.
    refused_per_s: BTreeMap<&'static str, f64>,
    /// `SENDGATE_FAIR_SHARE=shadow`: what would have been refused, by reason
    /// (`criticality`, `tenant_share`), and was admitted (it is in `admitted_per_s`).
    would_refuse_per_s: BTreeMap<&'static str, f64>,
}

impl TenantHealth {
    fn of(view: TenantView) -> Self {
        let rates = &view.counts.per_s;
        Self {
            name: view.tenant.name,
            weight: view.tenant.weight,
            share: (view.share.clamp(0.0, 1.0) * 1000.0).round() / 1000.0,
            admitted_per_s: rates.admitted,
            refused_per_s: Reason::ALL
                .into_iter()
                .map(|r| (r.as_str(), rates.refused(r)))
                .collect(),
            would_refuse_per_s: Reason::shadowed()
                .map(|r| (r.as_str(), rates.would_refuse(r)))
                .collect(),
        }
    }
}

// The schema's words say 10 seconds: keep them true.
const _: () = assert!(WINDOW_S == 10);

#[derive(Serialize, ToSchema)]
pub struct BackendHealth {
    #[schema(schema_with = schema::backend_kind)]
    kind: &'static str,
    #[schema(schema_with = schema::breaker_state)]
    breaker: &'static str,
    sends_in_flight: usize,
    max_in_flight: usize,
    /// Held open by an operator (`POST /admin/breakers/{backend}`): no trial until closed.
    held: bool,
    /// The last health probe of the admin plane; it never moves the breaker.
    probe: Option<Probe>,
    /// Seconds until the open breaker lets a trial send through (0: the next send is one);
    /// `null` unless the breaker is `open`.
    #[schema(minimum = 0)]
    next_trial_in_s: Option<f64>,
    /// The fallback's own per-queue capacity (the primary's is the top-level `queues`).
    #[serde(skip_serializing_if = "Option::is_none")]
    queues: Option<BTreeMap<String, QueueHealth>>,
    /// How far this backend's admin plane may trail its data plane, as in force now (ms):
    /// sends completed this long before a depth read are counted on top of it. Absent when
    /// the depth is exact (embedded, RabbitMQ's `amqp` depth source).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    depth_lag_ms: Option<u64>,
    /// Where `depth_lag_ms` comes from (described in `schema::depth_lag_source`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = schema::depth_lag_source)]
    depth_lag_source: Option<&'static str>,
    /// The embedded store's writes (absent for a broker): failing while a commit fails
    /// (a full disk: sends are `503 backend_busy`), back at the next one that goes through.
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<StoreState>,
}

/// The embedded store, as its last commit left it.
#[derive(Serialize, ToSchema)]
pub struct StoreState {
    ok: bool,
    /// Why the last commit failed; `null` while `ok`.
    error: Option<String>,
    /// When the current state began (the first failure of a run, or the commit after it).
    /// RFC 3339.
    #[schema(format = DateTime)]
    since: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Probe {
    ok: bool,
    /// RFC 3339.
    #[schema(format = DateTime)]
    at: Option<String>,
    error: Option<String>,
}

#[utoipa::path(
    get,
    path = "/health/detailed",
    tag = "health",
    operation_id = "detailed",
    summary = "Lifecycle, capacity and backends, as the gateway last saw them (role observer or admin)",
    responses(
        (status = 200, description = "The gateway's view; never calls the broker.", body = Detailed),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the role), or `forbidden_host` (open mode).", body = ErrorBody),
    )
)]
pub async fn detailed(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(
        &req,
        &context,
        &state.edge.auth,
        Permission::Observe,
        "read the gateway's health",
    )
    .await?;
    Ok(HttpResponse::Ok().json(snapshot(&state)))
}

/// What `/health/detailed` answers, without asking who is asking: the status page renders
/// it on the server in open mode (http/console), where any caller may read it.
pub(super) fn snapshot(state: &AppState) -> Detailed {
    let gateway_state = state.lifecycle.state();
    let queues = queues_of(state.dispatcher.primary());
    let mut degraded = gateway_state != GatewayState::Running
        || queues.values().any(|q| q.consecutive_failures > 0);
    let mut backends = BTreeMap::new();
    for lane in state.dispatcher.lanes() {
        let health = backend_health(lane, &state.dispatcher);
        degraded |= lane.role == BackendRole::Primary
            && (health.breaker != BreakerState::Closed.as_str()
                || health.store.as_ref().is_some_and(|s| !s.ok));
        backends.insert(lane.role.as_str(), health);
    }
    let coordination = coordination_of(&state.control.coordination);
    degraded |= !coordination.ok;
    let runtime = &state.control.settings;
    let store = runtime.health();
    let settings = SettingsState {
        store: runtime.store_kind(),
        ok: store.ok,
        last_error: store.last_error,
        lapse: match runtime.lapse() {
            OverridesLapse::ConfigChange => "config_change",
            OverridesLapse::Never => "never",
        },
        overridden: overridden(runtime, &state.dispatcher),
        lapsed: lapsed(runtime),
    };
    let drain = state.lifecycle.drain_status().map(|d| Drain {
        remaining_s: (d.remaining.as_secs_f64() * 10.0).round() / 10.0,
        in_flight: d.in_flight,
        linger_remaining_s: (d.linger_remaining.as_secs_f64() * 10.0).round() / 10.0,
    });
    Detailed {
        status: if degraded { "degraded" } else { "ok" },
        gateway_state,
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        drain,
        queues,
        backends,
        coordination,
        settings,
    }
}

fn coordination_of(coordination: &Coordination) -> CoordinationState {
    let h = coordination.health();
    CoordinationState {
        mode: h.mode,
        ok: h.ok,
        since: rfc3339(h.since),
        last_error: h.last_error,
    }
}

/// Each queue's capacity state on `lane`, as its gate last saw it.
fn queues_of(lane: &Lane) -> BTreeMap<String, QueueHealth> {
    lane.gates()
        .map(|gate| {
            let s = gate.snapshot();
            let policy = gate.policy();
            let health = QueueHealth {
                backlog: s.backlog,
                depth_read: s.depth_read.map(|read| DepthReadHealth {
                    backlog: read.backlog,
                    age_s: (read.age.as_secs_f64() * 1000.0).round() / 1000.0,
                }),
                limit: s.limit,
                consecutive_failures: s.consecutive_failures,
                fail_closed: s.fail_closed,
                last_read_ok_at: s.last_read_ok_at.and_then(rfc3339),
                drain_rate_per_s: s.drain_rate.map(DrainRate::rounded),
                refusing_until_backlog: s.refusing_until_backlog,
                fail_closed_enabled: policy.fail_closed,
                streak_threshold: policy.streak_threshold,
                promised: gate.promised().map(|p| PromisedHealth {
                    promises: p.promises,
                    units: p.units,
                }),
                tenants: gate.tenants(&s).into_iter().map(TenantHealth::of).collect(),
            };
            (gate.queue().to_string(), health)
        })
        .collect()
}

fn backend_health(lane: &Lane, dispatcher: &Dispatcher) -> BackendHealth {
    let in_flight = dispatcher.in_flight();
    let breaker = lane.breaker.state();
    let lag = lane.backend().depth_lag_in_force();
    BackendHealth {
        kind: lane.kind(),
        breaker: breaker.as_str(),
        held: lane.breaker.held(),
        sends_in_flight: in_flight.current(),
        max_in_flight: in_flight.max(),
        probe: lane.last_probe().map(|p| Probe {
            ok: p.ok,
            at: rfc3339(p.at),
            error: p.error,
        }),
        next_trial_in_s: (breaker == BreakerState::Open && !lane.breaker.held())
            .then(|| (lane.breaker.retry_after().as_secs_f64() * 10.0).round() / 10.0),
        queues: (lane.role == BackendRole::Fallback).then(|| queues_of(lane)),
        depth_lag_ms: lag.map(|l| u64::try_from(l.lag.as_millis()).unwrap_or(u64::MAX)),
        depth_lag_source: lag.map(|l| l.source.as_str()),
        store: lane.backend().store_health().map(|s| StoreState {
            ok: s.ok,
            error: s.error,
            since: rfc3339(s.since),
        }),
    }
}

fn rfc3339(t: SystemTime) -> Option<String> {
    OffsetDateTime::from(t).format(&Rfc3339).ok()
}
