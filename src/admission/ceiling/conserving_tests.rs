//! Work conservation on the paused clock: a queue drained at a set rate behind one
//! process's gate, sends arriving open-loop faster than it drains (issue 39, item 3).

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::super::*;
use super::policy;
use crate::backend::{Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};

/// A queue whose depth the test moves (stores, a consumer's takes), read by the gate as an
/// admin plane would: after `read_delay`, as the queue stood `lag` before the read ended
/// (exact with no lag: sends stored while the read runs are in it, and counted on top by
/// the gate as well, the harsher case).
struct FakeQueue {
    /// `(since, depth)`: the depth from each change on, oldest first.
    history: Mutex<VecDeque<(Instant, u64)>>,
    read_delay: Duration,
    lag: Duration,
    reads: Mutex<u64>,
    /// Reads fail while set.
    failing: Mutex<bool>,
}

impl FakeQueue {
    fn new(read_delay: Duration, lag: Duration) -> Arc<Self> {
        Arc::new(Self {
            history: Mutex::new(VecDeque::from([(Instant::now(), 0)])),
            read_delay,
            lag,
            reads: Mutex::new(0),
            failing: Mutex::new(false),
        })
    }

    fn depth(&self) -> u64 {
        self.history.lock().back().map_or(0, |(_, d)| *d)
    }

    fn set(&self, depth: u64) {
        let mut history = self.history.lock();
        history.push_back((Instant::now(), depth));
        // Keep what a lagging read can still ask for.
        let keep = self.lag + Duration::from_secs(1);
        while history.len() > 1 && history[1].0 + keep < Instant::now() {
            history.pop_front();
        }
    }

    fn store(&self) {
        self.set(self.depth() + 1);
    }

    /// A consumer's poll: whether it found a message to take.
    fn take(&self) -> bool {
        let depth = self.depth();
        if depth > 0 {
            self.set(depth - 1);
        }
        depth > 0
    }

    fn shown_at(&self, at: Instant) -> u64 {
        let history = self.history.lock();
        history
            .iter()
            .take_while(|(since, _)| *since <= at)
            .last()
            .or(history.front())
            .map_or(0, |(_, d)| *d)
    }

    fn reads(&self) -> u64 {
        *self.reads.lock()
    }
}

#[async_trait]
impl Backend for FakeQueue {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn depth_lag(&self) -> Duration {
        self.lag
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        unreachable!("the test stores what the gate admits")
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        *self.reads.lock() += 1;
        tokio::time::sleep(self.read_delay).await;
        if *self.failing.lock() {
            return Err(DepthError::Failed("admin plane down".into()));
        }
        let at = Instant::now()
            .checked_sub(self.lag)
            .unwrap_or_else(Instant::now);
        Ok(Backlog::of(self.shown_at(at)))
    }
}

/// Open-loop arrivals: exponential gaps at a rate, from a fixed seed (xorshift).
struct Arrivals {
    seed: u64,
    next: Instant,
}

impl Arrivals {
    fn new(seed: u64) -> Self {
        Self {
            seed,
            next: Instant::now(),
        }
    }

