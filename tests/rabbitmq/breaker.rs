//! The request-path circuit breaker against the real broker: the data plane is black-holed
//! while the admin plane (and so the health probes) stays healthy — the outage where probes
//! kept passing and the breaker never opened. Here it opens on request outcomes alone.

use std::time::{Duration, Instant};

use sendgate_testkit::fault_proxy::{Fault, FaultProxy};
use sendgate_testkit::gateway::retry_after;
use sendgate_testkit::rabbit;
use sendgate_testkit::rabbitmq_app::{spawn, RabbitApp};

/// A send's deadline: short, so tripping the breaker is quick, yet long enough that the
/// healthy first send of a test is not cut off on a loaded 2-core machine (at 300 ms it
/// was, now and then, with the broker and other suites on the same cores).
const SEND_DEADLINE_MS: u64 = 1000;

const BREAKER: &[(&str, &str)] = &[
    ("SENDGATE_SEND_TIMEOUT_MS", "1000"),
    ("SENDGATE_BREAKER_MIN_FAILURES", "3"),
    ("SENDGATE_BREAKER_OPEN_S", "2"),
    ("SENDGATE_PROBE_INTERVAL_S", "1"),
];

async fn timed(app: &RabbitApp) -> (reqwest::Response, Duration) {
    let started = Instant::now();
    let r = app.send("{}").await;
    (r, started.elapsed())
}

/// Black-hole the data plane and send until the breaker opens; returns how many sends it took.
async fn trip(app: &RabbitApp, proxy: &FaultProxy) -> usize {
    proxy.set(Fault::Blackhole);
    for n in 1..=10 {
        let (r, took) = timed(app).await;
        if r.status() == 503
            || r.headers()
                .get("X-Sendgate-Backend")
                .is_some_and(|b| b == "fallback")
        {
            return n;
        }
        assert!(
            took < Duration::from_millis(SEND_DEADLINE_MS + 700),
            "a send waited {took:?}"
        );
    }
    panic!("the breaker never opened");
}

#[tokio::test]
async fn black_holed_sends_open_the_breaker_although_probes_pass_and_a_trial_closes_it() {
    let queue = rabbit::unique("sg-breaker");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let mut vars = BREAKER.to_vec();
    vars.push(("SENDGATE_RABBITMQ_URL", &amqp));
    let app = spawn(&queue, &vars).await;
    assert_eq!(app.status("{}").await, 201);
    rabbit::wait_for_management_count(&queue, 1).await;

    let n = trip(&app, &proxy).await;
    assert_eq!(n, 4, "3 failures open it; the 4th send is refused");

    // Open: fail fast, with the time to the next trial; the probes still pass.
    let (r, took) = timed(&app).await;
    assert_eq!(r.status(), 503);
    assert!(
        took < Duration::from_millis(200),
        "fail fast (a send's deadline is {SEND_DEADLINE_MS} ms), took {took:?}"
    );
    let after = retry_after(&r).unwrap();
    assert!((1..=2).contains(&after), "Retry-After {after}");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "backend_unavailable");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let d = app.detailed().await;
    assert_eq!(d["backends"]["primary"]["breaker"], "open");
    assert_eq!(
        d["backends"]["primary"]["probe"]["ok"], true,
        "a healthy probe does not close it"
    );
    assert_eq!(d["status"], "degraded");

    // Traffic restored: after the open time a real send is the trial; it succeeds and closes it.
    proxy.set(Fault::Pass);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let started = Instant::now();
    while app.status("{}").await != 201 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never closed again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        app.detailed().await["backends"]["primary"]["breaker"],
        "closed"
    );
    assert_eq!(app.in_flight().await, 0);
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn while_the_primary_is_open_sends_go_to_the_fallback_and_come_back() {
    let queue = rabbit::unique("sg-failover");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let mut vars = BREAKER.to_vec();
    vars.extend([
        ("SENDGATE_RABBITMQ_URL", amqp.as_str()),
        ("SENDGATE_FALLBACK_BACKEND", "embedded"),
        ("SENDGATE_FALLBACK_DATA_DIR", data.as_str()),
    ]);
    let app = spawn(&queue, &vars).await;
    let r = app.send("{}").await;
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["X-Sendgate-Backend"], "primary");
    rabbit::wait_for_management_count(&queue, 1).await;

    trip(&app, &proxy).await;
    let mut on_fallback = 0;
    for _ in 0..5 {
        let (r, took) = timed(&app).await;
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["X-Sendgate-Backend"], "fallback");
        assert!(
            took < Duration::from_millis(200),
            "no request waits out a deadline: {took:?}"
        );
        on_fallback += 1;
    }
    let stored = sendgate::backend::embedded::Store::open(dir.path())
        .unwrap()
        .depth(&queue)
        .unwrap();
    assert!(
        stored >= on_fallback,
        "the fallback holds what it acknowledged"
    );

    proxy.set(Fault::Pass);
    let started = Instant::now();
    loop {
        let r = app.send("{}").await;
        assert_eq!(r.status(), 201);
        if r.headers()["X-Sendgate-Backend"] == "primary" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never back on the primary"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        app.detailed().await["backends"]["primary"]["breaker"],
        "closed"
    );
    rabbit::delete(&queue).await;
}

#[tokio::test]
async fn forced_to_the_primary_it_never_fails_over() {
    let queue = rabbit::unique("sg-forced");
    let proxy = FaultProxy::start(rabbit::AMQP.parse().unwrap()).await;
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let mut vars = BREAKER.to_vec();
    vars.extend([
        ("SENDGATE_RABBITMQ_URL", amqp.as_str()),
        ("SENDGATE_FALLBACK_BACKEND", "embedded"),
        ("SENDGATE_FALLBACK_DATA_DIR", data.as_str()),
        ("SENDGATE_FORCE_BACKEND", "primary"),
    ]);
    let app = spawn(&queue, &vars).await;
    assert_eq!(app.status("{}").await, 201);
    rabbit::wait_for_management_count(&queue, 1).await;
    trip(&app, &proxy).await;
    let r = app.send("{}").await;
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "backend_unavailable");
    let stored = sendgate::backend::embedded::Store::open(dir.path())
        .unwrap()
        .depth(&queue)
        .unwrap();
    assert_eq!(stored, 0, "nothing went to the fallback");
    proxy.set(Fault::Pass);
    rabbit::delete(&queue).await;
}
