//! The seat on tokio's paused clock over the in-memory ledger, which can lose its data,
//! roll back, answer late or cut a replica off: each docs/fleet.md bound, as a test.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::admission::ceiling::{
    BacklogEffect, CapacityGate, CapacityPolicy, FleetSeat, Refusal, Reservation,
};
use crate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::config::Fraction;
use crate::coordination::fleet::Fleet;
use crate::coordination::memory::MemoryLedger;
use crate::domain::QueueName;

const T: Duration = Duration::from_millis(50);
const SEND: Duration = Duration::from_secs(2);
const KEY: &str = "test:{rabbitmq/requests}";

/// A queue whose admin plane shows what was stored `lag` ago (nothing drains).
struct Broker {
    stored: Mutex<Vec<Instant>>,
    lag: Duration,
}

impl Broker {
    fn new(lag: Duration) -> Arc<Self> {
        Arc::new(Self {
            stored: Mutex::new(Vec::new()),
            lag,
        })
    }

    fn stored(&self) -> u64 {
        self.stored.lock().len() as u64
    }
}

#[async_trait]
impl Backend for Broker {
    fn kind(&self) -> &'static str {
        "broker"
    }
    fn depth_lag(&self) -> Duration {
        self.lag
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        unreachable!("the tests store through `store`")
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        let now = Instant::now();
        let seen = self
            .stored
            .lock()
            .iter()
            .filter(|at| **at + self.lag <= now)
            .count();
        Ok(Backlog::of(seen as u64))
    }
}

fn policy(limit: u64, fail_closed: bool) -> CapacityPolicy {
    CapacityPolicy {
        limit,
        fail_closed,
        streak_threshold: 1,
        ttl: Duration::from_millis(1000),
        read_timeout: Duration::from_millis(500),
        retry_after_max: Duration::from_secs(300),
        resume_below: Fraction::ONE,
    }
}

/// One replica: its fleet handle (its name, its status) and its gate for the queue.
struct Replica {
    fleet: Arc<Fleet>,
    gate: Arc<CapacityGate>,
}

