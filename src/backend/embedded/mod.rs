//! The embedded backend: a durable queue on local disk, so the gateway runs on a laptop
//! with no broker.
//!
//! Sends go to one writer thread over a bounded channel, each as a job: one message, or
//! a whole batch. The writer takes whatever jobs are waiting while their messages fit in
//! [`MAX_BATCH`] and commits them in one transaction, so one fsync covers many sends; a
//! job is never split, so a batch is stored whole or not at all. A job whose caller has
//! already given up (deadline passed, client gone) is dropped by the writer before it is
//! written, all its messages: that is how the deadline cancels the operation rather than
//! leaving it to run on in the background.
//!
//! Every attribute is stored with its message and honoured there (store.rs: scheduling,
//! expiry); the trace properties the gateway adds are stored beside them.
//!
//! A message id seen inside the duplicate window is not stored again: a retry (the same
//! body and attributes) is answered as a duplicate, another message under the same id is
//! refused ([`SendError::KeyReused`]).

mod store;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use sendgate_wire::MessageAttributes;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

pub use store::{
    database_path, system_clock, unix_ms, Clock, LeasedMessage, Store, StoreError, Stored,
    StoredMessage, DUPLICATE_WINDOW, MAX_LEASE,
};

use super::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt, StoreHealth};
use crate::domain::{Attributes, QueueName};

/// Most messages committed in one transaction. A job larger than this (a big batch) is
/// committed alone, whole.
const MAX_BATCH: usize = 512;
/// Jobs waiting for the writer before new ones wait for room.
const QUEUE_ROOM: usize = 4096;
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// What a client is told to wait while the disk is full: room comes back when a receiver
/// or an operator frees it, on no schedule the gateway knows.
const DISK_FULL_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Whether the writer's last commit went through, and why not: `/health/detailed`'s
/// `store`. Kept by the writer thread, read by the health route.
struct Condition(Mutex<StoreHealth>);

impl Condition {
    fn new() -> Self {
        Self(Mutex::new(StoreHealth {
            ok: true,
            error: None,
            since: std::time::SystemTime::now(),
        }))
    }

    fn wrote(&self) {
        let mut health = self.0.lock();
        if !health.ok {
            *health = StoreHealth {
                ok: true,
                error: None,
                since: std::time::SystemTime::now(),
            };
        }
    }

    /// Record a failed commit; `true` when it starts a run of failures or changes its
    /// reason (worth a log line: a full disk fails every send until room comes back).
    fn failed(&self, why: String) -> bool {
        let mut health = self.0.lock();
        let news = health.ok || health.error.as_deref() != Some(why.as_str());
        if health.ok {
            health.since = std::time::SystemTime::now();
        }
        health.ok = false;
        health.error = Some(why);
        news
    }
}

/// One message as the writer stores it, encoded on the sender's task beforehand: the one
/// writer thread is what every send waits on, so it does as little as it can.
struct Prepared {
    message: OutgoingMessage,
    attributes: Option<String>,
    trace_properties: Option<String>,
    scheduled_at_ms: Option<i64>,
    time_to_live_ms: Option<i64>,
}

impl Prepared {
    fn new(message: OutgoingMessage) -> Self {
        let attributes = store::encode_attributes(&wire_attributes(&message.attributes));
        let trace = message.trace_properties();
        let trace_properties =
            store::encode_trace_properties(trace.iter().map(|(k, v)| (*k, v.as_str())));
        let scheduled_at_ms = message.attributes.scheduled_enqueue_time.map(|at| {
            // Every time an RFC 3339 date can hold fits 64-bit milliseconds.
            i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
        });
        let time_to_live_ms = message
            .attributes
            .time_to_live
            .map(|ttl| i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        Self {
            message,
            attributes,
            trace_properties,
            scheduled_at_ms,
            time_to_live_ms,
        }
    }

    fn row(&self) -> store::NewMessage<'_> {
        store::NewMessage {
            queue: self.message.queue.as_str(),
            message_id: self.message.message_id.as_str(),
            correlation_id: self.message.correlation_id.as_ref().map(|c| c.as_str()),
            body: &self.message.body,
            attributes: self.attributes.as_deref(),
            trace_properties: self.trace_properties.as_deref(),
            scheduled_at_ms: self.scheduled_at_ms,
            time_to_live_ms: self.time_to_live_ms,
        }
    }
}

