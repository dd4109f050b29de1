//! OpenTelemetry over OTLP (HTTP with protobuf, or gRPC): a span per send and the sends' metrics, exported
//! only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or a signal's own endpoint) is set. Unset,
//! nothing here is built: the send routes hold `Option<Otel>` and pay one branch.
//!
//! - The span (`send {queue}`, kind producer): its parent is the request's `traceparent`,
//!   sampled by the SDK's sampler (`OTEL_TRACES_SAMPLER`); a single send's message carries
//!   the span's own context, so the consumer's trace continues from the send. Its
//!   attributes follow the messaging semantic conventions, plus the admission decision
//!   (`sendgate.*`); never a body, a property's value, a token or a key.
//! - The metrics: `messaging.client.operation.duration` (s) and `sendgate.refusals` by
//!   code, cumulative (`meters.rs`).
//! - Export runs on a thread of its own with its own runtime (`sendgate-otel`): spans leave
//!   the request path through a bounded buffer (`spans.rs`: dropped and counted when full),
//!   are encoded there (`encode.rs`) and posted (`client/`), each export bounded by
//!   `OTEL_EXPORTER_OTLP_TIMEOUT`. A slow or dead collector never slows a send.
//!
//! Why not the SDK's tracer, span processor and OTLP exporter: a send's span through them
//! cost 40 % more instructions on the 429 path (bench comparison 13: the span object, its
//! attributes as `KeyValue`s, the metric instruments' attribute-set lookups, and on the
//! export thread the conversion to the generated protobuf types, an allocation for every
//! id, key and value). What a send records here is a record of plain values; the SDK still
//! samples, generates the ids and reads the resource.
//!
//! What this module knows of a send comes in as plain values ([`SendRecord`]): it knows
//! nothing of HTTP or admission.

mod client;
mod encode;
mod meters;
mod names;
mod record;
mod spans;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_sdk::trace::{
    IdGenerator as _, RandomIdGenerator, SamplingDecision, ShouldSample,
};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::config::{OtelSettings, OtlpProtocol, SignalExport};
use crate::domain::{TraceContext, TraceParent};
use crate::telemetry::EveryPeriod;
use encode::{Origin, SpanEncoder};
use meters::{Labels, Meters};
pub use record::{attr, Decision, SendRecord};
use record::{OwnedRecord, SpanRecord};
use spans::SpanBuffer;
pub use spans::SpanCounts;

/// `messaging.system` for a backend's kind: the conventions' names for Service Bus and
/// RabbitMQ; the embedded queue (SQLite in the gateway) is none of theirs.
pub fn messaging_system(backend_kind: &str) -> &'static str {
    match backend_kind {
        "servicebus" => "servicebus",
        "rabbitmq" => "rabbitmq",
        _ => "sendgate_embedded",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("OpenTelemetry: cannot build an exporter's client: {0}")]
    Client(String),
    #[error("OpenTelemetry: cannot start the export thread: {0}")]
    Thread(std::io::Error),
}

/// The export pipeline, built once at start-up when an endpoint is set.
pub struct Otel {
    traces: Option<Traces>,
    meters: Option<Arc<Meters>>,
    counts: Arc<SpanCounts>,
    stopping: Mutex<Stopping>,
}

/// Sampling and the buffer: what a send's span needs.
struct Traces {
    sampler: Box<dyn ShouldSample>,
    ids: RandomIdGenerator,
    buffer: Arc<SpanBuffer>,
    names: names::Names,
}

/// What [`Otel::shutdown`] stops, each once.
#[derive(Default)]
struct Stopping {
    spans: Option<spans::Exporting>,
    metrics: Option<MetricsExporting>,
    /// Ends the export thread's runtime once everything is flushed.
    release: Option<oneshot::Sender<()>>,
}

