//! `sendgate send`: one message per JSON line, from a file or stdin, through the producer
//! client (the `sendgate-client` crate): bounded concurrency, a progress bar on a terminal and plain lines
//! otherwise, a summary on stderr, and the exit status of the contract (section 7):
//! 0 every message queued, 1 some not, 2 a terminal authentication error (or a usage
//! error, like every other sendgate command).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use sendgate_client::retry::Backoff;
use sendgate_client::{
    code_label, AttemptError, Client, ClientConfig, ClientStats, QueueName, QueueNameError,
    SendOutcome,
};

/// The variable that holds the bearer token when `--token-file` is not given. Not a
/// server setting: the server never reads it.
pub const TOKEN_VARIABLE: &str = crate::config::vars::TOKEN.name;

#[derive(Args)]
pub struct SendArgs {
    /// The gateway's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    /// The queue to send to.
    #[arg(long)]
    queue: String,
    /// A file holding the bearer token (otherwise SENDGATE_TOKEN, if set).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Messages in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: u16,
    /// Longest time one message may wait (a drain, Retry-After, backoff), in seconds.
    /// A drain the gateway announces moves it: it then counts from the drain's end.
    #[arg(long, value_name = "SECONDS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    deadline: u64,
    /// The longest an announced drain may stretch --deadline to, in seconds from the send.
    #[arg(long, value_name = "SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    deadline_cap: u64,
    /// Attempts per message, the first included; a 429 queue_full with a Retry-After (the
    /// gateway pacing producers at a full queue) is not counted: the deadline bounds those.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    max_attempts: u32,
    /// JSON lines to send, one message each; `-` or nothing reads stdin.
    #[arg(value_name = "FILE|-")]
    input: Option<PathBuf>,
}

/// A usage problem: nothing was sent.
#[derive(Debug, thiserror::Error)]
enum UsageError {
    #[error("--queue: {0}")]
    Queue(#[from] QueueNameError),
    #[error("--token-file {path}: {source}")]
    TokenFile {
        path: String,
        source: std::io::Error,
    },
    #[error("--token-file {0}: the file is empty")]
    EmptyToken(String),
    #[error("--url: {0}")]
    Client(#[from] sendgate_client::ClientError),
    #[error("{path}: {source}")]
    Input {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

pub fn run(args: SendArgs) -> ExitCode {
    match prepare(&args) {
        Ok((client, queue, input)) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sendgate: {}", UsageError::Runtime(e));
                    return ExitCode::from(2);
                }
            };
            runtime.block_on(send_all(
                client,
                queue,
                input,
                usize::from(args.concurrency),
            ))
        }
        Err(e) => {
            eprintln!("sendgate: {e}");
            ExitCode::from(2)
        }
    }
}

fn prepare(args: &SendArgs) -> Result<(Client, QueueName, Box<dyn Read + Send>), UsageError> {
    let queue = QueueName::parse(&args.queue)?;
    let token = match &args.token_file {
        Some(path) => {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| UsageError::TokenFile {
                path: shown.clone(),
                source,
            })?;
            let token = text.trim();
            if token.is_empty() {
                return Err(UsageError::EmptyToken(shown));
            }
            Some(token.to_owned())
        }
        None => std::env::var(TOKEN_VARIABLE)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty()),
    };
    let mut config = ClientConfig::new(args.url.clone())
        .deadline(Duration::from_secs(args.deadline))
        .deadline_cap(Duration::from_secs(args.deadline_cap))
        .backoff(Backoff {
            max_attempts: args.max_attempts,
            ..Backoff::default()
        });
    config.token = token;
    config.max_concurrent_requests = usize::from(args.concurrency);
    let client = Client::new(config)?;
    let input: Box<dyn Read + Send> = match &args.input {
        None => Box::new(std::io::stdin()),
        Some(p) if p.as_os_str() == "-" => Box::new(std::io::stdin()),
        Some(p) => Box::new(File::open(p).map_err(|source| UsageError::Input {
            path: p.display().to_string(),
            source,
        })?),
    };
    Ok((client, queue, input))
}

/// One line of input: its number (from 1) and its bytes without the line break.
type Line = std::io::Result<(u64, Vec<u8>)>;

