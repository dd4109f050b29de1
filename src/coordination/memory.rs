//! The ledger in memory: [`LedgerPort`] with the semantics of the Redis scripts
//! (`lua/*.lua`, docs/fleet.md), step for step and in the same integer milliseconds, for the
//! seat's unit tests and the fleet's simulation. `tests/ledger_contract.rs` runs one suite
//! on both.
//!
//! Time is `tokio::time::Instant`, so it runs on tokio's paused clock. Epoch ids come from
//! a counter that only increases (Redis uses `TIME` in µs): what matters is that a new
//! epoch is above every earlier one and above the caller's.
//!
//! Faults, for tests: [`MemoryLedger::lose_everything`] (FLUSHALL, a restart),
//! [`MemoryLedger::lose`] (one queue evicted), [`MemoryLedger::snapshot`] /
//! [`MemoryLedger::restore`] (a failover to a replica that missed the writes since),
//! [`MemoryLedger::cut_off`] (a replica's calls never reach it), [`MemoryLedger::delay`] (a
//! replica's calls run, their replies arrive late) and [`MemoryLedger::lose_replies`] (they
//! run, their replies never arrive).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::port::{
    Ask, Caller, Epoch, LedgerError, LedgerPort, QueueRef, ReadFor, ReadOutcome, ReadState,
    ReadTicket, ReserveAnswer, Settle, Terms, View,
};

/// As the prelude's `VERSION_KEPT_MS`: a replica's last version outlives its silence this
/// long.
const VERSION_KEPT_MS: i64 = 600_000;

/// A ledger in this process; clones share it.
#[derive(Clone)]
pub struct MemoryLedger {
    inner: Arc<Inner>,
}

struct Inner {
    /// Time zero of this ledger's millisecond clock.
    origin: Instant,
    timeout: Duration,
    world: parking_lot::Mutex<World>,
}

#[derive(Default)]
struct World {
    queues: HashMap<String, Queue>,
    /// The last epoch id handed out: the next is above it, whatever was lost.
    last_epoch: u64,
    faults: HashMap<String, Faults>,
    /// Redis down for everyone: every call fails after the timeout, `look` too.
    down: bool,
    /// Which server process holds the states (Redis's `run_id`): a restart or a failover
    /// is another one.
    incarnation: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    cut_off: bool,
    late_by: Duration,
    replies_lost: bool,
}

/// Every queue's state at one instant, to [`MemoryLedger::restore`] later.
#[derive(Debug, Clone)]
pub struct Snapshot(HashMap<String, Queue>);

/// One queue's hash, field for field (see `lua/prelude.lua`). Times are ms on the ledger's
/// clock; `reserved` and `carried` are sums of the live blocks and carries, never stored.
#[derive(Debug, Clone)]
struct Queue {
    /// When the state expires (idle after its last write), as `PEXPIRE` does.
    expires_at: i64,
    /// The incarnation that last wrote this state: a state another one holds may have
    /// lost writes (a failover) and is made anew.
    incarnation: u64,
    epoch: u64,
    version: u64,
    born: i64,
    read: ReadState,
    taken_ms: i64,
    /// When the last paced read's lease was taken.
    paced_ms: i64,
    streak: u64,
    generation: u64,
    paced: u64,
    reads_ok: u64,
    reads_failed: u64,
    published_seq: u64,
    lease_holder: Option<String>,
    lease_until: i64,
    ticket_seq: u64,
    /// Ticket seq → when its lease was taken.
    tickets: BTreeMap<u64, i64>,
    completed_total: u64,
    since_read: u64,
    /// 100 ms bucket → stored sends settled in it.
    lag: BTreeMap<i64, u64>,
    /// Block id → (units, lease end).
    blocks: HashMap<String, (u64, i64)>,
    /// Replica → (count, end).
    carries: HashMap<String, (u64, i64)>,
    /// Replica → until when it counts.
    members: HashMap<String, i64>,
    /// Replica → (the version of its last call, until when it is kept).
    versions: HashMap<String, (u64, i64)>,
    /// Replica → (the lag and read age it named last, until when they are kept): as the
    /// prelude's `l:` / `a:`, kept as long as its version.
    terms: HashMap<String, (i64, i64, i64)>,
    /// The longest lag and read age a replica still around named: what the state is
    /// pruned by (derived from `terms` by every call's preamble).
    lag_max: i64,
    read_age_max: i64,
}

