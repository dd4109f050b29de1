//! One send's judging (docs/fairness.md): asked of a queue's fairness for each decision,
//! handed the ceiling's view of the room (by the local gate under its lock, or the fleet's
//! seat's last view before the seat is asked), and settled with how the send was decided.
//!
//! The rules, in order: the send's criticality against its level's fraction of the
//! ceiling, then the tenant's quotas, then its share of the room. The judge only ever
//! refuses, and a quota is taken only from what it admits; what a fleet's seat then does
//! not admit is given back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::MutexGuard;
use tokio::time::Instant;

use super::policy::{FairPolicy, MAX_SHARE_RETRY_AFTER, SHARE_RETRY_AFTER};
use super::quota::{HeldBook, QueueQuotas, RateBucket};
use super::share::{ShareMode, Verdict};
use super::tally::Reason;
use super::{Asker, QueueFairness};
use crate::admission::ceiling::policy::{CapacityPolicy, CeilingView, Judge, Refusal};
use crate::admission::tenants::{QuotaKind, TenantIndex};

/// How the fleet's seat last saw the queue, for judging a send before the seat is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetView {
    /// A good read: the fleet's `estimate` (less this replica's unused block units) of
    /// `limit`, `replicas` in the fleet, in share round `round`.
    Read {
        estimate: u64,
        limit: u64,
        replicas: u64,
        round: u64,
    },
    /// No good read to judge by: the send is only counted, in the seat's share round.
    Unread { round: u64 },
}

/// How a judged send was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Answered where it was judged (the local gate's decision, the judge's own refusal
    /// before the seat), or admitted by the fleet's seat after the judge.
    Answered(&'a Result<(), Refusal>),
    /// The fleet's seat refused what the judge admitted: what the judge counted is given
    /// back first.
    RefusedBySeat(&'a Refusal),
}

/// One send's judging; without tenants every step leaves the ceiling's answer as it is.
pub struct Judging<'a> {
    asker: Asker,
    units: u64,
    fair: Option<Weighed<'a>>,
}

/// What the judge weighed a send by, and what it counted for it.
struct Weighed<'a> {
    fairness: &'a QueueFairness,
    policy: FairPolicy,
    /// In shadow mode, why the send would have been refused (it is admitted): counted per
    /// tenant by the queue's tally.
    would_refuse: Option<Reason>,
    /// The book's round the send was counted admitted in, once it is (what a fleet's seat
    /// refusing it takes back).
    counted_in: Option<u64>,
    /// The tenant's quotas were taken (the judge admitted).
    took_quotas: bool,
    /// In a fleet, an admitted send's units, counted until the seat answers.
    unanswered: Option<Unanswered<'a>>,
}

impl<'a> Judging<'a> {
    /// `asker`'s send of `units` to a queue with `fairness` (none: no tenants). A book
    /// nobody asked for two rounds of `ceiling` forgets its counts first.
    pub fn new(
        fairness: Option<&'a QueueFairness>,
        asker: Asker,
        units: u64,
        ceiling: &CapacityPolicy,
    ) -> Self {
        if let Some(fairness) = fairness {
            fairness
                .book
                .lock()
                .forget_if_idle(Instant::now(), super::idle(ceiling));
        }
        Self {
            asker,
            units,
            fair: fairness.map(Weighed::new),
        }
    }

    /// A replica in the fleet judges a send before its seat, by the view the seat last
    /// `seen` (asked only with tenants), with the units the judge admitted that the seat
    /// has not answered yet on top, and room for at least the send: the seat reserves what
    /// is really left, and a send the judge admits on room that has gone is refused by the
    /// seat, as without the judge. Without a good read, the send is only counted.
    pub fn in_fleet(&mut self, seen: impl FnOnce() -> FleetView) -> Result<(), Refusal> {
        let (asker, units) = (self.asker, self.units);
        let Some(fair) = &mut self.fair else {
            return Ok(());
        };
        let (estimate, limit, replicas, round) = match seen() {
            FleetView::Unread { round } => {
                let mut book = fair.fairness.book.lock();
                book.count_admitted(asker.cell(), units, round);
                fair.counted_in = Some(book.round());
                return Ok(());
            }
            FleetView::Read {
                estimate,
                limit,
                replicas,
                round,
            } => (estimate, limit, replicas, round),
        };
        let unanswered = Unanswered::count(&fair.fairness.unanswered, units);
        let estimate = estimate
            .saturating_add(unanswered.before)
            .min(limit.saturating_sub(units));
        // Every replica sees the same room until the next reply shows what the others took:
        // judged as this replica's share of it, a tenant over its part cannot take, on each
        // replica, the room owed to another. Rounded down: reads at the ceiling show room a
        // few units at a time, and each replica rounding up hands a tenant over its part up
        // to a unit per replica of every such read, the unit owed to another.
        let room = ((limit - estimate) / replicas).max(units);
        let view = CeilingView {
            round,
            units,
            room,
            estimate,
            after: estimate + units,
            limit,
        };
        let judged = fair.judge(asker, &view);
        if judged.is_ok() {
            fair.unanswered = Some(unanswered);
        }
        judged
    }

