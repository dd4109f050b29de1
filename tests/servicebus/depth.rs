//! The backlog read from the management endpoint, with the recorded bodies.

use std::time::{Duration, Instant};

use crate::helpers::{assert_sas_verifies, spawn_on, spawn_with, SEND_KEY};
use sendgate_testkit::gateway::{body_json, retry_after};
use sendgate_testkit::servicebus_stub::{
    description, Reply, ServiceBusStub, CLAIM_EMPTY_401, DESCRIPTION, NOT_FOUND_FEED,
};

#[tokio::test]
async fn the_backlog_is_active_plus_scheduled_without_dead_letters() {
    let stub = ServiceBusStub::start().await;
    // 4 active + 3 scheduled = 7; the 50 dead letters are not backlog.
    stub.on_depth(Reply::xml(200, &description(4, 50, 3, "Active")));
    let app = spawn_on(
        stub,
        &[
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "8"),
            ("SENDGATE_DEPTH_TTL_MS", "60000"),
        ],
    )
    .await;
    let health = app.detailed().await;
    assert_eq!(
        health["queues"]["requests"]["backlog"], 7,
        "the start-up read: {health}"
    );

    assert_eq!(app.send("{}").await.status(), 201, "7 is under 8");
    let response = app.send("{}").await;
    assert_eq!(response.status(), 429);
    assert!(retry_after(&response).unwrap() >= 1);
    let body = body_json(response).await;
    assert_eq!(body["code"], "queue_full");
    assert_eq!(
        (body["backlog"].as_u64(), body["limit"].as_u64()),
        (Some(8), Some(8))
    );

    let health = app.detailed().await;
    assert_eq!(health["queues"]["requests"]["backlog"], 8, "{health}");
    assert_eq!(health["queues"]["requests"]["consecutive_failures"], 0);

    let reads = app.stub.depth_reads();
    assert_eq!(reads.len(), 1, "the start-up read, reused for the TTL");
    assert_eq!(
        reads[0].request_line(),
        "GET /requests?api-version=2021-05 HTTP/1.1"
    );
    assert_eq!(reads[0].header("Accept"), Some("application/xml"));
    let sas = assert_sas_verifies(reads[0].header("Authorization").unwrap(), SEND_KEY);
    assert_eq!(
        sas.skn, "send",
        "no manage key set: the send key reads the depth"
    );
    assert_eq!(app.stub.sends().len(), 1);
}

#[tokio::test]
async fn at_the_ceiling_the_first_send_is_refused_with_the_read_backlog() {
    let stub = ServiceBusStub::start().await;
    // 2 active + 3 scheduled: at the ceiling of 5 from the start.
    stub.on_depth(Reply::xml(200, &description(2, 0, 3, "Active")));
    let app = spawn_on(
        stub,
        &[
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "5"),
            ("SENDGATE_DEPTH_TTL_MS", "60000"),
        ],
    )
    .await;
    let response = app.send("{}").await;
    assert_eq!(response.status(), 429);
    assert!(retry_after(&response).unwrap() >= 1);
    let body = body_json(response).await;
    assert_eq!(body["code"], "queue_full");
    assert_eq!(
        (body["backlog"].as_u64(), body["limit"].as_u64()),
        (Some(5), Some(5))
    );
    assert!(app.stub.sends().is_empty(), "refused without a send");
    assert_eq!(
        app.stub.depth_reads().len(),
        1,
        "decided on the start-up read, reused for the TTL"
    );
}

