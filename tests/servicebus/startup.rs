//! Start-up on Service Bus: the `starting` phase and its one depth read per queue, and
//! the refusals for settings that cannot work.

use std::time::Duration;

use sendgate::lifecycle::GatewayState;
use sendgate::startup::StartupError;

use crate::helpers::launch;
use sendgate_testkit::gateway::{body_json, build_only, retry_after};
use sendgate_testkit::servicebus_stub::{description, Reply, ServiceBusStub};

#[tokio::test]
async fn start_up_reads_each_queue_once_before_running_and_health_shows_that_backlog() {
    // The admin plane answers after a pause, so the gateway is seen `starting`.
    let hold = Duration::from_millis(1000);
    let stub = ServiceBusStub::start().await;
    // requests: 4 active + 2 scheduled (the dead letter is not backlog); audit: 9.
    stub.on_depth_for(
        "requests",
        Reply::xml(200, &description(4, 1, 2, "Active")).after(hold),
    );
    stub.on_depth_for(
        "audit",
        Reply::xml(200, &description(9, 0, 0, "Active")).after(hold),
    );
    let mut app = launch(
        stub,
        &[
            ("SENDGATE_QUEUES", "requests,audit"),
            ("SENDGATE_DEPTH_TTL_MS", "60000"),
        ],
    )
    .await;

    // `starting`: both reads are on the wire, and the gateway waits for their answers.
    let asked = std::time::Instant::now();
    while app.stub.depth_reads().len() < 2 {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "start-up never read: {:?}",
            app.stub.requests()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app.handle.lifecycle.state(), GatewayState::Starting);

    // It answers /health/* meanwhile, and refuses sends without calling the broker.
    let live = app
        .client
        .get(app.url("/health/live"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let ready = app
        .client
        .get(app.url("/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(body_json(ready).await["code"], "starting");
    let health = app.detailed().await;
    assert_eq!(health["gateway_state"], "starting", "{health}");
    assert!(
        health["queues"]["requests"]["backlog"].is_null(),
        "{health}"
    );
    assert!(health["queues"]["audit"]["backlog"].is_null(), "{health}");
    let response = app.send("{}").await;
    assert_eq!(response.status(), 503);
    assert_eq!(retry_after(&response), Some(1));
    assert_eq!(body_json(response).await["code"], "starting");
    assert_eq!(app.handle.lifecycle.state(), GatewayState::Starting);

    // `running` once the reads are answered; checks the log is exactly one GET per queue.
    app.until_running().await;
    assert_eq!(app.handle.lifecycle.state(), GatewayState::Running);
    assert!(
        app.stub.sends().is_empty(),
        "the refused send never reached the broker"
    );

    // Right after start, health shows each queue's backlog from its start-up read.
    let health = app.detailed().await;
    assert_eq!(health["gateway_state"], "running", "{health}");
    assert_eq!(health["status"], "ok", "{health}");
    for (queue, backlog) in [("requests", 6), ("audit", 9)] {
        let q = &health["queues"][queue];
        assert_eq!(q["backlog"], backlog, "{queue}: {health}");
        assert_eq!(q["consecutive_failures"], 0, "{queue}: {health}");
        assert!(q["last_read_ok_at"].is_string(), "{queue}: {health}");
    }
    let ready = app
        .client
        .get(app.url("/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert!(
        app.requests_since_start().is_empty(),
        "health reports the start-up reads, it does not read again"
    );
    app.stop().await;
}

#[tokio::test]
async fn without_a_namespace_endpoint_or_connection_string_start_up_names_servicebus_namespace() {
    let err = build_only(&[("SENDGATE_BACKEND", "servicebus")])
        .await
        .unwrap_err();
    match &err {
        StartupError::Config(e) => assert_eq!(e.variable(), Some("SERVICEBUS_NAMESPACE")),
        other => panic!("{other:?}"),
    }
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().starts_with("SERVICEBUS_NAMESPACE: "),
        "{err}"
    );
}

#[tokio::test]
async fn a_malformed_connection_string_stops_start_up_without_showing_the_key() {
    let key = "VerySecretKeyMaterial0123456789=";
    for raw in [
        format!("Endpoint=https://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={key}"),
        format!("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey={key}"),
        format!("sb://ns.servicebus.windows.net/;{key}"),
        // Commas instead of semicolons: one long Endpoint value that holds the key.
        format!("Endpoint=sb://ns.servicebus.windows.net/,SharedAccessKeyName=send,SharedAccessKey={key}"),
    ] {
        let err = build_only(&[
            ("SENDGATE_BACKEND", "servicebus"),
            ("SERVICEBUS_CONNECTION_STRING", &raw),
        ])
        .await
        .unwrap_err();
        match &err {
            StartupError::Config(e) => {
                assert_eq!(e.variable(), Some("SERVICEBUS_CONNECTION_STRING"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.exit_code(), 2);
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(key), "{shown}");
    }
}

#[test]
fn the_binary_exits_2_with_one_line_naming_the_variable() {
    let out = sendgate_testkit::gateway::run_binary(
        &[],
        &[
            ("SENDGATE_BACKEND", "servicebus"),
            ("SENDGATE_LISTEN", "127.0.0.1:0"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("SERVICEBUS_NAMESPACE"), "{stderr}");
}
