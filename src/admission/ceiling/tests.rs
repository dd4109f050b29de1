//! The gate in local mode, on tokio's paused clock.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::*;
use crate::admission::drain::DrainRate;
use crate::admission::fair::{FairParts, QueueFairness};
use crate::admission::tenants::Tenants;
use crate::backend::DepthError;
use crate::backend::{Backlog, OutgoingMessage, SendError, SendReceipt};
use crate::config::Fraction;
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};

#[test]
fn fail_closed_refusals_are_logged_once_per_depth_read_with_the_count_since() {
    let backend = Arc::new(ScriptedDepth::new(vec![], Duration::ZERO));
    let gate = gate(policy(1, 1000, true, 3), &backend);
    let refused = || -> Result<(), Refusal> {
        Err(Refusal::CapacityUnknown {
            consecutive_failures: 3,
            cause: crate::admission::ceiling::Unknown::AdminPlane,
        })
    };
    let mut state = gate.local.state.lock();
    state.generation = 7;
    assert_eq!(
        LocalGate::failclosed_to_log(&mut state, &refused()),
        Some(1)
    );
    for _ in 0..4 {
        assert_eq!(LocalGate::failclosed_to_log(&mut state, &refused()), None);
    }
    let full = Err(Refusal::QueueFull {
        backlog: 1,
        limit: 1,
        retry_after: Duration::from_secs(1),
        drain_rate: None,
        room: 0,
    });
    assert_eq!(LocalGate::failclosed_to_log(&mut state, &full), None);
    state.generation = 8;
    assert_eq!(
        LocalGate::failclosed_to_log(&mut state, &refused()),
        Some(5),
        "the four silent ones and this one"
    );
    assert_eq!(LocalGate::failclosed_to_log(&mut state, &refused()), None);
}

/// An admin plane that answers from a script (then repeats its last answer), after a delay.
struct ScriptedDepth {
    answers: Mutex<VecDeque<Result<u64, DepthError>>>,
    last: Mutex<Result<u64, DepthError>>,
    delay: Duration,
    reads: AtomicU64,
    lag: Duration,
}

impl ScriptedDepth {
    fn new(answers: Vec<Result<u64, DepthError>>, delay: Duration) -> Self {
        Self {
            answers: Mutex::new(answers.into()),
            last: Mutex::new(Ok(0)),
            delay,
            reads: AtomicU64::new(0),
            lag: Duration::ZERO,
        }
    }
    /// Its counts trail the queue by `lag`.
    fn lagging(mut self, lag: Duration) -> Self {
        self.lag = lag;
        self
    }
    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Backend for ScriptedDepth {
    fn kind(&self) -> &'static str {
        "scripted"
    }
    fn depth_lag(&self) -> Duration {
        self.lag
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        unreachable!("capacity never sends")
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let answer = {
            let mut answers = self.answers.lock();
            match answers.pop_front() {
                Some(a) => {
                    *self.last.lock() = a.clone();
                    a
                }
                None => self.last.lock().clone(),
            }
        };
        tokio::time::sleep(self.delay).await;
        answer.map(Backlog::of)
    }
}

fn policy(limit: u64, ttl_ms: u64, fail_closed: bool, threshold: u32) -> CapacityPolicy {
    CapacityPolicy {
        limit,
        fail_closed,
        streak_threshold: threshold,
        ttl: Duration::from_millis(ttl_ms),
        read_timeout: Duration::from_millis(2000),
        retry_after_max: Duration::from_secs(300),
        resume_below: Fraction::ONE,
    }
}

fn gate(p: CapacityPolicy, backend: &Arc<ScriptedDepth>) -> Arc<CapacityGate> {
    CapacityGate::new(GateParts::alone(
        QueueName::parse("requests").unwrap(),
        p,
        backend.clone(),
    ))
}

fn down() -> Result<u64, DepthError> {
    Err(DepthError::Failed("admin plane down".into()))
}

#[tokio::test(start_paused = true)]
async fn a_changed_policy_applies_to_the_next_decision_and_an_empty_one_restores_it() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(5)], Duration::ZERO));
    let g = gate(policy(1000, 60_000, false, 3), &backend);
    g.admit()
        .await
        .expect("under 1000")
        .finish(BacklogEffect::NotStored);
    g.policy_cell().apply(&PolicyOverride {
        limit: Some(5),
        ..PolicyOverride::default()
    });
    match g.admit().await {
        Err(Refusal::QueueFull { backlog, limit, .. }) => assert_eq!((backlog, limit), (5, 5)),
        other => panic!(
            "expected queue_full at the new ceiling, got {:?}",
            other.err()
        ),
    }
    assert_eq!(g.snapshot().limit, 5);
    assert_eq!(
        backend.reads(),
        1,
        "the cached read is reused: only the policy changed"
    );
    g.policy_cell().apply(&PolicyOverride::default());
    assert!(g.admit().await.is_ok(), "back at the variable's 1000");
    assert_eq!(g.policy().limit, 1000);
}

#[tokio::test(start_paused = true)]
async fn a_shorter_ttl_override_makes_the_next_send_read_again() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = gate(policy(1000, 60_000, false, 3), &backend);
    g.admit().await.unwrap().finish(BacklogEffect::NotStored);
    tokio::time::advance(Duration::from_millis(20)).await;
    g.admit().await.unwrap().finish(BacklogEffect::NotStored);
    assert_eq!(backend.reads(), 1);
    g.policy_cell().apply(&PolicyOverride {
        ttl: Some(Duration::from_millis(10)),
        ..PolicyOverride::default()
    });
    g.admit().await.unwrap().finish(BacklogEffect::NotStored);
    assert_eq!(
        backend.reads(),
        2,
        "the 20 ms old read is stale under a 10 ms TTL"
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_is_reused_for_the_ttl() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = gate(policy(100, 1000, false, 3), &backend);
    for _ in 0..3 {
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
    }
    assert_eq!(backend.reads(), 1);
    tokio::time::advance(Duration::from_millis(999)).await;
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    assert_eq!(backend.reads(), 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    assert_eq!(backend.reads(), 2);
}

/// Admit one send and say how long it waited.
async fn timed_admit(g: &Arc<CapacityGate>) -> Duration {
    let started = Instant::now();
    g.admit().await.unwrap().finish(BacklogEffect::NotStored);
    started.elapsed()
}

#[tokio::test(start_paused = true)]
async fn under_steady_traffic_the_read_is_made_ahead_of_expiry_and_no_send_waits() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(50)));
    let g = gate(policy(100, 1000, false, 3), &backend);
    assert_eq!(
        timed_admit(&g).await,
        Duration::from_millis(50),
        "only the first read is waited for"
    );
    // The read took 50 ms: the next one starts 100 ms before the value expires.
    tokio::time::advance(Duration::from_millis(899)).await;
    assert_eq!(timed_admit(&g).await, Duration::ZERO);
    tokio::task::yield_now().await;
    assert_eq!(backend.reads(), 1, "not yet within the lead");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        timed_admit(&g).await,
        Duration::ZERO,
        "decided on the cached value"
    );
    for _ in 0..5 {
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
    }
    tokio::task::yield_now().await;
    assert_eq!(backend.reads(), 2, "one read ahead, however many sends");
    tokio::time::advance(Duration::from_millis(150)).await;
    // Past the first value's expiry: the value read ahead is fresh.
    assert_eq!(timed_admit(&g).await, Duration::ZERO);
    tokio::task::yield_now().await;
    assert_eq!(backend.reads(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_slow_admin_plane_is_read_ahead_no_earlier_than_half_the_ttl() {
    // Reads take 40 ms against a 100 ms TTL: twice the read (80 ms) would start the
    // next one 20 ms into the value's life; the lead is capped at half the TTL.
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(40)));
    let g = gate(policy(100, 100, false, 3), &backend);
    timed_admit(&g).await;
    tokio::time::advance(Duration::from_millis(30)).await;
    assert_eq!(timed_admit(&g).await, Duration::ZERO);
    tokio::task::yield_now().await;
    assert_eq!(backend.reads(), 1, "30 ms into a 100 ms TTL: too early");
    tokio::time::advance(Duration::from_millis(20)).await;
    assert_eq!(timed_admit(&g).await, Duration::ZERO);
    tokio::task::yield_now().await;
    assert_eq!(backend.reads(), 2, "half the TTL: read ahead");
}

/// An admin plane whose reads take the given times in turn (then the last one again).
struct SlowingDepth {
    delays: Mutex<VecDeque<Duration>>,
    last: Mutex<Duration>,
    reads: AtomicU64,
}