async fn replicas(
    n: usize,
    ledger: &MemoryLedger,
    broker: &Arc<Broker>,
    p: CapacityPolicy,
) -> Vec<Replica> {
    let queue = QueueName::parse("requests").unwrap();
    let mut all = Vec::new();
    for _ in 0..n {
        let fleet = Fleet::start(Arc::new(ledger.clone()));
        let backend: Arc<dyn Backend> = broker.clone();
        let gate = CapacityGate::new(queue.clone(), p.clone(), Arc::clone(&backend));
        gate.join_fleet(FleetSeat::new(
            Arc::clone(&fleet),
            KEY.to_owned(),
            queue.clone(),
            Arc::clone(gate.policy_cell()),
            backend,
            SEND,
        ));
        all.push(Replica { fleet, gate });
    }
    // Joined once the rejoin probe saw the queue's state.
    for _ in 0..100 {
        if all.iter().all(|r| r.fleet.joined()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(all.iter().all(|r| r.fleet.joined()), "every replica joined");
    all
}

/// What one send got: admitted (and stored at once), or refused.
async fn send(r: &Replica, broker: &Broker) -> Result<(), Refusal> {
    let reservation: Reservation = r.gate.admit().await?;
    broker.stored.lock().push(Instant::now());
    reservation.finish(BacklogEffect::Stored);
    Ok(())
}

/// `rounds` sends per replica, in turn, a few ms apart (settles and reads go on between).
async fn fill(all: &[Replica], broker: &Broker, rounds: usize) -> (u64, Vec<Refusal>) {
    let mut admitted = 0;
    let mut refused = Vec::new();
    for _ in 0..rounds {
        for r in all {
            match send(r, broker).await {
                Ok(()) => admitted += 1,
                Err(e) => refused.push(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (admitted, refused)
}

#[tokio::test(start_paused = true)]
async fn three_replicas_store_exactly_the_ceiling() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(3, &ledger, &broker, policy(50, false)).await;
    let (admitted, refused) = fill(&all, &broker, 40).await;
    assert_eq!(broker.stored(), 50);
    assert_eq!(admitted, 50);
    assert!(refused
        .iter()
        .all(|r| matches!(r, Refusal::QueueFull { .. })));
}

/// Fill to `at`, apply `fault`, fill on: never past the ceiling.
async fn fault_mid_fill(lag: Duration, fault: impl FnOnce(&MemoryLedger)) -> u64 {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(lag);
    let all = replicas(3, &ledger, &broker, policy(50, false)).await;
    while broker.stored() < 25 {
        fill(&all, &broker, 1).await;
    }
    fault(&ledger);
    fill(&all, &broker, 60).await;
    // Long enough for every lease, carry and lag to end: the bound holds in the end too.
    tokio::time::sleep(Duration::from_secs(30)).await;
    fill(&all, &broker, 20).await;
    broker.stored()
}

#[tokio::test(start_paused = true)]
async fn redis_losing_everything_mid_fill_under_a_lagging_admin_plane_keeps_the_ceiling() {
    let stored = fault_mid_fill(Duration::from_secs(5), MemoryLedger::lose_everything).await;
    assert_eq!(stored, 50);
}

#[tokio::test(start_paused = true)]
async fn the_queues_state_evicted_mid_fill_keeps_the_ceiling() {
    let stored = fault_mid_fill(Duration::ZERO, |l| l.lose(KEY)).await;
    assert_eq!(stored, 50);
}

#[tokio::test(start_paused = true)]
async fn a_failover_to_a_replica_that_lost_the_last_writes_keeps_the_ceiling() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::from_secs(5));
    let all = replicas(3, &ledger, &broker, policy(50, false)).await;
    fill(&all, &broker, 2).await;
    let before = ledger.snapshot();
    while broker.stored() < 30 {
        fill(&all, &broker, 1).await;
    }
    ledger.restore(&before);
    fill(&all, &broker, 60).await;
    assert_eq!(broker.stored(), 50);
}

#[tokio::test(start_paused = true)]
async fn a_new_epoch_grants_nothing_within_its_grace_then_admits() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(50, false)).await;
    send(&all[0], &broker).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // the block's use is over
    ledger.lose_everything();
    let started = Instant::now();
    send(&all[0], &broker).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "waited out the grace ({:?})",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn cut_off_and_failing_closed_a_replica_spends_only_its_blocks_then_refuses() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(3, &ledger, &broker, policy(60, true)).await;
    send(&all[0], &broker).await.unwrap(); // it holds a block now
    ledger.cut_off(all[0].fleet.replica(), true);
    let (alone, _) = fill(&all[..1], &broker, 30).await;
    assert!(alone <= 8, "only what its block held ({alone})");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(matches!(
        send(&all[0], &broker).await,
        Err(Refusal::CapacityUnknown { .. })
    ));
    fill(&all[1..], &broker, 60).await;
    let held = broker.stored();
    assert!(held < 60, "the units it held unused stay counted ({held})");
    // Once its block's lease ended (use + hold), the others get them.
    tokio::time::sleep(Duration::from_secs(6)).await;
    fill(&all[1..], &broker, 60).await;
    assert_eq!(broker.stored(), 60);
    // Back: it rejoins and is refused like the others.
    ledger.cut_off(all[0].fleet.replica(), false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(all[0].fleet.joined());
    assert!(matches!(
        send(&all[0], &broker).await,
        Err(Refusal::QueueFull { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn cut_off_and_failing_open_the_fleet_stores_at_most_a_part_of_the_ceiling_more() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::from_secs(5));
    let all = replicas(3, &ledger, &broker, policy(60, false)).await;
    fill(&all, &broker, 1).await;
    ledger.cut_off(all[0].fleet.replica(), true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    fill(&all, &broker, 80).await;
    let stored = broker.stored();
    assert!(stored <= 60 + 20, "at most ⌈60/3⌉ over ({stored})");
    assert!(stored > 60, "the cut-off replica admitted alone ({stored})");
    // Rejoined, its alone sends reach the fleet as its carry: nothing more is admitted.
    ledger.cut_off(all[0].fleet.replica(), false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    fill(&all, &broker, 20).await;
    assert_eq!(broker.stored(), stored);
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_arrives_after_its_use_ended_is_given_back_not_used() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(2, &ledger, &broker, policy(4, true)).await;
    // The first replica's replies arrive late (a paused process), after the block's use
    // would have ended: each grant is given back.
    ledger.delay(all[0].fleet.replica(), super::USE_BLOCK_FOR + T);
    let late = send(&all[0], &broker).await;
    assert!(late.is_err(), "a late grant admits nothing ({late:?})");
    ledger.delay(all[0].fleet.replica(), Duration::ZERO);
    // What it was granted comes back with its settle, not at its lease's end.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (admitted, _) = fill(&all[1..], &broker, 10).await;
    assert_eq!(admitted, 4);
    assert_eq!(broker.stored(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_drained_replica_gives_back_what_its_blocks_did_not_use() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(2, &ledger, &broker, policy(20, false)).await;
    send(&all[0], &broker).await.unwrap(); // takes a block of 2 ((20 − 0) / 8)
    all[0].gate.leave_fleet().await;
    assert!(matches!(
        send(&all[0], &broker).await,
        Err(Refusal::Stopped)
    ));
    let (admitted, _) = fill(&all[1..], &broker, 30).await;
    assert_eq!(admitted, 19);
    assert_eq!(broker.stored(), 20);
}

#[tokio::test(start_paused = true)]
async fn two_waves_of_concurrent_sends_fill_the_ceiling_and_no_further() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let p = CapacityPolicy {
        ttl: Duration::from_millis(200),
        ..policy(50, false)
    };
    let all = Arc::new(replicas(3, &ledger, &broker, p).await);
    for wave in 0..2 {
        let sends: Vec<_> = (0..64)
            .map(|i| {
                let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
                tokio::spawn(async move { send(&all[(i + wave) % 3], &broker).await })
            })
            .collect();
        for s in sends {
            let _ = s.await.unwrap();
        }
    }
    assert_eq!(broker.stored(), 50);
}

#[tokio::test(start_paused = true)]
async fn one_slow_answer_is_not_a_partition() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = Arc::new(replicas(1, &ledger, &broker, policy(50, true)).await);
    send(&all[0], &broker).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // its block's use is over
                                                      // The next call runs but its answer misses the deadline (a loaded host); the one after
                                                      // answers in time.
    ledger.lose_replies(all[0].fleet.replica(), true);
    let sending = {
        let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
        tokio::spawn(async move { send(&all[0], &broker).await })
    };
    tokio::time::sleep(T / 2).await;
    ledger.lose_replies(all[0].fleet.replica(), false);
    assert_eq!(sending.await.unwrap(), Ok(()), "asked again, not cut off");
    assert!(all[0].fleet.joined());
}
