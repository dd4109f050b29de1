//! The gates a send passes after its input is valid, in the contract's order:
//! lane (primary, or the fallback while the primary's circuit is open) → capacity
//! (backlog ceiling, fail-closed) → the in-flight limit → the circuit breaker → the send
//! itself under its deadline. [`Dispatcher`] strings them together; each gate is its own
//! module.

pub mod assemble;
pub mod breaker;
pub mod ceiling;
pub mod drain;
pub mod fair;
pub mod inflight;
mod lane;
pub mod tenants;

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{OutgoingMessage, SendError, SendReceipt};
use crate::config::ForceBackend;
use crate::domain::{Attributes, Field, QueueName};
use breaker::Outcome;
use ceiling::{BacklogEffect, ClaimKey, Refusal};
use fair::Asker;
use inflight::InFlight;
pub use lane::{BackendRole, Lane, ProbeStatus};

/// Who asks for the queue's room, and the place a send's `Idempotency-Key` may claim.
type Asking = (Asker, Option<ClaimKey>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// Capacity said no: queue full, or depth unknown with the gate on.
    #[error("refused before the broker: {0:?}")]
    Refused(Refusal),
    /// Every in-flight slot is taken; answered at once, never queued. Not a backend failure.
    #[error("every in-flight slot is taken")]
    Saturated,
    /// The queue is not one this dispatcher serves.
    #[error("not a queue this gateway serves")]
    UnknownQueue,
    /// The circuit is open and no fallback can take the send.
    #[error("the backend's circuit is open (retry after {retry_after:?})")]
    BackendUnavailable { retry_after: Duration },
    /// The broker did not take the message (or may not have, for a timeout).
    #[error("the broker did not take the message: {0}")]
    Send(SendError),
    /// The backend the send would go to cannot carry this attribute (`kind()` names it).
    #[error("the {backend} backend cannot carry {attribute:?}")]
    Unsupported {
        attribute: Field,
        backend: &'static str,
    },
}

/// The result of one dispatch (a send's receipt, or a batch's results one per message:
/// refused whole as `Err`), and which backend it went to (if it got that far).
pub struct Routed<T> {
    pub via: Option<BackendRole>,
    pub result: Result<T, DispatchError>,
    /// How long the backend send itself took, when one was made.
    pub send_time: Option<Duration>,
}

/// One message's dispatch.
pub type Dispatched = Routed<SendReceipt>;

/// One batch's dispatch: refused whole (`Err`), or one result per message.
pub type DispatchedBatch = Routed<Vec<Result<SendReceipt, SendError>>>;

pub struct Dispatcher {
    primary: Lane,
    fallback: Option<Lane>,
    /// `SENDGATE_FORCE_BACKEND`, or its runtime override: 0 none, 1 primary, 2 fallback
    /// (an atomic, so routing reads it without a lock).
    force: AtomicU8,
    /// The variable's value, restored when the override is removed.
    force_default: Option<ForceBackend>,
    in_flight: InFlight,
    send_timeout: Duration,
}

impl Dispatcher {
    pub fn new(
        primary: Lane,
        fallback: Option<Lane>,
        force: Option<ForceBackend>,
        in_flight: InFlight,
        send_timeout: Duration,
    ) -> Self {
        Self {
            primary,
            fallback,
            force: AtomicU8::new(force_code(force)),
            force_default: force,
            in_flight,
            send_timeout,
        }
    }

    pub fn lanes(&self) -> impl Iterator<Item = &Lane> {
        std::iter::once(&self.primary).chain(self.fallback.as_ref())
    }

    pub fn primary(&self) -> &Lane {
        &self.primary
    }

    pub fn fallback(&self) -> Option<&Lane> {
        self.fallback.as_ref()
    }

    /// The pinned backend in force (the variable's, or a runtime override).
    pub fn force(&self) -> Option<ForceBackend> {
        match self.force.load(Ordering::Relaxed) {
            1 => Some(ForceBackend::Primary),
            2 => Some(ForceBackend::Fallback),
            _ => None,
        }
    }

    /// `SENDGATE_FORCE_BACKEND` as the variable set it.
    pub fn force_default(&self) -> Option<ForceBackend> {
        self.force_default
    }

    /// Pin routing from the next send on (`None`: the primary while its circuit allows).
    /// A fallback pin without a fallback changes nothing (the settings refuse it first).
    pub fn set_force(&self, force: Option<ForceBackend>) {
        if force == Some(ForceBackend::Fallback) && self.fallback.is_none() {
            return;
        }
        self.force.store(force_code(force), Ordering::Relaxed);
    }

