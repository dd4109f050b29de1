//! The drain as a load balancer and a producer see it (`SENDGATE_DRAIN_LINGER_S`): after
//! SIGTERM the listener keeps answering `503 draining` (readiness 503) for the linger even
//! with nothing in flight, so traffic still routed here meets a `Retry-After` instead of a
//! refused connection; then the process exits 0. A refused producer's `Retry-After` is
//! about as long as the restart takes (the linger left, or the sends in flight's bound, plus
//! a second), not the whole window: a plain HTTP client honouring it is back in seconds.

use std::time::{Duration, Instant};

use sendgate_testkit::embedded::spawn_app_with;
use sendgate_testkit::gateway::{body_json, retry_after, GatewayProcess};

/// The real binary on the embedded queue, in a data directory of its own.
async fn binary(dir: &tempfile::TempDir, vars: &[(&str, &str)]) -> GatewayProcess {
    let data = dir.path().to_str().unwrap();
    let mut all = vec![("SENDGATE_DATA_DIR", data), ("SENDGATE_WORKERS", "2")];
    all.extend_from_slice(vars);
    GatewayProcess::start(&all).await
}

/// Signal `TERM` and wait until the process has taken it: `kill` returns before the
/// gateway's signal task has run.
async fn terminate(gw: &GatewayProcess) {
    gw.signal("TERM");
    let started = Instant::now();
    while gw.detailed().await["gateway_state"] != "draining" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "SIGTERM never began a drain"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn send(gw: &GatewayProcess) -> reqwest::Response {
    gw.client
        .post(gw.url("/v1/queues/requests/messages"))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("the listener still answers while draining")
}

#[tokio::test]
async fn drain_with_nothing_in_flight_answers_503_draining_for_the_linger_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut gw = binary(
        &dir,
        &[
            ("SENDGATE_DRAIN_TIMEOUT_S", "20"),
            ("SENDGATE_DRAIN_LINGER_S", "3"),
        ],
    )
    .await;
    let signalled = Instant::now();
    terminate(&gw).await;

    // Nothing is in flight, yet the port stays open: a request the balancer still routes
    // here is told to come back, on a connection that is then closed.
    let late = send(&gw).await;
    assert_eq!(late.status(), 503);
    assert_eq!(late.headers()["connection"], "close");
    let after = retry_after(&late).expect("Retry-After");
    assert!(
        (2..=4).contains(&after),
        "Retry-After {after} is the 3 s linger left and a second for the restart, not the 20 s window"
    );
    let body = body_json(late).await;
    assert_eq!(body["code"], "draining");
    assert_eq!(body["retry_after_s"], after);

    let ready = gw.client.get(gw.url("/health/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "the balancer sees the drain");

    let d = gw.detailed().await;
    assert_eq!(d["gateway_state"], "draining");
    assert_eq!(d["drain"]["in_flight"], 0);
    let linger = d["drain"]["linger_remaining_s"].as_f64().unwrap();
    assert!(linger > 0.0 && linger <= 3.0, "linger_remaining_s {linger}");

    let (code, exited_at) = gw.exit(Duration::from_secs(15)).await;
    assert_eq!(code, 0);
    assert!(
        exited_at.duration_since(signalled) >= Duration::from_secs(3),
        "not before the linger"
    );
}

#[tokio::test]
async fn drain_without_a_linger_exits_as_soon_as_nothing_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mut gw = binary(
        &dir,
        &[
            ("SENDGATE_DRAIN_TIMEOUT_S", "60"),
            ("SENDGATE_DRAIN_LINGER_S", "0"),
        ],
    )
    .await;
    gw.signal("TERM");
    // Far inside the 60 s window: only "nothing in flight" can have ended it.
    let (code, _) = gw.exit(Duration::from_secs(15)).await;
    assert_eq!(code, 0);
}

#[tokio::test]
async fn drain_cut_short_by_a_second_signal_during_the_linger() {
    let dir = tempfile::tempdir().unwrap();
    let mut gw = binary(
        &dir,
        &[
            ("SENDGATE_DRAIN_TIMEOUT_S", "60"),
            ("SENDGATE_DRAIN_LINGER_S", "60"),
        ],
    )
    .await;
    terminate(&gw).await;
    assert_eq!(send(&gw).await.status(), 503, "lingering");
    gw.signal("TERM");
    // Far inside the 60 s linger: only the second signal can have ended it.
    let (code, _) = gw.exit(Duration::from_secs(15)).await;
    assert_eq!(code, 0);
}

#[tokio::test]
async fn drain_waits_for_a_send_longer_than_the_linger_and_ends_with_it() {
    let app = spawn_app_with(&[
        ("SENDGATE_DRAIN_TIMEOUT_S", "60"),
        ("SENDGATE_DRAIN_LINGER_S", "1"),
        ("SENDGATE_SEND_TIMEOUT_MS", "8000"),
        ("SENDGATE_BODY_TIMEOUT_MS", "2000"),
    ])
    .await;
    app.faults().hold_sends(true);
    let held = app.hold_one_send().await;
    assert!(app.handle.lifecycle.begin_drain(Duration::from_secs(60)));

    // The send in flight may take its body's 2 s and its send's 8 s: a producer refused now
    // is told that and the restart's second, not the 60 s window.
    let refused = app.send("requests", "{}").await;
    assert_eq!(refused.status(), 503);
    let after = retry_after(&refused).expect("Retry-After");
    assert!((10..=11).contains(&after), "Retry-After {after}");
    assert_eq!(body_json(refused).await["retry_after_s"], after);

    // Past the linger, the send still holds the drain open.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let d = app.detailed().await;
    assert_eq!(d["gateway_state"], "draining");
    assert_eq!(d["drain"]["in_flight"], 1);
    assert_eq!(d["drain"]["linger_remaining_s"], 0.0);

    app.faults().hold_sends(false);
    assert_eq!(held.await.unwrap(), 201);
    // Far inside the 60 s window: the send's end ended the drain.
    app.wait_stopped(Duration::from_secs(15)).await;
}