impl Queue {
    fn new(epoch: u64, now: i64, incarnation: u64) -> Self {
        Self {
            expires_at: now,
            incarnation,
            epoch,
            version: 0,
            born: now,
            read: ReadState::Never,
            taken_ms: 0,
            paced_ms: 0,
            streak: 0,
            generation: 0,
            paced: 0,
            reads_ok: 0,
            reads_failed: 0,
            published_seq: 0,
            lease_holder: None,
            lease_until: 0,
            ticket_seq: 0,
            tickets: BTreeMap::new(),
            completed_total: 0,
            since_read: 0,
            lag: BTreeMap::new(),
            blocks: HashMap::new(),
            carries: HashMap::new(),
            members: HashMap::new(),
            versions: HashMap::new(),
            terms: HashMap::new(),
            lag_max: 0,
            read_age_max: 0,
        }
    }

    fn seen(&self) -> Epoch {
        Epoch {
            id: self.epoch,
            version: self.version,
        }
    }

    fn sums(&self, now: i64) -> (u64, u64, u64) {
        let live = |m: &HashMap<String, (u64, i64)>| {
            m.values()
                .filter(|(_, end)| *end > now)
                .fold(0u64, |sum, (n, _)| sum.saturating_add(*n))
        };
        let replicas = self.members.values().filter(|until| **until > now).count();
        (
            live(&self.blocks),
            live(&self.carries),
            u64::try_from(replicas).unwrap_or(u64::MAX),
        )
    }

    fn prune(&mut self, now: i64, t: &Terms, replica: &str) {
        // As the prelude: by the longest terms a replica still around named, this caller's
        // as of now.
        self.terms.insert(
            replica.to_owned(),
            (
                ms(t.lag),
                ms(t.max_read_age),
                now.saturating_add(VERSION_KEPT_MS),
            ),
        );
        self.terms.retain(|_, (_, _, until)| *until > now);
        self.lag_max = self
            .terms
            .values()
            .map(|(lag, _, _)| *lag)
            .max()
            .unwrap_or(0);
        self.read_age_max = self
            .terms
            .values()
            .map(|(_, age, _)| *age)
            .max()
            .unwrap_or(0);
        let (lag, max_read_age) = (self.lag_max, self.read_age_max);
        self.blocks.retain(|_, (_, end)| *end > now);
        self.carries.retain(|_, (_, end)| *end > now);
        self.members.retain(|_, until| *until > now);
        self.versions.retain(|_, (_, until)| *until > now);
        let oldest = (now - lag - 1000).div_euclid(100);
        self.lag.retain(|bucket, _| *bucket >= oldest);
        // As the prelude: a ticket whose read would be too old when published is dropped.
        self.tickets.retain(|_, taken| now - *taken <= max_read_age);
    }

    /// As `complete` in the prelude.
    fn complete(&mut self, now: i64, lag: i64, stored: u64) {
        if stored == 0 {
            return;
        }
        self.completed_total = self.completed_total.saturating_add(stored);
        self.since_read = self.since_read.saturating_add(stored);
        if lag > 0 {
            let bucket = self.lag.entry(now.div_euclid(100)).or_default();
            *bucket = bucket.saturating_add(stored);
        }
    }

