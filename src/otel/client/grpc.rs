//! OTLP/gRPC: the signal's `Export` method (unary) over HTTP/2, with tonic's client. The
//! message is the same protobuf the HTTP exporter posts, already encoded (`encode.rs`):
//! [`Raw`] hands its bytes to tonic as they are, and the answer's back the same way. The
//! configured headers go as the call's metadata. `https://` endpoints are TLS (rustls on
//! ring, verified by the platform verifier as reqwest verifies the HTTP exporter's);
//! `http://` ones are HTTP/2 in the clear, as the Container Apps agent listens.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf as _, BufMut as _, Bytes};
use http_body_util::{LengthLimitError, Limited};
use parking_lot::Mutex;
use reqwest::header::HeaderMap;
use tonic::body::Body;
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::http::Response;
use tonic::metadata::{BinaryMetadataKey, BinaryMetadataValue, MetadataMap};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Extensions, Request, Status, TimeoutExpired};
use tonic_types::StatusExt as _;

use super::attempt::{described, with_causes, Failed, Signal, MAX_ANSWER};

/// The longest a collector's status message is repeated in our log.
const MAX_MESSAGE: usize = 200;

/// The most of an answer's body read: the answer and its gRPC frame's header.
const MAX_ANSWER_BODY: usize = MAX_ANSWER + 5;

/// The channel, its answers' bodies cut at [`MAX_ANSWER_BODY`]: past it the body ends in a
/// [`LengthLimitError`] that [`attempt`](GrpcPoster::attempt) tells from the collector's
/// own statuses (tonic's own bound would answer `OUT_OF_RANGE`, which is retried).
type Bounded = tower::util::MapResponse<Channel, fn(Response<Body>) -> Response<Limited<Body>>>;

fn bounded(answer: Response<Body>) -> Response<Limited<Body>> {
    answer.map(|body| Limited::new(body, MAX_ANSWER_BODY))
}

#[derive(Debug, Clone)]
pub(crate) struct GrpcPoster {
    endpoint: Endpoint,
    /// Made anew when a call goes unanswered until its deadline: HTTP/2 keeps one
    /// connection, and one whose peer went without a word (a dropped flow, a dead host)
    /// would hold every later call until TCP gives up on it, many minutes on.
    channel: Arc<Mutex<Bounded>>,
    method: PathAndQuery,
    metadata: MetadataMap,
}

impl GrpcPoster {
    pub(crate) fn new(
        url: &str,
        headers: HeaderMap,
        signal: Signal,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| format!("not a gRPC endpoint: {}", described(&e)))?
            .connect_timeout(connect_timeout);
        if url
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
        {
            let provider = rustls::crypto::CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
            let verifier = rustls_platform_verifier::Verifier::new(provider)
                .map_err(|e| format!("gRPC TLS: {}", described(&e)))?;
            endpoint = endpoint
                .tls_config_with_verifier(ClientTlsConfig::new(), Arc::new(verifier))
                .map_err(|e| format!("gRPC TLS: {}", described(&e)))?;
        }
        let method = match signal {
            Signal::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            Signal::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        };
        Ok(Self {
            channel: Arc::new(Mutex::new(connect_lazy(&endpoint))),
            endpoint,
            method: PathAndQuery::from_static(method),
            metadata: metadata(&headers),
        })
    }

    /// One call within `timeout` (sent as the call's `grpc-timeout` too). Retryable as the
    /// OTLP specification lists: `CANCELLED`, `DEADLINE_EXCEEDED`, `ABORTED`,
    /// `OUT_OF_RANGE`, `UNAVAILABLE` (a collector not reached is one), `DATA_LOSS`, and
    /// `RESOURCE_EXHAUSTED` only with a `RetryInfo`; a `RetryInfo`'s delay is waited.
    /// Unanswered by the deadline, the connection is left: the next call makes a new one.
    /// Runs on the export thread's runtime (a new channel spawns its tasks there).
    pub(crate) async fn attempt(&self, body: Bytes, timeout: Duration) -> Result<Vec<u8>, Failed> {
        let channel = self.channel.lock().clone();
        // The bound is the body's (`Bounded`): tonic's would be retried as OUT_OF_RANGE.
        let mut grpc = Grpc::new(channel).max_decoding_message_size(usize::MAX);
        let mut request = Request::from_parts(self.metadata.clone(), Extensions::default(), body);
        request.set_timeout(timeout);
        let call = async {
            grpc.ready()
                .await
                .map_err(|e| Status::unavailable(described(&e)))?;
            grpc.unary(request, self.method.clone(), Raw).await
        };
        // tonic ends the call at its `grpc-timeout` (CANCELLED, "Timeout expired"), or this
        // timer does: whichever is first, the collector did not answer in time.
        let answered = match tokio::time::timeout(timeout, call).await {
            Ok(Err(status)) if caused_by::<TimeoutExpired>(&status) => None,
            Ok(answered) => Some(answered),
            Err(_) => None,
        };
        match answered {
            Some(Ok(answer)) => Ok(answer.into_inner().to_vec()),
            // The collector took the export and answered more than is read: over HTTP too
            // such an answer is not read, and sending the export again would repeat it.
            Some(Err(status)) if caused_by::<LengthLimitError>(&status) => Ok(Vec::new()),
            Some(Err(status)) => Err(failed(&status)),
            None => {
                *self.channel.lock() = connect_lazy(&self.endpoint);
                Err(Failed {
                    error: "the collector did not answer within the deadline".into(),
                    retry: Some(None),
                })
            }
        }
    }
}