/// Read lines on a thread of its own (stdin has no async reader without more of tokio),
/// handing them over as they come, so a large file or an endless pipe is streamed.
fn read_lines(input: Box<dyn Read + Send>, room: usize) -> mpsc::Receiver<Line> {
    let (tx, rx) = mpsc::channel(room);
    std::thread::spawn(move || {
        let mut reader = BufReader::new(input);
        let mut number = 0u64;
        loop {
            let mut buf = Vec::new();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) => return,
                Ok(_) => {
                    number += 1;
                    if tx.blocking_send(Ok((number, buf))).is_err() {
                        return; // the sender stopped (authentication failure)
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    rx
}

async fn send_all(
    client: Client,
    queue: QueueName,
    input: Box<dyn Read + Send>,
    concurrency: usize,
) -> ExitCode {
    let mut lines = read_lines(input, concurrency * 2);
    let mut report = Report::new(std::io::stderr().is_terminal());
    let mut in_flight: JoinSet<(u64, SendOutcome)> = JoinSet::new();
    // The first message that reaches the gateway goes alone: if the token is refused, that
    // one request is all the run costs (the contract: stop at once on an auth error).
    let mut pilot_done = false;
    let mut read_error = None;

    'input: loop {
        // Outcomes are reported as they come, not only when a slot is needed: a producer
        // piping lines at its own pace sees each message's fate at once.
        let line = tokio::select! {
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                if report.finished(done) {
                    break 'input;
                }
                continue;
            }
            line = lines.recv() => match line {
                Some(line) => line,
                None => break,
            },
        };
        let (number, raw) = match line {
            Ok(l) => l,
            Err(e) => {
                read_error = Some(e);
                break;
            }
        };
        let body = raw.trim_ascii();
        if body.is_empty() {
            continue;
        }
        report.read += 1;
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            report.refused_locally(number, &e.to_string());
            continue;
        }
        let body = Bytes::copy_from_slice(body);
        if !pilot_done {
            let outcome = client.send(queue.as_str(), body, None).await;
            pilot_done = !matches!(outcome, SendOutcome::Invalid { .. });
            if report.record(number, outcome) {
                break 'input;
            }
            continue;
        }
        while in_flight.len() >= concurrency {
            if let Some(done) = in_flight.join_next().await {
                if report.finished(done) {
                    break 'input;
                }
            }
        }
        let (client, queue) = (client.clone(), queue.clone());
        in_flight.spawn(async move { (number, client.send(queue.as_str(), body, None).await) });
    }
    // Sends already on their way are waited for, also after an auth failure: each one's
    // outcome is then known and reported rather than guessed.
    drop(lines);
    while let Some(done) = in_flight.join_next().await {
        report.finished(done);
    }
    report.summary(client.stats(), read_error)
}

/// The tally, and what is shown while sending.
struct Report {
    bar: Option<ProgressBar>,
    read: u64,
    queued: u64,
    refused: BTreeMap<String, u64>,
    failed: BTreeMap<String, u64>,
    /// The first authentication failure ("401 unauthenticated"): the run stops on it.
    auth: Option<String>,
}

impl Report {
    fn new(terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {pos} sent in {elapsed} ({per_sec})  {msg}")
            {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Self {
            bar,
            read: 0,
            queued: 0,
            refused: BTreeMap::new(),
            failed: BTreeMap::new(),
            auth: None,
        }
    }

    /// A task ended (or panicked, which the client does not do on any input).
    fn finished(&mut self, done: Result<(u64, SendOutcome), tokio::task::JoinError>) -> bool {
        match done {
            Ok((number, outcome)) => self.record(number, outcome),
            Err(e) => {
                *self.failed.entry("internal error".into()).or_default() += 1;
                self.line(&format!("a send task ended abnormally: {e}"), true);
                false
            }
        }
    }

    /// Count one outcome; `true` when the run must stop (authentication failure).
    fn record(&mut self, number: u64, outcome: SendOutcome) -> bool {
        let problem = !matches!(outcome, SendOutcome::Queued { .. });
        let text = format!("line {number}: {outcome}");
        let stop = self.count(outcome);
        self.line(&text, problem);
        stop
    }

    fn count(&mut self, outcome: SendOutcome) -> bool {
        match outcome {
            SendOutcome::Queued { .. } => self.queued += 1,
            SendOutcome::Refused { status, code } => {
                let key = format!("{status} {}", code_label(status, code.as_ref()));
                *self.refused.entry(key).or_default() += 1
            }
            SendOutcome::Invalid { .. } => {
                *self.refused.entry("invalid (local)".into()).or_default() += 1
            }
            SendOutcome::Failed { last_error, .. } => {
                let key = match &last_error {
                    status @ AttemptError::Status { .. } => status.to_string(),
                    other => other.code(),
                };
                *self.failed.entry(key).or_default() += 1
            }
            SendOutcome::AuthFailed { status, code } => {
                let shown = format!("{status} {}", code_label(status, code.as_ref()));
                *self.failed.entry(shown.clone()).or_default() += 1;
                if self.auth.is_none() {
                    self.auth = Some(shown);
                }
                return true;
            }
        }
        false
    }

    fn refused_locally(&mut self, number: u64, why: &str) {
        *self
            .refused
            .entry("invalid_json (local)".into())
            .or_default() += 1;
        self.line(
            &format!("line {number}: refused locally, not sent: invalid_json: {why}"),
            true,
        );
    }

    /// On a terminal, problems are printed above the bar and successes only move it;
    /// otherwise every message gets a plain line.
    fn line(&self, text: &str, problem: bool) {
        match &self.bar {
            Some(bar) => {
                bar.inc(1);
                bar.set_message(format!(
                    "queued {} · refused {} · failed {}",
                    self.queued,
                    self.refused.values().sum::<u64>(),
                    self.failed.values().sum::<u64>()
                ));
                if problem {
                    bar.println(text);
                }
            }
            None => eprintln!("{text}"),
        }
    }

    fn summary(self, stats: ClientStats, read_error: Option<std::io::Error>) -> ExitCode {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let refused: u64 = self.refused.values().sum();
        let failed: u64 = self.failed.values().sum();
        eprintln!(
            "summary: {} message{}: {} queued, {refused} refused, {failed} failed",
            self.read,
            if self.read == 1 { "" } else { "s" },
            self.queued
        );
        for (code, n) in &self.refused {
            eprintln!("  refused {code}: {n}");
        }
        for (code, n) in &self.failed {
            eprintln!("  failed {code}: {n}");
        }
        eprintln!(
            "  requests {}, retries {}, retries refused by the budget {}, waits for a drain {}, lifecycle probes {}",
            stats.requests, stats.retries, stats.budget_refusals, stats.deferrals, stats.probes
        );
        if stats.probe_forbidden {
            eprintln!(
                "  note: the token may not read /health/detailed (no observer role), so a drain was only noticed when a send met it"
            );
        }
        if let Some(e) = &read_error {
            eprintln!("input: read error, the rest was not sent: {e}");
        }
        if let Some(refusal) = &self.auth {
            eprintln!(
                "stopped: the gateway refused the credential ({refusal}); the rest of the input was not sent"
            );
            return ExitCode::from(2);
        }
        if read_error.is_none() && self.queued == self.read {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}
