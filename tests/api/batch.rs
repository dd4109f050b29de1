//! `POST /v1/queues/{queue}/messages/batch` on the embedded backend (contract section 1, "Batches"):
//! validation first, capacity all or nothing, per-entry results.

use serde_json::{json, Value};

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::gateway::{body_json, retry_after};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn batch(app: &TestApp, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = app
        .client
        .post(app.url("/v1/queues/requests/messages/batch"))
        .header("Content-Type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn entries(n: usize) -> Value {
    json!({ "messages": (0..n).map(|i| json!({"body": {"i": i}, "idempotency_key": format!("k-{i}")})).collect::<Vec<_>>() })
}

fn locs(body: &Value) -> Vec<Value> {
    body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["loc"].clone())
        .collect()
}

#[tokio::test]
async fn a_batch_is_queued_in_order_each_message_its_own_trace_and_body_byte_for_byte() {
    let app = spawn_app_with(&[]).await;
    let body = json!({"messages": [
        {"body": {"n": 1}, "idempotency_key": "a", "subject": "first", "properties": {"Priority": "high"}},
        {"body": [1, 2.50, "x"], "correlation_id": "c-2", "time_to_live_s": 60},
        {"body": "text", "session_id": "s", "partition_key": "s"},
    ]});
    let response = batch(&app, &body, &[("traceparent", TRACEPARENT)]).await;
    assert_eq!(response.status(), 201);
    assert_eq!(
        response.headers()["x-sendgate-backend"].to_str().unwrap(),
        "primary"
    );
    let answer = body_json(response).await;
    assert_eq!(answer["status"], "queued");
    assert_eq!(answer["queue"], "requests");
    assert_eq!(answer["count"], 3);
    let messages = answer["messages"].as_array().unwrap();
    assert_eq!(messages[0]["message_id"], "a");
    let parents: Vec<&str> = messages
        .iter()
        .map(|m| m["traceparent"].as_str().unwrap())
        .collect();
    for p in &parents {
        assert!(p.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{p}");
        assert!(p.ends_with("-01"), "{p}");
        assert!(!p.contains("00f067aa0ba902b7"), "a new parent id: {p}");
    }
    assert!(parents[0] != parents[1] && parents[1] != parents[2]);
    let stored = app.receive_all("requests");
    let bodies: Vec<&[u8]> = stored.iter().map(|m| m.body.as_slice()).collect();
    // The entries' JSON text exactly as sent (serde_json's `to_string` writes 2.5 as 2.5).
    assert_eq!(
        bodies,
        [
            br#"{"n":1}"#.as_slice(),
            br#"[1,2.5,"x"]"#.as_slice(),
            br#""text""#.as_slice()
        ]
    );
    assert_eq!(stored[0].message_id, "a");
    assert_eq!(stored[1].correlation_id.as_deref(), Some("c-2"));
    assert_eq!(stored[1].message_id, messages[1]["message_id"]);
}

#[tokio::test]
async fn every_bad_entry_is_named_and_nothing_is_sent() {
    let app = spawn_app_with(&[]).await;
    let body = json!({"messages": [
        {"body": 1},
        {"body": 2, "properties": {"traceparent": "x"}},
        {"idempotency_key": "no-body"},
        {"body": 4, "time_to_live_s": 0, "subject": ""},
        {"body": 5, "colour": "red"},
        {"body": 6, "idempotency_key": "same"},
        {"body": 7, "idempotency_key": "same"},
    ]});
    let response = batch(&app, &body, &[]).await;
    assert_eq!(response.status(), 400);
    let answer = body_json(response).await;
    assert_eq!(answer["code"], "invalid_request");
    assert_eq!(
        locs(&answer),
        [
            json!(["body", "messages", 1, "properties"]),
            json!(["body", "messages", 2]),
            json!(["body", "messages", 3, "subject"]),
            json!(["body", "messages", 3, "time_to_live_s"]),
            json!(["body", "messages", 4]),
            json!(["body", "messages", 6, "idempotency_key"]),
        ]
    );
    assert_eq!(app.stored("requests"), 0);
    assert_eq!(app.backend_calls(), 0, "nothing asked of the backend");
}

#[tokio::test]
async fn the_limits_on_entries_bytes_and_each_body_hold() {
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_BATCH_MESSAGES", "3"),
        ("SENDGATE_MAX_BODY_BYTES", "64"),
        ("SENDGATE_MAX_BATCH_BYTES", "1024"),
    ])
    .await;
    assert_eq!(batch(&app, &entries(3), &[]).await.status(), 201);
    for n in [0, 4] {
        let response = batch(&app, &entries(n), &[]).await;
        assert_eq!(response.status(), 400, "{n} entries");
        assert_eq!(
            locs(&body_json(response).await),
            [json!(["body", "messages"])]
        );
    }
    let long = json!({"messages": [{"body": "x".repeat(70)}]});
    let answer = body_json(batch(&app, &long, &[]).await).await;
    assert_eq!(locs(&answer), [json!(["body", "messages", 0, "body"])]);
    let entry = json!({"body": "x".repeat(60)});
    let huge = json!({"messages": [entry, entry, entry], "pad": "y".repeat(1024)});
    let response = batch(&app, &huge, &[]).await;
    assert_eq!(response.status(), 413);
    assert_eq!(body_json(response).await["limit_bytes"], 1024);
    for not_a_batch in [
        json!([1, 2]),
        json!({"messages": 3}),
        json!({"entries": []}),
    ] {
        let response = batch(&app, &not_a_batch, &[]).await;
        assert_eq!(response.status(), 400, "{not_a_batch}");
        assert_eq!(locs(&body_json(response).await), [json!(["body"])]);
    }
    assert_eq!(app.stored("requests"), 3);
}

