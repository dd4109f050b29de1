//! Microsoft's Send Message Batch form
//! (learn.microsoft.com/rest/api/servicebus/send-message-batch), which every batch and
//! every message with application properties takes (a single send being a batch of one),
//! and how a batch is split into as few of those calls as Service Bus allows.
//!
//! Why the batch form for a message with application properties: property names are
//! case-sensitive at Service Bus, HTTP header names are not (our client sends them
//! lowercased), and the single form's custom-property headers carry every value as text
//! whose type the page does not state. A batch entry's `UserProperties` object keeps both
//! the name's case and the value's JSON type. What it cannot carry is a content type: see
//! `single`.
//!
//! The documented form: `POST https://{ns}/{queue}/messages`, `Content-Type:
//! application/vnd.microsoft.servicebus.json` ("without parameters such as
//! charset=utf-8"), the body "a JSON array of messages. Each message contains a Body
//! string and can include BrokerProperties and UserProperties objects", with the
//! `IsBodyBase64` flag for a body given as base64. The broker property names and their
//! forms are Message Headers and Properties': `TimeToLive` "the number of seconds",
//! `DateTime` values "as defined by RFC2616 ... Sun, 06 Nov 1994 08:49:37 GMT".

use std::collections::HashMap;
use std::hash::Hash;

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use time::{Month, OffsetDateTime, Weekday};

use crate::backend::OutgoingMessage;
use crate::domain::PropertyValue;

/// The batch form's content type, exactly (no `charset`: the page says without parameters).
pub const CONTENT_TYPE: &str = "application/vnd.microsoft.servicebus.json";

/// One message as a Send Message Batch entry.
///
/// The body travels base64-encoded with `IsBodyBase64: true`. The page gives `Body` as a
/// string and this flag as the way to send it as base64 bytes; without the flag the body
/// would be a JSON string whose conversion to message bytes the documentation does not
/// state. With it, Service Bus decodes exactly our bytes: the body arrives byte for byte
/// (whitespace, key order, escapes, the caller's UTF-8), as the single form's raw body did.
/// The third more bytes on the wire are not counted against the batch limit: see
/// [`counted_len`].
#[derive(Serialize)]
struct Entry<'a> {
    #[serde(rename = "Body")]
    body: String,
    #[serde(rename = "IsBodyBase64")]
    is_body_base64: bool,
    #[serde(rename = "BrokerProperties")]
    broker: BrokerProperties<'a>,
    #[serde(rename = "UserProperties")]
    user: UserProperties<'a>,
}

/// The broker properties sendgate sets, by their documented names; an absent attribute
/// is left out (Service Bus then uses its default).
#[derive(Serialize)]
struct BrokerProperties<'a> {
    #[serde(rename = "MessageId")]
    message_id: &'a str,
    #[serde(rename = "CorrelationId", skip_serializing_if = "Option::is_none")]
    correlation_id: Option<&'a str>,
    /// The subject (`ServiceBusMessage.Subject` is `Label` on the wire).
    #[serde(rename = "Label", skip_serializing_if = "Option::is_none")]
    label: Option<&'a str>,
    #[serde(rename = "SessionId", skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    #[serde(rename = "PartitionKey", skip_serializing_if = "Option::is_none")]
    partition_key: Option<&'a str>,
    /// Whole seconds, a JSON number ("the number of seconds of the TimeSpan").
    #[serde(rename = "TimeToLive", skip_serializing_if = "Option::is_none")]
    time_to_live: Option<u64>,
    #[serde(
        rename = "ScheduledEnqueueTimeUtc",
        skip_serializing_if = "Option::is_none"
    )]
    scheduled_enqueue_time_utc: Option<String>,
    #[serde(rename = "ReplyTo", skip_serializing_if = "Option::is_none")]
    reply_to: Option<&'a str>,
    #[serde(rename = "To", skip_serializing_if = "Option::is_none")]
    to: Option<&'a str>,
}

