//! `sendgate queue receive|complete|depth`: use the embedded queue from another process
//! while the server runs (SQLite in WAL mode lets both work at once).
//!
//! Two ways to receive, as Service Bus and SQS offer: receive-and-delete (the default),
//! and peek-lock (`--lock-s N`), which leases messages and prints a lock token per
//! message; `complete` deletes them. An unfinished lease makes them deliverable again.
//!
//! Each line carries the message's attributes under a batch entry's field names
//! (`subject`, `session_id`, `partition_key`, `time_to_live_s`, `scheduled_enqueue_time`,
//! `reply_to`, `to`, `properties`), only those it has. The properties the gateway added
//! (`traceparent`, `tracestate`, `Diagnostic-Id`) are printed inside `properties`, beside
//! the caller's, as a Service Bus or RabbitMQ consumer finds them among the application
//! properties (a caller cannot use those names). `expires_at` shows when a message with a
//! time to live expires.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use serde::Serialize;
use serde_json::value::RawValue;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use sendgate_wire::MessageAttributes;

use crate::backend::embedded::{database_path, LeasedMessage, Store, StoreError, StoredMessage};
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
        /// Peek-lock: lease the messages for this many seconds (1 to 300) and print a
        /// lock token each, instead of deleting them; `queue complete` deletes them.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=300))]
        lock_s: Option<u64>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete messages received with `--lock-s`, by lock token, while their lease holds.
    Complete {
        #[arg(long)]
        queue: String,
        /// One or more lock tokens, as `receive --lock-s` printed them.
        #[arg(long = "lock-token", required = true, num_args = 1..)]
        lock_tokens: Vec<String>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Print how many messages are in a queue (leased ones included, until completed).
    Depth {
        #[arg(long)]
        queue: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// Which embedded store a command reads.
#[derive(clap::Args)]
pub struct StoreArgs {
    /// The store's directory; defaults to the embedded backend's SENDGATE_DATA_DIR (or
    /// SENDGATE_FALLBACK_DATA_DIR), itself ./sendgate-data when unset.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Make an empty store there if there is none. Without it a directory holding no
    /// store is refused: a wrong one would read as an empty queue.
    #[arg(long)]
    create: bool,
}

#[derive(Serialize)]
struct ReceivedLine<'a> {
    queue: &'a str,
    message_id: &'a str,
    correlation_id: Option<&'a str>,
    enqueued_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
    delivery_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    lock_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    locked_until: Option<String>,
    #[serde(flatten)]
    attributes: MessageAttributes,
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
    let (queue, store_args) = match &command {
        QueueCommand::Receive { queue, store, .. }
        | QueueCommand::Complete { queue, store, .. }
        | QueueCommand::Depth { queue, store } => (queue, store),
    };
    let queue = QueueName::parse(queue).map_err(|e| (2, format!("--queue: {e}")))?;
    let mut store = open_store(store_args)?;
    match command {
        QueueCommand::Depth { .. } => {
            let n = store
                .depth(queue.as_str())
                .map_err(|e| (1, e.to_string()))?;
            println!("{n}");
        }
        QueueCommand::Receive { max, lock_s, .. } => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match lock_s {
                None => store
                    .receive(queue.as_str(), max, |m| {
                        writeln!(out, "{}", render(m, None)?)?;
                        out.flush()
                    })
                    .map(|_| ()),
                Some(seconds) => peek_lock(&mut store, &queue, max, seconds, &mut out),
            }
            .map_err(|e| (1, e.to_string()))?;
        }
        QueueCommand::Complete { lock_tokens, .. } => complete(&mut store, &queue, &lock_tokens)?,
    }
    Ok(())
}

