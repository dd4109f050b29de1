//! Who gets a queue's room when not everyone can (docs/fairness.md): the tiers' order and
//! the share rule, as a pure book of what each tenant asked and was admitted at each
//! criticality, round by round.
//!
//! The book never admits anything the ceiling would not: it is asked only about sends the
//! ceiling admits, with the room the ceiling sees, and it may only refuse. It knows nothing
//! of how the room is measured (a local gate or a fleet's seat) nor of HTTP.

use std::time::Duration;

use tokio::time::Instant;

use crate::admission::tenants::{Criticality, TenantIndex};

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
    /// Past the room its tier has, the higher tiers' asks kept: refused. `room` is how many
    /// units its tier could take now.
    Shed {
        room: u64,
    },
    /// Past its tier's room, admitted all the same (shadow mode).
    WouldShed,
}

/// A tenant at a criticality: the book counts each apart, the tiers' order keeps room for
/// the higher ones, and each tier's room is shared by its tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    pub tenant: TenantIndex,
    pub level: Criticality,
}

impl From<TenantIndex> for Cell {
    /// The tenant at the default criticality.
    fn from(tenant: TenantIndex) -> Self {
        Self {
            tenant,
            level: Criticality::Default,
        }
    }
}

/// The tiers, highest first: each is kept room for what every one above it is owed.
const TIERS: [Criticality; 3] = Criticality::ALL;

/// Where a level's cells lie in the book (default first, so a tenant's default cell is at
/// its own index).
fn slot(level: Criticality) -> usize {
    match level {
        Criticality::Default => 0,
        Criticality::Critical => 1,
        Criticality::Sheddable => 2,
    }
}

/// How much room above what a higher tier is taken to want is kept for it as well, in
/// standard deviations of a count of that many independent asks (√q): a round's asks are
/// not the last round's, and a higher tier asking a little more than it did must not find
/// its room taken by a lower one.
const SURGE_SIGMAS: f64 = 3.0;

/// How fast a tier's pace (its asks per round, smoothed over rounds) follows its asks: an
/// eighth of the way each round, so a pace of `λ` Poisson asks a round is off by about
/// `√(λ/15)`. One quiet round (a critical tier asking 2 a round asks none in one round of
/// seven) must not leave the next without room kept for it; a tier that stops is kept
/// room for a few more rounds (its pace halves every five).
const PACE_FOLLOWS: f64 = 0.125;

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

/// A round's counts, by tenant and criticality: this book's own, or what the other
/// replicas of a fleet counted (docs/fairness.md, "In a fleet").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundView {
    pub round: u64,
    /// Refused (at the ceiling or for a share) in this round / in the one before.
    pub refused_now: bool,
    pub refused_before: bool,
    pub counts: Vec<(Cell, Counts)>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Tenant {
    weight: u32,
    own: Counts,
    /// The other replicas' counts as last heard, as of this round.
    heard: Counts,
    /// Units of its part it was not admitted in the rounds before while it asked for more
    /// (a deficit, as in deficit round robin; below 0, what it was admitted past its part):
    /// owed on top of this round's part, so that over rounds of a few units each admissions
    /// follow the weights.
    behind: f64,
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

    /// Asked this round, here and on the other replicas.
    fn asked(&self) -> u64 {
        self.own.asked.saturating_add(self.heard.asked)
    }
}

/// One queue's book.
#[derive(Debug, Default)]
pub struct ShareBook {
    /// The round `tenants` counts: the share round of the queue's depth reads (the gate's
    /// own, or the fleet's; `CapacityPolicy::share_round`), since room opens only when a
    /// read shows the drain.
    round: u64,
    /// The tenants' cells, a level's `n` at a time ([`slot`]).
    tenants: Vec<Tenant>,
    /// Tenants in the keys file.
    n: usize,
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
    /// Each tier's asks per round, smoothed over the rounds before ([`PACE_FOLLOWS`];
    /// index [`slot`]).
    paces: [f64; 3],
    /// Rounds the paces were smoothed over since they last started from nothing (their
    /// start's bias toward 0 is taken out, as an exponential average's is).
    paced: i32,
    /// Units asked since the book began: the exchange tells nothing once this stops moving.
    asks: u64,
    /// When a send last asked the book ([`Self::forget_if_idle`]).
    asked_at: Option<Instant>,
}

impl ShareBook {
    /// A book for tenants of these weights (index = [`TenantIndex`]; each at least 1).
    pub fn new(weights: &[u32]) -> Self {
        let cells = TIERS.map(|_| weights).concat();
        Self {
            tenants: cells
                .iter()
                .map(|&weight| Tenant {
                    weight: weight.max(1),
                    ..Tenant::default()
                })
                .collect(),
            n: weights.len(),
            ..Self::default()
        }
    }

