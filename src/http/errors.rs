//! Every refusal the HTTP API can give, and the only place status codes, error codes,
//! bodies and `Retry-After` are chosen.
//!
//! Every error body is `{"code", "message", "request_id", ...fields}`; every 429 and 503
//! carries an integer `Retry-After` of at least 1.

use std::fmt::Write as _;
use std::time::Duration;

use actix_web::http::header::{HeaderValue, ALLOW, RETRY_AFTER, WWW_AUTHENTICATE};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use sendgate_wire::{ErrorBody, ErrorCode};

use super::headers::{CORRELATION_ID, SENDGATE_BACKEND};
use crate::admission::ceiling::{Refusal, Unknown};
use crate::admission::drain::DrainRate;
use crate::admission::tenants::{Criticality, QuotaKind};
use crate::admission::{BackendRole, DispatchError};
use crate::backend::SendError;
use crate::domain::{MessageId, RequestId};
use crate::lifecycle::NotAdmitting;

/// The challenge of a `401` to a request whose bearer token proves nothing (RFC 6750 §3.1).
pub const INVALID_TOKEN_CHALLENGE: &str = "Bearer error=\"invalid_token\"";

/// Fail-closed answers with a fixed `Retry-After`: the admin plane is down, so there is
/// no better estimate of when capacity will be known again.
pub const CAPACITY_UNKNOWN_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The longest wait a broker's own `Retry-After` may impose on producers: a throttling
/// broker asking for more (or sending garbage like `9999999999`) is passed on as this.
pub const MAX_BROKER_RETRY_AFTER: Duration = Duration::from_secs(60);

/// One problem with the request's input, and how many one 400 lists (part of the error
/// body, so wire vocabulary).
pub use sendgate_wire::{FieldError, MAX_FIELD_ERRORS};

