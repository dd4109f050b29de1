//! The fleet by simulation: 50 seats in one process (each its own replica: its own name,
//! its own connection) filling one queue at its ceiling while a consumer drains it, against
//! a Redis of the test's own and against the in-memory ledger. The bound is asserted (never
//! more stored than the ceiling); the costs are printed for docs/benchmarks.md: Redis calls
//! per admitted send and per second, and the p50/p99 of one ledger call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use sendgate::admission::ceiling::{
    BacklogEffect, CapacityGate, CapacityPolicy, FleetSeat, GateParts, PolicyCell,
};
use sendgate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use sendgate::config::{BackendKind, Fraction};
use sendgate::coordination::fleet::Fleet;
use sendgate::coordination::memory::MemoryLedger;
use sendgate::coordination::port::{
    Ask, Caller, LedgerError, LedgerPort, QueueRef, ReadFor, ReadOutcome, ReadTicket,
    ReserveAnswer, Settle, View,
};
use sendgate::coordination::redis_client::RedisClient;
use sendgate::domain::QueueName;

const SEATS: usize = 50;
const CEILING: u64 = 500;
const RUN: Duration = Duration::from_secs(8);
const DRAIN_EVERY: Duration = Duration::from_millis(2); // 500 msg/s
const T: Duration = Duration::from_millis(250);

/// An exact queue: stores at once, a consumer takes one every `DRAIN_EVERY`; remembers the
/// deepest it ever was.
#[derive(Default)]
struct Queue {
    depth: AtomicU64,
    deepest: AtomicU64,
    stored: AtomicU64,
}

