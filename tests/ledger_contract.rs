//! One contract, two ledgers: every case below is written once over `&dyn LedgerPort` and
//! run against `MemoryLedger` (on tokio's paused clock: its sleeps cost nothing) and against
//! the Lua scripts in the real local Redis (real sleeps, so the terms are short). What the
//! seat may rely on is what both answer (docs/fleet.md; src/coordination/port.rs).
//!
//! Each Redis case has a key prefix of its own and removes its keys when it ends.

use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use sendgate::config::BackendKind;
use sendgate::coordination::memory::{MemoryLedger, Snapshot};
use sendgate::coordination::port::{
    Ask, Caller, Epoch, LedgerPort, QueueRef, ReadFor, ReadOutcome, ReadState, ReadTicket,
    ReserveAnswer, Settle, Terms, View,
};
use sendgate::coordination::redis_client::RedisClient;
use sendgate::domain::QueueName;
use sendgate_testkit::ensure;
use sendgate_testkit::local_redis::{settings, unique_prefix, Cleanup};

const MS: Duration = Duration::from_millis(1);
/// A read the TTL paces, made for sends.
const FOR_SENDS: ReadFor = ReadFor::Ttl {
    in_streak: true,
    ends_lease: true,
};

/// Short enough for real sleeps, long enough that a busy machine does not cross a boundary
/// between two calls meant to fall on one side of it. Cases change what they test.
const TERMS: Terms = Terms {
    hold: Duration::from_millis(600),
    lag: Duration::ZERO,
    max_read_age: Duration::from_secs(60),
    grace: Duration::ZERO,
    member_for: Duration::from_secs(60),
    idle: Duration::from_secs(60),
};

/// A block lease no case outlives unless it means to.
const LONG: Duration = Duration::from_secs(60);

// ---- The two ledgers, and what a case needs beyond the port: faults.

#[async_trait(?Send)]
trait Rig {
    fn ledger(&self) -> &dyn LedgerPort;
    fn key(&self) -> &str;
    /// The queue's state evicted (all of it: one hash).
    async fn lose(&self);
    /// Remember the queue's state as it is now ...
    async fn save(&self);
    /// ... and go back to it on the same server: the writes since are lost.
    async fn roll_back(&self);
    /// ... or fail over to another server holding it (a replica that missed the writes
    /// since, promoted).
    async fn fail_over(&self);
}

struct Memory {
    ledger: MemoryLedger,
    saved: Mutex<Option<Snapshot>>,
}

impl Memory {
    fn new() -> Self {
        Self {
            ledger: MemoryLedger::new(Duration::from_millis(50)),
            saved: Mutex::new(None),
        }
    }
}

#[async_trait(?Send)]
impl Rig for Memory {
    fn ledger(&self) -> &dyn LedgerPort {
        &self.ledger
    }
    fn key(&self) -> &str {
        "sg:{rabbitmq/orders}"
    }
    async fn lose(&self) {
        self.ledger.lose(self.key());
    }
    async fn save(&self) {
        *self.saved.lock() = Some(self.ledger.snapshot());
    }
    async fn roll_back(&self) {
        let saved = self.saved.lock().clone().expect("saved first");
        self.ledger.restore(&saved);
    }
    async fn fail_over(&self) {
        let saved = self.saved.lock().clone().expect("saved first");
        self.ledger.fail_over(&saved);
    }
}

struct Redis {
    ledger: RedisClient,
    key: String,
    /// DUMP and PTTL of the hash when saved.
    saved: Mutex<Option<(Vec<u8>, i64)>>,
    _cleanup: Cleanup,
}

impl Redis {
    async fn new() -> Self {
        ensure::redis();
        let prefix = unique_prefix();
        let ledger = RedisClient::connect(&settings(
            "redis://127.0.0.1:6379",
            &prefix,
            Duration::from_millis(500),
        ))
        .await
        .expect("the local Redis answers");
        let key = ledger.queue_key(BackendKind::RabbitMq, &QueueName::parse("orders").unwrap());
        assert_eq!(key, format!("{prefix}:{{rabbitmq/orders}}"));
        Self {
            ledger,
            key,
            saved: Mutex::new(None),
            _cleanup: Cleanup(prefix),
        }
    }
}

#[async_trait(?Send)]
impl Rig for Redis {
    fn ledger(&self) -> &dyn LedgerPort {
        &self.ledger
    }
    fn key(&self) -> &str {
        &self.key
    }
    async fn lose(&self) {
        let mut pipe = ::redis::pipe();
        pipe.cmd("DEL").arg(&self.key).ignore();
        self.ledger.query::<()>(&pipe).await.expect("DEL");
    }
    async fn save(&self) {
        let mut pipe = ::redis::pipe();
        pipe.cmd("DUMP").arg(&self.key).cmd("PTTL").arg(&self.key);
        let (dump, ttl): (Option<Vec<u8>>, i64) = self.ledger.query(&pipe).await.expect("DUMP");
        *self.saved.lock() = Some((dump.expect("the hash exists"), ttl.max(0)));
    }
    async fn roll_back(&self) {
        let (dump, ttl) = self.saved.lock().clone().expect("saved first");
        let mut pipe = ::redis::pipe();
        pipe.cmd("RESTORE")
            .arg(&self.key)
            .arg(ttl)
            .arg(dump)
            .arg("REPLACE")
            .ignore();
        self.ledger.query::<()>(&pipe).await.expect("RESTORE");
    }
    /// The promoted replica's copy names the process that wrote it, not itself (a real
    /// failover between two servers is `redis_ledger.rs`'s).
    async fn fail_over(&self) {
        self.roll_back().await;
        let mut pipe = ::redis::pipe();
        pipe.cmd("HSET")
            .arg(&self.key)
            .arg("run")
            .arg("0123456789abcdef0123456789abcdef01234567")
            .ignore();
        self.ledger.query::<()>(&pipe).await.expect("HSET");
    }
}

/// Each case once per ledger: `memory::<case>` on the paused clock, `redis::<case>` for real.
macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    super::$case(&super::Memory::new()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&super::Redis::new().await).await;
                }
            )*
        }
    };
}

