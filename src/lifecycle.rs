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
//! While draining, new sends are refused with a `Retry-After` of about how long the restart
//! takes: until the drain is expected to end (the linger left; while sends are in flight,
//! the longest they can still take), never past the window, plus a second for the
//! replacement to start listening. Sends already admitted run to completion. The drain ends when no send
//! is in flight **and** the linger has passed since it began, or when the window closes,
//! whichever is first. The linger keeps the listener answering `503 draining` (and readiness
//! 503) for a while even when nothing is in flight: a load balancer keeps routing to a
//! terminating replica for a few seconds after SIGTERM, and those requests should meet a
//! `Retry-After`, not a refused connection.

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
    /// Shortest drain, even with nothing in flight (cut to the window at each drain).
    linger: Duration,
    /// The longest a send admitted before a drain can still take (its body's deadline and
    /// its send's): what a refused producer is told to wait for while sends are in flight.
    longest_send: Duration,
    drain: Mutex<Option<DrainTimes>>,
    sends: AtomicUsize,
    /// The sends among them that were admitted (not those being refused): what a refused
    /// producer waits for. Concurrent refusals, counted a moment in `sends`, are not.
    admitted: AtomicUsize,
    idle: Notify,
    changed: Notify,
}

/// When the current drain's window closes, when its linger ends and when the sends admitted
/// before it must have ended (neither after the window).
#[derive(Debug, Clone, Copy)]
struct DrainTimes {
    deadline: Instant,
    linger_until: Instant,
    sends_until: Instant,
}

/// What a refused producer waits on top of the drain's expected end: the replacement's start
/// (a new process listens well within a second of the old one's exit).
pub const RESTART_MARGIN: Duration = Duration::from_secs(1);

impl DrainTimes {
    /// The `Retry-After` of a send refused at `now` with `others` sends in flight: the drain's
    /// expected end (the linger's, or the sends' bound while any is in flight; never past the
    /// window) plus [`RESTART_MARGIN`].
    fn retry_after(&self, now: Instant, others: usize) -> Duration {
        let end = if others == 0 {
            self.linger_until
        } else {
            self.linger_until.max(self.sends_until)
        };
        end.min(self.deadline).saturating_duration_since(now) + RESTART_MARGIN
    }
}

/// Counts one send as in flight for the drain until dropped.
pub struct SendGuard {
    inner: Arc<Inner>,
    admitted: bool,
}