impl Otel {
    /// The pipeline `settings` ask for, or `None` when no endpoint is set (nothing built).
    pub fn build(settings: &OtelSettings) -> Result<Option<Self>, OtelError> {
        if !settings.enabled() {
            return Ok(None);
        }
        warn_unsupported(settings);
        crate::tls::install_ring();
        let client = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .build()
            .map_err(|e| OtelError::Client(e.to_string()))?;
        let (runtime, release) = export_thread()?;
        let origin = Origin::new(resource());
        let counts = Arc::new(SpanCounts::default());
        let mut stopping = Stopping {
            release: Some(release),
            ..Stopping::default()
        };
        let (traces_poster, metrics_poster) = posters(settings, &client, &runtime)?;
        let traces = traces_poster.map(|poster| {
            let (traces, exporting) = start_traces(poster, settings, &origin, &counts, &runtime);
            stopping.spans = Some(exporting);
            traces
        });
        let meters = metrics_poster.map(|poster| {
            let (meters, exporting) = start_metrics(poster, settings, &origin, &runtime);
            stopping.metrics = Some(exporting);
            meters
        });
        log_exporting(settings);
        Ok(Some(Self {
            traces,
            meters,
            counts,
            stopping: Mutex::new(stopping),
        }))
    }

    /// What became of the spans so far.
    pub fn span_counts(&self) -> &SpanCounts {
        &self.counts
    }

    /// A send's span, started now. `queue` is a served queue's name or `unknown`; `parent`
    /// the request's valid `traceparent` and `tracestate`, if it had one.
    pub fn start_send<'a>(&'a self, queue: &'a str, parent: Option<&TraceContext>) -> SendSpan<'a> {
        SendSpan {
            otel: self,
            queue,
            started: Instant::now(),
            span: self.traces.as_ref().map(|t| t.start(parent)),
        }
    }

    /// Flushes and stops within `within`: the metrics' last export, then the buffered spans.
    /// What cannot go in time is lost with the process; the drain never waits longer.
    pub async fn shutdown(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let (spans, metrics, release) = {
            let mut stopping = self.stopping.lock();
            (
                stopping.spans.take(),
                stopping.metrics.take(),
                stopping.release.take(),
            )
        };
        if let Some(metrics) = metrics {
            let _ = metrics.stop.send(());
            let _ = tokio::time::timeout(within / 2, metrics.done).await;
        }
        if let Some(spans) = spans {
            spans
                .stop(deadline.saturating_duration_since(tokio::time::Instant::now()))
                .await;
        }
        if let Some(release) = release {
            let _ = release.send(());
        }
    }
}

/// What the settings ask for that is not built in: said once, at start-up.
fn warn_unsupported(settings: &OtelSettings) {
    for (var, value) in &settings.unsupported_protocols {
        tracing::warn!(
            event = "otel_protocol_unsupported",
            variable = var,
            protocol = value.as_str(),
            "only grpc and http/protobuf are built in; the variable is ignored"
        );
    }
    if let Some(exporter) = &settings.unsupported_metrics_exporter {
        tracing::warn!(
            event = "otel_metrics_exporter_unsupported",
            exporter = exporter.as_str(),
            "OTEL_METRICS_EXPORTER: only otlp and none are built in; the value is ignored and the metrics are exported over OTLP"
        );
    }
    if let Some(compression) = settings
        .compression
        .as_deref()
        .filter(|c| !c.eq_ignore_ascii_case("none"))
    {
        tracing::warn!(
            event = "otel_compression_unsupported",
            compression,
            "OTEL_EXPORTER_OTLP_COMPRESSION: no compression is built in; exporting uncompressed"
        );
    }
}

/// The posters of the traces and of the metrics, for the signals that are exported.
fn posters(
    settings: &OtelSettings,
    client: &reqwest::Client,
    runtime: &tokio::runtime::Handle,
) -> Result<(Option<client::Poster>, Option<client::Poster>), OtelError> {
    // The gRPC channels spawn their connections' tasks on the export thread's runtime.
    let _entered = runtime.enter();
    let poster = |export: &SignalExport, signal| match export.protocol {
        OtlpProtocol::HttpProtobuf => Ok(client::Poster::http(
            client.clone(),
            export.endpoint.clone(),
            header_map(&export.headers),
        )),
        OtlpProtocol::Grpc => client::Poster::grpc(
            &export.endpoint,
            header_map(&export.headers),
            signal,
            settings.request_timeout,
        )
        .map_err(OtelError::Client),
    };
    let traces = settings
        .traces
        .as_ref()
        .map(|export| poster(export, client::Signal::Traces))
        .transpose()?;
    let metrics = settings
        .metrics
        .as_ref()
        .map(|export| poster(export, client::Signal::Metrics))
        .transpose()?;
    Ok((traces, metrics))
}

