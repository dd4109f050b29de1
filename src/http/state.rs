//! What every handler reaches: the application's state, and the one authorization check
//! every protected route goes through.

use std::collections::HashMap;

use actix_web::HttpRequest;

use super::auth::{self, Authenticator};
use super::body_budget::BodyBudget;
use super::context::RequestContext;
use super::errors::{ApiError, Problem};
use crate::admission::Dispatcher;
use crate::domain::QueueName;
use crate::lifecycle::Lifecycle;

/// What every handler can reach.
pub struct AppState {
    pub dispatcher: Dispatcher,
    pub auth: Authenticator,
    pub lifecycle: Lifecycle,
    pub queues: HashMap<String, QueueName>,
    pub max_body_bytes: usize,
    /// A batch send's limits: entries, and the request body's bytes.
    pub max_batch_messages: usize,
    pub max_batch_bytes: usize,
    /// Deepest nesting a send body may have.
    pub max_json_depth: usize,
    /// The drain window `POST /admin/drain` opens (`SENDGATE_DRAIN_TIMEOUT_S`).
    pub drain_window: std::time::Duration,
    pub metrics: crate::metrics::Metrics,
    /// Longest a request body may take to arrive.
    pub body_timeout: std::time::Duration,
    /// Request bodies held in memory at once.
    pub body_budget: BodyBudget,
    /// The open connections and what closed the others (`src/transport`).
    pub connections: std::sync::Arc<crate::transport::Connections>,
    /// Alone, or sharing the ceiling with the fleet.
    pub coordination: crate::coordination::Coordination,
    /// The runtime overrides (`/admin/settings`) and where they are kept.
    pub settings: std::sync::Arc<crate::settings::RuntimeSettings>,
    /// The tenants' rate quotas, for the `RateLimit` headers (the gates take from them).
    pub rates: std::sync::Arc<crate::admission::fair::quota::RateBook>,
    /// The OpenAPI document this gateway serves, made at the first ask and shared by every
    /// answer (`openapi.rs`).
    pub openapi: std::sync::OnceLock<bytes::Bytes>,
    /// OpenTelemetry export, when an endpoint is set (`None`: the send routes pay one branch).
    pub otel: Option<std::sync::Arc<crate::otel::Otel>>,
}

/// Authenticate the caller and check it may do `permission` (`action` names it in the 403).
/// Every protected route goes through here; the key's name goes on the request's log lines.
pub async fn authorize(
    req: &HttpRequest,
    context: &RequestContext,
    state: &AppState,
    permission: auth::Permission,
    action: &'static str,
) -> Result<std::sync::Arc<auth::Principal>, ApiError> {
    let principal = state.auth.authenticate(req).await.map_err(|e| {
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