/// Room for an error body's `message` (the longest is ~130 bytes, a `send_failed` detail
/// more): a refusal formats it without regrowing the buffer.
const MESSAGE_CAPACITY: usize = 160;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("No route matches this path.")]
    NotFound,
    #[error("This path does not accept this method.")]
    MethodNotAllowed { allow: &'static str },
    #[error("The queue {queue:?} is not served by this gateway.")]
    UnknownQueue { queue: String },
    #[error("A valid bearer token is required.")]
    Unauthenticated { token_given: bool },
    #[error("This key may not {action}.")]
    Forbidden { action: &'static str },
    #[error("Without API keys this gateway answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1]).")]
    ForbiddenHost,
    #[error("The gateway is starting; try again shortly.")]
    Starting,
    #[error("The gateway is draining before a restart; try again after Retry-After.")]
    Draining { retry_after: Duration },
    #[error("The body must be sent as application/json.")]
    UnsupportedMediaType,
    #[error("The message is too large: at most {limit} bytes are accepted.")]
    PayloadTooLarge { limit: usize },
    #[error("The request is not valid.")]
    InvalidRequest { errors: Vec<FieldError> },
    #[error("The body did not arrive in time; nothing was sent. Send the request again.")]
    RequestTimeout,
    #[error("The queue holds {backlog} messages against its ceiling of {limit}; sends resume once consumers take it down.")]
    QueueFull {
        backlog: u64,
        limit: u64,
        retry_after: Duration,
        drain_rate: Option<DrainRate>,
        /// A batch's: how many of its entries would be admitted now.
        room: Option<u64>,
    },
    #[error("The queue is nearly full: sends at criticality {criticality} are refused once the backlog would pass {cut} (it holds {backlog}).")]
    Shed {
        criticality: Criticality,
        backlog: u64,
        cut: u64,
        retry_after: Duration,
        /// A batch's: how many of its entries would be admitted now.
        room: Option<u64>,
    },
    #[error("The queue is full for now for your tenant: it has taken its part of the room ({share_milli} in 1000); its next part opens after Retry-After.")]
    TenantShare {
        share_milli: u16,
        retry_after: Duration,
        /// A batch's: how many of its entries would be admitted now.
        room: Option<u64>,
    },
    #[error("Your tenant is past its {} quota; sends resume after Retry-After.", .quota.as_str())]
    TenantQuota {
        quota: QuotaKind,
        retry_after: Duration,
        /// A batch's: how many of its entries would be admitted now.
        room: Option<u64>,
    },
    #[error("The {backend} backend cannot carry the attribute {attribute} faithfully, so the message was not sent.")]
    UnsupportedAttribute {
        attribute: &'static str,
        backend: &'static str,
    },
    #[error("{}", capacity_unknown_detail(*consecutive_failures, *cause))]
    CapacityUnknown {
        consecutive_failures: u32,
        cause: Unknown,
    },
    #[error("Too many sends are in flight; try again in a moment.")]
    Saturated,
    #[error("The broker is failing or cannot be reached; nothing was sent. Try again after Retry-After.")]
    BackendUnavailable { retry_after: Duration },
    #[error("The broker did not confirm the send in time; the outcome is unknown. Retry with the same Idempotency-Key.")]
    SendTimeout { message_id: String },
    #[error("The broker refused the gateway's credential.")]
    BackendAuthFailed,
    #[error("The broker is busy; try again after Retry-After.")]
    BackendBusy { retry_after: Duration },
    #[error("The queue is disabled at the broker.")]
    QueueDisabled,
    #[error("This Idempotency-Key was already used for another message (another body or other attributes) inside the duplicate-detection window; nothing was sent. A retry must repeat the message exactly; a new message needs a new key.")]
    IdempotencyKeyReused,
    #[error("No backend {backend:?} here: primary, or fallback when one is configured.")]
    UnknownBackend { backend: String },
    #[error("The change could not be stored, so it is not in force: {detail}")]
    SettingsUnavailable { detail: String },
    #[error("The send did not complete: {detail}")]
    SendFailed {
        detail: String,
        /// Set when the broker may have the message: the body then says `outcome: unknown`
        /// and carries the id to retry with.
        unknown_message_id: Option<String>,
    },
}

/// A `capacity_unknown`'s detail names the dependency that failed, so whoever reads it pages
/// the right owners.
fn capacity_unknown_detail(consecutive_failures: u32, cause: Unknown) -> String {
    match cause {
        Unknown::AdminPlane => format!(
            "The queue's depth could not be read {consecutive_failures} times in a row; sends are refused until it can."
        ),
        Unknown::Ledger => "The fleet's ledger (Redis) does not answer, so the queue's room is unknown; sends are refused until it does.".to_owned(),
    }
}

impl Problem {
    /// Why a `queue_full` was refused (the body's `reason`, or `ceiling` for the backlog
    /// itself); `None` for any other problem. Telemetry's `sendgate.refusal.reason`.
    pub fn refusal_reason(&self) -> Option<&'static str> {
        match self {
            Self::QueueFull { .. } => Some("ceiling"),
            Self::Shed { .. } => Some("criticality"),
            Self::TenantShare { .. } => Some("tenant_share"),
            Self::TenantQuota { .. } => Some("tenant_quota"),
            _ => None,
        }
    }

    /// Whether the broker answered this (the gateway had let the send through), rather
    /// than the gateway refusing it.
    pub fn from_broker(&self) -> bool {
        matches!(
            self,
            Self::SendTimeout { .. }
                | Self::SendFailed { .. }
                | Self::BackendAuthFailed
                | Self::BackendBusy { .. }
                | Self::QueueDisabled
                | Self::IdempotencyKeyReused
        )
    }

    /// The wire code (`Copy`; `as_str()` is static, so no allocation per refusal).
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotFound => ErrorCode::NotFound,
            Self::MethodNotAllowed { .. } => ErrorCode::MethodNotAllowed,
            Self::UnknownQueue { .. } => ErrorCode::UnknownQueue,
            Self::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            Self::Forbidden { .. } => ErrorCode::Forbidden,
            Self::ForbiddenHost => ErrorCode::ForbiddenHost,
            Self::Starting => ErrorCode::Starting,
            Self::Draining { .. } => ErrorCode::Draining,
            Self::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::InvalidRequest { .. } => ErrorCode::InvalidRequest,
            Self::RequestTimeout => ErrorCode::RequestTimeout,
            Self::QueueFull { .. }
            | Self::Shed { .. }
            | Self::TenantShare { .. }
            | Self::TenantQuota { .. } => ErrorCode::QueueFull,
            Self::CapacityUnknown { .. } => ErrorCode::CapacityUnknown,
            Self::Saturated => ErrorCode::Saturated,
            Self::BackendUnavailable { .. } => ErrorCode::BackendUnavailable,
            Self::SendTimeout { .. } => ErrorCode::SendTimeout,
            Self::BackendAuthFailed => ErrorCode::BackendAuthFailed,
            Self::BackendBusy { .. } => ErrorCode::BackendBusy,
            Self::QueueDisabled => ErrorCode::QueueDisabled,
            Self::IdempotencyKeyReused => ErrorCode::IdempotencyKeyReused,
            Self::SendFailed { .. } => ErrorCode::SendFailed,
            Self::UnknownBackend { .. } => ErrorCode::NotFound,
            Self::SettingsUnavailable { .. } => ErrorCode::SettingsUnavailable,
            Self::UnsupportedAttribute { .. } => ErrorCode::UnsupportedAttribute,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotFound | Self::UnknownQueue { .. } | Self::UnknownBackend { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthenticated { .. } => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } | Self::ForbiddenHost => StatusCode::FORBIDDEN,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::QueueFull { .. }
            | Self::Shed { .. }
            | Self::TenantShare { .. }
            | Self::TenantQuota { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Starting
            | Self::Draining { .. }
            | Self::CapacityUnknown { .. }
            | Self::Saturated
            | Self::BackendUnavailable { .. }
            | Self::BackendBusy { .. }
            | Self::SettingsUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::SendTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::BackendAuthFailed | Self::SendFailed { .. } => StatusCode::BAD_GATEWAY,
            Self::QueueDisabled => StatusCode::CONFLICT,
            Self::UnsupportedAttribute { .. } | Self::IdempotencyKeyReused => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
        }
    }

    /// `Retry-After`, for the answers that carry one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Starting | Self::Saturated | Self::SettingsUnavailable { .. } => {
                Some(Duration::from_secs(1))
            }
            Self::Draining { retry_after }
            | Self::QueueFull { retry_after, .. }
            | Self::Shed { retry_after, .. }
            | Self::TenantShare { retry_after, .. }
            | Self::TenantQuota { retry_after, .. }
            | Self::BackendBusy { retry_after }
            | Self::BackendUnavailable { retry_after } => Some(*retry_after),
            Self::CapacityUnknown { .. } => Some(CAPACITY_UNKNOWN_RETRY_AFTER),
            _ => None,
        }
    }
}