    fn unit(&mut self) -> f64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        ((self.seed >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// How many sends arrive by `now` at `per_s`.
    fn due(&mut self, now: Instant, per_s: f64) -> u64 {
        let mut n = 0;
        while self.next <= now {
            n += 1;
            let gap = -self.unit().ln() / per_s;
            self.next += Duration::from_secs_f64(gap);
        }
        n
    }
}

/// What a run saw.
#[derive(Debug, Default)]
struct Seen {
    admitted: u64,
    refused: u64,
    /// The consumer's polls made while some send was refused within the poll interval,
    /// and how many of those found the queue empty.
    polls_refusing: u64,
    empty_refusing: u64,
    max_depth: u64,
    last_refusal: Option<Instant>,
}

impl Seen {
    fn empty_share(&self) -> f64 {
        self.empty_refusing as f64 / self.polls_refusing.max(1) as f64
    }
}

/// One process's gate in front of a queue a consumer drains at `drain_per_s`.
struct Bench {
    gate: Arc<CapacityGate>,
    queue: Arc<FakeQueue>,
    arrivals: Arrivals,
    drain_per_s: u64,
    limit: u64,
    step: Duration,
    /// How long an admitted send takes: stored half-way, settled at the end.
    send_takes: Duration,
    /// Sends admitted and not yet settled: `(stored at, settled at, stored yet, its place)`.
    sending: VecDeque<(Instant, Instant, bool, Reservation)>,
}

impl Bench {
    async fn new(limit: u64, drain_per_s: u64, queue: Arc<FakeQueue>) -> Self {
        let gate = CapacityGate::new(GateParts::alone(
            QueueName::parse("requests").unwrap(),
            policy(limit, 1000, false, 3),
            queue.clone(),
        ));
        gate.prime().await;
        Self {
            gate,
            queue,
            arrivals: Arrivals::new(0x9E37_79B9_7F4A_7C15),
            drain_per_s,
            limit,
            step: Duration::from_millis(1),
            send_takes: Duration::ZERO,
            sending: VecDeque::new(),
        }
    }

    /// Sends arriving at `per_s` for `span`, a millisecond at a time.
    async fn run(&mut self, per_s: f64, span: Duration) -> Seen {
        let mut seen = Seen::default();
        let poll_every = Duration::from_secs(1) / u32::try_from(self.drain_per_s).unwrap();
        let start = Instant::now();
        let mut next_poll = start;
        while Instant::now() < start + span {
            let now = Instant::now();
            for _ in 0..self.arrivals.due(now, per_s) {
                self.send(now, &mut seen).await;
            }
            self.progress(now, &mut seen);
            if now >= next_poll {
                next_poll += poll_every;
                let refusing = seen
                    .last_refusal
                    .is_some_and(|at| now.duration_since(at) < poll_every);
                let found = self.queue.take();
                if refusing {
                    seen.polls_refusing += 1;
                    seen.empty_refusing += u64::from(!found);
                }
            }
            tokio::time::advance(self.step).await;
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
        }
        seen
    }

    async fn send(&mut self, now: Instant, seen: &mut Seen) {
        match self.gate.admit().await {
            Ok(reservation) => {
                seen.admitted += 1;
                let store_at = now + self.send_takes / 2;
                self.sending
                    .push_back((store_at, now + self.send_takes, false, reservation));
                self.progress(now, seen);
            }
            Err(Refusal::QueueFull { .. }) => {
                seen.refused += 1;
                seen.last_refusal = Some(now);
            }
            Err(other) => panic!("refused for something else: {other:?}"),
        }
    }

    /// Store the sends due to be stored by `now`, and settle those due to end.
    fn progress(&mut self, now: Instant, seen: &mut Seen) {
        for (store_at, _, stored, _) in self.sending.iter_mut() {
            if !*stored && *store_at <= now {
                *stored = true;
                self.queue.store();
                seen.max_depth = seen.max_depth.max(self.queue.depth());
                assert!(
                    self.queue.depth() <= self.limit,
                    "the queue passed its ceiling: {} > {}",
                    self.queue.depth(),
                    self.limit
                );
            }
        }
        while self
            .sending
            .front()
            .is_some_and(|(_, settle_at, stored, _)| *stored && *settle_at <= now)
        {
            if let Some((_, _, _, reservation)) = self.sending.pop_front() {
                reservation.finish(BacklogEffect::Stored);
            }
        }
    }
}

/// Ceiling 50 against a drain of 100/s and the default 1 s TTL (a ceiling below D × TTL),
/// sends at 5 × D: the gate must settle on the drain, never past the ceiling, and leave the
/// consumer short of work on at most 1 % of its polls while it refuses. Before refusals
/// read again, 50 a second were admitted (a read's worth of room per TTL) and about half
/// the polls found the queue empty.
#[tokio::test(start_paused = true)]
async fn a_ceiling_below_the_drain_per_ttl_admits_the_drain_and_keeps_the_consumer_busy() {
    let queue = FakeQueue::new(Duration::from_millis(2), Duration::ZERO);
    let mut bench = Bench::new(50, 100, queue.clone()).await;
    bench.run(500.0, Duration::from_secs(1)).await;
    let seen = bench.run(500.0, Duration::from_secs(10)).await;
    let rate = seen.admitted as f64 / 10.0;
    eprintln!(
        "5 x D: {seen:?}, admitted {rate}/s, empty {:.2} %, reads {}",
        100.0 * seen.empty_share(),
        queue.reads()
    );
    assert!(seen.refused > 0, "5 x D is refused: {seen:?}");
    assert!(
        (90.0..=110.0).contains(&rate),
        "admitted {rate}/s against a drain of 100/s"
    );
    assert!(seen.max_depth <= 50);
    assert!(
        seen.empty_share() <= 0.01,
        "the consumer found the queue empty on {:.1} % of its polls while sends were refused",
        100.0 * seen.empty_share()
    );
}

/// After 5 × D, demand falls to half the drain: the gate stops refusing within a fraction
/// of a second (before, it went on refusing about half the seconds: a TTL's arrivals at
/// half the drain fill a ceiling of half the drain per TTL).
#[tokio::test(start_paused = true)]
async fn when_demand_falls_under_the_drain_refusals_stop_within_a_fraction_of_a_second() {
    let queue = FakeQueue::new(Duration::from_millis(2), Duration::ZERO);
    let mut bench = Bench::new(50, 100, queue).await;
    bench.run(500.0, Duration::from_secs(3)).await;
    let fell = Instant::now();
    let seen = bench.run(50.0, Duration::from_secs(5)).await;
    let refusing_for = seen.last_refusal.map(|at| at.duration_since(fell));
    eprintln!("0.5 x D: {seen:?}, refusing for {refusing_for:?}");
    assert!(
        refusing_for.is_none_or(|d| d <= Duration::from_millis(300)),
        "refusals went on {refusing_for:?} after demand fell to half the drain"
    );
}

/// The double count: a read taken while sends are stored but not yet settled shows them,
/// and their settling counts them again on top, so the estimate stays over the queue until
/// the next read. A refusal once they settled reads again: the next send finds the room.
#[tokio::test(start_paused = true)]
async fn sends_a_read_shows_before_they_settle_are_counted_once_after_a_refusal_reads_again() {
    let queue = FakeQueue::new(Duration::ZERO, Duration::ZERO);
    let g = CapacityGate::new(GateParts::alone(
        QueueName::parse("requests").unwrap(),
        policy(4, 1000, false, 3),
        queue.clone(),
    ));
    let a = g.admit().await.unwrap();
    let b = g.admit().await.unwrap();
    queue.store();
    queue.store(); // stored, not yet settled
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        matches!(g.admit().await, Err(Refusal::QueueFull { backlog: 4, .. })),
        "the read shows 2 and the 2 in flight count on top: the safe side"
    );
    a.finish(BacklogEffect::Stored);
    b.finish(BacklogEffect::Stored);
    assert_eq!(g.snapshot().backlog, Some(4), "counted twice until a read");
    tokio::time::advance(Duration::from_millis(50)).await;
    assert!(
        g.admit().await.is_err(),
        "refused on the cached read, at once"
    );
    tokio::task::yield_now().await;
    assert_eq!(queue.reads(), 3, "the refusal read again");
    assert_eq!(g.snapshot().backlog, Some(2));
    g.admit()
        .await
        .expect("2 in the queue of a ceiling of 4")
        .finish(BacklogEffect::Stored);
}

fn gate_on(queue: &Arc<FakeQueue>, limit: u64, ttl_ms: u64) -> Arc<CapacityGate> {
    CapacityGate::new(GateParts::alone(
        QueueName::parse("requests").unwrap(),
        policy(limit, ttl_ms, false, 3),
        queue.clone(),
    ))
}

/// Refuse one send `queue_full` and say how long it waited.
async fn refused_after(g: &Arc<CapacityGate>) -> Duration {
    let started = Instant::now();
    let answer = g.admit().await;
    assert!(
        matches!(answer, Err(Refusal::QueueFull { .. })),
        "{:?}",
        answer.map(|_| ())
    );
    started.elapsed()
}

/// Let a read started in the background begin (or land, with no delay).
async fn settle() {
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_send_is_answered_at_once_and_reads_again_no_sooner_than_twice_the_last_read() {
    let queue = FakeQueue::new(Duration::from_millis(30), Duration::ZERO);
    queue.set(5);
    let g = gate_on(&queue, 5, 1000);
    assert_eq!(
        refused_after(&g).await,
        Duration::from_millis(30),
        "the first read"
    );
    // The read took 30 ms: the next may start 60 ms after it landed.
    tokio::time::advance(Duration::from_millis(59)).await;
    assert_eq!(refused_after(&g).await, Duration::ZERO);
    settle().await;
    assert_eq!(queue.reads(), 1, "59 ms after the read: too soon");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        refused_after(&g).await,
        Duration::ZERO,
        "answered without the read"
    );
    settle().await;
    assert_eq!(queue.reads(), 2, "read again");
    assert_eq!(refused_after(&g).await, Duration::ZERO);
    settle().await;
    assert_eq!(queue.reads(), 2, "one read at a time");
    queue.set(3); // consumers took two while the read ran
    tokio::time::advance(Duration::from_millis(30)).await;
    settle().await;
    assert_eq!(
        g.local.reads(),
        1,
        "the TTL's schedule (and share round) did not move"
    );
    g.admit()
        .await
        .expect("room shown before the TTL")
        .finish(BacklogEffect::Stored);
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_at_the_ceiling_keeps_the_last_read_and_waits_for_the_ttls_next() {
    let queue = FakeQueue::new(Duration::ZERO, Duration::ZERO);
    queue.set(5);
    let g = gate_on(&queue, 5, 1000);
    refused_after(&g).await;
    *queue.failing.lock() = true;
    tokio::time::advance(Duration::from_millis(20)).await;
    refused_after(&g).await;
    settle().await;
    assert_eq!(queue.reads(), 2);
    let snapshot = g.snapshot();
    assert_eq!(
        (
            snapshot.backlog,
            snapshot.consecutive_failures,
            snapshot.reads_failed
        ),
        (Some(5), 0, 1),
        "the last read stands, and the streak counts only the reads sends depend on"
    );
    tokio::time::advance(Duration::from_millis(500)).await;
    refused_after(&g).await;
    settle().await;
    assert_eq!(queue.reads(), 2, "no read at the ceiling before the TTL's");
    *queue.failing.lock() = false;
    tokio::time::advance(Duration::from_millis(480)).await;
    refused_after(&g).await; // the TTL's read, due
    settle().await;
    assert_eq!(queue.reads(), 3);
    tokio::time::advance(Duration::from_millis(20)).await;
    refused_after(&g).await;
    settle().await;
    assert_eq!(
        queue.reads(),
        4,
        "after a good read, reads at the ceiling again"
    );
}

#[tokio::test(start_paused = true)]
async fn an_admin_plane_that_lags_is_read_at_the_ceiling_no_sooner_than_half_its_lag() {
    let queue = FakeQueue::new(Duration::ZERO, Duration::from_secs(1));
    queue.set(5);
    tokio::time::advance(Duration::from_secs(2)).await;
    let g = gate_on(&queue, 5, 10_000);
    refused_after(&g).await;
    tokio::time::advance(Duration::from_millis(499)).await;
    refused_after(&g).await;
    settle().await;
    assert_eq!(queue.reads(), 1, "its count moves no faster");
    tokio::time::advance(Duration::from_millis(1)).await;
    refused_after(&g).await;
    settle().await;
    assert_eq!(queue.reads(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_send_admitted_within_a_tenth_of_the_ceiling_reads_again() {
    let queue = FakeQueue::new(Duration::ZERO, Duration::ZERO);
    let g = gate_on(&queue, 20, 1000);
    for _ in 0..16 {
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
    }
    tokio::time::advance(Duration::from_millis(20)).await;
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    settle().await;
    assert_eq!(queue.reads(), 1, "17 of 20: more than a tenth left");
    g.admit().await.unwrap().finish(BacklogEffect::Stored);
    settle().await;
    assert_eq!(queue.reads(), 2, "18 of 20: within a tenth");
    assert_eq!(
        g.snapshot().backlog,
        Some(0),
        "nothing was stored in the fake queue"
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_at_the_ceiling_that_lands_when_the_ttls_is_due_stands_for_it() {
    // Reads take 10 ms, the TTL is 100 ms: the TTL's next read is due 20 ms before the
    // value expires (at 90 ms). One made at the ceiling from 85 ms lands at 95 ms.
    let queue = FakeQueue::new(Duration::from_millis(10), Duration::ZERO);
    queue.set(5);
    let g = gate_on(&queue, 5, 100);
    refused_after(&g).await;
    tokio::time::advance(Duration::from_millis(75)).await;
    refused_after(&g).await;
    settle().await;
    tokio::time::advance(Duration::from_millis(10)).await;
    settle().await;
    assert_eq!(
        (queue.reads(), g.local.reads()),
        (2, 2),
        "it is the TTL's read"
    );
    // Past the first value's expiry (110 ms): the value read at 95 ms is fresh.
    tokio::time::advance(Duration::from_millis(16)).await;
    assert_eq!(
        refused_after(&g).await,
        Duration::ZERO,
        "no send waits for a read"
    );
    settle().await;
    assert_eq!(queue.reads(), 2);
}

/// A lagging admin plane (RabbitMQ management's default 11 s): nothing of the lag can be
/// credited (see local.rs), so the gate admits about ceiling / lag while the consumer
/// starves. This pins what is reached, on the safe side: never past the ceiling.
#[tokio::test(start_paused = true)]
async fn with_a_lagging_admin_plane_the_ceiling_holds_and_admits_about_the_ceiling_per_lag() {
    let queue = FakeQueue::new(Duration::from_millis(2), Duration::from_secs(11));
    let mut bench = Bench::new(50, 100, queue.clone()).await;
    bench.run(500.0, Duration::from_secs(12)).await;
    let seen = bench.run(500.0, Duration::from_secs(22)).await;
    let rate = seen.admitted as f64 / 22.0;
    eprintln!(
        "lag 11 s, 5 x D: {seen:?}, admitted {rate}/s, empty {:.1} %, reads {}",
        100.0 * seen.empty_share(),
        queue.reads()
    );
    assert!(seen.max_depth <= 50);
    assert!((3.0..=6.0).contains(&rate), "admitted {rate}/s");
}

/// The same at 5 × D with sends that take 30 ms (stored after 15, settled after 30), so reads
/// land while sends are stored and not settled (the double count): the ceiling holds, and
/// the consumer is still never left idle while sends are refused.
#[tokio::test(start_paused = true)]
async fn sends_in_flight_across_reads_keep_the_bound_and_the_consumer_busy() {
    let queue = FakeQueue::new(Duration::from_millis(2), Duration::ZERO);
    let mut bench = Bench::new(50, 100, queue.clone()).await;
    bench.send_takes = Duration::from_millis(30);
    bench.run(500.0, Duration::from_secs(1)).await;
    let seen = bench.run(500.0, Duration::from_secs(10)).await;
    let rate = seen.admitted as f64 / 10.0;
    eprintln!(
        "5 x D, 30 ms sends: {seen:?}, admitted {rate}/s, empty {:.2} %, reads {}",
        100.0 * seen.empty_share(),
        queue.reads()
    );
    assert!((90.0..=110.0).contains(&rate), "admitted {rate}/s");
    assert!(seen.max_depth <= 50);
    assert!(
        seen.empty_share() <= 0.01,
        "{:.1} % empty",
        100.0 * seen.empty_share()
    );
}
