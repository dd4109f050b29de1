//! The HTTP API: one file per route group, and the routing table that names them. What the
//! handlers share (the state, `authorize`, the request context, the errors) is in files of
//! its own, which they import without importing this one.

mod admin;
pub mod auth;
mod batch;
pub mod body_budget;
pub mod console;
pub mod context;
pub mod entra_auth;
pub mod errors;
mod fallback;
pub mod guard;
pub mod headers;
mod health;
mod metrics;
pub mod openapi;
mod otel;
pub mod ratelimit;
mod schema;
mod settings;
// Visible to the crate for `crate::fuzzing`, which parses send input as the handler does.
pub(crate) mod send;
pub mod state;

use actix_web::web;

pub use context::{RequestContext, RequestIdentity};
pub use state::AppState;

/// The routing table. Anything not listed is `404 not_found`, answered here without
/// touching the backend.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/v1/queues/{queue}/messages")
            .wrap(actix_web::middleware::from_fn(|req, next| {
                metrics::observe_send("message", req, next)
            }))
            .route(web::post().to(send::send_message))
            .default_service(web::to(fallback::only_post)),
    )
    .service(
        web::resource("/v1/queues/{queue}/messages/batch")
            .wrap(actix_web::middleware::from_fn(|req, next| {
                metrics::observe_send("batch", req, next)
            }))
            .route(web::post().to(batch::send_batch))
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
