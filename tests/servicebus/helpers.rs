//! Spawn the real application with the servicebus backend, pointed at a local stub.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use sendgate::config::Settings;
use sendgate::startup::{AppHandle, Application, StartupError};

use crate::stub::{Recorded, ServiceBusStub};

/// The send key. It looks like base64 but is used as its UTF-8 bytes.
pub const SEND_KEY: &str = "c2VuZGdhdGUtc2VuZC1rZXk9PQ==";
pub const MANAGE_KEY: &str = "bWFuYWdlLWtleS1mb3ItZGVwdGg=";
pub const NAMESPACE: &str = "test.servicebus.windows.net";

pub fn connection_string(key_name: &str, key: &str) -> String {
    format!("Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName={key_name};SharedAccessKey={key}")
}

pub struct TestApp {
    pub address: String,
    pub handle: AppHandle,
    pub client: reqwest::Client,
    pub stub: ServiceBusStub,
    /// The queues the app serves, as configured.
    pub queues: Vec<String>,
    /// How many requests the stub had recorded when the app became `running`.
    start_up_requests: usize,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// The settings every test starts from: loopback, random port, the servicebus backend
/// on `stub`, the send connection string, no timer probes; `vars` on top.
///
/// The health probe reads the admin plane on its own timer (its first tick at start-up),
/// with the same `GET` as a depth read. These tests count every admin-plane call the
/// start-up and request paths make, so the probe is off unless a test turns it on.
fn env(stub: &ServiceBusStub, vars: &[(&str, &str)]) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = HashMap::from([
        ("SENDGATE_LISTEN".into(), "127.0.0.1:0".into()),
        ("SENDGATE_WORKERS".into(), "2".into()),
        ("SENDGATE_PROBE_INTERVAL_S".into(), "0".into()),
        ("SENDGATE_BACKEND".into(), "servicebus".into()),
        ("SERVICEBUS_ENDPOINT".into(), stub.endpoint()),
        (
            "SERVICEBUS_CONNECTION_STRING".into(),
            connection_string("send", SEND_KEY),
        ),
    ]);
    for (k, v) in vars {
        env.insert(k.to_string(), v.to_string());
    }
    env
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

/// The app on `stub`, returned as soon as `Application::build` does: the gateway is
/// still `starting` and its start-up reads may be in flight.
pub async fn launch(stub: ServiceBusStub, vars: &[(&str, &str)]) -> TestApp {
    let settings = Settings::from_vars(&env(&stub, vars)).expect("test settings are valid");
    let queues = settings.queues.iter().map(|q| q.to_string()).collect();
    let app = Application::build(settings).await.expect("the app starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    let server = tokio::spawn(app.run_until_stopped(false));
    TestApp {
        address,
        handle,
        client: reqwest::Client::new(),
        stub,
        queues,
        start_up_requests: 0,
        server,
    }
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

/// Parse these variables (no defaults added) and build the application, for start-up
/// refusals: a setting that cannot work is refused while parsing (`StartupError::Config`).
pub async fn build_only(vars: &[(&str, &str)]) -> Result<(), StartupError> {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let settings = Settings::from_vars(&env)?;
    Application::build(settings).await.map(|_| ())
}

impl TestApp {
    /// Wait until the gateway leaves `starting`, check what start-up asked the broker,
    /// and take that as the baseline of [`Self::requests_since_start`].
    pub async fn until_running(&mut self) {
        tokio::time::timeout(Duration::from_secs(15), self.handle.lifecycle.started())
            .await
            .expect("the gateway leaves `starting`");
        let requests = self.stub.requests();
        assert_start_up_reads(&requests, &self.queues);
        self.start_up_requests = requests.len();
    }

    /// What the stub recorded after start-up, in order.
    pub fn requests_since_start(&self) -> Vec<Recorded> {
        self.stub.requests()[self.start_up_requests..].to_vec()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    pub async fn send(&self, body: &str) -> reqwest::Response {
        self.send_with(body, &[]).await
    }

    pub async fn send_with(&self, body: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url("/v1/queues/requests/messages"))
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("request reaches the server")
    }

    /// Send `n` messages one after another; the status of each.
    pub async fn statuses(&self, n: usize) -> Vec<u16> {
        let mut out = Vec::new();
        for i in 0..n {
            out.push(self.send(&format!("{{\"i\":{i}}}")).await.status().as_u16());
        }
        out
    }

    pub async fn detailed(&self) -> serde_json::Value {
        self.client
            .get(self.url("/health/detailed"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Drain and stop the server.
    pub async fn stop(self) {
        self.handle.lifecycle.begin_drain(Duration::from_secs(5));
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .expect("the server stops")
            .expect("the server task ends")
            .expect("the server ends cleanly");
    }
}

pub async fn body_json(response: reqwest::Response) -> serde_json::Value {
    response.json().await.expect("a JSON body")
}

pub fn retry_after(response: &reqwest::Response) -> Option<u64> {
    response.headers().get("Retry-After").map(|v| {
        v.to_str()
            .unwrap()
            .parse()
            .expect("Retry-After is an integer")
    })
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
