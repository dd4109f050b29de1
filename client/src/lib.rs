//! The producer client: send messages to a sendgate gateway the way the contract asks a
//! careful producer to (section 7 of `docs/contract.md`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), sendgate_client::ClientError> {
//! use sendgate_client::{Client, ClientConfig, SendOutcome};
//!
//! let client = Client::new(ClientConfig::new("http://127.0.0.1:8080").token("…"))?;
//! match client.send("requests", r#"{"prompt":"hi"}"#, Some("order-42")).await {
//!     SendOutcome::Queued { message_id } => println!("queued as {message_id}"),
//!     other => eprintln!("not queued: {other}"),
//! }
//! # Ok(()) }
//! ```
//!
//! A message with attributes, ids and a trace ([`Message`]) goes with
//! [`Client::send_with`]; many at once with [`Client::send_batch`], which packs them into
//! batch requests under the gateway's limits and retries only the entries that did not
//! make it, with their same ids:
//!
//! ```no_run
//! # async fn demo(client: sendgate_client::Client) {
//! use sendgate_client::{Message, MessageAttributes};
//!
//! let attributes = MessageAttributes {
//!     subject: Some("order".into()),
//!     ..MessageAttributes::default()
//! };
//! let messages = (0..250).map(|i| {
//!     Message::new(format!(r#"{{"n":{i}}}"#)).attributes(attributes.clone())
//! });
//! // One outcome per message, in order: three requests of at most 100 entries.
//! let outcomes = client.send_batch("requests", messages).await;
//! # }
//! ```
//!
//! One [`Client`] is meant to be shared (it is cheap to clone): its connection pool, its
//! lifecycle verdict and its retry budget are what make a burst of sends polite.
//!
//! - `lifecycle.rs`: is the gateway draining? one cached, single-flight probe.
//! - `retry.rs`: what is retried, the backoff, the budget shared across messages.
//! - `transport.rs`: the HTTP calls (a send, a batch, the probe), and the trait that lets
//!   tests fake them.
//! - here: the send loop, one for a single message and for a batch request's entries
//!   alike, and the planning of a batch into requests.
//!
//! Codes and states are the gateway's own types from `sendgate-wire`, re-exported here:
//! the client decides by [`ErrorCode`] and [`GatewayState`], never by matching text.

pub mod lifecycle;
pub mod retry;
pub mod token;
pub mod transport;

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::HeaderValue;
use sendgate_wire::{BatchEntry, CorrelationId, Loc};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use lifecycle::{LifecycleProbe, Verdict};
use retry::{is_retryable_status, Backoff, BudgetConfig, RetryBudget};
use transport::{
    BatchAnswer, HttpTransport, Outgoing, OutgoingBatch, Transport, TransportError,
    TransportSetupError,
};

pub use sendgate_wire::{
    AnyCode, ErrorCode, GatewayState, IdError, MessageAttributes, MessageId, QueueName,
    QueueNameError,
};
#[cfg(feature = "entra")]
pub use token::EntraTokenSource;
pub use token::{TokenSource, TokenSourceError};

/// The longest deadline taken as given; anything longer (which no caller means) would
/// only risk overflowing the clock.
pub const MAX_DEADLINE: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How a client behaves. [`ClientConfig::new`] gives the defaults of the contract.
#[derive(Clone)]
pub struct ClientConfig {
    /// The gateway's base URL, e.g. `http://127.0.0.1:8080`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer …` when set.
    pub token: Option<String>,
    /// Asked for the token before every request instead (an Entra ID token source, say);
    /// set at most one of the two.
    pub token_source: Option<Arc<dyn TokenSource>>,
    /// Longest time one message may spend waiting (for a drain to end, or before a
    /// retry), from the moment `send` is called. An attempt already in flight is bounded
    /// by `request_timeout` instead, so its outcome is never cut off and guessed at.
    ///
    /// A drain the gateway announces (its `drain.remaining_s`, or a `503 draining`'s
    /// `Retry-After`) moves the deadline: it then counts from the announced end of the
    /// drain, so a drain window longer than `deadline` is waited out, up to
    /// `deadline_cap` from the call in all.
    pub deadline: Duration,
    /// The longest an announced drain may stretch `deadline` to, from the call
    /// (default 10 minutes). Never shortens `deadline`.
    pub deadline_cap: Duration,
    /// Longest time one HTTP request may take (the gateway's own send deadline is 10 s).
    pub request_timeout: Duration,
    pub backoff: Backoff,
    pub budget: BudgetConfig,
    /// How long one lifecycle verdict is shared.
    pub probe_ttl: Duration,
    /// Longest wait for `/health/detailed`; past it the verdict is "not draining".
    pub probe_timeout: Duration,
    /// Sends on the wire at once, whatever the number of concurrent `send` calls: keeps
    /// the connection pool (and the gateway's in-flight slots) bounded.
    pub max_concurrent_requests: usize,
    /// Most entries in one batch request: the gateway's `SENDGATE_MAX_BATCH_MESSAGES`
    /// (default 100). A gateway that holds fewer says so with a `400`; the client then
    /// halves its requests (and keeps the lower number).
    pub max_batch_messages: usize,
    /// Most bytes in one batch request's body: the gateway's `SENDGATE_MAX_BATCH_BYTES`
    /// (default 1 MiB). A gateway that takes less says so with a `413` naming its limit,
    /// which the client then keeps.
    pub max_batch_bytes: usize,
    /// Sent as `Sendgate-Criticality` on every send and batch when set: lowers the level
    /// the gateway weighs them at (never above the key's; contract section 2).
    pub criticality: Option<Criticality>,
}

/// How much a send matters when the queue is nearly full (the gateway refuses a lower one
/// first): the values of `Sendgate-Criticality`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Criticality {
    Critical,
    Default,
    Sheddable,
}

impl Criticality {
    /// The header's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Criticality::Critical => "critical",
            Criticality::Default => "default",
            Criticality::Sheddable => "sheddable",
        }
    }

    /// One of the three words, exactly; anything else is `None`.
    pub fn parse(word: &str) -> Option<Self> {
        [Self::Critical, Self::Default, Self::Sheddable]
            .into_iter()
            .find(|c| c.as_str() == word)
    }
}

impl fmt::Debug for ClientConfig {
    // Never print the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_source", &self.token_source.as_ref().map(|_| ".."))
            .field("deadline", &self.deadline)
            .field("deadline_cap", &self.deadline_cap)
            .field("request_timeout", &self.request_timeout)
            .field("backoff", &self.backoff)
            .field("budget", &self.budget)
            .field("probe_ttl", &self.probe_ttl)
            .field("probe_timeout", &self.probe_timeout)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("max_batch_messages", &self.max_batch_messages)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .field("criticality", &self.criticality)
            .finish()
    }
}

