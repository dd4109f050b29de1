//! `send_batch` through the `Backend` trait (the HTTP batch route is not here yet): as few
//! Send Message Batch calls as Service Bus allows (one session / partition key per call,
//! each call's JSON body within SENDGATE_SERVICEBUS_MAX_BATCH_BYTES), the caller's order
//! kept, each call atomic: its answer is every one of its messages' result.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use sendgate::backend::servicebus::ServiceBus;
use sendgate::backend::{Backend, OutgoingMessage, SendError, SendReceipt};
use sendgate::domain::{Attributes, MessageId, QueueName, Raw, TraceContext};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::helpers::backend_on;
use sendgate_testkit::servicebus_stub::{Recorded, Reply, ServiceBusStub};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const SENT: Result<SendReceipt, SendError> = Ok(SendReceipt { duplicate: false });

/// A message for `requests` with this id, body and attributes (a batch entry's fields).
fn message(id: &str, body: &str, attributes: Value) -> OutgoingMessage {
    let fields = attributes.as_object().expect("an object").clone();
    let attributes =
        Attributes::parse(|f| fields.get(f.json_name()).map(Raw::Json)).expect("valid attributes");
    OutgoingMessage {
        attributes: attributes.into(),
        trace: TraceContext::from_request(Some(TRACEPARENT), None).for_message(),
        ..OutgoingMessage::new(
            QueueName::parse("requests").unwrap(),
            MessageId::parse(id).unwrap(),
            None,
            Bytes::from(body.to_owned()),
        )
    }
}

fn plain(id: &str) -> OutgoingMessage {
    message(id, &format!("{{\"id\":\"{id}\"}}"), json!({}))
}

