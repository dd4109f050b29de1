//! OpenTelemetry's settings: the variables sendgate's exporter reads itself (the
//! endpoints, the headers, the export deadline and interval, the span queue's bounds). The
//! rest of the specification's variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER`) are read by the OpenTelemetry SDK, as it reads them.

use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};

use super::error::ConfigError;
use super::layers::Layers;
use super::secret::Secret;
use super::vars::{self as v, Var};

/// Where and how spans and metrics are exported; neither signal: nothing is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// Where spans go; `None`: no spans.
    pub traces: Option<SignalExport>,
    /// Where metrics go; `None`: no metrics.
    pub metrics: Option<SignalExport>,
    /// The protocol variables' values that name no protocol built in, each with its
    /// variable's name: logged at start-up and ignored, as the specification asks.
    pub unsupported_protocols: Vec<(&'static str, String)>,
    /// `OTEL_METRICS_EXPORTER`'s value when it names no exporter built in (neither `otlp`
    /// nor `none`), as given: logged at start-up and ignored (the metrics go over OTLP).
    pub unsupported_metrics_exporter: Option<String>,
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

/// One signal's export: the URL, how it is spoken, and the headers sent with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalExport {
    /// Over HTTP the full URL posted to; over gRPC the collector's URL (its path unused).
    pub endpoint: String,
    pub protocol: Protocol,
    pub headers: ExportHeaders,
}

/// The OTLP transports built in (`OTEL_EXPORTER_OTLP_PROTOCOL`'s values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`: the specification's default.
    HttpProtobuf,
    /// `grpc`: the Export method of the signal's collector service, over HTTP/2.
    Grpc,
}

impl Protocol {
    /// The specification's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }

    fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "http/protobuf" => Some(Self::HttpProtobuf),
            "grpc" => Some(Self::Grpc),
            _ => None,
        }
    }
}

impl OtelSettings {
    /// Whether anything is exported (and so anything built).
    pub fn enabled(&self) -> bool {
        self.traces.is_some() || self.metrics.is_some()
    }
}

pub(super) fn parse(layers: &Layers) -> Result<OtelSettings, ConfigError> {
    let disabled = layers.choice(&v::OTEL_SDK_DISABLED)? == Some("true");
    let (no_metrics, unsupported_metrics_exporter) = metrics_exporter(layers);
    let base = http_url(layers, &v::OTEL_EXPORTER_OTLP_ENDPOINT)?;
    let (traces_protocol, metrics_protocol, unsupported_protocols) = protocols(layers);
    let common = Common {
        layers,
        disabled,
        base,
        headers: headers(layers, &v::OTEL_EXPORTER_OTLP_HEADERS)?,
    };
    let traces = common.signal(
        &v::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        "/v1/traces",
        traces_protocol,
        &v::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
    )?;
    // Its endpoint and headers are checked even when no metrics are exported.
    let metrics = common
        .signal(
            &v::OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
            "/v1/metrics",
            metrics_protocol,
            &v::OTEL_EXPORTER_OTLP_METRICS_HEADERS,
        )?
        .filter(|_| !no_metrics);
    let queue_size = layers.count(&v::OTEL_BSP_MAX_QUEUE_SIZE)? as usize;
    Ok(OtelSettings {
        traces,
        metrics,
        unsupported_protocols,
        unsupported_metrics_exporter,
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

/// Whether `OTEL_METRICS_EXPORTER` turns the metrics off, and the names in it of exporters
/// not built in (comma-separated, for the warning). The specification: the value is a
/// comma-separated list, empty is as if unset, `none` alone exports nothing, and an
/// unrecognised name is warned about and ignored, not refused: the default, `otlp`, then
/// exports.
fn metrics_exporter(layers: &Layers) -> (bool, Option<String>) {
    let names: Vec<&str> = layers
        .value(&v::OTEL_METRICS_EXPORTER)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect();
    let is = |name: &str, known: &str| name.eq_ignore_ascii_case(known);
    let unsupported: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| !is(name, "otlp") && !is(name, "none"))
        .collect();
    let off = !names.is_empty() && names.iter().all(|name| is(name, "none"));
    let unsupported = (!unsupported.is_empty()).then(|| unsupported.join(","));
    (off, unsupported)
}

/// The traces' and the metrics' protocols (a signal's own, else the common one, else
/// http/protobuf), and the values named that are not a supported protocol (ignored, for a
/// warning at start-up).
fn protocols(layers: &Layers) -> (Protocol, Protocol, Vec<(&'static str, String)>) {
    let mut unsupported = Vec::new();
    let mut protocol = |var: &'static Var| -> Option<Protocol> {
        let value = layers.text(var)?;
        let parsed = Protocol::parse(&value);
        if parsed.is_none() {
            unsupported.push((var.name, value));
        }
        parsed
    };
    let common = protocol(&v::OTEL_EXPORTER_OTLP_PROTOCOL);
    let traces = protocol(&v::OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
        .or(common)
        .unwrap_or(Protocol::HttpProtobuf);
    let metrics = protocol(&v::OTEL_EXPORTER_OTLP_METRICS_PROTOCOL)
        .or(common)
        .unwrap_or(Protocol::HttpProtobuf);
    (traces, metrics, unsupported)
}

/// What both signals start from: the base endpoint and the common headers.
struct Common<'a> {
    layers: &'a Layers,
    disabled: bool,
    base: Option<String>,
    headers: Option<ExportHeaders>,
}

impl Common<'_> {
    /// One signal's export, `None` when it has no endpoint or the SDK is disabled. A
    /// signal's own endpoint is used as it is; the base one gets the signal's `path` over
    /// HTTP and is used as it is over gRPC (the path is the service's method there). Its
    /// own headers replace the common ones; both are checked even when disabled.
    fn signal(
        &self,
        endpoint: &'static Var,
        path: &str,
        protocol: Protocol,
        own_headers: &'static Var,
    ) -> Result<Option<SignalExport>, ConfigError> {
        let (headers, headers_var) = match headers(self.layers, own_headers)? {
            Some(own) => (own, own_headers),
            None => (
                self.headers.clone().unwrap_or_default(),
                &v::OTEL_EXPORTER_OTLP_HEADERS,
            ),
        };
        if self.disabled {
            return Ok(None);
        }
        let endpoint = http_url(self.layers, endpoint)?.or_else(|| {
            self.base.as_deref().map(|base| match protocol {
                Protocol::HttpProtobuf => format!("{}{path}", base.trim_end_matches('/')),
                Protocol::Grpc => base.to_owned(),
            })
        });
        if endpoint.is_some() && protocol == Protocol::Grpc {
            grpc_metadata_names(self.layers, headers_var, &headers)?;
        }
        Ok(endpoint.map(|endpoint| SignalExport {
            endpoint,
            protocol,
            headers,
        }))
    }
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
            "expected an http:// or https:// URL",
        )),
    }
}

