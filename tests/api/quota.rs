//! Tenants' quotas on the real app with a keys file (docs/fairness.md, "Quotas"): a rate
//! quota's burst, then `429 tenant_quota` with `Retry-After` and the IETF `RateLimit`
//! fields; and a queue's shed level changed through the runtime settings.

use serde_json::json;

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::gateway::{body_json, retry_after};
use sendgate_testkit::keys::{Key, KeysFile};

async fn app(limit: &str) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sender = |name: &str| Key::new(name, &["sender"]);
    let path = KeysFile::new()
        // 0.2/s: one unit back every 5 s, so the test never sees one come back.
        .key(sender("metered").rate(0.2, 3))
        .key(sender("capped").max_share(0.3))
        .key(sender("reports").criticality("sheddable"))
        .key(sender("free"))
        .key(Key::new("ops", &["admin"]))
        .write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", path.to_str().unwrap()),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", limit),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    (app, dir)
}

async fn send(app: &TestApp, key: &str) -> reqwest::Response {
    let auth = format!("Bearer {key}-secret");
    app.send_with("requests", "{}", &[("Authorization", auth.as_str())])
        .await
}

async fn batch(app: &TestApp, key: &str, n: usize) -> reqwest::Response {
    let body = json!({"messages": (0..n).map(|i| json!({"body": i})).collect::<Vec<_>>()});
    app.client
        .post(app.url("/v1/queues/requests/messages/batch"))
        .header("Content-Type", "application/json")
        .bearer_auth(format!("{key}-secret"))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn a_burst_then_429_tenant_quota_with_retry_after_and_ratelimit_fields() {
    let (app, _dir) = app("100").await;
    for left in [2, 1, 0] {
        let queued = send(&app, "metered").await;
        assert_eq!(queued.status(), 201);
        assert_eq!(
            header(&queued, "ratelimit-policy"),
            Some("\"rate\";q=3;w=15")
        );
        let limit = header(&queued, "ratelimit").unwrap();
        assert!(
            limit.starts_with(&format!("\"rate\";r={left};t=")),
            "{limit}"
        );
    }
    let refused = send(&app, "metered").await;
    assert_eq!(refused.status(), 429);
    let wait = retry_after(&refused).expect("a Retry-After");
    assert!((1..=5).contains(&wait), "the next unit within 5 s: {wait}");
    assert_eq!(
        header(&refused, "ratelimit"),
        Some(format!("\"rate\";r=0;t={wait}").as_str()),
        "with nothing left, t is the Retry-After"
    );
    assert_eq!(
        header(&refused, "ratelimit-policy"),
        Some("\"rate\";q=3;w=15")
    );
    let body = body_json(refused).await;
    assert_eq!(body["code"], "queue_full");
    assert_eq!(body["reason"], "tenant_quota");
    assert_eq!(body["quota"], "rate");
    assert_eq!(body["retry_after_s"], wait);
    // Refusals took nothing: still refused, still r=0; a batch is refused whole.
    let again = batch(&app, "metered", 2).await;
    assert_eq!(again.status(), 429);
    assert_eq!(
        header(&again, "ratelimit").map(|v| &v[..12]),
        Some("\"rate\";r=0;t")
    );
    let body = body_json(again).await;
    assert_eq!(
        (body["reason"].as_str(), body["room"].as_u64()),
        (Some("tenant_quota"), Some(0))
    );
    // Another tenant is not held to it, and gets no RateLimit fields.
    let free = send(&app, "free").await;
    assert_eq!(free.status(), 201);
    assert!(header(&free, "ratelimit").is_none());
    assert_eq!(app.stored("requests"), 4);
}

#[tokio::test]
async fn max_share_holds_a_tenant_to_its_part_of_the_ceiling() {
    let (app, _dir) = app("10").await;
    for _ in 0..3 {
        assert_eq!(send(&app, "capped").await.status(), 201);
    }
    let refused = send(&app, "capped").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(retry_after(&refused), Some(1));
    assert!(header(&refused, "ratelimit").is_none(), "no rate quota");
    let body = body_json(refused).await;
    assert_eq!(
        (body["reason"].as_str(), body["quota"].as_str()),
        (Some("tenant_quota"), Some("max_share"))
    );
    assert_eq!(send(&app, "free").await.status(), 201);
    // Consumers take the queue down: the tenant's part opens again.
    app.receive_all("requests");
    assert_eq!(send(&app, "capped").await.status(), 201);
}

async fn patch(app: &TestApp, body: serde_json::Value) -> reqwest::Response {
    app.client
        .patch(app.url("/admin/settings"))
        .header("Content-Type", "application/json")
        .bearer_auth("ops-secret")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_queues_shed_level_changed_at_runtime_moves_where_sheddable_is_refused() {
    let (app, _dir) = app("10").await;
    // SENDGATE_SHED_AT_SHEDDABLE is 0.8: lowered to 0.3 for this queue.
    let changed = patch(
        &app,
        json!({"queues": {"requests": {"shed_at_sheddable": 0.3}}}),
    )
    .await;
    assert_eq!(changed.status(), 200);
    let body = body_json(changed).await;
    let view = &body["queues"]["requests"]["shed_at_sheddable"];
    assert_eq!(
        (view["value"].as_f64(), view["default"].as_f64()),
        (Some(0.3), Some(0.8))
    );
    assert_eq!(view["variable"], "SENDGATE_SHED_AT_SHEDDABLE");
    for _ in 0..3 {
        assert_eq!(send(&app, "reports").await.status(), 201);
    }
    let refused = send(&app, "reports").await;
    assert_eq!(refused.status(), 429);
    let body = body_json(refused).await;
    assert_eq!(
        (body["reason"].as_str(), body["limit"].as_u64()),
        (Some("criticality"), Some(3))
    );
    assert_eq!(
        send(&app, "free").await.status(),
        201,
        "default: to the ceiling"
    );

    // Above the queue's default level: refused, naming the member, nothing changed.
    let crossed = patch(
        &app,
        json!({"queues": {"requests": {"shed_at_default": 0.2}}}),
    )
    .await;
    assert_eq!(crossed.status(), 400);
    let body = body_json(crossed).await;
    assert_eq!(
        body["errors"][0]["loc"],
        json!(["body", "queues", "requests", "shed_at_default"])
    );
    let bad = patch(
        &app,
        json!({"queues": {"requests": {"shed_at_sheddable": 1.5}}}),
    )
    .await;
    assert_eq!(bad.status(), 400);
    assert_eq!(send(&app, "reports").await.status(), 429, "still 0.3");

    // null restores the variable's 0.8: sheddable goes to 8 again.
    let restored = patch(
        &app,
        json!({"queues": {"requests": {"shed_at_sheddable": null}}}),
    )
    .await;
    assert_eq!(restored.status(), 200);
    for _ in 0..4 {
        assert_eq!(send(&app, "reports").await.status(), 201);
    }
    assert_eq!(send(&app, "reports").await.status(), 429);
}