contract!(
    the_first_call_makes_an_epoch_and_answers_new_epoch_to_a_caller_that_named_none,
    every_call_of_a_replica_bumps_the_version_and_look_writes_nothing,
    a_grant_is_the_room_over_the_divisor_within_want_and_at_least_one,
    at_the_limit_reserve_is_full_and_names_the_whole_estimate,
    reserved_is_the_units_of_live_blocks_leaving_on_settle_and_at_lease_end,
    a_settle_of_an_unknown_or_ended_block_takes_nothing_but_its_stored_sends_count,
    a_block_asked_twice_holds_both_grants_under_the_later_lease,
    a_carry_counts_in_the_estimate_until_its_hold_ends,
    a_carry_report_replaces_the_last_and_zero_clears_it,
    a_carry_is_not_recorded_from_a_caller_naming_an_old_epoch,
    settle_rows_naming_an_old_epoch_are_dropped,
    a_new_epoch_grants_nothing_within_its_grace_then_grants,
    reserve_wants_a_read_first_when_there_is_none_or_it_is_too_old,
    a_reads_age_counts_from_when_its_lease_was_taken_not_from_its_publish,
    a_failed_read_is_unknown_with_its_streak_and_a_disabled_queue_is_disabled,
    one_replica_at_a_time_holds_the_read_lease_until_it_ends,
    a_read_at_the_ceiling_freshens_the_depth_and_no_count_of_the_ttls_reads,
    a_read_at_the_ceiling_that_shows_no_less_than_the_read_in_force_is_not_published,
    a_ticket_of_an_old_epoch_or_no_newer_than_the_last_published_is_dropped,
    a_ticket_whose_read_would_be_too_old_is_dropped,
    since_read_after_a_publish_is_the_completions_after_its_ticket,
    completions_within_the_lag_stay_on_top_of_a_read_leased_then,
    an_evicted_state_is_made_anew_with_a_larger_epoch,
    a_caller_that_saw_a_later_state_than_the_ledger_holds_makes_it_anew_above_its_epoch,
    a_lost_write_is_noticed_by_its_replica_after_the_others_raised_the_version_again,
    a_state_another_server_holds_after_a_failover_is_made_anew_for_every_caller,
    a_caller_with_a_shorter_lag_keeps_what_a_longer_lag_needs,
    a_longer_lag_stops_counting_once_the_replica_that_named_it_left,
    a_new_epoch_is_above_the_callers_even_when_the_clock_is_behind_it,
    leave_drops_the_replicas_blocks_member_and_lease_and_settles_its_rows,
    leave_keeps_the_carry_until_its_hold_ends,
    replicas_are_those_heard_from_within_member_for,
    the_state_expires_when_idle,
);

// ---- A replica's calls, spelled once.

struct Fleet<'a> {
    rig: &'a dyn Rig,
    terms: Terms,
}

fn seen(epoch: Epoch) -> Epoch {
    // Naming an epoch at version 0 is never "later" than the ledger: a caller that simply
    // has not seen the others' writes.
    Epoch {
        id: epoch.id,
        version: 0,
    }
}

impl<'a> Fleet<'a> {
    fn new(rig: &'a dyn Rig) -> Self {
        Self { rig, terms: TERMS }
    }

    fn with(rig: &'a dyn Rig, terms: Terms) -> Self {
        Self { rig, terms }
    }

    fn q(&self) -> QueueRef<'_> {
        QueueRef {
            key: self.rig.key(),
            terms: self.terms,
        }
    }

    async fn heartbeat(&self, replica: &str, seen: Epoch, carry: u64) -> View {
        self.rig
            .ledger()
            .heartbeat(
                self.q(),
                Caller {
                    replica,
                    seen,
                    carry,
                },
            )
            .await
            .expect("heartbeat")
    }

    /// The epoch the ledger is in now (made if missing), as a replica learns it.
    async fn join(&self, replica: &str) -> Epoch {
        self.heartbeat(replica, Epoch::NONE, 0).await.epoch
    }

    async fn reserve_as(
        &self,
        replica: &str,
        epoch: Epoch,
        carry: u64,
        ask: Ask<'_>,
    ) -> (ReserveAnswer, View) {
        let caller = Caller {
            replica,
            seen: seen(epoch),
            carry,
        };
        self.rig
            .ledger()
            .reserve(self.q(), caller, ask)
            .await
            .expect("reserve")
    }

    async fn reserve(
        &self,
        epoch: Epoch,
        block_id: &str,
        want: u64,
        limit: u64,
    ) -> (ReserveAnswer, View) {
        let replica = block_id.split(':').next().unwrap_or(block_id);
        let ask = Ask {
            block_id,
            want,
            limit,
            divisor: 1,
            lease: LONG,
        };
        self.reserve_as(replica, epoch, 0, ask).await
    }

    async fn settle(&self, replica: &str, epoch: Epoch, rows: &[Settle<'_>]) -> View {
        let caller = Caller {
            replica,
            seen: seen(epoch),
            carry: 0,
        };
        self.rig
            .ledger()
            .settle(self.q(), caller, rows)
            .await
            .expect("settle")
    }

    async fn lease(
        &self,
        replica: &str,
        epoch: Epoch,
        lease: Duration,
    ) -> (Option<ReadTicket>, View) {
        let caller = Caller {
            replica,
            seen: seen(epoch),
            carry: 0,
        };
        self.rig
            .ledger()
            .lease_read(self.q(), caller, lease)
            .await
            .expect("lease_read")
    }

    async fn publish_with(
        &self,
        epoch: Epoch,
        ticket: ReadTicket,
        outcome: ReadOutcome,
        for_: ReadFor,
    ) -> View {
        let caller = Caller {
            replica: "reader",
            seen: seen(epoch),
            carry: 0,
        };
        self.rig
            .ledger()
            .publish_read(self.q(), caller, ticket, outcome, for_)
            .await
            .expect("publish_read")
    }

    /// A read of `outcome`, leased (for no time: the next may follow at once) and published.
    async fn read(&self, epoch: Epoch, outcome: ReadOutcome) -> View {
        let (ticket, _) = self.lease("reader", epoch, Duration::ZERO).await;
        let ticket = ticket.expect("nobody else holds the lease");
        self.publish_with(epoch, ticket, outcome, FOR_SENDS).await
    }

    async fn read_ok(&self, epoch: Epoch, backlog: u64) -> View {
        let outcome = ReadOutcome::Ok {
            backlog,
            send_disabled: false,
        };
        self.read(epoch, outcome).await
    }

    async fn look(&self) -> Option<View> {
        self.rig.ledger().look(self.q()).await.expect("look")
    }

    async fn leave(&self, replica: &str, epoch: Epoch, rows: &[Settle<'_>]) {
        let caller = Caller {
            replica,
            seen: seen(epoch),
            carry: 0,
        };
        self.rig
            .ledger()
            .leave(self.q(), caller, rows)
            .await
            .expect("leave");
    }
}

fn row(block_id: &str, stored: u64, not_stored: u64) -> Settle<'_> {
    Settle {
        block_id,
        stored,
        not_stored,
    }
}

