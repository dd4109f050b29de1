//! What a send puts on the wire: request line, headers, body, and a SAS token that verifies.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::helpers::{
    assert_sas_verifies, connection_string, only_message, percent_decode, spawn_with, MANAGE_KEY,
    NAMESPACE, SEND_KEY,
};
use sendgate_testkit::gateway::body_json;
use sendgate_testkit::servicebus_stub::BATCH_CONTENT_TYPE;

#[tokio::test]
async fn a_send_without_properties_is_one_send_message_whose_content_type_consumers_read_as_json() {
    let app = spawn_with(&[]).await;
    // Whitespace, key order and escapes that a re-serialisation would change.
    let body =
        "{ \"prompt\" : \"h\\u00e9llo\",\n  \"n\": [1, 2.50, 1e3], \"q\": \"caf\u{e9} \\\"\" }";
    let response = app
        .send_with(
            body,
            &[
                ("Idempotency-Key", "order-1"),
                ("X-Correlation-Id", "corr-9"),
            ],
        )
        .await;
    assert_eq!(response.status(), 201);
    let answer = body_json(response).await;
    assert_eq!(answer["message_id"], "order-1");
    let traceparent = answer["traceparent"].as_str().unwrap().to_owned();

    let sends = app.stub.sends();
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert!(
        app.stub.violations().is_empty(),
        "{:?}",
        app.stub.violations()
    );
    let send = &sends[0];
    assert_eq!(send.request_line(), "POST /requests/messages HTTP/1.1");
    // Send Message: the only form whose message has a ContentType (Message Headers and
    // Properties maps it to this request's Content-Type header).
    assert!(send.is_single_form(), "{:?}", send.header("Content-Type"));
    let message = only_message(send);
    assert_eq!(
        message.content_type.as_deref(),
        Some("application/json"),
        "an azure-servicebus consumer reads content_type"
    );
    assert_eq!(
        message.body,
        body.as_bytes(),
        "the body arrives byte for byte"
    );
    assert_eq!(
        serde_json::Value::Object(message.broker),
        serde_json::json!({"MessageId": "order-1", "CorrelationId": "corr-9"})
    );
    // The trace context as custom-property headers, values as text.
    let user: Vec<(String, String)> = message
        .user
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        user,
        [
            ("diagnostic-id".to_owned(), traceparent.clone()),
            ("traceparent".to_owned(), traceparent),
        ]
    );
    let authorization = send.header("Authorization").unwrap();
    assert!(
        authorization.starts_with("SharedAccessSignature sr="),
        "{authorization}"
    );
}

