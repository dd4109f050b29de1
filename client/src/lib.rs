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
//! One [`Client`] is meant to be shared (it is cheap to clone): its connection pool, its
//! lifecycle verdict and its retry budget are what make a burst of sends polite.
//!
//! - `lifecycle.rs`: is the gateway draining? one cached, single-flight probe.
//! - `retry.rs`: what is retried, the backoff, the budget shared across messages.
//! - `transport.rs`: the two HTTP calls, and the trait that lets tests fake them.
//!
//! Codes and states are the gateway's own types from `sendgate-wire`, re-exported here:
//! the client decides by [`ErrorCode`] and [`GatewayState`], never by matching text.

pub mod lifecycle;
pub mod retry;
pub mod transport;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use lifecycle::{LifecycleProbe, Verdict};
use retry::{is_retryable_status, Backoff, BudgetConfig, RetryBudget};
use transport::{HttpTransport, Transport, TransportSetupError};

pub use sendgate_wire::{
    AnyCode, ErrorCode, GatewayState, IdError, MessageId, QueueName, QueueNameError,
};

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
}

impl fmt::Debug for ClientConfig {
    // Never print the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("deadline", &self.deadline)
            .field("deadline_cap", &self.deadline_cap)
            .field("request_timeout", &self.request_timeout)
            .field("backoff", &self.backoff)
            .field("budget", &self.budget)
            .field("probe_ttl", &self.probe_ttl)
            .field("probe_timeout", &self.probe_timeout)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .finish()
    }
}

impl ClientConfig {
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            token: None,
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
        }
    }

    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
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
    /// The answer is a server error outside what is retried (a `502`): reported at once.
    NotRetryable,
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Attempts => "attempts exhausted",
            Self::Budget => "retry budget spent",
            Self::Deadline => "deadline reached",
            Self::NotRetryable => "not retryable",
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
    /// `502`). `last_error` is the last attempt's. Never reported as sent: after a `504`
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
    /// Refused locally, never sent: the queue name or the key cannot be valid.
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
        let transport = HttpTransport::new(
            &config.base_url,
            config.token.as_deref(),
            config.request_timeout,
        )?;
        Ok(Self::with_transport(config, Arc::new(transport)))
    }

    /// A client over any [`Transport`] (tests use a scripted one). `base_url`, `token`
    /// and `request_timeout` of `config` are the transport's business and unused here.
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
        let queue = match QueueName::parse(queue) {
            Ok(q) => q,
            Err(e) => {
                return SendOutcome::Invalid {
                    reason: format!("queue {queue:?}: {e}"),
                }
            }
        };
        let key = match idempotency_key.map(MessageId::parse) {
            None => MessageId::generate(),
            Some(Ok(k)) => k,
            Some(Err(e)) => {
                return SendOutcome::Invalid {
                    reason: format!("Idempotency-Key: {e}"),
                }
            }
        };
        self.deliver(&queue, body.into(), &key).await
    }

    /// The send loop: wait out a drain, attempt, and retry what the policy allows.
    async fn deliver(&self, queue: &QueueName, body: Bytes, key: &MessageId) -> SendOutcome {
        let mut deadline =
            Deadline::new(Instant::now(), self.inner.deadline, self.inner.deadline_cap);
        let mut tries = Tries::default();
        loop {
            if let Err(outcome) = self.wait_until_admitting(&mut deadline, &tries).await {
                return outcome;
            }
            if !tries.deposited {
                // A first attempt earns the budget its share, once per message.
                self.inner.budget.deposit(Instant::now());
                tries.deposited = true;
            }
            let answer = self.attempt(queue, &body, key).await;
            // The drain (or start-up) shows in a send before the cached verdict expires:
            // a wait like the probe's, not a failed attempt.
            if let Ok(Some((state, after))) = answer.as_ref().map(|a| a.deferral()) {
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
            if let Err(transport::TransportError::Connect(why)) = &answer {
                tries.last_error = Some(AttemptError::Transport(why.clone()));
                self.inner.lifecycle.observe_unreachable();
                continue;
            }
            let (retry_after, paced) = match tries.judge(answer, key) {
                Judged::Final(outcome) => return outcome,
                Judged::Retry { retry_after, paced } => (retry_after, paced),
            };
            match self.retry_at(&tries, retry_after, paced, deadline.at) {
                Ok(at) => tokio::time::sleep_until(at).await,
                Err(gave_up) => return tries.give_up(gave_up),
            }
        }
    }

    /// Wait while the gateway is draining, starting or unreachable; a deadline passed
    /// while waiting ends the send. The probe never ends it otherwise: whatever it failed with, the
    /// send's own answer decides.
    async fn wait_until_admitting(
        &self,
        deadline: &mut Deadline,
        tries: &Tries,
    ) -> Result<(), SendOutcome> {
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
                        return Err(SendOutcome::Failed {
                            last_error: tries
                                .last_error
                                .clone()
                                .unwrap_or(AttemptError::StillDeferred { state }),
                            attempts: tries.attempts,
                            gave_up: GaveUp::Deadline,
                        });
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
                        return Err(SendOutcome::Failed {
                            last_error: tries.last_error.clone().unwrap_or_else(|| {
                                AttemptError::Transport("the gateway was unreachable".into())
                            }),
                            attempts: tries.attempts,
                            gave_up: GaveUp::Deadline,
                        });
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
    async fn attempt(
        &self,
        queue: &QueueName,
        body: &Bytes,
        key: &MessageId,
    ) -> Result<transport::Answer, transport::TransportError> {
        // The permit is held for the exchange only, never across a wait.
        let _permit = self.inner.on_the_wire.acquire().await;
        let answer = self
            .inner
            .transport
            .post(queue.as_str(), body.clone(), key.as_str())
            .await;
        if !matches!(answer, Err(transport::TransportError::Connect(_))) {
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

/// One message's attempts so far.
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
    fn judge(
        &mut self,
        answer: Result<transport::Answer, transport::TransportError>,
        key: &MessageId,
    ) -> Judged {
        let a = match answer {
            Ok(a) => a,
            Err(e) => {
                self.attempts += 1;
                self.last_error = Some(AttemptError::Transport(e.to_string()));
                return Judged::Retry {
                    retry_after: None,
                    paced: false,
                };
            }
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
        self.attempts += 1;
        let error = AttemptError::Status {
            status: a.status,
            code: a.code.clone(),
        };
        if is_retryable_status(a.status) {
            // The gateway's full queue saying when to ask again (it never says less than a
            // second: a smaller value is no pacing).
            let paced = a.status == 429
                && a.retry_after.is_some_and(|r| r >= Duration::from_secs(1))
                && a.code.as_ref().and_then(AnyCode::known) == Some(ErrorCode::QueueFull);
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

    fn give_up(&self, gave_up: GaveUp) -> SendOutcome {
        SendOutcome::Failed {
            last_error: self
                .last_error
                .clone()
                .unwrap_or_else(|| AttemptError::Transport("no attempt".into())),
            attempts: self.attempts,
            gave_up,
        }
    }
}

#[cfg(test)]
mod tests;
