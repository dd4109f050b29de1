//! A model of the fleet protocol (`docs/fleet.md`), checked exhaustively with stateright.
//!
//! Every step of the protocol that is atomic in the real system is one action here (or part
//! of one, where nothing can come between: see the reductions): each Lua script is one step
//! on the queue's hash; a replica's local decisions (hand out a unit, publish, give up on a
//! reply, notice a new epoch, admit alone) are steps of their own; the environment's faults
//! (Redis losing the hash, failing over to a copy that missed writes, a replica cut off from
//! Redis, crashing, pausing, a reply lost, a consumer draining) and time passing are steps
//! too. The checker explores every interleaving of them and checks, in every reachable state,
//! that the queue holds no more than the ceiling plus the documented slack ([`CEILING`]).
//!
//! # Time
//!
//! Time is a global count of ticks ([`Action::Tick`]): Redis `TIME` and every replica's
//! monotonic clock advance together (A1: same rate; their offsets never matter because no
//! two clocks are compared). Any number of steps happen within one tick, in any order.
//! Timestamps are kept as *ages* (ticks since the event), saturated at the largest constant
//! they are compared with, so two states that differ only in when they happened are one
//! state: the check covers runs of every length, not only short ones. Conventions, the same
//! as the text's: a read taken at tick `t` shows the messages stored at ticks `≤ t − Λ`;
//! "stored by `a + D`" is `age ≤ D`; "older than `TTL + R`" is `age > TTL + R`; a unit is
//! handed out "before `use_until`" while `age < use`; a block, a carry or a member lives
//! while `age < its duration`. The durations are small ([`Timing::default`]) but `H`, the
//! lease and the windows are computed from them by the text's formulas.
//!
//! A tick is longer than `T` (`T = 0`): a running replica processes a reply in the tick it
//! asked, settles what has an outcome (every 50 ms) and publishes the read it took before
//! time passes. One that does not is **paused** ([`Action::Pause`], or a call that pauses on
//! its reply): it takes no step while time passes, for as long as it likes, and so processes
//! its reply late when it resumes. Nothing else is urgent: a publish may wait for its
//! deadline, a call may never come.
//!
//! # Abstractions (each stated where it is made, collected here)
//!
//! - **Units, not messages.** A send is one unit; the queue is a count. With `L ≤ 15` the
//!   grant formula `max(1, min(128, ⌊(L − E)/8⌋))` always grants 1, so every send's block
//!   holds one unit (not an abstraction at these ceilings).
//! - **A batch is [`BATCH`] = 2 entries** ([`Kind::Batch`], at most [`Config::batches`]):
//!   its ask is `want 2`, divisor 1, so the grant is `min(2, L − E)`; a block of `n` units is
//!   `n` one-unit blocks granted in one step (the same owner, age and lease: the ledger only
//!   sums a block's units, a settle row takes one, a repeated row finds it gone, as for a
//!   send's). Every send's block holds one unit, so a batch never finds one with two left
//!   and always reserves. A whole grant is used at once at the reply, each entry with its
//!   own outcome; a short one (1 unit) is not used, and given back as not stored with the
//!   next settle ([`Short`]). A batch's ask paused on holds its entries of the budget until
//!   its reply is processed or dropped. Not modelled: a batch admitted alone (cut off,
//!   fail-open): at `L = 2`, `N = 2` a replica's part of the room is one unit, so a batch of
//!   two is never admitted alone; the rule counts its entries as that many sends.
//! - **A call is its script and its reply in one step**, unless the reply is lost
//!   ([`How::Lost`]: the script ran, the replica counts the call as failed) or the replica
//!   pauses on it ([`How::Paused`]: the reply waits, and is processed late, [`Action::Reply`]).
//!   On time, nothing the replica does between the script and its reply changes either (the
//!   reply's content is fixed by the script; the replica's own steps commute with it); the
//!   ask is at the script's instant, the worst case for every term measured from the script
//!   (a lease, a carry's end). A request reaching Redis after its caller gave up is not
//!   modelled: a block nobody uses, a carry or a settle recorded late only count more.
//! - **A replica's calls are serialized.** Concurrent calls of one seat only add reply
//!   orders; a reply older than the epoch a replica knows is ignored (its grant is of another
//!   epoch).
//! - **A read is one step**: `lease_read`, the admin-plane read and `publish_read` (within a
//!   tick nothing tells a later read from this one: the depth it shows and the ticket's cut
//!   are those of the tick). A replica that pauses on the lease holds the ticket and
//!   publishes it when it resumes, maybe into another epoch. The lease is not exclusive and
//!   tickets are not ordered: more reads than the protocol allows, never fewer (a published
//!   read and its `since_read` are consistent by themselves; the order is about freshness).
//! - **The broker stores at the issue**: a later store is a later issue, which the replica
//!   may choose (up to the deadline). A crash may come between the two: [`Action::Crash`]
//!   with its pending publishes issued, which the broker may store after the crash.
//! - **Admin reads succeed.** A failed read only makes `reserve` refuse (`Unknown`).
//! - **A late grant is dropped, not released with a call**; its block leaks until its lease
//!   ends (releasing it would only free room sooner). Unused units are not settled either,
//!   but a batch's short grant is: that give-back is the rule checked.
//! - **Settle rows of a block the ledger no longer holds add nothing** (the less cautious of
//!   the two readings of step 3: the read must then show those sends).
//! - **Redis `TIME` never steps back**, so the `+ 1 s` of `H` (which covers a step back
//!   across a failover) is left out of `H` and of the old lease alike: a smaller hold only
//!   makes the check harder to pass. Epochs are a counter for the same reason.
//! - **Versions** are tracked only as far as they are compared: for each version a replica
//!   holds, how far it is ahead of the live hash's and of the failover target's (exact while
//!   the target is at most `sync_lag` writes behind, which the model keeps by letting the
//!   target catch up first).
//! - **A failover target** is a copy of the hash as of its last sync ([`Action::Sync`]). A
//!   data loss (restart without persistence, `FLUSHALL`, eviction) reaches the copy as well.
//! - **A crashed replica does not come back**; a restart is a new replica, which a cold
//!   start (nobody joined) covers.
//! - **The grace `G` is a parameter**, not `2·HEARTBEAT + 4T`: the formula is what lets every
//!   live replica report its carry within `G` (liveness); the model instead counts every carry
//!   not reported when the grace ends in the slack `C`, as the bounds table does.
//! - **Fail-open, `E₀` is the replica's own read's backlog**: the fleet's estimate it last
//!   saw can only make `E₀` larger, so the model checks a rule that admits at least as much.
//! - **Faults are bounded** (a budget each: [`Faults`]) and so are sends ([`Config::sends`])
//!   and batches ([`Config::batches`]).
//!
//! # Reductions (exact: they change how many states there are, not what can happen)
//!
//! - Ages saturate; a replica forgets an admission once nothing looks at it again (done,
//!   settled, out of every window); admissions are kept sorted.
//! - A block is named by its owner, its age and a number within the tick (ids are only ever
//!   compared for equality).
//! - Replicas are interchangeable when every fault may strike any of them
//!   ([`Config::symmetric`]): one state per permutation.
//! - A state from which the queue cannot pass the bound any more is not explored further
//!   ([`Model::within_boundary`]).
//!
//! # What is checked
//!
//! [`CEILING`]: `stored ≤ L + U + C + F` in every state, where `U` counts the stored sends
//! whose outcome the gateway does not know (their replica crashed, or the publish timed
//! out), `C` the carries of replicas that had not reported theirs when a new epoch's grace
//! ended (admissions from blocks of an older epoch), and `F = k·⌈L/N⌉` for the `k` replicas
//! that admitted alone (fail-open only). `C` and `F` are the bounds table's terms, counted
//! as the faults happen and kept once counted (a message stored past the ceiling stays).

use std::fmt::{self, Write as _};

use stateright::{Model, Property};

/// The most replicas a configuration may have.
pub const MAX_REPLICAS: usize = 3;

/// The entries of a batch (`POST .../messages/batch`): 2 is enough at the model's ceilings
/// (`L = 2` or `3`), where a batch's grant can fall short by one.
pub const BATCH: u8 = 2;
/// A settle row's block age naming no block: a recounted send (step 5, what a loss costs).
const NO_BLOCK: u8 = u8::MAX;

/// A list of at most `N` items kept inline (the state is copied and hashed for every step:
/// no heap). Unused slots hold `T::default()`, so equal lists are equal arrays.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slots<T, const N: usize> {
    items: [T; N],
    len: u8,
}

impl<T: Copy + Default, const N: usize> Default for Slots<T, N> {
    fn default() -> Self {
        Slots {
            items: [T::default(); N],
            len: 0,
        }
    }
}

impl<T: Copy + Default, const N: usize> Slots<T, N> {
    fn filled(n: usize, value: T) -> Self {
        let mut s = Self::default();
        for _ in 0..n {
            s.push(value);
        }
        s
    }

    fn push(&mut self, item: T) {
        assert!(
            (self.len as usize) < N,
            "more than {N} items: raise the capacity"
        );
        self.items[self.len as usize] = item;
        self.len += 1;
    }

    fn remove(&mut self, i: usize) -> T {
        let item = self.items[i];
        let len = self.len as usize;
        self.items.copy_within(i + 1..len, i);
        self.len -= 1;
        self.items[len - 1] = T::default();
        item
    }

    fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mut j = 0;
        for i in 0..self.len as usize {
            if keep(&self.items[i]) {
                self.items[j] = self.items[i];
                j += 1;
            }
        }
        for slot in &mut self.items[j..self.len as usize] {
            *slot = T::default();
        }
        self.len = j as u8;
    }

    /// Shift every item one place up, losing the last; a default one enters at 0.
    fn shift_in(&mut self, first: T) {
        let len = self.len as usize;
        if len > 0 {
            self.items.copy_within(0..len - 1, 1);
            self.items[0] = first;
        }
    }
}

impl<T, const N: usize> std::ops::Deref for Slots<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..self.len as usize]
    }
}

impl<T, const N: usize> std::ops::DerefMut for Slots<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len as usize]
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a Slots<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a mut Slots<T, N> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl<T: Copy + Default, const N: usize> FromIterator<T> for Slots<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut s = Self::default();
        for item in iter {
            s.push(item);
        }
        s
    }
}

impl<T: fmt::Debug, const N: usize> fmt::Debug for Slots<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(&self.items[..self.len as usize])
            .finish()
    }
}

/// The invariant's name (an `always` property).
pub const CEILING: &str = "stored ≤ L + unknown + carries not reported + alone shares";
/// Non-vacuity: some send is admitted (a `sometimes` property).
pub const ADMITTED: &str = "a send is admitted";
/// Non-vacuity, stronger: the queue reaches the ceiling.
pub const FULL: &str = "the queue reaches the ceiling";
/// Coverage (`sometimes`): which of the faults' consequences a check reached.
pub mod reached {
    /// A hash made anew (after a loss or a failover) grants a block.
    pub const NEW_EPOCH_GRANTS: &str = "a new epoch grants a block";
    /// A carry is counted in the ledger.
    pub const CARRY: &str = "a carry is counted";
    /// A crashed replica's publish is in flight (it may still be stored).
    pub const CRASHED_IN_FLIGHT: &str = "a crashed replica's publish is in flight";
    /// A resumed replica holds a reply older than `T`.
    pub const LATE_REPLY: &str = "a reply is about to be processed late";
    /// A replica cut off from Redis holds a unit it may still hand out.
    pub const CUT_OFF_WITH_UNIT: &str = "a cut-off replica holds a unit";
    /// A drained replica has left.
    pub const LEFT: &str = "a replica has left";
    /// A cut-off replica admitted a send alone.
    pub const ALONE: &str = "a replica admits alone";
    /// The queue holds more than `L` (within the slack).
    pub const PAST_L: &str = "the queue holds more than L";
    /// Redis failed over.
    pub const FAILED_OVER: &str = "a failed-over hash is in use";
    /// A consumer took a message off the queue.
    pub const DRAINED: &str = "a message was drained";
    /// A batch's entries were admitted at once.
    pub const BATCH: &str = "a batch is admitted";
    /// A batch's short grant is held to give back.
    pub const SHORT_GRANT: &str = "a short grant is to be given back";
}

