//! OTLP/HTTP: a `POST` of `application/x-protobuf` with the configured headers, through our
//! reqwest client. A 429, 502, 503 or 504 answer, or none, is retryable; any other is final.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;

use super::attempt::{described, Failed, MAX_ANSWER};

#[derive(Debug, Clone)]
pub(crate) struct HttpPoster {
    client: reqwest::Client,
    url: String,
    headers: HeaderMap,
}

impl HttpPoster {
    pub(crate) fn new(client: reqwest::Client, url: String, headers: HeaderMap) -> Self {
        Self {
            client,
            url,
            headers,
        }
    }

    /// One `POST`: the answer of a `2xx`; `429`, `502`, `503`, `504` (their `Retry-After`
    /// in seconds) and no answer at all are retryable, the rest final.
    pub(crate) async fn attempt(&self, body: Bytes, timeout: Duration) -> Result<Vec<u8>, Failed> {
        let mut response = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| Failed {
                error: described(&e.without_url()),
                // No answer: the specification asks to send it again.
                retry: Some(None),
            })?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // The collector's answer (a partial success, an error), read whole so the
        // connection can be reused, up to a bound (past it the connection closes and what
        // was read is cut short: no partial success is read from it).
        let mut answer = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            if answer.len() + chunk.len() > MAX_ANSWER {
                answer.clear();
                break;
            }
            answer.extend_from_slice(&chunk);
        }
        if status.is_success() {
            return Ok(answer);
        }
        let retryable = matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::BAD_GATEWAY
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT
        );
        Err(Failed {
            error: format!("the collector answered {status}"),
            retry: retryable.then_some(retry_after),
        })
    }
}
