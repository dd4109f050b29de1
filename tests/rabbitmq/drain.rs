//! The announced lifecycle, on the real binary: SIGTERM drains sends held in flight by a
//! slow broker (the fault proxy delays the data plane), tells new clients when to come
//! back, and exits 0; nothing acknowledged is lost.

use std::time::{Duration, Instant};

use sendgate_testkit::fault_proxy::{Fault, FaultProxy};
use sendgate_testkit::gateway::GatewayProcess;
use sendgate_testkit::rabbit;

/// The real binary on the RabbitMQ backend serving `queue`, its data plane through `proxy`.
async fn start(queue: &str, proxy: &FaultProxy, vars: &[(&str, &str)]) -> GatewayProcess {
    sendgate_testkit::ensure::rabbitmq();
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let mut all = vec![
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_QUEUES", queue),
        ("SENDGATE_RABBITMQ_URL", amqp.as_str()),
        ("SENDGATE_DEPTH_TTL_MS", "600000"),
        ("SENDGATE_SEND_TIMEOUT_MS", "20000"),
        ("SENDGATE_WORKERS", "2"),
    ];
    all.extend_from_slice(vars);
    GatewayProcess::start(&all).await
}

#[tokio::test]
async fn sigterm_drains_sends_in_flight_announces_the_window_and_exits_zero() {
    let queue = rabbit::unique("sg-drain");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    // A linger shorter than the held sends: they, not it, decide when the process exits.
    let mut gw = start(
        &queue,
        &proxy,
        &[
            ("SENDGATE_DRAIN_TIMEOUT_S", "20"),
            ("SENDGATE_DRAIN_LINGER_S", "1"),
        ],
    )
    .await;

    // Hold three sends in flight: each chunk to and from the broker now takes 1 s.
    proxy.set(Fault::Delay(Duration::from_millis(1000)));
    let held: Vec<_> = (0..3)
        .map(|i| tokio::spawn(gw.send(&queue, &i.to_string())))
        .collect();
    gw.wait_in_flight(3).await;

    gw.signal("TERM");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let d = gw.detailed().await;
    assert_eq!(d["gateway_state"], "draining");
    let first = d["drain"]["remaining_s"].as_f64().unwrap();
    assert!(first > 18.0 && first <= 20.0, "remaining_s {first}");
    assert_eq!(d["drain"]["in_flight"], 3);

    // A late client gets the truth, not a refused connection: 503 draining with how long the
    // sends in flight may still take (body 5 s + send 20 s), cut to the 20 s window, and a
    // second for the restart.
    let late = gw
        .client
        .post(gw.url(&format!("/v1/queues/{queue}/messages")))
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("the listener still accepts while draining");
    assert_eq!(late.status(), 503);
    let retry_after: u64 = late.headers()["Retry-After"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: serde_json::Value = late.json().await.unwrap();
    assert_eq!(body["code"], "draining");
    assert_eq!(body["retry_after_s"], retry_after);
    assert!(
        (20..=21).contains(&retry_after),
        "Retry-After {retry_after} is the window left (the sends' bound is longer) and the restart"
    );
    let ready = gw.client.get(gw.url("/health/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 503);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let later = gw.detailed().await["drain"]["remaining_s"]
        .as_f64()
        .unwrap();
    assert!(
        later < first - 0.5,
        "remaining_s falls: {first} then {later}"
    );

    let mut created = 0;
    let mut last_answer = Instant::now();
    for h in held {
        assert_eq!(
            h.await.unwrap().unwrap(),
            201,
            "a send in flight completes normally"
        );
        created += 1;
        last_answer = Instant::now();
    }
    let (code, exited_at) = gw.exit(Duration::from_secs(15)).await;
    assert_eq!(code, 0);
    assert!(
        exited_at.duration_since(last_answer) < Duration::from_secs(3),
        "exits soon after the last send"
    );
    proxy.set(Fault::Pass);
    assert_eq!(
        rabbit::ready(&queue).await,
        created,
        "every 2xx is in the queue"
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_drain_window_shorter_than_a_held_send_ends_at_the_window_without_a_false_2xx() {
    let queue = rabbit::unique("sg-drain-cap");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let mut gw = start(&queue, &proxy, &[("SENDGATE_DRAIN_TIMEOUT_S", "1")]).await;
    proxy.set(Fault::Delay(Duration::from_millis(4000)));
    let held = tokio::spawn(gw.send(&queue, "{}"));
    gw.wait_in_flight(1).await;

    let signalled = Instant::now();
    gw.signal("TERM");
    let (code, exited_at) = gw.exit(Duration::from_secs(10)).await;
    assert_eq!(code, 0);
    let took = exited_at.duration_since(signalled);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "exited after {took:?}"
    );
    // Either an error status or a closed connection (no answer is not a 2xx).
    if let Ok(status) = held.await.unwrap() {
        assert_ne!(
            status, 201,
            "a send cut off by the drain never reports success"
        );
    }
    proxy.set(Fault::Pass);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn a_second_signal_ends_the_drain_at_once() {
    let queue = rabbit::unique("sg-drain-twice");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let mut gw = start(&queue, &proxy, &[("SENDGATE_DRAIN_TIMEOUT_S", "30")]).await;
    proxy.set(Fault::Blackhole);
    let _held = tokio::spawn(gw.send(&queue, "{}"));
    gw.wait_in_flight(1).await;
    gw.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gw.detailed().await["gateway_state"], "draining");
    let second = Instant::now();
    gw.signal("INT");
    let (code, exited_at) = gw.exit(Duration::from_secs(10)).await;
    assert_eq!(code, 0);
    assert!(exited_at.duration_since(second) < Duration::from_secs(3));
    proxy.set(Fault::Pass);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn an_announced_drain_is_not_cut_short_by_the_platforms_sigterm() {
    let queue = rabbit::unique("sg-drain-announced");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let mut gw = start(&queue, &proxy, &[("SENDGATE_DRAIN_TIMEOUT_S", "20")]).await;
    proxy.set(Fault::Delay(Duration::from_millis(1000)));
    let held = tokio::spawn(gw.send(&queue, "{}"));
    gw.wait_in_flight(1).await;

    // The deploy pipeline announces the drain, then the platform sends SIGTERM.
    let announced = gw
        .client
        .post(gw.url("/admin/drain"))
        .header("Content-Type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(announced.status(), 202);
    gw.signal("TERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        gw.detailed().await["gateway_state"],
        "draining",
        "SIGTERM did not end the drain"
    );
    assert_eq!(
        held.await.unwrap().unwrap(),
        201,
        "the send in flight completes"
    );
    let (code, _) = gw.exit(Duration::from_secs(10)).await;
    assert_eq!(code, 0);
    proxy.set(Fault::Pass);
    assert_eq!(rabbit::ready(&queue).await, 1);
    rabbit::delete(&queue).await;
}
