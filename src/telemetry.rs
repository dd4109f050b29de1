//! Logs: structured `tracing` events with stable `event` names (`send_failclosed`,
//! `depth_read_failed`, `drain_started`, ...), human-readable by default, JSON lines with
//! `SENDGATE_LOG_FORMAT=json`. `RUST_LOG` sets the level (default `info`).
//!
//! An event logged while serving a request carries `request_id` (and `queue`, `key` once
//! known), taken from the task's current [`RequestFields`] (set by `http/context.rs`): in
//! the text format before the event's own fields, in JSON as top-level fields next to them
//! (`{"event":"send_failclosed","request_id":"...","queue":"requests",...}`), so a log
//! query filters on `request_id` directly. Work a request hands to a shared task (the
//! embedded writer thread, a token refresh) logs without one: it serves many requests.
//!
//! Why a task-local and not a `tracing` span: a span per request cost ~9k instructions of
//! a refused send's ~87k (creating it in the registry, formatting its fields into a string
//! on creation and on each record, entering and leaving it on every poll, closing it) — a
//! tenth of the 429 path, for log lines that almost no request writes. The task-local
//! costs a pointer swap per poll; the fields are only formatted when a line is written.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::future::Future;
use std::rc::Rc;

use serde_json::{Map, Value};
use tokio::task::futures::TaskLocalFuture;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::domain::RequestId;

pub fn init(format: LogFormat) {
    let filter = filter(std::env::var(EnvFilter::DEFAULT_ENV).ok().as_deref());
    // Colours only for a person at a terminal: a file or a log collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Json => builder
            .fmt_fields(JsonMembers)
            .event_format(FlatJson)
            .finish()
            .with(no_payloads())
            .with(QuietNotFound)
            .try_init(),
        LogFormat::Text => builder
            .event_format(TextLine::<SystemTime>::default())
            .finish()
            .with(no_payloads())
            .with(QuietNotFound)
            .try_init(),
    };
}

/// The text format: `tracing_subscriber`'s default line, with the current request first
/// — `TIME LEVEL request{request_id="r-1" queue="requests" key="batch"}: target: message
/// fields` — and one physical line per event. The request comes before anything the event
/// carries, so a field whose value holds `request_id="…"` (a client's `Idempotency-Key` in
/// a message id) cannot pass for the request's, and a line break inside a value (a
/// broker's error text) is written as `\n` instead of starting a line of its own.
struct TextLine<T = SystemTime> {
    timer: T,
    /// The line after the time and the level: spans, target, fields.
    rest: tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Full, ()>,
}

impl Default for TextLine {
    fn default() -> Self {
        Self {
            timer: SystemTime,
            rest: tracing_subscriber::fmt::format::Format::default()
                .without_time()
                .with_level(false),
        }
    }
}

#[cfg(test)]
impl TextLine {
    fn without_time(self) -> TextLine<()> {
        TextLine {
            timer: (),
            rest: self.rest,
        }
    }
}

impl<S, N, T> FormatEvent<S, N> for TextLine<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let ansi = writer.has_ansi_escapes();
        let mut time = String::new();
        self.timer.format_time(&mut Writer::new(&mut time))?;
        if !time.is_empty() {
            write!(writer, "{time} ")?;
        }
        // The default format's level: padded to five, coloured at a terminal.
        let (level, colour) = match *event.metadata().level() {
            tracing::Level::TRACE => ("TRACE", "35"),
            tracing::Level::DEBUG => ("DEBUG", "34"),
            tracing::Level::INFO => (" INFO", "32"),
            tracing::Level::WARN => (" WARN", "33"),
            tracing::Level::ERROR => ("ERROR", "31"),
        };
        if ansi {
            write!(writer, "\x1b[{colour}m{level}\x1b[0m ")?;
        } else {
            write!(writer, "{level} ")?;
        }
        let mut request = String::new();
        current_fields(|name, value| {
            let gap = if request.is_empty() { "" } else { " " };
            let _ = write!(request, "{gap}{name}={value:?}");
        });
        if !request.is_empty() {
            write!(writer, "request{{{request}}}: ")?;
        }
        // The rest into a buffer, so that a line break inside a value can be escaped.
        let mut rest = String::new();
        let format = self.rest.clone().with_ansi(ansi);
        format.format_event(ctx, Writer::new(&mut rest), event)?;
        let rest = rest.strip_suffix('\n').unwrap_or(&rest);
        for (i, part) in rest.split('\n').enumerate() {
            if i > 0 {
                writer.write_str("\\n")?;
            }
            writer.write_str(&part.replace('\r', "\\r"))?;
        }
        writeln!(writer)
    }
}

