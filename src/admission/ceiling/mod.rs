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
//!    └─────▶ fleet.rs ──▶ policy.rs, window.rs, coordination::port
//! ```
//! `local.rs` knows nothing of a fleet or Redis; `fleet.rs` nothing of the local gate but
//! the bounds it hands it.

mod fleet;
mod local;
pub mod policy;
mod window;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::admission::exchange::{self, Names, Place};
use crate::admission::fair::{Asker, FairCell, FairOverride, FairPolicy, ShareJudge};
use crate::admission::quota::{HeldBook, QueueQuotas, RateBook};
use crate::admission::share::{ShareBook, ShareMode};
use crate::admission::tally::{Reason, Tally, TenantCounts};
use crate::admission::tenants::{Quota, Tenant, Tenants};
use crate::backend::Backend;
use crate::coordination::redis_client::CONNECT_DEADLINE;
use crate::domain::QueueName;

pub use fleet::{FleetSeat, Goodbye, Held, USE_BLOCK_FOR};
pub use local::LocalBounds;
use policy::Judge;
pub use policy::{
    BacklogEffect, CapacityPolicy, GateSnapshot, PolicyCell, PolicyOverride, Refusal,
};

use fleet::{AloneAnswer, FleetAnswer, Judged};
use local::LocalGate;

pub struct CapacityGate {
    local: Arc<LocalGate>,
    policy: Arc<PolicyCell>,
    /// With `SENDGATE_COORDINATION=redis`: the fleet's shared ceiling.
    seat: std::sync::OnceLock<Arc<FleetSeat>>,
    /// With tenants: who gets the room the ceiling admits (docs/fairness.md).
    shares: std::sync::OnceLock<Shares>,
    /// With tenants that have quotas: their books (docs/fairness.md, "Quotas").
    quotas: std::sync::OnceLock<QueueQuotas>,
}

/// A queue's share book, how it applies, and what each tenant was answered.
struct Shares {
    book: Arc<parking_lot::Mutex<ShareBook>>,
    /// The variables' policy with the queue's runtime overrides on top.
    policy: FairCell,
    tenants: Tenants,
    /// Counted once per decision, by whoever decided, after its judge.
    tally: Tally,
    /// In a fleet: units the judge admitted that the seat has not answered yet. The view
    /// the judge weighs a send by cannot show them, so it adds them: else concurrent sends
    /// judged by one view would each take the room another tenant is owed.
    unanswered: AtomicU64,
}

/// What the judge made of a send in the fleet ([`CapacityGate::judge_in_fleet`]).
struct FleetJudged<'a> {
    judged: Result<(), Refusal>,
    /// In shadow mode, why it would have been refused.
    would_refuse: Option<Reason>,
    /// What it counted in the book and the quotas (given back if the seat refuses).
    counted: Counted,
    /// An admitted send's units, counted until the seat answers.
    unanswered: Option<Unanswered<'a>>,
}

impl FleetJudged<'_> {
    /// Admitted without a judge (no tenants, or no read to judge by).
    fn unjudged(counted: Counted) -> Self {
        Self {
            judged: Ok(()),
            would_refuse: None,
            counted,
            unanswered: None,
        }
    }
}

/// Units counted in [`Shares::unanswered`] from before the judge weighs them until the
/// seat answers (or the judge refuses them).
struct Unanswered<'a> {
    count: &'a AtomicU64,
    units: u64,
    /// Counted before these: the sends judged and not yet answered when these were, on
    /// any worker (one atomic step, so two judged at once each see the other once).
    before: u64,
}

impl<'a> Unanswered<'a> {
    fn count(count: &'a AtomicU64, units: u64) -> Self {
        let before = count.fetch_add(units, Ordering::Relaxed);
        Self {
            count,
            units,
            before,
        }
    }
}

impl Drop for Unanswered<'_> {
    /// Answered, or the send given up (its future dropped) while the seat decided.
    fn drop(&mut self) {
        self.count.fetch_sub(self.units, Ordering::Relaxed);
    }
}

