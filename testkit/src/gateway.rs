//! The one way every suite spawns sendgate: in-process on a random port
//! ([`Gateway`], real backends wrapped in [`FaultyBackend`]), or as the real binary
//! ([`GatewayProcess`] for a server, [`run_binary`] for a command that ends on its own).
//!
//! Overrides are checked against the variables the configuration declares: a misspelled
//! name fails the test at once instead of silently testing the default.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sendgate::config::Settings;
use sendgate::startup::{AppHandle, Application, Backends, StartupError};

use crate::faulty_backend::FaultyBackend;

/// What every in-process gateway starts from: loopback on a random port, two workers,
/// no probe timer (its first tick would read the admin plane at a random moment and
/// spoil the call counts tests assert), and no drain linger (no load balancer in front:
/// every stop would otherwise wait it out). Suites and tests add their own on top.
const IN_PROCESS_DEFAULTS: &[(&str, &str)] = &[
    ("SENDGATE_LISTEN", "127.0.0.1:0"),
    ("SENDGATE_WORKERS", "2"),
    ("SENDGATE_PROBE_INTERVAL_S", "0"),
    ("SENDGATE_DRAIN_LINGER_S", "0"),
];

/// `layers` merged left to right (later wins), every name checked against the declared
/// variables.
pub fn env_of(layers: &[&[(&str, &str)]]) -> HashMap<String, String> {
    let mut env = HashMap::new();
    for layer in layers {
        for (name, value) in *layer {
            assert!(
                sendgate::config::VARIABLES.iter().any(|v| v.name == *name),
                "{name} is not a variable sendgate reads: a typo in the test?"
            );
            env.insert((*name).to_owned(), (*value).to_owned());
        }
    }
    env
}

/// Settings from the in-process defaults, then `layers`.
pub fn settings_of(layers: &[&[(&str, &str)]]) -> Settings {
    let mut all: Vec<&[(&str, &str)]> = vec![IN_PROCESS_DEFAULTS];
    all.extend_from_slice(layers);
    Settings::from_vars(&env_of(&all)).expect("test settings are valid")
}

/// Parse exactly these variables (no defaults added) and build the application, for
/// start-up refusals: a setting that cannot work is refused while parsing
/// (`StartupError::Config`), a backend that cannot be set up while building.
pub async fn build_only(vars: &[(&str, &str)]) -> Result<(), StartupError> {
    let settings = Settings::from_vars(&env_of(&[vars]))?;
    Application::build(settings).await.map(|_| ())
}

/// sendgate running in this process.
pub struct Gateway {
    pub address: String,
    pub handle: AppHandle,
    pub client: reqwest::Client,
    /// The primary backend, as the gateway sees it: counts calls, injects faults.
    pub primary: Arc<FaultyBackend>,
    pub fallback: Option<Arc<FaultyBackend>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    /// Assemble and start the gateway; returns while it may still be `starting`.
    pub async fn launch(settings: Settings) -> Self {
        // With RUST_LOG set, sendgate's logs show (on stderr, not captured by the harness).
        if std::env::var_os("RUST_LOG").is_some() {
            sendgate::telemetry::init(settings.log_format);
        }
        let backends = Backends::open(&settings).expect("the backends open");
        let primary = FaultyBackend::wrap(backends.primary);
        let fallback = backends.fallback.map(FaultyBackend::wrap);
        let app = Application::build_with(
            settings,
            Backends {
                primary: primary.clone(),
                fallback: fallback.clone().map(|f| f as _),
            },
        )
        .expect("the app starts");
        let address = format!("http://127.0.0.1:{}", app.port());
        let handle = app.handle();
        let server = tokio::spawn(app.run_until_stopped(false));
        sendgate::tls::install_ring();
        Self {
            address,
            handle,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("an HTTP client"),
            primary,
            fallback,
            server,
        }
    }

    /// Assemble and start the gateway, and wait until it is `running`.
    pub async fn start(settings: Settings) -> Self {
        let gateway = Self::launch(settings).await;
        gateway.until_running().await;
        gateway
    }

    pub async fn until_running(&self) {
        tokio::time::timeout(Duration::from_secs(15), self.handle.lifecycle.started())
            .await
            .expect("the gateway leaves `starting`");
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// POST a JSON body to a queue.
    pub async fn send(&self, queue: &str, body: &str) -> reqwest::Response {
        self.send_with(queue, body, &[]).await
    }

    pub async fn send_with(
        &self,
        queue: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url(&format!("/v1/queues/{queue}/messages")))
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("request reaches the server")
    }

    pub async fn detailed(&self) -> serde_json::Value {
        detailed(&self.client, &self.address).await
    }

    /// Sends holding an in-flight slot on the primary, as `/health/detailed` reports.
    pub async fn in_flight(&self) -> u64 {
        self.detailed().await["backends"]["primary"]["sends_in_flight"]
            .as_u64()
            .expect("sends_in_flight is a number")
    }

    /// Wait until `n` sends are in flight on the primary.
    pub async fn wait_in_flight(&self, n: u64) {
        wait_in_flight(&self.client, &self.address, n).await
    }

    /// Wait for the server to stop on its own (after a drain started elsewhere).
    pub async fn wait_stopped(self, limit: Duration) {
        tokio::time::timeout(limit, self.server)
            .await
            .expect("the server stops after the drain")
            .expect("the server task ends")
            .expect("the server ends cleanly");
    }

