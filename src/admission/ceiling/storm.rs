//! A retry storm on tokio's paused clock (issue 39): a queue's gate over a store whose
//! consumer takes a fixed rate, open-loop arrivals at a multiple of it, and producers that
//! honour `Retry-After` to the second until their message is admitted. What is counted is
//! the attempts each message took.

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
    /// The longest a message waited from its first attempt to its admission.
    longest: Duration,
}

impl Outcome {
    fn per_message(&self) -> f64 {
        self.attempts as f64 / self.messages as f64
    }
}

/// Run `storm` against a gate with a ceiling of `limit` (TTL 1 s): every message is sent
/// until admitted, its producer waiting what each `429` says.
async fn run(storm: Storm, limit: u64) -> Outcome {
    let backend = Arc::new(Drained::new(storm.drain_per_s));
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
    let attempts = Arc::new(AtomicU64::new(0));
    let longest = Arc::new(Mutex::new(Duration::ZERO));
    let start = Instant::now();
    let mut producers = Vec::new();
    let mut at = Duration::ZERO;
    let mut messages = 0;
    for (rate, span) in [
        (storm.drain_per_s * storm.multiple, storm.storm),
        (storm.drain_per_s * 0.5, storm.after),
    ] {
        let gap = Duration::from_secs_f64(1.0 / rate);
        let end = at + span;
        while at < end {
            tokio::time::sleep_until(start + at).await;
            let (gate, backend) = (Arc::clone(&gate), Arc::clone(&backend));
            let (attempts, longest) = (Arc::clone(&attempts), Arc::clone(&longest));
            producers.push(tokio::spawn(async move {
                let first = Instant::now();
                loop {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    match gate.admit().await {
                        Ok(held) => {
                            backend.store();
                            held.finish(BacklogEffect::Stored);
                            let waited = first.elapsed();
                            let mut longest = longest.lock();
                            *longest = (*longest).max(waited);
                            return;
                        }
                        Err(Refusal::QueueFull { retry_after, .. }) => {
                            let whole = whole(retry_after);
                            tokio::time::sleep(whole).await;
                        }
                        Err(other) => panic!("{other:?}"),
                    }
                }
            }));
            messages += 1;
            at += gap;
        }
    }
    for producer in producers {
        producer.await.unwrap();
    }
    let longest = *longest.lock();
    Outcome {
        messages,
        attempts: attempts.load(Ordering::Relaxed),
        longest,
    }
}

/// `Retry-After` as the header says it: whole seconds, rounded up, at least 1.
fn whole(d: Duration) -> Duration {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

/// Issue 39: at 5× a drain of 100/s (ceiling 200) every refused producer was told 1 s,
/// and producers honouring it sent ~7 attempts per message. Told the place they will be
/// served in, they come back about once.
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
        "storm 5x for 10 s: {} messages, {} attempts, {:.2} a message, longest wait {:?}",
        outcome.messages,
        outcome.attempts,
        outcome.per_message(),
        outcome.longest
    );
}
