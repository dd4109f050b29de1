//! Posting an encoded export: OTLP/HTTP, `application/x-protobuf`, the configured headers,
//! within `OTEL_EXPORTER_OTLP_TIMEOUT`. Our reqwest client (rustls on ring: one TLS stack),
//! run on the export thread's runtime, never the gateway's.

use std::time::Duration;

use reqwest::header::{HeaderMap, CONTENT_TYPE};

/// The most of a collector's answer read.
const MAX_ANSWER: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub(super) struct Poster {
    client: reqwest::Client,
    url: String,
    headers: HeaderMap,
}

impl Poster {
    pub(super) fn new(client: reqwest::Client, url: String, headers: HeaderMap) -> Self {
        Self {
            client,
            url,
            headers,
        }
    }

    /// One export; the error says what went wrong without the request's headers (a
    /// collector's API key may be among them).
    pub(super) async fn post(&self, body: Vec<u8>, timeout: Duration) -> Result<(), String> {
        let mut response = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let status = response.status();
        // The body is the collector's (a partial success, an error): not needed, but read
        // so the connection can be reused, up to a bound (past it the connection closes).
        let mut read = 0usize;
        while let Ok(Some(chunk)) = response.chunk().await {
            read += chunk.len();
            if read > MAX_ANSWER {
                break;
            }
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {status}"))
        }
    }
}
