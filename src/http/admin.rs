//! `POST /admin/drain` (role `admin`): start the same drain as SIGTERM, so a deploy
//! pipeline can announce a restart ahead of it. The process exits when the drain completes.
//!
//! Like every state-changing route it needs `Content-Type: application/json`: a browser
//! sends that cross-site only after a CORS preflight, which sendgate never answers, so a
//! page cannot drain a gateway running open on loopback with a form post.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::auth::Permission;
use super::errors::{ApiError, Problem};
use super::{authorize, AppState, RequestContext};

pub async fn drain(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(
        &req,
        &context,
        &state,
        Permission::Administer,
        "drain the gateway",
    )?;
    if !super::send::is_json(&req) {
        return Err(context.error(Problem::UnsupportedMediaType));
    }
    let started_now = state.lifecycle.begin_drain(state.drain_window);
    if started_now {
        tracing::info!(event = "drain_requested", by = %principal.name, "drain requested over HTTP");
    }
    let status = state.lifecycle.drain_status();
    Ok(HttpResponse::Accepted().json(json!({
        "status": "draining",
        "gateway_state": state.lifecycle.state().as_str(),
        "already_draining": !started_now,
        "remaining_s": status.map(|d| (d.remaining.as_secs_f64() * 10.0).round() / 10.0),
        "in_flight": status.map(|d| d.in_flight),
        "request_id": context.id().as_str(),
    })))
}
