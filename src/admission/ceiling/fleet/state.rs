//! The seat's state under its one lock: the mode it is in, the blocks it hands out, the
//! outcomes it owes the ledger, and what it last saw of the fleet.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::super::window::Window;
use crate::admission::drain::DrainEstimator;
use crate::coordination::port::{Epoch, View};

/// Most headroom one reservation asks for: far from the ceiling (room ≥ 8 × this), one
/// Redis call per this many sends.
pub(super) const BLOCK_WANT: u64 = 128;
/// A block is at most this share of the room left (1/8), so replicas split the headroom
/// and blocks shrink to one send near the ceiling.
pub(super) const SHARE_DIVISOR: u64 = 8;
/// Far from the ceiling (the last grant was a whole [`BLOCK_WANT`]), the next block is
/// asked for once fewer units than this are left, so sends neither wait for Redis nor
/// each ask at once when the block runs out. Near it, grants are smaller and nothing is
/// asked for ahead.
pub(super) const NEXT_BLOCK_BELOW: u64 = BLOCK_WANT / 2;

/// What an admission through the fleet holds, with the epoch of the ledger that counts it
/// and the window's bucket it was counted in (its outcome goes back there: docs/fleet.md,
/// step 5, what a loss costs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A unit of block `turn`.
    Block {
        epoch: u64,
        turn: u64,
        bucket: Instant,
    },
    /// Nothing reserved: admitted fail-open (the fleet's read failed); a stored outcome is
    /// still counted.
    Open { epoch: u64, bucket: Instant },
}

impl Held {
    /// The epoch whose ledger counts it, and its window bucket.
    pub(super) fn admitted(self) -> (u64, Instant) {
        match self {
            Held::Block { epoch, bucket, .. } | Held::Open { epoch, bucket } => (epoch, bucket),
        }
    }
}

/// What the seat does with a send that no unit of its blocks admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    // ## Reserving => Refusing | Leaving
    /// Asks the fleet for room (docs/fleet.md, step 1). A reservation answered "full" turns
    /// it [`Mode::Refusing`]; the replica's drain, [`Mode::Leaving`].
    Reserving,
    // ## Refusing => Reserving | Leaving
    /// Told "full": with hysteresis on (`SENDGATE_RESUME_BELOW` < 1), refuses until the
    /// estimate on the view last seen is back at or below the resume level, or a new epoch
    /// is adopted; both turn it [`Mode::Reserving`].
    Refusing,
    // ## Leaving { refusing } => Leaving { refusing: false }
    /// Drained (step 7): admits nothing more, in the fleet or alone. Whether it was refusing
    /// when it left is still shown by the snapshot, until the rules that end a refusal do.
    Leaving { refusing: bool },
}

impl Mode {
    pub(super) fn refusing(self) -> bool {
        matches!(self, Mode::Refusing | Mode::Leaving { refusing: true })
    }

    pub(super) fn leaving(self) -> bool {
        matches!(self, Mode::Leaving { .. })
    }

    /// A reservation answered "full".
    pub(super) fn told_full(&mut self) {
        *self = match self {
            Mode::Leaving { .. } => Mode::Leaving { refusing: true },
            Mode::Reserving | Mode::Refusing => Mode::Refusing,
        };
    }

    /// The estimate is back at the resume level, or a new epoch was adopted.
    pub(super) fn resume(&mut self) {
        *self = match self {
            Mode::Leaving { .. } => Mode::Leaving { refusing: false },
            Mode::Reserving | Mode::Refusing => Mode::Reserving,
        };
    }

    /// The replica drained.
    pub(super) fn leave(&mut self) {
        *self = Mode::Leaving {
            refusing: self.refusing(),
        };
    }
}

/// The seat's own tasks that run one at a time: each is marked here when it is started and
/// unmarked when it ends, so no second one starts meanwhile.
#[derive(Debug, Default)]
pub(super) struct Running {
    /// A reservation for the next block, asked for ahead (see [`NEXT_BLOCK_BELOW`]).
    pub(super) next_block: bool,
    /// A settle of the outcomes, scheduled (one per `SETTLE_EVERY`).
    pub(super) settle: bool,
    /// A read started ahead of the fleet's read's expiry.
    pub(super) read_ahead: bool,
    /// A read again at the ceiling.
    pub(super) ceiling_read: bool,
}

