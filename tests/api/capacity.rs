//! The backlog ceiling and the fail-closed gate, over HTTP (contract section 2).

use sendgate_testkit::embedded::{spawn_app_with, spawn_in, TestApp};
use sendgate_testkit::gateway::{body_json, retry_after};

/// Send `n` messages one after another; the status of each.
async fn statuses(app: &TestApp, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            app.send("requests", &format!("{{\"i\":{i}}}"))
                .await
                .status()
                .as_u16(),
        );
    }
    out
}

#[tokio::test]
async fn with_ceiling_5_exactly_5_of_8_sends_are_queued() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "5"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    let mut refused = Vec::new();
    let mut reads_under_the_ceiling = 0;
    for i in 0..8 {
        if i == 3 {
            reads_under_the_ceiling = app.primary.backlog_reads();
        }
        let response = app.send("requests", &i.to_string()).await;
        if response.status() == 429 {
            assert!(retry_after(&response).unwrap() >= 1);
            refused.push(body_json(response).await);
        } else {
            assert_eq!(response.status(), 201);
        }
    }
    assert_eq!(refused.len(), 3);
    for body in &refused {
        assert_eq!(body["code"], "queue_full");
        // The estimate: 5, or 6 when a read at the ceiling started while the fifth send was
        // in flight and showed it (it stays counted on top until the next read: contract
        // section 2, the double count). The queue itself holds 5 (below).
        let backlog = body["backlog"].as_u64().unwrap();
        assert!((5..=6).contains(&backlog), "{body}");
        assert_eq!(body["limit"], 5);
        assert!(body["request_id"].is_string() && body["message"].is_string());
    }
    assert_eq!(app.stored("requests"), 5);
    assert_eq!(reads_under_the_ceiling, 1, "one read, reused for the TTL");
    // Within a tenth of the ceiling (the 4th send on) and refused at it, a send may start
    // one read in the background (contract section 2).
    assert!(
        app.primary.backlog_reads() <= 1 + 5,
        "{} reads",
        app.primary.backlog_reads()
    );
}

#[tokio::test]
async fn a_429_says_its_retry_after_in_the_body_and_the_drain_rate_as_null_until_measured() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "2"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    assert_eq!(statuses(&app, 2).await, [201, 201]);
    let response = app.send("requests", "{}").await;
    assert_eq!(response.status(), 429);
    let header = retry_after(&response).unwrap();
    let body = body_json(response).await;
    assert_eq!(body["retry_after_s"].as_u64(), Some(header));
    assert!(
        body.get("drain_rate_per_s").is_some_and(|r| r.is_null()),
        "{body}"
    );
    let queue = &app.detailed().await["queues"]["requests"];
    assert!(queue["drain_rate_per_s"].is_null(), "{queue}");
    assert_eq!(queue["refusing_until_backlog"].as_u64(), Some(1), "{queue}");
}

#[tokio::test]
async fn after_a_consumer_takes_messages_sends_are_admitted_again() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "3"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    assert_eq!(statuses(&app, 4).await, [201, 201, 201, 429]);
    assert_eq!(app.receive_all("requests").len(), 3);
    assert_eq!(statuses(&app, 4).await, [201, 201, 201, 429]);
}

