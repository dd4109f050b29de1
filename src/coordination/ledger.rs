//! The fleet ledger: what every replica shares about one queue's ceiling, kept in Redis.
//!
//! A thin typed wrapper over Lua scripts (`scripts/*.lua`). Every check-and-change is one
//! script, so it runs atomically in Redis: no decision rests on a value read by an earlier
//! round trip that another replica may have changed since. All time is the Redis server's
//! `TIME`, read inside the scripts: the replicas' clocks are never compared.
//!
//! Per queue (and backend kind) the ledger keeps the fleet's last admin-plane read (depth,
//! ok/failed, when, the consecutive-failure streak), a read lease so one replica in the
//! fleet reads the admin plane per lease, the sends completed since that read, and the
//! headroom replicas hold in *blocks*: a replica reserves a block (a fraction of the room
//! left, shrinking to one send near the ceiling) and admits that many sends without another
//! round trip. A block lives one lease from its last reservation; when a replica dies
//! holding one, its headroom returns when the lease runs out.
//!
//! The invariant, fleet-wide: **admitted ≤ limit − backlog + unknown-outcome sends**.
//! `reserve` grants only while `backlog + since_read + reserved < limit`, and a granted
//! unit stays in `reserved` until `settle` moves it to `since_read` (stored or unknown
//! outcome: it may be in the queue) or drops it (definitely not stored), or `release` /
//! its block's expiry returns it. The one way past it is a block that expires while its
//! sends are still in flight: the caller keeps the block's lease longer than a send's
//! deadline.
//!
//! Every key expires after [`IDLE`] without a write, so a deleted queue or deployment
//! leaves nothing behind for ever.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

use super::entra::{EntraRedisCredentials, REDIS_SCOPE};
use crate::config::{BackendKind, RedisAuth, RedisSettings};
use crate::domain::QueueName;
use crate::entra::{CredentialChain, EntraCredential};

/// How long a queue's keys outlive their last write.
pub const IDLE: Duration = Duration::from_secs(24 * 60 * 60);

/// A replica counts in the fleet's size this long after it was last heard from (at least;
/// see [`Ledger::member_for`]: its *horizon*), and its share of the room stays withheld from
/// the others for as long, and longer: it may be running alone, cut off from Redis, until
/// just before its horizon, and the sends it stored alone show only in a read taken a send
/// deadline and the admin plane's lag after it ([`QueueKeys::with_send_deadline`]). Its
/// share comes back once such a read is published. A replica killed without a drain is
/// indistinguishable, so its share comes back only then.
pub const MEMBER_FOR: Duration = Duration::from_secs(10);

/// A replica in the fleet is heard from at least this often: each queue's seat asks for the
/// shared read when it made no other call for this long (see `FleetSeat`).
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// The longest the first connection (TCP, TLS, AUTH, PING) may take. Longer than one
/// call's deadline: it happens once, off the request path.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(1);

/// Counts travel through Lua, whose numbers are doubles: above 2^53 they would lose units.
/// Every count sent is clamped here; no queue comes near it.
pub(super) const MAX_EXACT: u64 = (1 << 53) - 1;

/// Why a ledger call failed. None of them names the Redis URL or its password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("Redis did not answer within the deadline")]
    Timeout,
    #[error("Redis: {0}")]
    Redis(String),
    #[error("unexpected reply from a ledger script: {0}")]
    Unexpected(String),
    /// `SENDGATE_REDIS_AUTH=entra`, but no Entra ID credential chain could be built here.
    #[error("SENDGATE_REDIS_AUTH=entra: {0}")]
    Entra(String),
}

/// One queue's keys, spelled once. The `{kind/queue}` hash tag (`{fallback/kind/queue}` for
/// the fallback lane's queue when the fallback is of the primary's kind: another broker's
/// queue of the same name) puts them in one cluster slot, which a script touching all of
/// them needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeys {
    read: String,
    lease: String,
    count: String,
    blocks: String,
    block_sizes: String,
    members: String,
    shares: String,
    /// How far the admin plane's counts trail the data plane (see [`QueueKeys::with_lag`]).
    lag_ms: u64,
    /// How long after its admission a send may still be stored: its deadline (see
    /// [`QueueKeys::with_send_deadline`]).
    send_ms: u64,
}

impl QueueKeys {
    /// Neither a queue name nor a prefix can hold `{` or `}` (see [`QueueName`],
    /// `KeyPrefix`), nor a scope (a backend kind, maybe after `fallback/`), so the hash tag
    /// is exactly `{scope/queue}`.
    fn new(prefix: &str, scope: &str, queue: &QueueName) -> Self {
        let base = queue_base(prefix, scope, queue);
        Self {
            read: format!("{base}:read"),
            lease: format!("{base}:lease"),
            count: format!("{base}:count"),
            blocks: format!("{base}:blocks"),
            block_sizes: format!("{base}:block_sizes"),
            members: format!("{base}:members"),
            shares: format!("{base}:shares"),
            lag_ms: 0,
            send_ms: 0,
        }
    }

    /// For an admin plane whose counts trail the data plane by up to `lag` (RabbitMQ's
    /// management statistics): completions settled within `lag` before a read's lease are
    /// still counted on top of that read, as the local gate does. Completions are kept in
    /// 100 ms buckets (rounded so a read counts a little more, never less).
    pub fn with_lag(mut self, lag: Duration) -> Self {
        self.lag_ms = millis(lag);
        self
    }

