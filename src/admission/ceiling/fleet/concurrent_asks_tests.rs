//! Reservations out at once on one replica (docs/fleet.md steps 1 and 2): they split a
//! share of the room, a send told full takes a unit a sibling's grant left, and neither
//! passes a ceiling, leaks the count, nor slows sends far from the ceiling.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn seat_of(r: &Replica) -> &Arc<FleetSeat> {
    r.gate.seat.as_ref().expect("in a fleet")
}

/// How many reservations the seat counts out now (a probe: one more started and dropped).
fn out_now(r: &Replica) -> u64 {
    seat_of(r).outstanding.start().others()
}

/// A send whose admit future is dropped while its reservation is out (a client gone, a
/// timeout around the handler) does not leave the count high: the next lone send asks for
/// a whole eighth again.
#[tokio::test(start_paused = true)]
async fn a_cancelled_send_leaves_no_reservation_counted_out() {
    let recording = Recording::new();
    let broker = Broker::new(Duration::ZERO);
    let r = Arc::new(recorded_replica(&recording, &broker, policy(1_000, false)).await);
    send(&r, &broker).await.unwrap(); // past the grace
    tokio::time::sleep(Duration::from_secs(1)).await; // its block's use is over
    *recording.reserve_runs_after.lock() = Duration::from_millis(50);
    let sends: Vec<_> = (0..5)
        .map(|_| {
            let (r, broker) = (Arc::clone(&r), Arc::clone(&broker));
            tokio::spawn(async move { send(&r, &broker).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(out_now(&r), 5, "five out");
    for s in &sends {
        s.abort();
    }
    for s in sends {
        assert!(s.await.unwrap_err().is_cancelled());
    }
    assert_eq!(out_now(&r), 0, "none counted out once they were dropped");
    *recording.reserve_runs_after.lock() = Duration::ZERO;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let from = recording.asks.lock().len();
    send(&r, &broker).await.unwrap();
    let asks = recording.asks.lock()[from..].to_vec();
    assert_eq!(asks, vec![(128, 8)], "a lone send divides by 8");
}

/// Sends out at once on one replica ask with divisors 8, 16, 24, ...; none is 0 or
/// overflows, and a batch among them keeps divisor 1.
#[tokio::test(start_paused = true)]
async fn asks_out_at_once_divide_by_eight_per_ask_out_and_a_batch_by_one() {
    let recording = Recording::new();
    let broker = Broker::new(Duration::ZERO);
    let r = Arc::new(recorded_replica(&recording, &broker, policy(100_000, false)).await);
    send(&r, &broker).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    *recording.reserve_runs_after.lock() = Duration::from_millis(5);
    let from = recording.asks.lock().len();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (r, broker) = (Arc::clone(&r), Arc::clone(&broker));
        tasks.push(tokio::spawn(async move {
            if i == 3 {
                send_units(&r, &broker, 5).await
            } else {
                send(&r, &broker).await
            }
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let asks = recording.asks.lock()[from..].to_vec();
    assert_eq!(asks.len(), 6, "{asks:?}");
    assert_eq!(asks.iter().filter(|a| *a == &(5, 1)).count(), 1, "{asks:?}");
    let mut singles: Vec<u64> = asks.iter().filter(|a| a.0 == 128).map(|a| a.1).collect();
    singles.sort_unstable();
    singles.dedup();
    assert_eq!(singles.len(), 5, "{asks:?}");
    assert!(
        singles.iter().all(|d| d % 8 == 0 && (8..=48).contains(d)),
        "{asks:?}"
    );
}

/// A ceiling lowered on every replica while a burst's reservations are out: nothing is
/// admitted past the lower one (grants given back, told-full sends take only units of
/// blocks granted under a ceiling no higher than the one in force).
#[tokio::test(start_paused = true)]
async fn a_ceiling_lowered_while_a_bursts_asks_are_out_is_kept() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = Arc::new(replicas(3, &ledger, &broker, policy(50, false)).await);
    fill(&all, &broker, 1).await; // past the grace: 3 stored
    tokio::time::sleep(Duration::from_secs(1)).await;
    for r in all.iter() {
        ledger.delay(r.fleet.replica(), Duration::from_millis(2));
    }
    let sends = burst(&all, &broker, 66);
    tokio::time::sleep(Duration::from_millis(1)).await;
    for r in all.iter() {
        lower_ceiling(r, 20);
    }
    let admitted = 3 + admitted_of(sends).await;
    assert_eq!(admitted, broker.stored());
    assert!(
        broker.stored() <= 20,
        "{} past the lowered 20",
        broker.stored()
    );
}

/// A burst of singles beside batches, at once on three replicas near the ceiling: never
/// past it, and every admission stored.
#[tokio::test(start_paused = true)]
async fn a_burst_of_singles_beside_batches_keeps_the_ceiling() {
    for delay_ms in [1u64, 2, 3, 7] {
        let ledger = MemoryLedger::new(T);
        let broker = Broker::new(Duration::ZERO);
        let all = Arc::new(replicas(3, &ledger, &broker, policy(50, false)).await);
        for (i, r) in all.iter().enumerate() {
            ledger.delay(
                r.fleet.replica(),
                Duration::from_millis(delay_ms + i as u64),
            );
        }
        let sends: Vec<_> = (0..90)
            .map(|i| {
                let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
                tokio::spawn(async move {
                    let r = &all[i % 3];
                    if i % 10 == 4 {
                        send_units(r, &broker, 4).await.map(|()| 4)
                    } else {
                        send(r, &broker).await.map(|()| 1)
                    }
                })
            })
            .collect();
        let mut admitted = 0;
        for s in sends {
            admitted += s.await.unwrap().unwrap_or(0);
        }
        assert_eq!(admitted, broker.stored());
        assert!(broker.stored() <= 50, "{} of 50", broker.stored());
    }
}

/// Two replicas past the grace and their warm-up blocks (used up, their leftovers given
/// back), the ceiling 40 with hysteresis down to half and a TTL of 5 s.
async fn two_replicas_with_hysteresis(
    ledger: &MemoryLedger,
    broker: &Arc<Broker>,
) -> Arc<Vec<Replica>> {
    let mut p = policy(40, false);
    p.resume_below = Fraction::new(0.5).unwrap();
    p.ttl = Duration::from_secs(5);
    let all = Arc::new(replicas(2, ledger, broker, p).await);
    fill(&all, broker, 1).await; // past the grace
    tokio::time::sleep(Duration::from_millis(600)).await; // the warm-up blocks' use is over
    fill(&all, broker, 1).await; // their leftovers given back
    tokio::time::sleep(Duration::from_millis(600)).await;
    all
}

/// Replica `i` takes every unit the fleet has left with one batch.
async fn take_the_room(all: &[Replica], ledger: &MemoryLedger, broker: &Broker, i: usize) {
    let queue = QueueRef {
        key: KEY,
        terms: seat_of(&all[i]).terms(),
    };
    let view = ledger.look(queue).await.unwrap().unwrap();
    let room = 40 - view.estimate().unwrap();
    assert!(room > 0);
    send_units(&all[i], broker, room).await.unwrap();
}

/// Sends on `r` until one is refused `queue_full`: how many were admitted first.
async fn admitted_until_full(r: &Replica, broker: &Broker) -> u64 {
    let mut admitted = 0;
    loop {
        match send(r, broker).await {
            Ok(()) => admitted += 1,
            Err(Refusal::QueueFull { .. }) => return admitted,
            Err(other) => panic!("{other:?}"),
        }
        assert!(admitted < 40);
    }
}

/// With hysteresis on, a send told full that takes a unit a sibling's grant left: the seat
/// is refusing with the fleet's "full" cached, hands out the rest of that block (as any
/// send that finds a unit does) and then refuses until the queue is back at the resume
/// level.
#[tokio::test(start_paused = true)]
async fn told_full_taking_a_siblings_unit_leaves_the_seat_refusing_under_hysteresis() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = two_replicas_with_hysteresis(&ledger, &broker).await;
    ledger.delay(all[0].fleet.replica(), Duration::from_millis(5));
    // A: its step runs now, its reply comes at 5 ms.
    let send_on_0 = || {
        let (all, broker) = (Arc::clone(&all), Arc::clone(&broker));
        tokio::spawn(async move { send(&all[0], &broker).await })
    };
    let a = send_on_0();
    tokio::time::sleep(Duration::from_millis(1)).await;
    take_the_room(&all, &ledger, &broker, 1).await;
    // B on replica 0: told full (A's block is in the estimate), its reply at 6 ms, after A's.
    let b = send_on_0();
    a.await.unwrap().unwrap();
    assert_eq!(b.await.unwrap(), Ok(()), "B took a unit A's grant left");
    {
        let state = seat_of(&all[0]).state.lock();
        assert_eq!(state.mode, Mode::Refusing);
        assert!(state.full.is_some());
    }
    admitted_until_full(&all[0], &broker).await; // the rest of A's block
    assert!(broker.stored() <= 40, "{}", broker.stored());
    // Half drained: still above the resume level (20), still refused after a new read.
    let keep: Vec<Instant> = broker.stored.lock().iter().take(25).copied().collect();
    *broker.stored.lock() = keep;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(matches!(
        send(&all[0], &broker).await,
        Err(Refusal::QueueFull { .. })
    ));
    let before = seat_of(&all[0]).snapshot().unwrap();
    assert!(before.refusing_until_backlog.is_some(), "{before:?}");
}

/// Far from the ceiling (10,000, the queue a fifth full) a replica taking 10 sends a
/// millisecond over a Redis 2 ms away: only the first burst waits for a reservation. A
/// split ask's grant is small by design, so it must not mark the replica near the ceiling
/// (which stops the next block being asked for ahead): it did, and 45 sends waited.
#[tokio::test(start_paused = true)]
async fn far_from_the_ceiling_a_busy_replica_waits_for_redis_only_once() {
    let recording = Recording::new();
    let broker = Broker::new(Duration::ZERO);
    let r = Arc::new(recorded_replica(&recording, &broker, policy(10_000, false)).await);
    send(&r, &broker).await.unwrap(); // past the grace
    tokio::time::sleep(Duration::from_secs(1)).await;
    *recording.reserve_runs_after.lock() = Duration::from_millis(2);
    let from = *recording.reserves.lock();
    let mut tasks = Vec::new();
    for _ in 0..400 {
        for _ in 0..10 {
            let (r, broker) = (Arc::clone(&r), Arc::clone(&broker));
            tasks.push(tokio::spawn(async move {
                let before = Instant::now();
                send(&r, &broker).await.unwrap();
                Instant::now() > before
            }));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut waited = 0;
    for t in tasks {
        waited += u64::from(t.await.unwrap());
    }
    let reserves = *recording.reserves.lock() - from;
    assert!(
        waited <= 20,
        "{waited} of 4000 sends waited for Redis ({reserves} reservations)"
    );
}
