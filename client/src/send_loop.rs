//! The send loop, for one message ([`One`](crate::single::One)) or one batch request's
//! entries ([`Batch`](crate::batch::Batch)) alike: wait out a drain, attempt, and retry
//! what the policy allows within the deadline and the shared budget.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use sendgate_wire::{AnyCode, ErrorCode, GatewayState, QueueName};
use tokio::time::Instant;

use crate::lifecycle::Verdict;
use crate::token;
use crate::transport::{Transport, TransportError};
use crate::{AttemptError, Client, GaveUp, Inner, SendOutcome, MAX_DEADLINE};

impl Client {
    /// The send loop, for one message or one batch request's entries alike: wait out a
    /// drain, attempt, and retry what the policy allows.
    pub(crate) async fn deliver<L: Load>(&self, queue: &QueueName, load: &mut L) -> Ended {
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
pub(crate) struct Tries {
    pub(crate) attempts: u32,
    /// Of those, the `429 queue_full` answers with a `Retry-After` of a second or more: the
    /// gateway pacing its producers at a full queue, which neither the attempt cap nor the
    /// retry budget counts.
    pub(crate) paced: u32,
    deposited: bool,
    pub(crate) last_error: Option<AttemptError>,
}

/// What a message gets when the token source fails before an attempt: `NoToken` (never
/// sent) when no attempt went before, else `Failed` with what the last one said, since an
/// earlier attempt may have stored it (its outcome unknown).
pub(crate) fn no_token(
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
pub(crate) fn is_pacing(
    status: u16,
    code: Option<&AnyCode>,
    retry_after: Option<Duration>,
) -> bool {
    status == 429
        && retry_after.is_some_and(|r| r >= Duration::from_secs(1))
        && code.and_then(AnyCode::known) == Some(ErrorCode::QueueFull)
}

/// How a run of the send loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every message (entry) it carried has its outcome.
    Done,
    /// The gateway found the request too large: its entries are to be planned again.
    Split,
}

/// What an answer leaves the loop to do.
pub(crate) enum Step {
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

/// What the send loop carries: one message on the single-send route
/// ([`One`](crate::single::One)), or one batch request's entries
/// ([`Batch`](crate::batch::Batch)). The loop itself (drain, deferral, deadline,
/// backoff, budget) is the same for both; only the exchange and the reading of its
/// answer differ.
#[async_trait]
pub(crate) trait Load: Send {
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
