//! Spawn sendgate on the RabbitMQ backend, on a random port, serving one fresh queue.

#![allow(dead_code)] // shared by two test binaries, each using part of it

use std::collections::HashMap;
use std::time::Duration;

use sendgate::config::Settings;
use sendgate::startup::{AppHandle, Application};

use crate::rabbit;

pub struct RabbitApp {
    pub address: String,
    pub queue: String,
    pub handle: AppHandle,
    pub client: reqwest::Client,
}

/// sendgate on the real broker, serving `queue`, with these variables on top.
pub async fn spawn(queue: &str, vars: &[(&str, &str)]) -> RabbitApp {
    rabbit::ensure_broker();
    let mut env: HashMap<String, String> = HashMap::from([
        ("SENDGATE_LISTEN".into(), "127.0.0.1:0".into()),
        ("SENDGATE_BACKEND".into(), "rabbitmq".into()),
        ("SENDGATE_QUEUES".into(), queue.into()),
        ("SENDGATE_WORKERS".into(), "2".into()),
    ]);
    for (k, v) in vars {
        env.insert(k.to_string(), v.to_string());
    }
    let settings = Settings::from_vars(&env).expect("valid test settings");
    // With RUST_LOG set, sendgate's logs show (on stderr, not captured by the harness).
    if std::env::var_os("RUST_LOG").is_some() {
        sendgate::telemetry::init(settings.log_format);
    }
    let app = Application::build(settings).await.expect("sendgate starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    tokio::spawn(app.run_until_stopped(false));
    handle.lifecycle.started().await;
    RabbitApp {
        address,
        queue: queue.to_owned(),
        handle,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
    }
}

impl RabbitApp {
    pub async fn send(&self, body: &str) -> reqwest::Response {
        self.send_with(body, &[]).await
    }

    pub async fn send_with(&self, body: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self
            .client
            .post(format!(
                "{}/v1/queues/{}/messages",
                self.address, self.queue
            ))
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("sendgate answers")
    }

    pub async fn status(&self, body: &str) -> u16 {
        self.send(body).await.status().as_u16()
    }

    pub async fn detailed(&self) -> serde_json::Value {
        self.client
            .get(format!("{}/health/detailed", self.address))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn in_flight(&self) -> u64 {
        self.detailed().await["backends"]["primary"]["sends_in_flight"]
            .as_u64()
            .unwrap()
    }
}

pub fn retry_after(r: &reqwest::Response) -> Option<u64> {
    r.headers()
        .get("Retry-After")
        .map(|v| v.to_str().unwrap().parse().unwrap())
}