async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

// ---- The cases.

async fn the_first_call_makes_an_epoch_and_answers_new_epoch_to_a_caller_that_named_none(
    rig: &dyn Rig,
) {
    let f = Fleet::new(rig);
    assert_eq!(f.look().await, None, "nothing before the first call");
    let (answer, view) = f.reserve(Epoch::NONE, "a:1", 4, 100).await;
    assert_eq!(answer, ReserveAnswer::NewEpoch);
    assert!(view.epoch.id > 0, "{view:?}");
    assert_eq!(
        view.reserved, 0,
        "a caller naming no epoch is granted nothing"
    );
    assert_eq!(f.look().await.map(|v| v.epoch.id), Some(view.epoch.id));
    // Naming it, the caller is past the epoch check: the read is what is missing now.
    let (answer, again) = f.reserve(view.epoch, "a:2", 4, 100).await;
    assert_eq!(answer, ReserveAnswer::Unread);
    assert_eq!(again.epoch.id, view.epoch.id);
    assert_eq!(again.read, ReadState::Never);
    assert_eq!(again.read_age, Duration::ZERO);
}

async fn every_call_of_a_replica_bumps_the_version_and_look_writes_nothing(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let first = f.heartbeat("a", Epoch::NONE, 0).await.epoch;
    let second = f.heartbeat("b", seen(first), 0).await.epoch;
    assert_eq!(second.id, first.id);
    assert_eq!(second.version, first.version + 1);
    let (_, view) = f.reserve(second, "a:1", 1, 10).await;
    assert_eq!(
        view.epoch.version,
        second.version + 1,
        "a refused reserve writes too"
    );
    let looked = f.look().await.expect("the state");
    assert_eq!(looked.epoch, view.epoch);
    assert_eq!(f.look().await.expect("the state").epoch, view.epoch);
}

async fn a_grant_is_the_room_over_the_divisor_within_want_and_at_least_one(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 20).await;
    let ask = |block_id, want, divisor| Ask {
        block_id,
        want,
        limit: 100,
        divisor,
        lease: LONG,
    };
    // Room 80, over 8: 10, below the want of 32.
    let (answer, view) = f.reserve_as("a", e, 0, ask("a:1", 32, 8)).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 10 });
    assert_eq!(view.reserved, 10);
    // Room 70, over 8: 8, above the want of 4.
    let (answer, _) = f.reserve_as("a", e, 0, ask("a:2", 4, 8)).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 4 });
    // Room 66, over 100: 0, but a grant is at least one.
    let (answer, view) = f.reserve_as("a", e, 0, ask("a:3", 32, 100)).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 1 });
    assert_eq!(view.reserved, 15);
    // A want of 0 counts as 1, a divisor of 0 as 1.
    let (answer, view) = f.reserve_as("a", e, 0, ask("a:4", 0, 0)).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 1 });
    assert_eq!(view.estimate(), Some(20 + 16));
}

async fn at_the_limit_reserve_is_full_and_names_the_whole_estimate(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 90).await;
    // since_read 2, a block of 5, b's carry of 3: 90 + 2 + 5 + 3 = 100.
    f.reserve(e, "a:1", 2, 1000).await;
    f.settle("a", e, &[row("a:1", 2, 0)]).await;
    f.heartbeat("b", seen(e), 3).await;
    let (answer, _) = f.reserve(e, "a:2", 5, 1000).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 5 });
    let (answer, view) = f.reserve(e, "a:3", 1, 100).await;
    assert_eq!(answer, ReserveAnswer::Full { estimate: 100 });
    assert_eq!(
        (view.since_read, view.reserved, view.carried),
        (2, 5, 3),
        "{view:?}"
    );
    assert_eq!(view.estimate(), Some(100));
    let (answer, view) = f.reserve(e, "a:4", 1, 101).await;
    assert_eq!(
        answer,
        ReserveAnswer::Granted { granted: 1 },
        "one unit of room"
    );
    assert_eq!(view.reserved, 6);
    let (answer, _) = f.reserve(e, "a:5", 1, 101).await;
    assert_eq!(answer, ReserveAnswer::Full { estimate: 101 });
}

async fn reserved_is_the_units_of_live_blocks_leaving_on_settle_and_at_lease_end(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    f.reserve(e, "a:1", 5, 100).await;
    let short = Ask {
        block_id: "a:2",
        want: 3,
        limit: 100,
        divisor: 1,
        lease: Duration::from_millis(300),
    };
    let (answer, view) = f.reserve_as("a", e, 0, short).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 3 });
    assert_eq!(view.reserved, 8);
    let view = f.settle("a", e, &[row("a:1", 2, 1)]).await;
    assert_eq!(view.reserved, 5, "three units left a:1");
    assert_eq!(
        view.since_read, 2,
        "only the stored ones count on top of the read"
    );
    sleep(400 * MS).await;
    assert_eq!(
        f.look().await.map(|v| v.reserved),
        Some(2),
        "a:2's lease ended"
    );
    let view = f.heartbeat("a", seen(e), 0).await;
    assert_eq!(view.reserved, 2);
    // A row takes at most what its block holds.
    let view = f.settle("a", e, &[row("a:1", 0, 9)]).await;
    assert_eq!(view.reserved, 0);
    assert_eq!(view.since_read, 2);
}

async fn a_settle_of_an_unknown_or_ended_block_takes_nothing_but_its_stored_sends_count(
    rig: &dyn Rig,
) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    f.reserve(e, "a:1", 4, 100).await;
    let view = f.settle("a", e, &[row("a:never", 2, 3)]).await;
    assert_eq!(
        view.reserved, 4,
        "a block never granted takes nothing from another"
    );
    assert_eq!(
        view.since_read, 2,
        "its stored sends may be in the queue all the same"
    );
    let short = Ask {
        block_id: "a:2",
        want: 6,
        limit: 100,
        divisor: 1,
        lease: Duration::from_millis(200),
    };
    f.reserve_as("a", e, 0, short).await;
    sleep(300 * MS).await;
    let view = f.settle("a", e, &[row("a:2", 1, 5)]).await;
    assert_eq!(
        view.reserved, 4,
        "the ended block already gave its units back"
    );
    assert_eq!(view.since_read, 3);
}

