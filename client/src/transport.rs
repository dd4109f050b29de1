//! The wire: one send (`POST /v1/queues/{queue}/messages`, its attributes as `Message-*`
//! headers), one batch send (`POST /v1/queues/{queue}/messages/batch`) and one lifecycle
//! probe (`GET /health/detailed`), each turned into a small typed answer. Nothing here
//! decides whether to retry or wait; that is `retry.rs`, `lifecycle.rs` and the send loop.
//!
//! [`Transport`] is a trait so the send loop can be tested with a scripted fake under a
//! paused clock; [`HttpTransport`] is the real one (reqwest with rustls, one pooled client).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use sendgate_wire::{
    headers, AnyCode, BatchMessage, BatchPartial, BatchQueued, CorrelationId, EntryResult,
    ErrorBody, ErrorCode, FieldError, GatewayState, LifecycleView, MessageAttributes, MessageId,
    Queued,
};

use super::retry::MAX_RETRY_AFTER;
use crate::token::{Credential, TokenSource, TokenSourceError};

/// The gateway's answer to one send, as far as the client needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// The body's `code`; `None` when the body is not the gateway's JSON (a proxy's page).
    pub code: Option<AnyCode>,
    /// The body's `message_id` (on a 201, and on a 504).
    pub message_id: Option<String>,
    pub retry_after: Option<Duration>,
    /// The error body says `outcome: unknown`: the broker may hold the message (a `502
    /// send_failed` whose send may have reached it, a `504`).
    pub outcome_unknown: bool,
}

impl Answer {
    /// A `503 draining` or `503 starting`: the gateway's state and its `Retry-After`. Such
    /// an answer is a wait, not a failed attempt.
    pub fn deferral(&self) -> Option<(GatewayState, Option<Duration>)> {
        deferral(self.status, self.code.as_ref(), self.retry_after)
    }
}

/// The gateway's answer to one batch request, as far as the client needs it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchAnswer {
    pub status: u16,
    /// An error body's `code`; `None` on a 201 or a 207, or when the body is not the
    /// gateway's JSON.
    pub code: Option<AnyCode>,
    pub retry_after: Option<Duration>,
    /// `201`: each entry's id and trace, in the request's order.
    pub queued: Vec<BatchMessage<'static>>,
    /// `207`: each entry's result.
    pub results: Vec<EntryResult<'static>>,
    /// `429 queue_full`: how many of the entries would be admitted now.
    pub room: Option<u64>,
    /// `400 invalid_request`: what is wrong, where (`["body", "messages", 3, "subject"]`).
    pub errors: Vec<FieldError>,
    /// `422 unsupported_attribute`: the attribute, by its batch field's name.
    pub attribute: Option<String>,
    /// `413 payload_too_large`: the largest request the gateway takes.
    pub limit_bytes: Option<usize>,
}

impl BatchAnswer {
    /// As [`Answer::deferral`]: a whole batch met a drain or a start-up.
    pub fn deferral(&self) -> Option<(GatewayState, Option<Duration>)> {
        deferral(self.status, self.code.as_ref(), self.retry_after)
    }
}

fn deferral(
    status: u16,
    code: Option<&AnyCode>,
    retry_after: Option<Duration>,
) -> Option<(GatewayState, Option<Duration>)> {
    if status != 503 {
        return None;
    }
    let state = match code?.known()? {
        ErrorCode::Draining => GatewayState::Draining,
        ErrorCode::Starting => GatewayState::Starting,
        _ => return None,
    };
    Some((state, retry_after))
}

/// The `Message-*` headers of a single send, as the contract spells them. The server's
/// names live in its `domain::attributes::Field`; the wire crate has no constants for them.
pub const MESSAGE_SUBJECT: &str = "Message-Subject";
pub const MESSAGE_SESSION_ID: &str = "Message-Session-Id";
pub const MESSAGE_PARTITION_KEY: &str = "Message-Partition-Key";
pub const MESSAGE_TIME_TO_LIVE: &str = "Message-Time-To-Live";
pub const MESSAGE_SCHEDULED_ENQUEUE_TIME: &str = "Message-Scheduled-Enqueue-Time";
pub const MESSAGE_REPLY_TO: &str = "Message-Reply-To";
pub const MESSAGE_TO: &str = "Message-To";
pub const MESSAGE_PROPERTIES: &str = "Message-Properties";
/// W3C trace context: the message joins this trace (with a parent id of its own).
pub const TRACEPARENT: &str = "traceparent";

