//! The rabbitmq suites' gateway: the shared harness on the RabbitMQ backend, serving one
//! fresh queue.

#![allow(dead_code)] // shared by two test binaries, each using part of it

use std::ops::Deref;

pub use crate::gateway::retry_after;
use crate::gateway::{settings_of, Gateway};
use crate::rabbit;

pub struct RabbitApp {
    gateway: Gateway,
    pub queue: String,
}

impl Deref for RabbitApp {
    type Target = Gateway;

    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}

/// sendgate on the real broker, serving `queue`, with these variables on top.
pub async fn spawn(queue: &str, vars: &[(&str, &str)]) -> RabbitApp {
    rabbit::ensure_broker();
    let settings = settings_of(&[
        &[
            ("SENDGATE_BACKEND", "rabbitmq"),
            ("SENDGATE_QUEUES", queue),
            // The RabbitMQ suites observe the probes on /health/detailed.
            ("SENDGATE_PROBE_INTERVAL_S", "5"),
        ],
        vars,
    ]);
    RabbitApp {
        gateway: Gateway::start(settings).await,
        queue: queue.to_owned(),
    }
}

impl RabbitApp {
    pub async fn send(&self, body: &str) -> reqwest::Response {
        self.gateway.send(&self.queue, body).await
    }

    pub async fn send_with(&self, body: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        self.gateway.send_with(&self.queue, body, headers).await
    }

    pub async fn status(&self, body: &str) -> u16 {
        self.send(body).await.status().as_u16()
    }
}
