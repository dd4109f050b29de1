//! A message as AMQP 0-9-1 carries it: the basic properties its ids, attributes and trace
//! context map to, and whether they fit at all.
//!
//! | attribute | AMQP |
//! |---|---|
//! | `properties` | the `headers` table: String → longstr, Integer → long-long-int, Float → double, Bool → boolean |
//! | trace context | headers `traceparent`, `tracestate` (when given), `Diagnostic-Id` (longstr) |
//! | `subject` | the basic property `type` |
//! | `reply_to` | `reply_to` |
//! | `time_to_live_s` | the per-message `expiration`, in milliseconds (a decimal string) |
//! | `session_id`, `partition_key`, `to` | headers `sendgate.session_id`, `sendgate.partition_key`, `sendgate.to` (longstr) |
//! | `scheduled_enqueue_time` | none: RabbitMQ has no delayed delivery without a plugin, so refused |
//!
//! Two limits of the protocol are the backend's own, checked before a send
//! ([`unsupported`]) rather than discovered on the wire: `type`, `reply_to` and the
//! headers' names are short strings (at most 255 bytes; lapin panics on a longer one), and
//! the whole content header travels in ONE frame of at most the connection's `frame_max`
//! (a larger one makes the broker close the connection, failing every send on it).

use std::collections::BTreeMap;

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use crate::backend::{OutgoingMessage, DIAGNOSTIC_ID, TRACEPARENT, TRACESTATE};
use crate::domain::{Attributes, Field, PropertyValue, TraceState};

/// The headers the gateway writes for the attributes AMQP has no property for (the
/// caller cannot set `sendgate.*` names: domain::attributes refuses them).
pub const SESSION_ID_HEADER: &str = "sendgate.session_id";
pub const PARTITION_KEY_HEADER: &str = "sendgate.partition_key";
pub const TO_HEADER: &str = "sendgate.to";

const CONTENT_TYPE: &str = "application/json";
/// The most bytes an AMQP short string holds.
const MAX_SHORT_STRING: usize = 255;
/// The longest message id or correlation id (sendgate-wire's ids.rs).
const MAX_ID_BYTES: usize = 128;
/// A `traceparent` as the gateway writes it (version 00).
const TRACEPARENT_BYTES: usize = 55;
/// A frame's own bytes around its payload: type, channel, size, and the end octet.
const FRAME_OVERHEAD: usize = 8;
/// The content header's payload before the properties: class id, weight, body size, and
/// the property flags (one word: basic has 14 properties).
const HEADER_PREAMBLE: usize = 2 + 2 + 8 + 2;

/// Why a message's properties cannot be sent as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    #[error("{0} is longer than an AMQP short string holds (255 bytes)")]
    ShortString(Field),
    #[error(
        "the message's AMQP content header ({bytes} bytes) is larger than the connection's \
         frame_max ({frame_max})"
    )]
    Header { bytes: usize, frame_max: usize },
}

/// The properties of `message`'s publish: persistent JSON with the producer's ids, and its
/// attributes and trace context as the module's table says.
pub fn properties_of(message: &OutgoingMessage) -> Result<BasicProperties, Unfit> {
    let attributes = &*message.attributes;
    // The trace context is on every message, so the table is always built: once, from a
    // vector sized for all its entries (a BTreeMap collected from it is built in bulk).
    let mut headers = Vec::with_capacity(3 + attributes.properties.len() + 3);
    for (name, value) in message.trace_properties() {
        headers.push((ShortString::from(name), AMQPValue::LongString(value.into())));
    }
    for (name, value) in attributes.properties.iter() {
        let name = ShortString::try_new(name).map_err(|_| Unfit::ShortString(Field::Properties))?;
        headers.push((name, amqp_value(value)));
    }
    for (name, text) in [
        (SESSION_ID_HEADER, &attributes.session_id),
        (PARTITION_KEY_HEADER, &attributes.partition_key),
        (TO_HEADER, &attributes.to),
    ] {
        if let Some(text) = text {
            headers.push((
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(text.as_str())),
            ));
        }
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(CONTENT_TYPE.into())
        .with_message_id(message.message_id.as_str().into())
        .with_headers(FieldTable::from(
            headers.into_iter().collect::<BTreeMap<_, _>>(),
        ));
    if let Some(c) = &message.correlation_id {
        properties = properties.with_correlation_id(c.as_str().into());
    }
    if let Some(subject) = &attributes.subject {
        properties = properties.with_type(short_string(subject.as_str(), Field::Subject)?);
    }
    if let Some(reply_to) = &attributes.reply_to {
        properties = properties.with_reply_to(short_string(reply_to.as_str(), Field::ReplyTo)?);
    }
    if let Some(ttl) = attributes.time_to_live {
        properties = properties.with_expiration(ttl.as_millis().to_string().into());
    }
    Ok(properties)
}

