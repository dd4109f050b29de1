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

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

/// Service Bus's default duplicate-detection window, which the embedded queue copies:
/// a second message with the same id inside it is acknowledged but not stored again.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(600);

const SCHEMA: &str = "
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

/// Leases (schema version 1): added to databases made before them.
const LEASE_COLUMNS: &[&str] = &[
    "ALTER TABLE messages ADD COLUMN locked_until_ms INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE messages ADD COLUMN lock_token TEXT",
    "ALTER TABLE messages ADD COLUMN delivery_count INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX IF NOT EXISTS messages_by_lock_token ON messages (lock_token)",
];

/// How long receive-and-delete keeps its claim while it writes the messages out. A
/// receiver that dies meanwhile loses nothing: the messages come back after this.
pub const RECEIVE_AND_DELETE_LEASE: Duration = Duration::from_secs(30);

/// The longest lease `receive --lock-s` takes (Service Bus allows 5 minutes).
pub const MAX_LEASE: Duration = Duration::from_secs(300);

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub seq: i64,
    pub queue: String,
    pub message_id: String,
    pub correlation_id: Option<String>,
    pub body: Vec<u8>,
    pub enqueued_at_ms: i64,
    /// How many times it has been handed out, this time included.
    pub delivery_count: u32,
}

/// A message claimed by a receiver until `locked_until_ms`; `lock_token` completes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedMessage {
    pub message: StoredMessage,
    pub lock_token: String,
    pub locked_until_ms: i64,
}

/// A message to store, borrowed from the request.
pub struct NewMessage<'a> {
    pub queue: &'a str,
    pub message_id: &'a str,
    pub correlation_id: Option<&'a str>,
    pub body: &'a [u8],
}

pub fn database_path(data_dir: &Path) -> PathBuf {
    data_dir.join("embedded.sqlite3")
}

pub struct Store {
    conn: Connection,
}