/// An attribute (or an id, or the trace) that cannot be sent as a header: nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}: holds a character that cannot go in an HTTP header (a control character)")]
pub struct HeaderError(pub &'static str);

/// A header value of `text`, which may be UTF-8 (the gateway reads the `Message-*` headers
/// as UTF-8) but not a control character.
pub fn header_value(name: &'static str, text: &str) -> Result<HeaderValue, HeaderError> {
    HeaderValue::from_bytes(text.as_bytes()).map_err(|_| HeaderError(name))
}

/// The `Message-*` headers that carry `attributes` on a single send: each attribute that
/// is set, the properties as one JSON object. The gateway checks the values (a `400`
/// names the header); only what no header can hold is refused here.
pub fn attribute_headers(
    attributes: &MessageAttributes,
) -> Result<Vec<(&'static str, HeaderValue)>, HeaderError> {
    let mut out = Vec::new();
    let texts = [
        (MESSAGE_SUBJECT, attributes.subject.as_deref()),
        (MESSAGE_SESSION_ID, attributes.session_id.as_deref()),
        (MESSAGE_PARTITION_KEY, attributes.partition_key.as_deref()),
        (
            MESSAGE_SCHEDULED_ENQUEUE_TIME,
            attributes.scheduled_enqueue_time.as_deref(),
        ),
        (MESSAGE_REPLY_TO, attributes.reply_to.as_deref()),
        (MESSAGE_TO, attributes.to.as_deref()),
    ];
    for (name, text) in texts {
        if let Some(text) = text {
            out.push((name, header_value(name, text)?));
        }
    }
    if let Some(ttl) = attributes.time_to_live_s {
        out.push((MESSAGE_TIME_TO_LIVE, HeaderValue::from(ttl)));
    }
    if !attributes.properties.is_empty() {
        // serde_json escapes every control character inside strings: the object's text is
        // always a valid header value (UTF-8 passes as is, which the gateway reads).
        let json = serde_json::to_string(&attributes.properties).unwrap_or_default();
        out.push((MESSAGE_PROPERTIES, header_value(MESSAGE_PROPERTIES, &json)?));
    }
    Ok(out)
}

/// One message on the single-send route, checked and ready for the wire.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Its `Idempotency-Key`, the same on every attempt.
    pub key: MessageId,
    pub body: Bytes,
    pub correlation_id: Option<CorrelationId>,
    pub traceparent: Option<HeaderValue>,
    /// The `Message-*` headers of its attributes.
    pub attributes: Vec<(&'static str, HeaderValue)>,
}

impl Outgoing {
    /// A message with a key and nothing else (what `Client::send` always sent).
    pub fn plain(key: MessageId, body: Bytes) -> Self {
        Self {
            key,
            body,
            correlation_id: None,
            traceparent: None,
            attributes: Vec::new(),
        }
    }
}

/// One batch request, ready for the wire.
#[derive(Debug, Clone)]
pub struct OutgoingBatch {
    /// The request's body: `{"messages":[...]}`, each entry with its idempotency key.
    pub body: Bytes,
    /// The `traceparent` every entry of this request shares.
    pub traceparent: Option<HeaderValue>,
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
    /// The token source gave no token: nothing was sent, and asking again at once would
    /// only ask the source again (it paces itself).
    #[error(transparent)]
    NoToken(#[from] crate::token::TokenSourceError),
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
    /// Send one message to `queue` (its key as `Idempotency-Key`, its attributes as the
    /// `Message-*` headers).
    async fn post(&self, queue: &str, message: &Outgoing) -> Result<Answer, TransportError>;
    /// Send one batch request to `queue`.
    async fn post_batch(
        &self,
        queue: &str,
        batch: &OutgoingBatch,
    ) -> Result<BatchAnswer, TransportError>;
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
    #[error("both a token and a token source are set: give one")]
    TwoCredentials,
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The real transport: one pooled reqwest client (rustls) for every call of one client.
pub struct HttpTransport {
    http: reqwest::Client,
    /// The base URL without a trailing slash.
    base: String,
    authorization: Authorization,
    /// `Sendgate-Criticality`, on every send and batch when set.
    criticality: Option<HeaderValue>,
}

impl fmt::Debug for HttpTransport {
    // Never print the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("base", &self.base)
            .field("authorization", &self.authorization)
            .finish()
    }
}

/// What goes in `Authorization`: nothing, a fixed header, or a source's token each time.
#[derive(Clone)]
enum Authorization {
    None,
    Fixed(HeaderValue),
    Source(Arc<dyn TokenSource>),
}

impl fmt::Debug for Authorization {
    // Never print the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Fixed(_) => "<redacted>",
            Self::Source(_) => "a token source",
        })
    }
}