impl Queue {
    fn store(&self) {
        let now = self.depth.fetch_add(1, Ordering::SeqCst) + 1;
        self.deepest.fetch_max(now, Ordering::SeqCst);
        self.stored.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for Queue {
    fn kind(&self) -> &'static str {
        "simulated"
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        unreachable!("the senders store through `store`")
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        Ok(Backlog::of(self.depth.load(Ordering::SeqCst)))
    }
}

/// Every call's duration, whatever the ledger behind.
struct Timed {
    inner: Arc<dyn LedgerPort>,
    took: Arc<Mutex<Vec<Duration>>>,
}

impl Timed {
    async fn time<F: std::future::Future>(&self, call: F) -> F::Output {
        let started = Instant::now();
        let out = call.await;
        self.took.lock().push(started.elapsed());
        out
    }
}

#[async_trait]
impl LedgerPort for Timed {
    async fn reserve(
        &self,
        q: QueueRef<'_>,
        c: Caller<'_>,
        a: Ask<'_>,
    ) -> Result<(ReserveAnswer, View), LedgerError> {
        self.time(self.inner.reserve(q, c, a)).await
    }
    async fn settle(
        &self,
        q: QueueRef<'_>,
        c: Caller<'_>,
        r: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        self.time(self.inner.settle(q, c, r)).await
    }
    async fn heartbeat(&self, q: QueueRef<'_>, c: Caller<'_>) -> Result<View, LedgerError> {
        self.time(self.inner.heartbeat(q, c)).await
    }
    async fn lease_read(
        &self,
        q: QueueRef<'_>,
        c: Caller<'_>,
        lease: Duration,
    ) -> Result<(Option<ReadTicket>, View), LedgerError> {
        self.time(self.inner.lease_read(q, c, lease)).await
    }
    async fn publish_read(
        &self,
        q: QueueRef<'_>,
        c: Caller<'_>,
        t: ReadTicket,
        o: ReadOutcome,
        f: ReadFor,
    ) -> Result<View, LedgerError> {
        self.time(self.inner.publish_read(q, c, t, o, f)).await
    }
    async fn leave(
        &self,
        q: QueueRef<'_>,
        c: Caller<'_>,
        r: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        self.time(self.inner.leave(q, c, r)).await
    }
    async fn look(&self, q: QueueRef<'_>) -> Result<Option<View>, LedgerError> {
        self.time(self.inner.look(q)).await
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
}

struct Outcome {
    admitted: u64,
    deepest: u64,
    calls: Vec<Duration>,
}

async fn simulate(ledgers: Vec<Arc<dyn LedgerPort>>, key: &str) -> Outcome {
    let queue = Arc::new(Queue::default());
    let name = QueueName::parse("sim").unwrap();
    let took = Arc::new(Mutex::new(Vec::new()));
    let policy = CapacityPolicy {
        limit: CEILING,
        fail_closed: true,
        streak_threshold: 1,
        ttl: Duration::from_millis(1000),
        read_timeout: Duration::from_millis(500),
        retry_after_max: Duration::from_secs(300),
        resume_below: Fraction::ONE,
    };
    let mut gates = Vec::new();
    let size = ledgers.len() as u64;
    for ledger in ledgers {
        let timed: Arc<dyn LedgerPort> = Arc::new(Timed {
            inner: ledger,
            took: Arc::clone(&took),
        });
        let fleet = Fleet::start(timed, size);
        let backend: Arc<dyn Backend> = queue.clone();
        let cell = PolicyCell::new(policy.clone());
        let seat = FleetSeat::new(
            Arc::clone(&fleet),
            key.to_owned(),
            name.clone(),
            Arc::clone(&cell),
            Arc::clone(&backend),
            Duration::from_secs(2),
        );
        let gate = CapacityGate::new(GateParts {
            seat: Some(seat),
            ..GateParts::alone(name.clone(), cell, backend)
        });
        gates.push((fleet, gate));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !gates.iter().all(|(f, _)| f.joined()) {
        assert!(std::time::Instant::now() < deadline, "every seat joined");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    took.lock().clear();
    let stop = Instant::now() + RUN;
    let drain = {
        let queue = Arc::clone(&queue);
        tokio::spawn(async move {
            while Instant::now() < stop {
                tokio::time::sleep(DRAIN_EVERY).await;
                let _ = queue
                    .depth
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1));
            }
        })
    };
    let admitted = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for (_, gate) in &gates {
        let (gate, queue, admitted) = (Arc::clone(gate), Arc::clone(&queue), Arc::clone(&admitted));
        senders.push(tokio::spawn(async move {
            while Instant::now() < stop {
                match gate.admit().await {
                    Ok(reservation) => {
                        queue.store();
                        reservation.finish(BacklogEffect::Stored);
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    drain.await.unwrap();
    let calls = took.lock().clone();
    Outcome {
        admitted: admitted.load(Ordering::SeqCst),
        deepest: queue.deepest.load(Ordering::SeqCst),
        calls,
    }
}

fn report(what: &str, o: &Outcome) {
    let mut calls = o.calls.clone();
    calls.sort();
    let pct = |p: f64| {
        calls
            .get(((calls.len() as f64 * p) as usize).min(calls.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "{what}: {SEATS} seats, ceiling {CEILING}: admitted {} in {:?}, deepest {}, ledger calls {} ({:.3} per admitted send, {:.0}/s), call p50 {:?} p99 {:?}",
        o.admitted,
        RUN,
        o.deepest,
        calls.len(),
        calls.len() as f64 / o.admitted.max(1) as f64,
        calls.len() as f64 / RUN.as_secs_f64(),
        pct(0.50),
        pct(0.99),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_seats_on_redis_never_store_past_the_ceiling() {
    let server = sendgate_testkit::redis_server::RedisServer::start().await;
    let prefix = sendgate_testkit::local_redis::unique_prefix();
    let settings = sendgate_testkit::local_redis::settings(&server.url(), &prefix, T);
    let mut ledgers: Vec<Arc<dyn LedgerPort>> = Vec::new();
    let mut key = String::new();
    for _ in 0..SEATS {
        let ledger = RedisClient::lazy(&settings).unwrap();
        key = ledger.queue_key(BackendKind::Embedded, &QueueName::parse("sim").unwrap());
        ledgers.push(Arc::new(ledger));
    }
    let o = simulate(ledgers, &key).await;
    report("redis", &o);
    assert!(
        o.deepest <= CEILING,
        "stored past the ceiling: {}",
        o.deepest
    );
    assert!(o.admitted > CEILING, "the drain made room that was used");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_seats_on_the_memory_ledger_never_store_past_the_ceiling() {
    let ledger = MemoryLedger::new(T);
    let ledgers = (0..SEATS)
        .map(|_| Arc::new(ledger.clone()) as Arc<dyn LedgerPort>)
        .collect();
    let o = simulate(ledgers, "sim:{embedded/sim}").await;
    report("memory", &o);
    assert!(
        o.deepest <= CEILING,
        "stored past the ceiling: {}",
        o.deepest
    );
    assert!(o.admitted > CEILING, "the drain made room that was used");
}