    /// As `settle_rows` in the prelude: a row takes at most what its live block holds.
    fn settle_rows(&mut self, now: i64, lag: i64, rows: &[Settle<'_>]) {
        let mut stored_total = 0u64;
        for row in rows {
            if let Entry::Occupied(mut block) = self.blocks.entry(row.block_id.to_owned()) {
                let (units, _) = block.get_mut();
                *units -= (*units).min(row.stored.saturating_add(row.not_stored));
                if *units == 0 {
                    block.remove();
                }
            }
            stored_total = stored_total.saturating_add(row.stored);
        }
        self.complete(now, lag, stored_total);
    }

    /// A published read's outcome: a good one replaces the read, a failed one leaves the
    /// last good read's backlog standing.
    fn land(&mut self, ticket: &ReadTicket, outcome: ReadOutcome, for_: ReadFor) {
        match outcome {
            ReadOutcome::Ok {
                backlog,
                send_disabled,
            } => {
                self.read = ReadState::Ok {
                    backlog,
                    send_disabled,
                };
                self.streak = 0;
                self.reads_ok += 1;
                self.since_read = self
                    .completed_total
                    .saturating_sub(ticket.completed_at_start);
            }
            ReadOutcome::Failed => {
                let standing = match self.read {
                    ReadState::Ok { backlog, .. } => Some(backlog),
                    ReadState::Failed { standing } => standing,
                    ReadState::Never => None,
                };
                self.read = ReadState::Failed { standing };
                if for_.counts_in_streak() {
                    self.streak += 1;
                }
                self.reads_failed += 1;
            }
        }
    }

    /// A read made again at the ceiling that shows no less than the read in force counted
    /// forward: both bound the queue from above, the higher only by sends it counts twice,
    /// so it is not published (publish_read.lua).
    fn shows_no_less(&self, ticket: &ReadTicket, outcome: ReadOutcome, for_: ReadFor) -> bool {
        match (for_.paced(), outcome, self.read) {
            (
                false,
                ReadOutcome::Ok {
                    backlog,
                    send_disabled: false,
                },
                ReadState::Ok {
                    backlog: standing, ..
                },
            ) => {
                let since = self
                    .completed_total
                    .saturating_sub(ticket.completed_at_start);
                backlog.saturating_add(since) >= standing.saturating_add(self.since_read)
            }
            _ => false,
        }
    }

    fn view(&self, now: i64, t: &Terms) -> View {
        let (reserved, carried, replicas) = self.sums(now);
        let (read_age, paced_age) = match self.read {
            ReadState::Never => (0, 0),
            _ => ((now - self.taken_ms).max(0), (now - self.paced_ms).max(0)),
        };
        View {
            epoch: self.seen(),
            grace_left: from_ms((self.born + ms(t.grace) - now).max(0)),
            read: self.read,
            read_age: from_ms(read_age),
            paced_age: from_ms(paced_age),
            streak: u32::try_from(self.streak).unwrap_or(u32::MAX),
            generation: self.generation,
            paced: self.paced,
            since_read: self.since_read,
            reserved,
            carried,
            replicas,
            reads_ok: self.reads_ok,
            reads_failed: self.reads_failed,
        }
    }
}

impl World {
    /// The preamble every replica's call runs (see `preamble` in `lua/prelude.lua`): the
    /// queue's state, made anew if missing or rolled back, pruned, the caller counted and
    /// its carry recorded if it names this epoch. Returns the state and whether it did.
    fn preamble(&mut self, key: &str, t: &Terms, c: &Caller<'_>, now: i64) -> (&mut Queue, bool) {
        let last_epoch = &mut self.last_epoch;
        let incarnation = self.incarnation;
        let mut make = || {
            let id = last_epoch
                .saturating_add(1)
                .max(c.seen.id.saturating_add(1));
            *last_epoch = id;
            Queue::new(id, now, incarnation)
        };
        let q = match self.queues.entry(key.to_owned()) {
            Entry::Vacant(v) => v.insert(make()),
            Entry::Occupied(mut o) => {
                // Expired (idle), written by another incarnation (a failover: it may have
                // missed writes nobody still around saw), or the caller saw a later state
                // than this one: later than the whole state, or than its own last call
                // (others' calls since a lost write may have raised the version past it).
                let own = o.get().versions.get(c.replica).map_or(0, |(v, _)| *v);
                let lost = c.seen.id == o.get().epoch && c.seen.version > own;
                let moved = o.get().incarnation != incarnation;
                if now > o.get().expires_at || moved || c.seen > o.get().seen() || lost {
                    o.insert(make());
                }
                o.into_mut()
            }
        };
        q.prune(now, t, c.replica);
        q.members
            .insert(c.replica.to_owned(), now.saturating_add(ms(t.member_for)));
        let matched = q.epoch == c.seen.id;
        if matched {
            if c.carry > 0 {
                q.carries.insert(
                    c.replica.to_owned(),
                    (c.carry, now.saturating_add(ms(t.hold))),
                );
            } else {
                q.carries.remove(c.replica);
            }
        }
        q.version += 1;
        q.versions.insert(
            c.replica.to_owned(),
            (q.version, now.saturating_add(VERSION_KEPT_MS)),
        );
        q.expires_at = now.saturating_add(ms(t.idle).max(1));
        (q, matched)
    }

