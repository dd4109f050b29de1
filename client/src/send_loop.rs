//! The send loop, for one message ([`One`](crate::single::One)) or one batch request's
//! entries ([`Batch`](crate::batch::Batch)) alike: wait out a drain (and the adaptive
//! throttle's holds), attempt, and retry what the policy allows within the deadline and
//! the shared budget.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use sendgate_wire::{GatewayState, QueueName};
use tokio::time::Instant;

use crate::lifecycle::Verdict;
use crate::retry::RetryKind;
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
            match self.ready(&mut deadline, &mut tries).await {
                Ok(Ready::Go) => {}
                Ok(Ready::Held) => continue,
                Err(gave_up) => return give_up(load, &tries, gave_up),
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
            tries.queued = false;
            tries.refused = false;
            let step = load.judge(&mut tries, answer, &self.inner);
            self.settle(&mut tries);
            let (retry_after, kind) = match step {
                Step::Done => return Ended::Done,
                Step::Split => return Ended::Split,
                Step::Now => continue,
                Step::Retry { retry_after, kind } => (retry_after, kind),
            };
            match self.retry_at(&mut tries, retry_after, kind, deadline.at) {
                Ok(at) => tokio::time::sleep_until(at).await,
                Err(gave_up) => return give_up(load, &tries, gave_up),
            }
        }
    }

    /// Whether the next attempt may go now: a drain (or start-up, or a restart's gap)
    /// waited out, the adaptive throttle's hold, and a retry's tokens paid.
    async fn ready(&self, deadline: &mut Deadline, tries: &mut Tries) -> Result<Ready, GaveUp> {
        let waited = match self.wait_until_admitting(deadline, tries).await {
            Ok(()) => self.hold_back(deadline, tries).await,
            Err(last_error) => Err(last_error),
        };
        match waited {
            Ok(Ready::Go) => self.pay(tries).map(|()| Ready::Go),
            Ok(Ready::Held) => Ok(Ready::Held),
            Err(last_error) => {
                tries.last_error = Some(last_error);
                Err(GaveUp::Deadline)
            }
        }
    }

    /// A retry takes its tokens as it goes on the wire, not when it is decided: a
    /// `Retry-After` may be long (an honest one spreads refused producers over the time it
    /// takes to serve them), and tokens held through the wait would fail every other
    /// refused message of the client while the ones holding them wait for a turn they were
    /// promised. Tokens pay for requests, not for waiting.
    fn pay(&self, tries: &mut Tries) -> Result<(), GaveUp> {
        let Some(kind) = tries.owed.take() else {
            return Ok(());
        };
        let i = &self.inner;
        let Some(cost) = i.budget.try_withdraw(kind) else {
            i.budget_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(GaveUp::Budget);
        };
        tries.withdrawn = Some(cost);
        tries.retried = true;
        i.retries.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// With adaptive throttling on, the throttle may hold the attempt back a while (it
    /// then asks again, a drain re-checked first); a deadline passed while held ends the
    /// send.
    async fn hold_back(
        &self,
        deadline: &Deadline,
        tries: &mut Tries,
    ) -> Result<Ready, AttemptError> {
        let Some(throttle) = &self.inner.throttle else {
            return Ok(Ready::Go);
        };
        let now = Instant::now();
        if throttle.admit(now, self.inner.jitter.unit()) {
            return Ok(Ready::Go);
        }
        if !std::mem::replace(&mut tries.counted, true) {
            throttle.request(now);
        }
        if now >= deadline.at {
            return Err(tries.last_error.clone().unwrap_or(AttemptError::HeldBack));
        }
        self.inner.held.fetch_add(1, Ordering::Relaxed);
        let wake = now
            .checked_add(throttle.hold_for(self.inner.jitter.unit()))
            .unwrap_or(deadline.at)
            .min(deadline.at);
        tokio::time::sleep_until(wake).await;
        Ok(Ready::Held)
    }

    /// What the last answer means for the retry budget and the throttle: an answer that
    /// queued something gives back the retry it came from (or a clean first attempt's
    /// token); one that is not a refusal counts as accepted.
    fn settle(&self, tries: &mut Tries) {
        let i = &self.inner;
        if tries.refused {
            // Refused again: the retry's tokens are spent.
            tries.withdrawn = None;
        }
        if tries.queued {
            match tries.withdrawn.take() {
                Some(cost) => i.budget.refund(cost),
                None if !tries.retried => i.budget.refund_clean_success(),
                None => {}
            }
        }
        if let Some(throttle) = &i.throttle {
            let now = Instant::now();
            if !std::mem::take(&mut tries.counted) {
                throttle.request(now);
            }
            if !tries.refused {
                throttle.accept(now);
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
                        .checked_add(self.inner.backoff.jitter(self.inner.jitter.unit()))
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

    /// When the next attempt may go, if the attempt cap, the deadline and the shared retry
    /// budget all allow one (checked in that order). The budget must hold the retry's cost
    /// now, so a message it cannot pay for fails at once rather than after its wait; the
    /// tokens are taken when the retry goes ([`pay`](Self::pay)).
    fn retry_at(
        &self,
        tries: &mut Tries,
        retry_after: Option<Duration>,
        kind: RetryKind,
        deadline: Instant,
    ) -> Result<Instant, GaveUp> {
        let i = &self.inner;
        let delay = i
            .backoff
            .delay(tries.attempts, retry_after, i.jitter.unit())
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
        // No retry is exempt, the gateway's pacing included: a held message resent at every
        // Retry-After is what multiplies the load of a storm. An empty budget fails the
        // message now rather than holding it (docs/client.md argues it).
        if i.budget.balance() < i.budget.config().cost(kind) {
            i.budget_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(GaveUp::Budget);
        }
        tries.owed = Some(kind);
        Ok(at)
    }
}

/// Retries ran out (or the deadline passed): whatever `load` still carries is failed, with
/// the last attempt's error.
fn give_up<L: Load>(load: &mut L, tries: &Tries, gave_up: GaveUp) -> Ended {
    let last_error = tries
        .last_error
        .clone()
        .unwrap_or_else(|| AttemptError::Transport("no attempt".into()));
    load.give_up(gave_up, tries.attempts, last_error);
    Ended::Done
}

/// Whether the send loop may attempt now.
enum Ready {
    Go,
    /// The adaptive throttle held the attempt back a while: ask again.
    Held,
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
    pub(crate) last_error: Option<AttemptError>,
    /// The last answer queued at least one message.
    pub(crate) queued: bool,
    /// The last answer was a refusal or a failure worth a retry.
    pub(crate) refused: bool,
    /// The retry waiting to go, to be paid for when it does.
    owed: Option<RetryKind>,
    /// The tokens the retry in flight took, given back if it queues something.
    withdrawn: Option<u32>,
    /// A retry was granted (a later success is not a clean first attempt's).
    retried: bool,
    /// The next attempt was held back by the adaptive throttle, and counted as a request
    /// then (not again when it is answered).
    counted: bool,
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
        kind: RetryKind,
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