#[tokio::test]
async fn a_queue_missing_from_the_namespace_is_a_failed_read() {
    let stub = ServiceBusStub::start().await;
    // 200 with an empty ATOM feed: how Service Bus says "no such queue".
    stub.on_depth(Reply::xml(200, NOT_FOUND_FEED));
    let app = spawn_on(
        stub,
        &[
            ("SERVICEBUS_SEND_FAILCLOSED", "true"),
            ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "3"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    // The start-up read failed (the feed is not read as a backlog of 0); it does not
    // start the streak, which counts the reads sends depend on.
    let health = app.detailed().await;
    let queue = &health["queues"]["requests"];
    assert!(queue["backlog"].is_null(), "{health}");
    assert_eq!(queue["consecutive_failures"], 0, "{health}");
    assert_eq!(queue["fail_closed"], false, "{health}");
    assert_eq!(
        app.statuses(2).await,
        [201, 201],
        "failures 1 and 2 (these sends' reads): still open"
    );
    let response = app.send("{}").await;
    assert_eq!(response.status(), 503);
    let body = body_json(response).await;
    assert_eq!(body["code"], "capacity_unknown");
    assert_eq!(body["consecutive_failures"], 3);
    let health = app.detailed().await;
    assert!(
        health["queues"]["requests"]["backlog"].is_null(),
        "{health}"
    );
    assert_eq!(app.stub.sends().len(), 2);
}

#[tokio::test]
async fn a_401_from_the_admin_plane_fails_closed_on_the_third_read_and_recovers() {
    let stub = ServiceBusStub::start().await;
    stub.on_depth(Reply::xml(401, CLAIM_EMPTY_401));
    let app = spawn_on(
        stub,
        &[
            ("SERVICEBUS_SEND_FAILCLOSED", "1"),
            ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "3"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    // The start-up read failed too, but the streak counts the reads sends depend on.
    let health = app.detailed().await;
    assert_eq!(
        health["queues"]["requests"]["consecutive_failures"], 0,
        "{health}"
    );
    assert_eq!(health["queues"]["requests"]["fail_closed"], false);

    // Reads 1 and 2, before sends 1 and 2: below the threshold, fail open.
    assert_eq!(
        app.statuses(2).await,
        [201, 201],
        "below the threshold: fail open"
    );
    let health = app.detailed().await;
    assert_eq!(
        health["queues"]["requests"]["consecutive_failures"], 2,
        "{health}"
    );

    // Read 3, before send 3: the threshold, fail closed (the contract's example).
    let response = app.send("{}").await;
    assert_eq!(response.status(), 503);
    assert_eq!(retry_after(&response), Some(30));
    let body = body_json(response).await;
    assert_eq!(body["code"], "capacity_unknown");
    assert_eq!(body["consecutive_failures"], 3);
    assert_eq!(app.stub.depth_reads().len(), 4, "start-up + one per send");
    assert_eq!(
        app.stub.sends().len(),
        2,
        "the refused send never reached the broker"
    );
    let health = app.detailed().await;
    assert_eq!(health["queues"]["requests"]["fail_closed"], true);
    assert_eq!(health["queues"]["requests"]["consecutive_failures"], 3);

    // The right is granted: the next read works, the streak resets, the send goes through.
    app.stub.on_depth(Reply::xml(200, DESCRIPTION));
    assert_eq!(app.statuses(1).await, [201]);
    assert_eq!(app.stub.depth_reads().len(), 5);
    assert_eq!(app.stub.sends().len(), 3);
    let health = app.detailed().await;
    assert_eq!(health["queues"]["requests"]["consecutive_failures"], 0);
    assert_eq!(health["queues"]["requests"]["fail_closed"], false);
}

#[tokio::test]
async fn a_disabled_queue_is_409_queue_disabled_without_a_send() {
    // Disabled from the start: the start-up read sees it; each send reads again (TTL 0).
    let stub = ServiceBusStub::start().await;
    stub.on_depth(Reply::xml(200, &description(0, 0, 0, "Disabled")));
    let app = spawn_on(stub, &[("SENDGATE_DEPTH_TTL_MS", "0")]).await;
    for status in ["Disabled", "SendDisabled"] {
        app.stub
            .on_depth(Reply::xml(200, &description(0, 0, 0, status)));
        let response = app.send("{}").await;
        assert_eq!(response.status(), 409, "{status}");
        assert_eq!(body_json(response).await["code"], "queue_disabled");
    }
    assert!(app.stub.sends().is_empty(), "no send reached the broker");
    // ReceiveDisabled still takes sends.
    app.stub
        .on_depth(Reply::xml(200, &description(0, 0, 0, "ReceiveDisabled")));
    assert_eq!(app.statuses(1).await, [201]);
}

#[tokio::test]
async fn a_depth_read_that_never_answers_times_out_and_counts_in_the_streak() {
    let stub = ServiceBusStub::start().await;
    stub.on_depth(Reply::Hang);
    let started = Instant::now();
    let app = spawn_on(
        stub,
        &[
            ("SENDGATE_ADMIN_TIMEOUT_MS", "300"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1800),
        "the start-up read gave up after {took:?}, and the gateway runs"
    );
    let health = app.detailed().await;
    assert_eq!(health["gateway_state"], "running", "{health}");
    assert_eq!(
        health["queues"]["requests"]["consecutive_failures"], 0,
        "{health}"
    );
    for streak in 1..=2 {
        let started = Instant::now();
        let response = app.send("{}").await;
        let took = started.elapsed();
        assert_eq!(response.status(), 201, "gate off: fails open");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(1800),
            "the read gave up after {took:?}"
        );
        let health = app.detailed().await;
        assert_eq!(
            health["queues"]["requests"]["consecutive_failures"], streak,
            "{health}"
        );
    }
    assert_eq!(app.stub.depth_reads().len(), 3);
    assert_eq!(app.stub.sends().len(), 2);
}

#[tokio::test]
async fn malformed_hostile_or_oversized_descriptions_are_failed_reads() {
    let app = spawn_with(&[("SENDGATE_DEPTH_TTL_MS", "0")]).await;
    let truncated = &DESCRIPTION[..DESCRIPTION.len() - 40];
    let laughs = r#"<?xml version="1.0"?><!DOCTYPE e [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><entry>&b;</entry>"#;
    let nested = format!("<entry>{}", "<a>".repeat(50_000));
    let huge = description(1, 0, 0, "Active")
        .replace("<content", &format!("{}<content", " ".repeat(2 << 20)));
    let bodies = [
        truncated.to_owned(),
        laughs.to_owned(),
        nested,
        huge,
        "not xml".to_owned(),
        String::new(),
    ];
    // The start-up read got the stub's good description: the streak starts at 0.
    let health = app.detailed().await;
    assert_eq!(
        health["queues"]["requests"]["consecutive_failures"], 0,
        "{health}"
    );
    for (i, body) in bodies.iter().enumerate() {
        app.stub.on_depth(Reply::xml(200, body));
        assert_eq!(app.send("{}").await.status(), 201, "case {i}: fails open");
        let health = app.detailed().await;
        assert_eq!(
            health["queues"]["requests"]["consecutive_failures"],
            i + 1,
            "case {i}: {health}"
        );
    }
    // And the next good read is read.
    app.stub
        .on_depth(Reply::xml(200, &description(3, 0, 0, "Active")));
    assert_eq!(app.send("{}").await.status(), 201);
    let health = app.detailed().await;
    assert_eq!(health["queues"]["requests"]["consecutive_failures"], 0);
}