    fn reserve(
        &mut self,
        key: &str,
        t: &Terms,
        c: &Caller<'_>,
        ask: &Ask<'_>,
        now: i64,
    ) -> (ReserveAnswer, View) {
        let (q, matched) = self.preamble(key, t, c, now);
        let decision = 'decide: {
            if !matched {
                break 'decide ReserveAnswer::NewEpoch;
            }
            if now < q.born + ms(t.grace) {
                break 'decide ReserveAnswer::Recovering;
            }
            let backlog = match q.read {
                ReadState::Never => break 'decide ReserveAnswer::Unread,
                _ if now - q.taken_ms > ms(t.max_read_age) => break 'decide ReserveAnswer::Unread,
                ReadState::Failed { .. } => break 'decide ReserveAnswer::Unknown,
                ReadState::Ok {
                    send_disabled: true,
                    ..
                } => break 'decide ReserveAnswer::Disabled,
                ReadState::Ok { backlog, .. } => backlog,
            };
            let (reserved, carried, _) = q.sums(now);
            let estimate = backlog
                .saturating_add(q.since_read)
                .saturating_add(reserved)
                .saturating_add(carried);
            if estimate >= ask.limit {
                break 'decide ReserveAnswer::Full { estimate };
            }
            let room = (ask.limit - estimate) / ask.divisor.max(1);
            let granted = ask.want.max(1).min(room).max(1);
            // As reserve.lua: a repeated id adds its units under the later lease.
            let lease_end = now.saturating_add(ms(ask.lease));
            let block = q
                .blocks
                .entry(ask.block_id.to_owned())
                .or_insert((0, lease_end));
            block.0 = block.0.saturating_add(granted);
            block.1 = block.1.max(lease_end);
            ReserveAnswer::Granted { granted }
        };
        (decision, q.view(now, t))
    }

    fn lease_read(
        &mut self,
        key: &str,
        t: &Terms,
        c: &Caller<'_>,
        lease: Duration,
        now: i64,
    ) -> (Option<ReadTicket>, View) {
        let (q, _) = self.preamble(key, t, c, now);
        if q.lease_until > now {
            return (None, q.view(now, t));
        }
        q.ticket_seq += 1;
        q.lease_holder = Some(c.replica.to_owned());
        q.lease_until = now.saturating_add(ms(lease));
        q.tickets.insert(q.ticket_seq, now);
        let lag = q.lag_max;
        let mut completed = q.completed_total;
        if lag > 0 {
            let from = (now - lag).div_euclid(100);
            let recent = q
                .lag
                .range(from..)
                .fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
            completed = completed.saturating_sub(recent);
        }
        let ticket = ReadTicket {
            epoch: q.epoch,
            seq: q.ticket_seq,
            completed_at_start: completed,
        };
        (Some(ticket), q.view(now, t))
    }

