//! A real OTLP receiver on 127.0.0.1:0, over HTTP or gRPC. Over HTTP it takes
//! `POST /v1/traces` and `POST /v1/metrics` (protobuf), decodes them with the collector's
//! own types (`opentelemetry-proto`) and keeps what came; or, [`Receiver::hanging`], reads
//! every request and never answers (a collector that is there but dead). Over gRPC
//! ([`Receiver::grpc`]) it is the collector's generated `TraceService` and `MetricsService`
//! servers on tonic, both on one port, as a collector's OTLP/gRPC receiver is.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Got {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
    /// Requests read, answered or not.
    requests: u64,
    /// What was not an OTLP protobuf POST to a known path.
    bad: Vec<String>,
    /// Each request's path and headers (names lowercased).
    heads: Vec<(String, Vec<(String, String)>)>,
}

pub struct Receiver {
    pub port: u16,
    got: Arc<Mutex<Got>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Answers every export `200` with an empty protobuf body.
    pub async fn start() -> Self {
        Self::listen(true).await
    }

    /// Reads every export and never answers (the connection stays open).
    pub async fn hanging() -> Self {
        Self::listen(false).await
    }

    /// OTLP over gRPC (HTTP/2 in the clear, as the Container Apps agent listens): answers
    /// every export `OK` with an empty response.
    pub async fn grpc() -> Self {
        Self::listen_grpc(true).await
    }

    /// OTLP over gRPC that takes every call and never answers.
    pub async fn grpc_hanging() -> Self {
        Self::listen_grpc(false).await
    }

    async fn listen_grpc(answer: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let got = Arc::new(Mutex::new(Got::default()));
        let collector = Collector {
            got: Arc::clone(&got),
            answer,
        };
        let traces = TraceServiceServer::new(collector.clone());
        let metrics = MetricsServiceServer::new(collector);
        // One port, the two services: routed by the method's path.
        let both = tower::service_fn(
            move |request: tonic::codegen::http::Request<tonic::body::Body>| {
                let traces = traces.clone();
                let metrics = metrics.clone();
                async move {
                    use tower::ServiceExt as _;
                    if request
                        .uri()
                        .path()
                        .starts_with("/opentelemetry.proto.collector.trace.")
                    {
                        traces.oneshot(request).await
                    } else {
                        metrics.oneshot(request).await
                    }
                }
            },
        );
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming(both, incoming)
                .await;
        });
        Self { port, got, task }
    }

    async fn listen(answer: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let got = Arc::new(Mutex::new(Got::default()));
        let task = {
            let got = Arc::clone(&got);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(serve(stream, Arc::clone(&got), answer));
                }
            })
        };
        Self { port, got, task }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for this receiver.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spans(&self) -> Vec<Span> {
        let got = self.got.lock();
        assert!(got.bad.is_empty(), "not OTLP: {:?}", got.bad);
        got.traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }

    /// The resources' attributes of every span export.
    pub fn span_resources(&self) -> Vec<Vec<KeyValue>> {
        self.got
            .lock()
            .traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .filter_map(|r| r.resource.as_ref().map(|r| r.attributes.clone()))
            .collect()
    }

    pub fn metrics(&self) -> Vec<Metric> {
        let got = self.got.lock();
        assert!(got.bad.is_empty(), "not OTLP: {:?}", got.bad);
        got.metrics
            .iter()
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| s.metrics.clone())
            .collect()
    }

    pub fn requests(&self) -> u64 {
        self.got.lock().requests
    }

    /// The values of header `name` (lowercase) on every request to `path`.
    pub fn header(&self, path: &str, name: &str) -> Vec<String> {
        self.got
            .lock()
            .heads
            .iter()
            .filter(|(p, _)| p == path)
            .flat_map(|(_, headers)| headers.iter().filter(|(n, _)| n == name))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Waits (at most `limit`) until `done` holds for the spans received.
    pub async fn wait_spans(&self, limit: Duration, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let spans = self.spans();
            if done(&spans) || tokio::time::Instant::now() > until {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (at most `limit`) until a metric named `name` has arrived; its last export.
    pub async fn wait_metric(&self, limit: Duration, name: &str) -> Option<Metric> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            if let Some(m) = self.metrics().into_iter().rev().find(|m| m.name == name) {
                return Some(m);
            }
            if tokio::time::Instant::now() > until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One connection: requests one after another (keep-alive), each head parsed with
/// httparse and its body read by `Content-Length`.
async fn serve(mut stream: TcpStream, got: Arc<Mutex<Got>>, answer: bool) {
    let mut buf = Vec::new();
    loop {
        let (path, length, head_len) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                let method = req.method.unwrap_or_default().to_owned();
                let path = req.path.unwrap_or_default().to_owned();
                let header = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned())
                };
                let length = header("content-length")
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let kind = header("content-type").unwrap_or_default();
                let mut got = got.lock();
                if method != "POST" || kind != "application/x-protobuf" {
                    got.bad.push(format!("{method} {path} {kind}"));
                }
                let all = req.headers.iter().map(|h| {
                    let value = String::from_utf8_lossy(h.value).into_owned();
                    (h.name.to_ascii_lowercase(), value)
                });
                got.heads.push((path.clone(), all.collect()));
                break (path, length, n);
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        while buf.len() < head_len + length {
            let mut chunk = [0u8; 65536];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..head_len + length).skip(head_len).collect();
        {
            let mut got = got.lock();
            got.requests += 1;
            match path.as_str() {
                "/v1/traces" => match ExportTraceServiceRequest::decode(body.as_slice()) {
                    Ok(r) => got.traces.push(r),
                    Err(e) => got.bad.push(format!("traces: {e}")),
                },
                "/v1/metrics" => match ExportMetricsServiceRequest::decode(body.as_slice()) {
                    Ok(r) => got.metrics.push(r),
                    Err(e) => got.bad.push(format!("metrics: {e}")),
                },
                other => got.bad.push(format!("path {other}")),
            }
        }
        if !answer {
            // There, and dead: hold the connection open without a word.
            std::future::pending::<()>().await;
        }
        let reply =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.write_all(reply).await.is_err() {
            return;
        }
    }
}

/// The gRPC methods' paths, under which [`Receiver::header`] files a gRPC call's metadata.
pub const GRPC_TRACES: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
pub const GRPC_METRICS: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// Both collector services over what one receiver got.
#[derive(Clone)]
struct Collector {
    got: Arc<Mutex<Got>>,
    answer: bool,
}

impl Collector {
    /// Files a call's metadata under its method, and counts it.
    fn took(&self, method: &str, metadata: &tonic::metadata::MetadataMap) -> Arc<Mutex<Got>> {
        let heads = metadata.clone().into_headers();
        let all = heads.iter().map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        });
        let mut got = self.got.lock();
        got.requests += 1;
        got.heads.push((method.to_owned(), all.collect()));
        Arc::clone(&self.got)
    }

    async fn answer(&self) {
        if !self.answer {
            std::future::pending::<()>().await;
        }
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let got = self.took(GRPC_TRACES, request.metadata());
        got.lock().traces.push(request.into_inner());
        self.answer().await;
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let got = self.took(GRPC_METRICS, request.metadata());
        got.lock().metrics.push(request.into_inner());
        self.answer().await;
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// A span's attribute, as a string, an integer or a boolean written out.
pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    Some(any(value))
}

fn any(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}