/// A channel to `endpoint`, connected on its first call; its tasks go on the current
/// runtime.
fn connect_lazy(endpoint: &Endpoint) -> Bounded {
    tower::util::MapResponse::new(endpoint.connect_lazy(), bounded)
}

/// The headers as a call's metadata. A `-bin` header's value is bytes, sent in base64 as
/// gRPC asks (the collector's gRPC decodes it back); sent as it is, gRPC's C core refuses
/// every call ("illegal base64 encoding"). Values stay sensitive.
fn metadata(headers: &HeaderMap) -> MetadataMap {
    let mut ascii = HeaderMap::with_capacity(headers.len());
    let mut binary = Vec::new();
    for (name, value) in headers {
        match BinaryMetadataKey::from_bytes(name.as_str().as_bytes()) {
            Ok(key) => {
                let mut bytes = BinaryMetadataValue::from_bytes(value.as_bytes());
                bytes.set_sensitive(value.is_sensitive());
                binary.push((key, bytes));
            }
            Err(_) => {
                ascii.append(name.clone(), value.clone());
            }
        }
    }
    let mut metadata = MetadataMap::from_headers(ascii);
    for (key, bytes) in binary {
        metadata.append_bin(key, bytes);
    }
    metadata
}

/// Whether `status` was made on our side from an `E`: the answer's body cut at
/// [`MAX_ANSWER_BODY`], the call's own deadline; never a collector's status.
fn caused_by<E: std::error::Error + 'static>(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        if e.is::<E>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// What a status says of the export, and whether it may be sent again.
fn failed(status: &Status) -> Failed {
    let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
    let retry = match status.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Some(delay),
        // The collector says whether it will recover: only with a delay to wait.
        Code::ResourceExhausted => delay.map(Some),
        _ => None,
    };
    let message: String = status.message().chars().take(MAX_MESSAGE).collect();
    let error = with_causes(
        format!("the collector answered {:?}: {message}", status.code()),
        std::error::Error::source(status),
    );
    Failed { error, retry }
}

/// The identity codec: the message is bytes already encoded, and so is the answer.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::{ErrorDetails, StatusExt as _};

    use super::*;

    #[test]
    fn a_bin_headers_value_is_sent_in_base64_the_others_as_they_are() {
        let mut headers = HeaderMap::new();
        let mut key = reqwest::header::HeaderValue::from_static("s3cr=t");
        key.set_sensitive(true);
        headers.insert("api-key", key.clone());
        headers.insert("x-token-bin", key);
        let metadata = metadata(&headers);
        assert_eq!(metadata.get("api-key").expect("ascii"), "s3cr=t");
        let bytes = metadata.get_bin("x-token-bin").expect("binary");
        assert_eq!(bytes.to_bytes().expect("base64"), "s3cr=t".as_bytes());
        let wire = metadata.into_headers();
        assert_eq!(
            wire["x-token-bin"], "czNjcj10",
            "unpadded base64, as gRPC emits"
        );
        assert!(wire.values().all(|v| v.is_sensitive()), "{wire:?}");
    }

    #[test]
    fn only_the_specifications_codes_are_retried() {
        let retry = |code| failed(&Status::new(code, "x")).retry;
        for code in [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unavailable,
            Code::DataLoss,
        ] {
            assert_eq!(retry(code), Some(None), "{code:?}");
        }
        for code in [
            Code::Unknown,
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Unimplemented,
            Code::Internal,
            Code::Unauthenticated,
        ] {
            assert_eq!(retry(code), None, "{code:?}");
        }
        let told = Status::with_error_details(
            Code::Unavailable,
            "x",
            ErrorDetails::with_retry_info(Some(Duration::from_secs(2))),
        );
        assert_eq!(failed(&told).retry, Some(Some(Duration::from_secs(2))));
        let long = Status::new(Code::Internal, "y".repeat(1000));
        assert_eq!(
            failed(&long).error.len(),
            "the collector answered Internal: ".len() + MAX_MESSAGE
        );
    }
}