fn short_string(text: &str, field: Field) -> Result<ShortString, Unfit> {
    ShortString::try_new(text).map_err(|_| Unfit::ShortString(field))
}

fn amqp_value(value: &PropertyValue) -> AMQPValue {
    match value {
        PropertyValue::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        PropertyValue::Integer(n) => AMQPValue::LongLongInt(*n),
        PropertyValue::Float(x) => AMQPValue::Double(*x),
        PropertyValue::Bool(b) => AMQPValue::Boolean(*b),
    }
}

/// The first of `attributes` (in [`Field::ALL`]'s order) that RabbitMQ cannot carry on a
/// connection of `frame_max`: a schedule, a short string too long, or a content header
/// that cannot fit one frame whatever the message's ids and trace context.
pub fn unsupported(attributes: &Attributes, frame_max: usize) -> Option<Field> {
    let too_long = |text: &Option<crate::domain::attributes::Text>| {
        text.as_ref()
            .is_some_and(|t| t.as_str().len() > MAX_SHORT_STRING)
    };
    // The most the ids and the trace context can weigh: the check does not depend on them,
    // so the same attributes get the same answer on every send.
    let worst =
        2 * (1 + MAX_ID_BYTES) + trace_entries(TRACEPARENT_BYTES, Some(TraceState::MAX_CHARS));
    let header = frame_bytes(attributes, worst);
    let fits = |bytes: usize| frame_max == 0 || bytes <= frame_max;
    Field::ALL.into_iter().find(|field| match field {
        Field::Subject => too_long(&attributes.subject),
        Field::ScheduledEnqueueTime => attributes.scheduled_enqueue_time.is_some(),
        Field::ReplyTo => too_long(&attributes.reply_to),
        // Only `to` and the properties can grow the header past the smallest frame_max the
        // protocol allows (4096): name whichever of them it is that does not fit.
        Field::To => attributes.to.is_some() && !fits(header - properties_bytes(attributes)),
        Field::Properties => {
            attributes
                .properties
                .iter()
                .any(|(name, _)| name.len() > MAX_SHORT_STRING)
                || !fits(header)
        }
        Field::SessionId | Field::PartitionKey | Field::TimeToLive => false,
    })
}

/// The content header frame `message` is sent in, checked against the connection's
/// negotiated `frame_max` (0: no limit): the broker may have lowered the one asked for.
pub fn check_frame(message: &OutgoingMessage, frame_max: usize) -> Result<(), Unfit> {
    let bytes = message_frame_bytes(message);
    if frame_max != 0 && bytes > frame_max {
        return Err(Unfit::Header { bytes, frame_max });
    }
    Ok(())
}

/// The content header frame of `message`, exactly.
fn message_frame_bytes(message: &OutgoingMessage) -> usize {
    let ids = 1
        + message.message_id.as_str().len()
        + message
            .correlation_id
            .as_ref()
            .map_or(0, |c| 1 + c.as_str().len());
    let trace = trace_entries(
        TRACEPARENT_BYTES,
        message.trace.state.as_ref().map(|s| s.as_str().len()),
    );
    frame_bytes(&message.attributes, ids + trace)
}