/// How a ledger notices it was rolled back (step 1 and 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detect {
    /// It does not: a failover's lost writes go unnoticed.
    Off,
    /// docs/fleet.md: a caller that saw a later `(epoch, version)` than the hash holds.
    EpochVersion,
    /// The fix (see the README): as `EpochVersion`, and also the hash records which Redis
    /// incarnation wrote it last (the server's `run_id`, which a restart or a promotion
    /// changes); a hash written by another incarnation may have lost writes and is made anew.
    Incarnation,
}

/// The rules of the protocol, each of which can be switched off to see the hole it closes.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// A hash that is missing (or rolled back) is made with a new epoch and a grace; replies
    /// carry the epoch; a replica that sees a new one drops its blocks and reports the
    /// admissions of its window not of that epoch as its carry, which `reserve` counts.
    /// Off: the hash is made again silently, as it was before epochs.
    pub epoch: bool,
    /// A reply processed after `asked + T` is released, never used. Off: it is used.
    pub late_release: bool,
    /// A block's `use_until` is `asked + use` on the replica's clock. Off: it is counted from
    /// when the reply is processed (the old code: a late grant got a fresh window).
    pub use_until_from_ask: bool,
    /// The block lease is `use + H` with `H = D + Λ + (TTL + R) + 2T`. Off: the old lease,
    /// `use + D + T`, with no term for the admin plane's lag or the read's age.
    pub lease_covers_lag: bool,
    /// `reserve` refuses a read older than `TTL + R`. Off: any published read is used.
    pub refuse_old_read: bool,
    /// A publish is never issued after its send's deadline, so a send is stored by `a + D` or
    /// never (A2). Off: a publish may be issued, and stored, after the deadline.
    pub publish_by_deadline: bool,
    /// A ticket of another epoch is not published. Off: it is, with its old count.
    pub drop_old_epoch_ticket: bool,
    /// How a rollback is noticed.
    pub rollback: Detect,
    /// Cut off, a fail-closed seat spends its live blocks and then refuses. Off: it admits
    /// alone by the old rule, `backlog + own × N < L` on its own read.
    pub fail_closed: bool,
    /// Fail-open, `N` in `N × window < L − E₀` is the fleet's largest size (configured).
    /// Off: the size it last saw, 1 if it never joined (docs/fleet.md, step 6).
    pub alone_n_is_fleet_max: bool,
    /// `leave` keeps the leaving replica's carry until it ends. Off: it drops it
    /// (docs/fleet.md, step 7).
    pub leave_keeps_carry: bool,
    /// Fail-open, the window in `N × window < L − E₀` is the admissions of the last
    /// `2H + use`: `H` until every reservation's read shows one, and `H + use` more until the
    /// units those earlier reservations granted (which `E₀`, from its own read, cannot see)
    /// show in its own read. Off: the last `H` (docs/fleet.md, step 6).
    pub alone_window_covers_grants: bool,
    /// Fail-open, a replica admits alone while `N × (window + 1) ≤ L − E₀`: its part of the
    /// room is `⌊(L − E₀)/N⌋`, so the parts add up to the room. Off: `N × window < L − E₀`,
    /// a part of `⌈(L − E₀)/N⌉` (docs/fleet.md, step 6), which the parts can pass.
    pub alone_part_floor: bool,
    /// What a batch does with a grant of fewer units than its entries (step 2, a batch).
    pub short_batch: Short,
    /// After a new epoch (step 5, what a loss costs), an admission of another epoch whose
    /// outcome is known leaves the carry: not stored, at once; stored, once a settle of the
    /// new epoch took it as a stored send of no block (a completion, in the lag bucket of
    /// now). Off: the carry holds every admission of another epoch for `H`.
    pub recount_stored: bool,
}

/// What a batch does with a short grant: fewer units than its entries (the room was less).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Short {
    /// The rule (all or nothing): none of it is used; the grant is given back, as not
    /// stored, with the next settle, and the batch is refused whole.
    GiveBack,
    /// Off, naive: the whole batch is admitted on any grant ("granted" read as "admitted").
    Whole,
    /// Off, a split: as many entries are admitted as units were granted, the rest refused,
    /// and the grant given back all the same (the refusal's give-back kept: its used units
    /// leave the ledger as not stored).
    SplitAndGiveBack,
    /// Off, a split done right: as many entries as units granted, nothing given back (each
    /// unit used or given back, never both, no entry without one).
    Split,
}

impl Rules {
    /// Every rule on, with the fixes this model proposes (see the README).
    pub const ALL: Rules = Rules {
        epoch: true,
        late_release: true,
        use_until_from_ask: true,
        lease_covers_lag: true,
        refuse_old_read: true,
        publish_by_deadline: true,
        drop_old_epoch_ticket: true,
        rollback: Detect::Incarnation,
        fail_closed: true,
        alone_n_is_fleet_max: true,
        leave_keeps_carry: true,
        alone_window_covers_grants: true,
        alone_part_floor: true,
        short_batch: Short::GiveBack,
        recount_stored: true,
    };
    /// Every rule as docs/fleet.md states it today.
    pub const DOCUMENTED: Rules = Rules {
        rollback: Detect::EpochVersion,
        alone_n_is_fleet_max: false,
        leave_keeps_carry: false,
        alone_window_covers_grants: false,
        alone_part_floor: false,
        ..Rules::ALL
    };
}

/// The protocol's durations, in ticks.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// `T`: a call is abandoned after it; a reply processed later is late.
    pub t: u8,
    /// The use window: a unit is handed out only before `asked + use`.
    pub use_for: u8,
    /// `D`: the send deadline.
    pub d: u8,
    /// `Λ`: the admin plane's lag.
    pub lag: u8,
    /// `TTL + R`: the oldest read `reserve` uses (since its lease was taken).
    pub read_age: u8,
    /// `G`: a new epoch grants nothing for this long.
    pub grace: u8,
    /// A replica counts in the fleet's size this long after its last call.
    pub member_for: u8,
}

impl Timing {
    /// `H = D + Λ + TTL + R + 2T` (the text's `+ 1 s` left out, see the abstractions).
    pub fn hold(&self) -> u8 {
        self.d + self.lag + self.read_age + 2 * self.t
    }
}

impl Default for Timing {
    /// A tick is longer than `T` (`T = 0`: a reply on time is processed in its ask's tick);
    /// `use = D = Λ = TTL + R = 1` (so `H = 3`, the lease 4, the old lease 2), `G = 2`,
    /// members for 3.
    fn default() -> Self {
        Timing {
            t: 0,
            use_for: 1,
            d: 1,
            lag: 1,
            read_age: 1,
            grace: 2,
            member_for: 3,
        }
    }
}

/// Which faults may happen, and how often.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Redis loses the hash (restart without persistence, `FLUSHALL`, eviction).
    pub losses: u8,
    /// Redis fails over to a copy that had not seen the last writes.
    pub failovers: u8,
    /// The failover target lags at most this many writes behind.
    pub sync_lag: u8,
    /// A replica is cut off from Redis (it still reaches the broker and the admin plane).
    pub partitions: u8,
    /// A replica crashes (its publishes already issued may still be stored).
    pub crashes: u8,
    /// A replica pauses (no step of its own while time passes), for as long as it likes.
    pub pauses: u8,
    /// A drained replica leaves (step 7).
    pub leaves: u8,
    /// A consumer takes a message off the queue.
    pub drains: u8,
    /// Replies lost (a reply processed late is a pause's doing).
    pub lost_replies: u8,
    /// The replicas a replica's faults (cut off, pause, crash, lost replies, leave) may strike:
    /// the first this many (0: all).
    pub faulty: u8,
    /// Leave heartbeats out: every other call does what one does (the prologue), and a
    /// replica can always make one of them (a read).
    pub no_heartbeats: bool,
}

/// One configuration to check.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Replicas (2 or 3).
    pub replicas: u8,
    /// `L`.
    pub limit: u8,
    /// Sends admitted in all (the bound on the run), a batch's entries included.
    pub sends: u8,
    /// Batches of [`BATCH`] entries admitted in all (each also takes its entries of `sends`).
    pub batches: u8,
    /// `SERVICEBUS_SEND_FAILCLOSED` off: a cut-off replica admits alone by step 6's rule.
    pub fail_open: bool,
    /// Start with no hash and nobody joined; otherwise from a settled fleet (epoch 1 past
    /// its grace, a fresh read of an empty queue, every replica joined).
    pub cold_start: bool,
    pub timing: Timing,
    pub faults: Faults,
    pub rules: Rules,
    /// Every replica is cut off from the start and stays so (and the bound checked is the
    /// text's for that case, `L + U`: "the parts add up to the room").
    pub whole_fleet_cut_off: bool,
    /// Keep the replicas in a canonical order (they are interchangeable when every fault may
    /// strike any of them): one state per permutation class. Traces then rename replicas
    /// between steps, so counterexample searches leave it off.
    pub symmetric: bool,
}

impl Config {
    /// Two replicas, `L = 2`, three sends, no faults, every rule on.
    pub fn base() -> Config {
        Config {
            replicas: 2,
            limit: 2,
            sends: 3,
            batches: 0,
            fail_open: false,
            cold_start: false,
            timing: Timing::default(),
            faults: Faults::default(),
            rules: Rules::ALL,
            whole_fleet_cut_off: false,
            symmetric: false,
        }
    }

    fn h(&self) -> u8 {
        self.timing.hold()
    }

    /// The block lease, from the script's `TIME`.
    pub fn lease(&self) -> u8 {
        let t = &self.timing;
        if self.rules.lease_covers_lag {
            t.use_for + t.hold()
        } else {
            t.use_for + t.d + t.t
        }
    }

    fn epochs(&self) -> bool {
        self.rules.epoch
    }

    /// May a cut-off replica admit alone (fail-open, or the old rule)? Only then do the
    /// fleet's size, its estimate and the cut-off state matter to a replica.
    pub fn alone_possible(&self) -> bool {
        self.fail_open || !self.rules.fail_closed
    }

    /// Does the fleet's size a replica last saw matter (the old rule, or step 6's `N` as the
    /// text has it)?
    fn tracks_members(&self) -> bool {
        self.alone_possible() && (!self.fail_open || !self.rules.alone_n_is_fleet_max)
    }

    /// Is there anything a heartbeat can tell or report (an epoch to learn, a carry to
    /// report, the fleet's size)? Otherwise it is left out: it changes nothing.
    fn heartbeats(&self) -> bool {
        !self.faults.no_heartbeats
            && (self.faults.losses > 0 || self.faults.failovers > 0 || self.alone_possible())
    }

