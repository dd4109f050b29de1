//! The HTTP side of the Service Bus backend: one pooled client, the calls sendgate makes
//! (send a message or a batch of messages; read a queue's description), and how each answer maps onto
//! [`SendError`] / [`DepthError`].
//!
//! Every call is bounded by the caller's deadline twice: reqwest's per-request timeout
//! (which also closes the connection) and `tokio::time::timeout_at` around the whole
//! exchange, body included.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use tokio::time::Instant;

use super::arm;
use super::atom::{self, QueueDescription, QueueRuntime, MAX_DOCUMENT_BYTES};
use super::batch;
use super::single::SingleSend;
use crate::backend::{DepthError, SendError, SendReceipt};

/// Idle pooled connections are closed after this, before the Azure front end (or a NAT
/// on the way) silently drops them.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Consecutive calls without any HTTP answer (connect errors, resets, timeouts) after
/// which the client and its pool are replaced: a pool holding half-open connections, or
/// resolved to a front end that has gone, otherwise keeps failing.
pub const REBUILD_AFTER_FAILURES: u32 = 3;
/// Error bodies are read up to this much for their detail.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// The longest broker detail carried into an error.
const MAX_DETAIL_CHARS: usize = 300;
/// `backend_busy` without a `Retry-After` from the broker, and the least one passed on.
pub const MIN_BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A call that got no HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CallError {
    Timeout,
    /// A reset, a body cut off: the request may or may not have arrived.
    Transport(String),
    /// The connection was never made: the request did not leave.
    Unsent(String),
    /// The request could not be built (a header value reqwest refuses); never sent.
    Request(String),
}

/// An HTTP answer: status, `Retry-After`, and the body when it fit under the cap.
struct RestReply {
    status: StatusCode,
    retry_after: Option<Duration>,
    body: Result<Bytes, String>,
}

/// The pooled client, replaced after [`REBUILD_AFTER_FAILURES`] calls in a row without an
/// answer.
pub struct RestClient {
    client: RwLock<reqwest::Client>,
    failures: FailureStreak,
}

impl RestClient {
    pub fn new() -> Result<Self, reqwest::Error> {
        Ok(Self {
            client: RwLock::new(build_client()?),
            failures: FailureStreak::default(),
        })
    }

    fn client(&self) -> reqwest::Client {
        // reqwest::Client is a handle to a shared pool: cloning it is cheap.
        self.client.read().clone()
    }

    /// `POST {url}` with one Send Message Batch body (see `batch`): its JSON array of
    /// messages, which Service Bus takes or refuses whole. The one answer is every one of
    /// its messages' result.
    pub async fn send_batch(
        &self,
        url: &str,
        authorization: &str,
        body: Bytes,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        let request = self
            .client()
            .post(url)
            .header(AUTHORIZATION, authorization)
            .header(CONTENT_TYPE, batch::CONTENT_TYPE)
            .body(body);
        self.send(request, deadline).await
    }

    /// `POST {url}` in the single form (see `single`): one message, its content type,
    /// broker properties and trace headers.
    pub async fn send_single(
        &self,
        url: &str,
        authorization: &str,
        send: SingleSend,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        let mut request = self.client().post(url).header(AUTHORIZATION, authorization);
        for (name, value) in send.headers {
            request = request.header(name, value);
        }
        self.send(request.body(send.body), deadline).await
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        match self.call(request, deadline, MAX_ERROR_BODY).await {
            Ok(answer) => {
                let detail = answer.body.as_deref().map(detail).unwrap_or_default();
                send_outcome(answer.status, answer.retry_after, &detail)
            }
            Err(CallError::Timeout) => Err(SendError::Timeout),
            Err(CallError::Unsent(e)) => Err(SendError::Unavailable(e)),
            Err(CallError::Transport(e)) => Err(SendError::Uncertain(e)),
            Err(CallError::Request(e)) => Err(SendError::Unavailable(e)),
        }
    }

    /// `GET {url}` (the queue's ATOM description) and its runtime counts.
    pub async fn queue_runtime(
        &self,
        url: &str,
        authorization: &str,
        deadline: Instant,
    ) -> Result<QueueRuntime, DepthError> {
        let read = DepthGet {
            accept: "application/xml",
            body_cap: MAX_DOCUMENT_BYTES,
            plane: "the admin plane",
            outcome: depth_outcome,
        };
        self.depth_get(url, authorization, deadline, read).await
    }