/// The whole content header frame of a message with `attributes`, given what its ids and
/// trace entries weigh (`rest`): the arithmetic of AMQP's encoding, pinned against the
/// encoder itself by the tests.
fn frame_bytes(attributes: &Attributes, rest: usize) -> usize {
    let short = |s: &str| 1 + s.len();
    let optional =
        |t: &Option<crate::domain::attributes::Text>| t.as_ref().map_or(0, |t| short(t.as_str()));
    let expiration = attributes.time_to_live.map_or(0, |ttl| {
        let ms = ttl.as_millis();
        1 + if ms == 0 { 1 } else { ms.ilog10() as usize + 1 }
    });
    FRAME_OVERHEAD
        + HEADER_PREAMBLE
        + short(CONTENT_TYPE)
        + 1 // delivery mode
        + 4 // the headers table's length
        + optional(&attributes.subject)
        + optional(&attributes.reply_to)
        + expiration
        + properties_bytes(attributes)
        + [
            (SESSION_ID_HEADER, &attributes.session_id),
            (PARTITION_KEY_HEADER, &attributes.partition_key),
            (TO_HEADER, &attributes.to),
        ]
        .iter()
        .map(|(name, text)| text.as_ref().map_or(0, |t| entry(name, 4 + t.as_str().len())))
        .sum::<usize>()
        + rest
}

/// The caller's properties in the headers table.
fn properties_bytes(attributes: &Attributes) -> usize {
    attributes
        .properties
        .iter()
        .map(|(name, value)| {
            entry(
                name,
                match value {
                    PropertyValue::String(s) => 4 + s.len(),
                    PropertyValue::Integer(_) | PropertyValue::Float(_) => 8,
                    PropertyValue::Bool(_) => 1,
                },
            )
        })
        .sum()
}

/// The trace context's entries: `traceparent`, `tracestate` (when given), `Diagnostic-Id`.
fn trace_entries(traceparent: usize, tracestate: Option<usize>) -> usize {
    entry(TRACEPARENT, 4 + traceparent)
        + tracestate.map_or(0, |s| entry(TRACESTATE, 4 + s))
        + entry(DIAGNOSTIC_ID, 4 + traceparent)
}

