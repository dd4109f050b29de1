//! The seat on tokio's paused clock over the in-memory ledger, which can lose its data,
//! roll back, answer late or cut a replica off: each docs/fleet.md bound, as a test.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::admission::ceiling::{
    BacklogEffect, CapacityGate, CapacityPolicy, FleetSeat, GateParts, PolicyCell, PolicyOverride,
    Refusal, Reservation, USE_BLOCK_FOR,
};
use crate::admission::fair::QueueFairness;
use crate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::config::Fraction;
use crate::coordination::fleet::{Fleet, HEARTBEAT};
use crate::coordination::memory::MemoryLedger;
use crate::coordination::port::{
    Ask, Caller, LedgerError, LedgerPort, QueueRef, ReadFor, ReadOutcome, ReadTicket,
    ReserveAnswer, Settle, View,
};
use crate::domain::QueueName;

use super::state::{Block, Mode, SeatState};

const T: Duration = Duration::from_millis(50);
const SEND: Duration = Duration::from_secs(2);
const KEY: &str = "test:{rabbitmq/requests}";

/// A queue whose admin plane shows what was stored `lag` ago (nothing drains); it can be
/// made to fail, or to take a while to answer.
struct Broker {
    stored: Mutex<Vec<Instant>>,
    lag: Duration,
    down: std::sync::atomic::AtomicBool,
    read_takes: Mutex<Duration>,
    /// Depth reads answered.
    reads: std::sync::atomic::AtomicU64,
}

impl Broker {
    fn new(lag: Duration) -> Arc<Self> {
        Arc::new(Self {
            stored: Mutex::new(Vec::new()),
            lag,
            down: std::sync::atomic::AtomicBool::new(false),
            read_takes: Mutex::new(Duration::ZERO),
            reads: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    fn stored(&self) -> u64 {
        self.stored.lock().len() as u64
    }

    /// A consumer takes every message.
    fn drain(&self) {
        self.stored.lock().clear();
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
        let takes = *self.read_takes.lock();
        if !takes.is_zero() {
            tokio::time::sleep(takes).await;
        }
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(DepthError::Timeout);
        }
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
    replicas_with(n, ledger, broker, p, |_| None).await
}

/// As [`replicas`], replica `i`'s gate with `fairness(i)`.
async fn replicas_with(
    n: usize,
    ledger: &MemoryLedger,
    broker: &Arc<Broker>,
    p: CapacityPolicy,
    fairness: impl Fn(usize) -> Option<QueueFairness>,
) -> Vec<Replica> {
    let all = start_with(n, ledger, broker, p, fairness);
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

/// `n` replicas, `SENDGATE_FLEET_MAX_REPLICAS` = `n`, not waiting for them to join.
fn start(n: usize, ledger: &MemoryLedger, broker: &Arc<Broker>, p: CapacityPolicy) -> Vec<Replica> {
    start_with(n, ledger, broker, p, |_| None)
}

/// As [`start`], replica `i`'s gate with `fairness(i)`.
fn start_with(
    n: usize,
    ledger: &MemoryLedger,
    broker: &Arc<Broker>,
    p: CapacityPolicy,
    fairness: impl Fn(usize) -> Option<QueueFairness>,
) -> Vec<Replica> {
    let queue = QueueName::parse("requests").unwrap();
    let mut all = Vec::new();
    for i in 0..n {
        let fleet = Fleet::start(Arc::new(ledger.clone()), n as u64);
        let backend: Arc<dyn Backend> = broker.clone();
        let gate = seated_gate(&fleet, &queue, p.clone(), backend, fairness(i));
        all.push(Replica { fleet, gate });
    }
    all
}

/// A gate for `queue` whose seat in `fleet` shares its policy.
fn seated_gate(
    fleet: &Arc<Fleet>,
    queue: &QueueName,
    p: CapacityPolicy,
    backend: Arc<dyn Backend>,
    fairness: Option<QueueFairness>,
) -> Arc<CapacityGate> {
    let policy = PolicyCell::new(p);
    let seat = FleetSeat::new(
        Arc::clone(fleet),
        KEY.to_owned(),
        queue.clone(),
        Arc::clone(&policy),
        Arc::clone(&backend),
        SEND,
    );
    CapacityGate::new(GateParts {
        fairness,
        seat: Some(seat),
        ..GateParts::alone(queue.clone(), policy, backend)
    })
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

/// `n` sends at once, round the replicas in turn, each answering whether it was admitted
/// (and stored at once).
fn burst(
    all: &Arc<Vec<Replica>>,
    broker: &Arc<Broker>,
    n: usize,
) -> Vec<tokio::task::JoinHandle<bool>> {
    (0..n)
        .map(|i| {
            let (all, broker) = (Arc::clone(all), Arc::clone(broker));
            tokio::spawn(async move { send(&all[i % all.len()], &broker).await.is_ok() })
        })
        .collect()
}

/// How many of a [`burst`]'s sends were admitted.
async fn admitted_of(sends: Vec<tokio::task::JoinHandle<bool>>) -> u64 {
    let mut admitted = 0;
    for s in sends {
        admitted += u64::from(s.await.unwrap());
    }
    admitted
}

#[tokio::test(start_paused = true)]
async fn three_replicas_store_exactly_the_ceiling() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(3, &ledger, &broker, policy(50, false)).await;
    let (first, mut refused) = fill(&all, &broker, 40).await;
    // A read taken between a send's store and its settle counts it twice (the safe side)
    // until the next read: once that is in, the fleet holds exactly the ceiling.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (then, more) = fill(&all, &broker, 20).await;
    refused.extend(more);
    let admitted = first + then;
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

/// docs/fleet.md, step 5 (what a loss costs): the sends stored before the loss are
/// recounted into the new epoch, so the first read after the grace counts them once: on a
/// queue a consumer drained, the fleet admits again after its grace, not a hold later
/// (carried, they kept it refusing for `H` on an empty queue).
#[tokio::test(start_paused = true)]
async fn a_fleet_that_lost_its_ledger_on_a_drained_queue_admits_after_its_grace() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(3, &ledger, &broker, policy(30, false)).await;
    fill(&all, &broker, 20).await;
    assert!(broker.stored() > 20, "filled ({})", broker.stored());
    broker.drain();
    ledger.lose_everything();
    // The grace (700 ms here) and a read; the hold is 4.6 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (admitted, _) = fill(&all, &broker, 20).await;
    assert_eq!(admitted, 30, "the whole ceiling of an empty queue");
    assert_eq!(broker.stored(), 30);
}

/// As above, the queue's state evicted mid-fill with nothing drained: the fleet fills to
/// the ceiling after its grace (carried, the sends before the eviction counted twice and
/// stopped it at about half).
#[tokio::test(start_paused = true)]
async fn an_eviction_mid_fill_leaves_the_fleet_filling_to_the_ceiling_after_its_grace() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(3, &ledger, &broker, policy(50, false)).await;
    while broker.stored() < 25 {
        fill(&all, &broker, 1).await;
    }
    ledger.lose(KEY);
    tokio::time::sleep(Duration::from_secs(1)).await;
    fill(&all, &broker, 60).await;
    assert_eq!(broker.stored(), 50);
}

/// A send in flight when the ledger is lost stays in the carry while its outcome is open,
/// and known stored it is recounted into the new epoch: counted all along, never twice for
/// long.
#[tokio::test(start_paused = true)]
async fn a_send_in_flight_across_a_loss_is_carried_then_recounted() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(10, false)).await;
    let in_flight = all[0].gate.admit().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // its block's use is over
    ledger.lose_everything();
    tokio::time::sleep(Duration::from_secs(1)).await; // past the grace
    let queue = QueueRef {
        key: KEY,
        terms: all[0].gate.seat.as_ref().unwrap().terms(),
    };
    let view = ledger.look(queue).await.unwrap().expect("the new epoch");
    assert_eq!(
        (view.carried, view.since_read),
        (1, 0),
        "carried while open"
    );
    broker.stored.lock().push(Instant::now());
    in_flight.finish(BacklogEffect::Stored);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let view = ledger.look(queue).await.unwrap().expect("the new epoch");
    assert_eq!(
        (view.carried, view.since_read),
        (0, 1),
        "recounted once stored"
    );
}

/// A consumer polling the queue every `every` (taking one message a poll) while 3
/// replicas are offered a send each every 2 ms (overload), for `run`; `lose` the ledger at
/// that instant, if any. Returns (polls counted, polls that found the queue empty while a
/// send was refused for the ceiling since the poll before), polls within `skip` after the
/// loss not counted (the protocol's own minimum hold: its grace and a read).
async fn drain_under_overload(
    limit: u64,
    every: Duration,
    run: Duration,
    lose: Option<Duration>,
) -> (u64, u64) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(3, &ledger, &broker, policy(limit, false)).await;
    let refused = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let skip = Duration::from_millis(1700);
    let consumer = {
        let (broker, refused) = (Arc::clone(&broker), Arc::clone(&refused));
        tokio::spawn(async move {
            let (mut polls, mut starved) = (0, 0);
            let mut tick = tokio::time::interval(every);
            while start.elapsed() < run {
                tick.tick().await;
                let empty = {
                    let mut stored = broker.stored.lock();
                    let empty = stored.is_empty();
                    if !empty {
                        stored.remove(0);
                    }
                    empty
                };
                let was_refused = refused.swap(false, Ordering::SeqCst);
                let since = start.elapsed();
                if lose.is_some_and(|at| since >= at && since < at + skip) {
                    continue;
                }
                polls += 1;
                starved += u64::from(empty && was_refused);
            }
            (polls, starved)
        })
    };
    let mut lost = false;
    while start.elapsed() < run {
        if !lost && lose.is_some_and(|at| start.elapsed() >= at) {
            ledger.lose_everything();
            lost = true;
        }
        for r in &all {
            if let Err(Refusal::QueueFull { .. }) = send(r, &broker).await {
                refused.store(true, Ordering::SeqCst);
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(broker.stored() <= limit, "past the ceiling");
    }
    consumer.await.unwrap()
}

/// Work conservation after a ledger loss (issue 39: after a `FLUSHALL` the fleet refused
/// on an empty queue for a hold): 3 replicas, ceiling 40, a consumer at 50 polls a second,
/// sends offered far above it. Past the protocol's own minimum hold after the loss (its
/// grace and a read), the consumer finds the queue empty while sends are refused on no more
/// of its polls than without a loss, within 2 % of them. (The share itself, ~19 % here, is
/// the TTL's: a ceiling below the drain over a TTL, with no credit for the drain between
/// reads, docs/fleet.md "Bounds".)
#[tokio::test(start_paused = true)]
async fn past_its_minimum_hold_a_ledger_loss_leaves_the_consumer_no_more_empty_polls() {
    let every = Duration::from_millis(20);
    let run = Duration::from_secs(20);
    let (polls, starved) = drain_under_overload(40, every, run, None).await;
    let (lost_polls, lost_starved) =
        drain_under_overload(40, every, run, Some(Duration::from_secs(8))).await;
    let share = starved as f64 / polls as f64;
    let lost_share = lost_starved as f64 / lost_polls as f64;
    eprintln!("empty while refusing: {starved}/{polls} without a loss, {lost_starved}/{lost_polls} with one");
    assert!(
        lost_share <= share + 0.02,
        "{lost_share:.3} of polls empty while refusing after a loss, {share:.3} without"
    );
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
    ledger.fail_over(&before);
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

/// A fleet that never reached Redis knows no size but the configured one: each replica
/// failing open admits its part of the room, not the whole room (docs/fleet.md, step 6).
#[tokio::test(start_paused = true)]
async fn a_fleet_that_never_reached_redis_shares_the_room_by_its_configured_size() {
    let ledger = MemoryLedger::new(T);
    ledger.set_down(true);
    let broker = Broker::new(Duration::from_secs(5));
    let all = start(3, &ledger, &broker, policy(30, false));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(all.iter().all(|r| !r.fleet.joined()));
    let (admitted, _) = fill(&all, &broker, 40).await;
    assert!(admitted > 0, "failing open, it admits alone");
    assert!(
        broker.stored() <= 30,
        "the parts add up to the room: {}",
        broker.stored()
    );
}

/// The model's counterexample to a window of one hold (model/): A, cut off, admits alone;
/// B reserves on a read taken before A's sends show in any, just before they turn a hold
/// old, and stores late; once A's sends are a hold old its own read shows them but not B's,
/// and with a window of a hold A would admit its part a second time. A counts what it
/// admitted for two holds and a block's use.
#[tokio::test(start_paused = true)]
async fn cut_off_a_replica_counts_what_it_admitted_until_the_grants_made_without_it_show() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::from_secs(5));
    let all = replicas(2, &ledger, &broker, policy(10, false)).await;
    let (a, b) = (&all[0], &all[1]);
    ledger.cut_off(a.fleet.replica(), true);
    let started = Instant::now();
    let mut alone = 0;
    for _ in 0..10 {
        if send(a, &broker).await.is_ok() {
            alone += 1;
        }
    }
    assert!(!a.fleet.joined());
    assert_eq!(alone, 4, "its part of the room: 0 + 2 × 5 ≥ 10");
    // B's read, taken before A's sends show (a lag of 5 s), lets it fill the room.
    tokio::time::sleep_until(started + Duration::from_millis(4900)).await;
    let (by_b, _) = fill(std::slice::from_ref(b), &broker, 12).await;
    assert_eq!(by_b, 10, "B's read did not show A's sends");
    // A hold (9.6 s) after A's sends, its own read shows them, not B's.
    tokio::time::sleep_until(started + Duration::from_millis(9700)).await;
    for _ in 0..10 {
        let _ = send(a, &broker).await;
    }
    let stored = broker.stored();
    assert!(stored <= 10 + 5, "L + one part: {stored}");
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
    // What it was granted comes back with its settle, not at its lease's end (and a read
    // taken between a store and its settle counts it twice only until the next read).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (first, _) = fill(&all[1..], &broker, 10).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (then, _) = fill(&all[1..], &broker, 10).await;
    assert_eq!(first + then, 4);
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
    // Its block's use is over; the next call runs but its answer misses the deadline (a
    // loaded host), and the one after answers in time.
    tokio::time::sleep(Duration::from_secs(1)).await;
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

// ---- Review of the seat (each test failed before its fix).

/// Every call a replica makes, with when it was made: the ledger underneath is `inner`.
struct Recording {
    inner: MemoryLedger,
    calls: Mutex<Vec<Instant>>,
    reserves: Mutex<usize>,
    /// Every reservation's `(want, divisor)`, in the order asked.
    asks: Mutex<Vec<(u64, u64)>>,
    /// A reservation reaches the ledger this long after it was made (zero: at once).
    reserve_runs_after: Mutex<Duration>,
}

impl Recording {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryLedger::new(T),
            calls: Mutex::new(Vec::new()),
            reserves: Mutex::new(0),
            asks: Mutex::new(Vec::new()),
            reserve_runs_after: Mutex::new(Duration::ZERO),
        })
    }
}

