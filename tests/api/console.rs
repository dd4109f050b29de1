//! `GET /`, the status page: its security headers, the snapshot rendered on the server in
//! open mode, no data with keys on, and no broker call.

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::keys::{Key, KeysFile};

/// The page's answer: status, headers, body.
async fn page(app: &TestApp, path: &str) -> (u16, reqwest::header::HeaderMap, String) {
    let response = app.client.get(app.url(path)).send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

fn assert_guarded(headers: &reqwest::header::HeaderMap) {
    let csp = headers["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{directive} in {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert!(!csp.contains("http"), "no other origin: {csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
}

#[tokio::test]
async fn in_open_mode_the_page_holds_the_snapshot_rendered_on_the_server() {
    let app = spawn_app_with(&[
        ("SENDGATE_QUEUES", "invoices"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "40"),
    ])
    .await;
    for _ in 0..3 {
        assert_eq!(app.send("invoices", "{}").await.status(), 201);
    }
    let calls = app.backend_calls();

    let (status, headers, body) = page(&app, "/").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert_eq!(headers["cache-control"], "no-store");
    assert!(headers.contains_key("x-request-id"));
    assert_guarded(&headers);
    assert!(body.starts_with("<!DOCTYPE html>"), "{body}");
    assert!(body.contains(r#"data-auth="open""#));
    assert!(
        body.contains(r#"data-backend="primary" data-queue="invoices""#),
        "{body}"
    );
    assert!(body.contains(r#"data-field="backlog">3<"#), "{body}");
    assert!(body.contains(r#"data-field="limit">40<"#), "{body}");
    assert!(body.contains(r#"data-field="streak">0 of 3<"#), "{body}");
    assert!(body.contains(r#"aria-live="polite""#));
    assert!(!body.contains("<script>"), "no inline script");
    assert!(
        !body.contains("style="),
        "no inline style (the CSP would block it)"
    );
    assert_eq!(
        app.backend_calls(),
        calls,
        "the page did not call the broker"
    );
}

#[tokio::test]
async fn with_keys_on_the_page_is_a_frame_and_a_token_form_without_data() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("ops", &["observer"]).token("observe-secret"))
        .write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
        ("SENDGATE_QUEUES", "invoices"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "40"),
    ])
    .await;

    // Even with a token: a plain GET of the page never carries data.
    let response = app
        .client
        .get(app.url("/"))
        .bearer_auth("observe-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_guarded(response.headers());
    let body = response.text().await.unwrap();
    assert!(body.contains(r#"data-auth="keys""#));
    assert!(body.contains(r#"<label for="token">Observer token</label>"#));
    assert!(body.contains(r#"type="password""#));
    for data in ["invoices", "data-field", "embedded", ">40<", "pid"] {
        assert!(!body.contains(data), "{data} in {body}");
    }
}

#[tokio::test]
async fn the_script_and_style_are_served_from_the_binary_and_only_get_is_allowed() {
    let app = spawn_app_with(&[]).await;
    for (path, content_type) in [
        ("/console/app.js", "text/javascript; charset=utf-8"),
        ("/console/style.css", "text/css; charset=utf-8"),
    ] {
        let (status, headers, body) = page(&app, path).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_guarded(&headers);
        assert!(body.len() > 1000, "{path}");
    }
    for path in ["/", "/console/app.js"] {
        let response = app.client.post(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 405, "{path}");
        assert_eq!(response.headers()["allow"], "GET");
    }
    assert_eq!(page(&app, "/console/other.js").await.0, 404);
}

#[tokio::test]
async fn in_open_mode_a_foreign_host_gets_no_page() {
    let app = spawn_app_with(&[]).await;
    let response = app
        .client
        .get(app.url("/"))
        .header("Host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "forbidden_host");
}
