//! The api and client suites' gateway: the in-process [`Gateway`] on the embedded backend,
//! with a data directory of its own and a look at what is on disk.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sendgate::backend::embedded::{Store, StoredMessage};

use crate::faulty_backend::FaultyBackend;
use crate::gateway::{settings_of, Gateway};

pub struct TestApp {
    gateway: Gateway,
    pub data_dir: PathBuf,
    /// Backend calls made by start-up (each queue's first depth read).
    calls_at_start: u64,
    /// Keeps the temporary directory alive for as long as the app.
    _dir: Option<Arc<tempfile::TempDir>>,
}

impl Deref for TestApp {
    type Target = Gateway;

    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// Spawn with these variables on top of the harness defaults, in a fresh data directory.
pub async fn spawn_app_with(vars: &[(&str, &str)]) -> TestApp {
    let dir = Arc::new(tempfile::tempdir().expect("temporary directory"));
    let mut app = spawn_in(dir.path(), vars).await;
    app._dir = Some(dir);
    app
}

/// Spawn on an existing data directory (to prove messages survive a restart).
pub async fn spawn_in(data_dir: &Path, vars: &[(&str, &str)]) -> TestApp {
    let dir = data_dir.display().to_string();
    let settings = settings_of(&[&[("SENDGATE_DATA_DIR", dir.as_str())], vars]);
    let gateway = Gateway::start(settings).await;
    TestApp {
        calls_at_start: gateway.primary.total_calls(),
        gateway,
        data_dir: data_dir.to_owned(),
        _dir: None,
    }
}

impl TestApp {
    /// The primary backend's fault switches.
    pub fn faults(&self) -> Arc<FaultyBackend> {
        self.primary.clone()
    }

    /// Backend calls since start-up finished.
    pub fn backend_calls(&self) -> u64 {
        self.primary.total_calls() - self.calls_at_start
    }

    /// What is on disk in `queue`, read without taking it off.
    pub fn stored(&self, queue: &str) -> u64 {
        Store::open(&self.data_dir).unwrap().depth(queue).unwrap()
    }

    /// Take up to `n` messages off `queue` (a consumer); how many there were.
    pub fn receive(&self, queue: &str, n: usize) -> usize {
        Store::open(&self.data_dir)
            .unwrap()
            .receive(queue, n, |_| Ok(()))
            .unwrap()
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
        self.wait_in_flight(1).await;
        held
    }

    /// Wait for the server to stop on its own (after a drain started elsewhere).
    pub async fn wait_stopped(self, limit: Duration) {
        self.gateway.wait_stopped(limit).await
    }

    /// Drain and stop the server, waiting until it has let go of its port.
    pub async fn stop(self) {
        self.gateway.stop().await
    }
}
