//! The client library against the real gateway (embedded backend), mostly through the
//! counting proxy so that requests are counted on the wire.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sendgate_client::retry::Backoff;
use sendgate_client::{
    AttemptError, Client, ClientConfig, ErrorCode, GaveUp, Message, MessageAttributes, SendOutcome,
};

use crate::proxy::Proxy;
use sendgate_testkit::embedded::{spawn_app_with, spawn_in, TestApp};
use sendgate_testkit::keys::{Key, KeysFile};

fn port_of(app: &TestApp) -> u16 {
    app.address.rsplit(':').next().unwrap().parse().unwrap()
}

fn queued(id: &str) -> SendOutcome {
    SendOutcome::Queued {
        message_id: id.into(),
    }
}

/// Send every key at once, each from its own task.
fn send_all(client: &Client, keys: &[String]) -> Vec<tokio::task::JoinHandle<SendOutcome>> {
    keys.iter()
        .map(|key| {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move {
                client
                    .send("requests", format!("{{\"key\":\"{key}\"}}"), Some(&key))
                    .await
            })
        })
        .collect()
}

/// Message ids on disk, taken off the queue; a duplicate would show as a shorter set.
fn stored_ids(app: &TestApp) -> (usize, BTreeSet<String>) {
    let all = app.receive_all("requests");
    let ids = all.iter().map(|m| m.message_id.clone()).collect();
    (all.len(), ids)
}

