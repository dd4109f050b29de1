//! The embedded backend: a durable queue on local disk, so the gateway runs on a laptop
//! with no broker.
//!
//! Sends go to one writer thread over a bounded channel. The writer takes whatever is
//! waiting (up to [`MAX_BATCH`]) and commits it in one transaction, so one fsync covers
//! many sends. A send whose caller has already given up (deadline passed, client gone)
//! is dropped by the writer before it is written: that is how the deadline cancels the
//! operation rather than leaving it to run on in the background.
//!
//! Every attribute is stored with its message and honoured there (store.rs: scheduling,
//! expiry); the trace properties the gateway adds are stored beside them.

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
    database_path, system_clock, unix_ms, Clock, LeasedMessage, Store, StoreError, StoredMessage,
    DUPLICATE_WINDOW, MAX_LEASE,
};

use super::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::domain::{Attributes, QueueName};

/// Most sends committed in one transaction.
const MAX_BATCH: usize = 512;
/// Sends waiting for the writer before new ones wait for room.
const QUEUE_ROOM: usize = 4096;
const PRUNE_EVERY: Duration = Duration::from_secs(60);

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

struct WriteJob {
    message: Prepared,
    reply: oneshot::Sender<Result<SendReceipt, SendError>>,
}

pub struct EmbeddedQueue {
    jobs: mpsc::Sender<WriteJob>,
    reader: Arc<Mutex<Store>>,
}

impl EmbeddedQueue {
    /// Open the queue under `data_dir` and start its writer thread.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let writer = Store::open(data_dir)?;
        let reader = Store::open(data_dir)?;
        let (jobs, inbox) = mpsc::channel(QUEUE_ROOM);
        std::thread::Builder::new()
            .name("sendgate-embedded-writer".into())
            .spawn(move || write_loop(writer, inbox))
            .map_err(StoreError::Output)?;
        Ok(Self {
            jobs,
            reader: Arc::new(Mutex::new(reader)),
        })
    }
}

fn write_loop(mut store: Store, mut inbox: mpsc::Receiver<WriteJob>) {
    let mut batch: Vec<WriteJob> = Vec::with_capacity(MAX_BATCH);
    let mut last_prune = std::time::Instant::now();
    while let Some(first) = inbox.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // The caller gave up (deadline or disconnect): never store what nobody waits for.
        batch.retain(|job| !job.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let rows: Vec<store::NewMessage<'_>> = batch.iter().map(|job| job.message.row()).collect();
        let outcome = store.insert_batch(&rows);
        drop(rows);
        match outcome {
            Ok(duplicates) => {
                for (job, duplicate) in batch.drain(..).zip(duplicates) {
                    let _ = job.reply.send(Ok(SendReceipt { duplicate }));
                }
            }
            Err(e) => {
                tracing::error!(event = "embedded_write_failed", error = %e, "embedded queue write failed");
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(SendError::Failed(e.to_string())));
                }
            }
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = std::time::Instant::now();
            if let Err(e) = store.prune_seen_ids() {
                tracing::warn!(error = %e, "could not prune the duplicate-detection history");
            }
        }
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
        let write = async {
            let (reply, answer) = oneshot::channel();
            let message = Prepared::new(message);
            self.jobs
                .send(WriteJob { message, reply })
                .await
                .map_err(|_| SendError::Unavailable("the embedded writer has stopped".into()))?;
            answer
                .await
                .map_err(|_| SendError::Unavailable("the embedded writer has stopped".into()))?
        };
        // Dropping `write` at the deadline drops the reply receiver, which tells the
        // writer to skip the message if it has not committed it yet.
        tokio::time::timeout_at(deadline, write)
            .await
            .map_err(|_| SendError::Timeout)?
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
}
