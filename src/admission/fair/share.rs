//! Who gets a queue's room when not everyone can (docs/fairness.md): the share rule, as a
//! pure book of what each tenant asked and was admitted, round by round.
//!
//! The book never admits anything the ceiling would not: it is asked only about sends the
//! ceiling admits, with the room the ceiling sees, and it may only refuse. It knows nothing
//! of how the room is measured (a local gate or a fleet's seat) nor of HTTP.

use std::time::Duration;

use tokio::time::Instant;

use crate::admission::tenants::TenantIndex;

/// What the book does with a send it would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareMode {
    /// Refuse it.
    Enforce,
    /// Admit it, and say it would have been refused.
    Shadow,
    /// Admit it; nothing is measured as a refusal.
    Off,
}

/// The book's answer for a send the ceiling would admit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Admit,
    /// Over its part: refused. `share` is its part of the room this round offers (0–1);
    /// `room` how many units it could take now.
    Refuse {
        share: f64,
        room: u64,
    },
    /// Over its part, admitted all the same (shadow mode).
    WouldRefuse {
        share: f64,
    },
}

/// A tenant's counts of a round, in units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Asked in the previous round (admitted or refused).
    pub asked_before: u64,
    /// Asked in this round so far.
    pub asked: u64,
    /// Admitted in this round so far.
    pub admitted: u64,
}

impl Counts {
    /// As of the round after: its asks become the asks before.
    fn rolled(self) -> Self {
        Self {
            asked_before: self.asked,
            ..Self::default()
        }
    }
}

/// A round's counts, by tenant index: this book's own, or what the other replicas of a
/// fleet counted (docs/fairness.md, "In a fleet").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundView {
    pub round: u64,
    /// Refused (at the ceiling or for a share) in this round / in the one before.
    pub refused_now: bool,
    pub refused_before: bool,
    pub counts: Vec<(TenantIndex, Counts)>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Tenant {
    weight: u32,
    own: Counts,
    /// The other replicas' counts as last heard, as of this round.
    heard: Counts,
}

impl Tenant {
    /// What the tenant is taken to want this round: its asks of the round before, or of
    /// this one if more, here and on the other replicas.
    fn wants(&self) -> u64 {
        let before = self
            .own
            .asked_before
            .saturating_add(self.heard.asked_before);
        let now = self.own.asked.saturating_add(self.heard.asked);
        before.max(now)
    }

    /// Admitted this round, here and on the other replicas.
    fn admitted(&self) -> u64 {
        self.own.admitted.saturating_add(self.heard.admitted)
    }
}

/// One queue's book.
#[derive(Debug, Default)]
pub struct ShareBook {
    /// The round `tenants` counts: the share round of the queue's depth reads (the gate's
    /// own, or the fleet's; `CapacityPolicy::share_round`), since room opens only when a
    /// read shows the drain.
    round: u64,
    tenants: Vec<Tenant>,
    /// A send was refused (at the ceiling, or for its share) in this round / in the
    /// previous one, here.
    refused_now: bool,
    refused_before: bool,
    /// The same, on another replica, as last heard.
    heard_refused_now: bool,
    heard_refused_before: bool,
    /// A send was refused on this replica's share of the room alone, of a tenant wanting
    /// more than its part of the whole room, while a refusal above (or the estimate near
    /// the ceiling) said the queue was contended this round or the last: in this round /
    /// the previous one. Never told to the other replicas, so it cannot renew itself
    /// through them, nor here: it needs that other sign within two rounds.
    past_part_now: bool,
    past_part_before: bool,
    /// Units asked since the book began: the exchange tells nothing once this stops moving.
    asks: u64,
    /// When a send last asked the book ([`Self::forget_if_idle`]).
    asked_at: Option<Instant>,
}

impl ShareBook {
    /// A book for tenants of these weights (index = [`TenantIndex`]; each at least 1).
    pub fn new(weights: &[u32]) -> Self {
        Self {
            tenants: weights
                .iter()
                .map(|&weight| Tenant {
                    weight: weight.max(1),
                    ..Tenant::default()
                })
                .collect(),
            ..Self::default()
        }
    }

