//! The embedded queue's storage: one SQLite database in WAL mode.
//!
//! SQLite is used because several processes must share the queue at once: the server
//! writes while `sendgate queue receive` takes messages off in another process. WAL mode
//! lets readers run beside the writer, and `synchronous=FULL` makes a commit durable
//! before the gateway answers 2xx (the writer batches many sends into one commit, so
//! this costs one fsync per batch, not per message).
//!
//! Depth is kept in its own table by triggers, so reading it is one row lookup however
//! long the queue is.
//!
//! Every write transaction is `IMMEDIATE`: it takes the write lock when it begins, so a
//! writer that finds the lock taken waits in SQLite's busy handler. A deferred
//! transaction that reads first and writes later cannot wait: once it holds a read
//! snapshot SQLite answers `SQLITE_BUSY` at once, and the send would fail beside a worker.
//!
//! Receiving claims messages with a lease, in one transaction: a claimed message is
//! invisible to other receivers until its lease ends (`locked_until_ms`), so two workers
//! never get the same message. Receive-and-delete deletes what it handed out; peek-lock
//! hands out a lock token and leaves the delete to `complete`. A lease that ends without
//! a delete makes the message deliverable again, its `delivery_count` one higher.
//!
//! Scheduling and expiry follow Service Bus. A message is stored at once but receivable
//! only from `visible_at_ms` (its scheduled enqueue time, or the time it was stored), and
//! is ordered among the others by that time, as Service Bus appends a scheduled message
//! to the queue when it becomes active. Meanwhile it counts in the depth, as Service Bus
//! counts scheduled messages in what the gateway reads. A message with a time to live
//! expires at `visible_at_ms` + TTL (`expires_at_ms`; Service Bus counts the TTL from the
//! enqueued time, which for a scheduled message is when it becomes active): from then on
//! it is never delivered, and it is deleted at the next depth read or receive of its
//! queue, so the depth triggers take it off the count (a mass expiry: a chunk per read,
//! see [`PURGE_CHUNK`]). One that expires while leased is
//! kept until its lease ends, so its holder can still complete it (a lock is not taken
//! away by expiry, as in Service Bus).
//!
//! Every attribute travels with its message: `attributes` holds them as JSON in the
//! form of a batch entry ([`MessageAttributes`]), `trace_properties` the properties the
//! gateway adds (`traceparent`, `tracestate`, `Diagnostic-Id`) as a JSON object.
//!
//! The time comes from the store's [`Clock`], so tests move it instead of sleeping.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row, Transaction, TransactionBehavior};
use sendgate_wire::MessageAttributes;

/// Service Bus's default duplicate-detection window, which the embedded queue copies:
/// a second message with the same id inside it is acknowledged but not stored again.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(600);

/// The tables every version starts from (schema version 0); [`MIGRATIONS`] brings them
/// up to date, on a new database as on an old one.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS messages (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    queue          TEXT    NOT NULL,
    message_id     TEXT    NOT NULL,
    correlation_id TEXT,
    body           BLOB    NOT NULL,
    enqueued_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS depth (
    queue TEXT PRIMARY KEY,
    n     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS messages_counted AFTER INSERT ON messages BEGIN
    INSERT INTO depth (queue, n) VALUES (NEW.queue, 1)
        ON CONFLICT (queue) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS messages_uncounted AFTER DELETE ON messages BEGIN
    UPDATE depth SET n = n - 1 WHERE queue = OLD.queue;
END;
CREATE TABLE IF NOT EXISTS seen_ids (
    queue      TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    seen_at_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS seen_ids_by_age ON seen_ids (seen_at_ms);
";

/// One schema change: the column (of `table`) that shows it was made, and the statements
/// that make it.
struct Migration {
    table: &'static str,
    marker_column: &'static str,
    statements: &'static [&'static str],
}

/// In order: the schema version is how many of them a database has.
const MIGRATIONS: &[Migration] = &[
    // Version 1: leases.
    Migration {
        table: "messages",
        marker_column: "lock_token",
        statements: &[
            "ALTER TABLE messages ADD COLUMN locked_until_ms INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE messages ADD COLUMN lock_token TEXT",
            "ALTER TABLE messages ADD COLUMN delivery_count INTEGER NOT NULL DEFAULT 0",
            "CREATE INDEX IF NOT EXISTS messages_by_lock_token ON messages (lock_token)",
        ],
    },
    // Version 2: attributes, scheduling and expiry. A message stored before has none of them: no
    // attributes, no expiry, and visible since time 0, which also keeps it ahead of every
    // newer message (adding a column with a constant default rewrites no row).
    // `messages_by_queue (queue, seq)` gives way to the order receives now take.
    Migration {
        table: "messages",
        marker_column: "visible_at_ms",
        statements: &[
            "ALTER TABLE messages ADD COLUMN attributes TEXT",
            "ALTER TABLE messages ADD COLUMN trace_properties TEXT",
            "ALTER TABLE messages ADD COLUMN visible_at_ms INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE messages ADD COLUMN expires_at_ms INTEGER",
            "CREATE INDEX IF NOT EXISTS messages_by_visibility
                 ON messages (queue, visible_at_ms, seq)",
            "CREATE INDEX IF NOT EXISTS messages_by_expiry ON messages (queue, expires_at_ms)
                 WHERE expires_at_ms IS NOT NULL",
            "DROP INDEX IF EXISTS messages_by_queue",
        ],
    },
    // Version 3: the digest of what was sent under an id, so the same id with another body
    // or other attributes is told apart from a retry. An id remembered before has none: it
    // is a duplicate whatever comes with it, as before.
    Migration {
        table: "seen_ids",
        marker_column: "digest",
        statements: &["ALTER TABLE seen_ids ADD COLUMN digest BLOB"],
    },
];

/// The schema version (`user_version`) a database has once [`MIGRATIONS`] ran: one per
/// migration.
const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long receive-and-delete keeps its claim while it writes the messages out. A
/// receiver that dies meanwhile loses nothing: the messages come back after this.
pub const RECEIVE_AND_DELETE_LEASE: Duration = Duration::from_secs(30);

/// The longest lease `receive --lock-s` takes (Service Bus allows 5 minutes).
pub const MAX_LEASE: Duration = Duration::from_secs(300);

/// Where the store reads the time, in Unix milliseconds.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system's wall clock: scheduled times and expiries are wall-clock times.
pub fn system_clock() -> Clock {
    Arc::new(|| unix_ms(SystemTime::now()))
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("embedded queue database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot write a received message out: {0}")]
    Output(#[from] std::io::Error),
}

/// A message as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    pub seq: i64,
    pub queue: String,
    pub message_id: String,
    pub correlation_id: Option<String>,
    pub body: Vec<u8>,
    pub enqueued_at_ms: i64,
    /// How many times it has been handed out, this time included.
    pub delivery_count: u32,
    /// Subject, session, TTL, schedule, addresses and the caller's properties, as sent
    /// (empty for a message stored before attributes were kept).
    pub attributes: MessageAttributes,
    /// The properties the gateway added: `traceparent`, `tracestate`, `Diagnostic-Id`.
    pub trace_properties: BTreeMap<String, String>,
    /// Receivable from then on.
    pub visible_at_ms: i64,
    /// Never delivered from then on; `None`: never expires.
    pub expires_at_ms: Option<i64>,
}