async fn wait_until(mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "condition not met in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_announced_on_the_probe_is_waited_out_and_every_message_lands_once() {
    let dir = tempfile::tempdir().unwrap();
    let old = spawn_in(dir.path(), &[]).await;
    let port = port_of(&old);
    // A send in flight holds the drain open until the test lets it go.
    let in_flight = old.handle.lifecycle.admit_send().unwrap();
    assert!(old.handle.lifecycle.begin_drain(Duration::from_secs(30)));

    let client = Client::new(ClientConfig::new(old.address.clone())).unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("drain-{i}")).collect();
    let sends = send_all(&client, &keys);

    // The gateway says "draining, 30 s left": the client waits, sends nothing, fails nothing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = client.stats();
    assert_eq!(stats.requests, 0, "no send against a draining gateway");
    // Asked again every second while draining (its end is noticed that soon), but by one
    // probe for all 40 sends.
    assert!(
        (1..=2).contains(&stats.probes),
        "one probe a second for 40 sends: {stats:?}"
    );
    assert!(sends.iter().all(|s| !s.is_finished()), "still waiting");

    // The old process ends its drain and exits; a new one takes the same port and data.
    drop(in_flight);
    old.wait_stopped(Duration::from_secs(10)).await;
    let listen = format!("127.0.0.1:{port}");
    let new = spawn_in(dir.path(), &[("SENDGATE_LISTEN", listen.as_str())]).await;

    for (send, key) in sends.into_iter().zip(&keys) {
        assert_eq!(send.await.unwrap(), queued(key));
    }
    let stats = client.stats();
    assert_eq!(stats.retries, 0, "waiting out a drain costs no retry");
    assert_eq!(stats.requests, 40, "one request per message");
    let (count, ids) = stored_ids(&new);
    assert_eq!(count, 40, "none lost, none duplicated");
    assert_eq!(ids, keys.iter().cloned().collect::<BTreeSet<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_met_by_the_sends_themselves_is_waited_out_too() {
    let dir = tempfile::tempdir().unwrap();
    let old = spawn_in(dir.path(), &[]).await;
    let port = port_of(&old);
    let client = Client::new(ClientConfig::new(old.address.clone())).unwrap();
    // The client has just seen the gateway running (a verdict it keeps for 5 s)...
    assert_eq!(
        client.send("requests", "0", Some("before")).await,
        queued("before")
    );
    // ...when the drain starts: the sends themselves get 503 draining.
    let in_flight = old.handle.lifecycle.admit_send().unwrap();
    assert!(old.handle.lifecycle.begin_drain(Duration::from_secs(30)));
    let keys: Vec<String> = (0..40).map(|i| format!("mid-{i}")).collect();
    let sends = send_all(&client, &keys);

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = client.stats();
    assert!(stats.requests >= 2, "the sends met the drain: {stats:?}");
    assert_eq!(stats.retries, 0, "a 503 draining is a wait, not a retry");
    assert!(sends.iter().all(|s| !s.is_finished()), "still waiting");
    assert_eq!(old.stored("requests"), 1);

    drop(in_flight);
    old.wait_stopped(Duration::from_secs(10)).await;
    let listen = format!("127.0.0.1:{port}");
    let new = spawn_in(dir.path(), &[("SENDGATE_LISTEN", listen.as_str())]).await;

    for (send, key) in sends.into_iter().zip(&keys) {
        assert_eq!(send.await.unwrap(), queued(key));
    }
    assert_eq!(client.stats().retries, 0);
    let (count, ids) = stored_ids(&new);
    assert_eq!(count, 41, "none lost, none duplicated");
    let mut expected: BTreeSet<String> = keys.into_iter().collect();
    expected.insert("before".into());
    assert_eq!(ids, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_window_longer_than_the_deadline_is_waited_out() {
    // A 2 s deadline, a drain announced for 30 s that lasts 4: the deadline follows the
    // announced drain (up to its cap) instead of failing the messages at 2 s.
    let dir = tempfile::tempdir().unwrap();
    let old = spawn_in(dir.path(), &[]).await;
    let port = port_of(&old);
    let in_flight = old.handle.lifecycle.admit_send().unwrap();
    assert!(old.handle.lifecycle.begin_drain(Duration::from_secs(30)));

    let client = Client::new(
        ClientConfig::new(old.address.clone())
            .deadline(Duration::from_secs(2))
            .deadline_cap(Duration::from_secs(60)),
    )
    .unwrap();
    let keys: Vec<String> = (0..10).map(|i| format!("long-{i}")).collect();
    let sends = send_all(&client, &keys);

    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        sends.iter().all(|s| !s.is_finished()),
        "still waiting past the 2 s deadline"
    );
    drop(in_flight);
    old.wait_stopped(Duration::from_secs(10)).await;
    let listen = format!("127.0.0.1:{port}");
    let new = spawn_in(dir.path(), &[("SENDGATE_LISTEN", listen.as_str())]).await;

    for (send, key) in sends.into_iter().zip(&keys) {
        assert_eq!(send.await.unwrap(), queued(key));
    }
    let stats = client.stats();
    assert_eq!(stats.retries, 0);
    assert!(stats.deferrals >= 10, "{stats:?}");
    let (count, ids) = stored_ids(&new);
    assert_eq!(count, 10);
    assert_eq!(ids, keys.iter().cloned().collect::<BTreeSet<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_retry_after_30_is_never_cut_short() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "1"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "1"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    app.faults().fail_depth_reads(true);
    let proxy = Proxy::start(&app.address).await;
    // Patience of 5 s, but the gateway asks for 30: no retry can honour it in time, so the
    // message fails at once with the gateway's answer instead of retrying early.
    let client =
        Client::new(ClientConfig::new(proxy.address.clone()).deadline(Duration::from_secs(5)))
            .unwrap();
    let start = Instant::now();
    let outcome = client.send("requests", "{}", Some("fc-1")).await;
    assert_eq!(
        outcome,
        SendOutcome::Failed {
            last_error: AttemptError::Status {
                status: 503,
                code: Some(ErrorCode::CapacityUnknown.into())
            },
            attempts: 1,
            gave_up: GaveUp::Deadline,
        }
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(proxy.posts().len(), 1, "exactly one attempt on the wire");
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_too_large_bodies_and_unknown_queues_are_not_retried() {
    let app = spawn_app_with(&[("SENDGATE_MAX_BODY_BYTES", "64")]).await;
    let proxy = Proxy::start(&app.address).await;
    let client = Client::new(ClientConfig::new(proxy.address.clone())).unwrap();

    let big = format!("\"{}\"", "x".repeat(100));
    let cases = [
        (
            "requests",
            "not json".to_owned(),
            400,
            ErrorCode::InvalidRequest,
        ),
        ("requests", big, 413, ErrorCode::PayloadTooLarge),
        ("elsewhere", "{}".to_owned(), 404, ErrorCode::UnknownQueue),
    ];
    for (queue, body, status, code) in cases {
        assert_eq!(
            client.send(queue, body, None).await,
            SendOutcome::Refused {
                status,
                code: Some(code.into())
            }
        );
    }
    // Longer than any backoff would wait: nothing else arrives.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let posts = proxy.posts();
    assert_eq!(
        posts.iter().map(|p| p.status).collect::<Vec<_>>(),
        [400, 413, 404],
        "one attempt each"
    );
    assert_eq!(client.stats().retries, 0);
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_504_is_retried_with_the_same_key_and_stores_one_message() {
    let app = spawn_app_with(&[("SENDGATE_SEND_TIMEOUT_MS", "300")]).await;
    let proxy = Proxy::start(&app.address).await;
    let client = Client::new(ClientConfig::new(proxy.address.clone()).backoff(Backoff {
        max_attempts: 10,
        ..Backoff::default()
    }))
    .unwrap();
    app.faults().hold_sends(true);
    let send = tokio::spawn({
        let client = client.clone();
        async move { client.send("requests", r#"{"n":504}"#, Some("k-504")).await }
    });
    // The gateway gives up on the held send: 504 send_timeout, outcome unknown.
    wait_until(|| proxy.posts().iter().any(|p| p.status == 504)).await;
    app.faults().hold_sends(false);

    assert_eq!(send.await.unwrap(), queued("k-504"));
    let posts = proxy.posts();
    assert!(posts.len() >= 2, "{posts:?}");
    assert_eq!(posts[0].status, 504);
    assert_eq!(posts.last().unwrap().status, 201);
    assert!(
        posts.iter().all(|p| p.key.as_deref() == Some("k-504")),
        "the same Idempotency-Key on every attempt: {posts:?}"
    );
    let stored = app.receive_all("requests");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].message_id, "k-504");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_lost_after_the_store_is_retried_without_a_duplicate() {
    // The held-send 504 above never stores the first attempt (the embedded backend drops
    // a send whose deadline passed). Here the first attempt IS stored and only its answer
    // is lost: the retry with the same key must be recognised as a duplicate.
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let client = Client::new(ClientConfig::new(proxy.address.clone())).unwrap();
    proxy.lose_next_post_answer();

    assert_eq!(
        client.send("requests", r#"{"n":1}"#, Some("k-lost")).await,
        queued("k-lost")
    );
    let posts = proxy.posts();
    assert_eq!(
        posts
            .iter()
            .map(|p| (p.key.as_deref(), p.upstream, p.status))
            .collect::<Vec<_>>(),
        [(Some("k-lost"), 201, 504), (Some("k-lost"), 201, 201)],
        "the gateway accepted both attempts"
    );
    let stored = app.receive_all("requests");
    assert_eq!(stored.len(), 1, "stored once");
    assert_eq!(stored[0].message_id, "k-lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_sends_cost_one_probe() {
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let client = Client::new(ClientConfig::new(proxy.address.clone())).unwrap();
    let start = Instant::now();
    let sends: Vec<_> = (0..1000)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .send("requests", format!("{{\"n\":{i}}}"), None)
                    .await
            })
        })
        .collect();
    for s in sends {
        assert!(matches!(s.await.unwrap(), SendOutcome::Queued { .. }));
    }
    let elapsed = start.elapsed();
    let probes = proxy.probes();
    eprintln!("1000 concurrent sends: {probes} probe(s) in {elapsed:?}");
    // One per 5 s of the burst (a slow machine may take longer than 5 s), never per send.
    let allowed = 1 + elapsed.as_secs() as usize / 5;
    assert!(probes >= 1 && probes <= allowed, "{probes} probes");
    assert_eq!(client.stats().probes as usize, probes);
    assert_eq!(proxy.posts().len(), 1000);
    assert_eq!(app.stored("requests"), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_only_key_cannot_probe_but_still_sends() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("app", &["sender"]).token("sender-token"))
        .write_in(dir.path());
    let app = spawn_app_with(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let proxy = Proxy::start(&app.address).await;
    let mut config = ClientConfig::new(proxy.address.clone()).token("sender-token");
    config.probe_ttl = Duration::from_millis(100);
    let client = Client::new(config).unwrap();

    assert_eq!(
        client.send("requests", "1", Some("s-1")).await,
        queued("s-1")
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        client.send("requests", "2", Some("s-2")).await,
        queued("s-2")
    );

    let seen = proxy.seen();
    let probes: Vec<_> = seen.iter().filter(|s| s.method == "GET").collect();
    assert_eq!(probes.len(), 1, "a 403 on the probe is not asked again");
    assert_eq!(probes[0].status, 403);
    assert!(
        seen.iter().all(|s| s.authorization),
        "the token on every request"
    );
    assert!(client.stats().probe_forbidden);
    assert_eq!(app.stored("requests"), 2);
}

fn numbered(n: usize, prefix: &str) -> Vec<Message> {
    (0..n)
        .map(|i| Message::new(format!("{{\"n\":{i}}}")).idempotency_key(format!("{prefix}-{i}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_send_timed_out_is_retried_with_the_same_ids_and_stored_once() {
    let app = spawn_app_with(&[("SENDGATE_SEND_TIMEOUT_MS", "300")]).await;
    let proxy = Proxy::start(&app.address).await;
    let client = Client::new(ClientConfig::new(proxy.address.clone()).backoff(Backoff {
        max_attempts: 10,
        ..Backoff::default()
    }))
    .unwrap();
    app.faults().hold_sends(true);
    let mut batch = numbered(4, "t");
    // Without a key of its own: the client makes one, kept across the retry.
    batch.push(Message::new("\"keyless\""));
    let send = tokio::spawn({
        let client = client.clone();
        async move { client.send_batch("requests", batch).await }
    });
    // The gateway gives up on the held batch: 207, every entry send_timeout, unknown.
    wait_until(|| proxy.posts().iter().any(|p| p.status == 207)).await;
    app.faults().hold_sends(false);

    let outcomes = send.await.unwrap();
    let batches = proxy.batches();
    assert!(batches.len() >= 2, "{batches:?}");
    assert!(
        batches.iter().all(|b| *b == batches[0]),
        "the same entries with the same ids every time: {batches:?}"
    );
    let keys: Vec<String> = batches[0].iter().cloned().map(Option::unwrap).collect();
    assert!(uuid::Uuid::parse_str(&keys[4]).is_ok(), "{keys:?}");
    assert_eq!(outcomes, keys.iter().map(|k| queued(k)).collect::<Vec<_>>());
    let (count, ids) = stored_ids(&app);
    assert_eq!(count, 5, "each entry once");
    assert_eq!(ids, keys.into_iter().collect::<BTreeSet<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_207_leaves_the_queued_entries_alone_and_reports_the_refused_one() {
    let app = spawn_app_with(&[]).await;
    app.faults().fail_ids_containing(Some("poison"));
    let proxy = Proxy::start(&app.address).await;
    let client = Client::new(ClientConfig::new(proxy.address.clone())).unwrap();
    let mut batch = numbered(3, "ok");
    batch[1].idempotency_key = Some("poison-1".into());
    let outcomes = client.send_batch("requests", batch).await;
    assert_eq!(outcomes[0], queued("ok-0"));
    assert_eq!(
        outcomes[1],
        SendOutcome::Failed {
            last_error: AttemptError::Status {
                status: 502,
                code: Some(ErrorCode::SendFailed.into())
            },
            attempts: 1,
            gave_up: GaveUp::NotRetryable,
        },
        "the broker refused it for sure: a 502 is not retried"
    );
    assert_eq!(outcomes[2], queued("ok-2"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(proxy.posts().len(), 1, "nothing sent again");
    assert_eq!(app.stored("requests"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_nearly_full_queue_a_batch_takes_the_room_and_never_more() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "5"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    let proxy = Proxy::start(&app.address).await;
    let client =
        Client::new(ClientConfig::new(proxy.address.clone()).deadline(Duration::from_secs(3)))
            .unwrap();
    let first = client.send_batch("requests", numbered(3, "a")).await;
    assert!(first
        .iter()
        .all(|o| matches!(o, SendOutcome::Queued { .. })));
    // Room for 2 of 4: those two go at once; the rest wait for the Retry-After, which a
    // full queue with no consumer puts past the 3 s deadline.
    let start = Instant::now();
    let outcomes = client.send_batch("requests", numbered(4, "b")).await;
    assert_eq!(&outcomes[..2], [queued("b-0"), queued("b-1")]);
    for outcome in &outcomes[2..] {
        assert!(
            matches!(
                outcome,
                SendOutcome::Failed {
                    last_error: AttemptError::Status { status: 429, .. },
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
    assert!(
        start.elapsed() <= Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    let posts = proxy.posts();
    let sizes: Vec<usize> = proxy.batches().iter().map(Vec::len).collect();
    assert_eq!(sizes[..3], [3, 4, 2], "{sizes:?}");
    assert_eq!(posts[1].status, 429);
    assert_eq!(posts[2].status, 201);
    // Whatever else went (a retry in time), no request ever carried more than the room.
    assert!(sizes[3..].iter().all(|&n| n <= 2), "{sizes:?}");
    assert_eq!(app.stored("requests"), 5, "exactly the ceiling");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_send_carries_its_attributes_and_trace_to_the_stored_message() {
    let app = spawn_app_with(&[]).await;
    let client = Client::new(ClientConfig::new(app.address.clone())).unwrap();
    let mut attributes = MessageAttributes {
        subject: Some("crème brûlée".into()),
        session_id: Some("s-9".into()),
        time_to_live_s: Some(120),
        ..MessageAttributes::default()
    };
    attributes
        .properties
        .insert("tier".into(), serde_json::json!("gold"));
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let message = Message::new("{}")
        .idempotency_key("attr-1")
        .correlation_id("corr-1")
        .traceparent(trace)
        .attributes(attributes.clone());
    assert_eq!(
        client.send_with("requests", message).await,
        queued("attr-1")
    );
    let stored = app.receive_all("requests");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].attributes, attributes);
    assert_eq!(stored[0].correlation_id.as_deref(), Some("corr-1"));
    let parent = &stored[0].trace_properties["traceparent"];
    assert!(
        parent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "the message joined the caller's trace: {parent}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sheddable_client_is_refused_from_its_level_where_a_default_one_is_admitted() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "10"),
        ("SENDGATE_SHED_AT_SHEDDABLE", "0.5"),
    ])
    .await;
    let config = || ClientConfig::new(app.address.clone()).deadline(Duration::from_secs(2));
    let plain = Client::new(config()).unwrap();
    let sheddable =
        Client::new(config().criticality(sendgate_client::Criticality::Sheddable)).unwrap();
    for i in 0..5 {
        let outcome = plain.send("requests", "{}", Some(&format!("d-{i}"))).await;
        assert!(matches!(outcome, SendOutcome::Queued { .. }), "{outcome:?}");
    }
    // Five of ten held: a sheddable send would pass its cut of 5; a default one may go.
    let outcome = sheddable.send("requests", "{}", Some("s-0")).await;
    match outcome {
        SendOutcome::Failed {
            last_error: AttemptError::Status { status: 429, .. },
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    let outcome = plain.send("requests", "{}", Some("d-5")).await;
    assert!(matches!(outcome, SendOutcome::Queued { .. }), "{outcome:?}");
    assert_eq!(app.stored("requests"), 6);
}

/// A client over `EntraTokenSource`: the gateway's keys file knows the token the fake
/// identity hands out (`token-1`, its first).
fn entra_client(
    address: &str,
    source: std::sync::Arc<sendgate_entra::testing::FakeSource>,
) -> Client {
    use sendgate_entra::{CredentialChain, EntraCredential};
    let chain = CredentialChain::new(ENTRA_SCOPE, vec![("fake identity", source as _)]);
    let tokens = sendgate_client::EntraTokenSource::new(EntraCredential::new(chain));
    let mut config = ClientConfig::new(address).token_source(std::sync::Arc::new(tokens));
    config.backoff = Backoff {
        max_attempts: 3,
        ..Backoff::default()
    };
    Client::new(config).unwrap()
}

const ENTRA_SCOPE: &str = "api://sendgate-test/.default";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entra_token_is_fetched_once_and_sent_with_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("playground", &["sender"]).token("token-1"))
        .write_in(dir.path());
    let app = spawn_app_with(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let proxy = Proxy::start(&app.address).await;
    let source = sendgate_entra::testing::FakeSource::new(
        ENTRA_SCOPE,
        false,
        Duration::from_millis(20),
        Duration::from_secs(3600),
    );
    let client = entra_client(&proxy.address, source.clone());
    let keys: Vec<String> = (0..20).map(|i| format!("entra-{i}")).collect();
    for send in send_all(&client, &keys) {
        assert!(matches!(send.await.unwrap(), SendOutcome::Queued { .. }));
    }
    // Twenty sends at once shared the one fetch, and every request carried the token.
    assert_eq!(source.calls(), 1);
    let posts = proxy.posts();
    assert_eq!(posts.len(), 20);
    assert!(posts.iter().all(|s| s.authorization && s.status == 201));
    assert_eq!(app.stored("requests"), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_that_gives_no_token_fails_the_sends_unsent_and_is_asked_once() {
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let source = sendgate_entra::testing::FakeSource::new(
        ENTRA_SCOPE,
        true,
        Duration::from_millis(20),
        Duration::from_secs(3600),
    );
    let client = entra_client(&proxy.address, source.clone());
    let keys: Vec<String> = (0..20).map(|i| format!("unsent-{i}")).collect();
    for send in send_all(&client, &keys) {
        match send.await.unwrap() {
            SendOutcome::NoToken { reason } => {
                assert!(reason.contains("fake identity"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Nothing reached the gateway, nothing was retried, and the identity was asked once:
    // its failure is answered from the cache for seconds (never a storm of fetches).
    assert!(proxy.posts().is_empty());
    assert_eq!(client.stats().retries, 0);
    assert_eq!(source.calls(), 1);
    // A send a moment later is answered from that cache too.
    let late = client.send("requests", "{}", Some("late")).await;
    assert!(matches!(late, SendOutcome::NoToken { .. }), "{late:?}");
    assert_eq!(source.calls(), 1);
}

#[test]
fn a_token_and_a_token_source_together_are_refused() {
    let source = sendgate_entra::testing::FakeSource::new(
        ENTRA_SCOPE,
        false,
        Duration::ZERO,
        Duration::from_secs(3600),
    );
    let chain =
        sendgate_entra::CredentialChain::new(ENTRA_SCOPE, vec![("fake identity", source as _)]);
    let tokens =
        sendgate_client::EntraTokenSource::new(sendgate_entra::EntraCredential::new(chain));
    let config = ClientConfig::new("http://127.0.0.1:1")
        .token("fixed")
        .token_source(std::sync::Arc::new(tokens));
    assert!(Client::new(config).is_err());
}

/// Off Azure, a managed identity endpoint that is not there takes its whole budget (10 s)
/// before the next source (the Azure CLI) is asked: the first request waits for the chain.
#[tokio::test(start_paused = true)]
async fn the_first_token_is_waited_for_through_a_source_that_hangs() {
    use sendgate_client::TokenSource;
    use sendgate_entra::testing::FakeSource;
    use sendgate_entra::{CredentialChain, EntraCredential};
    let hung = FakeSource::new(
        ENTRA_SCOPE,
        false,
        Duration::from_secs(600),
        Duration::from_secs(3600),
    );
    let cli = FakeSource::new(
        ENTRA_SCOPE,
        false,
        Duration::from_secs(2),
        Duration::from_secs(3600),
    );
    let chain = CredentialChain::new(
        ENTRA_SCOPE,
        vec![("managed identity", hung as _), ("az", cli.clone() as _)],
    );
    let tokens = sendgate_client::EntraTokenSource::new(EntraCredential::new(chain));
    let started = tokio::time::Instant::now();
    let token = tokens
        .token()
        .await
        .expect("a token from the second source");
    assert_eq!(&*token, "token-1");
    assert_eq!(cli.calls(), 1);
    assert!(started.elapsed() >= Duration::from_secs(12));
}
