//! The gates a send passes after its input is valid, in the contract's order:
//! route (primary, or the fallback while the primary's circuit is open) → capacity
//! (backlog ceiling, fail-closed) → the in-flight limit → the circuit breaker → the send
//! itself under its deadline. [`Dispatcher`] strings them together; each gate is its own
//! module.

pub mod breaker;
pub mod capacity;
pub mod inflight;
mod route;

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{OutgoingMessage, SendError, SendReceipt};
use crate::config::ForceBackend;
use breaker::Outcome;
use capacity::{Refusal, SendOutcome};
use inflight::InFlight;
pub use route::{BackendRole, ProbeStatus, Route};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchError {
    /// Capacity said no: queue full, or depth unknown with the gate on.
    Refused(Refusal),
    /// Every in-flight slot is taken; answered at once, never queued. Not a backend failure.
    Saturated,
    /// The queue is not one this dispatcher serves.
    UnknownQueue,
    /// The circuit is open and no fallback can take the send.
    BackendUnavailable { retry_after: Duration },
    /// The broker did not take the message (or may not have, for a timeout).
    Send(SendError),
}

/// The result of one dispatch, and which backend it went to (if it got that far).
pub struct Dispatched {
    pub via: Option<BackendRole>,
    pub result: Result<SendReceipt, DispatchError>,
    /// How long the backend send itself took, when one was made.
    pub send_time: Option<Duration>,
}

pub struct Dispatcher {
    primary: Route,
    fallback: Option<Route>,
    force: Option<ForceBackend>,
    in_flight: InFlight,
    send_timeout: Duration,
}