/// The spans' buffer, its export task started on `runtime`, and the sampling before it.
fn start_traces(
    poster: client::Poster,
    settings: &OtelSettings,
    origin: &Origin,
    counts: &Arc<SpanCounts>,
    runtime: &tokio::runtime::Handle,
) -> (Traces, spans::Exporting) {
    let exporter = OtlpSpans {
        poster,
        origin: origin.clone(),
        encoder: Mutex::new(SpanEncoder::default()),
        timeout: settings.request_timeout,
    };
    let bounds = spans::Bounds {
        queue: settings.queue_size,
        batch: settings.batch_size,
        delay: settings.schedule_delay,
        export_timeout: settings.export_timeout,
    };
    let (buffer, exporting, task) = spans::pipeline(exporter, bounds, Arc::clone(counts));
    runtime.spawn(task);
    let traces = Traces {
        // The SDK's sampler as it reads OTEL_TRACES_SAMPLER(_ARG).
        sampler: opentelemetry_sdk::trace::Config::default().sampler,
        ids: RandomIdGenerator::default(),
        buffer,
        names: names::Names::default(),
    };
    (traces, exporting)
}

/// The meters, their periodic export started on `runtime`.
fn start_metrics(
    poster: client::Poster,
    settings: &OtelSettings,
    origin: &Origin,
    runtime: &tokio::runtime::Handle,
) -> (Arc<Meters>, MetricsExporting) {
    let meters = Arc::new(Meters::default());
    let (stop, stopped) = oneshot::channel();
    let (finished, done) = oneshot::channel();
    let task = export_metrics(
        Arc::clone(&meters),
        poster,
        origin.clone(),
        settings.metric_interval,
        settings.request_timeout,
        stopped,
    );
    runtime.spawn(async move {
        task.await;
        let _ = finished.send(());
    });
    (meters, MetricsExporting { stop, done })
}

/// Where each signal goes (the endpoint without its user info), or `off`.
fn log_exporting(settings: &OtelSettings) {
    let shown = |export: &Option<SignalExport>| {
        export.as_ref().map_or_else(
            || "off".to_owned(),
            |e| format!("{} {}", e.protocol.as_str(), without_user_info(&e.endpoint)),
        )
    };
    tracing::info!(
        event = "otel_exporting",
        traces = shown(&settings.traces),
        metrics = shown(&settings.metrics),
        "exporting OpenTelemetry over OTLP"
    );
}

/// The export thread: its runtime is made, driven and dropped there (a runtime dropped on
/// the caller's async thread would panic). It runs until the sender is used or dropped.
fn export_thread() -> Result<(tokio::runtime::Handle, oneshot::Sender<()>), OtelError> {
    let (release, released) = oneshot::channel::<()>();
    let (made, runtime) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("sendgate-otel".into())
        .spawn(move || {
            let built = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match built {
                Ok(runtime) => {
                    let _ = made.send(Ok(runtime.handle().clone()));
                    runtime.block_on(async move {
                        let _ = released.await;
                    });
                }
                Err(e) => {
                    let _ = made.send(Err(e));
                }
            }
        })
        .map_err(OtelError::Thread)?;
    let runtime = runtime
        .recv()
        .map_err(|_| OtelError::Thread(std::io::Error::other("the export thread ended")))?
        .map_err(OtelError::Thread)?;
    Ok((runtime, release))
}

/// `url` without its user info (`user:password@`): a credential, never logged.
fn without_user_info(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.into();
    };
    let authority = rest.find(['/', '?', '#']).map_or(rest, |end| &rest[..end]);
    match authority.rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]).into(),
        None => url.into(),
    }
}

