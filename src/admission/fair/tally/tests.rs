//! The tally on the paused clock: what each answer counts under, the window's rates, and
//! the `tenant_refused` line at most once per read.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::admission::tenants::Criticality;

const A: TenantIndex = TenantIndex(0);
const B: TenantIndex = TenantIndex(1);

fn no_read() -> u64 {
    panic!("the read is asked for only when a line may be owed")
}

fn share() -> Refusal {
    Refusal::TenantShare {
        share_milli: 500,
        retry_after: Duration::from_secs(1),
        room: 0,
    }
}

fn shed() -> Refusal {
    Refusal::Shed {
        criticality: Criticality::Sheddable,
        backlog: 8,
        cut: 8,
        retry_after: Duration::from_secs(1),
        room: 0,
    }
}

fn full() -> Refusal {
    Refusal::QueueFull {
        backlog: 10,
        limit: 10,
        retry_after: Duration::from_secs(1),
        drain_rate: None,
        room: 0,
    }
}

#[test]
fn each_answer_counts_under_its_reason_and_refusals_about_no_room_count_for_no_one() {
    assert_eq!(Answer::of(&Ok(()), None), Some(Answer::Admitted));
    assert_eq!(
        Answer::of(&Ok(()), Some(Reason::Criticality)),
        Some(Answer::WouldRefuse(Reason::Criticality))
    );
    assert_eq!(
        Answer::of(&Err(full()), None),
        Some(Answer::Refused(Reason::QueueFull))
    );
    assert_eq!(
        Answer::of(&Err(shed()), None),
        Some(Answer::Refused(Reason::Criticality))
    );
    assert_eq!(
        Answer::of(&Err(share()), Some(Reason::Criticality)),
        Some(Answer::Refused(Reason::TenantShare)),
        "a refusal is what counts, whatever the judge noted"
    );
    for none in [
        Refusal::CapacityUnknown {
            consecutive_failures: 3,
            cause: crate::admission::ceiling::Unknown::AdminPlane,
        },
        Refusal::QueueDisabled,
        Refusal::Stopped,
    ] {
        assert_eq!(Answer::of(&Err(none), None), None);
    }
    let quota = Refusal::TenantQuota {
        quota: crate::admission::tenants::QuotaKind::Rate,
        retry_after: std::time::Duration::from_secs(1),
        room: 0,
    };
    assert_eq!(
        Answer::of(&Err(quota), None),
        Some(Answer::Refused(Reason::TenantQuota))
    );
    let words: Vec<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        words,
        ["queue_full", "criticality", "tenant_share", "tenant_quota"]
    );
    let shadowed: Vec<_> = Reason::shadowed().collect();
    assert_eq!(
        shadowed,
        [Reason::Criticality, Reason::TenantShare],
        "quotas are never shadowed"
    );
}

#[tokio::test(start_paused = true)]
async fn totals_grow_and_rates_are_units_a_second_over_the_last_ten_seconds() {
    let mut book = TallyBook::new(2, Instant::now());
    assert!(
        book.counts(Instant::now()).is_empty(),
        "no one answered yet"
    );
    book.record(A, 5, Answer::Admitted, no_read, Instant::now());
    tokio::time::advance(Duration::from_millis(500)).await;
    book.record(
        A,
        3,
        Answer::Refused(Reason::QueueFull),
        no_read,
        Instant::now(),
    );
    book.record(
        A,
        2,
        Answer::WouldRefuse(Reason::TenantShare),
        no_read,
        Instant::now(),
    );
    let counts = book.counts(Instant::now());
    assert_eq!(counts.len(), 1, "B was never answered: no row");
    let a = &counts[0];
    assert_eq!(a.tenant, A);
    assert_eq!(a.total.admitted, 7, "a would-be refusal is admitted too");
    assert_eq!(a.total.refused(Reason::QueueFull), 3);
    assert_eq!(a.total.would_refuse(Reason::TenantShare), 2);
    assert_eq!(a.total.refused(Reason::TenantShare), 0);
    assert_eq!(a.per_s.admitted, 0.7);
    assert_eq!(a.per_s.refused(Reason::QueueFull), 0.3);
    assert_eq!(a.per_s.refused_all(), 0.3);
    assert_eq!(a.per_s.would_refuse(Reason::TenantShare), 0.2);

    // Second 9: second 0 is still in the window; at second 10 it is out.
    tokio::time::advance(Duration::from_millis(8_500)).await;
    book.record(A, 1, Answer::Admitted, no_read, Instant::now());
    assert_eq!(book.counts(Instant::now())[0].per_s.admitted, 0.8);
    tokio::time::advance(Duration::from_secs(1)).await;
    let a = &book.counts(Instant::now())[0];
    assert_eq!(a.per_s.admitted, 0.1, "only second 9's unit is left");
    assert_eq!(a.per_s.refused_all(), 0.0);
    assert_eq!(a.total.admitted, 8, "totals never fall");
}