    /// The lane named `primary` or `fallback` (`None`: no such backend here).
    pub fn lane(&self, role: &str) -> Option<&Lane> {
        self.lanes().find(|lane| lane.role.as_str() == role)
    }

    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// Connect every backend ahead of the first send.
    pub async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        let results =
            futures_util::future::join_all(self.lanes().map(|r| r.warm_up(deadline))).await;
        results.into_iter().collect()
    }

    /// The replica drained: every lane's seats leave the fleet (a no-op for a replica that
    /// was never in it). The seats leave at once; each waits for the settle turn (at most a
    /// settle on its way and the settle batch queued behind it, one call each) and makes
    /// one call: bounded by three Redis deadlines (`FleetSeat::leave`).
    pub async fn leave_fleet(&self) {
        futures_util::future::join_all(self.lanes().map(Lane::leave_fleet)).await;
    }

    /// Make every queue's first depth read now, so the first sends find the backlog known.
    pub async fn prime_capacity(&self) {
        futures_util::future::join_all(self.lanes().map(Lane::prime_capacity)).await;
    }

    /// Which backend takes the next send: the primary while its circuit lets sends through,
    /// else the fallback when its circuit does; `SENDGATE_FORCE_BACKEND` pins the choice
    /// (primary = never fail over). With both circuits open it is the primary, so capacity
    /// still answers first (429 before 503, the contract's order).
    fn choose(&self) -> &Lane {
        match (self.force(), &self.fallback) {
            (Some(ForceBackend::Primary), _)
            | (None, None)
            | (Some(ForceBackend::Fallback), None) => &self.primary,
            (Some(ForceBackend::Fallback), Some(fallback)) => fallback,
            (None, Some(fallback)) => {
                if !self.primary.breaker.would_allow() && fallback.breaker.would_allow() {
                    fallback
                } else {
                    &self.primary
                }
            }
        }
    }

    /// Admit and send one message. Dropping the future at any point gives back its
    /// in-flight slot, its place under the ceiling and its breaker ticket.
    pub async fn send(&self, message: OutgoingMessage) -> Dispatched {
        let queue = message.queue.clone();
        let attributes = std::sync::Arc::clone(&message.attributes);
        self.send_with(&queue, &attributes, Asker::OPEN, None, || message)
            .await
    }

    /// The attribute the backend a send would go to now cannot carry, and its kind: what a
    /// dry run answers (the same check a send makes, no broker call).
    pub fn unsupported(&self, attributes: &Attributes) -> Option<(Field, &'static str)> {
        let lane = self.choose();
        lane.backend()
            .unsupported(attributes)
            .map(|field| (field, lane.backend().kind()))
    }

    /// Admit and send a batch (all for `queue`): refused whole, or admitted whole under the
    /// ceiling (one reservation of all its entries), one in-flight slot and one breaker
    /// ticket for the lot, then the backend's `send_batch`. `attributes` are the entries',
    /// in order; `messages` is called once admitted.
    pub async fn send_batch(
        &self,
        queue: &QueueName,
        attributes: &[&Attributes],
        asker: Asker,
        messages: impl FnOnce() -> Vec<OutgoingMessage>,
    ) -> DispatchedBatch {
        self.route(
            queue,
            attributes,
            (asker, None),
            messages,
            |lane, admitted, messages| async move {
                Ok(self.deliver_batch(lane, admitted, messages).await)
            },
        )
        .await
    }

    /// [`Dispatcher::send`], with the message made only once the send is admitted: a
    /// refused send (a 429 from the cached backlog) never builds it (no message id).
    /// `attributes` are the message's: a backend that cannot carry one refuses it first.
    /// `claim`: its `Idempotency-Key`, which may claim a place a refusal promised it.
    pub async fn send_with(
        &self,
        queue: &QueueName,
        attributes: &Attributes,
        asker: Asker,
        claim: Option<ClaimKey>,
        message: impl FnOnce() -> OutgoingMessage,
    ) -> Dispatched {
        self.route(
            queue,
            &[attributes],
            (asker, claim),
            message,
            |lane, admitted, message| self.deliver(lane, admitted, message),
        )
        .await
    }

    /// Admitted on a lane (what [`Self::admit_routed`] asks), then what `make` makes is
    /// `deliver`ed there, timed; sent on to the fallback when the primary never got it.
    async fn route<'d, T, M, F>(
        &'d self,
        queue: &QueueName,
        attributes: &[&Attributes],
        asker: Asking,
        make: impl FnOnce() -> M,
        deliver: impl Fn(&'d Lane, Admitted, M) -> F,
    ) -> Routed<T>
    where
        M: Clone,
        F: std::future::Future<Output = Result<T, DispatchError>>,
        Result<T, DispatchError>: NeverSent,
    {
        let (mut lane, admitted) = match self.admit_routed(queue, attributes, asker).await {
            Ok(routed) => routed,
            Err((via, e)) => {
                return Routed {
                    via,
                    result: Err(e),
                    send_time: None,
                }
            }
        };
        let mut started = Instant::now();
        let first_admitted_at = admitted.admitted_at;
        let made = make();
        let spare = self.may_send_on(lane).then(|| made.clone());
        let mut result = deliver(lane, admitted, made).await;
        if let (Some(made), true) = (spare, result.never_sent()) {
            // One request, one deadline: the second send ends when the first would have.
            let deadline = first_admitted_at + self.send_timeout;
            if let Some((fallback, mut again)) = self
                .admit_on_fallback(queue, attributes, asker, deadline)
                .await
            {
                again.admitted_at = again.admitted_at.min(first_admitted_at);
                lane = fallback;
                // Timed as the backend it names: the fallback's send, not the primary's try.
                started = Instant::now();
                result = deliver(lane, again, made).await;
            }
        }
        Routed {
            via: Some(lane.role),
            result,
            send_time: Some(started.elapsed()),
        }
    }

    /// Whether a send on `lane` that never reached its broker may go on to the fallback:
    /// the primary's, with a fallback, routing not pinned.
    fn may_send_on(&self, lane: &Lane) -> bool {
        lane.role == BackendRole::Primary && self.fallback.is_some() && self.force().is_none()
    }

    /// The fallback's admission (steps 5 to 7) for a send the primary never got: nothing
    /// reached the primary's broker, so sending it elsewhere cannot store it twice. The
    /// primary's trial among them: one a second while its broker cannot be reached, each of
    /// which a healthy fallback can take. `None` when the fallback does not admit it, or
    /// the request's `deadline` has passed (before or during the admission: its slot, place
    /// and ticket are given back): the primary's answer stands, `503 backend_unavailable`
    /// (nothing stored), never a `504` (outcome unknown) from a fallback never reached.
    async fn admit_on_fallback(
        &self,
        queue: &QueueName,
        attributes: &[&Attributes],
        asker: Asking,
        deadline: Instant,
    ) -> Option<(&Lane, Admitted)> {
        let fallback = self.fallback.as_ref()?;
        if !fallback.breaker.would_allow() || Instant::now() >= deadline {
            return None;
        }
        let admitted = self.admit(fallback, queue, attributes, asker).await.ok()?;
        if Instant::now() >= deadline {
            admitted.unsent();
            return None;
        }
        tracing::debug!(event = "fallback_selected", queue = %queue, "the primary's broker could not be reached: using the fallback");
        Some((fallback, admitted))
    }

    /// Step 5 and on up to the send: the lane, then what [`Self::admit`] asks of it. With
    /// the refusal, the backend it names (none for an unknown queue).
    async fn admit_routed(
        &self,
        queue: &QueueName,
        attributes: &[&Attributes],
        asker: Asking,
    ) -> Result<(&Lane, Admitted), (Option<BackendRole>, DispatchError)> {
        let mut lane = self.choose();
        let mut admitted = self.admit(lane, queue, attributes, asker).await;
        // The primary's trial went to another send (or it opened meanwhile): with a fallback
        // that takes sends, use it rather than answer 503.
        if let (Err(DispatchError::BackendUnavailable { .. }), None, Some(fallback)) =
            (&admitted, self.force(), &self.fallback)
        {
            if lane.role == BackendRole::Primary && fallback.breaker.would_allow() {
                lane = fallback;
                admitted = self.admit(lane, queue, attributes, asker).await;
            }
        }
        if lane.role == BackendRole::Fallback {
            tracing::debug!(event = "fallback_selected", queue = %queue, "primary circuit open: using the fallback");
        }
        match admitted {
            Ok(admitted) => Ok((lane, admitted)),
            Err(e) => {
                let via = (!matches!(e, DispatchError::UnknownQueue)).then_some(lane.role);
                Err((via, e))
            }
        }
    }

    /// Steps 5 to 7 for one backend: what it can carry, capacity (one unit per message),
    /// an in-flight slot, a breaker ticket.
    async fn admit(
        &self,
        lane: &Lane,
        queue: &QueueName,
        attributes: &[&Attributes],
        asker: Asking,
    ) -> Result<Admitted, DispatchError> {
        let gate = lane.gate(queue).ok_or(DispatchError::UnknownQueue)?;
        if let Some(attribute) = attributes
            .iter()
            .find_map(|a| lane.backend().unsupported(a))
        {
            return Err(DispatchError::Unsupported {
                attribute,
                backend: lane.backend().kind(),
            });
        }
        let units = attributes.len().max(1) as u64;
        let (asker, claim) = asker;
        let reservation = gate
            .admit_claiming(asker, units, claim)
            .await
            .map_err(DispatchError::Refused)?;
        // Not `now`: a send counted alone was counted before its replica's own gate read the
        // admin plane, and the hold that keeps it counted runs from then.
        let admitted_at = reservation.counted_at();
        let Some(slot) = self.in_flight.try_acquire() else {
            reservation.finish(BacklogEffect::NotStored);
            tracing::debug!(event = "send_saturated", queue = %queue);
            return Err(DispatchError::Saturated);
        };
        match lane.breaker.try_acquire() {
            Ok(ticket) => Ok(Admitted {
                reservation,
                admitted_at,
                _slot: slot,
                ticket,
            }),
            Err(retry_after) => {
                reservation.finish(BacklogEffect::NotStored);
                Err(DispatchError::BackendUnavailable { retry_after })
            }
        }
    }

    /// Step 8: the send under its deadline; its outcome feeds the breaker and the count
    /// under the ceiling.
    async fn deliver(
        &self,
        lane: &Lane,
        admitted: Admitted,
        message: OutgoingMessage,
    ) -> Result<SendReceipt, DispatchError> {
        let Admitted {
            reservation,
            admitted_at,
            _slot,
            ticket,
        } = admitted;
        let deadline = admitted_at + self.send_timeout;
        if Instant::now() >= deadline {
            // Never issued past the deadline counted from its admission (docs/fleet.md, A2).
            ticket.record(Outcome::Neutral);
            reservation.finish(BacklogEffect::NotStored);
            return Err(DispatchError::Send(SendError::Timeout));
        }
        // The deadline goes into the backend, which cancels its own work; the outer timeout
        // is the backstop for a backend that ignores it.
        let result = tokio::time::timeout_at(deadline, lane.backend().send(message, deadline))
            .await
            .unwrap_or(Err(SendError::Timeout));
        // One event per failed send whatever the backend, as the current request (its
        // `request_id`, `queue` and `key`), at most one a second per lane (with the count
        // held back): a broker failing every send must not flood the logs.
        if let Err(error) = &result {
            if let Some(held_back) = lane.send_failed_log.admit() {
                tracing::warn!(event = "send_failed", backend = lane.role.as_str(), %error, held_back_since_last_log = held_back, "the backend did not take the message");
            }
        }
        ticket.record(Outcome::of(&result));
        reservation.finish(backlog_effect(&result));
        result.map_err(DispatchError::Send)
    }

    /// Step 8 for a batch: the backend's `send_batch` under the deadline counted from the
    /// admission; the breaker hears one outcome for the lot (a success if any message was
    /// taken), the ceiling one per message.
    async fn deliver_batch(
        &self,
        lane: &Lane,
        admitted: Admitted,
        messages: Vec<OutgoingMessage>,
    ) -> Vec<Result<SendReceipt, SendError>> {
        let Admitted {
            reservation,
            admitted_at,
            _slot,
            ticket,
        } = admitted;
        let count = messages.len();
        let deadline = admitted_at + self.send_timeout;
        if Instant::now() >= deadline {
            ticket.record(Outcome::Neutral);
            reservation.finish(BacklogEffect::NotStored);
            return vec![Err(SendError::Timeout); count];
        }
        let mut results =
            tokio::time::timeout_at(deadline, lane.backend().send_batch(messages, deadline))
                .await
                .unwrap_or_else(|_| vec![Err(SendError::Timeout); count]);
        // A backend answers one result per message; one that did not is a bug whose
        // missing outcomes are unknown (counted as stored: the safe side).
        results.resize(
            count,
            Err(SendError::Uncertain("no result for this message".into())),
        );
        if let Some(error) = results.iter().find_map(|r| r.as_ref().err()) {
            if let Some(held_back) = lane.send_failed_log.admit() {
                let failed = results.iter().filter(|r| r.is_err()).count();
                tracing::warn!(event = "send_failed", backend = lane.role.as_str(), %error, failed, of = count, held_back_since_last_log = held_back, "the backend did not take every message of a batch");
            }
        }
        let outcome = if results.iter().any(Result::is_ok) {
            Outcome::Success
        } else {
            results
                .iter()
                .map(Outcome::of)
                .find(|o| o.failed())
                .unwrap_or(Outcome::Neutral)
        };
        ticket.record(outcome);
        reservation.finish_each(results.iter().map(backlog_effect));
        results
    }
}

