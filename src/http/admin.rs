//! `POST /admin/drain` (role `admin`): start the same drain as SIGTERM, so a deploy
//! pipeline can announce a restart ahead of it. The process exits when the drain completes.
//!
//! Like every state-changing route it needs `Content-Type: application/json`: a browser
//! sends that cross-site only after a CORS preflight, which sendgate never answers, so a
//! page cannot drain a gateway running open on loopback with a form post.

use actix_web::{web, HttpRequest, HttpResponse};
use sendgate_wire::{ErrorBody, GatewayState};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::Permission;
use super::context::RequestContext;
use super::errors::{ApiError, Problem};
use super::schema;
use super::state::{authorize, AppState};

/// `202 Accepted`: the drain has begun (or was already under way). Fields in alphabetical
/// order, as the untyped map this replaced wrote them.
#[derive(Serialize, ToSchema)]
pub struct DrainStarted<'a> {
    /// This request did not start the drain: one was already under way.
    already_draining: bool,
    gateway_state: GatewayState,
    /// Sends admitted before the drain and not yet finished (`null` once it has ended).
    in_flight: Option<usize>,
    /// Seconds left in the drain window, to a tenth (`null` once it has ended).
    remaining_s: Option<f64>,
    request_id: &'a str,
    #[schema(schema_with = schema::word_draining)]
    status: &'static str,
}

#[utoipa::path(
    post,
    path = "/admin/drain",
    tag = "admin",
    operation_id = "drain",
    summary = "Start the same drain as SIGTERM (role admin); the process exits when it completes",
    request_body(
        description = "Ignored; the content type must be application/json (a browser cannot send that cross-site without a CORS preflight).",
        content = serde_json::Value,
        content_type = "application/json",
    ),
    responses(
        (status = 202, description = "Draining.", body = DrainStarted),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the admin role, or its scope is not every queue: a drain stops them all), or `forbidden_host` (open mode).", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not `application/json` (checked after authentication).", body = ErrorBody),
    )
)]
pub async fn drain(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(
        &req,
        &context,
        &state.edge.auth,
        Permission::Administer,
        "drain the gateway",
    )
    .await?;
    if !principal.may_use_every_queue() {
        return Err(context.error(Problem::Forbidden {
            action: "drain the gateway (it stops every queue; this key's scope is not every queue)",
        }));
    }
    if !super::send::is_json(&req) {
        return Err(context.error(Problem::UnsupportedMediaType));
    }
    let started_now = state.lifecycle.begin_drain(state.control.drain_window);
    if started_now {
        tracing::info!(event = "drain_requested", by = %principal.name, "drain requested over HTTP");
    }
    let status = state.lifecycle.drain_status();
    Ok(HttpResponse::Accepted().json(DrainStarted {
        already_draining: !started_now,
        gateway_state: state.lifecycle.state(),
        in_flight: status.map(|d| d.in_flight),
        remaining_s: status.map(|d| (d.remaining.as_secs_f64() * 10.0).round() / 10.0),
        request_id: context.id().as_str(),
        status: "draining",
    }))
}
