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
//! - here: the [`Client`] and its three calls.
//! - `config.rs`: [`ClientConfig`], how a client behaves.
//! - `message.rs`: [`Message`], one message with its ids, attributes and trace.
//! - `outcome.rs`: what became of a message ([`SendOutcome`]) and why an attempt failed.
//! - `send_loop.rs`: the send loop, one for a single message and for a batch request's
//!   entries alike: wait out a drain, attempt, retry within budget and deadline.
//! - `single.rs`: one message on the single-send route, and what its answer means.
//! - `batch.rs`: a batch planned into requests, and what a batch answer means for each
//!   entry.
//! - `lifecycle.rs`: is the gateway draining? one cached, single-flight probe.
//! - `retry.rs`: what is retried, the backoff, the budget shared across messages.
//! - `throttle.rs`: optional client-side adaptive throttling (the SRE book's), holding
//!   attempts back while most recent ones were refused.
//! - `transport.rs`: the HTTP calls (a send, a batch, the probe), and the trait that lets
//!   tests fake them.
//!
//! Codes and states are the gateway's own types from `sendgate-wire`, re-exported here:
//! the client decides by [`ErrorCode`] and [`GatewayState`], never by matching text.

mod batch;
mod config;
mod jitter;
pub mod lifecycle;
mod message;
mod outcome;
pub mod retry;
mod send_loop;
mod single;
pub mod throttle;
pub mod token;
pub mod transport;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;

use batch::{entry, Batch, Entry};
use lifecycle::LifecycleProbe;
use retry::{Backoff, RetryBudget};
use send_loop::Ended;
use single::{single, One};
use throttle::AdaptiveThrottle;
use transport::{HttpTransport, Transport, TransportSetupError};

pub use config::{ClientConfig, Criticality, MAX_DEADLINE};
pub use message::Message;
pub use outcome::{code_label, AttemptError, ClientError, ClientStats, GaveUp, SendOutcome};

pub use sendgate_wire::{
    AnyCode, ErrorCode, GatewayState, IdError, MessageAttributes, MessageId, QueueName,
    QueueNameError,
};
#[cfg(feature = "entra")]
pub use token::EntraTokenSource;
pub use token::{TokenSource, TokenSourceError};

/// A producer client. Clone it freely: clones share the pool, the verdict and the budget.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Arc<dyn Transport>,
    lifecycle: LifecycleProbe,
    budget: RetryBudget,
    throttle: Option<AdaptiveThrottle>,
    backoff: Backoff,
    jitter: jitter::Jitter,
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
    held: AtomicU64,
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
                throttle: config.throttle.map(AdaptiveThrottle::new),
                backoff: config.backoff,
                jitter: jitter::Jitter::new(config.jitter_seed),
                deadline: config.deadline,
                deadline_cap: config.deadline_cap,
                on_the_wire: Semaphore::new(config.max_concurrent_requests.max(1)),
                max_batch_messages: AtomicUsize::new(config.max_batch_messages.max(1)),
                max_batch_bytes: AtomicUsize::new(config.max_batch_bytes.max(1)),
                requests: AtomicU64::new(0),
                retries: AtomicU64::new(0),
                budget_refusals: AtomicU64::new(0),
                held: AtomicU64::new(0),
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
            held: i.held.load(Ordering::Relaxed),
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
    /// entries) is split in two and the smaller limit kept. The retry budget counts
    /// requests, not entries: a retried request costs what a retried single send does,
    /// whatever the number of its entries, and a request that queues some of them gives
    /// back what a successful single send does.
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
}

#[cfg(test)]
mod tests;