async fn a_block_asked_twice_holds_both_grants_under_the_later_lease(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    let ask = |want, lease| Ask {
        block_id: "a:1",
        want,
        limit: 100,
        divisor: 1,
        lease,
    };
    f.reserve_as("a", e, 0, ask(3, LONG)).await;
    let (answer, view) = f.reserve_as("a", e, 0, ask(2, 300 * MS)).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 2 });
    assert_eq!(view.reserved, 5);
    sleep(400 * MS).await;
    assert_eq!(
        f.heartbeat("a", seen(e), 0).await.reserved,
        5,
        "the shorter second lease does not cut the first"
    );
}

async fn a_carry_counts_in_the_estimate_until_its_hold_ends(rig: &dyn Rig) {
    let f = Fleet::new(rig); // hold 600 ms
    let e = f.join("a").await;
    f.read_ok(e, 10).await;
    let view = f.heartbeat("b", seen(e), 7).await;
    assert_eq!(view.carried, 7);
    let (answer, _) = f.reserve(e, "a:1", 1, 17).await;
    assert_eq!(answer, ReserveAnswer::Full { estimate: 17 });
    sleep(200 * MS).await;
    let (answer, _) = f.reserve(e, "a:2", 1, 17).await;
    assert_eq!(
        answer,
        ReserveAnswer::Full { estimate: 17 },
        "within the hold"
    );
    sleep(600 * MS).await;
    let (answer, view) = f.reserve(e, "a:3", 1, 17).await;
    assert_eq!(
        answer,
        ReserveAnswer::Granted { granted: 1 },
        "the hold ended"
    );
    assert_eq!(view.carried, 0);
}

async fn a_carry_report_replaces_the_last_and_zero_clears_it(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    assert_eq!(f.heartbeat("b", seen(e), 7).await.carried, 7);
    assert_eq!(f.heartbeat("c", seen(e), 4).await.carried, 11);
    assert_eq!(
        f.heartbeat("b", seen(e), 2).await.carried,
        6,
        "b's 7 became 2"
    );
    assert_eq!(
        f.heartbeat("b", seen(e), 0).await.carried,
        4,
        "b carries nothing"
    );
    // A report lives its hold from the last call that made it.
    sleep(400 * MS).await;
    f.heartbeat("c", seen(e), 4).await;
    sleep(400 * MS).await;
    assert_eq!(f.look().await.map(|v| v.carried), Some(4));
}

async fn a_carry_is_not_recorded_from_a_caller_naming_an_old_epoch(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let old = f.join("a").await;
    rig.lose().await;
    let new = f.join("c").await;
    assert!(new.id > old.id);
    let view = f.heartbeat("b", seen(old), 9).await;
    assert_eq!(view.epoch.id, new.id);
    assert_eq!(view.carried, 0, "reckoned against the old state");
    let view = f.heartbeat("b", seen(new), 9).await;
    assert_eq!(view.carried, 9, "named the epoch: recorded");
}

async fn settle_rows_naming_an_old_epoch_are_dropped(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let old = f.join("a").await;
    f.read_ok(old, 0).await;
    f.reserve(old, "a:1", 5, 100).await;
    rig.lose().await;
    let new = f.join("b").await;
    f.read_ok(new, 0).await;
    f.reserve(new, "b:1", 3, 100).await;
    let view = f
        .settle("a", old, &[row("a:1", 5, 0), row("b:1", 0, 3)])
        .await;
    assert_eq!(view.epoch.id, new.id);
    assert_eq!(view.since_read, 0, "those sends are in a's carry");
    assert_eq!(
        view.reserved, 3,
        "nor does a row of an old epoch take from this one"
    );
}

async fn a_new_epoch_grants_nothing_within_its_grace_then_grants(rig: &dyn Rig) {
    let terms = Terms {
        grace: Duration::from_millis(400),
        ..TERMS
    };
    let f = Fleet::with(rig, terms);
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    let (answer, view) = f.reserve(e, "a:1", 1, 100).await;
    assert_eq!(answer, ReserveAnswer::Recovering);
    assert!(
        view.grace_left > Duration::ZERO && view.grace_left <= 400 * MS,
        "{view:?}"
    );
    assert_eq!(view.reserved, 0);
    sleep(450 * MS).await;
    let (answer, view) = f.reserve(e, "a:2", 1, 100).await;
    assert_eq!(answer, ReserveAnswer::Granted { granted: 1 });
    assert_eq!(view.grace_left, Duration::ZERO);
}

async fn reserve_wants_a_read_first_when_there_is_none_or_it_is_too_old(rig: &dyn Rig) {
    let terms = Terms {
        max_read_age: Duration::from_millis(300),
        ..TERMS
    };
    let f = Fleet::with(rig, terms);
    let e = f.join("a").await;
    assert_eq!(f.reserve(e, "a:1", 1, 100).await.0, ReserveAnswer::Unread);
    f.read_ok(e, 0).await;
    assert_eq!(
        f.reserve(e, "a:2", 1, 100).await.0,
        ReserveAnswer::Granted { granted: 1 }
    );
    sleep(400 * MS).await;
    let (answer, view) = f.reserve(e, "a:3", 1, 100).await;
    assert_eq!(
        answer,
        ReserveAnswer::Unread,
        "the read is older than max_read_age"
    );
    assert!(view.read_age >= 400 * MS, "{view:?}");
    // Too old a failed read is no better.
    f.read(e, ReadOutcome::Failed).await;
    sleep(400 * MS).await;
    assert_eq!(f.reserve(e, "a:4", 1, 100).await.0, ReserveAnswer::Unread);
}