impl Recording {
    fn note(&self) {
        self.calls.lock().push(Instant::now());
    }
}

#[async_trait]
impl LedgerPort for Recording {
    async fn reserve(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ask: Ask<'_>,
    ) -> Result<(ReserveAnswer, View), LedgerError> {
        self.note();
        *self.reserves.lock() += 1;
        self.asks.lock().push((ask.want, ask.divisor));
        let after = *self.reserve_runs_after.lock();
        if !after.is_zero() {
            tokio::time::sleep(after).await;
        }
        self.inner.reserve(queue, caller, ask).await
    }
    async fn settle(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        rows: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        self.note();
        self.inner.settle(queue, caller, rows).await
    }
    async fn heartbeat(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
    ) -> Result<View, LedgerError> {
        self.note();
        self.inner.heartbeat(queue, caller).await
    }
    async fn lease_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        lease: Duration,
    ) -> Result<(Option<ReadTicket>, View), LedgerError> {
        self.note();
        self.inner.lease_read(queue, caller, lease).await
    }
    async fn publish_read(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        ticket: ReadTicket,
        outcome: ReadOutcome,
        for_: ReadFor,
    ) -> Result<View, LedgerError> {
        self.note();
        self.inner
            .publish_read(queue, caller, ticket, outcome, for_)
            .await
    }
    async fn leave(
        &self,
        queue: QueueRef<'_>,
        caller: Caller<'_>,
        rows: &[Settle<'_>],
    ) -> Result<View, LedgerError> {
        self.note();
        self.inner.leave(queue, caller, rows).await
    }
    async fn look(&self, queue: QueueRef<'_>) -> Result<Option<View>, LedgerError> {
        self.inner.look(queue).await
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
}

/// The grace counts on every replica in the fleet calling within a heartbeat (and a
/// deadline): a seat whose last call was a send's, just after its heartbeat woke, must not
/// wait two heartbeats for the next one.
#[tokio::test(start_paused = true)]
async fn a_seat_is_heard_from_within_a_heartbeat_of_its_last_call_whatever_made_it() {
    let created = Instant::now();
    let recording = Recording::new();
    let fleet = Fleet::start(Arc::clone(&recording) as Arc<dyn LedgerPort>, 1);
    let queue = QueueName::parse("requests").unwrap();
    let broker = Broker::new(Duration::ZERO);
    let backend: Arc<dyn Backend> = broker.clone();
    let gate = seated_gate(&fleet, &queue, policy(50, false), backend, None);
    while !fleet.joined() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Just after the heartbeat's fourth wake: a send, and its settle 50 ms later.
    tokio::time::sleep_until(created + HEARTBEAT * 4 + Duration::from_millis(1)).await;
    let r = Replica {
        fleet: Arc::clone(&fleet),
        gate,
    };
    send(&r, &broker).await.unwrap();
    let from = recording.calls.lock().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = recording.calls.lock()[from - 1..].to_vec();
    let longest = calls.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        longest <= HEARTBEAT + T,
        "{longest:?} between two calls (heartbeat {HEARTBEAT:?}, deadline {T:?})"
    );
}

/// A Redis restart cuts every replica off at once, and each rejoins at its own probe, once
/// a second: the first back makes the new epoch, the others report their carries only once
/// their probe finds Redis again, up to a probe period later. The grace must cover that,
/// or the first replica is granted the room the others' recent sends (not yet in any read
/// of a lagging admin plane) fill.
#[tokio::test(start_paused = true)]
async fn redis_restarted_empty_keeps_the_ceiling_though_the_replicas_rejoin_a_probe_apart() {
    use crate::coordination::fleet::REJOIN_EVERY;
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::from_secs(5));
    let all = replicas(3, &ledger, &broker, policy(50, true)).await;
    while broker.stored() < 25 {
        fill(&all, &broker, 1).await;
    }
    tokio::time::sleep(USE_BLOCK_FOR).await; // the blocks' use is over
    ledger.set_down(true);
    ledger.lose_everything();
    // Replicas 1 and 2 have a send at that moment and are cut off at once; replica 0 at its
    // next heartbeat. Their probes run from then.
    let (one, two) = tokio::join!(send(&all[1], &broker), send(&all[2], &broker));
    assert!(one.is_err() && two.is_err());
    let mut fell = [None; 3];
    while fell.iter().any(Option::is_none) {
        for (i, r) in all.iter().enumerate() {
            if fell[i].is_none() && !r.fleet.joined() {
                fell[i] = Some(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let fell = fell.map(Option::unwrap);
    let probe = |i: usize, k: u32| fell[i] + (REJOIN_EVERY + T) * k;
    // Redis is back just after replicas 1 and 2 probed it: replica 0's probe finds it first.
    let back = probe(1, 2).max(probe(2, 2)) + Duration::from_millis(1);
    assert!(probe(0, 2) > back, "replica 0 fell back first: {fell:?}");
    tokio::time::sleep_until(back).await;
    ledger.set_down(false);
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        fill(&all, &broker, 1).await;
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    fill(&all, &broker, 20).await;
    assert_eq!(broker.stored(), 50);
}

/// Replies of one connection are processed by different tasks: one of the epoch before a
/// rebirth may be processed after one of the new epoch. It is older news, not a new epoch.
#[tokio::test(start_paused = true)]
async fn a_reply_of_an_older_epoch_processed_after_a_newer_one_changes_nothing() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(50, false)).await;
    send(&all[0], &broker).await.unwrap();
    let seat = Arc::clone(all[0].gate.seat.as_ref().unwrap());
    let (old, _) = seat.state.lock().last.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // the block's use is over
    ledger.lose_everything();
    send(&all[0], &broker).await.unwrap(); // meets the new epoch, waits its grace out
    let (new, blocks) = {
        let state = seat.state.lock();
        (state.seen, state.blocks.len())
    };
    assert!(
        new.id > old.epoch.id && blocks > 0,
        "{new:?}, {blocks} blocks"
    );
    seat.see(old);
    let state = seat.state.lock();
    assert_eq!(state.seen.id, new.id, "went back to the lost epoch");
    assert_eq!(state.blocks.len(), blocks, "dropped the new epoch's blocks");
}

/// Cut off with the gate on, the replica answers every send `503 capacity_unknown`:
/// `/health/detailed` says so (`fail_closed`), not the state of a local gate it does not use.
#[tokio::test(start_paused = true)]
async fn cut_off_and_failing_closed_the_gates_health_says_it_refuses() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(50, true)).await;
    send(&all[0], &broker).await.unwrap();
    assert!(!all[0].gate.snapshot().fail_closed);
    ledger.set_down(true);
    tokio::time::sleep(Duration::from_secs(1)).await; // cut off; the block's use is over
    assert!(matches!(
        send(&all[0], &broker).await,
        Err(Refusal::CapacityUnknown { .. })
    ));
    assert!(
        all[0].gate.snapshot().fail_closed,
        "refusing every send, health says it does not"
    );
    ledger.set_down(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    send(&all[0], &broker).await.unwrap();
    assert!(!all[0].gate.snapshot().fail_closed, "back in the fleet");
}