    fn detect(&self) -> Detect {
        if self.rules.epoch {
            self.rules.rollback
        } else {
            Detect::Off
        }
    }

    /// `⌈L/N⌉`: one replica's part of the room alone.
    fn share(&self) -> u8 {
        self.limit.div_ceil(self.replicas)
    }
}

// ---------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------

/// A count with its age.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timed {
    pub value: u8,
    pub age: u8,
}

/// The published read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Read {
    pub backlog: u8,
    /// Since its lease was taken.
    pub age: u8,
}

/// A block: one unit held for `owner` (block size 1: see the abstractions). Its id is
/// `(owner, age, nth)`: ids are only compared for equality, and a block is told from the
/// others of its owner by when it was granted and, within that tick, by `nth`, the
/// smallest number no block or settle row of that owner and tick uses. A batch's block of
/// `n` units is `n` of these, granted in one step (same owner and age, `n` numbers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Block {
    pub owner: u8,
    /// Since the script that granted it.
    pub age: u8,
    pub nth: u8,
}

/// One queue's hash in Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ledger {
    pub epoch: u8,
    /// Written last by the Redis incarnation that holds it now (false after a failover).
    pub fresh: bool,
    /// Ticks of grace left.
    pub grace: u8,
    pub read: Option<Read>,
    /// Stored (or unknown) sends settled in this epoch; `since_read = completed − start`.
    pub completed: u8,
    /// The published read's ticket: completions it already shows.
    pub start: u8,
    /// The lag buckets: completions settled in each of the last `Λ` ticks (`[0]` = this one).
    pub recent: Slots<u8, 2>,
    /// Live blocks, sorted.
    pub blocks: Slots<Block, 8>,
    /// `c:<replica>`: count and age.
    pub carries: [Option<Timed>; MAX_REPLICAS],
    /// `m:<replica>`: age since its last call.
    pub members: [Option<u8>; MAX_REPLICAS],
    /// Ghost (not in Redis): replicas whose carry this epoch has recorded, a bit each.
    pub reported: u8,
}

impl Ledger {
    fn new(epoch: u8, grace: u8, lag: u8) -> Ledger {
        Ledger {
            epoch,
            fresh: true,
            grace,
            read: None,
            completed: 0,
            start: 0,
            recent: Slots::filled(lag as usize, 0),
            blocks: Slots::default(),
            carries: [None; MAX_REPLICAS],
            members: [None; MAX_REPLICAS],
            reported: 0,
        }
    }

    fn since_read(&self) -> u8 {
        self.completed.saturating_sub(self.start)
    }

    /// `backlog + since_read + Σ blocks + Σ carries`, with a read.
    fn estimate(&self) -> Option<u8> {
        self.read.map(|r| {
            r.backlog
                + self.since_read()
                + self.blocks.len() as u8
                + self.carries.iter().flatten().map(|c| c.value).sum::<u8>()
        })
    }

    fn tick(&mut self, cfg: &Config) {
        let lease = cfg.lease();
        let h = cfg.h();
        for b in &mut self.blocks {
            b.age += 1;
        }
        self.blocks.retain(|b| b.age < lease);
        for c in self.carries.iter_mut() {
            if let Some(t) = c {
                t.age += 1;
                if t.age >= h {
                    *c = None;
                }
            }
        }
        for m in self.members.iter_mut() {
            if let Some(a) = m {
                *a += 1;
                if *a >= cfg.timing.member_for {
                    *m = None;
                }
            }
        }
        if let Some(r) = &mut self.read {
            r.age = (r.age + 1).min(cfg.timing.read_age + 1);
        }
        self.grace = self.grace.saturating_sub(1);
        self.recent.shift_in(0);
    }
}

/// A version a replica holds, as far as it is ever compared (see the abstractions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Seen {
    /// 0: none (never joined).
    pub epoch: u8,
    /// `max(0, version − the live hash's version)`, meaningful in the live hash's epoch.
    pub ahead: u8,
    /// `max(0, version − the failover target's version)`, in the target's epoch.
    pub ahead_of_target: u8,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Up {
    #[default]
    Live,
    Crashed,
    Gone,
}

/// A unit of a batch's short grant, never used: given back with the next settle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Returned {
    pub epoch: u8,
    /// Since the ask: its block's age in the ledger.
    pub asked: u8,
    pub nth: u8,
}

/// A unit of a block, not yet handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unit {
    pub epoch: u8,
    /// For its use window: since the ask (since the reply was processed, with
    /// `use_until_from_ask` off).
    pub age: u8,
    /// Since the ask: its block's age in the ledger.
    pub asked: u8,
    pub nth: u8,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Admitted, publish not issued.
    #[default]
    Pending,
    /// Issued to the broker, not stored (yet).
    InFlight,
    /// Stored, or never will be.
    Done,
}

/// What the gateway knows of a send's outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    #[default]
    Waiting,
    Stored,
    NotStored,
    /// The publish timed out: settled as stored; it may be stored or not.
    Unknown,
}

/// One admission: a send, and its entry in the replica's window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Adm {
    pub age: u8,
    /// The epoch of the block it came from; 0 for an admission made alone.
    pub epoch: u8,
    /// From a block: how much older the block is than the admission (its ask came that many
    /// ticks before), and its `nth`; the block is the owner's of age `age + .0`. None: made
    /// alone.
    pub block: Option<(u8, u8)>,
    pub phase: Phase,
    pub outcome: Outcome,
    /// Its block's row has been settled (or dropped: another epoch).
    pub settled: bool,
    /// The epoch a settle recounted it into, known stored (0: none).
    pub recounted: u8,
}

impl Adm {
    fn unsettled(&self) -> bool {
        self.block.is_some() && !self.settled && self.outcome != Outcome::Waiting
    }
}

/// A read lease's ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    pub epoch: u8,
    /// Completions counted when it was taken, less those within the lag.
    pub start: u8,
    /// Since the lease was taken.
    pub age: u8,
    /// The admin plane's backlog, read as soon as the ticket came.
    pub backlog: u8,
}

/// A replica's calls to the ledger. Each is its script (one atomic step at Redis) and its
/// reply, processed in the same step ([`How::Done`]), lost ([`How::Lost`]: the script ran,
/// the replica counts the call as failed), or left pending while the replica pauses
/// ([`How::Paused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Ask for a block. Paused, its reply waits ([`Action::Reply`]): processed late, it is
    /// released (or used, with `late_release` off).
    Reserve,
    /// A batch of [`BATCH`] sends asks for a block of its size (want `BATCH`, divisor 1),
    /// used at once if whole; a short grant is given back (step 2, a batch). Paused, as
    /// [`Kind::Reserve`].
    Batch,
    Settle,
    Heartbeat,
    /// The read: `lease_read`, the admin-plane read (at once: a later read only shows more
    /// of what the ticket's cut leaves to it), `publish_read`. Paused, the replica holds the
    /// ticket and publishes it when it resumes ([`Kind::Publish`]), perhaps into another
    /// epoch.
    Read,
    /// Publish a ticket held over a pause.
    Publish,
}

/// What becomes of a call's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum How {
    Done,
    Lost,
    Paused,
}

/// What `reserve` decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Grant {
    /// The units granted, one block entry each (one for a send; for a batch, `min(n, L − E)`).
    Granted {
        epoch: u8,
        nths: Slots<u8, 2>,
    },
    /// `Full`, `Unread`, `Recovering`.
    Refused,
    NewEpoch,
}

/// What every reply carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct View {
    pub seen: Seen,
    pub members: u8,
}

/// A `reserve` in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pending {
    /// Since the ask.
    pub age: u8,
    /// None: the request never ran (cut off).
    pub answer: Option<(Grant, View)>,
    /// A batch's ask (want [`BATCH`], divisor 1): it holds a batch and its entries of the
    /// budget until its reply is processed or dropped.
    pub batch: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Replica {
    pub up: Up,
    /// Cut off from Redis (the fault); the broker and the admin plane are still reached.
    pub partitioned: bool,
    /// Paused: it takes no step until it resumes.
    pub paused: bool,
    pub joined: bool,
    pub seen: Seen,
    /// A call failed and none succeeded since (step 6).
    pub cut_off: bool,
    /// The fleet's size it last saw.
    pub members: u8,
    /// Its own admin-plane read, cut off (fail-open only).
    pub own_read: Option<Timed>,
    pub unit: Option<Unit>,
    pub adms: Slots<Adm, 6>,
    /// Units of a batch's short grant, to give back (as not stored) with the next settle.
    pub returns: Slots<Returned, 2>,
    /// Its `reserve` in flight (one at a time).
    pub call: Option<Pending>,
    /// Its read lease's ticket, with the backlog it read.
    pub ticket: Option<Ticket>,
}

impl Replica {
    fn new(joined: bool, epoch: u8, members: u8) -> Replica {
        Replica {
            up: Up::Live,
            partitioned: false,
            paused: false,
            joined,
            seen: Seen {
                epoch,
                ..Seen::default()
            },
            cut_off: false,
            members,
            own_read: None,
            unit: None,
            adms: Slots::default(),
            returns: Slots::default(),
            call: None,
            ticket: None,
        }
    }

    fn window(&self, h: u8) -> u8 {
        self.adms.iter().filter(|a| a.age < h).count() as u8
    }

    /// Its window's admissions not of `epoch`; with `recount`, less those known not
    /// stored and those known stored a settle of `epoch` recounted.
    fn carry_for(&self, epoch: u8, h: u8, recount: bool) -> u8 {
        self.adms
            .iter()
            .filter(|a| a.age < h && a.epoch != epoch)
            .filter(|a| {
                !recount
                    || a.epoch == 0
                    || !(a.outcome == Outcome::NotStored
                        || (a.outcome == Outcome::Stored && a.recounted == epoch))
            })
            .count() as u8
    }

    /// With `recount`, an admission of another epoch than the one it knows, known stored
    /// and not yet recounted into that one: settled as a stored send of no block.
    fn owes_recount(&self, a: &Adm, recount: bool) -> bool {
        recount
            && a.epoch != 0
            && a.epoch != self.seen.epoch
            && a.outcome == Outcome::Stored
            && a.recounted != self.seen.epoch
    }

    /// Its settle rows: (block age, nth, stored), a short grant's units as not stored, and
    /// with `recount` a stored send of no block ([`NO_BLOCK`]) per admission to recount.
    fn rows(&self, recount: bool) -> Slots<(u8, u8, bool), 8> {
        let mut rows = Slots::default();
        for a in self.adms.iter() {
            if self.owes_recount(a, recount) {
                rows.push((NO_BLOCK, 0, true));
            }
        }
        for a in self.adms.iter() {
            if a.unsettled() && a.epoch == self.seen.epoch {
                let (delay, nth) = a.block.unwrap();
                rows.push((a.age + delay, nth, a.outcome != Outcome::NotStored));
            }
        }
        for u in self.returns.iter() {
            if u.epoch == self.seen.epoch {
                rows.push((u.asked, u.nth, false));
            }
        }
        rows
    }

