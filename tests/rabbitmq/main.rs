//! sendgate against the real local RabbitMQ, with real faults: a TCP proxy that black-holes
//! or resets live connections, and real permission changes with rabbitmqctl.

mod attributes;
mod batch;
mod breaker;
mod drain;
mod lag;

use std::time::{Duration, Instant};

use lapin::types::{AMQPValue, LongString};
use sendgate_testkit::fault_proxy::{Fault, FaultProxy};
use sendgate_testkit::gateway::retry_after;
use sendgate_testkit::rabbitmq_app::spawn;
use sendgate_testkit::{ensure, gateway, rabbit};

#[tokio::test]
async fn a_send_is_a_persistent_confirmed_message_with_its_ids() {
    let queue = rabbit::unique("sg-props");
    let app = spawn(&queue, &[]).await;
    let body = "{ \"prompt\" : \"h\u{e9}llo\" }";
    let response = app
        .send_with(
            body,
            &[("Idempotency-Key", "key-1"), ("X-Correlation-Id", "corr-1")],
        )
        .await;
    assert_eq!(response.status(), 201);
    let got = rabbit::take(&queue, 10).await;
    assert_eq!(got.len(), 1);
    let m = &got[0].delivery;
    assert_eq!(m.data, body.as_bytes(), "byte for byte");
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("key-1")
    );
    assert_eq!(
        m.properties.correlation_id().as_ref().map(|s| s.as_str()),
        Some("corr-1")
    );
    assert_eq!(*m.properties.delivery_mode(), Some(2), "persistent");
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn the_ceiling_holds_against_real_messages_and_lifts_when_a_consumer_drains() {
    let queue = rabbit::unique("sg-ceiling");
    rabbit::declare(&queue, &[]).await;
    rabbit::fill(&queue, 5).await;
    rabbit::wait_for_management_count(&queue, 5).await;
    let app = spawn(
        &queue,
        &[
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "5"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;

    let response = app.send("{}").await;
    assert_eq!(response.status(), 429);
    assert!(retry_after(&response).unwrap() >= 1);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "queue_full");
    assert_eq!(
        body["backlog"], 5,
        "the real backlog, read from the admin plane"
    );
    assert_eq!(body["limit"], 5);

    // A consumer takes 3: once the admin plane has caught up, sends are admitted again.
    assert_eq!(rabbit::take(&queue, 3).await.len(), 3);
    let started = Instant::now();
    loop {
        match app.status("{}").await {
            201 => break,
            429 => assert!(
                started.elapsed() < Duration::from_secs(30),
                "never re-admitted"
            ),
            other => panic!("unexpected {other}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_lagging_admin_plane_never_lets_one_process_overshoot() {
    let queue = rabbit::unique("sg-overshoot");
    let app = spawn(
        &queue,
        &[
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "5"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    // The management API trails the broker by seconds; sends in quick succession are
    // counted against its stale answer, so the queue never holds more than the ceiling.
    let mut created = 0;
    for i in 0..20 {
        let status = app.status(&i.to_string()).await;
        assert!(status == 201 || status == 429, "{status}");
        created += u32::from(status == 201);
    }
    assert!((1..=5).contains(&created), "admitted {created}");
    assert_eq!(rabbit::ready(&queue).await, created);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn the_amqp_depth_source_is_exact_and_immediate() {
    let queue = rabbit::unique("sg-amqp-depth");
    rabbit::declare(&queue, &[]).await;
    rabbit::fill(&queue, 3).await;
    let app = spawn(
        &queue,
        &[
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "4"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201);
    assert_eq!(app.status("{}").await, 429);
    rabbit::take(&queue, 2).await;
    assert_eq!(
        app.status("{}").await,
        201,
        "no lag: the next read sees the drain"
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn losing_the_management_tag_fails_closed_and_getting_it_back_recovers() {
    let queue = rabbit::unique("sg-claim");
    let user = rabbit::TempUser::new(&["monitoring"]);
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_MANAGEMENT_USER", &user.name),
            ("SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD", &user.password),
            ("SERVICEBUS_SEND_FAILCLOSED", "true"),
            ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "3"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201);

    user.set_tags(&[]); // "no Manage claim": the management API now answers 401
    assert_eq!(app.status("{}").await, 201);
    assert_eq!(app.status("{}").await, 201);
    let response = app.send("{}").await;
    assert_eq!(response.status(), 503);
    assert_eq!(retry_after(&response), Some(30));
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "capacity_unknown");
    assert_eq!(body["consecutive_failures"], 3);

    user.set_tags(&["monitoring"]);
    assert_eq!(app.status("{}").await, 201);
    assert_eq!(
        app.detailed().await["queues"][&queue]["consecutive_failures"],
        0
    );
    assert_eq!(rabbit::ready(&queue).await, 4);
    rabbit::delete(&queue).await;
}

/// Contract section 2: while the streak builds, what is known still bounds the sends: a
/// queue read at 20 under a ceiling of 25 takes 5 more, however many arrive in the
/// streak's seconds (not a TTL's worth of blind sends per failed read).
#[tokio::test]
async fn while_the_streak_builds_the_last_good_read_bounds_the_sends() {
    let queue = rabbit::unique("sg-claim-bound");
    rabbit::declare(&queue, &[]).await;
    rabbit::fill(&queue, 20).await;
    rabbit::wait_for_management_count(&queue, 20).await;
    let user = rabbit::TempUser::new(&["monitoring"]);
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_MANAGEMENT_USER", &user.name),
            ("SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD", &user.password),
            ("SERVICEBUS_SEND_FAILCLOSED", "true"),
            ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "3"),
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "25"),
            ("SENDGATE_DEPTH_TTL_MS", "1000"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201, "read 20: 21 now");
    user.set_tags(&[]); // the management API now answers 401
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut codes = std::collections::BTreeMap::<u16, u32>::new();
    for _ in 0..100 {
        *codes.entry(app.status("{}").await).or_default() += 1;
    }
    let detailed = app.detailed().await;
    assert_eq!(
        detailed["queues"][&queue]["consecutive_failures"], 1,
        "one failed read: the streak is still building"
    );
    assert_eq!(
        codes.get(&201).copied(),
        Some(4),
        "21 known, 4 to the ceiling of 25: {codes:?}"
    );
    assert_eq!(codes.get(&429).copied(), Some(96), "{codes:?}");
    assert_eq!(rabbit::ready(&queue).await, 25);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn without_the_gate_every_send_is_queued_while_the_admin_plane_refuses() {
    let queue = rabbit::unique("sg-claim-off");
    let user = rabbit::TempUser::new(&[]);
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_MANAGEMENT_USER", &user.name),
            ("SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD", &user.password),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    for _ in 0..5 {
        assert_eq!(app.status("{}").await, 201);
    }
    assert_eq!(
        app.detailed().await["queues"][&queue]["consecutive_failures"],
        5,
        "the five sends' reads failed (the start-up read does not start the streak)"
    );
    assert_eq!(rabbit::ready(&queue).await, 5);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_black_holed_admin_plane_costs_each_send_at_most_the_admin_timeout() {
    let queue = rabbit::unique("sg-admin-hole");
    let proxy = FaultProxy::start(rabbit::MANAGEMENT.parse().unwrap()).await;
    let management = format!("http://{}", proxy.addr());
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_MANAGEMENT_URL", &management),
            ("SENDGATE_ADMIN_TIMEOUT_MS", "300"),
            ("SERVICEBUS_SEND_FAILCLOSED", "1"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201);
    proxy.set(Fault::Blackhole);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        seen.push(app.status("{}").await);
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(300 + 700),
            "a send took {took:?} with the admin plane black-holed"
        );
    }
    assert_eq!(seen, [201, 201, 503]);
    proxy.set(Fault::Pass);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_black_holed_data_plane_times_out_at_the_deadline_and_recovers_without_leaks() {
    let queue = rabbit::unique("sg-data-hole");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_URL", &amqp),
            ("SENDGATE_SEND_TIMEOUT_MS", "500"),
            ("SENDGATE_MAX_IN_FLIGHT", "8"),
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "management"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201);
    // Depth reads go to the (healthy) admin plane once it lists the queue; until then they
    // would fall back to the data plane, which is about to be black-holed.
    rabbit::wait_for_management_count(&queue, 1).await;

    proxy.set(Fault::Blackhole);
    for _ in 0..4 {
        let started = Instant::now();
        let response = app.send("{}").await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(500 + 700),
            "answered after {took:?}"
        );
        let status = response.status().as_u16();
        // A publish on the wedged connection ends at its deadline (504, outcome unknown);
        // once the connection is replaced, a reconnect through the hole may fail fast: nothing
        // was sent, a retryable 503.
        assert!(status == 504 || status == 503, "status {status}");
        if status == 504 {
            let body: serde_json::Value = response.json().await.unwrap();
            assert_eq!(body["outcome"], "unknown");
        }
    }

    proxy.set(Fault::Pass);
    let started = Instant::now();
    while app.status("{}").await != 201 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "did not recover by itself"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Full concurrency is back: no slot or channel was leaked by the timed-out sends.
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let (client, url) = (
                app.client.clone(),
                format!("{}/v1/queues/{}/messages", app.address, queue),
            );
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .body("{}")
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap(), 201);
    }
    assert_eq!(app.in_flight().await, 0);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_reset_connection_is_replaced_by_the_next_send() {
    let queue = rabbit::unique("sg-reset");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_URL", &amqp),
            ("SENDGATE_SEND_TIMEOUT_MS", "2000"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201);
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set(Fault::Pass);
    let started = Instant::now();
    let mut statuses = Vec::new();
    while statuses.last() != Some(&201) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no recovery: {statuses:?}"
        );
        statuses.push(app.status("{}").await);
    }
    assert!(statuses.len() <= 3, "took {statuses:?}");
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn nothing_acknowledged_is_lost() {
    let queue = rabbit::unique("sg-count");
    let app = spawn(&queue, &[("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "100000")]).await;
    let sends: Vec<_> = (0..300)
        .map(|i| {
            let (client, url) = (
                app.client.clone(),
                format!("{}/v1/queues/{}/messages", app.address, queue),
            );
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .body(format!("{{\"i\":{i}}}"))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut created = 0;
    for s in sends {
        if s.await.unwrap() == 201 {
            created += 1;
        }
    }
    assert!(created > 0);
    assert_eq!(
        rabbit::ready(&queue).await,
        created,
        "every 2xx is in the queue, nothing more"
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_full_queue_that_rejects_publishes_is_503_backend_busy() {
    let queue = rabbit::unique("sg-overflow");
    rabbit::declare(
        &queue,
        &[
            ("x-max-length", AMQPValue::LongLongInt(2)),
            (
                "x-overflow",
                AMQPValue::LongString(LongString::from("reject-publish")),
            ),
        ],
    )
    .await;
    let app = spawn(&queue, &[]).await;
    assert_eq!(app.status("1").await, 201);
    assert_eq!(app.status("2").await, 201);
    let response = app.send("3").await;
    assert_eq!(response.status(), 503);
    assert!(retry_after(&response).unwrap() >= 1);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "backend_busy");
    assert_eq!(rabbit::ready(&queue).await, 2);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_queue_missing_at_the_broker_is_502_send_failed() {
    let queue = rabbit::unique("sg-missing");
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
            ("SENDGATE_DEPTH_TTL_MS", "60000"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201, "declared at start-up");
    rabbit::delete(&queue).await;
    let response = app.send("{}").await;
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "send_failed");
}

#[tokio::test]
async fn a_credential_the_broker_refuses_is_502_backend_auth_failed() {
    let queue = rabbit::unique("sg-denied");
    let user = rabbit::TempUser::without_permissions();
    let url = user.amqp_url(rabbit::AMQP);
    let app = spawn(&queue, &[("SENDGATE_RABBITMQ_URL", &url)]).await;
    let response = app.send("{}").await;
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "backend_auth_failed");
}

#[tokio::test]
async fn while_the_broker_is_unreachable_at_start_the_gateway_says_starting() {
    ensure::rabbitmq();
    let queue = rabbit::unique("sg-starting");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    proxy.set(Fault::Blackhole);
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let settings = gateway::settings_of(&[&[
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_QUEUES", &queue),
        ("SENDGATE_RABBITMQ_URL", &amqp),
    ]]);
    // Returns while `starting`: it binds without the broker.
    let app = gateway::Gateway::launch(settings).await;
    let (base, client) = (app.address.clone(), app.client.clone());

    assert_eq!(
        client
            .get(format!("{base}/health/live"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let ready = client
        .get(format!("{base}/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert!(retry_after(&ready).unwrap() >= 1);
    assert_eq!(app.detailed().await["gateway_state"], "starting");
    let send = client
        .post(format!("{base}/v1/queues/{queue}/messages"))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(send.status(), 503);
    assert!(retry_after(&send).unwrap() >= 1);
    let body: serde_json::Value = send.json().await.unwrap();
    assert_eq!(body["code"], "starting");

    proxy.set(Fault::Pass);
    app.until_running().await;
    let started = Instant::now();
    loop {
        let status = client
            .post(format!("{base}/v1/queues/{queue}/messages"))
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap()
            .status();
        if status == 201 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never admitted ({status})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn with_the_admin_plane_down_from_the_start_send_3_is_the_first_refused() {
    // The contract's example: gate on, threshold 3, depth read before every send, admin
    // plane down: sends 1 and 2 are queued, send 3 answers 503 with consecutive_failures 3.
    let queue = rabbit::unique("sg-down-from-start");
    let proxy = FaultProxy::start(rabbit::MANAGEMENT.parse().unwrap()).await;
    proxy.set(Fault::Reset);
    let management = format!("http://{}", proxy.addr());
    let app = spawn(
        &queue,
        &[
            ("SENDGATE_RABBITMQ_MANAGEMENT_URL", &management),
            ("SERVICEBUS_SEND_FAILCLOSED", "true"),
            ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "3"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
        ],
    )
    .await;
    assert_eq!(app.status("{}").await, 201);
    assert_eq!(app.status("{}").await, 201);
    let response = app.send("{}").await;
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["consecutive_failures"], 3);

    proxy.set(Fault::Pass);
    assert_eq!(
        app.status("{}").await,
        201,
        "the admin plane answers again: the next send reads it"
    );
    assert_eq!(
        app.detailed().await["queues"][&queue]["consecutive_failures"],
        0
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_message_returned_by_the_broker_never_puts_its_payload_in_the_logs() {
    // Sends are `mandatory`: when the queue is gone the broker returns the whole message,
    // and the AMQP client would log it (payload included) at WARN, under the default filter.
    ensure::rabbitmq();
    let queue = rabbit::unique("sg-returned");
    rabbit::declare(&queue, &[]).await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let gw = gateway::GatewayProcess::start_logging_to(
        &[
            ("SENDGATE_BACKEND", "rabbitmq"),
            ("SENDGATE_QUEUES", &queue),
            ("SENDGATE_WORKERS", "1"),
        ],
        log.reopen().unwrap(),
    )
    .await;
    rabbit::delete(&queue).await;
    let marker = "PAYLOAD-MARKER-7f3a9c";
    let status = gw
        .send(&queue, &format!("{{\"secret\":\"{marker}\"}}"))
        .await
        .unwrap();
    assert_eq!(status, 502, "the queue is gone: send_failed");
    drop(gw);
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(text.contains("listening"), "the log was captured: {text}");
    // As text, or as the byte list a Debug of the delivery prints.
    let as_bytes = format!("{:?}", &marker.as_bytes()[..8]);
    let as_bytes = &as_bytes[1..as_bytes.len() - 1];
    assert!(
        !text.contains(marker) && !text.contains(as_bytes),
        "the payload reached the logs:\n{text}"
    );
}

#[tokio::test]
async fn a_publish_that_timed_out_has_its_channel_recycled_without_losing_the_connection() {
    // A publish abandoned at its deadline leaves its pending confirm in the AMQP client
    // until the channel closes; the channel is swapped for a fresh one so that state cannot
    // pile up over a long life of sporadic timeouts that never add up to a wedged link.
    ensure::rabbitmq();
    let queue = rabbit::unique("sg-recycle");
    rabbit::declare(&queue, &[]).await;
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let log = tempfile::NamedTempFile::new().unwrap();
    let gw = gateway::GatewayProcess::start_logging_to(
        &[
            ("SENDGATE_BACKEND", "rabbitmq"),
            ("SENDGATE_QUEUES", &queue),
            ("SENDGATE_RABBITMQ_URL", &amqp),
            ("SENDGATE_SEND_TIMEOUT_MS", "500"),
            ("SENDGATE_DEPTH_TTL_MS", "600000"),
            ("SENDGATE_WORKERS", "1"),
        ],
        log.reopen().unwrap(),
    )
    .await;
    assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201);
    let recycled = || {
        std::fs::read_to_string(log.path())
            .unwrap()
            .matches("amqp_channel_recycled")
            .count()
    };
    for round in 1..=2 {
        // Each chunk now takes 800 ms each way: the confirm cannot come within 500 ms.
        proxy.set(Fault::Delay(Duration::from_millis(800)));
        assert_eq!(gw.send(&queue, "{}").await.unwrap(), 504, "round {round}");
        proxy.set(Fault::Pass);
        let started = Instant::now();
        while recycled() < round {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "round {round}: no channel recycled"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201, "round {round}");
    }
    drop(gw);
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert_eq!(recycled(), 2, "one recycle per timed-out publish:\n{text}");
    assert_eq!(
        publishing_connects(&text),
        1,
        "sporadic timeouts keep the connection:\n{text}"
    );
    rabbit::delete(&queue).await;
}

/// The publishing connections a gateway's log says it made (a queue's depth may be read
/// on a connection of its own, logged with `purpose` `read`).
fn publishing_connects(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("amqp_connected") && l.contains("publish"))
        .count()
}

#[tokio::test]
async fn sends_timing_out_on_a_replaced_connection_neither_warn_nor_count_against_its_successor() {
    // Ten sends wait on a connection that stopped confirming. The third timeout replaces
    // it (one `amqp_wedged`); the seven after it belong to a connection already gone: they
    // must neither warn, each, that a connection is being replaced, nor count as timeouts
    // "in a row" of the connection that follows (nor recycle the dead one's channels).
    ensure::rabbitmq();
    let queue = rabbit::unique("sg-stale-timeouts");
    rabbit::declare(&queue, &[]).await;
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let log = tempfile::NamedTempFile::new().unwrap();
    let gw = gateway::GatewayProcess::start_logging_to(
        &[
            ("SENDGATE_BACKEND", "rabbitmq"),
            ("SENDGATE_QUEUES", &queue),
            ("SENDGATE_RABBITMQ_URL", &amqp),
            ("SENDGATE_SEND_TIMEOUT_MS", "800"),
            ("SENDGATE_DEPTH_TTL_MS", "600000"),
            ("SENDGATE_WORKERS", "1"),
            // The ten timeouts would open the breaker for 15 s; the link is under test.
            ("SENDGATE_BREAKER_MIN_FAILURES", "1000"),
        ],
        log.reopen().unwrap(),
    )
    .await;
    assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201);
    let count = |event: &str| {
        std::fs::read_to_string(log.path())
            .unwrap()
            .matches(event)
            .count()
    };

    proxy.set(Fault::Blackhole);
    let mut sends = Vec::new();
    for _ in 0..10 {
        // Staggered, all started before the first deadline: they time out one by one.
        sends.push(tokio::spawn(gw.send(&queue, "{}")));
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for send in sends {
        assert_eq!(send.await.unwrap().unwrap(), 504);
    }
    proxy.set(Fault::Pass);
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert_eq!(
        count("amqp_wedged"),
        1,
        "one connection was replaced, so one warning:\n{text}"
    );
    let started = Instant::now();
    while gw.send(&queue, "{}").await.unwrap() != 201 {
        assert!(started.elapsed() < Duration::from_secs(10), "no recovery");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert_eq!(publishing_connects(&text), 2, "{text}");
    drop(gw);
    rabbit::delete(&queue).await;
}

/// Issue 41: a normal first start, on a queue that does not exist yet, logs no ERROR (the
/// check that runs before the queue is declared finds it missing: that is expected).
#[tokio::test]
async fn a_first_start_on_a_queue_not_yet_declared_logs_no_error() {
    ensure::rabbitmq();
    let queue = rabbit::unique("sg-first-start");
    let log = tempfile::NamedTempFile::new().unwrap();
    let gw = gateway::GatewayProcess::start_logging_to(
        &[
            ("SENDGATE_BACKEND", "rabbitmq"),
            ("SENDGATE_QUEUES", &queue),
            ("SENDGATE_WORKERS", "1"),
        ],
        log.reopen().unwrap(),
    )
    .await;
    assert_eq!(gw.send(&queue, "{}").await.unwrap(), 201);
    drop(gw);
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(text.contains("queue_declared"), "declared at start: {text}");
    let errors: Vec<&str> = text.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "ERROR lines on a first start:\n{text}");
    rabbit::delete(&queue).await;
}
