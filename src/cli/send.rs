//! `sendgate send`: one message per JSON line, from a file or stdin, through the producer
//! client (the `sendgate-client` crate): in batch requests of `--batch-size` lines (each
//! line alone on the single-send route with `--batch-size 1`), a line a bare body or, with
//! `--envelope`, a batch entry (`body`, ids, attributes); bounded concurrency, a progress
//! bar on a terminal and plain lines otherwise (with a line every [`QUIET_AT_MOST`] while
//! messages wait and nothing else was said), a summary on stderr, and the exit status
//! of the contract (section 7): 0 every message queued, 1 some not, 2 a terminal
//! authentication error (or a usage error, like every other sendgate command).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use sendgate_client::retry::{Backoff, BudgetConfig};
use sendgate_client::throttle::ThrottleConfig;
use sendgate_client::{
    code_label, AttemptError, Client, ClientConfig, ClientStats, Message, QueueName,
    QueueNameError, SendOutcome,
};
use sendgate_wire::BatchEntry;

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
    #[arg(long, value_name = "FILE", conflicts_with = "entra_scope")]
    token_file: Option<PathBuf>,
    /// Send Microsoft Entra ID access tokens for this scope instead, the gateway API's
    /// (`api://<app id>/.default`), from this process's identity: workload identity,
    /// managed identity, then the Azure CLI or Azure Developer CLI. Cached and renewed before
    /// they expire; no token stops the run (exit 2).
    #[arg(long, value_name = "SCOPE")]
    entra_scope: Option<String>,
    /// With --entra-scope: the client id of the user-assigned managed identity to use.
    #[arg(long, value_name = "CLIENT_ID", requires = "entra_scope")]
    entra_client_id: Option<String>,
    /// Requests in flight at once: batches, or single messages with --batch-size 1.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: u16,
    /// Messages per batch request (at most the gateway's SENDGATE_MAX_BATCH_MESSAGES,
    /// 100 by default); 1 sends each message alone, on the single-send route.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=10_000))]
    batch_size: u16,
    /// Each line is a batch entry, not a bare body: an object with `body` and any of
    /// `idempotency_key`, `correlation_id` and the attributes (`subject`, `session_id`,
    /// `partition_key`, `time_to_live_s`, `scheduled_enqueue_time`, `reply_to`, `to`,
    /// `properties`).
    #[arg(long)]
    envelope: bool,
    /// Longest time one message may wait (a drain, Retry-After, backoff), in seconds.
    /// A drain the gateway announces moves it: it then counts from the drain's end.
    #[arg(long, value_name = "SECONDS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    deadline: u64,
    /// The longest an announced drain may stretch --deadline to, in seconds from the send.
    #[arg(long, value_name = "SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    deadline_cap: u64,
    /// Attempts per message (or batch request), the first included, whatever the answers
    /// (a full queue's 429 too).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    max_attempts: u32,
    /// Tokens of the retry budget shared by every message of the run: a retry the gateway
    /// paced (429, or 503 with a Retry-After) costs 5, any other retry 10, given back if
    /// the retry queues the message; a message queued at its first attempt gives 1. A
    /// message whose retry the budget cannot pay for fails at once (not retried: retry
    /// budget exhausted). 0 never retries.
    #[arg(long, value_name = "TOKENS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    retry_budget: u32,
    /// Hold attempts back locally while the gateway refuses most of them (the SRE book's
    /// client-side adaptive throttling, K = 2 over 2 minutes): once more than half of the
    /// run's recent requests were refused, an attempt is held a second at a time, within
    /// its deadline, with a chance that grows with the refusals.
    #[arg(long)]
    adaptive_throttle: bool,
    /// The criticality to send at (critical, default or sheddable), as
    /// Sendgate-Criticality: a lower level is refused first when the queue is nearly full;
    /// never above the key's own. Without it, the key's level.
    #[arg(long, value_parser = parse_criticality)]
    criticality: Option<sendgate_client::Criticality>,
    /// JSON lines to send, one message each; `-` or nothing reads stdin.
    #[arg(value_name = "FILE|-")]
    input: Option<PathBuf>,
}