    /// The sends of the budget its `reserve` in flight holds (a batch's entries).
    fn held(&self) -> u8 {
        if self.call.is_some_and(|c| c.batch) {
            BATCH
        } else {
            0
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Budget {
    pub sends: u8,
    pub batches: u8,
    pub drains: u8,
    pub losses: u8,
    pub failovers: u8,
    pub partitions: u8,
    pub crashes: u8,
    pub pauses: u8,
    pub leaves: u8,
    pub lost: u8,
}

/// Not part of the system: what the invariant's slack has counted so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// `U`: stored sends whose outcome the gateway does not know.
    pub unknown: u8,
    /// `C`: carries not reported when a grace ended.
    pub unreported: u8,
    /// Replicas that admitted alone, a bit each (`F = k·⌈L/N⌉`).
    pub alone: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The queue's hash; None when it is missing.
    pub live: Option<Ledger>,
    /// The failover target's copy (only while a failover may still happen).
    pub target: Option<Ledger>,
    /// Writes the target has not seen.
    pub behind: u8,
    /// The next epoch a hash is made with.
    pub next_epoch: u8,
    pub replicas: Slots<Replica, MAX_REPLICAS>,
    /// Messages stored in the queue now.
    pub queue: u8,
    /// The queue's depth at the end of each of the last `Λ` ticks (`[0]` = the last one).
    pub depth: Slots<u8, 2>,
    pub budget: Budget,
    pub ghost: Ghost,
}

impl State {
    /// `L + U + C + F` for this state.
    pub fn bound(&self, cfg: &Config) -> u8 {
        // F is the fail-open price only: the old rule (fail-closed off) gets no slack, nor
        // does a fleet cut off as a whole.
        let alone = if cfg.fail_open && !cfg.whole_fleet_cut_off {
            self.ghost.alone.count_ones() as u8 * cfg.share()
        } else {
            0
        };
        cfg.limit + self.ghost.unknown + self.ghost.unreported + alone
    }
}

// ---------------------------------------------------------------------------------------
// Actions
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes: one tick on every clock.
    Tick,
    /// A replica's call reaches Redis: its script, and what becomes of the reply.
    Call(u8, Kind, How),
    /// A call of a cut-off replica fails.
    Fail(u8),
    /// A resumed replica processes the `reserve` reply it paused on (late, if a tick passed).
    Reply(u8),
    /// A resumed replica drops the `reserve` reply it paused on.
    GiveUp(u8),
    /// A send takes a unit of a live block.
    Admit(u8),
    /// A cut-off replica admits a send alone.
    AdmitAlone(u8),
    /// The publish of admission `.1` is issued to the broker.
    Issue(u8, u8),
    /// The broker stores admission `.1`.
    Store(u8, u8),
    /// Admission `.1`'s deadline passes: never issued (not stored) or outcome unknown.
    Deadline(u8, u8),
    /// A cut-off replica reads the admin plane itself.
    OwnRead(u8),
    /// A drained replica leaves (step 7) and exits.
    Leave(u8),
    Partition(u8),
    Heal(u8),
    /// A replica crashes; `.1`: with its pending publishes issued just before.
    Crash(u8, bool),
    Pause(u8),
    Resume(u8),
    /// Redis loses the hash.
    Lose,
    /// The failover target catches up.
    Sync,
    /// Redis fails over to the target.
    Failover,
    /// A consumer takes one message.
    Drain,
}

/// The model: a configuration.
#[derive(Clone, Debug)]
pub struct Fleet {
    pub cfg: Config,
}

impl Fleet {
    pub fn new(cfg: Config) -> Fleet {
        Fleet { cfg }
    }

    fn init(&self) -> State {
        let c = &self.cfg;
        let n = c.replicas;
        let (live, replicas, next_epoch) = if c.cold_start {
            (None, (0..n).map(|_| Replica::new(false, 0, 1)).collect(), 1)
        } else {
            let mut l = Ledger::new(1, 0, c.timing.lag);
            l.read = Some(Read { backlog: 0, age: 0 });
            if c.tracks_members() {
                for m in &mut l.members[..n as usize] {
                    *m = Some(0);
                }
            }
            l.reported = (1 << n) - 1;
            (
                Some(l),
                (0..n).map(|_| Replica::new(true, 1, n)).collect(),
                2,
            )
        };
        let mut replicas: Slots<Replica, MAX_REPLICAS> = replicas;
        if c.whole_fleet_cut_off {
            for rep in &mut replicas {
                rep.partitioned = true;
                rep.cut_off = true;
            }
        }
        State {
            target: if c.faults.failovers > 0 { live } else { None },
            live,
            behind: 0,
            next_epoch,
            replicas,
            queue: 0,
            depth: Slots::filled(c.timing.lag as usize, 0),
            budget: Budget {
                sends: c.sends,
                batches: c.batches,
                drains: c.faults.drains,
                losses: c.faults.losses,
                failovers: c.faults.failovers,
                partitions: c.faults.partitions,
                crashes: c.faults.crashes,
                pauses: c.faults.pauses,
                lost: c.faults.lost_replies,
                leaves: c.faults.leaves,
            },
            ghost: Ghost::default(),
        }
    }

    /// What a read of the admin plane taken now shows: the depth as of `Λ` ticks ago.
    fn admin_read(&self, s: &State) -> u8 {
        match self.cfg.timing.lag {
            0 => s.queue,
            lag => s.depth[lag as usize - 1],
        }
    }

    /// A write: every version a replica holds falls one further behind the live hash's.
    fn write(&self, s: &mut State) {
        for rep in &mut s.replicas {
            rep.seen.ahead = rep.seen.ahead.saturating_sub(1);
            if let Some(Pending {
                answer: Some((_, v)),
                ..
            }) = &mut rep.call
            {
                v.seen.ahead = v.seen.ahead.saturating_sub(1);
            }
        }
        if s.budget.failovers > 0 {
            s.behind += 1;
        }
    }

    fn view(&self, s: &State) -> View {
        let l = s.live.as_ref().unwrap();
        let alone = self.cfg.tracks_members();
        View {
            seen: Seen {
                epoch: l.epoch,
                ahead: 0,
                ahead_of_target: s.behind,
            },
            members: if alone {
                l.members.iter().flatten().count() as u8
            } else {
                0
            },
        }
    }

    /// What every script does first (the port's prologue): make a missing or rolled-back
    /// hash, count the caller, record its carry. Returns whether the caller knows the epoch.
    fn begin(&self, s: &mut State, r: usize) -> bool {
        let c = &self.cfg;
        let seen = s.replicas[r].seen;
        let joined = s.replicas[r].joined;
        let remake = match &s.live {
            None => true,
            Some(l) => match c.detect() {
                Detect::Off => false,
                d => {
                    let later = joined
                        && (seen.epoch > l.epoch || (seen.epoch == l.epoch && seen.ahead > 0));
                    later || (d == Detect::Incarnation && !l.fresh)
                }
            },
        };
        if remake {
            let (epoch, grace) = if c.epochs() {
                let e = s.next_epoch;
                s.next_epoch += 1;
                (e, c.timing.grace)
            } else {
                // Before epochs: the hash is made again as it was first made.
                (1, 0)
            };
            s.live = Some(Ledger::new(epoch, grace, c.timing.lag));
        }
        self.write(s);
        let carry = s.replicas[r].carry_for(seen.epoch, c.h(), c.rules.recount_stored);
        let l = s.live.as_mut().unwrap();
        l.fresh = true;
        if c.tracks_members() {
            l.members[r] = Some(0);
        }
        let knows = seen.epoch == l.epoch;
        if knows && c.epochs() {
            // A carry of 0 is kept as none (it counts the same and replaces the same).
            l.carries[r] = (carry > 0).then_some(Timed {
                value: carry,
                age: 0,
            });
            l.reported |= 1 << r;
        }
        knows
    }

    fn settle_rows(&self, s: &mut State, r: usize, rows: &[(u8, u8, bool)]) {
        let l = s.live.as_mut().unwrap();
        for &(age, nth, stored) in rows {
            if age == NO_BLOCK {
                // A recounted send: a completion whatever block (none) it names.
                l.completed += 1;
                if let Some(b) = l.recent.first_mut() {
                    *b += 1;
                }
                continue;
            }
            if let Some(i) = l
                .blocks
                .iter()
                .position(|b| b.owner == r as u8 && b.age == age && b.nth == nth)
            {
                l.blocks.remove(i);
                if stored {
                    l.completed += 1;
                    if let Some(b) = l.recent.first_mut() {
                        *b += 1;
                    }
                }
            }
        }
    }

    /// The `reserve` script, for a send (`want` 1: at `L ≤ 15` the share formula grants 1)
    /// or a batch (`want` its entries, divisor 1: `min(want, L − E)`).
    fn reserve(&self, s: &mut State, r: usize, want: u8) -> Grant {
        let c = &self.cfg;
        let free = fresh_nths(s, r);
        let knows = self.begin(s, r);
        let l = s.live.as_mut().unwrap();
        if !knows {
            return Grant::NewEpoch;
        }
        if l.grace > 0 {
            return Grant::Refused;
        }
        let fresh = l
            .read
            .is_some_and(|rd| !c.rules.refuse_old_read || rd.age <= c.timing.read_age);
        match l.estimate() {
            Some(e) if fresh && e < c.limit => {
                let nths: Slots<u8, 2> = free[..want.min(c.limit - e) as usize]
                    .iter()
                    .copied()
                    .collect();
                for &nth in &nths {
                    l.blocks.push(Block {
                        owner: r as u8,
                        age: 0,
                        nth,
                    });
                }
                l.blocks.sort();
                Grant::Granted {
                    epoch: l.epoch,
                    nths,
                }
            }
            _ => Grant::Refused,
        }
    }

    /// The replica uses a reply's view. A view of an older epoch than the one it knows is
    /// stale (a reply overtaken by a newer one) and is ignored.
    fn learn(&self, rep: &mut Replica, view: View) -> bool {
        if rep.joined && view.seen.epoch < rep.seen.epoch {
            return false;
        }
        if !rep.joined || view.seen.epoch != rep.seen.epoch {
            // A new epoch: drop the blocks of another; their admissions are now the carry.
            if rep.unit.is_some_and(|u| u.epoch != view.seen.epoch) {
                rep.unit = None;
            }
            for a in &mut rep.adms {
                if a.block.is_some() && a.epoch != view.seen.epoch {
                    a.settled = true;
                }
            }
            // Rows of another epoch are dropped (their blocks are not in this state).
            rep.returns.retain(|u| u.epoch == view.seen.epoch);
            rep.seen = view.seen;
        } else {
            // The same epoch: the later of the two versions.
            rep.seen.ahead = rep.seen.ahead.max(view.seen.ahead);
            rep.seen.ahead_of_target = rep.seen.ahead_of_target.max(view.seen.ahead_of_target);
        }
        rep.joined = true;
        rep.cut_off = false;
        if self.cfg.tracks_members() {
            rep.members = view.members;
        }
        true
    }

