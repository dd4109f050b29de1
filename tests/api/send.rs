use std::time::Duration;

use sendgate_testkit::embedded::{spawn_app, spawn_app_with, spawn_in, TestApp};
use sendgate_testkit::gateway::{body_json, retry_after};

#[tokio::test]
async fn a_send_is_queued_with_its_ids() {
    let app = spawn_app().await;
    let response = app
        .send_with(
            "requests",
            r#"{"job":1}"#,
            &[("X-Request-Id", "req-7"), ("X-Correlation-Id", "corr-9")],
        )
        .await;
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["X-Request-Id"], "req-7");
    assert_eq!(response.headers()["X-Correlation-Id"], "corr-9");
    let body = body_json(response).await;
    assert_eq!(body["status"], "queued");
    assert_eq!(body["queue"], "requests");
    assert_eq!(body["request_id"], "req-7");
    let message_id = body["message_id"].as_str().unwrap();
    assert!(
        uuid::Uuid::parse_str(message_id).is_ok(),
        "a generated id is a UUID: {message_id}"
    );

    let stored = app.receive_all("requests");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].message_id, message_id);
    assert_eq!(stored[0].correlation_id.as_deref(), Some("corr-9"));
}

#[tokio::test]
async fn the_idempotency_key_becomes_the_message_id_and_a_retry_stores_nothing_new() {
    let app = spawn_app().await;
    for _ in 0..2 {
        let response = app
            .send_with("requests", "[1,2]", &[("Idempotency-Key", "order-42")])
            .await;
        assert_eq!(response.status(), 201);
        assert_eq!(body_json(response).await["message_id"], "order-42");
    }
    let stored = app.receive_all("requests");
    assert_eq!(
        stored.len(),
        1,
        "the retry with the same key is detected as a duplicate"
    );
    assert_eq!(stored[0].message_id, "order-42");
}

/// Issue 41 item 5: where the gateway can know (the embedded queue keeps a digest of each
/// id's body and attributes for the duplicate window), a key reused for another message is
/// refused, as Stripe refuses a key reused with other parameters: `422
/// idempotency_key_reused`, nothing stored, the first message kept; a true retry is still a
/// duplicate.
#[tokio::test]
async fn the_same_idempotency_key_with_another_body_is_refused_and_nothing_is_stored() {
    let app = spawn_app().await;
    let key = [("Idempotency-Key", "order-43")];
    assert_eq!(app.send_with("requests", "[1,2]", &key).await.status(), 201);

    let reused = app.send_with("requests", "[1,3]", &key).await;
    assert_eq!(reused.status(), 422);
    assert!(
        reused.headers().get("retry-after").is_none(),
        "final, not a wait"
    );
    let body = body_json(reused).await;
    assert_eq!(body["code"], "idempotency_key_reused", "{body}");

    let retry = app.send_with("requests", "[1,2]", &key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(body_json(retry).await["duplicate"], true);
    let stored = app.receive_all("requests");
    assert_eq!(stored.len(), 1, "the reused key stored nothing");
    assert_eq!(stored[0].body, b"[1,2]", "the first message is kept");
    assert_eq!(
        app.detailed().await["backends"]["primary"]["breaker"],
        "closed",
        "the caller's mistake says nothing about the backend"
    );
}

#[tokio::test]
async fn the_body_is_stored_byte_for_byte_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let body = "{ \"text\" : \"h\u{e9}llo \\u00e9 \u{1f680}\",\n  \"n\": 1.50e3 }  ";
    let app = spawn_in(dir.path(), &[]).await;
    assert_eq!(app.send("requests", body).await.status(), 201);
    assert_eq!(app.send("requests", "null").await.status(), 201);
    app.stop().await;

    let restarted = spawn_in(dir.path(), &[]).await;
    let stored = restarted.receive_all("requests");
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].body, body.as_bytes());
    assert_eq!(stored[1].body, b"null");
}