    /// Start `round` if it is a new one: the next one rolls this round's asks into the
    /// asks before; any other (rounds the book missed, a fleet's generations begun again, a TTL changed)
    /// starts from nothing. A send judged by the read before the book's (a replica whose
    /// seat has not yet seen the read the others told of) counts in the book's round.
    fn roll(&mut self, round: u64) {
        if round == self.round || round.checked_add(1) == Some(self.round) {
            return;
        }
        let next = self.round.checked_add(1) == Some(round);
        for t in &mut self.tenants {
            t.own = if next {
                t.own.rolled()
            } else {
                Counts::default()
            };
            t.heard = if next {
                t.heard.rolled()
            } else {
                Counts::default()
            };
        }
        self.refused_before = next && self.refused_now;
        self.refused_now = false;
        self.heard_refused_before = next && self.heard_refused_now;
        self.heard_refused_now = false;
        self.past_part_before = next && self.past_part_now;
        self.past_part_now = false;
        self.round = round;
    }

    /// Before a send asks the book at `now`: a book nobody asked for longer than `idle`
    /// (the round and the next) forgets every count and refusal. Rounds end only at depth
    /// reads, and an idle queue is not read: without this, the first read after an idle
    /// hour would roll the hour-old round's asks in as the round before's, and owe room to
    /// tenants that stopped sending long ago.
    pub fn forget_if_idle(&mut self, now: Instant, idle: Duration) {
        if self.idle_at(now, idle) {
            for t in &mut self.tenants {
                t.own = Counts::default();
                t.heard = Counts::default();
            }
            self.refused_now = false;
            self.refused_before = false;
            self.past_part_now = false;
            self.past_part_before = false;
            self.heard_refused_now = false;
            self.heard_refused_before = false;
        }
        self.asked_at = Some(now);
    }

    /// Whether nobody asked the book for longer than `idle` before `now`.
    fn idle_at(&self, now: Instant, idle: Duration) -> bool {
        self.asked_at
            .is_some_and(|at| now.saturating_duration_since(at) > idle)
    }

    /// The round the book counts now.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Units asked of this book so far (admitted or not), ever.
    pub fn asks(&self) -> u64 {
        self.asks
    }

    /// Count `units` asked by tenant `index`: false for a tenant the book does not know.
    fn ask(&mut self, index: usize, units: u64) -> bool {
        let Some(t) = self.tenants.get_mut(index) else {
            return false;
        };
        t.own.asked = t.own.asked.saturating_add(units);
        self.asks = self.asks.saturating_add(units);
        true
    }

