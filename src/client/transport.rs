//! The wire: one send (`POST /v1/queues/{queue}/messages`) and one lifecycle probe
//! (`GET /health/detailed`), each turned into a small typed answer. Nothing here decides
//! whether to retry or wait; that is `retry.rs` and `lifecycle.rs`.
//!
//! [`Transport`] is a trait so the send loop can be tested with a scripted fake under a
//! paused clock; [`HttpTransport`] is the real one (reqwest with rustls, one pooled client).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use super::retry::MAX_RETRY_AFTER;

/// The gateway's answer to one send, as far as the client needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// The body's `code`; `None` when the body is not the gateway's JSON (a proxy's page).
    pub code: Option<String>,
    /// The body's `message_id` (on a 201, and on a 504).
    pub message_id: Option<String>,
    pub retry_after: Option<Duration>,
}

impl Answer {
    /// The error code to report: the body's, or `http_<status>` when there is none.
    pub fn code_or_status(&self) -> String {
        self.code
            .clone()
            .unwrap_or_else(|| format!("http_{}", self.status))
    }
}

/// No HTTP answer at all: the connection failed, was cut, or the request timed out.
/// Whether the message was stored is unknown, so it is retried with the same key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransportError(pub String);

/// What `/health/detailed` said.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeAnswer {
    /// A 200 with a `gateway_state`, and `drain.remaining_s` when draining.
    State {
        gateway_state: String,
        remaining: Option<Duration>,
    },
    /// 401: the gateway does not know the token.
    Unauthenticated { code: String },
    /// 403: the token is known but may not read the health (a `sender`-only key).
    Forbidden,
    /// Anything else: transport error, 5xx, a body that does not parse.
    Unusable(String),
}

#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Send `body` to `queue` with this `Idempotency-Key`.
    async fn post(&self, queue: &str, body: Bytes, key: &str) -> Result<Answer, TransportError>;
    /// Read the gateway's lifecycle.
    async fn probe(&self) -> ProbeAnswer;
}

/// Why an [`HttpTransport`] cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TransportSetupError {
    #[error("the URL {0:?} is not an http:// or https:// URL")]
    Url(String),
    #[error("the token holds characters that cannot go in an HTTP header")]
    Token,
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The real transport: one pooled reqwest client (rustls) for every call of one client.
pub struct HttpTransport {
    http: reqwest::Client,
    /// The base URL without a trailing slash.
    base: String,
    authorization: Option<HeaderValue>,
}

impl fmt::Debug for HttpTransport {
    // Never print the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("base", &self.base)
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Idle connections are closed after this long: shorter than the gateway's 75 s
/// keep-alive, so the client never reuses a connection the server is closing.
const POOL_IDLE: Duration = Duration::from_secs(50);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl HttpTransport {
    pub fn new(
        base_url: &str,
        token: Option<&str>,
        request_timeout: Duration,
    ) -> Result<Self, TransportSetupError> {
        let parsed =
            reqwest::Url::parse(base_url).map_err(|_| TransportSetupError::Url(base_url.into()))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(TransportSetupError::Url(base_url.into()));
        }
        let authorization = token
            .map(|t| {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
                    .map_err(|_| TransportSetupError::Token)?;
                // Keeps it out of reqwest's and hyper's debug output.
                v.set_sensitive(true);
                Ok::<_, TransportSetupError>(v)
            })
            .transpose()?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("sendgate-client/", env!("CARGO_PKG_VERSION")))
            .timeout(request_timeout)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE)
            .build()?;
        Ok(Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            authorization,
        })
    }

    fn with_auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.authorization {
            Some(v) => req.header(AUTHORIZATION, v.clone()),
            None => req,
        }
    }
}

#[async_trait]
impl Transport for HttpTransport {
    async fn post(&self, queue: &str, body: Bytes, key: &str) -> Result<Answer, TransportError> {
        // `queue` is a parsed QueueName (letters, digits, `.-_`): safe in a path as is.
        let url = format!("{}/v1/queues/{queue}/messages", self.base);
        let req = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", key)
            .body(body);
        let response = self
            .with_auth(req)
            .send()
            .await
            .map_err(|e| TransportError(describe(&e)))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| parse_retry_after(v.to_str().ok()?));
        // The body is small (the gateway's JSON); a body that cannot be read or parsed only
        // loses the code, never the status.
        let fields = response
            .bytes()
            .await
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let text = |name: &str| {
            fields
                .as_ref()
                .and_then(|f| f.get(name))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        Ok(Answer {
            status,
            code: text("code"),
            message_id: text("message_id"),
            retry_after,
        })
    }

    async fn probe(&self) -> ProbeAnswer {
        let req = self.http.get(format!("{}/health/detailed", self.base));
        let response = match self.with_auth(req).send().await {
            Ok(r) => r,
            Err(e) => return ProbeAnswer::Unusable(describe(&e)),
        };
        match response.status().as_u16() {
            200 => {}
            401 => {
                let code = response
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v.get("code")?.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "unauthenticated".into());
                return ProbeAnswer::Unauthenticated { code };
            }
            403 => return ProbeAnswer::Forbidden,
            other => return ProbeAnswer::Unusable(format!("health answered {other}")),
        }
        let Ok(v) = response.json::<serde_json::Value>().await else {
            return ProbeAnswer::Unusable("health body is not JSON".into());
        };
        let Some(state) = v.get("gateway_state").and_then(|s| s.as_str()) else {
            return ProbeAnswer::Unusable("health body has no gateway_state".into());
        };
        let remaining = v
            .get("drain")
            .and_then(|d| d.get("remaining_s"))
            .and_then(|r| r.as_f64())
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .map(|d| d.min(MAX_RETRY_AFTER));
        ProbeAnswer::State {
            gateway_state: state.to_owned(),
            remaining,
        }
    }
}

/// `Retry-After` in seconds (the gateway always sends an integer). An HTTP date, which a
/// proxy in front might send, is ignored: the backoff then decides alone.
pub fn parse_retry_after(raw: &str) -> Option<Duration> {
    raw.trim()
        .parse::<u64>()
        .ok()
        .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

/// A transport error in one line, with its cause (reqwest's own text is often just
/// "error sending request").
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let mut text = kind.to_owned();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_and_bounded() {
        assert_eq!(parse_retry_after("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after(" 1 "), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(
            parse_retry_after("99999999999999999"),
            Some(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn only_http_urls_are_accepted_and_the_token_is_never_printed() {
        assert!(HttpTransport::new("ftp://x", None, Duration::from_secs(1)).is_err());
        assert!(HttpTransport::new("not a url", None, Duration::from_secs(1)).is_err());
        assert!(matches!(
            HttpTransport::new("http://x", Some("bad\ntoken"), Duration::from_secs(1)),
            Err(TransportSetupError::Token)
        ));
        let t = HttpTransport::new("http://h:1/", Some("s3cret"), Duration::from_secs(1)).unwrap();
        assert_eq!(t.base, "http://h:1");
        assert!(!format!("{t:?}").contains("s3cret"));
    }
}