impl ClientConfig {
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            token: None,
            token_source: None,
            // Longer than the default drain window (30 s) plus a start-up (≤ 7 s), so a
            // rolling restart is waited out rather than reported as a failure.
            deadline: Duration::from_secs(120),
            // A drain window of several minutes (a long linger) is still waited out; past
            // ten minutes the producer hears about it rather than hanging on.
            deadline_cap: Duration::from_secs(600),
            request_timeout: Duration::from_secs(30),
            backoff: Backoff::default(),
            budget: BudgetConfig::default(),
            probe_ttl: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(3),
            max_concurrent_requests: 64,
            max_batch_messages: 100,
            max_batch_bytes: 1 << 20,
            criticality: None,
        }
    }

    /// Send at `criticality` (`Sendgate-Criticality` on every request).
    pub fn criticality(mut self, criticality: Criticality) -> Self {
        self.criticality = Some(criticality);
        self
    }

    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Ask `source` for the token before every request (see [`token`]).
    pub fn token_source(mut self, source: Arc<dyn TokenSource>) -> Self {
        self.token_source = Some(source);
        self
    }

    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    pub fn deadline_cap(mut self, cap: Duration) -> Self {
        self.deadline_cap = cap;
        self
    }

    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub fn budget(mut self, budget: BudgetConfig) -> Self {
        self.budget = budget;
        self
    }

    /// The gateway's batch limits: entries and bytes per request (at least 1 each).
    pub fn batch_limits(mut self, messages: usize, bytes: usize) -> Self {
        self.max_batch_messages = messages;
        self.max_batch_bytes = bytes;
        self
    }
}

/// One message in a batch entry's form — its body, its ids and its attributes — and the
/// trace it belongs to. Build it with [`Message::new`] and the setters:
///
/// ```
/// use sendgate_client::{Message, MessageAttributes};
///
/// let message = Message::new(r#"{"prompt":"hi"}"#)
///     .idempotency_key("order-42")
///     .correlation_id("session-7")
///     .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
///     .attributes(MessageAttributes {
///         subject: Some("prompt".into()),
///         time_to_live_s: Some(600),
///         ..MessageAttributes::default()
///     });
/// ```
///
/// The gateway checks the attributes (contract section 1.2): a bad one is a `400` naming
/// it, reported as [`SendOutcome::Refused`]. Only what cannot be sent at all (an id that
/// is not 1–128 printable ASCII, a control character in a header, a batch entry whose body
/// is not JSON) is refused here, as [`SendOutcome::Invalid`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// A JSON value (the gateway validates it; a batch entry's is checked here, as one bad
    /// body would make the whole request malformed).
    pub body: Bytes,
    /// The same on every attempt; a UUID made here when `None`.
    pub idempotency_key: Option<String>,
    /// Carried to the message (`X-Correlation-Id` on a single send).
    pub correlation_id: Option<String>,
    /// Sent as the `Message-*` headers on a single send, as the entry's fields in a batch.
    pub attributes: MessageAttributes,
    /// W3C `traceparent`: the message joins this trace with a parent id of its own. In a
    /// batch, entries with different traces go in different requests.
    pub traceparent: Option<String>,
}

impl Message {
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }

    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    pub fn attributes(mut self, attributes: MessageAttributes) -> Self {
        self.attributes = attributes;
        self
    }

    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }
}

impl From<BatchEntry> for Message {
    /// A batch entry as a producer wrote it (`sendgate send --envelope` reads lines so).
    fn from(entry: BatchEntry) -> Self {
        let body: Box<str> = entry.body.into();
        Self {
            body: Bytes::from(String::from(body)),
            idempotency_key: entry.idempotency_key,
            correlation_id: entry.correlation_id,
            attributes: entry.attributes,
            traceparent: None,
        }
    }
}

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
}

impl AttemptError {
    /// A short code for summaries: the gateway's code, `transport` or the state.
    pub fn code(&self) -> String {
        match self {
            Self::Status { status, code } => code_label(*status, code.as_ref()),
            Self::Transport(_) => "transport".into(),
            Self::StillDeferred { state } => state.as_str().into(),
        }
    }
}

/// Why a retryable failure was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaveUp {
    /// The per-message attempt cap was reached.
    Attempts,
    /// The retry budget shared by all messages was spent.
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
            Self::Budget => "retry budget spent",
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
    /// Retries the budget refused.
    pub budget_refusals: u64,
    /// Waits for a draining, starting or unreachable gateway.
    pub deferrals: u64,
    /// The token may not read `/health/detailed` (a 403), so drains are only learnt from
    /// the sends' own `503 draining`.
    pub probe_forbidden: bool,
}

/// A producer client. Clone it freely: clones share the pool, the verdict and the budget.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Arc<dyn Transport>,
    lifecycle: LifecycleProbe,
    budget: RetryBudget,
    backoff: Backoff,
    deadline: Duration,
    deadline_cap: Duration,
    on_the_wire: Semaphore,
    /// The batch limits in use: the configured ones, lowered to what the gateway said it
    /// takes (a `400` on the number of entries, a `413` naming its limit).
    max_batch_messages: AtomicUsize,
    max_batch_bytes: AtomicUsize,
    requests: AtomicU64,
    retries: AtomicU64,
    budget_refusals: AtomicU64,
    deferrals: AtomicU64,
}