/// What a `send_failclosed` line is logged once for: a fleet read (its generation), or,
/// cut off, a spell (since when the replica is local, and the log period within it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailClosedLog {
    Read(u64),
    CutOff(Instant, u64),
}

/// The fleet said "full" on a read generation: sends are refused locally until `until`
/// while that read is the last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ToldFull {
    pub(super) until: Instant,
    pub(super) estimate: u64,
    pub(super) generation: u64,
}

/// A block granted to this replica, being handed out.
pub(super) struct Block {
    pub(super) epoch: u64,
    pub(super) turn: u64,
    pub(super) left: u64,
    pub(super) use_until: Instant,
    /// The ceiling it was granted under: once a lower one is in force it is not used.
    pub(super) limit: u64,
}

pub(super) struct SeatState {
    pub(super) mode: Mode,
    /// The ledger's `(epoch, version)` in the newest reply processed.
    pub(super) seen: Epoch,
    /// Blocks being handed out, oldest first; bounded (a block leaves once used up or past
    /// its use, and a new one is asked for when none is usable, or ahead: see
    /// [`NEXT_BLOCK_BELOW`]).
    pub(super) blocks: VecDeque<Block>,
    /// The ceiling the last grant was made under, if it was a whole
    /// [`BLOCK_WANT`] (far from that ceiling).
    pub(super) whole_under: Option<u64>,
    pub(super) running: Running,
    pub(super) turns: u64,
    /// The fleet's state as last seen, and when (local clock).
    pub(super) last: Option<(View, Instant)>,
    /// The fleet's size and estimate as last seen with a good read, kept while cut off.
    pub(super) fleet_size: u64,
    pub(super) estimate: Option<(u64, Instant)>,
    /// Outcomes to settle, by `(epoch, block turn)` (turn 0: open sends): (stored, not).
    pub(super) pending: BTreeMap<(u64, u64), (u64, u64)>,
    /// By epoch: sends admitted open (no block holds them) in flight, plus the sends to
    /// settle as no block's, i.e. `pending[(epoch, 0)].0`: the open ones' stored outcomes
    /// and the sends of other epochs known stored, recounted (docs/fleet.md, step 1: every
    /// admitted send is counted somewhere at every instant; step 5, what a loss costs).
    /// Reported in the carry until a settle that took them succeeded; then `since_read`
    /// counts them.
    pub(super) open: BTreeMap<u64, u64>,
    pub(super) window: Window,
    pub(super) ahead_tried_at: Option<Instant>,
    /// The read generation another replica's read was last waited for in vain.
    pub(super) waited_out: Option<u64>,
    pub(super) last_read_took: Duration,
    /// The fleet's paced reads ([`View::paced`]) when a read at the ceiling last failed:
    /// none again before the TTL's next read.
    pub(super) ceiling_read_failed: Option<u64>,
    /// Admin-plane reads this replica made for the fleet: (ok, failed).
    pub(super) own_reads: (u64, u64),
    /// When the seat last lost its view to a cut-off: the spell `send_failclosed` is logged
    /// per while there is no fleet read to log per.
    pub(super) cut_off_at: Option<Instant>,
    /// Refreshes finished in this replica, and whether the last one failed on Redis: the
    /// sends queued behind it then make no call of their own in turn.
    pub(super) refreshes: (u64, bool),
    /// What the last `send_failclosed` line was logged for.
    pub(super) failclosed_logged: Option<FailClosedLog>,
    pub(super) failclosed_unlogged: u64,
    /// The fleet said "full": refused locally until then.
    pub(super) full: Option<ToldFull>,
    pub(super) drain: DrainEstimator,
    /// `(generation, backlog + since_read as last seen, when it was read)`.
    pub(super) measured: Option<(u64, u64, Instant)>,
}

impl SeatState {
    pub(super) fn new(lag: Duration) -> Self {
        Self {
            mode: Mode::Reserving,
            seen: Epoch::NONE,
            blocks: VecDeque::new(),
            whole_under: None,
            running: Running::default(),
            turns: 0,
            last: None,
            fleet_size: 1,
            estimate: None,
            pending: BTreeMap::new(),
            open: BTreeMap::new(),
            window: Window::default(),
            ahead_tried_at: None,
            waited_out: None,
            last_read_took: Duration::ZERO,
            ceiling_read_failed: None,
            own_reads: (0, 0),
            cut_off_at: None,
            refreshes: (0, false),
            failclosed_logged: None,
            failclosed_unlogged: 0,
            full: None,
            drain: DrainEstimator::new(lag),
            measured: None,
        }
    }

