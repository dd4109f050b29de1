//! The fleet under real faults, on the real binary: three replicas keep one ceiling of 500
//! through a Redis of the test's own, in front of the local RabbitMQ, while 64 concurrent
//! senders fill the queue and Redis is restarted empty, flushed, loses the queue's state
//! (what a `volatile-*` eviction does) or one replica is cut off from it for 15 s.
//!
//! Each run counts what the broker stored (exactly: a passive declare, once the count
//! settles) and checks it against the bound docs/fleet.md gives for the fault: `L + U`, or
//! `L + U + ⌈L/N⌉` for one replica cut off and failing open, where U counts the sends whose
//! outcome is unknown (a 504, a transport error, a body saying `outcome: unknown`). And in
//! every run no acknowledged message is lost: 201s ≤ stored ≤ 201s + unknown.
//!
//! The runs share one machine's cores and one broker, so they take turns (one lock), and
//! each prints its numbers (`cargo test --test fleet_faults -- --nocapture`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sendgate_testkit::fault_proxy::{Fault, FaultProxy};
use sendgate_testkit::fleet::{member, wait_for_mode};
use sendgate_testkit::gateway::GatewayProcess;
use sendgate_testkit::redis_server::RedisServer;
use sendgate_testkit::{ensure, rabbit};

/// The fleet's ceiling `L`.
const CEILING: u64 = 500;
/// Its size `N`.
const REPLICAS: usize = 3;
/// Concurrent senders, spread evenly over the replicas.
const SENDERS: usize = 64;
/// The fault strikes once this many sends were acknowledged (201).
const FAULT_AT: u64 = 250;
/// How long the fill goes on after a fault of the ledger: longer than the management
/// API's lag and a replica's spell alone, so whatever the fault lets in gets in.
const FILL_AFTER_FAULT: Duration = Duration::from_secs(10);
/// The replicas' send deadline `D` (a publish not confirmed by then is answered 504).
const SEND_TIMEOUT_MS: &str = "2000";
/// Their key prefix (the default, spelled out: the eviction names the queue's keys).
const PREFIX: &str = "sendgate";
/// How long a sender waits after a refusal before it asks again.
const BACKOFF: Duration = Duration::from_millis(100);
/// Each sender sends at most this many times.
const MAX_SENDS_PER_SENDER: usize = 1000;

/// One run at a time: three replicas and 64 senders take the machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// The management API (the default): lags the data plane by a few seconds.
    Management,
    /// A passive declare: exact (ready messages).
    Amqp,
}

impl Depth {
    fn source(self) -> &'static str {
        match self {
            Self::Management => "management",
            Self::Amqp => "amqp",
        }
    }
}

/// Three replicas serving `queue` with ceiling 500, a TTL of 1 s, a send deadline of 2 s
/// and a Redis deadline of 500 ms; replica `i` reaches Redis at `redis_urls[i]`. Each is
/// in the fleet when returned.
async fn fleet(
    queue: &str,
    redis_urls: [&str; REPLICAS],
    depth: Depth,
    fail_closed: bool,
) -> Vec<GatewayProcess> {
    let ceiling = CEILING.to_string();
    let fail_closed = if fail_closed { "true" } else { "false" };
    let mut replicas = Vec::new();
    for url in redis_urls {
        let vars = [
            ("SENDGATE_SEND_TIMEOUT_MS", SEND_TIMEOUT_MS),
            ("SENDGATE_DEPTH_TTL_MS", "1000"),
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", depth.source()),
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", ceiling.as_str()),
            ("SERVICEBUS_SEND_FAILCLOSED", fail_closed),
        ];
        replicas.push(member(queue, url, PREFIX, &vars).await);
    }
    for gw in &replicas {
        wait_for_mode(gw, "redis").await;
    }
    replicas
}