    /// The fleet's seat was cut off before it answered: what the judge counted is given
    /// back, and the send is judged afresh by the replica's own gate.
    pub fn cut_off(self) -> Self {
        let Some(mut fair) = self.fair else {
            return self;
        };
        drop(fair.unanswered.take());
        fair.give_back(self.asker, self.units, None);
        Self {
            fair: Some(Weighed::new(fair.fairness)),
            ..self
        }
    }

    /// The send was decided: counted once in the queue's tally (its `tenant_refused` line
    /// once per `reads`, the depth read it was decided on).
    pub fn settle(self, decision: Decision<'_>, reads: impl FnOnce() -> u64) {
        let Some(mut fair) = self.fair else {
            return;
        };
        // Answered: no longer counted as judged and unanswered.
        drop(fair.unanswered.take());
        let fairness = fair.fairness;
        let tally = |result: &Result<(), Refusal>, would_refuse| {
            let (tenant, units) = (self.asker.tenant, self.units);
            let queue = &fairness.queue;
            fairness
                .tally
                .count(queue, tenant, units, result, would_refuse, reads);
        };
        match decision {
            Decision::Answered(result) => tally(result, fair.would_refuse),
            Decision::RefusedBySeat(refusal) => {
                fair.give_back(self.asker, self.units, Some(refusal));
                tally(&Err(refusal.clone()), None);
            }
        }
    }
}

impl Judge for Judging<'_> {
    fn judge(&mut self, view: &CeilingView) -> Result<(), Refusal> {
        match &mut self.fair {
            Some(fair) => fair.judge(self.asker, view),
            None => Ok(()),
        }
    }

    fn refused_full(&mut self, round: u64, units: u64) {
        if let Some(fair) = &self.fair {
            fair.fairness
                .book
                .lock()
                .refused_at_ceiling(self.asker.cell(), units, round);
        }
    }
}

impl<'a> Weighed<'a> {
    fn new(fairness: &'a QueueFairness) -> Self {
        Self {
            fairness,
            policy: fairness.policy.load(),
            would_refuse: None,
            counted_in: None,
            took_quotas: false,
            unanswered: None,
        }
    }

    /// The rules in order; the quotas asked are held (locked) until the share rule has
    /// answered, and taken only if it admits.
    fn judge(&mut self, asker: Asker, view: &CeilingView) -> Result<(), Refusal> {
        self.cut(asker, view)?;
        let now = Instant::now();
        let asked = ask_quotas(self.fairness.quotas.as_ref(), asker.tenant, view, now)?;
        self.share(asker, view)?;
        asked.take(asker.tenant, view.units, now);
        self.took_quotas = true;
        Ok(())
    }

    /// The send's criticality against its level's cut.
    fn cut(&mut self, asker: Asker, view: &CeilingView) -> Result<(), Refusal> {
        let cut = self.policy.cut(asker.criticality, view.limit);
        if view.after <= cut {
            return Ok(());
        }
        // As many as the level has room for, weighed as the ceiling weighs them.
        let weight = (view.after - view.estimate)
            .div_ceil(view.units.max(1))
            .max(1);
        let refusal = Refusal::Shed {
            criticality: asker.criticality,
            backlog: view.estimate,
            cut,
            retry_after: SHARE_RETRY_AFTER,
            room: cut.saturating_sub(view.estimate) / weight,
        };
        // Shadow mode shadows the cut too: an operator sees both rules' effect before
        // either refuses. The book is still asked, so its parts count this admission.
        if self.policy.mode != ShareMode::Shadow {
            return Err(refusal);
        }
        self.would_refuse = Some(Reason::Criticality);
        Ok(())
    }

