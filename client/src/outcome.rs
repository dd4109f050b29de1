//! What became of a message ([`SendOutcome`]), why an attempt failed ([`AttemptError`])
//! and why retrying stopped ([`GaveUp`]); the client's counters.

use std::fmt;

use sendgate_wire::{AnyCode, GatewayState};

use crate::transport::TransportSetupError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Setup(#[from] TransportSetupError),
}

/// The code to show for an answer: the body's, or `http_<status>` when the body was not
/// the gateway's JSON (a proxy's error page).
pub fn code_label(status: u16, code: Option<&AnyCode>) -> String {
    match code {
        Some(code) => code.as_str().to_owned(),
        None => format!("http_{status}"),
    }
}

/// Why one attempt did not queue the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttemptError {
    /// The gateway answered with an error status; `code` is `None` when the body was not
    /// the gateway's JSON.
    #[error("{status} {}", code_label(*status, code.as_ref()))]
    Status { status: u16, code: Option<AnyCode> },
    /// No HTTP answer: whether the message was stored is unknown (or, when the gateway
    /// could not be reached until the deadline, known not to be).
    #[error("transport error: {0}")]
    Transport(String),
    /// The deadline passed while the gateway was still draining or starting.
    #[error("the gateway was still {state} at the deadline")]
    StillDeferred { state: GatewayState },
    /// The deadline passed while the client's adaptive throttle held the message back,
    /// before any attempt (the gateway had refused most of the client's recent requests).
    #[error("held back by the client's adaptive throttle until the deadline")]
    HeldBack,
}

impl AttemptError {
    /// A short code for summaries: the gateway's code, `transport` or the state.
    pub fn code(&self) -> String {
        match self {
            Self::Status { status, code } => code_label(*status, code.as_ref()),
            Self::Transport(_) => "transport".into(),
            Self::StillDeferred { state } => state.as_str().into(),
            Self::HeldBack => "held_back".into(),
        }
    }
}

/// Why a retryable failure was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaveUp {
    /// The per-message attempt cap was reached.
    Attempts,
    /// The retry budget shared by all messages could not pay for the retry: the message is
    /// failed at once rather than held (docs/client.md says why).
    Budget,
    /// The next attempt (or the end of a drain) would come after the deadline.
    Deadline,
    /// The answer is a server error outside what is retried (a `502` that says the broker
    /// does not hold the message): reported at once.
    NotRetryable,
    /// The token source gave no token for the next attempt.
    NoToken,
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Attempts => "attempts exhausted",
            Self::Budget => "not retried: retry budget exhausted",
            Self::Deadline => "deadline reached",
            Self::NotRetryable => "not retryable",
            Self::NoToken => "no token for the next attempt",
        })
    }
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The gateway answered 2xx: the message is in the queue.
    Queued { message_id: String },
    /// The gateway refused the message for good (`400`, `404`, `409`, `413`, `415`…):
    /// sending it again would be refused again. `code` is `None` when the body was not
    /// the gateway's JSON.
    Refused { status: u16, code: Option<AnyCode> },
    /// Not queued, although it might have been with more patience: retries ran out (or a
    /// `502` without `outcome: unknown`). `last_error` is the last attempt's. Never reported as sent: after a `504`
    /// or a transport error the message may still be in the queue; a later send with the
    /// same `Idempotency-Key` is safe.
    Failed {
        last_error: AttemptError,
        attempts: u32,
        gave_up: GaveUp,
    },
    /// The gateway refused the token (`401`) or its scope (`403`): no send will succeed
    /// until the credential changes, so nothing was retried.
    AuthFailed { status: u16, code: Option<AnyCode> },
    /// The token source gave no token: nothing was sent, and nothing retried (the source
    /// paces its own fetches).
    NoToken { reason: String },
    /// Refused locally, never sent: the queue name, an id, a header or (in a batch) the
    /// body cannot be valid, or the entry alone is larger than a batch request may be.
    Invalid { reason: String },
}

impl fmt::Display for SendOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Queued { message_id } => write!(f, "queued as {message_id}"),
            Self::Refused { status, code } => {
                write!(
                    f,
                    "refused: {status} {}",
                    code_label(*status, code.as_ref())
                )
            }
            Self::Failed {
                last_error,
                attempts,
                gave_up,
            } => write!(
                f,
                "failed after {attempts} attempt(s) ({gave_up}): {last_error}"
            ),
            Self::AuthFailed { status, code } => write!(
                f,
                "authentication failed: {status} {}",
                code_label(*status, code.as_ref())
            ),
            Self::Invalid { reason } => write!(f, "invalid, not sent: {reason}"),
            Self::NoToken { reason } => write!(f, "not sent: {reason}"),
        }
    }
}

/// Counters over the life of a client (for summaries and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// `GET /health/detailed` calls.
    pub probes: u64,
    /// `POST` attempts, first attempts and retries alike; a connection refused before the
    /// request was sent is not one (it shows as a deferral).
    pub requests: u64,
    /// Retries granted by the budget.
    pub retries: u64,
    /// Retries the budget refused (each ended its message or request).
    pub budget_refusals: u64,
    /// Attempts the adaptive throttle held back for a while (each hold counted).
    pub held: u64,
    /// Waits for a draining, starting or unreachable gateway.
    pub deferrals: u64,
    /// The token may not read `/health/detailed` (a 403), so drains are only learnt from
    /// the sends' own `503 draining`.
    pub probe_forbidden: bool,
}
