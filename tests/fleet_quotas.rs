//! A tenant's rate quota across a fleet on the real binary (docs/fairness.md, "Quotas in a
//! fleet"): three replicas on the local Redis and RabbitMQ, the tenant sending at three
//! times its rate spread over them, are admitted its rate, not three times it. Counts over
//! the span measured here are asserted, not timings: the demand stays above the rate even
//! on a slow machine (the three senders need only answers within 125 ms to ask 1.2x).

use std::time::{Duration, Instant};

use sendgate_testkit::fleet::member;
use sendgate_testkit::keys::{Key, KeysFile};
use sendgate_testkit::{ensure, local_redis, rabbit};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_admit_a_tenant_at_three_times_its_rate_its_rate() {
    ensure::rabbitmq();
    ensure::redis();
    let queue = rabbit::unique("sg-fleet-quota");
    rabbit::declare(&queue, &[]).await;
    let prefix = local_redis::unique_prefix();
    let _cleanup = local_redis::Cleanup(prefix.clone());
    let dir = tempfile::tempdir().unwrap();
    let (per_s, burst) = (20.0, 5);
    let keys = KeysFile::new()
        .key(Key::new("metered", &["sender"]).rate(per_s, burst))
        .write_in(dir.path());
    let vars = [
        ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "100000"),
        ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
        ("SENDGATE_FLEET_MAX_REPLICAS", "3"),
    ];
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(member(&queue, "redis://127.0.0.1:6379", &prefix, &vars).await);
    }
    let client = reqwest::Client::new();
    let send = |url: String| {
        client
            .post(url)
            .header("Authorization", "Bearer metered-secret")
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
    };
    // Each replica admits once (it reads the queue and leases): then the bucket refills.
    for gw in &fleet {
        let url = gw.url(&format!("/v1/queues/{queue}/messages"));
        let started = Instant::now();
        while send(url.clone()).await.unwrap().status() != 201 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never admitted"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let until = started + Duration::from_secs(5);
    let senders = fleet.iter().map(|gw| {
        let url = gw.url(&format!("/v1/queues/{queue}/messages"));
        async move {
            // The rate on each replica: three times it in all.
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_s));
            let (mut sent, mut admitted) = (0u64, 0u64);
            while Instant::now() < until {
                tick.tick().await;
                let answer = send(url.clone()).await.unwrap();
                sent += 1;
                admitted += u64::from(answer.status() == 201);
            }
            (sent, admitted)
        }
    });
    let answers = futures_util::future::join_all(senders).await;
    let elapsed = started.elapsed().as_secs_f64();
    let sent: u64 = answers.iter().map(|(s, _)| s).sum();
    let admitted: u64 = answers.iter().map(|(_, a)| a).sum();
    let target = per_s * elapsed;
    println!(
        "admitted {admitted} of {sent} in {elapsed:.2} s: {:.1}/s against {per_s}/s",
        admitted as f64 / elapsed
    );
    assert!(sent as f64 > 1.2 * target, "demand past the rate: {sent}");
    assert!(
        admitted as f64 <= target + f64::from(burst) + 3.0,
        "at most the rate and one burst: {admitted}, target {target:.0}"
    );
    assert!(
        admitted as f64 >= 0.9 * target,
        "{admitted}, target {target:.0}"
    );
}