    // One parameter per thing the call publishes; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    fn publish_read(
        &mut self,
        key: &str,
        t: &Terms,
        c: &Caller<'_>,
        ticket: &ReadTicket,
        outcome: ReadOutcome,
        for_: ReadFor,
        now: i64,
    ) -> View {
        let (q, _) = self.preamble(key, t, c, now);
        let taken = match q.tickets.get(&ticket.seq) {
            Some(taken) if ticket.epoch == q.epoch && ticket.seq > q.published_seq => *taken,
            _ => return q.view(now, t),
        };
        let published = !q.shows_no_less(ticket, outcome, for_);
        if for_.ends_lease() && ticket.seq == q.ticket_seq {
            q.lease_until = q.lease_until.min(now);
        }
        q.published_seq = ticket.seq;
        q.tickets.retain(|seq, _| *seq > ticket.seq);
        if published {
            q.generation += 1;
            if for_.paced() {
                q.paced += 1;
                q.paced_ms = taken;
            }
            q.taken_ms = taken;
            q.land(ticket, outcome, for_);
        }
        q.view(now, t)
    }

    fn leave(
        &mut self,
        key: &str,
        t: &Terms,
        c: &Caller<'_>,
        rows: &[Settle<'_>],
        now: i64,
    ) -> View {
        let (q, matched) = self.preamble(key, t, c, now);
        if matched {
            q.settle_rows(now, q.lag_max, rows);
        }
        let mine = format!("{}:", c.replica);
        q.blocks.retain(|id, _| !id.starts_with(&mine));
        q.members.remove(c.replica);
        q.terms.remove(c.replica);
        // As leave.lua: the carry stays until its hold ends (no read shows it yet).
        if q.lease_holder.as_deref() == Some(c.replica) {
            q.lease_holder = None;
            q.lease_until = 0;
        }
        q.view(now, t)
    }

    fn look(&self, key: &str, t: &Terms, now: i64) -> Option<View> {
        match self.queues.get(key) {
            Some(q) if now <= q.expires_at => Some(q.view(now, t)),
            _ => None,
        }
    }
}

