//! The runtime settings over a real file store and a dispatcher of idle backends: what the
//! start-up check puts in force when the store cannot be written.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use tokio::time::Instant;

use super::*;
use crate::admission::assemble::{assemble, Assembled};
use crate::admission::tenants::Tenants;
use crate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::config::vars;
use crate::domain::QueueName;

/// A broker that is never asked: the gates are only read.
struct Idle;

#[async_trait]
impl Backend for Idle {
    fn kind(&self) -> &'static str {
        "idle"
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        Ok(SendReceipt { duplicate: false })
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        Ok(Backlog::of(0))
    }
}

/// Local mode on `data` with the ceiling `ceiling`: the settings, read from the file, in
/// force on a dispatcher of their own.
fn local(data: &Path, ceiling: &str) -> (RuntimeSettings, Dispatcher) {
    let settings = Settings::from_overrides(&[
        (&vars::DATA_DIR, data.to_str().expect("a UTF-8 path")),
        (&vars::SERVICEBUS_SEND_MAX_QUEUE_DEPTH, ceiling),
    ])
    .expect("settings");
    let coordination = Coordination::Local {
        since: SystemTime::now(),
    };
    let Assembled { dispatcher, .. } = assemble(
        &settings,
        Arc::new(Idle),
        None,
        &Tenants::open(),
        &coordination,
    );
    let runtime = RuntimeSettings::open(&settings, &coordination).expect("the file reads");
    runtime.apply(&dispatcher);
    (runtime, dispatcher)
}

fn limit(dispatcher: &Dispatcher) -> u64 {
    let queue = QueueName::parse("requests").expect("a queue name");
    let gate = dispatcher.primary().gate(&queue).expect("the queue's gate");
    gate.policy_cell().load().limit
}

const SETTING: &str = "queues.requests.max_queue_depth";

/// Issue 41's review: with `config_change`, an override made against another ceiling is
/// not in force after a restart even when the store cannot drop it; the failure is logged
/// (`settings_lapse_drop_failed`) and the drop is made at the next read.
#[tokio::test]
async fn a_lapsed_override_the_file_cannot_drop_is_not_in_force_and_dropped_later() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    let (first, dispatcher) = local(&data, "500");
    let patch = Patch::parse(
        &serde_json::json!({"queues": {"requests": {"max_queue_depth": 3}}}),
        first.scope(),
    )
    .expect("a patch");
    first
        .patch(&dispatcher, &patch, "ops")
        .await
        .expect("stored");
    assert_eq!(limit(&dispatcher), 3);

    // The deployment raised the ceiling; the file's directory is now a file, so the
    // override read at open cannot be dropped from it.
    let (raised, dispatcher) = local(&data, "600");
    assert_eq!(limit(&dispatcher), 3, "in force until the start-up check");
    let moved = dir.path().join("moved");
    std::fs::rename(&data, &moved).expect("moved aside");
    std::fs::write(&data, "not a directory").expect("a file in its place");

    let out = crate::telemetry::Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(out.clone())
        .finish();
    let logging = crate::telemetry::Captured::install(subscriber);
    raised.sync(&dispatcher).await;
    drop(logging);

    assert_eq!(limit(&dispatcher), 600, "the deployment wins");
    assert!(raised
        .overrides()
        .get(&Key::parse_flat(SETTING).unwrap())
        .is_none());
    assert_eq!(raised.lapsed().len(), 1, "{:?}", raised.lapsed());
    assert!(!raised.health().ok, "the store's failure is shown");
    assert!(
        raised.needs_sync(),
        "local mode: the drop is still to be retried"
    );
    let text = out.text();
    assert!(text.contains("\"settings_lapse_drop_failed\""), "{text}");
    assert!(text.contains(SETTING), "{text}");

    // The store is back: the next read drops the override from it.
    std::fs::remove_file(&data).expect("the file removed");
    std::fs::rename(&moved, &data).expect("moved back");
    let file = std::fs::read_to_string(data.join(store::FILE_NAME)).expect("the file");
    assert!(file.contains(SETTING), "still stored: {file}");
    raised.sync(&dispatcher).await;
    let file = std::fs::read_to_string(data.join(store::FILE_NAME)).expect("the file");
    assert!(!file.contains(SETTING), "dropped at the next read: {file}");
    assert!(raised.health().ok);
    assert_eq!(limit(&dispatcher), 600);
    assert!(!raised.needs_sync(), "local mode: nothing left to poll for");
}
