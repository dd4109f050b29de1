//! The gateway's lifecycle, one source of truth for `/health/*` and for admission:
//!
//! ```text
//! starting ──(warm-up done, or its time budget spent)──▶ running ──(SIGTERM/SIGINT, POST /admin/drain)──▶ draining ──▶ stopped
//! ```
//!
//! The listener answers from the start, so probes see an honest `starting` (503); warm-up
//! (connect the backends, read each queue's depth once) is bounded by a time budget, after
//! which the gateway runs anyway and the capacity rules decide what happens to sends.
//!
//! While draining, new sends are refused with `Retry-After` set to the seconds left in the
//! drain window, and sends already admitted run to completion. The drain ends when no send
//! is in flight or when the window closes, whichever is first.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The states are wire vocabulary (`/health/*` announces them, the client reads them).
pub use sendgate_wire::GatewayState;

/// The state as stored in the atomic: 0 starting, 1 running, 2 draining, 3 stopped.
fn state_from_u8(v: u8) -> GatewayState {
    match v {
        0 => GatewayState::Starting,
        1 => GatewayState::Running,
        2 => GatewayState::Draining,
        _ => GatewayState::Stopped,
    }
}

/// Why a new send may not start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAdmitting {
    Starting,
    Draining { retry_after: Duration },
    Stopped,
}

#[derive(Clone)]
pub struct Lifecycle {
    inner: Arc<Inner>,
}

struct Inner {
    state: AtomicU8,
    drain_deadline: Mutex<Option<Instant>>,
    sends: AtomicUsize,
    idle: Notify,
    changed: Notify,
}

/// Counts one send as in flight for the drain until dropped.
pub struct SendGuard {
    inner: Arc<Inner>,
}

impl Drop for SendGuard {
    fn drop(&mut self) {
        if self.inner.sends.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

/// What `/health/detailed` shows of a drain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrainStatus {
    pub remaining: Duration,
    pub in_flight: usize,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                state: AtomicU8::new(0),
                drain_deadline: Mutex::new(None),
                sends: AtomicUsize::new(0),
                idle: Notify::new(),
                changed: Notify::new(),
            }),
        }
    }

    pub fn state(&self) -> GatewayState {
        state_from_u8(self.inner.state.load(Ordering::SeqCst))
    }

    pub fn set_running(&self) {
        let _ = self
            .inner
            .state
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
    }

    pub fn set_stopped(&self) {
        self.inner.state.store(3, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
    }

    /// Enter `draining` with a window of `window`. Returns false if already draining or stopped.
    pub fn begin_drain(&self, window: Duration) -> bool {
        let mut deadline = self.inner.drain_deadline.lock();
        let previous = self.inner.state.load(Ordering::SeqCst);
        if previous >= 2 {
            return false;
        }
        *deadline = Some(Instant::now() + window);
        self.inner.state.store(2, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
        true
    }

    pub fn drain_status(&self) -> Option<DrainStatus> {
        if self.state() != GatewayState::Draining {
            return None;
        }
        let deadline = (*self.inner.drain_deadline.lock())?;
        Some(DrainStatus {
            remaining: deadline.saturating_duration_since(Instant::now()),
            in_flight: self.inner.sends.load(Ordering::SeqCst),
        })
    }

    /// Admit a new send, or say why not. The guard keeps the drain waiting for it.
    pub fn admit_send(&self) -> Result<SendGuard, NotAdmitting> {
        // Count first, then check (both sequentially consistent, as the drain sets the state
        // then reads the count): a drain that starts in between sees this send and waits.
        self.inner.sends.fetch_add(1, Ordering::SeqCst);
        let guard = SendGuard {
            inner: self.inner.clone(),
        };
        match self.state() {
            GatewayState::Running => Ok(guard),
            GatewayState::Starting => Err(NotAdmitting::Starting),
            GatewayState::Stopped => Err(NotAdmitting::Stopped),
            GatewayState::Draining => {
                let remaining = self.drain_status().map(|d| d.remaining).unwrap_or_default();
                Err(NotAdmitting::Draining {
                    retry_after: remaining,
                })
            }
        }
    }

    /// Sends admitted and not yet finished.
    pub fn sends_in_flight(&self) -> usize {
        self.inner.sends.load(Ordering::SeqCst)
    }

    /// Wait until the gateway has left `starting`.
    pub async fn started(&self) {
        loop {
            let notified = self.inner.changed.notified();
            if self.state() != GatewayState::Starting {
                return;
            }
            notified.await;
        }
    }

    /// Wait until a drain has begun.
    pub async fn drain_started(&self) {
        loop {
            let notified = self.inner.changed.notified();
            if self.state() >= GatewayState::Draining {
                return;
            }
            notified.await;
        }
    }

    /// Wait until no send is in flight or the drain window closes. Returns the sends
    /// still in flight when it returned (0 for a clean drain).
    pub async fn drained(&self) -> usize {
        let deadline = (*self.inner.drain_deadline.lock()).unwrap_or_else(Instant::now);
        loop {
            let notified = self.inner.idle.notified();
            let left = self.sends_in_flight();
            if left == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.sends_in_flight();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn states_follow_the_contract_and_drains_announce_their_window() {
        let life = Lifecycle::new();
        assert_eq!(life.state(), GatewayState::Starting);
        assert_eq!(life.admit_send().err(), Some(NotAdmitting::Starting));
        life.set_running();
        assert!(life.admit_send().is_ok());
        assert!(life.begin_drain(Duration::from_secs(30)));
        assert!(
            !life.begin_drain(Duration::from_secs(30)),
            "one drain at a time"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            life.admit_send().err(),
            Some(NotAdmitting::Draining {
                retry_after: Duration::from_secs(20)
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_waits_for_sends_in_flight_but_not_past_its_window() {
        let life = Lifecycle::new();
        life.set_running();
        let held = life.admit_send().unwrap();
        life.begin_drain(Duration::from_secs(30));
        let waiter = tokio::spawn({
            let life = life.clone();
            async move { life.drained().await }
        });
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(held);
        assert_eq!(waiter.await.unwrap(), 0);

        let life = Lifecycle::new();
        life.set_running();
        let _stuck = life.admit_send().unwrap();
        life.begin_drain(Duration::from_secs(3));
        let start = Instant::now();
        assert_eq!(life.drained().await, 1);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }
}
