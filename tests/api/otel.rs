//! OpenTelemetry over OTLP (docs/operations.md "OpenTelemetry", contract section 6): a span per send
//! and the sends' metrics reach a real OTLP receiver, over HTTP or gRPC (decoded with the
//! collector's protobuf types, over gRPC by its generated services); while a collector never
//! answers every send is still stored, and what it cannot take is dropped and counted; without an
//! endpoint nothing is built.

use std::time::Duration;

use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::gateway::{body_json, settings_of, GatewayProcess};
use sendgate_testkit::otlp::{attribute, Receiver, GRPC_METRICS, GRPC_TRACES};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const WAIT: Duration = Duration::from_secs(10);

/// A gateway exporting to `receiver` quickly: spans within 20 ms, metrics every 200 ms.
async fn exporting_to(receiver: &Receiver, vars: &[(&str, &str)]) -> TestApp {
    let endpoint = receiver.endpoint();
    let mut all = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
    ];
    all.extend_from_slice(vars);
    spawn_app_with(&all).await
}

fn attr(span: &Span, key: &str) -> Option<String> {
    attribute(&span.attributes, key)
}

#[tokio::test]
async fn a_send_is_one_producer_span_in_the_producers_trace_and_its_message_carries_it() {
    let receiver = Receiver::start().await;
    let app = exporting_to(&receiver, &[]).await;
    let response = app
        .send_with(
            "requests",
            r#"{"secret":"BODY-SECRET"}"#,
            &[
                ("traceparent", TRACEPARENT),
                ("Idempotency-Key", "order-1"),
                ("Message-Properties", r#"{"k":"PROPERTY-SECRET"}"#),
            ],
        )
        .await;
    assert_eq!(response.status(), 201);
    let answered = body_json(response).await["traceparent"]
        .as_str()
        .expect("a traceparent")
        .to_owned();

    let spans = receiver.wait_spans(WAIT, |s| !s.is_empty()).await;
    assert_eq!(spans.len(), 1, "one span per send: {spans:?}");
    let span = &spans[0];
    assert_eq!(span.name, "send requests");
    assert_eq!(span.kind, SpanKind::Producer as i32);
    assert_eq!(hex(&span.trace_id), TRACE_ID, "the producer's trace");
    assert_eq!(
        hex(&span.parent_span_id),
        PARENT_ID,
        "the producer's span is the parent"
    );
    // The message's own context is the span's: a consumer's trace goes on from the send.
    assert_eq!(
        answered,
        format!("00-{TRACE_ID}-{}-01", hex(&span.span_id)),
        "the message carries the span's context"
    );
    for (key, value) in [
        ("messaging.system", "sendgate_embedded"),
        ("messaging.destination.name", "requests"),
        ("messaging.operation.type", "send"),
        ("messaging.operation.name", "send"),
        ("messaging.message.id", "order-1"),
        ("sendgate.admission.outcome", "admitted"),
        ("sendgate.backend", "primary"),
        ("http.response.status_code", "201"),
    ] {
        assert_eq!(attr(span, key).as_deref(), Some(value), "{key}: {span:?}");
    }
    assert_eq!(attr(span, "error.type"), None);
    assert_ne!(
        span.status.as_ref().map_or(0, |s| s.code),
        StatusCode::Error as i32
    );
    let text = format!("{span:?}");
    for secret in ["BODY-SECRET", "PROPERTY-SECRET"] {
        assert!(!text.contains(secret), "{secret} in the span: {text}");
    }
    let resources = receiver.span_resources();
    assert_eq!(
        attribute(&resources[0], "service.name").as_deref(),
        Some("sendgate")
    );
}

#[tokio::test]
async fn a_refused_send_says_why_on_its_span_and_in_the_refusals_metric() {
    let receiver = Receiver::start().await;
    let app = exporting_to(&receiver, &[("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1")]).await;
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    let refused = app.send("requests", "{}").await;
    assert_eq!(refused.status(), 429);

    let spans = receiver.wait_spans(WAIT, |s| s.len() >= 2).await;
    let span = spans
        .iter()
        .find(|s| attr(s, "http.response.status_code").as_deref() == Some("429"))
        .unwrap_or_else(|| panic!("the refused send's span: {spans:?}"));
    assert_eq!(attr(span, "error.type").as_deref(), Some("queue_full"));
    assert_eq!(
        attr(span, "sendgate.admission.outcome").as_deref(),
        Some("refused")
    );
    assert_eq!(
        attr(span, "sendgate.refusal.reason").as_deref(),
        Some("ceiling")
    );
    assert_eq!(attr(span, "messaging.message.id"), None, "never made");
    assert_eq!(hex(&span.parent_span_id), "", "no traceparent: a root span");

    let refusals = receiver
        .wait_metric(WAIT, "sendgate.refusals")
        .await
        .expect("the refusals counter");
    let Some(Data::Sum(sum)) = refusals.data else {
        panic!("a sum: {refusals:?}")
    };
    let point = sum
        .data_points
        .iter()
        .find(|p| attribute(&p.attributes, "error.type").as_deref() == Some("queue_full"))
        .expect("refusals by code");
    assert_eq!(
        point.value,
        Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(1))
    );

    let duration = receiver
        .wait_metric(WAIT, "messaging.client.operation.duration")
        .await
        .expect("the duration histogram");
    assert_eq!(duration.unit, "s");
    let Some(Data::Histogram(histogram)) = duration.data else {
        panic!("a histogram: {duration:?}")
    };
    let count = |error: Option<&str>| -> u64 {
        histogram
            .data_points
            .iter()
            .filter(|p| attribute(&p.attributes, "error.type").as_deref() == error)
            .inspect(|p| {
                assert_eq!(
                    attribute(&p.attributes, "messaging.destination.name").as_deref(),
                    Some("requests")
                );
                assert_eq!(
                    attribute(&p.attributes, "messaging.system").as_deref(),
                    Some("sendgate_embedded")
                );
            })
            .map(|p| p.count)
            .sum()
    };
    assert_eq!(count(None), 1, "the accepted send");
    assert_eq!(count(Some("queue_full")), 1, "the refused one");
}