/// Entra ID tokens for `scope`, which must name an app's `.default` scope (the app roles
/// the gateway maps are granted to an identity for the whole app, not per scope).
fn entra_source(
    scope: &str,
    client_id: Option<&str>,
) -> Result<std::sync::Arc<dyn sendgate_client::TokenSource>, UsageError> {
    let scope = scope.trim();
    let Some(app) = scope.strip_suffix("/.default") else {
        return Err(UsageError::EntraScopeSuffix(
            scope.trim_end_matches('/').to_owned(),
        ));
    };
    if app.is_empty() || scope.chars().any(char::is_whitespace) {
        return Err(UsageError::EntraScope(scope.to_owned()));
    }
    let source = sendgate_client::EntraTokenSource::from_environment(scope.to_owned(), client_id)
        .map_err(UsageError::Entra)?;
    Ok(std::sync::Arc::new(source))
}

fn parse_criticality(word: &str) -> Result<sendgate_client::Criticality, String> {
    sendgate_client::Criticality::parse(word)
        .ok_or_else(|| format!("{word:?}: expected critical, default or sheddable"))
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
    #[error("--entra-scope {0:?}: the scope of an app's roles ends in /.default (did you mean \"{0}/.default\"?)")]
    EntraScopeSuffix(String),
    #[error("--entra-scope {0:?}: not a scope; expected api://<app id>/.default")]
    EntraScope(String),
    #[error("--entra-scope and {TOKEN_VARIABLE} are both set: send with one credential")]
    TwoCredentials,
    #[error("--entra-scope: {0}")]
    Entra(sendgate_client::TokenSourceError),
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
            let options = Options {
                concurrency: usize::from(args.concurrency),
                batch_size: usize::from(args.batch_size),
                envelope: args.envelope,
            };
            runtime.block_on(send_all(client, queue, input, options))
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
        })
        .budget(BudgetConfig {
            capacity: args.retry_budget,
            ..BudgetConfig::default()
        });
    if args.adaptive_throttle {
        config = config.adaptive_throttle(ThrottleConfig::default());
    }
    match &args.entra_scope {
        Some(_) if token.is_some() => return Err(UsageError::TwoCredentials),
        Some(scope) => {
            config.token_source = Some(entra_source(scope, args.entra_client_id.as_deref())?)
        }
        None => config.token = token,
    }
    config.max_concurrent_requests = usize::from(args.concurrency);
    config.criticality = args.criticality;
    config.max_batch_messages = usize::from(args.batch_size);
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