/// What one send was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// 201: the broker confirmed it.
    Stored,
    /// 429 `queue_full`.
    Full,
    /// 503, with its code (`capacity_unknown`, `saturated`...): refused, never published.
    Refused(String),
    /// May be stored or not: a 504, a transport error, a body saying `outcome: unknown`,
    /// or any answer this file does not know to be a refusal.
    Unknown(String),
}

#[derive(Debug, Clone)]
struct Answer {
    replica: usize,
    asked: Instant,
    outcome: Outcome,
}

async fn send_once(client: &reqwest::Client, url: &str) -> Outcome {
    let response = match client
        .post(url)
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Outcome::Unknown("client timeout".into()),
        Err(_) => return Outcome::Unknown("transport error".into()),
    };
    let status = response.status().as_u16();
    if status == 201 {
        return Outcome::Stored;
    }
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    let code = body["code"].as_str().unwrap_or("no code").to_owned();
    match status {
        _ if body["outcome"] == "unknown" => Outcome::Unknown(format!("{status} {code}")),
        429 => Outcome::Full,
        503 => Outcome::Refused(code),
        _ => Outcome::Unknown(format!("{status} {code}")),
    }
}

/// 64 senders, each sending to one replica (sender `i` to replica `i % 3`) again and
/// again: at once after a 201 or an unknown outcome, after [`BACKOFF`] after a refusal;
/// until told to stop, `MAX_SENDS_PER_SENDER` sends, or a hard deadline.
struct Fill {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    senders: Vec<tokio::task::JoinHandle<Vec<Answer>>>,
}