/// Cut off and failing open, the seat counts a send in its window before the replica's own
/// gate decides it, which may first read the admin plane: the send's deadline (from which
/// the hold is reckoned) counts from the window's count, not from after that read.
#[tokio::test(start_paused = true)]
async fn a_send_admitted_alone_counts_its_deadline_from_when_the_seat_counted_it() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(50, false)).await;
    ledger.set_down(true);
    tokio::time::sleep(Duration::from_secs(1)).await; // cut off by its heartbeat
    *broker.read_takes.lock() = Duration::from_millis(400);
    let asked = Instant::now();
    let reservation = all[0].gate.admit().await.unwrap();
    assert!(asked.elapsed() >= Duration::from_millis(400), "read first");
    assert_eq!(reservation.counted_at(), asked);
    reservation.finish(BacklogEffect::NotStored);
}

/// Admitted open (the fleet's read failed, the gate off), a send is in no block: while in
/// flight it must still count somewhere, or a read published meanwhile lets the fleet
/// grant its room again.
#[tokio::test(start_paused = true)]
async fn sends_admitted_open_stay_counted_while_in_flight_when_the_read_comes_back() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(2, &ledger, &broker, policy(10, false)).await;
    broker.set_down(true);
    let mut in_flight = Vec::new();
    for _ in 0..5 {
        in_flight.push(all[0].gate.admit().await.unwrap());
    }
    broker.set_down(false);
    tokio::time::sleep(Duration::from_millis(1500)).await; // past the TTL: read again
    let (admitted, _) = fill(&all[1..], &broker, 30).await;
    for reservation in in_flight {
        broker.stored.lock().push(Instant::now());
        reservation.finish(BacklogEffect::Stored);
    }
    assert_eq!(
        broker.stored(),
        10,
        "{admitted} admitted on top of 5 in flight"
    );
    // Settled, they are counted once: nothing more is admitted, nothing less.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (more, _) = fill(&all, &broker, 10).await;
    assert_eq!((more, broker.stored()), (0, 10));
}

/// The grace covers both ways a replica Redis answers reaches a new epoch (see `grace`),
/// whatever the Redis deadline.
#[test]
fn the_grace_outlasts_a_heartbeat_and_a_rejoin_probe_with_their_deadlines() {
    use crate::admission::ceiling::fleet::{grace, REJOINED_POLL};
    use crate::coordination::fleet::REJOIN_EVERY;
    for t in [1, 50, 500, 5_000, 60_000].map(Duration::from_millis) {
        let reached = HEARTBEAT.max(REJOIN_EVERY + REJOINED_POLL) + t * 3;
        assert!(
            reached < grace(t),
            "T = {t:?}: {reached:?} ≥ {:?}",
            grace(t)
        );
    }
}

/// Contract section 2: while the streak builds on a fail-closed gate, the fleet admits open
/// only as far as the last good read and what it counted since allow, not whatever the
/// producers send in a streak of TTLs.
#[tokio::test(start_paused = true)]
async fn while_the_streak_builds_the_last_good_read_still_bounds_the_fleet() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let p = CapacityPolicy {
        streak_threshold: 3,
        ..policy(25, true)
    };
    let all = replicas(3, &ledger, &broker, p).await;
    let (first, _) = fill(&all, &broker, 4).await;
    assert_eq!(first, 12);
    tokio::time::sleep(Duration::from_millis(1500)).await; // a good read of 12 stands
    let (read, _) = fill(&all, &broker, 1).await;
    assert_eq!((read, broker.stored()), (3, 15));
    broker.set_down(true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (open, refused) = fill(&all, &broker, 30).await;
    let terms = all[0].gate.seat.as_ref().unwrap().terms();
    let view = ledger
        .look(QueueRef { key: KEY, terms })
        .await
        .unwrap()
        .unwrap();
    assert!(view.streak < 3, "still building: {view:?}");
    assert!(
        broker.stored() <= 25,
        "{open} admitted open: {} stored",
        broker.stored()
    );
    assert!(open >= 1, "open up to what is known: {refused:?}");
    assert!(
        refused
            .iter()
            .all(|r| matches!(r, Refusal::QueueFull { .. })),
        "the last good read shows the queue full: {refused:?}"
    );
}

/// docs/fleet.md, Bounds ("the admin plane fails, fail-closed on": `L + U + K`): Redis losing
/// the queue's state while the admin plane is down must not reopen the ceiling. The new
/// epoch has no good read and a streak of 0, so it is taken for an empty queue and up to
/// the ceiling again is admitted blind on top of what the queue already holds (live, 3
/// replicas on Redis and RabbitMQ, 20 queued, ceiling 25: the queue held 44).
#[tokio::test(start_paused = true)]
async fn redis_losing_the_queue_while_the_admin_plane_is_down_keeps_the_ceiling() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let p = CapacityPolicy {
        streak_threshold: 3,
        ..policy(25, true)
    };
    // 20 messages stored by producers before the fleet, or by it longer ago than any carry
    // or recount reaches: only a read can show them.
    broker.stored.lock().extend([Instant::now(); 20]);
    let all = replicas(3, &ledger, &broker, p).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    fill(&all, &broker, 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // a good read stands
    fill(&all, &broker, 1).await;
    broker.set_down(true);
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        fill(&all, &broker, 10).await;
    }
    let before = broker.stored();
    assert!(before <= 25, "{before} stored while the streak built");
    ledger.lose(KEY);
    for _ in 0..10 {
        fill(&all, &broker, 10).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    assert!(
        broker.stored() <= 25,
        "{before} stored before Redis lost the queue, {} after",
        broker.stored()
    );
}

/// Contract sections 2 and 3: in a fleet too, while the streak builds a batch refused on
/// the last good read says how many of its entries fit, and they are then admitted.
#[tokio::test(start_paused = true)]
async fn while_the_streak_builds_a_batch_refused_in_the_fleet_names_the_room() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let p = CapacityPolicy {
        streak_threshold: 3,
        ..policy(25, true)
    };
    broker.stored.lock().extend([Instant::now(); 20]);
    let all = replicas(1, &ledger, &broker, p).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    send(&all[0], &broker)
        .await
        .expect("a good read of 20: 21 now");
    tokio::time::sleep(Duration::from_millis(100)).await; // settled
    broker.set_down(true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let refused = all[0].gate.admit_units(5).await.map(|_| ());
    assert!(
        matches!(refused, Err(Refusal::QueueFull { room: 4, .. })),
        "4 of the 5 fit: {refused:?}"
    );
    let batch = all[0].gate.admit_units(4).await.expect("the 4 that fit");
    for _ in 0..4 {
        broker.stored.lock().push(Instant::now());
    }
    batch.finish(BacklogEffect::Stored);
    assert!(matches!(
        send(&all[0], &broker).await,
        Err(Refusal::QueueFull { .. })
    ));
    assert_eq!(broker.stored(), 25);
}

/// With no good read in the epoch, what the fleet admits blind while the streak builds is
/// at most the ceiling.
#[tokio::test(start_paused = true)]
async fn with_no_good_read_the_fleet_admits_at_most_the_ceiling_blind() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    broker.set_down(true);
    let p = CapacityPolicy {
        streak_threshold: 3,
        ..policy(12, true)
    };
    let all = replicas(3, &ledger, &broker, p).await;
    let (open, refused) = fill(&all, &broker, 30).await;
    assert!(
        open >= 1 && broker.stored() <= 12,
        "{open} admitted, {refused:?}"
    );
    assert!(
        refused.iter().any(|r| matches!(
            r,
            Refusal::CapacityUnknown {
                consecutive_failures: 1..=2,
                ..
            }
        )),
        "refused before the streak closes: {refused:?}"
    );
}