    /// The replica processes a `reserve` reply `age` ticks after it asked: a send's grant is
    /// a unit to hand out; a batch's is used at once, all or nothing. Returns the batch's
    /// entries admitted.
    fn take_grant(&self, rep: &mut Replica, grant: Grant, view: View, age: u8, batch: bool) -> u8 {
        let c = &self.cfg;
        if age > c.timing.t && c.rules.late_release {
            // Released, never used: the call failed.
            rep.cut_off = c.alone_possible();
            return 0;
        }
        if !self.learn(rep, view) {
            return 0;
        }
        let Grant::Granted { epoch, nths } = grant else {
            return 0;
        };
        let use_age = if c.rules.use_until_from_ask { age } else { 0 };
        if use_age >= c.timing.use_for || epoch != rep.seen.epoch {
            return 0;
        }
        if !batch {
            rep.unit = Some(Unit {
                epoch,
                age: use_age,
                asked: age,
                nth: nths[0],
            });
            return 0;
        }
        let whole = nths.len() as u8 >= BATCH;
        let short = c.rules.short_batch;
        if !whole && matches!(short, Short::GiveBack | Short::SplitAndGiveBack) {
            // Less room than the batch: all of the grant is given back.
            for &nth in &nths {
                rep.returns.push(Returned {
                    epoch,
                    asked: age,
                    nth,
                });
            }
            rep.returns.sort();
        }
        let admitted = match short {
            _ if whole => BATCH,
            // None of a short grant is used: the batch is refused whole.
            Short::GiveBack => 0,
            Short::Whole => BATCH,
            Short::SplitAndGiveBack | Short::Split => nths.len() as u8,
        };
        Self::admit_entries(rep, epoch, age, &nths, admitted);
        admitted
    }

    /// Every entry of a batch admitted at once, each with its own outcome (a short grant
    /// used whole, the rule off, names its last unit for the entries past it).
    fn admit_entries(rep: &mut Replica, epoch: u8, age: u8, nths: &[u8], admitted: u8) {
        for i in 0..admitted as usize {
            rep.adms.push(Adm {
                age: 0,
                epoch,
                block: Some((age, nths[i.min(nths.len() - 1)])),
                phase: Phase::Pending,
                outcome: Outcome::Waiting,
                settled: false,
                recounted: 0,
            });
        }
    }

    /// The `lease_read` script: a ticket, with the admin plane read at once.
    fn lease_read(&self, s: &mut State, r: usize) -> Ticket {
        let admin = self.admin_read(s);
        self.begin(s, r);
        let l = s.live.as_ref().unwrap();
        Ticket {
            epoch: l.epoch,
            start: l.completed - l.recent.iter().sum::<u8>(),
            age: 0,
            backlog: admin,
        }
    }

    /// The `publish_read` script.
    fn publish_read(&self, s: &mut State, r: usize, t: Ticket) {
        let c = &self.cfg;
        self.begin(s, r);
        let l = s.live.as_mut().unwrap();
        if t.epoch == l.epoch || !c.rules.drop_old_epoch_ticket {
            l.read = Some(Read {
                backlog: t.backlog,
                age: t.age,
            });
            l.start = t.start;
        }
    }

    /// How many writes a call makes (the failover target may fall that far behind).
    fn writes(kind: Kind, how: How) -> u8 {
        match (kind, how) {
            (Kind::Read, How::Done) => 2,
            _ => 1,
        }
    }

    /// One call of replica `r`, reaching Redis.
    fn call(&self, s: &mut State, r: usize, kind: Kind, how: How) {
        let c = &self.cfg;
        let alone = c.alone_possible();
        match how {
            How::Paused => s.budget.pauses -= 1,
            How::Lost => s.budget.lost -= 1,
            How::Done => {}
        }
        match kind {
            Kind::Reserve | Kind::Batch => {
                let batch = kind == Kind::Batch;
                let grant = self.reserve(s, r, if batch { BATCH } else { 1 });
                let view = self.view(s);
                let rep = &mut s.replicas[r];
                match how {
                    How::Done => {
                        let admitted = self.take_grant(rep, grant, view, 0, batch);
                        if admitted > 0 {
                            s.budget.sends -= admitted;
                            s.budget.batches -= 1;
                        }
                    }
                    How::Lost => rep.cut_off = alone,
                    How::Paused => {
                        rep.call = Some(Pending {
                            age: 0,
                            answer: Some((grant, view)),
                            batch,
                        });
                        rep.paused = true;
                        if batch {
                            // Held until the reply is processed or dropped.
                            s.budget.sends -= BATCH;
                            s.budget.batches -= 1;
                        }
                    }
                }
            }
            Kind::Settle => {
                let recount = c.rules.recount_stored;
                let rows = s.replicas[r].rows(recount);
                let knows = self.begin(s, r);
                if knows {
                    self.settle_rows(s, r, &rows);
                }
                if knows && how != How::Lost {
                    // The script took the recounted sends: out of the carry from here.
                    let rep = &mut s.replicas[r];
                    let recounted: Vec<bool> = rep
                        .adms
                        .iter()
                        .map(|a| rep.owes_recount(a, recount))
                        .collect();
                    let epoch = rep.seen.epoch;
                    for (a, yes) in rep.adms.iter_mut().zip(recounted) {
                        if yes {
                            a.recounted = epoch;
                        }
                    }
                }
                let view = self.view(s);
                let rep = &mut s.replicas[r];
                // Units given back are not sent again, whatever the reply (the seat drops
                // not-stored rows of a failed settle: their units stay until the lease ends).
                let epoch = rep.seen.epoch;
                rep.returns.retain(|u| u.epoch != epoch);
                if how == How::Lost {
                    rep.cut_off = alone;
                } else if self.learn(rep, view) {
                    // The rows sent: every one still to settle in the epoch they were sent in.
                    let epoch = rep.seen.epoch;
                    for a in &mut rep.adms {
                        if a.unsettled() && a.epoch == epoch {
                            a.settled = true;
                        }
                    }
                }
            }
            Kind::Heartbeat => {
                self.begin(s, r);
                let view = self.view(s);
                let rep = &mut s.replicas[r];
                if how == How::Lost {
                    rep.cut_off = alone;
                } else {
                    self.learn(rep, view);
                }
            }
            Kind::Read => {
                let ticket = self.lease_read(s, r);
                let view = self.view(s);
                if how == How::Lost {
                    s.replicas[r].cut_off = alone;
                    return;
                }
                let rep = &mut s.replicas[r];
                self.learn(rep, view);
                if how == How::Paused {
                    rep.ticket = Some(ticket);
                    rep.paused = true;
                    return;
                }
                self.publish_read(s, r, ticket);
                let view = self.view(s);
                self.learn(&mut s.replicas[r], view);
            }
            Kind::Publish => {
                let ticket = s.replicas[r].ticket.take().unwrap();
                self.publish_read(s, r, ticket);
                let view = self.view(s);
                let rep = &mut s.replicas[r];
                if how == How::Lost {
                    rep.cut_off = alone;
                } else {
                    self.learn(rep, view);
                }
            }
        }
    }

    /// May this cut-off replica admit one more send alone?
    fn may_admit_alone(&self, rep: &Replica) -> bool {
        let c = &self.cfg;
        if !rep.cut_off || rep.up != Up::Live {
            return false;
        }
        let Some(own) = rep.own_read else {
            return false;
        };
        let window = rep.window(self.alone_window()) as u32;
        let seen_n = if rep.joined { rep.members.max(1) } else { 1 } as u32;
        let l = c.limit as u32;
        if c.fail_open {
            // Step 6: N × window < L − E₀.
            let n = if c.rules.alone_n_is_fleet_max {
                c.replicas as u32
            } else {
                seen_n
            };
            // E₀: its own read's backlog. (The fleet's estimate it last saw, which E₀ may
            // also be, is left out: it can only make E₀ larger, so the model checks a rule
            // that admits at least as much.)
            let e0 = own.value as u32;
            if c.rules.alone_part_floor {
                e0 < l && n * (window + 1) <= l - e0
            } else {
                e0 < l && n * window < l - e0
            }
        } else if !c.rules.fail_closed {
            // The old rule: backlog + own × N < L, on its own read.
            own.value as u32 + window * seen_n < l
        } else {
            false
        }
    }

    /// The span of admissions the alone rule counts.
    fn alone_window(&self) -> u8 {
        let c = &self.cfg;
        if c.fail_open && c.rules.alone_window_covers_grants {
            2 * c.h() + c.timing.use_for
        } else {
            c.h()
        }
    }

    fn tick(&self, s: &mut State) {
        let c = &self.cfg;
        let h = c.h();
        let grace_before = s.live.as_ref().map(|l| l.grace);
        if let Some(l) = &mut s.live {
            l.tick(c);
        }
        if let Some(l) = &mut s.target {
            l.tick(c);
        }
        if let (Some(1), Some(l)) = (grace_before, &s.live) {
            // The grace ends: the carries not reported are the bound's C (block admissions
            // of older epochs; alone ones are F's).
            let mut unreported = 0;
            for (r, rep) in s.replicas.iter().enumerate() {
                if l.reported & (1 << r) == 0 {
                    unreported += rep
                        .adms
                        .iter()
                        .filter(|a| a.age < h && a.epoch != 0 && a.epoch != l.epoch)
                        .count() as u8;
                }
            }
            s.ghost.unreported += unreported;
        }
        s.depth.shift_in(s.queue);
        let deadline_rule = c.rules.publish_by_deadline;
        let window = self.alone_window();
        for rep in &mut s.replicas {
            if let Some(u) = &mut rep.unit {
                u.age += 1;
                u.asked += 1;
                if u.age >= c.timing.use_for {
                    rep.unit = None;
                }
            }
            if let Some(call) = &mut rep.call {
                call.age = (call.age + 1).min(c.timing.t + 1);
            }
            // A unit to give back whose lease ended is in no ledger: its row would find nothing.
            for u in &mut rep.returns {
                u.asked += 1;
            }
            let lease = c.lease();
            rep.returns.retain(|u| u.asked < lease);
            if let Some(o) = &mut rep.own_read {
                o.age += 1;
                if o.age > c.timing.read_age {
                    rep.own_read = None;
                }
            }
            if let Some(t) = &mut rep.ticket {
                t.age = (t.age + 1).min(c.timing.read_age + 1);
                if t.age > c.timing.read_age && c.rules.refuse_old_read {
                    // A read that old is refused: publishing it would change nothing.
                    rep.ticket = None;
                }
            }
            let live = rep.up == Up::Live;
            let cap = h.max(c.lease()).max(window);
            for a in &mut rep.adms {
                a.age = (a.age + 1).min(cap);
                if deadline_rule && a.age > c.timing.d && a.phase != Phase::Done {
                    // The deadline passes: the send was never issued (not stored) or its
                    // outcome is unknown, and the broker stores nothing this late (A2).
                    // (Whenever the replica takes note of it, it is the same outcome.)
                    a.outcome = if a.phase == Phase::Pending || !live {
                        Outcome::NotStored
                    } else {
                        Outcome::Unknown
                    };
                    a.phase = Phase::Done;
                }
            }
        }
    }

    /// After every step: forget the admissions nothing will look at again, and keep each
    /// replica's in one order (which one is first means nothing).
    fn normalize(&self, s: &mut State) {
        let c = &self.cfg;
        let h = c.h();
        // The window matters for an alone admission, and for a carry: an admission of
        // another epoch than the live hash's, or of this one while the hash may still be lost.
        let change_ahead = c.epochs() && (s.budget.losses > 0 || s.budget.failovers > 0);
        let alone = c.alone_possible();
        let window = self.alone_window();
        let live_epoch = s.live.as_ref().map(|l| l.epoch);
        for rep in &mut s.replicas {
            let live = rep.up == Up::Live;
            let epoch = rep.seen.epoch;
            rep.adms.retain(|a| {
                let settle_pending = live && a.unsettled() && a.epoch == epoch;
                let carry = a.age < h && (change_ahead || Some(a.epoch) != live_epoch);
                let alone_window = alone && a.age < window;
                a.phase != Phase::Done || settle_pending || carry || alone_window
            });
            rep.adms.sort();
        }
        if c.symmetric && c.faults.faulty == 0 {
            self.canonical(s);
        }
    }

