//! A queue's backlog ceiling and fail-closed gate (contract section 2): the one place that
//! picks who decides a send.
//!
//! - **In the fleet** (`SENDGATE_COORDINATION=redis`, Redis answering): the [`FleetSeat`]
//!   decides against the fleet's ledger (docs/fleet.md).
//! - **Cut off from it**: the seat's blocks still in use, then fail closed, or fail open
//!   by the local gate with the bounds the seat gives ([`FleetSeat::alone`]).
//! - **Alone by design** (`local`): the [`LocalGate`] decides with its own count.
//!
//! ```text
//! mod.rs ──▶ local.rs ──▶ policy.rs
//!    ├─────▶ fleet/ ──▶ policy.rs, window.rs, local.rs (its bounds), coordination::port
//!    ├─────▶ reservation.rs ──▶ local.rs, fleet/
//!    ├─────▶ pacing.rs ──▶ policy.rs
//!    ├─────▶ claims.rs
//!    └─────▶ fair (one send's Judging, handed to local.rs as policy.rs's Judge)
//! ```
//! Whoever refused a send for room, its wait is spread here, once, behind the producers
//! refused before it (`pacing.rs`), at the drain rate of whoever decides. A gate alone by
//! design keeps the places it promised for the sends whose keys claim
//! them (`claims.rs`), before it asks who decides: `claims.rs` knows nothing of reads,
//! fairness or the fleet, and the deciders nothing of claims.
//! `local.rs` knows nothing of a fleet or Redis; `fleet/` nothing of the local gate but
//! the bounds it hands it; neither anything of fairness. Each gate is built whole from its
//! [`GateParts`] (start-up: `admission::assemble`).

mod claims;
mod fleet;
mod local;
mod pacing;
pub mod policy;
mod reservation;
mod window;

use std::sync::Arc;
use std::time::Duration;

use crate::admission::fair::judging::{Decision, FleetView, Judging};
use crate::admission::fair::{Asker, QueueFairness, TenantView};
use crate::backend::Backend;
use crate::coordination::redis_client::CONNECT_DEADLINE;
use crate::domain::QueueName;

pub use claims::{ClaimKey, Promised};
pub use fleet::{FleetSeat, Goodbye, Held, USE_BLOCK_FOR};
pub use local::LocalBounds;
pub use policy::{
    BacklogEffect, CapacityPolicy, GateSnapshot, PolicyCell, PolicyOverride, Refusal, Unknown,
};
pub use reservation::Reservation;

use claims::{Claims, Standing};
use fleet::{AloneAnswer, FleetAnswer, Judged};
use local::LocalGate;
use pacing::level;
use pacing::{whole_seconds, Ask, Pacing};
use reservation::Decider;

pub struct CapacityGate {
    local: Arc<LocalGate>,
    policy: Arc<PolicyCell>,
    /// With `SENDGATE_COORDINATION=redis`: the fleet's shared ceiling.
    seat: Option<Arc<FleetSeat>>,
    /// With tenants: who gets the room the ceiling admits (docs/fairness.md).
    fairness: Option<QueueFairness>,
    /// The waits promised to the producers refused for room.
    pacing: Pacing,
    /// Alone by design: the places promised, kept for their producers.
    claims: Option<Arc<Claims>>,
}

/// What a queue's gate is made of (at start-up).
pub struct GateParts {
    pub queue: QueueName,
    /// The policy in force, swappable at runtime; a fleet's seat shares the same cell.
    pub policy: Arc<PolicyCell>,
    /// Whose admin plane is read: the lane's backend.
    pub backend: Arc<dyn Backend>,
    /// With tenants: who gets the room the ceiling admits; without, the ceiling alone.
    pub fairness: Option<QueueFairness>,
    /// With `SENDGATE_COORDINATION=redis`: the queue's seat in the fleet.
    pub seat: Option<Arc<FleetSeat>>,
}