/// Contract section 2: with the gate on at a streak of 3 and the admin plane down, sends 1
/// and 2 fail open and send 3 is refused, one failed read each. A send that meets a new
/// epoch reads, waits out the grace, and finds its read too old to reserve against: the
/// read it makes again is for the same send, and must not count in the streak twice (on
/// the real binary, tests/fleet.rs's denied admin plane then answered 201, 503, 503).
#[tokio::test(start_paused = true)]
async fn a_send_that_waits_out_a_grace_counts_one_failed_read_in_the_streak() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    broker.set_down(true);
    let p = CapacityPolicy {
        ttl: Duration::ZERO,
        streak_threshold: 3,
        ..policy(50, true)
    };
    let all = replicas(3, &ledger, &broker, p).await;
    let terms = all[0].gate.seat.as_ref().unwrap().terms();
    let streak = || async {
        let view = ledger.look(QueueRef { key: KEY, terms }).await.unwrap();
        view.map_or(0, |v| v.streak)
    };
    assert!(send(&all[0], &broker).await.is_ok(), "fails open");
    assert_eq!(streak().await, 1, "one send, one failed read");
    // The read lease (the TTL, at least 1 ms) of the last read is over.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(send(&all[1], &broker).await.is_ok(), "fails open");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(matches!(
        send(&all[2], &broker).await,
        Err(Refusal::CapacityUnknown {
            consecutive_failures: 3,
            cause: crate::admission::ceiling::Unknown::AdminPlane,
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn what_a_block_did_not_hand_out_is_given_back_before_the_next_reservation() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let p = CapacityPolicy {
        ttl: Duration::from_millis(200),
        ..policy(50, false)
    };
    let all = Arc::new(replicas(3, &ledger, &broker, p).await);
    for wave in 0..2 {
        // Every send of a wave asks at once, so each uses its own grant's first unit and
        // the rest of its block is left unused until the next wave, past the block's use.
        let sends: Vec<_> = (0..64)
            .map(|i| {
                let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
                tokio::spawn(async move { send(&all[(i + wave) % 3], &broker).await })
            })
            .collect();
        for s in sends {
            let _ = s.await.unwrap();
        }
        tokio::time::sleep(super::USE_BLOCK_FOR + Duration::from_millis(10)).await;
    }
    assert_eq!(broker.stored(), 50);
}

/// Found in review: a goodbye that reaches a state made anew (a restart just before it)
/// named the old epoch, so no carry was recorded and the leaver's sends, not yet in any
/// read, were counted nowhere. The leaver adopts the new epoch and says it again.
#[tokio::test(start_paused = true)]
async fn a_goodbye_to_a_state_made_anew_keeps_the_leavers_carry() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::from_secs(3));
    let all = replicas(2, &ledger, &broker, policy(20, false)).await;
    let mut admitted = 0;
    while admitted < 10 {
        if send(&all[0], &broker).await.is_ok() {
            admitted += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    ledger.lose_everything();
    all[0].gate.leave_fleet().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    fill(&all[1..], &broker, 40).await;
    assert!(
        broker.stored() <= 20,
        "stored {} against a ceiling of 20",
        broker.stored()
    );
}

/// A replica that stops sending gives back what its block did not hand out within a
/// heartbeat of the block's use, not a hold later when the lease ends: counted still,
/// those units would keep the rest of the fleet below the ceiling.
#[tokio::test(start_paused = true)]
async fn an_idle_replicas_unused_units_come_back_within_a_heartbeat_of_the_blocks_use() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(2, &ledger, &broker, policy(10_000, false)).await;
    send(&all[0], &broker).await.unwrap();
    let queue = QueueRef {
        key: KEY,
        terms: all[0].gate.seat.as_ref().unwrap().terms(),
    };
    let held = ledger.look(queue).await.unwrap().unwrap().reserved;
    assert!(held > 1, "a block of {held}");
    tokio::time::sleep(USE_BLOCK_FOR + HEARTBEAT + T * 2).await;
    assert_eq!(ledger.look(queue).await.unwrap().unwrap().reserved, 0);
}

/// A block granted under a higher ceiling is not used once a lower one is in force (a
/// runtime override): its units were room only under the old one.
#[tokio::test(start_paused = true)]
async fn a_block_granted_under_a_higher_ceiling_is_not_used_once_a_lower_one_is_in_force() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(10_000, false)).await;
    send(&all[0], &broker).await.unwrap();
    send(&all[0], &broker).await.unwrap();
    lower_ceiling(&all[0], 2);
    assert!(matches!(
        send(&all[0], &broker).await,
        Err(Refusal::QueueFull { .. })
    ));
    assert_eq!(broker.stored(), 2);
}

/// Far from the ceiling the next block is asked for before the one in use runs out: a
/// replica whose every Redis reply takes 5 ms waits for Redis on its first send only, where
/// it waited once per block (and every send that came meanwhile asked too).
#[tokio::test(start_paused = true)]
async fn far_from_the_ceiling_no_send_waits_for_the_next_block() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(1_000_000, false)).await;
    ledger.delay(all[0].fleet.replica(), Duration::from_millis(5));
    let mut waited = 0;
    for _ in 0..600 {
        let before = Instant::now();
        send(&all[0], &broker).await.unwrap();
        if Instant::now() > before {
            waited += 1;
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    assert_eq!(broker.stored(), 600);
    assert_eq!(waited, 1, "only the first send waited for a reservation");
}

/// Near the ceiling grants shrink and nothing is asked for ahead: every reservation is made
/// by a send that found no unit (one asked ahead would hold room another replica could
/// use).
#[tokio::test(start_paused = true)]
async fn near_the_ceiling_every_reservation_is_made_by_a_send_that_found_no_unit() {
    let recording = Recording::new();
    let broker = Broker::new(Duration::ZERO);
    let r = recorded_replica(&recording, &broker, policy(200, false)).await;
    // Calls take no time on the paused clock: a reservation made between sends, not by
    // one, was asked for ahead (at a ceiling of 200 the first grant is 25, far below a
    // whole block, and they shrink from there).
    let mut by_sends = 0;
    for _ in 0..250 {
        let before = *recording.reserves.lock();
        let _ = send(&r, &broker).await;
        by_sends += *recording.reserves.lock() - before;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(broker.stored(), 200);
    assert!(by_sends > 0);
    assert_eq!(*recording.reserves.lock(), by_sends, "none asked for ahead");
}

/// Coming from far below the ceiling, the first grant short of a whole block marks the
/// ceiling near: from then on nothing is asked for ahead, though grants were whole before.
#[tokio::test(start_paused = true)]
async fn from_far_below_the_first_short_grant_stops_the_asks_ahead() {
    let recording = Recording::new();
    let broker = Broker::new(Duration::ZERO);
    let r = recorded_replica(&recording, &broker, policy(1_200, false)).await;
    // Room for a whole block (⌊room/8⌋ ≥ 128) ends by 176 counted, blocks held included.
    let mut ahead_near = 0;
    for _ in 0..1_300 {
        let before = *recording.reserves.lock();
        let _ = send(&r, &broker).await;
        let by_send = *recording.reserves.lock() - before;
        tokio::time::sleep(Duration::from_millis(1)).await;
        if broker.stored() > 400 {
            ahead_near += *recording.reserves.lock() - before - by_send;
        }
    }
    assert_eq!(broker.stored(), 1_200);
    assert_eq!(ahead_near, 0, "asked for ahead near the ceiling");
}

/// A lower ceiling in force gives back what the blocks granted under the higher one did not
/// hand out within a heartbeat, before their use ends.
#[tokio::test(start_paused = true)]
async fn a_lower_ceiling_gives_back_the_unused_units_of_blocks_granted_under_a_higher_one() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(10_000, false)).await;
    send(&all[0], &broker).await.unwrap();
    let queue = QueueRef {
        key: KEY,
        terms: all[0].gate.seat.as_ref().unwrap().terms(),
    };
    assert!(ledger.look(queue).await.unwrap().unwrap().reserved > 1);
    lower_ceiling(&all[0], 100);
    tokio::time::sleep(HEARTBEAT + T * 2).await;
    assert!(
        HEARTBEAT + T * 2 < USE_BLOCK_FOR,
        "before the block's use ends"
    );
    assert_eq!(ledger.look(queue).await.unwrap().unwrap().reserved, 0);
}

/// A grant that comes back after a lower ceiling came in force is not used, not even its
/// first unit (contract section 9): the send asks again under the ceiling in force.
#[tokio::test(start_paused = true)]
async fn a_grant_answered_after_the_ceiling_was_lowered_is_not_used() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = Arc::new(replicas(1, &ledger, &broker, policy(10_000, false)).await);
    for _ in 0..3 {
        send(&all[0], &broker).await.unwrap();
    }
    tokio::time::sleep(USE_BLOCK_FOR + Duration::from_millis(10)).await;
    ledger.delay(all[0].fleet.replica(), Duration::from_millis(5));
    let sending = {
        let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
        tokio::spawn(async move { send(&all[0], &broker).await })
    };
    // Its block's leftover is settled first (answered at 5 ms), then it reserves (10 ms).
    tokio::time::sleep(Duration::from_millis(7)).await;
    lower_ceiling(&all[0], 3);
    assert!(matches!(
        sending.await.unwrap(),
        Err(Refusal::QueueFull { .. })
    ));
    assert_eq!(broker.stored(), 3);
}

/// A reservation asked for ahead and still out when the replica leaves does not put it
/// back in the fleet: its goodbye waits for it and gives its grant back.
#[tokio::test(start_paused = true)]
async fn a_block_asked_for_ahead_does_not_outlive_the_goodbye() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(1_000_000, false)).await;
    let queue = QueueRef {
        key: KEY,
        terms: all[0].gate.seat.as_ref().unwrap().terms(),
    };
    ledger.delay(all[0].fleet.replica(), Duration::from_millis(5));
    // The first send's block is 128; the 65th leaves 63, under half: the next is asked for.
    for _ in 0..65 {
        send(&all[0], &broker).await.unwrap();
    }
    all[0].gate.leave_fleet().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let view = ledger.look(queue).await.unwrap().unwrap();
    assert_eq!((view.reserved, view.replicas), (0, 0));
}

/// One replica over `recording`, joined.
async fn recorded_replica(
    recording: &Arc<Recording>,
    broker: &Arc<Broker>,
    p: CapacityPolicy,
) -> Replica {
    let fleet = Fleet::start(Arc::clone(recording) as Arc<dyn LedgerPort>, 1);
    let queue = QueueName::parse("requests").unwrap();
    let backend: Arc<dyn Backend> = broker.clone();
    let gate = seated_gate(&fleet, &queue, p, backend, None);
    let r = Replica { fleet, gate };
    while !r.fleet.joined() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    r
}

