//! Every attribute of a single send (its `Message-*` headers) and its trace context, as
//! Service Bus receives them: `BrokerProperties` (names, JSON types, the date form) in
//! either form, and, with application properties, the batch form's `UserProperties`
//! (names' case, JSON types).

use serde_json::json;

use crate::helpers::{only_message, spawn_with};
use sendgate_testkit::gateway::body_json;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

#[tokio::test]
async fn every_attribute_reaches_service_bus_in_the_documented_form() {
    let app = spawn_with(&[]).await;
    let body = r#"{"order": 7, "note": "caf\u00e9"}"#;
    let response = app
        .send_with(
            body,
            &[
                ("Idempotency-Key", "order-7"),
                ("X-Correlation-Id", "corr-7"),
                ("Message-Subject", "order.created"),
                ("Message-Session-Id", "customer-7"),
                ("Message-Partition-Key", "customer-7"),
                ("Message-Time-To-Live", "90"),
                (
                    "Message-Scheduled-Enqueue-Time",
                    "2026-12-02T09:30:00+01:00",
                ),
                ("Message-Reply-To", "replies"),
                ("Message-To", "billing"),
                (
                    "Message-Properties",
                    r#"{"priority":"high","Attempt":3,"ratio":0.5,"version":2.0,"urgent":true,"big":18446744073709551615}"#,
                ),
                ("traceparent", TRACEPARENT),
                ("tracestate", TRACESTATE),
            ],
        )
        .await;
    assert_eq!(response.status(), 201);
    let answer = body_json(response).await;
    let traceparent = answer["traceparent"].as_str().unwrap().to_owned();

    let sends = app.stub.sends();
    assert_eq!(sends.len(), 1, "one REST call: {sends:?}");
    assert!(
        app.stub.violations().is_empty(),
        "{:?}",
        app.stub.violations()
    );
    let message = only_message(&sends[0]);
    assert_eq!(
        message.body,
        body.as_bytes(),
        "the body arrives byte for byte"
    );

    // Field names, JSON types and the date exactly as Message Headers and Properties
    // documents them: TimeToLive a number of seconds, the schedule an RFC 1123 date in GMT
    // (09:30 at +01:00 is 08:30 UTC; 2 December 2026 is a Wednesday).
    assert_eq!(
        serde_json::Value::Object(message.broker.clone()),
        json!({
            "MessageId": "order-7",
            "CorrelationId": "corr-7",
            "Label": "order.created",
            "SessionId": "customer-7",
            "PartitionKey": "customer-7",
            "TimeToLive": 90,
            "ScheduledEnqueueTimeUtc": "Wed, 02 Dec 2026 08:30:00 GMT",
            "ReplyTo": "replies",
            "To": "billing",
        })
    );
    assert!(message.broker["TimeToLive"].is_u64(), "a number, not text");

    // The caller's properties with their names' case and JSON types, and the message's
    // trace context: the request's trace, a parent id of its own, the state passed on.
    assert_eq!(traceparent.len(), 55, "{traceparent}");
    assert!(
        traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-")
            && traceparent.ends_with("-01"),
        "the request's trace and flags: {traceparent}"
    );
    assert_ne!(traceparent, TRACEPARENT, "a new parent id for the message");
    assert_eq!(
        serde_json::Value::Object(message.user.clone()),
        json!({
            "priority": "high",
            "Attempt": 3,
            "ratio": 0.5,
            "version": 2.0,
            "urgent": true,
            "big": 18446744073709551615u64 as f64,
            "traceparent": traceparent,
            "tracestate": TRACESTATE,
            "Diagnostic-Id": traceparent,
        })
    );
    let user = &message.user;
    assert!(user["Attempt"].is_i64() && !user["Attempt"].is_f64());
    assert!(
        user["version"].is_f64(),
        "2.0 stays a floating-point number"
    );
    assert!(user["big"].is_f64(), "past i64: a floating-point number");
    assert!(user["urgent"].is_boolean() && user["priority"].is_string());
    assert!(
        !user.contains_key("attempt") && !user.contains_key("diagnostic-id"),
        "names keep their case"
    );
}

#[tokio::test]
async fn without_attributes_or_a_request_trace_the_message_carries_a_trace_of_its_own() {
    let app = spawn_with(&[]).await;
    let response = app
        .send_with(
            "{}",
            &[("tracestate", TRACESTATE), ("Idempotency-Key", "k")],
        )
        .await;
    assert_eq!(response.status(), 201);
    let traceparent = body_json(response).await["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    let message = only_message(&app.stub.sends()[0]);
    assert_eq!(
        serde_json::Value::Object(message.broker),
        json!({"MessageId": "k"}),
        "no broker property the request did not set"
    );
    // A tracestate without a traceparent means nothing (W3C): dropped, a new trace. No
    // application properties: the single form, its trace properties as headers (HTTP
    // names, which travel lowercased) and its content type.
    assert_eq!(message.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        serde_json::Value::Object(message.user),
        json!({"traceparent": traceparent, "diagnostic-id": traceparent})
    );
    assert!(traceparent.ends_with("-00"), "a trace nothing sampled");
}
