//! OpenTelemetry's settings: the variables sendgate's exporter reads itself (the
//! endpoints, the export deadline and interval, the span queue's bounds). The rest of the
//! specification's variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER`, the headers) are read by the OpenTelemetry SDK, as it reads them.

use std::time::Duration;

use super::error::ConfigError;
use super::layers::Layers;
use super::vars::{self as v, Var};

/// Where and how spans and metrics are exported; neither endpoint: nothing is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// The full URL spans are posted to (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, or
    /// the base endpoint's `/v1/traces`); `None`: no spans.
    pub traces_endpoint: Option<String>,
    /// The same for metrics (`/v1/metrics`); `None`: no metrics.
    pub metrics_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` when set: only `http/protobuf` is built in.
    pub protocol: Option<String>,
    /// One export request's deadline (`OTEL_EXPORTER_OTLP_TIMEOUT`).
    pub request_timeout: Duration,
    pub metric_interval: Duration,
    /// Ended spans waiting for export, at most; past it they are dropped and counted.
    pub queue_size: usize,
    pub batch_size: usize,
    pub schedule_delay: Duration,
    /// One export of spans, retries included.
    pub export_timeout: Duration,
}

impl OtelSettings {
    /// Whether anything is exported (and so anything built).
    pub fn enabled(&self) -> bool {
        self.traces_endpoint.is_some() || self.metrics_endpoint.is_some()
    }
}

pub(super) fn parse(layers: &Layers) -> Result<OtelSettings, ConfigError> {
    let disabled = layers.choice(&v::OTEL_SDK_DISABLED)? == Some("true");
    let base = http_url(layers, &v::OTEL_EXPORTER_OTLP_ENDPOINT)?;
    let signal = |var: &'static Var, path: &str| -> Result<Option<String>, ConfigError> {
        if disabled {
            return Ok(None);
        }
        Ok(http_url(layers, var)?.or_else(|| {
            base.as_deref()
                .map(|base| format!("{}{path}", base.trim_end_matches('/')))
        }))
    };
    let queue_size = layers.count(&v::OTEL_BSP_MAX_QUEUE_SIZE)? as usize;
    Ok(OtelSettings {
        traces_endpoint: signal(&v::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "/v1/traces")?,
        metrics_endpoint: signal(&v::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "/v1/metrics")?,
        protocol: layers.text(&v::OTEL_EXPORTER_OTLP_PROTOCOL),
        request_timeout: layers.duration(&v::OTEL_EXPORTER_OTLP_TIMEOUT)?,
        metric_interval: layers.duration(&v::OTEL_METRIC_EXPORT_INTERVAL)?,
        queue_size,
        // The specification: a batch larger than the queue is the queue.
        batch_size: (layers.count(&v::OTEL_BSP_MAX_EXPORT_BATCH_SIZE)? as usize).min(queue_size),
        schedule_delay: layers.duration(&v::OTEL_BSP_SCHEDULE_DELAY)?,
        export_timeout: layers.duration(&v::OTEL_BSP_EXPORT_TIMEOUT)?,
    })
}

/// An `http://` or `https://` URL with a host, or the variable's error.
fn http_url(layers: &Layers, var: &'static Var) -> Result<Option<String>, ConfigError> {
    let Some(value) = layers.value(var) else {
        return Ok(None);
    };
    let lower = value.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(Some(value.to_owned())),
        _ => Err(ConfigError::invalid(
            var,
            value,
            "expected an http:// or https:// URL (OTLP over HTTP)",
        )),
    }
}
