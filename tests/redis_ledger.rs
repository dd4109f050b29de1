//! The Redis ledger's connection against the real local Redis: deadlines on a black-holed,
//! closed or silent server, a refused password, and `SENDGATE_REDIS_AUTH=entra` through an
//! ACL user whose password is a fake token. What the scripts decide is
//! `tests/ledger_contract.rs`; each test here has a key prefix of its own and removes its
//! keys when it ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sendgate::config::BackendKind;
use sendgate::coordination::entra::REDIS_SCOPE;
use sendgate::coordination::fleet::{IDLE, MEMBER_FOR};
use sendgate::coordination::port::{
    Ask, Caller, Epoch, LedgerError, LedgerPort, QueueRef, ReadFor, ReadOutcome, ReserveAnswer,
    Settle, Terms, View,
};
use sendgate::coordination::redis_client::{RedisClient, RedisError};
use sendgate::domain::QueueName;
use sendgate_entra::{CredentialChain, EntraCredential};
use sendgate_testkit::entra::FakeToken;
use sendgate_testkit::fault_proxy::{Fault, FaultProxy};
use sendgate_testkit::local_redis::{cli, settings, unique_prefix, Cleanup};
use sendgate_testkit::redis_server::RedisServer;
use sendgate_testkit::{ensure, local_redis};

const TIMEOUT: Duration = Duration::from_millis(500);
const LONG: Duration = Duration::from_secs(30);

const TERMS: Terms = Terms {
    hold: LONG,
    lag: Duration::ZERO,
    max_read_age: LONG,
    grace: Duration::ZERO,
    member_for: MEMBER_FOR,
    idle: IDLE,
};

fn queue_key(ledger: &RedisClient, name: &str) -> String {
    ledger.queue_key(BackendKind::RabbitMq, &QueueName::parse(name).unwrap())
}

/// The queue's state as it is (`None`: never made), through a script.
async fn look(ledger: &RedisClient, key: &str) -> Result<Option<View>, LedgerError> {
    ledger.look(QueueRef { key, terms: TERMS }).await
}

fn caller() -> Caller<'static> {
    Caller {
        replica: "me",
        seen: Epoch::NONE,
        carry: 0,
    }
}

fn within(started: Instant, bound: Duration) {
    let took = started.elapsed();
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
}

#[tokio::test]
async fn a_black_holed_redis_times_out_within_the_deadline_then_recovers() {
    ensure::redis();
    let prefix = unique_prefix();
    let _cleanup = Cleanup(prefix.clone());
    let target: SocketAddr = local_redis::ADDR.parse().unwrap();
    let proxy = FaultProxy::start(target).await;
    let timeout = Duration::from_millis(100);
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let ledger = RedisClient::connect(&settings(&url, &prefix, timeout))
        .await
        .unwrap();
    let key = queue_key(&ledger, "q");
    look(&ledger, &key).await.unwrap();
    let q = QueueRef {
        key: &key,
        terms: TERMS,
    };

    proxy.set(Fault::Blackhole);
    let slack = timeout + Duration::from_millis(150);
    let started = Instant::now();
    assert_eq!(ledger.ping().await, Err(RedisError::Timeout));
    within(started, slack);
    let started = Instant::now();
    let ask = Ask {
        block_id: "me:1",
        want: 1,
        limit: 10,
        divisor: 1,
        lease: LONG,
    };
    assert_eq!(
        ledger.reserve(q, caller(), ask).await,
        Err(LedgerError::Timeout)
    );
    within(started, slack);
    let started = Instant::now();
    assert_eq!(
        ledger.lease_read(q, caller(), LONG).await,
        Err(LedgerError::Timeout)
    );
    within(started, slack);

    proxy.set(Fault::Pass);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ledger.ping().await {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("Redis never answered again: {e}"),
        }
    }
    look(&ledger, &key).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_redis_errs_within_the_deadline() {
    // A port nothing listens on: bind one, note it, close it.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let prefix = unique_prefix();
    let s = settings(&format!("redis://127.0.0.1:{closed}"), &prefix, TIMEOUT);
    let started = Instant::now();
    assert!(RedisClient::connect(&s).await.is_err());
    within(started, Duration::from_millis(1500));

    // A lazy ledger exists without Redis and each call fails by its deadline.
    let ledger = RedisClient::lazy(&s).unwrap();
    let key = ledger.queue_key(BackendKind::Embedded, &QueueName::parse("q").unwrap());
    for _ in 0..3 {
        let started = Instant::now();
        assert!(look(&ledger, &key).await.is_err());
        within(started, TIMEOUT + Duration::from_millis(150));
    }
}