#[tokio::test]
async fn a_dry_run_validates_without_touching_the_backend() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages?dry_run=true"))
        .header("Content-Type", "application/json")
        .body(r#"{"ok":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = body_json(response).await;
    assert_eq!(body["status"], "valid");
    assert_eq!(body["dry_run"], true);
    assert!(body["message_id"].is_string() && body["request_id"].is_string());

    let invalid = app
        .client
        .post(app.url("/v1/queues/requests/messages?dry_run=true"))
        .header("Content-Type", "application/json")
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 400);
    assert_eq!(app.backend_calls(), 0);
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test]
async fn a_wrong_content_type_is_415() {
    let app = spawn_app().await;
    for content_type in [None, Some("text/plain"), Some("application/xml")] {
        let mut req = app
            .client
            .post(app.url("/v1/queues/requests/messages"))
            .body("{}");
        if let Some(ct) = content_type {
            req = req.header("Content-Type", ct);
        }
        let response = req.send().await.unwrap();
        assert_eq!(response.status(), 415, "{content_type:?}");
        let body = body_json(response).await;
        assert_eq!(body["code"], "unsupported_media_type");
        assert!(body["message"].is_string() && body["request_id"].is_string());
    }
    let with_charset = app
        .send_with(
            "requests",
            "{}",
            &[("Content-Type", "application/json; charset=utf-8")],
        )
        .await;
    assert_eq!(with_charset.status(), 201);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_whether_announced_or_streamed() {
    let app = spawn_app_with(&[("SENDGATE_MAX_BODY_BYTES", "100")]).await;
    let exactly = format!("\"{}\"", "x".repeat(98));
    assert_eq!(app.send("requests", &exactly).await.status(), 201);

    let too_big = format!("\"{}\"", "x".repeat(99));
    let response = app.send("requests", &too_big).await;
    assert_eq!(response.status(), 413);
    let body = body_json(response).await;
    assert_eq!(body["code"], "payload_too_large");
    assert_eq!(body["limit_bytes"], 100);

    // Chunked, with no Content-Length to refuse it early.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(vec![b'['; 60]), Ok(vec![b']'; 60])];
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages"))
        .header("Content-Type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(app.stored("requests"), 1);
}

#[tokio::test]
async fn bad_input_is_400_listing_every_problem() {
    let app = spawn_app().await;
    let long_key = "k".repeat(129);
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages?dry_run=maybe"))
        .header("Content-Type", "application/json")
        .header("Idempotency-Key", long_key.as_str())
        .header("X-Correlation-Id", "")
        .body("{\"unterminated\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body = body_json(response).await;
    assert_eq!(body["code"], "invalid_request");
    let locs: Vec<String> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(e["msg"].is_string());
            e["loc"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect();
    assert_eq!(
        locs,
        [
            "body",
            "header.Idempotency-Key",
            "header.X-Correlation-Id",
            "query.dry_run"
        ]
    );

    for bad in ["", "{\"a\":1} trailing", "NaN", "[1,]"] {
        let response = app.send("requests", bad).await;
        assert_eq!(response.status(), 400, "{bad:?}");
    }
    assert_eq!(
        app.backend_calls(),
        0,
        "invalid input never reaches the backend"
    );
}

#[tokio::test]
async fn a_full_in_flight_pool_answers_503_saturated_at_once_and_gives_slots_back() {
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_IN_FLIGHT", "2"),
        ("SENDGATE_SEND_TIMEOUT_MS", "30000"),
    ])
    .await;
    app.faults().hold_sends(true);
    let held: Vec<_> = (0..2)
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
            })
        })
        .collect();
    wait_until(|| async { app.detailed().await["backends"]["primary"]["sends_in_flight"] == 2 })
        .await;

    let started = std::time::Instant::now();
    let response = app.send("requests", "3").await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "saturation is answered at once"
    );
    assert_eq!(response.status(), 503);
    assert_eq!(retry_after(&response), Some(1));
    assert_eq!(body_json(response).await["code"], "saturated");

    app.faults().hold_sends(false);
    for h in held {
        assert_eq!(h.await.unwrap(), 201);
    }
    assert_eq!(
        app.detailed().await["backends"]["primary"]["sends_in_flight"],
        0
    );
    assert_eq!(app.send("requests", "4").await.status(), 201);
    assert_eq!(app.stored("requests"), 3);
}

