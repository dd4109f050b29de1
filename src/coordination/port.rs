//! The ledger as the fleet's seat sees it: one trait, its calls and replies, and nothing of
//! Redis. `docs/fleet.md` is the protocol; `redis_port.rs` runs it as Lua scripts in Redis
//! and [`super::memory::MemoryLedger`] in memory (the seat's unit tests, the simulation),
//! and the two answer every call the same (`tests/ledger_contract.rs`).
//!
//! Every call is one atomic step on one queue, and every call but [`LedgerPort::look`]
//! speaks for a replica ([`Caller`]): it first makes the queue's state if it is missing
//! (a new epoch), makes it anew if the caller saw a later `(epoch, version)` than it holds
//! (the ledger was rolled back), prunes expired blocks and carries, counts the caller in
//! the fleet's size, and records the caller's carry when the caller knows the epoch.

use std::time::Duration;

use async_trait::async_trait;

/// Why a ledger call failed. None of them names the Redis URL or its password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("Redis did not answer within the deadline")]
    Timeout,
    #[error("Redis: {0}")]
    Redis(String),
    #[error("unexpected reply from a ledger script: {0}")]
    Unexpected(String),
}

/// Which incarnation of a queue's state a reply comes from, and how far into it. Ordered:
/// a later epoch, or the same epoch at a higher version, is later. `Epoch::NONE` is what a
/// replica that has seen no reply names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch {
    /// Redis `TIME` in µs when the state was made (above the caller's if it was rolled back).
    pub id: u64,
    /// Bumped by every call that writes.
    pub version: u64,
}

impl Epoch {
    pub const NONE: Epoch = Epoch { id: 0, version: 0 };
}

/// The queue's timings, fixed for a seat: what every call needs to prune and decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// `H`: a send admitted at `a` is in every read a reservation uses from `a + H` on.
    /// A carry lives this long after the call that reported it.
    pub hold: Duration,
    /// `Λ`: how far the admin plane's counts trail the queue.
    pub lag: Duration,
    /// `TTL + R`: a published read older than this (since its lease was taken) is not
    /// reserved against.
    pub max_read_age: Duration,
    /// `G`: a new epoch grants nothing for this long after its birth.
    pub grace: Duration,
    /// A replica counts in the fleet's size this long after its last call.
    pub member_for: Duration,
    /// The queue's state expires this long after its last write.
    pub idle: Duration,
}

/// Who asks, what it last saw, and what it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller<'a> {
    /// The replica's name (no `:`); its blocks are `{replica}:{turn}`.
    pub replica: &'a str,
    /// The `(epoch, version)` of the last reply it processed ([`Epoch::NONE`] for none).
    pub seen: Epoch,
    /// Its admissions of the last `hold` the ledger of `seen.id` does not hold: made alone,
    /// or from blocks of an older epoch. Recorded only when `seen.id` is the ledger's epoch.
    pub carry: u64,
}

/// The fleet's last admin-plane read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadState {
    /// No read published in this epoch.
    Never,
    Ok {
        backlog: u64,
        send_disabled: bool,
    },
    /// The last read failed. `standing` is the backlog of the epoch's last good read, which
    /// with every send counted since still bounds the queue: what a replica may admit while
    /// the streak builds (None: no good read in this epoch).
    Failed {
        standing: Option<u64>,
    },
}

/// What a published read was made for, which decides the counts it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFor {
    /// The read the TTL paces. A failure counts in the streak when `in_streak` (not for a
    /// start-up read, nor for a send's second read: one send, one failed read at most).
    /// Published, it ends the lease when `ends_lease` (a queue read again at the ceiling:
    /// its reads at the ceiling may follow at once); else the lease runs its TTL, which
    /// also keeps a second read of the same TTL out.
    Ttl { in_streak: bool, ends_lease: bool },
    /// Made again at the ceiling, to show room as soon as consumers make it: it freshens
    /// the depth and nothing else (not the streak, not [`View::paced`]).
    Ceiling,
}

impl ReadFor {
    pub fn counts_in_streak(self) -> bool {
        matches!(
            self,
            Self::Ttl {
                in_streak: true,
                ..
            }
        )
    }

    pub fn ends_lease(self) -> bool {
        matches!(
            self,
            Self::Ceiling
                | Self::Ttl {
                    ends_lease: true,
                    ..
                }
        )
    }

    pub fn paced(self) -> bool {
        matches!(self, Self::Ttl { .. })
    }
}

/// What every reply carries: the queue's state as Redis had it in one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub epoch: Epoch,
    /// Until the end of the epoch's grace (zero once it is over).
    pub grace_left: Duration,
    pub read: ReadState,
    /// Since the published read's lease was taken (zero for `Never`).
    pub read_age: Duration,
    /// Since the lease of the last read the TTL paces was taken (zero for `Never`): what
    /// says when the TTL's next read is due, however often reads at the ceiling come.
    pub paced_age: Duration,
    /// Consecutive failed reads that count (reads made for sends).
    pub streak: u32,
    /// Bumped by every published read.
    pub generation: u64,
    /// Bumped by every published read but one made again at the ceiling
    /// ([`ReadFor::Ceiling`]): the reads the TTL paces, which number the share rounds.
    pub paced: u64,
    /// Stored (or unknown-outcome) sends settled after the read's ticket.
    pub since_read: u64,
    /// Units held in live blocks, every replica's.
    pub reserved: u64,
    /// Live carries, every replica's.
    pub carried: u64,
    /// Replicas that called within `member_for`.
    pub replicas: u64,
    pub reads_ok: u64,
    pub reads_failed: u64,
}