/// A reservation asked for ahead that reaches Redis after the goodbye would make the
/// replica a member again (every call names it) and hold its grant until the lease ends:
/// the goodbye waits for one that is out.
#[tokio::test(start_paused = true)]
async fn a_goodbye_waits_for_a_block_asked_for_ahead_that_is_still_out() {
    let recording = Recording::new();
    let broker = Broker::new(Duration::ZERO);
    let r = recorded_replica(&recording, &broker, policy(1_000_000, false)).await;
    for _ in 0..64 {
        send(&r, &broker).await.unwrap();
    }
    *recording.reserve_runs_after.lock() = Duration::from_millis(5);
    // The 65th leaves 63 of the first block's 128, under half: the next is asked for, and
    // is on its way when the replica leaves.
    send(&r, &broker).await.unwrap();
    tokio::task::yield_now().await;
    r.gate.leave_fleet().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queue = QueueRef {
        key: KEY,
        terms: r.gate.seat.as_ref().unwrap().terms(),
    };
    let view = recording.inner.look(queue).await.unwrap().unwrap();
    assert_eq!((view.reserved, view.replicas), (0, 0));
}

/// The units left that decide whether the next block is due are those a send may still
/// take: a block past its use, or granted under a higher ceiling, holds none.
#[tokio::test(start_paused = true)]
async fn the_next_block_is_due_by_the_units_a_send_may_still_take() {
    let now = Instant::now();
    let block = |left, use_until, limit| Block {
        epoch: 1,
        turn: 1,
        left,
        use_until,
        limit,
    };
    let live = now + USE_BLOCK_FOR;
    for (other, due) in [
        (block(100, now, 1000), true),
        (block(100, live, 2000), true),
        (block(100, live, 1000), false),
    ] {
        let mut state = SeatState::new(Duration::ZERO);
        state.whole_under = Some(1000);
        state.blocks.push_back(other);
        state.blocks.push_back(block(10, live, 1000));
        assert_eq!(state.next_block_due(now, 1000), due);
    }
    let mut state = SeatState::new(Duration::ZERO);
    state.whole_under = Some(2000);
    state.blocks.push_back(block(10, live, 1000));
    assert!(
        !state.next_block_due(now, 1000),
        "not under a lower ceiling"
    );
}

/// A unit is taken only before its block's use ends; the next block is due once fewer than
/// half a whole block's units are left; a spent block gives back what it holds once, and
/// leaves (an empty one leaves with nothing to give back).
#[tokio::test(start_paused = true)]
async fn a_seats_blocks_at_their_boundaries() {
    let now = Instant::now();
    let block = |left, use_until| Block {
        epoch: 1,
        turn: 1,
        left,
        use_until,
        limit: 1000,
    };
    let mut state = SeatState::new(Duration::ZERO);
    state.blocks.push_back(block(5, now));
    assert_eq!(
        state.take_units(now, SEND, 1000, 1),
        None,
        "its use ends at use_until"
    );

    for (left, due) in [
        (super::state::NEXT_BLOCK_BELOW, false),
        (super::state::NEXT_BLOCK_BELOW - 1, true),
    ] {
        let mut state = SeatState::new(Duration::ZERO);
        state.whole_under = Some(1000);
        state.blocks.push_back(block(left, now + USE_BLOCK_FOR));
        assert_eq!(state.next_block_due(now, 1000), due, "{left} left");
    }

    let mut state = SeatState::new(Duration::ZERO);
    state.blocks.push_back(block(5, now));
    state.blocks.push_back(block(0, now));
    assert!(state.give_back_spent(now, 1000));
    assert!(state.blocks.is_empty());
    assert_eq!(state.pending.get(&(1, 1)), Some(&(0, 5)));
    assert!(!state.give_back_spent(now, 1000), "given back once");
    state.blocks.push_back(block(0, now + USE_BLOCK_FOR));
    assert!(!state.give_back_spent(now, 1000), "nothing to give back");
    assert!(state.blocks.is_empty(), "an empty block leaves");
    state.blocks.push_back(block(5, now + USE_BLOCK_FOR));
    assert!(
        !state.give_back_spent(now, 1000),
        "in use, under the ceiling in force"
    );
    assert_eq!(state.blocks.len(), 1);
}

/// The seat's mode follows its transitions: "full" turns it refusing, the resume level or a
/// new epoch back to reserving; leaving is for good, and keeps whether it was refusing (the
/// snapshot still says so) until the same rules end the refusal.
#[test]
fn the_seats_mode_moves_only_along_its_transitions() {
    let mut mode = Mode::Reserving;
    mode.told_full();
    assert_eq!(mode, Mode::Refusing);
    assert!(mode.refusing() && !mode.leaving());
    mode.resume();
    assert_eq!(mode, Mode::Reserving);
    mode.told_full();
    mode.leave();
    assert_eq!(mode, Mode::Leaving { refusing: true });
    assert!(mode.refusing() && mode.leaving());
    mode.resume();
    assert_eq!(mode, Mode::Leaving { refusing: false });
    mode.told_full();
    assert_eq!(mode, Mode::Leaving { refusing: true }, "still leaving");
    let mut mode = Mode::Reserving;
    mode.leave();
    assert_eq!(mode, Mode::Leaving { refusing: false });
}

/// A new epoch drops the old one's blocks, outcomes and open sends, its "full", and ends a
/// refusal; a leaving seat stays leaving.
#[tokio::test(start_paused = true)]
async fn adopting_an_epoch_drops_the_old_ones_state_and_ends_a_refusal() {
    use crate::coordination::port::Epoch;
    let now = Instant::now();
    let mut state = SeatState::new(Duration::ZERO);
    state.seen = Epoch { id: 1, version: 3 };
    state.blocks.push_back(Block {
        epoch: 1,
        turn: 1,
        left: 5,
        use_until: now + USE_BLOCK_FOR,
        limit: 1000,
    });
    state.give_back(1, 1, 2);
    state.open.insert(1, 4);
    state.mode.told_full();
    state.mode.leave();
    state.adopt(Epoch { id: 2, version: 1 }, now, Duration::from_secs(10));
    assert_eq!(state.seen, Epoch { id: 2, version: 1 });
    assert!(state.blocks.is_empty() && state.pending.is_empty() && state.open.is_empty());
    assert_eq!(state.full, None);
    assert_eq!(state.mode, Mode::Leaving { refusing: false });
}

/// docs/fleet.md, step 5 (what a loss costs): adopting an epoch, the sends of the last hold
/// known stored, whatever epoch counted them, are settled into the new one as no block's
/// and carried until then; those still open stay in the window's carry; older ones neither.
#[tokio::test(start_paused = true)]
async fn adopting_an_epoch_recounts_the_sends_of_the_hold_known_stored() {
    use super::super::window::{Ended, BUCKET};
    use crate::coordination::port::Epoch;
    let hold = Duration::from_secs(10);
    let t0 = Instant::now();
    let mut state = SeatState::new(Duration::ZERO);
    state.seen = Epoch { id: 1, version: 3 };
    let old = state.window.record_units(t0, 1, hold * 3, 2);
    state.window.ended(1, old, Ended::Stored);
    let now = t0 + hold + BUCKET;
    let bucket = state.window.record_units(now, 1, hold * 3, 4);
    state.window.ended(1, bucket, Ended::Stored);
    state.window.ended(1, bucket, Ended::Stored);
    state.window.ended(1, bucket, Ended::NotStored);
    state.adopt(Epoch { id: 2, version: 1 }, now, hold);
    assert_eq!(
        state.pending.get(&(2, 0)),
        Some(&(2, 0)),
        "settled as stored"
    );
    assert_eq!(state.open.get(&2), Some(&2), "carried until then");
    assert_eq!(state.window.carry(now, hold, 2), 1, "the one still open");
    state.open.clear();
    state.adopt(Epoch { id: 3, version: 1 }, now, hold);
    assert_eq!(
        state.open.get(&3),
        Some(&2),
        "recounted into each epoch in turn"
    );
}

/// A runtime override of the queue's ceiling on this replica.
fn lower_ceiling(r: &Replica, limit: u64) {
    r.gate.policy_cell().apply(&PolicyOverride {
        limit: Some(limit),
        ..PolicyOverride::default()
    });
}

// ---- Batches: all of a batch's units under one Held, or none.

/// A batch of `n` admitted at once (stored at once), or refused.
async fn send_units(r: &Replica, broker: &Broker, n: u64) -> Result<(), Refusal> {
    let reservation = r.gate.admit_units(n).await?;
    assert_eq!(reservation.units(), n);
    {
        let mut stored = broker.stored.lock();
        for _ in 0..n {
            stored.push(Instant::now());
        }
    }
    reservation.finish(BacklogEffect::Stored);
    Ok(())
}

/// Far from the ceiling a batch is one reservation of exactly its size (not a block it
/// takes one unit of), and a batch that fits the block in use asks Redis nothing.
#[tokio::test(start_paused = true)]
async fn a_batch_is_one_reservation_of_its_size_or_units_of_the_block_in_use() {
    let recording = Recording::new();
    let broker = Broker::new(Duration::ZERO);
    let r = recorded_replica(&recording, &broker, policy(1_000_000, false)).await;
    send(&r, &broker).await.unwrap(); // a block of 128, one unit used
    let before = *recording.reserves.lock();
    send_units(&r, &broker, 100).await.unwrap();
    assert_eq!(*recording.reserves.lock(), before, "taken from the block");
    send_units(&r, &broker, 100).await.unwrap();
    assert_eq!(
        *recording.reserves.lock(),
        before + 1,
        "27 left: one reservation for the 100"
    );
    assert_eq!(broker.stored(), 201);
}

/// Near the ceiling a batch gets all of the room or nothing: the units a short grant held
/// are given back (the next batch that fits gets them), and nothing passes the ceiling.
#[tokio::test(start_paused = true)]
async fn a_batch_larger_than_the_room_is_refused_whole_with_the_room_and_holds_nothing() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(50, false)).await;
    let r = &all[0];
    send_units(r, &broker, 45).await.unwrap();
    // Past the block's use, so nothing is left in a block of this replica's.
    tokio::time::sleep(USE_BLOCK_FOR + Duration::from_millis(100)).await;
    match send_units(r, &broker, 8).await {
        Err(Refusal::QueueFull { room, .. }) => assert_eq!(room, 5),
        other => panic!("{other:?}"),
    }
    assert_eq!(broker.stored(), 45);
    // The five units the short grant held come back with the settle: a batch of 5 fits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    send_units(r, &broker, 5).await.unwrap();
    assert_eq!(broker.stored(), 50);
    assert!(matches!(
        send_units(r, &broker, 1).await,
        Err(Refusal::QueueFull { .. })
    ));
}