impl Client {
    /// A client over HTTP (reqwest with rustls, one pooled connection set).
    ///
    /// TLS uses the process-level rustls crypto provider: if the process has not installed
    /// one, this installs ring's (a provider installed earlier is kept).
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let credential = match (&config.token, &config.token_source) {
            (Some(_), Some(_)) => return Err(TransportSetupError::TwoCredentials.into()),
            (Some(token), None) => Some(token::Credential::Token(token.clone())),
            (None, Some(source)) => Some(token::Credential::Source(Arc::clone(source))),
            (None, None) => None,
        };
        let transport = HttpTransport::new(
            &config.base_url,
            credential.as_ref(),
            config.request_timeout,
        )?
        .criticality(config.criticality);
        Ok(Self::with_transport(config, Arc::new(transport)))
    }

    /// A client over any [`Transport`] (tests use a scripted one). `base_url`, `token`,
    /// `token_source` and `request_timeout` of `config` are the transport's business and
    /// unused here.
    pub fn with_transport(config: ClientConfig, transport: Arc<dyn Transport>) -> Self {
        Self {
            inner: Arc::new(Inner {
                lifecycle: LifecycleProbe::new(
                    transport.clone(),
                    config.probe_ttl,
                    config.probe_timeout,
                ),
                transport,
                budget: RetryBudget::new(config.budget),
                backoff: config.backoff,
                deadline: config.deadline,
                deadline_cap: config.deadline_cap,
                on_the_wire: Semaphore::new(config.max_concurrent_requests.max(1)),
                max_batch_messages: AtomicUsize::new(config.max_batch_messages.max(1)),
                max_batch_bytes: AtomicUsize::new(config.max_batch_bytes.max(1)),
                requests: AtomicU64::new(0),
                retries: AtomicU64::new(0),
                budget_refusals: AtomicU64::new(0),
                deferrals: AtomicU64::new(0),
            }),
        }
    }

    pub fn stats(&self) -> ClientStats {
        let i = &self.inner;
        ClientStats {
            probes: i.lifecycle.probes(),
            requests: i.requests.load(Ordering::Relaxed),
            retries: i.retries.load(Ordering::Relaxed),
            budget_refusals: i.budget_refusals.load(Ordering::Relaxed),
            deferrals: i.deferrals.load(Ordering::Relaxed),
            probe_forbidden: i.lifecycle.forbidden(),
        }
    }

    /// Send one message (`body`: a JSON value; the gateway validates it) to `queue`.
    ///
    /// Every attempt carries the same `Idempotency-Key`: `idempotency_key`, or a UUID made
    /// here when it is `None`. While the gateway drains, starts or cannot be connected to,
    /// the send waits (no attempt, no retry spent) until that is over or the deadline
    /// passes.
    pub async fn send(
        &self,
        queue: &str,
        body: impl Into<Bytes>,
        idempotency_key: Option<&str>,
    ) -> SendOutcome {
        let mut message = Message::new(body);
        message.idempotency_key = idempotency_key.map(str::to_owned);
        self.send_with(queue, message).await
    }

    /// Send one [`Message`] with its ids, attributes and trace, as [`Client::send`] does
    /// (same retries, same waits).
    pub async fn send_with(&self, queue: &str, message: Message) -> SendOutcome {
        let queue = match QueueName::parse(queue) {
            Ok(q) => q,
            Err(e) => {
                return SendOutcome::Invalid {
                    reason: format!("queue {queue:?}: {e}"),
                }
            }
        };
        let outgoing = match single(message) {
            Ok(outgoing) => outgoing,
            Err(reason) => return SendOutcome::Invalid { reason },
        };
        let mut load = One {
            message: outgoing,
            outcome: None,
        };
        self.deliver(&queue, &mut load).await;
        load.outcome.unwrap_or_else(|| SendOutcome::Failed {
            last_error: AttemptError::Transport("no outcome".into()),
            attempts: 0,
            gave_up: GaveUp::NotRetryable,
        })
    }

    /// Send many messages through the batch route: one outcome per message, in their
    /// order.
    ///
    /// The messages are packed, in order, into requests of at most
    /// [`ClientConfig::max_batch_messages`] entries and
    /// [`ClientConfig::max_batch_bytes`] bytes (entries with different traces go in
    /// different requests); the requests go one after another, so without retries the
    /// messages reach the queue in their order. Every entry carries an idempotency key,
    /// made here (a UUID) when the message has none, so that a retry cannot store it twice.
    ///
    /// Each request goes through the loop a single send does: it waits out a drain, and
    /// its deadline counts from its first attempt. After a `207` only the entries that
    /// failed retryably or whose outcome is unknown are sent again (with their same ids);
    /// the queued ones are done. A `429 queue_full` naming `room` for some of the entries
    /// sends those first `room` at once (never more) and the rest after its
    /// `Retry-After`. A `400` naming entries refuses those and sends the others at once,
    /// as a `422 unsupported_attribute` does for the entries that carry the attribute;
    /// a request the gateway finds too large (`413`, or a `400` on the number of
    /// entries) is split in two and the smaller limit kept. A retried request takes one
    /// token of the retry budget, and a first request deposits one share, whatever the
    /// number of its entries.
    pub async fn send_batch(
        &self,
        queue: &str,
        messages: impl IntoIterator<Item = Message>,
    ) -> Vec<SendOutcome> {
        let messages: Vec<Message> = messages.into_iter().collect();
        let queue = match QueueName::parse(queue) {
            Ok(q) => q,
            Err(e) => {
                let reason = format!("queue {queue:?}: {e}");
                return messages
                    .iter()
                    .map(|_| SendOutcome::Invalid {
                        reason: reason.clone(),
                    })
                    .collect();
            }
        };
        let mut outcomes: Vec<Option<SendOutcome>> = vec![None; messages.len()];
        let mut ready = Vec::with_capacity(messages.len());
        for (index, message) in messages.into_iter().enumerate() {
            match entry(index, message) {
                Ok(entry) => ready.push(entry),
                Err(reason) => outcomes[index] = Some(SendOutcome::Invalid { reason }),
            }
        }
        let mut plan: VecDeque<Vec<Entry>> = self.plan(ready, &mut outcomes).into();
        while let Some(entries) = plan.pop_front() {
            let mut load = Batch::new(entries);
            let ended = self.deliver(&queue, &mut load).await;
            let (done, left) = load.into_parts();
            for (index, outcome) in done {
                outcomes[index] = Some(outcome);
            }
            if ended == Ended::Split {
                // In front of the rest of the plan: the order of the messages is kept.
                let again = self.replan(left, &mut outcomes);
                for request in again.into_iter().rev() {
                    plan.push_front(request);
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| SendOutcome::Failed {
                    last_error: AttemptError::Transport("no outcome".into()),
                    attempts: 0,
                    gave_up: GaveUp::NotRetryable,
                })
            })
            .collect()
    }

    /// The entries packed in order into requests under the limits in use; an entry that
    /// alone is over the byte limit gets its outcome here, without a request.
    fn plan(&self, entries: Vec<Entry>, outcomes: &mut [Option<SendOutcome>]) -> Vec<Vec<Entry>> {
        let max_messages = self.inner.max_batch_messages.load(Ordering::Relaxed).max(1);
        let max_bytes = self.inner.max_batch_bytes.load(Ordering::Relaxed);
        let mut requests: Vec<Vec<Entry>> = Vec::new();
        let mut current: Vec<Entry> = Vec::new();
        let mut bytes = 0;
        for entry in entries {
            let alone = request_bytes(1, entry.json.len());
            if alone > max_bytes {
                outcomes[entry.index] = Some(SendOutcome::Invalid {
                    reason: format!(
                        "alone in a batch request it makes {alone} bytes, over the {max_bytes} a request may have (max_batch_bytes, or the gateway's smaller limit)"
                    ),
                });
                continue;
            }
            let fits = current.len() < max_messages
                && request_bytes(current.len() + 1, bytes + entry.json.len()) <= max_bytes
                && current
                    .first()
                    .is_none_or(|first| first.traceparent == entry.traceparent);
            if !fits {
                requests.push(std::mem::take(&mut current));
                bytes = 0;
            }
            bytes += entry.json.len();
            current.push(entry);
        }
        if !current.is_empty() {
            requests.push(current);
        }
        requests
    }

    /// A request the gateway found too large, planned again under the limits it taught;
    /// in two halves at least, so that every split makes progress.
    fn replan(&self, entries: Vec<Entry>, outcomes: &mut [Option<SendOutcome>]) -> Vec<Vec<Entry>> {
        let count = entries.len();
        let mut again = self.plan(entries, outcomes);
        if again.len() == 1 && count > 1 {
            if let Some(mut whole) = again.pop() {
                let second = whole.split_off(count / 2);
                again = vec![whole, second];
            }
        }
        again
    }

    /// The send loop, for one message or one batch request's entries alike: wait out a
    /// drain, attempt, and retry what the policy allows.
    async fn deliver<L: Load>(&self, queue: &QueueName, load: &mut L) -> Ended {
        let mut deadline =
            Deadline::new(Instant::now(), self.inner.deadline, self.inner.deadline_cap);
        let mut tries = Tries::default();
        loop {
            if let Err(last_error) = self.wait_until_admitting(&mut deadline, &tries).await {
                load.give_up(GaveUp::Deadline, tries.attempts, last_error);
                return Ended::Done;
            }
            if !tries.deposited {
                // A first attempt earns the budget its share, once per message (or request).
                self.inner.budget.deposit(Instant::now());
                tries.deposited = true;
            }
            let answer = self.attempt(queue, load).await;
            // The drain (or start-up) shows in a send before the cached verdict expires:
            // a wait like the probe's, not a failed attempt.
            if let Ok(Some((state, after))) = answer.as_ref().map(L::deferral) {
                if let Verdict::Defer {
                    drain_ends: Some(end),
                    ..
                } = self.inner.lifecycle.observe_defer(state, after)
                {
                    deadline.follow_drain(end);
                }
                continue;
            }
            // Nothing listening (a restart's gap): the request never left, nothing was
            // stored, so this is a wait like `starting`, not a failed attempt.
            if let Err(TransportError::Connect(why)) = &answer {
                tries.last_error = Some(AttemptError::Transport(why.clone()));
                self.inner.lifecycle.observe_unreachable();
                continue;
            }
            let (retry_after, paced) = match load.judge(&mut tries, answer, &self.inner) {
                Step::Done => return Ended::Done,
                Step::Split => return Ended::Split,
                Step::Now => continue,
                Step::Retry { retry_after, paced } => (retry_after, paced),
            };
            match self.retry_at(&tries, retry_after, paced, deadline.at) {
                Ok(at) => tokio::time::sleep_until(at).await,
                Err(gave_up) => {
                    let last_error = tries
                        .last_error
                        .clone()
                        .unwrap_or_else(|| AttemptError::Transport("no attempt".into()));
                    load.give_up(gave_up, tries.attempts, last_error);
                    return Ended::Done;
                }
            }
        }
    }

    /// Wait while the gateway is draining, starting or unreachable; a deadline passed
    /// while waiting ends the send, with the error to report (the last attempt's, or the
    /// state waited on). The probe never ends it otherwise: whatever it failed with, the
    /// send's own answer decides.
    async fn wait_until_admitting(
        &self,
        deadline: &mut Deadline,
        tries: &Tries,
    ) -> Result<(), AttemptError> {
        loop {
            match self.inner.lifecycle.verdict().await {
                Verdict::Defer {
                    until,
                    state,
                    drain_ends,
                } => {
                    if let Some(end) = drain_ends {
                        deadline.follow_drain(end);
                    }
                    let now = Instant::now();
                    if now >= deadline.at {
                        return Err(tries
                            .last_error
                            .clone()
                            .unwrap_or(AttemptError::StillDeferred { state }));
                    }
                    self.inner.deferrals.fetch_add(1, Ordering::Relaxed);
                    let wake = until.min(deadline.at);
                    tracing::info!(
                        event = "client_deferred",
                        wait_ms = u64::try_from((wake - now).as_millis()).unwrap_or(u64::MAX),
                        reason = state.as_str(),
                        "the gateway is {state}: waiting before sending"
                    );
                    tokio::time::sleep_until(wake).await;
                }
                Verdict::Unreachable { until } => {
                    let now = Instant::now();
                    if now >= deadline.at {
                        return Err(tries.last_error.clone().unwrap_or_else(|| {
                            AttemptError::Transport("the gateway was unreachable".into())
                        }));
                    }
                    self.inner.deferrals.fetch_add(1, Ordering::Relaxed);
                    // Every send that met the closed port wakes a little apart.
                    let wake = until
                        .checked_add(self.inner.backoff.jitter(rand::random()))
                        .unwrap_or(until)
                        .min(deadline.at);
                    tracing::info!(
                        event = "client_deferred",
                        wait_ms = u64::try_from((wake - now).as_millis()).unwrap_or(u64::MAX),
                        reason = "unreachable",
                        "the gateway cannot be connected to: waiting before sending"
                    );
                    tokio::time::sleep_until(wake).await;
                }
                Verdict::Go => return Ok(()),
            }
        }
    }

    /// One exchange with the gateway.
    async fn attempt<L: Load>(
        &self,
        queue: &QueueName,
        load: &mut L,
    ) -> Result<L::Answer, TransportError> {
        // The permit is held for the exchange only, never across a wait.
        let _permit = self.inner.on_the_wire.acquire().await;
        let answer = load
            .send(self.inner.transport.as_ref(), queue.as_str())
            .await;
        if !matches!(answer, Err(TransportError::Connect(_))) {
            self.inner.requests.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    /// When the next attempt may go, if the backoff, the deadline and the shared retry
    /// budget all allow one.
    fn retry_at(
        &self,
        tries: &Tries,
        retry_after: Option<Duration>,
        paced: bool,
        deadline: Instant,
    ) -> Result<Instant, GaveUp> {
        let i = &self.inner;
        // A full queue that said when to ask again is pacing, not a failed attempt: the
        // attempt cap counts the others (the deadline bounds the rest).
        let delay = i
            .backoff
            .delay(tries.attempts - tries.paced, retry_after, rand::random())
            .ok_or(GaveUp::Attempts)?;
        let now = Instant::now();
        // The jitter on top of a Retry-After is the client's own: trimmed by the deadline
        // rather than turning a Retry-After that fits into a failure.
        let earliest = now.checked_add(retry_after.unwrap_or_default());
        let at = match (now.checked_add(delay), earliest) {
            (Some(at), _) if at <= deadline => at,
            (_, Some(earliest)) if earliest <= deadline => deadline,
            // No attempt could happen in time: say so now rather than sleep first.
            _ => return Err(GaveUp::Deadline),
        };
        // A retry the gateway paced goes at the rate it asked for: no retry storm for the
        // budget to damp, and a token per paced retry would end every message but one of a
        // client with several in flight within a second or two at a full queue.
        if !paced && !i.budget.try_withdraw(now) {
            i.budget_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(GaveUp::Budget);
        }
        i.retries.fetch_add(1, Ordering::Relaxed);
        Ok(at)
    }
}

/// When one message gives up waiting: `deadline` from the call, moved by an announced
/// drain to `deadline` past the drain's end, never past `deadline_cap` from the call.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    base: Duration,
    cap_at: Instant,
}