#[tokio::test]
async fn a_tls_url_to_a_silent_server_times_out_without_panicking() {
    // Accepts and never answers: the TLS handshake starts (so the TLS config is built,
    // which needs a crypto provider) and then waits for the deadline.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let s = settings(
        &format!("rediss://localhost:{port}"),
        &unique_prefix(),
        Duration::from_millis(100),
    );
    let started = Instant::now();
    assert_eq!(
        RedisClient::connect(&s).await.unwrap_err(),
        RedisError::Timeout
    );
    within(started, Duration::from_millis(1500));
    holder.abort();
}

/// An ACL user of its own, deleted when dropped.
struct AclUser(String);

impl Drop for AclUser {
    fn drop(&mut self) {
        cli(&["ACL", "DELUSER", &self.0]);
    }
}

#[tokio::test]
async fn a_refused_password_is_reported_without_echoing_it_then_the_ledger_recovers() {
    ensure::redis();
    let prefix = unique_prefix();
    let _cleanup = Cleanup(prefix.clone());
    let user = AclUser(format!(
        "sgtest-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let password = format!("pw{}", uuid::Uuid::new_v4().simple());
    assert_eq!(
        cli(&[
            "ACL",
            "SETUSER",
            &user.0,
            "on",
            ">other-password",
            "~*",
            "+@all"
        ]),
        "OK"
    );
    let url = format!("redis://{}:{password}@127.0.0.1:6379", user.0);
    let s = settings(&url, &prefix, TIMEOUT);

    let started = Instant::now();
    let e = RedisClient::connect(&s).await.unwrap_err();
    within(started, Duration::from_millis(1500));
    let text = format!("{e} {e:?}");
    assert!(!text.contains(&password), "{text}");
    assert!(
        matches!(e, RedisError::Failed(_)),
        "the refusal, not a timeout: {e:?}"
    );

    // The operator fixes the ACL: the same ledger answers within a few calls, without a
    // restart (redis's manager alone would keep the failed first connection for ever).
    let ledger = RedisClient::lazy(&s).unwrap();
    assert!(ledger.ping().await.is_err());
    let grant = format!(">{password}");
    assert_eq!(cli(&["ACL", "SETUSER", &user.0, "resetpass", &grant]), "OK");
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = ledger.ping().await {
        assert!(Instant::now() < deadline, "never recovered: {e}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(look(&ledger, &queue_key(&ledger, "q")).await.unwrap(), None);
}

// ---- SENDGATE_REDIS_AUTH=entra, with a fake Entra ID source and an ACL user whose
// password is the "token" (Azure Managed Redis checks the real token the same way: the
// identity's object id as the user, the token as its password).

fn entra_credential(source: Arc<FakeToken>) -> Arc<EntraCredential> {
    Arc::new(EntraCredential::new(CredentialChain::new(
        REDIS_SCOPE,
        vec![("fake", source)],
    )))
}

fn object_id() -> AclUser {
    AclUser(format!("sgtest-oid-{}", uuid::Uuid::new_v4().simple()))
}

fn fake_token(tag: &str) -> String {
    format!("eyJ{tag}.{}", uuid::Uuid::new_v4().simple())
}

/// `CLIENT LIST` lines of the connections authenticated as `user`.
fn connections_of(user: &str) -> Vec<String> {
    let needle = format!(" user={user} ");
    cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.contains(&needle))
        .map(str::to_owned)
        .collect()
}

/// Whether Redis logged a refused AUTH (or any ACL denial) for `user`.
fn acl_denials_of(user: &str) -> usize {
    cli(&["ACL", "LOG", "128"])
        .lines()
        .filter(|line| *line == user)
        .count()
}

async fn ping_until_ok(ledger: &RedisClient, within: Duration) {
    let deadline = Instant::now() + within;
    while let Err(e) = ledger.ping().await {
        assert!(Instant::now() < deadline, "never answered: {e}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn entra_auth_sends_the_token_as_the_users_password_and_follows_a_rotation() {
    ensure::redis();
    let prefix = unique_prefix();
    let _cleanup = Cleanup(prefix.clone());
    let user = object_id();
    let (first, rotated) = (fake_token("first"), fake_token("rotated"));
    let keys_pattern = format!("~{prefix}:*");
    let grant = format!(">{first}");
    assert_eq!(
        cli(&[
            "ACL",
            "SETUSER",
            &user.0,
            "on",
            &grant,
            &keys_pattern,
            "+@all"
        ]),
        "OK"
    );
    // Two-second tokens: renewed at three quarters of their life (1.5 s), so the test
    // sees renewals; real ones live an hour and are renewed five minutes before expiry.
    let source = FakeToken::new(REDIS_SCOPE, &first, Duration::from_secs(2));
    let url = format!("redis://{}@127.0.0.1:6379", user.0);
    let ledger = RedisClient::lazy_with_entra(
        &settings(&url, &prefix, TIMEOUT),
        entra_credential(source.clone()),
    )
    .unwrap();

    // The URL's user with the token as password: AUTH succeeds and the scripts run on
    // this deployment's keys.
    ping_until_ok(&ledger, Duration::from_secs(3)).await;
    assert_eq!(
        look(&ledger, &queue_key(&ledger, "orders")).await.unwrap(),
        None
    );
    let before = connections_of(&user.0);
    assert_eq!(
        before.len(),
        1,
        "one connection as the object id: {before:?}"
    );
    assert!(source.calls() >= 1);

    // Rotation: Redis accepts the new token too, the credential hands it out; once the
    // live connection renewed (1.5 s), the old token is revoked.
    let grant = format!(">{rotated}");
    assert_eq!(cli(&["ACL", "SETUSER", &user.0, &grant]), "OK");
    source.set_secret(&rotated);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let revoke = format!("<{first}");
    assert_eq!(cli(&["ACL", "SETUSER", &user.0, &revoke]), "OK");

    // The live connection keeps re-authenticating, now with the new token only: after a
    // call, its last command becomes an AUTH again, and Redis refused none.
    ledger.ping().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = connections_of(&user.0);
        if now.len() == 1 && now[0].contains(" cmd=auth ") {
            break;
        }
        assert!(Instant::now() < deadline, "no re-AUTH seen: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(acl_denials_of(&user.0), 0, "an AUTH was refused");
    let after = connections_of(&user.0);
    assert_eq!(after.len(), 1, "{after:?}");
    let id = |line: &str| line.split(' ').next().unwrap_or_default().to_owned();
    assert_eq!(
        id(&after[0]),
        id(&before[0]),
        "the same connection, re-authenticated"
    );
    ledger.ping().await.unwrap();

    // A new connection (the old one killed) authenticates with the new token.
    assert_eq!(cli(&["CLIENT", "KILL", "USER", &user.0]), "1");
    ping_until_ok(&ledger, Duration::from_secs(5)).await;
    let reconnected = connections_of(&user.0);
    assert_eq!(reconnected.len(), 1, "{reconnected:?}");
    assert_ne!(id(&reconnected[0]), id(&before[0]));
    assert_eq!(acl_denials_of(&user.0), 0, "an AUTH was refused");

    // The control: a ledger whose credential still hands out the revoked token is refused,
    // and its error does not carry the token.
    let stale = FakeToken::new(REDIS_SCOPE, &first, Duration::from_secs(3600));
    let refused =
        RedisClient::lazy_with_entra(&settings(&url, &prefix, TIMEOUT), entra_credential(stale))
            .unwrap();
    let e = refused.ping().await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(matches!(e, RedisError::Failed(_)), "{text}");
    assert!(!text.contains(&first) && !text.contains(&rotated), "{text}");
    assert!(
        acl_denials_of(&user.0) >= 1,
        "Redis refused the revoked token"
    );
}

#[tokio::test]
async fn without_an_entra_token_the_ledger_errs_then_joins_when_one_comes() {
    ensure::redis();
    let prefix = unique_prefix();
    let _cleanup = Cleanup(prefix.clone());
    let user = object_id();
    let token = fake_token("late");
    let grant = format!(">{token}");
    let keys_pattern = format!("~{prefix}:*");
    assert_eq!(
        cli(&[
            "ACL",
            "SETUSER",
            &user.0,
            "on",
            &grant,
            &keys_pattern,
            "+@all"
        ]),
        "OK"
    );
    let source = FakeToken::new(REDIS_SCOPE, &token, Duration::from_secs(3600));
    source.set_failing(true);
    let url = format!("redis://{}@127.0.0.1:6379", user.0);
    let ledger = RedisClient::lazy_with_entra(
        &settings(&url, &prefix, TIMEOUT),
        entra_credential(source.clone()),
    )
    .unwrap();

    let started = Instant::now();
    let e = ledger.ping().await.unwrap_err();
    within(started, Duration::from_millis(1500));
    let text = e.to_string();
    assert!(matches!(e, RedisError::Failed(_)), "{e:?}");
    assert!(text.contains("Entra"), "says why: {text}");
    assert!(!text.contains(&token), "{text}");
    assert!(connections_of(&user.0).is_empty());

    // A token can be had again: the same ledger connects (after the credential's failure
    // pause of at most 5 s), without a restart.
    source.set_failing(false);
    ping_until_ok(&ledger, Duration::from_secs(8)).await;
    assert_eq!(connections_of(&user.0).len(), 1);
    assert_eq!(acl_denials_of(&user.0), 0);
}

// ---- A replica's seat in the fleet (src/admission/shared.rs) and its local gate
// (src/admission/capacity.rs), on the real Redis through the fault proxy.

/// Retries `call` until Redis answers (a reconnect after a failover), within 5 s.
async fn answered<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LedgerError>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match call().await {
            Ok(value) => return value,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("Redis never answered: {e}"),
        }
    }
}

/// A real failover: a replica of the primary is promoted before the primary's last write
/// reached it, and the address the fleet uses moves to it. The replica that calls next saw
/// nothing of the lost write (its epoch and version are all in the copy), so only the
/// hash's record of which Redis process wrote it shows the copy may be missing writes:
/// the state is made anew, with a new epoch, for that caller too (docs/fleet.md, step 5).
#[tokio::test]
async fn a_failover_to_a_replica_that_missed_a_write_is_a_new_epoch_even_for_a_caller_that_saw_none_of_it(
) {
    let primary = RedisServer::start().await;
    let replica = RedisServer::start().await;
    let port = primary.addr().port().to_string();
    // The first sync at once, not after the default 5 s wait for more replicas.
    primary
        .cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"])
        .await;
    replica.cli(&["REPLICAOF", "127.0.0.1", &port]).await;
    let proxy = FaultProxy::start(primary.addr()).await;
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let ledger = RedisClient::connect(&settings(&url, "sg", TIMEOUT))
        .await
        .unwrap();
    let key = queue_key(&ledger, "q");
    let q = QueueRef {
        key: &key,
        terms: TERMS,
    };
    let b = |seen| Caller {
        replica: "b",
        seen,
        carry: 0,
    };
    let joined = ledger.heartbeat(q, b(Epoch::NONE)).await.unwrap().epoch;
    let a = |seen| Caller {
        replica: "a",
        seen,
        carry: 0,
    };
    let a_saw = ledger.heartbeat(q, a(joined)).await.unwrap().epoch;
    let (ticket, _) = ledger.lease_read(q, b(joined), LONG).await.unwrap();
    let ok = ReadOutcome::Ok {
        backlog: 0,
        send_disabled: false,
    };
    let b_saw = ledger
        .publish_read(
            q,
            b(joined),
            ticket.expect("the lease is free"),
            ok,
            ReadFor::Ttl {
                in_streak: true,
                ends_lease: true,
            },
        )
        .await
        .unwrap()
        .epoch;
    // The replica has everything b saw, and is promoted: its copy stops there.
    assert_eq!(primary.cli(&["WAIT", "1", "5000"]).await, "1", "replicated");
    assert_eq!(replica.cli(&["REPLICAOF", "NO", "ONE"]).await, "OK");
    // a's grant reaches only the old primary.
    let ask = Ask {
        block_id: "a:1",
        want: 5,
        limit: 10,
        divisor: 1,
        lease: LONG,
    };
    let (granted, _) = ledger.reserve(q, a(a_saw), ask).await.unwrap();
    assert_eq!(granted, ReserveAnswer::Granted { granted: 5 });

    proxy.retarget(replica.addr()).await;
    let view = answered(|| ledger.heartbeat(q, b(b_saw))).await;
    assert!(
        view.epoch.id > b_saw.id,
        "the promoted copy, missing a's block, is made anew: {view:?} after {b_saw:?}"
    );
    let (answer, _) = ledger.reserve(q, a(a_saw), ask).await.unwrap();
    assert_eq!(
        answer,
        ReserveAnswer::NewEpoch,
        "a hears of it on its next call"
    );
}

/// A Redis user whose ACL leaves out `@dangerous` (as Redis Enterprise, so Azure Managed
/// Redis, leaves INFO out of scripts) runs every script: were any but `look` to fail, each
/// replica would join, be cut off and join again, while its health said ok.
#[tokio::test]
async fn a_redis_user_that_may_not_run_info_still_runs_every_script() {
    let server = RedisServer::start().await;
    server
        .cli(&[
            "ACL",
            "SETUSER",
            "gate",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-@dangerous",
        ])
        .await;
    let url = format!("redis://gate:pw@{}", server.addr());
    let ledger = RedisClient::connect(&settings(&url, "sg", TIMEOUT))
        .await
        .unwrap();
    let key = queue_key(&ledger, "q");
    let q = QueueRef {
        key: &key,
        terms: TERMS,
    };
    let view = ledger
        .heartbeat(q, caller())
        .await
        .expect("the preamble runs");
    let again = Caller {
        seen: view.epoch,
        ..caller()
    };
    let next = ledger.heartbeat(q, again).await.unwrap();
    assert_eq!(
        next.epoch.id, view.epoch.id,
        "one epoch: no run_id is not a new one"
    );
}

/// The lag's 100 ms buckets are one field, bounded by the lag, not a field each (every call
/// loads and walks the whole hash); a bucket an older build's replica wrote as a field of
/// its own (`r:<n>`, during a rollout) still counts in a ticket within the lag, and is
/// pruned once older.
#[tokio::test]
async fn the_lag_buckets_are_one_bounded_field_and_an_older_builds_bucket_fields_still_count() {
    ensure::redis();
    let prefix = unique_prefix();
    let _cleanup = Cleanup(prefix.clone());
    let ledger = RedisClient::connect(&settings("redis://127.0.0.1:6379", &prefix, TIMEOUT))
        .await
        .unwrap();
    let key = queue_key(&ledger, "q");
    let q = QueueRef {
        key: &key,
        terms: Terms {
            lag: Duration::from_millis(300),
            ..TERMS
        },
    };
    let me = |seen| Caller { seen, ..caller() };
    let mut seen = ledger.heartbeat(q, caller()).await.unwrap().epoch;
    let (ticket, view) = ledger
        .lease_read(q, me(seen), Duration::from_millis(100))
        .await
        .unwrap();
    seen = view.epoch;
    let ok = ReadOutcome::Ok {
        backlog: 0,
        send_disabled: false,
    };
    let view = ledger
        .publish_read(
            q,
            me(seen),
            ticket.unwrap(),
            ok,
            ReadFor::Ttl {
                in_streak: true,
                ends_lease: true,
            },
        )
        .await
        .unwrap();
    seen = view.epoch;
    let ask = Ask {
        block_id: "me:1",
        want: 100,
        limit: 1000,
        divisor: 1,
        lease: LONG,
    };
    let (granted, view) = ledger.reserve(q, me(seen), ask).await.unwrap();
    assert_eq!(granted, ReserveAnswer::Granted { granted: 100 });
    seen = view.epoch;
    // One stored send in each of 25 buckets, 2.5 s: a lag of 0.3 s keeps the last ~13.
    for _ in 0..25 {
        let row = Settle {
            block_id: "me:1",
            stored: 1,
            not_stored: 0,
        };
        seen = ledger.settle(q, me(seen), &[row]).await.unwrap().epoch;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut pipe = ::redis::pipe();
    pipe.cmd("HGET")
        .arg(&key)
        .arg("lag_buckets")
        .cmd("HLEN")
        .arg(&key);
    let (buckets, fields): (String, u64) = ledger.query(&pipe).await.unwrap();
    let kept = buckets.split(' ').count();
    assert!((3..=15).contains(&kept), "{kept} buckets kept: {buckets}");
    // The fixed fields (the paced read's count and time among them) and a few blocks: not
    // one field per bucket.
    assert!(fields < 27, "{fields} fields in the hash");

    // Past the lag: none of those is left out of a ticket. An older build's bucket of now,
    // and one of 10 s ago.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut pipe = ::redis::pipe();
    pipe.cmd("TIME");
    let ((s, us),): ((u64, u64),) = ledger.query(&pipe).await.unwrap();
    let bucket = (s * 1000 + us / 1000) / 100;
    let mut pipe = ::redis::pipe();
    pipe.cmd("HSET")
        .arg(&key)
        .arg(format!("r:{bucket}"))
        .arg(4)
        .arg(format!("r:{}", bucket - 100))
        .arg(7)
        .ignore();
    ledger.query::<()>(&pipe).await.unwrap();
    let (ticket, _) = ledger
        .lease_read(q, me(seen), Duration::from_millis(100))
        .await
        .unwrap();
    let ticket = ticket.expect("the first lease has ended");
    assert_eq!(
        ticket.completed_at_start,
        25 - 4,
        "the older build's bucket within the lag may not show in the read"
    );
    let mut pipe = ::redis::pipe();
    pipe.cmd("HEXISTS")
        .arg(&key)
        .arg(format!("r:{}", bucket - 100));
    let (old,): (bool,) = ledger.query(&pipe).await.unwrap();
    assert!(!old, "a bucket older than the lag is pruned");
}

/// The tenants' exchange (docs/fairness.md, "In a fleet") on the real Redis: each replica
/// hears the sum of the others' counts of the round, a damaged field is skipped, a flush
/// loses the counts (and nothing else breaks), and nothing is written to the ceiling's hash.
#[tokio::test]
async fn the_tenants_exchange_sums_the_other_replicas_counts_and_survives_a_flush_of_its_key() {
    use sendgate::coordination::shares::{Counts, RoundCounts, ShareExchange};
    ensure::redis();
    let prefix = unique_prefix();
    let _cleanup = Cleanup(prefix.clone());
    let ledger = RedisClient::connect(&settings("redis://127.0.0.1:6379", &prefix, TIMEOUT))
        .await
        .unwrap();
    let queue = queue_key(&ledger, "requests");
    let key = format!("{queue}:tenants");
    let counts = |round, asked, admitted| {
        let mut c = RoundCounts::empty(round);
        c.tenants.insert(
            "greedy".into(),
            Counts {
                asked_before: 0,
                asked,
                admitted,
            },
        );
        c
    };
    // Counts past a Lua double's exact range travel as the string they were sent as.
    let big = (1u64 << 53) + 1;
    let heard = ledger
        .exchange(&key, "r1", &counts(7, big, 3))
        .await
        .unwrap();
    assert!(heard.tenants.is_empty(), "nobody else yet: {heard:?}");
    cli(&["HSET", &key, "junk", "not|a replica's counts"]);
    let heard = ledger
        .exchange(&key, "r2", &counts(7, 10, 1))
        .await
        .unwrap();
    assert_eq!(heard.tenants["greedy"].asked, big);
    assert_eq!(heard.tenants["greedy"].admitted, 3);
    // r1's counts of round 7, heard in round 8: its asks move back a round.
    let heard = ledger.exchange(&key, "r3", &counts(8, 1, 1)).await.unwrap();
    assert_eq!(heard.round, 8);
    assert_eq!(heard.tenants["greedy"].asked_before, big + 10);
    assert_eq!(heard.tenants["greedy"].admitted, 0);
    assert_eq!(
        cli(&["EXISTS", &queue]),
        "0",
        "the ceiling's hash is not touched"
    );
    let ttl: i64 = cli(&["PTTL", &key]).parse().unwrap();
    assert!(ttl > 0 && ttl <= 3_000, "kept for its counts' time: {ttl}");
    cli(&["DEL", &key]);
    let heard = ledger.exchange(&key, "r1", &counts(8, 2, 2)).await.unwrap();
    assert!(
        heard.tenants.is_empty(),
        "a flush loses what was heard: {heard:?}"
    );
}
