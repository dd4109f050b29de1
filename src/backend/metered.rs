//! Counts every call that reaches a backend, so tests and metrics can prove which
//! requests touched the broker and which did not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::domain::QueueName;

#[derive(Debug, Default)]
pub struct BackendCalls {
    sends: AtomicU64,
    backlog_reads: AtomicU64,
}

impl BackendCalls {
    pub fn sends(&self) -> u64 {
        self.sends.load(Ordering::Relaxed)
    }

    pub fn backlog_reads(&self) -> u64 {
        self.backlog_reads.load(Ordering::Relaxed)
    }

    pub fn total(&self) -> u64 {
        self.sends() + self.backlog_reads()
    }
}

/// A backend wrapped so that every call is counted.
pub struct Metered {
    inner: Arc<dyn Backend>,
    calls: Arc<BackendCalls>,
}

impl Metered {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self {
            inner,
            calls: Arc::default(),
        }
    }

    pub fn calls(&self) -> Arc<BackendCalls> {
        self.calls.clone()
    }
}

#[async_trait]
impl Backend for Metered {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn send(
        &self,
        message: OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        self.calls.sends.fetch_add(1, Ordering::Relaxed);
        self.inner.send(message, deadline).await
    }

    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError> {
        self.calls.backlog_reads.fetch_add(1, Ordering::Relaxed);
        self.inner.backlog(queue, deadline).await
    }

    fn depth_lag(&self) -> std::time::Duration {
        self.inner.depth_lag()
    }

    async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        self.inner.warm_up(deadline).await
    }
}
