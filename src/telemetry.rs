//! Logs: structured `tracing` events with stable `event` names (`send_failclosed`,
//! `depth_read_failed`, `drain_started`, ...), human-readable by default, JSON lines with
//! `SENDGATE_LOG_FORMAT=json`. `RUST_LOG` sets the level (default `info`).
//!
//! An event logged while serving a request runs inside the request's span (see
//! `http/context.rs`), so it carries `request_id` (and `queue`, `key` once known): in the
//! text format as the span's prefix, in JSON as top-level fields next to the event's own
//! (`{"event":"send_failclosed","request_id":"...","queue":"requests",...}`), so a log
//! query filters on `request_id` directly. Work a request hands to a shared task (the
//! embedded writer thread, a token refresh) logs without one: it serves many requests.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

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
            .try_init(),
        LogFormat::Text => builder.fmt_fields(TextFields).try_init(),
    };
}

/// The text format's fields, exactly as `tracing_subscriber`'s `DefaultFields` writes them,
/// with one shortcut: a plain string field (printable ASCII without `"` or `\`, no colours)
/// is written as `name="value"` in one go instead of through `Debug`, which escapes it one
/// character at a time. Every request's span records three such fields (`request_id`,
/// `key`, `queue`): through `Debug` they were ~5 % of a refused send's instructions.
struct TextFields;

impl<'a> tracing_subscriber::field::MakeVisitor<Writer<'a>> for TextFields {
    type Visitor = TextVisitor<'a>;

    fn make_visitor(&self, writer: Writer<'a>) -> Self::Visitor {
        TextVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        }
    }
}

struct TextVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    /// Anything but a plain string: `DefaultFields`' own visitor writes this one field.
    fn delegate(&mut self, field: &Field, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        // `DefaultVisitor` skips the `log` crate's metadata fields without padding.
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.is_empty = false;
        self.result = tracing_subscriber::field::VisitOutput::finish(visitor);
    }
}

/// Written by `Debug` exactly as it is, between quotes.
fn is_plain(value: &str) -> bool {
    value
        .bytes()
        .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let name = field.name();
        let special = name == "message" || name.starts_with("r#") || name.starts_with("log.");
        if special || self.writer.has_ansi_escapes() || !is_plain(value) {
            return self.delegate(field, |v| v.record_str(field, value));
        }
        if self.result.is_err() {
            return;
        }
        let pad = if std::mem::take(&mut self.is_empty) {
            ""
        } else {
            " "
        };
        let w = &mut self.writer;
        self.result = w
            .write_str(pad)
            .and_then(|()| w.write_str(name))
            .and_then(|()| w.write_str("=\""))
            .and_then(|()| w.write_str(value))
            .and_then(|()| w.write_char('"'));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.delegate(field, |v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.delegate(field, |v| v.record_debug(field, value));
    }
}

impl tracing_subscriber::field::VisitOutput<fmt::Result> for TextVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl tracing_subscriber::field::VisitFmt for TextVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
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

/// `RUST_LOG` (or `info` when unset or invalid), with [`NO_PAYLOADS`] on top.
fn filter(rust_log: Option<&str>) -> EnvFilter {
    let filter = rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    NO_PAYLOADS.iter().fold(filter, |filter, directive| {
        // Constants, checked by the tests below: never input.
        filter.add_directive(directive.parse().expect("a valid directive"))
    })
}

/// Logs never carry message bodies or the broker password, whatever `RUST_LOG` says.
/// The AMQP client logs a message the broker returns (a `mandatory` publish to a queue
/// that is gone) with its whole payload, at WARN (the backend maps that return to
/// `send_failed` itself); at TRACE it logs every frame it reads or writes (`Debug` of a
/// body frame is the payload, of `connection.start-ok` the PLAIN password) and the
/// frames it discards. Those modules stay at DEBUG at most; nothing else of lapin's is
/// touched.
const NO_PAYLOADS: &[&str] = &[
    "lapin::returned_messages=off",
    "lapin::channels=debug",
    "lapin::io_loop=debug",
    "lapin::frames=debug",
];

/// One JSON object per event: `timestamp`, `level`, `target`, the fields of the spans it
/// happened in (outermost first) and the event's own fields, all at the top level. On a
/// name clash the event's field wins, then the innermost span's.
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

/// A span's fields as JSON object members (`"request_id":"r-1","queue":"requests"`),
/// appended to as fields are recorded, never re-parsed: a request's span costs one small
/// string, and its fields are only merged into an object when an event is written.
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

#[cfg(test)]
mod tests {
    use super::*;

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

    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    /// What a subscriber filtered by `RUST_LOG=rust_log` writes for one event per target.
    fn logged_under(rust_log: &str) -> String {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_env_filter(filter(Some(rust_log)))
            .finish();
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
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
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
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    /// Spans and events with every kind of field, as the text format writes them.
    fn text_logged(fields: impl for<'w> FormatFields<'w> + Send + Sync + 'static) -> String {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .without_time()
            .with_ansi(false)
            .fmt_fields(fields)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::error_span!(
                "request",
                request_id = "5f0c6a1e-8d1b-4f57-9a43-0d6c1f6e2b7a",
                queue = tracing::field::Empty,
                key = tracing::field::Empty,
            );
            let _entered = span.enter();
            span.record("key", "bench-sender");
            span.record("queue", "with \"quotes\" and \\ and é\n");
            let error = std::io::Error::other("broken pipe");
            tracing::warn!(
                event = "send_failed",
                plain = "text",
                odd = "tab\there",
                empty = "",
                r#type = "raw",
                n = 42u64,
                i = -3i64,
                yes = true,
                ratio = 0.5f64,
                debugged = ?vec!["a"],
                shown = %"displayed",
                error = &error as &(dyn std::error::Error + 'static),
                "a message with \"quotes\""
            );
            tracing::info!(only = "one");
            tracing::info!("just a message");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn the_text_fields_are_written_exactly_as_tracing_writes_them() {
        let ours = text_logged(TextFields);
        assert_eq!(
            ours,
            text_logged(tracing_subscriber::fmt::format::DefaultFields::new())
        );
        assert!(
            ours.contains("request_id=\"5f0c6a1e-8d1b-4f57-9a43-0d6c1f6e2b7a\""),
            "{ours}"
        );
        assert!(ours.contains("key=\"bench-sender\""), "{ours}");
    }

    #[test]
    fn span_fields_recorded_later_sit_next_to_the_event_fields() {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .fmt_fields(JsonMembers)
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::error_span!(
                "request",
                request_id = "r-\"1\"",
                queue = tracing::field::Empty,
                key = tracing::field::Empty,
            );
            let _in = span.enter();
            span.record("queue", "requests");
            span.record("key", "batch");
            tracing::warn!(
                event = "send_failclosed",
                consecutive_failures = 3u32,
                "refused"
            );
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["request_id"], "r-\"1\"");
        assert_eq!(line["queue"], "requests");
        assert_eq!(line["key"], "batch");
        assert_eq!(line["key"], "batch");
        assert_eq!(line["event"], "send_failclosed");
        assert_eq!(line["consecutive_failures"], 3);
        assert_eq!(line["message"], "refused");
        assert_eq!(line["level"], "WARN");
        assert!(line["timestamp"].is_string() && line["target"].is_string());
    }
}