impl Store {
    /// Open (creating when missing) the queue database under `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            path: data_dir.to_owned(),
            source,
        })?;
        let conn = Connection::open(database_path(data_dir))?;
        // Another process (a receiver) may hold the write lock briefly.
        conn.busy_timeout(BUSY_TIMEOUT)?;
        enable_wal(&conn)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        migrate(&conn)?;
        Ok(Self { conn })
    }

    /// A write transaction that holds the write lock from its start (see the module doc).
    fn write(&mut self) -> Result<rusqlite::Transaction<'_>, StoreError> {
        Ok(self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?)
    }

    /// Store a batch in one transaction; one result per message: `true` when it was a
    /// duplicate inside the window and so was not stored again.
    pub fn insert_batch(
        &mut self,
        batch: &[NewMessage<'_>],
        now_ms: i64,
    ) -> Result<Vec<bool>, StoreError> {
        let window_start = now_ms - DUPLICATE_WINDOW.as_millis() as i64;
        let tx = self.write()?;
        let mut duplicates = Vec::with_capacity(batch.len());
        {
            let mut seen = tx.prepare_cached(
                "SELECT seen_at_ms FROM seen_ids WHERE queue = ?1 AND message_id = ?2",
            )?;
            let mut remember = tx.prepare_cached(
                "INSERT INTO seen_ids (queue, message_id, seen_at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (queue, message_id) DO UPDATE SET seen_at_ms = excluded.seen_at_ms",
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO messages (queue, message_id, correlation_id, body, enqueued_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for m in batch {
                let seen_at: Option<i64> = seen
                    .query_row(params![m.queue, m.message_id], |r| r.get(0))
                    .optional()?;
                if seen_at.is_some_and(|t| t >= window_start) {
                    duplicates.push(true);
                    continue;
                }
                remember.execute(params![m.queue, m.message_id, now_ms])?;
                insert.execute(params![
                    m.queue,
                    m.message_id,
                    m.correlation_id,
                    m.body,
                    now_ms
                ])?;
                duplicates.push(false);
            }
        }
        tx.commit()?;
        Ok(duplicates)
    }

    /// Forget message ids older than the duplicate window.
    pub fn prune_seen_ids(&mut self, now_ms: i64) -> Result<usize, StoreError> {
        let window_start = now_ms - DUPLICATE_WINDOW.as_millis() as i64;
        let tx = self.write()?;
        let pruned = tx.execute("DELETE FROM seen_ids WHERE seen_at_ms < ?1", [window_start])?;
        tx.commit()?;
        Ok(pruned)
    }

    /// Messages stored in `queue` and not yet received.
    pub fn depth(&self, queue: &str) -> Result<u64, StoreError> {
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
        let now_ms = unix_ms(SystemTime::now());
        let claimed = self.lease(queue, max, RECEIVE_AND_DELETE_LEASE, now_ms)?;
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
        self.complete(queue, &delivered, now_ms)?;
        self.release(&undelivered)?;
        match failure {
            Some(e) => Err(StoreError::Output(e)),
            None => Ok(delivered.len()),
        }
    }

    /// Claim up to `max` deliverable messages of `queue` (oldest first) until
    /// `now_ms + lease`, each with a lock token of its own.
    pub fn lease(
        &mut self,
        queue: &str,
        max: usize,
        lease: Duration,
        now_ms: i64,
    ) -> Result<Vec<LeasedMessage>, StoreError> {
        let locked_until_ms = now_ms.saturating_add(lease.min(MAX_LEASE).as_millis() as i64);
        let max = max.min(i64::MAX as usize) as i64;
        let tx = self.write()?;
        let seqs: Vec<i64> = tx
            .prepare_cached(
                "SELECT seq FROM messages WHERE queue = ?1 AND locked_until_ms <= ?2
                 ORDER BY seq LIMIT ?3",
            )?
            .query_map(params![queue, now_ms, max], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut claimed = Vec::with_capacity(seqs.len());
        {
            let mut claim = tx.prepare_cached(
                "UPDATE messages SET locked_until_ms = ?2, lock_token = ?3,
                        delivery_count = delivery_count + 1
                 WHERE seq = ?1
                 RETURNING seq, queue, message_id, correlation_id, body, enqueued_at_ms,
                           delivery_count",
            )?;
            for seq in seqs {
                let lock_token = uuid::Uuid::new_v4().to_string();
                let message = claim.query_row(params![seq, locked_until_ms, lock_token], |r| {
                    Ok(StoredMessage {
                        seq: r.get(0)?,
                        queue: r.get(1)?,
                        message_id: r.get(2)?,
                        correlation_id: r.get(3)?,
                        body: r.get(4)?,
                        enqueued_at_ms: r.get(5)?,
                        delivery_count: r.get(6)?,
                    })
                })?;
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
    pub fn complete(
        &mut self,
        queue: &str,
        lock_tokens: &[&str],
        now_ms: i64,
    ) -> Result<Vec<bool>, StoreError> {
        if lock_tokens.is_empty() {
            return Ok(Vec::new());
        }
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

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Bring a database made by an older sendgate up to the current schema.
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version >= 1 {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    // Another process may have migrated while this one waited for the lock.
    let has_leases = conn
        .prepare("SELECT 1 FROM pragma_table_info('messages') WHERE name = 'lock_token'")?
        .exists([])?;
    let migrated = (|| {
        if !has_leases {
            for statement in LEASE_COLUMNS {
                conn.execute_batch(statement)?;
            }
        }
        conn.pragma_update(None, "user_version", 1)
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
    use super::*;

    fn msg<'a>(id: &'a str, body: &'a [u8]) -> NewMessage<'a> {
        NewMessage {
            queue: "q",
            message_id: id,
            correlation_id: None,
            body,
        }
    }

    #[test]
    fn stores_counts_and_receives_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let dups = store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2"), msg("c", b"3")], 1_000)
            .unwrap();
        assert_eq!(dups, vec![false, false, false]);
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
        let mut store = Store::open(dir.path()).unwrap();
        assert_eq!(
            store
                .insert_batch(&[msg("k", b"1"), msg("k", b"1")], 1_000)
                .unwrap(),
            vec![false, true]
        );
        assert_eq!(
            store.insert_batch(&[msg("k", b"1")], 2_000).unwrap(),
            vec![true]
        );
        assert_eq!(store.depth("q").unwrap(), 1);
        let later = 2_000 + DUPLICATE_WINDOW.as_millis() as i64 + 1;
        assert_eq!(
            store.insert_batch(&[msg("k", b"1")], later).unwrap(),
            vec![false]
        );
        assert_eq!(store.depth("q").unwrap(), 2);
    }

    #[test]
    fn pruning_forgets_only_ids_older_than_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let window = DUPLICATE_WINDOW.as_millis() as i64;
        store.insert_batch(&[msg("old", b"1")], 1_000).unwrap();
        store.insert_batch(&[msg("new", b"2")], 5_000).unwrap();
        // At 1_000 + window + 1 only "old" is out of the window.
        assert_eq!(store.prune_seen_ids(1_000 + window + 1).unwrap(), 1);
        assert_eq!(
            store.prune_seen_ids(1_000 + window + 1).unwrap(),
            0,
            "already gone"
        );
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
        let mut store = Store::open(dir.path()).unwrap();
        store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2"), msg("c", b"3")], 1)
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
        let next = store
            .lease("q", 10, Duration::from_secs(1), unix_ms(SystemTime::now()))
            .unwrap();
        let ids: Vec<_> = next.iter().map(|l| l.message.message_id.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
        assert!(next.iter().all(|l| l.message.delivery_count == 1));
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
        let mut store = Store::open(dir.path()).unwrap();
        let mut writer = Store::open(dir.path()).unwrap();
        store.insert_batch(&[msg("a", b"1")], 1).unwrap();
        store
            .receive("q", 1, |_| {
                // While the receiver is still writing its output, the writer commits.
                writer.conn.busy_timeout(Duration::from_millis(1)).unwrap();
                writer
                    .insert_batch(&[msg("b", b"2")], 2)
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            })
            .unwrap();
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    fn lease(store: &mut Store, max: usize, lease_ms: u64, now_ms: i64) -> Vec<LeasedMessage> {
        store
            .lease("q", max, Duration::from_millis(lease_ms), now_ms)
            .unwrap()
    }

    #[test]
    fn a_leased_message_is_hidden_from_other_receivers_until_its_lease_ends() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let mut other = Store::open(dir.path()).unwrap();
        store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2")], 1)
            .unwrap();
        let first = lease(&mut store, 1, 1_000, 10);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].message.message_id, "a");
        assert_eq!(first[0].message.delivery_count, 1);
        assert_eq!(first[0].locked_until_ms, 1_010);
        let second = lease(&mut other, 10, 1_000, 20);
        let ids: Vec<_> = second
            .iter()
            .map(|l| l.message.message_id.as_str())
            .collect();
        assert_eq!(
            ids,
            ["b"],
            "the other receiver only gets what is not leased"
        );
        assert_eq!(store.depth("q").unwrap(), 2, "leased messages still count");

        // The lease ends without a complete: deliverable again, one delivery more.
        let again = lease(&mut other, 10, 1_000, 1_010);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].message.message_id, "a");
        assert_eq!(again[0].message.delivery_count, 2);
        assert_ne!(again[0].lock_token, first[0].lock_token);
    }

    #[test]
    fn complete_deletes_by_lock_token_only_while_the_lease_holds() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        store
            .insert_batch(&[msg("a", b"1"), msg("b", b"2")], 1)
            .unwrap();
        let leased = lease(&mut store, 2, 1_000, 10);
        let (a, b) = (leased[0].lock_token.as_str(), leased[1].lock_token.as_str());
        assert_eq!(
            store.complete("other", &[a], 500).unwrap(),
            [false],
            "a token completes only in the queue it was leased from"
        );
        assert_eq!(store.depth("q").unwrap(), 2);
        assert_eq!(
            store.complete("q", &[a, "nope"], 500).unwrap(),
            [true, false]
        );
        assert_eq!(store.depth("q").unwrap(), 1);
        assert_eq!(
            store.complete("q", &[a], 600).unwrap(),
            [false],
            "already gone"
        );
        assert_eq!(
            store.complete("q", &[b], 1_010).unwrap(),
            [false],
            "the lease ended: the lock is lost"
        );
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    #[test]
    fn a_lease_is_capped_at_the_longest_lease() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        store.insert_batch(&[msg("a", b"1")], 1).unwrap();
        let leased = lease(&mut store, 1, u64::MAX, 0);
        assert_eq!(leased[0].locked_until_ms, MAX_LEASE.as_millis() as i64);
    }

    #[test]
    fn a_database_from_before_leases_is_migrated_and_keeps_its_messages() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(database_path(dir.path())).unwrap();
            conn.execute_batch(SCHEMA).unwrap();
            conn.execute(
                "INSERT INTO messages (queue, message_id, body, enqueued_at_ms) VALUES ('q', 'old', x'31', 1)",
                [],
            )
            .unwrap();
        }
        let mut store = Store::open(dir.path()).unwrap();
        assert_eq!(store.depth("q").unwrap(), 1);
        let leased = lease(&mut store, 1, 1_000, 10);
        assert_eq!(leased[0].message.message_id, "old");
        assert_eq!(leased[0].message.delivery_count, 1);
        drop(store);
        // Opening again is a no-op.
        assert_eq!(Store::open(dir.path()).unwrap().depth("q").unwrap(), 1);
    }

    #[test]
    fn a_failing_receiver_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        store.insert_batch(&[msg("a", b"1")], 1).unwrap();
        let err = store.receive("q", 10, |_| Err(std::io::Error::other("pipe closed")));
        assert!(err.is_err());
        assert_eq!(store.depth("q").unwrap(), 1);
    }

    #[test]
    fn many_processes_opening_one_data_directory_at_once_all_succeed() {
        // The gateway and `sendgate queue` may open a data directory at the same moment,
        // fresh (switching it to WAL) or made before leases (migrating it).
        for round in 0..24 {
            let dir = tempfile::tempdir().unwrap();
            if round % 2 == 0 {
                let conn = Connection::open(database_path(dir.path())).unwrap();
                conn.pragma_update(None, "journal_mode", "WAL").unwrap();
                conn.execute_batch(SCHEMA).unwrap();
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
            let mut store = Store::open(dir.path()).unwrap();
            store.insert_batch(&[msg("a", b"1")], 1).unwrap();
            assert_eq!(lease(&mut store, 1, 1_000, 10).len(), 1);
        }
    }
}