#[tokio::test]
async fn a_batch_is_one_span_with_its_message_count() {
    let receiver = Receiver::start().await;
    let app = exporting_to(&receiver, &[]).await;
    let body = json!({"messages": [{"body": 1}, {"body": 2}, {"body": 3}]});
    let response = app
        .client
        .post(app.url("/v1/queues/requests/messages/batch"))
        .header("traceparent", TRACEPARENT)
        .json(&body)
        .send()
        .await
        .expect("the batch is answered");
    assert_eq!(response.status(), 201);
    let answered = body_json(response).await;

    let spans = receiver.wait_spans(WAIT, |s| !s.is_empty()).await;
    assert_eq!(spans.len(), 1, "one span per batch: {spans:?}");
    let span = &spans[0];
    assert_eq!(span.name, "send requests");
    assert_eq!(
        attr(span, "messaging.batch.message_count").as_deref(),
        Some("3")
    );
    assert_eq!(attr(span, "messaging.message.id"), None);
    assert_eq!(hex(&span.trace_id), TRACE_ID);
    assert_eq!(hex(&span.parent_span_id), PARENT_ID);
    // Each message in the batch span's trace, sampled as it is, a parent id of its own.
    for entry in answered["messages"].as_array().expect("the entries") {
        let traceparent = entry["traceparent"].as_str().expect("a traceparent");
        assert!(
            traceparent.starts_with(&format!("00-{TRACE_ID}-")),
            "{traceparent}"
        );
        assert!(traceparent.ends_with("-01"), "{traceparent}");
    }
}

#[tokio::test]
async fn while_a_collector_never_answers_every_send_is_stored_and_the_drops_are_counted() {
    never_answering(Receiver::hanging().await, "http/protobuf").await;
}

#[tokio::test]
async fn while_a_grpc_collector_never_answers_every_send_is_stored_and_the_drops_are_counted() {
    never_answering(Receiver::grpc_hanging().await, "grpc").await;
}

async fn never_answering(receiver: Receiver, protocol: &str) {
    let endpoint = receiver.endpoint();
    let app = spawn_app_with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "2"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
        ("OTEL_BSP_SCHEDULE_DELAY", "1"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "60000"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "50"),
    ])
    .await;
    // The first export hangs for a minute; every send is still answered (no timing
    // asserted here: bench comparison 13 measures the cost).
    for _ in 0..20 {
        assert_eq!(app.send("requests", "{}").await.status(), 201);
    }
    let reached = tokio::time::Instant::now() + WAIT;
    while receiver.requests() == 0 && tokio::time::Instant::now() < reached {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        receiver.requests() >= 1,
        "the exporter reached the collector"
    );
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let dropped: u64 = metrics
        .lines()
        .find(|l| l.starts_with("sendgate_otel_spans_dropped_total{reason=\"queue_full\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the drops are on /metrics: {metrics}"));
    // One span in the hanging export, two queued: the rest dropped.
    assert!(dropped >= 17, "dropped {dropped}: {metrics}");
}

#[tokio::test]
async fn without_an_endpoint_nothing_is_built_and_metrics_say_nothing_of_it() {
    let otel = |vars: &[(&str, &str)]| settings_of(&[vars]).otel;
    assert!(sendgate::otel::Otel::build(&otel(&[]))
        .expect("builds")
        .is_none());
    assert!(
        sendgate::otel::Otel::build(&otel(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_SDK_DISABLED", "true"),
        ]))
        .expect("builds")
        .is_none(),
        "OTEL_SDK_DISABLED"
    );
    let app = spawn_app_with(&[]).await;
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(!metrics.contains("sendgate_otel"), "{metrics}");
}