    /// The room of the send's tier, the higher tiers' asks kept, and the tenant's share
    /// of it, as the book answers them.
    fn share(&mut self, asker: Asker, view: &CeilingView) -> Result<(), Refusal> {
        let near = view.estimate as f64 >= self.policy.share_at.get() * view.limit as f64;
        let verdict = {
            let mut book = self.fairness.book.lock();
            // The ceiling's room in all, of which `room` may be this replica's share.
            let whole = view.limit.saturating_sub(view.estimate).max(view.room);
            let part = (view.room, whole);
            let verdict = book.decide_in_part(
                asker.cell(),
                view.units,
                part,
                near,
                self.policy.mode,
                view.round,
            );
            self.counted_in = Some(book.round());
            verdict
        };
        match verdict {
            Verdict::Admit => Ok(()),
            Verdict::WouldRefuse { .. } => {
                // The first rule that would refuse names it, as it would the 429.
                self.would_refuse.get_or_insert(Reason::TenantShare);
                Ok(())
            }
            Verdict::WouldShed => {
                self.would_refuse.get_or_insert(Reason::Criticality);
                Ok(())
            }
            Verdict::Refuse { share, room } => Err(Refusal::TenantShare {
                share_milli: (share.clamp(0.0, 1.0) * 1000.0).round() as u16,
                retry_after: SHARE_RETRY_AFTER,
                room,
            }),
            // The level's cut now is where its tier's room ends.
            Verdict::Shed { room } => Err(Refusal::Shed {
                criticality: asker.criticality,
                backlog: view.estimate,
                cut: view.estimate.saturating_add(room).min(view.limit),
                retry_after: SHARE_RETRY_AFTER,
                room,
            }),
        }
    }

    /// What the fleet's seat did not admit: out of the book again, and counted as refused
    /// at the ceiling if it was (`refusal`).
    fn give_back(&self, asker: Asker, units: u64, refusal: Option<&Refusal>) {
        // The quotas the judge took are given back (only admitted units count); none, when
        // it took none.
        if let Some(quotas) = self.fairness.quotas.as_ref().filter(|_| self.took_quotas) {
            if let Some((_, bucket)) = quotas.rates.bucket(asker.tenant) {
                bucket.lock().give_back(units);
            }
            quotas.held.lock().give_back(asker.tenant, units);
        }
        let Some(round) = self.counted_in else {
            return;
        };
        let mut book = self.fairness.book.lock();
        book.withdraw(asker.cell(), units, round);
        if matches!(refusal, Some(Refusal::QueueFull { .. })) {
            // In the book's round now: the book may have moved on (or begun again, with a
            // new epoch's reads) while the seat was asked, and must not roll back to the
            // round the send was judged in.
            let now = book.round();
            book.refused_at_ceiling(asker.cell(), units, now);
        }
    }
}

/// A tenant's quotas as asked for one send: held (locked, in one order: the tenant's
/// bucket, then the queue's held book) until the share rule answers.
struct AskedQuotas<'q> {
    bucket: Option<MutexGuard<'q, RateBucket>>,
    held: Option<MutexGuard<'q, HeldBook>>,
}

/// Whether the tenant's quotas let the send's units through now: asked, not taken (a unit
/// refused for its share costs none of the tenant's quota).
fn ask_quotas<'q>(
    quotas: Option<&'q QueueQuotas>,
    tenant: TenantIndex,
    view: &CeilingView,
    now: Instant,
) -> Result<AskedQuotas<'q>, Refusal> {
    let bucket = quotas
        .and_then(|q| q.rates.bucket(tenant))
        .map(|(_, bucket)| bucket.lock());
    if let Some(bucket) = &bucket {
        let wait = bucket.wait(view.units, now);
        if wait != Some(Duration::ZERO) {
            return Err(Refusal::TenantQuota {
                quota: QuotaKind::Rate,
                // More than the burst never conforms: when the bucket is full again, the
                // answer's `room` is what may be sent.
                retry_after: wait.unwrap_or_else(|| bucket.until_full(now)),
                room: bucket.available(now),
            });
        }
    }
    let mut held = quotas.map(|q| q.held.lock());
    if let Some(held) = &mut held {
        if let Err(room) = held.check(tenant, view.units, view.estimate, view.limit) {
            return Err(Refusal::TenantQuota {
                quota: QuotaKind::MaxShare,
                retry_after: MAX_SHARE_RETRY_AFTER,
                room,
            });
        }
    }
    Ok(AskedQuotas { bucket, held })
}

