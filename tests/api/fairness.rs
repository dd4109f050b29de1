//! Tenants and criticality on the real binary with a keys file (docs/fairness.md): a
//! sheddable send is refused from its fraction of the ceiling, a default one up to it; a
//! tenant past its part is refused (enforce) or counted (shadow), per tenant on
//! `/health/detailed` and `/metrics`, and logged once per read.

use std::time::Duration;

use serde_json::Value;

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::gateway::{body_json, retry_after, GatewayProcess};
use sendgate_testkit::keys::{Key, KeysFile};

/// A sender's key.
fn sender(name: &str) -> Key {
    Key::new(name, &["sender"])
}

async fn app(limit: &str) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = KeysFile::new()
        .key(sender("web").criticality("critical"))
        .key(sender("reports").tenant("batch").criticality("sheddable"))
        .key(sender("script"))
        .write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", path.to_str().unwrap()),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", limit),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    (app, dir)
}

async fn send(app: &TestApp, key: &str, criticality: Option<&str>) -> reqwest::Response {
    let auth = format!("Bearer {key}-secret");
    let mut headers = vec![("Authorization", auth.as_str())];
    if let Some(level) = criticality {
        headers.push(("Sendgate-Criticality", level));
    }
    app.send_with("requests", "{}", &headers).await
}

#[tokio::test]
async fn a_sheddable_send_is_refused_from_80_percent_and_a_default_one_up_to_the_ceiling() {
    let (app, _dir) = app("10").await;
    for _ in 0..8 {
        assert_eq!(send(&app, "reports", None).await.status(), 201);
    }
    let refused = send(&app, "reports", None).await;
    assert_eq!(refused.status(), 429);
    assert!(retry_after(&refused).is_some());
    let body = body_json(refused).await;
    assert_eq!(body["code"], "queue_full");
    assert_eq!(body["reason"], "criticality");
    assert_eq!(body["criticality"], "sheddable");
    assert_eq!(
        (body["backlog"].as_u64(), body["limit"].as_u64()),
        (Some(8), Some(8))
    );
    // A default key lowered to sheddable by the header is refused alike...
    let lowered = send(&app, "script", Some("sheddable")).await;
    assert_eq!(lowered.status(), 429);
    assert_eq!(body_json(lowered).await["reason"], "criticality");
    // ...asking for more than its key allows is the key's level, not more...
    assert_eq!(send(&app, "script", Some("critical")).await.status(), 201);
    // ...and an unknown level is a 400 naming the header.
    let bad = send(&app, "script", Some("urgent")).await;
    assert_eq!(bad.status(), 400);
    let body = body_json(bad).await;
    assert_eq!(
        body["errors"][0]["loc"],
        serde_json::json!(["header", "Sendgate-Criticality"])
    );
    assert_eq!(
        send(&app, "web", None).await.status(),
        201,
        "critical: to the ceiling"
    );
    let full = send(&app, "web", None).await;
    assert_eq!(full.status(), 429);
    assert!(
        body_json(full).await.get("reason").is_none(),
        "the ceiling itself"
    );
    assert_eq!(app.stored("requests"), 10);
}

#[tokio::test]
async fn a_batch_refused_for_its_criticality_says_how_many_entries_would_be_admitted() {
    let (app, _dir) = app("10").await;
    for _ in 0..6 {
        assert_eq!(send(&app, "reports", None).await.status(), 201);
    }
    let batch = serde_json::json!({"messages": (0..3).map(|i| serde_json::json!({"body": i})).collect::<Vec<_>>()});
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages/batch"))
        .header("Content-Type", "application/json")
        .header("Authorization", "Bearer reports-secret")
        .body(batch.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    let body = body_json(response).await;
    assert_eq!(body["reason"], "criticality");
    assert_eq!(
        body["room"], 2,
        "6 held, sheddable up to 8: two of the three would go"
    );
    assert_eq!(app.stored("requests"), 6);
}

#[tokio::test]
async fn a_bad_criticality_header_is_a_step_4_problem_after_the_content_type() {
    let (app, _dir) = app("10").await;
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages"))
        .header("Content-Type", "text/plain")
        .header("Authorization", "Bearer script-secret")
        .header("Sendgate-Criticality", "urgent")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415, "the content type is checked first");
}

/// Two tenants of weight 1 (`a` by key `greedy`, `b` by key `modest`) and an observer, on
/// a ceiling of 10 read before every send, with the shares in `mode`.
async fn two_tenants(mode: &str) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = KeysFile::new()
        .key(sender("greedy").tenant("a"))
        .key(sender("modest").tenant("b"))
        .key(Key::new("ops", &["observer"]))
        .write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", path.to_str().unwrap()),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "10"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
        ("SENDGATE_FAIR_SHARE", mode),
    ])
    .await;
    (app, dir)
}

/// `a` fills the queue, `b` is refused 20 times at the ceiling (it asked: the queue is
/// contended), then the queue is emptied: `b` is owed its part of the room that opened.
async fn contend(app: &TestApp) {
    for _ in 0..10 {
        assert_eq!(send(app, "greedy", None).await.status(), 201);
    }
    for _ in 0..20 {
        let refused = send(app, "modest", None).await;
        assert_eq!(refused.status(), 429);
        assert!(
            body_json(refused).await.get("reason").is_none(),
            "the ceiling"
        );
    }
    assert_eq!(app.receive_all("requests").len(), 10);
}

/// The queue's row for `tenant` on `/health/detailed`.
async fn tenant_row(app: &TestApp, tenant: &str) -> Value {
    let detailed: Value = app
        .client
        .get(app.url("/health/detailed"))
        .bearer_auth("ops-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rows = detailed["queues"]["requests"]["tenants"].clone();
    rows.as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == tenant).cloned())
        .unwrap_or_else(|| panic!("no row for {tenant}: {rows}"))
}