/// The attributes in the form of a batch entry, as the store keeps and `queue receive`
/// prints them.
fn wire_attributes(a: &Attributes) -> MessageAttributes {
    MessageAttributes {
        subject: a.subject.as_ref().map(ToString::to_string),
        session_id: a.session_id.as_ref().map(ToString::to_string),
        partition_key: a.partition_key.as_ref().map(ToString::to_string),
        time_to_live_s: a.time_to_live.map(|ttl| ttl.as_secs()),
        scheduled_enqueue_time: a.scheduled_rfc3339(),
        reply_to: a.reply_to.as_ref().map(ToString::to_string),
        to: a.to.as_ref().map(ToString::to_string),
        properties: a
            .properties
            .iter()
            .map(|(name, value)| (name.to_owned(), value.to_json()))
            .collect(),
    }
}

/// Messages stored in one transaction, and where to say how it went.
struct WriteJob {
    messages: Vec<Prepared>,
    /// Per message, what became of it; or why none of them was stored.
    reply: oneshot::Sender<Result<Vec<Stored>, SendError>>,
}

pub struct EmbeddedQueue {
    jobs: mpsc::Sender<WriteJob>,
    reader: Arc<Mutex<Store>>,
    condition: Arc<Condition>,
}

impl EmbeddedQueue {
    /// Open the queue under `data_dir` and start its writer thread.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let writer = Store::open(data_dir)?;
        let reader = Store::open(data_dir)?;
        let (jobs, inbox) = mpsc::channel(QUEUE_ROOM);
        let condition = Arc::new(Condition::new());
        let kept = condition.clone();
        std::thread::Builder::new()
            .name("sendgate-embedded-writer".into())
            .spawn({
                let data_dir = data_dir.to_owned();
                move || {
                    let reopen = || Store::open(&data_dir);
                    write_while_alive(writer, reopen, inbox, &kept, commit);
                }
            })
            .map_err(StoreError::Output)?;
        Ok(Self {
            jobs,
            reader: Arc::new(Mutex::new(reader)),
            condition,
        })
    }

    /// Hand `messages` to the writer as one job and wait for it, until `deadline`.
    async fn write(
        &self,
        messages: Vec<Prepared>,
        deadline: Instant,
    ) -> Result<Vec<Stored>, SendError> {
        let count = messages.len();
        let write = async {
            let (reply, answer) = oneshot::channel();
            self.jobs
                .send(WriteJob { messages, reply })
                .await
                .map_err(|_| SendError::Unavailable("the embedded writer has stopped".into()))?;
            // Handed over, then dropped unanswered: the writer died holding the job, after
            // its commit or before it. Nothing says which.
            answer.await.map_err(|_| {
                SendError::Uncertain("the embedded writer stopped holding this send".into())
            })?
        };
        // Dropping `write` at the deadline drops the reply receiver, which tells the
        // writer to skip the job if it has not committed it yet.
        let duplicates = tokio::time::timeout_at(deadline, write)
            .await
            .map_err(|_| SendError::Timeout)??;
        if duplicates.len() != count {
            // Its transaction went through: which of them it holds is not known.
            return Err(SendError::Uncertain(format!(
                "the embedded writer answered for {} of {count} messages",
                duplicates.len()
            )));
        }
        Ok(duplicates)
    }
}

