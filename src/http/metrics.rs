//! `GET /metrics`: the Prometheus exposition that `crate::metrics` renders. Like the health
//! routes, it reads state the gateway already holds and never calls the broker. And
//! [`observe_send`], around the two send routes: what their answers took and the
//! `Retry-After` they gave, read off the answer as the client gets it.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::RETRY_AFTER;
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse};
use sendgate_wire::ErrorCode;

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

/// Around a send route (`route`: `message` or `batch`): each `POST`'s time from the route to
/// its answer, and the `Retry-After` a refusal gave, by its code (which `errors.rs` puts on
/// the answer it makes).
pub async fn observe_send<B: MessageBody>(
    route: &'static str,
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<B>, actix_web::Error> {
    let started = tokio::time::Instant::now();
    let sent = req.method() == Method::POST;
    let answer = next.call(req).await?;
    let Some(state) = answer
        .request()
        .app_data::<web::Data<AppState>>()
        .filter(|_| sent)
    else {
        return Ok(answer);
    };
    let queue = state
        .edge
        .queue_label(answer.request().match_info().get("queue").unwrap_or(""));
    let metrics = &state.observability.metrics;
    let response = answer.response();
    metrics.request_latency(queue, route, response.status().as_u16(), started.elapsed());
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let (Some(seconds), Some(code)) = (retry_after, response.extensions().get::<ErrorCode>()) {
        metrics.retry_after_given(queue, code.as_str(), seconds);
    }
    Ok(answer)
}