/// One tenant of a queue as health and metrics show it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantView {
    pub tenant: Tenant,
    /// Its part of the room this round offers (0–1), as the share rule computes it now.
    pub share: f64,
    pub counts: TenantCounts,
}

impl CapacityGate {
    pub fn new(queue: QueueName, policy: CapacityPolicy, backend: Arc<dyn Backend>) -> Arc<Self> {
        let policy = PolicyCell::new(policy);
        Arc::new(Self {
            local: LocalGate::new(queue, Arc::clone(&policy), backend),
            policy,
            seat: std::sync::OnceLock::new(),
            shares: std::sync::OnceLock::new(),
            quotas: std::sync::OnceLock::new(),
        })
    }

    /// Share this queue's room among these tenants (once, at start-up); without it every
    /// send is decided by the ceiling alone.
    pub fn share_among(&self, tenants: &Tenants, policy: FairPolicy) {
        let book = ShareBook::new(&tenants.weights());
        let _ = self.shares.set(Shares {
            book: Arc::new(parking_lot::Mutex::new(book)),
            policy: FairCell::new(policy),
            tenants: tenants.clone(),
            tally: Tally::new(tenants),
            unanswered: AtomicU64::new(0),
        });
    }

    /// In a fleet, share the room by the fleet's counts (docs/fairness.md, "In a fleet"):
    /// the book's counts are exchanged at `place` from now on (once, at start-up, after [`Self::share_among`]). With one
    /// tenant nobody is owed anything, and with shares off nobody's counts change a
    /// decision (the criticality cut weighs the estimate alone), so nothing is exchanged.
    pub fn exchange_shares(&self, place: Place) {
        let Some(shares) = self.shares.get() else {
            return;
        };
        if shares.tenants.len() < 2 || shares.policy.base().mode == ShareMode::Off {
            return;
        }
        tokio::spawn(exchange::run(
            Arc::downgrade(&shares.book),
            Names::of(&shares.tenants),
            place,
        ));
    }

    /// Each tenant answered at least once (nothing without shares): its counts, its rates
    /// and its part of the room `snapshot` leaves now.
    pub fn tenants(&self, snapshot: &GateSnapshot) -> Vec<TenantView> {
        let Some(shares) = self.shares.get() else {
            return Vec::new();
        };
        let counts = shares.tally.counts();
        if counts.is_empty() {
            return Vec::new();
        }
        // Unknown backlog: the room is taken as the whole ceiling (nothing to judge by).
        let room = snapshot
            .limit
            .saturating_sub(snapshot.backlog.unwrap_or_default());
        let parts =
            shares
                .book
                .lock()
                .shares_now(room, tokio::time::Instant::now(), self.share_idle());
        counts
            .into_iter()
            .filter_map(|counts| {
                let tenant = shares.tally.tenants().get(counts.tenant)?.clone();
                let share = parts.get(usize::from(counts.tenant.0)).copied()?;
                Some(TenantView {
                    tenant,
                    share,
                    counts,
                })
            })
            .collect()
    }

    /// Hold this queue's tenants to their quotas (once, at start-up, after
    /// [`Self::share_among`]): `rates` is the gateway's, shared by every queue.
    pub fn hold_to(&self, quotas: &[Quota], rates: Arc<RateBook>) {
        let _ = self.quotas.set(QueueQuotas {
            rates,
            held: parking_lot::Mutex::new(HeldBook::new(quotas)),
        });
    }

    /// Put the queue's runtime overrides of the fair policy in force (an empty one
    /// restores the variables'); without shares there is nothing to apply them to.
    pub fn apply_fair(&self, overrides: &FairOverride) {
        if let Some(shares) = self.shares.get() {
            shares.policy.apply(overrides);
        }
    }

    /// The fair policy in force (`None` without shares).
    pub fn fair_policy(&self) -> Option<FairPolicy> {
        self.shares.get().map(|s| s.policy.load())
    }

    /// The fair policy the variables give (`None` without shares).
    pub fn fair_base(&self) -> Option<FairPolicy> {
        self.shares.get().map(|s| *s.policy.base())
    }

