//! A lane: one backend as the dispatcher sees it: the backend, its circuit breaker, one
//! capacity gate per queue, and the last health probe.
//!
//! Probes run on their own timer against the backend's admin plane and never take an
//! in-flight slot or touch the breaker: a healthy probe must not hide a failing request
//! path, and a failing probe alone must not take a working one out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::breaker::{Breaker, BreakerPolicy};
use super::ceiling::CapacityGate;
use crate::backend::Backend;
use crate::domain::QueueName;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendRole {
    Primary,
    Fallback,
}

impl BackendRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Fallback => "fallback",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeStatus {
    pub ok: bool,
    pub at: SystemTime,
    pub error: Option<String>,
}

pub struct Lane {
    pub role: BackendRole,
    pub breaker: Arc<Breaker>,
    backend: Arc<dyn Backend>,
    gates: HashMap<QueueName, Arc<CapacityGate>>,
    probe: Mutex<Option<ProbeStatus>>,
    /// `send_failed` is logged at most once a second per lane.
    pub send_failed_log: crate::telemetry::EveryPeriod,
}

impl Lane {
    /// A lane over `backend` with one gate per queue, each built whole.
    pub fn new(
        role: BackendRole,
        backend: Arc<dyn Backend>,
        gates: impl IntoIterator<Item = Arc<CapacityGate>>,
        breaker: BreakerPolicy,
    ) -> Self {
        Self {
            role,
            breaker: Breaker::new(role.as_str(), breaker),
            backend,
            gates: gates
                .into_iter()
                .map(|gate| (gate.queue().clone(), gate))
                .collect(),
            probe: Mutex::new(None),
            send_failed_log: crate::telemetry::EveryPeriod::new(Duration::from_secs(1)),
        }
    }

    /// The replica drained: each queue's seat leaves the fleet, all at once.
    pub async fn leave_fleet(&self) {
        futures_util::future::join_all(self.gates.values().map(|g| g.leave_fleet())).await;
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn kind(&self) -> &'static str {
        self.backend.kind()
    }

    pub fn gate(&self, queue: &QueueName) -> Option<&Arc<CapacityGate>> {
        self.gates.get(queue)
    }

    pub fn gates(&self) -> impl Iterator<Item = &Arc<CapacityGate>> {
        self.gates.values()
    }

    pub fn last_probe(&self) -> Option<ProbeStatus> {
        self.probe.lock().clone()
    }

    pub async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        self.backend.warm_up(deadline).await
    }

    pub async fn prime_capacity(&self) {
        let reads = self.gates.values().map(|g| g.prime());
        futures_util::future::join_all(reads).await;
    }

    /// One probe: a depth read of the first queue on the admin plane, bounded by `timeout`.
    pub async fn probe(&self, timeout: Duration) {
        let Some(queue) = self.gates.keys().min() else {
            return;
        };
        let deadline = Instant::now() + timeout;
        let result = tokio::time::timeout_at(deadline, self.backend.backlog(queue, deadline)).await;
        let status = match result {
            Ok(Ok(_)) => ProbeStatus {
                ok: true,
                at: SystemTime::now(),
                error: None,
            },
            Ok(Err(e)) => ProbeStatus {
                ok: false,
                at: SystemTime::now(),
                error: Some(e.to_string()),
            },
            Err(_) => ProbeStatus {
                ok: false,
                at: SystemTime::now(),
                error: Some("timed out".into()),
            },
        };
        *self.probe.lock() = Some(status);
    }
}
