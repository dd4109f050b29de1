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
    // Spaced past the ceiling-read interval (contract section 2: at least 20 ms and twice
    // the last read's duration), so the reads are known: the first send's, one started by
    // the second (admitted within a tenth of the ceiling of 2), one by the third (refused
    // `queue_full`), which lands before the scrape. Sent back to back, whether the second
    // and third read depended on the machine's speed.
    for _ in 0..3 {
        app.send("requests", "{}").await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    app.send("nope", "{}").await;
    let calls = app.backend_calls();
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
        3.0
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
    assert_eq!(app.backend_calls(), calls, "scraping touched no backend");
}

/// The series' lines of family `name` (its samples, any labels).
fn samples<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .collect()
}

async fn scrape(app: &sendgate_testkit::embedded::TestApp) -> String {
    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// Issue 41: what operators look for — a send's end-to-end latency, the `Retry-After`
/// values given, the depth reads' latency, the process's own series and the build.
#[tokio::test]
async fn metrics_time_requests_and_depth_reads_and_count_the_retry_after_given() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    let full = app.send("requests", "{}").await;
    assert_eq!(full.status(), 429);
    let given: u64 = full.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let text = scrape(&app).await;

    assert_eq!(
        value(
            &text,
            r#"sendgate_request_duration_seconds_count{queue="requests",route="message",status="201"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_request_duration_seconds_count{queue="requests",route="message",status="429"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_retry_after_seconds_count{code="queue_full",queue="requests"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_retry_after_seconds_sum{code="queue_full",queue="requests"}"#
        ),
        given as f64,
        "the seconds the header said"
    );
    assert!(
        value(
            &text,
            r#"sendgate_depth_read_duration_seconds_count{backend="primary",queue="requests",result="ok"}"#
        ) >= 1.0,
        "the start-up read (and the probes')"
    );
    assert!(value(&text, "process_cpu_seconds_total") >= 0.0);
    for family in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(value(&text, family) > 0.0, "{family}");
    }
    let info = format!(
        r#"sendgate_build_info{{git_sha="unknown",version="{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(value(&text, &info), 1.0);

    // A batch is timed under its own route; a refusal without Retry-After gives none.
    let batch = app
        .client
        .post(app.url("/v1/queues/requests/messages/batch"))
        .header("Content-Type", "application/json")
        .body(r#"{"messages":[{"body":1}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 429);
    let unknown = app.send("nope", "{}").await;
    assert_eq!(unknown.status(), 404);
    let text = scrape(&app).await;
    assert_eq!(
        value(
            &text,
            r#"sendgate_request_duration_seconds_count{queue="requests",route="batch",status="429"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_request_duration_seconds_count{queue="unknown",route="message",status="404"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            r#"sendgate_retry_after_seconds_count{code="queue_full",queue="requests"}"#
        ),
        2.0
    );
    assert!(
        samples(&text, "sendgate_retry_after_seconds_count")
            .iter()
            .all(|l| !l.contains("unknown_queue")),
        "{text}"
    );
}

/// Issue 41: the drain rate the gate measured, per queue, once consumers took messages
/// between depth reads (none before).
#[tokio::test]
async fn metrics_show_the_measured_drain_rate_per_queue() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1000"),
        ("SENDGATE_DEPTH_TTL_MS", "50"),
    ])
    .await;
    for _ in 0..40 {
        assert_eq!(app.send("requests", "{}").await.status(), 201);
    }
    let text = scrape(&app).await;
    assert!(
        samples(&text, "sendgate_drain_rate_per_second").is_empty(),
        "nothing drained yet: {text}"
    );
    // A consumer takes 2 messages every 100 ms while a producer sends 1: the reads the
    // sends make see the backlog fall.
    let mut store = sendgate::backend::embedded::Store::open(&app.data_dir).unwrap();
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(2500) {
        store.receive("requests", 2, |_| Ok(())).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(app.send("requests", "{}").await.status(), 201);
    }
    let text = scrape(&app).await;
    let rate = value(
        &text,
        r#"sendgate_drain_rate_per_second{backend="primary",queue="requests"}"#,
    );
    let shown = app.detailed().await["queues"]["requests"]["drain_rate_per_s"]
        .as_f64()
        .expect("measured");
    assert!(rate > 1.0, "{rate}");
    assert!(
        (rate - shown).abs() < 0.01 * rate + 0.001,
        "{rate} vs {shown}"
    );
}