async fn a_reads_age_counts_from_when_its_lease_was_taken_not_from_its_publish(rig: &dyn Rig) {
    let terms = Terms {
        max_read_age: Duration::from_millis(300),
        ..TERMS
    };
    let f = Fleet::with(rig, terms);
    let e = f.join("a").await;
    let ticket = f.lease("reader", e, Duration::ZERO).await.0.unwrap();
    sleep(200 * MS).await;
    let ok = ReadOutcome::Ok {
        backlog: 0,
        send_disabled: false,
    };
    let view = f.publish_with(e, ticket, ok, FOR_SENDS).await;
    assert!(view.read_age >= 200 * MS, "{view:?}");
    // 350 ms after the lease, 150 ms after the publish.
    sleep(150 * MS).await;
    assert_eq!(f.reserve(e, "a:1", 1, 100).await.0, ReserveAnswer::Unread);
}

async fn a_failed_read_is_unknown_with_its_streak_and_a_disabled_queue_is_disabled(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 5).await;
    let view = f.read(e, ReadOutcome::Failed).await;
    assert_eq!(
        (view.read, view.streak),
        (ReadState::Failed { standing: Some(5) }, 1),
        "the last good read stands"
    );
    let (ticket, _) = f.lease("reader", e, Duration::ZERO).await;
    let view = f
        .publish_with(
            e,
            ticket.unwrap(),
            ReadOutcome::Failed,
            ReadFor::Ttl {
                in_streak: false,
                ends_lease: true,
            },
        )
        .await;
    assert_eq!(
        view.streak, 1,
        "a start-up read does not count in the streak"
    );
    assert_eq!((view.reads_ok, view.reads_failed), (1, 2));
    assert_eq!(view.estimate(), None);
    assert_eq!(
        view.read,
        ReadState::Failed { standing: Some(5) },
        "a second failure leaves the same read standing"
    );
    assert_eq!(view.standing_estimate(), Some(5 + view.since_read));
    let (answer, view) = f.reserve(e, "a:1", 1, 100).await;
    assert_eq!(answer, ReserveAnswer::Unknown);
    assert_eq!(view.reserved, 0);
    let disabled = ReadOutcome::Ok {
        backlog: 0,
        send_disabled: true,
    };
    let view = f.read(e, disabled).await;
    assert_eq!(view.streak, 0);
    assert_eq!(f.reserve(e, "a:2", 1, 100).await.0, ReserveAnswer::Disabled);
}

async fn one_replica_at_a_time_holds_the_read_lease_until_it_ends(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    let (first, _) = f.lease("a", e, 300 * MS).await;
    let first = first.expect("nobody held it");
    assert_eq!(first.epoch, e.id);
    assert_eq!(f.lease("b", e, 300 * MS).await.0, None);
    assert_eq!(
        f.lease("a", e, 300 * MS).await.0,
        None,
        "not even the holder twice"
    );
    sleep(400 * MS).await;
    let (second, _) = f.lease("b", e, 300 * MS).await;
    let second = second.expect("the lease ended");
    assert!(second.seq > first.seq);
    let ok = ReadOutcome::Ok {
        backlog: 1,
        send_disabled: false,
    };
    // An older ticket's read is published, and the newer lease stays held.
    let view = f.publish_with(e, first, ok, FOR_SENDS).await;
    assert_eq!(view.generation, 1);
    assert_eq!(f.lease("a", e, 300 * MS).await.0, None);
    // Publishing the newest ticket gives the lease back: the read it guarded is over.
    f.publish_with(e, second, ok, FOR_SENDS).await;
    let (third, _) = f.lease("a", e, 300 * MS).await;
    let third = third.expect("given back by the publish");
    assert!(third.seq > second.seq);
    // Unless the read says otherwise: then the lease runs out its time.
    let keeps = ReadFor::Ttl {
        in_streak: true,
        ends_lease: false,
    };
    f.publish_with(e, third, ok, keeps).await;
    assert_eq!(f.lease("b", e, 300 * MS).await.0, None, "kept to its end");
}

async fn a_read_at_the_ceiling_freshens_the_depth_and_no_count_of_the_ttls_reads(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    let paced = f
        .read(
            e,
            ReadOutcome::Ok {
                backlog: 7,
                send_disabled: false,
            },
        )
        .await;
    assert_eq!((paced.generation, paced.paced), (1, 1));
    let (ticket, _) = f.lease("a", e, Duration::ZERO).await;
    let view = f
        .publish_with(
            e,
            ticket.expect("free"),
            ReadOutcome::Ok {
                backlog: 3,
                send_disabled: false,
            },
            ReadFor::Ceiling,
        )
        .await;
    assert_eq!(
        view.read,
        ReadState::Ok {
            backlog: 3,
            send_disabled: false
        }
    );
    assert_eq!((view.generation, view.paced), (2, 1), "{view:?}");
    // Failed, it counts in no streak (the seat does not publish one; the ledger would not
    // count it either).
    let (ticket, _) = f.lease("a", e, Duration::ZERO).await;
    let view = f
        .publish_with(
            e,
            ticket.expect("free"),
            ReadOutcome::Failed,
            ReadFor::Ceiling,
        )
        .await;
    assert_eq!(
        (view.streak, view.generation, view.paced),
        (0, 3, 1),
        "{view:?}"
    );
}

/// Both reads bound the queue from above; the higher one only by the sends it counts twice
/// (stored before it, settled after its ticket). A read at the ceiling that shows no less
/// than the read in force, counted forward, leaves that read in force (its ticket spent).
async fn a_read_at_the_ceiling_that_shows_no_less_than_the_read_in_force_is_not_published(
    rig: &dyn Rig,
) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    let ok = |backlog| ReadOutcome::Ok {
        backlog,
        send_disabled: false,
    };
    let first = f.read(e, ok(7)).await;
    let (ticket, _) = f.lease("a", e, Duration::ZERO).await;
    let ticket = ticket.expect("free");
    let view = f.publish_with(e, ticket, ok(7), ReadFor::Ceiling).await;
    assert_eq!(
        (view.read, view.generation),
        (first.read, first.generation),
        "as high as the read in force: {view:?}"
    );
    let view = f.publish_with(e, ticket, ok(2), ReadFor::Ceiling).await;
    assert_eq!(view.generation, first.generation, "its ticket is spent");
    let (ticket, _) = f.lease("a", e, Duration::ZERO).await;
    let view = f
        .publish_with(e, ticket.expect("free"), ok(6), ReadFor::Ceiling)
        .await;
    assert_eq!(
        (view.read, view.generation),
        (
            ReadState::Ok {
                backlog: 6,
                send_disabled: false
            },
            first.generation + 1
        ),
        "lower: published"
    );
    let (ticket, _) = f.lease("a", e, Duration::ZERO).await;
    let view = f
        .publish_with(e, ticket.expect("free"), ok(9), FOR_SENDS)
        .await;
    assert_eq!(
        view.read,
        ReadState::Ok {
            backlog: 9,
            send_disabled: false
        },
        "a read the TTL paces is published whatever it shows"
    );
    let (ticket, _) = f.lease("a", e, Duration::ZERO).await;
    let disabled = ReadOutcome::Ok {
        backlog: 9,
        send_disabled: true,
    };
    let view = f
        .publish_with(e, ticket.expect("free"), disabled, ReadFor::Ceiling)
        .await;
    assert_eq!(
        view.read,
        ReadState::Ok {
            backlog: 9,
            send_disabled: true
        },
        "a queue disabled is news whatever the count"
    );
}