#[tokio::test]
async fn at_the_ceiling_a_batch_is_refused_whole_with_the_room_there_is() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "5"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    assert_eq!(batch(&app, &entries(3), &[]).await.status(), 201);
    let response = batch(&app, &entries(3), &[]).await;
    assert_eq!(response.status(), 429);
    assert!(retry_after(&response).unwrap() >= 1);
    let answer = body_json(response).await;
    assert_eq!(answer["code"], "queue_full");
    assert_eq!(answer["room"], 2);
    assert_eq!(answer["backlog"], 3);
    assert_eq!(app.stored("requests"), 3, "nothing of it stored");
    // The room is what it says: two more fit, then none.
    let two = json!({"messages": [{"body": 1}, {"body": 2}]});
    assert_eq!(batch(&app, &two, &[]).await.status(), 201);
    let one = json!({"messages": [{"body": 1}]});
    let response = batch(&app, &one, &[]).await;
    assert_eq!(response.status(), 429);
    assert_eq!(body_json(response).await["room"], 0);
    assert_eq!(app.stored("requests"), 5);
    // A single send's 429 names no room (it has none to name).
    let single = body_json(app.send("requests", "1").await).await;
    assert_eq!(single["code"], "queue_full");
    assert!(single.get("room").is_none(), "{single}");
}

#[tokio::test]
async fn an_entry_the_broker_refuses_is_named_in_a_207_and_its_retry_stores_it_once() {
    let app = spawn_app_with(&[]).await;
    app.faults().fail_ids_containing(Some("poison"));
    let body = json!({"messages": [
        {"body": 0, "idempotency_key": "ok-0"},
        {"body": 1, "idempotency_key": "poison-1"},
        {"body": 2, "idempotency_key": "ok-2"},
    ]});
    let response = batch(&app, &body, &[]).await;
    assert_eq!(response.status(), 207);
    let answer = body_json(response).await;
    assert_eq!(answer["status"], "partial");
    assert_eq!(
        (answer["queued"].clone(), answer["failed"].clone()),
        (json!(2), json!(1))
    );
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[1]["index"], 1);
    assert_eq!(results[1]["status"], "failed");
    assert_eq!(results[1]["code"], "send_failed");
    assert_eq!(results[1]["message_id"], "poison-1");
    assert_eq!(results[0]["status"], "queued");
    assert_eq!(results[2]["status"], "queued");
    assert_eq!(
        app.faults().batch_sends(),
        1,
        "one batch call to the backend"
    );
    assert_eq!(app.stored("requests"), 2);

    // Sent again whole: the broker's duplicate detection keeps the two queued ones once.
    app.faults().fail_ids_containing(None);
    let response = batch(&app, &body, &[]).await;
    assert_eq!(response.status(), 201);
    let answer = body_json(response).await;
    let duplicates: Vec<bool> = answer["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["duplicate"].as_bool().unwrap_or(false))
        .collect();
    assert_eq!(duplicates, [true, false, true]);
    assert_eq!(app.stored("requests"), 3);
}