    /// Renames the replicas so that they come in one order (see [`Config::symmetric`]).
    fn canonical(&self, s: &mut State) {
        let n = s.replicas.len();
        // What the state holds about replica `r`, wherever it is.
        let key = |s: &State, r: usize| {
            let mut blocks: Slots<(bool, u8, u8), 16> = Slots::default();
            for (t, l) in [&s.live, &s.target].into_iter().enumerate() {
                for b in l.iter().flat_map(|l| l.blocks.iter()) {
                    if b.owner as usize == r {
                        blocks.push((t == 1, b.age, b.nth));
                    }
                }
            }
            let ledger = |l: &Option<Ledger>| {
                l.as_ref()
                    .map(|l| (l.carries[r], l.members[r], l.reported >> r & 1))
            };
            (
                s.replicas[r],
                blocks,
                ledger(&s.live),
                ledger(&s.target),
                s.ghost.alone >> r & 1,
            )
        };
        let mut order: [usize; MAX_REPLICAS] = [0, 1, 2];
        order[..n].sort_by_key(|&r| key(s, r));
        if order[..n].iter().enumerate().all(|(i, &r)| i == r) {
            return;
        }
        // `order[new] = old`; `rename[old] = new`.
        let mut rename = [0u8; MAX_REPLICAS];
        for (new, &old) in order[..n].iter().enumerate() {
            rename[old] = new as u8;
        }
        let old = *s;
        for (new, &o) in order[..n].iter().enumerate() {
            s.replicas[new] = old.replicas[o];
        }
        let bits = |b: u8| (0..n).fold(0u8, |acc, o| acc | ((b >> o & 1) << rename[o]));
        for l in [&mut s.live, &mut s.target].into_iter().flatten() {
            for b in &mut l.blocks {
                b.owner = rename[b.owner as usize];
            }
            l.blocks.sort();
            let (carries, members) = (l.carries, l.members);
            for o in 0..n {
                l.carries[rename[o] as usize] = carries[o];
                l.members[rename[o] as usize] = members[o];
            }
            l.reported = bits(l.reported);
        }
        s.ghost.alone = bits(s.ghost.alone);
    }

    /// The broker stores admission `i` of replica `r`.
    fn store(&self, s: &mut State, r: usize, i: usize) {
        let rep = &mut s.replicas[r];
        let a = &mut rep.adms[i];
        a.phase = Phase::Done;
        s.queue += 1;
        if rep.up == Up::Live && a.outcome == Outcome::Waiting {
            a.outcome = Outcome::Stored;
        } else {
            s.ghost.unknown += 1;
        }
    }

    /// A batch's `reserve` in flight is dropped: what it held goes back to the budget.
    fn unhold(&self, s: &mut State, r: usize) {
        let held = s.replicas[r].held();
        if held > 0 {
            s.budget.sends += held;
            s.budget.batches += 1;
        }
    }

    fn sync_versions(&self, s: &mut State) {
        s.behind = 0;
        for rep in &mut s.replicas {
            rep.seen.ahead_of_target = rep.seen.ahead;
            if let Some(Pending {
                answer: Some((_, v)),
                ..
            }) = &mut rep.call
            {
                v.seen.ahead_of_target = v.seen.ahead;
            }
        }
    }
}

/// The `nth`s of blocks granted to `r` now: the two smallest no block or row of this tick
/// uses (a send takes the first; a batch's units the first two).
fn fresh_nths(s: &State, r: usize) -> [u8; 2] {
    let rep = &s.replicas[r];
    let mut used: Slots<u8, 16> = Slots::default();
    for a in rep.adms.iter() {
        if let Some((0, nth)) = a.block.filter(|_| a.age == 0) {
            used.push(nth);
        }
    }
    if let Some(u) = rep.unit.filter(|u| u.asked == 0) {
        used.push(u.nth);
    }
    for u in rep.returns.iter().filter(|u| u.asked == 0) {
        used.push(u.nth);
    }
    if let Some(Pending {
        age: 0,
        answer: Some((Grant::Granted { nths, .. }, _)),
        ..
    }) = &rep.call
    {
        for &nth in nths {
            used.push(nth);
        }
    }
    for l in [&s.live, &s.target].into_iter().flatten() {
        for b in l.blocks.iter() {
            if b.owner == r as u8 && b.age == 0 {
                used.push(b.nth);
            }
        }
    }
    let first = (0..).find(|i| !used.contains(i)).unwrap();
    let second = (first + 1..).find(|i| !used.contains(i)).unwrap();
    [first, second]
}

impl Model for Fleet {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.init()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let c = &self.cfg;
        let d = c.timing.d;
        let by_deadline = c.rules.publish_by_deadline;
        let flaky = s.budget.lost > 0;
        let reaches = |rep: &Replica, kind, how| {
            !rep.partitioned
                && (s.budget.failovers == 0
                    || s.behind + Self::writes(kind, how) <= c.faults.sync_lag)
        };
        // Time passes once every running replica has done what it does at once: process a
        // reply (`T` is shorter than a tick), settle what has an outcome (every 50 ms) and
        // publish the read it took. A replica that does not is paused ([`Action::Pause`]).
        let due = s.replicas.iter().any(|rep| {
            rep.up == Up::Live
                && !rep.paused
                && (rep.call.is_some()
                    || (reaches(rep, Kind::Settle, How::Done)
                        && (rep.ticket.is_some() || !rep.rows(c.rules.recount_stored).is_empty())))
        });
        if !due {
            out.push(Action::Tick);
        }
        for (r, rep) in s.replicas.iter().enumerate() {
            let ri = r as u8;
            // The broker stores what was issued, whatever the replica does now.
            for (i, a) in rep.adms.iter().enumerate() {
                if a.phase == Phase::InFlight && (a.age <= d || !by_deadline) {
                    out.push(Action::Store(ri, i as u8));
                }
            }
            if rep.up != Up::Live {
                continue;
            }
            let faulty = c.faults.faulty == 0 || r < c.faults.faulty as usize;
            let flaky = flaky && faulty;
            if faulty && s.budget.crashes > 0 {
                out.push(Action::Crash(ri, false));
                if rep.adms.iter().any(|a| a.phase == Phase::Pending) {
                    out.push(Action::Crash(ri, true));
                }
            }
            if rep.partitioned && !c.whole_fleet_cut_off {
                out.push(Action::Heal(ri));
            } else if rep.partitioned {
            } else if faulty && s.budget.partitions > 0 {
                out.push(Action::Partition(ri));
            }
            if rep.paused {
                out.push(Action::Resume(ri));
                continue;
            }
            let pauses = faulty && s.budget.pauses > 0;
            if pauses {
                out.push(Action::Pause(ri));
            }
            for (i, a) in rep.adms.iter().enumerate() {
                if a.phase == Phase::Pending && (a.age <= d || !by_deadline) {
                    out.push(Action::Issue(ri, i as u8));
                }
                if !by_deadline && a.outcome == Outcome::Waiting && a.age > d {
                    out.push(Action::Deadline(ri, i as u8));
                }
            }
            if let Some(call) = &rep.call {
                // A reply it paused on: processed now (late, if a tick passed), or dropped.
                out.push(Action::Reply(ri));
                if call.age > c.timing.t || flaky {
                    out.push(Action::GiveUp(ri));
                }
                continue;
            }
            let mut kinds = Vec::with_capacity(5);
            if rep.unit.is_none() && s.budget.sends > 0 {
                kinds.push(Kind::Reserve);
            }
            // A batch finds no block of its replica with `BATCH` units left (at these
            // ceilings every send's block holds one), so it reserves, a unit held or not.
            if s.budget.batches > 0 && s.budget.sends >= BATCH && (rep.returns.len() as u8) < BATCH
            {
                kinds.push(Kind::Batch);
            }
            if !rep.rows(c.rules.recount_stored).is_empty() {
                kinds.push(Kind::Settle);
            }
            if c.heartbeats() {
                kinds.push(Kind::Heartbeat);
            }
            kinds.push(if rep.ticket.is_some() {
                Kind::Publish
            } else {
                Kind::Read
            });
            if rep.partitioned {
                if c.alone_possible() && !rep.cut_off {
                    out.push(Action::Fail(ri));
                }
            } else {
                for k in kinds {
                    for how in [How::Done, How::Lost, How::Paused] {
                        let may = match how {
                            How::Done => true,
                            How::Lost => flaky,
                            How::Paused => {
                                pauses && matches!(k, Kind::Reserve | Kind::Batch | Kind::Read)
                            }
                        };
                        if may && reaches(rep, k, how) {
                            out.push(Action::Call(ri, k, how));
                        }
                    }
                }
                let drained = rep
                    .adms
                    .iter()
                    .all(|a| a.phase != Phase::Pending && a.outcome != Outcome::Waiting);
                if faulty && s.budget.leaves > 0 && drained && reaches(rep, Kind::Settle, How::Done)
                {
                    out.push(Action::Leave(ri));
                }
            }
            if s.budget.sends > 0 {
                if rep.unit.is_some() {
                    out.push(Action::Admit(ri));
                } else if self.may_admit_alone(rep) {
                    out.push(Action::AdmitAlone(ri));
                }
            }
            if rep.cut_off && c.alone_possible() && rep.own_read.is_none_or(|o| o.age > 0) {
                out.push(Action::OwnRead(ri));
            }
        }
        if s.live.is_some() && s.budget.losses > 0 {
            out.push(Action::Lose);
        }
        if s.budget.failovers > 0 {
            if s.behind > 0 || s.target != s.live {
                out.push(Action::Sync);
            }
            out.push(Action::Failover);
        }
        if s.queue > 0 && s.budget.drains > 0 {
            out.push(Action::Drain);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let c = &self.cfg;
        let mut s = *last;
        match action {
            Action::Tick => self.tick(&mut s),
            Action::Call(r, kind, how) => self.call(&mut s, r as usize, kind, how),
            Action::Fail(r) => s.replicas[r as usize].cut_off = true,
            Action::Reply(r) => {
                let rep = &mut s.replicas[r as usize];
                let call = rep.call.take().unwrap();
                let (grant, view) = call.answer.unwrap();
                let admitted = self.take_grant(rep, grant, view, call.age, call.batch);
                if call.batch {
                    // What the batch held and did not admit goes back to the budget.
                    s.budget.sends += BATCH - admitted;
                    if admitted == 0 {
                        s.budget.batches += 1;
                    }
                }
            }
            Action::GiveUp(r) => {
                if s.replicas[r as usize]
                    .call
                    .is_some_and(|p| p.age <= c.timing.t)
                {
                    // Dropped on time: the reply is lost.
                    s.budget.lost -= 1;
                }
                self.unhold(&mut s, r as usize);
                let rep = &mut s.replicas[r as usize];
                rep.call = None;
                rep.cut_off = c.alone_possible();
            }
            Action::Admit(r) => {
                let rep = &mut s.replicas[r as usize];
                let u = rep.unit.take().unwrap();
                rep.adms.push(Adm {
                    age: 0,
                    epoch: u.epoch,
                    block: Some((u.asked, u.nth)),
                    phase: Phase::Pending,
                    outcome: Outcome::Waiting,
                    settled: false,
                    recounted: 0,
                });
                s.budget.sends -= 1;
            }
            Action::AdmitAlone(r) => {
                s.replicas[r as usize].adms.push(Adm {
                    age: 0,
                    epoch: 0,
                    block: None,
                    phase: Phase::Pending,
                    outcome: Outcome::Waiting,
                    settled: false,
                    recounted: 0,
                });
                s.budget.sends -= 1;
                s.ghost.alone |= 1 << r;
            }
            Action::Issue(r, i) => {
                // The broker stores at the issue: a later store is the same as a later issue,
                // which the replica may choose. Issued and not yet stored matters only when
                // the replica dies meanwhile: [`Action::Crash`]`(_, true)`.
                s.replicas[r as usize].adms[i as usize].phase = Phase::InFlight;
                self.store(&mut s, r as usize, i as usize);
            }
            Action::Store(r, i) => self.store(&mut s, r as usize, i as usize),
            Action::Deadline(r, i) => {
                let a = &mut s.replicas[r as usize].adms[i as usize];
                if a.phase == Phase::Pending {
                    a.phase = Phase::Done;
                    a.outcome = Outcome::NotStored;
                } else {
                    a.outcome = Outcome::Unknown;
                    if c.rules.publish_by_deadline {
                        // Stored by `a + D` or never (A2): never, now.
                        a.phase = Phase::Done;
                    }
                }
            }
            Action::OwnRead(r) => {
                let value = self.admin_read(&s);
                s.replicas[r as usize].own_read = Some(Timed { value, age: 0 });
            }
            Action::Leave(r) => {
                let r = r as usize;
                s.budget.leaves -= 1;
                let rows = s.replicas[r].rows(c.rules.recount_stored);
                let knows = self.begin(&mut s, r);
                if knows {
                    self.settle_rows(&mut s, r, &rows);
                }
                let l = s.live.as_mut().unwrap();
                l.blocks.retain(|b| b.owner != r as u8);
                l.members[r] = None;
                if !c.rules.leave_keeps_carry {
                    l.carries[r] = None;
                }
                let rep = &mut s.replicas[r];
                rep.up = Up::Gone;
                rep.unit = None;
                rep.returns = Slots::default();
                rep.call = None;
                rep.ticket = None;
            }
            Action::Partition(r) => {
                s.budget.partitions -= 1;
                s.replicas[r as usize].partitioned = true;
            }
            Action::Heal(r) => s.replicas[r as usize].partitioned = false,
            Action::Pause(r) => {
                s.budget.pauses -= 1;
                s.replicas[r as usize].paused = true;
            }
            Action::Resume(r) => s.replicas[r as usize].paused = false,
            Action::Crash(r, issued) => {
                s.budget.crashes -= 1;
                self.unhold(&mut s, r as usize);
                let rep = &mut s.replicas[r as usize];
                if issued {
                    // It issued its pending publishes just before it died: the broker may
                    // store them later, their outcome unknown to the gateway.
                    for a in &mut rep.adms {
                        if a.phase == Phase::Pending
                            && (a.age <= c.timing.d || !c.rules.publish_by_deadline)
                        {
                            a.phase = Phase::InFlight;
                        }
                    }
                }
                rep.up = Up::Crashed;
                rep.unit = None;
                rep.returns = Slots::default();
                rep.call = None;
                rep.ticket = None;
                rep.own_read = None;
            }
            Action::Lose => {
                s.budget.losses -= 1;
                s.live = None;
                // The deletion reaches the copy too.
                if s.target.is_some() {
                    s.target = None;
                    self.sync_versions(&mut s);
                }
            }
            Action::Sync => {
                s.target = s.live;
                self.sync_versions(&mut s);
            }
            Action::Failover => {
                s.budget.failovers -= 1;
                s.live = s.target;
                if let Some(l) = &mut s.live {
                    l.fresh = false;
                }
                for rep in &mut s.replicas {
                    rep.seen.ahead = rep.seen.ahead_of_target;
                    if let Some(Pending {
                        answer: Some((_, v)),
                        ..
                    }) = &mut rep.call
                    {
                        v.seen.ahead = v.seen.ahead_of_target;
                    }
                }
                if s.budget.failovers == 0 {
                    // No failover can follow: forget the copy and how far ahead of it.
                    s.target = None;
                    s.behind = 0;
                    for rep in &mut s.replicas {
                        rep.seen.ahead_of_target = 0;
                        if let Some(Pending {
                            answer: Some((_, v)),
                            ..
                        }) = &mut rep.call
                        {
                            v.seen.ahead_of_target = 0;
                        }
                    }
                } else {
                    s.target = s.live;
                    self.sync_versions(&mut s);
                }
            }
            Action::Drain => {
                s.budget.drains -= 1;
                s.queue -= 1;
            }
        }
        self.normalize(&mut s);
        Some(s)
    }

