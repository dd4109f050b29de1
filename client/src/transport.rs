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
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use sendgate_wire::{headers, AnyCode, ErrorBody, ErrorCode, GatewayState, LifecycleView, Queued};

use super::retry::MAX_RETRY_AFTER;

/// The gateway's answer to one send, as far as the client needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// The body's `code`; `None` when the body is not the gateway's JSON (a proxy's page).
    pub code: Option<AnyCode>,
    /// The body's `message_id` (on a 201, and on a 504).
    pub message_id: Option<String>,
    pub retry_after: Option<Duration>,
}

impl Answer {
    /// A `503 draining` or `503 starting`: the gateway's state and its `Retry-After`. Such
    /// an answer is a wait, not a failed attempt.
    pub fn deferral(&self) -> Option<(GatewayState, Option<Duration>)> {
        if self.status != 503 {
            return None;
        }
        let state = match self.code.as_ref()?.known()? {
            ErrorCode::Draining => GatewayState::Draining,
            ErrorCode::Starting => GatewayState::Starting,
            _ => return None,
        };
        Some((state, self.retry_after))
    }
}

/// No HTTP answer at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The request never reached a server (connection refused, reset or timed out while
    /// connecting): nothing was stored. A restart's gap on the same port looks like this,
    /// so the send waits and asks again instead of spending an attempt.
    #[error("{0}")]
    Connect(String),
    /// The connection was cut or the request timed out after it was sent: whether the
    /// message was stored is unknown, so it is retried with the same key.
    #[error("{0}")]
    Unknown(String),
}

impl TransportError {
    fn of(e: &reqwest::Error) -> Self {
        // reqwest marks an error from the connector (TCP connect, TLS handshake, the
        // connect timeout) as `is_connect`: no byte of the request was written then.
        if e.is_connect() {
            Self::Connect(describe(e))
        } else {
            Self::Unknown(describe(e))
        }
    }
}

/// What `/health/detailed` said.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeAnswer {
    /// A 200 with a known `gateway_state`, and `drain.remaining_s` when draining.
    State {
        gateway_state: GatewayState,
        remaining: Option<Duration>,
    },
    /// 401: the gateway does not know the token.
    Unauthenticated { code: AnyCode },
    /// 403: the token is known but may not read the health (a `sender`-only key).
    Forbidden,
    /// Anything else: transport error, 5xx, a body that does not parse, a state this
    /// version does not know.
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

/// Installs ring as the process-level rustls provider unless the producer installed one.
///
/// reqwest is built with `rustls-no-provider` (one TLS stack, no aws-lc-rs C build) and
/// panics when building a client with no provider installed; a provider the producer chose
/// before this is kept.
fn install_ring_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Err only means one is installed already, which is all a client needs.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

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
        install_ring_provider();
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
            .header(headers::IDEMPOTENCY_KEY, key)
            .body(body);
        let response = self
            .with_auth(req)
            .send()
            .await
            .map_err(|e| TransportError::of(&e))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(headers::RETRY_AFTER)
            .and_then(|v| parse_retry_after(v.to_str().ok()?));
        // The body is small (the gateway's JSON); a body that cannot be read or parsed only
        // loses the code, never the status.
        let body = response.bytes().await.unwrap_or_default();
        let (code, message_id) = read_send_body(status, &body);
        Ok(Answer {
            status,
            code,
            message_id,
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
                let body = response.bytes().await.unwrap_or_default();
                let code = read_send_body(401, &body)
                    .0
                    .unwrap_or(AnyCode::Known(ErrorCode::Unauthenticated));
                return ProbeAnswer::Unauthenticated { code };
            }
            403 => return ProbeAnswer::Forbidden,
            other => return ProbeAnswer::Unusable(format!("health answered {other}")),
        }
        match response.bytes().await {
            Ok(body) => read_health(&body),
            Err(e) => ProbeAnswer::Unusable(describe(&e)),
        }
    }
}