/// Issue 41 item 5 in a batch: an entry whose key was used for another message is refused
/// in the `207` (`idempotency_key_reused`), the others are queued or duplicates.
#[tokio::test]
async fn an_entry_reusing_a_key_for_another_body_is_refused_in_a_207() {
    let app = spawn_app_with(&[]).await;
    let first = json!({"messages": [
        {"body": 0, "idempotency_key": "k-0"},
        {"body": 1, "idempotency_key": "k-1"},
    ]});
    assert_eq!(batch(&app, &first, &[]).await.status(), 201);
    let again = json!({"messages": [
        {"body": 0, "idempotency_key": "k-0"},
        {"body": "other", "idempotency_key": "k-1"},
        {"body": 2, "idempotency_key": "k-2"},
    ]});
    let response = batch(&app, &again, &[]).await;
    assert_eq!(response.status(), 207);
    let answer = body_json(response).await;
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results[1]["status"], "failed", "{answer}");
    assert_eq!(results[1]["code"], "idempotency_key_reused", "{answer}");
    assert_eq!(results[0]["status"], "queued");
    assert_eq!(results[2]["status"], "queued");
    assert_eq!(app.stored("requests"), 3);
}

#[tokio::test]
async fn a_batch_whose_send_times_out_says_unknown_for_each_and_its_retry_stores_each_once() {
    let app = spawn_app_with(&[("SENDGATE_SEND_TIMEOUT_MS", "300")]).await;
    app.faults().hold_sends(true);
    let response = batch(&app, &entries(3), &[]).await;
    assert_eq!(response.status(), 207);
    let answer = body_json(response).await;
    assert_eq!(answer["failed"], 3);
    for result in answer["results"].as_array().unwrap() {
        assert_eq!(result["code"], "send_timeout");
        assert_eq!(result["outcome"], "unknown");
    }
    app.faults().hold_sends(false);
    assert_eq!(batch(&app, &entries(3), &[]).await.status(), 201);
    assert_eq!(batch(&app, &entries(3), &[]).await.status(), 201);
    assert_eq!(app.stored("requests"), 3, "each entry once");
}

