//! `GET /metrics`: the Prometheus exposition that `crate::metrics` renders. Like the health
//! routes, it reads state the gateway already holds and never calls the broker.

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::Permission;
use super::context::RequestContext;
use super::errors::ApiError;
use super::state::{authorize, AppState};
use sendgate_wire::ErrorBody;

/// `GET /metrics`: Prometheus text (role `observer` or `admin` when keys are on).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "observability",
    operation_id = "metrics",
    summary = "Prometheus text exposition (role observer or admin)",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4.", body = String,
            content_type = "text/plain; version=0.0.4; charset=utf-8"),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the role), or `forbidden_host` (open mode).", body = ErrorBody),
    )
)]
pub async fn metrics(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(
        &req,
        &context,
        &state.edge.auth,
        Permission::Observe,
        "read metrics",
    )
    .await?;
    let observed = &state.observability;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(observed.metrics.render(
            &state.dispatcher,
            &state.lifecycle,
            &state.control.coordination,
            &observed.connections,
            observed.otel.as_deref().map(crate::otel::Otel::span_counts),
        )))
}