    /// This book's own counts of its round (tenants that counted nothing left out); `None`
    /// when nothing was asked in it or the round before (nothing to tell).
    pub fn own_round(&self) -> Option<RoundView> {
        let counts: Vec<(TenantIndex, Counts)> = self
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| t.own != Counts::default())
            .map(|(i, t)| (TenantIndex(u16::try_from(i).unwrap_or(u16::MAX)), t.own))
            .collect();
        (!counts.is_empty()).then_some(RoundView {
            round: self.round,
            refused_now: self.refused_now,
            refused_before: self.refused_before,
            counts,
        })
    }

    /// What the other replicas counted, as of `view.round`: counts of this book's round
    /// replace what was heard, those of the round before move back one (a replica that has
    /// not yet seen the latest read), those of the round after start it (this one has
    /// not); any other round's are dropped.
    pub fn hear(&mut self, view: RoundView) {
        if self.round.checked_add(1) == Some(view.round) {
            self.roll(view.round);
        }
        let next = view.round.checked_add(1) == Some(self.round);
        if view.round != self.round && !next {
            return;
        }
        for t in &mut self.tenants {
            t.heard = Counts::default();
        }
        for (index, counts) in view.counts {
            if let Some(t) = self.tenants.get_mut(usize::from(index.0)) {
                t.heard = if next { counts.rolled() } else { counts };
            }
        }
        self.heard_refused_now = !next && view.refused_now;
        self.heard_refused_before = if next {
            view.refused_now
        } else {
            view.refused_before
        };
    }

    /// Take back `units` counted as admitted to `tenant` in `round` ([`Self::round`] when
    /// they were; the fleet's seat then did not admit them): neither asked nor admitted.
    /// A later round's counts are not that round's: they keep them.
    pub fn withdraw(&mut self, tenant: TenantIndex, units: u64, round: u64) {
        if round != self.round {
            return;
        }
        if let Some(t) = self.tenants.get_mut(usize::from(tenant.0)) {
            t.own.asked = t.own.asked.saturating_sub(units);
            t.own.admitted = t.own.admitted.saturating_sub(units);
        }
    }

    /// Count `units` asked and admitted for `tenant` in `round` without deciding (the room
    /// is not known: the ceiling alone decides).
    pub fn count_admitted(&mut self, tenant: TenantIndex, units: u64, round: u64) {
        self.roll(round);
        let index = usize::from(tenant.0);
        if self.ask(index, units) {
            let t = &mut self.tenants[index].own;
            t.admitted = t.admitted.saturating_add(units);
        }
    }

    /// The ceiling refused `units` for `tenant` in `round`: they count as asked, and the
    /// queue as contended for this round and the next.
    pub fn refused_at_ceiling(&mut self, tenant: TenantIndex, units: u64, round: u64) {
        self.roll(round);
        self.ask(usize::from(tenant.0), units);
        self.refused_now = true;
    }

    /// Whether the queue counts as contended: a send refused at the ceiling or for its
    /// share this round or the last (here or, as heard, on another replica), or `near`
    /// (the gate's estimate at or over the share threshold).
    fn contended(&self, near: bool) -> bool {
        self.refused_anywhere(near) || self.past_part_now || self.past_part_before
    }

    /// A send refused at the ceiling, or for a share the whole room would refuse too, this
    /// round or the last (here or, as heard, on another replica), or `near`.
    fn refused_anywhere(&self, near: bool) -> bool {
        near || self.refused_now
            || self.refused_before
            || self.heard_refused_now
            || self.heard_refused_before
    }

    /// Decide `units` for `tenant` in `round`, which the ceiling would admit with `room`
    /// left (room before these units). `near`: the estimate is at or over the share
    /// threshold. Admitted (or admitted in shadow) units are counted as the round's.
    pub fn decide(
        &mut self,
        tenant: TenantIndex,
        units: u64,
        room: u64,
        near: bool,
        mode: ShareMode,
        round: u64,
    ) -> Verdict {
        self.decide_in_part(tenant, units, (room, room), near, mode, round)
    }

    /// As [`Self::decide`], judged on `rooms.0`, this replica's part of the room, of
    /// `rooms.1` the ceiling has left in all (a fleet's replica judges on its share of what
    /// is left, docs/fairness.md "In a fleet").
    pub fn decide_in_part(
        &mut self,
        tenant: TenantIndex,
        units: u64,
        rooms: (u64, u64),
        near: bool,
        mode: ShareMode,
        round: u64,
    ) -> Verdict {
        let (room, whole) = rooms;
        self.roll(round);
        let index = usize::from(tenant.0);
        if !self.ask(index, units) {
            return Verdict::Admit;
        }
        // One tenant is owed nothing by anyone else: whatever the ceiling admits is its
        // (open mode, a keys file of one tenant), without the parts computed per send.
        let alone = self.tenants.len() == 1;
        let (verdict, scarce, past_part) =
            if alone || mode == ShareMode::Off || !self.contended(near) {
                (Verdict::Admit, false, false)
            } else {
                let verdict = match self.over_part(index, units, room) {
                    None => Verdict::Admit,
                    Some((share, _)) if mode == ShareMode::Shadow => Verdict::WouldRefuse { share },
                    Some((share, room)) => Verdict::Refuse { share, room },
                };
                let refused = verdict != Verdict::Admit;
                // Refused where the whole room would refuse too.
                let scarce =
                    refused && (whole <= room || self.over_part(index, units, whole).is_some());
                // Refused on this replica's share alone, the tenant wanting more than its part
                // of the whole room (its asks include retries of such refusals).
                let past_part = refused && !scarce && self.wants_past_part(index, whole);
                (verdict, scarce, past_part)
            };
        if !matches!(verdict, Verdict::Refuse { .. }) {
            let asker = &mut self.tenants[index].own;
            asker.admitted = asker.admitted.saturating_add(units);
        }
        // A share refused (or, in shadow, one that would be) keeps the queue contended for
        // the next round, as a refusal at the ceiling does: else a round that ends with the
        // room a modest tenant is owed still unused would start the next one uncontended,
        // and the greedy tenant would take it all before the ceiling refuses anyone. On its
        // share of the room, each of a fleet's replicas keeps back all of what the others
        // are owed, so it refuses demand that fits the whole room too: such refusals alone
        // would hold a queue whose demand fits contended round after round (their retries
        // count as asks). A refusal the whole room would make keeps it contended; one of a
        // tenant wanting past its part of the whole room only while another sign says so
        // (the room kept back ends every round unused, and without it the next round would
        // start uncontended with the greedy tenant taking all).
        if scarce {
            self.refused_now = true;
        } else if past_part && self.refused_anywhere(near) {
            self.past_part_now = true;
        }
        verdict
    }

    /// What this round offers with `room` left: what it admitted, and the room.
    fn offered(&self, room: u64) -> u64 {
        self.tenants
            .iter()
            .map(Tenant::admitted)
            .fold(room, u64::saturating_add)
    }

    /// Whether the tenant wants more than its part of what the round offers with `room`
    /// left: then the tenants' asks do not all fit in it.
    fn wants_past_part(&self, index: usize, room: u64) -> bool {
        let offered = self.offered(room);
        parts(offered, &self.tenants)[index] < self.tenants[index].wants() as f64
    }

    /// `None` when `units` fit in the room the others' parts leave (to within a unit);
    /// else the asker's part of the room this round offers, and the units that do fit.
    fn over_part(&self, index: usize, units: u64, room: u64) -> Option<(f64, u64)> {
        let offered = self.offered(room);
        let parts = parts(offered, &self.tenants);
        let owed: Vec<f64> = self
            .tenants
            .iter()
            .zip(&parts)
            .map(|(t, &part)| (part - t.admitted() as f64).max(0.0))
            .collect();
        let total: f64 = owed.iter().sum();
        let room_f = room as f64;
        let scale = if total > room_f { room_f / total } else { 1.0 };
        let others: f64 = owed
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != index)
            .map(|(_, &s)| s * scale)
            .sum();
        // "To within a unit": a fraction of room left over is a unit the asker may take.
        let left = (room_f - others - 1e-9).ceil();
        let fits = if left > 0.0 { left as u64 } else { 0 };
        if units as f64 <= left {
            None
        } else if offered == 0 {
            Some((0.0, fits))
        } else {
            Some((parts[index] / offered as f64, fits))
        }
    }

    /// Each tenant's part of the room this round offers, for health (0–1 each; all 0 when
    /// nothing is offered, nobody asks, or nobody asked for longer than `idle` before `now`).
    pub fn shares_now(&self, room: u64, now: Instant, idle: Duration) -> Vec<f64> {
        if self.idle_at(now, idle) {
            return vec![0.0; self.tenants.len()];
        }
        let offered = self.offered(room);
        if offered == 0 {
            return vec![0.0; self.tenants.len()];
        }
        parts(offered, &self.tenants)
            .into_iter()
            .map(|p| p / offered as f64)
            .collect()
    }
}