/// The specification's variables read from the environment (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_EXPORTER_OTLP_HEADERS`): the
/// real binary, whose environment they are.
#[tokio::test]
async fn the_binary_honours_the_specifications_variables() {
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint();
    let dir = tempfile::tempdir().expect("a data directory");
    let data = dir.path().display().to_string();
    let gateway = GatewayProcess::start(&[
        ("SENDGATE_DATA_DIR", data.as_str()),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            &format!("{endpoint}/v1/traces"),
        ),
        ("OTEL_SERVICE_NAME", "orders-gateway"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci"),
        ("OTEL_TRACES_SAMPLER", "parentbased_always_off"),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=EXPORT%3DSECRET"),
    ])
    .await;
    // A sampled parent is followed; a root is not sampled (always_off).
    let sampled = gateway
        .client
        .post(gateway.url("/v1/queues/requests/messages"))
        .header("Content-Type", "application/json")
        .header("traceparent", TRACEPARENT)
        .body("{}")
        .send()
        .await
        .expect("answered");
    assert_eq!(sampled.status(), 201);
    assert_eq!(gateway.send("requests", "{}").await.expect("answered"), 201);
    let spans = receiver.wait_spans(WAIT, |s| !s.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spans_later = receiver.spans();
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans_later.len(), 1, "the root span was not sampled");
    assert_eq!(hex(&spans[0].trace_id), TRACE_ID);
    let resources = receiver.span_resources();
    assert_eq!(
        attribute(&resources[0], "service.name").as_deref(),
        Some("orders-gateway")
    );
    assert_eq!(
        attribute(&resources[0], "deployment.environment.name").as_deref(),
        Some("ci")
    );
    assert!(receiver.metrics().is_empty(), "traces only");
    assert_eq!(
        receiver.header("/v1/traces", "api-key"),
        ["EXPORT=SECRET"],
        "OTEL_EXPORTER_OTLP_HEADERS, percent-decoded"
    );
}

/// What the Azure Container Apps managed OpenTelemetry agent asks of an app: OTLP over
/// gRPC, HTTP/2 in the clear, to the endpoint it injects (`OTEL_EXPORTER_OTLP_ENDPOINT`,
/// `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`). Spans and metrics arrive through the collector's
/// own generated services, the headers as the calls' metadata.
#[tokio::test]
async fn over_grpc_as_the_container_apps_agent_takes_them_spans_and_metrics_arrive() {
    let receiver = Receiver::grpc().await;
    let app = exporting_to(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=GRPC%3DSECRET"),
        ],
    )
    .await;
    let response = app
        .send_with("requests", "{}", &[("traceparent", TRACEPARENT)])
        .await;
    assert_eq!(response.status(), 201);

    let spans = receiver.wait_spans(WAIT, |s| !s.is_empty()).await;
    assert_eq!(spans.len(), 1, "one span per send: {spans:?}");
    let span = &spans[0];
    assert_eq!(span.name, "send requests");
    assert_eq!(span.kind, SpanKind::Producer as i32);
    assert_eq!(hex(&span.trace_id), TRACE_ID);
    assert_eq!(hex(&span.parent_span_id), PARENT_ID);
    for (key, value) in [
        ("messaging.system", "sendgate_embedded"),
        ("messaging.destination.name", "requests"),
        ("messaging.operation.type", "send"),
        ("sendgate.admission.outcome", "admitted"),
    ] {
        assert_eq!(attr(span, key).as_deref(), Some(value), "{key}: {span:?}");
    }
    let duration = receiver
        .wait_metric(WAIT, "messaging.client.operation.duration")
        .await
        .expect("the duration histogram, over gRPC");
    assert_eq!(duration.unit, "s");
    assert_eq!(receiver.header(GRPC_TRACES, "x-api-key"), ["GRPC=SECRET"]);
    assert!(
        receiver
            .header(GRPC_METRICS, "x-api-key")
            .iter()
            .all(|v| v == "GRPC=SECRET")
            && !receiver.header(GRPC_METRICS, "x-api-key").is_empty(),
        "the metrics' calls carry the headers too"
    );
    assert_eq!(
        receiver.header(GRPC_TRACES, "content-type"),
        ["application/grpc"]
    );
}

/// Issue 41: the managed agent's Application Insights destination takes no metrics, so the
/// infra sets `OTEL_METRICS_EXPORTER=none`: the spans still arrive, no metrics call is made.
#[tokio::test]
async fn with_otel_metrics_exporter_none_spans_arrive_and_no_metrics_are_sent() {
    let receiver = Receiver::grpc().await;
    let app = exporting_to(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_METRICS_EXPORTER", "none"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "50"),
        ],
    )
    .await;
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    let spans = receiver.wait_spans(WAIT, |s| !s.is_empty()).await;
    assert_eq!(spans.len(), 1, "{spans:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(receiver.metrics().is_empty(), "ten intervals, no metrics");
    assert!(
        receiver.header(GRPC_METRICS, "content-type").is_empty(),
        "no metrics call at all"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