    /// For sends that may be stored up to `deadline` after they were admitted
    /// (`SENDGATE_SEND_TIMEOUT_MS`). With the lag, how long past this replica's horizon its
    /// last sends alone may be missing from a read (its *hold*, recorded beside its share):
    /// once it is forgotten, its share stays withheld from the others until a read taken
    /// that long after the horizon is published, or as long as the asking replica's own
    /// hold if that is longer (see [`Ledger::reserve`]).
    pub fn with_send_deadline(mut self, deadline: Duration) -> Self {
        self.send_ms = millis(deadline);
        self
    }

    /// How long past a forgotten replica's horizon a read may not show its sends yet.
    fn hold_ms(&self) -> u64 {
        self.lag_ms.saturating_add(self.send_ms).min(MAX_EXACT)
    }

    /// Every key, in the order the scripts take them (`KEYS[1..7]`).
    pub fn all(&self) -> [&str; 7] {
        [
            &self.read,
            &self.lease,
            &self.count,
            &self.blocks,
            &self.block_sizes,
            &self.members,
            &self.shares,
        ]
    }
}

/// The right to read the admin plane for the fleet, and what was counted when it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTicket {
    /// `completed_total` when the lease was taken: completions after it go on top of the
    /// depth this read will see.
    pub completed_at_start: u64,
    /// Orders tickets: a read older than the last one published is dropped, not published.
    pub seq: u64,
}

/// What one admin-plane read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    Ok { backlog: u64, send_disabled: bool },
    Failed,
}

/// The fleet's last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedState {
    /// No replica has published a read of this queue (or its keys expired).
    Never,
    Ok {
        backlog: u64,
        send_disabled: bool,
    },
    Failed,
}

/// The shared read and the counts on top of it, as Redis had them in one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedRead {
    pub state: SharedState,
    /// Since the read was published, by Redis `TIME` (zero for `Never`).
    pub age: Duration,
    /// Consecutive failed reads that count (reads made for sends).
    pub streak: u32,
    /// Bumped by every published read.
    pub generation: u64,
    /// Stored (or unknown-outcome) sends completed since the read started.
    pub since_read: u64,
    /// Headroom held in live blocks, all replicas together.
    pub reserved: u64,
    pub reads_ok: u64,
    pub reads_failed: u64,
    /// Replicas heard from (a reservation, a heartbeat, a read) within the member horizon
    /// ([`Ledger::member_for`]): the fleet's size.
    pub replicas: u64,
    /// What the asking replica may admit alone should it turn local before it is heard from
    /// again (see [`Ledger::reserve`]), and that share's sequence number (newer is larger);
    /// `0, 0` from a call that does not speak for a replica (an onlooker's read, a published
    /// read); without a good read, the share last recorded.
    pub share: u64,
    pub share_seq: u64,
}

/// What `reserve` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// `granted` sends (1 ≤ granted ≤ want) may go; they are held in the block.
    Granted { granted: u64, read: SharedRead },
    /// No room: `estimate` = backlog + since_read + reserved + the other replicas' shares ≥
    /// limit.
    Full { estimate: u64, read: SharedRead },
    /// The last read says the queue does not accept sends.
    Disabled { read: SharedRead },
    /// No good read (never read, or the last read failed): the caller applies fail-open or
    /// fail-closed with `read.streak`.
    Unknown { read: SharedRead },
}

/// One block's outcomes in a [`Ledger::settle_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle<'a> {
    pub block_id: &'a str,
    /// Stored (or unknown outcome): counted on top of the read.
    pub stored: u64,
    /// Definitely not stored, or never used (a release): only leave the block.
    pub not_stored: u64,
}

impl<'a> Settle<'a> {
    pub fn new(block_id: &'a str, stored: u64, not_stored: u64) -> Self {
        Self {
            block_id,
            stored,
            not_stored,
        }
    }
}

/// The compiled scripts; each carries its SHA-1 so calls go as EVALSHA (EVAL once after a
/// Redis restart emptied its script cache).
struct Scripts {
    lease_read: Script,
    publish_read: Script,
    shared_read: Script,
    reserve: Script,
    settle: Script,
    leave: Script,
}

macro_rules! ledger_script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("scripts/common.lua"),
            include_str!(concat!("scripts/", $file))
        ))
    };
}

impl Scripts {
    fn new() -> Self {
        Self {
            lease_read: ledger_script!("lease_read.lua"),
            publish_read: ledger_script!("publish_read.lua"),
            shared_read: ledger_script!("shared_read.lua"),
            reserve: ledger_script!("reserve.lua"),
            settle: ledger_script!("settle.lua"),
            leave: ledger_script!("leave.lua"),
        }
    }
}

/// After this many calls in a row failed on the connection (not on a script), the
/// connection manager is replaced: see [`Connection`].
const REBUILD_AFTER: u32 = 3;

/// redis's `ConnectionManager` with two gaps closed. It reconnects only after an I/O error,
/// so a first connection that failed otherwise (wrong password, `LOADING` while Redis
/// restarts) would fail every call for ever, and a peer gone silent (no RST) keeps its
/// connection until TCP gives up, many minutes later. Both show as calls failing in a row:
/// after [`REBUILD_AFTER`] of them a fresh manager replaces the old one.
struct Connection {
    client: redis::Client,
    config: ConnectionManagerConfig,
    current: parking_lot::Mutex<ConnectionManager>,
    failures: AtomicU32,
}