/// A message claimed by a receiver until `locked_until_ms`; `lock_token` completes it.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedMessage {
    pub message: StoredMessage,
    pub lock_token: String,
    pub locked_until_ms: i64,
}

/// A message to store, borrowed from the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct NewMessage<'a> {
    pub queue: &'a str,
    pub message_id: &'a str,
    pub correlation_id: Option<&'a str>,
    pub body: &'a [u8],
    /// [`encode_attributes`]' text; `None` without attributes.
    pub attributes: Option<&'a str>,
    /// [`encode_trace_properties`]' text.
    pub trace_properties: Option<&'a str>,
    /// Not receivable before (Unix ms); a time already past means now.
    pub scheduled_at_ms: Option<i64>,
    /// Expires this long after it becomes receivable.
    pub time_to_live_ms: Option<i64>,
}

/// What became of one message of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored.
    New,
    /// Its id was stored inside the window with the same body and attributes: a retry,
    /// acknowledged and not stored again.
    Duplicate,
    /// Its id was stored inside the window with another body or other attributes: not
    /// stored, and refused (Stripe's rule for a key reused with other parameters).
    KeyReused,
}

/// SHA-256 of what a message's id stands for: its body and its attributes (not the trace
/// properties, which each attempt makes anew).
fn digest(m: &NewMessage<'_>) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update((m.body.len() as u64).to_le_bytes());
    hash.update(m.body);
    hash.update(m.attributes.unwrap_or("").as_bytes());
    hash.finalize().to_vec()
}

/// The attributes as the `attributes` column holds them; `None` when there are none.
pub fn encode_attributes(attributes: &MessageAttributes) -> Option<String> {
    if attributes.is_empty() {
        return None;
    }
    // A struct of strings, integers and JSON values: serialising it cannot fail.
    serde_json::to_string(attributes).ok()
}

/// The gateway's properties as the `trace_properties` column holds them.
pub fn encode_trace_properties<'a>(
    properties: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    let map: BTreeMap<&str, &str> = properties.into_iter().collect();
    if map.is_empty() {
        return None;
    }
    serde_json::to_string(&map).ok()
}

pub fn database_path(data_dir: &Path) -> PathBuf {
    data_dir.join("embedded.sqlite3")
}

/// The columns [`stored_message`] reads, in its order.
const MESSAGE_COLUMNS: &str = "seq, queue, message_id, correlation_id, body, enqueued_at_ms,
    delivery_count, attributes, trace_properties, visible_at_ms, expires_at_ms";

fn stored_message(r: &Row<'_>) -> rusqlite::Result<StoredMessage> {
    Ok(StoredMessage {
        seq: r.get(0)?,
        queue: r.get(1)?,
        message_id: r.get(2)?,
        correlation_id: r.get(3)?,
        body: r.get(4)?,
        enqueued_at_ms: r.get(5)?,
        delivery_count: r.get(6)?,
        attributes: json_column(r, 7)?.unwrap_or_default(),
        trace_properties: json_column(r, 8)?.unwrap_or_default(),
        visible_at_ms: r.get(9)?,
        expires_at_ms: r.get(10)?,
    })
}

/// A JSON text column, `None` when NULL.
fn json_column<T: serde::de::DeserializeOwned>(
    r: &Row<'_>,
    index: usize,
) -> rusqlite::Result<Option<T>> {
    let Some(text) = r.get::<_, Option<String>>(index)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(e)))
}

pub struct Store {
    conn: Connection,
    clock: Clock,
    /// [`PURGE_CHUNK`]; smaller in tests.
    purge_chunk: i64,
}

