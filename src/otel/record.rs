//! What a send's span and metrics say, as plain values: the attribute names, how the
//! gateway decided, the route's [`SendRecord`] and the ended span's [`SpanRecord`]. It
//! knows nothing of how they are exported.

use std::sync::Arc;

use super::names::Names;

/// The attribute names used here (the semantic conventions' and sendgate's own).
pub mod attr {
    pub const MESSAGING_SYSTEM: &str = "messaging.system";
    pub const MESSAGING_DESTINATION_NAME: &str = "messaging.destination.name";
    pub const MESSAGING_OPERATION_TYPE: &str = "messaging.operation.type";
    pub const MESSAGING_OPERATION_NAME: &str = "messaging.operation.name";
    pub const MESSAGING_MESSAGE_ID: &str = "messaging.message.id";
    pub const MESSAGING_BATCH_MESSAGE_COUNT: &str = "messaging.batch.message_count";
    pub const ERROR_TYPE: &str = "error.type";
    pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
    pub const ADMISSION_OUTCOME: &str = "sendgate.admission.outcome";
    pub const REFUSAL_REASON: &str = "sendgate.refusal.reason";
    pub const TENANT: &str = "sendgate.tenant";
    pub const BACKEND_ROLE: &str = "sendgate.backend";
    pub const DRY_RUN: &str = "sendgate.dry_run";
}

/// How the gateway decided on a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Let through to the broker (which may still have failed it).
    Admitted,
    /// Refused by the gateway itself.
    Refused,
    /// A dry run, validated.
    Validated,
}

impl Decision {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Refused => "refused",
            Self::Validated => "validated",
        }
    }
}

/// How a send was answered, in plain values: what its span and metrics say.
#[derive(Debug, Clone, Copy)]
pub struct SendRecord<'a> {
    /// The backend's `messaging.system` ([`messaging_system`]).
    pub system: &'static str,
    /// `primary` or `fallback`, when the send was routed.
    pub backend: Option<&'static str>,
    pub status: u16,
    /// The problem code of a failure or refusal (`error.type`); `None` for a success.
    pub error: Option<&'static str>,
    pub decision: Decision,
    /// Why a `queue_full` was refused: `ceiling`, `criticality`, `tenant_share`, `tenant_quota`.
    pub reason: Option<&'static str>,
    pub message_id: Option<&'a str>,
    /// A batch's entries.
    pub message_count: Option<usize>,
    pub tenant: Option<&'a str>,
}

/// An ended, sampled span: everything its export says, owned.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SpanRecord {
    pub(super) trace_id: [u8; 16],
    pub(super) span_id: [u8; 8],
    /// The request's span, when it gave a valid `traceparent`.
    pub(super) parent_id: Option<[u8; 8]>,
    /// The parent's `tracestate`, which the span inherits.
    pub(super) trace_state: Option<Box<str>>,
    pub(super) start_unix_nanos: u64,
    pub(super) end_unix_nanos: u64,
    /// A served queue's name or `unknown`.
    pub(super) queue: Arc<str>,
    pub(super) send: OwnedRecord,
}

/// A [`SendRecord`] whose borrowed parts are copied.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OwnedRecord {
    pub(super) system: &'static str,
    pub(super) backend: Option<&'static str>,
    pub(super) status: u16,
    pub(super) error: Option<&'static str>,
    pub(super) decision: Decision,
    pub(super) reason: Option<&'static str>,
    pub(super) message_id: Option<Box<str>>,
    pub(super) message_count: Option<usize>,
    pub(super) tenant: Option<Arc<str>>,
}

impl OwnedRecord {
    /// `r`'s values, its tenant's name shared through `names`.
    pub(super) fn new(r: &SendRecord<'_>, names: &Names) -> Self {
        Self {
            system: r.system,
            backend: r.backend,
            status: r.status,
            error: r.error,
            decision: r.decision,
            reason: r.reason,
            message_id: r.message_id.map(Box::from),
            message_count: r.message_count,
            tenant: r.tenant.map(|t| names.get(t)),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A span record of an admitted send to `requests`, its span id all `n`.
    pub(crate) fn record(n: u8) -> SpanRecord {
        SpanRecord {
            trace_id: [1; 16],
            span_id: [n; 8],
            parent_id: None,
            trace_state: None,
            start_unix_nanos: 1,
            end_unix_nanos: 2,
            queue: "requests".into(),
            send: OwnedRecord {
                system: "rabbitmq",
                backend: None,
                status: 201,
                error: None,
                decision: Decision::Admitted,
                reason: None,
                message_id: None,
                message_count: None,
                tenant: None,
            },
        }
    }
}
