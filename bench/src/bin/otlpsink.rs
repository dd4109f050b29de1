//! A local OTLP sink for bench comparison 13, over HTTP or gRPC. Over HTTP it answers every
//! POST `200` with an empty protobuf body after reading it whole (keep-alive, a thread per
//! connection); over gRPC it is the collector's generated trace and metrics services on
//! tonic, answering every call `OK`. It counts the requests and bytes it took (printed on
//! stderr every 10 s). The measure is the gateway's cost of exporting, not a collector's.
//!
//!   otlpsink ADDR MAX_SECS [http|grpc]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

#[derive(Clone, Default)]
struct Counts {
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl Counts {
    fn took(&self, bytes: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:4318".into());
    let max_secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1800);
    let grpc = args.next().as_deref() == Some("grpc");
    let counts = Counts::default();
    {
        let counts = counts.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            loop {
                std::thread::sleep(Duration::from_secs(10));
                eprintln!(
                    "otlpsink: {} requests, {} bytes",
                    counts.requests.load(Ordering::Relaxed),
                    counts.bytes.load(Ordering::Relaxed)
                );
                if started.elapsed() > Duration::from_secs(max_secs) {
                    std::process::exit(0);
                }
            }
        });
    }
    if grpc {
        serve_grpc(&addr, counts);
        return;
    }
    let listener = TcpListener::bind(&addr).expect("bind");
    for stream in listener.incoming().flatten() {
        let counts = counts.clone();
        std::thread::spawn(move || {
            let _ = serve(stream, &counts);
        });
    }
}

fn serve(stream: TcpStream, counts: &Counts) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        counts.took(length);
        writer.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        )?;
    }
}

#[derive(Clone)]
struct Sink(Counts);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        use prost::Message as _;
        self.0.took(request.get_ref().encoded_len());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        use prost::Message as _;
        self.0.took(request.get_ref().encoded_len());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

fn serve_grpc(addr: &str, counts: Counts) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let traces = TraceServiceServer::new(Sink(counts.clone()));
        let metrics = MetricsServiceServer::new(Sink(counts));
        let both = tower::service_fn(
            move |request: tonic::codegen::http::Request<tonic::body::Body>| {
                let (traces, metrics) = (traces.clone(), metrics.clone());
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
        tonic::transport::Server::builder()
            .serve_with_incoming(both, tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("served");
    });
}
