//! Spawn the real application on a random port, with its own data directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sendgate::backend::embedded::{EmbeddedFaults, Store, StoredMessage};
use sendgate::config::Settings;
use sendgate::startup::{AppHandle, Application};

pub struct TestApp {
    pub address: String,
    pub handle: AppHandle,
    pub client: reqwest::Client,
    pub data_dir: PathBuf,
    /// Backend calls made by start-up (each queue's first depth read).
    calls_at_start: u64,
    /// Keeps the temporary directory alive for as long as the app.
    _dir: Option<Arc<tempfile::TempDir>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// Spawn with these variables on top of the test defaults (loopback, random port,
/// a fresh data directory, one worker).
pub async fn spawn_app_with(vars: &[(&str, &str)]) -> TestApp {
    let dir = Arc::new(tempfile::tempdir().expect("temporary directory"));
    let mut app = spawn_in(dir.path(), vars).await;
    app._dir = Some(dir);
    app
}

/// Spawn on an existing data directory (to prove messages survive a restart).
pub async fn spawn_in(data_dir: &Path, vars: &[(&str, &str)]) -> TestApp {
    let mut env: HashMap<String, String> = HashMap::from([
        ("SENDGATE_LISTEN".into(), "127.0.0.1:0".into()),
        ("SENDGATE_DATA_DIR".into(), data_dir.display().to_string()),
        ("SENDGATE_WORKERS".into(), "2".into()),
    ]);
    for (k, v) in vars {
        env.insert(k.to_string(), v.to_string());
    }
    let settings = Settings::from_vars(&env).expect("test settings are valid");
    let app = Application::build(settings).await.expect("the app starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    let server = tokio::spawn(app.run_until_stopped(false));
    handle.lifecycle.started().await;
    let calls_at_start = handle.backend_calls.total();
    TestApp {
        calls_at_start,
        address,
        handle,
        client: reqwest::Client::new(),
        data_dir: data_dir.to_owned(),
        _dir: None,
        server,
    }
}

impl TestApp {
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
        self.client
            .get(self.url("/health/detailed"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub fn faults(&self) -> Arc<EmbeddedFaults> {
        self.handle
            .embedded_faults
            .clone()
            .expect("embedded backend")
    }

    /// Backend calls since start-up finished.
    pub fn backend_calls(&self) -> u64 {
        self.handle.backend_calls.total() - self.calls_at_start
    }

    /// What is on disk in `queue`, read without taking it off.
    pub fn stored(&self, queue: &str) -> u64 {
        Store::open(&self.data_dir).unwrap().depth(queue).unwrap()
    }

    /// Take everything off `queue`.
    pub fn receive_all(&self, queue: &str) -> Vec<StoredMessage> {
        let mut out = Vec::new();
        Store::open(&self.data_dir)
            .unwrap()
            .receive(queue, usize::MAX >> 1, |m| {
                out.push(m.clone());
                Ok(())
            })
            .unwrap();
        out
    }

    /// Start one send while sends are held (`faults().hold_sends(true)`) and wait until it is
    /// in flight; the task answers its status once released.
    pub async fn hold_one_send(&self) -> tokio::task::JoinHandle<reqwest::StatusCode> {
        let (client, url) = (
            self.client.clone(),
            self.url("/v1/queues/requests/messages"),
        );
        let held = tokio::spawn(async move {
            client
                .post(url)
                .header("Content-Type", "application/json")
                .body("1")
                .send()
                .await
                .unwrap()
                .status()
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.detailed().await["backends"]["primary"]["sends_in_flight"] != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the held send never got in flight"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        held
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
