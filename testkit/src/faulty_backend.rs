//! A real backend wrapped in a decorator that counts every call and can misbehave on
//! purpose. The gateway is assembled with it through `Application::build_with`, so the
//! production code carries no test switches.
//!
//! The embedded queue has no admin plane that could fail for real, so tests of the
//! fail-closed gate and of in-flight limits use [`FaultyBackend::fail_depth_reads`] and
//! [`FaultyBackend::hold_sends`]; the RabbitMQ and Service Bus suites use real faults.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use sendgate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use sendgate::domain::{Attributes, Field, QueueName};

pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    fail_depth_reads: AtomicBool,
    hold_sends: watch::Sender<bool>,
    /// Messages whose broker id contains this fail as the broker refusing them would.
    fail_ids_containing: parking_lot::Mutex<Option<String>>,
    sends: AtomicU64,
    batch_sends: AtomicU64,
    backlog_reads: AtomicU64,
}

impl FaultyBackend {
    pub fn wrap(inner: Arc<dyn Backend>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            fail_depth_reads: AtomicBool::new(false),
            hold_sends: watch::Sender::new(false),
            fail_ids_containing: parking_lot::Mutex::new(None),
            sends: AtomicU64::new(0),
            batch_sends: AtomicU64::new(0),
            backlog_reads: AtomicU64::new(0),
        })
    }

    /// Make every message whose broker id contains `marker` fail at the broker (`None`:
    /// none do), single or in a batch; the others go on to the backend.
    pub fn fail_ids_containing(&self, marker: Option<&str>) {
        *self.fail_ids_containing.lock() = marker.map(str::to_owned);
    }

    /// Batch sends (calls of `send_batch`) that reached the decorator.
    pub fn batch_sends(&self) -> u64 {
        self.batch_sends.load(Ordering::SeqCst)
    }

    fn fails(&self, message: &OutgoingMessage) -> bool {
        self.fail_ids_containing
            .lock()
            .as_deref()
            .is_some_and(|m| message.message_id.as_str().contains(m))
    }

    async fn wait_unheld(&self, deadline: Instant) -> Result<(), SendError> {
        let mut held = self.hold_sends.subscribe();
        tokio::time::timeout_at(deadline, held.wait_for(|hold| !*hold))
            .await
            .map_err(|_| SendError::Timeout)?
            .map_err(|_| SendError::Unavailable("the fault switch is gone".into()))?;
        Ok(())
    }

    /// Make every depth read fail (`true`) or reach the backend again (`false`).
    pub fn fail_depth_reads(&self, fail: bool) {
        self.fail_depth_reads.store(fail, Ordering::SeqCst);
    }

    /// Hold every send before it reaches the backend (`true`) until released (`false`);
    /// a held send still ends at its deadline, as a hung broker's would.
    pub fn hold_sends(&self, hold: bool) {
        self.hold_sends.send_replace(hold);
    }

    /// Sends that reached the decorator (held ones included).
    pub fn sends(&self) -> u64 {
        self.sends.load(Ordering::SeqCst)
    }

    /// Depth reads that reached the decorator (failed ones included).
    pub fn backlog_reads(&self) -> u64 {
        self.backlog_reads.load(Ordering::SeqCst)
    }

    pub fn total_calls(&self) -> u64 {
        self.sends() + self.backlog_reads()
    }
}

#[async_trait]
impl Backend for FaultyBackend {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn send(
        &self,
        message: OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        self.sends.fetch_add(1, Ordering::SeqCst);
        self.wait_unheld(deadline).await?;
        if self.fails(&message) {
            return Err(SendError::Failed(
                "injected fault: this message fails".into(),
            ));
        }
        self.inner.send(message, deadline).await
    }

    async fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
        deadline: Instant,
    ) -> Vec<Result<SendReceipt, SendError>> {
        self.sends
            .fetch_add(messages.len() as u64, Ordering::SeqCst);
        self.batch_sends.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.wait_unheld(deadline).await {
            return vec![Err(e); messages.len()];
        }
        let failing: Vec<bool> = messages.iter().map(|m| self.fails(m)).collect();
        let passing: Vec<OutgoingMessage> = messages
            .into_iter()
            .zip(&failing)
            .filter(|(_, fails)| !**fails)
            .map(|(m, _)| m)
            .collect();
        let mut passed = self.inner.send_batch(passing, deadline).await.into_iter();
        failing
            .into_iter()
            .map(|fails| {
                if fails {
                    Err(SendError::Failed(
                        "injected fault: this message fails".into(),
                    ))
                } else {
                    passed
                        .next()
                        .unwrap_or(Err(SendError::Uncertain("no result".into())))
                }
            })
            .collect()
    }

    fn unsupported(&self, attributes: &Attributes) -> Option<Field> {
        self.inner.unsupported(attributes)
    }

    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError> {
        self.backlog_reads.fetch_add(1, Ordering::SeqCst);
        if self.fail_depth_reads.load(Ordering::SeqCst) {
            return Err(DepthError::Failed(
                "injected fault: depth reads fail".into(),
            ));
        }
        self.inner.backlog(queue, deadline).await
    }

    fn depth_lag(&self) -> Duration {
        self.inner.depth_lag()
    }

    fn depth_lag_in_force(&self) -> Option<sendgate::backend::DepthLag> {
        self.inner.depth_lag_in_force()
    }

    fn store_health(&self) -> Option<sendgate::backend::StoreHealth> {
        self.inner.store_health()
    }

    async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        self.inner.warm_up(deadline).await
    }
}