    /// `GET {url}` (the queue's ARM resource, see `arm`) and its runtime counts.
    pub async fn arm_queue(
        &self,
        url: &str,
        authorization: &str,
        deadline: Instant,
    ) -> Result<QueueRuntime, DepthError> {
        let read = DepthGet {
            accept: "application/json",
            body_cap: arm::MAX_BODY_BYTES,
            plane: "Azure Resource Manager",
            outcome: arm_outcome,
        };
        self.depth_get(url, authorization, deadline, read).await
    }

    /// One depth read's `GET`, its answer read as `read.outcome` says.
    async fn depth_get(
        &self,
        url: &str,
        authorization: &str,
        deadline: Instant,
        read: DepthGet,
    ) -> Result<QueueRuntime, DepthError> {
        let request = self
            .client()
            .get(url)
            .header(AUTHORIZATION, authorization)
            .header(ACCEPT, read.accept);
        match self.call(request, deadline, read.body_cap).await {
            Ok(answer) => (read.outcome)(answer.status, answer.body),
            Err(CallError::Timeout) => Err(DepthError::Timeout),
            Err(CallError::Transport(e) | CallError::Unsent(e) | CallError::Request(e)) => Err(
                DepthError::Failed(format!("{} could not be reached: {e}", read.plane)),
            ),
        }
    }

    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        deadline: Instant,
        body_cap: usize,
    ) -> Result<RestReply, CallError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(CallError::Timeout);
        }
        let exchange = async {
            let mut response = request.timeout(remaining).send().await?;
            let status = response.status();
            let retry_after = retry_after(response.headers());
            let body = read_capped(&mut response, body_cap).await?;
            Ok::<_, reqwest::Error>(RestReply {
                status,
                retry_after,
                body,
            })
        };
        let outcome = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) if e.is_timeout() => Err(CallError::Timeout),
            Ok(Err(e)) if e.is_builder() => return Err(CallError::Request(e.to_string())),
            // A failed connect never carried the request; anything later may have.
            Ok(Err(e)) if e.is_connect() => Err(CallError::Unsent(error_chain(&e))),
            Ok(Err(e)) => Err(CallError::Transport(error_chain(&e))),
            Err(_) => Err(CallError::Timeout),
        };
        match outcome {
            Ok(_) => self.failures.answered(),
            Err(_) => {
                if self.failures.failed() {
                    self.rebuild();
                }
            }
        }
        outcome
    }

    fn rebuild(&self) {
        match build_client() {
            Ok(fresh) => {
                *self.client.write() = fresh;
                tracing::warn!(
                    event = "servicebus_client_rebuilt",
                    after_failures = REBUILD_AFTER_FAILURES,
                    "no answer from Service Bus {REBUILD_AFTER_FAILURES} times in a row: opened a fresh connection pool"
                );
            }
            Err(e) => {
                tracing::error!(event = "servicebus_client_rebuild_failed", error = %e, "could not rebuild the HTTP client; keeping the old one");
            }
        }
    }
}

