//! Spawn the real application with the servicebus backend, pointed at a local stub.

use std::ops::Deref;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use sendgate_testkit::gateway::{settings_of, Gateway};

use sendgate_testkit::servicebus_stub::{Recorded, ServiceBusStub, StubMessage};

/// The send key. It looks like base64 but is used as its UTF-8 bytes.
pub const SEND_KEY: &str = "c2VuZGdhdGUtc2VuZC1rZXk9PQ==";
pub const MANAGE_KEY: &str = "bWFuYWdlLWtleS1mb3ItZGVwdGg=";
pub const NAMESPACE: &str = "test.servicebus.windows.net";

pub fn connection_string(key_name: &str, key: &str) -> String {
    format!("Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName={key_name};SharedAccessKey={key}")
}

pub struct TestApp {
    gateway: Gateway,
    pub stub: ServiceBusStub,
    /// The queues the app serves, as configured.
    pub queues: Vec<String>,
    /// How many requests the stub had recorded when the app became `running`.
    start_up_requests: usize,
}

impl Deref for TestApp {
    type Target = Gateway;

    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}

/// A fresh stub with its default answers (sends 201, depth reads backlog 0), and the app
/// on it, `running`.
pub async fn spawn_with(vars: &[(&str, &str)]) -> TestApp {
    spawn_on(ServiceBusStub::start().await, vars).await
}

/// The app on a stub the test has already scripted, so the start-up depth read gets the
/// scripted answer. Returns once the app is `running`, having checked that start-up made
/// exactly one depth read per served queue and nothing else.
pub async fn spawn_on(stub: ServiceBusStub, vars: &[(&str, &str)]) -> TestApp {
    let mut app = launch(stub, vars).await;
    app.until_running().await;
    app
}

/// The app on `stub`, returned as soon as it is assembled: the gateway is still
/// `starting` and its start-up reads may be in flight.
///
/// The servicebus backend on `stub` with the send connection string, `vars` on top.
/// The harness keeps the probe timer off: these tests count every admin-plane call the
/// start-up and request paths make, and a probe reads with the same `GET`.
pub async fn launch(stub: ServiceBusStub, vars: &[(&str, &str)]) -> TestApp {
    let settings = settings_on(&stub, vars);
    let queues = settings.queues.iter().map(|q| q.to_string()).collect();
    TestApp {
        gateway: Gateway::launch(settings).await,
        stub,
        queues,
        start_up_requests: 0,
    }
}

/// The Service Bus backend itself (no gateway) on `stub`, built from the same settings the
/// app is: for what the HTTP routes do not reach yet (`send_batch`).
pub fn backend_on(
    stub: &ServiceBusStub,
    vars: &[(&str, &str)],
) -> sendgate::backend::servicebus::ServiceBus {
    match settings_on(stub, vars).primary {
        sendgate::config::BackendSettings::ServiceBus(plan) => {
            sendgate::backend::servicebus::ServiceBus::new(&plan).expect("the backend builds")
        }
        other => panic!("not servicebus: {other:?}"),
    }
}

/// The servicebus backend on `stub` with the send connection string, `vars` on top.
pub fn settings_on(stub: &ServiceBusStub, vars: &[(&str, &str)]) -> sendgate::config::Settings {
    let endpoint = stub.endpoint();
    let send = connection_string("send", SEND_KEY);
    settings_of(&[
        &[
            ("SENDGATE_BACKEND", "servicebus"),
            ("SERVICEBUS_ENDPOINT", &endpoint),
            ("SERVICEBUS_CONNECTION_STRING", &send),
        ],
        vars,
    ])
}

/// Check that `requests` are exactly the start-up reads: one depth `GET` per served
/// queue (in any order: they run concurrently), and nothing else.
pub fn assert_start_up_reads(requests: &[Recorded], queues: &[String]) {
    let lines = || {
        requests
            .iter()
            .map(Recorded::request_line)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        requests.len(),
        queues.len(),
        "start-up makes one request per served queue: {:?}",
        lines()
    );
    let mut expected: Vec<String> = queues
        .iter()
        .map(|q| format!("GET /{q}?api-version=2021-05 HTTP/1.1"))
        .collect();
    let mut seen = lines();
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected, "start-up reads each queue's depth once");
}

impl TestApp {
    /// Wait until the gateway leaves `starting`, check what start-up asked the broker,
    /// and take that as the baseline of [`Self::requests_since_start`].
    pub async fn until_running(&mut self) {
        self.gateway.until_running().await;
        let requests = self.stub.requests();
        assert_start_up_reads(&requests, &self.queues);
        self.start_up_requests = requests.len();
    }

    /// What the stub recorded after start-up, in order.
    pub fn requests_since_start(&self) -> Vec<Recorded> {
        self.stub.requests()[self.start_up_requests..].to_vec()
    }

    pub async fn send(&self, body: &str) -> reqwest::Response {
        self.gateway.send("requests", body).await
    }

    pub async fn send_with(&self, body: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        self.gateway.send_with("requests", body, headers).await
    }

    /// Send `n` messages one after another; the status of each.
    pub async fn statuses(&self, n: usize) -> Vec<u16> {
        let mut out = Vec::new();
        for i in 0..n {
            out.push(self.send(&format!("{{\"i\":{i}}}")).await.status().as_u16());
        }
        out
    }

    /// Drain and stop the server.
    pub async fn stop(self) {
        self.gateway.stop().await
    }
}

/// The fields of a `SharedAccessSignature sr=..&sig=..&se=..&skn=..` header, as sent.
#[derive(Debug)]
pub struct SasFields {
    pub sr: String,
    pub sig: String,
    pub se: String,
    pub skn: String,
}

pub fn sas_fields(authorization: &str) -> SasFields {
    let fields = authorization
        .strip_prefix("SharedAccessSignature ")
        .unwrap_or_else(|| panic!("not a SAS token: {authorization}"));
    let get = |name: &str| {
        fields
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {fields}"))
            .to_owned()
    };
    SasFields {
        sr: get("sr"),
        sig: get("sig"),
        se: get("se"),
        skn: get("skn"),
    }
}

/// Decode `%XX` escapes (and nothing else), independently of the code under test.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Check a SAS header the way Service Bus does: recompute the HMAC-SHA256 of
/// `{sr as sent}\n{se}` with `key`'s UTF-8 bytes and compare it with `sig`.
pub fn assert_sas_verifies(authorization: &str, key: &str) -> SasFields {
    let f = sas_fields(authorization);
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(format!("{}\n{}", f.sr, f.se).as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    assert_eq!(
        percent_decode(&f.sig),
        expected,
        "the signature does not verify with this key: {authorization}"
    );
    f
}

/// The one message of a send, read by the documented form it took.
pub fn only_message(send: &Recorded) -> StubMessage {
    let mut messages = send
        .messages()
        .unwrap_or_else(|why| panic!("not a documented send form: {why}"));
    assert_eq!(messages.len(), 1, "one message: {messages:?}");
    messages.remove(0)
}