/// What a send's result means for the backlog (an unknown outcome counts as stored).
fn backlog_effect(result: &Result<SendReceipt, SendError>) -> BacklogEffect {
    match result {
        Ok(receipt) if receipt.duplicate => BacklogEffect::NotStored,
        Ok(_) => BacklogEffect::Stored,
        Err(SendError::Timeout | SendError::Uncertain(_)) => BacklogEffect::Unknown,
        Err(_) => BacklogEffect::NotStored,
    }
}

/// Whether nothing of a dispatch reached the broker (no connection: nothing was sent), so
/// it may be sent elsewhere.
trait NeverSent {
    fn never_sent(&self) -> bool;
}

impl NeverSent for Result<SendReceipt, DispatchError> {
    fn never_sent(&self) -> bool {
        matches!(self, Err(DispatchError::Send(SendError::Unavailable(_))))
    }
}

/// A batch: when none of its messages reached the broker.
impl NeverSent for Result<Vec<Result<SendReceipt, SendError>>, DispatchError> {
    fn never_sent(&self) -> bool {
        matches!(self, Ok(results) if !results.is_empty()
            && results.iter().all(|r| matches!(r, Err(SendError::Unavailable(_)))))
    }
}

fn force_code(force: Option<ForceBackend>) -> u8 {
    match force {
        None => 0,
        Some(ForceBackend::Primary) => 1,
        Some(ForceBackend::Fallback) => 2,
    }
}

