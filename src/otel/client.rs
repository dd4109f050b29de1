//! The exporters' HTTP client: the project's own reqwest 0.13 (rustls on ring: one TLS
//! stack), each request run on the export thread's runtime.
//!
//! Why not reqwest's `Client` as it is: the SDK's metric reader exports from a thread of
//! its own with `futures_executor::block_on`, where reqwest finds no tokio reactor. Handing
//! the request to the export runtime works from any thread, and keeps every export off the
//! gateway's own runtime.

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

#[derive(Debug, Clone)]
pub(super) struct OnExportRuntime {
    /// Built with `OTEL_EXPORTER_OTLP_TIMEOUT` as its timeout: no request outlives it.
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl OnExportRuntime {
    pub(super) fn new(client: reqwest::Client, runtime: tokio::runtime::Handle) -> Self {
        Self { client, runtime }
    }
}

#[async_trait::async_trait]
impl HttpClient for OnExportRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| -> HttpError { Box::new(e) })?
    }
}