impl Deadline {
    fn new(start: Instant, base: Duration, cap: Duration) -> Self {
        let base = base.min(MAX_DEADLINE);
        Self {
            at: start + base,
            base,
            cap_at: start + cap.clamp(base, MAX_DEADLINE),
        }
    }

    /// The gateway announced that its drain ends by `end` (it may end sooner): the
    /// message's own patience starts then, as a drain is a wait nobody chose.
    fn follow_drain(&mut self, end: Instant) {
        let wanted = end.checked_add(self.base).unwrap_or(self.cap_at);
        self.at = self.at.max(wanted.min(self.cap_at));
    }
}

/// One message's (or one batch request's) attempts so far.
#[derive(Default)]
struct Tries {
    attempts: u32,
    /// Of those, the `429 queue_full` answers with a `Retry-After` of a second or more: the
    /// gateway pacing its producers at a full queue, which neither the attempt cap nor the
    /// retry budget counts.
    paced: u32,
    deposited: bool,
    last_error: Option<AttemptError>,
}

/// What one answer means for the message.
enum Judged {
    Final(SendOutcome),
    /// `paced`: the gateway's full queue said when to ask again (see [`Tries::paced`]).
    Retry {
        retry_after: Option<Duration>,
        paced: bool,
    },
}

impl Tries {
    /// What a single send's answer means for its message.
    fn judge(
        &mut self,
        answer: Result<transport::Answer, TransportError>,
        key: &MessageId,
    ) -> Judged {
        let a = match answer {
            Ok(a) => a,
            Err(e) => return self.judge_unanswered(e),
        };
        if (200..300).contains(&a.status) {
            return Judged::Final(SendOutcome::Queued {
                message_id: a.message_id.unwrap_or_else(|| key.to_string()),
            });
        }
        if a.status == 401 || a.status == 403 {
            return Judged::Final(SendOutcome::AuthFailed {
                status: a.status,
                code: a.code,
            });
        }
        self.judge_failed(a)
    }