async fn a_ticket_of_an_old_epoch_or_no_newer_than_the_last_published_is_dropped(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    let ok = |backlog| ReadOutcome::Ok {
        backlog,
        send_disabled: false,
    };
    let older = f.lease("a", e, Duration::ZERO).await.0.unwrap();
    let newer = f.lease("b", e, Duration::ZERO).await.0.unwrap();
    assert!(newer.seq > older.seq);
    let view = f.publish_with(e, newer, ok(10), FOR_SENDS).await;
    assert_eq!(
        (view.generation, view.read),
        (
            1,
            ReadState::Ok {
                backlog: 10,
                send_disabled: false
            }
        )
    );
    let view = f.publish_with(e, older, ok(99), FOR_SENDS).await;
    assert_eq!(view.generation, 1, "older news");
    assert_eq!(view.estimate(), Some(10));
    let view = f.publish_with(e, newer, ok(98), FOR_SENDS).await;
    assert_eq!(view.generation, 1, "published once");
    let never = ReadTicket {
        seq: newer.seq + 5,
        ..newer
    };
    let view = f.publish_with(e, never, ok(97), FOR_SENDS).await;
    assert_eq!(view.estimate(), Some(10), "a ticket never issued");
    // A ticket of an epoch that is gone counted another state's completions.
    let stale = f.lease("a", e, Duration::ZERO).await.0.unwrap();
    rig.lose().await;
    let new = f.join("a").await;
    let view = f.publish_with(new, stale, ok(5), FOR_SENDS).await;
    assert_eq!((view.read, view.generation), (ReadState::Never, 0));
    // Even with a seq this epoch has issued.
    let fresh = f.lease("a", new, Duration::ZERO).await.0.unwrap();
    let forged = ReadTicket {
        epoch: stale.epoch,
        ..fresh
    };
    let view = f.publish_with(new, forged, ok(5), FOR_SENDS).await;
    assert_eq!(view.read, ReadState::Never);
}

async fn a_ticket_whose_read_would_be_too_old_is_dropped(rig: &dyn Rig) {
    let terms = Terms {
        max_read_age: Duration::from_millis(300),
        ..TERMS
    };
    let f = Fleet::with(rig, terms);
    let e = f.join("a").await;
    let on_time = f.lease("reader", e, Duration::ZERO).await.0.unwrap();
    let view = f
        .publish_with(e, on_time, ReadOutcome::Failed, FOR_SENDS)
        .await;
    assert_eq!(
        (view.read, view.generation),
        (ReadState::Failed { standing: None }, 1)
    );
    let stale = f.lease("reader", e, Duration::ZERO).await.0.unwrap();
    sleep(400 * MS).await;
    let view = f
        .publish_with(
            e,
            stale,
            ReadOutcome::Ok {
                backlog: 0,
                send_disabled: false,
            },
            FOR_SENDS,
        )
        .await;
    assert_eq!(
        (view.read, view.generation),
        (ReadState::Failed { standing: None }, 1),
        "{view:?}"
    );
}

async fn since_read_after_a_publish_is_the_completions_after_its_ticket(rig: &dyn Rig) {
    let f = Fleet::new(rig); // no lag
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    f.reserve(e, "a:1", 10, 100).await;
    f.settle("a", e, &[row("a:1", 3, 0)]).await;
    let ticket = f.lease("reader", e, Duration::ZERO).await.0.unwrap();
    assert_eq!(ticket.completed_at_start, 3);
    let view = f.settle("a", e, &[row("a:1", 4, 0)]).await;
    assert_eq!(view.since_read, 7);
    let ok = ReadOutcome::Ok {
        backlog: 50,
        send_disabled: false,
    };
    let view = f.publish_with(e, ticket, ok, FOR_SENDS).await;
    assert_eq!(view.since_read, 4, "the read shows the first three");
    assert_eq!(view.estimate(), Some(50 + 4 + 3));
}

async fn completions_within_the_lag_stay_on_top_of_a_read_leased_then(rig: &dyn Rig) {
    let terms = Terms {
        lag: Duration::from_millis(300),
        ..TERMS
    };
    let f = Fleet::with(rig, terms);
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    f.reserve(e, "a:1", 10, 100).await;
    f.settle("a", e, &[row("a:1", 3, 0)]).await;
    // Older than the lag (and its 100 ms rounding) when the lease is taken.
    sleep(600 * MS).await;
    f.settle("a", e, &[row("a:1", 2, 0)]).await;
    // Within the lag, in a later 100 ms bucket.
    sleep(100 * MS).await;
    let ticket = f.lease("reader", e, Duration::ZERO).await.0.unwrap();
    assert_eq!(
        ticket.completed_at_start, 3,
        "the last two may not show in the read"
    );
    let ok = ReadOutcome::Ok {
        backlog: 3,
        send_disabled: false,
    };
    let view = f.publish_with(e, ticket, ok, FOR_SENDS).await;
    assert_eq!(view.since_read, 2);
}

async fn an_evicted_state_is_made_anew_with_a_larger_epoch(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let old = f.join("a").await;
    f.read_ok(old, 10).await;
    f.reserve(old, "a:1", 5, 100).await;
    f.heartbeat("b", seen(old), 3).await;
    rig.lose().await;
    assert_eq!(f.look().await, None);
    let (answer, view) = f.reserve(old, "a:2", 5, 100).await;
    assert_eq!(answer, ReserveAnswer::NewEpoch);
    assert!(view.epoch.id > old.id, "{view:?} after {old:?}");
    assert_eq!(view.read, ReadState::Never);
    assert_eq!((view.reserved, view.carried, view.replicas), (0, 0, 1));
}

