//! The real local Redis, for tests: give each test a prefix of its own and remove that
//! prefix's keys afterwards.

use std::process::Command;
use std::time::Duration;

use sendgate::config::{KeyPrefix, RedisAuth, RedisSettings, Secret};

pub const ADDR: &str = "127.0.0.1:6379";

/// A prefix no other test (nor an earlier run) uses.
pub fn unique_prefix() -> String {
    format!(
        "sgtest:{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub fn settings(url: &str, prefix: &str, timeout: Duration) -> RedisSettings {
    RedisSettings {
        url: Secret::wrap(reqwest::Url::parse(url).expect("test URL")),
        auth: RedisAuth::Url,
        prefix: KeyPrefix::parse(prefix).expect("test prefix"),
        timeout,
        max_replicas: 10,
    }
}

/// Deletes every key under the prefix when dropped (also when the test fails).
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let pattern = format!("{}:*", self.0);
        let Ok(out) = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                "6379",
                "--scan",
                "--pattern",
                &pattern,
            ])
            .output()
        else {
            return;
        };
        let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        if !keys.is_empty() {
            let _ = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", "6379", "DEL"])
                .args(&keys)
                .output();
        }
    }
}

/// Every key under the prefix and its remaining time to live in ms (-1: none).
pub fn keys_and_ttls(prefix: &str) -> Vec<(String, i64)> {
    let pattern = format!("{prefix}:*");
    let out = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            "6379",
            "--scan",
            "--pattern",
            &pattern,
        ])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|key| {
            let ttl = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", "6379", "PTTL", key])
                .output()
                .expect("redis-cli");
            let ttl = String::from_utf8_lossy(&ttl.stdout)
                .trim()
                .parse()
                .unwrap_or(-3);
            (key.to_owned(), ttl)
        })
        .collect()
}

/// Run a raw command through redis-cli (to plant malformed state).
pub fn cli(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", "6379"])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