    /// No answer: the token source had none (nothing was sent), or the exchange failed
    /// (an attempt, retried).
    fn judge_unanswered(&mut self, error: TransportError) -> Judged {
        match error {
            TransportError::NoToken(e) => {
                Judged::Final(no_token(e, self.last_error.clone(), self.attempts))
            }
            e => {
                self.attempts += 1;
                self.last_error = Some(AttemptError::Transport(e.to_string()));
                Judged::Retry {
                    retry_after: None,
                    paced: false,
                }
            }
        }
    }

    /// An answer neither queued nor an authentication failure: an attempt that failed,
    /// retried when its status (or an unknown outcome) allows, else final.
    fn judge_failed(&mut self, a: transport::Answer) -> Judged {
        self.attempts += 1;
        let error = AttemptError::Status {
            status: a.status,
            code: a.code.clone(),
        };
        // A `502` whose send may have reached the broker is retried like a `504` (the
        // same key), as a batch entry with `outcome: unknown` is.
        if is_retryable_status(a.status) || a.outcome_unknown {
            let paced = is_pacing(a.status, a.code.as_ref(), a.retry_after);
            if paced {
                self.paced += 1;
            }
            self.last_error = Some(error);
            return Judged::Retry {
                retry_after: a.retry_after,
                paced,
            };
        }
        Judged::Final(if a.status >= 500 {
            SendOutcome::Failed {
                last_error: error,
                attempts: self.attempts,
                gave_up: GaveUp::NotRetryable,
            }
        } else {
            SendOutcome::Refused {
                status: a.status,
                code: a.code,
            }
        })
    }
}

/// What a message gets when the token source fails before an attempt: `NoToken` (never
/// sent) when no attempt went before, else `Failed` with what the last one said, since an
/// earlier attempt may have stored it (its outcome unknown).
fn no_token(
    error: token::TokenSourceError,
    last_error: Option<AttemptError>,
    attempts: u32,
) -> SendOutcome {
    match last_error {
        Some(last_error) if attempts > 0 => SendOutcome::Failed {
            last_error,
            attempts,
            gave_up: GaveUp::NoToken,
        },
        _ => SendOutcome::NoToken {
            reason: error.to_string(),
        },
    }
}

/// The gateway's full queue saying when to ask again (it never says less than a second: a
/// smaller value is no pacing).
fn is_pacing(status: u16, code: Option<&AnyCode>, retry_after: Option<Duration>) -> bool {
    status == 429
        && retry_after.is_some_and(|r| r >= Duration::from_secs(1))
        && code.and_then(AnyCode::known) == Some(ErrorCode::QueueFull)
}

/// How a run of the send loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Every message (entry) it carried has its outcome.
    Done,
    /// The gateway found the request too large: its entries are to be planned again.
    Split,
}

/// What an answer leaves the loop to do.
enum Step {
    Done,
    /// Send what is left at once: nothing about it failed (a `400` or `422` named other
    /// entries, a `429` named room for the first ones). Not an attempt, not a retry.
    Now,
    Retry {
        retry_after: Option<Duration>,
        paced: bool,
    },
    Split,
}

/// What the send loop carries: one message on the single-send route ([`One`]), or one
/// batch request's entries ([`Batch`]). The loop itself (drain, deferral, deadline,
/// backoff, budget) is the same for both; only the exchange and the reading of its
/// answer differ.
#[async_trait]
trait Load: Send {
    type Answer: Send;

    async fn send(
        &mut self,
        transport: &dyn Transport,
        queue: &str,
    ) -> Result<Self::Answer, TransportError>;

    /// A `503 draining` or `starting`: a wait, not an attempt.
    fn deferral(answer: &Self::Answer) -> Option<(GatewayState, Option<Duration>)>;

    /// Record what the answer decided and say what is left to do.
    fn judge(
        &mut self,
        tries: &mut Tries,
        answer: Result<Self::Answer, TransportError>,
        client: &Inner,
    ) -> Step;

    /// Retries ran out: whatever is still undecided is failed.
    fn give_up(&mut self, gave_up: GaveUp, attempts: u32, last_error: AttemptError);
}

/// One message on the single-send route.
struct One {
    message: Outgoing,
    outcome: Option<SendOutcome>,
}

