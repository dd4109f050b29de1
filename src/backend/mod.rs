//! The broker behind the gateway.
//!
//! A [`Backend`] does two things, each bounded by a deadline that is passed *into* the
//! operation (not only put around it), so a call that runs out of time is cancelled and
//! gives back whatever it held:
//! - `send`: put one message on a queue (the data plane);
//! - `backlog`: read how many messages wait in a queue (the admin plane).

pub mod embedded;
pub mod rabbitmq;
pub mod servicebus;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::time::Instant;

use crate::domain::{Attributes, CorrelationId, Field, MessageId, QueueName, TraceContext};

/// The application properties the gateway writes on every message (contract section 1, "Trace context"),
/// beside the caller's: the message's own trace context, and `Diagnostic-Id` (equal to
/// `traceparent`) as the Azure SDKs write it.
pub use crate::domain::trace::{TRACEPARENT, TRACESTATE};
pub const DIAGNOSTIC_ID: &str = "Diagnostic-Id";

/// One message on its way to a queue; `body` is delivered byte for byte.
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    pub queue: QueueName,
    pub message_id: MessageId,
    pub correlation_id: Option<CorrelationId>,
    pub body: Bytes,
    /// Subject, session, TTL, schedule, addresses and the caller's properties (shared:
    /// a retry or a fallback clones the message, not them).
    pub attributes: Arc<Attributes>,
    /// This message's own trace context (a parent id no other message has).
    pub trace: TraceContext,
}

impl OutgoingMessage {
    /// A message without attributes, in a trace of its own.
    pub fn new(
        queue: QueueName,
        message_id: MessageId,
        correlation_id: Option<CorrelationId>,
        body: Bytes,
    ) -> Self {
        Self {
            queue,
            message_id,
            correlation_id,
            body,
            attributes: Arc::default(),
            trace: TraceContext::from_request(None, None),
        }
    }

    /// The properties the gateway adds to the caller's: `traceparent`, `tracestate`
    /// (when the request had a valid one) and `Diagnostic-Id`.
    pub fn trace_properties(&self) -> Vec<(&'static str, String)> {
        let traceparent = self.trace.parent.to_string();
        let mut out = Vec::with_capacity(3);
        out.push((TRACEPARENT, traceparent.clone()));
        if let Some(state) = &self.trace.state {
            out.push((TRACESTATE, state.as_str().to_owned()));
        }
        out.push((DIAGNOSTIC_ID, traceparent));
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendReceipt {
    /// The broker already held a message with this id inside its duplicate-detection
    /// window, so nothing new was stored.
    pub duplicate: bool,
}

/// What the admin plane says about a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// Messages waiting: stored and not yet taken (contract section 2).
    pub messages: u64,
    /// The broker says the queue does not accept sends now (Service Bus `Status`
    /// `Disabled`/`SendDisabled`): sends are answered `409 queue_disabled` without trying.
    pub send_disabled: bool,
}

impl Backlog {
    pub fn of(messages: u64) -> Self {
        Self {
            messages,
            send_disabled: false,
        }
    }
}

/// Where the admin plane's lag in force comes from (`/health/detailed`'s `depth_lag_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LagSource {
    /// Derived from what the broker was measured to do (RabbitMQ's statistics refresh).
    Broker,
    /// The operator's setting (`SENDGATE_RABBITMQ_STATS_LAG_MS`), longer than the derived one.
    Configured,
    /// The documented default: nothing measured (yet), nothing configured longer.
    Default,
}

impl LagSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Broker => "broker",
            Self::Configured => "configured",
            Self::Default => "default",
        }
    }
}

/// The admin plane's lag in force now, and why it is that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthLag {
    pub lag: Duration,
    pub source: LagSource,
}

/// Whether the embedded store's last write went through (`/health/detailed`'s `store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreHealth {
    pub ok: bool,
    /// Why the last write failed (`None` while `ok`).
    pub error: Option<String>,
    /// When the current state began: the first failure of a run, or the write after it.
    pub since: std::time::SystemTime,
}