impl View {
    /// `backlog + since_read + reserved + carried`, with a good read.
    pub fn estimate(&self) -> Option<u64> {
        match self.read {
            ReadState::Ok { backlog, .. } => Some(
                backlog
                    .saturating_add(self.since_read)
                    .saturating_add(self.reserved)
                    .saturating_add(self.carried),
            ),
            _ => None,
        }
    }

    /// The estimate on what is known with the last read failed: the standing backlog
    /// (none: an empty queue) and everything counted since.
    pub fn standing_estimate(&self) -> Option<u64> {
        match self.read {
            ReadState::Failed { standing } => Some(
                standing
                    .unwrap_or(0)
                    .saturating_add(self.since_read)
                    .saturating_add(self.reserved)
                    .saturating_add(self.carried),
            ),
            _ => None,
        }
    }
}

/// A reservation's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// `{replica}:{turn}`: a new id for every ask.
    pub block_id: &'a str,
    /// Most units wanted (≥ 1).
    pub want: u64,
    pub limit: u64,
    /// A grant is at most `⌊room / divisor⌋` (and at least 1).
    pub divisor: u64,
    /// From the script's `TIME`: use plus hold.
    pub lease: Duration,
}

/// What `reserve` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveAnswer {
    /// `granted` units (1 ≤ granted ≤ want), held in the block.
    Granted { granted: u64 },
    /// No room: the view's estimate ≥ limit.
    Full { estimate: u64 },
    /// The read says the queue does not accept sends.
    Disabled,
    /// The last read failed: the caller fails open or closed with the view's streak.
    Unknown,
    /// No read in this epoch, or the published one is older than `max_read_age`: read first.
    Unread,
    /// Within the epoch's grace: nothing is granted before `grace_left`.
    Recovering,
    /// The caller named another epoch: it adopts the view's and asks again.
    NewEpoch,
}

/// The right to read the admin plane for the fleet, and what was counted when it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTicket {
    /// The epoch it was taken in: published into another, it is dropped.
    pub epoch: u64,
    /// Orders tickets: one no newer than the last published is dropped.
    pub seq: u64,
    /// Completions counted when it was taken, less those within the lag.
    pub completed_at_start: u64,
}

/// What one admin-plane read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    Ok { backlog: u64, send_disabled: bool },
    Failed,
}

/// One block's outcomes in a settle batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle<'a> {
    pub block_id: &'a str,
    /// Stored (or unknown outcome): into `since_read`.
    pub stored: u64,
    /// Definitely not stored, or never used: only leave the block.
    pub not_stored: u64,
}

/// The ledger, one queue at a time.
#[async_trait]
pub trait LedgerPort: Send + Sync + 'static {
    /// The check-and-reserve (docs/fleet.md, step 1).
    async fn reserve(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ask: Ask<'_>,
    ) -> Result<(ReserveAnswer, View), LedgerError>;

    /// Outcomes of the caller's blocks (step 3). Rows are dropped when `caller.seen.id` is
    /// not the ledger's epoch (those sends are in the caller's carry).
    async fn settle(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        rows: &[Settle<'_>],
    ) -> Result<View, LedgerError>;

    /// Be counted, report the carry, see the state: a seat's heartbeat.
    async fn heartbeat(&self, queue: QueueRef<'_>, caller: Caller<'_>)
        -> Result<View, LedgerError>;

    /// Take the read lease for `lease` if nobody holds it (step 4).
    async fn lease_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        lease: Duration,
    ) -> Result<(Option<ReadTicket>, View), LedgerError>;

    /// Publish a read taken with `ticket`, made `for_` what it names (which counts it
    /// moves). Dropped (the view answered, nothing published) for a ticket of another epoch,
    /// one no newer than the last published, or one taken more than `max_read_age` ago (its
    /// read would be refused anyway). Publishing the newest ticket ends the read lease when
    /// [`ReadFor::ends_lease`]: the read it guarded is over.
    async fn publish_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ticket: ReadTicket,
        outcome: ReadOutcome,
        for_: ReadFor,
    ) -> Result<View, LedgerError>;

    /// Settle `rows`, then forget the caller: its blocks, member and read lease (step 7).
    /// Its carry, recorded by this call like any other, stays until its hold ends: it
    /// counts sends no read may show yet, and leaving does not make a read show them.
    async fn leave(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        rows: &[Settle<'_>],
    ) -> Result<View, LedgerError>;

    /// The state as it is, changing nothing (not even a missing state is made).
    async fn look(&self, queue: QueueRef<'_>) -> Result<Option<View>, LedgerError>;

    /// The longest one call may take before the caller gives up on it (`T`).
    fn timeout(&self) -> Duration;
}

/// One queue's state in the ledger: its name there, and its timings as the caller's
/// policy has them now (the depth TTL may change at runtime, and the hold with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRef<'a> {
    /// The Redis key, `{prefix}:{scope/queue}` (one hash tag: one cluster slot).
    pub key: &'a str,
    pub terms: Terms,
}