fn header_map(headers: &crate::config::ExportHeaders) -> reqwest::header::HeaderMap {
    headers
        .iter()
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// Spans to the collector: encoded on the export thread, posted.
struct OtlpSpans {
    poster: client::Poster,
    origin: Origin,
    /// Only the export task uses it: the lock is never contended.
    encoder: Mutex<SpanEncoder>,
    timeout: Duration,
}

impl spans::Export for OtlpSpans {
    async fn export(&self, batch: Vec<SpanRecord>) -> Result<spans::Rejected, String> {
        let body = self.encoder.lock().encode(&self.origin, &batch);
        drop(batch);
        let answer = self.poster.post(body, self.timeout).await?;
        Ok(rejected_spans(&answer))
    }
}

/// What a `200`'s `ExportTraceServiceResponse` says was rejected (a partial success); none
/// when it is empty or not one.
fn rejected_spans(answer: &[u8]) -> spans::Rejected {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
    use prost::Message as _;
    let partial = ExportTraceServiceResponse::decode(answer)
        .ok()
        .and_then(|r| r.partial_success);
    match partial {
        Some(p) if p.rejected_spans > 0 => spans::Rejected {
            spans: u64::try_from(p.rejected_spans).unwrap_or(0),
            why: p.error_message,
        },
        _ => spans::Rejected::default(),
    }
}

/// What a `200`'s `ExportMetricsServiceResponse` says was rejected: the data points and why.
fn rejected_points(answer: &[u8]) -> Option<(i64, String)> {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
    use prost::Message as _;
    let partial = ExportMetricsServiceResponse::decode(answer)
        .ok()?
        .partial_success?;
    (partial.rejected_data_points > 0 || !partial.error_message.is_empty())
        .then_some((partial.rejected_data_points, partial.error_message))
}

struct MetricsExporting {
    stop: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

/// Every `interval`, and once more when stopped: the totals, when any send was counted.
async fn export_metrics(
    meters: Arc<Meters>,
    poster: client::Poster,
    origin: Origin,
    interval: Duration,
    timeout: Duration,
    mut stop: oneshot::Receiver<()>,
) {
    static FAILED: EveryPeriod = EveryPeriod::new(Duration::from_secs(60));
    let start = unix_nanos(SystemTime::now());
    loop {
        let stopping = tokio::select! {
            biased;
            _ = &mut stop => true,
            () = tokio::time::sleep(interval) => false,
        };
        let cells = meters.snapshot();
        if !cells.is_empty() {
            let body = encode::metrics(&origin, &cells, start, unix_nanos(SystemTime::now()));
            let error = match poster.post(body, timeout).await {
                Ok(answer) => rejected_points(&answer).map(|(points, why)| {
                    let why = why.chars().take(200).collect::<String>();
                    format!("the collector rejected {points} data points: {why}")
                }),
                Err(error) => Some(error),
            };
            if let Some(error) = error {
                if let Some(held_back) = FAILED.admit() {
                    tracing::warn!(
                        event = "otel_metrics_export_failed",
                        error = %error,
                        failures_held_back = held_back,
                        "could not export the metrics; the next export sends the totals"
                    );
                }
            }
        }
        if stopping {
            return;
        }
    }
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `service.name` and the rest as the SDK reads them (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`); `sendgate` when neither names the service; and a
/// `service.instance.id` of this process's own when they give none ([`with_instance_id`]).
fn resource() -> opentelemetry_proto::tonic::resource::v1::Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let resource = if named {
        detected
    } else {
        Resource::builder().with_service_name("sendgate").build()
    };
    let mut attributes = ResourceAttributesWithSchema::from(&resource).attributes.0;
    with_instance_id(&mut attributes, || uuid::Uuid::new_v4().to_string());
    opentelemetry_proto::tonic::resource::v1::Resource {
        attributes,
        dropped_attributes_count: 0,
        entity_refs: Vec::new(),
    }
}

/// Adds `service.instance.id` (a new UUID, as the semantic conventions advise) unless one is
/// set. The metrics are cumulative: without it every replica of a fleet exports the same
/// series under the same resource, and a collector or backend reads their different totals
/// as one series that jumps and resets (OpenTelemetry's single-writer rule).
fn with_instance_id(
    attributes: &mut Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
    id: impl FnOnce() -> String,
) {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    if attributes.iter().any(|kv| kv.key == "service.instance.id") {
        return;
    }
    attributes.push(KeyValue {
        key: "service.instance.id".into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(id())),
        }),
        key_strindex: 0,
    });
}

impl Traces {
    /// A span's ids and sampling, from its parent's when it has one.
    fn start(&self, parent: Option<&TraceContext>) -> Started {
        let span_id = self.ids.new_span_id().to_bytes();
        let (trace_id, decision) = match parent {
            None => {
                let trace_id = self.ids.new_trace_id();
                let decision = self.sampler.should_sample(
                    None,
                    trace_id,
                    "send",
                    &SpanKind::Producer,
                    &[],
                    &[],
                );
                (trace_id.to_bytes(), decision.decision)
            }
            Some(parent) => {
                let trace_id = TraceId::from_bytes(parent.parent.trace_id_bytes());
                let context = Context::new().with_remote_span_context(SpanContext::new(
                    trace_id,
                    SpanId::from_bytes(parent.parent.parent_id_bytes()),
                    TraceFlags::new(parent.parent.flags()),
                    true,
                    TraceState::NONE,
                ));
                let decision = self.sampler.should_sample(
                    Some(&context),
                    trace_id,
                    "send",
                    &SpanKind::Producer,
                    &[],
                    &[],
                );
                (trace_id.to_bytes(), decision.decision)
            }
        };
        let sampled = decision == SamplingDecision::RecordAndSample;
        Started {
            trace_id,
            span_id,
            sampled,
            parent: parent.map(|p| {
                (
                    p.parent.parent_id_bytes(),
                    p.state.as_ref().map(|s| Box::from(s.as_str())),
                )
            }),
            at: sampled.then(SystemTime::now),
        }
    }
}

/// A span's own context, and what its record needs when it is sampled.
struct Started {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
    parent: Option<([u8; 8], Option<Box<str>>)>,
    /// The wall clock at the start, when sampled.
    at: Option<SystemTime>,
}

/// A send's span, between its arrival and its answer.
pub struct SendSpan<'a> {
    otel: &'a Otel,
    queue: &'a str,
    started: Instant,
    span: Option<Started>,
}

impl SendSpan<'_> {
    /// The span's own context as the message's (`request`'s `tracestate` kept): its trace
    /// and its span id as the parent id, sampled as the span is. `None` without spans.
    pub fn trace(&self, request: &TraceContext) -> Option<TraceContext> {
        let span = self.span.as_ref()?;
        let parent = TraceParent::from_parts(span.trace_id, span.span_id, span.sampled)?;
        Some(TraceContext {
            parent,
            state: request.state.clone(),
        })
    }

    /// Ends the span with what the answer was, and records the metrics.
    pub fn end(self, record: SendRecord<'_>) {
        let elapsed = self.started.elapsed();
        if let Some(meters) = &self.otel.meters {
            let labels = Labels {
                system: record.system,
                error: record.error,
                refused: record.decision == Decision::Refused,
                reason: record.reason,
            };
            meters.record(self.queue, labels, elapsed.as_secs_f64());
        }
        let (Some(traces), Some(span)) = (&self.otel.traces, self.span) else {
            return;
        };
        let Some(at) = span.at else {
            return;
        };
        let start_unix_nanos = unix_nanos(at);
        let (parent_id, trace_state) = match span.parent {
            Some((id, state)) => (Some(id), state),
            None => (None, None),
        };
        traces.buffer.push(SpanRecord {
            trace_id: span.trace_id,
            span_id: span.span_id,
            parent_id,
            trace_state,
            start_unix_nanos,
            end_unix_nanos: start_unix_nanos
                .saturating_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)),
            queue: traces.names.get(self.queue),
            send: OwnedRecord::new(&record, &traces.names),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Captured;

    #[test]
    fn the_endpoints_are_logged_without_their_user_info() {
        for protocol in ["grpc", "http/protobuf"] {
            let env = [
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "http://user:PA55-WORD@127.0.0.1:9/base",
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let settings = crate::config::Settings::from_vars(&env).expect("settings");
            let out = Captured::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(out.clone())
                .with_ansi(false)
                .finish();
            let logging = Captured::install(subscriber);
            let otel = Otel::build(&settings.otel).expect("builds");
            drop(logging);
            drop(otel);
            let text = out.text();
            assert!(text.contains("otel_exporting"), "{text}");
            assert!(text.contains("http://127.0.0.1:9/base"), "{text}");
            assert!(!text.contains("PA55-WORD"), "{protocol}: {text}");
        }
        assert_eq!(without_user_info("https://h:4317"), "https://h:4317");
        assert_eq!(
            without_user_info("http://h/p@q"),
            "http://h/p@q",
            "a path's @"
        );
        assert_eq!(without_user_info("http://a:b@c@h?x"), "http://h?x");
    }

    /// Issue 41's review: an `OTEL_METRICS_EXPORTER` not built in is said at start-up, with
    /// the value as given, and the metrics are exported over OTLP as by default.
    #[test]
    fn an_unknown_metrics_exporter_is_warned_about_and_otlp_exports() {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_METRICS_EXPORTER", "prometheus"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let settings = crate::config::Settings::from_vars(&env).expect("settings");
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(out.clone())
            .finish();
        let logging = Captured::install(subscriber);
        let otel = Otel::build(&settings.otel).expect("builds");
        drop(logging);
        drop(otel);
        let warned: Vec<serde_json::Value> = out
            .text()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|l: &serde_json::Value| {
                l["fields"]["event"] == "otel_metrics_exporter_unsupported"
            })
            .collect();
        assert_eq!(warned.len(), 1, "{}", out.text());
        assert_eq!(warned[0]["level"], "WARN");
        assert_eq!(warned[0]["fields"]["exporter"], "prometheus");
        assert!(settings.otel.metrics.is_some(), "exported over OTLP");
    }

    fn instance_id(r: &opentelemetry_proto::tonic::resource::v1::Resource) -> Vec<String> {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        r.attributes
            .iter()
            .filter(|kv| kv.key == "service.instance.id")
            .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_partial_success_says_what_was_rejected() {
        use opentelemetry_proto::tonic::collector::metrics::v1::{
            ExportMetricsPartialSuccess, ExportMetricsServiceResponse,
        };
        use opentelemetry_proto::tonic::collector::trace::v1::{
            ExportTracePartialSuccess, ExportTraceServiceResponse,
        };
        use prost::Message as _;
        let partial = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: 3,
                error_message: "spans too old".into(),
            }),
        };
        assert_eq!(
            rejected_spans(&partial.encode_to_vec()),
            spans::Rejected {
                spans: 3,
                why: "spans too old".into()
            }
        );
        // An empty answer (the usual), an empty message, or no protobuf: nothing rejected.
        for answer in [
            Vec::new(),
            ExportTraceServiceResponse::default().encode_to_vec(),
            b"{\"partialSuccess\":{}}".to_vec(),
        ] {
            assert_eq!(rejected_spans(&answer), spans::Rejected::default());
        }
        let points = ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess {
                rejected_data_points: 2,
                error_message: "bad unit".into(),
            }),
        };
        assert_eq!(
            rejected_points(&points.encode_to_vec()),
            Some((2, "bad unit".into()))
        );
        assert_eq!(rejected_points(&[]), None);
    }

    #[test]
    fn each_process_is_an_instance_of_its_own_unless_told_which() {
        // Two gateways of one service: two instances, so two series of cumulative totals.
        let (one, two) = (resource(), resource());
        let (one, two) = (instance_id(&one), instance_id(&two));
        assert_eq!((one.len(), two.len()), (1, 1), "{one:?} {two:?}");
        assert_ne!(one, two);
        // OTEL_RESOURCE_ATTRIBUTES' service.instance.id is kept as it is.
        let mut given = resource().attributes;
        given.retain(|kv| kv.key != "service.instance.id");
        with_instance_id(&mut given, || "replica-1".into());
        with_instance_id(&mut given, || "other".into());
        let given = opentelemetry_proto::tonic::resource::v1::Resource {
            attributes: given,
            dropped_attributes_count: 0,
            entity_refs: Vec::new(),
        };
        assert_eq!(instance_id(&given), ["replica-1"]);
    }
}
