//! A redis-server of the test's own, on a free loopback port: nothing else shares it, so a
//! test may kill it, start it again empty on the same port, flush it or delete keys from it
//! without touching any other test's state (the shared Redis on 6379 is `local_redis.rs`).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Start an empty redis-server (no persistence) on a free port, answering PING when
    /// returned.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self {
            port,
            dir: tempfile::tempdir().expect("a data directory"),
            child: None,
        };
        server.spawn().await;
        server
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL the server (no goodbye, nothing saved), then start a new, empty one on the
    /// same port; returns once it answers PING.
    pub async fn restart_empty(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// Run a command through redis-cli against this server; its output, trimmed.
    pub async fn cli(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .await
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts (scripts/ensure-redis.sh installs it)");
        self.child = Some(child);
        let started = Instant::now();
        while self.cli(&["PING"]).await != "PONG" {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("redis-server on port {} exited: {status}", self.port);
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server on port {} never answered PING",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
