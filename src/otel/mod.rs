//! OpenTelemetry over OTLP/HTTP protobuf: a span per send and the sends' metrics, exported
//! only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or a signal's own endpoint) is set. Unset,
//! nothing here is built: the send routes hold `Option<Otel>` and pay one branch.
//!
//! - The span (`send {queue}`, kind producer) is made with the OpenTelemetry API directly,
//!   not as a `tracing` span (see `telemetry.rs` on what those cost per request). Its parent
//!   is the request's `traceparent`; a single send's message carries the span's own
//!   context, so the consumer's trace continues from the send. Its attributes follow the
//!   messaging semantic conventions, plus the admission decision (`sendgate.*`); never a
//!   body, a property's value, a token or a key.
//! - The metrics: `messaging.client.operation.duration` (s) and `sendgate.refusals` by
//!   code, read by the SDK's periodic reader.
//! - Export runs on a thread of its own with its own runtime (`sendgate-otel`): spans leave
//!   the request path through a bounded queue (`spans.rs`: dropped and counted when full),
//!   and every export request is bounded by `OTEL_EXPORTER_OTLP_TIMEOUT`. A slow or dead
//!   collector never slows a send.
//!
//! What this module knows of a send comes in as plain values ([`SendRecord`]): it knows
//! nothing of HTTP or admission.

mod client;
mod spans;

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _,
    TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter as _};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::config::OtelSettings;
use crate::domain::{TraceContext, TraceParent};
pub use spans::SpanCounts;

/// The attribute names used here (the semantic conventions' and sendgate's own).
pub mod attr {
    pub const MESSAGING_SYSTEM: &str = "messaging.system";
    pub const MESSAGING_DESTINATION_NAME: &str = "messaging.destination.name";
    pub const MESSAGING_OPERATION_TYPE: &str = "messaging.operation.type";
    pub const MESSAGING_OPERATION_NAME: &str = "messaging.operation.name";
    pub const MESSAGING_MESSAGE_ID: &str = "messaging.message.id";
    pub const MESSAGING_BATCH_MESSAGE_COUNT: &str = "messaging.batch.message_count";
    pub const ERROR_TYPE: &str = "error.type";
    pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
    pub const ADMISSION_OUTCOME: &str = "sendgate.admission.outcome";
    pub const REFUSAL_REASON: &str = "sendgate.refusal.reason";
    pub const TENANT: &str = "sendgate.tenant";
    pub const BACKEND_ROLE: &str = "sendgate.backend";
    pub const DRY_RUN: &str = "sendgate.dry_run";
}

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
    #[error("OpenTelemetry: cannot build the exporters' HTTP client: {0}")]
    Client(String),
    #[error("OpenTelemetry: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("OpenTelemetry: cannot start the export thread: {0}")]
    Thread(std::io::Error),
}

/// The export pipeline, built once at start-up when an endpoint is set.
pub struct Otel {
    tracer: Option<SdkTracer>,
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
    instruments: Option<Instruments>,
    counts: Arc<SpanCounts>,
    exporting: Mutex<Option<spans::Exporting>>,
    /// Ends the export thread's runtime once everything is flushed.
    release: Mutex<Option<oneshot::Sender<()>>>,
}

struct Instruments {
    duration: Histogram<f64>,
    refusals: Counter<u64>,
}

/// The semantic conventions' advice for `messaging.client.operation.duration`.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