/// Weighted max-min fair water-filling of `offered` units over what each tenant wants: a
/// tenant wanting less than its weighted part gets what it wants, the rest is shared by
/// the others by weight. When everyone can have what it wants, each gets exactly that.
fn parts(offered: u64, tenants: &[Tenant]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..tenants.len())
        .filter(|&i| tenants[i].wants() > 0)
        .collect();
    // Smallest want per weight first: each in turn is either satisfied or sets the level.
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&tenants[a], &tenants[b]);
        (u128::from(ta.wants()) * u128::from(tb.weight))
            .cmp(&(u128::from(tb.wants()) * u128::from(ta.weight)))
    });
    let mut parts = vec![0.0; tenants.len()];
    let mut left = offered as f64;
    let mut weights: f64 = order.iter().map(|&i| f64::from(tenants[i].weight)).sum();
    for (k, &i) in order.iter().enumerate() {
        let t = &tenants[i];
        let level = left / weights;
        let want = t.wants() as f64;
        let weight = f64::from(t.weight);
        if want <= weight * level {
            parts[i] = want;
            left -= want;
            weights -= weight;
        } else {
            for &j in &order[k..] {
                parts[j] = f64::from(tenants[j].weight) * level;
            }
            break;
        }
    }
    parts
}

#[cfg(test)]
mod tests;
