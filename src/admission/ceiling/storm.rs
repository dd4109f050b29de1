//! A retry storm on tokio's paused clock (issue 39): a queue's gate over a store whose
//! consumer takes a fixed rate, open-loop arrivals at a multiple of it, and producers that
//! honour `Retry-After` to the second until their message is admitted. What is counted is
//! the attempts each message took: at five times the drain four in five first attempts
//! are refused whatever the answer, so a message takes at least ~1.8; what the answer
//! decides is how many more a refused one takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{BacklogEffect, CapacityGate, CapacityPolicy, ClaimKey, GateParts, Refusal};
use crate::admission::fair::Asker;
use crate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::config::Fraction;
use crate::domain::QueueName;

/// A queue whose consumer takes `per_second` whenever there is something to take, that
/// rate multiplied by `slowdown.2` from `slowdown.0` for `slowdown.1` after it was made.
struct Drained {
    per_second: f64,
    slowdown: Option<(Duration, Duration, f64)>,
    started: Instant,
    /// The backlog (fractional: the consumer is continuous) as of an instant.
    held: Mutex<(f64, Instant)>,
}

impl Drained {
    fn new(per_second: f64, slowdown: Option<(Duration, Duration, f64)>) -> Self {
        let now = Instant::now();
        Self {
            per_second,
            slowdown,
            started: now,
            held: Mutex::new((0.0, now)),
        }
    }

    /// What the consumer can take between `from` and `to`.
    fn capacity(&self, from: Instant, to: Instant) -> f64 {
        let whole = (to - from).as_secs_f64() * self.per_second;
        let Some((at, span, factor)) = self.slowdown else {
            return whole;
        };
        let (slow_from, slow_to) = (self.started + at, self.started + at + span);
        let overlap = to
            .min(slow_to)
            .saturating_duration_since(from.max(slow_from));
        whole - overlap.as_secs_f64() * self.per_second * (1.0 - factor)
    }

    /// The backlog now, after what the consumer took since last asked.
    fn settle(&self, held: &mut (f64, Instant)) -> f64 {
        let now = Instant::now();
        let taken = self.capacity(held.1, now);
        *held = ((held.0 - taken).max(0.0), now);
        held.0
    }

    fn store(&self) {
        let mut held = self.held.lock();
        self.settle(&mut held);
        held.0 += 1.0;
    }
}

#[async_trait]
impl Backend for Drained {
    fn kind(&self) -> &'static str {
        "drained"
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        unreachable!("the storm stores through `store`")
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        let mut held = self.held.lock();
        Ok(Backlog::of(self.settle(&mut held).ceil() as u64))
    }
}

/// The storm's shape: `multiple` × the drain for `storm`, then `after_multiple` × it for
/// `after`; `keyed`: each message sent with a key of its own (the same on every attempt).
struct Storm {
    drain_per_s: f64,
    /// The drain multiplied by `.2` from `.0` for `.1`.
    slowdown: Option<(Duration, Duration, f64)>,
    multiple: f64,
    storm: Duration,
    after_multiple: f64,
    after: Duration,
    keyed: bool,
}

/// What the producers saw.
#[derive(Debug)]
struct Outcome {
    messages: u64,
    attempts: u64,
    /// Messages refused at least once.
    refused: u64,
    /// The longest a message waited from its first attempt to its admission.
    longest: Duration,
    /// Messages refused at first whose wait to admission was within ±20 % of the first
    /// `Retry-After` they were told.
    told_right: u64,
}

impl Outcome {
    fn per_message(&self) -> f64 {
        self.attempts as f64 / self.messages as f64
    }

    /// Attempts after the first, per message refused at least once.
    fn retries_per_refused(&self) -> f64 {
        (self.attempts - self.messages) as f64 / self.refused.max(1) as f64
    }

    /// The part of the messages refused at first that waited what they were first told.
    fn told_right(&self) -> f64 {
        self.told_right as f64 / self.refused.max(1) as f64
    }
}

/// What the producers count as they go.
#[derive(Default)]
struct Tally {
    attempts: AtomicU64,
    refused: AtomicU64,
    longest: Mutex<Duration>,
    told_right: AtomicU64,
}