async fn a_caller_that_saw_a_later_state_than_the_ledger_holds_makes_it_anew_above_its_epoch(
    rig: &dyn Rig,
) {
    let f = Fleet::new(rig);
    let old = f.join("a").await;
    f.read_ok(old, 10).await;
    rig.save().await;
    f.reserve(old, "a:1", 5, 100).await;
    let latest = f.heartbeat("a", seen(old), 0).await.epoch;
    // A caller behind the others is not a rollback: the state stays.
    let behind = f.heartbeat("b", seen(old), 0).await;
    assert_eq!((behind.epoch.id, behind.reserved), (old.id, 5));
    // A failover loses a:1's block and the writes after the save.
    rig.roll_back().await;
    assert!(f.look().await.unwrap().epoch < latest);
    let view = f.heartbeat("a", latest, 0).await;
    assert!(view.epoch.id > latest.id, "{view:?} after {latest:?}");
    assert_eq!(
        view.read,
        ReadState::Never,
        "nothing of the rolled-back state is kept"
    );
    assert_eq!(view.replicas, 1);
    // The others hear of the new epoch on their next call.
    let (answer, _) = f.reserve(seen(old), "b:1", 1, 100).await;
    assert_eq!(answer, ReserveAnswer::NewEpoch);
}

async fn a_lost_write_is_noticed_by_its_replica_after_the_others_raised_the_version_again(
    rig: &dyn Rig,
) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 10).await;
    rig.save().await;
    // a's grant and what it saw of it are lost in a failover ...
    let (granted, saw) = f.reserve(e, "a:1", 5, 100).await;
    assert_eq!(granted, ReserveAnswer::Granted { granted: 5 });
    rig.roll_back().await;
    // ... and the others' calls raise the version past what a saw before a calls again.
    for _ in 0..5 {
        f.heartbeat("b", seen(e), 0).await;
    }
    assert!(f.look().await.unwrap().epoch.version > saw.epoch.version);
    let view = f.heartbeat("a", saw.epoch, 0).await;
    assert!(
        view.epoch.id > e.id,
        "the state that lost a's block is made anew: {view:?}"
    );
}

async fn a_state_another_server_holds_after_a_failover_is_made_anew_for_every_caller(
    rig: &dyn Rig,
) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    let b_saw = f.heartbeat("b", seen(e), 0).await.epoch;
    f.read_ok(e, 10).await;
    rig.save().await;
    // a's grant is lost in the failover; b saw nothing of it.
    let (granted, _) = f.reserve(e, "a:1", 5, 100).await;
    assert_eq!(granted, ReserveAnswer::Granted { granted: 5 });
    rig.fail_over().await;
    let view = f.heartbeat("b", b_saw, 0).await;
    assert!(view.epoch.id > e.id, "made anew: {view:?} after {e:?}");
    assert_eq!((view.read, view.reserved), (ReadState::Never, 0));
    // The next caller of the new server's state is in its epoch: nothing is made again.
    let again = f.heartbeat("b", view.epoch, 0).await;
    assert_eq!(again.epoch.id, view.epoch.id);
}

async fn a_caller_with_a_shorter_lag_keeps_what_a_longer_lag_needs(rig: &dyn Rig) {
    let long = Terms {
        lag: Duration::from_millis(2000),
        ..TERMS
    };
    let f = Fleet::with(rig, long);
    let short = Fleet::new(rig); // lag 0
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    f.reserve(e, "a:1", 10, 100).await;
    f.settle("a", e, &[row("a:1", 3, 0)]).await;
    // A replica with no lag settles and prunes past its own terms ...
    sleep(1200 * MS).await;
    short.settle("b", e, &[row("b:1", 2, 0)]).await;
    // ... and the lagging reader's ticket still starts before all five.
    let ticket = f.lease("reader", e, Duration::ZERO).await.0.unwrap();
    assert_eq!(ticket.completed_at_start, 0, "{ticket:?}");
}

/// The longest lag is kept for the replicas that name it, not for the life of the hash:
/// once the one replica with a longer lag (a lag measured long once, a setting since
/// changed) left, the others' completions stop being counted on top of reads that show
/// them (every read of the fleet would over-count them, for as long as the hash lives).
async fn a_longer_lag_stops_counting_once_the_replica_that_named_it_left(rig: &dyn Rig) {
    let long = Terms {
        lag: Duration::from_millis(2000),
        ..TERMS
    };
    let f = Fleet::with(rig, long);
    let short = Fleet::new(rig); // lag 0
    let e = f.join("a").await;
    short.read_ok(e, 0).await;
    f.leave("a", e, &[]).await;
    short.reserve(e, "b:1", 10, 100).await;
    short.settle("b", e, &[row("b:1", 3, 0)]).await;
    sleep(1200 * MS).await;
    let ticket = short.lease("reader", e, Duration::ZERO).await.0.unwrap();
    assert_eq!(
        ticket.completed_at_start, 3,
        "a's lag outlived a: {ticket:?}"
    );
}

async fn a_new_epoch_is_above_the_callers_even_when_the_clock_is_behind_it(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let now = f.join("a").await;
    // A caller that saw an epoch a second ahead of this ledger's clock (Redis TIME stepped
    // back across a failover): the epoch it names must not come round again.
    let ahead = Epoch {
        id: now.id + 1_000_000,
        version: 0,
    };
    let view = f.heartbeat("b", ahead, 0).await;
    assert!(view.epoch.id > ahead.id, "{view:?} for {ahead:?}");
    // Missing rather than behind: the same.
    rig.lose().await;
    let further = Epoch {
        id: view.epoch.id + 1_000_000,
        version: 0,
    };
    let view = f.heartbeat("b", further, 0).await;
    assert!(view.epoch.id > further.id, "{view:?} for {further:?}");
}

