//! Work conservation in the fleet on the paused clock: at the ceiling the fleet reads again
//! sooner than the TTL, so room consumers make shows while sends are being refused, and
//! those reads move nothing but the depth (docs/fleet.md, step 4).

use std::time::Duration;

use tokio::time::Instant;

use super::*;

/// Sends from every replica in turn every `every` for `span`, checking the queue never
/// holds more than `limit`: how many were admitted.
async fn offer(
    all: &[Replica],
    broker: &Broker,
    limit: u64,
    every: Duration,
    span: Duration,
) -> u64 {
    let end = Instant::now() + span;
    let mut admitted = 0;
    while Instant::now() < end {
        for r in all {
            if send(r, broker).await.is_ok() {
                admitted += 1;
            }
            assert!(
                broker.stored() <= limit,
                "over the ceiling: {}",
                broker.stored()
            );
        }
        tokio::time::sleep(every).await;
    }
    admitted
}

fn seat(r: &Replica) -> &Arc<FleetSeat> {
    r.gate.seat.as_ref().expect("in a fleet")
}

/// Consumers empty a full queue just after the TTL's read: the room shows within a few
/// ceiling-read intervals, not at the TTL's next read, and fills to the ceiling again.
#[tokio::test(start_paused = true)]
async fn at_the_ceiling_room_consumers_make_shows_before_the_ttls_next_read() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(2, &ledger, &broker, policy(20, false)).await;
    fill(&all, &broker, 25).await; // past the new epoch's grace, to the ceiling
    assert_eq!(broker.stored(), 20, "full");
    broker.drain();
    let admitted = offer(
        &all,
        &broker,
        20,
        Duration::from_millis(5),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(
        admitted, 20,
        "the emptied queue filled again within 0.3 s of a 1 s TTL"
    );
}

/// Reads at the ceiling freshen the depth only: the share round (which counts the TTL's
/// reads) and the streak stay as they were.
#[tokio::test(start_paused = true)]
async fn reads_at_the_ceiling_move_no_share_round_nor_streak() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let mut p = policy(20, false);
    p.ttl = Duration::from_secs(10);
    let all = replicas(2, &ledger, &broker, p).await;
    fill(&all, &broker, 25).await; // past the new epoch's grace, to the ceiling
    let round = seat(&all[0]).share_round();
    let generation = seat(&all[0]).read_generation();
    for _ in 0..5 {
        broker.drain();
        offer(
            &all,
            &broker,
            20,
            Duration::from_millis(20),
            Duration::from_millis(200),
        )
        .await;
    }
    let reads = seat(&all[0]).read_generation() - generation;
    assert!(reads >= 5, "read again at the ceiling: {reads} reads");
    assert_eq!(seat(&all[0]).share_round(), round);
    assert_eq!(seat(&all[1]).share_round(), round);
    assert_eq!(seat(&all[0]).snapshot().unwrap().consecutive_failures, 0);
}

/// A read at the ceiling that fails leaves the fleet's read standing (no unknown depth, no
/// streak) and none is made again before the TTL's next read.
#[tokio::test(start_paused = true)]
async fn a_failed_read_at_the_ceiling_leaves_the_read_standing_until_the_ttls_next() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let mut p = policy(20, true);
    p.ttl = Duration::from_secs(2);
    let all = replicas(1, &ledger, &broker, p).await;
    fill(&all, &broker, 25).await; // past the new epoch's grace, to the ceiling
    assert_eq!(broker.stored(), 20);
    broker.set_down(true);
    let (_, failed_before) = seat(&all[0]).own_reads();
    offer(
        &all,
        &broker,
        20,
        Duration::from_millis(10),
        Duration::from_millis(800),
    )
    .await;
    let (_, failed) = seat(&all[0]).own_reads();
    assert_eq!(
        failed - failed_before,
        1,
        "one failed read at the ceiling, then none"
    );
    let snapshot = seat(&all[0]).snapshot().unwrap();
    assert_eq!(snapshot.consecutive_failures, 0);
    assert_eq!(snapshot.backlog, Some(20), "the last good read stands");
    let refusal = send(&all[0], &broker).await.unwrap_err();
    assert!(matches!(refusal, Refusal::QueueFull { .. }), "{refusal:?}");
}

/// Far from the ceiling no read is made but the TTL's.
#[tokio::test(start_paused = true)]
async fn far_from_the_ceiling_only_the_ttls_reads_are_made() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(2, &ledger, &broker, policy(1_000, false)).await;
    fill(&all, &broker, 5).await;
    let generation = seat(&all[0]).read_generation();
    offer(
        &all,
        &broker,
        1_000,
        Duration::from_millis(5),
        Duration::from_millis(500),
    )
    .await;
    assert!(broker.stored() > 100);
    assert!(seat(&all[0]).read_generation() - generation <= 1);
}

/// Review (issue 39, item 3): reads again at the ceiling keep the fleet's read younger than
/// the TTL, so while the fleet sits at the ceiling the TTL's own read is never due and
/// `paced` (the share rounds, the once-per-paced-read logs) stops. docs/fleet.md step 4
/// says the share rounds count the TTL's reads: they must still come once per TTL.
#[tokio::test(start_paused = true)]
async fn at_the_ceiling_the_ttls_paced_reads_still_come_once_per_ttl() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = replicas(2, &ledger, &broker, policy(20, false)).await; // TTL 1 s
    fill(&all, &broker, 25).await; // past the new epoch's grace, to the ceiling
    assert_eq!(broker.stored(), 20, "full");
    let paced = seat(&all[0]).paced_reads();
    let generation = seat(&all[0]).read_generation();
    // 5 s at the ceiling, sends refused queue_full all along: 5 TTLs.
    offer(
        &all,
        &broker,
        20,
        Duration::from_millis(20),
        Duration::from_secs(5),
    )
    .await;
    let reads = seat(&all[0]).read_generation() - generation;
    let paced_now = seat(&all[0]).paced_reads() - paced;
    assert!(
        paced_now >= 3,
        "5 TTLs at the ceiling: {paced_now} paced reads (of {reads} reads); the share \
         round stays at {}",
        seat(&all[0]).share_round()
    );
}

/// Sends that waited out a new fleet's grace ask at once when it ends. Asking at once they
/// split a share of the room, and one told full takes a unit a sibling's grant left, so
/// the burst fills the empty queue to within what the replicas' first asks hold unused
/// (each took a whole share: 25 admitted of 50 when every ask took one).
#[tokio::test(start_paused = true)]
async fn a_burst_at_the_end_of_the_grace_fills_the_empty_queue_near_its_ceiling() {
    let ledger = MemoryLedger::new(T);
    let broker = Broker::new(Duration::ZERO);
    let all = Arc::new(replicas(3, &ledger, &broker, policy(50, false)).await);
    for r in all.iter() {
        ledger.delay(r.fleet.replica(), Duration::from_millis(2));
    }
    let admitted = admitted_of(burst(&all, &broker, 66)).await;
    assert_eq!(admitted, broker.stored());
    assert!(
        (44..=50).contains(&admitted),
        "{admitted} of an empty queue's ceiling of 50"
    );
}
