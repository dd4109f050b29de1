//! `POST /admin/drain`: the same drain as SIGTERM, for deploy pipelines; role `admin`.

use sha2::{Digest, Sha256};
use std::time::Duration;

use crate::helpers::{body_json, spawn_app_with};

fn keys_file(dir: &std::path::Path) -> std::path::PathBuf {
    let entry = |name: &str, token: &str, role: &str| {
        format!(
            "[[keys]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = [\"{role}\"]\nqueues = [\"*\"]\n",
            hex::encode(Sha256::digest(token.as_bytes()))
        )
    };
    let path = dir.join("keys.toml");
    let text = [
        entry("deployer", "admin-token", "admin"),
        entry("grafana", "observer-token", "observer"),
        entry("app", "sender-token", "sender"),
    ]
    .concat();
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn admin_drain_needs_the_admin_role_and_then_drains_to_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
        ("SENDGATE_DRAIN_TIMEOUT_S", "20"),
    ])
    .await;
    let drain = |token: Option<&'static str>| {
        let mut req = app.client.post(app.url("/admin/drain"));
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