#[async_trait]
impl Load for One {
    type Answer = transport::Answer;

    async fn send(
        &mut self,
        transport: &dyn Transport,
        queue: &str,
    ) -> Result<transport::Answer, TransportError> {
        transport.post(queue, &self.message).await
    }

    fn deferral(answer: &transport::Answer) -> Option<(GatewayState, Option<Duration>)> {
        answer.deferral()
    }

    fn judge(
        &mut self,
        tries: &mut Tries,
        answer: Result<transport::Answer, TransportError>,
        _: &Inner,
    ) -> Step {
        match tries.judge(answer, &self.message.key) {
            Judged::Final(outcome) => {
                self.outcome = Some(outcome);
                Step::Done
            }
            Judged::Retry { retry_after, paced } => Step::Retry { retry_after, paced },
        }
    }

    fn give_up(&mut self, gave_up: GaveUp, attempts: u32, last_error: AttemptError) {
        self.outcome = Some(SendOutcome::Failed {
            last_error,
            attempts,
            gave_up,
        });
    }
}

/// A message checked for the single-send route: its key, ids, trace and headers.
fn single(message: Message) -> Result<Outgoing, String> {
    let key = key_of(message.idempotency_key.as_deref())?;
    let correlation_id = message
        .correlation_id
        .as_deref()
        .map(CorrelationId::parse)
        .transpose()
        .map_err(|e| format!("{}: {e}", sendgate_wire::headers::CORRELATION_ID))?;
    let traceparent = traceparent_of(message.traceparent.as_deref())?;
    let attributes =
        transport::attribute_headers(&message.attributes).map_err(|e| e.to_string())?;
    Ok(Outgoing {
        key,
        body: message.body,
        correlation_id,
        traceparent,
        attributes,
    })
}

fn key_of(given: Option<&str>) -> Result<MessageId, String> {
    match given.map(MessageId::parse) {
        None => Ok(MessageId::generate()),
        Some(Ok(k)) => Ok(k),
        Some(Err(e)) => Err(format!("Idempotency-Key: {e}")),
    }
}

fn traceparent_of(given: Option<&str>) -> Result<Option<HeaderValue>, String> {
    given
        .map(|t| transport::header_value(transport::TRACEPARENT, t))
        .transpose()
        .map_err(|e| e.to_string())
}

/// One entry of a batch, checked and written as its JSON text once.
struct Entry {
    /// Its place in the caller's list.
    index: usize,
    key: MessageId,
    attributes: MessageAttributes,
    /// The text the planner groups by: entries of one request share a trace.
    traceparent: Option<String>,
    traceparent_header: Option<HeaderValue>,
    /// The entry in a request's `messages`, its key in it.
    json: Vec<u8>,
    /// The last attempt's error for this entry (a `207` names one per entry).
    last_error: Option<AttemptError>,
    outcome: Option<SendOutcome>,
}

/// A message as a batch entry: an id (made here when it has none), its body checked as
/// JSON (one bad body would make the whole request malformed), its text written once.
fn entry(index: usize, message: Message) -> Result<Entry, String> {
    let key = key_of(message.idempotency_key.as_deref())?;
    if let Some(correlation) = message.correlation_id.as_deref() {
        CorrelationId::parse(correlation).map_err(|e| format!("correlation_id: {e}"))?;
    }
    let traceparent_header = traceparent_of(message.traceparent.as_deref())?;
    let text = String::from_utf8(message.body.to_vec())
        .map_err(|e| format!("body: not valid UTF-8: {e}"))?;
    // serde_json's raw values are on: the wire crate's `BatchEntry` needs them.
    let body = serde_json::value::RawValue::from_string(text)
        .map_err(|e| format!("body: not valid JSON: {e}"))?;
    let wire = BatchEntry {
        body,
        idempotency_key: Some(key.as_str().to_owned()),
        correlation_id: message.correlation_id,
        attributes: message.attributes,
    };
    let json = serde_json::to_vec(&wire).map_err(|e| format!("entry: {e}"))?;
    Ok(Entry {
        index,
        key,
        attributes: wire.attributes,
        traceparent: message.traceparent,
        traceparent_header,
        json,
        last_error: None,
        outcome: None,
    })
}

const REQUEST_HEAD: &[u8] = br#"{"messages":["#;
const REQUEST_TAIL: &[u8] = b"]}";

/// The size of a request's body holding `entries` entries of `entry_bytes` bytes in all.
fn request_bytes(entries: usize, entry_bytes: usize) -> usize {
    REQUEST_HEAD.len() + entry_bytes + entries.saturating_sub(1) + REQUEST_TAIL.len()
}

/// The entries of one batch request, as the send loop carries them.
struct Batch {
    entries: Vec<Entry>,
    traceparent: Option<HeaderValue>,
    /// Positions in `entries` still undecided, in order.
    pending: Vec<usize>,
    /// Positions the last request carried.
    sent: Vec<usize>,
    /// A `429 queue_full` named room for this many: the next request carries only them...
    room: Option<usize>,
    /// ...and the rest wait until then (and was that 429 the gateway's pacing?).
    rest: Option<(Instant, bool)>,
    /// The last request carried only the room of a 429: another 429 is waited out.
    room_round: bool,
}

impl Batch {
    fn new(entries: Vec<Entry>) -> Self {
        Self {
            traceparent: entries.first().and_then(|e| e.traceparent_header.clone()),
            pending: (0..entries.len()).collect(),
            entries,
            sent: Vec::new(),
            room: None,
            rest: None,
            room_round: false,
        }
    }

    /// The outcomes decided, by the caller's index, and the entries still undecided (to be
    /// planned again after a split).
    fn into_parts(self) -> (Vec<(usize, SendOutcome)>, Vec<Entry>) {
        let mut done = Vec::new();
        let mut left = Vec::new();
        for mut entry in self.entries {
            match entry.outcome.take() {
                Some(outcome) => done.push((entry.index, outcome)),
                None => left.push(entry),
            }
        }
        (done, left)
    }

    fn decide(&mut self, position: usize, outcome: SendOutcome) {
        if let Some(entry) = self.entries.get_mut(position) {
            entry.outcome = Some(outcome);
        }
    }

    /// Every entry the last request carried gets `outcome`.
    fn decide_sent(&mut self, outcome: impl Fn() -> SendOutcome) {
        for position in self.sent.clone() {
            self.decide(position, outcome());
        }
    }

