//! A RabbitMQ node of a test's own: its own name, ports, data and log, so a test may alarm,
//! stop or restart it without touching the shared broker or another test.
//!
//! Nodes start one at a time within a test binary: an Erlang node's boot takes both of this
//! machine's cores for several seconds, and two booting at once beside the rest of the suite
//! were seen to miss a minute's limit. A node that does not come up names its log's last
//! lines in the failure, so the cause is in the test's output.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::gateway::free_port;
use crate::rabbit::unique;

/// Held while a node boots.
static BOOTING: Mutex<()> = Mutex::new(());

/// How long a node may take from `rabbitmq-server -detached` to taking connections.
const BOOT_LIMIT: Duration = Duration::from_secs(150);

/// A private node, stopped and its files removed when dropped.
pub struct RabbitNode {
    name: String,
    port: u16,
    dist_port: u16,
    dir: PathBuf,
}

impl RabbitNode {
    /// Starts a node and returns once it takes AMQP connections and has finished booting.
    ///
    /// # Panics
    /// If the node does not come up within the limit: the panic carries its log's tail.
    #[must_use]
    pub fn start() -> Self {
        crate::ensure::rabbitmq(); // the package is installed
        let _one_at_a_time = BOOTING.lock();
        let node = Self {
            name: format!("sg-{}@localhost", unique("node")),
            port: free_port(),
            dist_port: free_port(),
            dir: std::env::temp_dir().join(unique("sg-node")),
        };
        node.write_files();
        let started = node.command("rabbitmq-server").arg("-detached").status();
        assert!(
            started.is_ok_and(|s| s.success()),
            "the private node's server script failed: {}",
            node.log_tail()
        );
        let since = Instant::now();
        while !node.listening() {
            assert!(
                since.elapsed() < BOOT_LIMIT,
                "the private node {} never listened on {} within {BOOT_LIMIT:?}: {}",
                node.name,
                node.port,
                node.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            node.ctl(&["await_startup"]),
            "await_startup failed: {}",
            node.log_tail()
        );
        node
    }

    /// The node's configuration, owned by the `rabbitmq` user the server script runs as.
    fn write_files(&self) {
        let d = |leaf: &str| self.dir.join(leaf);
        std::fs::create_dir_all(&self.dir).expect("the node's folder");
        std::fs::write(d("env.conf"), "ERL_EPMD_ADDRESS=127.0.0.1\n").expect("env.conf");
        std::fs::write(d("plugins"), "[].\n").expect("the plugins file");
        std::fs::write(
            d("rabbitmq.conf"),
            format!(
                "listeners.tcp.local = 127.0.0.1:{}\nloopback_users = none\n",
                self.port
            ),
        )
        .expect("rabbitmq.conf");
        let chown = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&self.dir)
            .status();
        assert!(
            chown.is_ok_and(|s| s.success()),
            "chown of the node's folder"
        );
    }

    fn command(&self, program: &str) -> Command {
        let d = |leaf: &str| self.dir.join(leaf);
        let mut c = Command::new(program);
        c.env("RABBITMQ_CONF_ENV_FILE", d("env.conf"))
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d("mnesia"))
            .env("RABBITMQ_LOG_BASE", d("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d("plugins"))
            .env("RABBITMQ_CONFIG_FILE", d("rabbitmq"))
            .env("RABBITMQ_PID_FILE", d("pid"))
            .env("ERL_FLAGS", "-kernel inet_dist_use_interface {127,0,0,1}")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// Runs `rabbitmqctl` on this node; whether it succeeded.
    pub fn ctl(&self, args: &[&str]) -> bool {
        self.command("rabbitmqctl")
            .args(["-q", "-n", &self.name])
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Raises (`on`) or clears the node's memory alarm through its high watermark.
    ///
    /// # Panics
    /// If `rabbitmqctl` fails.
    pub fn alarm(&self, on: bool) {
        let mark = if on { "0.0000001" } else { "0.4" };
        assert!(self.ctl(&["set_vm_memory_high_watermark", mark]));
    }

    /// Stops the RabbitMQ application (the Erlang node stays up): connections are refused.
    ///
    /// # Panics
    /// If `rabbitmqctl` fails.
    pub fn stop_app(&self) {
        assert!(self.ctl(&["stop_app"]), "rabbitmqctl stop_app");
    }

    /// Starts the application again and returns once it takes connections.
    ///
    /// # Panics
    /// If `rabbitmqctl` fails or the node does not listen within the limit.
    pub fn start_app(&self) {
        assert!(self.ctl(&["start_app"]), "rabbitmqctl start_app");
        let since = Instant::now();
        while !self.listening() {
            assert!(since.elapsed() < BOOT_LIMIT, "{}", self.log_tail());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn listening(&self) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
    }

    /// The AMQP URL of the node's default vhost.
    #[must_use]
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// The messages `queue` holds (ready and unacknowledged), 0 for a queue it lacks.
    ///
    /// # Panics
    /// If `rabbitmqctl` cannot be run.
    #[must_use]
    pub fn messages(&self, queue: &str) -> u64 {
        let out = self
            .command("rabbitmqctl")
            .args(["-q", "-n", &self.name, "list_queues", "name", "messages"])
            .stdout(Stdio::piped())
            .output()
            .expect("rabbitmqctl list_queues");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .find(|(name, _)| *name == queue)
            .and_then(|(_, n)| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The last lines of the node's logs, for a failure message.
    fn log_tail(&self) -> String {
        let Ok(entries) = std::fs::read_dir(self.dir.join("log")) else {
            return "(no log folder)".into();
        };
        let mut tail = String::new();
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(30);
            tail.push_str(&format!("\n--- {}\n", entry.path().display()));
            tail.push_str(&lines[from..].join("\n"));
        }
        tail
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.ctl(&["stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