#[tokio::test]
async fn a_send_with_properties_is_a_batch_of_one_whose_consumers_read_no_content_type() {
    let app = spawn_with(&[]).await;
    let body = "{\"a\": 1}";
    let response = app
        .send_with(body, &[("Message-Properties", r#"{"Attempt":3}"#)])
        .await;
    assert_eq!(response.status(), 201);
    let send = &app.stub.sends()[0];
    // Send Message Batch: the content type without parameters, no BrokerProperties header.
    assert_eq!(send.header("Content-Type"), Some(BATCH_CONTENT_TYPE));
    assert_eq!(send.header_count("BrokerProperties"), 0);
    let message = only_message(send);
    assert_eq!(message.content_type, None, "the batch form documents none");
    assert_eq!(message.body, body.as_bytes());
    assert!(
        message.is_body_base64,
        "bytes travel as base64, the documented flag set"
    );
    assert_eq!(
        message.user["Attempt"], 3,
        "the name's case and the value's type"
    );
    assert!(app.stub.violations().is_empty());
}

#[tokio::test]
async fn without_a_correlation_id_broker_properties_carry_only_the_generated_message_id() {
    let app = spawn_with(&[]).await;
    let response = app.send("{}").await;
    assert_eq!(response.status(), 201);
    let message_id = body_json(response).await["message_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(message_id.len(), 36, "a UUID: {message_id}");

    let message = only_message(&app.stub.sends()[0]);
    assert_eq!(
        serde_json::Value::Object(message.broker),
        serde_json::json!({ "MessageId": message_id })
    );
}

#[tokio::test]
async fn the_sas_token_verifies_against_the_key_the_queue_url_and_its_expiry() {
    let app = spawn_with(&[]).await;
    assert_eq!(app.send("{}").await.status(), 201);
    let send = &app.stub.sends()[0];
    let sas = assert_sas_verifies(send.header("Authorization").unwrap(), SEND_KEY);

    assert_eq!(sas.skn, "send");
    // Signed for the queue's URL on the namespace (not the stub's address), url-encoded.
    assert_eq!(
        sas.sr,
        "https%3A%2F%2Ftest.servicebus.windows.net%2Frequests"
    );
    assert_eq!(
        percent_decode(&sas.sr),
        format!("https://{NAMESPACE}/requests")
    );
    // Valid for an hour from now.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expiry: u64 = sas.se.parse().unwrap();
    assert!(
        (now + 3500..=now + 3601).contains(&expiry),
        "se={expiry}, now={now}"
    );
    // The key used as base64 text would not verify if it had been decoded first.
    assert!(SEND_KEY.ends_with('='));
}

#[tokio::test]
async fn the_same_token_is_reused_between_calls() {
    let app = spawn_with(&[("SENDGATE_DEPTH_TTL_MS", "0")]).await;
    assert_eq!(app.statuses(3).await, [201, 201, 201]);
    let after_start = app.requests_since_start();
    let shape: Vec<_> = after_start
        .iter()
        .map(|r| (r.is_depth_read(), r.is_send()))
        .collect();
    assert_eq!(
        shape,
        [(true, false), (false, true)].repeat(3),
        "a depth read before each send"
    );
    // The start-up read's token and the six calls after it: one token.
    let requests = app.stub.requests();
    assert_eq!(requests.len(), 7);
    let tokens: std::collections::BTreeSet<_> = requests
        .iter()
        .map(|r| r.header("Authorization").unwrap().to_owned())
        .collect();
    assert_eq!(
        tokens.len(),
        1,
        "one cached token for the queue: {tokens:?}"
    );
}

#[tokio::test]
async fn depth_reads_use_the_manage_key_when_one_is_set() {
    let manage = connection_string("manage", MANAGE_KEY);
    let app = spawn_with(&[
        ("SERVICEBUS_MANAGE_CONNECTION_STRING", &manage),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    assert_eq!(app.send("{}").await.status(), 201);

    let reads = app.stub.depth_reads();
    assert_eq!(reads.len(), 1, "the start-up read, reused for the send");
    let read = assert_sas_verifies(reads[0].header("Authorization").unwrap(), MANAGE_KEY);
    assert_eq!(read.skn, "manage");
    let send = assert_sas_verifies(
        app.stub.sends()[0].header("Authorization").unwrap(),
        SEND_KEY,
    );
    assert_eq!(send.skn, "send");
}

#[tokio::test]
async fn one_pooled_client_reuses_its_connections() {
    let app = spawn_with(&[("SENDGATE_DEPTH_TTL_MS", "0")]).await;
    let connections_at_start = app.stub.connections();
    assert_eq!(
        connections_at_start, 1,
        "one connection for the start-up read"
    );
    assert_eq!(app.statuses(5).await, [201; 5]);
    let requests = app.requests_since_start().len();
    assert_eq!(requests, 10, "a depth read and a send, five times");
    let opened = app.stub.connections() - connections_at_start;
    assert!(
        opened < requests,
        "{opened} new connections for {requests} requests after start-up"
    );
    assert!(
        app.stub.connections() < app.stub.requests().len(),
        "{} connections for {} requests in all",
        app.stub.connections(),
        app.stub.requests().len()
    );
}

#[tokio::test]
async fn health_shows_the_servicebus_backend() {
    // `spawn_with` has checked that start-up made only its one depth read.
    let app = spawn_with(&[]).await;
    let health = app.detailed().await;
    assert_eq!(
        health["backends"]["primary"]["kind"], "servicebus",
        "{health}"
    );
    // `CountDetails`' lag is a documented assumption (not measurable here), said as such.
    assert_eq!(health["backends"]["primary"]["depth_lag_ms"], 1000);
    assert_eq!(health["backends"]["primary"]["depth_lag_source"], "default");
    for path in ["/health/live", "/health/ready", "/health/detailed"] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    assert!(
        app.requests_since_start().is_empty(),
        "health never calls the broker: {:?}",
        app.requests_since_start()
    );
    app.stop().await;
}