#[tokio::test]
async fn a_dry_run_validates_without_the_backend() {
    let app = spawn_app_with(&[]).await;
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages/batch?dry_run=true"))
        .header("Content-Type", "application/json")
        .body(entries(2).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let answer = body_json(response).await;
    assert_eq!(answer["status"], "valid");
    assert_eq!(answer["dry_run"], true);
    assert_eq!(answer["messages"][1]["message_id"], "k-1");
    assert_eq!(app.backend_calls(), 0);
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test]
async fn the_batch_route_refuses_what_the_single_one_refuses() {
    let app = spawn_app_with(&[]).await;
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages/batch"))
        .header("Content-Type", "text/plain")
        .body(entries(1).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    let response = app
        .client
        .post(app.url("/v1/queues/nope/messages/batch"))
        .header("Content-Type", "application/json")
        .body(entries(1).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(body_json(response).await["code"], "unknown_queue");
    let response = app
        .client
        .get(app.url("/v1/queues/requests/messages/batch"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
}

/// A megabyte of `[1,1,1,…]` is refused once past the most entries any batch may hold,
/// without holding a reference per entry.
#[tokio::test]
async fn far_more_entries_than_a_batch_may_hold_are_refused_without_reading_them_all() {
    let app = spawn_app_with(&[]).await;
    let flood = json!({ "messages": vec![1; 400_000] });
    let response = batch(&app, &flood, &[]).await;
    assert_eq!(response.status(), 400);
    let answer = body_json(response).await;
    assert_eq!(locs(&answer), [json!(["body"])]);
    let msg = answer["errors"][0]["msg"].as_str().unwrap();
    assert!(msg.contains("more than 1000 entries"), "{msg}");
}

/// A schedule valid in its own offset whose UTC time is past the year 9999 (or before 0000)
/// is a 400 naming it, in a batch entry and in a single send's header alike: it once
/// panicked the worker (the connection closed with no answer).
#[tokio::test]
async fn a_schedule_past_the_years_rfc_3339_holds_in_utc_is_a_400_not_a_dropped_connection() {
    let app = spawn_app_with(&[]).await;
    let late = "9999-12-31T23:59:59-01:00";
    let body = json!({"messages": [{"body": 1, "scheduled_enqueue_time": late}]});
    let response = batch(&app, &body, &[]).await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        locs(&body_json(response).await),
        [json!(["body", "messages", 0, "scheduled_enqueue_time"])]
    );
    let response = app
        .send_with(
            "requests",
            "{}",
            &[("Message-Scheduled-Enqueue-Time", late)],
        )
        .await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        locs(&body_json(response).await),
        [json!(["header", "Message-Scheduled-Enqueue-Time"])]
    );
    assert_eq!(app.stored("requests"), 0);
}

/// Two properties of one name in one object: refused (400 naming the properties), never
/// one of the values kept silently; in a batch entry and in `Message-Properties` alike.
#[tokio::test]
async fn a_property_name_given_twice_is_a_400_in_an_entry_and_in_the_header() {
    let app = spawn_app_with(&[]).await;
    let twice = r#"{"Priority": "high", "Priority": "low"}"#;
    let body = format!(r#"{{"messages": [{{"body": 1}}, {{"body": 2, "properties": {twice}}}]}}"#);
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages/batch"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(
        locs(&body_json(response).await),
        [json!(["body", "messages", 1, "properties"])]
    );
    let response = app
        .send_with("requests", "{}", &[("Message-Properties", twice)])
        .await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        locs(&body_json(response).await),
        [json!(["header", "Message-Properties"])]
    );
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test]
async fn a_batch_holds_twice_its_bytes_of_the_body_budget_while_it_is_in_the_gateway() {
    // 5000 bytes for bodies. A batch of ~1500 bytes holds 3000 (its bytes, and room for
    // the copies on the way to the broker: the HTTP server's read-ahead, the broker
    // client's), a single body only its own.
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_BODY_BYTES", "2000"),
        ("SENDGATE_MAX_BUFFERED_BYTES", "5000"),
        ("SENDGATE_MAX_BATCH_BYTES", "2000"),
    ])
    .await;
    let big = |tag: &str| json!({"messages": [{"body": "x".repeat(1450), "idempotency_key": tag}]});
    assert!((1400..1600).contains(&big("a").to_string().len()));
    app.faults().hold_sends(true);
    let (client, url, first) = (
        app.client.clone(),
        app.url("/v1/queues/requests/messages/batch"),
        big("held").to_string(),
    );
    let held = tokio::spawn(async move {
        client
            .post(url)
            .header("Content-Type", "application/json")
            .body(first)
            .send()
            .await
            .unwrap()
            .status()
    });
    app.wait_in_flight(1).await;
    // 3000 held + 3000 > 5000: the second batch is refused before it is read...
    let response = batch(&app, &big("second"), &[]).await;
    assert_eq!(response.status(), 503);
    assert_eq!(body_json(response).await["code"], "saturated");
    // ...while a single body of the same size fits (3000 + 1500).
    let (client, url) = (app.client.clone(), app.url("/v1/queues/requests/messages"));
    let single = tokio::spawn(async move {
        client
            .post(url)
            .header("Content-Type", "application/json")
            .body(format!("\"{}\"", "y".repeat(1450)))
            .send()
            .await
            .unwrap()
            .status()
    });
    app.wait_in_flight(2).await;
    app.faults().hold_sends(false);
    assert_eq!(held.await.unwrap(), 201);
    assert_eq!(single.await.unwrap(), 201);
    assert_eq!(
        batch(&app, &big("again"), &[]).await.status(),
        201,
        "given back"
    );
}
