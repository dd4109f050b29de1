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

use super::{BacklogEffect, CapacityGate, CapacityPolicy, GateParts, Refusal};
use crate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::config::Fraction;
use crate::domain::QueueName;

/// A queue whose consumer takes `per_second` whenever there is something to take.
struct Drained {
    per_second: f64,
    /// The backlog (fractional: the consumer is continuous) as of an instant.
    held: Mutex<(f64, Instant)>,
}

impl Drained {
    fn new(per_second: f64) -> Self {
        Self {
            per_second,
            held: Mutex::new((0.0, Instant::now())),
        }
    }

    /// The backlog now, after what the consumer took since last asked.
    fn settle(&self, held: &mut (f64, Instant)) -> f64 {
        let now = Instant::now();
        let taken = (now - held.1).as_secs_f64() * self.per_second;
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

/// The storm's shape: `multiple` × the drain for `storm`, then half the drain for `after`.
struct Storm {
    drain_per_s: f64,
    multiple: f64,
    storm: Duration,
    after: Duration,
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
}

impl Outcome {
    fn per_message(&self) -> f64 {
        self.attempts as f64 / self.messages as f64
    }

    /// Attempts after the first, per message refused at least once.
    fn retries_per_refused(&self) -> f64 {
        (self.attempts - self.messages) as f64 / self.refused.max(1) as f64
    }
}

/// What the producers count as they go.
#[derive(Default)]
struct Tally {
    attempts: AtomicU64,
    refused: AtomicU64,
    longest: Mutex<Duration>,
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
async fn produce(gate: Arc<CapacityGate>, backend: Arc<Drained>, tally: Arc<Tally>) {
    let first = Instant::now();
    loop {
        tally.attempts.fetch_add(1, Ordering::Relaxed);
        match gate.admit().await {
            Ok(held) => {
                backend.store();
                held.finish(BacklogEffect::Stored);
                let mut longest = tally.longest.lock();
                *longest = (*longest).max(first.elapsed());
                return;
            }
            Err(Refusal::QueueFull { retry_after, .. }) => {
                if first == Instant::now() {
                    tally.refused.fetch_add(1, Ordering::Relaxed);
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
    let backend = Arc::new(Drained::new(storm.drain_per_s));
    let gate = gate_over(&backend, limit).await;
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let mut producers = Vec::new();
    let mut at = Duration::ZERO;
    for (rate, span) in [
        (storm.drain_per_s * storm.multiple, storm.storm),
        (storm.drain_per_s * 0.5, storm.after),
    ] {
        let gap = Duration::from_secs_f64(1.0 / rate);
        let end = at + span;
        while at < end {
            tokio::time::sleep_until(start + at).await;
            let producer = produce(Arc::clone(&gate), Arc::clone(&backend), Arc::clone(&tally));
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
    }
}

/// `Retry-After` as the header says it: whole seconds, rounded up, at least 1.
fn whole(d: Duration) -> Duration {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

/// Issue 39: at 5× a drain of 100/s (ceiling 200) every refused producer was told 1 s,
/// and producers honouring it sent ~7 attempts per message (21.8 here, where every message
/// is sent until admitted). Told the place they will be served in, most refused producers
/// are admitted on their first retry.
#[tokio::test(start_paused = true)]
async fn producers_honouring_retry_after_through_a_storm_at_five_times_the_drain() {
    let outcome = run(
        Storm {
            drain_per_s: 100.0,
            multiple: 5.0,
            storm: Duration::from_secs(10),
            after: Duration::from_secs(60),
        },
        200,
    )
    .await;
    println!(
        "storm 5x for 10 s: {} messages ({} refused at first), {} attempts: {:.2} a message, \
         {:.2} retries a refused one; longest wait {:?}",
        outcome.messages,
        outcome.refused,
        outcome.attempts,
        outcome.per_message(),
        outcome.retries_per_refused(),
        outcome.longest
    );
    // 1.99 and 1.70 when written (21.8 a message when every refusal said 1 s). Not the
    // issue's 1.5: a producer told a place that opens while fresh sends still arrive at 5×
    // finds it taken (the gate cannot tell a returning producer from a new one) and is
    // refused once more, behind the whole line.
    assert!(outcome.per_message() <= 2.5, "{outcome:?}");
    assert!(outcome.retries_per_refused() <= 2.0, "{outcome:?}");
}