#[tokio::test]
async fn a_backlog_already_over_the_ceiling_is_refused_from_the_first_send() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_in(dir.path(), &[]).await;
    assert_eq!(statuses(&app, 3).await, [201, 201, 201]);
    app.stop().await;
    // Restarted with a lower ceiling, the gateway reads the stored backlog before admitting.
    let app = spawn_in(dir.path(), &[("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "2")]).await;
    let response = app.send("requests", "{}").await;
    assert_eq!(response.status(), 429);
    let body = body_json(response).await;
    assert_eq!(
        (body["backlog"].as_u64(), body["limit"].as_u64()),
        (Some(3), Some(2))
    );
}

#[tokio::test]
async fn concurrent_sends_never_overshoot_the_ceiling() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "20"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    let started = std::time::Instant::now();
    let sends: Vec<_> = (0..64)
        .map(|i| {
            let (client, url) = (app.client.clone(), app.url("/v1/queues/requests/messages"));
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .body(format!("{i}"))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut queued = 0;
    let mut full = 0;
    for s in sends {
        match s.await.unwrap() {
            201 => queued += 1,
            429 => full += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((queued, full), (20, 44));
    assert_eq!(app.stored("requests"), 20);
    // They shared one read; at the ceiling a send may start one more in the background,
    // no sooner than 20 ms after the last landed (contract section 2).
    let at_the_ceiling = started.elapsed().as_millis() / 20;
    let reads = app.primary.backlog_reads();
    assert!(
        u128::from(reads) <= 1 + at_the_ceiling,
        "64 concurrent sends made {reads} depth reads in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn gate_on_fails_closed_on_the_third_failed_read_and_recovers() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "true"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "3"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    app.faults().fail_depth_reads(true);
    assert_eq!(
        statuses(&app, 2).await,
        [201, 201],
        "below the threshold the send fails open"
    );

    let response = app.send("requests", "{}").await;
    assert_eq!(response.status(), 503);
    assert_eq!(retry_after(&response), Some(30));
    let body = body_json(response).await;
    assert_eq!(body["code"], "capacity_unknown");
    assert_eq!(body["consecutive_failures"], 3);
    assert_eq!(
        body["reason"], "admin_plane",
        "the failing dependency is named"
    );
    let health = app.detailed().await;
    assert_eq!(health["queues"]["requests"]["fail_closed"], true);
    assert_eq!(health["status"], "degraded");

    app.faults().fail_depth_reads(false);
    assert_eq!(statuses(&app, 1).await, [201]);
    let health = app.detailed().await;
    assert_eq!(health["queues"]["requests"]["consecutive_failures"], 0);
    assert_eq!(health["queues"]["requests"]["fail_closed"], false);
    assert_eq!(app.stored("requests"), 3);
}

/// A replica whose Redis does not answer names the ledger, not the admin plane (which
/// answers): the alert pages Redis's owners.
#[tokio::test]
async fn fail_closed_with_redis_unreachable_names_the_ledger_not_the_admin_plane() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "true"),
        ("SENDGATE_COORDINATION", "redis"),
        ("SENDGATE_REDIS_URL", url.as_str()),
        ("SENDGATE_REDIS_TIMEOUT_MS", "100"),
    ])
    .await;
    let response = app.send("requests", "{}").await;
    assert_eq!(response.status(), 503);
    let body = body_json(response).await;
    assert_eq!(body["code"], "capacity_unknown");
    assert_eq!(body["reason"], "ledger", "{body}");
    let detail = body["message"].as_str().unwrap_or_default();
    assert!(detail.contains("Redis"), "{body}");
    assert!(!detail.contains("times in a row"), "{body}");
}

#[tokio::test]
async fn gate_off_lets_every_send_through_while_reads_fail() {
    let app = spawn_app_with(&[("SENDGATE_DEPTH_TTL_MS", "0")]).await;
    app.faults().fail_depth_reads(true);
    assert_eq!(statuses(&app, 5).await, [201; 5]);
    assert_eq!(
        app.detailed().await["queues"]["requests"]["consecutive_failures"],
        5
    );
}

#[tokio::test]
async fn only_consecutive_failures_count_towards_the_threshold() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "yes"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "2"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    let faults = app.faults();
    let mut seen = Vec::new();
    for fail in [true, false, true] {
        faults.fail_depth_reads(fail);
        seen.push(app.send("requests", "{}").await.status().as_u16());
    }
    assert_eq!(seen, [201, 201, 201]);
}

#[tokio::test]
async fn a_streak_of_0_acts_as_1() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "1"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "0"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    app.faults().fail_depth_reads(true);
    let response = app.send("requests", "{}").await;
    assert_eq!(response.status(), 503);
    assert_eq!(body_json(response).await["consecutive_failures"], 1);
}

#[tokio::test]
async fn a_streak_that_is_not_a_number_acts_as_3() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "TRUE"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "abc"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    app.faults().fail_depth_reads(true);
    assert_eq!(statuses(&app, 3).await, [201, 201, 503]);
}

#[tokio::test]
async fn a_flag_that_is_not_on_leaves_the_gate_off() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "on"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "1"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    app.faults().fail_depth_reads(true);
    assert_eq!(statuses(&app, 3).await, [201, 201, 201]);
}

/// A send refused at a full queue with its `Idempotency-Key` is promised its place
/// (contract section 2, "Claiming a place"): `/health/detailed` counts it until its retry
/// with the same key is admitted. A send without a key is promised nothing.
#[tokio::test]
async fn a_refused_send_with_a_key_is_promised_its_place_until_its_retry_is_admitted() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "10"),
        ("SENDGATE_DEPTH_TTL_MS", "100"),
    ])
    .await;
    let promised = |d: &serde_json::Value| d["queues"]["requests"]["promised"].clone();
    while app.send("requests", "{}").await.status() == 201 {}
    assert_eq!(
        promised(&app.detailed().await),
        serde_json::json!({"promises": 0, "units": 0})
    );
    // A consumer takes 4 a second while the queue stays full: the drain is measured.
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(4) {
        app.receive("requests", 1);
        while app.send("requests", "{}").await.status() == 201 {}
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let rate = app.detailed().await["queues"]["requests"]["drain_rate_per_s"].as_f64();
    assert!(rate.is_some_and(|r| r > 0.0), "drain measured: {rate:?}");
    let unkeyed = app.send("requests", "{}").await;
    assert_eq!(unkeyed.status(), 429);
    assert_eq!(
        promised(&app.detailed().await)["promises"],
        0,
        "no key, no place"
    );

    let keyed = [("Idempotency-Key", "claim-me")];
    let refused = app.send_with("requests", "{}", &keyed).await;
    assert_eq!(refused.status(), 429);
    let told = retry_after(&refused).unwrap();
    assert_eq!(
        promised(&app.detailed().await),
        serde_json::json!({"promises": 1, "units": 1})
    );
    // The consumer makes room; the producer comes back when told.
    app.receive("requests", 5);
    tokio::time::sleep(std::time::Duration::from_secs(told)).await;
    let back = app.send_with("requests", "{}", &keyed).await;
    assert_eq!(back.status(), 201, "{:?}", body_json(back).await);
    assert_eq!(
        promised(&app.detailed().await),
        serde_json::json!({"promises": 0, "units": 0})
    );
}
