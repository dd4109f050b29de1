//! Unknown paths, unknown queues and wrong methods: answered without the backend.

use sendgate_testkit::embedded::{spawn_app, spawn_app_with};
use sendgate_testkit::gateway::body_json;

#[tokio::test]
async fn unknown_paths_are_404_and_never_reach_the_backend() {
    let app = spawn_app().await;
    // (`/` is the status page: GET only, so a POST is 405; tests/api/console.rs.)
    for path in [
        "/console",
        "/console/",
        "/admin",
        "/v1/queues",
        "/v1/queues/requests",
        "/wp-login.php",
        "/v1/queues/requests/messages/x",
    ] {
        let response = app
            .client
            .post(app.url(path))
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{path}");
        let body = body_json(response).await;
        assert_eq!(body["code"], "not_found");
        assert!(body["request_id"].is_string() && body["message"].is_string());
    }
    for _ in 0..1000 {
        assert_eq!(
            app.client
                .get(app.url("/scanner/probe"))
                .send()
                .await
                .unwrap()
                .status(),
            404
        );
    }
    assert_eq!(app.backend_calls(), 0);
}

#[tokio::test]
async fn an_unknown_queue_is_404_unknown_queue_without_a_backend_call() {
    let app = spawn_app_with(&[("SENDGATE_QUEUES", "requests,batch")]).await;
    let response = app.send("nope", "{}").await;
    assert_eq!(response.status(), 404);
    let body = body_json(response).await;
    assert_eq!(body["code"], "unknown_queue");
    assert_eq!(body["queue"], "nope");
    assert_eq!(app.backend_calls(), 0);
    assert_eq!(app.send("batch", "{}").await.status(), 201);
}

#[tokio::test]
async fn a_wrong_method_on_a_known_path_is_405_with_allow() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(app.url("/v1/queues/requests/messages"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["Allow"], "POST");
    assert_eq!(body_json(response).await["code"], "method_not_allowed");
    let response = app
        .client
        .delete(app.url("/health/live"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(app.backend_calls(), 0);
}