async fn leave_drops_the_replicas_blocks_member_and_lease_and_settles_its_rows(rig: &dyn Rig) {
    let f = Fleet::new(rig);
    let e = f.join("a").await;
    f.read_ok(e, 0).await;
    f.reserve(e, "a:1", 4, 100).await;
    f.reserve(e, "a:2", 2, 100).await;
    // A replica whose name starts with "a" is another replica.
    f.reserve(e, "ab:1", 3, 100).await;
    let ticket = f.lease("a", e, LONG).await.0;
    assert!(ticket.is_some());
    let before = f.heartbeat("b", seen(e), 0).await;
    assert_eq!((before.reserved, before.replicas), (9, 4), "{before:?}");
    f.leave("a", e, &[row("a:1", 1, 0)]).await;
    let view = f.look().await.unwrap();
    assert_eq!(view.reserved, 3, "only ab's block is left");
    assert_eq!(view.since_read, 1, "its stored send is counted");
    assert_eq!(view.replicas, 3, "reader, ab, b");
    let (ticket, _) = f.lease("b", e, LONG).await;
    assert!(ticket.is_some(), "a gave the read lease back");
    // A leave names its own lease only.
    f.leave("ab", e, &[]).await;
    assert_eq!(f.lease("reader", e, LONG).await.0, None, "b's lease stays");
}

async fn leave_keeps_the_carry_until_its_hold_ends(rig: &dyn Rig) {
    let f = Fleet::new(rig); // hold 600 ms
    let e = f.join("a").await;
    f.heartbeat("a", seen(e), 5).await;
    let caller = Caller {
        replica: "a",
        seen: seen(e),
        carry: 6,
    };
    rig.ledger().leave(f.q(), caller, &[]).await.unwrap();
    let view = f.look().await.unwrap();
    assert_eq!(view.carried, 6, "its sends may not be in any read yet");
    assert_eq!(view.replicas, 0);
    sleep(700 * MS).await;
    assert_eq!(f.look().await.unwrap().carried, 0);
}

async fn replicas_are_those_heard_from_within_member_for(rig: &dyn Rig) {
    let terms = Terms {
        member_for: Duration::from_millis(500),
        ..TERMS
    };
    let f = Fleet::with(rig, terms);
    let e = f.join("a").await;
    assert_eq!(f.heartbeat("b", seen(e), 0).await.replicas, 2);
    sleep(300 * MS).await;
    assert_eq!(f.heartbeat("a", seen(e), 0).await.replicas, 2);
    sleep(300 * MS).await;
    assert_eq!(
        f.look().await.unwrap().replicas,
        1,
        "b was last heard 600 ms ago"
    );
    assert_eq!(f.heartbeat("c", seen(e), 0).await.replicas, 2);
}

async fn the_state_expires_when_idle(rig: &dyn Rig) {
    let terms = Terms {
        idle: Duration::from_millis(500),
        ..TERMS
    };
    let f = Fleet::with(rig, terms);
    let old = f.join("a").await;
    sleep(300 * MS).await;
    f.heartbeat("a", seen(old), 0).await;
    sleep(300 * MS).await;
    assert!(
        f.look().await.is_some(),
        "every write restarts the idle time"
    );
    sleep(400 * MS).await;
    assert_eq!(f.look().await, None);
    assert!(f.join("a").await.id > old.id);
}

// ---- The scripts alone: what only Redis can hold (A5 says nothing else writes there, but a
// replica must survive it if something does).

mod redis_only {
    use super::*;
    use sendgate::coordination::port::LedgerError;

    async fn plant(rig: &Redis, args: &[&str]) {
        let mut pipe = ::redis::pipe();
        let mut cmd = ::redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        pipe.add_command(cmd).ignore();
        rig.ledger.query::<()>(&pipe).await.expect("planted");
    }

    #[tokio::test]
    async fn a_foreign_value_under_the_key_is_an_error_not_a_panic() {
        let rig = Redis::new().await;
        plant(&rig, &["SET", rig.key(), "not a hash"]).await;
        let f = Fleet::new(&rig);
        let caller = Caller {
            replica: "a",
            seen: Epoch::NONE,
            carry: 0,
        };
        let answer = rig.ledger().heartbeat(f.q(), caller).await;
        assert!(matches!(answer, Err(LedgerError::Redis(_))), "{answer:?}");
        let answer = rig.ledger().look(f.q()).await;
        assert!(matches!(answer, Err(LedgerError::Redis(_))), "{answer:?}");
    }

    #[tokio::test]
    async fn a_hash_without_a_valid_epoch_is_made_anew() {
        let rig = Redis::new().await;
        plant(
            &rig,
            &[
                "HSET",
                rig.key(),
                "epoch",
                "garbage",
                "b:a:1",
                "5:99999999999999",
            ],
        )
        .await;
        let f = Fleet::new(&rig);
        assert_eq!(f.look().await, None, "not a state");
        let view = f.heartbeat("a", Epoch::NONE, 0).await;
        assert!(view.epoch.id > 0);
        assert_eq!(view.reserved, 0, "nothing of what was there is kept");
    }

    #[tokio::test]
    async fn malformed_fields_count_as_nothing_and_are_pruned() {
        let rig = Redis::new().await;
        let f = Fleet::new(&rig);
        let e = f.join("a").await;
        plant(
            &rig,
            &[
                "HSET",
                rig.key(),
                "b:x:1",
                "-5:99999999999999",
                "c:y",
                "abc",
                "m:z",
                "soon",
            ],
        )
        .await;
        let view = f.heartbeat("a", seen(e), 0).await;
        assert_eq!((view.reserved, view.carried, view.replicas), (0, 0, 1));
        let mut pipe = ::redis::pipe();
        pipe.cmd("HEXISTS").arg(rig.key()).arg("b:x:1");
        let (exists,): (bool,) = rig.ledger.query(&pipe).await.unwrap();
        assert!(!exists);
    }

    #[tokio::test]
    async fn a_state_no_script_writes_is_an_unexpected_reply_not_a_panic() {
        let rig = Redis::new().await;
        let f = Fleet::new(&rig);
        let e = f.join("a").await;
        plant(
            &rig,
            &[
                "HSET",
                rig.key(),
                "state",
                "ok",
                "backlog",
                "-3",
                "taken_ms",
                "0",
            ],
        )
        .await;
        let answer = rig.ledger().look(f.q()).await;
        assert!(
            matches!(answer, Err(LedgerError::Unexpected(_))),
            "{answer:?}"
        );
        let caller = Caller {
            replica: "a",
            seen: seen(e),
            carry: 0,
        };
        let answer = rig.ledger().heartbeat(f.q(), caller).await;
        assert!(
            matches!(answer, Err(LedgerError::Unexpected(_))),
            "{answer:?}"
        );
    }
}