/// The writer thread: the write loop, begun again on a store opened afresh when it dies of a
/// panic (a bug). The jobs it held then are dropped unanswered (their sends' outcome is
/// unknown: it may have committed them); those still in the channel are taken by the loop
/// begun again. `/health/detailed`'s `store` says so until the next commit goes through.
/// Ends when every sender is gone (shutdown), or when the store cannot be opened again:
/// then nothing takes a job, and every send is answered as never handed over.
fn write_while_alive(
    mut store: Store,
    mut reopen: impl FnMut() -> Result<Store, StoreError>,
    mut inbox: mpsc::Receiver<WriteJob>,
    condition: &Condition,
    mut commit: impl FnMut(&mut Store, Vec<WriteJob>, &Condition),
) {
    loop {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            write_loop(&mut store, &mut inbox, condition, &mut commit);
        }));
        if ran.is_ok() {
            return;
        }
        // The old connection is dropped, and with it any transaction the panic left open.
        store = match reopen() {
            Ok(fresh) => fresh,
            Err(e) => {
                condition.failed(format!(
                    "the embedded writer stopped (a panic) and cannot reopen the store: {e}"
                ));
                tracing::error!(
                    event = "embedded_writer_stopped",
                    error = %e,
                    "the embedded queue's writer stopped and cannot reopen the store: no send is stored until a restart"
                );
                return;
            }
        };
        condition.failed("the embedded writer stopped (a panic) and began again".into());
        tracing::error!(
            event = "embedded_writer_restarted",
            "the embedded queue's writer stopped (a panic) and began again: the sends it held have an unknown outcome"
        );
    }
}

/// Take jobs, a transaction's worth at a time, until every sender is gone.
fn write_loop(
    store: &mut Store,
    inbox: &mut mpsc::Receiver<WriteJob>,
    condition: &Condition,
    commit: &mut impl FnMut(&mut Store, Vec<WriteJob>, &Condition),
) {
    let mut carried: Option<WriteJob> = None;
    let mut last_prune = std::time::Instant::now();
    loop {
        let Some(first) = carried.take().or_else(|| inbox.blocking_recv()) else {
            return;
        };
        let (jobs, next) = gather(first, inbox);
        carried = next;
        commit(store, jobs, condition);
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = std::time::Instant::now();
            if let Err(e) = store.prune_seen_ids() {
                tracing::warn!(error = %e, "could not prune the duplicate-detection history");
            }
        }
    }
}

/// The jobs of one transaction: `first` (whole, whatever its size), then those waiting
/// while their messages fit in [`MAX_BATCH`]. The first that does not fit is handed back
/// to open the next transaction: a job is never split.
fn gather(
    first: WriteJob,
    inbox: &mut mpsc::Receiver<WriteJob>,
) -> (Vec<WriteJob>, Option<WriteJob>) {
    let mut count = first.messages.len();
    let mut jobs = vec![first];
    while count < MAX_BATCH {
        match inbox.try_recv() {
            // Nobody waits for it: it takes no room.
            Ok(job) if job.reply.is_closed() => {}
            Ok(job) if count + job.messages.len() <= MAX_BATCH => {
                count += job.messages.len();
                jobs.push(job);
            }
            Ok(job) => return (jobs, Some(job)),
            Err(_) => break,
        }
    }
    (jobs, None)
}

