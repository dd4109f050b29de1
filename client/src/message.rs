//! One message as the caller gives it ([`Message`]), and the checks of its ids that both
//! routes share.

use bytes::Bytes;
use reqwest::header::HeaderValue;
use sendgate_wire::{BatchEntry, MessageAttributes, MessageId};

use crate::transport;
#[cfg(doc)]
use crate::SendOutcome;

/// One message in a batch entry's form — its body, its ids and its attributes — and the
/// trace it belongs to. Build it with [`Message::new`] and the setters:
///
/// ```
/// use sendgate_client::{Message, MessageAttributes};
///
/// let message = Message::new(r#"{"prompt":"hi"}"#)
///     .idempotency_key("order-42")
///     .correlation_id("session-7")
///     .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
///     .attributes(MessageAttributes {
///         subject: Some("prompt".into()),
///         time_to_live_s: Some(600),
///         ..MessageAttributes::default()
///     });
/// ```
///
/// The gateway checks the attributes (contract section 1.2): a bad one is a `400` naming
/// it, reported as [`SendOutcome::Refused`]. Only what cannot be sent at all (an id that
/// is not 1–128 printable ASCII, a control character in a header, a batch entry whose body
/// is not JSON) is refused here, as [`SendOutcome::Invalid`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// A JSON value (the gateway validates it; a batch entry's is checked here, as one bad
    /// body would make the whole request malformed).
    pub body: Bytes,
    /// The same on every attempt; a UUID made here when `None`.
    pub idempotency_key: Option<String>,
    /// Carried to the message (`X-Correlation-Id` on a single send).
    pub correlation_id: Option<String>,
    /// Sent as the `Message-*` headers on a single send, as the entry's fields in a batch.
    pub attributes: MessageAttributes,
    /// W3C `traceparent`: the message joins this trace with a parent id of its own. In a
    /// batch, entries with different traces go in different requests.
    pub traceparent: Option<String>,
}

impl Message {
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }

    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    pub fn attributes(mut self, attributes: MessageAttributes) -> Self {
        self.attributes = attributes;
        self
    }

    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }
}

impl From<BatchEntry> for Message {
    /// A batch entry as a producer wrote it (`sendgate send --envelope` reads lines so).
    fn from(entry: BatchEntry) -> Self {
        let body: Box<str> = entry.body.into();
        Self {
            body: Bytes::from(String::from(body)),
            idempotency_key: entry.idempotency_key,
            correlation_id: entry.correlation_id,
            attributes: entry.attributes,
            traceparent: None,
        }
    }
}

/// The message's `Idempotency-Key`, or a UUID made here when it has none.
pub(crate) fn key_of(given: Option<&str>) -> Result<MessageId, String> {
    match given.map(MessageId::parse) {
        None => Ok(MessageId::generate()),
        Some(Ok(k)) => Ok(k),
        Some(Err(e)) => Err(format!("Idempotency-Key: {e}")),
    }
}

/// The message's `traceparent` as a header value, if it has one.
pub(crate) fn traceparent_of(given: Option<&str>) -> Result<Option<HeaderValue>, String> {
    given
        .map(|t| transport::header_value(transport::TRACEPARENT, t))
        .transpose()
        .map_err(|e| e.to_string())
}