/// Three replicas sending batches at the ceiling never store past it.
#[tokio::test(start_paused = true)]
async fn batches_from_three_replicas_never_pass_the_ceiling() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(3, &ledger, &broker, policy(100, false)).await;
    for round in 0..40u64 {
        for r in &all {
            let _ = send_units(r, &broker, 1 + round % 7).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for r in &all {
        let _ = send_units(r, &broker, 1).await;
    }
    assert!(broker.stored() <= 100, "{}", broker.stored());
    assert!(
        broker.stored() >= 90,
        "the room was used ({})",
        broker.stored()
    );
}

/// The replicas share the queue's room between two tenants of equal weight, `greedy`
/// (index 0) and `modest` (1), by the fleet's counts (one exchange for all): replica `i`'s
/// fairness.
fn greedy_and_modest(
    mode: crate::admission::fair::share::ShareMode,
) -> impl Fn(usize) -> Option<QueueFairness> {
    use crate::admission::fair::{FairParts, FairPolicy, Place};
    use crate::admission::tenants::{Tenant, Tenants};
    use crate::coordination::shares::{MemoryShares, ShareExchange};

    let exchange: Arc<dyn ShareExchange> = Arc::new(MemoryShares::default());
    let tenants = Tenants::new(
        ["greedy", "modest"]
            .map(|name| Tenant {
                name: name.into(),
                weight: 1,
                quota: Default::default(),
            })
            .to_vec(),
    )
    .unwrap();
    let fair = FairPolicy { mode, ..enforced() };
    move |i| {
        Some(QueueFairness::new(FairParts {
            queue: QueueName::parse("requests").unwrap(),
            tenants: tenants.clone(),
            policy: fair,
            quotas: None,
            exchange: Some(Place {
                exchange: Arc::clone(&exchange),
                key: format!("{KEY}:tenants"),
                replica: format!("replica-{i}"),
            }),
        }))
    }
}

/// Consumers taking the oldest message every 20 ms (50 a second), until aborted.
fn consume_every_20_ms(broker: &Arc<Broker>) -> tokio::task::JoinHandle<()> {
    let broker = Arc::clone(broker);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut stored = broker.stored.lock();
            if !stored.is_empty() {
                stored.remove(0);
            }
        }
    })
}