impl Otel {
    /// The pipeline `settings` ask for, or `None` when no endpoint is set (nothing built).
    pub fn build(settings: &OtelSettings) -> Result<Option<Self>, OtelError> {
        if !settings.enabled() {
            return Ok(None);
        }
        if let Some(protocol) = settings
            .protocol
            .as_deref()
            .filter(|p| !p.eq_ignore_ascii_case("http/protobuf"))
        {
            tracing::warn!(
                event = "otel_protocol_unsupported",
                protocol,
                "OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is built in; sending that"
            );
        }
        crate::tls::install_ring();
        let client = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .build()
            .map_err(|e| OtelError::Client(e.to_string()))?;
        // The export thread first: its runtime is made, driven and dropped there (a
        // runtime dropped on the caller's async thread would panic). Released when this
        // returns an error (the sender dropped) or by `shutdown`.
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
        let http = client::OnExportRuntime::new(client, runtime.clone());
        let resource = resource();
        let scope = InstrumentationScope::builder("sendgate")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let counts = Arc::new(SpanCounts::default());

        let mut traces = None;
        if let Some(url) = &settings.traces_endpoint {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(http.clone())
                .with_endpoint(url)
                .with_timeout(settings.request_timeout)
                .build()?;
            exporter.set_resource(&resource);
            let bounds = spans::Bounds {
                queue: settings.queue_size,
                batch: settings.batch_size,
                delay: settings.schedule_delay,
                export_timeout: settings.export_timeout,
            };
            let (processor, exporting, task) =
                spans::pipeline(exporter, bounds, Arc::clone(&counts));
            // The sampler is the SDK's default, which reads OTEL_TRACES_SAMPLER(_ARG).
            let provider = SdkTracerProvider::builder()
                .with_span_processor(processor)
                .with_resource(resource.clone())
                .build();
            runtime.spawn(task);
            traces = Some((
                provider.tracer_with_scope(scope.clone()),
                provider,
                exporting,
            ));
        }
        let mut metrics = None;
        if let Some(url) = &settings.metrics_endpoint {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_http_client(http)
                .with_endpoint(url)
                .with_timeout(settings.request_timeout)
                .with_temporality(Temporality::Cumulative)
                .build()?;
            let reader = PeriodicReader::builder(exporter)
                .with_interval(settings.metric_interval)
                .build();
            let provider = SdkMeterProvider::builder()
                .with_reader(reader)
                .with_resource(resource)
                .build();
            let meter = provider.meter_with_scope(scope);
            let instruments = Instruments {
                duration: meter
                    .f64_histogram("messaging.client.operation.duration")
                    .with_unit("s")
                    .with_description("Duration of a send request, from its arrival to its answer.")
                    .with_boundaries(DURATION_BUCKETS.to_vec())
                    .build(),
                refusals: meter
                    .u64_counter("sendgate.refusals")
                    .with_unit("{refusal}")
                    .with_description(
                        "Sends the gateway refused, by error.type (the problem code).",
                    )
                    .build(),
            };
            metrics = Some((provider, instruments));
        }

        tracing::info!(
            event = "otel_exporting",
            traces = settings.traces_endpoint.as_deref().unwrap_or("off"),
            metrics = settings.metrics_endpoint.as_deref().unwrap_or("off"),
            "exporting OpenTelemetry over OTLP/HTTP"
        );
        let (tracer, tracer_provider, exporting) = match traces {
            Some((t, p, e)) => (Some(t), Some(p), Some(e)),
            None => (None, None, None),
        };
        let (meter_provider, instruments) = match metrics {
            Some((p, i)) => (Some(p), Some(i)),
            None => (None, None),
        };
        Ok(Some(Self {
            tracer,
            tracer_provider,
            meter_provider,
            instruments,
            counts,
            exporting: Mutex::new(exporting),
            release: Mutex::new(Some(release)),
        }))
    }

    /// What became of the spans so far.
    pub fn span_counts(&self) -> &SpanCounts {
        &self.counts
    }

    /// A send's span, started now. `queue` is a served queue's name or `unknown`; `parent`
    /// the request's valid `traceparent` and `tracestate`, if it had one.
    pub fn start_send<'a>(&'a self, queue: &'a str, parent: Option<&TraceContext>) -> SendSpan<'a> {
        let span = self.tracer.as_ref().map(|tracer| {
            let name = if queue == "unknown" {
                "send".to_owned()
            } else {
                format!("send {queue}")
            };
            let builder = SpanBuilder::from_name(name)
                .with_kind(SpanKind::Producer)
                .with_attributes([
                    KeyValue::new(attr::MESSAGING_DESTINATION_NAME, queue.to_owned()),
                    KeyValue::new(attr::MESSAGING_OPERATION_TYPE, "send"),
                    KeyValue::new(attr::MESSAGING_OPERATION_NAME, "send"),
                ]);
            tracer.build_with_context(builder, &remote_parent(parent))
        });
        SendSpan {
            otel: self,
            span,
            queue,
            started: Instant::now(),
        }
    }

    /// Flushes and stops within `within`: the metrics' last export, then the queued spans.
    /// What cannot go in time is lost with the process; the drain never waits longer.
    pub async fn shutdown(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        if let Some(provider) = self.meter_provider.clone() {
            // The SDK's reader blocks its caller until its last export ends.
            let flushed = tokio::task::spawn_blocking(move || provider.shutdown());
            let _ = tokio::time::timeout(within / 2, flushed).await;
        }
        let exporting = self.exporting.lock().take();
        if let Some(exporting) = exporting {
            exporting
                .stop(deadline.saturating_duration_since(tokio::time::Instant::now()))
                .await;
        }
        if let Some(provider) = &self.tracer_provider {
            let _ = provider.shutdown();
        }
        if let Some(release) = self.release.lock().take() {
            let _ = release.send(());
        }
    }
}

/// The request's context as a remote parent, or none (a root span).
fn remote_parent(parent: Option<&TraceContext>) -> Context {
    let Some(parent) = parent else {
        return Context::new();
    };
    let state = parent
        .state
        .as_ref()
        .and_then(|s| s.as_str().parse::<TraceState>().ok())
        .unwrap_or_default();
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(parent.parent.trace_id_bytes()),
        SpanId::from_bytes(parent.parent.parent_id_bytes()),
        TraceFlags::new(parent.parent.flags()),
        true,
        state,
    ))
}

/// `service.name` and the rest as the SDK reads them (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`); `sendgate` when neither names the service.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        Resource::builder().with_service_name("sendgate").build()
    }
}