    /// Share this queue's ceiling with the fleet (once, at start-up).
    pub fn join_fleet(&self, seat: Arc<FleetSeat>) {
        let _ = self.seat.set(seat);
    }

    /// The replica drained: leave the fleet, if in one (how it went is logged there).
    pub async fn leave_fleet(&self) {
        if let Some(seat) = self.seat.get() {
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

    /// How long the share book may go unasked before it forgets its counts: the round and
    /// the next (docs/fairness.md), and the longest a send may take between asking and
    /// being counted (a depth read's deadline).
    fn share_idle(&self) -> std::time::Duration {
        let policy = self.policy.load();
        policy
            .share_round_span()
            .saturating_mul(2)
            .saturating_add(policy.read_timeout)
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
    /// queue's shares and the asker's criticality when the gateway has tenants.
    pub async fn admit_units_for(
        self: &Arc<Self>,
        asker: Asker,
        units: u64,
    ) -> Result<Reservation, Refusal> {
        let units = units.max(1);
        if let Some(shares) = self.shares.get() {
            shares
                .book
                .lock()
                .forget_if_idle(tokio::time::Instant::now(), self.share_idle());
        }
        let Some(seat) = self.seat.get() else {
            self.admit_locally(None, units, asker).await?;
            return Ok(self.reservation(Decider::Local, units));
        };
        if seat.joined() {
            let FleetJudged {
                judged,
                would_refuse,
                counted,
                unanswered,
            } = self.judge_in_fleet(seat, asker, units);
            if let Err(refusal) = judged {
                seat.read_ahead_if_due();
                self.tally_in_fleet(seat, asker, units, &Err(refusal.clone()), would_refuse);
                return Err(refusal);
            }
            let answer = seat.admit_units(units).await;
            drop(unanswered);
            match answer {
                FleetAnswer::Admit(held) => {
                    self.tally_in_fleet(seat, asker, units, &Ok(()), would_refuse);
                    return Ok(self.reservation(Decider::Fleet(held), units));
                }
                FleetAnswer::Refuse(refusal) => {
                    self.unjudge(asker, units, counted, Some(&refusal));
                    self.tally_in_fleet(seat, asker, units, &Err(refusal.clone()), None);
                    return Err(self.log_failclosed(seat, refusal));
                }
                // The replica's own gate decides it now, and counts it.
                FleetAnswer::CutOff => self.unjudge(asker, units, counted, None),
            }
        }
        match seat.alone_units(units) {
            AloneAnswer::Admit(held) => Ok(self.reservation(Decider::Fleet(held), units)),
            AloneAnswer::Refuse(refusal) => Err(self.log_failclosed(seat, refusal)),
            AloneAnswer::Decide { bounds, counted } => {
                // Reads the gate made before the replica last turned local do not show what
                // the fleet admitted since.
                self.local.forget_reads_before(seat.local_since());
                match self.admit_locally(Some(bounds), units, asker).await {
                    // Counted since before the gate's read (which may take up to its
                    // deadline): the send's deadline counts from then, or it could be
                    // published after the hold that keeps it counted has ended.
                    Ok(()) => Ok(self.reservation_counted_at(Decider::Alone, units, counted.at)),
                    Err(refusal) => {
                        seat.take_back_alone(counted);
                        Err(refusal)
                    }
                }
            }
        }
    }

    /// A replica in the fleet asks the judge before its seat (docs/fairness.md, "In a
    /// fleet"), with the fleet's estimate as the seat last saw it (and the units the judge
    /// admitted that the seat has not answered yet), and room for at least
    /// `units`: the seat reserves what is really left, and a send the judge admits on room
    /// that has gone is refused by the seat, as without the judge. The judge only refuses.
    /// Without a good read to judge by, the send is only counted.
    /// Also what the judge would have refused in shadow mode, and what it counted.
    fn judge_in_fleet(&self, seat: &Arc<FleetSeat>, asker: Asker, units: u64) -> FleetJudged<'_> {
        let Some(shares) = self.shares.get() else {
            return FleetJudged::unjudged(Counted::default());
        };
        let Some(Judged {
            estimate,
            limit,
            replicas,
            round,
        }) = seat.judged_estimate()
        else {
            let mut book = shares.book.lock();
            book.count_admitted(asker.tenant, units, seat.share_round());
            let counted = Counted {
                in_round: Some(book.round()),
                quotas: false,
            };
            return FleetJudged::unjudged(counted);
        };
        let unanswered = Unanswered::count(&shares.unanswered, units);
        let estimate = estimate
            .saturating_add(unanswered.before)
            .min(limit.saturating_sub(units));
        // Every replica sees the same room until the next reply shows what the others took:
        // judged as this replica's share of it, a tenant over its part cannot take, on each
        // replica, the room owed to another.
        let room = (limit - estimate).div_ceil(replicas).max(units);
        let mut judge = ShareJudge {
            book: &shares.book,
            asker,
            quotas: self.quotas.get(),
            policy: shares.policy.load(),
            would_refuse: None,
            counted_in: None,
        };
        let judged = judge.admits(round, units, room, estimate, estimate + units, limit);
        let counted = Counted {
            in_round: judge.counted_in,
            // The judge takes a tenant's quotas exactly when it admits.
            quotas: judged.is_ok(),
        };
        FleetJudged {
            unanswered: judged.is_ok().then_some(unanswered),
            judged,
            would_refuse: judge.would_refuse,
            counted,
        }
    }

    /// A decision made in the fleet, in the queue's tally (its log line once per fleet
    /// read generation this replica saw).
    fn tally_in_fleet(
        &self,
        seat: &FleetSeat,
        asker: Asker,
        units: u64,
        decision: &Result<(), Refusal>,
        would_refuse: Option<Reason>,
    ) {
        if let Some(shares) = self.shares.get() {
            shares.tally.count(
                self.queue(),
                asker.tenant,
                units,
                decision,
                would_refuse,
                || seat.read_generation(),
            );
        }
    }

    /// The seat did not admit what the judge `counted`: out of the book again, and counted
    /// as refused at the ceiling if it was (`refusal`).
    fn unjudge(&self, asker: Asker, units: u64, counted: Counted, refusal: Option<&Refusal>) {
        // The quotas the judge took are given back (only admitted units count); none, when
        // it took none.
        if let Some(quotas) = self.quotas.get().filter(|_| counted.quotas) {
            if let Some((_, bucket)) = quotas.rates.bucket(asker.tenant) {
                bucket.lock().give_back(units);
            }
            quotas.held.lock().give_back(asker.tenant, units);
        }
        let Some(shares) = self.shares.get() else {
            return;
        };
        let Some(round) = counted.in_round else {
            return;
        };
        let mut book = shares.book.lock();
        book.withdraw(asker.tenant, units, round);
        if matches!(refusal, Some(Refusal::QueueFull { .. })) {
            // In the book's round now: the book may have moved on (or begun again, with a
            // new epoch's reads) while the seat was asked, and must not roll back to the
            // round the send was judged in.
            let now = book.round();
            book.refused_at_ceiling(asker.tenant, units, now);
        }
    }

    /// The local gate's decision, through the queue's shares and the asker's criticality
    /// when the gateway has them.
    async fn admit_locally(
        self: &Arc<Self>,
        bounds: Option<LocalBounds>,
        units: u64,
        asker: Asker,
    ) -> Result<(), Refusal> {
        match self.shares.get() {
            Some(shares) => {
                let mut judge = ShareJudge {
                    book: &shares.book,
                    quotas: self.quotas.get(),
                    asker,
                    policy: shares.policy.load(),
                    would_refuse: None,
                    counted_in: None,
                };
                let decision = self.local.admit_judged(bounds, units, &mut judge).await;
                shares.tally.count(
                    self.queue(),
                    asker.tenant,
                    units,
                    &decision,
                    judge.would_refuse,
                    || self.local.reads(),
                );
                decision
            }
            None => self.local.admit_units(bounds, units).await,
        }
    }

    fn reservation(self: &Arc<Self>, decider: Decider, units: u64) -> Reservation {
        self.reservation_counted_at(decider, units, tokio::time::Instant::now())
    }

    fn reservation_counted_at(
        self: &Arc<Self>,
        decider: Decider,
        units: u64,
        counted_at: tokio::time::Instant,
    ) -> Reservation {
        Reservation {
            gate: Arc::clone(self),
            decider,
            units,
            counted_at,
            finished: false,
        }
    }

    /// The fleet's fail-closed refusals are logged once per fleet read (the local gate
    /// logs its own).
    fn log_failclosed(&self, seat: &FleetSeat, refusal: Refusal) -> Refusal {
        if let Refusal::CapacityUnknown {
            consecutive_failures,
        } = refusal
        {
            if let Some(refused_since_last_log) = seat.failclosed_to_log() {
                tracing::warn!(
                    event = "send_failclosed",
                    queue = %self.queue(),
                    consecutive_failures,
                    refused_since_last_log,
                    "queue depth unknown: refusing sends (fail-closed)"
                );
            }
        }
        refusal
    }

    /// Read the depth now, whatever the cache holds (start-up). A replica of a fleet first
    /// waits a moment for Redis to answer (a connection's deadline): a send before that
    /// would find it cut off, which fails closed with the gate on.
    pub async fn prime(&self) {
        if let Some(seat) = self.seat.get() {
            let deadline = tokio::time::Instant::now() + CONNECT_DEADLINE;
            while !seat.joined() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        if let Some(seat) = self.seat.get().filter(|s| s.joined()) {
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
        let seat = self.seat.get();
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

/// Who admitted a send, so its end is told to the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decider {
    Local,
    Fleet(Held),
    /// The replica's own gate, cut off from the fleet and failing open: the seat counted it
    /// in its window already.
    Alone,
}

/// One admitted send's place under the ceiling (or a batch's, one unit per entry). Finish
/// it with the send's outcome; if it is dropped unfinished (the request was cancelled
/// mid-send) every unit counts as [`BacklogEffect::Unknown`], the safe side.
pub struct Reservation {
    gate: Arc<CapacityGate>,
    decider: Decider,
    units: u64,
    counted_at: tokio::time::Instant,
    finished: bool,
}

impl Reservation {
    /// When the ceiling began counting this send: its deadline counts from here
    /// (docs/fleet.md, A2: a send counted at `a` is stored by `a + D` or never).
    pub fn counted_at(&self) -> tokio::time::Instant {
        self.counted_at
    }

    /// How many sends it holds.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// Every unit ended with `outcome`.
    pub fn finish(mut self, outcome: BacklogEffect) {
        self.finished = true;
        for _ in 0..self.units {
            self.settle(outcome);
        }
    }

    /// A batch ended: one outcome per unit. Units without one (fewer outcomes than units)
    /// count as [`BacklogEffect::Unknown`].
    pub fn finish_each(mut self, outcomes: impl IntoIterator<Item = BacklogEffect>) {
        self.finished = true;
        let mut left = self.units;
        for outcome in outcomes.into_iter().take(self.units as usize) {
            self.settle(outcome);
            left -= 1;
        }
        for _ in 0..left {
            self.settle(BacklogEffect::Unknown);
        }
    }

    fn settle(&self, outcome: BacklogEffect) {
        match (self.decider, self.gate.seat.get()) {
            (Decider::Fleet(held), Some(seat)) => seat.finish(held, outcome),
            _ => self.gate.local.finish(outcome),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.finished {
            for _ in 0..self.units {
                self.settle(BacklogEffect::Unknown);
            }
        }
    }
}

/// What the judge counted for a send in the fleet, for the seat's refusal to take back.
#[derive(Debug, Clone, Copy, Default)]
struct Counted {
    /// The book's round the send was counted admitted in.
    in_round: Option<u64>,
    /// Whether the tenant's quotas were taken (the judge was asked, and admitted).
    quotas: bool,
}

#[cfg(test)]
mod tests;
