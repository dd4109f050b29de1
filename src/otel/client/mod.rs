//! Sending an encoded export to the collector, over OTLP/HTTP (`http.rs`) or OTLP/gRPC
//! (`grpc.rs`): the request bodies are the same protobuf messages, and so are the answers
//! (a partial success says what was rejected). Both run on the export thread's runtime,
//! never the gateway's, and both are rustls on ring (one TLS stack).
//!
//! Retries as the OTLP specification asks, the same for both transports: what the
//! transport calls retryable (an answer saying so, or none) is sent again with exponential
//! backoff (100 ms doubling to 1.6 s, plus up to 100 ms of jitter; at most 3 retries, as
//! the SDK's exporter did), a delay the collector names (`Retry-After`, `RetryInfo`) waited
//! instead; every other answer is final. All of it within the export's one deadline: a
//! retry that would not fit is not made.
//!
//! Neither transport puts a request header in an error: a collector's API key may be
//! among them.

mod attempt;
mod grpc;
mod http;
#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use sendgate_backoff::{Doubling, Jitter};
use tokio::time::Instant;

pub(crate) use attempt::Signal;

/// Retries after the first attempt, at most.
const MAX_RETRIES: u32 = 3;
/// The wait before retry `n` when the collector names none.
const BACKOFF: Doubling = Doubling::new(Duration::from_millis(100), Duration::from_millis(1600))
    .with_jitter(Jitter::Add(Duration::from_millis(100)));

/// One signal's way to its collector.
#[derive(Debug, Clone)]
pub(crate) enum Poster {
    Http(http::HttpPoster),
    Grpc(Box<grpc::GrpcPoster>),
}

impl Poster {
    /// OTLP/HTTP: `url` is the full URL posted to.
    pub(crate) fn http(client: reqwest::Client, url: String, headers: HeaderMap) -> Self {
        Self::Http(http::HttpPoster::new(client, url, headers))
    }

    /// OTLP/gRPC to the collector at `url`, connected on the first export. Call it inside
    /// the runtime the exports run on: the connection's tasks are spawned there.
    pub(crate) fn grpc(
        url: &str,
        headers: HeaderMap,
        signal: Signal,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        grpc::GrpcPoster::new(url, headers, signal, connect_timeout)
            .map(|p| Self::Grpc(Box::new(p)))
    }

    /// One export, retried while the collector asks for it and time is left: the
    /// collector's answer (its first [`attempt::MAX_ANSWER`] bytes). The error says what went wrong,
    /// without the request's headers.
    pub(crate) async fn post(&self, body: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        let body = Bytes::from(body);
        let mut retries = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = match self {
                Self::Http(http) => http.attempt(body.clone(), left).await,
                Self::Grpc(grpc) => grpc.attempt(body.clone(), left).await,
            };
            let failed = match attempt {
                Ok(answer) => return Ok(answer),
                Err(failed) => failed,
            };
            let Some(asked) = failed.retry else {
                return Err(failed.error);
            };
            if retries == MAX_RETRIES {
                return Err(format!("{} ({retries} retries)", failed.error));
            }
            let wait = asked.unwrap_or_else(|| BACKOFF.wait(retries + 1, rand::random()));
            if Instant::now() + wait >= deadline {
                return Err(format!(
                    "{} ({retries} retries; no time left for another)",
                    failed.error
                ));
            }
            tokio::time::sleep(wait).await;
            retries += 1;
        }
    }
}
