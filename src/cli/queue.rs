//! `sendgate queue receive|depth`: use the embedded queue from another process while the
//! server runs (SQLite in WAL mode lets both work at once).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use serde::Serialize;
use serde_json::value::RawValue;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::backend::embedded::{Store, StoredMessage};
use crate::config::Settings;
use crate::domain::QueueName;

#[derive(Subcommand)]
pub enum QueueCommand {
    /// Take messages off a queue, oldest first, printing one JSON line each.
    Receive {
        #[arg(long)]
        queue: String,
        /// Most messages to take.
        #[arg(long, default_value_t = 1)]
        max: usize,
        /// Defaults to the embedded backend's SENDGATE_DATA_DIR (or SENDGATE_FALLBACK_DATA_DIR).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Print how many messages wait in a queue.
    Depth {
        #[arg(long)]
        queue: String,
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Serialize)]
struct ReceivedLine<'a> {
    queue: &'a str,
    message_id: &'a str,
    correlation_id: Option<&'a str>,
    enqueued_at: String,
    body: &'a RawValue,
}

pub fn run(command: QueueCommand) -> ExitCode {
    match execute(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("sendgate: {message}");
            ExitCode::from(code)
        }
    }
}

fn execute(command: QueueCommand) -> Result<(), (u8, String)> {
    let (queue, data_dir) = match &command {
        QueueCommand::Receive {
            queue, data_dir, ..
        }
        | QueueCommand::Depth { queue, data_dir } => (queue, data_dir),
    };
    let queue = QueueName::parse(queue).map_err(|e| (2, format!("--queue: {e}")))?;
    let data_dir = match data_dir {
        Some(d) => d.clone(),
        None => Settings::from_env()
            .map_err(|e| (2, e.to_string()))?
            .embedded_data_dir()
            .ok_or((
                2,
                "no embedded backend is configured: pass --data-dir".to_owned(),
            ))?
            .to_owned(),
    };
    let mut store = Store::open(&data_dir).map_err(|e| (1, e.to_string()))?;
    match command {
        QueueCommand::Depth { .. } => {
            let n = store
                .depth(queue.as_str())
                .map_err(|e| (1, e.to_string()))?;
            println!("{n}");
        }
        QueueCommand::Receive { max, .. } => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            store
                .receive(queue.as_str(), max, |m| {
                    writeln!(out, "{}", render(m)?)?;
                    out.flush()
                })
                .map_err(|e| (1, e.to_string()))?;
        }
    }
    Ok(())
}

/// One line per message. The body was valid JSON when it was accepted; line breaks between
/// its tokens (pretty-printed input) become spaces so it stays on one line — the same JSON
/// value. The stored bytes themselves are untouched.
fn render(m: &StoredMessage) -> std::io::Result<String> {
    // Accepted bodies are valid UTF-8 JSON (checked at the door); anything else is reported.
    let text = std::str::from_utf8(&m.body)
        .map_err(std::io::Error::other)?
        .replace(['\r', '\n'], " ");
    let body = RawValue::from_string(text).map_err(std::io::Error::other)?;
    let enqueued_at =
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(m.enqueued_at_ms) * 1_000_000)
            .ok()
            .and_then(|t| t.format(&Rfc3339).ok())
            .unwrap_or_default();
    serde_json::to_string(&ReceivedLine {
        queue: &m.queue,
        message_id: &m.message_id,
        correlation_id: m.correlation_id.as_deref(),
        enqueued_at,
        body: &body,
    })
    .map_err(std::io::Error::other)
}