/// The code and the message id of a send's answer body: a [`Queued`] body on a 2xx, an
/// [`ErrorBody`] otherwise. A body that is not the gateway's JSON gives neither.
fn read_send_body(status: u16, body: &[u8]) -> (Option<AnyCode>, Option<String>) {
    if (200..300).contains(&status) {
        return match serde_json::from_slice::<Queued>(body) {
            Ok(q) => (None, Some(q.message_id.into_owned())),
            Err(_) => (None, None),
        };
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => (Some(e.code), e.message_id.map(|m| m.into_owned())),
        Err(_) => (None, None),
    }
}

/// A 200 from `/health/detailed`, read as far as the lifecycle goes.
fn read_health(body: &[u8]) -> ProbeAnswer {
    let view = match serde_json::from_slice::<LifecycleView>(body) {
        Ok(v) => v,
        Err(e) => return ProbeAnswer::Unusable(format!("health body unreadable: {e}")),
    };
    let Some(gateway_state) = view.state() else {
        return ProbeAnswer::Unusable(format!(
            "health names an unknown gateway_state {:?}",
            view.gateway_state
        ));
    };
    let remaining = view
        .drain
        .and_then(|d| Duration::try_from_secs_f64(d.remaining_s).ok())
        .map(|d| d.min(MAX_RETRY_AFTER));
    ProbeAnswer::State {
        gateway_state,
        remaining,
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

    #[test]
    fn send_bodies_are_read_through_the_wire_types() {
        let created = br#"{"status":"queued","queue":"q","message_id":"m-1","request_id":"r"}"#;
        assert_eq!(read_send_body(201, created), (None, Some("m-1".into())));
        let timeout = br#"{"code":"send_timeout","message":"late","message_id":"m-2","outcome":"unknown","request_id":"r"}"#;
        assert_eq!(
            read_send_body(504, timeout),
            (Some(ErrorCode::SendTimeout.into()), Some("m-2".into()))
        );
        let newer = br#"{"code":"rate_limited","message":"slow down","request_id":"r"}"#;
        assert_eq!(
            read_send_body(429, newer),
            (Some(AnyCode::Unknown("rate_limited".into())), None)
        );
        assert_eq!(
            read_send_body(502, b"<html>bad gateway</html>"),
            (None, None)
        );
    }

    #[test]
    fn only_a_503_draining_or_starting_is_a_deferral() {
        let answer = |status, code: ErrorCode| Answer {
            status,
            code: Some(code.into()),
            message_id: None,
            retry_after: Some(Duration::from_secs(7)),
        };
        assert_eq!(
            answer(503, ErrorCode::Draining).deferral(),
            Some((GatewayState::Draining, Some(Duration::from_secs(7))))
        );
        assert_eq!(
            answer(503, ErrorCode::Starting).deferral(),
            Some((GatewayState::Starting, Some(Duration::from_secs(7))))
        );
        assert_eq!(answer(503, ErrorCode::Saturated).deferral(), None);
        assert_eq!(answer(429, ErrorCode::Draining).deferral(), None);
    }

    #[test]
    fn the_health_body_gives_the_state_and_the_drain_left() {
        let draining = br#"{"status":"degraded","gateway_state":"draining","drain":{"remaining_s":2.5,"in_flight":1}}"#;
        assert_eq!(
            read_health(draining),
            ProbeAnswer::State {
                gateway_state: GatewayState::Draining,
                remaining: Some(Duration::from_millis(2500))
            }
        );
        let running = br#"{"status":"ok","gateway_state":"running","drain":null}"#;
        assert!(matches!(
            read_health(running),
            ProbeAnswer::State {
                gateway_state: GatewayState::Running,
                remaining: None
            }
        ));
        // The state is compared trimmed and without regard to case.
        for body in [
            &br#"{"gateway_state":"Draining ","drain":{"remaining_s":4.0}}"#[..],
            br#"{"gateway_state":"DRAINING","drain":{"remaining_s":4.0}}"#,
            br#"{"gateway_state":" draining\n","drain":{"remaining_s":4.0}}"#,
        ] {
            assert_eq!(
                read_health(body),
                ProbeAnswer::State {
                    gateway_state: GatewayState::Draining,
                    remaining: Some(Duration::from_secs(4))
                },
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // A state this version does not know reads as unusable, which means "send".
        for body in [&br#"{"gateway_state":"sideways"}"#[..], b"{}", b"not json"] {
            assert!(
                matches!(read_health(body), ProbeAnswer::Unusable(_)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
