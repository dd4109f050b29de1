//! One request context: every answer carries `X-Request-Id`, and every event logged while
//! serving a request carries its id.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use sendgate_testkit::embedded::{spawn_app, spawn_app_with};
use sendgate_testkit::gateway::{binary, body_json, env_of, free_port};
use sendgate_testkit::keys::{Key, KeysFile};

/// The answer's `X-Request-Id`, checked to be the id its body names (when it has a body
/// that names one).
async fn request_id_of(response: reqwest::Response) -> String {
    let id = response
        .headers()
        .get("X-Request-Id")
        .unwrap_or_else(|| panic!("no X-Request-Id on a {}", response.status()))
        .to_str()
        .unwrap()
        .to_owned();
    if let Ok(body) = response.json::<Value>().await {
        if let Some(in_body) = body.get("request_id") {
            assert_eq!(in_body, &Value::String(id.clone()));
        }
    }
    id
}

#[tokio::test]
async fn routing_refusals_carry_the_request_id() {
    let app = spawn_app().await;
    let not_found = app.client.get(app.url("/nowhere")).send().await.unwrap();
    assert_eq!(not_found.status(), 404);
    assert!(uuid::Uuid::parse_str(&request_id_of(not_found).await).is_ok());

    let wrong_method = app
        .client
        .get(app.url("/v1/queues/requests/messages"))
        .header("X-Request-Id", "mine-405")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(request_id_of(wrong_method).await, "mine-405");

    let not_found = app
        .client
        .delete(app.url("/v2/anything"))
        .header("X-Request-Id", "mine-404")
        .send()
        .await
        .unwrap();
    assert_eq!(not_found.status(), 404);
    assert_eq!(request_id_of(not_found).await, "mine-404");
}

#[tokio::test]
async fn a_401_and_a_429_carry_the_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("batch", &["sender"]))
        .write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1"),
        ("SENDGATE_DEPTH_TTL_MS", "60000"),
    ])
    .await;
    let unauthenticated = app
        .send_with("requests", "{}", &[("X-Request-Id", "mine-401")])
        .await;
    assert_eq!(unauthenticated.status(), 401);
    assert_eq!(request_id_of(unauthenticated).await, "mine-401");

    let auth = [("Authorization", "Bearer batch-secret")];
    assert_eq!(app.send_with("requests", "1", &auth).await.status(), 201);
    let full = app
        .send_with("requests", "2", &[auth[0], ("X-Request-Id", "mine-429")])
        .await;
    assert_eq!(full.status(), 429);
    assert_eq!(request_id_of(full).await, "mine-429");

    let generated = app.send_with("requests", "3", &auth).await;
    assert_eq!(generated.status(), 429);
    assert!(uuid::Uuid::parse_str(&request_id_of(generated).await).is_ok());
}

#[tokio::test]
async fn an_invalid_request_id_is_replaced_and_a_send_lists_it_as_a_field_error() {
    let app = spawn_app().await;
    let response = app
        .send_with("requests", "{}", &[("X-Request-Id", "")])
        .await;
    assert_eq!(response.status(), 400);
    let id = response.headers()["X-Request-Id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "a fresh id: {id:?}");
    let body = body_json(response).await;
    assert_eq!(body["code"], "invalid_request");
    assert_eq!(body["request_id"], id.as_str());
    assert_eq!(
        body["errors"][0]["loc"],
        serde_json::json!(["header", "X-Request-Id"])
    );
    assert_eq!(app.stored("requests"), 0);

    // Outside the send path the bad id is only replaced.
    let live = app
        .client
        .get(app.url("/health/live"))
        .header("X-Request-Id", "x".repeat(129))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    assert!(uuid::Uuid::parse_str(live.headers()["X-Request-Id"].to_str().unwrap()).is_ok());
}

/// The real binary, logging JSON lines to stderr, read line by line as they come.
struct LoggingGateway {
    child: Child,
    lines: mpsc::Receiver<Value>,
    port: u16,
    /// What start-up logged, up to `started`.
    start_up: Vec<Value>,
}

impl LoggingGateway {
    /// A servicebus gateway on a closed port. Failing closed on the first failed depth read,
    /// every send is refused `capacity_unknown`; failing open, every send finds no broker
    /// to send to (`503 backend_unavailable`, logged `send_failed`). Both log on the way.
    fn start(fail_closed: bool) -> Self {
        let endpoint = format!("http://127.0.0.1:{}", free_port());
        let env = env_of(&[&[
            ("SENDGATE_LOG_FORMAT", "json"),
            ("SENDGATE_LISTEN", "127.0.0.1:0"),
            ("SENDGATE_BACKEND", "servicebus"),
            ("SENDGATE_PROBE_INTERVAL_S", "0"),
            ("SENDGATE_DEPTH_TTL_MS", "0"),
            ("SENDGATE_ADMIN_TIMEOUT_MS", "1000"),
            ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "1"),
            ("SERVICEBUS_SEND_FAILCLOSED", if fail_closed { "1" } else { "0" }),
            ("SERVICEBUS_ENDPOINT", &endpoint),
            (
                "SERVICEBUS_CONNECTION_STRING",
                "Endpoint=sb://test.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VuZA==",
            ),
        ]]);
        let mut child = binary(&[], &env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let parsed = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                if tx.send(parsed).is_err() {
                    return;
                }
            }
        });
        let mut gateway = Self {
            child,
            lines,
            port: 0,
            start_up: Vec::new(),
        };
        gateway.start_up = gateway.lines_until("started");
        let listening = gateway
            .start_up
            .iter()
            .find(|l| l["event"] == "listening")
            .expect("the listening event comes before started");
        gateway.port = listening["port"].as_u64().unwrap() as u16;
        gateway
    }

    /// Every line logged until (and including) the next `event`.
    fn lines_until(&mut self, event: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {event} event logged; saw {seen:?}"));
            let done = line["event"] == event;
            seen.push(line);
            if done {
                return seen;
            }
        }
    }
}