fn session(id: &str, key: &str) -> OutgoingMessage {
    message(id, "{}", json!({ "session_id": key }))
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// Each call's message ids, in the order the stub received the calls.
fn calls(stub: &ServiceBusStub) -> Vec<Vec<String>> {
    stub.sends().iter().map(Recorded::message_ids).collect()
}

/// The calls as a set of id lists: concurrent calls arrive in any order.
fn call_set(stub: &ServiceBusStub) -> BTreeSet<Vec<String>> {
    calls(stub).into_iter().collect()
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn one_call_per_session_or_partition_key_with_the_callers_order_kept() {
    let stub = ServiceBusStub::start().await;
    let bus = backend_on(&stub, &[]);
    let batch = vec![
        plain("a1"),
        session("s1", "A"),
        plain("a2"),
        message("p1", "{}", json!({"partition_key": "P"})),
        session("s2", "A"),
        // Both keys (equal, as Service Bus requires): the session's group.
        message("s3", "{}", json!({"session_id": "A", "partition_key": "A"})),
        plain("a3"),
        message("p2", "{}", json!({"partition_key": "P"})),
    ];
    let results = bus.send_batch(batch, deadline()).await;
    assert_eq!(results, vec![SENT; 8], "one result per message, in order");
    assert_eq!(
        call_set(&stub),
        BTreeSet::from([
            ids(&["a1", "a2", "a3"]),
            ids(&["s1", "s2", "s3"]),
            ids(&["p1", "p2"]),
        ]),
        "exactly three calls: the unkeyed messages together, one per key"
    );
    assert!(stub.violations().is_empty(), "{:?}", stub.violations());
    for send in stub.sends() {
        let messages = send.messages().unwrap();
        // The key a call shares: the session id, else the partition key (a session's
        // partition key is its session id).
        let keys: BTreeSet<Option<String>> = messages
            .iter()
            .map(|m| {
                m.broker
                    .get("SessionId")
                    .or(m.broker.get("PartitionKey"))
                    .map(|v| v.as_str().unwrap().to_owned())
            })
            .collect();
        assert_eq!(keys.len(), 1, "one call, one key: {keys:?}");
    }
}

#[tokio::test]
async fn an_empty_batch_makes_no_call() {
    let stub = ServiceBusStub::start().await;
    let bus = backend_on(&stub, &[]);
    assert!(bus.send_batch(Vec::new(), deadline()).await.is_empty());
    assert!(stub.sends().is_empty());
}

/// Messages whose entries all have one length (same body and id lengths, trace ids of
/// fixed length): what one entry weighs is measured on a batch of one.
fn sized(n: usize) -> Vec<OutgoingMessage> {
    (0..n)
        .map(|i| message(&format!("m{i}"), &"x".repeat(200), json!({})))
        .collect()
}

async fn entry_len() -> usize {
    let stub = ServiceBusStub::start().await;
    let bus = backend_on(&stub, &[]);
    let one = sized(1);
    assert_eq!(bus.send_batch(one, deadline()).await, vec![SENT]);
    // `[` entry `]`
    counted(&stub.sends()[0]) - 2
}

/// A call's body as SENDGATE_SERVICEBUS_MAX_BATCH_BYTES counts it: each entry's base64
/// `Body` at its decoded size (what Service Bus stores).
fn counted(send: &Recorded) -> usize {
    let entries: Vec<Value> = serde_json::from_slice(&send.body).expect("a JSON array");
    let encoded: usize = entries
        .iter()
        .map(|e| e["Body"].as_str().unwrap().len())
        .sum();
    let decoded: usize = entries
        .iter()
        .map(|e| {
            assert_eq!(e["IsBodyBase64"], true);
            base64::engine::general_purpose::STANDARD
                .decode(e["Body"].as_str().unwrap())
                .unwrap()
                .len()
        })
        .sum();
    send.body.len() - encoded + decoded
}

#[tokio::test]
async fn a_batch_is_split_by_size_into_the_fewest_calls_under_the_limit() {
    let entry = entry_len().await;
    // Room for exactly three entries: `[` + 3 entries + 2 commas + `]`.
    let three = 3 * entry + 4;
    assert!(three >= 1024, "within the variable's bounds: {three}");
    for (limit, expected) in [
        (three, vec![3, 3, 1]),
        (three - 1, vec![2, 2, 2, 1]),
        (three + entry, vec![3, 3, 1]),
        (three + entry + 1, vec![4, 3]),
    ] {
        let stub = ServiceBusStub::start().await;
        let limit_var = limit.to_string();
        let bus = backend_on(
            &stub,
            &[("SENDGATE_SERVICEBUS_MAX_BATCH_BYTES", &limit_var)],
        );
        let results = bus.send_batch(sized(7), deadline()).await;
        assert_eq!(results, vec![SENT; 7], "limit {limit}");
        let sends = stub.sends();
        let sizes: Vec<usize> = sends.iter().map(|s| s.message_ids().len()).collect();
        assert_eq!(sizes, expected, "limit {limit} (an entry is {entry} bytes)");
        for send in &sends {
            assert!(counted(send) <= limit, "{} > {limit}", counted(send));
        }
        // One group: its calls go one after another, each after the last was answered,
        // so the queue gets the messages in the caller's order.
        let order: Vec<String> = calls(&stub).concat();
        assert_eq!(order, (0..7).map(|i| format!("m{i}")).collect::<Vec<_>>());
        for pair in sends.windows(2) {
            let answered = pair[0].answered_at.expect("answered");
            assert!(
                pair[1].received_at >= answered,
                "limit {limit}: overlapping calls"
            );
        }
    }
}

#[tokio::test]
async fn a_single_body_under_the_tiers_limit_goes_though_its_base64_is_over_it() {
    let stub = ServiceBusStub::start().await;
    let bus = backend_on(&stub, &[]);
    let body = "z".repeat(250_000);
    let results = bus
        .send_batch(vec![message("big", &body, json!({}))], deadline())
        .await;
    assert_eq!(results, vec![SENT]);
    let sends = stub.sends();
    assert_eq!(sends.len(), 1);
    assert!(sends[0].body.len() > 262_144, "the wire carries the base64");
    assert!(counted(&sends[0]) <= 262_144, "{}", counted(&sends[0]));
}

#[tokio::test]
async fn a_message_too_large_alone_is_refused_and_the_others_are_sent() {
    let stub = ServiceBusStub::start().await;
    let bus = backend_on(&stub, &[("SENDGATE_SERVICEBUS_MAX_BATCH_BYTES", "1024")]);
    let batch = vec![
        plain("a1"),
        message("big", &"x".repeat(1024), json!({})),
        plain("a2"),
        // Alone in its group: still too large, only itself refused.
        message("big-s", &"y".repeat(2000), json!({"session_id": "S"})),
        session("s1", "S"),
    ];
    let results = bus.send_batch(batch, deadline()).await;
    assert_eq!(
        results,
        vec![
            SENT,
            Err(SendError::TooLarge),
            SENT,
            Err(SendError::TooLarge),
            SENT
        ]
    );
    assert_eq!(
        call_set(&stub),
        BTreeSet::from([ids(&["a1", "a2"]), ids(&["s1"])]),
        "the too-large messages never leave"
    );
}

#[tokio::test]
async fn a_failed_call_fails_exactly_its_messages() {
    let stub = ServiceBusStub::start().await;
    stub.on_send_holding(
        "s2",
        Reply::xml(
            500,
            "<Error><Code>500</Code><Detail>Internal error</Detail></Error>",
        ),
    );
    stub.on_send_holding(
        "p1",
        Reply::xml(
            403,
            "<Error><Code>403</Code><Detail>Quota exceeded.</Detail></Error>",
        ),
    );
    let bus = backend_on(&stub, &[]);
    let batch = vec![
        plain("a1"),
        session("s1", "A"),
        message("p1", "{}", json!({"partition_key": "P"})),
        plain("a2"),
        session("s2", "A"),
    ];
    let results = bus.send_batch(batch, deadline()).await;
    assert_eq!(stub.sends().len(), 3, "{:?}", calls(&stub));
    assert_eq!(results[0], SENT);
    assert_eq!(results[3], SENT);
    for i in [1, 4] {
        assert!(
            matches!(&results[i], Err(SendError::Failed(d)) if d == "HTTP 500: Internal error"),
            "{i}: {:?}",
            results[i]
        );
    }
    assert!(
        matches!(&results[2], Err(SendError::Busy { retry_after: Some(d), .. }) if *d == Duration::from_secs(1)),
        "{:?}",
        results[2]
    );
}

#[tokio::test]
async fn a_call_unanswered_at_the_deadline_is_a_timeout_for_its_messages_only() {
    let stub = ServiceBusStub::start().await;
    stub.on_send_holding("s1", Reply::Hang);
    let bus = backend_on(&stub, &[]);
    let batch = vec![
        plain("a1"),
        session("s1", "A"),
        plain("a2"),
        session("s2", "A"),
    ];
    let started = std::time::Instant::now();
    let results = bus
        .send_batch(batch, Instant::now() + Duration::from_millis(400))
        .await;
    let took = started.elapsed();
    assert_eq!(
        results,
        vec![SENT, Err(SendError::Timeout), SENT, Err(SendError::Timeout)]
    );
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(2500),
        "{took:?}"
    );
}

#[tokio::test]
async fn calls_run_at_most_four_at_once_and_the_keys_do_not_wait_for_each_other() {
    let stub = ServiceBusStub::start().await;
    stub.on_send(Reply::status(201).after(Duration::from_millis(150)));
    let bus = backend_on(&stub, &[]);
    let batch: Vec<_> = (0..10)
        .map(|i| session(&format!("m{i}"), &format!("K{i}")))
        .collect();
    let results = bus.send_batch(batch, deadline()).await;
    assert_eq!(results, vec![SENT; 10]);
    assert_eq!(stub.sends().len(), 10, "one call per key");
    assert_eq!(stub.max_sends_in_flight(), 4, "bounded, and concurrent");
}

#[tokio::test]
async fn a_connection_closed_mid_call_leaves_its_messages_uncertain() {
    let stub = ServiceBusStub::start().await;
    stub.on_send_holding("s1", Reply::Close);
    let bus = backend_on(&stub, &[]);
    let results = bus
        .send_batch(
            vec![plain("a1"), session("s1", "A"), session("s2", "A")],
            deadline(),
        )
        .await;
    assert_eq!(results[0], SENT);
    for r in &results[1..] {
        assert!(matches!(r, Err(SendError::Uncertain(_))), "{r:?}");
    }
}

/// The backend object, not through the trait's default (which would send one by one).
#[tokio::test]
async fn the_backend_sends_a_batch_in_one_call_not_one_per_message() {
    let stub = ServiceBusStub::start().await;
    let bus: ServiceBus = backend_on(&stub, &[]);
    let results = bus
        .send_batch(
            (0..20).map(|i| plain(&format!("m{i}"))).collect(),
            deadline(),
        )
        .await;
    assert_eq!(results, vec![SENT; 20]);
    assert_eq!(stub.sends().len(), 1);
    assert_eq!(stub.sends()[0].message_ids().len(), 20);
}