    /// A state from which the queue cannot pass the bound any more is not explored further:
    /// the queue grows only by stores of sends admitted and not done, or of sends still to
    /// be admitted, and the bound never shrinks. (Exact for the invariant; it only spares
    /// the checker the runs' tails.)
    fn within_boundary(&self, s: &State) -> bool {
        let open: u8 = s
            .replicas
            .iter()
            .map(|rep| {
                rep.adms.iter().filter(|a| a.phase != Phase::Done).count() as u8 + rep.held()
            })
            .sum();
        s.queue + open + s.budget.sends > s.bound(&self.cfg)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always(CEILING, |m, s| s.queue <= s.bound(&m.cfg)),
            Property::<Self>::sometimes(ADMITTED, |m, s| {
                let held: u8 = s.replicas.iter().map(|r| r.held()).sum();
                s.budget.sends + held < m.cfg.sends
            }),
            Property::<Self>::sometimes(FULL, |m, s| s.queue >= m.cfg.limit),
            Property::<Self>::sometimes(reached::NEW_EPOCH_GRANTS, |_, s| {
                // Epoch 1 is the first hash (made at the start, or by the first call).
                s.live.is_some_and(|l| l.epoch >= 2 && !l.blocks.is_empty())
            }),
            Property::<Self>::sometimes(reached::CARRY, |_, s| {
                s.live
                    .is_some_and(|l| l.carries.iter().any(|c| c.is_some()))
            }),
            Property::<Self>::sometimes(reached::CRASHED_IN_FLIGHT, |_, s| {
                s.replicas.iter().any(|r| {
                    r.up == Up::Crashed && r.adms.iter().any(|a| a.phase == Phase::InFlight)
                })
            }),
            Property::<Self>::sometimes(reached::LATE_REPLY, |m, s| {
                s.replicas
                    .iter()
                    .any(|r| !r.paused && r.call.is_some_and(|c| c.age > m.cfg.timing.t))
            }),
            Property::<Self>::sometimes(reached::CUT_OFF_WITH_UNIT, |_, s| {
                s.replicas.iter().any(|r| r.partitioned && r.unit.is_some())
            }),
            Property::<Self>::sometimes(reached::LEFT, |_, s| {
                s.replicas.iter().any(|r| r.up == Up::Gone)
            }),
            Property::<Self>::sometimes(reached::ALONE, |_, s| s.ghost.alone != 0),
            Property::<Self>::sometimes(reached::PAST_L, |m, s| s.queue > m.cfg.limit),
            Property::<Self>::sometimes(reached::FAILED_OVER, |_, s| {
                s.live.is_some_and(|l| !l.fresh)
            }),
            Property::<Self>::sometimes(reached::DRAINED, |m, s| {
                s.budget.drains < m.cfg.faults.drains
            }),
            Property::<Self>::sometimes(reached::BATCH, |m, s| {
                // A batch held by a call in flight goes back to the budget unless admitted.
                let held = s.replicas.iter().filter(|r| r.held() > 0).count() as u8;
                s.budget.batches + held < m.cfg.batches
            }),
            Property::<Self>::sometimes(reached::SHORT_GRANT, |_, s| {
                s.replicas.iter().any(|r| !r.returns.is_empty())
            }),
        ]
    }
}

impl Fleet {
    /// A trace in words: each step, then the queue, the ledger and the replicas after it.
    pub fn explain(&self, path: &[(State, Option<Action>)]) -> String {
        let mut out = String::new();
        let mut tick = 0;
        for (i, (s, a)) in path.iter().enumerate() {
            if i == 0 {
                let _ = writeln!(out, "start          {}", Summary(self, s));
            }
            let Some(a) = a else { continue };
            if *a == Action::Tick {
                tick += 1;
            }
            let next = self.next_state(s, *a).unwrap();
            let _ = writeln!(
                out,
                "t={tick:<2} {:<26} {}",
                describe(a),
                Summary(self, &next)
            );
        }
        out
    }
}

fn describe(a: &Action) -> String {
    let r = |r: &u8| (b'A' + r) as char;
    match a {
        Action::Tick => "tick".into(),
        Action::Call(x, k, How::Done) => format!("{} calls {:?}", r(x), k),
        Action::Call(x, k, How::Lost) => format!("{} calls {:?}, reply lost", r(x), k),
        Action::Call(x, k, How::Paused) => format!("{} calls {:?}, pauses", r(x), k),
        Action::Fail(x) => format!("{}'s call fails", r(x)),
        Action::Reply(x) => format!("{} takes its reply", r(x)),
        Action::GiveUp(x) => format!("{} drops its reply", r(x)),
        Action::Admit(x) => format!("{} admits from block", r(x)),
        Action::AdmitAlone(x) => format!("{} admits alone", r(x)),
        Action::Issue(x, i) => format!("{} publishes #{i}", r(x)),
        Action::Store(x, i) => format!("broker stores {}#{i}", r(x)),
        Action::Deadline(x, i) => format!("{}#{i} passes its deadline", r(x)),
        Action::OwnRead(x) => format!("{} reads the admin alone", r(x)),
        Action::Leave(x) => format!("{} leaves", r(x)),
        Action::Partition(x) => format!("{} is cut off", r(x)),
        Action::Heal(x) => format!("{} reaches Redis again", r(x)),
        Action::Crash(x, false) => format!("{} crashes", r(x)),
        Action::Crash(x, true) => format!("{} crashes, publishes issued", r(x)),
        Action::Pause(x) => format!("{} pauses", r(x)),
        Action::Resume(x) => format!("{} resumes", r(x)),
        Action::Lose => "Redis loses the hash".into(),
        Action::Sync => "the replica syncs".into(),
        Action::Failover => "Redis fails over".into(),
        Action::Drain => "a consumer drains 1".into(),
    }
}

struct Summary<'a>(&'a Fleet, &'a State);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, s) = (self.0, self.1);
        write!(f, "stored {} (bound {}) | ", s.queue, s.bound(&m.cfg))?;
        match &s.live {
            None => write!(f, "no hash")?,
            Some(l) => {
                write!(f, "e{}", l.epoch)?;
                if l.grace > 0 {
                    write!(f, " grace {}", l.grace)?;
                }
                match l.read {
                    Some(r) => write!(f, " read {} age {}", r.backlog, r.age)?,
                    None => write!(f, " no read")?,
                }
                let carries = l.carries.iter().flatten().map(|c| c.value).sum::<u8>();
                write!(
                    f,
                    ", since {} blocks {} carries {}",
                    l.since_read(),
                    l.blocks.len(),
                    carries
                )?;
                if !l.fresh {
                    write!(f, " (failed over)")?;
                }
            }
        }
        for (r, rep) in s.replicas.iter().enumerate() {
            write!(f, " | {}:", (b'A' + r as u8) as char)?;
            match rep.up {
                Up::Crashed => write!(f, " crashed")?,
                Up::Gone => write!(f, " gone")?,
                Up::Live => {}
            }
            write!(f, " e{}", rep.seen.epoch)?;
            if rep.partitioned {
                write!(f, " partitioned")?;
            }
            if rep.cut_off {
                write!(f, " cut-off")?;
            }
            if rep.unit.is_some() {
                write!(f, " unit")?;
            }
            if !rep.returns.is_empty() {
                write!(f, " to give back {}", rep.returns.len())?;
            }
            let flying = rep.adms.iter().filter(|a| a.phase != Phase::Done).count();
            if flying > 0 {
                write!(f, " sending {flying}")?;
            }
            if rep.call.is_some() {
                write!(f, " asking")?;
            }
            if rep.ticket.is_some() {
                write!(f, " ticket")?;
            }
        }
        Ok(())
    }
}

