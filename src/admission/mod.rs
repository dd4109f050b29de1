//! The gates a send passes after its input is valid, in the contract's order:
//! capacity (backlog ceiling, fail-closed), then the in-flight limit, then the send itself
//! under its deadline. [`Dispatcher`] strings them together.

pub mod capacity;
pub mod inflight;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, OutgoingMessage, SendError, SendReceipt};
use crate::domain::QueueName;
use capacity::{CapacityGate, Refusal, SendOutcome};
use inflight::InFlight;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchError {
    /// Capacity said no: queue full, or depth unknown with the gate on.
    Refused(Refusal),
    /// Every in-flight slot is taken; answered at once, never queued.
    Saturated,
    /// The queue is not one this dispatcher serves.
    UnknownQueue,
    /// The broker did not take the message (or may not have, for a timeout).
    Send(SendError),
}

pub struct Dispatcher {
    backend: Arc<dyn Backend>,
    gates: HashMap<QueueName, Arc<CapacityGate>>,
    in_flight: InFlight,
    send_timeout: Duration,
}

impl Dispatcher {
    pub fn new(
        backend: Arc<dyn Backend>,
        gates: impl IntoIterator<Item = Arc<CapacityGate>>,
        in_flight: InFlight,
        send_timeout: Duration,
    ) -> Self {
        Self {
            backend,
            gates: gates.into_iter().map(|g| (g.queue().clone(), g)).collect(),
            in_flight,
            send_timeout,
        }
    }

    pub fn backend_kind(&self) -> &'static str {
        self.backend.kind()
    }

    pub fn gates(&self) -> impl Iterator<Item = &Arc<CapacityGate>> {
        self.gates.values()
    }

    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// Connect the backend ahead of the first send.
    pub async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        self.backend.warm_up(deadline).await
    }

    /// Make every queue's first depth read now, concurrently, so the first sends find the
    /// backlog known (or the streak started).
    pub async fn prime_capacity(&self) {
        let reads = self.gates.values().map(|g| g.prime(self.backend.as_ref()));
        futures_util::future::join_all(reads).await;
    }

    /// Admit and send one message. Dropping the returned future at any point gives back
    /// its in-flight slot and its place under the ceiling.
    pub async fn send(&self, message: OutgoingMessage) -> Result<SendReceipt, DispatchError> {
        let gate = self
            .gates
            .get(&message.queue)
            .ok_or(DispatchError::UnknownQueue)?;
        let reservation = gate
            .admit(self.backend.as_ref())
            .await
            .map_err(DispatchError::Refused)?;
        let Some(_slot) = self.in_flight.try_acquire() else {
            reservation.finish(SendOutcome::NotStored);
            tracing::debug!(event = "send_saturated", queue = %message.queue);
            return Err(DispatchError::Saturated);
        };
        let deadline = Instant::now() + self.send_timeout;
        // The deadline goes into the backend, which cancels its own work; the outer timeout
        // is the backstop for a backend that ignores it.
        let result = tokio::time::timeout_at(deadline, self.backend.send(message, deadline))
            .await
            .unwrap_or(Err(SendError::Timeout));
        reservation.finish(match &result {
            Ok(receipt) if receipt.duplicate => SendOutcome::NotStored,
            Ok(_) => SendOutcome::Stored,
            Err(SendError::Timeout | SendError::Unavailable(_) | SendError::Failed(_)) => {
                SendOutcome::Unknown
            }
            Err(_) => SendOutcome::NotStored,
        });
        result.map_err(DispatchError::Send)
    }
}