impl SlowingDepth {
    fn new(delays_ms: &[u64]) -> Self {
        Self {
            delays: Mutex::new(
                delays_ms
                    .iter()
                    .map(|&ms| Duration::from_millis(ms))
                    .collect(),
            ),
            last: Mutex::new(Duration::ZERO),
            reads: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl Backend for SlowingDepth {
    fn kind(&self) -> &'static str {
        "slowing"
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        unreachable!("capacity never sends")
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let delay = match self.delays.lock().pop_front() {
            Some(d) => {
                *self.last.lock() = d;
                d
            }
            None => *self.last.lock(),
        };
        tokio::time::sleep(delay).await;
        Ok(Backlog::of(0))
    }
}

#[tokio::test(start_paused = true)]
async fn a_read_ahead_that_outlasts_its_lead_keeps_sends_on_the_cached_value() {
    // The first read takes 1 ms, so the next starts 2 ms before the value expires; that
    // one takes 50 ms (a saturated worker or a busy admin plane). Sends arriving after
    // the expiry, while it runs, must not queue behind it: at 256 connections they all
    // would, and be released one by one (the p99 and max spikes once per TTL).
    let backend = Arc::new(SlowingDepth::new(&[1, 50]));
    let g = CapacityGate::new(GateParts::alone(
        QueueName::parse("requests").unwrap(),
        policy(100, 1000, false, 3),
        backend.clone(),
    ));
    assert_eq!(
        timed_admit(&g).await,
        Duration::from_millis(1),
        "the first read"
    );
    tokio::time::advance(Duration::from_millis(998)).await;
    assert_eq!(timed_admit(&g).await, Duration::ZERO);
    tokio::task::yield_now().await;
    assert_eq!(backend.reads.load(Ordering::SeqCst), 2, "read ahead");
    tokio::time::advance(Duration::from_millis(10)).await;
    for _ in 0..5 {
        assert_eq!(
            timed_admit(&g).await,
            Duration::ZERO,
            "past the expiry, the read ahead still running: decided on the last value"
        );
    }
    assert_eq!(
        backend.reads.load(Ordering::SeqCst),
        2,
        "no read of their own"
    );
    tokio::time::advance(Duration::from_millis(40)).await;
    tokio::task::yield_now().await;
    assert_eq!(g.snapshot().reads_ok, 2, "the read ahead landed");
    assert_eq!(timed_admit(&g).await, Duration::ZERO);
    assert_eq!(backend.reads.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_expired_value_is_reused_no_longer_than_a_read_ahead_can_run() {
    // A read ahead marked as running that never lands (its task gone with its worker):
    // past the TTL plus the read's deadline, a send reads for itself again.
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = gate(policy(100, 1000, false, 3), &backend);
    timed_admit(&g).await;
    g.local.state.lock().reading_in_background = true;
    tokio::time::advance(Duration::from_millis(1000 + 2000 - 1)).await;
    timed_admit(&g).await;
    assert_eq!(
        backend.reads(),
        1,
        "within the read's deadline: the last value"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    timed_admit(&g).await;
    assert_eq!(backend.reads(), 2, "past it: a read of its own");
}

#[tokio::test(start_paused = true)]
async fn a_lagging_read_counts_completions_within_the_lag_and_during_the_read() {
    let backend = Arc::new(
        ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(100)).lagging(Duration::from_secs(5)),
    );
    let g = gate(policy(100, 1000, false, 3), &backend);
    let during = g.admit().await.unwrap(); // read 1 (100 ms)
    g.admit().await.unwrap().finish(BacklogEffect::Stored); // before read 2, in the lag
    assert_eq!(g.snapshot().reads_ok, 1);
    tokio::time::advance(Duration::from_millis(1000)).await;
    let waiting = {
        let g = g.clone();
        tokio::spawn(async move { g.admit().await.unwrap() })
    };
    tokio::task::yield_now().await; // read 2 starts
    during.finish(BacklogEffect::Stored); // completes while read 2 runs
    let third = waiting.await.unwrap();
    assert_eq!(g.snapshot().reads_ok, 2);
    assert_eq!(
        g.snapshot().backlog,
        Some(3),
        "0 read + 1 within the lag + 1 during the read + 1 in flight"
    );
    drop(third);
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_ahead_counts_in_the_streak_and_the_next_send_sees_it() {
    let backend = Arc::new(ScriptedDepth::new(
        vec![Ok(0), down()],
        Duration::from_millis(10),
    ));
    let g = gate(policy(100, 1000, true, 1), &backend);
    timed_admit(&g).await;
    tokio::time::advance(Duration::from_millis(985)).await;
    assert_eq!(timed_admit(&g).await, Duration::ZERO);
    tokio::task::yield_now().await; // the read ahead starts
    tokio::time::advance(Duration::from_millis(10)).await;
    tokio::task::yield_now().await; // and finishes
    assert_eq!(g.snapshot().consecutive_failures, 1);
    assert!(matches!(
        g.admit().await.err(),
        Some(Refusal::CapacityUnknown { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn concurrent_sends_share_one_read_in_flight() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(100)));
    let g = gate(policy(100, 0, false, 3), &backend);
    let admits: Vec<_> = (0..10)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { g.admit().await.is_ok() })
        })
        .collect();
    for a in admits {
        assert!(a.await.unwrap());
    }
    assert!(
        backend.reads() <= 2,
        "10 concurrent sends made {} reads",
        backend.reads()
    );
}

#[tokio::test(start_paused = true)]
async fn sends_since_the_read_count_so_the_ceiling_is_never_overshot() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = gate(policy(5, 60_000, false, 3), &backend);
    let mut queued = 0;
    let mut refused = Vec::new();
    for _ in 0..8 {
        match g.admit().await {
            Ok(r) => {
                r.finish(BacklogEffect::Stored);
                queued += 1;
            }
            Err(e) => refused.push(e),
        }
    }
    assert_eq!(queued, 5);
    assert_eq!(refused.len(), 3);
    assert!(matches!(
        refused[0],
        Refusal::QueueFull {
            backlog: 5,
            limit: 5,
            ..
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn sends_in_flight_count_towards_the_backlog() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(3)], Duration::ZERO));
    let g = gate(policy(5, 60_000, false, 3), &backend);
    let a = g.admit().await.unwrap();
    let b = g.admit().await.unwrap();
    assert!(
        g.admit().await.is_err(),
        "3 stored + 2 in flight is the ceiling"
    );
    b.finish(BacklogEffect::NotStored);
    let c = g.admit().await.expect("a refused send frees its place");
    drop(c); // a cancelled send counts as stored: the safe side
    assert!(g.admit().await.is_err());
    a.finish(BacklogEffect::Stored);
    assert_eq!(g.snapshot().backlog, Some(5));
}

#[tokio::test(start_paused = true)]
async fn a_new_read_replaces_the_local_count_without_double_counting() {
    // The second read already counts the two sends stored before it: they must not be
    // added again on top of it.
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0), Ok(2)], Duration::ZERO));
    let g = gate(policy(3, 1000, false, 3), &backend);
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    tokio::time::advance(Duration::from_millis(1000)).await;
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    assert_eq!(g.snapshot().backlog, Some(3));
    assert!(matches!(
        g.admit().await,
        Err(Refusal::QueueFull { backlog: 3, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_lagging_admin_plane_still_sees_recent_sends_counted() {
    // The admin plane reports 0 although 4 sends completed just before the read.
    let backend = Arc::new(
        ScriptedDepth::new(vec![Ok(0), Ok(0)], Duration::ZERO).lagging(Duration::from_secs(5)),
    );
    let g = gate(policy(5, 1000, false, 3), &backend);
    for _ in 0..4 {
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    assert!(
        g.admit().await.is_err(),
        "lagging read of 0 + 5 recent sends is the ceiling"
    );
    // Well past the lag window, the admin plane's count is trusted alone.
    tokio::time::advance(Duration::from_secs(7)).await;
    assert!(g.admit().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn queue_full_says_when_the_next_read_is_due() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(10)], Duration::ZERO));
    let g = gate(policy(5, 4000, false, 3), &backend);
    assert!(g.admit().await.is_err());
    tokio::time::advance(Duration::from_millis(1500)).await;
    match g.admit().await {
        Err(Refusal::QueueFull {
            backlog: 10,
            limit: 5,
            retry_after,
            drain_rate: None,
            room: 0,
        }) => {
            assert_eq!(retry_after, Duration::from_millis(2500));
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// One send refused `429`: its `Retry-After` and drain rate.
async fn refused(g: &Arc<CapacityGate>) -> (Duration, Option<f64>) {
    match g.admit().await {
        Err(Refusal::QueueFull {
            retry_after,
            drain_rate,
            ..
        }) => (retry_after, drain_rate.map(DrainRate::per_second)),
        other => panic!("not refused full: {:?}", other.map(|_| ())),
    }
}

/// A gate reading `depths` one per second (TTL 1 s), each read made by a refused send;
/// the last refusal's answer.
async fn read_each_second(g: &Arc<CapacityGate>, reads: usize) -> (Duration, Option<f64>) {
    let mut last = refused(g).await;
    for _ in 1..reads {
        tokio::time::advance(Duration::from_secs(1)).await;
        last = refused(g).await;
    }
    last
}

fn depths(values: impl IntoIterator<Item = u64>) -> Arc<ScriptedDepth> {
    Arc::new(ScriptedDepth::new(
        values.into_iter().map(Ok).collect(),
        Duration::ZERO,
    ))
}

fn within(d: Duration, low_s: f64, high_s: f64) -> bool {
    (low_s..=high_s).contains(&d.as_secs_f64())
}

#[tokio::test(start_paused = true)]
async fn a_steady_drain_gives_the_time_to_drain_below_the_ceiling() {
    // 10 a second taken from 200 against a ceiling of 50.
    let backend = depths((0..6).map(|i| 200 - 10 * i));
    let g = gate(policy(50, 1000, false, 3), &backend);
    let (retry_after, rate) = read_each_second(&g, 6).await;
    assert_eq!(rate, Some(10.0));
    // 150 − 49 = 101 messages at 10/s: 10.1 s, behind the places promised before.
    assert!(within(retry_after, 9.0, 11.0), "{retry_after:?}");
    assert_eq!(
        g.snapshot().drain_rate.map(DrainRate::per_second),
        Some(10.0)
    );
}

#[tokio::test(start_paused = true)]
async fn with_no_drain_observed_retry_after_is_the_time_until_the_next_read() {
    let backend = depths([100]);
    let g = gate(policy(50, 1000, false, 3), &backend);
    read_each_second(&g, 8).await;
    tokio::time::advance(Duration::from_millis(300)).await;
    assert_eq!(refused(&g).await, (Duration::from_millis(700), None));
    assert_eq!(g.snapshot().drain_rate, None);
}

#[tokio::test(start_paused = true)]
async fn counts_that_lag_and_jump_are_smoothed_to_the_true_rate() {
    // Consumers take 10/s, but the admin plane's count moves only every 5 s, off the
    // reads' phase: reads show no change, then a jump of 50.
    // The plane says it trails (as RabbitMQ's management API does), so a sample spans 5 s.
    let backend = Arc::new(
        ScriptedDepth::new(
            (0..31).map(|i| Ok(1000 - 50 * ((i + 2) / 5))).collect(),
            Duration::ZERO,
        )
        .lagging(Duration::from_secs(5)),
    );
    let g = gate(policy(50, 1000, false, 3), &backend);
    let mut rates = Vec::new();
    refused(&g).await;
    for _ in 0..30 {
        tokio::time::advance(Duration::from_secs(1)).await;
        rates.push(refused(&g).await.1);
    }
    assert!(
        rates[..4].iter().all(Option::is_none),
        "one read is no rate"
    );
    for rate in rates[4..].iter() {
        let rate = rate.expect("drain observed");
        assert!((8.0..=12.0).contains(&rate), "{rates:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_admitted_sends_is_not_mistaken_for_drain() {
    // Nobody consumes: each read shows the 50 sends admitted since the one before.
    let backend = depths((0..6).map(|i| 50 * i));
    let g = gate(policy(250, 1000, false, 3), &backend);
    for _ in 0..5 {
        for _ in 0..50 {
            g.admit().await.unwrap().finish(BacklogEffect::Stored);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(refused(&g).await, (Duration::from_secs(1), None));
}

#[tokio::test(start_paused = true)]
async fn a_slow_drain_is_clamped_to_the_longest_retry_after() {
    let backend = depths((0..6).map(|i| 10_000 - i));
    let p = CapacityPolicy {
        retry_after_max: Duration::from_secs(120),
        ..policy(10, 1000, false, 3)
    };
    let g = gate(p, &backend);
    let (retry_after, rate) = read_each_second(&g, 6).await;
    assert_eq!(rate, Some(1.0));
    assert!(within(retry_after, 108.0, 120.0), "{retry_after:?}");
}

/// Refusals at one instant are spread behind one another at the drain rate (pacing.rs),
/// each told the start of its place in whole seconds, never below 1 s.
#[tokio::test(start_paused = true)]
async fn refusals_are_spread_behind_one_another_at_the_drain_rate() {
    let backend = depths((0..6).map(|i| 200 - 10 * i));
    let g = gate(policy(50, 1000, false, 3), &backend);
    read_each_second(&g, 6).await;
    // 150 − 49 = 101 messages at 10/s: the first place opens in 10.1 s, then one every
    // 0.1 s; the refusals of `read_each_second` took the places up to 10.6 s from now.
    let mut waits = Vec::new();
    for _ in 0..300 {
        waits.push(refused(&g).await.0.as_secs());
    }
    assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
    assert_eq!(waits[0], 11);
    assert!((40..=41).contains(&waits[299]), "{waits:?}");

    // 100/s, one message over: a hundredth of a second, raised to the next read (1 s),
    // then a place every 10 ms; the last refusal of `read_each_second` took the one at 1 s.
    let backend = depths((0..6).map(|i| 1000 - 100 * i));
    let g = gate(policy(500, 1000, false, 3), &backend);
    read_each_second(&g, 6).await;
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..200 {
        *seen.entry(refused(&g).await.0.as_secs()).or_insert(0) += 1;
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), [2, 3], "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn refusing_at_the_ceiling_goes_on_until_the_backlog_is_at_the_resume_level() {
    let backend = depths([10, 8, 6, 5]);
    let p = CapacityPolicy {
        resume_below: Fraction::new(0.5).unwrap(),
        ..policy(10, 1000, false, 3)
    };
    let g = gate(p, &backend);
    for backlog in [10, 8, 6] {
        assert!(
            matches!(g.admit().await, Err(Refusal::QueueFull { backlog: b, .. }) if b == backlog),
            "{backlog} is over the resume level"
        );
        assert_eq!(g.snapshot().refusing_until_backlog, Some(5));
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    g.admit()
        .await
        .expect("5 is the resume level")
        .finish(BacklogEffect::NotStored);
    assert_eq!(g.snapshot().refusing_until_backlog, None);
    for _ in 0..5 {
        g.admit()
            .await
            .expect("under the ceiling again")
            .finish(BacklogEffect::Stored);
    }
    assert!(g.admit().await.is_err(), "5 + 5 stored is the ceiling");
    assert_eq!(g.snapshot().refusing_until_backlog, Some(5));
}

#[tokio::test(start_paused = true)]
async fn without_hysteresis_one_under_the_ceiling_admits() {
    let backend = depths([10, 9]);
    let g = gate(policy(10, 1000, false, 3), &backend);
    assert!(g.admit().await.is_err());
    assert_eq!(g.snapshot().refusing_until_backlog, Some(9));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(g.admit().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn gate_on_fails_closed_at_the_threshold_and_recovers() {
    let backend = Arc::new(ScriptedDepth::new(
        vec![down(), down(), down(), Ok(0)],
        Duration::ZERO,
    ));
    let g = gate(policy(100, 0, true, 3), &backend);
    assert!(g.admit().await.is_ok());
    assert!(g.admit().await.is_ok());
    assert_eq!(
        g.admit().await.err(),
        Some(Refusal::CapacityUnknown {
            consecutive_failures: 3,
            cause: crate::admission::ceiling::Unknown::AdminPlane,
        })
    );
    assert!(g.snapshot().fail_closed);
    assert!(g.admit().await.is_ok(), "a good read resets the streak");
    assert_eq!(g.snapshot().consecutive_failures, 0);
    assert!(!g.snapshot().fail_closed);
}

#[tokio::test(start_paused = true)]
async fn while_the_streak_builds_the_last_good_read_still_bounds_what_is_admitted() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(20), down()], Duration::ZERO));
    let g = gate(policy(25, 1000, true, 3), &backend);
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut admitted = 0;
    let mut refusal = None;
    for _ in 0..200 {
        match g.admit().await {
            Ok(admission) => {
                admitted += 1;
                admission.finish(BacklogEffect::Stored);
            }
            Err(refused) => {
                refusal = Some(refused);
                break;
            }
        }
    }
    assert_eq!(
        g.snapshot().consecutive_failures,
        1,
        "the failed read counts"
    );
    assert_eq!(
        admitted, 4,
        "read 20, 1 stored since: 4 more reach the ceiling of 25"
    );
    match refusal {
        Some(Refusal::QueueFull { backlog, limit, .. }) => assert_eq!((backlog, limit), (25, 25)),
        other => panic!("expected queue_full on what is known, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn with_no_good_read_the_streak_admits_at_most_the_ceiling_blind() {
    let backend = Arc::new(ScriptedDepth::new(vec![down()], Duration::ZERO));
    let g = gate(policy(10, 1000, true, 3), &backend);
    let mut admitted = 0;
    let mut refusal = None;
    for _ in 0..200 {
        match g.admit().await {
            Ok(admission) => {
                admitted += 1;
                admission.finish(BacklogEffect::Stored);
            }
            Err(refused) => {
                refusal = Some(refused);
                break;
            }
        }
    }
    assert_eq!(admitted, 10);
    assert_eq!(
        refusal,
        Some(Refusal::CapacityUnknown {
            consecutive_failures: 1,
            cause: crate::admission::ceiling::Unknown::AdminPlane,
        })
    );
}

#[tokio::test(start_paused = true)]
async fn a_standing_read_from_before_a_spell_in_the_fleet_bounds_nothing() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(9), down()], Duration::ZERO));
    let g = gate(policy(10, 1000, true, 3), &backend);
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(matches!(g.admit().await, Err(Refusal::QueueFull { .. })));
    g.local.forget_reads_before(Instant::now());
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut admitted = 0;
    while let Ok(admission) = g.admit().await {
        admitted += 1;
        admission.finish(BacklogEffect::Stored);
        if admitted > 100 {
            break;
        }
    }
    assert_eq!(
        admitted, 9,
        "the read of 9 is not this spell's: the 1 stored since counts from an empty queue"
    );
}

#[tokio::test(start_paused = true)]
async fn gate_off_admits_past_the_ceiling_while_the_depth_is_unknown() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0), down()], Duration::ZERO));
    let g = gate(policy(3, 1000, false, 3), &backend);
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    tokio::time::advance(Duration::from_secs(1)).await;
    for _ in 0..10 {
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
    }
}

/// Contract section 2, `SENDGATE_RESUME_BELOW`: once a queue refuses at the ceiling it keeps
/// refusing until the backlog is at or below the resume level. A read that fails while the
/// queue refuses above that level leaves the last good read standing (23 here, resume 20),
/// and that read still says to refuse: the streak must not reopen what the read closed.
#[tokio::test(start_paused = true)]
async fn a_failed_read_while_refusing_above_the_resume_level_keeps_refusing() {
    let backend = Arc::new(ScriptedDepth::new(
        vec![Ok(25), Ok(23), down()],
        Duration::ZERO,
    ));
    let p = CapacityPolicy {
        resume_below: Fraction::new(0.8).unwrap(),
        ..policy(25, 1000, true, 3)
    };
    let g = gate(p, &backend);
    for backlog in [25, 23] {
        assert!(
            matches!(g.admit().await, Err(Refusal::QueueFull { backlog: b, .. }) if b == backlog),
            "{backlog} is over the resume level of 20"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let got = g.admit().await.map(|a| a.finish(BacklogEffect::Stored));
    assert_eq!(g.snapshot().consecutive_failures, 1, "the read failed");
    assert!(
        matches!(got, Err(Refusal::QueueFull { backlog: 23, .. })),
        "last good read 23, over the resume level 20: still refusing, got {got:?}"
    );
}

/// Contract section 3: a batch refused `queue_full` says in `room` how many entries would be
/// admitted now. While the streak builds, the last good read (20, one stored since, ceiling
/// 25) leaves room for 4: a batch of 5 is refused naming that room, and 4 are then admitted
/// (live, RabbitMQ: the 429 said `"room":0` and the batch of 4 that followed was a 201).
#[tokio::test(start_paused = true)]
async fn while_the_streak_builds_a_refused_batch_names_the_room_there_is() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(20), down()], Duration::ZERO));
    let g = gate(policy(25, 1000, true, 3), &backend);
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    tokio::time::advance(Duration::from_secs(1)).await;
    let got = g.admit_units(5).await.map(|_| ());
    assert_eq!(g.snapshot().consecutive_failures, 1, "the read failed");
    assert!(
        matches!(got, Err(Refusal::QueueFull { room: 4, .. })),
        "4 of the 5 fit under the ceiling: {got:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_start_up_read_does_not_start_the_streak() {
    let backend = Arc::new(ScriptedDepth::new(vec![down()], Duration::ZERO));
    let g = gate(policy(100, 0, true, 3), &backend);
    g.prime().await;
    assert_eq!(g.snapshot().consecutive_failures, 0);
    assert_eq!(g.snapshot().reads_failed, 1);
    assert!(g.admit().await.is_ok());
    assert!(g.admit().await.is_ok());
    assert_eq!(
        g.admit().await.err(),
        Some(Refusal::CapacityUnknown {
            consecutive_failures: 3,
            cause: crate::admission::ceiling::Unknown::AdminPlane,
        }),
        "the contract's example: sends 1 and 2 queued, send 3 refused"
    );
}

#[tokio::test(start_paused = true)]
async fn gate_off_always_fails_open() {
    let backend = Arc::new(ScriptedDepth::new(vec![down()], Duration::ZERO));
    let g = gate(policy(100, 0, false, 3), &backend);
    for _ in 0..5 {
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
    }
    assert_eq!(g.snapshot().consecutive_failures, 5);
    assert!(!g.snapshot().fail_closed);
}

#[tokio::test(start_paused = true)]
async fn the_streak_counts_consecutive_failures_only() {
    let backend = Arc::new(ScriptedDepth::new(
        vec![down(), Ok(0), down()],
        Duration::ZERO,
    ));
    let g = gate(policy(100, 0, true, 2), &backend);
    for _ in 0..3 {
        assert!(g.admit().await.is_ok());
    }
    assert_eq!(g.snapshot().consecutive_failures, 1);
}

#[tokio::test(start_paused = true)]
async fn a_read_that_outlives_its_timeout_is_a_failure_and_ends_on_time() {
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_secs(60)));
    let g = gate(policy(100, 0, true, 1), &backend);
    let start = Instant::now();
    assert_eq!(
        g.admit().await.err(),
        Some(Refusal::CapacityUnknown {
            consecutive_failures: 1,
            cause: crate::admission::ceiling::Unknown::AdminPlane,
        }),
        "the timed-out read counts before the send is decided"
    );
    assert_eq!(start.elapsed(), Duration::from_millis(2000));
    assert_eq!(g.snapshot().consecutive_failures, 1);
}

