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
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self { conn })
    }

    /// Store a batch in one transaction; one result per message: `true` when it was a
    /// duplicate inside the window and so was not stored again.
    pub fn insert_batch(
        &mut self,
        batch: &[NewMessage<'_>],
        now_ms: i64,
    ) -> Result<Vec<bool>, StoreError> {
        let window_start = now_ms - DUPLICATE_WINDOW.as_millis() as i64;
        let tx = self.conn.transaction()?;
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
        Ok(self
            .conn
            .execute("DELETE FROM seen_ids WHERE seen_at_ms < ?1", [window_start])?)
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

    /// Take up to `max` messages off `queue`, oldest first. Each is handed to `deliver`
    /// before it is deleted, so a receiver that dies half-way loses nothing (at-least-once:
    /// it may see a message again). The write lock is taken only for the short delete at
    /// the end, never while `deliver` writes out: a slow reader on the other end of a pipe
    /// must not stall the gateway's writer.
    pub fn receive(
        &mut self,
        queue: &str,
        max: usize,
        mut deliver: impl FnMut(&StoredMessage) -> std::io::Result<()>,
    ) -> Result<usize, StoreError> {
        let messages: Vec<StoredMessage> = {
            let mut select = self.conn.prepare(
                "SELECT seq, queue, message_id, correlation_id, body, enqueued_at_ms
                 FROM messages WHERE queue = ?1 ORDER BY seq LIMIT ?2",
            )?;
            let rows =
                select.query_map(params![queue, max.min(i64::MAX as usize) as i64], |r| {
                    Ok(StoredMessage {
                        seq: r.get(0)?,
                        queue: r.get(1)?,
                        message_id: r.get(2)?,
                        correlation_id: r.get(3)?,
                        body: r.get(4)?,
                        enqueued_at_ms: r.get(5)?,
                    })
                })?;
            rows.collect::<Result<_, _>>()?
        };
        let mut delivered = Vec::with_capacity(messages.len());
        let mut failure = None;
        for m in &messages {
            if let Err(e) = deliver(m) {
                failure = Some(e);
                break;
            }
            delivered.push(m.seq);
        }
        // Delete what was handed out, even when a later delivery failed.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            let mut delete = tx.prepare_cached("DELETE FROM messages WHERE seq = ?1")?;
            for seq in &delivered {
                delete.execute([seq])?;
            }
        }
        tx.commit()?;
        match failure {
            Some(e) => Err(StoreError::Output(e)),
            None => Ok(delivered.len()),
        }
    }
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

    #[test]
    fn a_failing_receiver_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        store.insert_batch(&[msg("a", b"1")], 1).unwrap();
        let err = store.receive("q", 10, |_| Err(std::io::Error::other("pipe closed")));
        assert!(err.is_err());
        assert_eq!(store.depth("q").unwrap(), 1);
    }
}