/// One headers table entry: its name (a short string), the type octet, the value.
fn entry(name: &str, value: usize) -> usize {
    1 + name.len() + 1 + value
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use serde_json::{json, Value};

    use super::*;
    use crate::domain::{CorrelationId, MessageId, QueueName, Raw, TraceContext};

    const TRACEPARENT_IN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn attributes(entry: Value) -> Attributes {
        let map = entry.as_object().unwrap().clone();
        Attributes::parse(|f| map.get(f.json_name()).map(Raw::Json)).unwrap()
    }

    fn message(
        attributes: Attributes,
        correlation: Option<&str>,
        tracestate: Option<&str>,
    ) -> OutgoingMessage {
        let mut m = OutgoingMessage::new(
            QueueName::parse("q").unwrap(),
            MessageId::parse("id-1").unwrap(),
            correlation.map(|c| CorrelationId::parse(c).unwrap()),
            Bytes::from_static(b"{}"),
        );
        m.attributes = Arc::new(attributes);
        m.trace = TraceContext::from_request(Some(TRACEPARENT_IN), tracestate).for_message();
        m
    }

    fn every_attribute() -> Attributes {
        attributes(json!({
            "subject": "order.created",
            "session_id": "customer-7",
            "partition_key": "customer-7",
            "time_to_live_s": 90,
            "reply_to": "replies",
            "to": "billing-\u{e9}",
            "properties": {"priority": "high", "attempt": -3, "ratio": 0.5, "urgent": true},
        }))
    }

    fn header<'a>(properties: &'a BasicProperties, name: &str) -> Option<&'a AMQPValue> {
        properties.headers().as_ref().unwrap().inner().get(name)
    }

    fn long_string(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    /// What lapin writes for the content header of a publish with `properties`.
    fn encoded_frame_bytes(properties: &BasicProperties) -> usize {
        let written =
            lapin::protocol::basic::gen_properties::<Vec<u8>>(properties)(Vec::new().into())
                .unwrap();
        let (buffer, _) = written.into_inner();
        FRAME_OVERHEAD + HEADER_PREAMBLE - 2 + buffer.len()
    }

    #[test]
    fn every_attribute_is_carried_as_the_table_says() {
        let m = message(every_attribute(), Some("corr-1"), Some("congo=t61rcWkgMzE"));
        let p = properties_of(&m).unwrap();
        assert_eq!(
            p.kind().as_ref().map(ShortString::as_str),
            Some("order.created")
        );
        assert_eq!(
            p.reply_to().as_ref().map(ShortString::as_str),
            Some("replies")
        );
        assert_eq!(
            p.expiration().as_ref().map(ShortString::as_str),
            Some("90000")
        );
        assert_eq!(
            p.message_id().as_ref().map(ShortString::as_str),
            Some("id-1")
        );
        assert_eq!(
            p.correlation_id().as_ref().map(ShortString::as_str),
            Some("corr-1")
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(header(&p, "priority"), Some(&long_string("high")));
        assert_eq!(header(&p, "attempt"), Some(&AMQPValue::LongLongInt(-3)));
        assert_eq!(header(&p, "ratio"), Some(&AMQPValue::Double(0.5)));
        assert_eq!(header(&p, "urgent"), Some(&AMQPValue::Boolean(true)));
        assert_eq!(
            header(&p, SESSION_ID_HEADER),
            Some(&long_string("customer-7"))
        );
        assert_eq!(
            header(&p, PARTITION_KEY_HEADER),
            Some(&long_string("customer-7"))
        );
        assert_eq!(header(&p, TO_HEADER), Some(&long_string("billing-\u{e9}")));
        let traceparent = m.trace.parent.to_string();
        assert_eq!(header(&p, "traceparent"), Some(&long_string(&traceparent)));
        assert_eq!(
            header(&p, "Diagnostic-Id"),
            Some(&long_string(&traceparent))
        );
        assert_eq!(
            header(&p, "tracestate"),
            Some(&long_string("congo=t61rcWkgMzE"))
        );
        assert_eq!(
            p.headers().as_ref().unwrap().inner().len(),
            10,
            "nothing else: {p:?}"
        );
    }

    #[test]
    fn a_message_without_attributes_carries_its_trace_context_and_nothing_else() {
        let m = message(Attributes::default(), None, None);
        let p = properties_of(&m).unwrap();
        let names: Vec<&str> = p
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .keys()
            .map(ShortString::as_str)
            .collect();
        assert_eq!(names, ["Diagnostic-Id", "traceparent"]);
        assert_eq!(*p.kind(), None);
        assert_eq!(*p.reply_to(), None);
        assert_eq!(*p.expiration(), None);
        assert_eq!(*p.correlation_id(), None);
    }

    #[test]
    fn the_frame_arithmetic_is_the_encoders() {
        let big = "x".repeat(3000);
        let cases = [
            message(Attributes::default(), None, None),
            message(Attributes::default(), Some("c"), Some("a=b")),
            message(
                every_attribute(),
                Some("corr-x"),
                Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
            ),
            message(
                attributes(
                    json!({"time_to_live_s": 4_294_967, "subject": "\u{e9}".repeat(127),
                    "properties": {"\u{e9}t\u{e9}": big, "n": 1, "b": false, "f": 1e300}}),
                ),
                Some(&"c".repeat(128)),
                None,
            ),
            message(attributes(json!({"time_to_live_s": 1})), None, None),
        ];
        for m in &cases {
            let p = properties_of(m).unwrap();
            assert_eq!(message_frame_bytes(m), encoded_frame_bytes(&p), "{m:?}");
        }
    }

    #[test]
    fn a_schedule_is_refused_and_everything_else_is_carried() {
        let mut all = every_attribute();
        assert_eq!(unsupported(&all, 16_384), None);
        all.scheduled_enqueue_time = Some(time::OffsetDateTime::UNIX_EPOCH);
        assert_eq!(unsupported(&all, 16_384), Some(Field::ScheduledEnqueueTime));
        assert_eq!(unsupported(&Attributes::default(), 4096), None);
    }

    #[test]
    fn a_short_string_over_255_bytes_is_refused_not_cut_nor_a_panic() {
        // 128 characters of two bytes each: valid for the gateway, too long for AMQP.
        let long = "\u{e9}".repeat(128);
        let fits = "\u{e9}".repeat(127) + "x";
        for (field, name) in [(Field::Subject, "subject"), (Field::ReplyTo, "reply_to")] {
            let refused = attributes(json!({ name: long }));
            assert_eq!(unsupported(&refused, 16_384), Some(field));
            let unfit = properties_of(&message(refused, None, None)).unwrap_err();
            assert_eq!(unfit, Unfit::ShortString(field));
            // The failure names the field as the batch entry spells it.
            assert_eq!(
                unfit.to_string(),
                format!("{name} is longer than an AMQP short string holds (255 bytes)")
            );
            let carried = attributes(json!({ name: fits }));
            assert_eq!(unsupported(&carried, 16_384), None);
            assert!(properties_of(&message(carried, None, None)).is_ok());
        }
        let refused = attributes(json!({"properties": { long.clone(): 1 }}));
        assert_eq!(unsupported(&refused, 16_384), Some(Field::Properties));
        assert_eq!(
            properties_of(&message(refused, None, None)).unwrap_err(),
            Unfit::ShortString(Field::Properties)
        );
        let carried = attributes(json!({"properties": { fits: 1 }}));
        assert_eq!(unsupported(&carried, 16_384), None);
    }

    /// Properties of one string whose value makes the worst case's frame exactly `bytes`.
    fn properties_weighing(frame: usize) -> Attributes {
        let base = attributes(json!({"properties": {"p": ""}}));
        let worst =
            2 * (1 + MAX_ID_BYTES) + trace_entries(TRACEPARENT_BYTES, Some(TraceState::MAX_CHARS));
        let value = "v".repeat(frame - frame_bytes(&base, worst));
        attributes(json!({"properties": {"p": value}}))
    }

    #[test]
    fn properties_are_refused_when_the_header_cannot_fit_one_frame_whatever_the_ids() {
        let at_limit = properties_weighing(16_384);
        assert_eq!(unsupported(&at_limit, 16_384), None);
        assert_eq!(
            unsupported(&properties_weighing(16_385), 16_384),
            Some(Field::Properties)
        );
        assert_eq!(
            unsupported(&properties_weighing(16_385), 0),
            None,
            "0: no limit"
        );
        // The worst case is real: the longest ids and tracestate make the frame exactly
        // frame_max, which the send-time check (the negotiated frame_max) lets through.
        // Two members (a value holds at most 256 characters), 512 characters in all.
        let state = format!("a={},b={}", "v".repeat(254), "v".repeat(253));
        let mut worst = message(at_limit, Some(&"c".repeat(128)), Some(&state));
        worst.message_id = MessageId::parse(&"m".repeat(128)).unwrap();
        assert_eq!(
            worst.trace.state.as_ref().unwrap().as_str().len(),
            TraceState::MAX_CHARS
        );
        assert_eq!(encoded_frame_bytes(&properties_of(&worst).unwrap()), 16_384);
        assert_eq!(check_frame(&worst, 16_384), Ok(()));
        assert_eq!(
            check_frame(&worst, 16_383),
            Err(Unfit::Header {
                bytes: 16_384,
                frame_max: 16_383
            })
        );
        assert!(MessageId::parse(&"m".repeat(MAX_ID_BYTES + 1)).is_err());
        assert!(CorrelationId::parse(&"c".repeat(MAX_ID_BYTES + 1)).is_err());
    }

    #[test]
    fn a_to_too_long_for_the_smallest_frame_is_named_rather_than_the_properties() {
        let to = "t".repeat(1024);
        let big = attributes(json!({"to": to, "properties": {"p": 1}}));
        assert_eq!(unsupported(&big, 16_384), None);
        // Four-byte characters: 4 KiB of `to`, more than AMQP's smallest frame holds.
        let huge = attributes(json!({"to": "\u{1F600}".repeat(1024), "properties": {"p": 1}}));
        assert_eq!(unsupported(&huge, 4096), Some(Field::To));
        assert_eq!(unsupported(&huge, 16_384), None);
    }

    #[test]
    fn the_expiration_is_the_ttl_in_milliseconds() {
        for (seconds, expected) in [(1, "1000"), (4_294_967, "4294967000")] {
            let m = message(attributes(json!({"time_to_live_s": seconds})), None, None);
            let p = properties_of(&m).unwrap();
            assert_eq!(
                p.expiration().as_ref().map(ShortString::as_str),
                Some(expected)
            );
            assert_eq!(
                m.attributes.time_to_live,
                Some(Duration::from_secs(seconds))
            );
        }
    }
}
