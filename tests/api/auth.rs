//! API keys (contract section 5).

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::gateway::body_json;
use sendgate_testkit::keys::{Key, KeysFile};

async fn app_with_keys() -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = KeysFile::new()
        .key(
            Key::new("playground", &["sender"])
                .token("play-secret")
                .queues(&["requests"]),
        )
        .key(Key::new("grafana", &["observer"]).token("observe-secret"))
        .key(Key::new("ops", &["admin"]).token("admin-secret"))
        .write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", path.to_str().unwrap()),
        ("SENDGATE_QUEUES", "requests,private"),
    ])
    .await;
    (app, dir)
}

#[tokio::test]
async fn a_missing_or_unknown_token_is_401_with_www_authenticate() {
    let (app, _dir) = app_with_keys().await;
    let response = app.send("requests", "{}").await;
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["WWW-Authenticate"], "Bearer");
    assert_eq!(body_json(response).await["code"], "unauthenticated");

    let response = app
        .send_with("requests", "{}", &[("Authorization", "Bearer guessed")])
        .await;
    assert_eq!(response.status(), 401);
    // RFC 6750: a token was given and proves nothing, and nothing more is said.
    assert_eq!(
        response.headers()["WWW-Authenticate"],
        "Bearer error=\"invalid_token\""
    );
    assert_eq!(body_json(response).await["code"], "unauthenticated");
    assert_eq!(app.backend_calls(), 0);
}

#[tokio::test]
async fn authentication_comes_before_everything_but_routing() {
    let (app, _dir) = app_with_keys().await;
    // Unknown queue, wrong content type, bad body: still 401 first.
    let response = app
        .send_with("nope", "{bad", &[("Content-Type", "text/plain")])
        .await;
    assert_eq!(response.status(), 401);
    let response = app.client.get(app.url("/nowhere")).send().await.unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn a_known_token_without_the_role_or_queue_is_403() {
    let (app, _dir) = app_with_keys().await;
    let observer = [("Authorization", "Bearer observe-secret")];
    let response = app.send_with("requests", "{}", &observer).await;
    assert_eq!(response.status(), 403);
    assert_eq!(body_json(response).await["code"], "forbidden");

    let sender = [("Authorization", "Bearer play-secret")];
    assert_eq!(app.send_with("private", "{}", &sender).await.status(), 403);
    assert_eq!(app.send_with("requests", "{}", &sender).await.status(), 201);
    let admin = [("Authorization", "Bearer admin-secret")];
    assert_eq!(app.send_with("private", "{}", &admin).await.status(), 201);
}

#[tokio::test]
async fn health_detailed_and_metrics_need_observer_or_admin_while_live_and_ready_are_open() {
    let (app, _dir) = app_with_keys().await;
    let get = |path: &'static str, token: Option<&'static str>| {
        let mut req = app.client.get(app.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(get("/health/live", None).await, 200);
    assert_eq!(get("/health/ready", None).await, 200);
    assert_eq!(get("/health/detailed", None).await, 401);
    assert_eq!(get("/health/detailed", Some("play-secret")).await, 403);
    assert_eq!(get("/health/detailed", Some("observe-secret")).await, 200);
    assert_eq!(get("/health/detailed", Some("admin-secret")).await, 200);
    assert_eq!(get("/metrics", None).await, 401);
    assert_eq!(get("/metrics", Some("play-secret")).await, 403);
    assert_eq!(get("/metrics", Some("observe-secret")).await, 200);
}

#[tokio::test]
async fn an_idempotency_key_is_scoped_to_the_key_holder_at_the_broker() {
    let (app, _dir) = app_with_keys().await;
    let app = &app;
    let send = |token: &'static str| async move {
        app.send_with(
            "requests",
            "{}",
            &[("Authorization", token), ("Idempotency-Key", "order-42")],
        )
        .await
    };
    let first = body_json(send("Bearer play-secret").await).await;
    assert_eq!(
        first["message_id"], "order-42",
        "the answer echoes the client's key"
    );
    // Another key holder reusing the same Idempotency-Key does not suppress anything…
    let other = body_json(send("Bearer admin-secret").await).await;
    assert_eq!(other["status"], "queued");
    assert_eq!(other.get("duplicate"), None, "{other}");
    // …while the same caller's retry is still a duplicate.
    let retry = body_json(send("Bearer play-secret").await).await;
    assert_eq!(retry["duplicate"], true, "{retry}");
    let mut stored: Vec<String> = app
        .receive_all("requests")
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    stored.sort();
    assert_eq!(stored, ["ops:order-42", "playground:order-42"]);
}
