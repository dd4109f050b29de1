use sendgate_testkit::embedded::{spawn_app, spawn_app_with};
use sendgate_testkit::gateway::{body_json, retry_after};

#[tokio::test]
async fn live_and_ready_answer_while_running() {
    let app = spawn_app().await;
    let live = app
        .client
        .get(app.url("/health/live"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    assert_eq!(body_json(live).await["status"], "ok");
    let ready = app
        .client
        .get(app.url("/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(body_json(ready).await["gateway_state"], "running");
}

#[tokio::test]
async fn detailed_reports_state_version_pid_queues_and_backends() {
    let app = spawn_app_with(&[
        ("SENDGATE_QUEUES", "requests,batch"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "40"),
    ])
    .await;
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    let d = app.detailed().await;
    assert_eq!(d["status"], "ok");
    assert_eq!(d["gateway_state"], "running");
    assert_eq!(d["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(d["pid"], std::process::id());
    assert!(d["drain"].is_null());
    let q = &d["queues"]["requests"];
    assert_eq!(q["backlog"], 1);
    assert_eq!(q["limit"], 40);
    assert_eq!(q["consecutive_failures"], 0);
    assert_eq!(q["fail_closed"], false);
    let read_at = q["last_read_ok_at"].as_str().unwrap();
    assert!(
        time::OffsetDateTime::parse(read_at, &time::format_description::well_known::Rfc3339)
            .is_ok()
    );
    assert_eq!(
        d["queues"]["batch"]["backlog"], 0,
        "every queue is read once at start-up"
    );
    assert_eq!(d["backends"]["primary"]["kind"], "embedded");
    assert_eq!(d["backends"]["primary"]["breaker"], "closed");
    assert!(
        d["backends"]["primary"].get("depth_lag_ms").is_none(),
        "the embedded store's depth is exact: no lag to show"
    );
}

#[tokio::test]
async fn draining_turns_ready_to_503_and_refuses_sends_until_the_sends_in_flight_can_end() {
    let app = spawn_app_with(&[
        ("SENDGATE_DRAIN_TIMEOUT_S", "30"),
        ("SENDGATE_SEND_TIMEOUT_MS", "20000"),
    ])
    .await;
    // Hold one send in flight so the drain stays open.
    app.faults().hold_sends(true);
    let held = app.hold_one_send().await;
    app.handle
        .lifecycle
        .begin_drain(std::time::Duration::from_secs(30));

    let ready = app
        .client
        .get(app.url("/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert!(retry_after(&ready).unwrap() >= 1);
    let response = app.send("requests", "2").await;
    assert_eq!(response.status(), 503);
    // The send in flight may take its body's 5 s and its send's 20 s, then a second for the
    // restart: within the 30 s window.
    let after = retry_after(&response).unwrap();
    assert!(
        (25..=26).contains(&after),
        "Retry-After is the sends in flight's bound and the restart, got {after}"
    );
    let body = body_json(response).await;
    assert_eq!(body["code"], "draining");
    assert_eq!(body["retry_after_s"], after);
    let d = app.detailed().await;
    assert_eq!(d["gateway_state"], "draining");
    assert_eq!(d["drain"]["in_flight"], 1);
    assert!(d["drain"]["remaining_s"].as_f64().unwrap() > 28.0);

    app.faults().hold_sends(false);
    assert_eq!(
        held.await.unwrap(),
        201,
        "a send in flight completes normally"
    );
    assert_eq!(app.stored("requests"), 1);
}

#[tokio::test]
async fn detailed_shows_the_fail_closed_gate_its_threshold_and_the_breakers_next_trial() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "yes"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "4"),
        ("SENDGATE_SEND_TIMEOUT_MS", "300"),
        ("SENDGATE_BREAKER_MIN_FAILURES", "1"),
        ("SENDGATE_BREAKER_OPEN_S", "60"),
    ])
    .await;
    let d = app.detailed().await;
    let q = &d["queues"]["requests"];
    assert_eq!(q["fail_closed_enabled"], true, "the gate is on");
    assert_eq!(q["fail_closed"], false, "but not refusing");
    assert_eq!(q["streak_threshold"], 4);
    assert!(d["backends"]["primary"]["next_trial_in_s"].is_null());

    // One send that times out opens the breaker (one failure is enough here).
    app.faults().hold_sends(true);
    assert_eq!(app.send("requests", "1").await.status(), 504);
    let d = app.detailed().await;
    let primary = &d["backends"]["primary"];
    assert_eq!(primary["breaker"], "open");
    let next = primary["next_trial_in_s"].as_f64().unwrap();
    assert!((0.0..=60.0).contains(&next) && next > 50.0, "{next}");
}

#[tokio::test]
async fn the_gate_off_is_said_as_such() {
    let app = spawn_app().await;
    let q = &app.detailed().await["queues"]["requests"];
    assert_eq!(q["fail_closed_enabled"], false);
    assert_eq!(q["streak_threshold"], 3, "the default");
}

/// Issue 39: `backlog` is the estimate the ceiling decides by (the read plus the sends
/// counted since); the read itself is shown beside it, with its age.
#[tokio::test]
async fn detailed_shows_the_estimate_and_the_depth_read_it_is_made_from() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "40"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    for _ in 0..3 {
        assert_eq!(app.send("requests", "{}").await.status(), 201);
    }
    let d = app.detailed().await;
    let q = &d["queues"]["requests"];
    assert_eq!(
        q["backlog"], 3,
        "the start-up read and the three sends: {q}"
    );
    assert_eq!(q["depth_read"]["backlog"], 0, "the start-up read: {q}");
    let age = q["depth_read"]["age_s"].as_f64().expect("an age");
    assert!((0.0..60.0).contains(&age), "{q}");
    assert!(q["drain_rate_per_s"].is_null(), "{q}");
}