/// A gate with a ceiling of `limit` (TTL 1 s) over `backend`.
async fn gate_over(backend: &Arc<Drained>, limit: u64) -> Arc<CapacityGate> {
    let policy = CapacityPolicy {
        limit,
        fail_closed: false,
        streak_threshold: 3,
        ttl: Duration::from_secs(1),
        read_timeout: Duration::from_secs(2),
        retry_after_max: Duration::from_secs(300),
        resume_below: Fraction::ONE,
    };
    let gate = CapacityGate::new(GateParts::alone(
        QueueName::parse("requests").unwrap(),
        policy,
        backend.clone(),
    ));
    gate.prime().await;
    gate
}

/// One message, sent until admitted, its producer waiting what each `429` says.
async fn produce(
    gate: Arc<CapacityGate>,
    backend: Arc<Drained>,
    tally: Arc<Tally>,
    claim: Option<ClaimKey>,
) {
    let first = Instant::now();
    let mut told_first = None;
    loop {
        tally.attempts.fetch_add(1, Ordering::Relaxed);
        match gate.admit_claiming(Asker::OPEN, 1, claim).await {
            Ok(held) => {
                backend.store();
                held.finish(BacklogEffect::Stored);
                let waited = first.elapsed();
                let mut longest = tally.longest.lock();
                *longest = (*longest).max(waited);
                if let Some(told) = told_first.map(|t: Duration| t.as_secs_f64()) {
                    let ratio = waited.as_secs_f64() / told;
                    if (0.8..=1.2).contains(&ratio) {
                        tally.told_right.fetch_add(1, Ordering::Relaxed);
                    }
                }
                return;
            }
            Err(Refusal::QueueFull { retry_after, .. }) => {
                if first == Instant::now() {
                    tally.refused.fetch_add(1, Ordering::Relaxed);
                    told_first = Some(whole(retry_after));
                }
                tokio::time::sleep(whole(retry_after)).await;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
}

/// Run `storm` against a gate with a ceiling of `limit`: open-loop arrivals, each message
/// its own producer.
async fn run(storm: Storm, limit: u64) -> Outcome {
    let backend = Arc::new(Drained::new(storm.drain_per_s, storm.slowdown));
    let gate = gate_over(&backend, limit).await;
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let mut producers = Vec::new();
    let mut at = Duration::ZERO;
    for (rate, span) in [
        (storm.drain_per_s * storm.multiple, storm.storm),
        (storm.drain_per_s * storm.after_multiple, storm.after),
    ] {
        let gap = Duration::from_secs_f64(1.0 / rate);
        let end = at + span;
        while at < end {
            tokio::time::sleep_until(start + at).await;
            let claim = storm
                .keyed
                .then(|| ClaimKey::of(&format!("message-{}", producers.len())));
            let producer = produce(
                Arc::clone(&gate),
                Arc::clone(&backend),
                Arc::clone(&tally),
                claim,
            );
            producers.push(tokio::spawn(producer));
            at += gap;
        }
    }
    let messages = producers.len() as u64;
    for producer in producers {
        producer.await.unwrap();
    }
    let longest = *tally.longest.lock();
    Outcome {
        messages,
        attempts: tally.attempts.load(Ordering::Relaxed),
        refused: tally.refused.load(Ordering::Relaxed),
        longest,
        told_right: tally.told_right.load(Ordering::Relaxed),
    }
}

/// `Retry-After` as the header says it: whole seconds, rounded up, at least 1.
fn whole(d: Duration) -> Duration {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

fn report(name: &str, outcome: &Outcome) {
    println!(
        "{name}: {} messages ({} refused at first), {} attempts: {:.2} a message, {:.2} \
         retries a refused one, {:.0} % of them waited what they were first told (±20 %); \
         longest wait {:?}",
        outcome.messages,
        outcome.refused,
        outcome.attempts,
        outcome.per_message(),
        outcome.retries_per_refused(),
        100.0 * outcome.told_right(),
        outcome.longest
    );
}

/// Issue 39: at 5× a drain of 100/s (ceiling 200) every refused producer was told 1 s,
/// and producers honouring it sent ~7 attempts per message (21.8 here, where every message
/// is sent until admitted). Told the place they will be served in, refused producers come
/// back spread over the time it takes to serve them; with their keys, the place is kept
/// for them, and they are admitted on their first retry, after the wait they were told.
#[tokio::test(start_paused = true)]
async fn producers_honouring_retry_after_through_a_storm_at_five_times_the_drain() {
    let storm = |keyed| Storm {
        drain_per_s: 100.0,
        slowdown: None,
        multiple: 5.0,
        storm: Duration::from_secs(10),
        after_multiple: 0.5,
        after: Duration::from_secs(60),
        keyed,
    };
    let unkeyed = run(storm(false), 200).await;
    let keyed = run(storm(true), 200).await;
    report("storm 5x for 10 s, without keys", &unkeyed);
    report("storm 5x for 10 s, with keys", &keyed);
    // Without keys 1.98 and 1.82 when written (21.8 a message when every refusal said
    // 1 s): a producer told a place that opens while fresh sends still arrive at 5× finds
    // it taken and is refused once more, behind the whole line.
    assert!(unkeyed.per_message() <= 2.5, "{unkeyed:?}");
    assert!(unkeyed.retries_per_refused() <= 2.0, "{unkeyed:?}");
    // With keys 2.00, 1.05 and 39 s against 78 s: more first attempts are refused (the
    // room is kept for the line), and the line is served in order.
    assert!(keyed.per_message() <= 2.1, "{keyed:?}");
    assert!(keyed.retries_per_refused() <= 1.1, "{keyed:?}");
    assert!(keyed.told_right() >= 0.9, "{keyed:?}");
    assert!(keyed.longest < unkeyed.longest, "{keyed:?} {unkeyed:?}");
}

/// Issue 39's capacity drop, as the drain sees it: 1.6 times a drain of 50/s for 30 s
/// (0.8 of a drain of 100 that halved), then 0.4 of it. With keys, a producer back for
/// its place is admitted before fresh sends (`claims.rs`); without, fresh sends take most
/// of the places promised, and the producers come back to be refused again.
#[tokio::test(start_paused = true)]
async fn producers_back_for_their_places_through_a_capacity_drop() {
    let drop = |keyed| Storm {
        drain_per_s: 50.0,
        slowdown: None,
        multiple: 1.6,
        storm: Duration::from_secs(30),
        after_multiple: 0.4,
        after: Duration::from_secs(60),
        keyed,
    };
    let unkeyed = run(drop(false), 200).await;
    let keyed = run(drop(true), 200).await;
    report("capacity drop, without keys", &unkeyed);
    report("capacity drop, with keys", &keyed);
    // 1.62 a message, 2.71 retries a refused one and a longest wait of 44 s without keys;
    // 1.65, 1.00 and 16 s with them.
    assert!(keyed.retries_per_refused() <= 1.1, "{keyed:?}");
    assert!(unkeyed.retries_per_refused() >= 2.0, "{unkeyed:?}");
    assert!(keyed.told_right() >= 0.9, "{keyed:?}");
    assert!(keyed.longest < unkeyed.longest, "{keyed:?} {unkeyed:?}");
    assert!(
        keyed.per_message() <= unkeyed.per_message() * 1.05,
        "{keyed:?} {unkeyed:?}"
    );
}

/// Issue 39's capacity drop as the bench runs it: 0.8 times a drain of 100/s throughout,
/// the drain halving for 30 s after 15 s. Places promised before the drop open later than
/// promised; a producer back for one that is not yet open keeps the head of the line, and
/// those back together are spread over the places as they open, not all told the same one.
#[tokio::test(start_paused = true)]
async fn producers_back_for_their_places_through_a_drop_of_the_drain() {
    let drop = |keyed| Storm {
        drain_per_s: 100.0,
        slowdown: Some((Duration::from_secs(15), Duration::from_secs(30), 0.5)),
        multiple: 0.8,
        storm: Duration::from_secs(75),
        after_multiple: 0.4,
        after: Duration::from_secs(30),
        keyed,
    };
    let unkeyed = run(drop(false), 200).await;
    let keyed = run(drop(true), 200).await;
    report("drain halved, without keys", &unkeyed);
    report("drain halved, with keys", &keyed);
    // Without keys 1.56 a message, 3.42 retries a refused one, 26 % waited what they were
    // told, 53 s the longest. With keys 1.67, 1.25, 88 % and 26 s; 1.91, 1.69, 85 % and
    // 27 s when those back for a place not yet open were all told the next opening.
    assert!(keyed.retries_per_refused() <= 1.3, "{keyed:?}");
    assert!(keyed.told_right() >= 0.87, "{keyed:?}");
    assert!(keyed.longest < unkeyed.longest, "{keyed:?} {unkeyed:?}");
    assert!(
        keyed.per_message() <= unkeyed.per_message() * 1.1,
        "{keyed:?} {unkeyed:?}"
    );
}
