//! `GET /openapi.json`: the document generated from the code, open like `/health/live`,
//! the same bytes as the committed `docs/openapi.json` and as `sendgate openapi` prints.

use sendgate_testkit::embedded::spawn_app_with;
use sendgate_testkit::gateway::run_binary;
use sendgate_testkit::keys::{Key, KeysFile};

const COMMITTED: &str = include_str!("../../docs/openapi.json");
const STALE: &str =
    "docs/openapi.json is stale: regenerate it with `cargo run -q -- openapi > docs/openapi.json`";

/// A gateway with API keys on, so an open route is open on purpose.
async fn with_keys() -> (sendgate_testkit::embedded::TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("app", &["sender"]).token("sender-token"))
        .write_in(dir.path());
    let app = spawn_app_with(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    (app, dir)
}

#[tokio::test]
async fn the_served_document_is_the_committed_file_and_needs_no_token() {
    let (app, _dir) = with_keys().await;
    let response = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert!(response.headers().contains_key("x-request-id"));
    let served = response.text().await.unwrap();
    assert!(served == COMMITTED, "{STALE}");
    let doc: serde_json::Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");

    let wrong_method = app
        .client
        .post(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(wrong_method.headers()["allow"], "GET");
}

#[test]
fn the_cli_prints_the_committed_file() {
    let out = run_binary(&["openapi"], &[]);
    assert!(out.status.success());
    assert!(
        String::from_utf8(out.stdout).unwrap() == COMMITTED,
        "{STALE}"
    );
}

/// Each operation of `doc` asked once without a token (an empty JSON body, the served
/// queue and backend), but those on `skip`'s paths: `(path, operation, status)`.
async fn ask_each_operation<'a>(
    app: &sendgate_testkit::embedded::TestApp,
    doc: &'a serde_json::Value,
    skip: &[&str],
) -> Vec<(&'a str, &'a serde_json::Value, u16)> {
    let mut answers = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if skip.contains(&path.as_str()) {
            continue;
        }
        for (method, operation) in item.as_object().unwrap() {
            let url = app.url(
                &path
                    .replace("{queue}", "requests")
                    .replace("{backend}", "primary"),
            );
            let response = app
                .client
                .request(method.to_uppercase().parse().unwrap(), url)
                .header("Content-Type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            answers.push((path.as_str(), operation, response.status().as_u16()));
        }
    }
    answers
}

/// Every documented operation is routed (none falls to the 404 of an unknown path), and
/// those that need a key say so in the document exactly when they answer 401 without one.
#[tokio::test]
async fn every_documented_operation_is_a_route_and_its_security_is_what_it_does() {
    let (app, _dir) = with_keys().await;
    let doc: serde_json::Value = serde_json::from_str(COMMITTED).unwrap();
    let answers = ask_each_operation(&app, &doc, &[]).await;
    for &(path, operation, status) in &answers {
        assert_ne!(status, 404, "{path}");
        let open = operation["security"] == serde_json::json!([{}]);
        assert_eq!(status == 401, !open, "{path}: {status}");
        assert!(
            operation["responses"][status.to_string()].is_object(),
            "{path} answered {status}, which it does not document"
        );
    }
    assert_eq!(answers.len(), 12);
}

/// An open gateway (no keys file) serves the document of what it is: no route declares a
/// security requirement, since none asks for a token, and every documented operation
/// answers without one (no 401); `sendgate openapi --open` prints the same bytes.
#[tokio::test]
async fn an_open_gateway_serves_a_document_without_security_and_needs_no_token_anywhere() {
    let app = spawn_app_with(&[]).await;
    let served = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(served != COMMITTED, "the keys document, served open");
    assert!(!served.contains("\"security\""), "{served}");
    let doc: serde_json::Value = serde_json::from_str(&served).unwrap();
    assert!(doc["components"].get("securitySchemes").is_none());
    let committed: serde_json::Value = serde_json::from_str(COMMITTED).unwrap();
    assert_eq!(
        doc["paths"].as_object().unwrap().keys().collect::<Vec<_>>(),
        committed["paths"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>()
    );
    // POST /admin/drain's 202 would drain the gateway (tests/api/admin.rs).
    let answers = ask_each_operation(&app, &doc, &["/admin/drain"]).await;
    assert_eq!(answers.len(), 11);
    for (path, operation, status) in answers {
        assert_ne!(status, 401, "{path}");
        assert!(
            operation["responses"][status.to_string()].is_object(),
            "{path} answered {status}, which it does not document"
        );
    }
    let out = run_binary(&["openapi", "--open"], &[]);
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap() == served);
}