/// The value of the `/metrics` series whose name and labels start with `series`.
async fn metric(app: &TestApp, series: &str) -> f64 {
    let text = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth("ops-secret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test]
async fn enforced_a_tenant_past_its_part_is_refused_and_counted_by_reason() {
    let (app, _dir) = two_tenants("enforce").await;
    contend(&app).await;
    // In the round of b's asks `a` has had its half already; a round later it gets half
    // of the room (5) at most: refused within six sends either way.
    let mut reason = None;
    for _ in 0..6 {
        let response = send(&app, "greedy", None).await;
        if response.status() == 429 {
            reason = body_json(response).await["reason"]
                .as_str()
                .map(str::to_owned);
            break;
        }
    }
    assert_eq!(reason.as_deref(), Some("tenant_share"));
    let a = tenant_row(&app, "a").await;
    assert!(
        a["refused_per_s"]["tenant_share"].as_f64().unwrap() >= 0.1,
        "{a}"
    );
    assert!(a["admitted_per_s"].as_f64().unwrap() >= 1.0, "{a}");
    assert_eq!(a["weight"], 1);
    let b = tenant_row(&app, "b").await;
    assert_eq!(
        b["refused_per_s"]["queue_full"], 2.0,
        "20 units over 10 s: {b}"
    );
    assert_eq!(b["admitted_per_s"], 0.0);
    assert!(b["share"].as_f64().unwrap() > 0.0, "b is owed a part: {b}");
    let refused = |tenant: &str, reason: &str| {
        format!(
            "sendgate_tenant_refused_total{{backend=\"primary\",queue=\"requests\",reason=\"{reason}\",tenant=\"{tenant}\"}}"
        )
    };
    assert_eq!(metric(&app, &refused("b", "queue_full")).await, 20.0);
    assert!(metric(&app, &refused("a", "tenant_share")).await >= 1.0);
    assert_eq!(
        metric(
            &app,
            "sendgate_tenant_would_refuse_total{backend=\"primary\",queue=\"requests\",reason=\"tenant_share\",tenant=\"a\"}"
        )
        .await,
        0.0
    );
}

#[tokio::test]
async fn in_shadow_a_send_over_its_part_is_admitted_and_counted_as_a_would_be_refusal() {
    let (app, _dir) = two_tenants("shadow").await;
    contend(&app).await;
    for _ in 0..6 {
        assert_eq!(
            send(&app, "greedy", None).await.status(),
            201,
            "shadow refuses nothing under the ceiling"
        );
    }
    assert_eq!(app.stored("requests"), 6);
    let a = tenant_row(&app, "a").await;
    assert!(
        a["would_refuse_per_s"]["tenant_share"].as_f64().unwrap() >= 0.1,
        "{a}"
    );
    assert_eq!(a["refused_per_s"]["tenant_share"], 0.0, "{a}");
    assert_eq!(
        a["admitted_per_s"], 1.6,
        "10 + 6 over 10 s, would-be refusals included"
    );
    let would = metric(
        &app,
        "sendgate_tenant_would_refuse_total{backend=\"primary\",queue=\"requests\",reason=\"tenant_share\",tenant=\"a\"}",
    )
    .await;
    assert!(would >= 1.0, "{would}");
    assert_eq!(
        metric(
            &app,
            "sendgate_tenant_admitted_total{backend=\"primary\",queue=\"requests\",tenant=\"a\"}"
        )
        .await,
        16.0
    );
}

#[tokio::test]
async fn a_tenant_refused_for_its_criticality_is_logged_once_per_read() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(sender("reports").tenant("batch").criticality("sheddable"))
        .write_in(dir.path());
    let data = dir.path().join("data").display().to_string();
    let log_path = dir.path().join("sendgate.log");
    let gw = GatewayProcess::start_logging_to(
        &[
            ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
            ("SENDGATE_DATA_DIR", data.as_str()),
            ("SENDGATE_LOG_FORMAT", "json"),
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "10"),
            // One read for all the sends below, then a new one after the pause.
            ("SENDGATE_DEPTH_TTL_MS", "3000"),
        ],
        std::fs::File::create(&log_path).unwrap(),
    )
    .await;
    let send = || {
        gw.client
            .post(gw.url("/v1/queues/requests/messages"))
            .bearer_auth("reports-secret")
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
    };
    for _ in 0..8 {
        assert_eq!(send().await.unwrap().status(), 201);
    }
    for _ in 0..5 {
        assert_eq!(send().await.unwrap().status(), 429);
    }
    let lines = |want: usize| {
        let path = log_path.clone();
        async move {
            let started = std::time::Instant::now();
            loop {
                let lines: Vec<Value> = std::fs::read_to_string(&path)
                    .unwrap()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|l| l["event"] == "tenant_refused")
                    .collect();
                if lines.len() >= want || started.elapsed() > Duration::from_secs(5) {
                    // Anything more would have been written by now.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return lines;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let first = lines(1).await;
    assert_eq!(
        first.len(),
        1,
        "five refusals, one read: one line: {first:?}"
    );
    let line = &first[0];
    assert_eq!(line["queue"], "requests");
    assert_eq!(line["tenant"], "batch");
    assert_eq!(line["reason"], "criticality");
    assert_eq!(line["refused_since_last_log"], 1);
    assert_eq!(line["level"], "WARN");
    // The next read: the next refusal says how many were held back, itself included.
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    assert_eq!(send().await.unwrap().status(), 429);
    let both = lines(2).await;
    assert_eq!(both.len(), 2, "{both:?}");
    assert_eq!(both[1]["refused_since_last_log"], 5);
}
