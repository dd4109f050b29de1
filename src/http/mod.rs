//! The HTTP API: one file per route group, the shared state, and the routing table.

mod admin;
pub mod auth;
pub mod body_budget;
pub mod console;
pub mod context;
pub mod errors;
mod fallback;
pub mod guard;
pub mod headers;
mod health;
mod metrics;
pub mod openapi;
mod settings;
// Visible to the crate for `crate::fuzzing`, which parses send input as the handler does.
pub(crate) mod send;

use std::collections::HashMap;

use actix_web::{web, HttpRequest};

use crate::admission::Dispatcher;
use crate::domain::QueueName;
use crate::lifecycle::Lifecycle;
use auth::Authenticator;
pub use context::{RequestContext, RequestIdentity};

/// What every handler can reach.
pub struct AppState {
    pub dispatcher: Dispatcher,
    pub auth: Authenticator,
    pub lifecycle: Lifecycle,
    pub queues: HashMap<String, QueueName>,
    pub max_body_bytes: usize,
    /// The drain window `POST /admin/drain` opens (`SENDGATE_DRAIN_TIMEOUT_S`).
    pub drain_window: std::time::Duration,
    pub metrics: crate::metrics::Metrics,
    /// Longest a request body may take to arrive.
    pub body_timeout: std::time::Duration,
    /// Request bodies held in memory at once.
    pub body_budget: body_budget::BodyBudget,
    /// Alone, or sharing the ceiling with the fleet.
    pub coordination: crate::coordination::Coordination,
    /// The runtime overrides (`/admin/settings`) and where they are kept.
    pub settings: std::sync::Arc<crate::settings::RuntimeSettings>,
}

/// The routing table. Anything not listed is `404 not_found`, answered here without
/// touching the backend.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/v1/queues/{queue}/messages")
            .route(web::post().to(send::send_message))
            .default_service(web::to(fallback::only_post)),
    )
    .service(
        web::resource("/health/live")
            .route(web::get().to(health::live))
            .default_service(web::to(fallback::only_get)),
    )
    .service(
        web::resource("/health/ready")
            .route(web::get().to(health::ready))
            .default_service(web::to(fallback::only_get)),
    )
    .service(
        web::resource("/health/detailed")
            .route(web::get().to(health::detailed))
            .default_service(web::to(fallback::only_get)),
    )
    .service(
        web::resource("/metrics")
            .route(web::get().to(metrics::metrics))
            .default_service(web::to(fallback::only_get)),
    )
    .service(
        web::resource("/admin/drain")
            .route(web::post().to(admin::drain))
            .default_service(web::to(fallback::only_post)),
    )
    .service(
        web::resource("/admin/settings")
            .route(web::get().to(settings::get_settings))
            .route(web::patch().to(settings::patch_settings))
            .default_service(web::to(fallback::get_or_patch)),
    )
    .service(
        web::resource("/admin/breakers/{backend}")
            .route(web::post().to(settings::breaker))
            .default_service(web::to(fallback::only_post)),
    )
    .service(
        web::resource("/")
            .route(web::get().to(console::page))
            .default_service(web::to(fallback::only_get)),
    )
    .service(
        web::resource(console::SCRIPT_PATH)
            .route(web::get().to(console::script))
            .default_service(web::to(fallback::only_get)),
    )
    .service(
        web::resource(console::STYLE_PATH)
            .route(web::get().to(console::stylesheet))
            .default_service(web::to(fallback::only_get)),
    )
    .service(
        web::resource("/openapi.json")
            .route(web::get().to(openapi::openapi_json))
            .default_service(web::to(fallback::only_get)),
    )
    .default_service(web::to(fallback::not_found));
}

/// Authenticate the caller and check it may do `permission` (`action` names it in the 403).
/// Every protected route goes through here; the key's name goes on the request's log lines.
pub fn authorize(
    req: &HttpRequest,
    context: &RequestContext,
    state: &AppState,
    permission: auth::Permission,
    action: &'static str,
) -> Result<std::sync::Arc<auth::Principal>, errors::ApiError> {
    use errors::Problem;
    let principal = state.auth.authenticate(req).map_err(|e| {
        context.error(Problem::Unauthenticated {
            token_given: e == auth::AuthError::Unknown,
        })
    })?;
    context.record_key(&principal.name);
    if !principal.may(permission) {
        return Err(context.error(Problem::Forbidden { action }));
    }
    Ok(principal)
}