#[tokio::test]
async fn a_send_past_its_deadline_is_504_outcome_unknown_and_frees_its_slot() {
    let app = spawn_app_with(&[
        ("SENDGATE_SEND_TIMEOUT_MS", "300"),
        ("SENDGATE_MAX_IN_FLIGHT", "1"),
    ])
    .await;
    app.faults().hold_sends(true);
    let response = app
        .send_with("requests", "{}", &[("Idempotency-Key", "slow-1")])
        .await;
    assert_eq!(response.status(), 504);
    let body = body_json(response).await;
    assert_eq!(body["code"], "send_timeout");
    assert_eq!(body["outcome"], "unknown");
    assert_eq!(body["message_id"], "slow-1");

    app.faults().hold_sends(false);
    assert_eq!(
        app.detailed().await["backends"]["primary"]["sends_in_flight"],
        0
    );
    assert_eq!(
        app.send_with("requests", "{}", &[("Idempotency-Key", "slow-1")])
            .await
            .status(),
        201
    );
    assert_eq!(
        app.stored("requests"),
        1,
        "the timed-out send was cancelled, the retry stored once"
    );
}

/// Poll until `check` holds (for state that another task changes), failing after 5 s.
pub async fn wait_until<F, Fut>(check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not reached in 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_body_that_is_not_utf8_is_400_even_inside_a_string() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages"))
        .header("Content-Type", "application/json")
        .body(b"\"\xff\xfe\"".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body = body_json(response).await;
    assert_eq!(body["errors"][0]["loc"], serde_json::json!(["body"]));
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test]
async fn error_answers_echo_the_correlation_id_too() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    assert_eq!(app.send("requests", "1").await.status(), 201);
    let response = app
        .send_with("requests", "2", &[("X-Correlation-Id", "corr-full")])
        .await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["X-Correlation-Id"], "corr-full");
    assert!(response.headers().contains_key("X-Request-Id"));
}

/// Announce 100 bytes, send 10, then nothing: the answer, and how long it took.
async fn stalled_upload(app: &TestApp) -> (String, Duration) {
    stalled_upload_to(app, "POST /v1/queues/requests/messages").await
}

