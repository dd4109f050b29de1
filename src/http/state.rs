//! What the handlers reach: the application's state, grouped by what uses it, and the one
//! authorization check every protected route goes through.
//!
//! One `web::Data<AppState>` rather than one per group: each extractor is a look-up per
//! request on the send path, and the groups below already let a function take only the
//! part it uses (`&Edge`, `&Observability`, …).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpRequest;
use bytes::Bytes;

use super::auth::{self, Authenticator};
use super::body_budget::BodyBudget;
use super::context::RequestContext;
use super::errors::{ApiError, Problem};
use crate::admission::fair::quota::RateBook;
use crate::admission::Dispatcher;
use crate::coordination::Coordination;
use crate::domain::QueueName;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::otel::Otel;
use crate::settings::RuntimeSettings;
use crate::transport::Connections;

/// What every handler can reach.
pub struct AppState {
    /// What a request meets before admission.
    pub edge: Edge,
    /// Admission and the backends: every send goes through it.
    pub dispatcher: Dispatcher,
    /// The tenants' rate quotas, for the `RateLimit` headers (the gates take from them).
    pub rates: Arc<RateBook>,
    /// `starting`, `running`, `draining`, `stopped`, and the sends a drain waits for.
    pub lifecycle: Lifecycle,
    /// What an operator acts on while the gateway runs.
    pub control: Control,
    /// What the gateway reports of itself (`/metrics`, OpenTelemetry).
    pub observability: Observability,
    /// The OpenAPI document this gateway serves (`openapi.rs`), made whole at start-up: it
    /// depends only on how callers authenticate, and every answer shares the one copy.
    pub openapi: Bytes,
}

/// Who is asking, for which queue, and the limits and budget of what they send.
pub struct Edge {
    pub auth: Authenticator,
    /// The served queues, by name.
    pub queues: HashMap<String, QueueName>,
    pub limits: BodyLimits,
    /// Request bodies held in memory at once.
    pub body_budget: BodyBudget,
}

impl Edge {
    /// A served queue's name, or `unknown`, so the metrics' label set stays bounded.
    pub fn queue_label(&self, queue: &str) -> &str {
        self.queues
            .get_key_value(queue)
            .map_or("unknown", |(name, _)| name.as_str())
    }
}

/// A request body's limits.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// A single send's body, and each batch entry's.
    pub max_body_bytes: usize,
    /// A batch send's limits: entries, and the request body's bytes.
    pub max_batch_messages: usize,
    pub max_batch_bytes: usize,
    /// Deepest nesting a send body may have.
    pub max_json_depth: usize,
    /// Longest a request body may take to arrive.
    pub body_timeout: Duration,
}

/// The runtime overrides, the coordination with a fleet, and the drain an operator opens.
pub struct Control {
    /// The runtime overrides (`/admin/settings`) and where they are kept.
    pub settings: Arc<RuntimeSettings>,
    /// Alone, or sharing the ceiling with the fleet.
    pub coordination: Coordination,
    /// The drain window `POST /admin/drain` opens (`SENDGATE_DRAIN_TIMEOUT_S`).
    pub drain_window: Duration,
}

/// The counters `/metrics` renders, the OpenTelemetry export, and the connections.
pub struct Observability {
    pub metrics: Metrics,
    /// OpenTelemetry export, when an endpoint is set (`None`: the send routes pay one branch).
    pub otel: Option<Arc<Otel>>,
    /// The open connections and what closed the others (`src/transport`).
    pub connections: Arc<Connections>,
}

/// Authenticate the caller and check it may do `permission` (`action` names it in the 403).
/// Every protected route goes through here; the key's name goes on the request's log lines.
pub async fn authorize(
    req: &HttpRequest,
    context: &RequestContext,
    auth: &Authenticator,
    permission: auth::Permission,
    action: &'static str,
) -> Result<Arc<auth::Principal>, ApiError> {
    let principal = auth.authenticate(req).await.map_err(|e| {
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