/// How the gateway decided on a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Let through to the broker (which may still have failed it).
    Admitted,
    /// Refused by the gateway itself.
    Refused,
    /// A dry run, validated.
    Validated,
}

impl Decision {
    fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Refused => "refused",
            Self::Validated => "validated",
        }
    }
}

/// How a send was answered, in plain values: what its span and metrics say.
#[derive(Debug, Clone, Copy)]
pub struct SendRecord<'a> {
    /// The backend's `messaging.system` ([`messaging_system`]).
    pub system: &'static str,
    /// `primary` or `fallback`, when the send was routed.
    pub backend: Option<&'static str>,
    pub status: u16,
    /// The problem code of a failure or refusal (`error.type`); `None` for a success.
    pub error: Option<&'static str>,
    pub decision: Decision,
    /// Why a `queue_full` was refused: `ceiling`, `criticality`, `tenant_share`, `tenant_quota`.
    pub reason: Option<&'static str>,
    pub message_id: Option<&'a str>,
    /// A batch's entries.
    pub message_count: Option<usize>,
    pub tenant: Option<&'a str>,
}

/// A send's span, between its arrival and its answer.
pub struct SendSpan<'a> {
    otel: &'a Otel,
    span: Option<opentelemetry_sdk::trace::Span>,
    queue: &'a str,
    started: Instant,
}

impl SendSpan<'_> {
    /// The span's own context as the message's (`request`'s `tracestate` kept): its trace
    /// and its span id as the parent id, sampled as the span is. `None` without spans.
    pub fn trace(&self, request: &TraceContext) -> Option<TraceContext> {
        let context = self.span.as_ref()?.span_context();
        let parent = TraceParent::from_parts(
            context.trace_id().to_bytes(),
            context.span_id().to_bytes(),
            context.is_sampled(),
        )?;
        Some(TraceContext {
            parent,
            state: request.state.clone(),
        })
    }

    /// Ends the span with what the answer was, and records the metrics.
    pub fn end(self, record: SendRecord<'_>) {
        let elapsed = self.started.elapsed().as_secs_f64();
        if let Some(mut span) = self.span {
            if span.is_recording() {
                span.set_attributes(span_attributes(&record));
                if record.status >= 500 {
                    span.set_status(Status::error(record.error.unwrap_or("error")));
                }
            }
            span.end();
        }
        let Some(instruments) = &self.otel.instruments else {
            return;
        };
        let queue = Value::from(self.queue.to_owned());
        let base = [
            KeyValue::new(attr::MESSAGING_SYSTEM, record.system),
            KeyValue::new(attr::MESSAGING_DESTINATION_NAME, queue.clone()),
            KeyValue::new(attr::MESSAGING_OPERATION_NAME, "send"),
            KeyValue::new(attr::MESSAGING_OPERATION_TYPE, "send"),
        ];
        match record.error {
            None => instruments.duration.record(elapsed, &base),
            Some(code) => {
                let [a, b, c, d] = base;
                instruments.duration.record(
                    elapsed,
                    &[a, b, c, d, KeyValue::new(attr::ERROR_TYPE, code)],
                );
            }
        }
        if record.decision == Decision::Refused {
            let code = record.error.unwrap_or("refused");
            let mut attributes = vec![
                KeyValue::new(attr::ERROR_TYPE, code),
                KeyValue::new(attr::MESSAGING_DESTINATION_NAME, queue),
            ];
            if let Some(reason) = record.reason {
                attributes.push(KeyValue::new(attr::REFUSAL_REASON, reason));
            }
            instruments.refusals.add(1, &attributes);
        }
    }
}

fn span_attributes(record: &SendRecord<'_>) -> Vec<KeyValue> {
    let mut out = Vec::with_capacity(9);
    out.push(KeyValue::new(attr::MESSAGING_SYSTEM, record.system));
    out.push(KeyValue::new(
        attr::HTTP_RESPONSE_STATUS_CODE,
        i64::from(record.status),
    ));
    out.push(KeyValue::new(
        attr::ADMISSION_OUTCOME,
        record.decision.as_str(),
    ));
    if record.decision == Decision::Validated {
        out.push(KeyValue::new(attr::DRY_RUN, true));
    }
    if let Some(backend) = record.backend {
        out.push(KeyValue::new(attr::BACKEND_ROLE, backend));
    }
    if let Some(code) = record.error {
        out.push(KeyValue::new(attr::ERROR_TYPE, code));
    }
    if let Some(reason) = record.reason {
        out.push(KeyValue::new(attr::REFUSAL_REASON, reason));
    }
    if let Some(id) = record.message_id {
        out.push(KeyValue::new(attr::MESSAGING_MESSAGE_ID, id.to_owned()));
    }
    if let Some(n) = record.message_count {
        out.push(KeyValue::new(
            attr::MESSAGING_BATCH_MESSAGE_COUNT,
            i64::try_from(n).unwrap_or(i64::MAX),
        ));
    }
    if let Some(tenant) = record.tenant {
        out.push(KeyValue::new(attr::TENANT, tenant.to_owned()));
    }
    out
}