/// Headers sent with every export, `OTEL_EXPORTER_OTLP_HEADERS`'s `key=value,…` with the
/// values percent-decoded. A value may be a collector's API key: each is a [`Secret`] (and
/// marked sensitive for the HTTP stack); `Debug` shows the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ExportHeaders(Vec<(HeaderName, Secret<HeaderValue>)>);

impl ExportHeaders {
    /// Each header with its value exposed: for the export's request, and nothing else.
    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        self.0.iter().map(|(name, value)| (name, value.expose()))
    }
}

impl fmt::Debug for ExportHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Over gRPC the headers are the call's metadata, whose names are narrower than HTTP's
/// (0-9, a-z, `-`, `_`, `.`): gRPC refuses every call with another ("Illegal header key").
/// The error names the header, never a value.
fn grpc_metadata_names(
    layers: &Layers,
    var: &'static Var,
    headers: &ExportHeaders,
) -> Result<(), ConfigError> {
    let allowed = |b: u8| b.is_ascii_digit() || b.is_ascii_lowercase() || b"-_.".contains(&b);
    match headers
        .iter()
        .find(|(name, _)| !name.as_str().bytes().all(allowed))
    {
        Some((name, _)) => Err(ConfigError::invalid(
            var,
            layers.value(var).unwrap_or_default(),
            format!(
                "`{name}` is not a gRPC metadata name (0-9, a-z, -, _ and . only), and this \
                 signal is exported over gRPC"
            ),
        )),
        None => Ok(()),
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
        out.push((name, Secret::wrap(value)));
    }
    Ok(Some(ExportHeaders(out)))
}

#[cfg(test)]
mod tests {
    use super::Protocol;

    #[test]
    fn a_protocol_is_named_as_the_specification_names_it() {
        for protocol in [Protocol::HttpProtobuf, Protocol::Grpc] {
            assert_eq!(Protocol::parse(protocol.as_str()), Some(protocol));
        }
        assert_eq!(Protocol::Grpc.as_str(), "grpc");
        assert_eq!(Protocol::HttpProtobuf.as_str(), "http/protobuf");
        assert_eq!(Protocol::parse("http/json"), None);
    }
}
