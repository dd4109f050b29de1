//! The rabbitmq suites' gateway: the in-process [`Gateway`] on the RabbitMQ backend,
//! serving one fresh queue; and that backend alone.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sendgate::backend::{Backend, OutgoingMessage};
use sendgate::domain::{Attributes, MessageId, QueueName, Raw};
use sendgate::startup::Backends;
use tokio::time::Instant;

use crate::gateway::{settings_of, Gateway};

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
    crate::ensure::rabbitmq();
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

/// The RabbitMQ backend itself (no gateway around it), serving `queue`, connected and the
/// queue declared; the depth read over AMQP (these tests never read the admin plane).
pub async fn backend(queue: &str, vars: &[(&str, &str)]) -> Arc<dyn Backend> {
    crate::ensure::rabbitmq();
    let settings = settings_of(&[
        &[
            ("SENDGATE_BACKEND", "rabbitmq"),
            ("SENDGATE_QUEUES", queue),
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ],
        vars,
    ]);
    let backend = Backends::open(&settings)
        .expect("the backend opens")
        .primary;
    backend
        .warm_up(Instant::now() + Duration::from_secs(10))
        .await
        .expect("connected to the broker");
    backend
}

/// A message for `queue` with this id and body and the attributes of a batch entry's
/// fields (`{}`: none), in a trace of its own.
pub fn message(
    queue: &str,
    id: &str,
    body: &str,
    attributes: serde_json::Value,
) -> OutgoingMessage {
    let fields = attributes
        .as_object()
        .expect("attributes as a JSON object")
        .clone();
    let mut m = OutgoingMessage::new(
        QueueName::parse(queue).expect("a valid queue name"),
        MessageId::parse(id).expect("a valid message id"),
        None,
        Bytes::from(body.to_owned()),
    );
    m.attributes = Arc::new(
        Attributes::parse(|f| fields.get(f.json_name()).map(Raw::Json)).expect("valid attributes"),
    );
    m
}

/// A deadline this far from now, on the clock the backend reads.
pub fn deadline_in(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}