/// What a send holds between admission and its answer; each part is given back on drop.
struct Admitted {
    reservation: ceiling::Reservation,
    /// The send's deadline counts from here: the ceiling counts it from its admission.
    admitted_at: Instant,
    _slot: inflight::Slot,
    ticket: breaker::Ticket,
}

impl Admitted {
    /// Nothing was sent: the place under the ceiling is freed (not counted as maybe
    /// stored, as a drop would), the ticket says nothing of the backend's health.
    fn unsent(self) {
        self.ticket.record(Outcome::Neutral);
        self.reservation.finish(BacklogEffect::NotStored);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Backlog, DepthError};
    use crate::config::CapacitySettings;
    use crate::domain::{MessageId, QueueName};
    use async_trait::async_trait;
    use breaker::BreakerPolicy;
    use std::sync::Arc;

    /// A broker whose sends never answer.
    struct Hung;

    #[async_trait]
    impl Backend for Hung {
        fn kind(&self) -> &'static str {
            "hung"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            std::future::pending().await
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(0))
        }
    }

    /// A ceiling of 1000 nobody reaches, fail-open, its depth read again after `depth_ttl`.
    fn capacity(depth_ttl: Duration) -> CapacitySettings {
        CapacitySettings {
            max_queue_depth: 1000,
            fail_closed: false,
            fail_closed_streak: 3,
            depth_ttl,
            admin_timeout: Duration::from_secs(1),
            retry_after_max: Duration::from_secs(300),
            resume_below: crate::config::Fraction::ONE,
        }
    }

    /// A lane over `backend` whose gates decide alone, without tenants.
    fn lane(
        role: BackendRole,
        backend: Arc<dyn Backend>,
        queues: &[QueueName],
        capacity: &CapacitySettings,
        breaker: BreakerPolicy,
    ) -> Lane {
        let policy = ceiling::CapacityPolicy::from_settings(capacity);
        let gates = queues.iter().map(|queue| {
            let parts =
                ceiling::GateParts::alone(queue.clone(), policy.clone(), Arc::clone(&backend));
            ceiling::CapacityGate::new(parts)
        });
        Lane::new(role, Arc::clone(&backend), gates, breaker)
    }

    fn dispatcher(max: usize) -> (Arc<Dispatcher>, QueueName) {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::from_secs(60));
        let lane = lane(
            BackendRole::Primary,
            Arc::new(Hung),
            std::slice::from_ref(&queue),
            &capacity,
            BreakerPolicy::default(),
        );
        (
            Arc::new(Dispatcher::new(
                lane,
                None,
                None,
                InFlight::new(max),
                Duration::from_secs(3600),
            )),
            queue,
        )
    }

    fn message(queue: &QueueName) -> OutgoingMessage {
        OutgoingMessage::new(
            queue.clone(),
            MessageId::generate(),
            None,
            bytes::Bytes::from_static(b"{}"),
        )
    }

    #[tokio::test]
    async fn a_dropped_send_gives_its_slot_back_at_once() {
        let (d, queue) = dispatcher(2);
        let sends: Vec<_> = (0..2)
            .map(|_| {
                let (d, m) = (d.clone(), message(&queue));
                tokio::spawn(async move { d.send(m).await.result })
            })
            .collect();
        while d.in_flight().current() < 2 {
            tokio::task::yield_now().await;
        }
        let third = d.send(message(&queue)).await;
        assert_eq!(third.result, Err(DispatchError::Saturated));
        for s in &sends {
            s.abort();
        }
        for s in sends {
            let _ = s.await;
        }
        assert_eq!(
            d.in_flight().current(),
            0,
            "aborted (dropped) sends hold nothing"
        );
        assert_eq!(
            d.primary().breaker.state(),
            breaker::BreakerState::Closed,
            "neither saturation nor a drop is a failure"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn hung_sends_end_at_the_deadline_and_open_the_breaker() {
        let (d, queue) = dispatcher(64);
        let mut sends = Vec::new();
        for _ in 0..10 {
            let (d, m) = (d.clone(), message(&queue));
            sends.push(tokio::spawn(async move { d.send(m).await.result }));
        }
        for s in sends {
            assert_eq!(
                s.await.unwrap(),
                Err(DispatchError::Send(SendError::Timeout))
            );
        }
        assert_eq!(d.in_flight().current(), 0);
        assert_eq!(d.primary().breaker.state(), breaker::BreakerState::Open);
        let next = d.send(message(&queue)).await;
        assert!(matches!(
            next.result,
            Err(DispatchError::BackendUnavailable { .. })
        ));
    }

    /// A broker whose sends fail until `heal` is set, whose depth reads take 100 ms.
    struct Flaky {
        healed: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl Backend for Flaky {
        fn kind(&self) -> &'static str {
            "flaky"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            if self.healed.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await; // the trial hangs: it holds the trial slot
            }
            Err(SendError::Failed("down".into()))
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(Backlog::of(0))
        }
    }

    /// A broker that takes everything at once.
    struct Healthy;

    #[async_trait]
    impl Backend for Healthy {
        fn kind(&self) -> &'static str {
            "healthy"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            Ok(SendReceipt { duplicate: false })
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(0))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_that_loses_the_primarys_trial_goes_to_the_fallback_not_to_a_503() {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::ZERO);
        let flaky = Arc::new(Flaky {
            healed: false.into(),
        });
        let queues = std::slice::from_ref(&queue);
        let policy = BreakerPolicy {
            open_for: Duration::from_secs(5),
            ..BreakerPolicy::default()
        };
        let primary = lane(
            BackendRole::Primary,
            flaky.clone(),
            queues,
            &capacity,
            policy.clone(),
        );
        let fallback = lane(
            BackendRole::Fallback,
            Arc::new(Healthy),
            queues,
            &capacity,
            policy,
        );
        let d = Arc::new(Dispatcher::new(
            primary,
            Some(fallback),
            None,
            InFlight::new(64),
            Duration::from_secs(30),
        ));
        for _ in 0..10 {
            assert_eq!(
                d.send(message(&queue)).await.via,
                Some(BackendRole::Primary)
            );
        }
        assert_eq!(d.primary().breaker.state(), breaker::BreakerState::Open);
        assert_eq!(
            d.send(message(&queue)).await.via,
            Some(BackendRole::Fallback)
        );

        // The open time passes: two sends both pick the primary (its trial is due) and wait on
        // its depth read; one gets the trial, the other must not be refused.
        tokio::time::advance(Duration::from_secs(5)).await;
        flaky
            .healed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let sends: Vec<_> = (0..2)
            .map(|_| {
                let (d, m) = (d.clone(), message(&queue));
                tokio::spawn(async move {
                    let sent = d.send(m).await;
                    (sent.via, sent.result.is_ok())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for s in sends {
            answers.push(s.await.unwrap());
        }
        answers.sort_by_key(|(via, _)| via.map(BackendRole::as_str));
        assert_eq!(
            answers,
            [
                (Some(BackendRole::Fallback), true),
                (Some(BackendRole::Primary), false)
            ],
            "one send is the primary's trial (it hangs to its deadline); the other is not refused"
        );
    }

    /// A broker no send reaches (connection refused: nothing is sent), or one that answers
    /// `error` to every send.
    struct Unreachable {
        error: SendError,
    }

    #[async_trait]
    impl Backend for Unreachable {
        fn kind(&self) -> &'static str {
            "unreachable"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            Err(self.error.clone())
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(0))
        }
    }

    /// A primary whose sends fail with `error`, a healthy fallback, `force` pinned.
    fn failing_primary(error: SendError, force: Option<ForceBackend>) -> (Dispatcher, QueueName) {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::from_secs(60));
        let queues = std::slice::from_ref(&queue);
        let lane = |role, backend: Arc<dyn Backend>| {
            lane(role, backend, queues, &capacity, BreakerPolicy::default())
        };
        let d = Dispatcher::new(
            lane(BackendRole::Primary, Arc::new(Unreachable { error })),
            Some(lane(BackendRole::Fallback, Arc::new(Healthy))),
            force,
            InFlight::new(8),
            Duration::from_secs(5),
        );
        (d, queue)
    }

    /// While the primary's broker cannot be reached, every send is taken by the fallback:
    /// the few that find the primary's circuit still closed, and the trial each second
    /// (which keeps the circuit open: the primary's broker is still down).
    #[tokio::test(start_paused = true)]
    async fn a_send_the_primary_never_got_goes_to_the_fallback_the_trial_too() {
        let refused = SendError::Unavailable("connection refused".into());
        let (d, queue) = failing_primary(refused, None);
        for n in 0..3 {
            let sent = d.send(message(&queue)).await;
            assert_eq!(
                (sent.via, sent.result),
                (
                    Some(BackendRole::Fallback),
                    Ok(SendReceipt { duplicate: false })
                ),
                "send {n}, before the circuit opened"
            );
        }
        assert_eq!(d.primary().breaker.state(), breaker::BreakerState::Open);
        for second in 1..=3 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert!(d.primary().breaker.would_allow(), "the trial is due");
            let sent = d.send(message(&queue)).await;
            assert_eq!(
                (sent.via, sent.result),
                (
                    Some(BackendRole::Fallback),
                    Ok(SendReceipt { duplicate: false })
                ),
                "the trial at {second} s"
            );
            assert_eq!(
                d.primary().breaker.state(),
                breaker::BreakerState::Open,
                "the failed trial keeps it open"
            );
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        let attributes = Attributes::default();
        let batch = d
            .send_batch(&queue, &[&attributes, &attributes], Asker::OPEN, || {
                vec![message(&queue), message(&queue)]
            })
            .await;
        assert_eq!(
            (batch.via, batch.result),
            (
                Some(BackendRole::Fallback),
                Ok(vec![Ok(SendReceipt { duplicate: false }); 2])
            ),
            "a batch as the trial"
        );
    }

    /// A broker that answers every send, after `after`, that it could not be reached (a
    /// connect attempt that timed out).
    struct SlowToRefuse {
        after: Duration,
    }

    #[async_trait]
    impl Backend for SlowToRefuse {
        fn kind(&self) -> &'static str {
            "slow"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            tokio::time::sleep(self.after).await;
            Err(SendError::Unavailable("connect timed out".into()))
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(0))
        }
    }

    /// The fallback's send ends when the primary's would have: one request, one deadline
    /// (here 5 s, of which the primary took 4).
    #[tokio::test(start_paused = true)]
    async fn a_send_sent_on_to_the_fallback_keeps_the_requests_deadline() {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::from_secs(60));
        let queues = std::slice::from_ref(&queue);
        let slow = SlowToRefuse {
            after: Duration::from_secs(4),
        };
        let d = Dispatcher::new(
            lane(
                BackendRole::Primary,
                Arc::new(slow),
                queues,
                &capacity,
                BreakerPolicy::default(),
            ),
            Some(lane(
                BackendRole::Fallback,
                Arc::new(Hung),
                queues,
                &capacity,
                BreakerPolicy::default(),
            )),
            None,
            InFlight::new(8),
            Duration::from_secs(5),
        );
        let started = Instant::now();
        let sent = d.send(message(&queue)).await;
        assert_eq!(
            (sent.via, sent.result),
            (
                Some(BackendRole::Fallback),
                Err(DispatchError::Send(SendError::Timeout))
            )
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(d.in_flight().current(), 0, "both slots given back");
    }

    /// A fallback whose queue is at its ceiling.
    struct FullFallback;

    #[async_trait]
    impl Backend for FullFallback {
        fn kind(&self) -> &'static str {
            "full"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            Ok(SendReceipt { duplicate: false })
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(1000))
        }
    }

    /// A send the primary never got that the fallback refuses at its gates (here its
    /// ceiling) is answered as the primary's: 503 backend_unavailable, not the fallback's 429
    /// (contract §1 step 8 says so).
    #[tokio::test(start_paused = true)]
    async fn a_send_the_fallback_refuses_at_its_gates_keeps_the_primarys_answer() {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::from_secs(60));
        let queues = std::slice::from_ref(&queue);
        let lane = |role, backend: Arc<dyn Backend>| {
            lane(role, backend, queues, &capacity, BreakerPolicy::default())
        };
        let refused = SendError::Unavailable("connection refused".into());
        let d = Dispatcher::new(
            lane(
                BackendRole::Primary,
                Arc::new(Unreachable {
                    error: refused.clone(),
                }),
            ),
            Some(lane(BackendRole::Fallback, Arc::new(FullFallback))),
            None,
            InFlight::new(8),
            Duration::from_secs(5),
        );
        let sent = d.send(message(&queue)).await;
        assert_eq!(
            (sent.via, sent.result),
            (
                Some(BackendRole::Primary),
                Err(DispatchError::Send(refused))
            )
        );
    }

    /// The latency a send sent on is timed by (the `sendgate_send_duration` of the backend
    /// it names) is the fallback's send: not the 4 s the primary's broker took to say it
    /// could not be reached.
    #[tokio::test(start_paused = true)]
    async fn a_send_sent_on_is_timed_as_the_fallbacks_send_alone() {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::from_secs(60));
        let queues = std::slice::from_ref(&queue);
        let lane = |role, backend: Arc<dyn Backend>| {
            lane(role, backend, queues, &capacity, BreakerPolicy::default())
        };
        let slow = SlowToRefuse {
            after: Duration::from_secs(4),
        };
        let d = Dispatcher::new(
            lane(BackendRole::Primary, Arc::new(slow)),
            Some(lane(BackendRole::Fallback, Arc::new(Healthy))),
            None,
            InFlight::new(8),
            Duration::from_secs(5),
        );
        let sent = d.send(message(&queue)).await;
        assert_eq!(sent.via, Some(BackendRole::Fallback));
        assert_eq!(sent.send_time, Some(Duration::ZERO));
    }

    /// A broker whose connect attempt runs out with the send's deadline (a broker that
    /// drops packets: the connect times out): nothing was sent, answered at the deadline.
    struct RefusedAtDeadline;

    #[async_trait]
    impl Backend for RefusedAtDeadline {
        fn kind(&self) -> &'static str {
            "black-holed"
        }
        async fn send(
            &self,
            _: OutgoingMessage,
            deadline: Instant,
        ) -> Result<SendReceipt, SendError> {
            tokio::time::sleep_until(deadline).await;
            Err(SendError::Unavailable(
                "the operation ran out of time".into(),
            ))
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(0))
        }
    }

    /// A send the primary never got, answered only at its deadline, has no time left for
    /// the fallback: it is answered as the primary's (503 backend_unavailable: nothing was
    /// stored, retry), not 504 send_timeout (outcome unknown) from a fallback it never
    /// reached, and the fallback's slot, ceiling and breaker are not taken for it.
    #[tokio::test(start_paused = true)]
    async fn a_send_the_primary_never_got_with_no_time_left_is_not_sent_on() {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::from_secs(60));
        let queues = std::slice::from_ref(&queue);
        let lane = |role, backend: Arc<dyn Backend>| {
            lane(role, backend, queues, &capacity, BreakerPolicy::default())
        };
        let d = Dispatcher::new(
            lane(BackendRole::Primary, Arc::new(RefusedAtDeadline)),
            Some(lane(BackendRole::Fallback, Arc::new(Healthy))),
            None,
            InFlight::new(8),
            Duration::from_secs(5),
        );
        let sent = d.send(message(&queue)).await;
        assert_eq!(
            (sent.via, sent.result),
            (
                Some(BackendRole::Primary),
                Err(DispatchError::Send(SendError::Unavailable(
                    "the operation ran out of time".into()
                )))
            )
        );
        assert_eq!(d.in_flight().current(), 0);
    }

    /// A send that may have reached the primary's broker (its outcome unknown, or the
    /// broker answered) is never sent again elsewhere: it could be stored twice. Nor is one
    /// pinned to the primary.
    #[tokio::test(start_paused = true)]
    async fn a_send_the_primary_may_have_got_or_a_pinned_one_is_not_sent_to_the_fallback() {
        let cases = [
            (SendError::Uncertain("connection lost".into()), None),
            (SendError::Timeout, None),
            (SendError::Failed("returned".into()), None),
            (
                SendError::Unavailable("connection refused".into()),
                Some(ForceBackend::Primary),
            ),
        ];
        for (error, force) in cases {
            let (d, queue) = failing_primary(error.clone(), force);
            let sent = d.send(message(&queue)).await;
            assert_eq!(
                (sent.via, sent.result),
                (Some(BackendRole::Primary), Err(DispatchError::Send(error))),
                "forced {force:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_forced_backend_set_at_runtime_routes_the_next_send_and_none_restores_the_default() {
        let queue = QueueName::parse("q").unwrap();
        let capacity = capacity(Duration::from_secs(60));
        let queues = std::slice::from_ref(&queue);
        let lane = |role| {
            lane(
                role,
                Arc::new(Healthy),
                queues,
                &capacity,
                BreakerPolicy::default(),
            )
        };
        let d = Dispatcher::new(
            lane(BackendRole::Primary),
            Some(lane(BackendRole::Fallback)),
            None,
            InFlight::new(8),
            Duration::from_secs(5),
        );
        assert_eq!(
            d.send(message(&queue)).await.via,
            Some(BackendRole::Primary)
        );
        d.set_force(Some(ForceBackend::Fallback));
        assert_eq!(d.force(), Some(ForceBackend::Fallback));
        assert_eq!(
            d.send(message(&queue)).await.via,
            Some(BackendRole::Fallback)
        );
        d.set_force(d.force_default());
        assert_eq!(
            d.send(message(&queue)).await.via,
            Some(BackendRole::Primary)
        );

        let alone = Dispatcher::new(
            lane(BackendRole::Primary),
            None,
            Some(ForceBackend::Primary),
            InFlight::new(8),
            Duration::from_secs(5),
        );
        alone.set_force(Some(ForceBackend::Fallback));
        assert_eq!(
            alone.force(),
            Some(ForceBackend::Primary),
            "no fallback to pin: nothing changes (the settings refuse it first)"
        );
        assert_eq!(alone.force_default(), Some(ForceBackend::Primary));
        assert!(alone.lane("fallback").is_none());
        assert!(alone.lane("primary").is_some());
    }
}