    /// A cell's place in the book: `None` for a tenant the book does not know.
    fn index(&self, cell: Cell) -> Option<usize> {
        let tenant = usize::from(cell.tenant.0);
        (tenant < self.n).then(|| slot(cell.level) * self.n + tenant)
    }

    /// The cell at a place in the book.
    fn cell(&self, index: usize) -> Cell {
        let level = TIERS
            .into_iter()
            .find(|&l| slot(l) == index / self.n.max(1))
            .unwrap_or(Criticality::Default);
        Cell {
            tenant: TenantIndex(u16::try_from(index % self.n.max(1)).unwrap_or(u16::MAX)),
            level,
        }
    }

    /// The places of a level's cells.
    fn tier(&self, level: Criticality) -> std::ops::Range<usize> {
        let start = slot(level) * self.n;
        start..start + self.n
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
        // Only a round the room did not cover carries: one whose refusals were all of a
        // replica's share of the room (demand that fits the whole of it) says nothing of
        // what a tenant was short.
        let carry = next && (self.refused_now || self.heard_refused_now);
        if carry {
            self.carry_deficits();
        }
        if next {
            self.pace_tiers();
        } else {
            (self.paces, self.paced) = ([0.0; 3], 0);
        }
        for t in &mut self.tenants {
            if !carry {
                t.behind = 0.0;
            }
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
                t.behind = 0.0;
            }
            (self.paces, self.paced) = ([0.0; 3], 0);
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

    /// Count `units` asked by `cell`: its place, or `None` for a tenant the book does not
    /// know.
    fn ask(&mut self, cell: Cell, units: u64) -> Option<usize> {
        let index = self.index(cell)?;
        let t = &mut self.tenants[index];
        t.own.asked = t.own.asked.saturating_add(units);
        self.asks = self.asks.saturating_add(units);
        Some(index)
    }

    /// This book's own counts of its round (tenants that counted nothing left out); `None`
    /// when nothing was asked in it or the round before (nothing to tell).
    pub fn own_round(&self) -> Option<RoundView> {
        let counts: Vec<(Cell, Counts)> = self
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| t.own != Counts::default())
            .map(|(i, t)| (self.cell(i), t.own))
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
        for (cell, counts) in view.counts {
            if let Some(index) = self.index(cell) {
                self.tenants[index].heard = if next { counts.rolled() } else { counts };
            }
        }
        self.heard_refused_now = !next && view.refused_now;
        self.heard_refused_before = if next {
            view.refused_now
        } else {
            view.refused_before
        };
    }

    /// Take back `units` counted as admitted to `cell` in `round` ([`Self::round`] when
    /// they were; the fleet's seat then did not admit them): neither asked nor admitted.
    /// A later round's counts are not that round's: they keep them.
    pub fn withdraw(&mut self, cell: impl Into<Cell>, units: u64, round: u64) {
        if round != self.round {
            return;
        }
        if let Some(index) = self.index(cell.into()) {
            let t = &mut self.tenants[index].own;
            t.asked = t.asked.saturating_sub(units);
            t.admitted = t.admitted.saturating_sub(units);
        }
    }

    /// Count `units` asked and admitted for `cell` in `round` without deciding (the room
    /// is not known: the ceiling alone decides).
    pub fn count_admitted(&mut self, cell: impl Into<Cell>, units: u64, round: u64) {
        self.roll(round);
        if let Some(index) = self.ask(cell.into(), units) {
            let t = &mut self.tenants[index].own;
            t.admitted = t.admitted.saturating_add(units);
        }
    }

