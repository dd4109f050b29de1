//! Faults of the whole broker, which every connection on the machine feels: a restart of the
//! real server, and a memory alarm that blocks all publishers. They run one at a time, in a
//! test binary of their own (cargo runs test binaries one after another), so no other test
//! sees the broker down.

use std::process::Command;
use std::time::{Duration, Instant};

use sendgate_testkit::gateway::retry_after;
use sendgate_testkit::rabbit;
use sendgate_testkit::rabbitmq_app::spawn;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_broker_restart_is_survived_and_every_acknowledged_send_is_kept() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let _back_up = BrokerBackUp;
    let queue = rabbit::unique("sg-restart");
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_SEND_TIMEOUT_MS", "2000"),
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ],
    )
    .await;
    let mut created = 0;
    for _ in 0..10 {
        created += u32::from(app.status("{}").await == 201);
    }
    assert_eq!(created, 10);

    // Stop the real server (the whole node) while sendgate runs, and send into the outage.
    rabbit::rabbitmqctl(&["stop"]);
    let mut during = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let status = app.status("{}").await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a send hung during the outage"
        );
        created += u32::from(status == 201);
        during.push(status);
    }
    assert!(
        during.iter().all(|s| *s != 201),
        "nothing can be acknowledged while the broker is down: {during:?}"
    );
    let started = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/ensure-rabbitmq.sh"
        ))
        .status()
        .unwrap();
    assert!(started.success(), "RabbitMQ did not come back");

    let started = Instant::now();
    loop {
        let status = app.status("{}").await;
        if status == 201 {
            created += 1;
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no reconnect after the restart (last {status})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for _ in 0..10 {
        created += u32::from(app.status("{}").await == 201);
    }
    assert_eq!(
        rabbit::ready(&queue).await,
        created,
        "every 2xx survived the restart, nothing else was stored"
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_memory_alarm_is_503_backend_busy_never_a_hung_request() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let queue = rabbit::unique("sg-alarm");
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_SEND_TIMEOUT_MS", "1000"),
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201);

    rabbit::rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"]);
    let restore = Restore;
    let mut busy = None;
    for _ in 0..6 {
        let started = Instant::now();
        let response = app.send("{}").await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1000 + 1500),
            "a send waited {took:?} under the alarm"
        );
        let status = response.status().as_u16();
        assert_ne!(
            status, 201,
            "nothing is accepted while publishers are blocked"
        );
        if status == 503 {
            busy = Some((
                retry_after(&response),
                response.json::<serde_json::Value>().await.unwrap(),
            ));
            break;
        }
        // The first publish after the alarm is what makes the broker block the connection;
        // it ends at its deadline (504), and the connection reports itself blocked.
        assert_eq!(status, 504);
    }
    let (after, body) = busy.expect("a blocked broker is reported as busy");
    assert_eq!(body["code"], "backend_busy");
    assert!(after.unwrap() >= 1);
    drop(restore);

    let started = Instant::now();
    while app.status("{}").await != 201 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not accepted again after the alarm cleared"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    rabbit::delete(&queue).await;
}

/// Starts the broker again even when the test fails half-way.
struct BrokerBackUp;

impl Drop for BrokerBackUp {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/ensure-rabbitmq.sh"
            ))
            .status();
    }
}

/// Puts the memory watermark back even when the test fails.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "set_vm_memory_high_watermark", "0.4"])
            .status();
    }
}
