//! Fleet mode on the real binary: several gateway processes against the real local
//! RabbitMQ and Redis keep one ceiling, and a Redis that stops answering turns each
//! replica local (sends keep flowing) until it answers again.

#[path = "support/fault_proxy.rs"]
mod fault_proxy;
#[allow(dead_code)]
#[path = "support/faulty_backend.rs"]
mod faulty_backend;
#[path = "support/gateway.rs"]
mod gateway;
#[path = "support/rabbit.rs"]
mod rabbit;
#[path = "support/redis.rs"]
mod redis_support;

use std::time::{Duration, Instant};

use fault_proxy::{Fault, FaultProxy};
use gateway::GatewayProcess;

/// The real binary on RabbitMQ (exact depth from the data plane), in the fleet `prefix`.
async fn replica(queue: &str, redis_url: &str, prefix: &str, ceiling: &str) -> GatewayProcess {
    GatewayProcess::start(&[
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_QUEUES", queue),
        ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", ceiling),
        ("SENDGATE_DEPTH_TTL_MS", "200"),
        ("SENDGATE_WORKERS", "1"),
        ("SENDGATE_COORDINATION", "redis"),
        ("SENDGATE_REDIS_URL", redis_url),
        ("SENDGATE_REDIS_PREFIX", prefix),
        ("SENDGATE_REDIS_TIMEOUT_MS", "200"),
    ])
    .await
}

async fn wait_for_mode(gw: &GatewayProcess, mode: &str) {
    let started = Instant::now();
    loop {
        let d = gw.detailed().await;
        if d["coordination"]["mode"] == mode {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "coordination never became {mode}: {}",
            d["coordination"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn three_replicas_keep_one_ceiling_under_64_concurrent_senders() {
    rabbit::ensure_broker();
    redis_support::ensure_redis();
    let queue = rabbit::unique("sg-fleet");
    rabbit::declare(&queue, &[]).await;
    let prefix = redis_support::unique_prefix();
    let url = "redis://127.0.0.1:6379";
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(replica(&queue, url, &prefix, "50").await);
    }
    for gw in &fleet {
        wait_for_mode(gw, "redis").await;
    }
    let sends: Vec<_> = (0..64)
        .map(|i| {
            let send = fleet[i % 3].send(&queue, "{}");
            tokio::spawn(async move { send.await.expect("an answer") })
        })
        .collect();
    let mut statuses = Vec::new();
    for s in sends {
        statuses.push(s.await.unwrap());
    }
    // A second wave: whatever the first left, the ceiling holds.
    let again: Vec<_> = (0..64)
        .map(|i| {
            let send = fleet[(i + 1) % 3].send(&queue, "{}");
            tokio::spawn(async move { send.await.expect("an answer") })
        })
        .collect();
    for s in again {
        statuses.push(s.await.unwrap());
    }
    let queued = statuses.iter().filter(|s| **s == 201).count();
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 429),
        "only 201 or 429 queue_full: {statuses:?}"
    );
    let held = rabbit::ready(&queue).await;
    assert_eq!(held as usize, queued, "every 201 is in the queue");
    assert!(held <= 50, "the fleet overshot the ceiling: {held} > 50");
    assert!(
        held >= 40,
        "the fleet kept far under the ceiling ({held}): headroom lost"
    );
    // Every replica sees the same fleet-wide count.
    for gw in &fleet {
        let d = gw.detailed().await;
        assert_eq!(d["coordination"]["mode"], "redis");
        assert_eq!(d["queues"][&queue]["limit"], 50);
    }
    drop(fleet);
    rabbit::delete(&queue).await;
    redis_support::cli(&[
        "EVAL",
        "for _,k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
        "0",
        &format!("{prefix}:*"),
    ]);
}

#[tokio::test]
async fn a_black_holed_redis_turns_each_replica_local_within_its_deadline_and_it_rejoins() {
    rabbit::ensure_broker();
    redis_support::ensure_redis();
    let queue = rabbit::unique("sg-fleet-hole");
    rabbit::declare(&queue, &[]).await;
    let prefix = redis_support::unique_prefix();
    let proxy = FaultProxy::start(redis_support::ADDR.parse().unwrap()).await;
    let url = format!("redis://{}", proxy.addr());
    let a = replica(&queue, &url, &prefix, "1000").await;
    let b = replica(&queue, &url, &prefix, "1000").await;
    wait_for_mode(&a, "redis").await;
    wait_for_mode(&b, "redis").await;
    assert_eq!(a.send(&queue, "{}").await.unwrap(), 201);

    proxy.set(Fault::Blackhole);
    // Sends keep flowing: none waits past its deadline for Redis (200 ms per call).
    for gw in [&a, &b, &a, &b] {
        let started = Instant::now();
        assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a send waited {:?} on a black-holed Redis",
            started.elapsed()
        );
    }
    for gw in [&a, &b] {
        // A replica that happened not to call Redis yet turns local on its next send.
        assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201);
        wait_for_mode(gw, "local").await;
        let d = gw.detailed().await;
        assert_eq!(d["coordination"]["ok"], false);
        assert_eq!(d["status"], "degraded");
        assert!(d["coordination"]["last_error"].is_string());
    }

    proxy.set(Fault::Pass);
    for gw in [&a, &b] {
        wait_for_mode(gw, "redis").await;
        assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201);
        assert_eq!(gw.detailed().await["coordination"]["ok"], true);
    }
    drop((a, b));
    rabbit::delete(&queue).await;
    redis_support::cli(&[
        "EVAL",
        "for _,k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
        "0",
        &format!("{prefix}:*"),
    ]);
}