/// Two replicas of a queue (ceiling 40, consumers taking one message every 20 ms), with
/// tenants sharing its room by the fleet's counts: a greedy tenant sends every 5 ms to
/// both replicas, a modest one 10 a second to one. What fraction of the modest tenant's
/// sends were admitted, the most the queue held, and the greedy tenant's refusals at its
/// share.
async fn greedy_spread_beside_modest(
    mode: crate::admission::fair::share::ShareMode,
) -> (f64, u64, u64) {
    use crate::admission::fair::Asker;
    use crate::admission::tenants::{Criticality, TenantIndex};

    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let mut p = policy(40, false);
    p.ttl = Duration::from_millis(250);
    let all = start_with(2, &ledger, &broker, p, greedy_and_modest(mode));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let consumer = consume_every_20_ms(&broker);
    let asker = |tenant| Asker {
        tenant: TenantIndex(tenant),
        criticality: Criticality::Default,
    };
    let (mut modest_sent, mut modest_admitted, mut greedy_share_refused, mut most) = (0, 0, 0, 0);
    let mut share_refused_on = [0u64; 2];
    let end = Instant::now() + Duration::from_secs(20);
    let mut step = 0u64;
    while Instant::now() < end {
        for (i, r) in all.iter().enumerate() {
            match r.gate.admit_units_for(asker(0), 1).await {
                Ok(reservation) => {
                    broker.stored.lock().push(Instant::now());
                    reservation.finish(BacklogEffect::Stored);
                }
                Err(Refusal::TenantShare { .. }) => {
                    greedy_share_refused += 1;
                    share_refused_on[i] += 1;
                }
                Err(_) => {}
            }
        }
        if step.is_multiple_of(20) {
            modest_sent += 1;
            if let Ok(reservation) = all[1].gate.admit_units_for(asker(1), 1).await {
                broker.stored.lock().push(Instant::now());
                reservation.finish(BacklogEffect::Stored);
                modest_admitted += 1;
            }
        }
        most = most.max(broker.stored());
        step += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    consumer.abort();
    // The fleet's decisions are in each replica's tally: replica 0 saw the greedy tenant
    // only, and counted each of its sends once, by how it was answered.
    let tally = all[0].gate.fairness().unwrap().counts();
    assert_eq!(tally.len(), 1, "only the greedy tenant asked replica 0");
    let greedy = tally[0].total;
    assert_eq!(
        greedy.refused(crate::admission::fair::tally::Reason::TenantShare),
        share_refused_on[0]
    );
    assert!(greedy.admitted > 0);
    (
        modest_admitted as f64 / modest_sent as f64,
        most,
        greedy_share_refused,
    )
}

#[tokio::test(start_paused = true)]
async fn a_tenant_spread_over_the_fleet_leaves_a_modest_one_its_sends() {
    use crate::admission::fair::share::ShareMode;
    let (modest, most, greedy_refused) = greedy_spread_beside_modest(ShareMode::Enforce).await;
    eprintln!("fleet of 2, shares enforced: the modest tenant got {modest:.3} of its sends");
    // One process gets 0.987 (share/tests.rs): here each replica sees the room the other
    // took only at its next reply (docs/fairness.md, "In a fleet").
    assert!(
        modest >= 0.85,
        "the modest tenant got {modest:.3} of its sends"
    );
    assert!(greedy_refused > 0);
    assert!(most <= 40, "the ceiling held: at most {most}");
    // The same fleet without the rule: the greedy tenant takes the room first.
    let (modest, most, greedy_refused) = greedy_spread_beside_modest(ShareMode::Off).await;
    eprintln!("fleet of 2, shares off: the modest tenant got {modest:.3} of its sends");
    assert!(
        modest < 0.5,
        "without shares the modest tenant got {modest:.3}"
    );
    assert_eq!(greedy_refused, 0);
    assert!(most <= 40);
}

/// The judge runs before the seat, so a send it refuses never makes the seat read: judged
/// by a view whose read has aged past the TTL, a replica that only gets sends the cut
/// refuses would refuse them by that old backlog for as long as they come, however far
/// the queue has drained.
#[tokio::test(start_paused = true)]
async fn sheddable_sends_are_judged_by_a_fresh_read_not_the_last_one_seen() {
    use crate::admission::fair::Asker;
    use crate::admission::tenants::{Criticality, TenantIndex};

    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas_with(1, &ledger, &broker, policy(40, false), |_| {
        Some(open_fairness(None))
    })
    .await;
    // The queue fills to 36 of 40 and a read shows it.
    while broker.stored() < 36 {
        send(&all[0], &broker).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    send(&all[0], &broker).await.unwrap();
    // Then the consumers take everything; only sheddable sends come, one every 100 ms.
    broker.stored.lock().clear();
    let sheddable = Asker {
        tenant: TenantIndex(0),
        criticality: Criticality::Sheddable,
    };
    let mut admitted = 0;
    for _ in 0..50 {
        if let Ok(reservation) = all[0].gate.admit_units_for(sheddable, 1).await {
            broker.stored.lock().push(Instant::now());
            reservation.finish(BacklogEffect::Stored);
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An empty queue of 40 takes 32 sheddable sends (a read between a send's store and its
    // settle counts it twice: the safe side).
    assert!(
        (30..=32).contains(&admitted),
        "{admitted} sheddable sends admitted into the drained queue"
    );
    assert!(broker.stored() <= 40);
}

/// A send the seat refuses gives back only the quota the judge took: judged by no good
/// read, the judge takes none, and a tenant refused `503` while the admin plane is down
/// must not come back with its bucket refilled by those refusals.
#[tokio::test(start_paused = true)]
async fn a_seat_refusal_gives_back_no_quota_the_judge_did_not_take() {
    use crate::admission::fair::quota::{QueueQuotas, RateBook};
    use crate::admission::fair::Asker;
    use crate::admission::tenants::{Criticality, Quota, QuotaKind, Rate, TenantIndex};

    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    // Two units at once, then one every 100 s: nothing refills within the test.
    let quota = [Quota {
        rate: Rate::new(0.01, Some(2)),
        max_share: None,
    }];
    let rates = Arc::new(RateBook::new(&quota, Instant::now()));
    let all = replicas_with(1, &ledger, &broker, policy(40, true), |_| {
        let quotas = QueueQuotas::new(&quota, Arc::clone(&rates));
        Some(open_fairness(Some(quotas)))
    })
    .await;
    let gate = &all[0].gate;
    let asker = Asker {
        tenant: TenantIndex(0),
        criticality: Criticality::Default,
    };
    let send = || async {
        let reservation = gate.admit_units_for(asker, 1).await?;
        broker.stored.lock().push(Instant::now());
        reservation.finish(BacklogEffect::Stored);
        Ok::<(), Refusal>(())
    };
    // A first read (that send is judged by none, so it takes no quota), then the burst.
    send().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    send().await.unwrap();
    send().await.unwrap();
    assert!(matches!(
        send().await,
        Err(Refusal::TenantQuota {
            quota: QuotaKind::Rate,
            ..
        })
    ));
    // The admin plane goes down: with no good read the judge is not asked, and the seat
    // refuses every send (fail-closed at a streak of 1).
    broker.set_down(true);
    let mut unknown = 0;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        unknown += u32::from(matches!(send().await, Err(Refusal::CapacityUnknown { .. })));
    }
    assert!(unknown >= 3, "{unknown} sends refused 503");
    broker.set_down(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The first send makes a good read again, judged by none (contract section 2: no
    // backlog to judge by, no quota asked); after it, the bucket is as empty as before.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(send().await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        answers[1..].iter().all(|a| matches!(
            a,
            Err(Refusal::TenantQuota {
                quota: QuotaKind::Rate,
                ..
            })
        )),
        "{answers:?}"
    );
}

/// The open mode's one tenant, by the fair policy's defaults, held to `quotas`.
fn open_fairness(quotas: Option<crate::admission::fair::quota::QueueQuotas>) -> QueueFairness {
    QueueFairness::new(crate::admission::fair::FairParts {
        queue: QueueName::parse("requests").unwrap(),
        tenants: crate::admission::tenants::Tenants::open(),
        policy: enforced(),
        quotas,
        exchange: None,
    })
}

/// The fair policy's defaults, enforced.
fn enforced() -> crate::admission::fair::FairPolicy {
    crate::admission::fair::FairPolicy {
        mode: crate::admission::fair::share::ShareMode::Enforce,
        share_at: Fraction::new(0.9).unwrap(),
        shed_at_sheddable: Fraction::new(0.8).unwrap(),
        shed_at_default: Fraction::ONE,
    }
}

/// What one tenant's senders got in [`issue_scenario`].
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    sent: u64,
    admitted: u64,
    at_ceiling: u64,
    for_share: u64,
}

/// Issue 25's scenario on `n` replicas of a queue (ceiling 40, consumers taking one
/// message every 20 ms, reads a TTL apart), concurrently, as the benchmark runs it: a
/// greedy tenant's 4 senders per replica each send again at once after a 201 and 20 ms
/// after a refusal; a modest tenant sends 10 a second to the last replica. Each Redis call
/// answers 1 ms late, and a store takes 2 ms. What each tenant got, and the most the queue
/// held.
async fn issue_scenario(
    n: usize,
    mode: crate::admission::fair::share::ShareMode,
    seconds: u64,
) -> (Sent, Sent, u64) {
    use crate::admission::fair::Asker;
    use crate::admission::tenants::{Criticality, TenantIndex};

    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas_with(
        n,
        &ledger,
        &broker,
        policy(40, false),
        greedy_and_modest(mode),
    );
    let all = Arc::new(all.await);
    for r in all.iter() {
        ledger.delay(r.fleet.replica(), Duration::from_millis(1));
    }
    let consumer = consume_every_20_ms(&broker);
    let end = Instant::now() + Duration::from_secs(seconds);
    let one = {
        let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
        move |replica: usize, tenant: u16| {
            let all = Arc::clone(&all);
            let broker = Arc::clone(&broker);
            async move {
                let asker = Asker {
                    tenant: TenantIndex(tenant),
                    criticality: Criticality::Default,
                };
                match all[replica].gate.admit_units_for(asker, 1).await {
                    Ok(reservation) => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        broker.stored.lock().push(Instant::now());
                        reservation.finish(BacklogEffect::Stored);
                        Ok(())
                    }
                    Err(refusal) => Err(refusal),
                }
            }
        }
    };
    let count = |sent: &mut Sent, answer: Result<(), Refusal>| {
        sent.sent += 1;
        match answer {
            Ok(()) => sent.admitted += 1,
            Err(Refusal::TenantShare { .. }) => sent.for_share += 1,
            Err(_) => sent.at_ceiling += 1,
        }
    };
    let mut greedy = Vec::new();
    for replica in 0..n {
        for _ in 0..4 {
            let one = one.clone();
            greedy.push(tokio::spawn(async move {
                let mut sent = Sent::default();
                while Instant::now() < end {
                    let answer = one(replica, 0).await;
                    let refused = answer.is_err();
                    count(&mut sent, answer);
                    if refused {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    } else {
                        tokio::time::sleep(Duration::from_micros(500)).await;
                    }
                }
                sent
            }));
        }
    }
    let mut modest = Sent::default();
    let mut most = 0;
    let mut next = Instant::now();
    while next < end {
        tokio::time::sleep_until(next).await;
        count(&mut modest, one(n - 1, 1).await);
        most = most.max(broker.stored());
        next += Duration::from_millis(100);
    }
    let mut greedy_sent = Sent::default();
    for task in greedy {
        let sent = task.await.unwrap();
        greedy_sent.sent += sent.sent;
        greedy_sent.admitted += sent.admitted;
        greedy_sent.at_ceiling += sent.at_ceiling;
        greedy_sent.for_share += sent.for_share;
    }
    consumer.abort();
    (greedy_sent, modest, most)
}

/// Issue 25's scenario on three replicas sending at once (docs/benchmarks.md, comparison
/// 12): the modest tenant gets its sends though the greedy one's senders on every replica
/// judge by views a reply old, and without the rule it gets almost none.
#[tokio::test(start_paused = true)]
async fn three_replicas_sending_at_once_leave_the_modest_tenant_its_sends() {
    use crate::admission::fair::share::ShareMode;
    let (greedy, modest, most) = issue_scenario(3, ShareMode::Enforce, 30).await;
    let got = modest.admitted as f64 / modest.sent as f64;
    eprintln!("3 replicas, shares enforced: modest {got:.3} {modest:?}, greedy {greedy:?}");
    assert!(got >= 0.9, "the modest tenant got {got:.3} of its sends");
    assert!(greedy.for_share > 0 && greedy.admitted > 0);
    assert!(most <= 40, "the ceiling held: at most {most}");
    let shared = greedy.admitted + modest.admitted;
    let (greedy, modest, most) = issue_scenario(3, ShareMode::Off, 30).await;
    let got = modest.admitted as f64 / modest.sent as f64;
    eprintln!("3 replicas, shares off: modest {got:.3} {modest:?}, greedy {greedy:?}");
    assert!(got < 0.5, "without shares the modest tenant got {got:.3}");
    assert!(most <= 40);
    // What the rule costs the queue's consumers. The rule off admits about what they take
    // (50 a second). With it each replica's judge shares out its part of the room,
    // ⌊(L − E)/N⌋, and keeps back what the others are owed: the fleet reads again once
    // that part is within a tenth of the ceiling, so the room consumers make shows before
    // the queue runs dry. 0.99 of the rule off, measured; 0.89 when the fleet read again
    // only within a tenth of the whole ceiling (0.73 when a queue shared by weight was read
    // only once per TTL).
    let unshared = greedy.admitted + modest.admitted;
    eprintln!("{shared} admitted with shares, {unshared} without");
    assert!(unshared >= 48 * 30, "{unshared} admitted without shares");
    assert!(
        shared as f64 >= 0.97 * unshared as f64,
        "{shared} admitted with shares, {unshared} without"
    );
}

/// A fleet of one, its greedy senders judged while others' reservations are on the wire:
/// the judge counts the units it admitted that the seat has not answered, which no view
/// shows yet (0.91 without: concurrent sends judged by one view took the owed room).
#[tokio::test(start_paused = true)]
async fn sends_the_seat_has_not_answered_count_in_the_judges_estimate() {
    use crate::admission::fair::share::ShareMode;
    let (_, modest, most) = issue_scenario(1, ShareMode::Enforce, 30).await;
    let got = modest.admitted as f64 / modest.sent as f64;
    assert!(got >= 0.95, "the modest tenant got {got:.3} of its sends");
    assert!(most <= 40);
}

/// Read again at the ceiling on one replica, the modest tenant still gets its sends: the
/// TTL's read settles the replica's outcomes first, so it does not count a send stored and
/// not yet settled twice (in the read and in its block), which took the unit kept for it
/// at each round's start (0.927 without).
#[tokio::test(start_paused = true)]
async fn reads_again_at_the_ceiling_leave_a_modest_tenant_its_sends() {
    use crate::admission::fair::share::ShareMode;
    let (_, modest, most) = issue_scenario(1, ShareMode::Enforce, 30).await;
    let got = modest.admitted as f64 / modest.sent as f64;
    assert!(got >= 0.95, "the modest tenant got {got:.3} of its sends");
    assert!(most <= 40);
}

/// A replica's gate primed at start-up, before its fleet has answered, waits for it (up to
/// a connection's deadline) and primes through the seat: a send right after start-up
/// finds it in the fleet, not cut off (which fails closed with the gate on).
#[tokio::test(start_paused = true)]
async fn priming_before_the_fleet_answers_waits_for_it_to_join() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = start(1, &ledger, &broker, policy(10, true));
    assert!(!all[0].fleet.joined(), "not joined before its first probe");
    let started = Instant::now();
    all[0].gate.prime().await;
    assert!(all[0].fleet.joined(), "primed only once joined");
    // Joined at the first probe (250 ms): primed then, not at the 1 s deadline.
    let took = started.elapsed();
    assert!(took < Duration::from_millis(500), "primed after {took:?}");
    send(&all[0], &broker).await.expect("admitted in the fleet");
}

/// Issue 39: health shows the fleet's read in force beside the estimate, with its age.
#[tokio::test(start_paused = true)]
async fn the_snapshot_shows_the_fleets_depth_read_beside_its_estimate() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    for _ in 0..5 {
        broker.stored.lock().push(Instant::now());
    }
    let all = replicas(1, &ledger, &broker, policy(50, false)).await;
    for _ in 0..3 {
        send(&all[0], &broker).await.expect("under the ceiling");
    }
    let snapshot = all[0].gate.snapshot();
    let read = snapshot.depth_read.expect("a good read");
    assert_eq!(read.backlog, 5, "{snapshot:?}");
    assert!(
        snapshot.backlog >= Some(8),
        "the estimate counts the sends: {snapshot:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = all[0].gate.snapshot().depth_read.expect("still the read");
    assert!(
        later.age >= read.age + Duration::from_millis(300),
        "{later:?}"
    );
}

/// Each replica paces its own refusals (pacing.rs): it promises its share of the queue's
/// drain, the rate its seat measured over the fleet's size as last seen.
#[tokio::test(start_paused = true)]
async fn a_replica_paces_its_refusals_at_its_share_of_the_fleets_drain() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let fleet = Fleet::start(Arc::new(ledger.clone()), 3);
    let queue = QueueName::parse("requests").unwrap();
    let backend: Arc<dyn Backend> = broker.clone();
    let seat = FleetSeat::new(
        fleet,
        KEY.to_owned(),
        queue,
        PolicyCell::new(policy(50, false)),
        backend,
        SEND,
    );
    assert_eq!(seat.drain_share(), None, "no drain measured");
    {
        let mut state = seat.state.lock();
        state.drain.record(crate::admission::drain::Pair {
            before: 400,
            after: 100,
            read: 100,
            over: Duration::from_secs(1),
        });
        state.fleet_size = 3;
    }
    assert_eq!(seat.drain_share(), Some(100.0));
}