/// The fields of the request a task serves, written on every line logged while serving it:
/// `request_id`, then `queue` and `key` once known. Cheap to clone (shared).
#[derive(Clone)]
pub struct RequestFields(Rc<Fields>);

struct Fields {
    id: RequestId,
    queue: RefCell<Option<Box<str>>>,
    key: RefCell<Option<Box<str>>>,
}

tokio::task_local! {
    /// The request this task is serving right now. Work handed to another task (the
    /// embedded writer, a token refresh) serves many requests and logs without one.
    static CURRENT: RequestFields;
}

impl RequestFields {
    pub fn new(id: RequestId) -> Self {
        Self(Rc::new(Fields {
            id,
            queue: RefCell::new(None),
            key: RefCell::new(None),
        }))
    }

    pub fn id(&self) -> &RequestId {
        &self.0.id
    }

    pub fn record_queue(&self, queue: &str) {
        *self.0.queue.borrow_mut() = Some(queue.into());
    }

    pub fn record_key(&self, name: &str) {
        *self.0.key.borrow_mut() = Some(name.into());
    }

    /// Runs `f` with these as the current request's fields.
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(self, f)
    }

    /// Polls `future` with these as the current request's fields, on every poll.
    pub fn scope<F: Future>(self, future: F) -> TaskLocalFuture<RequestFields, F> {
        CURRENT.scope(self, future)
    }
}

/// The current request's fields for a log line — `request_id`, then `queue` and `key` once
/// known — or nothing outside a request.
pub fn current_fields(mut field: impl FnMut(&'static str, &str)) {
    let _ = CURRENT.try_with(|current| {
        let fields = &current.0;
        field("request_id", fields.id.as_str());
        if let Some(queue) = fields.queue.borrow().as_deref() {
            field("queue", queue);
        }
        if let Some(key) = fields.key.borrow().as_deref() {
            field("key", key);
        }
    });
}

/// At most one line per `period` for an event that would otherwise be logged once per
/// request (a broker that fails every send would write thousands a second). The line that
/// is let through says how many were held back since the last one.
pub struct EveryPeriod {
    period: std::time::Duration,
    state: parking_lot::Mutex<(Option<tokio::time::Instant>, u64)>,
}

impl EveryPeriod {
    pub const fn new(period: std::time::Duration) -> Self {
        Self {
            period,
            state: parking_lot::const_mutex((None, 0)),
        }
    }

    /// `Some(held back since the last line)` when this one may be logged.
    pub fn admit(&self) -> Option<u64> {
        let now = tokio::time::Instant::now();
        let mut state = self.state.lock();
        let (last, held_back) = &mut *state;
        if last.is_some_and(|at| now < at + self.period) {
            *held_back += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(held_back))
    }
}

/// `RUST_LOG` (or `info` when unset or invalid).
fn filter(rust_log: Option<&str>) -> EnvFilter {
    rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new("info"))
}

/// Logs never carry message bodies or the broker password, whatever `RUST_LOG` says.
/// The AMQP client logs a message the broker returns (a `mandatory` publish to a queue
/// that is gone) with its whole payload, at WARN (the backend maps that return to
/// `send_failed` itself); at TRACE it logs every frame it reads or writes (`Debug` of a
/// body frame is the payload, of `connection.start-ok` the PLAIN password) and the
/// frames it discards. Those modules stay at DEBUG at most; nothing else of lapin's is
/// touched. A filter of its own beside `RUST_LOG`'s, so it can only lower a level: a
/// directive added to `RUST_LOG`'s would set the module's level, raising it where
/// `RUST_LOG` asked for less.
fn no_payloads() -> Targets {
    Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("lapin::returned_messages", LevelFilter::OFF)
        .with_target("lapin::channels", LevelFilter::DEBUG)
        .with_target("lapin::io_loop", LevelFilter::DEBUG)
        .with_target("lapin::frames", LevelFilter::DEBUG)
}

