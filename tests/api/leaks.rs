//! In-flight slots come back on every path: a send that hangs, one that times out, and one
//! whose client gives up and disconnects (the request future is dropped). In the spirit of
//! tower's permit-leak tests: after ten times the pool of hung sends, the gateway still
//! serves at full concurrency once the backend answers again.

use std::time::Duration;

use crate::helpers::{spawn_app_with, TestApp};
use crate::send::wait_until;

async fn in_flight(app: &TestApp) -> u64 {
    app.detailed().await["backends"]["primary"]["sends_in_flight"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn hung_timed_out_and_abandoned_sends_all_give_their_slot_back() {
    const MAX: usize = 4;
    let app = spawn_app_with(&[
        ("SENDGATE_MAX_IN_FLIGHT", "4"),
        ("SENDGATE_SEND_TIMEOUT_MS", "1500"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "100000"),
    ])
    .await;
    app.faults().hold_sends(true);

    // Ten times the pool: half wait for the gateway's deadline, half give up after 200 ms
    // and disconnect.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let sends: Vec<_> = (0..MAX * 10)
        .map(|i| {
            let client = if i % 2 == 0 {
                app.client.clone()
            } else {
                impatient.clone()
            };
            let url = app.url("/v1/queues/requests/messages");
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .body(i.to_string())
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .ok()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for s in sends {
        answers.push(s.await.unwrap());
    }
    let timed_out = answers.iter().filter(|a| **a == Some(504)).count();
    let saturated = answers.iter().filter(|a| **a == Some(503)).count();
    let abandoned = answers.iter().filter(|a| a.is_none()).count();
    assert!(timed_out >= 1, "{answers:?}");
    assert!(saturated >= 1, "{answers:?}");
    assert!(abandoned >= 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, None | Some(503) | Some(504))),
        "{answers:?}"
    );

    // Every slot comes back: abandoned ones when their future is dropped or at the deadline.
    wait_until(|| async { in_flight(&app).await == 0 }).await;

    app.faults().hold_sends(false);
    let burst: Vec<_> = (0..MAX)
        .map(|i| {
            let (client, url) = (app.client.clone(), app.url("/v1/queues/requests/messages"));
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .body(i.to_string())
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap(), 201, "full concurrency is available again");
    }
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