    /// `units` of block `turn` of `epoch` will not be handed out: settled as not stored with
    /// the next batch, so the ledger counts them no longer than that.
    pub(super) fn give_back(&mut self, epoch: u64, turn: u64, units: u64) {
        self.pending.entry((epoch, turn)).or_default().1 += units;
    }

    /// A reply named a new epoch (docs/fleet.md, step 5): the blocks and the outcomes of the
    /// old one go, and so does what its reads said. Their sends of the last `hold` are in
    /// the carry while their outcome is open; those known stored are recounted: settled
    /// into the new epoch as no block's, and carried until then.
    pub(super) fn adopt(&mut self, epoch: Epoch, now: Instant, hold: Duration) {
        self.seen = epoch;
        self.blocks.clear();
        let current = epoch.id;
        self.pending.retain(|(epoch, _), _| *epoch == current);
        // Open sends of the old epoch are in the window under it: in the carry now.
        self.open.retain(|epoch, _| *epoch == current);
        let recount = self.window.recount(now, hold, current);
        if recount > 0 {
            self.pending.entry((current, 0)).or_default().0 += recount;
            *self.open.entry(current).or_default() += recount;
        }
        self.full = None;
        self.mode.resume();
        self.measured = None;
        self.drain.break_chain();
    }

    /// `units` units of one block still in use (so they share one [`Held`]), granted
    /// under a ceiling no higher than `limit` (the one in force), if any: counted in the
    /// window under its epoch.
    pub(super) fn take_units(
        &mut self,
        now: Instant,
        keep: Duration,
        limit: u64,
        units: u64,
    ) -> Option<Held> {
        let block = self
            .blocks
            .iter_mut()
            .find(|b| b.left >= units && now < b.use_until && b.limit <= limit)?;
        block.left -= units;
        let (epoch, turn) = (block.epoch, block.turn);
        Some(Held::Block {
            epoch,
            turn,
            bucket: self.window.record_units(now, epoch, keep, units),
        })
    }

    /// Units of blocks still in use under a ceiling no higher than `limit`, not yet handed
    /// out.
    pub(super) fn unused(&self, now: Instant, limit: u64) -> u64 {
        self.blocks
            .iter()
            .filter(|b| now < b.use_until && b.limit <= limit)
            .map(|b| b.left)
            .sum()
    }

    /// What a single send's grant says of the distance to the ceiling `limit`: whole
    /// ([`BLOCK_WANT`]), far from it; less, near it. A `split` ask's grant (step 1: others
    /// of this replica were out) is small by design, so it may mark the ceiling far but
    /// never near: else a burst far from the ceiling would stop the next block being
    /// asked for ahead.
    pub(super) fn note_grant(&mut self, granted: u64, limit: u64, split: bool) {
        let whole = granted >= BLOCK_WANT;
        if whole || !split {
            self.whole_under = whole.then_some(limit);
        }
    }

    /// Whether the next block should be asked for now (see [`NEXT_BLOCK_BELOW`]); if so, it
    /// is marked asked. Not once a lower ceiling is in force than the whole grant's.
    pub(super) fn next_block_due(&mut self, now: Instant, limit: u64) -> bool {
        let far = self.whole_under.is_some_and(|under| under <= limit);
        if !far || self.running.next_block || self.mode.leaving() {
            return false;
        }
        self.running.next_block = self.unused(now, limit) < NEXT_BLOCK_BELOW;
        self.running.next_block
    }

    /// Blocks past their use, or granted under a higher ceiling than `limit`, give back what
    /// they did not hand out (to settle): counted still, those units would make this
    /// replica's sends, and the others', find the fleet full while they go unused. Whether
    /// any did.
    pub(super) fn give_back_spent(&mut self, now: Instant, limit: u64) -> bool {
        let mut leftover = Vec::new();
        self.blocks.retain(|b| {
            let spent = now >= b.use_until || b.limit > limit;
            if b.left > 0 && spent {
                leftover.push((b.epoch, b.turn, b.left));
            }
            b.left > 0 && !spent
        });
        let any = !leftover.is_empty();
        for (epoch, turn, left) in leftover {
            self.give_back(epoch, turn, left);
        }
        any
    }
}