/// Why a send did not put the message on the queue (or may not have).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// The deadline passed; the broker may or may not have the message.
    #[error("the broker did not confirm the send before its deadline")]
    Timeout,
    #[error("the broker refused the gateway's credential: {0}")]
    AuthFailed(String),
    #[error("the broker is busy or throttling: {reason}")]
    Busy {
        reason: String,
        retry_after: Option<Duration>,
    },
    #[error("the queue is disabled for sends at the broker")]
    QueueDisabled,
    /// The queue is at its own length limit and the broker refused the message (RabbitMQ's
    /// `x-overflow: reject-publish` nacks it): that queue's backpressure, nothing stored.
    /// Other queues on the same broker are not concerned.
    #[error("the queue is full at the broker (its length limit, overflow reject-publish)")]
    QueueFull,
    #[error("the queue does not exist at the broker")]
    QueueNotFound,
    #[error("the broker refused the message as too large")]
    TooLarge,
    /// The message id (the idempotency key) was used inside the duplicate window for
    /// another message (another body or other attributes): nothing stored. Only a backend
    /// that keeps what each id stood for can say so (the embedded queue).
    #[error("the message id was already used for another message")]
    KeyReused,
    /// The message never reached the broker (no connection, backing off, no credential).
    #[error("the broker could not be reached: {0}")]
    Unavailable(String),
    /// The request may have reached the broker, but the answer was lost (a connection
    /// dropped mid-call): the outcome is unknown, as after a timeout.
    #[error("the send's outcome is unknown: {0}")]
    Uncertain(String),
    /// The broker answered with an error: nothing was stored.
    #[error("the send failed: {0}")]
    Failed(String),
}

/// Why the backlog could not be read. Every variant counts as one failed read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DepthError {
    #[error("the depth read did not answer before its deadline")]
    Timeout,
    #[error("the admin plane refused the credential (no right to read the depth): {0}")]
    Unauthorized(String),
    #[error("the queue does not exist at the broker")]
    QueueNotFound,
    #[error("the depth read failed: {0}")]
    Failed(String),
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// `embedded`, `rabbitmq` or `servicebus`, as `/health/detailed` shows it.
    fn kind(&self) -> &'static str;

    /// Put `message` on its queue; give up, cancelling the operation, at `deadline`.
    async fn send(
        &self,
        message: OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError>;

    /// Put `messages` (all for one queue) on it in as few broker operations as the broker
    /// allows; one result per message, in their order. By default each is a `send`, all at
    /// once.
    async fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
        deadline: Instant,
    ) -> Vec<Result<SendReceipt, SendError>> {
        futures_util::future::join_all(messages.into_iter().map(|m| self.send(m, deadline))).await
    }

    /// The first of `attributes` this backend cannot carry faithfully: such a send is
    /// refused (`422 unsupported_attribute`) before capacity is asked, never sent without
    /// it. A pure check: no broker call.
    fn unsupported(&self, _attributes: &Attributes) -> Option<Field> {
        None
    }

    /// Read the queue's backlog from the admin plane; give up at `deadline`.
    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError>;

    /// How far the admin plane's counts may trail the data plane *now* (it may change once
    /// the broker has been measured, so read it each time rather than keeping it). The
    /// capacity gate counts sends completed within this window before a read on top of it.
    /// Zero for an exact admin plane.
    fn depth_lag(&self) -> Duration {
        self.depth_lag_in_force().map_or(Duration::ZERO, |l| l.lag)
    }

    /// [`depth_lag`](Self::depth_lag) with where it comes from; `None` for an exact admin
    /// plane (embedded, RabbitMQ's `amqp` depth source).
    fn depth_lag_in_force(&self) -> Option<DepthLag> {
        None
    }

    /// The state of the backend's own storage, for `/health/detailed`; `None` for a
    /// backend that keeps none (a broker's storage is the broker's to report).
    fn store_health(&self) -> Option<StoreHealth> {
        None
    }

    /// Get ready to serve (connect, declare) before the gateway says `running`. A failure
    /// is reported, not fatal: sends connect on demand.
    async fn warm_up(&self, _deadline: Instant) -> Result<(), String> {
        Ok(())
    }
}