impl MemoryLedger {
    /// A ledger whose [`LedgerPort::timeout`] is `timeout` (how long a cut-off call takes
    /// to fail). Call it inside a tokio runtime (its clock starts here).
    pub fn new(timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                origin: Instant::now(),
                timeout,
                world: parking_lot::Mutex::new(World::default()),
            }),
        }
    }

    /// FLUSHALL, or a restart without persistence: every queue's state is gone.
    pub fn lose_everything(&self) {
        let mut world = self.inner.world.lock();
        world.queues.clear();
        world.incarnation += 1;
    }

    /// One queue's state evicted (all of it: it is one hash).
    pub fn lose(&self, key: &str) {
        self.inner.world.lock().queues.remove(key);
    }

    /// Every queue's state as it is now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.inner.world.lock().queues.clone())
    }

    /// Back to `snapshot` on the same server (a `RESTORE`): the writes since are lost, and
    /// only a caller that saw one of them can tell. Epoch ids already handed out are not
    /// handed out again.
    pub fn restore(&self, snapshot: &Snapshot) {
        self.inner.world.lock().queues = snapshot.0.clone();
    }

    /// A failover to a replica that had seen nothing since `snapshot`: the writes since are
    /// lost, and the server is another one (another `run_id`).
    pub fn fail_over(&self, snapshot: &Snapshot) {
        let mut world = self.inner.world.lock();
        world.queues = snapshot.0.clone();
        world.incarnation += 1;
    }

    /// While `on`, every call of `replica` fails with [`LedgerError::Timeout`] after the
    /// timeout, without running (Redis unreachable from it, the connection black-holed).
    pub fn cut_off(&self, replica: &str, on: bool) {
        self.faults(replica, |f| f.cut_off = on);
    }

    /// Every call of `replica` runs at once but its reply arrives `late_by` later (zero: on
    /// time). Longer than the timeout, it still arrives: it stands for a replica that was
    /// paused and processes the reply late, which a deadline does not catch.
    pub fn delay(&self, replica: &str, late_by: Duration) {
        self.faults(replica, |f| f.late_by = late_by);
    }

    /// While `on`, Redis answers nobody: every call (an onlooker's `look` too) fails with
    /// [`LedgerError::Timeout`] after the timeout, without running. Unlike
    /// [`MemoryLedger::cut_off`], which names a replica, this also stops the rejoin probe.
    pub fn set_down(&self, on: bool) {
        self.inner.world.lock().down = on;
    }

    /// While `on`, every call of `replica` runs, but it hears [`LedgerError::Timeout`] after
    /// the timeout (Redis slower than the deadline: the step happened all the same).
    pub fn lose_replies(&self, replica: &str, on: bool) {
        self.faults(replica, |f| f.replies_lost = on);
    }

    fn faults(&self, replica: &str, change: impl FnOnce(&mut Faults)) {
        let mut world = self.inner.world.lock();
        change(world.faults.entry(replica.to_owned()).or_default());
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.inner.origin.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// One call of `replica`: the faults set for it, then `step` atomically on the state.
    async fn call<T>(
        &self,
        replica: &str,
        step: impl FnOnce(&mut World, i64) -> T,
    ) -> Result<T, LedgerError> {
        let (faults, down) = {
            let world = self.inner.world.lock();
            let faults = world.faults.get(replica).copied().unwrap_or_default();
            (faults, world.down)
        };
        if faults.cut_off || down {
            tokio::time::sleep(self.inner.timeout).await;
            return Err(LedgerError::Timeout);
        }
        let answer = {
            let now = self.now_ms();
            step(&mut self.inner.world.lock(), now)
        };
        if faults.replies_lost {
            tokio::time::sleep(self.inner.timeout).await;
            return Err(LedgerError::Timeout);
        }
        if !faults.late_by.is_zero() {
            tokio::time::sleep(faults.late_by).await;
        }
        Ok(answer)
    }
}