#[tokio::test(start_paused = true)]
async fn failed_reads_are_cached_for_the_ttl_too() {
    let backend = Arc::new(ScriptedDepth::new(vec![down()], Duration::ZERO));
    let g = gate(policy(100, 1000, true, 3), &backend);
    for _ in 0..10 {
        assert!(g.admit().await.is_ok());
    }
    assert_eq!(
        backend.reads(),
        1,
        "a failing admin plane is not hammered by every send"
    );
}

fn fair(mode: crate::admission::fair::share::ShareMode) -> crate::admission::fair::FairPolicy {
    crate::admission::fair::FairPolicy {
        mode,
        share_at: Fraction::new(0.9).unwrap(),
        shed_at_sheddable: Fraction::new(0.8).unwrap(),
        shed_at_default: Fraction::ONE,
    }
}

/// The share tests' depth reads are a second apart: the room a read shows opens a round.
const SHARE_TTL_MS: u64 = 1_000;

/// Past the cached read: the next send reads the depth, which starts the book's next round.
async fn until_the_next_read() {
    tokio::time::advance(Duration::from_millis(SHARE_TTL_MS)).await;
}

fn two_tenants() -> Tenants {
    let t = |name: &str| crate::admission::tenants::Tenant {
        name: name.into(),
        weight: 1,
        quota: Default::default(),
    };
    Tenants::new(vec![t("a"), t("b")]).unwrap()
}

