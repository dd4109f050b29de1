//! How a client behaves: [`ClientConfig`], built from the contract's defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::retry::{Backoff, BudgetConfig};
use crate::throttle::ThrottleConfig;
use crate::token::TokenSource;

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
    /// The retry budget shared by every message of the client (see [`RetryBudget`](crate::retry::RetryBudget)).
    pub budget: BudgetConfig,
    /// Client-side adaptive throttling ([`AdaptiveThrottle`](crate::throttle::AdaptiveThrottle)),
    /// off unless set: attempts are held back locally while most recent ones were refused.
    pub throttle: Option<ThrottleConfig>,
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
    /// Seeds the retries' jitter and the throttle's draws, so a run can be repeated (on a
    /// deterministic scheduler: tokio's current-thread runtime, a paused clock); `None`
    /// (the default) seeds them from the OS. Producers given one seed retry in lockstep,
    /// which is what jitter is there to prevent: leave it `None` in production.
    pub jitter_seed: Option<u64>,
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
            .field("throttle", &self.throttle)
            .field("probe_ttl", &self.probe_ttl)
            .field("probe_timeout", &self.probe_timeout)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("max_batch_messages", &self.max_batch_messages)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .field("criticality", &self.criticality)
            .field("jitter_seed", &self.jitter_seed)
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
            throttle: None,
            probe_ttl: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(3),
            max_concurrent_requests: 64,
            max_batch_messages: 100,
            max_batch_bytes: 1 << 20,
            criticality: None,
            jitter_seed: None,
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

    /// Ask `source` for the token before every request (see [`token`](crate::token)).
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

    /// Hold attempts back locally while the gateway refuses most of them (off by default).
    pub fn adaptive_throttle(mut self, throttle: ThrottleConfig) -> Self {
        self.throttle = Some(throttle);
        self
    }

    /// The gateway's batch limits: entries and bytes per request (at least 1 each).
    pub fn batch_limits(mut self, messages: usize, bytes: usize) -> Self {
        self.max_batch_messages = messages;
        self.max_batch_bytes = bytes;
        self
    }
}
