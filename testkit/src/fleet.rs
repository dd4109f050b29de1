//! A fleet on the real binary: `sendgate` processes on the local RabbitMQ keeping one
//! ceiling through a Redis (docs/fleet.md).

use std::time::{Duration, Instant};

use crate::gateway::GatewayProcess;

/// The real binary on RabbitMQ serving `queue`, a member of the fleet `prefix` through
/// `redis_url`, with one worker and a Redis deadline generous enough that a loaded machine
/// never turns it local; then `vars`.
pub async fn member(
    queue: &str,
    redis_url: &str,
    prefix: &str,
    vars: &[(&str, &str)],
) -> GatewayProcess {
    let mut all = vec![
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_QUEUES", queue),
        ("SENDGATE_WORKERS", "1"),
        ("SENDGATE_COORDINATION", "redis"),
        ("SENDGATE_REDIS_URL", redis_url),
        ("SENDGATE_REDIS_PREFIX", prefix),
        ("SENDGATE_REDIS_TIMEOUT_MS", "500"),
    ];
    all.extend_from_slice(vars);
    GatewayProcess::start(&all).await
}

/// Wait until `gw`'s `/health/detailed` reports its coordination in `mode` (`redis`: in
/// the fleet; `local`: on its own); 10 s at most.
pub async fn wait_for_mode(gw: &GatewayProcess, mode: &str) {
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