impl Fill {
    fn start(fleet: &[GatewayProcess], queue: &str, hard_stop: Duration) -> Self {
        sendgate::tls::install_ring();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client");
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + hard_stop;
        let senders = (0..SENDERS)
            .map(|i| {
                let replica = i % fleet.len();
                let url = fleet[replica].url(&format!("/v1/queues/{queue}/messages"));
                let (client, stop, acked) = (client.clone(), stop.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::SeqCst)
                        && answers.len() < MAX_SENDS_PER_SENDER
                        && Instant::now() < deadline
                    {
                        let asked = Instant::now();
                        let outcome = send_once(&client, &url).await;
                        let refused = matches!(outcome, Outcome::Full | Outcome::Refused(_));
                        if outcome == Outcome::Stored {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        answers.push(Answer {
                            replica,
                            asked,
                            outcome,
                        });
                        if refused {
                            tokio::time::sleep(BACKOFF).await;
                        }
                    }
                    answers
                })
            })
            .collect();
        Self {
            stop,
            acked,
            senders,
        }
    }

    /// Wait until `n` sends were acknowledged (at most `within`).
    async fn until_acked(&self, n: u64, within: Duration) {
        let started = Instant::now();
        while self.acked.load(Ordering::SeqCst) < n {
            assert!(
                started.elapsed() < within,
                "the fill acknowledged only {} sends in {within:?}",
                self.acked.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stop sending; every answer, once the last send in flight is answered.
    async fn finish(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = Vec::new();
        for s in self.senders {
            all.extend(s.await.expect("a sender ends"));
        }
        all
    }
}

#[derive(Debug, Default)]
struct Tally {
    stored: u64,
    full: u64,
    refused: u64,
    unknown: u64,
    /// Every answer but a 201 or 429, by code.
    codes: BTreeMap<String, u64>,
}

fn tally<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> Tally {
    let mut t = Tally::default();
    for a in answers {
        match &a.outcome {
            Outcome::Stored => t.stored += 1,
            Outcome::Full => t.full += 1,
            Outcome::Refused(code) => {
                t.refused += 1;
                *t.codes.entry(format!("503 {code}")).or_default() += 1;
            }
            Outcome::Unknown(what) => {
                t.unknown += 1;
                *t.codes.entry(what.clone()).or_default() += 1;
            }
        }
    }
    t
}

/// What the broker holds once the count stops moving: the same exact count (a passive
/// declare) for 3 s, longer than a send deadline, so a publish still on its way lands.
async fn settled_depth(queue: &str) -> u64 {
    let started = Instant::now();
    let mut last = u64::from(rabbit::ready(queue).await);
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_secs(3) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the queue's depth never settled (last {last})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = u64::from(rabbit::ready(queue).await);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

/// Print a run's numbers and check them: no acknowledged message lost, nothing stored that
/// was refused, and at most `ceiling_plus` (the fault's allowance on top of `L`) plus the
/// unknown outcomes stored; then that the fill did reach the ceiling (some 429s).
fn check(run: &str, stored: u64, t: &Tally, ceiling_plus: u64, started: Instant) {
    let bound = CEILING + ceiling_plus + t.unknown;
    println!(
        "{run}: stored {stored} (bound {bound} = {CEILING} + {ceiling_plus} + unknown {}), \
         201 {}, 429 {}, 503 {}, unknown {}, other answers {:?}, {:.1} s",
        t.unknown,
        t.stored,
        t.full,
        t.refused,
        t.unknown,
        t.codes,
        started.elapsed().as_secs_f64()
    );
    assert!(
        t.stored <= stored,
        "{run}: acknowledged messages were lost: {} answered 201, {stored} on the broker",
        t.stored
    );
    assert!(
        stored <= t.stored + t.unknown,
        "{run}: the broker holds {stored}, more than the {} acknowledged + {} unknown",
        t.stored,
        t.unknown
    );
    assert!(
        stored <= bound,
        "{run}: the fleet overshot: {stored} stored > {bound} \
         ({CEILING} + {ceiling_plus} + {} unknown)",
        t.unknown
    );
    assert!(
        t.full > 0,
        "{run}: the fill never reached the ceiling (no 429): the run shows nothing"
    );
}

/// A queue of the run's own, empty and known to the management API.
async fn fresh_queue(name: &str) -> String {
    ensure::rabbitmq();
    ensure::redis(); // installs redis-server and redis-cli if missing
    let queue = rabbit::unique(name);
    rabbit::declare(&queue, &[]).await;
    rabbit::wait_for_management_count(&queue, 0).await;
    queue
}

/// What happens to the fleet's Redis mid-fill.
#[derive(Debug, Clone, Copy)]
enum LedgerFault {
    /// SIGKILL redis-server, start a new empty one on the same port.
    RestartEmpty,
    /// `FLUSHALL`.
    FlushAll,
    /// Delete the queue's count, as a `volatile-*` eviction may: the whole state where it
    /// is one hash (`{prefix}:{kind/queue}`, docs/fleet.md), else its `:count` key.
    EvictQueueState,
}

async fn strike(fault: LedgerFault, redis: &mut RedisServer, queue: &str) -> String {
    match fault {
        LedgerFault::RestartEmpty => {
            redis.restart_empty().await;
            "redis-server killed and started again empty".into()
        }
        LedgerFault::FlushAll => {
            let reply = redis.cli(&["FLUSHALL"]).await;
            assert_eq!(reply, "OK", "FLUSHALL");
            "FLUSHALL".into()
        }
        LedgerFault::EvictQueueState => {
            let whole = format!("{PREFIX}:{{rabbitmq/{queue}}}");
            let count = format!("{whole}:count");
            let evicted = redis
                .cli(&[
                    "EVAL",
                    "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('DEL', KEYS[1]) \
                     return KEYS[1] end \
                     if redis.call('DEL', KEYS[2]) == 1 then return KEYS[2] end \
                     return 'nothing'",
                    "2",
                    &whole,
                    &count,
                ])
                .await;
            assert_ne!(
                evicted, "nothing",
                "neither {whole} nor {count} exists mid-fill: the layout changed again?"
            );
            format!("DEL {evicted}")
        }
    }
}

/// Fill the fleet (fail-closed off) and strike `fault` at 250 acknowledged sends; the fill
/// goes on for [`FILL_AFTER_FAULT`]. Stored ≤ L + U.
async fn fill_through(fault: LedgerFault, depth: Depth) {
    let _serial = ONE_AT_A_TIME.lock().await;
    let run = format!("{fault:?} mid-fill, {} depths", depth.source());
    let started = Instant::now();
    let queue = fresh_queue("sg-faults").await;
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    let replicas = fleet(&queue, [url.as_str(); REPLICAS], depth, false).await;

    let fill = Fill::start(&replicas, &queue, Duration::from_secs(40));
    fill.until_acked(FAULT_AT, Duration::from_secs(20)).await;
    let struck = Instant::now();
    let what = strike(fault, &mut redis, &queue).await;
    println!(
        "{run}: {what} at {} acknowledged ({:?} to strike)",
        fill.acked.load(Ordering::SeqCst),
        struck.elapsed()
    );
    tokio::time::sleep_until((struck + FILL_AFTER_FAULT).into()).await;
    let answers = fill.finish().await;
    let stored = settled_depth(&queue).await;
    let after = tally(answers.iter().filter(|a| a.asked >= struck));
    println!(
        "{run}: after the fault 201 {}, 429 {}, 503 {}, unknown {}",
        after.stored, after.full, after.refused, after.unknown
    );
    drop(replicas);
    rabbit::delete(&queue).await;
    check(&run, stored, &tally(&answers), 0, started);
}

/// Three replicas, replica 2 reaching Redis through a proxy that black-holes it for 15 s
/// (it still reaches the broker). The fill runs from [`FILL_FROM`] into the cut until its
/// end, when Redis forgot the cut-off replica and a replica alone admits as one of N.
async fn one_cut_off(fail_closed: bool) {
    const CUT: Duration = Duration::from_secs(15);
    // Past the 10 s a replica counts in the fleet after its last call: the others' Redis no
    // longer counts the cut-off replica.
    const FILL_FROM: Duration = Duration::from_secs(11);
    let _serial = ONE_AT_A_TIME.lock().await;
    let run = format!(
        "one replica cut off from Redis for {CUT:?}, fail-closed {}",
        if fail_closed { "on" } else { "off" }
    );
    let started = Instant::now();
    let queue = fresh_queue("sg-faults-cut").await;
    let redis = RedisServer::start().await;
    let proxy = FaultProxy::start(redis.addr()).await;
    let (direct, cut_url) = (redis.url(), format!("redis://{}", proxy.addr()));
    let replicas = fleet(
        &queue,
        [direct.as_str(), direct.as_str(), cut_url.as_str()],
        Depth::Management,
        fail_closed,
    )
    .await;
    const CUT_OFF: usize = 2;

    // Every replica holds a block when the cut starts: a few sends each.
    let mut answers = Vec::new();
    let client = reqwest::Client::new();
    for (replica, gw) in replicas.iter().enumerate() {
        for _ in 0..3 {
            let asked = Instant::now();
            let url = gw.url(&format!("/v1/queues/{queue}/messages"));
            let outcome = send_once(&client, &url).await;
            answers.push(Answer {
                replica,
                asked,
                outcome,
            });
        }
    }
    proxy.set(Fault::Blackhole);
    let cut = Instant::now();
    // A wait on the protocol's clocks (the fleet forgetting a member), not on an event
    // this test could poll for.
    tokio::time::sleep_until((cut + FILL_FROM).into()).await;
    let fill = Fill::start(&replicas, &queue, CUT - FILL_FROM);
    tokio::time::sleep_until((cut + CUT).into()).await;
    answers.extend(fill.finish().await);
    // Every send of the fill was answered while the cut lasted.
    let healed = Instant::now();
    proxy.set(Fault::Pass);
    let stored = settled_depth(&queue).await;
    let cut_off = tally(answers.iter().filter(|a| a.replica == CUT_OFF));
    println!(
        "{run}: the cut-off replica: 201 {}, 429 {}, 503 {}, unknown {}, {:?} (cut for {:?})",
        cut_off.stored,
        cut_off.full,
        cut_off.refused,
        cut_off.unknown,
        cut_off.codes,
        healed - cut
    );
    drop(replicas);
    rabbit::delete(&queue).await;
    // Failing open, the cut-off replica may admit its part of the room alone: ⌈L/N⌉.
    let part = CEILING.div_ceil(REPLICAS as u64);
    check(
        &run,
        stored,
        &tally(&answers),
        if fail_closed { 0 } else { part },
        started,
    );
    if fail_closed {
        // Cut off, it spends what it holds and then answers 503 capacity_unknown (and
        // nothing else) until it rejoins.
        let mut during: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.replica == CUT_OFF && a.asked >= cut)
            .collect();
        during.sort_by_key(|a| a.asked);
        let unknown = Outcome::Refused("capacity_unknown".into());
        let first = during.iter().position(|a| a.outcome == unknown);
        let Some(first) = first else {
            panic!(
                "{run}: the cut-off replica never answered 503 capacity_unknown: {:?}",
                tally(during.iter().copied())
            );
        };
        let later = tally(during[first..].iter().copied());
        assert_eq!(
            later.stored, 0,
            "{run}: after its first capacity_unknown the cut-off replica still admitted: {later:?}"
        );
    }
}

#[tokio::test]
async fn without_a_fault_the_fleet_fills_to_the_ceiling_and_no_further() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let run = "no fault, management depths";
    let started = Instant::now();
    let queue = fresh_queue("sg-faults-none").await;
    let redis = RedisServer::start().await;
    let url = redis.url();
    let replicas = fleet(&queue, [url.as_str(); REPLICAS], Depth::Management, false).await;
    let fill = Fill::start(&replicas, &queue, Duration::from_secs(40));
    fill.until_acked(FAULT_AT, Duration::from_secs(20)).await;
    tokio::time::sleep(FILL_AFTER_FAULT).await;
    let answers = fill.finish().await;
    let stored = settled_depth(&queue).await;
    drop(replicas);
    rabbit::delete(&queue).await;
    check(run, stored, &tally(&answers), 0, started);
}

#[tokio::test]
async fn redis_restarted_empty_mid_fill_keeps_the_ceiling_with_management_depths() {
    fill_through(LedgerFault::RestartEmpty, Depth::Management).await;
}

#[tokio::test]
async fn redis_restarted_empty_mid_fill_keeps_the_ceiling_with_amqp_depths() {
    fill_through(LedgerFault::RestartEmpty, Depth::Amqp).await;
}

#[tokio::test]
async fn flushall_mid_fill_keeps_the_ceiling_with_management_depths() {
    fill_through(LedgerFault::FlushAll, Depth::Management).await;
}

#[tokio::test]
async fn flushall_mid_fill_keeps_the_ceiling_with_amqp_depths() {
    fill_through(LedgerFault::FlushAll, Depth::Amqp).await;
}

#[tokio::test]
async fn the_queues_state_evicted_mid_fill_keeps_the_ceiling_with_management_depths() {
    fill_through(LedgerFault::EvictQueueState, Depth::Management).await;
}

#[tokio::test]
async fn the_queues_state_evicted_mid_fill_keeps_the_ceiling_with_amqp_depths() {
    fill_through(LedgerFault::EvictQueueState, Depth::Amqp).await;
}

#[tokio::test]
async fn a_replica_cut_off_from_redis_failing_closed_refuses_and_the_fleet_keeps_the_ceiling() {
    one_cut_off(true).await;
}

#[tokio::test]
async fn a_replica_cut_off_from_redis_failing_open_admits_at_most_its_part_of_the_room() {
    one_cut_off(false).await;
}
