//! Tenants and criticality on the real binary with a keys file (docs/fairness.md): a
//! sheddable send is refused from its fraction of the ceiling, a default one up to it.

use sha2::{Digest, Sha256};

use crate::helpers::{body_json, retry_after, spawn_app_with, TestApp};

fn entry(name: &str, extra: &str) -> String {
    format!(
        "[[keys]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = [\"sender\"]\nqueues = [\"*\"]\n{extra}\n",
        hex::encode(Sha256::digest(format!("{name}-secret").as_bytes()))
    )
}

async fn app(limit: &str) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let text = [
        entry("web", "criticality = \"critical\""),
        entry("reports", "tenant = \"batch\"\ncriticality = \"sheddable\""),
        entry("script", ""),
    ]
    .concat();
    std::fs::write(&path, text).unwrap();
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