impl AskedQuotas<'_> {
    /// The judge admitted: the units are the tenant's.
    fn take(self, tenant: TenantIndex, units: u64, now: Instant) {
        if let Some(mut bucket) = self.bucket {
            bucket.take(units, now);
        }
        if let Some(mut held) = self.held {
            held.take(tenant, units);
        }
    }
}

/// Units counted in [`QueueFairness`]'s unanswered from before the judge weighs them until
/// the seat answers (or the judge refuses them).
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::admission::fair::quota::RateBook;
    use crate::admission::fair::FairParts;
    use crate::admission::tenants::{Quota, Rate, Tenants};
    use crate::config::Fraction;
    use crate::domain::QueueName;

    /// One open tenant, shares enforced, sheddable cut at 0.8 of the ceiling.
    fn open_fairness(quotas: Option<QueueQuotas>) -> QueueFairness {
        QueueFairness::new(FairParts {
            queue: QueueName::parse("requests").unwrap(),
            tenants: Tenants::open(),
            policy: FairPolicy {
                mode: ShareMode::Enforce,
                share_at: Fraction::new(0.9).unwrap(),
                shed_at_sheddable: Fraction::new(0.8).unwrap(),
                shed_at_default: Fraction::ONE,
            },
            quotas,
            exchange: None,
        })
    }

    fn ceiling_of(limit: u64) -> CapacityPolicy {
        CapacityPolicy {
            limit,
            fail_closed: false,
            streak_threshold: 3,
            ttl: Duration::from_secs(10),
            read_timeout: Duration::from_secs(2),
            retry_after_max: Duration::from_secs(300),
            resume_below: Fraction::ONE,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn what_the_seat_does_not_admit_gives_back_the_quota_the_judge_took_and_only_that() {
        let quotas = [Quota {
            rate: Rate::new(0.01, Some(2)),
            max_share: None,
        }];
        let rates = Arc::new(RateBook::new(&quotas, Instant::now()));
        let fairness = open_fairness(Some(QueueQuotas::new(&quotas, Arc::clone(&rates))));
        let ceiling = ceiling_of(10);
        let available = || {
            rates
                .state(TenantIndex(0), Instant::now())
                .unwrap()
                .available
        };
        let judged = |estimate| {
            let mut judging = Judging::new(Some(&fairness), Asker::OPEN, 1, &ceiling);
            let view = CeilingView {
                round: 0,
                units: 1,
                room: 10 - estimate,
                estimate,
                after: estimate + 1,
                limit: 10,
            };
            judging.judge(&view).expect("under every rule");
            judging
        };
        let (first, _second) = (judged(0), judged(1));
        assert_eq!(available(), 0);
        // The judge took it (it admitted): given back.
        drop(first.cut_off());
        assert_eq!(available(), 1);
        // It took none: nothing is given back.
        drop(Judging::new(Some(&fairness), Asker::OPEN, 1, &ceiling).cut_off());
        assert_eq!(available(), 1);
    }

    /// A send the judge admitted in a fleet weighs on every later judge until the seat has
    /// answered it: settled, cut off, or given up (its future dropped mid-seat), and not a
    /// moment longer; a send the judge refused never does.
    #[tokio::test(start_paused = true)]
    async fn a_judged_send_counts_as_unanswered_until_answered_or_dropped_and_only_then() {
        use crate::admission::tenants::Criticality;

        let fairness = open_fairness(None);
        let ceiling = ceiling_of(100);
        let unanswered = || fairness.unanswered.load(Ordering::Relaxed);
        let seen = |estimate| {
            move || FleetView::Read {
                estimate,
                limit: 100,
                replicas: 1,
                round: 0,
            }
        };
        let judged = |units| {
            let mut judging = Judging::new(Some(&fairness), Asker::OPEN, units, &ceiling);
            judging.in_fleet(seen(0)).expect("far from every rule");
            judging
        };

        let (first, second, third) = (judged(2), judged(3), judged(4));
        assert_eq!(unanswered(), 9);
        // The seat admitted it.
        first.settle(Decision::Answered(&Ok(())), || 0);
        assert_eq!(unanswered(), 7);
        // The seat refused it.
        let full = Refusal::QueueFull {
            backlog: 100,
            limit: 100,
            retry_after: Duration::from_secs(1),
            drain_rate: None,
            room: 0,
        };
        second.settle(Decision::RefusedBySeat(&full), || 0);
        assert_eq!(unanswered(), 4);
        // The seat was cut off: judged afresh by the replica's own gate, counted no more.
        let alone = third.cut_off();
        assert_eq!(unanswered(), 0);
        drop(alone);

        // The send's future dropped while the seat decided.
        let given_up = judged(5);
        assert_eq!(unanswered(), 5);
        drop(given_up);
        assert_eq!(unanswered(), 0);

        // Refused by the judge (past the sheddable level): never counted past its judging.
        let sheddable = Asker {
            criticality: Criticality::Sheddable,
            ..Asker::OPEN
        };
        let mut refused = Judging::new(Some(&fairness), sheddable, 1, &ceiling);
        assert!(refused.in_fleet(seen(90)).is_err());
        assert_eq!(unanswered(), 0);
    }

    /// In a fleet a send is weighed by the backlog it would leave: at its level's cut
    /// (sheddable at 0.8 of a ceiling of 10: 8) one more is refused, one below it admitted.
    #[tokio::test(start_paused = true)]
    async fn in_a_fleet_a_send_that_would_take_the_queue_past_its_cut_is_refused() {
        use crate::admission::tenants::Criticality;

        let fairness = open_fairness(None);
        let ceiling = ceiling_of(10);
        let sheddable = Asker {
            criticality: Criticality::Sheddable,
            ..Asker::OPEN
        };
        let judged = |estimate| {
            let mut judging = Judging::new(Some(&fairness), sheddable, 1, &ceiling);
            let seen = move || FleetView::Read {
                estimate,
                limit: 10,
                replicas: 1,
                round: 0,
            };
            judging.in_fleet(seen)
        };
        assert!(judged(7).is_ok(), "7 + 1 is at the cut");
        assert!(matches!(
            judged(8),
            Err(Refusal::Shed {
                cut: 8,
                backlog: 8,
                ..
            })
        ));
    }

    /// A refused level's `room` counts the sends as the ceiling weighs them: a replica
    /// deciding alone weighs each of its sends by the fleet's size (here 3), so 4 units
    /// below the cut are room for one more, not four.
    #[tokio::test(start_paused = true)]
    async fn a_shed_refusals_room_is_counted_in_sends_as_the_ceiling_weighs_them() {
        use crate::admission::tenants::Criticality;

        let fairness = open_fairness(None);
        let ceiling = ceiling_of(10);
        let sheddable = Asker {
            criticality: Criticality::Sheddable,
            ..Asker::OPEN
        };
        let mut judging = Judging::new(Some(&fairness), sheddable, 2, &ceiling);
        let view = CeilingView {
            round: 0,
            units: 2,
            room: 6,
            estimate: 4,
            after: 10,
            limit: 10,
        };
        assert!(matches!(
            judging.judge(&view),
            Err(Refusal::Shed {
                cut: 8,
                backlog: 4,
                room: 1,
                ..
            })
        ));
    }

    /// The tiers' refusal is a criticality refusal: its `cut` is where the level's room ends
    /// now (the room less what critical is kept), its `room` what the level may still take.
    #[tokio::test(start_paused = true)]
    async fn a_send_past_its_tiers_room_is_refused_for_its_criticality_where_that_room_ends() {
        use crate::admission::tenants::Criticality;

        let fairness = open_fairness(None);
        let ceiling = ceiling_of(100);
        let at = |criticality| Asker {
            criticality,
            ..Asker::OPEN
        };
        // Round 0: 16 critical units refused at the ceiling.
        Judging::new(Some(&fairness), at(Criticality::Critical), 16, &ceiling).refused_full(0, 16);
        // Round 1, 40 of 100 held: critical is kept ⌊16 + 3 √16⌋ = 28 of the 60 left, so a
        // default send of 33 is refused with room for 32, and the cut at 40 + 32.
        let view = CeilingView {
            round: 1,
            units: 33,
            room: 60,
            estimate: 40,
            after: 73,
            limit: 100,
        };
        let mut judging = Judging::new(Some(&fairness), at(Criticality::Default), 33, &ceiling);
        let answer = judging.judge(&view);
        assert!(matches!(
            answer,
            Err(Refusal::Shed {
                criticality: Criticality::Default,
                backlog: 40,
                cut: 72,
                room: 32,
                ..
            })
        ));
        judging.settle(Decision::Answered(&answer), || 1);
        let counts = fairness.counts();
        assert_eq!(counts[0].total.refused(Reason::Criticality), 33);
        // A critical send of 60 takes it all.
        let mut critical = Judging::new(Some(&fairness), at(Criticality::Critical), 60, &ceiling);
        assert!(critical
            .judge(&CeilingView {
                units: 60,
                after: 100,
                ..view
            })
            .is_ok());
    }
}