    /// Read the answer for the entries sent; what is left, and when it goes.
    fn read(
        &mut self,
        tries: &mut Tries,
        answer: Result<BatchAnswer, TransportError>,
        client: &Inner,
    ) -> Step {
        let a = match answer {
            Ok(a) => a,
            Err(e) => return self.read_unanswered(tries, e),
        };
        let status = a.status;
        if status == 207 {
            return self.read_partial(tries, &a);
        }
        if (200..300).contains(&status) {
            self.read_queued(&a);
            return Step::Done;
        }
        if status == 401 || status == 403 {
            // No entry can go with this credential: the unsent ones neither.
            for position in self.pending.clone() {
                self.decide(
                    position,
                    SendOutcome::AuthFailed {
                        status,
                        code: a.code.clone(),
                    },
                );
            }
            return Step::Done;
        }
        let known = a.code.as_ref().and_then(AnyCode::known);
        match (status, known) {
            (400, Some(ErrorCode::InvalidRequest)) => self.read_invalid(&a, client),
            (413, _) if self.sent.len() > 1 => {
                if let Some(limit) = a.limit_bytes {
                    client
                        .max_batch_bytes
                        .fetch_min(limit.max(1), Ordering::Relaxed);
                }
                Step::Split
            }
            (422, Some(ErrorCode::UnsupportedAttribute)) => self.read_unsupported_attribute(&a),
            _ => self.read_failed(tries, &a, known),
        }
    }

    /// No answer: the token source had none (nothing was sent), or the request was cut or
    /// timed out after it was sent.
    fn read_unanswered(&mut self, tries: &mut Tries, error: TransportError) -> Step {
        match error {
            TransportError::NoToken(e) => {
                // Nothing was sent: no entry can go until the source has a token.
                for position in self.pending.clone() {
                    let last_error = self.entries[position].last_error.clone();
                    self.decide(position, no_token(e.clone(), last_error, tries.attempts));
                }
                Step::Done
            }
            e => {
                // Cut or timed out after it was sent: every entry's outcome is unknown.
                tries.attempts += 1;
                let error = AttemptError::Transport(e.to_string());
                self.fail_sent(&error);
                tries.last_error = Some(error);
                Step::Retry {
                    retry_after: None,
                    paced: false,
                }
            }
        }
    }

    /// A `2xx`: every entry sent is queued, under the id the gateway names (else its key).
    fn read_queued(&mut self, a: &BatchAnswer) {
        for (k, position) in self.sent.clone().into_iter().enumerate() {
            let message_id = match a.queued.get(k) {
                Some(m) => m.message_id.to_string(),
                None => self.entries[position].key.to_string(),
            };
            self.decide(position, SendOutcome::Queued { message_id });
        }
    }

    /// A `422 unsupported_attribute`: the entries that carry the attribute are refused, as
    /// each would be alone, and the others sent again at once; when none carries it,
    /// every entry is refused.
    fn read_unsupported_attribute(&mut self, a: &BatchAnswer) -> Step {
        let refused = || SendOutcome::Refused {
            status: a.status,
            code: a.code.clone(),
        };
        let carrying: Vec<usize> = self
            .sent
            .iter()
            .copied()
            .filter(|&p| {
                a.attribute
                    .as_deref()
                    .is_some_and(|name| has_attribute(&self.entries[p].attributes, name))
            })
            .collect();
        if carrying.is_empty() {
            self.decide_sent(refused);
            return Step::Done;
        }
        for position in carrying {
            self.decide(position, refused());
        }
        Step::Now
    }

    /// Any other answer: an attempt that failed for every entry sent, retried when its
    /// status allows, else each entry's final outcome.
    fn read_failed(
        &mut self,
        tries: &mut Tries,
        a: &BatchAnswer,
        known: Option<ErrorCode>,
    ) -> Step {
        let status = a.status;
        tries.attempts += 1;
        let error = AttemptError::Status {
            status,
            code: a.code.clone(),
        };
        if is_retryable_status(status) {
            let paced = is_pacing(status, a.code.as_ref(), a.retry_after);
            if paced {
                tries.paced += 1;
            }
            self.fail_sent(&error);
            tries.last_error = Some(error);
            // Room for some: those go at once (never more than the room), the rest after
            // the Retry-After. Once per 429: a second one is waited out whole.
            let room = a.room.and_then(|r| usize::try_from(r).ok()).unwrap_or(0);
            if known == Some(ErrorCode::QueueFull)
                && room > 0
                && room < self.sent.len()
                && !self.room_round
            {
                self.room = Some(room);
                self.rest = Some((Instant::now() + a.retry_after.unwrap_or_default(), paced));
                return Step::Now;
            }
            return Step::Retry {
                retry_after: a.retry_after,
                paced,
            };
        }
        if status >= 500 {
            let attempts = tries.attempts;
            self.decide_sent(|| SendOutcome::Failed {
                last_error: error.clone(),
                attempts,
                gave_up: GaveUp::NotRetryable,
            });
        } else {
            self.decide_sent(|| SendOutcome::Refused {
                status,
                code: a.code.clone(),
            });
        }
        Step::Done
    }

    fn fail_sent(&mut self, error: &AttemptError) {
        for position in self.sent.clone() {
            self.entries[position].last_error = Some(error.clone());
        }
    }

    /// A `207`: each entry's own result. Only the failed ones a retry can help (a retryable
    /// code, or an outcome unknown: the same id keeps a retry from storing it twice) stay.
    fn read_partial(&mut self, tries: &mut Tries, a: &BatchAnswer) -> Step {
        let mut again: Option<AttemptError> = None;
        let attempts = tries.attempts + 1;
        for (k, position) in self.sent.clone().into_iter().enumerate() {
            let result = a.results.iter().find(|r| r.index == k);
            if let Some(error) = self.read_entry(position, result, attempts) {
                again.get_or_insert(error);
            }
        }
        match again {
            None => Step::Done,
            Some(error) => {
                tries.attempts = attempts;
                tries.last_error = Some(error);
                Step::Retry {
                    retry_after: a.retry_after,
                    paced: false,
                }
            }
        }
    }

    /// One entry's result in a `207`: its outcome decided, or the error it is sent again
    /// after. `None` (not named: a body that did not parse) is an outcome unknown.
    fn read_entry(
        &mut self,
        position: usize,
        result: Option<&sendgate_wire::EntryResult<'_>>,
        attempts: u32,
    ) -> Option<AttemptError> {
        let Some(result) = result else {
            let error = AttemptError::Status {
                status: 207,
                code: None,
            };
            self.entries[position].last_error = Some(error.clone());
            return Some(error);
        };
        if !result.failed() {
            let message_id = result.message_id.to_string();
            self.decide(position, SendOutcome::Queued { message_id });
            return None;
        }
        let code = result.code.clone();
        let status = code.as_ref().map_or(502, status_of);
        let error = AttemptError::Status {
            status,
            code: code.clone(),
        };
        if result.outcome.as_deref() == Some(sendgate_wire::ErrorBody::OUTCOME_UNKNOWN)
            || is_retryable_status(status)
        {
            self.entries[position].last_error = Some(error.clone());
            return Some(error);
        }
        let outcome = if status == 401 || status == 403 {
            SendOutcome::AuthFailed { status, code }
        } else if status >= 500 {
            SendOutcome::Failed {
                last_error: error,
                attempts,
                gave_up: GaveUp::NotRetryable,
            }
        } else {
            SendOutcome::Refused { status, code }
        };
        self.decide(position, outcome);
        None
    }

