//! A message's attributes and trace context on the message the real broker delivers, sent
//! through the `Backend` trait (and, for the refusal, through the real binary's HTTP).

use std::time::{Duration, Instant};

use lapin::types::{AMQPValue, FieldTable, LongString};
use sendgate::backend::SendReceipt;
use sendgate::domain::{Attributes, Field, Raw, TraceContext};
use serde_json::json;

use sendgate_testkit::gateway::GatewayProcess;
use sendgate_testkit::rabbit;
use sendgate_testkit::rabbitmq_app::{backend, deadline_in, message};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn text(value: Option<&lapin::types::ShortString>) -> Option<&str> {
    value.map(|s| s.as_str())
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn headers(m: &lapin::message::BasicGetMessage) -> FieldTable {
    m.delivery
        .properties
        .headers()
        .clone()
        .expect("the message has a headers table")
}

fn header_text(table: &FieldTable, name: &str) -> String {
    match table.inner().get(name) {
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).unwrap(),
        other => panic!("{name}: not a long string: {other:?}"),
    }
}

#[tokio::test]
async fn every_attribute_arrives_on_the_delivered_message_with_its_amqp_type() {
    let queue = rabbit::unique("sg-attrs");
    let backend = backend(&queue, &[]).await;
    let mut m = message(
        &queue,
        "attrs-1",
        r#"{"order":7}"#,
        json!({
            "subject": "order.created",
            "session_id": "customer-7",
            "partition_key": "customer-7",
            "time_to_live_s": 90,
            "reply_to": "replies",
            "to": "billing",
            "properties": {
                "priority": "high", "attempt": 3, "big": 9_007_199_254_740_993_i64,
                "ratio": 0.5, "urgent": true, "quiet": false, "Priority": "case kept"
            },
        }),
    );
    m.correlation_id = Some(sendgate::domain::CorrelationId::parse("corr-1").unwrap());
    m.trace =
        TraceContext::from_request(Some(TRACEPARENT), Some("congo=t61rcWkgMzE")).for_message();
    let traceparent = m.trace.parent.to_string();
    assert_eq!(
        backend.send(m, deadline_in(5000)).await,
        Ok(SendReceipt { duplicate: false })
    );

    let got = rabbit::take(&queue, 10).await;
    assert_eq!(got.len(), 1);
    let p = &got[0].delivery.properties;
    assert_eq!(got[0].delivery.data, br#"{"order":7}"#, "byte for byte");
    assert_eq!(text(p.message_id().as_ref()), Some("attrs-1"));
    assert_eq!(text(p.correlation_id().as_ref()), Some("corr-1"));
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        text(p.kind().as_ref()),
        Some("order.created"),
        "subject → type"
    );
    assert_eq!(text(p.reply_to().as_ref()), Some("replies"));
    assert_eq!(text(p.expiration().as_ref()), Some("90000"), "TTL in ms");

    let h = headers(&got[0]);
    let expected = [
        ("priority", long_string("high")),
        ("Priority", long_string("case kept")),
        ("attempt", AMQPValue::LongLongInt(3)),
        ("big", AMQPValue::LongLongInt(9_007_199_254_740_993)),
        ("ratio", AMQPValue::Double(0.5)),
        ("urgent", AMQPValue::Boolean(true)),
        ("quiet", AMQPValue::Boolean(false)),
        ("sendgate.session_id", long_string("customer-7")),
        ("sendgate.partition_key", long_string("customer-7")),
        ("sendgate.to", long_string("billing")),
        ("traceparent", long_string(&traceparent)),
        ("tracestate", long_string("congo=t61rcWkgMzE")),
        ("Diagnostic-Id", long_string(&traceparent)),
    ];
    for (name, value) in &expected {
        assert_eq!(h.inner().get(*name), Some(value), "header {name}: {h:?}");
    }
    assert_eq!(h.inner().len(), expected.len(), "nothing else: {h:?}");
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn messages_of_one_request_share_its_trace_each_with_a_parent_id_of_its_own() {
    let queue = rabbit::unique("sg-trace");
    let backend = backend(&queue, &[]).await;
    let request = TraceContext::from_request(Some(TRACEPARENT), None);
    for id in ["t-1", "t-2"] {
        let mut m = message(&queue, id, "{}", json!({}));
        m.trace = request.for_message();
        assert!(backend.send(m, deadline_in(5000)).await.is_ok());
    }
    let got = rabbit::take(&queue, 10).await;
    assert_eq!(got.len(), 2);
    let parents: Vec<String> = got
        .iter()
        .map(|m| {
            let h = headers(m);
            let traceparent = header_text(&h, "traceparent");
            assert_eq!(header_text(&h, "Diagnostic-Id"), traceparent);
            assert!(!h.contains_key("tracestate"), "none was given: {h:?}");
            traceparent
        })
        .collect();
    assert_ne!(
        parents[0], parents[1],
        "the trace context is unique per message"
    );
    for p in &parents {
        assert_eq!(p.len(), 55, "{p}");
        assert_eq!(&p[..36], &TRACEPARENT[..36], "the request's trace: {p}");
        assert_eq!(&p[52..], "-01", "its flags: {p}");
        assert_ne!(
            &p[36..52],
            &TRACEPARENT[36..52],
            "not the request's own parent id"
        );
    }
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_message_past_its_time_to_live_leaves_the_queue_undelivered() {
    let queue = rabbit::unique("sg-ttl");
    let backend = backend(&queue, &[]).await;
    let sent = Instant::now();
    let expiring = message(&queue, "ttl-1s", "{}", json!({"time_to_live_s": 1}));
    assert!(backend.send(expiring, deadline_in(5000)).await.is_ok());
    let lasting = message(&queue, "no-ttl", "{}", json!({}));
    assert!(backend.send(lasting, deadline_in(5000)).await.is_ok());
    assert_eq!(rabbit::ready(&queue).await, 2, "both stored");
    // The broker drops the expired message once it is due (it is at the head): poll.
    while rabbit::ready(&queue).await != 1 {
        assert!(sent.elapsed() < Duration::from_secs(10), "never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "gone after {:?}: before its TTL",
        sent.elapsed()
    );
    let left = rabbit::take(&queue, 10).await;
    let ids: Vec<_> = left
        .iter()
        .map(|m| {
            text(m.delivery.properties.message_id().as_ref())
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids, ["no-ttl"], "the expired one is never delivered");
    rabbit::delete(&queue).await;
}

fn attributes(fields: serde_json::Value) -> Attributes {
    let map = fields.as_object().unwrap().clone();
    Attributes::parse(|f| map.get(f.json_name()).map(Raw::Json)).unwrap()
}

#[tokio::test]
async fn a_scheduled_enqueue_is_the_one_attribute_refused() {
    let queue = rabbit::unique("sg-unsupported");
    let backend = backend(&queue, &[]).await;
    let everything_else = json!({
        "subject": "s", "session_id": "k", "partition_key": "k", "time_to_live_s": 60,
        "reply_to": "r", "to": "t", "properties": {"p": 1},
    });
    assert_eq!(
        backend.unsupported(&attributes(everything_else.clone())),
        None
    );
    let mut scheduled = everything_else;
    scheduled["scheduled_enqueue_time"] = json!("2030-01-01T00:00:00Z");
    assert_eq!(
        backend.unsupported(&attributes(scheduled)),
        Some(Field::ScheduledEnqueueTime)
    );
    assert_eq!(
        backend.unsupported(&attributes(
            json!({"scheduled_enqueue_time": "2030-01-01T00:00:00Z"})
        )),
        Some(Field::ScheduledEnqueueTime)
    );
    rabbit::delete(&queue).await;
}

/// Properties of one string value, as long as they can be on this connection (16 KiB
/// frames): the backend's check allows for the longest ids and `tracestate`.
fn properties_of_length(value_bytes: usize) -> serde_json::Value {
    json!({"properties": {"p": "v".repeat(value_bytes)}})
}

#[tokio::test]
async fn the_largest_headers_the_backend_accepts_fit_the_brokers_frame_and_one_byte_more_is_refused(
) {
    let queue = rabbit::unique("sg-frame");
    let backend = backend(&queue, &[]).await;
    // The largest value accepted, found from the backend's own answer.
    let mut n = 15_000;
    while backend
        .unsupported(&attributes(properties_of_length(n + 1)))
        .is_none()
    {
        n += 1;
        assert!(n < 17_000, "properties past a 16 KiB frame accepted");
    }
    assert_eq!(
        backend.unsupported(&attributes(properties_of_length(n + 1))),
        Some(Field::Properties)
    );
    // Sent with the longest ids and tracestate, the content header is exactly the
    // connection's frame_max: a byte more and the broker would close the connection.
    let state = format!("a={},b={}", "v".repeat(254), "v".repeat(253));
    let mut m = message(&queue, &"m".repeat(128), "{}", properties_of_length(n));
    m.correlation_id = Some(sendgate::domain::CorrelationId::parse(&"c".repeat(128)).unwrap());
    m.trace = TraceContext::from_request(Some(TRACEPARENT), Some(&state)).for_message();
    assert_eq!(
        backend.send(m, deadline_in(5000)).await,
        Ok(SendReceipt { duplicate: false })
    );
    let got = rabbit::take(&queue, 1).await;
    assert_eq!(header_text(&headers(&got[0]), "p").len(), n);
    assert_eq!(header_text(&headers(&got[0]), "tracestate"), state);
    // And the connection is the same one, still healthy: the next send goes through.
    let m = message(&queue, "after", "{}", json!({}));
    assert!(backend.send(m, deadline_in(5000)).await.is_ok());
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_send_with_a_schedule_is_422_unsupported_attribute_and_nothing_is_published() {
    // The real binary: its backend is the RabbitMQ backend itself, nothing wrapped around it.
    sendgate_testkit::ensure::rabbitmq();
    let queue = rabbit::unique("sg-schedule-422");
    let gw = GatewayProcess::start(&[
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_QUEUES", &queue),
    ])
    .await;
    for path in ["", "?dry_run=true"] {
        let response = gw
            .client
            .post(gw.url(&format!("/v1/queues/{queue}/messages{path}")))
            .header("Content-Type", "application/json")
            .header("Message-Scheduled-Enqueue-Time", "2030-01-01T00:00:00Z")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "{path}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["code"], "unsupported_attribute", "{path}: {body}");
        assert_eq!(
            body["attribute"], "scheduled_enqueue_time",
            "{path}: {body}"
        );
        assert_eq!(body["backend"], "rabbitmq", "{path}: {body}");
    }
    // The queue exists (declared at start-up) and holds nothing.
    assert_eq!(rabbit::ready(&queue).await, 0);
    // Without the schedule the same send is stored: the 422 was the schedule's.
    assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201);
    assert_eq!(rabbit::ready(&queue).await, 1);
    rabbit::delete(&queue).await;
}