/// The AMQP client logs every channel the broker closes with an error at ERROR, a
/// `NOT_FOUND` (404) too. sendgate meets one on every first start: the check before it
/// declares a queue is a passive declare, which the broker answers so when the queue does
/// not exist yet. Every other `NOT_FOUND` is a depth read's (the queue deleted under the
/// `amqp` depth source), which sendgate logs itself (`depth_read_failed`, the queue not
/// found) as it does the declare (`queue_declared`): the client's line only repeats it, as
/// an ERROR where nothing failed. Its other channel errors (an access refused, a
/// precondition failed) are left as they are.
struct QuietNotFound;

impl<S: Subscriber> tracing_subscriber::Layer<S> for QuietNotFound {
    fn event_enabled(
        &self,
        event: &Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        !is_channel_not_found(event)
    }
}

/// The AMQP client's "Channel closed" ERROR for a `NOT_FOUND`.
fn is_channel_not_found(event: &Event<'_>) -> bool {
    /// Whether the event's `error` field is the soft error `NOTFOUND`.
    struct NotFound(bool);
    impl Visit for NotFound {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            if field.name() == "error" {
                self.0 = format!("{value:?}").contains("Soft(NOTFOUND)");
            }
        }
    }
    let meta = event.metadata();
    if meta.target() != "lapin::channel" || *meta.level() != tracing::Level::ERROR {
        return false;
    }
    let mut found = NotFound(false);
    event.record(&mut found);
    found.0
}

/// One JSON object per event: `timestamp`, `level`, `target`, the current request's
/// fields, the fields of the spans it happened in (outermost first) and the event's own
/// fields, all at the top level. On a name clash the event's field wins, then the
/// innermost span's, then the request's.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::String(timestamp));
        let meta = event.metadata();
        line.insert("level".into(), meta.level().as_str().into());
        // The request is the outermost context of anything logged while serving it.
        current_fields(|name, value| {
            line.insert(name.into(), value.into());
        });
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                let object = format!("{{{}}}", fields.fields);
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&object) {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut JsonFieldsOf(&mut line));
        line.insert("target".into(), meta.target().into());
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// A span's fields (a library's) as JSON object members (`"conn":7,"peer":"a"`),
/// appended to as fields are recorded, never re-parsed: a span costs one small string,
/// and its fields are only merged into an object when an event is written.
struct JsonMembers;

impl<'writer> FormatFields<'writer> for JsonMembers {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut members = JsonMembersOf {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut members);
        members.result
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut members = JsonMembersOf {
            first: current.fields.is_empty(),
            writer: &mut current.as_writer(),
            result: Ok(()),
        };
        fields.record(&mut members);
        members.result
    }
}

struct JsonMembersOf<'a, 'w> {
    writer: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl JsonMembersOf<'_, '_> {
    fn member(&mut self, field: &Field, value: Value) {
        let comma = if std::mem::take(&mut self.first) {
            ""
        } else {
            ","
        };
        let name = Value::from(field.name());
        self.result = self
            .result
            .and_then(|()| write!(self.writer, "{comma}{name}:{value}"));
    }
}

impl Visit for JsonMembersOf<'_, '_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.member(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, format!("{value:?}").into());
    }
}

/// An event's fields as JSON values.
struct JsonFieldsOf<'a>(&'a mut Map<String, Value>);

impl Visit for JsonFieldsOf<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

/// A log writer for tests: every line the subscriber writes, kept to be read back.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Sends this thread's events to `subscriber` until the guard drops, whatever other
    /// tests' threads do meanwhile. tracing caches a callsite's interest once for the
    /// process, asked (while one dispatcher is registered) of the thread that reaches it
    /// first: a sibling test's thread without a subscriber would cache it as never, and
    /// this thread's subscriber would see none of that callsite's events. A process-wide
    /// default that is interested in everything and writes nothing (a bare registry) makes
    /// every thread's answer "interested".
    pub(crate) fn install(
        subscriber: impl tracing::Subscriber + Send + Sync + 'static,
    ) -> tracing::subscriber::DefaultGuard {
        static ANCHOR: std::sync::Once = std::sync::Once::new();
        ANCHOR.call_once(|| {
            // Nothing else in the test process sets a global default (`init` runs only in
            // `serve`). A callsite a sibling thread registers while no dispatcher exists yet
            // (before the first install) may still be cached as never until this rebuild.
            let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        });
        let guard = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        guard
    }
}