/// Store `jobs` in one transaction and answer each; `condition` keeps how it went.
fn commit(store: &mut Store, mut jobs: Vec<WriteJob>, condition: &Condition) {
    // The caller gave up (deadline or disconnect): never store what nobody waits for.
    jobs.retain(|job| !job.reply.is_closed());
    if jobs.is_empty() {
        return;
    }
    let rows: Vec<store::NewMessage<'_>> = jobs
        .iter()
        .flat_map(|job| job.messages.iter().map(Prepared::row))
        .collect();
    let outcome = store.insert_batch(&rows);
    drop(rows);
    match outcome {
        Ok(results) => {
            condition.wrote();
            let mut results = results.into_iter();
            for job in jobs {
                let mine = results.by_ref().take(job.messages.len()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            let answer = refusal(&e);
            let why = if e.is_disk_full() {
                format!("the disk is full ({e})")
            } else {
                e.to_string()
            };
            if condition.failed(why) {
                tracing::error!(
                    event = "embedded_write_failed",
                    error = %e,
                    disk_full = e.is_disk_full(),
                    "embedded queue write failed (logged again when the reason changes)"
                );
            }
            for job in jobs {
                let _ = job.reply.send(Err(answer.clone()));
            }
        }
    }
}

/// One message's answer: stored, a duplicate (a retry), or its id reused for another message.
fn receipt(stored: Stored) -> Result<SendReceipt, SendError> {
    match stored {
        Stored::New => Ok(SendReceipt { duplicate: false }),
        Stored::Duplicate => Ok(SendReceipt { duplicate: true }),
        Stored::KeyReused => Err(SendError::KeyReused),
    }
}

/// A failed commit as the senders are answered. Nothing was stored either way; a full disk
/// is busy (room may come back: `503 backend_busy`), anything else a failure.
fn refusal(e: &StoreError) -> SendError {
    if e.is_disk_full() {
        SendError::Busy {
            reason: format!("the embedded store's disk is full ({e})"),
            retry_after: Some(DISK_FULL_RETRY_AFTER),
        }
    } else {
        SendError::Failed(e.to_string())
    }
}

#[async_trait]
impl Backend for EmbeddedQueue {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn send(
        &self,
        message: OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        let results = self.write(vec![Prepared::new(message)], deadline).await?;
        receipt(results[0])
    }

    /// One job, so one transaction: every message is stored, or none is (each then fails
    /// with the same error).
    async fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
        deadline: Instant,
    ) -> Vec<Result<SendReceipt, SendError>> {
        let count = messages.len();
        if count == 0 {
            return Vec::new();
        }
        let prepared = messages.into_iter().map(Prepared::new).collect();
        match self.write(prepared, deadline).await {
            Ok(results) => results.into_iter().map(receipt).collect(),
            Err(e) => vec![Err(e); count],
        }
    }

    fn store_health(&self) -> Option<StoreHealth> {
        Some(self.condition.0.lock().clone())
    }

    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError> {
        let reader = self.reader.clone();
        let queue = queue.as_str().to_owned();
        let read = tokio::task::spawn_blocking(move || reader.lock().depth(&queue));
        match tokio::time::timeout_at(deadline, read).await {
            Err(_) => Err(DepthError::Timeout),
            Ok(Err(join)) => Err(DepthError::Failed(join.to_string())),
            Ok(Ok(Err(e))) => Err(DepthError::Failed(e.to_string())),
            Ok(Ok(Ok(messages))) => Ok(Backlog::of(messages)),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use rusqlite::Connection;
    use serde_json::json;
    use time::OffsetDateTime;

    use super::*;
    use crate::domain::{MessageId, Raw, TraceContext};

    const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn message(id: &str) -> OutgoingMessage {
        OutgoingMessage::new(
            QueueName::parse("q").unwrap(),
            MessageId::parse(id).unwrap(),
            None,
            Bytes::from_static(b"{}"),
        )
    }

    fn with_attributes(id: &str, attributes: serde_json::Value) -> OutgoingMessage {
        let map = attributes.as_object().unwrap().clone();
        let parsed = Attributes::parse(|f| map.get(f.json_name()).map(Raw::Json)).unwrap();
        OutgoingMessage {
            attributes: Arc::new(parsed),
            trace: TraceContext::from_request(Some(TRACEPARENT), Some("vendor=1")).for_message(),
            ..message(id)
        }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    fn everything(dir: &Path) -> Vec<StoredMessage> {
        Store::open(dir)
            .unwrap()
            .lease("q", 10_000, Duration::from_secs(1))
            .unwrap()
            .into_iter()
            .map(|l| l.message)
            .collect()
    }

    #[tokio::test]
    async fn a_send_stores_every_attribute_and_its_trace_properties() {
        let dir = tempfile::tempdir().unwrap();
        let queue = EmbeddedQueue::open(dir.path()).unwrap();
        let sent = with_attributes(
            "m",
            json!({
                "subject": "order.created",
                "session_id": "customer-7",
                "partition_key": "customer-7",
                "time_to_live_s": 90,
                "scheduled_enqueue_time": "2000-01-01T01:00:00+01:00",
                "reply_to": "replies",
                "to": "billing",
                "properties": {"priority": "high", "attempt": 3, "ratio": 0.5, "urgent": true},
            }),
        );
        let traceparent = sent.trace.parent.to_string();
        assert!(!queue.send(sent, soon()).await.unwrap().duplicate);
        let stored = everything(dir.path()).remove(0);
        assert_eq!(
            serde_json::to_value(&stored.attributes).unwrap(),
            json!({
                "subject": "order.created",
                "session_id": "customer-7",
                "partition_key": "customer-7",
                "time_to_live_s": 90,
                "scheduled_enqueue_time": "2000-01-01T00:00:00Z",
                "reply_to": "replies",
                "to": "billing",
                "properties": {"priority": "high", "attempt": 3, "ratio": 0.5, "urgent": true},
            })
        );
        let trace: Vec<(&str, &str)> = stored
            .trace_properties
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            trace,
            [
                ("Diagnostic-Id", traceparent.as_str()),
                ("traceparent", traceparent.as_str()),
                ("tracestate", "vendor=1"),
            ]
        );
        // Scheduled in the past: receivable at once, expiring 90 s after it was stored.
        assert_eq!(stored.visible_at_ms, stored.enqueued_at_ms);
        assert_eq!(stored.expires_at_ms, Some(stored.enqueued_at_ms + 90_000));
    }

    #[tokio::test]
    async fn a_scheduled_send_is_stored_for_its_time() {
        let dir = tempfile::tempdir().unwrap();
        let queue = EmbeddedQueue::open(dir.path()).unwrap();
        let at = "2999-01-01T00:00:00Z";
        let sent = with_attributes("m", json!({"scheduled_enqueue_time": at}));
        queue.send(sent, soon()).await.unwrap();
        assert!(everything(dir.path()).is_empty(), "not receivable yet");
        let at_ms = OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
            .unwrap()
            .unix_timestamp()
            * 1_000;
        let store = Store::open_with_clock(dir.path(), Arc::new(move || at_ms)).unwrap();
        assert_eq!(store.depth("q").unwrap(), 1);
        drop(store);
        let mut later = Store::open_with_clock(dir.path(), Arc::new(move || at_ms)).unwrap();
        let due = later.lease("q", 10, Duration::from_secs(1)).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].message.visible_at_ms, at_ms);
        assert_eq!(due[0].message.expires_at_ms, None);
    }

    #[tokio::test]
    async fn a_message_without_attributes_stores_none_but_its_trace() {
        let dir = tempfile::tempdir().unwrap();
        let queue = EmbeddedQueue::open(dir.path()).unwrap();
        queue.send(message("m"), soon()).await.unwrap();
        let stored = everything(dir.path()).remove(0);
        assert!(stored.attributes.is_empty());
        assert_eq!(
            stored.trace_properties.keys().collect::<Vec<_>>(),
            ["Diagnostic-Id", "traceparent"],
            "no tracestate without one in the request"
        );
        assert_eq!(stored.expires_at_ms, None);
    }

    #[tokio::test]
    async fn an_id_reused_for_another_body_is_refused_and_a_retry_is_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let queue = EmbeddedQueue::open(dir.path()).unwrap();
        queue.send(message("k"), soon()).await.unwrap();
        let other = OutgoingMessage::new(
            QueueName::parse("q").unwrap(),
            MessageId::parse("k").unwrap(),
            None,
            Bytes::from_static(b"[]"),
        );
        assert_eq!(queue.send(other, soon()).await, Err(SendError::KeyReused));
        assert_eq!(
            queue.send(message("k"), soon()).await,
            Ok(SendReceipt { duplicate: true })
        );
        assert_eq!(queue.reader.lock().depth("q").unwrap(), 1);
    }

    #[tokio::test]
    async fn a_batch_reports_each_duplicate_as_single_sends_do() {
        let dir = tempfile::tempdir().unwrap();
        let queue = EmbeddedQueue::open(dir.path()).unwrap();
        queue.send(message("before"), soon()).await.unwrap();
        let results = queue
            .send_batch(
                vec![message("a"), message("before"), message("a"), message("b")],
                soon(),
            )
            .await;
        let duplicates: Vec<bool> = results.into_iter().map(|r| r.unwrap().duplicate).collect();
        assert_eq!(duplicates, [false, true, true, false]);
        assert_eq!(queue.reader.lock().depth("q").unwrap(), 3);
        assert!(queue.send_batch(Vec::new(), soon()).await.is_empty());
    }

    #[tokio::test]
    async fn a_batch_larger_than_a_transaction_is_stored_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let queue = EmbeddedQueue::open(dir.path()).unwrap();
        // The database refuses the batch's last message: had the writer split the batch
        // at MAX_BATCH, the first part would be stored.
        let refuse = Connection::open(database_path(dir.path())).unwrap();
        refuse
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON messages WHEN NEW.message_id = 'last'
                 BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
        let size = MAX_BATCH + 88;
        let batch = |last: &str| {
            let mut batch: Vec<_> = (1..size).map(|i| message(&format!("m-{i}"))).collect();
            batch.push(message(last));
            batch
        };
        let results = queue.send_batch(batch("last"), soon()).await;
        assert_eq!(results.len(), size);
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(SendError::Failed(e)) if e.contains("refused"))),
            "every message fails with the transaction"
        );
        assert_eq!(queue.reader.lock().depth("q").unwrap(), 0);
        let results = queue.send_batch(batch("fine"), soon()).await;
        assert!(results
            .iter()
            .all(|r| r == &Ok(SendReceipt { duplicate: false })));
        assert_eq!(queue.reader.lock().depth("q").unwrap(), size as u64);
    }

    /// A queue whose writer is `writer`, run on a thread of its own over the job channel.
    fn queue_with_writer(
        dir: &Path,
        writer: impl FnOnce(mpsc::Receiver<WriteJob>) + Send + 'static,
    ) -> EmbeddedQueue {
        let (jobs, inbox) = mpsc::channel(QUEUE_ROOM);
        std::thread::spawn(move || writer(inbox));
        EmbeddedQueue {
            jobs,
            reader: Arc::new(Mutex::new(Store::open(dir).unwrap())),
            condition: Arc::new(Condition::new()),
        }
    }

    /// A writer that takes one job and dies of a panic holding it.
    fn dies_holding_a_job(mut inbox: mpsc::Receiver<WriteJob>) {
        let _held = inbox.blocking_recv();
        panic!("the writer fails holding a job");
    }

    /// The writer dies holding the job (a panic, after its commit or before it): nothing
    /// says whether the message was stored, so the send's outcome is unknown (`502
    /// send_failed`, `outcome: unknown`): the producer retries with its key. `Unavailable` would say it never reached the store,
    /// and the dispatcher would store it again on a fallback.
    #[tokio::test]
    async fn a_writer_that_dies_holding_a_send_leaves_its_outcome_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let queue = queue_with_writer(dir.path(), dies_holding_a_job);
        let answer = queue.send(message("m-1"), soon()).await;
        assert!(matches!(answer, Err(SendError::Uncertain(_))), "{answer:?}");
    }

    /// The real writer thread over a commit that fails as `commit` says, and its queue.
    fn queue_over_commit(
        dir: &Path,
        reopen: impl FnMut() -> Result<Store, StoreError> + Send + 'static,
        commit: impl FnMut(&mut Store, Vec<WriteJob>, &Condition) + Send + 'static,
    ) -> (EmbeddedQueue, std::thread::JoinHandle<()>) {
        let (jobs, inbox) = mpsc::channel(QUEUE_ROOM);
        let condition = Arc::new(Condition::new());
        let kept = Arc::clone(&condition);
        let store = Store::open(dir).unwrap();
        let writer =
            std::thread::spawn(move || write_while_alive(store, reopen, inbox, &kept, commit));
        let queue = EmbeddedQueue {
            jobs,
            reader: Arc::new(Mutex::new(Store::open(dir).unwrap())),
            condition,
        };
        (queue, writer)
    }

    /// A commit that panics once (a bug): the send it held has an unknown outcome, the
    /// store's health says the writer began again, and the next send is stored by the loop
    /// begun again, which clears it.
    #[tokio::test]
    async fn a_writer_that_dies_of_a_panic_begins_again_and_the_next_send_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let mut panicked = false;
        let (queue, _writer) = queue_over_commit(
            dir.path(),
            move || Store::open(&path),
            move |store, jobs, condition| {
                if !std::mem::replace(&mut panicked, true) {
                    panic!("a bug in the commit");
                }
                commit(store, jobs, condition);
            },
        );
        let held = queue.send(message("m-1"), soon()).await;
        assert!(matches!(held, Err(SendError::Uncertain(_))), "{held:?}");
        // The held reply is dropped as the panic unwinds, before the writer begins again.
        let mut health = queue.store_health().unwrap();
        for _ in 0..500 {
            if !health.ok {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            health = queue.store_health().unwrap();
        }
        assert!(!health.ok);
        assert!(health.error.unwrap().contains("began again"));
        let next = queue.send(message("m-2"), soon()).await;
        assert_eq!(next, Ok(SendReceipt { duplicate: false }));
        assert!(queue.store_health().unwrap().ok);
        assert_eq!(queue.reader.lock().depth("q").unwrap(), 1);
    }

    /// A writer that cannot open the store again stops: the store's health says why, and
    /// every send after it is answered as never handed over (it may go to a fallback).
    #[tokio::test]
    async fn a_writer_that_cannot_reopen_the_store_stops_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let (queue, writer) = queue_over_commit(
            dir.path(),
            || {
                Err(StoreError::Output(std::io::Error::other(
                    "no room for a connection",
                )))
            },
            |_, _, _| panic!("a bug in the commit"),
        );
        let held = queue.send(message("m-1"), soon()).await;
        assert!(matches!(held, Err(SendError::Uncertain(_))), "{held:?}");
        writer.join().unwrap();
        let health = queue.store_health().unwrap();
        assert!(!health.ok);
        assert!(health.error.unwrap().contains("cannot reopen the store"));
        let after = queue.send(message("m-2"), soon()).await;
        assert!(matches!(after, Err(SendError::Unavailable(_))), "{after:?}");
    }

    /// A batch handed over whole and dropped unanswered: every entry's outcome is unknown
    /// (the dispatcher reroutes a batch only when every entry is `Unavailable`).
    #[tokio::test]
    async fn a_writer_that_dies_holding_a_batch_leaves_every_entry_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let queue = queue_with_writer(dir.path(), dies_holding_a_job);
        let answers = queue
            .send_batch(vec![message("b-1"), message("b-2"), message("b-3")], soon())
            .await;
        assert_eq!(answers.len(), 3);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(SendError::Uncertain(_)))),
            "{answers:?}"
        );
    }

    /// A writer gone before the send was handed to it never saw the message: it may go
    /// elsewhere.
    #[tokio::test]
    async fn a_writer_gone_before_the_send_was_handed_over_never_saw_it() {
        let dir = tempfile::tempdir().unwrap();
        let queue = queue_with_writer(dir.path(), drop);
        while !queue.jobs.is_closed() {
            tokio::task::yield_now().await;
        }
        let answer = queue.send(message("m-1"), soon()).await;
        assert!(
            matches!(answer, Err(SendError::Unavailable(_))),
            "{answer:?}"
        );
    }

    fn job(size: usize) -> (WriteJob, oneshot::Receiver<Result<Vec<Stored>, SendError>>) {
        let (reply, answer) = oneshot::channel();
        let messages = (0..size)
            .map(|i| Prepared::new(message(&format!("m-{size}-{i}"))))
            .collect();
        (WriteJob { messages, reply }, answer)
    }

    fn sizes(jobs: &[WriteJob]) -> Vec<usize> {
        jobs.iter().map(|j| j.messages.len()).collect()
    }

    #[test]
    fn a_transaction_counts_messages_and_never_splits_a_job() {
        let (tx, mut inbox) = mpsc::channel(16);
        let mut answers = Vec::new();
        for size in [1, 300, 211, 2, 600, 5] {
            let (job, answer) = job(size);
            answers.push(answer);
            tx.try_send(job).ok().unwrap();
        }
        let next = inbox.try_recv().unwrap();
        // 1 + 300 + 211 = 512 fill a transaction; the 2 waits for the next.
        let (jobs, carried) = gather(next, &mut inbox);
        assert_eq!(sizes(&jobs), [1, 300, 211]);
        assert!(carried.is_none(), "full: nothing more was taken");
        let next = inbox.try_recv().unwrap();
        // 2, then 600 does not fit: handed back whole to open the next one.
        let (jobs, carried) = gather(next, &mut inbox);
        assert_eq!(sizes(&jobs), [2]);
        let carried = carried.unwrap();
        assert_eq!(carried.messages.len(), 600);
        // Larger than a transaction, it goes alone and whole.
        let (jobs, carried) = gather(carried, &mut inbox);
        assert_eq!(sizes(&jobs), [600]);
        assert!(carried.is_none());
        let (jobs, carried) = gather(inbox.try_recv().unwrap(), &mut inbox);
        assert_eq!((sizes(&jobs), carried.is_none()), (vec![5], true));
    }

    #[test]
    fn a_full_disk_is_busy_and_any_other_write_error_a_failure() {
        let sqlite = |code| {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                None,
            ))
        };
        for full in [
            rusqlite::ffi::SQLITE_FULL,
            rusqlite::ffi::SQLITE_IOERR_SHMSIZE,
        ] {
            assert!(matches!(
                refusal(&sqlite(full)),
                SendError::Busy { retry_after: Some(after), .. } if after == DISK_FULL_RETRY_AFTER
            ));
        }
        for other in [
            rusqlite::ffi::SQLITE_CONSTRAINT,
            rusqlite::ffi::SQLITE_IOERR_READ,
        ] {
            assert!(matches!(refusal(&sqlite(other)), SendError::Failed(_)));
        }
    }

    #[test]
    fn the_store_condition_logs_a_run_of_failures_once_and_clears_at_the_next_commit() {
        let condition = Condition::new();
        let started = condition.0.lock().since;
        assert!(
            condition.failed("the disk is full".into()),
            "a run starts: logged"
        );
        let failing = condition.0.lock().clone();
        assert!(!failing.ok && failing.since >= started);
        assert!(
            !condition.failed("the disk is full".into()),
            "the same run: not again"
        );
        assert_eq!(
            condition.0.lock().since,
            failing.since,
            "since the run began"
        );
        assert!(
            condition.failed("disk I/O error".into()),
            "a new reason: logged"
        );
        condition.wrote();
        let health = condition.0.lock().clone();
        assert!(health.ok && health.error.is_none() && health.since >= failing.since);
        condition.wrote();
        assert_eq!(
            condition.0.lock().since,
            health.since,
            "ok since the first good commit"
        );
    }

    #[test]
    fn a_job_nobody_waits_for_takes_no_room_and_is_not_stored() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path()).unwrap();
        let (tx, mut inbox) = mpsc::channel(16);
        let (abandoned, answer) = job(500);
        drop(answer);
        tx.try_send(abandoned).ok().unwrap();
        let (kept, mut kept_answer) = job(100);
        tx.try_send(kept).ok().unwrap();
        let (first, first_answer) = job(3);
        let (jobs, carried) = gather(first, &mut inbox);
        assert_eq!(sizes(&jobs), [3, 100], "the abandoned 500 took no room");
        assert!(carried.is_none());
        // The caller of a gathered job gives up before the commit: skipped whole.
        drop(first_answer);
        commit(&mut store, jobs, &Condition::new());
        assert_eq!(store.depth("q").unwrap(), 100);
        assert_eq!(kept_answer.try_recv().unwrap().unwrap().len(), 100);
    }
}