impl GateParts {
    /// A gate alone by design, without tenants.
    pub fn alone(
        queue: QueueName,
        policy: impl Into<Arc<PolicyCell>>,
        backend: Arc<dyn Backend>,
    ) -> Self {
        Self {
            queue,
            policy: policy.into(),
            backend,
            fairness: None,
            seat: None,
        }
    }
}

/// How a send in the fleet ended: decided, or its seat cut off before it answered.
enum InFleet<'g> {
    Decided(Result<Reservation, Refusal>),
    CutOff(Judging<'g>),
}

/// How the seat last saw the queue, for the judge.
fn fleet_view(seat: &FleetSeat) -> FleetView {
    match seat.judged_estimate() {
        Some(Judged {
            estimate,
            limit,
            replicas,
            round,
        }) => FleetView::Read {
            estimate,
            limit,
            replicas,
            round,
        },
        None => FleetView::Unread {
            round: seat.share_round(),
        },
    }
}

/// Who decides a send, picked afresh for each.
enum Mode<'a> {
    /// Alone by design (`SENDGATE_COORDINATION=local`).
    Local,
    /// In the fleet: its seat decides.
    Fleet(&'a Arc<FleetSeat>),
    /// Cut off from the fleet: the seat's blocks, then the replica's own gate.
    CutOff(&'a Arc<FleetSeat>),
}

impl CapacityGate {
    pub fn new(parts: GateParts) -> Arc<Self> {
        let GateParts {
            queue,
            policy,
            backend,
            fairness,
            seat,
        } = parts;
        // In a fleet a retry may reach another replica, which knows nothing of the promise.
        let claims = seat.is_none().then(Arc::<Claims>::default);
        Arc::new(Self {
            local: LocalGate::new(queue, Arc::clone(&policy), backend),
            policy,
            seat,
            fairness,
            pacing: Pacing::default(),
            claims,
        })
    }

    /// The queue's fairness (`None` without tenants).
    pub fn fairness(&self) -> Option<&QueueFairness> {
        self.fairness.as_ref()
    }

    /// Each tenant answered at least once (nothing without tenants): its counts, its rates
    /// and its part of the room `snapshot` leaves now.
    pub fn tenants(&self, snapshot: &GateSnapshot) -> Vec<TenantView> {
        self.fairness
            .as_ref()
            .map(|f| f.tenants(snapshot, &self.policy.load()))
            .unwrap_or_default()
    }

    /// The places promised and outstanding; `None` for a gate that keeps none (in a fleet).
    pub fn promised(&self) -> Option<Promised> {
        let claims = self.claims.as_ref()?;
        Some(claims.outstanding(tokio::time::Instant::now()))
    }

    /// The replica drained: leave the fleet, if in one (how it went is logged there).
    pub async fn leave_fleet(&self) {
        if let Some(seat) = &self.seat {
            let _ = seat.say_goodbye().await;
        }
    }

    pub fn queue(&self) -> &QueueName {
        self.local.queue()
    }

    /// The policy in force now (the variables with any runtime overrides on top).
    pub fn policy(&self) -> Arc<CapacityPolicy> {
        self.policy.load_full()
    }

    /// The swappable policy, shared with the queue's [`FleetSeat`].
    pub fn policy_cell(&self) -> &Arc<PolicyCell> {
        &self.policy
    }

    /// Decide whether one more send may go to the queue. An admitted send holds a
    /// [`Reservation`] until it finishes.
    pub async fn admit(self: &Arc<Self>) -> Result<Reservation, Refusal> {
        self.admit_units(1).await
    }

    /// Decide whether `units` more sends (a batch's entries) may go to the queue, all of
    /// them or none: a refusal's `room` says how many would have been admitted. The one
    /// [`Reservation`] holds all of them.
    pub async fn admit_units(self: &Arc<Self>, units: u64) -> Result<Reservation, Refusal> {
        self.admit_units_for(Asker::OPEN, units).await
    }

    /// As [`Self::admit_units`], for `asker`: what the ceiling admits goes through the
    /// queue's fairness (its shares, quotas and the asker's criticality) when it has tenants.
    pub async fn admit_units_for(
        self: &Arc<Self>,
        asker: Asker,
        units: u64,
    ) -> Result<Reservation, Refusal> {
        self.admit_claiming(asker, units, None).await
    }

    /// As [`Self::admit_units_for`], for a send whose `Idempotency-Key` (`claim`) may claim
    /// a place it was promised when refused before (`claims.rs`).
    pub async fn admit_claiming(
        self: &Arc<Self>,
        asker: Asker,
        units: u64,
        claim: Option<ClaimKey>,
    ) -> Result<Reservation, Refusal> {
        let units = units.max(1);
        let (standing, read) = match self.standing(asker, units, claim).await {
            Ok(standing) => standing,
            Err(refusal) => {
                let judging =
                    Judging::new(self.fairness.as_ref(), asker, units, &self.policy.load());
                judging.settle(Decision::Answered(&Err(refusal.clone())), || {
                    self.local.reads()
                });
                return Err(refusal);
            }
        };
        if let Some(fairness) = &self.fairness {
            fairness.lease_rate(asker.tenant, units).await;
        }
        let judging = Judging::new(self.fairness.as_ref(), asker, units, &self.policy.load());
        let decision = match self.mode() {
            Mode::Local => self.admit_locally(judging, units, read).await,
            Mode::Fleet(seat) => match self.admit_in_fleet(seat, judging, units).await {
                InFleet::Decided(decision) => decision,
                // The replica's own gate decides it now, and counts it.
                InFleet::CutOff(judging) => {
                    self.admit_cut_off(seat, judging.cut_off(), units).await
                }
            },
            Mode::CutOff(seat) => self.admit_cut_off(seat, judging, units).await,
        };
        match decision {
            // Its promise, if any, is kept until the send is stored (or may have been): one
            // admitted here but never sent (no in-flight slot, no breaker ticket, the broker
            // never reached) keeps its place for its retry.
            Ok(reservation) => Ok(match (&self.claims, claim) {
                (Some(claims), Some(key)) => reservation.claiming(Arc::clone(claims), key),
                _ => reservation,
            }),
            Err(refusal) => Err(match standing {
                Standing::Due => self.keep_place(refusal, asker, units, claim),
                // Refused on room its place does not need yet: it keeps its place.
                Standing::Early(left) if refusal.room_wait().is_some() => {
                    refusal.told(whole_seconds(left))
                }
                _ => self.refuse_for_room(refusal, asker, units, claim),
            }),
        }
    }

    /// Where a send stands with the places promised. While the room left is less than the
    /// promises at its level and above need (with the send), a fresh send is refused and
    /// takes a place, and one whose place is not yet due is told the rest of its wait; with
    /// room beyond them (a queue under half its ceiling always has), both are decided as
    /// any send. With it, the generation of the depth read it waited for, if any: the
    /// send's decision reuses it.
    async fn standing(
        &self,
        asker: Asker,
        units: u64,
        claim: Option<ClaimKey>,
    ) -> Result<(Standing, Option<u64>), Refusal> {
        let Some(claims) = &self.claims else {
            return Ok((Standing::Fresh, None));
        };
        let now = tokio::time::Instant::now();
        let standing = claims.standing(claim, now);
        if standing == Standing::Due {
            return Ok((standing, None));
        }
        let limit = self.policy.load().limit;
        let kept = claims.kept(limit, asker.tenant, level(asker.criticality), now);
        if kept == 0 {
            return Ok((standing, None));
        }
        let (full, read) = self.local.full_short_of(units, kept).await;
        let Some(full) = full else {
            return Ok((standing, read));
        };
        Err(match standing {
            Standing::Early(left) => full.told(whole_seconds(left)),
            _ => self.refuse_for_room(full, asker, units, claim),
        })
    }

    /// A refusal for room takes its place behind those refused before it (`pacing.rs`),
    /// kept for `claim`.
    fn refuse_for_room(
        &self,
        refusal: Refusal,
        asker: Asker,
        units: u64,
        claim: Option<ClaimKey>,
    ) -> Refusal {
        let paced = self.pacing.place(refusal, self.ask(asker, units));
        self.promise(paced, asker, units, claim)
    }

    /// What a refusal of `asker`'s `units` asks of the pacing.
    fn ask(&self, asker: Asker, units: u64) -> Ask {
        Ask {
            criticality: asker.criticality,
            units,
            per_second: self.drain_share(),
            max: self.policy.load().retry_after_max,
        }
    }

    /// A paced refusal (and when its place opens), the place kept for `claim` in a gate
    /// that keeps places.
    fn promise(
        &self,
        (refusal, opens): (Refusal, Option<Duration>),
        asker: Asker,
        units: u64,
        claim: Option<ClaimKey>,
    ) -> Refusal {
        if let (Some(claims), Some(opens), Some(told)) = (&self.claims, opens, refusal.room_wait())
        {
            let now = tokio::time::Instant::now();
            claims.promise(claim, now, place(opens, told, asker, units));
        }
        refusal
    }

    /// A producer back for its due place (so in a gate that keeps places) found the room
    /// taken: it keeps the head of the line (`Pacing::head`), not a place behind it.
    fn keep_place(
        &self,
        refusal: Refusal,
        asker: Asker,
        units: u64,
        claim: Option<ClaimKey>,
    ) -> Refusal {
        let paced = self.pacing.head(refusal, self.ask(asker, units));
        self.promise(paced, asker, units, claim)
    }

    /// Messages a second this gate's refused producers are served at: the queue's measured
    /// drain, in a fleet (as its seat last saw it, cut off too) this replica's share of it.
    fn drain_share(&self) -> Option<f64> {
        match &self.seat {
            None => self.local.drain_rate().map(|r| r.per_second()),
            Some(seat) => seat.drain_share(),
        }
    }

    fn mode(&self) -> Mode<'_> {
        match &self.seat {
            None => Mode::Local,
            Some(seat) if seat.joined() => Mode::Fleet(seat),
            Some(seat) => Mode::CutOff(seat),
        }
    }

    /// Alone by design: the local gate decides, with the judge under its lock.
    async fn admit_locally(
        self: &Arc<Self>,
        mut judging: Judging<'_>,
        units: u64,
        read: Option<u64>,
    ) -> Result<Reservation, Refusal> {
        let decision = self
            .local
            .admit_units_read(read, None, units, &mut judging)
            .await;
        judging.settle(Decision::Answered(&decision), || self.local.reads());
        decision.map(|()| Reservation::new(Decider::Local(Arc::clone(&self.local)), units))
    }

    /// In the fleet: the judge first, by the seat's last view (docs/fairness.md, "In a
    /// fleet"), then the seat.
    async fn admit_in_fleet<'g>(
        self: &'g Arc<Self>,
        seat: &Arc<FleetSeat>,
        mut judging: Judging<'g>,
        units: u64,
    ) -> InFleet<'g> {
        let reads = || seat.paced_reads();
        let judged = judging.in_fleet(|| fleet_view(seat));
        if let Err(refusal) = &judged {
            seat.read_ahead_if_due();
            let refusal = refusal.clone();
            judging.settle(Decision::Answered(&judged), reads);
            return InFleet::Decided(Err(refusal));
        }
        InFleet::Decided(match seat.admit_units(units).await {
            FleetAnswer::Admit(held) => {
                judging.settle(Decision::Answered(&judged), reads);
                Ok(Reservation::new(
                    Decider::Fleet(Arc::clone(seat), held),
                    units,
                ))
            }
            FleetAnswer::Refuse(refusal) => {
                judging.settle(Decision::RefusedBySeat(&refusal), reads);
                Err(self.log_failclosed(seat, refusal))
            }
            FleetAnswer::CutOff => return InFleet::CutOff(judging),
        })
    }

    /// Cut off from the fleet: the seat's blocks still in use, its refusal (fail closed),
    /// or the replica's own gate within the bounds the seat gives (fail open).
    async fn admit_cut_off(
        self: &Arc<Self>,
        seat: &Arc<FleetSeat>,
        mut judging: Judging<'_>,
        units: u64,
    ) -> Result<Reservation, Refusal> {
        let (bounds, counted) = match seat.alone_units(units) {
            AloneAnswer::Admit(held) => {
                return Ok(Reservation::new(
                    Decider::Fleet(Arc::clone(seat), held),
                    units,
                ))
            }
            AloneAnswer::Refuse(refusal) => return Err(self.log_failclosed(seat, refusal)),
            AloneAnswer::Decide { bounds, counted } => (bounds, counted),
        };
        // Reads the gate made before the replica last turned local do not show what the
        // fleet admitted since.
        self.local.forget_reads_before(seat.local_since());
        let decision = self
            .local
            .admit_units(Some(bounds), units, &mut judging)
            .await;
        judging.settle(Decision::Answered(&decision), || self.local.reads());
        match decision {
            // Counted since before the gate's read (which may take up to its deadline): the
            // send's deadline counts from then, or it could be published after the hold
            // that keeps it counted has ended.
            Ok(()) => {
                let decider = Decider::Alone(Arc::clone(&self.local));
                Ok(Reservation::counted_since(decider, units, counted.at))
            }
            Err(refusal) => {
                seat.take_back_alone(counted);
                Err(refusal)
            }
        }
    }

    /// The fleet's fail-closed refusals are logged once per fleet read (the local gate
    /// logs its own).
    fn log_failclosed(&self, seat: &FleetSeat, refusal: Refusal) -> Refusal {
        if let Refusal::CapacityUnknown {
            consecutive_failures,
            cause,
        } = refusal
        {
            if let Some(refused_since_last_log) = seat.failclosed_to_log() {
                tracing::warn!(
                    event = "send_failclosed",
                    queue = %self.queue(),
                    cause = cause.as_str(),
                    consecutive_failures,
                    refused_since_last_log,
                    "{}: refusing sends (fail-closed)",
                    match cause {
                        Unknown::AdminPlane => "queue depth unknown",
                        Unknown::Ledger => "the fleet's ledger (Redis) does not answer",
                    }
                );
            }
        }
        refusal
    }

    /// Read the depth now, whatever the cache holds (start-up). A replica of a fleet first
    /// waits a moment for Redis to answer (a connection's deadline): a send before that
    /// would find it cut off, which fails closed with the gate on.
    pub async fn prime(&self) {
        if let Some(seat) = self.seat.as_ref() {
            let deadline = tokio::time::Instant::now() + CONNECT_DEADLINE;
            while !seat.joined() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        if let Some(seat) = self.seat.as_ref().filter(|s| s.joined()) {
            match seat.prime().await {
                Ok(()) => return,
                Err(error) => {
                    seat.fall_back(&error);
                }
            }
        }
        self.local.prime().await;
    }

    pub fn snapshot(&self) -> GateSnapshot {
        let seat = self.seat.as_ref();
        let own = seat.map_or((0, 0), |s| s.own_reads());
        let local = self.local.snapshot(own);
        match seat.filter(|s| s.joined()).and_then(|s| s.snapshot()) {
            Some(shared) => GateSnapshot {
                reads_ok: local.reads_ok,
                reads_failed: local.reads_failed,
                ..shared
            },
            None => GateSnapshot {
                // Cut off with the gate on, the replica answers every send `503
                // capacity_unknown` (docs/fleet.md, step 6) whatever its own gate, which it
                // does not consult then, last read.
                fail_closed: local.fail_closed
                    || (seat.is_some_and(|s| !s.joined()) && self.policy.load().fail_closed),
                ..local
            },
        }
    }
}

/// The place a refusal promised `asker`'s `units`.
fn place(opens: Duration, told: Duration, asker: Asker, units: u64) -> claims::Place {
    claims::Place {
        opens,
        told,
        units,
        tenant: asker.tenant,
        level: level(asker.criticality),
    }
}

#[cfg(test)]
mod storm;
#[cfg(test)]
mod tests;
