//! The real local RabbitMQ, for tests: talk to it directly (not through sendgate) to
//! declare, fill, drain and count queues and to change permissions.

use std::process::Command;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

pub const AMQP: &str = "127.0.0.1:5672";
pub const MANAGEMENT: &str = "127.0.0.1:15672";

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub async fn connect() -> Connection {
    crate::ensure::rabbitmq();
    Connection::connect(
        &format!("amqp://guest:guest@{AMQP}/%2f"),
        ConnectionProperties::default(),
    )
    .await
    .expect("direct AMQP connection")
}

/// Declare a durable queue with optional arguments (e.g. `x-max-length`).
pub async fn declare(queue: &str, args: &[(&str, AMQPValue)]) {
    let conn = connect().await;
    let ch = conn.create_channel().await.unwrap();
    let mut table = FieldTable::default();
    for (k, v) in args {
        table.insert(ShortString::from(*k), v.clone());
    }
    ch.queue_declare(queue.into(), QueueDeclareOptions::durable(), table)
        .await
        .unwrap();
    let _ = conn.close(200, "bye".into()).await;
}

/// Publish `n` persistent messages straight to the queue (not through sendgate).
pub async fn fill(queue: &str, n: usize) {
    let conn = connect().await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    for i in 0..n {
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            format!("{{\"prefill\":{i}}}").as_bytes(),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let _ = conn.close(200, "bye".into()).await;
}

/// Ready messages, exactly (passive declare).
pub async fn ready(queue: &str) -> u32 {
    let conn = connect().await;
    let ch = conn.create_channel().await.unwrap();
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = conn.close(200, "bye".into()).await;
    q.message_count()
}

/// Take up to `n` messages off the queue (get + ack).
pub async fn take(queue: &str, n: usize) -> Vec<lapin::message::BasicGetMessage> {
    let conn = connect().await;
    let ch = conn.create_channel().await.unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        match ch
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            Some(m) => {
                m.delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .unwrap();
                out.push(m);
            }
            None => break,
        }
    }
    let _ = conn.close(200, "bye".into()).await;
    out
}

/// Wait until the management API reports `n` messages for `queue` (its statistics lag).
pub async fn wait_for_management_count(queue: &str, n: u64) {
    let url = format!("http://{MANAGEMENT}/api/queues/%2F/{queue}?columns=messages");
    sendgate::tls::install_ring();
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    loop {
        let body: serde_json::Value = match client
            .get(&url)
            .basic_auth("guest", Some("guest"))
            .send()
            .await
        {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        if body.get("messages").and_then(|m| m.as_u64()) == Some(n) {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "management never reported {n} for {queue}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

pub async fn delete(queue: &str) {
    let conn = connect().await;
    let ch = conn.create_channel().await.unwrap();
    let _ = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    let _ = conn.close(200, "bye".into()).await;
}

pub fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A broker user of the test's own, deleted when dropped.
pub struct TempUser {
    pub name: String,
    pub password: String,
}

impl TempUser {
    /// A user with full permissions on `/` and these tags (e.g. `["monitoring"]`).
    pub fn new(tags: &[&str]) -> Self {
        crate::ensure::rabbitmq();
        let name = unique("sendgate-test");
        let password = unique("pw");
        rabbitmqctl(&["add_user", &name, &password]);
        rabbitmqctl(&["set_permissions", "-p", "/", &name, ".*", ".*", ".*"]);
        let user = Self { name, password };
        user.set_tags(tags);
        user
    }

    /// A user that exists but may do nothing on `/`.
    pub fn without_permissions() -> Self {
        crate::ensure::rabbitmq();
        let name = unique("sendgate-test");
        let password = unique("pw");
        rabbitmqctl(&["add_user", &name, &password]);
        Self { name, password }
    }

    pub fn set_tags(&self, tags: &[&str]) {
        let mut args = vec!["set_user_tags", self.name.as_str()];
        args.extend_from_slice(tags);
        rabbitmqctl(&args);
    }

    pub fn amqp_url(&self, host_port: &str) -> String {
        format!("amqp://{}:{}@{host_port}/%2f", self.name, self.password)
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_user", &self.name])
            .output();
    }
}

/// Each channel of `user`'s connections as the management API counts it, busiest first:
/// (messages published on it, publishes it confirmed). The statistics trail by about a
/// refresh (`collect_statistics_interval`); a channel that published nothing counts 0.
pub async fn channel_publishes(user: &str) -> Vec<(u64, u64)> {
    sendgate::tls::install_ring();
    let channels: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "http://{MANAGEMENT}/api/channels?columns=user,number,message_stats"
        ))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .expect("the management API answers")
        .json()
        .await
        .expect("a JSON list of channels");
    let count = |c: &serde_json::Value, what: &str| c["message_stats"][what].as_u64().unwrap_or(0);
    let mut out: Vec<(u64, u64)> = channels
        .as_array()
        .expect("a JSON list of channels")
        .iter()
        .filter(|c| c["user"] == user)
        .map(|c| (count(c, "publish"), count(c, "confirm")))
        .collect();
    out.sort_unstable_by(|a, b| b.cmp(a));
    out
}