/// `Retry-After` in whole seconds, rounded up, never below 1.
pub fn whole_seconds(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

/// A refusal for one request: the problem and the request's id.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{problem}")]
pub struct ApiError {
    pub problem: Problem,
    pub request_id: RequestId,
    /// The backend the send went to, echoed as `X-Sendgate-Backend`.
    pub via: Option<BackendRole>,
    /// The client's `X-Correlation-Id`, echoed.
    pub correlation: Option<String>,
}

impl ApiError {
    pub fn new(problem: Problem, request_id: &RequestId) -> Self {
        Self {
            problem,
            request_id: request_id.clone(),
            via: None,
            correlation: None,
        }
    }

    pub fn correlation(mut self, id: Option<String>) -> Self {
        self.correlation = id;
        self
    }

    pub fn via(mut self, backend: Option<BackendRole>) -> Self {
        self.via = backend;
        self
    }
}

impl ApiError {
    /// What this refusal is counted as in the metrics (status, code, the backend it named).
    pub fn outcome(&self) -> crate::metrics::RequestOutcome {
        crate::metrics::RequestOutcome {
            status: self.problem.status(),
            code: self.problem.code().as_str(),
            backend: self.via,
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.problem.status()
    }

    fn error_response(&self) -> HttpResponse {
        let body = self.body();

        // `X-Request-Id` is set on every answer by the request context (`context.rs`).
        let mut response = HttpResponse::build(self.problem.status());
        if let Some(via) = self.via {
            response.insert_header((SENDGATE_BACKEND, via.as_str()));
        }
        if let Some(correlation) = &self.correlation {
            response.insert_header((CORRELATION_ID, correlation.as_str()));
        }
        if let Some(after) = self.problem.retry_after() {
            response.insert_header((RETRY_AFTER, HeaderValue::from(whole_seconds(after))));
        }
        // For the metrics of the send routes (`http/metrics.rs`): the code, beside the
        // header, on the answer itself (a 429 may leave here as a response, not an error).
        response.extensions_mut().insert(self.problem.code());
        match &self.problem {
            // RFC 6750 §3: no token, a bare challenge; a token that proves nothing (an
            // unknown key, an Entra ID token that does not verify), `invalid_token` and
            // nothing more: why is for the log, never for the caller (contract section 5).
            Problem::Unauthenticated { token_given } => {
                response.insert_header((
                    WWW_AUTHENTICATE,
                    if *token_given {
                        INVALID_TOKEN_CHALLENGE
                    } else {
                        "Bearer"
                    },
                ));
            }
            Problem::MethodNotAllowed { allow } => {
                response.insert_header((ALLOW, *allow));
            }
            // Close the connection: the client's next attempt opens a new one, which a load
            // balancer can route to another replica instead of this draining one.
            Problem::Draining { .. } => {
                response.force_close();
            }
            _ => {}
        }
        response.json(body)
    }
}

impl From<NotAdmitting> for Problem {
    fn from(n: NotAdmitting) -> Self {
        match n {
            NotAdmitting::Starting => Problem::Starting,
            NotAdmitting::Draining { retry_after } => Problem::Draining { retry_after },
            NotAdmitting::Stopped => Problem::Draining {
                retry_after: Duration::from_secs(1),
            },
        }
    }
}

impl Problem {
    /// The answer for a dispatch that did not end in the queue. `message_id` goes into a
    /// 504 so the client can retry with the same key (`None` when the send was refused
    /// before its message was made: no answer of those names an id); `max_body_bytes` is
    /// the limit a 413 names when the broker refuses the message as too large (its own
    /// limit also counts the message's properties, so a body under ours can still be
    /// refused).
    pub fn from_dispatch(
        e: DispatchError,
        message_id: Option<&MessageId>,
        max_body_bytes: usize,
    ) -> Self {
        match e {
            DispatchError::Refused(refusal) => Self::from_refusal(refusal),
            DispatchError::Send(e) => Self::from_send(e, message_id, max_body_bytes),
            DispatchError::Unsupported { attribute, backend } => Problem::UnsupportedAttribute {
                attribute: attribute.json_name(),
                backend,
            },
            DispatchError::Saturated => Problem::Saturated,
            DispatchError::BackendUnavailable { retry_after } => {
                Problem::BackendUnavailable { retry_after }
            }
            DispatchError::UnknownQueue => Problem::SendFailed {
                detail: "no route to this queue".into(),
                unknown_message_id: None,
            },
        }
    }

    /// A send the gate refused. A refusal's `room` is named by a batch's answer only (a
    /// single send has none when refused).
    fn from_refusal(refusal: Refusal) -> Self {
        match refusal {
            Refusal::QueueFull {
                backlog,
                limit,
                retry_after,
                drain_rate,
                room: _,
            } => Problem::QueueFull {
                backlog,
                limit,
                retry_after,
                drain_rate,
                room: None,
            },
            Refusal::CapacityUnknown {
                consecutive_failures,
                cause,
            } => Problem::CapacityUnknown {
                consecutive_failures,
                cause,
            },
            Refusal::QueueDisabled => Problem::QueueDisabled,
            Refusal::Shed {
                criticality,
                backlog,
                cut,
                retry_after,
                room: _,
            } => Problem::Shed {
                criticality,
                backlog,
                cut,
                retry_after,
                room: None,
            },
            Refusal::TenantShare {
                share_milli,
                retry_after,
                room: _,
            } => Problem::TenantShare {
                share_milli,
                retry_after,
                room: None,
            },
            Refusal::TenantQuota {
                quota,
                retry_after,
                room: _,
            } => Problem::TenantQuota {
                quota,
                retry_after,
                room: None,
            },
            // A send that reached the gate after the drain (its seat left the fleet): as
            // one refused by the lifecycle once stopped.
            Refusal::Stopped => Problem::Draining {
                retry_after: Duration::from_secs(1),
            },
        }
    }

    /// A send that reached the backend and failed there: only such a send names its id,
    /// and its message was made.
    fn from_send(e: SendError, message_id: Option<&MessageId>, max_body_bytes: usize) -> Self {
        let id = || message_id.map(ToString::to_string).unwrap_or_default();
        match e {
            SendError::Timeout => Problem::SendTimeout { message_id: id() },
            SendError::AuthFailed(_) => Problem::BackendAuthFailed,
            SendError::Busy { retry_after, .. } => Problem::BackendBusy {
                retry_after: retry_after
                    .unwrap_or(Duration::from_secs(1))
                    .min(MAX_BROKER_RETRY_AFTER),
            },
            // Room comes back when a consumer takes a message, which nothing here can
            // foresee: the shortest wait, and the breaker is not moved, so the retry is
            // tried.
            SendError::QueueFull => Problem::BackendBusy {
                retry_after: Duration::from_secs(1),
            },
            SendError::QueueDisabled => Problem::QueueDisabled,
            SendError::KeyReused => Problem::IdempotencyKeyReused,
            SendError::TooLarge => Problem::PayloadTooLarge {
                limit: max_body_bytes,
            },
            e @ SendError::Uncertain(_) => Problem::SendFailed {
                detail: e.to_string(),
                unknown_message_id: Some(id()),
            },
            // Nothing reached the broker (no connection): retryable, like an open circuit.
            SendError::Unavailable(_) => Problem::BackendUnavailable {
                retry_after: Duration::from_secs(1),
            },
            e @ (SendError::QueueNotFound | SendError::Failed(_)) => Problem::SendFailed {
                detail: e.to_string(),
                unknown_message_id: None,
            },
        }
    }
}

impl ApiError {
    /// The wire's error body (`sendgate_wire::ErrorBody`), borrowing from the problem.
    fn body(&self) -> ErrorBody<'_> {
        // Formatted once into a buffer of its final size: `to_string()` starts empty and
        // regrows it several times (every refusal pays it; the 429's message has numbers).
        let mut message = String::with_capacity(MESSAGE_CAPACITY);
        let _ = write!(message, "{}", self.problem);
        let mut b = ErrorBody::new(
            self.problem.code(),
            message.into(),
            self.request_id.as_str(),
        );
        match &self.problem {
            Problem::UnknownQueue { queue } => b.queue = Some(queue.into()),
            Problem::Draining { retry_after } => {
                b.retry_after_s = Some(whole_seconds(*retry_after))
            }
            Problem::PayloadTooLarge { limit } => b.limit_bytes = Some(*limit),
            Problem::InvalidRequest { errors } => b.errors = Some(errors.into()),
            Problem::UnsupportedAttribute { attribute, backend } => {
                b.attribute = Some((*attribute).into());
                b.backend = Some((*backend).into());
            }
            Problem::QueueFull {
                backlog,
                limit,
                retry_after,
                drain_rate,
                room,
            } => {
                b.room = *room;
                b.backlog = Some(*backlog);
                b.limit = Some(*limit);
                // The header's value, to the second: a client may read either.
                b.retry_after_s = Some(whole_seconds(*retry_after));
                b.drain_rate_per_s = Some(drain_rate.map(DrainRate::rounded));
            }
            Problem::Shed {
                criticality,
                backlog,
                cut,
                retry_after,
                room,
            } => {
                b.room = *room;
                b.reason = Some("criticality".into());
                b.criticality = Some(criticality.as_str().into());
                b.backlog = Some(*backlog);
                b.limit = Some(*cut);
                b.retry_after_s = Some(whole_seconds(*retry_after));
            }
            Problem::TenantShare {
                share_milli,
                retry_after,
                room,
            } => {
                b.room = *room;
                b.reason = Some("tenant_share".into());
                b.share = Some(f64::from(*share_milli) / 1000.0);
                b.retry_after_s = Some(whole_seconds(*retry_after));
            }
            Problem::TenantQuota {
                quota,
                retry_after,
                room,
            } => {
                b.room = *room;
                b.reason = Some("tenant_quota".into());
                b.quota = Some(quota.as_str().into());
                b.retry_after_s = Some(whole_seconds(*retry_after));
            }
            Problem::CapacityUnknown {
                consecutive_failures,
                cause,
            } => {
                b.consecutive_failures = Some(*consecutive_failures);
                b.reason = Some(cause.as_str().into());
            }
            Problem::SendTimeout { message_id }
            | Problem::SendFailed {
                unknown_message_id: Some(message_id),
                ..
            } => {
                b.outcome = Some(ErrorBody::OUTCOME_UNKNOWN.into());
                b.message_id = Some(message_id.into());
            }
            _ => {}
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review 15: with `SENDGATE_RESUME_BELOW` under 1 a queue refuses below its ceiling
    /// (observed live: backlog 92, ceiling 100, resume level 50), and the 429's message then
    /// says "The queue holds 92 messages, at or over its ceiling of 100" — false, and the
    /// body has no field that says why (the resume level is only on `/health/detailed`).
    #[test]
    fn a_refusal_under_the_ceiling_does_not_claim_to_be_over_it() {
        let p = Problem::QueueFull {
            backlog: 92,
            limit: 100,
            retry_after: Duration::from_secs(21),
            drain_rate: None,
            room: None,
        };
        let text = p.to_string();
        assert!(!text.contains("at or over"), "{text}");
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(30)), 30);
    }

    /// A 429's base wait is written in whole seconds rounded up (contract section 2; it is
    /// spread by pacing, not jittered): a whole-second estimate is said as it is, and a
    /// 1 s answer never doubles to 2.
    #[test]
    fn the_header_is_the_estimate_rounded_up() {
        use crate::admission::drain::{retry_after, DrainRate};
        let r = Some(DrainRate::measured(1.0));
        let longest = Duration::from_secs(300);
        let header = |backlog, resume| {
            whole_seconds(retry_after(backlog, resume, r, Duration::ZERO, longest))
        };
        assert_eq!(header(110, 100), 10);
        assert_eq!(header(100, 99), 1, "a 1 s estimate doubled by rounding");
        let half = Some(DrainRate::measured(2.0));
        let rounded = retry_after(111, 100, half, Duration::ZERO, longest);
        assert_eq!(whole_seconds(rounded), 6, "5.5 s is said as 6");
    }

    #[test]
    fn a_message_the_broker_finds_too_large_is_a_413_naming_the_gateway_limit() {
        let id = MessageId::parse("m-1").unwrap();
        let p = Problem::from_dispatch(DispatchError::Send(SendError::TooLarge), Some(&id), 4096);
        assert_eq!(p, Problem::PayloadTooLarge { limit: 4096 });
        assert_eq!(p.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(p.code(), ErrorCode::PayloadTooLarge);
    }

    #[test]
    fn every_429_and_503_has_a_retry_after() {
        let all = [
            Problem::Starting,
            Problem::Draining {
                retry_after: Duration::ZERO,
            },
            Problem::QueueFull {
                backlog: 1,
                limit: 1,
                retry_after: Duration::ZERO,
                drain_rate: None,
                room: None,
            },
            Problem::CapacityUnknown {
                consecutive_failures: 3,
                cause: Unknown::AdminPlane,
            },
            Problem::CapacityUnknown {
                consecutive_failures: 0,
                cause: Unknown::Ledger,
            },
            Problem::Saturated,
            Problem::SettingsUnavailable {
                detail: "disk full".into(),
            },
            Problem::BackendUnavailable {
                retry_after: Duration::ZERO,
            },
            Problem::BackendBusy {
                retry_after: Duration::ZERO,
            },
        ];
        for p in all {
            let s = p.status().as_u16();
            assert!(s == 429 || s == 503);
            assert!(p.retry_after().is_some(), "{p:?}");
        }
    }
}