/// Where the store is: `--data-dir`, else the settings' embedded data directory, and
/// whether that is the variable's default (said on stderr, as no one chose it).
fn store_dir(args: &StoreArgs) -> Result<(PathBuf, bool), (u8, String)> {
    if let Some(dir) = &args.data_dir {
        return Ok((dir.clone(), false));
    }
    let settings = Settings::from_env().map_err(|e| (2, e.to_string()))?;
    let dir = settings.embedded_data_dir().ok_or((
        2,
        "no embedded backend is configured: pass --data-dir".to_owned(),
    ))?;
    let default = crate::config::vars::DATA_DIR
        .default
        .is_some_and(|d| Path::new(d) == dir);
    Ok((dir.to_owned(), default))
}

/// The store the command reads: refused where there is none, unless `--create`.
fn open_store(args: &StoreArgs) -> Result<Store, (u8, String)> {
    let (dir, default) = store_dir(args)?;
    let shown = dir.display();
    let whose = if default {
        " (SENDGATE_DATA_DIR is not set: its default)"
    } else {
        ""
    };
    if !args.create && !database_path(&dir).is_file() {
        return Err((
            1,
            format!(
                "no embedded store at {shown}{whose}: point SENDGATE_DATA_DIR or --data-dir at the gateway's, or pass --create to make an empty one"
            ),
        ));
    }
    if default {
        eprintln!("sendgate: the embedded store at {shown}{whose}");
    }
    Store::open(&dir).map_err(|e| (1, e.to_string()))
}

fn peek_lock(
    store: &mut Store,
    queue: &QueueName,
    max: usize,
    seconds: u64,
    out: &mut impl Write,
) -> Result<(), StoreError> {
    let leased = store.lease(queue.as_str(), max, Duration::from_secs(seconds))?;
    for l in &leased {
        writeln!(out, "{}", render(&l.message, Some(l))?)?;
    }
    out.flush()?;
    Ok(())
}

/// Exit 1 when any token's lock was lost: its message may be handed out again.
fn complete(store: &mut Store, queue: &QueueName, tokens: &[String]) -> Result<(), (u8, String)> {
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let done = store
        .complete(queue.as_str(), &tokens)
        .map_err(|e| (1, e.to_string()))?;
    let lost: Vec<&str> = tokens
        .iter()
        .zip(&done)
        .filter(|(_, ok)| !**ok)
        .map(|(t, _)| *t)
        .collect();
    if lost.is_empty() {
        return Ok(());
    }
    Err((
        1,
        format!(
            "lock lost (lease ended, or no such token in {}) for {}: the message may be delivered again",
            queue.as_str(),
            lost.join(", ")
        ),
    ))
}

/// One line per message. The body was valid JSON when it was accepted; line breaks between
/// its tokens (pretty-printed input) become spaces so it stays on one line — the same JSON
/// value. The stored bytes themselves are untouched.
fn render(m: &StoredMessage, lease: Option<&LeasedMessage>) -> std::io::Result<String> {
    // Accepted bodies are valid UTF-8 JSON (checked at the door); anything else is reported.
    let text = std::str::from_utf8(&m.body)
        .map_err(std::io::Error::other)?
        .replace(['\r', '\n'], " ");
    let body = RawValue::from_string(text).map_err(std::io::Error::other)?;
    let enqueued_at = rfc3339(m.enqueued_at_ms);
    // The gateway's names are reserved, so none of them can hide one of the caller's.
    let mut attributes = m.attributes.clone();
    attributes.properties.extend(
        m.trace_properties
            .iter()
            .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone()))),
    );
    serde_json::to_string(&ReceivedLine {
        queue: &m.queue,
        message_id: &m.message_id,
        correlation_id: m.correlation_id.as_deref(),
        enqueued_at,
        expires_at: m.expires_at_ms.map(rfc3339),
        delivery_count: m.delivery_count,
        lock_token: lease.map(|l| l.lock_token.as_str()),
        locked_until: lease.map(|l| rfc3339(l.locked_until_ms)),
        attributes,
        body: &body,
    })
    .map_err(std::io::Error::other)
}

fn rfc3339(unix_ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}