    /// A `400`: the entries it names (`["body", "messages", 3, ...]`) are refused and the
    /// others sent again at once; one on the number of entries (`["body", "messages"]`)
    /// splits the request; anything else refuses every entry.
    fn read_invalid(&mut self, a: &BatchAnswer, client: &Inner) -> Step {
        let refused = || SendOutcome::Refused {
            status: 400,
            code: a.code.clone(),
        };
        let named: Option<Vec<usize>> = a
            .errors
            .iter()
            .map(|e| match e.loc.as_slice() {
                [body, messages, Loc::Index(k), ..]
                    if *body == "body" && *messages == "messages" =>
                {
                    usize::try_from(*k)
                        .ok()
                        .and_then(|k| self.sent.get(k).copied())
                }
                _ => None,
            })
            .collect();
        match named {
            Some(positions) if !positions.is_empty() => {
                for position in positions {
                    self.decide(position, refused());
                }
                Step::Now
            }
            _ => {
                let on_the_count = a.errors.len() == 1
                    && a.errors[0].loc.len() == 2
                    && a.errors[0].loc[0] == "body"
                    && a.errors[0].loc[1] == "messages";
                if on_the_count && self.sent.len() > 1 {
                    client
                        .max_batch_messages
                        .fetch_min((self.sent.len() / 2).max(1), Ordering::Relaxed);
                    return Step::Split;
                }
                self.decide_sent(refused);
                Step::Done
            }
        }
    }
}

#[async_trait]
impl Load for Batch {
    type Answer = BatchAnswer;

    async fn send(
        &mut self,
        transport: &dyn Transport,
        queue: &str,
    ) -> Result<BatchAnswer, TransportError> {
        self.room_round = self.room.is_some();
        let take = self.room.take().unwrap_or(self.pending.len());
        if !self.room_round {
            self.rest = None;
        }
        self.sent = self.pending.iter().copied().take(take).collect();
        let entry_bytes: usize = self.sent.iter().map(|&p| self.entries[p].json.len()).sum();
        let mut body = Vec::with_capacity(request_bytes(self.sent.len(), entry_bytes));
        body.extend_from_slice(REQUEST_HEAD);
        for (k, &position) in self.sent.iter().enumerate() {
            if k > 0 {
                body.push(b',');
            }
            body.extend_from_slice(&self.entries[position].json);
        }
        body.extend_from_slice(REQUEST_TAIL);
        let batch = OutgoingBatch {
            body: Bytes::from(body),
            traceparent: self.traceparent.clone(),
        };
        transport.post_batch(queue, &batch).await
    }

    fn deferral(answer: &BatchAnswer) -> Option<(GatewayState, Option<Duration>)> {
        answer.deferral()
    }

    fn judge(
        &mut self,
        tries: &mut Tries,
        answer: Result<BatchAnswer, TransportError>,
        client: &Inner,
    ) -> Step {
        let step = self.read(tries, answer, client);
        let entries = &self.entries;
        self.pending.retain(|&p| entries[p].outcome.is_none());
        if self.pending.is_empty() {
            return Step::Done;
        }
        // After a request that carried only a 429's room, the rest wait for its
        // Retry-After, whatever the room's own answer was.
        if let Some((at, rest_paced)) = self.rest.take_if(|_| self.room_round) {
            let wait = at.saturating_duration_since(Instant::now());
            return match step {
                Step::Retry { retry_after, paced } => Step::Retry {
                    retry_after: Some(retry_after.unwrap_or_default().max(wait)),
                    paced,
                },
                Step::Split => Step::Split,
                Step::Done | Step::Now => Step::Retry {
                    retry_after: Some(wait),
                    paced: rest_paced,
                },
            };
        }
        match step {
            // Entries left that the answer did not name: they go again at once.
            Step::Done => Step::Now,
            other => other,
        }
    }

    fn give_up(&mut self, gave_up: GaveUp, attempts: u32, last_error: AttemptError) {
        for position in self.pending.clone() {
            let entry = &mut self.entries[position];
            entry.outcome = Some(SendOutcome::Failed {
                last_error: entry
                    .last_error
                    .clone()
                    .unwrap_or_else(|| last_error.clone()),
                attempts,
                gave_up,
            });
        }
    }
}

/// Whether `attributes` sets the attribute named `name` (its batch field's name, as a
/// `422 unsupported_attribute` names it).
fn has_attribute(attributes: &MessageAttributes, name: &str) -> bool {
    match name {
        "subject" => attributes.subject.is_some(),
        "session_id" => attributes.session_id.is_some(),
        "partition_key" => attributes.partition_key.is_some(),
        "time_to_live_s" => attributes.time_to_live_s.is_some(),
        "scheduled_enqueue_time" => attributes.scheduled_enqueue_time.is_some(),
        "reply_to" => attributes.reply_to.is_some(),
        "to" => attributes.to.is_some(),
        "properties" => !attributes.properties.is_empty(),
        _ => false,
    }
}

/// The status a single send answers with `code`: a `207`'s entries carry codes only, and
/// the client decides by the status as for a single send (contract section 4's table).
/// A code this version does not know reads as a `502`: a failure it cannot place, not
/// retried unless its outcome is unknown.
fn status_of(code: &AnyCode) -> u16 {
    use ErrorCode as C;
    match code.known() {
        Some(C::NotFound | C::UnknownQueue) => 404,
        Some(C::MethodNotAllowed) => 405,
        Some(C::Unauthenticated) => 401,
        Some(C::Forbidden | C::ForbiddenHost) => 403,
        Some(C::UnsupportedMediaType) => 415,
        Some(C::PayloadTooLarge) => 413,
        Some(C::InvalidRequest) => 400,
        Some(C::RequestTimeout) => 408,
        Some(C::QueueFull) => 429,
        Some(
            C::Starting
            | C::Draining
            | C::CapacityUnknown
            | C::Saturated
            | C::BackendUnavailable
            | C::BackendBusy
            | C::SettingsUnavailable,
        ) => 503,
        Some(C::SendTimeout) => 504,
        Some(C::QueueDisabled) => 409,
        Some(C::UnsupportedAttribute) => 422,
        Some(C::BackendAuthFailed | C::SendFailed) | None => 502,
    }
}

#[cfg(test)]
mod tests;
