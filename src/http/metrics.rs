//! `GET /metrics`: the Prometheus exposition that `crate::metrics` renders. Like the health
//! routes, it reads state the gateway already holds and never calls the broker.

use actix_web::{web, HttpRequest, HttpResponse};

use super::auth::Permission;
use super::errors::ApiError;
use super::{authorize, AppState, RequestContext};

/// `GET /metrics`: Prometheus text (role `observer` or `admin` when keys are on).
pub async fn metrics(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &context, &state, Permission::Observe, "read metrics")?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render(&state.dispatcher, &state.lifecycle)))
}