    /// Drain and stop the server, waiting until it has let go of its port.
    pub async fn stop(self) {
        self.handle.lifecycle.begin_drain(Duration::from_secs(5));
        self.wait_stopped(Duration::from_secs(10)).await;
    }
}

/// sendgate as the real binary, serving on a port of its own until it exits or is dropped.
pub struct GatewayProcess {
    child: Child,
    pub address: String,
    pub client: reqwest::Client,
}

impl GatewayProcess {
    /// Start `sendgate serve` with a clean environment plus `vars` (names checked) on a
    /// free port, and wait until `/health/ready` answers 200. Its output is discarded.
    pub async fn start(vars: &[(&str, &str)]) -> Self {
        Self::start_logging_to(vars, Stdio::null()).await
    }

    /// [`Self::start`], its logs (stderr) going to `log`.
    pub async fn start_logging_to(vars: &[(&str, &str)], log: impl Into<Stdio>) -> Self {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let env = env_of(&[&[("SENDGATE_LISTEN", listen.as_str())], vars]);
        let child = binary(&["serve"], &env)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the binary starts");
        sendgate::tls::install_ring();
        let gateway = Self {
            child,
            address: format!("http://{listen}"),
            // A fresh connection per request: a draining gateway closes them.
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("an HTTP client"),
        };
        let started = Instant::now();
        loop {
            let ready = gateway
                .client
                .get(gateway.url("/health/ready"))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status() == 200) {
                return gateway;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the gateway never became ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// POST a JSON body to a queue; the future owns what it needs, so it can be spawned.
    pub fn send(
        &self,
        queue: &str,
        body: &str,
    ) -> impl std::future::Future<Output = Result<u16, reqwest::Error>> + 'static {
        let request = self
            .client
            .post(self.url(&format!("/v1/queues/{queue}/messages")))
            .header("Content-Type", "application/json")
            .body(body.to_owned())
            .send();
        async move { request.await.map(|r| r.status().as_u16()) }
    }

    /// POST a batch body (`{"messages": [...]}`) to a queue: the status.
    pub fn send_batch(
        &self,
        queue: &str,
        body: &str,
    ) -> impl std::future::Future<Output = Result<u16, reqwest::Error>> + 'static {
        let request = self
            .client
            .post(self.url(&format!("/v1/queues/{queue}/messages/batch")))
            .header("Content-Type", "application/json")
            .body(body.to_owned())
            .send();
        async move { request.await.map(|r| r.status().as_u16()) }
    }

    pub async fn detailed(&self) -> serde_json::Value {
        detailed(&self.client, &self.address).await
    }

    pub async fn wait_in_flight(&self, n: u64) {
        wait_in_flight(&self.client, &self.address, n).await
    }

    /// Send the process a signal by name (`TERM`, `INT`).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success(), "kill -{name} failed");
    }

    /// Wait for the process to exit; its exit code and when.
    pub async fn exit(&mut self, limit: Duration) -> (i32, Instant) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("the child can be waited on") {
                return (status.code().expect("exited, not killed"), Instant::now());
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!("the gateway did not exit within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `sendgate` binary cargo built for this run. Cargo gives its path to the package's
/// integration tests as `CARGO_BIN_EXE_sendgate`, at run time since cargo 1.94 (this crate
/// is compiled apart from them, so it cannot read it with `env!`); without it, the binary
/// is where cargo puts it: in the profile's folder, above the test binary's `deps/`.
pub fn sendgate_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_sendgate") {
        return PathBuf::from(path);
    }
    let test = std::env::current_exe().expect("the test binary's path");
    let profile = test
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in <target>/<profile>/deps/");
    profile.join(format!("sendgate{}", std::env::consts::EXE_SUFFIX))
}

/// The binary with a clean environment (only `PATH` and `env`), stdin closed.
pub fn binary(args: &[&str], env: &HashMap<String, String>) -> Command {
    let mut cmd = Command::new(sendgate_binary());
    cmd.args(args)
        .stdin(Stdio::null())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env);
    cmd
}

/// Run the binary with a clean environment plus `env` (names NOT checked: start-up
/// refusals are tested with wrong names on purpose) until it exits by itself.
pub fn run_binary(args: &[&str], env: &[(&str, &str)]) -> Output {
    let env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let child = binary(args, &env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    wait_with_timeout(child, Duration::from_secs(20))
}

pub fn wait_with_timeout(mut child: Child, limit: Duration) -> Output {
    // Read both pipes while waiting: output larger than a pipe's buffer (64 KiB; the
    // OpenAPI document is more) would otherwise block the child for ever.
    fn drain(
        pipe: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("the child can be waited on") {
            return Output {
                status,
                stdout: stdout.join().unwrap_or_default(),
                stderr: stderr.join().unwrap_or_default(),
            };
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("sendgate did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

async fn detailed(client: &reqwest::Client, address: &str) -> serde_json::Value {
    client
        .get(format!("{address}/health/detailed"))
        .send()
        .await
        .expect("the gateway answers")
        .json()
        .await
        .expect("a JSON body")
}

async fn wait_in_flight(client: &reqwest::Client, address: &str, n: u64) {
    let started = Instant::now();
    while detailed(client, address).await["backends"]["primary"]["sends_in_flight"] != n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never {n} sends in flight"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn body_json(response: reqwest::Response) -> serde_json::Value {
    response.json().await.expect("a JSON body")
}

pub fn retry_after(response: &reqwest::Response) -> Option<u64> {
    response.headers().get("Retry-After").map(|v| {
        v.to_str()
            .expect("Retry-After is text")
            .parse()
            .expect("Retry-After is an integer")
    })
}