fn build_client() -> Result<reqwest::Client, reqwest::Error> {
    crate::tls::install_ring();
    reqwest::Client::builder()
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tcp_keepalive(Duration::from_secs(30))
        // A redirected POST would turn into a GET; Service Bus never redirects these calls.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("sendgate/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Counts calls in a row that got no HTTP answer.
#[derive(Debug, Default)]
struct FailureStreak(AtomicU32);

impl FailureStreak {
    fn answered(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// One more failure; `true` when the streak reaches [`REBUILD_AFTER_FAILURES`] (and
    /// starts over).
    fn failed(&self) -> bool {
        let streak = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        if streak >= REBUILD_AFTER_FAILURES {
            self.0.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// The body, or why it is not there: larger than `cap` (announced or while reading).
async fn read_capped(
    response: &mut reqwest::Response,
    cap: usize,
) -> Result<Result<Bytes, String>, reqwest::Error> {
    let too_large = || format!("the body is larger than {cap} bytes");
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Ok(Err(too_large()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > cap {
            return Ok(Err(too_large()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Ok(body.into()))
}

/// `Retry-After` in whole seconds (the form Service Bus sends); an HTTP date is ignored.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// reqwest's error with its causes ("error sending request: connection refused").
fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A broker error body as one short line: the `<Detail>` of an `<Error>` document, or
/// the text itself.
fn detail(body: &[u8]) -> String {
    atom::error_detail(body).unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        atom::shorten(&line, MAX_DETAIL_CHARS)
    })
}

fn describe(status: StatusCode, detail: &str) -> String {
    let detail = atom::shorten(detail, MAX_DETAIL_CHARS);
    if detail.is_empty() {
        format!("HTTP {}", status.as_u16())
    } else {
        format!("HTTP {}: {detail}", status.as_u16())
    }
}

/// What a send's answer means. Service Bus documents 201 on success; 401; 403 for quota
/// exceeded *or* message too large (told apart by the body); 404/410 for a missing
/// entity; 413; 429/503 when busy or throttled; 500.
pub fn send_outcome(
    status: StatusCode,
    retry_after: Option<Duration>,
    detail: &str,
) -> Result<SendReceipt, SendError> {
    if status.is_success() {
        // Duplicate detection drops a repeated MessageId silently and still answers 201.
        return Ok(SendReceipt { duplicate: false });
    }
    let text = detail.to_ascii_lowercase();
    let busy = || SendError::Busy {
        reason: describe(status, detail),
        retry_after: Some(
            retry_after
                .unwrap_or(MIN_BUSY_RETRY_AFTER)
                .max(MIN_BUSY_RETRY_AFTER),
        ),
    };
    Err(match status.as_u16() {
        401 => SendError::AuthFailed(describe(status, detail)),
        403 if says_too_large(&text) => SendError::TooLarge,
        403 if says_quota_exceeded(&text) => busy(),
        403 if says_disabled(&text) => SendError::QueueDisabled,
        403 => SendError::AuthFailed(describe(status, detail)),
        413 => SendError::TooLarge,
        404 | 410 => SendError::QueueNotFound,
        429 | 503 => busy(),
        _ => SendError::Failed(describe(status, detail)),
    })
}

fn says_too_large(text: &str) -> bool {
    [
        "too large",
        "messagesizeexceeded",
        "message size",
        "exceeds the limit",
        "maximum message size",
    ]
    .iter()
    .any(|p| text.contains(p))
}

fn says_quota_exceeded(text: &str) -> bool {
    // "Quota exceeded", and the entity-full text: "The maximum entity size has been
    // reached or exceeded for Queue ...".
    ["quota", "maximum entity size"]
        .iter()
        .any(|p| text.contains(p))
}

fn says_disabled(text: &str) -> bool {
    text.contains("disabled")
}

/// How one depth source's `GET` is asked and read: what it accepts, the most of its body
/// read, the plane named when it cannot be reached, and what its answer means.
struct DepthGet {
    accept: &'static str,
    body_cap: usize,
    plane: &'static str,
    outcome: fn(StatusCode, Result<Bytes, String>) -> Result<QueueRuntime, DepthError>,
}

/// What a depth read's answer means. A 200 may still be "not found": an empty ATOM feed.
fn depth_outcome(
    status: StatusCode,
    body: Result<Bytes, String>,
) -> Result<QueueRuntime, DepthError> {
    let detail_of = |body: &Result<Bytes, String>| match body {
        Ok(b) => detail(b),
        Err(e) => e.clone(),
    };
    match status.as_u16() {
        200 => {
            let body = body.map_err(|e| DepthError::Failed(format!("queue description: {e}")))?;
            match atom::parse_queue_description(&body) {
                Ok(QueueDescription::Found(runtime)) => Ok(runtime),
                Ok(QueueDescription::NotFound) => Err(DepthError::QueueNotFound),
                Err(e) => Err(DepthError::Failed(format!(
                    "unreadable queue description: {e}"
                ))),
            }
        }
        401 | 403 => Err(DepthError::Unauthorized(describe(
            status,
            &detail_of(&body),
        ))),
        404 | 410 => Err(DepthError::QueueNotFound),
        _ => Err(DepthError::Failed(describe(status, &detail_of(&body)))),
    }
}

/// What an ARM queue read's answer means: 200 the resource; 401/403 no Reader right (or
/// a token ARM refuses); 404 no such queue (or namespace); anything else, a 429 throttle
/// included, a failed read.
fn arm_outcome(
    status: StatusCode,
    body: Result<Bytes, String>,
) -> Result<QueueRuntime, DepthError> {
    let detail_of = |body: &Result<Bytes, String>| match body {
        Ok(b) => arm::error_detail(b).unwrap_or_else(|| detail(b)),
        Err(e) => e.clone(),
    };
    match status.as_u16() {
        200 => {
            let body = body.map_err(|e| DepthError::Failed(format!("queue resource: {e}")))?;
            arm::parse_queue(&body).map_err(|e| DepthError::Failed(e.to_string()))
        }
        401 | 403 => Err(DepthError::Unauthorized(describe(
            status,
            &detail_of(&body),
        ))),
        404 => Err(DepthError::QueueNotFound),
        _ => Err(DepthError::Failed(describe(status, &detail_of(&body)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAIM_EMPTY: &str =
        include_str!("../../../tests/data/servicebus/management_401_claim_empty.xml");
    const FOUND: &str =
        include_str!("../../../tests/data/servicebus/queue_runtime_properties_200.xml");
    const NOT_FOUND: &str =
        include_str!("../../../tests/data/servicebus/queue_not_found_200_feed.xml");

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    fn error_body(code: u16, detail: &str) -> String {
        format!("<Error><Code>{code}</Code><Detail>{detail}</Detail></Error>")
    }

    fn outcome(code: u16, retry: Option<u64>, body: &str) -> Result<SendReceipt, SendError> {
        send_outcome(
            status(code),
            retry.map(Duration::from_secs),
            &detail(body.as_bytes()),
        )
    }

    #[test]
    fn success_statuses_are_sent() {
        assert_eq!(outcome(201, None, ""), Ok(SendReceipt { duplicate: false }));
        assert_eq!(outcome(200, None, ""), Ok(SendReceipt { duplicate: false }));
    }

    #[test]
    fn every_send_status_maps_to_its_error() {
        let too_large = error_body(
            403,
            "The received message (delivery-id:0, size:300000 bytes) exceeds the limit (262144 bytes) currently allowed on the link.",
        );
        let quota = error_body(
            403,
            "The maximum entity size has been reached or exceeded for Queue: 'requests'. TrackingId:1",
        );
        let quota_plain = error_body(403, "Quota exceeded.");
        let disabled = error_body(
            403,
            "Messaging entity 'ns:queue:requests' is currently disabled.",
        );
        let claim = error_body(401, "claim is empty. TrackingId:1");
        let send_claim = error_body(403, "Send claims are required for this operation.");

        assert!(
            matches!(outcome(401, None, &claim), Err(SendError::AuthFailed(d)) if d.contains("claim is empty"))
        );
        assert!(matches!(
            outcome(403, None, &send_claim),
            Err(SendError::AuthFailed(_))
        ));
        assert_eq!(outcome(403, None, &too_large), Err(SendError::TooLarge));
        assert_eq!(
            outcome(413, None, "Request Entity Too Large"),
            Err(SendError::TooLarge)
        );
        assert_eq!(outcome(413, None, ""), Err(SendError::TooLarge));
        assert!(matches!(
            outcome(403, None, &quota),
            Err(SendError::Busy { retry_after: Some(d), .. }) if d == Duration::from_secs(1)
        ));
        assert!(
            matches!(outcome(403, Some(9), &quota_plain), Err(SendError::Busy { retry_after: Some(d), .. }) if d == Duration::from_secs(9))
        );
        assert_eq!(outcome(403, None, &disabled), Err(SendError::QueueDisabled));
        assert_eq!(outcome(404, None, ""), Err(SendError::QueueNotFound));
        assert_eq!(outcome(410, None, "gone"), Err(SendError::QueueNotFound));
        assert!(
            matches!(outcome(500, None, "boom"), Err(SendError::Failed(d)) if d == "HTTP 500: boom")
        );
        assert!(matches!(outcome(400, None, ""), Err(SendError::Failed(d)) if d == "HTTP 400"));
        assert!(matches!(outcome(302, None, ""), Err(SendError::Failed(_))));
    }

    #[test]
    fn busy_carries_retry_after_of_at_least_one_second() {
        for (code, header, expected) in [
            (503, Some(7), 7),
            (503, None, 1),
            (429, Some(0), 1),
            (429, Some(120), 120),
        ] {
            match outcome(code, header, "Server busy") {
                Err(SendError::Busy {
                    retry_after,
                    reason,
                }) => {
                    assert_eq!(
                        retry_after,
                        Some(Duration::from_secs(expected)),
                        "{code} {header:?}"
                    );
                    assert!(reason.contains("Server busy"), "{reason}");
                }
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    #[test]
    fn retry_after_is_whole_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, " 7 ".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, "-3".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn depth_answers_map_to_backlog_or_a_clean_failure() {
        let ok = |s: &str| Ok(Bytes::from(s.to_owned()));
        assert_eq!(depth_outcome(status(200), ok(FOUND)).unwrap().backlog(), 0);
        assert_eq!(
            depth_outcome(status(200), ok(NOT_FOUND)),
            Err(DepthError::QueueNotFound)
        );
        match depth_outcome(status(401), ok(CLAIM_EMPTY)) {
            Err(DepthError::Unauthorized(d)) => {
                assert!(d.starts_with("HTTP 401: claim is empty."), "{d}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            depth_outcome(status(403), ok("Manage,EntityRead claims required for this operation.")),
            Err(DepthError::Unauthorized(d)) if d.contains("Manage,EntityRead")
        ));
        assert_eq!(
            depth_outcome(status(404), ok("")),
            Err(DepthError::QueueNotFound)
        );
        assert!(matches!(
            depth_outcome(status(200), ok(&FOUND[..FOUND.len() / 2])),
            Err(DepthError::Failed(d)) if d.starts_with("unreadable queue description")
        ));
        assert!(matches!(
            depth_outcome(status(200), Err("the body is larger than 1048576 bytes".into())),
            Err(DepthError::Failed(d)) if d.contains("larger than")
        ));
        assert!(matches!(
            depth_outcome(status(503), ok("busy")),
            Err(DepthError::Failed(d)) if d == "HTTP 503: busy"
        ));
    }

    #[test]
    fn arm_answers_map_to_backlog_or_a_clean_failure() {
        const QUEUE: &str = include_str!("../../../tests/data/servicebus/arm_queue_get_200.json");
        let ok = |s: &str| Ok(Bytes::from(s.to_owned()));
        assert_eq!(arm_outcome(status(200), ok(QUEUE)).unwrap().backlog(), 0);
        let denied = r#"{"error":{"code":"AuthorizationFailed","message":"no read"}}"#;
        for code in [401, 403] {
            assert_eq!(
                arm_outcome(status(code), ok(denied)),
                Err(DepthError::Unauthorized(format!(
                    "HTTP {code}: AuthorizationFailed: no read"
                )))
            );
        }
        assert_eq!(
            arm_outcome(status(404), ok(r#"{"error":{"code":"NotFound"}}"#)),
            Err(DepthError::QueueNotFound)
        );
        assert_eq!(
            arm_outcome(status(429), ok(r#"{"error":{"code":"TooManyRequests"}}"#)),
            Err(DepthError::Failed("HTTP 429: TooManyRequests".into()))
        );
        assert_eq!(
            arm_outcome(status(503), ok("busy")),
            Err(DepthError::Failed("HTTP 503: busy".into()))
        );
        assert!(matches!(
            arm_outcome(status(200), ok("{}")),
            Err(DepthError::Failed(d)) if d.contains("countDetails")
        ));
        assert!(matches!(
            arm_outcome(status(200), Err("the body is larger than 1048576 bytes".into())),
            Err(DepthError::Failed(d)) if d.contains("larger than")
        ));
    }

    #[test]
    fn error_details_are_one_short_line() {
        assert_eq!(detail(b"  two\n  lines  "), "two lines");
        let long = "x".repeat(1000);
        assert_eq!(
            detail(long.as_bytes()).chars().count(),
            MAX_DETAIL_CHARS + 1
        );
        assert_eq!(detail(b"\xff\xfe"), "\u{fffd}\u{fffd}");
    }

    #[test]
    fn the_client_is_rebuilt_after_three_failures_in_a_row() {
        let streak = FailureStreak::default();
        assert!(!streak.failed());
        assert!(!streak.failed());
        streak.answered();
        assert!(!streak.failed());
        assert!(!streak.failed());
        assert!(streak.failed(), "third in a row");
        assert!(!streak.failed(), "the count starts over");
    }
}