impl Drop for LoggingGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_sends_log_events_carry_its_request_id() {
    let mut gateway = LoggingGateway::start(true);
    sendgate::tls::install_ring();
    let client = reqwest::Client::new();
    let url = format!(
        "http://127.0.0.1:{}/v1/queues/requests/messages",
        gateway.port
    );
    let send = |id: Option<&'static str>| {
        let mut req = client
            .post(&url)
            .header("Content-Type", "application/json")
            .body("{}");
        if let Some(id) = id {
            req = req.header("X-Request-Id", id);
        }
        req.send()
    };

    let response = send(Some("log-test-42")).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(body_json(response).await["code"], "capacity_unknown");
    let lines = gateway.lines_until("send_failclosed");
    let read_failed = lines
        .iter()
        .find(|l| l["event"] == "depth_read_failed")
        .unwrap_or_else(|| panic!("the send's own depth read is logged: {lines:?}"));
    let refused = lines.last().unwrap();
    // (Both events carry a `queue` of their own, so the request's is not checked here:
    // the unit tests of `http::context` and `telemetry` do.)
    for event in [read_failed, refused] {
        assert_eq!(event["request_id"], "log-test-42", "{event}");
        assert_eq!(event["key"], "anonymous", "{event}");
    }
    assert_eq!(refused["level"], "WARN");
    assert_eq!(refused["consecutive_failures"], 1);

    // A generated id is logged as the one the answer carries.
    let response = send(None).await.unwrap();
    assert_eq!(response.status(), 503);
    let answered = response.headers()["X-Request-Id"]
        .to_str()
        .unwrap()
        .to_owned();
    let lines = gateway.lines_until("send_failclosed");
    assert_eq!(lines.last().unwrap()["request_id"], answered.as_str());

    // Start-up's own failed depth read belongs to no request.
    assert!(gateway
        .start_up
        .iter()
        .any(|l| l["event"] == "depth_read_failed"));
    assert!(
        gateway
            .start_up
            .iter()
            .all(|l| l.get("request_id").is_none()),
        "{:?}",
        gateway.start_up
    );
}

#[tokio::test]
async fn a_failed_sends_log_events_carry_its_request_id() {
    let mut gateway = LoggingGateway::start(false);
    sendgate::tls::install_ring();
    let response = reqwest::Client::new()
        .post(format!(
            "http://127.0.0.1:{}/v1/queues/requests/messages",
            gateway.port
        ))
        .header("Content-Type", "application/json")
        .header("X-Request-Id", "failed-send-7")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        503,
        "nothing reached the broker: retryable"
    );
    let lines = gateway.lines_until("send_failed");
    let backend_detail = lines
        .iter()
        .find(|l| l["event"] == "servicebus_send_failed")
        .unwrap_or_else(|| panic!("the backend logs its detail: {lines:?}"));
    for event in [backend_detail, lines.last().unwrap()] {
        assert_eq!(event["request_id"], "failed-send-7", "{event}");
        assert_eq!(event["key"], "anonymous", "{event}");
    }
    assert_eq!(lines.last().unwrap()["backend"], "primary");
}