    /// The ceiling refused `units` for `cell` in `round`: they count as asked, and the
    /// queue as contended for this round and the next.
    pub fn refused_at_ceiling(&mut self, cell: impl Into<Cell>, units: u64, round: u64) {
        self.roll(round);
        self.ask(cell.into(), units);
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

    /// Decide `units` for `cell` in `round`, which the ceiling would admit with `room`
    /// left (room before these units). `near`: the estimate is at or over the share
    /// threshold. Admitted (or admitted in shadow) units are counted as the round's.
    pub fn decide(
        &mut self,
        cell: impl Into<Cell>,
        units: u64,
        room: u64,
        near: bool,
        mode: ShareMode,
        round: u64,
    ) -> Verdict {
        self.decide_in_part(cell, units, (room, room), near, mode, round)
    }

    /// As [`Self::decide`], judged on `rooms.0`, this replica's part of the room, of
    /// `rooms.1` the ceiling has left in all (a fleet's replica judges on its share of what
    /// is left, docs/fairness.md "In a fleet").
    pub fn decide_in_part(
        &mut self,
        cell: impl Into<Cell>,
        units: u64,
        rooms: (u64, u64),
        near: bool,
        mode: ShareMode,
        round: u64,
    ) -> Verdict {
        self.roll(round);
        let Some(index) = self.ask(cell.into(), units) else {
            return Verdict::Admit;
        };
        let verdict = if self.contended(near) {
            self.judge_contended(index, units, rooms, near, mode)
        } else {
            Verdict::Admit
        };
        if !matches!(verdict, Verdict::Refuse { .. } | Verdict::Shed { .. }) {
            let asker = &mut self.tenants[index].own;
            asker.admitted = asker.admitted.saturating_add(units);
        }
        verdict
    }

    /// A contended round: the room the higher tiers are owed is theirs (criticality applies
    /// with shares off too), and what is left is the cell's tier's, shared by its tenants.
    fn judge_contended(
        &mut self,
        index: usize,
        units: u64,
        (room, whole): (u64, u64),
        near: bool,
        mode: ShareMode,
    ) -> Verdict {
        let above = self.owed_above(self.cell(index).level);
        let (room, whole) = (room.saturating_sub(above), whole.saturating_sub(above));
        if units > room {
            // Refused where the whole room would refuse too: the queue stays contended
            // for the next round, as for a share (below).
            if units > whole {
                self.refused_now = true;
            }
            return match mode {
                ShareMode::Shadow => Verdict::WouldShed,
                _ => Verdict::Shed { room },
            };
        }
        // One tenant is owed nothing by anyone else: whatever its tier has is its (open
        // mode, a keys file of one tenant), without the parts computed per send.
        if self.n == 1 || mode == ShareMode::Off {
            return Verdict::Admit;
        }
        self.share_verdict(index, units, (room, whole), near, mode)
    }

    /// The cell's share of its tier's room (`room` this replica's part of it, `whole` all
    /// of it), and whether its refusal keeps the queue contended.
    fn share_verdict(
        &mut self,
        index: usize,
        units: u64,
        (room, whole): (u64, u64),
        near: bool,
        mode: ShareMode,
    ) -> Verdict {
        let verdict = match self.over_part(index, units, room) {
            None => Verdict::Admit,
            Some((share, _)) if mode == ShareMode::Shadow => Verdict::WouldRefuse { share },
            Some((share, room)) => Verdict::Refuse { share, room },
        };
        let refused = verdict != Verdict::Admit;
        // Refused where the whole room would refuse too.
        let scarce = refused && (whole <= room || self.over_part(index, units, whole).is_some());
        // Refused on this replica's share alone, the tenant wanting more than its part of
        // the whole room (its asks include retries of such refusals).
        let past_part = refused && !scarce && self.wants_past_part(index, whole);
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

    /// What the tiers above `level` are still owed this round.
    fn owed_above(&self, level: Criticality) -> u64 {
        TIERS
            .into_iter()
            .take_while(|&higher| higher != level)
            .map(|higher| self.tier_owed(higher))
            .fold(0, u64::saturating_add)
    }

    /// What a tier is still owed this round: what it is taken to want, `q` (its tenants'
    /// asks of the round before or of this one if more, or its pace if more), and a surge
    /// of [`SURGE_SIGMAS`] `√q`, less what it was admitted.
    fn tier_owed(&self, level: Criticality) -> u64 {
        let cells = &self.tenants[self.tier(level)];
        let sum = |count: fn(&Tenant) -> u64| cells.iter().map(count).fold(0, u64::saturating_add);
        let warmed = 1.0 - (1.0 - PACE_FOLLOWS).powi(self.paced);
        let pace = if warmed > 0.0 {
            self.paces[slot(level)] / warmed
        } else {
            0.0
        };
        let wants = (sum(Tenant::wants) as f64).max(pace);
        let kept = (wants + SURGE_SIGMAS * wants.sqrt()).floor() as u64;
        kept.saturating_sub(sum(Tenant::admitted))
    }

    /// At the end of a round: each tier's pace moves toward what it asked in it.
    fn pace_tiers(&mut self) {
        for level in TIERS {
            let asked = self.tenants[self.tier(level)]
                .iter()
                .map(Tenant::asked)
                .fold(0, u64::saturating_add);
            let pace = &mut self.paces[slot(level)];
            *pace += (asked as f64 - *pace) * PACE_FOLLOWS;
        }
        self.paced = self.paced.saturating_add(1).min(1_000);
    }

    /// At the end of a round (the next one starting): each cell that asked for more than it
    /// was admitted carries what it was short of (or over) its part of what its tier
    /// admitted and of what it carried before, into the next round, at most its part (or a
    /// unit) either way; one that got all it asked for carries nothing. The rounds'
    /// rounding, and who asked first when a round's room was a few units, so even out over
    /// rounds.
    fn carry_deficits(&mut self) {
        for level in TIERS {
            let range = self.tier(level);
            let offered = self.offered(range.clone(), 0);
            let parts = parts(offered, &self.tenants[range.clone()]);
            for (t, part) in self.tenants[range].iter_mut().zip(parts) {
                let bound = part.max(1.0);
                t.behind = if t.asked() > t.admitted() {
                    (t.behind + part - t.admitted() as f64).clamp(-bound, bound)
                } else {
                    0.0
                };
            }
        }
    }

    /// What this round offers the cells of `range` with `room` left: what it admitted
    /// them, and the room.
    fn offered(&self, range: std::ops::Range<usize>, room: u64) -> u64 {
        self.tenants[range]
            .iter()
            .map(Tenant::admitted)
            .fold(room, u64::saturating_add)
    }

    /// Whether the cell wants more than its part of what its tier's round offers with
    /// `room` left: then the tier's asks do not all fit in it.
    fn wants_past_part(&self, index: usize, room: u64) -> bool {
        let range = self.tier(self.cell(index).level);
        let offered = self.offered(range.clone(), room);
        let start = range.start;
        parts(offered, &self.tenants[range])[index - start] < self.tenants[index].wants() as f64
    }

    /// `None` when `units` fit in the room the others' parts of the cell's tier leave;
    /// else the asker's part of the room the tier's round offers, and the units that do
    /// fit. A cell is owed its part and what it carried ([`Tenant::behind`]). Room that
    /// cannot cover all that is owed (a fraction of a unit, or a round of a few) goes first
    /// to the cell owed the most: no deadlock at a unit of room, and over rounds the units
    /// go where the parts say, whoever asks first.
    fn over_part(&self, index: usize, units: u64, room: u64) -> Option<(f64, u64)> {
        const EPSILON: f64 = 1e-9;
        let range = self.tier(self.cell(index).level);
        let offered = self.offered(range.clone(), room);
        let cells = &self.tenants[range.clone()];
        let parts = parts(offered, cells);
        let owed: Vec<f64> = cells
            .iter()
            .zip(&parts)
            .map(|(t, &part)| {
                // What it carried adds to a part only up to what it wants: a modest cell's
                // part is its asks already, its retries of a refused send included.
                let due = (part + t.behind).min(t.wants() as f64);
                (due - t.admitted() as f64).max(0.0)
            })
            .collect();
        let mine = index - range.start;
        let others: f64 = owed
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != mine)
            .map(|(_, &s)| s)
            .sum();
        let room_f = room as f64;
        let left = (room_f - others + EPSILON).floor().max(0.0);
        let most = owed[mine] > EPSILON && owed.iter().all(|&s| s <= owed[mine] + EPSILON);
        let fits = if most {
            left.max((owed[mine] - EPSILON).ceil().min(room_f))
        } else {
            left
        };
        if units as f64 <= fits {
            None
        } else if offered == 0 {
            Some((0.0, fits as u64))
        } else {
            Some((parts[mine] / offered as f64, fits as u64))
        }
    }

    /// Each tenant's part of the room this round offers, for health (0–1 each; all 0 when
    /// nothing is offered, nobody asks, or nobody asked for longer than `idle` before `now`):
    /// its parts of each tier's, the tiers taking the room highest first.
    pub fn shares_now(&self, room: u64, now: Instant, idle: Duration) -> Vec<f64> {
        let all = self.offered(0..self.tenants.len(), room);
        if self.idle_at(now, idle) || all == 0 {
            return vec![0.0; self.n];
        }
        let mut shares = vec![0.0; self.n];
        let mut left = room as f64;
        for level in TIERS {
            let range = self.tier(level);
            let cells = &self.tenants[range.clone()];
            let offered = self.offered(range.clone(), left.floor() as u64);
            for (i, (t, part)) in cells.iter().zip(parts(offered, cells)).enumerate() {
                shares[i] += part;
                left -= (part - t.admitted() as f64).max(0.0);
            }
            left = left.max(0.0);
        }
        shares
            .into_iter()
            .map(|p| (p / all as f64).min(1.0))
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