impl Connection {
    fn new(client: redis::Client, config: ConnectionManagerConfig) -> redis::RedisResult<Self> {
        let current = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(Self {
            client,
            config,
            current: parking_lot::Mutex::new(current),
            failures: AtomicU32::new(0),
        })
    }

    fn get(&self) -> ConnectionManager {
        self.current.lock().clone()
    }

    /// Whether a call failed on the connection (see [`failed_on_the_connection`]).
    fn record(&self, connection_failed: bool) {
        if !connection_failed {
            self.failures.store(0, Ordering::Relaxed);
            return;
        }
        if self.failures.fetch_add(1, Ordering::Relaxed) + 1 < REBUILD_AFTER {
            return;
        }
        self.failures.store(0, Ordering::Relaxed);
        // Lazy: nothing is awaited here; the next call connects.
        if let Ok(fresh) =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
        {
            *self.current.lock() = fresh;
        }
    }
}

/// A replica's handle on the ledger: cheap to clone (one multiplexed connection, shared).
#[derive(Clone)]
pub struct Ledger {
    conn: std::sync::Arc<Connection>,
    prefix: String,
    timeout: Duration,
    scripts: std::sync::Arc<Scripts>,
    /// Strings no error may carry (the URL, its password).
    redact: std::sync::Arc<[String]>,
    /// With Entra auth: the token source, whose current token no error may carry either.
    entra: Option<std::sync::Arc<EntraCredential>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Connect now and check Redis answers, all within [`CONNECT_DEADLINE`] (or the call
    /// deadline, if longer).
    pub async fn connect(settings: &RedisSettings) -> Result<Self, LedgerError> {
        let ledger = Self::lazy(settings)?;
        let deadline = CONNECT_DEADLINE.max(settings.timeout);
        ledger.ping_within(deadline).await.map(|()| ledger)
    }

    /// A ledger that connects on its first call (and reconnects in the background after a
    /// failure): for a replica that starts while Redis is down and joins when it answers.
    /// Fails only on settings it cannot use.
    pub fn lazy(settings: &RedisSettings) -> Result<Self, LedgerError> {
        let entra = match &settings.auth {
            RedisAuth::Url => None,
            RedisAuth::Entra {
                managed_identity_client_id,
            } => {
                let chain = CredentialChain::from_environment(
                    REDIS_SCOPE,
                    managed_identity_client_id.as_deref(),
                )
                .map_err(LedgerError::Entra)?;
                Some(std::sync::Arc::new(EntraCredential::new(chain)))
            }
        };
        Self::build(settings, entra)
    }

    /// [`Ledger::lazy`] with Entra auth through `credential` (whatever `settings.auth`
    /// says): the URL's user authenticates with `credential`'s tokens for
    /// `https://redis.azure.com/.default`. For tests, and for a process that already holds
    /// a credential.
    pub fn lazy_with_entra(
        settings: &RedisSettings,
        credential: std::sync::Arc<EntraCredential>,
    ) -> Result<Self, LedgerError> {
        Self::build(settings, Some(credential))
    }

    fn build(
        settings: &RedisSettings,
        entra: Option<std::sync::Arc<EntraCredential>>,
    ) -> Result<Self, LedgerError> {
        let url = settings.url.expose();
        let redact: Vec<String> = std::iter::once(url.as_str().to_owned())
            .chain(url.password().filter(|p| !p.is_empty()).map(str::to_owned))
            .collect();
        let redact: std::sync::Arc<[String]> = redact.into();
        let fail = |e: redis::RedisError| redis_error(&redact, None, e);
        if url.scheme() == "rediss" {
            crate::tls::install_ring();
        }
        let client = redis::Client::open(url.as_str()).map_err(fail)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_DEADLINE.max(settings.timeout)))
            // A backstop only: every call's deadline is `Ledger::within`'s, which looks at a
            // reply that arrived by then once more before calling it late (the client's own
            // timer would race it and drop that reply).
            .set_response_timeout(Some(settings.timeout.saturating_mul(2)))
            // One quick retry per connection attempt, so a call meets the real error (refused,
            // WRONGPASS) rather than its deadline; the next call tries again, and the fleet is
            // rejoined as soon as Redis answers.
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(200))
            .set_number_of_retries(1);
        let config = match &entra {
            // The URL's user with a token as its password, a new AUTH on every live
            // connection before the token expires (see `super::entra`).
            Some(credential) => config.set_credentials_provider(EntraRedisCredentials::new(
                url.username(),
                credential.clone(),
            )),
            None => config,
        };
        let conn = Connection::new(client, config).map_err(fail)?;
        Ok(Self {
            conn: std::sync::Arc::new(conn),
            prefix: settings.prefix.as_str().to_owned(),
            timeout: settings.timeout,
            scripts: std::sync::Arc::new(Scripts::new()),
            redact,
            entra,
        })
    }

    /// How long a replica not heard from still counts, its share withheld: [`MEMBER_FOR`],
    /// or longer with a long call deadline (many heartbeats fit in it either way).
    pub fn member_for(&self) -> Duration {
        MEMBER_FOR.max(self.timeout * 4 + HEARTBEAT * 4)
    }

    /// The deadline of one call: an answer may arrive this long after its script ran.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The keys of one queue on one backend kind: the primary lane's (`{kind/queue}`).
    pub fn keys(&self, backend: BackendKind, queue: &QueueName) -> QueueKeys {
        QueueKeys::new(&self.prefix, backend.as_str(), queue)
    }

    /// The keys of one queue of the fallback lane, whose backend is of kind `fallback`
    /// beside a primary of kind `primary`. Of another kind, a fallback's queue is named as a
    /// primary's would be (`{kind/queue}`, as before); of the same kind it is another
    /// broker's queue and has keys of its own, `{fallback/kind/queue}`, else both lanes would
    /// keep one count for two queues. Those keys are in force only once every replica runs
    /// this version: during a rolling upgrade an older replica still counts that fallback's
    /// sends in the primary's keys (and the newer ones do not see them there).
    pub fn fallback_keys(
        &self,
        primary: BackendKind,
        fallback: BackendKind,
        queue: &QueueName,
    ) -> QueueKeys {
        QueueKeys::new(&self.prefix, &fallback_scope(primary, fallback), queue)
    }

    /// One queue's state in the fleet protocol (docs/fleet.md): the one hash
    /// `{prefix}:{kind/queue}` of the primary lane, the base the old keys' names extend.
    pub fn queue_key(&self, backend: BackendKind, queue: &QueueName) -> String {
        queue_base(&self.prefix, backend.as_str(), queue)
    }

    /// [`Ledger::queue_key`] of the fallback lane, named as [`Ledger::fallback_keys`] names
    /// its keys (`{fallback/kind/queue}` beside a primary of the same kind).
    pub fn fallback_queue_key(
        &self,
        primary: BackendKind,
        fallback: BackendKind,
        queue: &QueueName,
    ) -> String {
        queue_base(&self.prefix, &fallback_scope(primary, fallback), queue)
    }

    pub async fn ping(&self) -> Result<(), LedgerError> {
        self.ping_within(self.timeout).await
    }

    async fn ping_within(&self, deadline: Duration) -> Result<(), LedgerError> {
        let mut conn = self.conn.get();
        let cmd = redis::cmd("PING");
        let answer = self
            .within(deadline, cmd.query_async::<Value>(&mut conn))
            .await?;
        match answer {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            other => Err(LedgerError::Unexpected(format!("PING answered {other:?}"))),
        }
    }

    /// Become the fleet's reader for `lease` (SET NX PX). `Some(ticket)`: read the admin
    /// plane now and publish the outcome with this ticket; `None`: another replica reads.
    pub async fn lease_read(
        &self,
        q: &QueueKeys,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<ReadTicket>, LedgerError> {
        let mut call = self.scripts.lease_read.prepare_invoke();
        call.key(&q.all()[..])
            .arg(owner)
            .arg(millis(lease).max(1))
            .arg(millis(IDLE))
            .arg(q.lag_ms);
        let reply = self.run(&call).await?;
        decode_ticket(&ints(reply)?)
    }

    /// Publish a read's outcome for every replica and return the new shared state.
    /// Ok: `since_read` becomes the completions after the ticket, the streak 0. Failed: the
    /// streak grows by one if `counts_in_streak`. The generation grows either way — unless
    /// a newer ticket was already published: then nothing changes (older news).
    pub async fn publish_read(
        &self,
        q: &QueueKeys,
        ticket: ReadTicket,
        outcome: ReadOutcome,
        counts_in_streak: bool,
    ) -> Result<SharedRead, LedgerError> {
        let (ok, backlog, send_disabled) = match outcome {
            ReadOutcome::Ok {
                backlog,
                send_disabled,
            } => (true, backlog, send_disabled),
            ReadOutcome::Failed => (false, 0, false),
        };
        let mut call = self.scripts.publish_read.prepare_invoke();
        call.key(&q.all()[..])
            .arg(exact(ticket.seq))
            .arg(exact(ticket.completed_at_start))
            .arg(u8::from(ok))
            .arg(exact(backlog))
            .arg(u8::from(send_disabled))
            .arg(u8::from(counts_in_streak))
            .arg(millis(IDLE));
        let reply = self.run(&call).await?;
        decode_read(&ints(reply)?)
    }

    /// The fleet's shared read as it stands (expired blocks pruned first), for an onlooker:
    /// the caller is not counted among the fleet's replicas.
    pub async fn shared_read(&self, q: &QueueKeys) -> Result<SharedRead, LedgerError> {
        let mut call = self.scripts.shared_read.prepare_invoke();
        call.key(&q.all()[..]);
        let reply = self.run(&call).await?;
        decode_read(&ints(reply)?)
    }

    /// [`Ledger::shared_read`] by replica `replica` of the fleet, whose ceiling is `limit`:
    /// it is counted among the [`SharedRead::replicas`] (as a reservation counts it), and
    /// its share of the room is recorded and returned (see [`Ledger::reserve`]) under `seq`,
    /// the replica's own number for this call (rising, like its block ids' `{n}`).
    pub async fn shared_read_as(
        &self,
        q: &QueueKeys,
        replica: &str,
        limit: u64,
        seq: u64,
        acked: u64,
    ) -> Result<SharedRead, LedgerError> {
        let mut call = self.scripts.shared_read.prepare_invoke();
        call.key(&q.all()[..])
            .arg(replica)
            .arg(millis(self.member_for()))
            .arg(millis(IDLE))
            .arg(exact(limit))
            .arg(exact(seq))
            .arg(exact(acked))
            .arg(q.hold_ms());
        let reply = self.run(&call).await?;
        decode_read(&ints(reply)?)
    }

    /// Atomic check-and-reserve. Expired blocks are pruned; then, with a good read that
    /// does not disable sends: `estimate = backlog + since_read + reserved`; at or past
    /// `limit` → `Full`; else grant `min(want, max(1, (limit − estimate) / share_divisor))`
    /// into block `block_id`, which then expires one `lease` from now (a block asked again
    /// grows and is extended). `want` and `share_divisor` count as at least 1. Block ids
    /// are `{replica}:{n}`: the part before the last `:` is counted among the fleet's
    /// [`SharedRead::replicas`] (an id without a `:` belongs to one anonymous replica), and
    /// `n`, rising with each of the replica's calls, numbers its share.
    ///
    /// Every answer records the replica's **share** and returns it
    /// ([`SharedRead::share`]): what it may admit alone should it turn local before it is
    /// heard from again, `⌊(limit − estimate − the others' shares) / (4 × replicas)⌋`. Every other
    /// replica's share counts in the estimate a reservation is checked against, so the
    /// blocks and the shares together never pass the ceiling, and the fleet stays under it
    /// however much of it is cut off from Redis (for [`Ledger::member_for`]). A replica
    /// forgotten (not heard from for that long) no longer counts in `replicas`, but its
    /// share is still counted for the others until the read the fleet reserves against was
    /// taken at least its hold (a send deadline and the admin plane's lag, as its own calls
    /// recorded it; `q`'s if longer) after its horizon: only such a read shows every send
    /// it may have stored alone.
    pub async fn reserve(
        &self,
        q: &QueueKeys,
        block_id: &str,
        want: u64,
        limit: u64,
        share_divisor: u64,
        lease: Duration,
    ) -> Result<Reservation, LedgerError> {
        self.reserve_acked(q, block_id, want, limit, share_divisor, lease, 0)
            .await
    }

    /// [`Ledger::reserve`] by a replica that last heard of its share numbered `acked` (0:
    /// none yet): the shares of its calls since, whose answers it may not have seen, are
    /// withheld from the others with the new one (the largest of them).
    // One parameter per script argument; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub async fn reserve_acked(
        &self,
        q: &QueueKeys,
        block_id: &str,
        want: u64,
        limit: u64,
        share_divisor: u64,
        lease: Duration,
        acked: u64,
    ) -> Result<Reservation, LedgerError> {
        let mut call = self.scripts.reserve.prepare_invoke();
        call.key(&q.all()[..])
            .arg(block_id)
            .arg(exact(want).max(1))
            .arg(exact(limit))
            .arg(millis(lease).max(1))
            .arg(exact(share_divisor).max(1))
            .arg(millis(IDLE))
            .arg(millis(self.member_for()))
            .arg(exact(acked))
            .arg(q.hold_ms());
        let reply = self.run(&call).await?;
        decode_reservation(&ints(reply)?)
    }

    /// Sends from block `block_id` finished: `stored` (stored or unknown outcome) move from
    /// the block's headroom to `since_read`/`completed_total`; `not_stored` just leave it.
    /// Only what the block still holds leaves `reserved` (an expired block already gave its
    /// headroom back); stored sends count on top of the read either way.
    pub async fn settle(
        &self,
        q: &QueueKeys,
        block_id: &str,
        stored: u64,
        not_stored: u64,
    ) -> Result<(), LedgerError> {
        self.settle_batch(q, &[Settle::new(block_id, stored, not_stored)])
            .await
    }

    /// [`Ledger::settle`] for several blocks in one atomic call (one round trip): a
    /// replica's outcomes of one settle period, whatever number of blocks they came from.
    /// An empty batch makes no call.
    pub async fn settle_batch(
        &self,
        q: &QueueKeys,
        batch: &[Settle<'_>],
    ) -> Result<(), LedgerError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut call = self.scripts.settle.prepare_invoke();
        call.key(&q.all()[..]).arg(millis(IDLE)).arg(q.lag_ms);
        for s in batch {
            call.arg(s.block_id)
                .arg(exact(s.stored))
                .arg(exact(s.not_stored));
        }
        let reply = self.run(&call).await?;
        expect_one(&reply)
    }

    /// Give back headroom block `block_id` will not use.
    pub async fn release(
        &self,
        q: &QueueKeys,
        block_id: &str,
        unused: u64,
    ) -> Result<(), LedgerError> {
        self.settle(q, block_id, 0, unused).await
    }

    /// Replica `replica` drained and leaves the fleet, in one atomic call: `batch` (what its
    /// sends left: outcomes, headroom unused) is settled as [`Ledger::settle_batch`] does,
    /// then it no longer counts in [`SharedRead::replicas`], its share is no longer withheld
    /// from the others, and the read lease, if it holds it (a read ahead on its way), is
    /// given back, so the others need not wait it out. Only for a replica that has nothing
    /// admitted alone outside `batch` (its share covered those sends) and admits nothing
    /// from the moment it asks to leave, neither through the fleet nor alone: once this call
    /// ran, its share is the others', and a send admitted alone on it would put the fleet
    /// over the ceiling (`FleetSeat` refuses every send once its goodbye began). A call of
    /// its still on its way when this one ran is ignored for a member horizon (it would
    /// count it in the fleet again).
    pub async fn leave(
        &self,
        q: &QueueKeys,
        replica: &str,
        batch: &[Settle<'_>],
    ) -> Result<(), LedgerError> {
        let mut call = self.scripts.leave.prepare_invoke();
        call.key(&q.all()[..])
            .arg(replica)
            .arg(millis(IDLE))
            .arg(q.lag_ms)
            .arg(millis(self.member_for()));
        for s in batch {
            call.arg(s.block_id)
                .arg(exact(s.stored))
                .arg(exact(s.not_stored));
        }
        let reply = self.run(&call).await?;
        expect_one(&reply)
    }

    pub(super) async fn run(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, LedgerError> {
        let mut conn = self.conn.get();
        self.within(self.timeout, call.invoke_async::<Value>(&mut conn))
            .await
    }

    /// Every call ends by its deadline, whatever the connection does; how it ended is
    /// recorded for the connection's health.
    async fn within<T>(
        &self,
        deadline: Duration,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LedgerError> {
        match answer_by(deadline, call).await {
            Ok(Ok(value)) => {
                self.conn.record(false);
                Ok(value)
            }
            Ok(Err(e)) => {
                self.conn.record(failed_on_the_connection(&e));
                let token = self.entra.as_ref().and_then(|c| c.cached_secret());
                Err(redis_error(&self.redact, token.as_deref(), e))
            }
            Err(_) => {
                self.conn.record(true);
                Err(LedgerError::Timeout)
            }
        }
    }
}

/// Plain commands for the runtime settings (`src/settings/store.rs`), on the ledger's
/// connection, deadline and redaction.
impl Ledger {
    /// A deployment-wide key under this deployment's prefix.
    pub fn deployment_key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// One command or pipeline, bounded by the call deadline.
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, LedgerError> {
        let mut conn = self.conn.get();
        self.within(self.timeout, pipe.query_async::<T>(&mut conn))
            .await
    }
}

/// `call`'s answer, or `Elapsed` once `deadline` has passed. When it passes, this process may
/// not have been running (a busy machine descheduled it): the reply can be in the socket,
/// waiting for the connection's own task to read it. The tasks that are ready run once
/// (that task among them) and the call is looked at again without waiting: a reply that
/// came in time is not a miss, and nothing waits longer than one turn of the scheduler
/// past the deadline.
async fn answer_by<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = T>,
) -> Result<T, tokio::time::error::Elapsed> {
    let mut call = std::pin::pin!(call);
    match tokio::time::timeout(deadline, &mut call).await {
        Ok(answer) => Ok(answer),
        Err(_) => {
            tokio::task::yield_now().await;
            tokio::time::timeout(Duration::ZERO, &mut call).await
        }
    }
}

/// An error Redis answered on a working connection (a script's error, WRONGTYPE) says
/// nothing against the connection; any other (refused, reset, timed out, AUTH refused while
/// connecting, LOADING while Redis restarts) does.
fn failed_on_the_connection(e: &redis::RedisError) -> bool {
    !matches!(e.kind(), redis::ErrorKind::Server(kind) if kind != redis::ServerErrorKind::BusyLoading)
}

/// `redact` (the URL, its password) and the Entra `token` in use are cut out of the text.
fn redis_error(redact: &[String], token: Option<&str>, e: redis::RedisError) -> LedgerError {
    if e.is_timeout() {
        return LedgerError::Timeout;
    }
    let mut text = e.to_string();
    let secrets = redact.iter().map(String::as_str).chain(token);
    for secret in secrets.filter(|s| !s.is_empty()) {
        text = text.replace(secret, "(redacted)");
    }
    LedgerError::Redis(text)
}

/// `{prefix}:{scope/queue}`: one hash tag, so one cluster slot for everything of the queue.
fn queue_base(prefix: &str, scope: &str, queue: &QueueName) -> String {
    format!("{prefix}:{{{scope}/{queue}}}")
}

/// The hash tag's scope of the fallback lane's keys (see [`Ledger::fallback_keys`]).
fn fallback_scope(primary: BackendKind, fallback: BackendKind) -> String {
    if fallback == primary {
        format!("fallback/{}", fallback.as_str())
    } else {
        fallback.as_str().to_owned()
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .min(MAX_EXACT)
}

pub(super) fn exact(n: u64) -> u64 {
    n.min(MAX_EXACT)
}

// ---- Replies. Scripts answer arrays of integers; anything else is `Unexpected`, never a
// panic: a changed script, a proxy or a foreign key must not take a replica down.

fn ints(reply: Value) -> Result<Vec<i64>, LedgerError> {
    match reply {
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::Int(n) => Ok(n),
                other => Err(LedgerError::Unexpected(format!(
                    "expected an integer, got {other:?}"
                ))),
            })
            .collect(),
        other => Err(LedgerError::Unexpected(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

fn count(n: i64, what: &str) -> Result<u64, LedgerError> {
    u64::try_from(n).map_err(|_| LedgerError::Unexpected(format!("{what} is negative ({n})")))
}

fn flag(n: i64, what: &str) -> Result<bool, LedgerError> {
    match n {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(LedgerError::Unexpected(format!(
            "{what} is {other}, not 0 or 1"
        ))),
    }
}

const READ_LEN: usize = 13;

fn decode_read(v: &[i64]) -> Result<SharedRead, LedgerError> {
    let [state, backlog, send_disabled, age_ms, streak, generation, since_read, reserved, reads_ok, reads_failed, replicas, share, share_seq] =
        <[i64; READ_LEN]>::try_from(v).map_err(|_| {
            LedgerError::Unexpected(format!(
                "a shared read has {READ_LEN} fields, got {}",
                v.len()
            ))
        })?;
    let state = match state {
        0 => SharedState::Never,
        1 => SharedState::Ok {
            backlog: count(backlog, "backlog")?,
            send_disabled: flag(send_disabled, "send_disabled")?,
        },
        2 => SharedState::Failed,
        other => {
            return Err(LedgerError::Unexpected(format!("unknown state {other}")));
        }
    };
    Ok(SharedRead {
        state,
        age: Duration::from_millis(count(age_ms, "age")?),
        streak: u32::try_from(count(streak, "streak")?).unwrap_or(u32::MAX),
        generation: count(generation, "generation")?,
        since_read: count(since_read, "since_read")?,
        reserved: count(reserved, "reserved")?,
        reads_ok: count(reads_ok, "reads_ok")?,
        reads_failed: count(reads_failed, "reads_failed")?,
        replicas: count(replicas, "replicas")?,
        share: count(share, "share")?,
        share_seq: count(share_seq, "share_seq")?,
    })
}

fn decode_reservation(v: &[i64]) -> Result<Reservation, LedgerError> {
    let [kind, n, rest @ ..] = v else {
        return Err(LedgerError::Unexpected(format!(
            "a reservation has {} fields, got {}",
            2 + READ_LEN,
            v.len()
        )));
    };
    let read = decode_read(rest)?;
    let n = count(*n, "reservation count")?;
    match kind {
        0 if n >= 1 => Ok(Reservation::Granted { granted: n, read }),
        0 => Err(LedgerError::Unexpected("a grant of 0".into())),
        1 => Ok(Reservation::Full { estimate: n, read }),
        2 => Ok(Reservation::Disabled { read }),
        3 => Ok(Reservation::Unknown { read }),
        other => Err(LedgerError::Unexpected(format!(
            "unknown reservation kind {other}"
        ))),
    }
}

fn decode_ticket(v: &[i64]) -> Result<Option<ReadTicket>, LedgerError> {
    match v {
        [0, _, _] => Ok(None),
        [1, completed, seq] => Ok(Some(ReadTicket {
            completed_at_start: count(*completed, "completed_total")?,
            seq: count(*seq, "ticket seq")?,
        })),
        other => Err(LedgerError::Unexpected(format!(
            "a lease answer is [0|1, completed, seq], got {other:?}"
        ))),
    }
}

fn expect_one(reply: &Value) -> Result<(), LedgerError> {
    match reply {
        Value::Int(1) => Ok(()),
        other => Err(LedgerError::Unexpected(format!(
            "expected 1, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_fields() -> Vec<i64> {
        vec![1, 40, 0, 1500, 0, 3, 2, 5, 3, 0, 2, 9, 4]
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_ready_when_the_deadline_fires_is_taken_not_called_late() {
        let deadline = Duration::from_millis(50);
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The connection's task: its reply is there at the deadline, but the task has not
        // run yet when the caller's timer fires (the caller's timer was armed first).
        let caller = tokio::spawn(answer_by(deadline, rx));
        tokio::task::yield_now().await; // the caller arms its timer
        tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            let _ = tx.send(7);
        });
        assert_eq!(caller.await.unwrap().map(Result::ok), Ok(Some(7)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_not_there_by_the_deadline_is_late() {
        let (_tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let started = tokio::time::Instant::now();
        assert!(answer_by(Duration::from_millis(50), rx).await.is_err());
        assert_eq!(started.elapsed(), Duration::from_millis(50));
    }

    #[test]
    fn keys_share_one_hash_tag_per_queue_and_backend() {
        let q = QueueName::parse("orders.eu-1").unwrap();
        let keys = QueueKeys::new("prod:sg", BackendKind::RabbitMq.as_str(), &q);
        assert_eq!(
            keys.all(),
            [
                "prod:sg:{rabbitmq/orders.eu-1}:read",
                "prod:sg:{rabbitmq/orders.eu-1}:lease",
                "prod:sg:{rabbitmq/orders.eu-1}:count",
                "prod:sg:{rabbitmq/orders.eu-1}:blocks",
                "prod:sg:{rabbitmq/orders.eu-1}:block_sizes",
                "prod:sg:{rabbitmq/orders.eu-1}:members",
                "prod:sg:{rabbitmq/orders.eu-1}:shares",
            ]
        );
        assert_ne!(
            keys,
            QueueKeys::new("prod:sg", BackendKind::ServiceBus.as_str(), &q)
        );
    }

    #[test]
    fn a_fallback_of_the_primarys_kind_has_keys_of_its_own_and_the_primary_keeps_its_names() {
        let q = QueueName::parse("orders").unwrap();
        let primary = QueueKeys::new("sg", BackendKind::RabbitMq.as_str(), &q);
        let same = QueueKeys::new(
            "sg",
            &fallback_scope(BackendKind::RabbitMq, BackendKind::RabbitMq),
            &q,
        );
        assert_eq!(primary.all()[0], "sg:{rabbitmq/orders}:read");
        assert_eq!(same.all()[0], "sg:{fallback/rabbitmq/orders}:read");
        assert!(same
            .all()
            .iter()
            .all(|k| k.starts_with("sg:{fallback/rabbitmq/orders}:")));
        assert!(primary.all().iter().all(|k| !same.all().contains(k)));
        // Of another kind, the fallback's queue keeps the names it always had.
        let other = QueueKeys::new(
            "sg",
            &fallback_scope(BackendKind::RabbitMq, BackendKind::ServiceBus),
            &q,
        );
        assert_eq!(other.all()[0], "sg:{servicebus/orders}:read");
    }

    #[test]
    fn the_one_hash_of_a_queue_is_the_base_the_old_keys_extend() {
        let q = QueueName::parse("orders").unwrap();
        for (scope, base) in [
            (
                BackendKind::RabbitMq.as_str().to_owned(),
                "sg:{rabbitmq/orders}",
            ),
            (
                fallback_scope(BackendKind::RabbitMq, BackendKind::RabbitMq),
                "sg:{fallback/rabbitmq/orders}",
            ),
            (
                fallback_scope(BackendKind::RabbitMq, BackendKind::ServiceBus),
                "sg:{servicebus/orders}",
            ),
        ] {
            assert_eq!(queue_base("sg", &scope, &q), base);
            let old = QueueKeys::new("sg", &scope, &q);
            assert!(old.all().iter().all(|k| k.starts_with(&format!("{base}:"))));
        }
    }

    #[test]
    fn a_well_formed_read_decodes() {
        let read = decode_read(&read_fields()).unwrap();
        assert_eq!(
            read,
            SharedRead {
                state: SharedState::Ok {
                    backlog: 40,
                    send_disabled: false
                },
                age: Duration::from_millis(1500),
                streak: 0,
                generation: 3,
                since_read: 2,
                reserved: 5,
                reads_ok: 3,
                reads_failed: 0,
                replicas: 2,
                share: 9,
                share_seq: 4,
            }
        );
    }

    #[test]
    fn malformed_replies_are_errors_never_panics() {
        let bad_values = [
            Value::Nil,
            Value::Okay,
            Value::Int(7),
            Value::SimpleString("PONG".into()),
            Value::Array(vec![Value::Int(1), Value::Nil]),
            Value::Array(vec![Value::BulkString(b"1".to_vec())]),
            Value::Array(vec![Value::Array(vec![])]),
        ];
        for v in bad_values {
            if let Ok(fields) = ints(v.clone()) {
                assert!(decode_read(&fields).is_err(), "{v:?}");
                assert!(decode_reservation(&fields).is_err(), "{v:?}");
                assert!(decode_ticket(&fields).is_err(), "{v:?}");
            }
            assert!(expect_one(&v).is_err(), "{v:?}");
        }
        let mut short = read_fields();
        short.pop();
        assert!(decode_read(&short).is_err());
        let mut long = read_fields();
        long.push(0);
        assert!(decode_read(&long).is_err());
        for (index, value) in [
            (0, 3),
            (0, -1),
            (1, -5),
            (2, 2),
            (3, -1),
            (7, -1),
            (10, -1),
            (11, -1),
            (12, -1),
        ] {
            let mut fields = read_fields();
            fields[index] = value;
            assert!(
                decode_read(&fields).is_err(),
                "field {index} = {value} accepted"
            );
        }
        let reservation = |kind: i64, n: i64| {
            let mut v = vec![kind, n];
            v.extend(read_fields());
            decode_reservation(&v)
        };
        assert!(reservation(0, 0).is_err(), "a grant of 0");
        assert!(reservation(0, -1).is_err());
        assert!(reservation(9, 1).is_err());
        assert!(decode_reservation(&[]).is_err());
        assert!(decode_reservation(&[0]).is_err());
        assert!(decode_ticket(&[2, 0, 0]).is_err());
        assert!(decode_ticket(&[1, -1, 1]).is_err());
        assert!(decode_ticket(&[1, 5]).is_err());
    }

    #[test]
    fn well_formed_reservations_and_tickets_decode() {
        let with = |kind: i64, n: i64| {
            let mut v = vec![kind, n];
            v.extend(read_fields());
            decode_reservation(&v).unwrap()
        };
        assert!(matches!(
            with(0, 4),
            Reservation::Granted { granted: 4, .. }
        ));
        assert!(matches!(
            with(1, 50),
            Reservation::Full { estimate: 50, .. }
        ));
        assert!(matches!(with(2, 0), Reservation::Disabled { .. }));
        assert!(matches!(with(3, 0), Reservation::Unknown { .. }));
        assert_eq!(decode_ticket(&[0, 0, 0]).unwrap(), None);
        assert_eq!(
            decode_ticket(&[1, 12, 4]).unwrap(),
            Some(ReadTicket {
                completed_at_start: 12,
                seq: 4
            })
        );
    }

    #[test]
    fn a_huge_streak_saturates_rather_than_fails() {
        let mut fields = read_fields();
        fields[4] = i64::from(u32::MAX) + 10;
        assert_eq!(decode_read(&fields).unwrap().streak, u32::MAX);
    }

    #[test]
    fn errors_never_carry_the_url_or_password() {
        let redact = [
            "redis://u:hunter2@host:6379".to_owned(),
            "hunter2".to_owned(),
        ];
        let e = redis::RedisError::from((
            redis::ErrorKind::Io,
            "connect failed",
            "redis://u:hunter2@host:6379 said hunter2".to_owned(),
        ));
        let text = redis_error(&redact, None, e).to_string();
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn errors_never_carry_the_entra_token_in_use() {
        let e = redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "AUTH refused",
            "for eyJ0eXAi.tok3n.sig".to_owned(),
        ));
        let text = redis_error(&[], Some("eyJ0eXAi.tok3n.sig"), e).to_string();
        assert!(!text.contains("tok3n"), "{text}");
        assert!(text.contains("(redacted)"), "{text}");
    }
}