/// Tenants `t0`, `t1`, ... of these weights.
fn tenants(weights: &[u32]) -> crate::admission::tenants::Tenants {
    crate::admission::tenants::Tenants::new(
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| crate::admission::tenants::Tenant {
                name: format!("t{i}"),
                weight,
                quota: Default::default(),
            })
            .collect(),
    )
    .expect("one to a thousand tenants")
}

fn asker(
    tenant: u16,
    criticality: crate::admission::tenants::Criticality,
) -> crate::admission::fair::Asker {
    crate::admission::fair::Asker {
        tenant: crate::admission::tenants::TenantIndex(tenant),
        criticality,
    }
}

#[tokio::test(start_paused = true)]
async fn the_gate_refuses_a_tenant_past_its_part_and_admits_the_one_it_owes() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::Default as D;
    // Empty at every read; ceiling 40; what is in flight is what the queue holds.
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = shared_gate(
        policy(40, SHARE_TTL_MS, false, 3),
        &backend,
        &two_tenants(),
        fair(ShareMode::Enforce),
    );
    let (a, b) = (asker(0, D), asker(1, D));
    // Round 0: A fills the queue (not contended until the estimate nears 36), B asks once
    // at the full queue: both have asked.
    let mut held = Vec::new();
    while let Ok(r) = g.admit_units_for(a, 1).await {
        held.push(r);
    }
    assert_eq!(held.len(), 40, "the ceiling alone while uncontended");
    assert!(matches!(
        g.admit_units_for(b, 1).await,
        Err(Refusal::QueueFull { .. })
    ));
    // Ten of A's are not stored: room for 10 opens (the gate counts them gone).
    for r in held.drain(..10) {
        r.finish(BacklogEffect::NotStored);
    }
    until_the_next_read().await;
    // Round 1: B asked 1 last round, so it is owed 1 of the 10; A takes 9 and is refused.
    let mut a_got = 0;
    loop {
        match g.admit_units_for(a, 1).await {
            Ok(r) => {
                held.push(r);
                a_got += 1;
            }
            Err(Refusal::TenantShare { share_milli, .. }) => {
                assert_eq!(share_milli, 900, "A's part: 9 of the 10 offered");
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(a_got, 9);
    held.push(g.admit_units_for(b, 1).await.expect("the unit B is owed"));
    assert!(matches!(
        g.admit_units_for(b, 1).await,
        Err(Refusal::QueueFull { .. })
    ));
}

#[test]
fn a_share_round_spans_at_least_a_second_of_whole_reads() {
    let per_round = |ttl_ms| policy(40, ttl_ms, false, 3).reads_per_round();
    assert_eq!(per_round(1_000), 1);
    assert_eq!(per_round(5_000), 1, "a read's interval when longer");
    assert_eq!(per_round(200), 5);
    assert_eq!(per_round(300), 4, "rounded up: never under a second");
    assert_eq!(
        per_round(0),
        1_000,
        "a read per send counted as a millisecond apart"
    );
    let p = policy(40, 200, false, 3);
    let rounds: Vec<u64> = (0..11).map(|read| p.share_round(read)).collect();
    assert_eq!(rounds, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn with_reads_200_ms_apart_one_ask_keeps_a_tenant_owed_for_its_round_and_the_next() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::Default as D;
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = shared_gate(
        policy(40, 200, false, 3),
        &backend,
        &two_tenants(),
        fair(ShareMode::Enforce),
    );
    let (a, b) = (asker(0, D), asker(1, D));
    // Read 1 (round 0): A fills the queue; B asks once, at the full queue.
    let mut held = Vec::new();
    while let Ok(r) = g.admit_units_for(a, 1).await {
        held.push(r);
    }
    assert!(matches!(
        g.admit_units_for(b, 1).await,
        Err(Refusal::QueueFull { .. })
    ));
    // Reads 2-10, 200 ms apart: two of A's leave the queue before each; A takes all it may.
    let mut left_for_b = Vec::new();
    for _read in 2..=10 {
        for r in held.drain(..2) {
            r.finish(BacklogEffect::NotStored);
        }
        tokio::time::advance(Duration::from_millis(200)).await;
        loop {
            match g.admit_units_for(a, 1).await {
                Ok(r) => held.push(r),
                Err(Refusal::TenantShare { room, .. }) => {
                    left_for_b.push(room == 0);
                    break;
                }
                Err(Refusal::QueueFull { .. }) => {
                    left_for_b.push(false);
                    break;
                }
                Err(other) => panic!("{other:?}"),
            }
        }
    }
    // B's one ask counts through round 0 (reads 1-4) and round 1 (reads 5-9): a unit is
    // kept for it at each of those reads; from read 10 (round 2) nothing is owed.
    assert_eq!(
        left_for_b,
        [true, true, true, true, true, true, true, true, false]
    );
}

#[tokio::test(start_paused = true)]
async fn a_sheddable_send_is_refused_from_its_fraction_a_default_one_up_to_the_ceiling() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::{Critical, Default as D, Sheddable};
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = shared_gate(
        policy(10, 10_000, false, 3),
        &backend,
        &Tenants::open(),
        fair(ShareMode::Off),
    );
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(g.admit_units_for(asker(0, Sheddable), 1).await.unwrap());
    }
    match g.admit_units_for(asker(0, Sheddable), 1).await {
        Err(Refusal::Shed {
            criticality,
            backlog,
            cut,
            ..
        }) => assert_eq!((criticality, backlog, cut), (Sheddable, 8, 8)),
        other => panic!("{:?}", other.err()),
    }
    held.push(
        g.admit_units_for(asker(0, D), 1)
            .await
            .expect("default to the ceiling"),
    );
    held.push(
        g.admit_units_for(asker(0, Critical), 1)
            .await
            .expect("critical too"),
    );
    assert!(matches!(
        g.admit_units_for(asker(0, Critical), 1).await,
        Err(Refusal::QueueFull { .. })
    ));
}

/// What the gate's tally shows of `tenant`: (admitted, refused by reason, would-refuse by
/// reason), for the ceiling's, criticality's and share's reasons.
fn tallied(g: &CapacityGate, tenant: &str) -> (u64, [u64; 3], [u64; 3]) {
    use crate::admission::fair::tally::Reason;
    // The share rule's reasons (quotas are counted apart: their tests say so).
    const SHARES: [Reason; 3] = [Reason::QueueFull, Reason::Criticality, Reason::TenantShare];
    let views = g.tenants(&g.snapshot());
    let view = views
        .iter()
        .find(|v| v.tenant.name == tenant)
        .unwrap_or_else(|| panic!("{tenant} in {views:?}"));
    let t = &view.counts.total;
    (
        t.admitted,
        SHARES.map(|r| t.refused(r)),
        SHARES.map(|r| t.would_refuse(r)),
    )
}

/// Round 0: A (`t0`) fills a ceiling of 40, B (`t1`) is refused once at it; 10 of A's end
/// not stored; round 1 opens: B is owed 1 of the 10. A then sends until refused: what A got.
async fn a_greedy_round(
    mode: crate::admission::fair::share::ShareMode,
) -> (Arc<CapacityGate>, u64) {
    use crate::admission::tenants::Criticality::Default as D;
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = shared_gate(
        policy(40, SHARE_TTL_MS, false, 3),
        &backend,
        &tenants(&[1, 1]),
        fair(mode),
    );
    let mut held = Vec::new();
    while let Ok(r) = g.admit_units_for(asker(0, D), 1).await {
        held.push(r);
    }
    assert!(g.admit_units_for(asker(1, D), 1).await.is_err());
    for r in held.drain(..10) {
        r.finish(BacklogEffect::NotStored);
    }
    until_the_next_read().await;
    let mut got = 0;
    while let Ok(r) = g.admit_units_for(asker(0, D), 1).await {
        std::mem::forget(r);
        got += 1;
    }
    std::mem::forget(held);
    (g, got)
}

#[tokio::test(start_paused = true)]
async fn enforced_the_tally_counts_each_tenants_refusals_by_reason_and_shows_its_part() {
    use crate::admission::fair::share::ShareMode;
    let (g, got) = a_greedy_round(ShareMode::Enforce).await;
    assert_eq!(got, 9, "B is owed one of the ten");
    // A: 40 + 9 admitted; its 41st at the ceiling, then the first past its part.
    assert_eq!(tallied(&g, "t0"), (49, [1, 0, 1], [0, 0, 0]));
    assert_eq!(
        tallied(&g, "t1"),
        (0, [1, 0, 0], [0, 0, 0]),
        "B at the ceiling"
    );
    let views = g.tenants(&g.snapshot());
    let share = |name: &str| views.iter().find(|v| v.tenant.name == name).unwrap().share;
    assert!((share("t0") - 0.9).abs() < 1e-9, "{views:?}");
    assert!((share("t1") - 0.1).abs() < 1e-9, "{views:?}");
    // The rates are of the last 10 s: 49 admitted over them, 4.9 a second.
    let a = views.iter().find(|v| v.tenant.name == "t0").unwrap();
    assert_eq!(a.counts.per_s.admitted, 4.9);
    assert_eq!(a.tenant.weight, 1);
}

#[tokio::test(start_paused = true)]
async fn in_shadow_a_send_past_its_part_is_admitted_and_counted_as_a_would_be_refusal() {
    use crate::admission::fair::share::ShareMode;
    let (g, got) = a_greedy_round(ShareMode::Shadow).await;
    assert_eq!(got, 10, "nothing refused but at the ceiling");
    // A's tenth of round 1 is the unit B was owed: admitted, counted as enforce's refusal;
    // its last ask of each round met the ceiling.
    assert_eq!(tallied(&g, "t0"), (50, [2, 0, 0], [0, 0, 1]));
    assert_eq!(tallied(&g, "t1"), (0, [1, 0, 0], [0, 0, 0]));
    let (g, _) = a_greedy_round(ShareMode::Off).await;
    assert_eq!(
        tallied(&g, "t0"),
        (50, [2, 0, 0], [0, 0, 0]),
        "off: none counted"
    );
}

#[tokio::test(start_paused = true)]
async fn in_shadow_a_send_past_its_criticality_cut_is_admitted_and_counted() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::Sheddable;
    for (mode, admitted, refused, would) in [
        (ShareMode::Shadow, 10, [1, 0, 0], [0, 2, 0]),
        (ShareMode::Enforce, 8, [0, 1, 0], [0, 0, 0]),
        (ShareMode::Off, 8, [0, 1, 0], [0, 0, 0]),
    ] {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
        let g = shared_gate(
            policy(10, 10_000, false, 3),
            &backend,
            &tenants(&[1]),
            fair(mode),
        );
        let mut held = Vec::new();
        // Sheddable is cut at 8 of 10: shadow admits to the ceiling and counts the two.
        while let Ok(r) = g.admit_units_for(asker(0, Sheddable), 1).await {
            held.push(r);
        }
        assert_eq!(held.len() as u64, admitted, "{mode:?}");
        assert_eq!(tallied(&g, "t0"), (admitted, refused, would), "{mode:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn without_shares_the_gate_shows_no_tenants_and_fail_closed_refusals_count_for_none() {
    use crate::admission::fair::share::ShareMode;
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = gate(policy(10, 10_000, false, 3), &backend);
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    assert!(g.tenants(&g.snapshot()).is_empty(), "no book, no tally");
    // Depth unknown, gate on at a streak of 1: refused for no tenant's sake.
    let backend = Arc::new(ScriptedDepth::new(
        vec![Err(DepthError::Timeout)],
        Duration::ZERO,
    ));
    let g = shared_gate(
        policy(10, 0, true, 1),
        &backend,
        &tenants(&[1]),
        fair(ShareMode::Enforce),
    );
    assert!(matches!(
        g.admit_units_for(asker(0, crate::admission::tenants::Criticality::Default), 1)
            .await,
        Err(Refusal::CapacityUnknown { .. })
    ));
    assert!(g.tenants(&g.snapshot()).is_empty());
}

/// Counts the exchanges made through it, answering nothing heard.
#[derive(Default)]
struct CountedExchange(AtomicU64);

#[async_trait]
impl crate::coordination::shares::ShareExchange for CountedExchange {
    async fn exchange(
        &self,
        _: &str,
        _: &str,
        mine: &crate::coordination::shares::RoundCounts,
    ) -> Result<crate::coordination::shares::RoundCounts, crate::coordination::shares::ExchangeError>
    {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(crate::coordination::shares::RoundCounts::empty(mine.round))
    }
}

#[tokio::test(start_paused = true)]
async fn with_shares_off_a_gate_of_two_tenants_makes_no_exchange_calls() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::Default as D;
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let place = |exchange: &Arc<CountedExchange>| crate::admission::fair::Place {
        exchange: Arc::clone(exchange) as Arc<dyn crate::coordination::shares::ShareExchange>,
        key: "q:tenants".into(),
        replica: "r".into(),
    };
    let mut calls = Vec::new();
    for mode in [ShareMode::Enforce, ShareMode::Off] {
        let exchange = Arc::new(CountedExchange::default());
        let g = gate_with(
            policy(40, 10_000, false, 3),
            &backend,
            FairParts {
                exchange: Some(place(&exchange)),
                ..fair_parts(&two_tenants(), fair(mode))
            },
        );
        for _ in 0..10 {
            let _ = g.admit_units_for(asker(0, D), 1).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        calls.push(exchange.0.load(Ordering::SeqCst));
    }
    // Enforced, the book tells its counts every 100 ms while it has asks; off, nobody's
    // counts change a decision: no Redis call for them.
    assert!(calls[0] >= 5, "enforced: {} exchanges", calls[0]);
    assert_eq!(calls[1], 0, "off: {} exchanges", calls[1]);
}

/// A gate whose room `tenants` share by `fair`.
fn shared_gate(
    p: CapacityPolicy,
    backend: &Arc<ScriptedDepth>,
    tenants: &Tenants,
    fair: crate::admission::fair::FairPolicy,
) -> Arc<CapacityGate> {
    gate_with(p, backend, fair_parts(tenants, fair))
}

/// As [`shared_gate`], the tenants held to `quotas`: the gate, and the tenants' rate book.
fn quota_gate(
    p: CapacityPolicy,
    backend: &Arc<ScriptedDepth>,
    tenants: &Tenants,
    fair: crate::admission::fair::FairPolicy,
    quotas: &[crate::admission::tenants::Quota],
) -> (
    Arc<CapacityGate>,
    Arc<crate::admission::fair::quota::RateBook>,
) {
    let rates = Arc::new(crate::admission::fair::quota::RateBook::new(
        quotas,
        tokio::time::Instant::now(),
    ));
    let parts = FairParts {
        quotas: Some(crate::admission::fair::quota::QueueQuotas::new(
            quotas,
            Arc::clone(&rates),
        )),
        ..fair_parts(tenants, fair)
    };
    (gate_with(p, backend, parts), rates)
}

fn fair_parts(tenants: &Tenants, fair: crate::admission::fair::FairPolicy) -> FairParts {
    FairParts {
        queue: QueueName::parse("requests").unwrap(),
        tenants: tenants.clone(),
        policy: fair,
        quotas: None,
        exchange: None,
    }
}

fn gate_with(
    p: CapacityPolicy,
    backend: &Arc<ScriptedDepth>,
    fair: FairParts,
) -> Arc<CapacityGate> {
    CapacityGate::new(GateParts {
        fairness: Some(QueueFairness::new(fair)),
        ..GateParts::alone(QueueName::parse("requests").unwrap(), p, backend.clone())
    })
}

fn rated(per_s: f64, burst: u32) -> crate::admission::tenants::Quota {
    crate::admission::tenants::Quota {
        rate: crate::admission::tenants::Rate::new(per_s, Some(burst)),
        max_share: None,
    }
}

/// A replica's gate whose tenants' rates are leased from the fleet's `rates`, in a fleet
/// of `n` it has joined (the gate itself decides alone: only the rates are shared).
async fn leasing_gate(
    n: u64,
    rates: &Arc<crate::coordination::rates::MemoryRates>,
    tenants: &Tenants,
) -> Arc<CapacityGate> {
    use crate::admission::fair::fleet_rate::FleetRates;
    use crate::admission::fair::quota::{QueueQuotas, RateBook};
    use crate::coordination::fleet::{Fleet, IDLE, MEMBER_FOR};
    use crate::coordination::memory::MemoryLedger;
    let fleet = Fleet::start(Arc::new(MemoryLedger::new(Duration::from_millis(100))), n);
    let terms = crate::coordination::port::Terms {
        hold: Duration::from_secs(1),
        lag: Duration::ZERO,
        max_read_age: Duration::from_secs(1),
        grace: Duration::ZERO,
        member_for: MEMBER_FOR,
        idle: IDLE,
    };
    fleet.register("q".into(), terms);
    while !fleet.joined() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ledger = Arc::clone(rates) as Arc<dyn crate::coordination::rates::RateLedger>;
    let book = RateBook::in_fleet(tenants, FleetRates { ledger, fleet }, Instant::now());
    let parts = FairParts {
        quotas: Some(QueueQuotas::new(&tenants.quotas(), Arc::new(book))),
        ..fair_parts(
            tenants,
            fair(crate::admission::fair::share::ShareMode::Enforce),
        )
    };
    gate_with(policy(1_000_000_000, 100, false, 3), &depths([]), parts)
}

/// Issue 39: three replicas' gates, a tenant sending at 3x its rate spread over them, admit
/// its rate ±10 % (each gate leases the tenant's units before its judge asks for them);
/// with each its own book, as before, they admitted 3x.
#[tokio::test(start_paused = true)]
async fn three_gates_leasing_one_fleets_rate_admit_the_tenants_rate() {
    use crate::admission::tenants::{Criticality::Default as D, Tenant};
    let tenants = Tenants::new(vec![Tenant {
        name: "t".into(),
        weight: 1,
        quota: rated(1000.0, 10),
    }])
    .unwrap();
    let rates = Arc::new(crate::coordination::rates::MemoryRates::default());
    let mut gates = Vec::new();
    for _ in 0..3 {
        gates.push(leasing_gate(3, &rates, &tenants).await);
    }
    let mut admitted = 0u64;
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        for gate in &gates {
            admitted += u64::from(gate.admit_units_for(asker(0, D), 1).await.is_ok());
        }
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    assert!(
        (4500..=5010).contains(&admitted),
        "admitted {admitted} at 1000/s over 5 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_rate_quota_refuses_after_the_burst_and_only_admitted_units_count() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::{Criticality::Default as D, Criticality::Sheddable, QuotaKind};
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let (g, rates) = quota_gate(
        policy(10, 10_000, false, 3),
        &backend,
        &tenants(&[1]),
        fair(ShareMode::Enforce),
        &[rated(1.0, 3)],
    );
    let a = crate::admission::tenants::TenantIndex(0);
    // The burst at once.
    let mut held: Vec<_> = Vec::new();
    for _ in 0..3 {
        held.push(g.admit_units_for(asker(0, D), 1).await.unwrap());
    }
    assert_eq!(
        rates
            .state(a, tokio::time::Instant::now())
            .unwrap()
            .available,
        0
    );
    match g.admit_units_for(asker(0, D), 1).await {
        Err(Refusal::TenantQuota {
            quota: QuotaKind::Rate,
            retry_after,
            room: 0,
        }) => assert_eq!(retry_after, Duration::from_secs(1)),
        other => panic!("{:?}", other.err()),
    }
    // Refused again and again: the bucket gives the unit back on time all the same.
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(g.admit_units_for(asker(0, D), 1).await.is_err());
    tokio::time::advance(Duration::from_millis(500)).await;
    held.push(g.admit_units_for(asker(0, D), 1).await.unwrap());
    // A send shed for its criticality takes nothing either: 4 held of 10, sheddable cut 8.
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(
        rates
            .state(a, tokio::time::Instant::now())
            .unwrap()
            .available,
        3
    );
    match g.admit_units_for(asker(0, Sheddable), 5).await {
        Err(Refusal::Shed { room: 4, .. }) => {}
        other => panic!("{:?}", other.err()),
    }
    assert_eq!(
        rates
            .state(a, tokio::time::Instant::now())
            .unwrap()
            .available,
        3
    );
    // A batch of n takes n units or none.
    assert!(matches!(
        g.admit_units_for(asker(0, D), 4).await,
        Err(Refusal::TenantQuota {
            quota: QuotaKind::Rate,
            room: 3,
            ..
        })
    ));
    held.push(g.admit_units_for(asker(0, D), 3).await.unwrap());
    assert_eq!(
        rates
            .state(a, tokio::time::Instant::now())
            .unwrap()
            .available,
        0
    );
}

#[tokio::test(start_paused = true)]
async fn a_send_refused_for_its_share_takes_nothing_of_its_quota() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::Default as D;
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let (g, rates) = quota_gate(
        policy(40, SHARE_TTL_MS, false, 3),
        &backend,
        &tenants(&[1, 1]),
        fair(ShareMode::Enforce),
        &[rated(1000.0, 1000), Default::default()],
    );
    let (a, b) = (asker(0, D), asker(1, D));
    let mut held = Vec::new();
    while let Ok(r) = g.admit_units_for(a, 1).await {
        held.push(r);
    }
    assert!(g.admit_units_for(b, 1).await.is_err());
    for r in held.drain(..10) {
        r.finish(BacklogEffect::NotStored);
    }
    until_the_next_read().await;
    let now = tokio::time::Instant::now();
    let before = rates
        .state(crate::admission::tenants::TenantIndex(0), now)
        .unwrap()
        .available;
    let mut admitted = 0;
    loop {
        match g.admit_units_for(a, 1).await {
            Ok(r) => {
                held.push(r);
                admitted += 1;
            }
            Err(Refusal::TenantShare { .. }) => break,
            Err(other) => panic!("{other:?}"),
        }
    }
    for _ in 0..50 {
        assert!(matches!(
            g.admit_units_for(a, 1).await,
            Err(Refusal::TenantShare { .. })
        ));
    }
    let after = rates
        .state(crate::admission::tenants::TenantIndex(0), now)
        .unwrap()
        .available;
    assert_eq!(
        before - after,
        admitted,
        "only the admitted units were taken"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queues_shed_level_is_the_override_in_force() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::fair::FairOverride;
    use crate::admission::tenants::Criticality::Sheddable;
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = shared_gate(
        policy(10, 10_000, false, 3),
        &backend,
        &tenants(&[1]),
        fair(ShareMode::Off),
    );
    g.fairness().unwrap().apply(&FairOverride {
        shed_at_sheddable: Fraction::new(0.3),
        ..FairOverride::default()
    });
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(g.admit_units_for(asker(0, Sheddable), 1).await.unwrap());
    }
    assert!(matches!(
        g.admit_units_for(asker(0, Sheddable), 1).await,
        Err(Refusal::Shed { cut: 3, .. })
    ));
    // Crossed levels (an override kept while a variable changed): sheddable is held to
    // default, never above it.
    g.fairness().unwrap().apply(&FairOverride {
        shed_at_sheddable: Fraction::new(0.9),
        shed_at_default: Fraction::new(0.5),
        ..FairOverride::default()
    });
    assert_eq!(
        g.fairness().map(|f| f.policy().shed_at_sheddable),
        Fraction::new(0.5)
    );
    g.fairness().unwrap().apply(&FairOverride::default());
    assert_eq!(
        g.fairness().map(QueueFairness::policy),
        g.fairness().map(QueueFairness::base)
    );
    held.push(g.admit_units_for(asker(0, Sheddable), 1).await.unwrap());
}

/// Two tenants on a ceiling of 40, empty at every read: A fills the queue, then B is
/// refused at the ceiling `b_refused` times. The gate, and A's sends held.
async fn filled_by_a_beside_b(b_refused: usize) -> (Arc<CapacityGate>, Vec<Reservation>) {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::Default as D;
    let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
    let g = shared_gate(
        policy(40, SHARE_TTL_MS, false, 3),
        &backend,
        &two_tenants(),
        fair(ShareMode::Enforce),
    );
    let mut held = Vec::new();
    while let Ok(r) = g.admit_units_for(asker(0, D), 1).await {
        held.push(r);
    }
    for _ in 0..b_refused {
        assert!(matches!(
            g.admit_units_for(asker(1, D), 1).await,
            Err(Refusal::QueueFull { .. })
        ));
    }
    (g, held)
}

#[tokio::test(start_paused = true)]
async fn a_queue_idle_for_two_rounds_forgets_who_asked_and_that_it_was_contended() {
    use crate::admission::tenants::Criticality::Default as D;
    let a = asker(0, D);
    let (g, mut held) = filled_by_a_beside_b(20).await;
    assert!(g.tenants(&g.snapshot()).iter().any(|t| t.share > 0.0));
    // Everything drains; nobody sends for an hour.
    for r in held.drain(..) {
        r.finish(BacklogEffect::NotStored);
    }
    tokio::time::advance(Duration::from_secs(3600)).await;
    // Health shows no part for anyone: nobody asked in this round or the last.
    let shares: Vec<f64> = g.tenants(&g.snapshot()).iter().map(|t| t.share).collect();
    assert_eq!(shares, [0.0, 0.0]);
    // A alone, to the empty queue: the whole ceiling is its (an hour-old round's asks and
    // refusals count for nothing).
    let mut got = 0;
    while let Ok(r) = g.admit_units_for(a, 1).await {
        held.push(r);
        got += 1;
    }
    assert_eq!(got, 40, "work-conserving after an idle hour");
}

#[tokio::test(start_paused = true)]
async fn a_queue_asked_within_two_rounds_keeps_what_it_counted() {
    use crate::admission::tenants::Criticality::Default as D;
    let a = asker(0, D);
    let (g, mut held) = filled_by_a_beside_b(1).await;
    for r in held.drain(..10) {
        r.finish(BacklogEffect::NotStored);
    }
    // Just under two rounds later (reads a second apart): B's ask still counts.
    tokio::time::advance(Duration::from_millis(1_900)).await;
    let mut a_got = 0;
    while let Ok(r) = g.admit_units_for(a, 1).await {
        held.push(r);
        a_got += 1;
    }
    assert_eq!(a_got, 9, "B's unit of the 10 is kept for it");
}

/// Issue 39: health shows the last depth read beside the estimate made from it.
#[tokio::test(start_paused = true)]
async fn the_snapshot_shows_the_depth_read_beside_the_estimate() {
    let backend = depths([7]);
    let g = gate(policy(100, 60_000, false, 3), &backend);
    assert_eq!(g.snapshot().depth_read, None, "before the first read");
    for _ in 0..2 {
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
    }
    tokio::time::advance(Duration::from_millis(1500)).await;
    let s = g.snapshot();
    assert_eq!(s.backlog, Some(9), "the read and the two sends since");
    assert_eq!(
        s.depth_read,
        Some(policy::DepthRead {
            backlog: 7,
            age: Duration::from_millis(1500)
        })
    );
}

/// Work conservation, in a file of its own beside this one.
#[path = "conserving_tests.rs"]
mod conserving;

/// A gate with a ceiling of 10 that has measured a drain of 1/s and is full at 10 (reads
/// of 12, 11, 10 a second apart), its next read (`then`) showing room.
async fn full_draining(then: &[u64]) -> (Arc<CapacityGate>, Arc<ScriptedDepth>) {
    let backend = depths([12, 11, 10].into_iter().chain(then.iter().copied()));
    let g = gate(policy(10, 1000, false, 3), &backend);
    read_each_second(&g, 3).await;
    (g, backend)
}

fn claim(n: u32) -> Option<ClaimKey> {
    Some(ClaimKey::of(&format!("producer-{n}")))
}

async fn claiming(g: &Arc<CapacityGate>, key: Option<ClaimKey>) -> Result<(), Duration> {
    match g.admit_claiming(Asker::OPEN, 1, key).await {
        Ok(held) => {
            held.finish(BacklogEffect::Stored);
            Ok(())
        }
        Err(refusal) => Err(refusal.room_wait().expect("refused for room")),
    }
}

#[tokio::test(start_paused = true)]
async fn a_producer_back_for_its_place_is_admitted_before_a_fresh_send() {
    for keyed in [true, false] {
        let (g, _) = full_draining(&[9, 9, 9, 9]).await;
        let key = keyed.then(|| claim(1)).flatten();
        let told = claiming(&g, key).await.expect_err("full");
        tokio::time::advance(told).await;
        // The read now shows a place: kept for the producer it was promised to.
        let fresh = claiming(&g, claim(2)).await;
        let back = claiming(&g, key).await;
        if keyed {
            assert!(fresh.is_err(), "the room is kept: {fresh:?}");
            assert_eq!(back, Ok(()), "told {told:?}");
        } else {
            assert_eq!(fresh, Ok(()), "nothing kept without a key");
            assert!(back.is_err());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_producer_back_early_is_told_the_rest_of_its_wait_and_keeps_its_place() {
    let (g, _) = full_draining(&[10, 10, 10, 9]).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    // Others refused behind it: the line the early one would go to the back of.
    let behind = claiming(&g, claim(2)).await.expect_err("full");
    assert!(behind >= told, "{behind:?} {told:?}");
    tokio::time::advance(told / 2).await;
    let rest = claiming(&g, claim(1)).await.expect_err("not yet due");
    assert!(rest <= told, "the rest of its wait, {rest:?} of {told:?}");
    assert!(
        rest < behind + Duration::from_secs(1),
        "not a new place behind the line"
    );
}

/// A fresh send refused for the room kept waits at least until the next depth read, as one
/// refused at the ceiling does: no read before then can show it the room it needs.
#[tokio::test(start_paused = true)]
async fn a_fresh_send_refused_for_the_room_kept_is_told_no_sooner_than_the_next_read() {
    let backend = depths([30, 20, 10, 0]);
    let g = gate(policy(10, 5000, false, 3), &backend);
    for _ in 0..2 {
        refused(&g).await;
        tokio::time::advance(Duration::from_secs(5)).await;
    }
    let told = claiming(&g, claim(1))
        .await
        .expect_err("full, draining 2/s");
    assert_eq!(told, Duration::from_secs(5), "until the next read");
    // The line before it is served, and the read made now finds the queue emptied: fresh
    // sends fill it up to the unit kept for the first.
    tokio::time::advance(told + Duration::from_millis(100)).await;
    for n in 0..9 {
        assert_eq!(claiming(&g, None).await, Ok(()), "send {n}");
    }
    let fresh = claiming(&g, None).await.expect_err("the last unit is kept");
    assert_eq!(
        fresh,
        Duration::from_secs(5),
        "until the read after this one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_promise_nobody_claims_keeps_no_room_past_its_lapse() {
    let (g, _) = full_draining(&[9, 9, 9, 9, 9, 9, 9, 9]).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    tokio::time::advance(told).await;
    assert!(claiming(&g, None).await.is_err(), "kept for the first");
    tokio::time::advance(claims::LEAST_GRACE.max(told / 2)).await;
    assert_eq!(
        claiming(&g, claim(3)).await,
        Ok(()),
        "the first never came back"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fresh_send_yields_only_to_the_promises_of_its_own_tenant() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::tenants::Criticality::Default as D;
    // Shares off: the ceiling and the promises alone decide.
    let backend = depths([12, 11, 10, 9]);
    let parts = fair_parts(&two_tenants(), fair(ShareMode::Off));
    let g = gate_with(policy(10, 1000, false, 3), &backend, parts);
    read_each_second(&g, 3).await;
    let (a, b) = (asker(0, D), asker(1, D));
    let told = match g.admit_claiming(a, 1, claim(1)).await {
        Err(refusal) => refusal.room_wait().expect("refused for room"),
        Ok(_) => panic!("full"),
    };
    tokio::time::advance(told).await;
    // One unit of room, kept for A's promise: A's fresh send yields to it, B's does not.
    assert!(g.admit_claiming(a, 1, None).await.is_err());
    g.admit_claiming(b, 1, None)
        .await
        .expect("B is not behind A's line")
        .finish(BacklogEffect::Stored);
}

#[tokio::test(start_paused = true)]
async fn a_producer_back_early_to_a_queue_with_room_is_admitted() {
    // The queue empties after the refusal (every read from the next one shows 0).
    let (g, _) = full_draining(&[0]).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    assert!(told > Duration::from_secs(1), "{told:?}");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        claiming(&g, claim(1)).await,
        Ok(()),
        "room beyond what is kept"
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_past_its_ttl_is_made_again_before_room_is_kept() {
    let (g, backend) = full_draining(&[0]).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    // Quiet until the read is stale; the queue emptied meanwhile.
    tokio::time::advance(told).await;
    let reads = backend.reads();
    tokio::time::advance(Duration::from_secs(1)).await;
    // A fresh send is decided on a new read, not refused on the stale one for the promise.
    assert_eq!(claiming(&g, None).await, Ok(()));
    assert!(backend.reads() > reads);
}

/// Review of the claims (2fa043c): a claim admitted by the gate but never sent (the
/// dispatcher then found no in-flight slot, `503 saturated`, or no breaker ticket, or the
/// send never reached the broker) lost its promise at the admission: its retry was a fresh
/// send, refused behind the whole line. The promise is kept until the send is stored (or
/// may have been).
#[tokio::test(start_paused = true)]
async fn a_claim_admitted_but_never_sent_keeps_its_place() {
    let (g, _) = full_draining(&[9, 9, 9, 9]).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    tokio::time::advance(told).await;
    let held = g
        .admit_claiming(Asker::OPEN, 1, claim(1))
        .await
        .expect("its place");
    // No slot, no ticket, or the broker never reached: nothing stored.
    held.finish(BacklogEffect::NotStored);
    assert!(claiming(&g, claim(2)).await.is_err(), "still kept for it");
    assert_eq!(claiming(&g, claim(1)).await, Ok(()), "the retry claims it");
    // Stored: the promise is kept no more.
    let now = tokio::time::Instant::now();
    let standing = g.claims.as_ref().unwrap().standing(claim(1), now);
    assert_eq!(standing, claims::Standing::Fresh, "claimed once stored");
}

#[tokio::test(start_paused = true)]
async fn a_batch_refused_for_the_room_kept_is_told_the_room_beside_it() {
    let (g, _) = full_draining(&[5]).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    tokio::time::advance(told).await;
    // The read now shows 5 units of room, one of them kept for the producer told to come.
    match g.admit_claiming(Asker::OPEN, 5, None).await {
        Err(Refusal::QueueFull { room, .. }) => assert_eq!(room, 4),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test(start_paused = true)]
async fn a_producer_back_for_its_place_to_a_full_queue_keeps_the_head_of_the_line() {
    let (g, _) = full_draining(&[10]).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    // Ten more behind it: at 1/s, the line runs ten seconds past its place.
    for n in 2..12 {
        claiming(&g, claim(n)).await.expect_err("full");
    }
    tokio::time::advance(told).await;
    let again = claiming(&g, claim(1)).await.expect_err("still full");
    let fresh = claiming(&g, claim(99)).await.expect_err("full");
    // Told the refusal's own wait (when the next place opens: 5 s, first told 3 s), not a
    // place behind the ten (60 s; a fresh send's 60 s when written).
    assert!(again <= told * 2, "{again:?} {told:?}");
    assert!(fresh >= again * 4, "{fresh:?} {again:?}");
}

#[tokio::test(start_paused = true)]
async fn a_producer_back_early_refused_while_the_gate_resumes_keeps_its_place() {
    // Resuming at 5 of 10: refused from 10 until the backlog is at 5, whatever the room.
    let backend = depths([12, 11, 10, 8]);
    let p = CapacityPolicy {
        resume_below: Fraction::new(0.5).unwrap(),
        ..policy(10, 1000, false, 3)
    };
    let g = gate(p, &backend);
    read_each_second(&g, 3).await;
    let told = claiming(&g, claim(1)).await.expect_err("full");
    tokio::time::advance(Duration::from_secs(1)).await;
    // 8: two units of room, more than the one kept, but still above the resume level: the
    // gate refuses it, and it is told the rest of its wait (6 s of 7; a new place, from
    // the backlog's time to the resume level, was 5 s, ahead of those it was refused
    // behind).
    let rest = claiming(&g, claim(1)).await.expect_err("resuming");
    assert_eq!(rest, told - Duration::from_secs(1), "told {told:?}");
}

/// Review 2: a batch is a fresh send, and the contract says a fresh send is never refused
/// for the room kept "while the queue holds less than half of it" (no idle workers for a
/// promise). A batch of more than half the ceiling was refused at an empty queue while
/// promises were outstanding.
#[tokio::test(start_paused = true)]
async fn a_batch_is_never_refused_for_the_room_kept_below_half_the_ceiling() {
    // The queue empties after the refusals (every read from the next one shows 0).
    let (g, _) = full_draining(&[0]).await;
    for n in 1..6 {
        claiming(&g, claim(n)).await.expect_err("full");
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    // Five units kept (half of 10); the queue is empty: a batch of 6 fits under the ceiling.
    match g.admit_claiming(Asker::OPEN, 6, None).await {
        Ok(held) => held.finish(BacklogEffect::Stored),
        Err(refusal) => panic!("refused at an empty queue: {refusal:?}"),
    }
}

/// Review 2: with `SENDGATE_DEPTH_TTL_MS=0` (a read before every send), a send while
/// promises are outstanding read the depth twice (once for the room kept, once for its
/// decision): twice the admin-plane load, and a failing admin plane added two to the
/// streak per send (the contract: one per failed read, fail-closed at the third send).
#[tokio::test(start_paused = true)]
async fn with_no_ttl_a_send_reads_once_while_promises_are_kept() {
    // The queue empties after the refusal: the send is decided past the room kept.
    let (g, backend) = full_draining(&[0]).await;
    claiming(&g, claim(1)).await.expect_err("full");
    g.policy_cell().apply(&PolicyOverride {
        ttl: Some(Duration::ZERO),
        ..PolicyOverride::default()
    });
    tokio::time::advance(Duration::from_millis(100)).await;
    let reads = backend.reads();
    assert_eq!(claiming(&g, None).await, Ok(()), "room beyond the one kept");
    // Nor one started in the background for it.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(backend.reads(), reads + 1, "one read for one send");
}