/// `Bearer {token}`, kept out of reqwest's and hyper's debug output.
fn bearer(token: &str) -> Result<HeaderValue, TransportSetupError> {
    let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| TransportSetupError::Token)?;
    v.set_sensitive(true);
    Ok(v)
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
        credential: Option<&Credential>,
        request_timeout: Duration,
    ) -> Result<Self, TransportSetupError> {
        let parsed =
            reqwest::Url::parse(base_url).map_err(|_| TransportSetupError::Url(base_url.into()))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(TransportSetupError::Url(base_url.into()));
        }
        let authorization = match credential {
            None => Authorization::None,
            Some(Credential::Token(token)) => Authorization::Fixed(bearer(token)?),
            Some(Credential::Source(source)) => Authorization::Source(Arc::clone(source)),
        };
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
            criticality: None,
        })
    }

    /// Send every request at `criticality` (`None`: the key's own level).
    pub fn criticality(mut self, criticality: Option<crate::Criticality>) -> Self {
        self.criticality = criticality.map(|c| HeaderValue::from_static(c.as_str()));
        self
    }

    /// The `Sendgate-Criticality` header, when set.
    fn with_criticality(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.criticality {
            Some(v) => req.header(headers::CRITICALITY, v.clone()),
            None => req,
        }
    }

    async fn with_auth(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, TransportError> {
        Ok(match &self.authorization {
            Authorization::None => req,
            Authorization::Fixed(v) => req.header(AUTHORIZATION, v.clone()),
            Authorization::Source(source) => {
                let token = source.token().await?;
                let header = bearer(&token).map_err(|e| TokenSourceError(e.to_string()))?;
                req.header(AUTHORIZATION, header)
            }
        })
    }
}

/// A response's status, its `Retry-After` and its body. A body that cannot be read only
/// loses what it would have said, never the status.
async fn read_response(response: reqwest::Response) -> (u16, Option<Duration>, Bytes) {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(headers::RETRY_AFTER)
        .and_then(|v| parse_retry_after(v.to_str().ok()?));
    let body = response.bytes().await.unwrap_or_default();
    (status, retry_after, body)
}

#[async_trait]
impl Transport for HttpTransport {
    async fn post(&self, queue: &str, message: &Outgoing) -> Result<Answer, TransportError> {
        // `queue` is a parsed QueueName (letters, digits, `.-_`): safe in a path as is.
        let url = format!("{}/v1/queues/{queue}/messages", self.base);
        let mut req = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header(headers::IDEMPOTENCY_KEY, message.key.as_str());
        if let Some(correlation) = &message.correlation_id {
            req = req.header(headers::CORRELATION_ID, correlation.as_str());
        }
        if let Some(parent) = &message.traceparent {
            req = req.header(TRACEPARENT, parent.clone());
        }
        for (name, value) in &message.attributes {
            req = req.header(*name, value.clone());
        }
        let response = self
            .with_auth(self.with_criticality(req.body(message.body.clone())))
            .await?
            .send()
            .await
            .map_err(|e| TransportError::of(&e))?;
        let (status, retry_after, body) = read_response(response).await;
        let sent = read_send_body(status, &body);
        Ok(Answer {
            status,
            code: sent.code,
            message_id: sent.message_id,
            retry_after,
            outcome_unknown: sent.outcome_unknown,
        })
    }

    async fn post_batch(
        &self,
        queue: &str,
        batch: &OutgoingBatch,
    ) -> Result<BatchAnswer, TransportError> {
        let url = format!("{}/v1/queues/{queue}/messages/batch", self.base);
        let mut req = self.http.post(url).header(CONTENT_TYPE, "application/json");
        if let Some(parent) = &batch.traceparent {
            req = req.header(TRACEPARENT, parent.clone());
        }
        let response = self
            .with_auth(self.with_criticality(req.body(batch.body.clone())))
            .await?
            .send()
            .await
            .map_err(|e| TransportError::of(&e))?;
        let (status, retry_after, body) = read_response(response).await;
        Ok(read_batch_body(status, retry_after, &body))
    }