/// The caller's application properties (names as given, values with their JSON types),
/// then the gateway's trace properties; the caller cannot use those names (the attribute
/// parser refuses them), so no key is written twice.
struct UserProperties<'a> {
    message: &'a OutgoingMessage,
    trace: Vec<(&'static str, String)>,
}

impl Serialize for UserProperties<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let properties = &self.message.attributes.properties;
        let mut map = serializer.serialize_map(Some(properties.len() + self.trace.len()))?;
        for (name, value) in properties.iter() {
            match value {
                PropertyValue::String(s) => map.serialize_entry(name, s)?,
                PropertyValue::Integer(n) => map.serialize_entry(name, n)?,
                // Finite by the parser: serde_json writes it as a JSON number (2.0 stays
                // `2.0`, read back as a floating-point value, not an integer).
                PropertyValue::Float(x) => map.serialize_entry(name, x)?,
                PropertyValue::Bool(b) => map.serialize_entry(name, b)?,
            }
        }
        for (name, value) in &self.trace {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// `message` as its JSON entry (the bytes that go between the batch's `[`, `,` and `]`).
pub fn entry(message: &OutgoingMessage) -> Result<Vec<u8>, serde_json::Error> {
    let entry = Entry {
        body: base64::engine::general_purpose::STANDARD.encode(&message.body),
        is_body_base64: true,
        broker: broker_properties(message),
        user: UserProperties {
            message,
            trace: message.trace_properties(),
        },
    };
    serde_json::to_vec(&entry)
}

/// `message`'s broker properties as the JSON object both forms carry (the single form in
/// its `BrokerProperties` header).
pub fn broker_properties_json(message: &OutgoingMessage) -> Result<String, serde_json::Error> {
    serde_json::to_string(&broker_properties(message))
}

fn broker_properties(message: &OutgoingMessage) -> BrokerProperties<'_> {
    let attributes = &message.attributes;
    BrokerProperties {
        message_id: message.message_id.as_str(),
        correlation_id: message.correlation_id.as_ref().map(|c| c.as_str()),
        label: attributes.subject.as_ref().map(|t| t.as_str()),
        session_id: attributes.session_id.as_ref().map(|t| t.as_str()),
        partition_key: attributes.partition_key.as_ref().map(|t| t.as_str()),
        time_to_live: attributes.time_to_live.map(|d| d.as_secs()),
        scheduled_enqueue_time_utc: attributes.scheduled_enqueue_time.map(http_date),
        reply_to: attributes.reply_to.as_ref().map(|t| t.as_str()),
        to: attributes.to.as_ref().map(|t| t.as_str()),
    }
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 1123's form of an HTTP date), in UTC. The form has
/// whole seconds: a time with a fraction is rounded up, so the message is never enqueued
/// before the time the caller asked for.
pub fn http_date(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    let at = match at.nanosecond() {
        0 => at,
        nanos => at
            .checked_add(time::Duration::nanoseconds(
                1_000_000_000 - i64::from(nanos),
            ))
            .unwrap_or(at),
    };
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        weekday(at.weekday()),
        at.day(),
        month(at.month()),
        at.year(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

fn weekday(day: Weekday) -> &'static str {
    match day {
        Weekday::Monday => "Mon",
        Weekday::Tuesday => "Tue",
        Weekday::Wednesday => "Wed",
        Weekday::Thursday => "Thu",
        Weekday::Friday => "Fri",
        Weekday::Saturday => "Sat",
        Weekday::Sunday => "Sun",
    }
}

fn month(month: Month) -> &'static str {
    match month {
        Month::January => "Jan",
        Month::February => "Feb",
        Month::March => "Mar",
        Month::April => "Apr",
        Month::May => "May",
        Month::June => "Jun",
        Month::July => "Jul",
        Month::August => "Aug",
        Month::September => "Sep",
        Month::October => "Oct",
        Month::November => "Nov",
        Month::December => "Dec",
    }
}

/// What one entry counts against `SENDGATE_SERVICEBUS_MAX_BATCH_BYTES`: its JSON with the
/// body at its decoded size. Service Bus limits the messages it stores, not the HTTP
/// request carrying them (its refusal names "the received message (... size:300000 bytes)
/// exceeds the limit (262144 bytes)"), and an `IsBodyBase64` body is stored decoded; so a
/// 200 KB body goes to a Standard namespace as it did in the single form, and counting the
/// base64 would refuse it here for a limit it is under.
pub fn counted_len(entry: &[u8], body_len: usize) -> usize {
    let encoded = body_len.div_ceil(3).saturating_mul(4);
    entry.len().saturating_sub(encoded).saturating_add(body_len)
}

/// The JSON body of one call: its entries as a JSON array.
pub fn body<'a>(entries: impl Iterator<Item = &'a [u8]> + Clone) -> Bytes {
    let mut out = BytesMut::with_capacity(call_len(entries.clone().map(<[u8]>::len)));
    out.put_u8(b'[');
    for (i, entry) in entries.enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(entry);
    }
    out.put_u8(b']');
    out.freeze()
}

