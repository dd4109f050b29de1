//! The embedded backend: a durable queue on local disk, so the gateway runs on a laptop
//! with no broker.
//!
//! Sends go to one writer thread over a bounded channel. The writer takes whatever is
//! waiting (up to [`MAX_BATCH`]) and commits it in one transaction, so one fsync covers
//! many sends. A send whose caller has already given up (deadline passed, client gone)
//! is dropped by the writer before it is written: that is how the deadline cancels the
//! operation rather than leaving it to run on in the background.

mod store;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

pub use store::{
    database_path, unix_ms, LeasedMessage, Store, StoreError, StoredMessage, DUPLICATE_WINDOW,
    MAX_LEASE,
};

use super::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::domain::QueueName;

/// Most sends committed in one transaction.
const MAX_BATCH: usize = 512;
/// Sends waiting for the writer before new ones wait for room.
const QUEUE_ROOM: usize = 4096;
const PRUNE_EVERY: Duration = Duration::from_secs(60);

struct WriteJob {
    message: OutgoingMessage,
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
        let now_ms = unix_ms(SystemTime::now());
        let rows: Vec<store::NewMessage<'_>> = batch
            .iter()
            .map(|job| store::NewMessage {
                queue: job.message.queue.as_str(),
                message_id: job.message.message_id.as_str(),
                correlation_id: job.message.correlation_id.as_ref().map(|c| c.as_str()),
                body: &job.message.body,
            })
            .collect();
        let outcome = store.insert_batch(&rows, now_ms);
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
            if let Err(e) = store.prune_seen_ids(now_ms) {
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
