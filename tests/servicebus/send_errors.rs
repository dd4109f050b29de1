//! Every way Service Bus can refuse a send, and the answer the producer gets for it.

use std::time::{Duration, Instant};

use crate::helpers::spawn_with;
use sendgate_testkit::gateway::{body_json, retry_after};
use sendgate_testkit::servicebus_stub::{Reply, CLAIM_EMPTY_401};

fn error(code: u16, detail: &str) -> String {
    format!("<Error><Code>{code}</Code><Detail>{detail}</Detail></Error>")
}

#[tokio::test]
async fn each_broker_refusal_maps_to_its_answer() {
    let app = spawn_with(&[
        ("SENDGATE_MAX_BODY_BYTES", "100000"),
        // Most of these refusals are backend failures, one after another: by default the
        // circuit breaker would open after the tenth and answer the rest itself. This test
        // is about how each broker answer maps; the breaker has its own tests.
        ("SENDGATE_BREAKER_MIN_FAILURES", "1000"),
    ])
    .await;
    let too_large = error(
        403,
        "The received message (delivery-id:0, size:300000 bytes) exceeds the limit (262144 bytes) currently allowed on the link.",
    );
    let quota = error(
        403,
        "The maximum entity size has been reached or exceeded for Queue: 'requests'. Quota exceeded.",
    );
    let no_send_claim = error(403, "Send claims are required for this operation.");
    let disabled = error(
        403,
        "Messaging entity 'test:Queue:requests' is currently disabled.",
    );
    // (broker answer, expected status, code, Retry-After)
    let cases: Vec<(Reply, u16, &str, Option<u64>)> = vec![
        (
            Reply::xml(401, CLAIM_EMPTY_401),
            502,
            "backend_auth_failed",
            None,
        ),
        (
            Reply::xml(403, &no_send_claim),
            502,
            "backend_auth_failed",
            None,
        ),
        (Reply::xml(403, &quota), 503, "backend_busy", Some(1)),
        (Reply::xml(403, &too_large), 413, "payload_too_large", None),
        (Reply::status(413), 413, "payload_too_large", None),
        (Reply::xml(403, &disabled), 409, "queue_disabled", None),
        (
            Reply::xml(404, &error(404, "No such entity")),
            502,
            "send_failed",
            None,
        ),
        (
            Reply::xml(410, &error(410, "Gone")),
            502,
            "send_failed",
            None,
        ),
        (
            Reply::xml(500, &error(500, "Internal error")),
            502,
            "send_failed",
            None,
        ),
        (
            Reply::xml(400, &error(400, "Bad request")),
            502,
            "send_failed",
            None,
        ),
        (
            Reply::xml(503, &error(503, "Server busy")).header("Retry-After", "7"),
            503,
            "backend_busy",
            Some(7),
        ),
        (Reply::status(503), 503, "backend_busy", Some(1)),
        (Reply::status(429), 503, "backend_busy", Some(1)),
        (
            Reply::status(429).header("Retry-After", "12"),
            503,
            "backend_busy",
            Some(12),
        ),
        // Bounded by us, not by the broker: a producer is never told to wait for years.
        (
            Reply::status(429).header("Retry-After", "9999999999"),
            503,
            "backend_busy",
            Some(60),
        ),
        (
            Reply::status(503).header("Retry-After", "61"),
            503,
            "backend_busy",
            Some(60),
        ),
    ];
    let total = cases.len();
    for (i, (reply, status, code, retry)) in cases.into_iter().enumerate() {
        let label = format!("{reply:?}");
        app.stub.push_send(reply);
        let response = app.send("{\"n\":1}").await;
        assert_eq!(response.status().as_u16(), status, "{label}");
        assert_eq!(retry_after(&response), retry, "{label}");
        let body = body_json(response).await;
        assert_eq!(body["code"], code, "{label}: {body}");
        assert!(body["message"].is_string() && body["request_id"].is_string());
        if code == "payload_too_large" {
            assert_eq!(body["limit_bytes"], 100000, "{body}");
        }
        assert_eq!(app.stub.sends().len(), i + 1, "one POST per send, no retry");
    }
    // Refusals are not stored: after them all, a send is admitted and answered 201.
    assert_eq!(app.send("{}").await.status(), 201);
    assert_eq!(app.stub.sends().len(), total + 1);
}

#[tokio::test]
async fn a_send_the_broker_never_answers_is_a_504_at_the_deadline() {
    let app = spawn_with(&[("SENDGATE_SEND_TIMEOUT_MS", "400")]).await;
    app.stub.on_send(Reply::Hang);
    let started = Instant::now();
    let response = app
        .send_with("{}", &[("Idempotency-Key", "retry-me")])
        .await;
    let took = started.elapsed();
    assert_eq!(response.status(), 504);
    let body = body_json(response).await;
    assert_eq!(body["code"], "send_timeout");
    assert_eq!(body["outcome"], "unknown");
    assert_eq!(body["message_id"], "retry-me");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(3000),
        "answered after {took:?}"
    );
    assert_eq!(app.stub.sends().len(), 1, "the request reached the broker");
}

#[tokio::test]
async fn a_slow_answer_inside_the_deadline_is_still_a_201() {
    let app = spawn_with(&[("SENDGATE_SEND_TIMEOUT_MS", "2000")]).await;
    app.stub
        .push_send(Reply::status(201).after(Duration::from_millis(300)));
    assert_eq!(app.send("{}").await.status(), 201);
}

#[tokio::test]
async fn a_connection_closed_without_an_answer_is_a_502_send_failed() {
    let app = spawn_with(&[]).await;
    app.stub.on_send(Reply::Close);
    let response = app.send("{}").await;
    assert_eq!(response.status(), 502);
    let body = body_json(response).await;
    assert_eq!(body["code"], "send_failed", "{body}");
    // The request left and the connection closed before an answer: the broker may have
    // the message, so the body says so, with the id to retry with.
    assert_eq!(body["outcome"], "unknown", "{body}");
    assert!(body["message_id"].is_string(), "{body}");
    // The gateway keeps working once the broker answers again.
    app.stub.on_send(Reply::status(201));
    assert_eq!(app.send("{}").await.status(), 201);
}
