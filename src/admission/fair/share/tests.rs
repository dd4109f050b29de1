//! The share rule on tokio's paused clock: the book alone, and the book beside a queue
//! whose ceiling, drain and depth reads are simulated (docs/fairness.md's scenarios).

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::admission::tenants::Criticality;

const A: TenantIndex = TenantIndex(0);
const B: TenantIndex = TenantIndex(1);

fn tenant(weight: u32, wants: u64) -> Tenant {
    Tenant {
        weight,
        own: Counts {
            asked_before: wants,
            ..Counts::default()
        },
        ..Tenant::default()
    }
}

#[test]
fn water_filling_gives_a_modest_tenant_its_ask_and_the_rest_by_weight() {
    // Equal weights: 10 wanted of 40 → 10, the other takes the 30 left.
    assert_eq!(
        parts(40, &[tenant(1, 500), tenant(1, 10)]),
        vec![30.0, 10.0]
    );
    // Both over their parts: by weight, 3:1.
    assert_eq!(
        parts(40, &[tenant(3, 500), tenant(1, 500)]),
        vec![30.0, 10.0]
    );
    // Everyone can have its ask: exactly that, the rest is nobody's.
    assert_eq!(parts(40, &[tenant(1, 5), tenant(1, 7)]), vec![5.0, 7.0]);
    // Three tenants, one modest: it is satisfied, the two others share by weight.
    assert_eq!(
        parts(100, &[tenant(1, 10), tenant(2, 1000), tenant(1, 1000)]),
        vec![10.0, 60.0, 30.0]
    );
    // A tenant that wants nothing has no part; nothing offered, no parts.
    assert_eq!(parts(40, &[tenant(1, 0), tenant(1, 100)]), vec![0.0, 40.0]);
    assert_eq!(parts(0, &[tenant(1, 5), tenant(1, 5)]), vec![0.0, 0.0]);
}

#[test]
fn without_contention_every_send_the_ceiling_admits_is_admitted() {
    let mut book = ShareBook::new(&[1, 1]);
    let round = 1;
    for _ in 0..100 {
        let v = book.decide(A, 1, 50, false, ShareMode::Enforce, round);
        assert_eq!(v, Verdict::Admit);
    }
    // B is owed its part only once the queue is contended.
    assert_eq!(
        book.decide(B, 1, 1, false, ShareMode::Enforce, round),
        Verdict::Admit
    );
}