/// The configurations the suite checks, by name.
pub mod configs {
    use super::{Config, Detect, Faults, Rules, Short, Timing};

    /// The exhaustive checks with every rule on ([`all`]).
    pub const NAMES: &[&str] = &[
        "fail_closed",
        "fail_open",
        "failover",
        "drain",
        "whole_fleet",
        "three",
        "batch",
    ];

    /// A configuration by name: one of [`all`] or [`holes`], or `base-change,change,...`
    /// with changes `lost`, `leave`, `pause`, `crash`, `part`, `loss` (that fault left out),
    /// `warm` (no cold start), `asym` (no symmetry), `three` (3 replicas), `l3`, `l4` (the
    /// ceiling), `drain` (a drain), `batch` (a batch of [`super::BATCH`] more), each with
    /// the sends it needs.
    pub fn by_name(name: &str) -> Option<Config> {
        if let Some((base, drop)) = name.split_once('-') {
            let mut c = by_name(base)?;
            for d in drop.split(',') {
                match d {
                    "lost" => c.faults.lost_replies = 0,
                    "leave" => c.faults.leaves = 0,
                    "pause" => c.faults.pauses = 0,
                    "crash" => c.faults.crashes = 0,
                    "part" => c.faults.partitions = 0,
                    "loss" => c.faults.losses = 0,
                    "warm" => c.cold_start = false,
                    "asym" => c.symmetric = false,
                    "three" => {
                        c.replicas = 3;
                        c.sends += 1;
                    }
                    "l3" => {
                        c.limit = 3;
                        c.sends += 1;
                    }
                    "l4" => {
                        c.limit = 4;
                        c.sends += 3;
                    }
                    "drain" => {
                        c.faults.drains = 1;
                        c.sends += 1;
                    }
                    "batch" => {
                        c.batches += 1;
                        c.sends += super::BATCH;
                    }
                    _ => return None,
                }
            }
            return Some(c);
        }
        if let Some(c) = all().into_iter().find(|(n, _)| *n == name) {
            return Some(c.1);
        }
        holes().into_iter().find(|(n, _)| *n == name).map(|h| h.1)
    }

    pub fn all() -> Vec<(&'static str, Config)> {
        vec![
            ("fail_closed", fail_closed()),
            ("fail_open", fail_open()),
            ("failover", failover()),
            ("drain", drain()),
            ("whole_fleet", whole_fleet()),
            ("three", three()),
            ("batch", batch()),
        ]
    }

    /// A batch of two beside a send (`L = 2`: the batch's grant is the whole room, or one
    /// unit short once the send holds one), fail-closed, with the faults a batch's units
    /// meet: Redis loses the hash once (their admissions in the carry, a unit to give back of
    /// the old epoch), a replica pauses once (a batch's grant processed late), crashes once
    /// (its entries in flight), leaves once (settling a unit to give back); one reply is lost
    /// (a settle that gave back). A partition is left out: cut off, a replica cannot reserve,
    /// and a unit it could not give back only stays counted until its lease ends.
    pub fn batch() -> Config {
        Config {
            batches: 1,
            faults: Faults {
                partitions: 0,
                ..fail_closed().faults
            },
            ..fail_closed()
        }
    }

    /// A consumer drains one message while a replica may crash or pause; one send more, so
    /// that the drained one can be made up.
    pub fn drain() -> Config {
        Config {
            sends: 4,
            faults: Faults {
                drains: 1,
                crashes: 1,
                pauses: 1,
                ..Faults::default()
            },
            symmetric: true,
            ..Config::base()
        }
    }

    /// Fail-closed, every fault but a failover: Redis loses the hash once; a replica is cut
    /// off once, pauses once (so a reply is processed late), crashes once, leaves once; one
    /// reply is lost. Every fault may strike either replica.
    pub fn fail_closed() -> Config {
        Config {
            faults: Faults {
                losses: 1,
                partitions: 1,
                crashes: 1,
                pauses: 1,
                leaves: 1,
                lost_replies: 1,
                ..Faults::default()
            },
            symmetric: true,
            ..Config::base()
        }
    }

    /// Fail-open from a cold start (no hash, nobody joined): one replica is cut off once;
    /// four sends (one past `L + ⌈L/N⌉`).
    pub fn fail_open() -> Config {
        Config {
            fail_open: true,
            cold_start: true,
            sends: 4,
            faults: Faults {
                partitions: 1,
                ..Faults::default()
            },
            symmetric: true,
            ..Config::base()
        }
    }

    /// Redis fails over once to a copy up to two writes behind; a replica may pause once.
    pub fn failover() -> Config {
        Config {
            faults: Faults {
                failovers: 1,
                sync_lag: 2,
                pauses: 1,
                ..Faults::default()
            },
            symmetric: true,
            ..Config::base()
        }
    }

    /// Three replicas: a drain, a crash, a pause, five sends. (The larger configurations with
    /// three replicas hold too, one-off: fail-open 6.2 M states, failover 5.3 M; too slow for
    /// the suite.)
    pub fn three() -> Config {
        Config {
            replicas: 3,
            sends: 5,
            ..drain()
        }
    }

    /// Fail-open, the whole fleet cut off from the start, `L = 3`: the text's bound for it,
    /// `L + U`.
    pub fn whole_fleet() -> Config {
        Config {
            limit: 3,
            sends: 5,
            fail_open: true,
            whole_fleet_cut_off: true,
            symmetric: true,
            ..Config::base()
        }
    }

    /// For each rule, a configuration with it off where it should matter.
    pub fn holes() -> Vec<(&'static str, Config)> {
        let with = |rules: Rules, faults: Faults| Config {
            rules,
            faults,
            ..Config::base()
        };
        let all = Rules::ALL;
        let loss = Faults {
            losses: 1,
            ..Faults::default()
        };
        let pause = Faults {
            pauses: 1,
            ..Faults::default()
        };
        let crash = Faults {
            crashes: 1,
            ..Faults::default()
        };
        let part = Faults {
            partitions: 1,
            ..Faults::default()
        };
        let failover = Faults {
            failovers: 1,
            sync_lag: 2,
            ..Faults::default()
        };
        let fail_open = |rules: Rules| Config {
            rules,
            fail_open: true,
            sends: 4,
            faults: part,
            ..Config::base()
        };
        vec![
            (
                "no_epoch",
                with(
                    Rules {
                        epoch: false,
                        ..all
                    },
                    loss,
                ),
            ),
            (
                "no_late_release",
                with(
                    Rules {
                        late_release: false,
                        ..all
                    },
                    pause,
                ),
            ),
            (
                "no_use_until_from_ask",
                with(
                    Rules {
                        use_until_from_ask: false,
                        ..all
                    },
                    pause,
                ),
            ),
            (
                "no_late_release_nor_use_until_from_ask",
                with(
                    Rules {
                        late_release: false,
                        use_until_from_ask: false,
                        ..all
                    },
                    pause,
                ),
            ),
            (
                "no_lease_for_lag",
                with(
                    Rules {
                        lease_covers_lag: false,
                        ..all
                    },
                    crash,
                ),
            ),
            (
                "no_read_age",
                with(
                    Rules {
                        refuse_old_read: false,
                        ..all
                    },
                    crash,
                ),
            ),
            (
                "no_publish_deadline",
                with(
                    Rules {
                        publish_by_deadline: false,
                        ..all
                    },
                    pause,
                ),
            ),
            (
                "no_old_ticket_drop",
                Config {
                    timing: Timing {
                        grace: 1,
                        ..Timing::default()
                    },
                    ..with(
                        Rules {
                            drop_old_epoch_ticket: false,
                            ..all
                        },
                        Faults {
                            losses: 1,
                            pauses: 1,
                            ..Faults::default()
                        },
                    )
                },
            ),
            (
                "no_old_ticket_drop_long_grace",
                with(
                    Rules {
                        drop_old_epoch_ticket: false,
                        ..all
                    },
                    Faults {
                        losses: 1,
                        pauses: 1,
                        ..Faults::default()
                    },
                ),
            ),
            (
                "no_rollback_detection",
                with(
                    Rules {
                        rollback: Detect::Off,
                        ..all
                    },
                    failover,
                ),
            ),
            (
                "rollback_by_epoch_version",
                with(
                    Rules {
                        rollback: Detect::EpochVersion,
                        ..all
                    },
                    failover,
                ),
            ),
            (
                "no_fail_closed",
                with(
                    Rules {
                        fail_closed: false,
                        ..all
                    },
                    part,
                ),
            ),
            (
                "alone_n_last_seen",
                Config {
                    cold_start: true,
                    ..fail_open(Rules {
                        alone_n_is_fleet_max: false,
                        ..all
                    })
                },
            ),
            // The window as the text has it, and its part rounded up as the text has it: at
            // `L = 2` the rounding down alone keeps this run under the bound (it needs
            // `L ≥ 4` then, too big for the suite).
            (
                "alone_window_h",
                fail_open(Rules {
                    alone_window_covers_grants: false,
                    alone_part_floor: false,
                    ..all
                }),
            ),
            (
                "alone_part_ceil",
                Config {
                    rules: Rules {
                        alone_part_floor: false,
                        ..all
                    },
                    symmetric: false,
                    ..whole_fleet()
                },
            ),
            (
                "batch_whole",
                Config {
                    batches: 1,
                    ..with(
                        Rules {
                            short_batch: Short::Whole,
                            ..all
                        },
                        Faults::default(),
                    )
                },
            ),
            (
                "batch_split_give_back",
                Config {
                    batches: 1,
                    ..with(
                        Rules {
                            short_batch: Short::SplitAndGiveBack,
                            ..all
                        },
                        Faults::default(),
                    )
                },
            ),
            (
                "batch_split",
                Config {
                    batches: 1,
                    ..with(
                        Rules {
                            short_batch: Short::Split,
                            ..all
                        },
                        Faults {
                            losses: 1,
                            pauses: 1,
                            ..Faults::default()
                        },
                    )
                },
            ),
            (
                "leave_drops_carry",
                with(
                    // Recounting, a drained leaver's carry holds only its sends of unknown
                    // outcome, which this configuration makes none of (its known stored
                    // ones the goodbye settles): the hole is shown on the carry that held
                    // every send of the hold.
                    Rules {
                        leave_keeps_carry: false,
                        recount_stored: false,
                        ..all
                    },
                    Faults {
                        losses: 1,
                        leaves: 1,
                        ..Faults::default()
                    },
                ),
            ),
        ]
    }
}