impl Drop for SendGuard {
    fn drop(&mut self) {
        if self.admitted {
            self.inner.admitted.fetch_sub(1, Ordering::SeqCst);
        }
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
    /// Left of the linger: the drain does not end before it, even with nothing in flight.
    pub linger_remaining: Duration,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    /// A lifecycle whose drains end as soon as nothing is in flight (no linger).
    pub fn new() -> Self {
        Self::with_linger(Duration::ZERO)
    }

    /// A lifecycle whose drains last at least `linger` (`SENDGATE_DRAIN_LINGER_S`), or
    /// their whole window when that is shorter.
    pub fn with_linger(linger: Duration) -> Self {
        Self::with_drain(linger, Duration::ZERO)
    }

    /// [`Lifecycle::with_linger`], knowing that a send admitted before a drain ends within
    /// `longest_send` of it (what a producer refused while one is in flight is told to wait).
    pub fn with_drain(linger: Duration, longest_send: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: AtomicU8::new(0),
                linger,
                longest_send,
                drain: Mutex::new(None),
                sends: AtomicUsize::new(0),
                admitted: AtomicUsize::new(0),
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
        let mut drain = self.inner.drain.lock();
        let previous = self.inner.state.load(Ordering::SeqCst);
        if previous >= 2 {
            return false;
        }
        let now = Instant::now();
        let deadline = now + window;
        let within = |d: Duration| now.checked_add(d).map_or(deadline, |t| t.min(deadline));
        *drain = Some(DrainTimes {
            deadline,
            linger_until: within(self.inner.linger),
            sends_until: within(self.inner.longest_send),
        });
        self.inner.state.store(2, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
        true
    }

    pub fn drain_status(&self) -> Option<DrainStatus> {
        if self.state() != GatewayState::Draining {
            return None;
        }
        let times = (*self.inner.drain.lock())?;
        let now = Instant::now();
        Some(DrainStatus {
            remaining: times.deadline.saturating_duration_since(now),
            in_flight: self.inner.sends.load(Ordering::SeqCst),
            linger_remaining: times.linger_until.saturating_duration_since(now),
        })
    }

    /// Admit a new send, or say why not. The guard keeps the drain waiting for it.
    pub fn admit_send(&self) -> Result<SendGuard, NotAdmitting> {
        // Count first, then check (both sequentially consistent, as the drain sets the state
        // then reads the count): a drain that starts in between sees this send and waits.
        self.inner.sends.fetch_add(1, Ordering::SeqCst);
        let mut guard = SendGuard {
            inner: self.inner.clone(),
            admitted: false,
        };
        match self.state() {
            GatewayState::Running => {
                self.inner.admitted.fetch_add(1, Ordering::SeqCst);
                guard.admitted = true;
                Ok(guard)
            }
            GatewayState::Starting => Err(NotAdmitting::Starting),
            GatewayState::Stopped => Err(NotAdmitting::Stopped),
            GatewayState::Draining => Err(NotAdmitting::Draining {
                retry_after: self.retry_after_with(self.admitted_in_flight()),
            }),
        }
    }

    /// The `Retry-After` of a request refused while draining (readiness too): about as long
    /// as the restart takes (see the module doc).
    pub fn drain_retry_after(&self) -> Duration {
        self.retry_after_with(self.admitted_in_flight())
    }

    /// Sends admitted and not yet finished, without those being refused this moment.
    fn admitted_in_flight(&self) -> usize {
        self.inner.admitted.load(Ordering::SeqCst)
    }

    fn retry_after_with(&self, others: usize) -> Duration {
        (*self.inner.drain.lock()).map_or(RESTART_MARGIN, |t| t.retry_after(Instant::now(), others))
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

    /// Wait until the drain is done: no send in flight and the linger over, or the window
    /// closed, whichever is first. Returns the sends still in flight when it returned (0
    /// for a clean drain). Without a drain under way it returns at once.
    pub async fn drained(&self) -> usize {
        let Some(times) = *self.inner.drain.lock() else {
            return self.sends_in_flight();
        };
        loop {
            let notified = self.inner.idle.notified();
            if self.sends_in_flight() == 0 {
                break;
            }
            if tokio::time::timeout_at(times.deadline, notified)
                .await
                .is_err()
            {
                return self.sends_in_flight();
            }
        }
        // Nothing in flight, and nothing can be admitted while draining (a refused send is
        // counted only for the moment it takes to refuse it): only the linger is left, and
        // it ends no later than the window.
        tokio::time::sleep_until(times.linger_until).await;
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn started_waits_while_starting_and_returns_once_running() {
        let life = Lifecycle::new();
        let waiter = {
            let life = life.clone();
            tokio::spawn(async move { life.started().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "returned while still starting");
        life.set_running();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("started() returns once running")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn drain_started_waits_while_running_and_returns_once_a_drain_begins() {
        let life = Lifecycle::new();
        life.set_running();
        let waiter = {
            let life = life.clone();
            tokio::spawn(async move { life.drain_started().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "returned while running");
        assert!(life.begin_drain(Duration::from_secs(30)));
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("drain_started() returns once draining")
            .unwrap();
    }

    #[test]
    fn stopped_is_final_no_send_is_admitted_and_no_drain_begins() {
        let life = Lifecycle::new();
        life.set_running();
        life.set_stopped();
        assert_eq!(life.state(), GatewayState::Stopped);
        assert!(life.admit_send().is_err());
        assert!(!life.begin_drain(Duration::from_secs(30)));
        assert_eq!(life.state(), GatewayState::Stopped);
    }

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
        assert!(
            matches!(life.admit_send(), Err(NotAdmitting::Draining { .. })),
            "refused while draining"
        );
    }

    fn refused_for(life: &Lifecycle) -> Duration {
        match life.admit_send() {
            Err(NotAdmitting::Draining { retry_after }) => retry_after,
            other => panic!("expected a draining refusal, got {:?}", other.err()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_the_linger_left_plus_the_restart_not_the_window() {
        let life = Lifecycle::with_drain(Duration::from_secs(5), Duration::from_secs(12));
        life.set_running();
        assert!(life.begin_drain(Duration::from_secs(30)));
        assert_eq!(refused_for(&life), Duration::from_secs(6));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(refused_for(&life), Duration::from_secs(4));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            refused_for(&life),
            RESTART_MARGIN,
            "past the linger: the restart"
        );
    }

    /// Requests refused at the same moment are not sends in flight to one another: each is
    /// told the linger left, not the sends' bound (16 s at the defaults, at random under
    /// load, when each refusal counted the others).
    #[test]
    fn concurrent_refusals_do_not_count_one_another_as_sends_in_flight() {
        let life = Lifecycle::with_drain(Duration::from_secs(5), Duration::from_secs(60));
        life.set_running();
        assert!(life.begin_drain(Duration::from_secs(120)));
        let longest = std::thread::scope(|scope| {
            let refusing: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..20_000)
                            .map(|_| match life.admit_send() {
                                Err(NotAdmitting::Draining { retry_after }) => retry_after,
                                other => panic!("expected draining, got {:?}", other.err()),
                            })
                            .max()
                            .unwrap_or_default()
                    })
                })
                .collect();
            refusing
                .into_iter()
                .map(|t| t.join().expect("no panic"))
                .max()
        });
        assert!(
            longest <= Some(Duration::from_secs(6)),
            "told {longest:?}: the linger left and the restart, nothing in flight"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn while_sends_are_in_flight_retry_after_is_their_bound_within_the_window() {
        let life = Lifecycle::with_drain(Duration::from_secs(5), Duration::from_secs(12));
        life.set_running();
        let held = life.admit_send().unwrap();
        assert!(life.begin_drain(Duration::from_secs(30)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(refused_for(&life), Duration::from_secs(11));
        assert_eq!(life.drain_retry_after(), Duration::from_secs(11));
        drop(held);
        assert_eq!(
            refused_for(&life),
            Duration::from_secs(4),
            "only the linger left"
        );

        // The window bounds both.
        let life = Lifecycle::with_drain(Duration::from_secs(5), Duration::from_secs(60));
        life.set_running();
        let _held = life.admit_send().unwrap();
        assert!(life.begin_drain(Duration::from_secs(20)));
        assert_eq!(refused_for(&life), Duration::from_secs(21));
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

    /// A drain begun on `life` with a 10 s window, and a task that reports what `drained`
    /// returned and how long after the drain began it did.
    fn drain_10s(life: &Lifecycle) -> tokio::task::JoinHandle<(usize, Duration)> {
        assert!(life.begin_drain(Duration::from_secs(10)));
        let life = life.clone();
        let began = Instant::now();
        tokio::spawn(async move { (life.drained().await, began.elapsed()) })
    }

    #[tokio::test(start_paused = true)]
    async fn with_nothing_in_flight_the_drain_lasts_the_linger() {
        let life = Lifecycle::with_linger(Duration::from_secs(5));
        life.set_running();
        let waiter = drain_10s(&life);
        tokio::time::advance(Duration::from_secs(2)).await;
        let status = life.drain_status().unwrap();
        assert_eq!(status.linger_remaining, Duration::from_secs(3));
        assert_eq!(status.in_flight, 0);
        assert!(
            matches!(life.admit_send(), Err(NotAdmitting::Draining { .. })),
            "refused while lingering"
        );
        assert_eq!(waiter.await.unwrap(), (0, Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_linger_an_idle_drain_ends_at_once() {
        let life = Lifecycle::new();
        life.set_running();
        assert_eq!(drain_10s(&life).await.unwrap(), (0, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_that_ends_within_the_linger_does_not_shorten_it() {
        let life = Lifecycle::with_linger(Duration::from_secs(5));
        life.set_running();
        let held = life.admit_send().unwrap();
        let waiter = drain_10s(&life);
        tokio::time::advance(Duration::from_secs(2)).await;
        drop(held);
        assert_eq!(waiter.await.unwrap(), (0, Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_longer_than_the_linger_is_waited_for() {
        let life = Lifecycle::with_linger(Duration::from_secs(5));
        life.set_running();
        let held = life.admit_send().unwrap();
        let waiter = drain_10s(&life);
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(!waiter.is_finished(), "the send still holds the drain");
        assert_eq!(
            life.drain_status().unwrap().linger_remaining,
            Duration::ZERO
        );
        drop(held);
        assert_eq!(waiter.await.unwrap(), (0, Duration::from_secs(8)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_ends_the_drain_whatever_the_linger_or_the_sends() {
        // A linger longer than the window is cut to it.
        let life = Lifecycle::with_linger(Duration::from_secs(60));
        life.set_running();
        let waiter = drain_10s(&life);
        assert_eq!(
            life.drain_status().unwrap().linger_remaining,
            Duration::from_secs(10)
        );
        assert_eq!(waiter.await.unwrap(), (0, Duration::from_secs(10)));

        // A send stuck past the window is cut off, and counted.
        let life = Lifecycle::with_linger(Duration::from_secs(5));
        life.set_running();
        let _stuck = life.admit_send().unwrap();
        assert_eq!(
            drain_10s(&life).await.unwrap(),
            (1, Duration::from_secs(10))
        );
    }
}
