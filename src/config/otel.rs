//! OpenTelemetry's settings: the variables sendgate's exporter reads itself (the
//! endpoints, the headers, the export deadline and interval, the span queue's bounds). The
//! rest of the specification's variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER`) are read by the OpenTelemetry SDK, as it reads them.

use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};

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
    pub traces_headers: ExportHeaders,
    pub metrics_headers: ExportHeaders,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` when set: only `http/protobuf` is built in.
    pub protocol: Option<String>,
    /// `OTEL_EXPORTER_OTLP_COMPRESSION` when set: none is built in.
    pub compression: Option<String>,
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
    let common = headers(layers, &v::OTEL_EXPORTER_OTLP_HEADERS)?;
    let own = |var| -> Result<ExportHeaders, ConfigError> {
        Ok(headers(layers, var)?.unwrap_or_else(|| common.clone().unwrap_or_default()))
    };
    Ok(OtelSettings {
        traces_endpoint: signal(&v::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "/v1/traces")?,
        metrics_endpoint: signal(&v::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "/v1/metrics")?,
        traces_headers: own(&v::OTEL_EXPORTER_OTLP_TRACES_HEADERS)?,
        metrics_headers: own(&v::OTEL_EXPORTER_OTLP_METRICS_HEADERS)?,
        protocol: layers.text(&v::OTEL_EXPORTER_OTLP_PROTOCOL),
        compression: layers.text(&v::OTEL_EXPORTER_OTLP_COMPRESSION),
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

/// Headers sent with every export, `OTEL_EXPORTER_OTLP_HEADERS`'s `key=value,…` with the
/// values percent-decoded. A value may be a collector's API key: each is marked sensitive,
/// and `Debug` shows the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ExportHeaders(Vec<(HeaderName, HeaderValue)>);

impl ExportHeaders {
    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        self.0.iter().map(|(name, value)| (name, value))
    }
}

impl fmt::Debug for ExportHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// The variable's headers, `None` when it is unset. The errors name the entry by its
/// position, never its value.
fn headers(layers: &Layers, var: &'static Var) -> Result<Option<ExportHeaders>, ConfigError> {
    let Some(value) = layers.value(var) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (n, entry) in value.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let invalid =
            |why: &str| ConfigError::invalid(var, value, format!("entry {}: {why}", n + 1));
        let (name, raw) = entry
            .split_once('=')
            .ok_or_else(|| invalid("expected key=value"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| invalid("not a header name"))?;
        let decoded = percent_encoding::percent_decode_str(raw.trim()).collect::<Vec<u8>>();
        let mut value =
            HeaderValue::from_bytes(&decoded).map_err(|_| invalid("not a header value"))?;
        value.set_sensitive(true);
        out.push((name, value));
    }
    Ok(Some(ExportHeaders(out)))
}