/// One line of input: its number (from 1), its bytes without the line break, and whether
/// the next line is already read in full (so a batch waits for it rather than lingering).
type Line = std::io::Result<(u64, Vec<u8>, bool)>;

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
                    // The next line is in memory when the buffer holds its end: reading it
                    // cannot wait on the producer.
                    let next_ready = reader.buffer().contains(&b'\n');
                    if tx.blocking_send(Ok((number, buf, next_ready))).is_err() {
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

/// How `send_all` sends.
struct Options {
    concurrency: usize,
    batch_size: usize,
    envelope: bool,
}

/// A batch that is not full goes when the input has paused this long (the next line not
/// read yet)...
const LINGER: Duration = Duration::from_millis(50);
/// ...or once its first line has waited this long for the rest, so a producer trickling
/// lines sees each one's fate within about a second.
const MOST_FILL: Duration = Duration::from_secs(1);

/// The fields of an `--envelope` line: a batch entry's. Any other is refused locally, as
/// the gateway would refuse it (reading it as a `BatchEntry` would drop it silently).
const ENVELOPE_FIELDS: [&str; 11] = [
    "body",
    "idempotency_key",
    "correlation_id",
    "subject",
    "session_id",
    "partition_key",
    "time_to_live_s",
    "scheduled_enqueue_time",
    "reply_to",
    "to",
    "properties",
];

/// An `--envelope` line as its message, or why it cannot be one.
fn envelope(line: &[u8]) -> Result<Message, String> {
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(line)
        .map_err(|e| format!("must be a JSON object with a body: {e}"))?;
    if let Some(unknown) = object
        .keys()
        .find(|k| !ENVELOPE_FIELDS.contains(&k.as_str()))
    {
        return Err(format!(
            "unknown field {unknown:?} (a line holds {})",
            ENVELOPE_FIELDS.join(", ")
        ));
    }
    // Read again from the text: the body is kept as its JSON text, not as a value.
    let entry: BatchEntry = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    Ok(Message::from(entry))
}

/// A line as its message; a blank one is none, a bad one is counted and shown here.
fn parse_line(report: &mut Report, number: u64, raw: &[u8], enveloped: bool) -> Option<Message> {
    let text = raw.trim_ascii();
    if text.is_empty() {
        return None;
    }
    report.note_read();
    if enveloped {
        return match envelope(text) {
            Ok(message) => Some(message),
            Err(why) => {
                report.refused_locally(number, "invalid_envelope", &why);
                None
            }
        };
    }
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(text) {
        report.refused_locally(number, "invalid_json", &e.to_string());
        return None;
    }
    Some(Message::new(Bytes::copy_from_slice(text)))
}

/// What one request (a batch, or one message) came to: each line's outcome.
type Sent = Vec<(u64, SendOutcome)>;

/// What the loop waits for next.
enum Event {
    Line(u64, Vec<u8>, bool),
    /// The input paused (or the batch waited long enough): what is there goes now.
    Paused,
    End,
    ReadError(std::io::Error),
    Finished(Result<Sent, tokio::task::JoinError>),
}

impl Event {
    fn of(line: Option<Line>) -> Self {
        match line {
            Some(Ok((number, raw, next_ready))) => Self::Line(number, raw, next_ready),
            Some(Err(e)) => Self::ReadError(e),
            None => Self::End,
        }
    }
}

/// Hands the batches to the client: the first alone (the pilot), then up to
/// `concurrency` at once.
struct Dispatcher {
    client: Client,
    queue: QueueName,
    single: bool,
    concurrency: usize,
    in_flight: JoinSet<Sent>,
    pilot_done: bool,
}

impl Dispatcher {
    /// Batches of `batch_size` lines (one: each line on the single-send route), up to
    /// `concurrency` at once after the pilot.
    fn new(client: Client, queue: QueueName, batch_size: usize, concurrency: usize) -> Self {
        Self {
            client,
            queue,
            single: batch_size == 1,
            concurrency: concurrency.max(1),
            in_flight: JoinSet::new(),
            pilot_done: false,
        }
    }

    /// Send `batch`; `true` when the run must stop (authentication failure).
    async fn dispatch(&mut self, batch: Vec<(u64, Message)>, report: &mut Report) -> bool {
        let send = send_lines(self.client.clone(), self.queue.clone(), batch, self.single);
        if !self.pilot_done {
            let sent = send.await;
            self.pilot_done = !sent
                .iter()
                .all(|(_, o)| matches!(o, SendOutcome::Invalid { .. }));
            return report.record_all(sent);
        }
        while self.in_flight.len() >= self.concurrency {
            if let Some(done) = self.in_flight.join_next().await {
                if report.finished(done) {
                    return true;
                }
            }
        }
        self.in_flight.spawn(send);
        false
    }

    /// Sends already on their way are waited for, also after an auth failure: each one's
    /// outcome is then known and reported rather than guessed.
    async fn wait_all(&mut self, report: &mut Report) {
        while let Some(done) = self.in_flight.join_next().await {
            report.finished(done);
        }
    }
}

async fn send_lines(
    client: Client,
    queue: QueueName,
    batch: Vec<(u64, Message)>,
    single: bool,
) -> Sent {
    let (numbers, messages): (Vec<u64>, Vec<Message>) = batch.into_iter().unzip();
    if single {
        let mut sent = Vec::with_capacity(messages.len());
        for (number, message) in numbers.into_iter().zip(messages) {
            sent.push((number, client.send_with(queue.as_str(), message).await));
        }
        return sent;
    }
    let outcomes = client.send_batch(queue.as_str(), messages).await;
    numbers.into_iter().zip(outcomes).collect()
}

async fn send_all(
    client: Client,
    queue: QueueName,
    input: Box<dyn Read + Send>,
    options: Options,
) -> ExitCode {
    let batch_size = options.batch_size.max(1);
    let mut lines = read_lines(input, options.concurrency.max(batch_size) * 2);
    let mut report = Report::new(std::io::stderr().is_terminal());
    let _waiting = WaitingLine::start(&report, &client);
    let mut dispatcher = Dispatcher::new(client.clone(), queue, batch_size, options.concurrency);
    let mut read_error = None;
    let mut stopped = false;
    let mut filling = Filling::new(batch_size, options.envelope);
    loop {
        match filling
            .next_event(&mut lines, &mut dispatcher.in_flight)
            .await
        {
            Event::Finished(done) => {
                if report.finished(done) {
                    stopped = true;
                    break;
                }
                continue;
            }
            Event::Line(number, raw, ready) => {
                if !filling.add(&mut report, number, &raw, ready) {
                    continue;
                }
            }
            Event::Paused => {}
            Event::End => break,
            Event::ReadError(e) => {
                read_error = Some(e);
                break;
            }
        }
        if dispatcher
            .dispatch(std::mem::take(&mut filling.batch), &mut report)
            .await
        {
            stopped = true;
            break;
        }
    }
    // What was read before the end (or a read error) goes too; after an authentication
    // failure nothing more does.
    if !stopped && !filling.batch.is_empty() {
        dispatcher.dispatch(filling.batch, &mut report).await;
    }
    drop(lines);
    dispatcher.wait_all(&mut report).await;
    report.summary(client.stats(), read_error)
}

/// The longest a run stays silent on stderr (no bar) while messages wait for an answer:
/// a full queue's 429s, a drain, retries may hold one for minutes (`--deadline`).
const QUIET_AT_MOST: Duration = Duration::from_secs(5);

/// What the waiting line reads: messages read and answered, and when a line was last said.
struct Progress {
    started: std::time::Instant,
    read: AtomicU64,
    answered: AtomicU64,
    /// Milliseconds from `started` to the last line written.
    said_at_ms: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            started: std::time::Instant::now(),
            read: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            said_at_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A line was written now.
    fn said(&self) {
        self.said_at_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The line to write now, if messages wait and nothing was said for [`QUIET_AT_MOST`].
    fn waiting_line(&self, stats: &ClientStats) -> Option<String> {
        let now = self.now_ms();
        let read = self.read.load(Ordering::Relaxed);
        let waiting = read.saturating_sub(self.answered.load(Ordering::Relaxed));
        let quiet = now.saturating_sub(self.said_at_ms.load(Ordering::Relaxed));
        if waiting == 0 || u128::from(quiet) < QUIET_AT_MOST.as_millis() {
            return None;
        }
        Some(format!(
            "waiting: {waiting} of {read} message{} not answered yet after {} s ({} requests, {} retries, {} waits for a drain so far)",
            if read == 1 { "" } else { "s" },
            now / 1000,
            stats.requests,
            stats.retries,
            stats.deferrals
        ))
    }
}

/// The task that writes the waiting line, stopped when the run ends (dropped).
struct WaitingLine(Option<tokio::task::JoinHandle<()>>);

impl WaitingLine {
    /// Without the bar only: a run waiting at a full queue (or a drain) still says so.
    fn start(report: &Report, client: &Client) -> Self {
        Self(report.bar.is_none().then(|| {
            tokio::spawn(say_while_waiting(
                Arc::clone(&report.progress),
                client.clone(),
            ))
        }))
    }
}

impl Drop for WaitingLine {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Every second, the waiting line when one is due (see [`Progress::waiting_line`]).
async fn say_while_waiting(progress: Arc<Progress>, client: Client) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if let Some(line) = progress.waiting_line(&client.stats()) {
            eprintln!("{line}");
            progress.said();
        }
    }
}

/// The batch being filled: its lines, whether the next line is already in memory, and
/// until when it may wait for more.
struct Filling {
    batch: Vec<(u64, Message)>,
    /// Lines a batch holds.
    size: usize,
    /// Lines are batch entries (`--envelope`), not bare bodies.
    envelope: bool,
    next_ready: bool,
    fill_until: tokio::time::Instant,
}

impl Filling {
    fn new(size: usize, envelope: bool) -> Self {
        Self {
            batch: Vec::new(),
            size,
            envelope,
            next_ready: false,
            fill_until: tokio::time::Instant::now(),
        }
    }

    /// What comes next: with no batch filling, a line or a send finishing, whichever is
    /// first; while one fills, the next line, or a pause once it waited long enough.
    async fn next_event(
        &self,
        lines: &mut mpsc::Receiver<Line>,
        in_flight: &mut JoinSet<Sent>,
    ) -> Event {
        if self.batch.is_empty() {
            // Outcomes are reported as they come, not only when a slot is needed: a
            // producer piping lines at its own pace sees each message's fate at once.
            tokio::select! {
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    Event::Finished(done)
                }
                line = lines.recv() => Event::of(line),
            }
        } else if self.next_ready {
            Event::of(lines.recv().await)
        } else {
            let wait = self
                .fill_until
                .saturating_duration_since(tokio::time::Instant::now())
                .min(LINGER);
            match tokio::time::timeout(wait, lines.recv()).await {
                Ok(line) => Event::of(line),
                Err(_) => Event::Paused,
            }
        }
    }

    /// Line `number` read (`next_ready`: the one after it is in memory too): its message
    /// joins the batch (a line that is none is reported, not sent). `true` when the batch
    /// is full.
    fn add(&mut self, report: &mut Report, number: u64, raw: &[u8], next_ready: bool) -> bool {
        self.next_ready = next_ready;
        if let Some(message) = parse_line(report, number, raw, self.envelope) {
            if self.batch.is_empty() {
                self.fill_until = tokio::time::Instant::now() + MOST_FILL;
            }
            self.batch.push((number, message));
        }
        self.batch.len() >= self.size
    }
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
    /// Why the token source gave no token: the run stops on it too.
    no_token: Option<String>,
    /// Shared with the waiting line's task.
    progress: Arc<Progress>,
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
            no_token: None,
            progress: Arc::new(Progress::new()),
        }
    }

    /// A line of input that is a message (or meant as one).
    fn note_read(&mut self) {
        self.read += 1;
        self.progress.read.store(self.read, Ordering::Relaxed);
    }

    /// A task ended (or panicked, which the client does not do on any input).
    fn finished(&mut self, done: Result<Sent, tokio::task::JoinError>) -> bool {
        match done {
            Ok(sent) => self.record_all(sent),
            Err(e) => {
                *self.failed.entry("internal error".into()).or_default() += 1;
                self.line(&format!("a send task ended abnormally: {e}"), true);
                false
            }
        }
    }

    /// Count a request's outcomes; `true` when the run must stop (one was an
    /// authentication failure).
    fn record_all(&mut self, sent: Sent) -> bool {
        let mut stop = false;
        for (number, outcome) in sent {
            stop |= self.record(number, outcome);
        }
        stop
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
            // No later message would get a token either (the source paces its fetches).
            SendOutcome::NoToken { reason } => {
                *self.failed.entry("no token".into()).or_default() += 1;
                if self.no_token.is_none() {
                    self.no_token = Some(reason);
                }
                return true;
            }
        }
        false
    }

    fn refused_locally(&mut self, number: u64, code: &str, why: &str) {
        *self.refused.entry(format!("{code} (local)")).or_default() += 1;
        self.line(
            &format!("line {number}: refused locally, not sent: {code}: {why}"),
            true,
        );
    }

    /// On a terminal, problems are printed above the bar and successes only move it;
    /// otherwise every message gets a plain line.
    fn line(&self, text: &str, problem: bool) {
        let answered =
            self.queued + self.refused.values().sum::<u64>() + self.failed.values().sum::<u64>();
        self.progress.answered.store(answered, Ordering::Relaxed);
        self.progress.said();
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
        if stats.held > 0 {
            eprintln!(
                "  attempts held back by the adaptive throttle: {}",
                stats.held
            );
        }
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
        if let Some(why) = &self.no_token {
            eprintln!(
                "stopped: no token for the gateway ({why}); nothing more was sent, the rest of the input neither"
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

#[cfg(test)]
mod tests {
    use super::*;
    use sendgate_client::MessageAttributes;

    /// A run `ago` old, with `read` messages read and `answered` answered.
    fn progress(ago: Duration, read: u64, answered: u64) -> Progress {
        Progress {
            started: std::time::Instant::now()
                .checked_sub(ago)
                .expect("the clock goes back that far"),
            read: AtomicU64::new(read),
            answered: AtomicU64::new(answered),
            said_at_ms: AtomicU64::new(0),
        }
    }

    #[test]
    fn a_waiting_line_is_due_only_while_messages_wait_after_a_quiet_spell() {
        let stats = ClientStats {
            requests: 4,
            retries: 3,
            deferrals: 1,
            ..ClientStats::default()
        };
        let quiet = progress(Duration::from_millis(5_100), 3, 1);
        assert_eq!(
            quiet.waiting_line(&stats).as_deref(),
            Some("waiting: 2 of 3 messages not answered yet after 5 s (4 requests, 3 retries, 1 waits for a drain so far)")
        );
        quiet.said();
        assert_eq!(quiet.waiting_line(&stats), None, "just said");
        let one = progress(Duration::from_secs(12), 1, 0);
        assert!(one
            .waiting_line(&stats)
            .is_some_and(|l| l.starts_with("waiting: 1 of 1 message not answered yet after 12 s")));
        assert_eq!(
            progress(Duration::from_secs(12), 3, 3).waiting_line(&stats),
            None,
            "nothing waits"
        );
        assert_eq!(
            progress(Duration::from_millis(4_900), 3, 0).waiting_line(&stats),
            None,
            "not quiet long enough"
        );
        let at_five = progress(QUIET_AT_MOST, 1, 0);
        assert!(at_five.waiting_line(&stats).is_some(), "due at 5 s");
    }

    #[test]
    fn the_envelope_fields_are_a_batch_entrys() {
        // Every field a batch entry can carry, set: its JSON names are the list's.
        let mut attributes = MessageAttributes {
            subject: Some("s".into()),
            session_id: Some("s".into()),
            partition_key: Some("s".into()),
            time_to_live_s: Some(1),
            scheduled_enqueue_time: Some("2030-01-01T00:00:00Z".into()),
            reply_to: Some("r".into()),
            to: Some("t".into()),
            ..MessageAttributes::default()
        };
        attributes.properties.insert("p".into(), 1.into());
        let entry = BatchEntry {
            body: serde_json::value::RawValue::from_string("1".into()).unwrap(),
            idempotency_key: Some("k".into()),
            correlation_id: Some("c".into()),
            attributes,
        };
        let value = serde_json::to_value(&entry).unwrap();
        let mut names: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut fields = ENVELOPE_FIELDS.to_vec();
        names.sort_unstable();
        fields.sort_unstable();
        assert_eq!(names, fields);
    }

    #[test]
    fn an_envelope_line_is_its_message_and_an_unknown_field_is_refused() {
        let message = envelope(
            br#"{"body": {"n": 1}, "idempotency_key": "k-1", "subject": "s", "time_to_live_s": 60, "properties": {"tier": "gold"}}"#,
        )
        .unwrap();
        assert_eq!(
            &message.body[..],
            br#"{"n": 1}"#,
            "the body's text as written"
        );
        assert_eq!(message.idempotency_key.as_deref(), Some("k-1"));
        assert_eq!(message.attributes.subject.as_deref(), Some("s"));
        assert_eq!(message.attributes.time_to_live_s, Some(60));
        assert_eq!(message.attributes.properties["tier"], "gold");
        let unknown = envelope(br#"{"body": 1, "subjct": "s"}"#).unwrap_err();
        assert!(unknown.contains("\"subjct\""), "{unknown}");
        assert!(envelope(br#"{"subject": "s"}"#)
            .unwrap_err()
            .contains("body"));
        assert!(envelope(b"[1]").is_err());
        assert!(envelope(br#"{"body": 1, "time_to_live_s": "60"}"#).is_err());
    }
}