/// The length of a call's body holding entries of these lengths: `[`, `]`, the commas.
fn call_len(entries: impl Iterator<Item = usize>) -> usize {
    let (count, sum) = entries.fold((0usize, 0usize), |(n, s), len| (n + 1, s + len));
    2 + sum + count.saturating_sub(1)
}

/// How a batch goes out: its calls, grouped by the key they share, and the messages too
/// large to go at all (lengths as [`counted_len`] counts them). Every index of the batch is in exactly one call or in `too_large`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// One group per key (first-seen order), its calls in the caller's order: a group's
    /// calls go one after another, so the queue gets its messages in that order.
    pub groups: Vec<Vec<Vec<usize>>>,
    /// A message whose entry alone makes a body over the limit.
    pub too_large: Vec<usize>,
}

impl Plan {
    pub fn calls(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }
}

/// The fewest calls for messages with these keys (the backend's: the queue and the ordering
/// key, the session id else the partition key:
/// "If the SessionId and PartitionKey properties are both set, they must be set to the
/// same value", and one Service Bus batch shares one) and entry lengths, each call's body
/// at most `limit` bytes.
///
/// Within a group the order is fixed, so filling each call before starting the next (in
/// order) is the fewest calls there can be: any split into fewer would need a call holding
/// more consecutive entries than fit.
pub fn plan<K: Eq + Hash + Copy>(keys: &[K], entry_lens: &[usize], limit: usize) -> Plan {
    let mut groups: Vec<Vec<Vec<usize>>> = Vec::new();
    // The body length of each group's last call so far.
    let mut open: Vec<usize> = Vec::new();
    let mut group_of: HashMap<K, usize> = HashMap::new();
    let mut too_large = Vec::new();
    for (index, (key, &len)) in keys.iter().zip(entry_lens).enumerate() {
        let alone = call_len(std::iter::once(len));
        if alone > limit {
            too_large.push(index);
            continue;
        }
        let group = *group_of.entry(*key).or_insert_with(|| {
            groups.push(Vec::new());
            open.push(0);
            groups.len() - 1
        });
        let calls = &mut groups[group];
        match calls.last_mut() {
            Some(call) if open[group] + 1 + len <= limit => {
                call.push(index);
                open[group] += 1 + len;
            }
            _ => {
                calls.push(vec![index]);
                open[group] = alone;
            }
        }
    }
    Plan { groups, too_large }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Attributes, MessageId, QueueName, Raw, TraceContext};
    use serde_json::{json, Value};

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn message(body: &[u8], attributes: Value) -> OutgoingMessage {
        let fields = attributes.as_object().unwrap().clone();
        let attributes = Attributes::parse(|f| fields.get(f.json_name()).map(Raw::Json)).unwrap();
        OutgoingMessage {
            attributes: attributes.into(),
            trace: TraceContext::from_request(Some(TRACEPARENT), Some("a=1")).for_message(),
            ..OutgoingMessage::new(
                QueueName::parse("q").unwrap(),
                MessageId::parse("m-1").unwrap(),
                None,
                Bytes::copy_from_slice(body),
            )
        }
    }

    fn json_of(entry: &[u8]) -> Value {
        serde_json::from_slice(entry).unwrap()
    }

    #[test]
    fn an_entry_carries_the_body_as_base64_and_every_attribute_by_its_documented_name() {
        let m = message(
            b"{ \"a\" : 1 }",
            json!({
                "subject": "s", "session_id": "k", "partition_key": "k", "time_to_live_s": 90,
                "scheduled_enqueue_time": "1994-11-06T09:49:37+01:00",
                "reply_to": "r", "to": "t", "properties": {"Name": "v", "n": -3, "x": 2.0, "b": false},
            }),
        );
        let entry = json_of(&entry(&m).unwrap());
        let traceparent = m.trace.parent.to_string();
        assert_eq!(
            entry,
            json!({
                "Body": "eyAiYSIgOiAxIH0=",
                "IsBodyBase64": true,
                "BrokerProperties": {
                    "MessageId": "m-1", "Label": "s", "SessionId": "k", "PartitionKey": "k",
                    "TimeToLive": 90, "ScheduledEnqueueTimeUtc": "Sun, 06 Nov 1994 08:49:37 GMT",
                    "ReplyTo": "r", "To": "t",
                },
                "UserProperties": {
                    "Name": "v", "n": -3, "x": 2.0, "b": false,
                    "traceparent": traceparent, "tracestate": "a=1", "Diagnostic-Id": traceparent,
                },
            })
        );
        assert!(entry["UserProperties"]["x"].is_f64());
        assert!(entry["UserProperties"]["n"].is_i64());
    }

    #[test]
    fn broker_properties_carry_message_and_correlation_ids_escaped_and_nothing_unset() {
        let mut m = message(b"{}", json!({}));
        let broker = |m: &OutgoingMessage| json_of(&entry(m).unwrap())["BrokerProperties"].clone();
        assert_eq!(broker(&m), json!({"MessageId": "m-1"}));
        m.correlation_id = Some(crate::domain::CorrelationId::parse("c \"q\"").unwrap());
        assert_eq!(
            broker(&m),
            json!({"MessageId": "m-1", "CorrelationId": "c \"q\""})
        );
        let text = String::from_utf8(entry(&m).unwrap()).unwrap();
        assert!(
            text.contains(r#""BrokerProperties":{"MessageId":"m-1","CorrelationId":"c \"q\""}"#),
            "{text}"
        );
    }

    #[test]
    fn any_bytes_survive_the_base64_body() {
        let bytes: Vec<u8> = (0..=255).collect();
        let entry = json_of(&entry(&message(&bytes, json!({}))).unwrap());
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(entry["Body"].as_str().unwrap())
            .unwrap();
        assert_eq!(decoded, bytes);
    }

    #[test]
    fn an_entry_counts_its_body_at_the_decoded_size() {
        for len in [0, 1, 2, 3, 4, 200, 200_000] {
            let body = vec![b'x'; len];
            let written = entry(&message(&body, json!({}))).unwrap();
            let base64 = json_of(&written)["Body"].as_str().unwrap().len();
            assert_eq!(
                counted_len(&written, len),
                written.len() - base64 + len,
                "{len}"
            );
        }
    }

    #[test]
    fn a_body_under_the_standard_limit_is_planned_though_its_base64_is_over_it() {
        let body = vec![b'x'; 200_000];
        let written = entry(&message(&body, json!({}))).unwrap();
        assert!(written.len() > 262_144, "{}", written.len());
        let counted = counted_len(&written, body.len());
        let plan = plan(&[()], &[counted], 262_144);
        assert_eq!(plan.groups, vec![vec![vec![0]]]);
        assert!(plan.too_large.is_empty());
        let plan = plan_of_one(262_144 - 1, 262_144);
        assert_eq!(
            plan.too_large,
            vec![0],
            "a body the limit's size cannot fit with its entry"
        );
    }

    fn plan_of_one(body_len: usize, limit: usize) -> Plan {
        let body = vec![b'y'; body_len];
        let written = entry(&message(&body, json!({}))).unwrap();
        plan(&[()], &[counted_len(&written, body_len)], limit)
    }

    #[test]
    fn http_dates_are_rfc_1123_in_gmt_rounded_up_to_the_second() {
        let at = |s: &str| {
            OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
        };
        assert_eq!(
            http_date(at("1994-11-06T08:49:37Z")),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(
            http_date(at("2027-01-09T23:59:59-05:00")),
            "Sun, 10 Jan 2027 04:59:59 GMT"
        );
        assert_eq!(
            http_date(at("2026-12-31T23:59:59.001Z")),
            "Fri, 01 Jan 2027 00:00:00 GMT",
            "never before the time asked for"
        );
        assert_eq!(
            http_date(at("2026-03-01T00:00:00.999999999+00:00")),
            "Sun, 01 Mar 2026 00:00:01 GMT"
        );
    }

    #[test]
    fn a_body_is_a_json_array_of_its_entries() {
        let entries: Vec<&[u8]> = vec![b"{\"a\":1}", b"{}"];
        let body = body(entries.iter().copied());
        assert_eq!(&body[..], b"[{\"a\":1},{}]");
        assert_eq!(body.len(), call_len([7, 2].into_iter()));
        assert_eq!(call_len(std::iter::once(5)), 7);
        assert_eq!(call_len(std::iter::empty()), 2);
    }

    fn sizes(plan: &Plan) -> Vec<Vec<usize>> {
        plan.groups
            .iter()
            .map(|g| g.iter().map(Vec::len).collect())
            .collect()
    }

    #[test]
    fn a_plan_fills_each_call_up_to_the_limit_exactly() {
        // Entries of 10: a call of n holds 2 + 10n + (n - 1) bytes; three take 34.
        let keys: [Option<&str>; 7] = [None; 7];
        let lens = [10; 7];
        assert_eq!(sizes(&plan(&keys, &lens, 34)), [[3, 3, 1]]);
        assert_eq!(sizes(&plan(&keys, &lens, 33)), [[2, 2, 2, 1]]);
        assert_eq!(sizes(&plan(&keys, &lens, 12)), [[1; 7]]);
        assert_eq!(plan(&keys, &lens, 11).too_large, (0..7).collect::<Vec<_>>());
        assert_eq!(plan(&keys, &lens, 1_000).calls(), 1);
        // In order, not re-packed: a small entry after a large one starts no earlier call.
        let p = plan::<Option<&str>>(&[None; 3], &[20, 20, 5], 45);
        assert_eq!(p.groups, [vec![vec![0, 1], vec![2]]]);
    }

    #[test]
    fn a_plan_keeps_one_key_per_call_and_the_callers_order_in_each() {
        let keys = [None, Some("A"), None, Some("B"), Some("A"), None, Some("A")];
        let p = plan(&keys, &[1; 7], 1_000);
        assert_eq!(
            p.groups,
            [vec![vec![0, 2, 5]], vec![vec![1, 4, 6]], vec![vec![3]]]
        );
        let p = plan(&keys, &[10, 10, 10, 10, 10, 10, 10], 23);
        assert_eq!(
            p.groups,
            [
                vec![vec![0, 2], vec![5]],
                vec![vec![1, 4], vec![6]],
                vec![vec![3]]
            ]
        );
    }

    #[test]
    fn a_message_too_large_alone_is_set_apart_and_the_rest_planned() {
        let p = plan(&[None, None, Some("A"), None], &[5, 50, 60, 5], 20);
        assert_eq!(p.too_large, [1, 2]);
        assert_eq!(p.groups, [vec![vec![0, 3]]]);
        assert!(plan::<Option<&str>>(&[], &[], 20).groups.is_empty());
    }
}
