//! Microsoft's Send Message form (learn.microsoft.com/rest/api/servicebus/send-message-to-queue),
//! for the one message whose every part it carries as the batch form would, plus its
//! content type.
//!
//! Why it exists beside the batch form: Message Headers and Properties maps a message's
//! `ContentType` to this form's `Content-Type` header and to nothing else; the batch form
//! documents no way to set it (and ignores broker properties it does not list), so a
//! consumer reads `content_type = None` for every batch entry.
//!
//! What this form cannot carry faithfully: application properties. Each is "placed in its
//! own HTTP header", and HTTP header names are case-insensitive (they travel lowercased),
//! while Service Bus property names are case-sensitive; and a header's value is text, the
//! page stating no type for it. So a message with application properties of the caller's
//! goes in the batch form, whose `UserProperties` keep both. The gateway's own trace
//! properties go as headers here: `traceparent` and `tracestate` are lowercase names by
//! the W3C's spelling, with text values; `Diagnostic-Id` reaches the broker in the case
//! HTTP gives it (docs/contract.md says so).
//!
//! The request: `POST https://{ns}/{queue}/messages`, `Content-Type` the message's,
//! `BrokerProperties` the same JSON object a batch entry holds, the trace headers, and
//! the body byte for byte.

use bytes::Bytes;

use super::batch;
use crate::backend::OutgoingMessage;

/// The content type every message has: the gateway takes JSON bodies only (contract §1).
pub const MESSAGE_CONTENT_TYPE: &str = "application/json";

/// The broker-properties header's name.
pub const BROKER_PROPERTIES: &str = "BrokerProperties";

/// One Send Message request's parts, ready for the HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingleSend {
    /// Header names and values, `Content-Type` and `BrokerProperties` first.
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
}

/// Whether `message` goes in this form: it has no application properties of the caller's.
pub fn fits(message: &OutgoingMessage) -> bool {
    message.attributes.properties.is_empty()
}

/// `message` as one Send Message request.
pub fn request(message: &OutgoingMessage) -> Result<SingleSend, serde_json::Error> {
    let broker = batch::broker_properties_json(message)?;
    let mut headers = vec![
        ("Content-Type", MESSAGE_CONTENT_TYPE.to_owned()),
        (BROKER_PROPERTIES, ascii_json(&broker)),
    ];
    headers.extend(message.trace_properties());
    Ok(SingleSend {
        headers,
        body: message.body.clone(),
    })
}

/// JSON text with every non-ASCII character as a `\u` escape (UTF-16, as JSON spells it):
/// the same JSON value, and a header value of ASCII only, which HTTP carries unchanged.
/// Outside strings JSON holds only ASCII, so escaping character by character is exact.
fn ascii_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Attributes, MessageId, QueueName, Raw, TraceContext};
    use serde_json::{json, Value};

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn message(attributes: Value) -> OutgoingMessage {
        let fields = attributes.as_object().unwrap().clone();
        let attributes = Attributes::parse(|f| fields.get(f.json_name()).map(Raw::Json)).unwrap();
        OutgoingMessage {
            attributes: attributes.into(),
            trace: TraceContext::from_request(Some(TRACEPARENT), Some("a=1")).for_message(),
            ..OutgoingMessage::new(
                QueueName::parse("q").unwrap(),
                MessageId::parse("m-1").unwrap(),
                None,
                Bytes::from_static(b"{ \"a\" : 1 }"),
            )
        }
    }

    #[test]
    fn only_a_message_without_application_properties_fits() {
        assert!(fits(&message(json!({"subject": "s", "time_to_live_s": 9}))));
        assert!(!fits(&message(json!({"properties": {"n": "v"}}))));
    }

    #[test]
    fn the_request_is_the_content_type_the_broker_properties_the_trace_and_the_body() {
        let m = message(json!({"subject": "caf\u{e9} \u{1F600}", "time_to_live_s": 90}));
        let request = request(&m).unwrap();
        let traceparent = m.trace.parent.to_string();
        let (names, values): (Vec<_>, Vec<_>) = request.headers.iter().cloned().unzip();
        assert_eq!(
            names,
            [
                "Content-Type",
                "BrokerProperties",
                "traceparent",
                "tracestate",
                "Diagnostic-Id"
            ]
        );
        assert_eq!(values[0], "application/json");
        assert!(values[1].is_ascii(), "{}", values[1]);
        assert!(
            values[1].contains(r"caf\u00e9 \ud83d\ude00"),
            "{}",
            values[1]
        );
        let broker: Value = serde_json::from_str(&values[1]).unwrap();
        assert_eq!(
            broker,
            json!({"MessageId": "m-1", "Label": "caf\u{e9} \u{1F600}", "TimeToLive": 90})
        );
        assert_eq!(
            values[2..],
            [traceparent.clone(), "a=1".into(), traceparent]
        );
        assert_eq!(&request.body[..], b"{ \"a\" : 1 }");
    }
}