/// The same to another route: `request` is the request line's method and path.
pub async fn stalled_upload_to(app: &TestApp, request: &str) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.address.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{request} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[1,2,3,4,"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
        .await
        .expect("answered")
        .unwrap();
    (
        String::from_utf8_lossy(&answer[..n]).to_string(),
        started.elapsed(),
    )
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_given_up_at_the_send_deadline() {
    let app = spawn_app_with(&[("SENDGATE_SEND_TIMEOUT_MS", "500")]).await;
    let (text, took) = stalled_upload(&app).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(took < Duration::from_secs(3));
    assert_eq!(
        app.handle.lifecycle.sends_in_flight(),
        0,
        "the stalled upload no longer holds the drain"
    );
}

#[tokio::test]
async fn a_body_has_a_deadline_of_its_own_shorter_than_the_sends() {
    // The send deadline (10 s) would let a stalled upload hold its request for 10 s.
    let app = spawn_app_with(&[("SENDGATE_BODY_TIMEOUT_MS", "300")]).await;
    let (text, took) = stalled_upload(&app).await;
    // 408, retryable: a 400 would tell the client its well-formed request is malformed.
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains(r#""code":"request_timeout""#), "{text}");
    assert!(text.contains("did not arrive in time"), "{text}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn bodies_held_past_the_memory_budget_are_refused_saturated_at_once() {
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_BODY_BYTES", "1000"),
        ("SENDGATE_MAX_BUFFERED_BYTES", "1000"),
    ])
    .await;
    let body = format!("\"{}\"", "x".repeat(598)); // 600 bytes
    app.faults().hold_sends(true);
    let (client, url, held_body) = (
        app.client.clone(),
        app.url("/v1/queues/requests/messages"),
        body.clone(),
    );
    let held = tokio::spawn(async move {
        client
            .post(url)
            .header("Content-Type", "application/json")
            .body(held_body)
            .send()
            .await
            .unwrap()
            .status()
    });
    app.wait_in_flight(1).await;
    // 600 held + 600 more > 1000: refused before the body is read.
    let response = app.send("requests", &body).await;
    assert_eq!(response.status(), 503);
    assert!(retry_after(&response).is_some());
    assert_eq!(body_json(response).await["code"], "saturated");
    app.faults().hold_sends(false);
    assert_eq!(held.await.unwrap(), 201);
    assert_eq!(
        app.send("requests", &body).await.status(),
        201,
        "given back"
    );
}

#[tokio::test]
async fn a_body_sent_without_a_length_holds_only_its_own_bytes_once_read() {
    // No Content-Length: the largest body is reserved while it arrives, but once it is
    // read only its 12 bytes stay held for the send, not the whole 1000.
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_BODY_BYTES", "1000"),
        ("SENDGATE_MAX_BUFFERED_BYTES", "1000"),
    ])
    .await;
    app.faults().hold_sends(true);
    let (client, url) = (app.client.clone(), app.url("/v1/queues/requests/messages"));
    let held = tokio::spawn(async move {
        let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>("\"chunked!!!\"")]);
        client
            .post(url)
            .header("Content-Type", "application/json")
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
            .await
            .unwrap()
            .status()
    });
    app.wait_in_flight(1).await;
    let body = format!("\"{}\"", "x".repeat(598)); // 600 bytes: 12 + 600 < 1000
    let (client, url) = (app.client.clone(), app.url("/v1/queues/requests/messages"));
    let second = tokio::spawn(async move {
        let response = client
            .post(url)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    });
    // Refused, it is answered at once; taken, it waits for the broker beside the first.
    let started = std::time::Instant::now();
    while !second.is_finished() && started.elapsed() < Duration::from_secs(5) {
        let detailed = app
            .client
            .get(app.url("/health/detailed"))
            .send()
            .await
            .unwrap();
        if body_json(detailed).await["backends"]["primary"]["sends_in_flight"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    app.faults().hold_sends(false);
    let (status, text) = second.await.unwrap();
    assert_eq!(status, 201, "{text}");
    assert_eq!(held.await.unwrap(), 201);
}

/// Contract section 1, "Message attributes": a single send's attributes come as `Message-*` headers, and a bad
/// one is a 400 naming the header; nothing is sent.
#[tokio::test]
async fn bad_message_headers_are_each_named_and_nothing_is_sent() {
    let app = spawn_app().await;
    let response = app
        .send_with(
            "requests",
            "{}",
            &[
                ("Message-Time-To-Live", "0"),
                ("Message-Scheduled-Enqueue-Time", "next tuesday"),
                ("Message-Properties", r#"{"Diagnostic-Id": "mine"}"#),
                ("Message-Session-Id", "a"),
                ("Message-Partition-Key", "b"),
            ],
        )
        .await;
    assert_eq!(response.status(), 400);
    let body = body_json(response).await;
    let locs: Vec<serde_json::Value> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["loc"].clone())
        .collect();
    assert_eq!(
        locs,
        [
            serde_json::json!(["header", "Message-Time-To-Live"]),
            serde_json::json!(["header", "Message-Scheduled-Enqueue-Time"]),
            serde_json::json!(["header", "Message-Properties"]),
            serde_json::json!(["header", "Message-Partition-Key"]),
        ]
    );
    assert_eq!(app.stored("requests"), 0);
}

/// Contract section 1, "Trace context": the answer carries the message's traceparent: the request's trace
/// with a parent id of its own; an invalid traceparent is ignored (a new trace), not a 400.
#[tokio::test]
async fn the_answer_carries_the_messages_own_traceparent() {
    let app = spawn_app().await;
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traceparent = |body: &serde_json::Value| body["traceparent"].as_str().unwrap().to_owned();
    let first = body_json(
        app.send_with("requests", "1", &[("traceparent", given)])
            .await,
    )
    .await;
    let second = body_json(
        app.send_with("requests", "2", &[("traceparent", given)])
            .await,
    )
    .await;
    for t in [traceparent(&first), traceparent(&second)] {
        assert!(t.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{t}");
        assert!(!t.contains("00f067aa0ba902b7") && t.ends_with("-01"), "{t}");
    }
    assert_ne!(traceparent(&first), traceparent(&second));
    let invalid = app
        .send_with("requests", "3", &[("traceparent", "00-not-a-trace-01")])
        .await;
    assert_eq!(invalid.status(), 201);
    let fresh = traceparent(&body_json(invalid).await);
    assert_eq!(fresh.len(), 55);
    assert!(
        !fresh.contains("4bf92f3577b34da6a3ce929d0e0e4736"),
        "{fresh}"
    );
    let dry = app
        .client
        .post(app.url("/v1/queues/requests/messages?dry_run=true"))
        .header("Content-Type", "application/json")
        .header("traceparent", given)
        .body("1")
        .send()
        .await
        .unwrap();
    let dry = body_json(dry).await;
    assert!(traceparent(&dry).starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
}