#[cfg(test)]
impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;
    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A callsite another thread, one without a subscriber, reaches first (as a sibling
    /// test's does) still reaches the subscriber a test installed.
    #[test]
    fn an_installed_subscriber_sees_a_callsite_another_thread_reached_first() {
        fn shared_callsite(n: u32) {
            tracing::warn!(n, "one callsite, two threads");
        }
        let out = Captured::default();
        let _logging = Captured::install(
            tracing_subscriber::fmt()
                .with_writer(out.clone())
                .with_ansi(false)
                .finish(),
        );
        std::thread::spawn(|| shared_callsite(1))
            .join()
            .expect("the other thread");
        shared_callsite(2);
        let text = out.text();
        assert!(text.contains("n=2"), "{text}");
        assert!(!text.contains("n=1"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_event_is_let_through_once_a_period_with_the_count_held_back() {
        let every = EveryPeriod::new(std::time::Duration::from_secs(1));
        assert_eq!(every.admit(), Some(0), "the first one");
        for _ in 0..5 {
            assert_eq!(every.admit(), None);
        }
        tokio::time::advance(std::time::Duration::from_millis(999)).await;
        assert_eq!(every.admit(), None, "still inside the period");
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert_eq!(
            every.admit(),
            Some(6),
            "one line, saying six were held back"
        );
        assert_eq!(every.admit(), None);
    }

    /// The AMQP client's channel-closed ERRORs, as it writes them: a `NOT_FOUND` is left
    /// out (sendgate says what it means), any other error stays.
    #[test]
    fn the_amqp_clients_not_found_channel_close_is_left_out_and_other_errors_stay() {
        let not_found = Printed("AMQPError { kind: Soft(NOTFOUND), message: ShortString(\"NOT_FOUND - no queue 'q' in vhost '/'\") }");
        let refused = Printed(
            "AMQPError { kind: Soft(ACCESSREFUSED), message: ShortString(\"ACCESS_REFUSED\") }",
        );
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_ansi(false)
            .with_env_filter(filter(None))
            .finish()
            .with(no_payloads())
            .with(QuietNotFound);
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "lapin::channel", channel = 5, error = ?not_found, "Channel closed");
            tracing::error!(target: "lapin::channel", channel = 6, error = ?refused, "Channel closed");
            tracing::error!(target: "lapin::channel", channel = 7, "Channel closed");
            tracing::error!(target: "lapin::channel", channel = 8, reason = ?not_found, "Channel closed");
            tracing::error!(target: "sendgate", error = ?not_found, "ours, the same words");
            tracing::warn!(target: "lapin::channel", error = ?not_found, "a warning");
        });
        let text = out.text();
        assert!(!text.contains("channel=5"), "{text}");
        for kept in [
            "channel=6",
            "channel=7",
            "channel=8",
            "ours, the same words",
            "a warning",
        ] {
            assert!(text.contains(kept), "{kept}: {text}");
        }
    }

    /// A value whose `Debug` is the text given (a foreign type's, as it prints).
    struct Printed(&'static str);
    impl fmt::Debug for Printed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    /// What a subscriber filtered by `RUST_LOG=rust_log` writes for one event per target.
    fn logged_under(rust_log: &str) -> String {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_env_filter(filter(Some(rust_log)))
            .finish()
            .with(no_payloads());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "lapin::returned_messages", "returned PAYLOAD-1");
            tracing::trace!(target: "lapin::channels", "will handle frame PAYLOAD-2");
            tracing::trace!(target: "lapin::io_loop", "will write StartOk SECRET-3");
            tracing::trace!(target: "lapin::frames", "discarding frame PAYLOAD-4");
            tracing::trace!(target: "lapin::io_loop", "kept at trace");
            tracing::debug!(target: "lapin::io_loop", "io loop at debug");
            tracing::trace!(target: "lapin::connection", "connection at trace");
            tracing::info!(target: "sendgate", "ours at info");
        });
        out.text()
    }

    #[test]
    fn no_rust_log_lets_payloads_or_the_broker_password_into_the_logs() {
        for rust_log in [
            "trace",
            "info,lapin=trace",
            "info,lapin::io_loop=trace,lapin::channels=trace,lapin::frames=trace,lapin::returned_messages=warn",
        ] {
            let text = logged_under(rust_log);
            for secret in ["PAYLOAD-1", "PAYLOAD-2", "SECRET-3", "PAYLOAD-4"] {
                assert!(!text.contains(secret), "{rust_log}: {text}");
            }
            assert!(text.contains("io loop at debug"), "{rust_log}: {text}");
            assert!(text.contains("ours at info"), "{rust_log}: {text}");
        }
        let text = logged_under("info,lapin=trace");
        assert!(
            text.contains("connection at trace"),
            "the rest of lapin: {text}"
        );
        assert!(
            logged_under("not a filter [").contains("ours at info"),
            "invalid: info"
        );
        // The caps never raise a module past what `RUST_LOG` asks.
        for rust_log in [
            "info",
            "info,lapin=warn",
            "info,lapin=off",
            "error,sendgate=debug",
        ] {
            let text = logged_under(rust_log);
            assert!(!text.contains("io loop at debug"), "{rust_log}: {text}");
        }
        assert!(logged_under("info").contains("ours at info"));
    }

    fn request(id: &str) -> RequestFields {
        RequestFields::new(RequestId::parse(id).unwrap())
    }

    /// One warning logged while serving a request (`r-"1"`, queue and key recorded after
    /// it started), inside a library's span, through the given subscriber.
    fn log_in_a_request(subscriber: impl Subscriber + Send + Sync + 'static) {
        let fields = request("r-\"1\"");
        tracing::subscriber::with_default(subscriber, || {
            fields.clone().sync_scope(|| {
                fields.record_queue("requests");
                fields.record_key("batch");
                let span = tracing::info_span!("lib", conn = 7u64);
                let _in = span.enter();
                tracing::warn!(
                    event = "send_failclosed",
                    consecutive_failures = 3u32,
                    "refused"
                );
            });
            tracing::info!(what = "outside");
        });
    }

    #[test]
    fn json_lines_carry_the_request_and_span_fields_beside_the_event_fields() {
        let out = Captured::default();
        log_in_a_request(
            tracing_subscriber::fmt()
                .with_writer(out.clone())
                .fmt_fields(JsonMembers)
                .event_format(FlatJson)
                .finish(),
        );
        let text = out.text();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let line = &lines[0];
        assert_eq!(line["request_id"], "r-\"1\"");
        assert_eq!(line["queue"], "requests");
        assert_eq!(line["key"], "batch");
        assert_eq!(line["conn"], 7, "the library span's field");
        assert_eq!(line["event"], "send_failclosed");
        assert_eq!(line["consecutive_failures"], 3);
        assert_eq!(line["message"], "refused");
        assert_eq!(line["level"], "WARN");
        assert!(line["timestamp"].is_string() && line["target"].is_string());
        assert_eq!(lines[1]["what"], "outside");
        assert!(lines[1].get("request_id").is_none(), "{}", lines[1]);
    }

    /// Review of 19df3eb: written after the event's fields, the request's could be forged
    /// by a value that holds `request_id="…"` (an `Idempotency-Key` in a message id), and
    /// a line break in a value (a broker's error text) put them on a line of their own.
    #[test]
    fn text_lines_name_their_request_first_and_stay_one_line() {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_ansi(false)
            .event_format(TextLine::default().without_time())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            request("r-1").sync_scope(|| {
                tracing::warn!(
                    message_id = %"k request_id=\"victim\"",
                    error = %"first\nsecond\rthird",
                    "forged"
                );
            });
        });
        let text = out.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        let first = text.find("request_id=").unwrap();
        assert!(text[first..].starts_with("request_id=\"r-1\""), "{text}");
        assert!(text.contains("first\\nsecond\\rthird"), "{text}");
    }

    #[test]
    fn text_lines_start_with_the_request_fields() {
        let out = Captured::default();
        log_in_a_request(
            tracing_subscriber::fmt()
                .with_writer(out.clone())
                .without_time()
                .with_ansi(false)
                .event_format(TextLine::default().without_time())
                .finish(),
        );
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            " WARN request{request_id=\"r-\\\"1\\\"\" queue=\"requests\" key=\"batch\"}: \
             lib{conn=7}: sendgate::telemetry::tests: refused event=\"send_failclosed\" \
             consecutive_failures=3",
        );
        assert_eq!(
            lines[1],
            " INFO sendgate::telemetry::tests: what=\"outside\""
        );
    }
}
