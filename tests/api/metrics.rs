//! `GET /metrics`: Prometheus text with the series the contract names.

use sendgate_testkit::embedded::spawn_app_with;

/// The value of the first series whose line starts with `prefix` (name and labels).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn metrics_count_requests_reads_and_state() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "2"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    for _ in 0..3 {
        app.send("requests", "{}").await;
    }
    app.send("nope", "{}").await;
    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();

    assert_eq!(
        value(
            &text,
            r#"sendgate_requests_total{backend="primary",code="queued",queue="requests",status="201"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_requests_total{backend="primary",code="queue_full",queue="requests",status="429"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_requests_total{backend="none",code="unknown_queue",queue="unknown",status="404"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_depth_reads_total{backend="primary",queue="requests",result="ok"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_depth_reads_total{backend="primary",queue="requests",result="failed"}"#
        ),
        0.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_backlog{backend="primary",queue="requests"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_backlog_limit{backend="primary",queue="requests"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_depth_read_failure_streak{backend="primary",queue="requests"}"#
        ),
        0.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_breaker_state{backend="primary",kind="embedded",state="closed"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_breaker_state{backend="primary",kind="embedded",state="open"}"#
        ),
        0.0
    );
    assert_eq!(value(&text, "sendgate_sends_in_flight "), 0.0);
    assert_eq!(
        value(
            &text,
            r#"sendgate_send_duration_seconds_count{backend="primary"}"#
        ),
        2.0
    );
    assert_eq!(
        value(&text, r#"sendgate_gateway_state{state="running"}"#),
        1.0
    );
    assert_eq!(app.backend_calls(), 2, "scraping touched no backend");
}