#[tokio::test(start_paused = true)]
async fn a_bucket_reused_ten_seconds_later_starts_from_zero() {
    let mut book = TallyBook::new(1, Instant::now());
    book.record(A, 4, Answer::Admitted, no_read, Instant::now());
    tokio::time::advance(Duration::from_secs(10)).await;
    book.record(A, 1, Answer::Admitted, no_read, Instant::now());
    let a = &book.counts(Instant::now())[0];
    assert_eq!(
        a.per_s.admitted, 0.1,
        "second 10 replaced second 0 in its slot"
    );
    assert_eq!(a.total.admitted, 5);
    // A tenant quiet for longer than the window shows nothing a second.
    tokio::time::advance(Duration::from_secs(25)).await;
    assert_eq!(book.counts(Instant::now())[0].per_s, Rates::default());
}

#[tokio::test(start_paused = true)]
async fn a_tenants_own_refusals_are_logged_once_per_read_with_the_units_since() {
    let now = Instant::now();
    let mut book = TallyBook::new(2, now);
    let first = book.record(A, 1, Answer::Refused(Reason::Criticality), || 7, now);
    assert_eq!(
        first,
        Some(ToLog {
            tenant: A,
            reason: Reason::Criticality,
            refused_since_last_log: 1,
        })
    );
    assert_eq!(
        book.record(A, 2, Answer::Refused(Reason::TenantShare), || 7, now),
        None,
        "the same read: held back"
    );
    // Another tenant on the same read has its own line.
    assert!(book
        .record(B, 1, Answer::Refused(Reason::TenantShare), || 7, now)
        .is_some());
    // The ceiling's refusals and admissions are no line and ask for no read.
    assert_eq!(
        book.record(A, 5, Answer::Refused(Reason::QueueFull), no_read, now),
        None
    );
    assert_eq!(book.record(A, 5, Answer::Admitted, no_read, now), None);
    assert_eq!(
        book.record(A, 5, Answer::WouldRefuse(Reason::TenantShare), no_read, now),
        None,
        "shadow mode refuses nothing: no line"
    );
    let next = book.record(A, 3, Answer::Refused(Reason::TenantShare), || 8, now);
    assert_eq!(
        next,
        Some(ToLog {
            tenant: A,
            reason: Reason::TenantShare,
            refused_since_last_log: 5,
        }),
        "a new read: the two held back and these three"
    );
    assert_eq!(
        book.record(A, 1, Answer::Refused(Reason::Criticality), || 8, now),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn a_tenant_past_the_rows_counts_for_no_one() {
    let mut book = TallyBook::new(1, Instant::now());
    assert_eq!(
        book.record(
            B,
            1,
            Answer::Refused(Reason::TenantShare),
            || 1,
            Instant::now()
        ),
        None
    );
    assert!(book.counts(Instant::now()).is_empty());
}

#[tokio::test(start_paused = true)]
async fn counts_name_each_tenant_by_its_index() {
    let mut book = TallyBook::new(3, Instant::now());
    book.record(TenantIndex(2), 1, Answer::Admitted, no_read, Instant::now());
    book.record(A, 1, Answer::Admitted, no_read, Instant::now());
    let tenants: Vec<_> = book
        .counts(Instant::now())
        .iter()
        .map(|c| c.tenant)
        .collect();
    assert_eq!(tenants, [A, TenantIndex(2)]);
}