#[test]
fn contended_a_tenant_past_its_part_leaves_the_room_the_other_is_owed() {
    let mut book = ShareBook::new(&[1, 1]);
    let mut round = 1;
    // Round 0: both ask (B 10, A 100): the wants of round 1.
    for _ in 0..10 {
        book.refused_at_ceiling(B, 1, round);
    }
    for _ in 0..100 {
        book.refused_at_ceiling(A, 1, round);
    }
    round += 1;
    // Round 1 opens 40 units: B's part is its 10, A's the other 30.
    let mut room = 40;
    let mut a = 0;
    while room > 0 {
        match book.decide(A, 1, room, true, ShareMode::Enforce, round) {
            Verdict::Admit => {
                a += 1;
                room -= 1;
            }
            Verdict::Refuse { share, room: fits } => {
                assert!((share - 0.75).abs() < 1e-9, "{share}");
                assert_eq!(fits, 0, "all that is left is B's");
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(a, 30, "A stops where B's 10 begin");
    for _ in 0..10 {
        assert_eq!(
            book.decide(B, 1, room, true, ShareMode::Enforce, round),
            Verdict::Admit
        );
        room -= 1;
    }
    assert_eq!(room, 0);
}

#[test]
fn asks_of_an_uncontended_round_make_no_one_owed_the_next_uncontended_one() {
    let mut book = ShareBook::new(&[1, 1]);
    let mut round = 1;
    // Round 0, far from the ceiling: both ask 10, all admitted.
    for t in [A, B] {
        let v = book.decide(t, 10, 100, false, ShareMode::Enforce, round);
        assert_eq!(v, Verdict::Admit);
    }
    round += 1;
    // Round 1, still uncontended: A may take all 10 of the room though B asked 10 before
    // (contended, B would be owed half of it).
    assert_eq!(
        book.decide(A, 10, 10, false, ShareMode::Enforce, round),
        Verdict::Admit
    );
}

#[test]
fn a_round_that_refused_a_tenant_its_share_keeps_the_next_one_contended() {
    let mut book = ShareBook::new(&[1, 1]);
    let mut round = 1;
    book.refused_at_ceiling(A, 100, round);
    book.refused_at_ceiling(B, 10, round);
    round += 1;
    // Round 2: A stops where B's 10 begin; B asks only 9 of them, so the last unit stays
    // B's and no send meets the ceiling this round.
    let mut room = 40;
    while let Verdict::Admit = book.decide(A, 1, room, true, ShareMode::Enforce, round) {
        room -= 1;
    }
    assert_eq!(room, 10);
    for _ in 0..9 {
        assert_eq!(
            book.decide(B, 1, room, true, ShareMode::Enforce, round),
            Verdict::Admit
        );
        room -= 1;
    }
    assert!(matches!(
        book.decide(A, 1, room, true, ShareMode::Enforce, round),
        Verdict::Refuse { .. }
    ));
    round += 1;
    // Round 3 opens 40 again, far from the ceiling: A was refused its share last round, so
    // the queue is still contended and B's 9 are kept for it.
    let mut room = 40;
    while let Verdict::Admit = book.decide(A, 1, room, false, ShareMode::Enforce, round) {
        room -= 1;
    }
    assert_eq!(room, 9, "B's part of round 3 (it asked 9 in round 2)");
}

#[test]
fn room_too_small_for_what_is_owed_is_shared_in_proportion_not_withheld_from_all() {
    let mut book = ShareBook::new(&[1, 1, 1]);
    let mut round = 1;
    for t in [A, B, TenantIndex(2)] {
        book.refused_at_ceiling(t, 10, round);
    }
    round += 1;
    // The third tenant took 6 this round; 2 units are left, A and B are each owed 8/3.
    book.tenants[2].own.admitted = 6;
    // Owed 16/3 against a room of 2: each owed share is scaled by 2 / (16/3), B's to 1,
    // so A may take one unit (unscaled, B's 8/3 would leave A nothing, and B nothing).
    assert_eq!(
        book.decide(A, 1, 2, true, ShareMode::Enforce, round),
        Verdict::Admit
    );
    assert_eq!(
        book.decide(B, 1, 1, true, ShareMode::Enforce, round),
        Verdict::Admit
    );
}

#[test]
fn one_unit_of_room_owed_to_both_goes_to_whoever_asks() {
    let mut book = ShareBook::new(&[1, 1]);
    let mut round = 1;
    book.refused_at_ceiling(A, 5, round);
    book.refused_at_ceiling(B, 5, round);
    round += 1;
    // One unit and each owed half of it: no deadlock, the first asker takes it.
    assert_eq!(
        book.decide(B, 1, 1, true, ShareMode::Enforce, round),
        Verdict::Admit
    );
    let mut book = ShareBook::new(&[1, 1]);
    let mut round = 1;
    book.refused_at_ceiling(A, 5, round);
    book.refused_at_ceiling(B, 5, round);
    round += 1;
    assert_eq!(
        book.decide(A, 1, 1, true, ShareMode::Enforce, round),
        Verdict::Admit
    );
}

#[test]
fn shadow_mode_admits_and_says_what_it_would_refuse_off_says_nothing() {
    for (mode, expected) in [
        (ShareMode::Shadow, Verdict::WouldRefuse { share: 0.5 }),
        (ShareMode::Off, Verdict::Admit),
    ] {
        let mut book = ShareBook::new(&[1, 1]);
        let mut round = 1;
        book.refused_at_ceiling(A, 100, round);
        book.refused_at_ceiling(B, 100, round);
        round += 1;
        // 10 units offered, 5 each: A's sixth would be refused.
        let mut room = 10;
        for _ in 0..5 {
            assert_eq!(book.decide(A, 1, room, true, mode, round), Verdict::Admit);
            room -= 1;
        }
        assert_eq!(book.decide(A, 1, room, true, mode, round), expected);
    }
}

/// A queue behind a local gate, simulated on the paused clock: a ceiling, consumers
/// draining at a steady rate, a depth read every `ttl` (offset from the rounds), the
/// gate's count of its own admissions since the read, and the share book beside it.
struct Queue {
    book: ShareBook,
    limit: u64,
    drain_per_s: f64,
    ttl: Duration,
    next_read: Instant,
    /// Depth reads so far: the book's rounds.
    reads: u64,
    stored: f64,
    read: f64,
    since_read: u64,
    max_seen: f64,
    drained: f64,
}

impl Queue {
    fn new(weights: &[u32], limit: u64, drain_per_s: f64) -> Self {
        let now = Instant::now();
        Self {
            book: ShareBook::new(weights),
            limit,
            drain_per_s,
            ttl: Duration::from_secs(1),
            next_read: now + Duration::from_millis(370),
            reads: 0,
            stored: 0.0,
            read: 0.0,
            since_read: 0,
            max_seen: 0.0,
            drained: 0.0,
        }
    }

    /// The clock moved by `step`: consumers drain, a read falls due.
    fn tick(&mut self, step: Duration) {
        let gone = (self.drain_per_s * step.as_secs_f64()).min(self.stored);
        self.stored -= gone;
        self.drained += gone;
        if Instant::now() >= self.next_read {
            self.read = self.stored;
            self.since_read = 0;
            self.reads += 1;
            self.next_read += self.ttl;
        }
    }

    fn room(&self) -> u64 {
        let estimate = self.read.ceil() as u64 + self.since_read;
        self.limit.saturating_sub(estimate)
    }

    /// One send of `tenant`'s: true when admitted.
    fn send(&mut self, tenant: TenantIndex, mode: ShareMode) -> bool {
        let room = self.room();
        if room == 0 {
            self.book.refused_at_ceiling(tenant, 1, self.reads);
            return false;
        }
        let estimate = self.limit - room;
        let near = estimate as f64 >= 0.9 * self.limit as f64;
        match self.book.decide(tenant, 1, room, near, mode, self.reads) {
            Verdict::Refuse { .. } | Verdict::Shed { .. } => false,
            Verdict::Admit | Verdict::WouldRefuse { .. } | Verdict::WouldShed => {
                self.since_read += 1;
                self.stored += 1.0;
                self.max_seen = self.max_seen.max(self.stored);
                true
            }
        }
    }
}

const STEP: Duration = Duration::from_millis(10);

/// Greedy: `threads` callers each asking every 20 ms, whatever the answer.
fn greedy_asks(step: u64, threads: u64) -> u64 {
    if step.is_multiple_of(2) {
        threads
    } else {
        0
    }
}

/// The scenario: ceiling 40, consumers at ~50 msg/s, A 12 threads retrying every
/// 20 ms, B 10 messages a second, honouring `Retry-After` (1 s). Returns (B queued / B
/// sent, admitted / drained, the highest backlog seen).
async fn modest_beside_greedy(mode: ShareMode, seconds: u64) -> (f64, f64, f64) {
    let mut q = Queue::new(&[1, 1], 40, 50.0);
    let mut b_pending: Vec<Instant> = Vec::new();
    let (mut b_sent, mut b_queued, mut admitted) = (0u64, 0u64, 0u64);
    for step in 0..seconds * 100 {
        for _ in 0..greedy_asks(step, 12) {
            admitted += u64::from(q.send(A, mode));
        }
        if step.is_multiple_of(10) {
            b_sent += 1;
            b_pending.push(Instant::now());
        }
        let now = Instant::now();
        let mut waiting = Vec::new();
        for due in b_pending.drain(..) {
            if due > now {
                waiting.push(due);
            } else if q.send(B, mode) {
                b_queued += 1;
                admitted += 1;
            } else {
                waiting.push(now + Duration::from_secs(1));
            }
        }
        b_pending = waiting;
        tokio::time::advance(STEP).await;
        q.tick(STEP);
    }
    (
        b_queued as f64 / b_sent as f64,
        admitted as f64 / q.drained.max(1.0),
        q.max_seen,
    )
}

#[tokio::test(start_paused = true)]
async fn a_modest_tenant_beside_a_greedy_one_gets_what_it_sends() {
    let (modest, used, max) = modest_beside_greedy(ShareMode::Enforce, 60).await;
    assert!(
        modest >= 0.9,
        "the modest tenant got {modest:.3} of its sends"
    );
    assert!(used >= 0.95, "admitted {used:.3} of what was consumed");
    assert!(max <= 40.0, "backlog {max} over the ceiling");
    // Without the rule (off), the greedy one takes nearly everything: the test can fail.
    let (modest_off, _, _) = modest_beside_greedy(ShareMode::Off, 60).await;
    assert!(modest_off < 0.5, "off: {modest_off:.3}");
}

/// Two greedy tenants with these weights for `seconds`: each one's share of the admitted.
async fn both_greedy(weights: &[u32], seconds: u64) -> Vec<f64> {
    let mut q = Queue::new(weights, 40, 50.0);
    let mut admitted = vec![0u64; weights.len()];
    for step in 0..seconds * 100 {
        // Interleaved, B first on odd steps: neither is favoured by asking first.
        for k in 0..greedy_asks(step, 12) {
            for i in 0..weights.len() {
                let i = (i + (k as usize + step as usize / 2)) % weights.len();
                let t = TenantIndex(i as u16);
                admitted[i] += u64::from(q.send(t, ShareMode::Enforce));
            }
        }
        tokio::time::advance(STEP).await;
        q.tick(STEP);
    }
    let total: u64 = admitted.iter().sum();
    admitted.iter().map(|&a| a as f64 / total as f64).collect()
}

#[tokio::test(start_paused = true)]
async fn two_greedy_tenants_share_by_their_weights() {
    let shares = both_greedy(&[3, 1], 60).await;
    assert!((shares[0] - 0.75).abs() <= 0.05, "{shares:?}");
    assert!((shares[1] - 0.25).abs() <= 0.05, "{shares:?}");
    let shares = both_greedy(&[1, 1], 60).await;
    assert!((shares[0] - 0.5).abs() <= 0.05, "{shares:?}");
}

#[tokio::test(start_paused = true)]
async fn a_tenant_that_goes_idle_leaves_its_part_to_the_others_and_a_new_one_gets_its_own() {
    let mut q = Queue::new(&[1, 1], 40, 50.0);
    let mut per_second = Vec::new();
    for second in 0..12u64 {
        let mut got = [0u64; 2];
        for step in 0..100 {
            for _ in 0..greedy_asks(step, 12) {
                got[0] += u64::from(q.send(A, ShareMode::Enforce));
                // B is greedy in seconds 0–3, idle in 4–7, back in 8–11.
                if !(4..8).contains(&second) {
                    got[1] += u64::from(q.send(B, ShareMode::Enforce));
                }
            }
            tokio::time::advance(STEP).await;
            q.tick(STEP);
        }
        per_second.push(got);
    }
    let total = |s: [u64; 2]| (s[0] + s[1]).max(1) as f64;
    // Idle from second 4's start: its part of that round is held for it (idle room, the
    // documented limit); from the next round on, A takes all the room.
    assert!(per_second[4][0] < 30, "{per_second:?}");
    for &s in &per_second[5..8] {
        assert_eq!(s[1], 0);
        assert!(s[0] as f64 >= 0.95 * 40.0, "{per_second:?}");
    }
    // Back at second 8: from its first full round on, B has about half.
    for &s in &per_second[9..12] {
        let b = s[1] as f64 / total(s);
        assert!((b - 0.5).abs() <= 0.1, "{per_second:?}");
    }
}

#[test]
fn a_withdrawal_takes_back_only_from_the_round_it_was_counted_in() {
    let mut book = ShareBook::new(&[1, 1]);
    book.count_admitted(A, 5, 1);
    book.withdraw(A, 2, 1);
    assert_eq!(book.tenants[0].own.admitted, 3);
    assert_eq!(book.tenants[0].own.asked, 3);
    // Round 2 counts its own: a unit of round 1 given back takes nothing of them.
    book.count_admitted(A, 4, 2);
    book.withdraw(A, 1, 1);
    assert_eq!(
        book.tenants[0].own,
        Counts {
            asked_before: 3,
            asked: 4,
            admitted: 4
        }
    );
}

#[test]
fn counts_heard_of_the_round_before_move_back_one_those_of_the_round_after_roll_it_on() {
    let view = |round, asked, admitted| RoundView {
        round,
        refused_now: true,
        refused_before: false,
        counts: vec![(
            B.into(),
            Counts {
                asked_before: 1,
                asked,
                admitted,
            },
        )],
    };
    // A replica one read behind: its asks are this round's asks before, nothing admitted.
    let mut book = ShareBook::new(&[1, 1]);
    book.count_admitted(A, 1, 5);
    book.hear(view(4, 7, 7));
    assert_eq!(
        book.tenants[1].heard,
        Counts {
            asked_before: 7,
            ..Counts::default()
        }
    );
    assert!(!book.heard_refused_now && book.heard_refused_before);
    // One read ahead: the book rolls on to it and takes the counts as they are.
    book.hear(view(6, 3, 2));
    assert_eq!(book.round(), 6);
    assert_eq!(
        book.tenants[1].heard,
        Counts {
            asked_before: 1,
            asked: 3,
            admitted: 2
        }
    );
    assert_eq!(book.tenants[0].own.asked_before, 1, "its own rolled too");
    // Any other round is dropped.
    book.hear(view(9, 100, 100));
    assert_eq!(book.tenants[1].heard.asked, 3);
}

#[test]
fn a_refusal_only_a_replicas_share_of_the_room_makes_does_not_keep_the_queue_contended() {
    let mut book = ShareBook::new(&[1, 1]);
    book.refused_at_ceiling(A, 80, 1);
    book.refused_at_ceiling(B, 15, 1);
    // Round 2: 100 units left in all; this replica of five judges on its 20, of which B's
    // part is half (it wants 15), so A stops at 10 here, though the whole room has A's
    // 80 beside B's 15.
    let mut a = 0;
    while let Verdict::Admit =
        book.decide_in_part(A, 1, (20 - a, 100 - a), true, ShareMode::Enforce, 2)
    {
        a += 1;
    }
    assert_eq!(a, 10);
    assert_eq!(
        book.decide_in_part(B, 1, (10, 90), true, ShareMode::Enforce, 2),
        Verdict::Admit
    );
    // Round 3, far from the ceiling: that refusal was of this replica's share alone, so
    // the queue is not contended and A may take the room B asked for last round.
    assert_eq!(
        book.decide_in_part(A, 30, (30, 30), false, ShareMode::Enforce, 3),
        Verdict::Admit
    );
}

#[test]
fn a_book_forgets_only_once_it_was_idle_for_longer_than_the_window() {
    let idle = Duration::from_secs(2);
    let start = Instant::now();
    let mut book = ShareBook::new(&[1, 1]);
    book.forget_if_idle(start, idle);
    book.refused_at_ceiling(B, 3, 1);
    // Exactly the window later: kept.
    book.forget_if_idle(start + idle, idle);
    assert_eq!(book.tenants[1].own.asked, 3);
    assert!(book.refused_now);
    // Past it: forgotten, flags and all.
    book.forget_if_idle(start + idle * 2 + Duration::from_millis(1), idle);
    assert_eq!(book.tenants[1].own, Counts::default());
    assert!(!book.refused_now);
}

/// Round 1, far from the ceiling: A asks 50 and B 5, all admitted. In round 2 A's sends
/// meet the rule only when something makes the queue contended.
fn asked_uncontended() -> ShareBook {
    let mut book = ShareBook::new(&[1, 1]);
    for (t, units) in [(A, 50), (B, 5)] {
        let v = book.decide(t, units, 100, false, ShareMode::Enforce, 1);
        assert_eq!(v, Verdict::Admit);
    }
    book
}

/// How many units A takes one at a time of 10 in round 2, judged with `near`.
fn a_takes_of_ten(book: &mut ShareBook, near: bool) -> u64 {
    let mut room = 10;
    while room > 0 {
        match book.decide(A, 1, room, near, ShareMode::Enforce, 2) {
            Verdict::Admit => room -= 1,
            _ => break,
        }
    }
    10 - room
}

#[test]
fn an_estimate_near_the_ceiling_alone_makes_the_queue_contended() {
    assert_eq!(a_takes_of_ten(&mut asked_uncontended(), false), 10);
    assert_eq!(
        a_takes_of_ten(&mut asked_uncontended(), true),
        5,
        "B's 5 kept"
    );
}

#[test]
fn a_refusal_another_replica_made_the_round_before_alone_makes_the_queue_contended() {
    let mut book = asked_uncontended();
    // Heard in round 2: another replica refused a send in round 1, none yet in round 2.
    book.hear(RoundView {
        round: 2,
        refused_now: false,
        refused_before: true,
        counts: Vec::new(),
    });
    assert_eq!(a_takes_of_ten(&mut book, false), 5, "B's 5 kept");
}

#[test]
fn a_replicas_refusal_of_a_tenant_wanting_past_its_part_of_the_whole_room_keeps_it_contended() {
    let mut book = ShareBook::new(&[1, 1]);
    book.refused_at_ceiling(A, 80, 1);
    book.refused_at_ceiling(B, 10, 1);
    // Round 2: 40 units left in all; this replica of three judges on its 14, of which B's
    // part is half, so A stops at 7 with the whole room holding more than B is owed.
    let mut a = 0;
    while let Verdict::Admit =
        book.decide_in_part(A, 1, (14 - a, 40 - a), true, ShareMode::Enforce, 2)
    {
        a += 1;
    }
    assert_eq!(a, 7);
    for b in 0..5 {
        assert_eq!(
            book.decide_in_part(B, 1, (7 - b, 33 - b), true, ShareMode::Enforce, 2),
            Verdict::Admit
        );
    }
    // Round 3 starts far from the ceiling: A wanted 80 of a round offering 40, so its
    // refusal was of demand that does not fit, and B's part (5) is still kept.
    assert!(matches!(
        book.decide_in_part(A, 30, (30, 30), false, ShareMode::Enforce, 3),
        Verdict::Refuse { .. }
    ));
}

#[test]
fn refusals_of_demand_that_fits_the_whole_room_do_not_keep_the_queue_contended_by_themselves() {
    let mut book = ShareBook::new(&[1, 1]);
    book.refused_at_ceiling(A, 60, 1);
    book.refused_at_ceiling(B, 10, 1);
    // Rounds 2 and 3, far from the ceiling (40 left in all; this replica of five judges on
    // its 8): A asks 20 and is refused most on this replica's share alone, and asks again
    // (its retries count as asks: 89 in all), while the whole room would take its 20; B
    // asks its 10 (on another replica, say).
    for round in [2, 3] {
        let mut admitted = 0;
        for _ in 0..89 {
            let left = 8u64.saturating_sub(admitted).max(1);
            let verdict = book.decide_in_part(
                A,
                1,
                (left, 40 - admitted),
                false,
                ShareMode::Enforce,
                round,
            );
            admitted += u64::from(verdict == Verdict::Admit);
        }
        assert!(
            admitted < 20,
            "A's asks were refused on the replica's share"
        );
        for b in 0..10 {
            let whole = 40 - admitted - b;
            assert_eq!(
                book.decide_in_part(B, 1, (8, whole), false, ShareMode::Enforce, round),
                Verdict::Admit
            );
        }
    }
    // Round 2 was contended by round 1's refusals at the ceiling, and round 3 by A's
    // refusals in round 2; round 3 had no sign of its own (no refusal the whole room
    // would make, not near the ceiling), so round 4 is not contended: A gets the 30 it
    // asks for, though B is owed 10 of them. Its refusals alone never renew contention.
    assert_eq!(
        book.decide_in_part(A, 30, (30, 30), false, ShareMode::Enforce, 4),
        Verdict::Admit
    );
}

fn at(tenant: TenantIndex, level: Criticality) -> Cell {
    Cell { tenant, level }
}

/// Round 1: one tenant asks 10 critical and 50 default, all refused at the ceiling.
fn critical_asked_ten() -> ShareBook {
    let mut book = ShareBook::new(&[1]);
    book.refused_at_ceiling(at(A, Criticality::Critical), 10, 1);
    book.refused_at_ceiling(at(A, Criticality::Default), 50, 1);
    book
}

#[test]
fn contended_a_lower_level_leaves_the_room_a_higher_one_asked_for_and_its_surge() {
    let mut book = critical_asked_ten();
    // Round 2 opens 30: critical is kept its 10 and ⌊3 √10⌋ = 9 more, so default gets 11.
    let mut room = 30;
    let mut default = 0;
    loop {
        match book.decide(
            at(A, Criticality::Default),
            1,
            room,
            true,
            ShareMode::Enforce,
            2,
        ) {
            Verdict::Admit => {
                default += 1;
                room -= 1;
            }
            Verdict::Shed { room: fits } => {
                assert_eq!(fits, 0);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(default, 11);
    // Critical takes the rest, whatever default asks meanwhile; a sheddable send is kept
    // out of both.
    assert_eq!(
        book.decide(
            at(A, Criticality::Sheddable),
            1,
            room,
            true,
            ShareMode::Enforce,
            2
        ),
        Verdict::Shed { room: 0 }
    );
    for _ in 0..19 {
        let v = book.decide(
            at(A, Criticality::Critical),
            1,
            room,
            true,
            ShareMode::Enforce,
            2,
        );
        assert_eq!(v, Verdict::Admit);
        room -= 1;
    }
    assert_eq!(room, 0);
}

#[test]
fn the_tiers_order_holds_with_shares_off_is_only_counted_in_shadow_and_not_when_uncontended() {
    let default = at(A, Criticality::Default);
    let mut book = critical_asked_ten();
    assert_eq!(
        book.decide(default, 12, 30, true, ShareMode::Off, 2),
        Verdict::Shed { room: 11 }
    );
    let mut book = critical_asked_ten();
    assert_eq!(
        book.decide(default, 12, 30, true, ShareMode::Shadow, 2),
        Verdict::WouldShed
    );
    // Round 2 without a refusal in it or round 1 and far from the ceiling: nothing kept.
    let mut book = ShareBook::new(&[1]);
    book.count_admitted(at(A, Criticality::Critical), 10, 1);
    assert_eq!(
        book.decide(default, 30, 30, false, ShareMode::Enforce, 2),
        Verdict::Admit
    );
}

#[test]
fn a_tenants_critical_sends_share_only_with_critical_sends() {
    let mut book = ShareBook::new(&[3, 1]);
    // Round 1: A asks 100 at default, B 4 at critical: B's part of a round of 8 by weight
    // alone would be 2.
    book.refused_at_ceiling(A, 100, 1);
    book.refused_at_ceiling(at(B, Criticality::Critical), 4, 1);
    let mut room = 8;
    for _ in 0..4 {
        let v = book.decide(
            at(B, Criticality::Critical),
            1,
            room,
            true,
            ShareMode::Enforce,
            2,
        );
        assert_eq!(
            v,
            Verdict::Admit,
            "B's critical sends are the critical tier's"
        );
        room -= 1;
    }
    // Critical is still kept its surge (⌊4 + 3 √4⌋ = 10, 4 admitted): A's default sends
    // find no room of this round.
    assert!(matches!(
        book.decide(A, 1, room, true, ShareMode::Enforce, 2),
        Verdict::Shed { .. }
    ));
}

#[test]
fn what_a_tenant_was_short_of_its_part_is_owed_to_it_the_round_after() {
    let mut book = ShareBook::new(&[3, 1]);
    book.refused_at_ceiling(A, 100, 1);
    book.refused_at_ceiling(B, 100, 1);
    // Round 2 offers 4: B asks first and takes 1 (its part), then A takes 3; B is refused
    // at the ceiling once more.
    let mut room = 4;
    for (t, n) in [(B, 1), (A, 3)] {
        for _ in 0..n {
            assert_eq!(
                book.decide(t, 1, room, true, ShareMode::Enforce, 2),
                Verdict::Admit
            );
            room -= 1;
        }
    }
    book.refused_at_ceiling(B, 1, 2);
    // Round 3 offers 2, A first: parts are 1.5 and 0.5, nobody carried anything (each got
    // its part), so A takes both (a fraction to the one owed the most).
    for room in [2, 1] {
        assert_eq!(
            book.decide(A, 1, room, true, ShareMode::Enforce, 3),
            Verdict::Admit
        );
    }
    book.refused_at_ceiling(B, 1, 3);
    // Round 4 offers 2 again: B was half a unit short of its part and is owed 1 (its part
    // and what it carried), A 1.5: A takes one and the other is B's (3:1 over the rounds).
    assert_eq!(
        book.decide(A, 1, 2, true, ShareMode::Enforce, 4),
        Verdict::Admit
    );
    assert!(matches!(
        book.decide(A, 1, 1, true, ShareMode::Enforce, 4),
        Verdict::Refuse { room: 0, .. }
    ));
    assert_eq!(
        book.decide(B, 1, 1, true, ShareMode::Enforce, 4),
        Verdict::Admit
    );
}
