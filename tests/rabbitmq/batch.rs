//! `send_batch` on the real broker, through the `Backend` trait: one channel, every
//! confirm awaited together, one result per message mapped as a single send's.

use std::time::{Duration, Instant};

use lapin::types::{AMQPValue, LongString};
use sendgate::backend::{SendError, SendReceipt};
use serde_json::json;

use sendgate_testkit::fault_proxy::{Fault, FaultProxy};
use sendgate_testkit::rabbit;
use sendgate_testkit::rabbitmq_app::{backend, deadline_in, message};

fn ids(got: &[lapin::message::BasicGetMessage]) -> Vec<String> {
    got.iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .expect("a message id")
                .to_string()
        })
        .collect()
}

const STORED: Result<SendReceipt, SendError> = Ok(SendReceipt { duplicate: false });

#[tokio::test]
async fn a_batch_of_100_is_stored_in_order_with_its_ids_from_one_channel() {
    let queue = rabbit::unique("sg-batch");
    // A user of the test's own: its connection is this backend's alone, so the broker's
    // per-channel counts of it are the batch's.
    let user = rabbit::TempUser::new(&[]);
    let backend = backend(
        &queue,
        &[("SENDGATE_RABBITMQ_URL", &user.amqp_url(rabbit::AMQP))],
    )
    .await;
    let want: Vec<String> = (0..100).map(|i| format!("batch-{i:03}")).collect();
    let batch = want
        .iter()
        .enumerate()
        .map(|(i, id)| {
            message(
                &queue,
                id,
                &format!("{{\"i\":{i}}}"),
                json!({"subject": "s"}),
            )
        })
        .collect();
    let results = backend.send_batch(batch, deadline_in(10_000)).await;
    assert_eq!(results, vec![STORED; 100]);

    let got = rabbit::take(&queue, 200).await;
    assert_eq!(ids(&got), want, "exactly the 100, in order");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.delivery.data, format!("{{\"i\":{i}}}").as_bytes());
    }

    // Four single sends after it, which take the publisher channels round robin: the
    // counts below do see sends spread over channels when they are.
    for i in 0..4 {
        let m = message(&queue, &format!("single-{i}"), "{}", json!({}));
        assert_eq!(backend.send(m, deadline_in(5000)).await, STORED);
    }
    let started = Instant::now();
    let channels = loop {
        let channels = rabbit::channel_publishes(&user.name).await;
        if channels.iter().map(|c| c.0).sum::<u64>() == 104
            && channels.iter().map(|c| c.1).sum::<u64>() == 104
        {
            break channels;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the management API never counted 104 publishes and confirms: {channels:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let busy: Vec<_> = channels.into_iter().filter(|c| c.0 > 0).collect();
    assert_eq!(
        busy,
        [(101, 101), (1, 1), (1, 1), (1, 1)],
        "the batch on one channel (with one of the single sends), each other send on one of its own"
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_batch_larger_than_the_publish_window_goes_window_by_window_in_order() {
    let queue = rabbit::unique("sg-batch-window");
    let backend = backend(&queue, &[]).await;
    // 40 bodies of 30 KB: 1.2 MB, several 256 KiB windows; one of 300 KB (more than a
    // window) goes alone in the middle.
    let body = |i: usize| {
        let size = if i == 20 { 300_000 } else { 30_000 };
        format!("{{\"i\":{i},\"pad\":\"{}\"}}", "p".repeat(size))
    };
    let want: Vec<String> = (0..40).map(|i| format!("window-{i:02}")).collect();
    let batch = want
        .iter()
        .enumerate()
        .map(|(i, id)| message(&queue, id, &body(i), json!({})))
        .collect();
    let results = backend.send_batch(batch, deadline_in(20_000)).await;
    assert_eq!(results, vec![STORED; 40]);
    let got = rabbit::take(&queue, 100).await;
    assert_eq!(ids(&got), want, "exactly the 40, in order");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.delivery.data, body(i).as_bytes());
    }
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_message_the_broker_refuses_fails_alone_and_the_rest_are_stored() {
    // A queue that refuses a publish that would take it past 1,000 bytes (and nacks it):
    // the large message in the middle does not fit, the small ones after it still do.
    let queue = rabbit::unique("sg-batch-refused");
    rabbit::declare(
        &queue,
        &[
            ("x-max-length-bytes", AMQPValue::LongLongInt(1000)),
            (
                "x-overflow",
                AMQPValue::LongString(LongString::from("reject-publish")),
            ),
        ],
    )
    .await;
    let backend = backend(&queue, &[]).await;
    let large = format!("\"{}\"", "x".repeat(2000));
    let batch = (0..10)
        .map(|i| {
            let body = if i == 4 {
                large.clone()
            } else {
                format!("{i}")
            };
            message(&queue, &format!("m-{i}"), &body, json!({}))
        })
        .collect();
    let results = backend.send_batch(batch, deadline_in(10_000)).await;
    for (i, result) in results.iter().enumerate() {
        if i == 4 {
            assert!(
                matches!(result, Err(SendError::QueueFull)),
                "the refused one: {result:?}"
            );
        } else {
            assert_eq!(*result, STORED, "message {i}");
        }
    }
    let got = rabbit::take(&queue, 20).await;
    assert_eq!(
        ids(&got),
        ["m-0", "m-1", "m-2", "m-3", "m-5", "m-6", "m-7", "m-8", "m-9"]
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_batch_with_a_message_the_backend_cannot_carry_sends_the_others() {
    // A subject that does not fit AMQP's `type` (a short string) is never published (a
    // send that skipped the unsupported check gets a failure, not a panic); the rest are.
    let queue = rabbit::unique("sg-batch-unfit");
    let backend = backend(&queue, &[]).await;
    let batch = vec![
        message(&queue, "a", "1", json!({})),
        message(&queue, "b", "2", json!({"subject": "\u{e9}".repeat(128)})),
        message(&queue, "c", "3", json!({})),
    ];
    let results = backend.send_batch(batch, deadline_in(5000)).await;
    assert_eq!(results[0], STORED);
    assert!(
        matches!(&results[1], Err(SendError::Failed(why)) if why.contains("subject")),
        "{:?}",
        results[1]
    );
    assert_eq!(results[2], STORED);
    assert_eq!(ids(&rabbit::take(&queue, 10).await), ["a", "c"]);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_batch_on_a_black_holed_connection_times_out_at_its_deadline_and_the_link_recovers() {
    sendgate_testkit::ensure::rabbitmq();
    let queue = rabbit::unique("sg-batch-hole");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let backend = backend(&queue, &[("SENDGATE_RABBITMQ_URL", &amqp)]).await;
    proxy.set(Fault::Blackhole);
    let batch = (0..10)
        .map(|i| message(&queue, &format!("h-{i}"), "{}", json!({})))
        .collect();
    let started = Instant::now();
    let results = backend.send_batch(batch, deadline_in(500)).await;
    let took = started.elapsed();
    assert_eq!(results, vec![Err(SendError::Timeout); 10]);
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(800),
        "answered after {took:?}"
    );
    proxy.set(Fault::Pass);
    let started = Instant::now();
    loop {
        let batch = (0..5)
            .map(|i| message(&queue, &format!("after-{i}"), "{}", json!({})))
            .collect();
        if backend.send_batch(batch, deadline_in(2000)).await == vec![STORED; 5] {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "no recovery");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_refused_credential_fails_every_message_of_the_batch_alike() {
    let queue = rabbit::unique("sg-batch-denied");
    let user = rabbit::TempUser::without_permissions();
    sendgate_testkit::ensure::rabbitmq();
    let settings = sendgate_testkit::gateway::settings_of(&[&[
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_QUEUES", &queue),
        ("SENDGATE_RABBITMQ_URL", &user.amqp_url(rabbit::AMQP)),
    ]]);
    let backend = sendgate::startup::Backends::open(&settings)
        .unwrap()
        .primary;
    let batch = (0..3)
        .map(|i| message(&queue, &format!("d-{i}"), "{}", json!({})))
        .collect();
    let results = backend.send_batch(batch, deadline_in(5000)).await;
    assert_eq!(results.len(), 3);
    for result in &results {
        assert!(
            matches!(result, Err(SendError::AuthFailed(_))),
            "{results:?}"
        );
    }
}