impl Dispatcher {
    pub fn new(
        primary: Route,
        fallback: Option<Route>,
        force: Option<ForceBackend>,
        in_flight: InFlight,
        send_timeout: Duration,
    ) -> Self {
        Self {
            primary,
            fallback,
            force,
            in_flight,
            send_timeout,
        }
    }

    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        std::iter::once(&self.primary).chain(self.fallback.as_ref())
    }

    pub fn primary(&self) -> &Route {
        &self.primary
    }

    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// Connect every backend ahead of the first send.
    pub async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        let results =
            futures_util::future::join_all(self.routes().map(|r| r.warm_up(deadline))).await;
        results.into_iter().collect()
    }

    /// Make every queue's first depth read now, so the first sends find the backlog known.
    pub async fn prime_capacity(&self) {
        futures_util::future::join_all(self.routes().map(Route::prime_capacity)).await;
    }

    /// Which backend takes the next send: the primary while its circuit lets sends through,
    /// else the fallback; `SENDGATE_FORCE_BACKEND` pins the choice (primary = never fail over).
    fn choose(&self) -> Result<&Route, Duration> {
        match (self.force, &self.fallback) {
            (Some(ForceBackend::Primary), _) | (None, None) => Ok(&self.primary),
            (Some(ForceBackend::Fallback), Some(fallback)) => Ok(fallback),
            (Some(ForceBackend::Fallback), None) => Ok(&self.primary),
            (None, Some(fallback)) => {
                if self.primary.breaker.would_allow() {
                    Ok(&self.primary)
                } else if fallback.breaker.would_allow() {
                    Ok(fallback)
                } else {
                    Err(self.primary.breaker.retry_after())
                }
            }
        }
    }

    /// Admit and send one message. Dropping the future at any point gives back its
    /// in-flight slot, its place under the ceiling and its breaker ticket.
    pub async fn send(&self, message: OutgoingMessage) -> Dispatched {
        let route = match self.choose() {
            Ok(route) => route,
            Err(retry_after) => {
                return Dispatched {
                    via: None,
                    result: Err(DispatchError::BackendUnavailable { retry_after }),
                    send_time: None,
                }
            }
        };
        if route.role == BackendRole::Fallback {
            tracing::debug!(event = "fallback_selected", queue = %message.queue, "primary circuit open: using the fallback");
        }
        let mut send_time = None;
        let result = self.send_via(route, message, &mut send_time).await;
        Dispatched {
            via: Some(route.role),
            result,
            send_time,
        }
    }

    async fn send_via(
        &self,
        route: &Route,
        message: OutgoingMessage,
        send_time: &mut Option<Duration>,
    ) -> Result<SendReceipt, DispatchError> {
        let gate = route
            .gate(&message.queue)
            .ok_or(DispatchError::UnknownQueue)?;
        let reservation = gate
            .admit(route.backend())
            .await
            .map_err(DispatchError::Refused)?;
        let Some(_slot) = self.in_flight.try_acquire() else {
            reservation.finish(SendOutcome::NotStored);
            tracing::debug!(event = "send_saturated", queue = %message.queue);
            return Err(DispatchError::Saturated);
        };
        let ticket = match route.breaker.try_acquire() {
            Ok(ticket) => ticket,
            Err(retry_after) => {
                reservation.finish(SendOutcome::NotStored);
                return Err(DispatchError::BackendUnavailable { retry_after });
            }
        };
        let started = Instant::now();
        let deadline = started + self.send_timeout;
        // The deadline goes into the backend, which cancels its own work; the outer timeout
        // is the backstop for a backend that ignores it.
        let result = tokio::time::timeout_at(deadline, route.backend().send(message, deadline))
            .await
            .unwrap_or(Err(SendError::Timeout));
        *send_time = Some(started.elapsed());
        ticket.record(match &result {
            Ok(_) => Outcome::Success,
            // The request's own fault, or the queue's configuration: not the backend's health.
            Err(SendError::TooLarge | SendError::QueueDisabled) => Outcome::Neutral,
            Err(_) => Outcome::Failure,
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, Backlog, DepthError};
    use crate::config::CapacitySettings;
    use crate::domain::{MessageId, QueueName};
    use async_trait::async_trait;
    use breaker::BreakerPolicy;
    use std::sync::Arc;

    /// A broker whose sends never answer.
    struct Hung;

    #[async_trait]
    impl Backend for Hung {
        fn kind(&self) -> &'static str {
            "hung"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            std::future::pending().await
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(0))
        }
    }

    fn dispatcher(max: usize) -> (Arc<Dispatcher>, QueueName) {
        let queue = QueueName::parse("q").unwrap();
        let capacity = CapacitySettings {
            max_queue_depth: 1000,
            fail_closed: false,
            fail_closed_streak: 3,
            depth_ttl: Duration::from_secs(60),
            admin_timeout: Duration::from_secs(1),
        };
        let route = Route::new(
            BackendRole::Primary,
            Arc::new(Hung),
            std::slice::from_ref(&queue),
            &capacity,
            BreakerPolicy::default(),
        );
        (
            Arc::new(Dispatcher::new(
                route,
                None,
                None,
                InFlight::new(max),
                Duration::from_secs(3600),
            )),
            queue,
        )
    }

    fn message(queue: &QueueName) -> OutgoingMessage {
        OutgoingMessage {
            queue: queue.clone(),
            message_id: MessageId::generate(),
            correlation_id: None,
            body: bytes::Bytes::from_static(b"{}"),
        }
    }

    #[tokio::test]
    async fn a_dropped_send_gives_its_slot_back_at_once() {
        let (d, queue) = dispatcher(2);
        let sends: Vec<_> = (0..2)
            .map(|_| {
                let (d, m) = (d.clone(), message(&queue));
                tokio::spawn(async move { d.send(m).await.result })
            })
            .collect();
        while d.in_flight().current() < 2 {
            tokio::task::yield_now().await;
        }
        let third = d.send(message(&queue)).await;
        assert_eq!(third.result, Err(DispatchError::Saturated));
        for s in &sends {
            s.abort();
        }
        for s in sends {
            let _ = s.await;
        }
        assert_eq!(
            d.in_flight().current(),
            0,
            "aborted (dropped) sends hold nothing"
        );
        assert_eq!(
            d.primary().breaker.state(),
            breaker::BreakerState::Closed,
            "neither saturation nor a drop is a failure"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn hung_sends_end_at_the_deadline_and_open_the_breaker() {
        let (d, queue) = dispatcher(64);
        let mut sends = Vec::new();
        for _ in 0..10 {
            let (d, m) = (d.clone(), message(&queue));
            sends.push(tokio::spawn(async move { d.send(m).await.result }));
        }
        for s in sends {
            assert_eq!(
                s.await.unwrap(),
                Err(DispatchError::Send(SendError::Timeout))
            );
        }
        assert_eq!(d.in_flight().current(), 0);
        assert_eq!(d.primary().breaker.state(), breaker::BreakerState::Open);
        let next = d.send(message(&queue)).await;
        assert!(matches!(
            next.result,
            Err(DispatchError::BackendUnavailable { .. })
        ));
    }
}
