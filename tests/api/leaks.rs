//! In-flight slots come back on every path: a send that hangs, one that times out, and one
//! whose client gives up and disconnects (the request future is dropped). In the spirit of
//! tower's permit-leak tests: after ten times the pool of hung sends, the gateway still
//! serves at full concurrency once the backend answers again.

use std::time::Duration;

use crate::send::wait_until;
use sendgate_testkit::embedded::{spawn_app_with, TestApp};

async fn in_flight(app: &TestApp) -> u64 {
    app.detailed().await["backends"]["primary"]["sends_in_flight"]
        .as_u64()
        .unwrap()
}

/// `n` sends at once; each answer's status, or `None` when the client gave up first.
async fn burst(app: &TestApp, client: &reqwest::Client, n: usize) -> Vec<Option<u16>> {
    let sends: Vec<_> = (0..n)
        .map(|i| {
            let (client, url) = (client.clone(), app.url("/v1/queues/requests/messages"));
            tokio::spawn(async move {
                let sent = client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .body(i.to_string())
                    .send()
                    .await;
                sent.map(|r| r.status().as_u16()).ok()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for s in sends {
        answers.push(s.await.unwrap());
    }
    answers
}

#[tokio::test]
async fn hung_timed_out_and_abandoned_sends_all_give_their_slot_back() {
    const MAX: usize = 4;
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_IN_FLIGHT", "4"),
        ("SENDGATE_SEND_TIMEOUT_MS", "500"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "100000"),
        // Forty timeouts would rightly open the breaker; this test is about slots.
        ("SENDGATE_BREAKER_MIN_FAILURES", "1000"),
    ])
    .await;
    app.faults().hold_sends(true);
    sendgate::tls::install_ring();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();

    // Ten times the pool in hung sends, in rounds: clients that give up and disconnect,
    // clients that wait for the gateway's deadline, and the sends a full pool refuses.
    let mut hung = 0;
    while hung < MAX * 10 {
        let abandoned = burst(&app, &impatient, MAX).await;
        assert!(abandoned.iter().all(Option::is_none), "{abandoned:?}");
        assert_eq!(
            in_flight(&app).await,
            MAX as u64,
            "abandoned sends hold their slot until the deadline"
        );
        let refused = burst(&app, &app.client, MAX).await;
        assert!(
            refused.iter().all(|a| *a == Some(503)),
            "a full pool answers at once: {refused:?}"
        );
        wait_until(|| async { in_flight(&app).await == 0 }).await;
        let timed_out = burst(&app, &app.client, MAX).await;
        assert!(timed_out.iter().all(|a| *a == Some(504)), "{timed_out:?}");
        hung += 2 * MAX;
    }
    assert_eq!(in_flight(&app).await, 0);

    app.faults().hold_sends(false);
    let answers = burst(&app, &app.client, MAX).await;
    assert!(
        answers.iter().all(|a| *a == Some(201)),
        "full concurrency is available again: {answers:?}"
    );
    assert_eq!(in_flight(&app).await, 0);
}

#[tokio::test]
async fn a_client_that_disconnects_holds_its_slot_no_longer_than_the_deadline() {
    // actix-web finishes a handler whose client has gone, so the slot is freed by the
    // send's own deadline (a dropped dispatch frees it at once: see the unit test
    // `admission::tests::a_dropped_send_gives_its_slot_back_at_once`).
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_IN_FLIGHT", "1"),
        ("SENDGATE_SEND_TIMEOUT_MS", "1500"),
    ])
    .await;
    app.faults().hold_sends(true);
    sendgate::tls::install_ring();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let gave_up = impatient
        .post(app.url("/v1/queues/requests/messages"))
        .header("Content-Type", "application/json")
        .body("1")
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    wait_until(|| async { in_flight(&app).await == 0 }).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500 + 1000),
        "freed by the deadline"
    );
    app.faults().hold_sends(false);
    assert_eq!(app.send("requests", "2").await.status(), 201);
    assert_eq!(
        app.stored("requests"),
        1,
        "the abandoned send was cancelled at its deadline, not stored"
    );
}
