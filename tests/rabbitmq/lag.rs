//! The management API's lag, measured against the real broker: how late a burst stored
//! over AMQP shows in `GET /api/queues/…`, against the lag in force the gateway reports.
//! The delays are a property of this deployment (its statistics interval, its collector),
//! not a timing target: they are printed with the lag, and the lag must cover them.

use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;

use sendgate_testkit::rabbit;
use sendgate_testkit::rabbitmq_app::{spawn, RabbitApp};

/// Messages per burst, and bursts (each starting at another point of the broker's
/// statistics cycle, so the worst phase is likely among them).
const BURST: u64 = 50;
const BURSTS: u64 = 5;

/// The primary's `depth_lag_ms` and `depth_lag_source`, once the source is `want` (the
/// measurement spans a few refresh periods after start-up).
async fn lag_once(app: &RabbitApp, want: &str, within: Duration) -> (u64, String) {
    let started = Instant::now();
    loop {
        let d = app.detailed().await;
        let primary = &d["backends"]["primary"];
        let source = primary["depth_lag_source"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if source == want {
            let lag = primary["depth_lag_ms"]
                .as_u64()
                .expect("a lag with its source");
            return (lag, source);
        }
        assert!(
            started.elapsed() < within,
            "the lag's source never became {want}: {primary}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the management API says the queue holds now (`None` before it lists it).
async fn management_count(client: &reqwest::Client, queue: &str) -> Option<u64> {
    let url = format!(
        "http://{}/api/queues/%2F/{queue}?columns=messages",
        rabbit::MANAGEMENT
    );
    let response = client
        .get(&url)
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .ok()?;
    let body: serde_json::Value = response.json().await.ok()?;
    body.get("messages")?.as_u64()
}

#[tokio::test]
async fn a_burst_shows_on_the_management_api_within_the_lag_in_force() {
    let queue = rabbit::unique("sg-lag");
    rabbit::declare(&queue, &[]).await;
    rabbit::wait_for_management_count(&queue, 0).await;
    let app = spawn(&queue, &[("SENDGATE_PROBE_INTERVAL_S", "0")]).await;
    let (lag_ms, _) = lag_once(&app, "broker", Duration::from_secs(90)).await;
    let lag = Duration::from_millis(lag_ms);

    sendgate::tls::install_ring();
    let client = reqwest::Client::new();
    let conn = rabbit::connect().await;
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut delays = Vec::new();
    for burst in 0..BURSTS {
        // Another phase of the broker's cycle each time (0, 1.3, 2.6, … s apart, mod 5 s).
        tokio::time::sleep(Duration::from_millis(burst * 1300 % 5000)).await;
        let started = Instant::now();
        let mut confirms = Vec::new();
        for i in 0..BURST {
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    format!("{{\"burst\":{burst},\"i\":{i}}}").as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap();
            confirms.push(confirm);
        }
        for confirm in confirms {
            assert!(confirm.await.unwrap().is_ack(), "the broker took it");
        }
        let confirmed = started.elapsed();
        let want = (burst + 1) * BURST;
        // From the first publish: every message of the burst was stored after it, so this
        // bounds each one's delay from above.
        let delay = loop {
            if management_count(&client, &queue).await == Some(want) {
                break started.elapsed();
            }
            assert!(
                started.elapsed() < lag * 3,
                "burst {burst} not shown after {:?} (lag in force {lag:?})",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!(
            "burst {burst}: {BURST} messages confirmed in {confirmed:?}, shown by the \
             management API {delay:?} after the first publish (lag in force {lag:?})"
        );
        delays.push(delay);
    }
    let _ = conn.close(200, "bye".into()).await;
    let worst = delays.iter().max().copied().unwrap_or_default();
    println!("observed delays {delays:?}; worst {worst:?}; lag in force {lag:?} (broker)");
    for (burst, delay) in delays.iter().enumerate() {
        assert!(
            *delay <= lag,
            "burst {burst} showed {delay:?} late, past the lag in force {lag:?}"
        );
    }
    // Still the lag the gateway reports once the bursts are in.
    assert_eq!(lag_once(&app, "broker", Duration::ZERO).await.0, lag_ms);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn the_lag_in_force_is_shown_per_backend_with_its_source() {
    let queue = rabbit::unique("sg-lag-shown");
    rabbit::declare(&queue, &[]).await;
    // A configured lag longer than any derived one is in force at once; a fallback on the
    // exact `amqp` depth source has none.
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_PROBE_INTERVAL_S", "0"),
            ("SENDGATE_RABBITMQ_STATS_LAG_MS", "3600000"),
            ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
            ("SENDGATE_FALLBACK_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ],
    )
    .await;
    let d = app.detailed().await;
    assert_eq!(d["backends"]["primary"]["depth_lag_ms"], 3_600_000, "{d}");
    assert_eq!(d["backends"]["primary"]["depth_lag_source"], "configured");
    let fallback = d["backends"]["fallback"].as_object().unwrap();
    assert!(!fallback.contains_key("depth_lag_ms"), "{d}");
    assert!(!fallback.contains_key("depth_lag_source"), "{d}");
    drop(app);

    // A management user that may read queues but not list nodes: nothing is measured, the
    // default interval's lag stays in force.
    let user = rabbit::TempUser::new(&["management"]);
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_PROBE_INTERVAL_S", "0"),
            ("SENDGATE_RABBITMQ_MANAGEMENT_USER", &user.name),
            ("SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD", &user.password),
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let primary = &app.detailed().await["backends"]["primary"];
    assert_eq!(primary["depth_lag_ms"], 11_000, "{primary}");
    assert_eq!(primary["depth_lag_source"], "default");
    rabbit::delete(&queue).await;
}
