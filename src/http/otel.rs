//! The send routes' OpenTelemetry: a span started as a send request arrives, ended with
//! what its typed answer was. `otel.rs` gets plain values ([`SendRecord`]) and knows
//! nothing of HTTP or admission; without an endpoint there is no [`Otel`] and a send pays
//! one branch here.

use super::auth::Authenticator;
use super::errors::ApiError;
use crate::admission::tenants::TenantIndex;
use crate::admission::Dispatcher;
use crate::domain::TraceContext;
use crate::metrics::RequestOutcome;
use crate::otel::{messaging_system, Decision, Otel, SendRecord, SendSpan};

/// The send's span, when OpenTelemetry is on. `queue` is a served queue's name or
/// `unknown` (the metrics' bounded label); `parent` reads the request's valid trace
/// context, only when on.
pub(crate) fn start<'a>(
    otel: Option<&'a Otel>,
    queue: &'a str,
    parent: impl FnOnce() -> Option<TraceContext>,
) -> Option<SendSpan<'a>> {
    let otel = otel?;
    Some(otel.start_send(queue, parent().as_ref()))
}

/// What ends a send's span: the answer as counted (`outcome`), its refusal if any, and
/// what only the route knows.
pub(crate) struct Ended<'a> {
    pub(crate) outcome: &'a RequestOutcome,
    pub(crate) refusal: Option<&'a ApiError>,
    pub(crate) dry_run: bool,
    pub(crate) message_id: Option<&'a str>,
    pub(crate) message_count: Option<usize>,
    pub(crate) tenant: Option<TenantIndex>,
}

/// End `span`: the backend's system from the lane the send took, the tenant's name from
/// the authenticator.
pub(crate) fn end(
    span: SendSpan<'_>,
    dispatcher: &Dispatcher,
    auth: &Authenticator,
    ended: Ended<'_>,
) {
    let outcome = ended.outcome;
    let lane = outcome
        .backend
        .and_then(|role| dispatcher.lane(role.as_str()))
        .unwrap_or_else(|| dispatcher.primary());
    let status = outcome.status.as_u16();
    let decision = match ended.refusal {
        None if ended.dry_run => Decision::Validated,
        None => Decision::Admitted,
        Some(e) if e.problem.from_broker() => Decision::Admitted,
        Some(_) => Decision::Refused,
    };
    let tenant = ended.tenant.and_then(|index| auth.tenant_name(index));
    span.end(SendRecord {
        system: messaging_system(lane.backend().kind()),
        backend: outcome.backend.map(|role| role.as_str()),
        status,
        // A 207's entries failed in part: `partial`, the outcome's code.
        error: (status >= 400 || status == 207).then_some(outcome.code),
        decision,
        reason: ended.refusal.and_then(|e| e.problem.refusal_reason()),
        message_id: ended.message_id,
        message_count: ended.message_count,
        tenant,
    });
}