impl std::fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLedger")
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LedgerPort for MemoryLedger {
    async fn reserve(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ask: Ask<'_>,
    ) -> Result<(ReserveAnswer, View), LedgerError> {
        self.call(caller.replica, |w, now| {
            w.reserve(queue.key, &queue.terms, &caller, &ask, now)
        })
        .await
    }

    async fn settle(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        rows: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        self.call(caller.replica, |w, now| {
            let t = &queue.terms;
            let (q, matched) = w.preamble(queue.key, t, &caller, now);
            if matched {
                q.settle_rows(now, q.lag_max, rows);
            }
            q.view(now, t)
        })
        .await
    }

    async fn heartbeat(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
    ) -> Result<View, LedgerError> {
        self.call(caller.replica, |w, now| {
            let (q, _) = w.preamble(queue.key, &queue.terms, &caller, now);
            q.view(now, &queue.terms)
        })
        .await
    }

    async fn lease_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        lease: Duration,
    ) -> Result<(Option<ReadTicket>, View), LedgerError> {
        self.call(caller.replica, |w, now| {
            w.lease_read(queue.key, &queue.terms, &caller, lease, now)
        })
        .await
    }

    async fn publish_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ticket: ReadTicket,
        outcome: ReadOutcome,
        for_: ReadFor,
    ) -> Result<View, LedgerError> {
        self.call(caller.replica, |w, now| {
            w.publish_read(
                queue.key,
                &queue.terms,
                &caller,
                &ticket,
                outcome,
                for_,
                now,
            )
        })
        .await
    }

    async fn leave(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        rows: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        self.call(caller.replica, |w, now| {
            w.leave(queue.key, &queue.terms, &caller, rows, now)
        })
        .await
    }

    async fn look(&self, queue: QueueRef<'_>) -> Result<Option<View>, LedgerError> {
        if self.inner.world.lock().down {
            tokio::time::sleep(self.inner.timeout).await;
            return Err(LedgerError::Timeout);
        }
        let now = self.now_ms();
        Ok(self.inner.world.lock().look(queue.key, &queue.terms, now))
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

/// Counts and times travel to Redis as Lua doubles, clamped to 2^53 − 1: the same here.
fn ms(d: Duration) -> i64 {
    const MAX_EXACT: u128 = (1 << 53) - 1;
    // Below 2^53, so the conversion cannot fail.
    i64::try_from(d.as_millis().min(MAX_EXACT)).unwrap_or(i64::MAX)
}

fn from_ms(n: i64) -> Duration {
    Duration::from_millis(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: Terms = Terms {
        hold: Duration::from_millis(300),
        lag: Duration::ZERO,
        max_read_age: Duration::from_secs(60),
        grace: Duration::ZERO,
        member_for: Duration::from_secs(1),
        idle: Duration::from_secs(60),
    };

    fn queue() -> QueueRef<'static> {
        QueueRef {
            key: "sg:{rabbitmq/orders}",
            terms: TERMS,
        }
    }

    fn caller(replica: &str) -> Caller<'_> {
        Caller {
            replica,
            seen: Epoch::NONE,
            carry: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_off_replica_fails_after_the_timeout_and_its_call_never_runs() {
        let ledger = MemoryLedger::new(Duration::from_millis(50));
        ledger.cut_off("a", true);
        let started = Instant::now();
        let answer = ledger.heartbeat(queue(), caller("a")).await;
        assert_eq!(answer, Err(LedgerError::Timeout));
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        assert_eq!(ledger.look(queue()).await, Ok(None), "the call ran");
        // Another replica is not cut off, and the first is back once the cut ends.
        assert!(ledger.heartbeat(queue(), caller("b")).await.is_ok());
        ledger.cut_off("a", false);
        let view = ledger.heartbeat(queue(), caller("a")).await.unwrap();
        assert_eq!(view.replicas, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_reply_comes_after_its_step_already_happened() {
        let ledger = MemoryLedger::new(Duration::from_millis(50));
        ledger.delay("a", Duration::from_secs(2));
        let slow = {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let view = ledger.heartbeat(queue(), caller("a")).await;
                (view, started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let seen = ledger.look(queue()).await.unwrap().expect("the step ran");
        assert_eq!(seen.replicas, 1);
        let (view, took) = slow.await.unwrap();
        assert_eq!(view.map(|v| v.epoch), Ok(seen.epoch));
        assert_eq!(took, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_reply_is_a_timeout_though_the_step_happened() {
        let ledger = MemoryLedger::new(Duration::from_millis(50));
        ledger.lose_replies("a", true);
        assert_eq!(
            ledger.heartbeat(queue(), caller("a")).await,
            Err(LedgerError::Timeout)
        );
        assert_eq!(
            ledger.look(queue()).await.unwrap().map(|v| v.replicas),
            Some(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_restored_snapshot_forgets_what_came_after_it_but_not_the_epochs_handed_out() {
        let ledger = MemoryLedger::new(Duration::from_millis(50));
        let first = ledger.heartbeat(queue(), caller("a")).await.unwrap().epoch;
        let before = ledger.snapshot();
        ledger.heartbeat(queue(), caller("b")).await.unwrap();
        ledger.restore(&before);
        let view = ledger.look(queue()).await.unwrap().unwrap();
        assert_eq!((view.epoch, view.replicas), (first, 1));
        ledger.lose_everything();
        let next = ledger.heartbeat(queue(), caller("a")).await.unwrap().epoch;
        assert!(next.id > first.id, "{next:?} after {first:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn clones_share_one_ledger() {
        let ledger = MemoryLedger::new(Duration::from_millis(50));
        let other = ledger.clone();
        ledger.heartbeat(queue(), caller("a")).await.unwrap();
        assert!(other.look(queue()).await.unwrap().is_some());
        other.lose(queue().key);
        assert_eq!(ledger.look(queue()).await, Ok(None));
    }
}
