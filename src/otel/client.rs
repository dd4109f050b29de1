//! Posting an encoded export: OTLP/HTTP, `application/x-protobuf`, the configured headers,
//! within `OTEL_EXPORTER_OTLP_TIMEOUT`. Our reqwest client (rustls on ring: one TLS stack),
//! run on the export thread's runtime, never the gateway's.
//!
//! Retries as the OTLP/HTTP specification asks: `429`, `502`, `503` and `504`, and a
//! request that got no answer, are sent again with exponential backoff (100 ms doubling to
//! 1.6 s, plus up to 100 ms of jitter; at most 3 retries, as the SDK's exporter did), a
//! `Retry-After` in seconds waited instead; every other answer is final. All of it within
//! the export's one deadline: a retry that would not fit is not made.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use tokio::time::Instant;

/// The most of a collector's answer read.
const MAX_ANSWER: usize = 64 * 1024;
/// Retries after the first attempt, at most.
const MAX_RETRIES: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_millis(1600);
const MAX_JITTER_MS: u64 = 100;

#[derive(Debug, Clone)]
pub(super) struct Poster {
    client: reqwest::Client,
    url: String,
    headers: HeaderMap,
}

/// One attempt's failure, and whether (and after how long, if the collector said) it may
/// be tried again.
struct Failed {
    error: String,
    retry: Option<Option<Duration>>,
}

impl Poster {
    pub(super) fn new(client: reqwest::Client, url: String, headers: HeaderMap) -> Self {
        Self {
            client,
            url,
            headers,
        }
    }

    /// One export, retried while the collector asks for it and time is left: the
    /// collector's answer (its first [`MAX_ANSWER`] bytes: a partial success says what it
    /// rejected). The error says what went wrong without the request's headers (a
    /// collector's API key may be among them).
    pub(super) async fn post(&self, body: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        let body = Bytes::from(body);
        let mut backoff = FIRST_BACKOFF;
        let mut retries = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let failed = match self.attempt(body.clone(), left).await {
                Ok(answer) => return Ok(answer),
                Err(failed) => failed,
            };
            let Some(asked) = failed.retry else {
                return Err(failed.error);
            };
            if retries == MAX_RETRIES {
                return Err(format!("{} ({retries} retries)", failed.error));
            }
            let jitter = Duration::from_millis(rand::random_range(0..=MAX_JITTER_MS));
            let wait = asked.unwrap_or(backoff + jitter);
            if Instant::now() + wait >= deadline {
                return Err(format!(
                    "{} ({retries} retries; no time left for another)",
                    failed.error
                ));
            }
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            retries += 1;
        }
    }

    async fn attempt(&self, body: Bytes, timeout: Duration) -> Result<Vec<u8>, Failed> {
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

/// `error` and its causes (reqwest's own says only "error sending request"; the cause says
/// refused, reset, DNS or TLS). None of them holds a header.
fn described(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A collector on 127.0.0.1 that answers its `n`th request with `answers[n]` (the last
    /// one again past the end), after reading it whole; it counts the requests.
    async fn collector(answers: &'static [&'static str]) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let url = format!("http://{}/v1/traces", listener.local_addr().expect("bound"));
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        while buf.len() < head_end + length {
                            let mut chunk = [0u8; 4096];
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..head_end + length);
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        let answer = answers[n.min(answers.len() - 1)];
                        let reply = format!("HTTP/1.1 {answer}\r\ncontent-length: 0\r\n\r\n");
                        if stream.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, seen)
    }

    fn poster(url: String) -> Poster {
        crate::tls::install_ring();
        Poster::new(reqwest::Client::new(), url, HeaderMap::new())
    }

    #[tokio::test]
    async fn a_busy_collector_is_asked_again_and_its_retry_after_waited() {
        let (url, seen) = collector(&[
            "503 Service Unavailable\r\nretry-after: 1",
            "429 Too Many Requests",
            "200 OK",
        ])
        .await;
        let started = Instant::now();
        let posted = poster(url)
            .post(vec![1, 2, 3], Duration::from_secs(10))
            .await;
        assert_eq!(posted, Ok(Vec::new()));
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "the Retry-After was waited: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_refusal_is_final_and_retries_end_at_the_deadline() {
        let (url, seen) = collector(&["400 Bad Request"]).await;
        let posted = poster(url).post(vec![1], Duration::from_secs(10)).await;
        assert_eq!(posted, Err("the collector answered 400 Bad Request".into()));
        assert_eq!(seen.load(Ordering::SeqCst), 1, "a 400 is not sent again");

        // Always busy: at most 3 retries, never past the deadline.
        let (url, seen) = collector(&["502 Bad Gateway"]).await;
        let posted = poster(url.clone())
            .post(vec![1], Duration::from_secs(10))
            .await;
        assert!(posted.is_err_and(|e| e.contains("502") && e.contains("3 retries")));
        assert_eq!(seen.load(Ordering::SeqCst), 4);
        let (url, seen) = collector(&["503 Service Unavailable\r\nretry-after: 30"]).await;
        let started = Instant::now();
        let posted = poster(url).post(vec![1], Duration::from_secs(2)).await;
        assert!(posted.is_err_and(|e| e.contains("no time left")));
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_failed_request_says_why() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let url = format!("http://{}/v1/traces", listener.local_addr().expect("bound"));
        drop(listener);
        let error = poster(url)
            .post(vec![1], Duration::from_millis(300))
            .await
            .expect_err("nobody listens");
        assert!(
            error.to_lowercase().contains("connection refused"),
            "the cause, not only \"error sending request\": {error}"
        );
    }

    #[tokio::test]
    async fn a_collector_that_is_not_there_yet_is_tried_again() {
        // A port with nobody on it, then a collector on it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let address = listener.local_addr().expect("bound");
        drop(listener);
        let url = format!("http://{address}/v1/traces");
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let listener = TcpListener::bind(address).await.expect("the same port");
            let (mut stream, _) = listener.accept().await.expect("a request");
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        });
        let posted = poster(url).post(vec![1], Duration::from_secs(5)).await;
        assert_eq!(posted, Ok(Vec::new()));
        late.await.expect("served");
    }
}