    async fn probe(&self) -> ProbeAnswer {
        let req = self.http.get(format!("{}/health/detailed", self.base));
        let req = match self.with_auth(req).await {
            Ok(req) => req,
            Err(e) => return ProbeAnswer::Unusable(e.to_string()),
        };
        let response = match req.send().await {
            Ok(r) => r,
            Err(e) => return ProbeAnswer::Unusable(describe(&e)),
        };
        match response.status().as_u16() {
            200 => {}
            401 => {
                let body = response.bytes().await.unwrap_or_default();
                let code = read_send_body(401, &body)
                    .code
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

/// What a send's answer body says: a [`Queued`] body on a 2xx, an [`ErrorBody`]
/// otherwise. A body that is not the gateway's JSON says nothing.
#[derive(Debug, Default, PartialEq, Eq)]
struct SendBody {
    code: Option<AnyCode>,
    message_id: Option<String>,
    outcome_unknown: bool,
}

fn read_send_body(status: u16, body: &[u8]) -> SendBody {
    if (200..300).contains(&status) {
        return match serde_json::from_slice::<Queued>(body) {
            Ok(q) => SendBody {
                message_id: Some(q.message_id.into_owned()),
                ..SendBody::default()
            },
            Err(_) => SendBody::default(),
        };
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => SendBody {
            outcome_unknown: e.outcome_unknown(),
            code: Some(e.code),
            message_id: e.message_id.map(|m| m.into_owned()),
        },
        Err(_) => SendBody::default(),
    }
}

/// A batch request's answer: a [`BatchQueued`] on a 2xx, a [`BatchPartial`] on a 207, an
/// [`ErrorBody`] otherwise. A body that is not the gateway's JSON keeps only the status
/// (a 207 without results then reads as every entry's outcome unknown).
pub fn read_batch_body(status: u16, retry_after: Option<Duration>, body: &[u8]) -> BatchAnswer {
    let mut answer = BatchAnswer {
        status,
        retry_after,
        ..BatchAnswer::default()
    };
    match status {
        207 => {
            if let Ok(partial) = serde_json::from_slice::<BatchPartial>(body) {
                answer.results = partial.results.into_iter().map(owned_result).collect();
            }
        }
        200..=299 => {
            if let Ok(queued) = serde_json::from_slice::<BatchQueued>(body) {
                answer.queued = queued
                    .messages
                    .into_iter()
                    .map(|m| BatchMessage {
                        message_id: m.message_id.into_owned().into(),
                        traceparent: m.traceparent.into_owned().into(),
                        duplicate: m.duplicate,
                    })
                    .collect();
            }
        }
        _ => {
            if let Ok(e) = serde_json::from_slice::<ErrorBody>(body) {
                answer.room = e.room;
                answer.errors = e.errors.map(|e| e.into_owned()).unwrap_or_default();
                answer.attribute = e.attribute.map(|a| a.into_owned());
                answer.limit_bytes = e.limit_bytes;
                answer.code = Some(e.code);
            }
        }
    }
    answer
}

fn owned_result(r: EntryResult<'_>) -> EntryResult<'static> {
    EntryResult {
        index: r.index,
        status: r.status.into_owned().into(),
        message_id: r.message_id.into_owned().into(),
        traceparent: r.traceparent.map(|t| t.into_owned().into()),
        code: r.code,
        message: r.message.map(|m| m.into_owned().into()),
        outcome: r.outcome.map(|o| o.into_owned().into()),
        duplicate: r.duplicate,
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
            HttpTransport::new(
                "http://x",
                Some(&Credential::Token("bad\ntoken".into())),
                Duration::from_secs(1)
            ),
            Err(TransportSetupError::Token)
        ));
        let t = HttpTransport::new(
            "http://h:1/",
            Some(&Credential::Token("s3cret".into())),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(t.base, "http://h:1");
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn send_bodies_are_read_through_the_wire_types() {
        let body = |code: Option<AnyCode>, message_id: Option<&str>, outcome_unknown| SendBody {
            code,
            message_id: message_id.map(str::to_owned),
            outcome_unknown,
        };
        let created = br#"{"status":"queued","queue":"q","message_id":"m-1","request_id":"r"}"#;
        assert_eq!(read_send_body(201, created), body(None, Some("m-1"), false));
        let timeout = br#"{"code":"send_timeout","message":"late","message_id":"m-2","outcome":"unknown","request_id":"r"}"#;
        assert_eq!(
            read_send_body(504, timeout),
            body(Some(ErrorCode::SendTimeout.into()), Some("m-2"), true)
        );
        let uncertain = br#"{"code":"send_failed","message":"reset","message_id":"m-3","outcome":"unknown","request_id":"r"}"#;
        assert_eq!(
            read_send_body(502, uncertain),
            body(Some(ErrorCode::SendFailed.into()), Some("m-3"), true)
        );
        let refused = br#"{"code":"send_failed","message":"no","request_id":"r"}"#;
        assert_eq!(
            read_send_body(502, refused),
            body(Some(ErrorCode::SendFailed.into()), None, false)
        );
        let newer = br#"{"code":"rate_limited","message":"slow down","request_id":"r"}"#;
        assert_eq!(
            read_send_body(429, newer),
            body(Some(AnyCode::Unknown("rate_limited".into())), None, false)
        );
        assert_eq!(
            read_send_body(502, b"<html>bad gateway</html>"),
            SendBody::default()
        );
    }

    #[test]
    fn only_a_503_draining_or_starting_is_a_deferral() {
        let answer = |status, code: ErrorCode| Answer {
            status,
            code: Some(code.into()),
            message_id: None,
            retry_after: Some(Duration::from_secs(7)),
            outcome_unknown: false,
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
    #[test]
    fn batch_bodies_are_read_through_the_wire_types() {
        let created = br#"{"status":"queued","queue":"q","request_id":"r","count":2,"messages":[{"message_id":"a","traceparent":"t-a"},{"message_id":"b","traceparent":"t-b","duplicate":true}]}"#;
        let a = read_batch_body(201, None, created);
        assert_eq!(
            a.queued
                .iter()
                .map(|m| m.message_id.as_ref())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(a.queued[1].duplicate);

        let partial = br#"{"status":"partial","queue":"q","request_id":"r","queued":1,"failed":1,"results":[{"index":0,"status":"queued","message_id":"a"},{"index":1,"status":"failed","message_id":"b","code":"send_timeout","message":"late","outcome":"unknown"}]}"#;
        let a = read_batch_body(207, Some(Duration::from_secs(2)), partial);
        assert_eq!(a.results.len(), 2);
        assert!(a.results[1].failed());
        assert_eq!(a.results[1].code, Some(ErrorCode::SendTimeout.into()));
        assert_eq!(a.results[1].outcome.as_deref(), Some("unknown"));
        assert_eq!(a.retry_after, Some(Duration::from_secs(2)));

        let full = br#"{"backlog":3,"code":"queue_full","limit":5,"message":"full","request_id":"r","retry_after_s":1,"room":2}"#;
        let a = read_batch_body(429, Some(Duration::from_secs(1)), full);
        assert_eq!(
            (a.code, a.room),
            (Some(ErrorCode::QueueFull.into()), Some(2))
        );

        let invalid = br#"{"code":"invalid_request","errors":[{"loc":["body","messages",3,"properties"],"msg":"bad"}],"message":"m","request_id":"r"}"#;
        let a = read_batch_body(400, None, invalid);
        assert_eq!(a.errors.len(), 1);
        assert_eq!(a.errors[0].loc[2], sendgate_wire::Loc::Index(3));

        let unsupported = br#"{"attribute":"scheduled_enqueue_time","backend":"rabbitmq","code":"unsupported_attribute","message":"m","request_id":"r"}"#;
        let a = read_batch_body(422, None, unsupported);
        assert_eq!(a.attribute.as_deref(), Some("scheduled_enqueue_time"));

        let too_large =
            br#"{"code":"payload_too_large","limit_bytes":1024,"message":"m","request_id":"r"}"#;
        assert_eq!(
            read_batch_body(413, None, too_large).limit_bytes,
            Some(1024)
        );

        // A proxy's page keeps the status only; a 207 without results reads as none named.
        let page = read_batch_body(502, None, b"<html>bad gateway</html>");
        assert_eq!((page.status, page.code), (502, None));
        assert!(read_batch_body(207, None, b"garbage").results.is_empty());
    }

    #[test]
    fn attributes_become_the_message_headers_and_control_characters_are_refused() {
        let mut attributes = MessageAttributes {
            session_id: Some("s-1".into()),
            partition_key: Some("s-1".into()),
            reply_to: Some("replies".into()),
            to: Some("there".into()),
            ..MessageAttributes::default()
        };
        attributes
            .properties
            .insert("note".into(), serde_json::json!("a\nb \u{e9}"));
        let headers = attribute_headers(&attributes).unwrap();
        let names: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                MESSAGE_SESSION_ID,
                MESSAGE_PARTITION_KEY,
                MESSAGE_REPLY_TO,
                MESSAGE_TO,
                MESSAGE_PROPERTIES
            ]
        );
        // The newline inside a property is escaped by JSON; the é goes as UTF-8.
        assert_eq!(
            headers[4].1.as_bytes(),
            "{\"note\":\"a\\nb \u{e9}\"}".as_bytes()
        );
        assert!(attribute_headers(&MessageAttributes::default())
            .unwrap()
            .is_empty());
        let bad = MessageAttributes {
            to: Some("a\rb".into()),
            ..MessageAttributes::default()
        };
        assert_eq!(attribute_headers(&bad), Err(HeaderError(MESSAGE_TO)));
    }
}