impl Store {
    /// Open (creating when missing) the queue database under `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_clock(data_dir, system_clock())
    }

    /// [`open`](Self::open), reading the time from `clock`.
    pub fn open_with_clock(data_dir: &Path, clock: Clock) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            path: data_dir.to_owned(),
            source,
        })?;
        let conn = Connection::open(database_path(data_dir))?;
        // Another process (a receiver) may hold the write lock briefly.
        conn.busy_timeout(BUSY_TIMEOUT)?;
        enable_wal(&conn)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        bound_the_log(&conn)?;
        conn.execute_batch(SCHEMA)?;
        migrate(&conn)?;
        Ok(Self {
            conn,
            clock,
            purge_chunk: PURGE_CHUNK,
        })
    }

    /// The store's time now (Unix ms).
    pub fn now_ms(&self) -> i64 {
        (self.clock)()
    }

    /// A write transaction that holds the write lock from its start (see the module doc).
    fn write(&mut self) -> Result<Transaction<'_>, StoreError> {
        Ok(self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?)
    }

    /// Store a batch in one transaction (all of it or, on an error, none); one result per
    /// message: an id already stored inside the window (by an earlier message of the same
    /// batch too) is not stored again, a [`Stored::Duplicate`] when it came with the same
    /// body and attributes, else [`Stored::KeyReused`].
    pub fn insert_batch(&mut self, batch: &[NewMessage<'_>]) -> Result<Vec<Stored>, StoreError> {
        let now_ms = self.now_ms();
        let window_start = now_ms - DUPLICATE_WINDOW.as_millis() as i64;
        let tx = self.write()?;
        let mut results = Vec::with_capacity(batch.len());
        {
            let mut seen = tx.prepare_cached(
                "SELECT seen_at_ms, digest FROM seen_ids WHERE queue = ?1 AND message_id = ?2",
            )?;
            let mut remember = tx.prepare_cached(
                "INSERT INTO seen_ids (queue, message_id, seen_at_ms, digest) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (queue, message_id)
                 DO UPDATE SET seen_at_ms = excluded.seen_at_ms, digest = excluded.digest",
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO messages (queue, message_id, correlation_id, body, enqueued_at_ms,
                                       attributes, trace_properties, visible_at_ms, expires_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            for m in batch {
                let digest = digest(m);
                let seen: Option<(i64, Option<Vec<u8>>)> = seen
                    .query_row(params![m.queue, m.message_id], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()?;
                if let Some((_, was)) = seen.filter(|(at, _)| *at >= window_start) {
                    results.push(match was {
                        Some(was) if was != digest => Stored::KeyReused,
                        _ => Stored::Duplicate,
                    });
                    continue;
                }
                // A time already past schedules nothing: the message is enqueued now.
                let visible_at_ms = m.scheduled_at_ms.map_or(now_ms, |at| at.max(now_ms));
                let expires_at_ms = m
                    .time_to_live_ms
                    .map(|ttl| visible_at_ms.saturating_add(ttl));
                remember.execute(params![m.queue, m.message_id, now_ms, digest])?;
                insert.execute(params![
                    m.queue,
                    m.message_id,
                    m.correlation_id,
                    m.body,
                    now_ms,
                    m.attributes,
                    m.trace_properties,
                    visible_at_ms,
                    expires_at_ms,
                ])?;
                results.push(Stored::New);
            }
        }
        tx.commit()?;
        Ok(results)
    }

    /// Forget message ids older than the duplicate window.
    pub fn prune_seen_ids(&mut self) -> Result<usize, StoreError> {
        let window_start = self.now_ms() - DUPLICATE_WINDOW.as_millis() as i64;
        let tx = self.write()?;
        let pruned = tx.execute("DELETE FROM seen_ids WHERE seen_at_ms < ?1", [window_start])?;
        tx.commit()?;
        Ok(pruned)
    }

    /// Messages stored in `queue` and not yet received, scheduled ones included, expired
    /// ones not. Cheap, as the admission path needs: the depth row, and one index probe
    /// for expired messages (deleted first when there are any, so each is deleted once).
    /// When more than [`PURGE_CHUNK`] expired at once, the rest still counts until later
    /// reads have deleted it: the depth is then too high for a while, never too low.
    pub fn depth(&self, queue: &str) -> Result<u64, StoreError> {
        let now_ms = self.now_ms();
        if any_expired(&self.conn, queue, now_ms)? {
            // `&self`: the reader behind a shared lock purges too. IMMEDIATE, as every
            // write here (see the module doc).
            let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Immediate)?;
            purge_expired(&tx, queue, now_ms, self.purge_chunk)?;
            tx.commit()?;
        }
        let n: Option<i64> = self
            .conn
            .prepare_cached("SELECT n FROM depth WHERE queue = ?1")?
            .query_row([queue], |r| r.get(0))
            .optional()?;
        Ok(n.unwrap_or(0).max(0) as u64)
    }

    /// Take up to `max` messages off `queue`, oldest first (receive-and-delete). They are
    /// claimed first, so no other receiver gets them; each is handed to `deliver`, and what
    /// was handed out is deleted. A receiver that fails or dies half-way loses nothing
    /// (at-least-once): what it did not hand out is released at once, what it did not
    /// delete comes back when the claim ends. No lock is held while `deliver` writes out:
    /// a slow reader on the other end of a pipe never stalls the gateway's writer.
    pub fn receive(
        &mut self,
        queue: &str,
        max: usize,
        mut deliver: impl FnMut(&StoredMessage) -> std::io::Result<()>,
    ) -> Result<usize, StoreError> {
        let claimed = self.lease(queue, max, RECEIVE_AND_DELETE_LEASE)?;
        let mut delivered = Vec::with_capacity(claimed.len());
        let mut failure = None;
        for leased in &claimed {
            if let Err(e) = deliver(&leased.message) {
                failure = Some(e);
                break;
            }
            delivered.push(leased.lock_token.as_str());
        }
        let undelivered: Vec<&str> = claimed[delivered.len()..]
            .iter()
            .map(|l| l.lock_token.as_str())
            .collect();
        // Delete what was handed out, even when a later delivery failed.
        self.complete(queue, &delivered)?;
        self.release(&undelivered)?;
        match failure {
            Some(e) => Err(StoreError::Output(e)),
            None => Ok(delivered.len()),
        }
    }

    /// Claim up to `max` deliverable messages of `queue` until now + `lease`, each with a
    /// lock token of its own: receivable (`visible_at_ms` reached), not expired, not
    /// leased; in the order they became receivable. Expired ones are deleted first.
    pub fn lease(
        &mut self,
        queue: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<LeasedMessage>, StoreError> {
        let now_ms = self.now_ms();
        let locked_until_ms = now_ms.saturating_add(lease.min(MAX_LEASE).as_millis() as i64);
        let max = max.min(i64::MAX as usize) as i64;
        let purge_chunk = self.purge_chunk;
        let tx = self.write()?;
        // What is left beyond the chunk is skipped by the claim below all the same.
        purge_expired(&tx, queue, now_ms, purge_chunk)?;
        let seqs: Vec<i64> = tx
            .prepare_cached(NEXT_RECEIVABLE)?
            .query_map(params![queue, now_ms, max], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut claimed = Vec::with_capacity(seqs.len());
        {
            let mut claim = tx.prepare_cached(&format!(
                "UPDATE messages SET locked_until_ms = ?2, lock_token = ?3,
                        delivery_count = delivery_count + 1
                 WHERE seq = ?1
                 RETURNING {MESSAGE_COLUMNS}"
            ))?;
            for seq in seqs {
                let lock_token = uuid::Uuid::new_v4().to_string();
                let message =
                    claim.query_row(params![seq, locked_until_ms, lock_token], stored_message)?;
                claimed.push(LeasedMessage {
                    message,
                    lock_token,
                    locked_until_ms,
                });
            }
        }
        tx.commit()?;
        Ok(claimed)
    }

    /// Delete the messages of `queue` these lock tokens claim; per token, `false` when its
    /// lease had already ended (the message may have gone to another receiver) or it is
    /// unknown in `queue`.
    pub fn complete(&mut self, queue: &str, lock_tokens: &[&str]) -> Result<Vec<bool>, StoreError> {
        if lock_tokens.is_empty() {
            return Ok(Vec::new());
        }
        let now_ms = self.now_ms();
        let tx = self.write()?;
        let mut done = Vec::with_capacity(lock_tokens.len());
        {
            let mut delete = tx.prepare_cached(
                "DELETE FROM messages
                 WHERE lock_token = ?1 AND locked_until_ms > ?2 AND queue = ?3",
            )?;
            for token in lock_tokens {
                done.push(delete.execute(params![token, now_ms, queue])? > 0);
            }
        }
        tx.commit()?;
        Ok(done)
    }

    /// Give claimed messages back at once, as if never handed out.
    fn release(&mut self, lock_tokens: &[&str]) -> Result<(), StoreError> {
        if lock_tokens.is_empty() {
            return Ok(());
        }
        let tx = self.write()?;
        {
            let mut release = tx.prepare_cached(
                "UPDATE messages SET locked_until_ms = 0, lock_token = NULL,
                        delivery_count = delivery_count - 1
                 WHERE lock_token = ?1",
            )?;
            for token in lock_tokens {
                release.execute([token])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// The next `?3` messages of queue `?1` a receiver may claim at `?2`, in the order they
/// became receivable (the order of `messages_by_visibility`: no sort).
const NEXT_RECEIVABLE: &str = "SELECT seq FROM messages
    WHERE queue = ?1 AND visible_at_ms <= ?2 AND locked_until_ms <= ?2
      AND (expires_at_ms IS NULL OR expires_at_ms > ?2)
    ORDER BY visible_at_ms, seq LIMIT ?3";

/// Most expired messages one depth read or receive deletes. Deleting costs per row (the
/// depth trigger runs for each), and a depth read is on the admission path under a
/// deadline: when a mass of messages expires at once (a burst sent with one TTL), each
/// read deletes a chunk (50 to 70 ms in a debug build, measured) instead of one read
/// deleting them all past its deadline (a million: seconds).
const PURGE_CHUNK: i64 = 10_000;

/// The messages of a queue that have expired and that no receiver holds: those a purge
/// deletes. (A leased one stays until its lease ends, so its holder can complete it.)
const EXPIRED: &str = "queue = ?1 AND expires_at_ms <= ?2 AND locked_until_ms <= ?2";

/// Whether `queue` has an expired message to delete: one probe of `messages_by_expiry`.
fn any_expired(conn: &Connection, queue: &str, now_ms: i64) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(&format!("SELECT 1 FROM messages WHERE {EXPIRED} LIMIT 1"))?
        .exists(params![queue, now_ms])?)
}

/// Delete up to `chunk` of `queue`'s expired messages (the depth trigger uncounts each).
fn purge_expired(
    tx: &Transaction<'_>,
    queue: &str,
    now_ms: i64,
    chunk: i64,
) -> Result<usize, StoreError> {
    Ok(tx
        .prepare_cached(&format!(
            "DELETE FROM messages WHERE seq IN (SELECT seq FROM messages WHERE {EXPIRED} LIMIT ?3)"
        ))?
        .execute(params![queue, now_ms, chunk])?)
}

/// How long a statement waits for another process's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Switch to WAL. On a new database the switch takes an exclusive lock without waiting in
/// the busy handler, so two processes opening a fresh data directory at once (the gateway
/// and `sendgate queue`) would get "database is locked": retry for the busy timeout.
fn enable_wal(conn: &Connection) -> Result<(), StoreError> {
    let give_up = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(e) if is_busy(&e) && std::time::Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(5));
            }
            done => return Ok(done?),
        }
    }
}

/// Pages written to the write-ahead log before a commit checkpoints it into the database
/// (SQLite's default is 1,000: ~4 MiB, which a small disk ran out of for ~0.5 MiB of bodies).
const WAL_AUTOCHECKPOINT_PAGES: i64 = 128;
/// What the log is truncated to once checkpointed: a large batch may grow it past
/// [`WAL_AUTOCHECKPOINT_PAGES`], and the room is given back after it.
const WAL_SIZE_LIMIT_BYTES: i64 = 1024 * 1024;

/// Checkpoint the log sooner and truncate it after, so it holds ~0.5 MiB, not ~4 MiB.
fn bound_the_log(conn: &Connection) -> Result<(), StoreError> {
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)?;
    Ok(())
}

impl StoreError {
    /// The disk (or the filesystem's quota) has no room: nothing was stored, and room may
    /// come back. SQLite answers `SQLITE_FULL` for a write that met `ENOSPC`, and
    /// `SQLITE_IOERR_SHMSIZE` when the log's index cannot grow.
    pub fn is_disk_full(&self) -> bool {
        let Self::Sqlite(rusqlite::Error::SqliteFailure(e, _)) = self else {
            return false;
        };
        e.code == rusqlite::ErrorCode::DiskFull
            || e.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Bring a database made by an older sendgate up to the current schema, in one
/// transaction (a failure leaves it as it was).
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version >= SCHEMA_VERSION {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let migrated = (|| {
        for migration in MIGRATIONS {
            // Another process may have migrated while this one waited for the lock: each
            // change is made only where its column is missing.
            let made = conn
                .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
                .exists([migration.table, migration.marker_column])?;
            if !made {
                for statement in migration.statements {
                    conn.execute_batch(statement)?;
                }
            }
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
    })();
    match migrated {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e.into());
        }
    }
    Ok(())
}

pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;

    /// The schema as sendgate made it before leases (version 0), word for word.
    const V0_DDL: &str = "
    CREATE TABLE IF NOT EXISTS messages (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        queue          TEXT    NOT NULL,
        message_id     TEXT    NOT NULL,
        correlation_id TEXT,
        body           BLOB    NOT NULL,
        enqueued_at_ms INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS messages_by_queue ON messages (queue, seq);
    CREATE TABLE IF NOT EXISTS depth (
        queue TEXT PRIMARY KEY,
        n     INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TRIGGER IF NOT EXISTS messages_counted AFTER INSERT ON messages BEGIN
        INSERT INTO depth (queue, n) VALUES (NEW.queue, 1)
            ON CONFLICT (queue) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER IF NOT EXISTS messages_uncounted AFTER DELETE ON messages BEGIN
        UPDATE depth SET n = n - 1 WHERE queue = OLD.queue;
    END;
    CREATE TABLE IF NOT EXISTS seen_ids (
        queue      TEXT    NOT NULL,
        message_id TEXT    NOT NULL,
        seen_at_ms INTEGER NOT NULL,
        PRIMARY KEY (queue, message_id)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS seen_ids_by_age ON seen_ids (seen_at_ms);
    ";

    /// What sendgate added for leases (version 1), word for word.
    const V1_DDL: &str = "
    ALTER TABLE messages ADD COLUMN locked_until_ms INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE messages ADD COLUMN lock_token TEXT;
    ALTER TABLE messages ADD COLUMN delivery_count INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX IF NOT EXISTS messages_by_lock_token ON messages (lock_token);
    PRAGMA user_version = 1;
    ";

    /// A clock the test sets; every store opened on it reads it.
    #[derive(Clone, Default)]
    struct TestClock(Arc<AtomicI64>);

    impl TestClock {
        fn at(ms: i64) -> Self {
            let clock = Self::default();
            clock.set(ms);
            clock
        }

        fn set(&self, ms: i64) {
            self.0.store(ms, Ordering::SeqCst);
        }

        fn clock(&self) -> Clock {
            let now = self.0.clone();
            Arc::new(move || now.load(Ordering::SeqCst))
        }
    }

    fn open(dir: &Path, clock: &TestClock) -> Store {
        Store::open_with_clock(dir, clock.clock()).unwrap()
    }

    fn msg<'a>(id: &'a str, body: &'a [u8]) -> NewMessage<'a> {
        NewMessage {
            queue: "q",
            message_id: id,
            body,
            ..NewMessage::default()
        }
    }

    fn scheduled<'a>(id: &'a str, at_ms: i64) -> NewMessage<'a> {
        NewMessage {
            scheduled_at_ms: Some(at_ms),
            ..msg(id, b"{}")
        }
    }

    fn expiring<'a>(id: &'a str, ttl_ms: i64) -> NewMessage<'a> {
        NewMessage {
            time_to_live_ms: Some(ttl_ms),
            ..msg(id, b"{}")
        }
    }

    fn lease(store: &mut Store, max: usize, lease_ms: u64) -> Vec<LeasedMessage> {
        store
            .lease("q", max, Duration::from_millis(lease_ms))
            .unwrap()
    }

    fn ids(leased: &[LeasedMessage]) -> Vec<&str> {
        leased
            .iter()
            .map(|l| l.message.message_id.as_str())
            .collect()
    }

    /// Rows of `q` on disk, whatever the depth table says.
    fn rows(store: &Store) -> i64 {
        store
            .conn
            .query_row("SELECT count(*) FROM messages WHERE queue = 'q'", [], |r| {
                r.get(0)
            })
            .unwrap()
    }

    #[test]
    fn stores_counts_and_receives_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), &TestClock::at(1_000));
        let dups = store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2"), msg("c", b"3")])
            .unwrap();
        assert_eq!(dups, vec![Stored::New; 3]);
        assert_eq!(store.depth("q").unwrap(), 3);
        assert_eq!(store.depth("other").unwrap(), 0);
        let mut got = Vec::new();
        store
            .receive("q", 2, |m| {
                got.push(m.body.clone());
                Ok(())
            })
            .unwrap();
        assert_eq!(got, vec![b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    #[test]
    fn duplicates_inside_the_window_are_not_stored_again() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        assert_eq!(
            store
                .insert_batch(&[msg("k", b"1"), msg("k", b"1")])
                .unwrap(),
            vec![Stored::New, Stored::Duplicate]
        );
        clock.set(2_000);
        assert_eq!(
            store.insert_batch(&[msg("k", b"1")]).unwrap(),
            vec![Stored::Duplicate]
        );
        assert_eq!(store.depth("q").unwrap(), 1);
        clock.set(2_000 + DUPLICATE_WINDOW.as_millis() as i64 + 1);
        assert_eq!(
            store.insert_batch(&[msg("k", b"1")]).unwrap(),
            vec![Stored::New]
        );
        assert_eq!(store.depth("q").unwrap(), 2);
    }

    #[test]
    fn an_id_reused_with_another_body_or_other_attributes_is_told_apart_from_a_retry() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        let attributed = |body: &'static [u8], attributes: &'static str| NewMessage {
            attributes: Some(attributes),
            ..msg("k", body)
        };
        assert_eq!(
            store
                .insert_batch(&[msg("k", b"1"), msg("k", b"2")])
                .unwrap(),
            vec![Stored::New, Stored::KeyReused],
            "within one batch too"
        );
        clock.set(2_000);
        assert_eq!(
            store
                .insert_batch(&[msg("k", b"1"), msg("k", b"12"), attributed(b"1", "{}")])
                .unwrap(),
            vec![Stored::Duplicate, Stored::KeyReused, Stored::KeyReused]
        );
        assert_eq!(store.depth("q").unwrap(), 1, "nothing reused was stored");
        // Past the window the id is free again, with any body.
        clock.set(2_000 + DUPLICATE_WINDOW.as_millis() as i64 + 1);
        assert_eq!(
            store.insert_batch(&[msg("k", b"2")]).unwrap(),
            vec![Stored::New]
        );
    }

    #[test]
    fn pruning_forgets_only_ids_older_than_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        let window = DUPLICATE_WINDOW.as_millis() as i64;
        store.insert_batch(&[msg("old", b"1")]).unwrap();
        clock.set(5_000);
        store.insert_batch(&[msg("new", b"2")]).unwrap();
        // At 1_000 + window + 1 only "old" is out of the window.
        clock.set(1_000 + window + 1);
        assert_eq!(store.prune_seen_ids().unwrap(), 1);
        assert_eq!(store.prune_seen_ids().unwrap(), 0, "already gone");
        let seen: Vec<String> = store
            .conn
            .prepare("SELECT message_id FROM seen_ids ORDER BY message_id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(seen, ["new"], "the recent id is still remembered");
    }

    #[test]
    fn a_receiver_that_fails_half_way_keeps_what_it_did_not_hand_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), &TestClock::at(1));
        store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2"), msg("c", b"3")])
            .unwrap();
        let mut handed = 0;
        let result = store.receive("q", 10, |_| {
            handed += 1;
            if handed == 2 {
                Err(std::io::Error::other("pipe closed"))
            } else {
                Ok(())
            }
        });
        assert!(result.is_err());
        assert_eq!(
            store.depth("q").unwrap(),
            2,
            "only the one handed out is gone"
        );
        // What was not handed out is released at once, not after the 30 s claim, with its
        // delivery not counted.
        let next = lease(&mut store, 10, 1_000);
        assert_eq!(ids(&next), ["b", "c"]);
        assert!(next.iter().all(|l| l.message.delivery_count == 1));
    }

    /// 600 sends of 1 KiB, a commit each: the write-ahead log once reached ~4 MiB for them
    /// (checkpointed every 1,000 pages, never truncated), taking a small disk's room.
    #[test]
    fn the_write_ahead_log_stays_small_however_many_commits() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let wal = PathBuf::from(format!("{}-wal", database_path(dir.path()).display()));
        let body = vec![b'x'; 1024];
        let mut largest = 0;
        for i in 0..600 {
            let id = format!("m-{i}");
            store.insert_batch(&[msg(&id, &body)]).unwrap();
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        eprintln!("largest write-ahead log: {largest} bytes");
        assert!(largest <= 1024 * 1024, "the log grew to {largest} bytes");
    }

    #[test]
    fn the_database_is_in_wal_mode_so_readers_run_beside_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mode: String = store
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn a_slow_receiver_does_not_hold_the_write_lock() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1);
        let mut store = open(dir.path(), &clock);
        let mut writer = open(dir.path(), &clock);
        store.insert_batch(&[msg("a", b"1")]).unwrap();
        store
            .receive("q", 1, |_| {
                // While the receiver is still writing its output, the writer commits.
                writer.conn.busy_timeout(Duration::from_millis(1)).unwrap();
                writer
                    .insert_batch(&[msg("b", b"2")])
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            })
            .unwrap();
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    #[test]
    fn a_leased_message_is_hidden_from_other_receivers_until_its_lease_ends() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1);
        let mut store = open(dir.path(), &clock);
        let mut other = open(dir.path(), &clock);
        store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2")])
            .unwrap();
        clock.set(10);
        let first = lease(&mut store, 1, 1_000);
        assert_eq!(ids(&first), ["a"]);
        assert_eq!(first[0].message.delivery_count, 1);
        assert_eq!(first[0].locked_until_ms, 1_010);
        clock.set(20);
        let second = lease(&mut other, 10, 1_000);
        assert_eq!(
            ids(&second),
            ["b"],
            "the other receiver only gets what is not leased"
        );
        assert_eq!(store.depth("q").unwrap(), 2, "leased messages still count");

        // The lease ends without a complete: deliverable again, one delivery more.
        clock.set(1_010);
        let again = lease(&mut other, 10, 1_000);
        assert_eq!(ids(&again), ["a"]);
        assert_eq!(again[0].message.delivery_count, 2);
        assert_ne!(again[0].lock_token, first[0].lock_token);
    }

    #[test]
    fn complete_deletes_by_lock_token_only_while_the_lease_holds() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1);
        let mut store = open(dir.path(), &clock);
        store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2")])
            .unwrap();
        clock.set(10);
        let leased = lease(&mut store, 2, 1_000);
        let (a, b) = (leased[0].lock_token.as_str(), leased[1].lock_token.as_str());
        clock.set(500);
        assert_eq!(
            store.complete("other", &[a]).unwrap(),
            [false],
            "a token completes only in the queue it was leased from"
        );
        assert_eq!(store.depth("q").unwrap(), 2);
        assert_eq!(store.complete("q", &[a, "nope"]).unwrap(), [true, false]);
        assert_eq!(store.depth("q").unwrap(), 1);
        clock.set(600);
        assert_eq!(store.complete("q", &[a]).unwrap(), [false], "already gone");
        clock.set(1_010);
        assert_eq!(
            store.complete("q", &[b]).unwrap(),
            [false],
            "the lease ended: the lock is lost"
        );
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    #[test]
    fn a_lease_is_capped_at_the_longest_lease() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), &TestClock::at(0));
        store.insert_batch(&[msg("a", b"1")]).unwrap();
        let leased = lease(&mut store, 1, u64::MAX);
        assert_eq!(leased[0].locked_until_ms, MAX_LEASE.as_millis() as i64);
    }

    #[test]
    fn a_database_from_before_leases_is_migrated_and_keeps_its_messages() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(database_path(dir.path())).unwrap();
            conn.execute_batch(V0_DDL).unwrap();
            conn.execute(
                "INSERT INTO messages (queue, message_id, body, enqueued_at_ms) VALUES ('q', 'old', x'31', 1)",
                [],
            )
            .unwrap();
        }
        let mut store = open(dir.path(), &TestClock::at(10));
        assert_eq!(store.depth("q").unwrap(), 1);
        let leased = lease(&mut store, 1, 1_000);
        assert_eq!(ids(&leased), ["old"]);
        assert_eq!(leased[0].message.delivery_count, 1);
        drop(store);
        // Opening again is a no-op.
        assert_eq!(Store::open(dir.path()).unwrap().depth("q").unwrap(), 1);
    }

    #[test]
    fn a_database_from_before_attributes_is_migrated_and_its_messages_still_work() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(database_path(dir.path())).unwrap();
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            conn.execute_batch(V0_DDL).unwrap();
            conn.execute_batch(V1_DDL).unwrap();
            for (id, at) in [("old-1", 1), ("old-2", 2)] {
                conn.execute(
                    "INSERT INTO messages (queue, message_id, correlation_id, body, enqueued_at_ms)
                     VALUES ('q', ?1, 'c', x'7b7d', ?2)",
                    params![id, at],
                )
                .unwrap();
            }
            // One of them leased by an old receiver, until 5_000.
            conn.execute(
                "UPDATE messages SET lock_token = 't', locked_until_ms = 5000, delivery_count = 1
                 WHERE message_id = 'old-2'",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO seen_ids VALUES ('q', 'old-1', 1000), ('q', 'old-2', 1000)",
                [],
            )
            .unwrap();
        }
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        let version: i64 = store
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let indexes: Vec<String> = store
            .conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'messages' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            indexes,
            [
                "messages_by_expiry",
                "messages_by_lock_token",
                "messages_by_visibility"
            ],
            "the unused (queue, seq) index is gone"
        );
        assert_eq!(store.depth("q").unwrap(), 2, "the count is kept");
        // The old messages: no attributes, never expiring, receivable at once, ahead of
        // a new one.
        store.insert_batch(&[msg("new", b"1")]).unwrap();
        let leased = lease(&mut store, 10, 1_000);
        assert_eq!(ids(&leased), ["old-1", "new"], "old-2 is still leased");
        let old = &leased[0].message;
        assert_eq!(old.correlation_id.as_deref(), Some("c"));
        assert_eq!(old.body, b"{}");
        assert_eq!(old.enqueued_at_ms, 1);
        assert!(old.attributes.is_empty() && old.trace_properties.is_empty());
        assert_eq!((old.visible_at_ms, old.expires_at_ms), (0, None));
        // The old lease holds and completes as before.
        assert_eq!(store.complete("q", &["t"]).unwrap(), [true]);
        // Duplicate detection remembers the old ids.
        // An id remembered without a digest is a duplicate whatever comes with it.
        assert_eq!(
            store.insert_batch(&[msg("old-1", b"1")]).unwrap(),
            [Stored::Duplicate]
        );
        assert_eq!(store.depth("q").unwrap(), 2);
        drop(store);
        // Opening again is a no-op: the messages are still there, leased as they were.
        let reopened = open(dir.path(), &clock);
        assert_eq!(reopened.depth("q").unwrap(), 2);
        assert_eq!(rows(&reopened), 2);
    }

    #[test]
    fn a_failing_receiver_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), &TestClock::at(1));
        store.insert_batch(&[msg("a", b"1")]).unwrap();
        let err = store.receive("q", 10, |_| Err(std::io::Error::other("pipe closed")));
        assert!(err.is_err());
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    #[test]
    fn many_processes_opening_one_data_directory_at_once_all_succeed() {
        // The gateway and `sendgate queue` may open a data directory at the same moment,
        // fresh (switching it to WAL), made before leases, or made before attributes
        // (migrating it).
        for round in 0..24 {
            let dir = tempfile::tempdir().unwrap();
            if round % 3 != 0 {
                let conn = Connection::open(database_path(dir.path())).unwrap();
                conn.pragma_update(None, "journal_mode", "WAL").unwrap();
                conn.execute_batch(V0_DDL).unwrap();
                if round % 3 == 2 {
                    conn.execute_batch(V1_DDL).unwrap();
                }
            }
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let openers: Vec<_> = (0..8)
                .map(|_| {
                    let path = dir.path().to_owned();
                    let barrier = barrier.clone();
                    std::thread::spawn(move || {
                        barrier.wait();
                        Store::open(&path).map(drop).map_err(|e| e.to_string())
                    })
                })
                .collect();
            for opener in openers {
                if let Err(e) = opener.join().unwrap() {
                    panic!("round {round}: {e}");
                }
            }
            let mut store = open(dir.path(), &TestClock::at(1));
            store.insert_batch(&[msg("a", b"1")]).unwrap();
            assert_eq!(lease(&mut store, 1, 1_000).len(), 1);
        }
    }

    #[test]
    fn a_scheduled_message_is_counted_at_once_and_received_only_from_its_time() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        store
            .insert_batch(&[scheduled("later", 5_000), msg("now", b"1")])
            .unwrap();
        assert_eq!(store.depth("q").unwrap(), 2, "a scheduled message counts");
        clock.set(4_999);
        let early = lease(&mut store, 10, 100_000);
        assert_eq!(ids(&early), ["now"], "not before its time");
        assert_eq!(store.depth("q").unwrap(), 2);
        assert!(lease(&mut store, 10, 1_000).is_empty());
        clock.set(5_000);
        let due = lease(&mut store, 10, 1_000);
        assert_eq!(ids(&due), ["later"], "received once its time has come");
        let m = &due[0].message;
        assert_eq!((m.enqueued_at_ms, m.visible_at_ms), (1_000, 5_000));
        assert_eq!(m.delivery_count, 1);
    }

    #[test]
    fn a_scheduled_message_takes_its_place_when_it_becomes_receivable() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        // Stored first, receivable from 3_000; "b" stored at 2_000; "c" scheduled in the
        // past (enqueued as it is stored, at 2_500); "d" at 4_000.
        store.insert_batch(&[scheduled("a", 3_000)]).unwrap();
        clock.set(2_000);
        store.insert_batch(&[msg("b", b"{}")]).unwrap();
        clock.set(2_500);
        store.insert_batch(&[scheduled("c", 7)]).unwrap();
        clock.set(4_000);
        store.insert_batch(&[msg("d", b"{}")]).unwrap();
        let all = lease(&mut store, 10, 1_000);
        assert_eq!(ids(&all), ["b", "c", "a", "d"]);
        assert_eq!(all[1].message.visible_at_ms, 2_500, "a past time means now");
    }

    #[test]
    fn an_expired_message_is_never_received_and_leaves_the_depth() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        store
            .insert_batch(&[
                expiring("short", 1_000),
                expiring("long", 60_000),
                msg("forever", b"{}"),
            ])
            .unwrap();
        clock.set(1_999);
        assert_eq!(store.depth("q").unwrap(), 3, "not expired yet");
        clock.set(2_000);
        assert_eq!(store.depth("q").unwrap(), 2, "expired at stored time + TTL");
        assert_eq!(rows(&store), 2, "deleted, so the count stays exact");
        assert_eq!(
            store.depth("q").unwrap(),
            2,
            "deleted once: the next read finds nothing to purge"
        );
        clock.set(61_000);
        let left = lease(&mut store, 10, 1_000);
        assert_eq!(
            ids(&left),
            ["forever"],
            "an expired message is never delivered"
        );
        assert_eq!(left[0].message.expires_at_ms, None);
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    #[test]
    fn a_mass_expiry_is_deleted_a_chunk_per_read_and_never_delivered_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        store.purge_chunk = 2;
        let expiring_ids: Vec<String> = (0..5).map(|i| format!("e-{i}")).collect();
        let mut batch: Vec<_> = expiring_ids.iter().map(|id| expiring(id, 10)).collect();
        batch.push(msg("kept", b"{}"));
        store.insert_batch(&batch).unwrap();
        clock.set(1_010);
        let reads: Vec<u64> = (0..4).map(|_| store.depth("q").unwrap()).collect();
        assert_eq!(reads, [4, 2, 1, 1], "too high for a while, never too low");
        store
            .insert_batch(&[expiring("x", 1), expiring("y", 1), expiring("z", 1)])
            .unwrap();
        clock.set(1_011);
        let left = lease(&mut store, 10, 1_000);
        assert_eq!(
            ids(&left),
            ["kept"],
            "what a receive does not delete it still skips"
        );
        assert_eq!(rows(&store), 2);
    }

    #[test]
    fn a_receive_deletes_what_expired_without_a_depth_read() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        store
            .insert_batch(&[expiring("gone", 10), msg("kept", b"{}")])
            .unwrap();
        clock.set(1_010);
        let mut got = Vec::new();
        store
            .receive("q", 10, |m| {
                got.push(m.message_id.clone());
                Ok(())
            })
            .unwrap();
        assert_eq!(got, ["kept"]);
        assert_eq!(rows(&store), 0);
        assert_eq!(store.depth("q").unwrap(), 0);
    }

    #[test]
    fn a_scheduled_message_expires_its_time_to_live_after_it_becomes_receivable() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        store
            .insert_batch(&[NewMessage {
                time_to_live_ms: Some(500),
                ..scheduled("s", 10_000)
            }])
            .unwrap();
        clock.set(10_499);
        let leased = lease(&mut store, 10, 1);
        assert_eq!(ids(&leased), ["s"]);
        assert_eq!(leased[0].message.expires_at_ms, Some(10_500));
        clock.set(10_500);
        assert!(lease(&mut store, 10, 1).is_empty());
        assert_eq!(store.depth("q").unwrap(), 0);
    }

    #[test]
    fn a_message_expiring_while_leased_stays_for_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        store
            .insert_batch(&[expiring("a", 100), expiring("b", 100)])
            .unwrap();
        let leased = lease(&mut store, 2, 1_000);
        clock.set(1_500);
        assert_eq!(store.depth("q").unwrap(), 2, "leased messages still count");
        assert!(lease(&mut store, 10, 1_000).is_empty());
        assert_eq!(
            store.complete("q", &[&leased[0].lock_token]).unwrap(),
            [true],
            "the holder completes it though it expired"
        );
        clock.set(2_000);
        assert_eq!(store.depth("q").unwrap(), 0, "gone once its lease ended");
        assert_eq!(rows(&store), 0);
    }

    #[test]
    fn a_batch_is_stored_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), &TestClock::at(1_000));
        store
            .conn
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON messages WHEN NEW.message_id = 'bad'
                 BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
        let batch = [msg("a", b"1"), msg("b", b"2"), msg("bad", b"3")];
        assert!(store.insert_batch(&batch).is_err());
        assert_eq!(store.depth("q").unwrap(), 0);
        assert_eq!(rows(&store), 0);
        store.conn.execute_batch("DROP TRIGGER refuse").unwrap();
        assert_eq!(
            store.insert_batch(&batch).unwrap(),
            [Stored::New; 3],
            "nothing of the failed batch was remembered as seen"
        );
        assert_eq!(store.depth("q").unwrap(), 3);
    }

    #[test]
    fn a_batch_reports_each_duplicate_inside_it_and_against_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path(), &TestClock::at(1_000));
        store.insert_batch(&[msg("earlier", b"0")]).unwrap();
        let dups = store
            .insert_batch(&[
                msg("a", b"1"),
                msg("earlier", b"0"),
                msg("a", b"1"),
                msg("b", b"4"),
            ])
            .unwrap();
        use Stored::{Duplicate, New};
        assert_eq!(dups, [New, Duplicate, Duplicate, New]);
        assert_eq!(store.depth("q").unwrap(), 3);
        let bodies: Vec<Vec<u8>> = lease(&mut store, 10, 1_000)
            .into_iter()
            .map(|l| l.message.body)
            .collect();
        assert_eq!(bodies, [b"0".to_vec(), b"1".to_vec(), b"4".to_vec()]);
    }

    #[test]
    fn attributes_and_trace_properties_come_back_as_they_were_stored() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(1_000);
        let mut store = open(dir.path(), &clock);
        let attributes = MessageAttributes {
            subject: Some("order.created".into()),
            session_id: Some("s-1".into()),
            partition_key: Some("s-1".into()),
            time_to_live_s: Some(90),
            scheduled_enqueue_time: Some("1970-01-01T00:00:02Z".into()),
            reply_to: Some("replies".into()),
            to: Some("billing".into()),
            properties: [
                ("n".to_owned(), serde_json::json!(3)),
                ("x".to_owned(), serde_json::json!(0.5)),
                ("one".to_owned(), serde_json::json!(1.0)),
                ("ok".to_owned(), serde_json::json!(true)),
                ("s".to_owned(), serde_json::json!("text")),
            ]
            .into(),
        };
        let encoded = encode_attributes(&attributes);
        let trace = encode_trace_properties([
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            (
                "Diagnostic-Id",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ]);
        store
            .insert_batch(&[NewMessage {
                attributes: encoded.as_deref(),
                trace_properties: trace.as_deref(),
                scheduled_at_ms: Some(2_000),
                time_to_live_ms: Some(90_000),
                ..msg("m", b"{}")
            }])
            .unwrap();
        clock.set(2_000);
        let got = lease(&mut store, 1, 1_000).remove(0).message;
        assert_eq!(got.attributes, attributes);
        assert_eq!(
            got.attributes.properties["one"].to_string(),
            "1.0",
            "a float stays one"
        );
        assert_eq!(
            got.trace_properties
                .get("Diagnostic-Id")
                .map(String::as_str),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        assert_eq!(got.trace_properties.len(), 2);
        assert_eq!(got.expires_at_ms, Some(92_000));
        assert_eq!(encode_attributes(&MessageAttributes::default()), None);
        assert_eq!(encode_trace_properties([]), None);
    }

    /// SQLite's plan for `sql`, one line per step.
    fn plan(store: &Store, sql: &str, args: impl rusqlite::Params) -> String {
        store
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(args, |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
            .join("\n")
    }

    #[test]
    fn depth_receive_and_purge_read_by_index_not_by_scanning_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), &TestClock::at(1));
        let probe = plan(
            &store,
            &format!("SELECT 1 FROM messages WHERE {EXPIRED} LIMIT 1"),
            params!["q", 1],
        );
        assert!(probe.contains("USING INDEX messages_by_expiry"), "{probe}");
        let purge = plan(
            &store,
            &format!(
                "DELETE FROM messages WHERE seq IN (SELECT seq FROM messages WHERE {EXPIRED} LIMIT ?3)"
            ),
            params!["q", 1, 10],
        );
        assert!(purge.contains("USING INDEX messages_by_expiry"), "{purge}");
        let claim = plan(&store, NEXT_RECEIVABLE, params!["q", 1, 10]);
        assert!(
            claim.contains("USING INDEX messages_by_visibility"),
            "{claim}"
        );
        assert!(!claim.contains("TEMP B-TREE"), "no sort: {claim}");
    }
}
