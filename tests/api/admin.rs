//! `POST /admin/drain`: the same drain as SIGTERM, for deploy pipelines; role `admin`.

use std::time::Duration;

use sendgate_testkit::embedded::spawn_app_with;
use sendgate_testkit::gateway::body_json;
use sendgate_testkit::keys::KeysFile;

#[tokio::test]
async fn admin_drain_needs_the_admin_role_and_then_drains_to_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::one_per_role().write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
        ("SENDGATE_DRAIN_TIMEOUT_S", "20"),
    ])
    .await;
    let drain = |token: Option<&'static str>| {
        let mut req = app
            .client
            .post(app.url("/admin/drain"))
            .header("Content-Type", "application/json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    assert_eq!(drain(None).await.unwrap().status(), 401);
    assert_eq!(drain(Some("sender-token")).await.unwrap().status(), 403);
    assert_eq!(drain(Some("observer-token")).await.unwrap().status(), 403);
    assert_eq!(
        app.handle.lifecycle.state().as_str(),
        "running",
        "refused drains change nothing"
    );

    let response = drain(Some("admin-token")).await.unwrap();
    assert_eq!(response.status(), 202);
    let body = body_json(response).await;
    assert_eq!(body["gateway_state"], "draining");
    assert!(body["remaining_s"].as_f64().unwrap() > 19.0);

    // Nothing in flight: the drain completes and the server stops by itself.
    app.wait_stopped(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_draining_answer_closes_the_connection_so_the_balancer_reroutes() {
    let app = spawn_app_with(&[("SENDGATE_DRAIN_TIMEOUT_S", "20")]).await;
    app.faults().hold_sends(true);
    let held = app.hold_one_send().await;
    app.handle.lifecycle.begin_drain(Duration::from_secs(20));
    let response = app.send("requests", "2").await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["connection"], "close");
    app.faults().hold_sends(false);
    assert_eq!(held.await.unwrap(), 201);
}

/// What a cross-site page can make a browser send to a gateway running open on loopback.
async fn post_drain(
    app: &sendgate_testkit::embedded::TestApp,
    headers: &[(&str, &str)],
    body: &str,
) -> reqwest::Response {
    let mut req = app
        .client
        .post(app.url("/admin/drain"))
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn a_cross_site_form_or_text_post_cannot_drain_an_open_gateway() {
    let app = spawn_app_with(&[]).await;
    for content_type in [
        "application/x-www-form-urlencoded",
        "text/plain",
        "multipart/form-data; boundary=x",
    ] {
        let response = post_drain(
            &app,
            &[
                ("Content-Type", content_type),
                ("Origin", "http://evil.example"),
            ],
            "a=1",
        )
        .await;
        assert_eq!(response.status(), 415, "{content_type}");
        assert!(response.headers().contains_key("x-request-id"));
        assert_eq!(body_json(response).await["code"], "unsupported_media_type");
    }
    assert_eq!(
        post_drain(&app, &[], "").await.status(),
        415,
        "no content type at all"
    );
    assert_eq!(app.handle.lifecycle.state().as_str(), "running");
    // The same request as a deploy pipeline sends it still drains.
    let response = post_drain(&app, &[("Content-Type", "application/json")], "").await;
    assert_eq!(response.status(), 202);
    app.wait_stopped(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn an_open_gateway_answers_only_loopback_host_names() {
    let app = spawn_app_with(&[]).await;
    // DNS rebinding: the page's own name, pointed at 127.0.0.1, arrives in Host.
    for host in ["evil.example", "evil.example:8080", "10.0.0.7:8080"] {
        for (method, path) in [
            ("POST", "/admin/drain"),
            ("GET", "/health/detailed"),
            ("POST", "/v1/queues/requests/messages"),
        ] {
            let response = app
                .client
                .request(method.parse().unwrap(), app.url(path))
                .header("Host", host)
                .header("Content-Type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 403, "{method} {path} Host: {host}");
            assert!(response.headers().contains_key("x-request-id"));
            assert_eq!(body_json(response).await["code"], "forbidden_host");
        }
    }
    assert_eq!(app.stored("requests"), 0, "nothing was sent");
    assert_eq!(app.handle.lifecycle.state().as_str(), "running");
    for host in ["localhost:8080", "127.0.0.1", "[::1]:9"] {
        let response = app
            .client
            .get(app.url("/health/detailed"))
            .header("Host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "Host: {host}");
    }
}

#[tokio::test]
async fn with_keys_the_host_is_not_checked() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::one_per_role().write_in(dir.path());
    let app = spawn_app_with(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let response = app
        .client
        .get(app.url("/health/detailed"))
        .header("Host", "sendgate.internal.example")
        .bearer_auth("observer-token")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}