#[path = "conserving_tests.rs"]
mod conserving;

#[path = "concurrent_asks_tests.rs"]
mod concurrent_asks;

/// Cut off and failing closed, a replica logs `send_failclosed` once when it turned local
/// and then once per period, not once per refused send (there are no fleet reads to log
/// once per).
#[tokio::test(start_paused = true)]
async fn cut_off_and_failing_closed_refusals_are_logged_once_per_period() {
    let out = crate::telemetry::Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(out.clone())
        .finish();
    let _logging = crate::telemetry::Captured::install(subscriber);
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(1, &ledger, &broker, policy(60, true)).await;
    ledger.cut_off(all[0].fleet.replica(), true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let end = Instant::now() + Duration::from_secs(25);
    let mut refused = 0;
    while Instant::now() < end {
        assert!(matches!(
            send(&all[0], &broker).await,
            Err(Refusal::CapacityUnknown { .. })
        ));
        refused += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counts: Vec<u64> = out
        .text()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["fields"]["event"] == "send_failclosed")
        .filter_map(|line| line["fields"]["refused_since_last_log"].as_u64())
        .collect();
    // 25 s cut off: the first refusal, then one line per 10 s, each with the count since.
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert_eq!(counts[0], 1);
    // A send takes two ledger deadlines here: ~50 a period.
    assert!(
        counts[1..].iter().all(|n| (45..=55).contains(n)),
        "{counts:?}"
    );
    assert!(
        counts.iter().sum::<u64>() <= refused,
        "{counts:?} of {refused}"
    );
}

/// A Redis slower than its deadline does not serialise a replica's sends: the sends queued
/// behind one whose read's call failed take that failure, rather than each waiting out a
/// deadline of its own in turn (one timeout apart, past a connection's safety limit).
#[tokio::test(start_paused = true)]
async fn sends_queued_behind_a_failed_read_take_its_failure_not_a_deadline_each() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = Arc::new(replicas(1, &ledger, &broker, policy(1_000, true)).await);
    send(&all[0], &broker).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // the read is stale
    ledger.lose_replies(all[0].fleet.replica(), true);
    let started = Instant::now();
    let sending: Vec<_> = (0..30)
        .map(|_| {
            let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
            tokio::spawn(async move {
                let answer = send(&all[0], &broker).await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for sent in sending {
        let (answer, took) = sent.await.unwrap();
        assert!(
            matches!(answer, Err(Refusal::CapacityUnknown { .. })),
            "{answer:?}"
        );
        slowest = slowest.max(took);
    }
    assert!(
        slowest <= T * 6,
        "the last of 30 was answered after {slowest:?}"
    );
}

/// Review (issue 39, item 3): with the share round frozen at the ceiling (reads again at
/// the ceiling keep the TTL's paced reads from coming), a tenant's counts never roll: one
/// that was greedy a while ago stays behind the other for as long as the fleet sits at the
/// ceiling, though it now asks far less than its half. Two tenants of equal weight, a
/// ceiling of 40 drained at 50/s: tenant 0 greedy for 5 s, then tenant 1 greedy while
/// tenant 0 sends 10 a second (a fifth of the drain, under its half of it).
#[tokio::test(start_paused = true)]
async fn a_tenant_greedy_earlier_gets_its_modest_sends_once_the_round_rolls() {
    use crate::admission::fair::share::ShareMode;
    use crate::admission::fair::Asker;
    use crate::admission::tenants::{Criticality, TenantIndex};

    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let mut p = policy(40, false);
    p.ttl = Duration::from_millis(250);
    let all = start_with(
        2,
        &ledger,
        &broker,
        p,
        greedy_and_modest(ShareMode::Enforce),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let consumer = consume_every_20_ms(&broker);
    let asker = |tenant| Asker {
        tenant: TenantIndex(tenant),
        criticality: Criticality::Default,
    };
    let round_at_start = all[0].gate.seat.as_ref().unwrap().share_round();
    let mut most = 0;
    let mut step = 0u64;
    let (mut sent, mut admitted) = (0u64, 0u64);
    let switch = Instant::now() + Duration::from_secs(5);
    let end = switch + Duration::from_secs(5);
    while Instant::now() < end {
        let (greedy, modest) = if Instant::now() < switch {
            (0, 1)
        } else {
            (1, 0)
        };
        for r in &all {
            if let Ok(reservation) = r.gate.admit_units_for(asker(greedy), 1).await {
                broker.stored.lock().push(Instant::now());
                reservation.finish(BacklogEffect::Stored);
            }
        }
        if Instant::now() >= switch && step.is_multiple_of(20) {
            sent += 1;
            if let Ok(reservation) = all[1].gate.admit_units_for(asker(modest), 1).await {
                broker.stored.lock().push(Instant::now());
                reservation.finish(BacklogEffect::Stored);
                admitted += 1;
            }
        }
        most = most.max(broker.stored());
        step += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    consumer.abort();
    assert!(most <= 40, "the ceiling held: at most {most}");
    let rounds = all[0].gate.seat.as_ref().unwrap().share_round() - round_at_start;
    assert!(rounds >= 8, "the share round rolled {rounds} times in 10 s");
    // Measured 0.80 with reads again at the ceiling and without them (c42e869): what the
    // greedy spell left it carrying costs it a fifth of its sends for a while (issue 39's
    // note); frozen rounds gave it none.
    let got = admitted as f64 / sent as f64;
    assert!(
        got >= 0.75,
        "tenant 0, now modest, got {got:.3} of its sends ({admitted} of {sent}); {rounds} \
         share rounds in 10 s of a 250 ms TTL"
    );
}

/// A read at the ceiling is made only near it: a send ending with the fleet's estimate
/// within a tenth of the ceiling starts one (once the read is an interval old); one ending
/// further from it leaves the TTL's reads alone. In a fleet of `N`, near is a replica's
/// part of the room, `⌊(L − E)/N⌋`, within a tenth of the ceiling, and never more than
/// half the ceiling free.
#[tokio::test(start_paused = true)]
async fn only_sends_within_a_tenth_of_the_ceiling_read_again() {
    let apart = Duration::from_millis(100);
    assert_eq!(
        reads_while_sending_at(1, 50, apart).await,
        0,
        "far from the ceiling"
    );
    let near = reads_while_sending_at(1, 92, apart).await;
    // One per send: each comes a ceiling-read interval (a settle's period, 100 ms) after
    // the read before, as soon as one is due.
    assert_eq!(near, 8, "reads within a tenth of the ceiling");
    // Sends 10 ms apart: reads come no faster than their interval (at least a settle's
    // period, 100 ms), not one per send.
    let close = reads_while_sending_at(1, 92, Duration::from_millis(10)).await;
    assert!((1..=2).contains(&close), "{close} reads in 80 ms of sends");
}

/// Three replicas: each judges by a third of the room, so sends ending with 70 of 100 held
/// (a part of about 9) read again and ones with 56 (about 14) do not. Ten replicas: 50
/// held (half the ceiling free) read again; 36 (a part of about 6, but more than half the
/// ceiling free) do not. (The block a send reserves counts too, so the part is about.)
#[tokio::test(start_paused = true)]
async fn in_a_fleet_a_replicas_part_of_the_room_near_a_tenth_of_the_ceiling_reads_again() {
    let apart = Duration::from_millis(100);
    assert_eq!(reads_while_sending_at(3, 70, apart).await, 8, "a part of 9");
    assert_eq!(
        reads_while_sending_at(3, 56, apart).await,
        0,
        "a part of 14"
    );
    assert_eq!(reads_while_sending_at(10, 50, apart).await, 8, "half free");
    assert_eq!(
        reads_while_sending_at(10, 36, apart).await,
        0,
        "past half free"
    );
}

/// Near the ceiling's edges, exactly: a part of `⌊(L − E)/N⌋` up to a tenth of the ceiling
/// (at least 1), with at most half of it free.
#[test]
fn near_the_ceiling_is_a_replicas_part_within_a_tenth_and_at_most_half_free() {
    use super::read::near_ceiling;
    assert!(
        near_ceiling(90, 100, 1),
        "alone: the estimate within a tenth"
    );
    assert!(!near_ceiling(89, 100, 1));
    assert!(near_ceiling(69, 100, 3), "⌊31/3⌋ = 10");
    assert!(!near_ceiling(67, 100, 3), "⌊33/3⌋ = 11");
    assert!(near_ceiling(50, 100, 10), "half free, a part of 5");
    assert!(!near_ceiling(49, 100, 10), "past half free");
    assert!(
        near_ceiling(90, 100, 0),
        "no replicas heard of counts as one"
    );
    assert!(near_ceiling(4, 5, 1), "a tenth of a small ceiling is one");
    assert!(!near_ceiling(3, 5, 1));
    assert!(
        near_ceiling(0, 1, 1),
        "a ceiling of 1 with its one place free: within a tenth (one), as before"
    );
    assert!(near_ceiling(120, 100, 3), "over the ceiling");
}

/// Depth reads made during 8 sends `apart` through the first of `n` replicas, the queue
/// holding `held` of 100 (the sends leave it as they came).
async fn reads_while_sending_at(n: usize, held: usize, apart: Duration) -> u64 {
    use std::sync::atomic::Ordering::SeqCst;
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    broker.stored.lock().extend(vec![Instant::now(); held]);
    let all = replicas(n, &ledger, &broker, policy(100, false)).await;
    send(&all[0], &broker).await.expect("room");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = broker.reads.load(SeqCst);
    for _ in 0..8 {
        send(&all[0], &broker).await.expect("room");
        // The sends leave the queue as they came: the estimate stays where it is.
        broker.stored.lock().pop();
        tokio::time::sleep(apart).await;
    }
    broker.reads.load(SeqCst) - before
}
