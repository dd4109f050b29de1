//! A message's attributes besides its body and ids (contract section 1, "Message attributes"): parsed once, from
//! a single send's `Message-*` headers or from a batch entry's fields, into [`Attributes`],
//! whose every value is known to be within the limits every backend shares.
//!
//! The two forms share one parser per attribute ([`Raw`] is where a value came from), so a
//! header and a batch field cannot drift apart.

use std::fmt;
use std::time::Duration;

use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};

/// Service Bus's limit on `SessionId` and `PartitionKey` (characters).
pub const MAX_KEY_CHARS: usize = 128;
/// The limit on `subject`, `reply_to` and `to` (characters): each travels in a broker
/// header, which Service Bus caps at 64 KiB in all.
pub const MAX_TEXT_CHARS: usize = 1024;
/// The limit on an application property's name (characters).
pub const MAX_PROPERTY_NAME_CHARS: usize = 256;
/// Service Bus's limit on one application property's value (a string's UTF-8 bytes).
pub const MAX_PROPERTY_VALUE_BYTES: usize = 32 * 1024;
/// Service Bus's limit on all application properties (names and values, UTF-8 bytes).
pub const MAX_PROPERTIES_BYTES: usize = 64 * 1024;
/// The longest time to live: 2³² − 1 ms, the most RabbitMQ's per-message `expiration` holds.
pub const MAX_TIME_TO_LIVE_S: u64 = 4_294_967;

/// Property names the gateway writes itself (compared without case: consumers often
/// look them up without).
pub const RESERVED_NAMES: [&str; 3] = [
    super::trace::TRACEPARENT,
    super::trace::TRACESTATE,
    "diagnostic-id",
];
/// And every name under this prefix (without case).
pub const RESERVED_PREFIX: &str = "sendgate.";

/// The attributes, each with its batch field's and its header's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    Subject,
    SessionId,
    PartitionKey,
    TimeToLive,
    ScheduledEnqueueTime,
    ReplyTo,
    To,
    Properties,
}

impl Field {
    pub const ALL: [Field; 8] = [
        Field::Subject,
        Field::SessionId,
        Field::PartitionKey,
        Field::TimeToLive,
        Field::ScheduledEnqueueTime,
        Field::ReplyTo,
        Field::To,
        Field::Properties,
    ];

    /// The batch entry's field (and `queue receive`'s).
    pub fn json_name(self) -> &'static str {
        match self {
            Field::Subject => "subject",
            Field::SessionId => "session_id",
            Field::PartitionKey => "partition_key",
            Field::TimeToLive => "time_to_live_s",
            Field::ScheduledEnqueueTime => "scheduled_enqueue_time",
            Field::ReplyTo => "reply_to",
            Field::To => "to",
            Field::Properties => "properties",
        }
    }

    /// The single send's header, as the contract spells it.
    pub fn header_name(self) -> &'static str {
        match self {
            Field::Subject => "Message-Subject",
            Field::SessionId => "Message-Session-Id",
            Field::PartitionKey => "Message-Partition-Key",
            Field::TimeToLive => "Message-Time-To-Live",
            Field::ScheduledEnqueueTime => "Message-Scheduled-Enqueue-Time",
            Field::ReplyTo => "Message-Reply-To",
            Field::To => "Message-To",
            Field::Properties => "Message-Properties",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.json_name())
    }
}

/// One bad attribute: which, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributeError {
    pub field: Field,
    pub message: String,
}

impl AttributeError {
    fn new(field: Field, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

/// Where one attribute's value came from.
#[derive(Debug, Clone, Copy)]
pub enum Raw<'a> {
    /// A header's value (its bytes, which must be UTF-8).
    Header(&'a [u8]),
    /// A batch entry's field, as a value.
    Json(&'a Value),
    /// A batch entry's field as its JSON text: the properties come so, since a name given
    /// twice can only be seen in the text (a parsed object has kept one of its values).
    JsonText(&'a str),
}

/// Text of 1 to `max` characters, none of them a control character.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Text(String);

impl Text {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn parse(raw: &str, max: usize) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if raw.chars().count() > max {
            return Err(format!("must be at most {max} characters"));
        }
        if raw.chars().any(char::is_control) {
            return Err("must not contain control characters".into());
        }
        Ok(Self(raw.to_owned()))
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An application property's value: what Service Bus and AMQP both carry with its type.
#[derive(Debug, Clone, PartialEq)]
pub enum PropertyValue {
    String(String),
    /// A JSON number without fraction or exponent that fits 64 bits.
    Integer(i64),
    /// Any other (finite) JSON number.
    Float(f64),
    Bool(bool),
}

impl PropertyValue {
    /// The value as JSON, as a batch entry carries it.
    pub fn to_json(&self) -> Value {
        match self {
            PropertyValue::String(s) => Value::String(s.clone()),
            PropertyValue::Integer(n) => Value::from(*n),
            PropertyValue::Float(x) => Value::from(*x),
            PropertyValue::Bool(b) => Value::Bool(*b),
        }
    }

    /// What it weighs against [`MAX_PROPERTIES_BYTES`]: a string's bytes, or its JSON text.
    fn weight(&self) -> usize {
        match self {
            PropertyValue::String(s) => s.len(),
            other => other.to_json().to_string().len(),
        }
    }
}

/// The caller's application properties, by name (case-sensitive), in name order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties(Vec<(String, PropertyValue)>);

impl Properties {
    pub fn iter(&self) -> impl Iterator<Item = (&str, &PropertyValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `name` is one the gateway writes itself (`traceparent`, `tracestate`,
    /// `Diagnostic-Id`, `sendgate.*`, in any case).
    pub fn is_reserved(name: &str) -> bool {
        let lower = name.to_ascii_lowercase();
        RESERVED_NAMES.contains(&lower.as_str()) || lower.starts_with(RESERVED_PREFIX)
    }

    /// A JSON object's text (a header's, or a batch entry's field), every name once.
    fn parse_text(text: &[u8]) -> Result<Self, String> {
        let object: UniqueNames = serde_json::from_slice(text).map_err(|e| {
            if e.is_data() {
                e.to_string()
            } else {
                format!("must be a JSON object: {e}")
            }
        })?;
        Self::parse(object.0.iter().map(|(name, value)| (name, value)))
    }

    fn parse<'v>(
        object: impl IntoIterator<Item = (&'v String, &'v Value)>,
    ) -> Result<Self, String> {
        let mut total = 0usize;
        let mut out = Vec::new();
        for (name, value) in object {
            if name.is_empty() || name.chars().count() > MAX_PROPERTY_NAME_CHARS {
                return Err(format!(
                    "a property name must be 1 to {MAX_PROPERTY_NAME_CHARS} characters"
                ));
            }
            if name.chars().any(char::is_control) {
                return Err(format!(
                    "property {name:?}: a name must not contain control characters"
                ));
            }
            if Self::is_reserved(name) {
                return Err(format!(
                    "property {name:?} is set by the gateway (traceparent, tracestate, \
                     Diagnostic-Id and sendgate.* are reserved)"
                ));
            }
            let value = match value {
                Value::String(s) => PropertyValue::String(s.clone()),
                Value::Bool(b) => PropertyValue::Bool(*b),
                Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                    (Some(i), _) => PropertyValue::Integer(i),
                    // serde_json holds no infinite or NaN number: every f64 it gives
                    // is finite.
                    (None, Some(x)) => PropertyValue::Float(x),
                    _ => return Err(format!("property {name:?}: the number is out of range")),
                },
                _ => {
                    return Err(format!(
                        "property {name:?}: a value must be a string, a number or a boolean"
                    ))
                }
            };
            let weight = value.weight();
            if weight > MAX_PROPERTY_VALUE_BYTES {
                return Err(format!(
                    "property {name:?}: a value must be at most {MAX_PROPERTY_VALUE_BYTES} bytes"
                ));
            }
            total += name.len() + weight;
            out.push((name.clone(), value));
        }
        if total > MAX_PROPERTIES_BYTES {
            return Err(format!(
                "the properties must be at most {MAX_PROPERTIES_BYTES} bytes in all \
                 (names and values)"
            ));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self(out))
    }
}

/// A JSON object's members in their order, refused when a name comes twice (serde_json's
/// map keeps the last value silently) or when there are more than any valid properties can
/// be (each weighs a byte at least): a megabyte of `{"a":0,…}` stops there.
struct UniqueNames(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for UniqueNames {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = UniqueNames;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members: Vec<(String, Value)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                while let Some(name) = map.next_key::<String>()? {
                    if members.len() == MAX_PROPERTIES_BYTES {
                        return Err(serde::de::Error::custom(format!(
                            "the properties must be at most {MAX_PROPERTIES_BYTES} bytes in all \
                             (names and values)"
                        )));
                    }
                    if !seen.insert(name.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "property {name:?} is given twice"
                        )));
                    }
                    let value = map.next_value::<Value>()?;
                    members.push((name, value));
                }
                Ok(UniqueNames(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A message's attributes; all absent by default (a message as before this contract).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attributes {
    pub subject: Option<Text>,
    pub session_id: Option<Text>,
    pub partition_key: Option<Text>,
    /// Whole seconds, 1 to [`MAX_TIME_TO_LIVE_S`].
    pub time_to_live: Option<Duration>,
    /// In UTC.
    pub scheduled_enqueue_time: Option<OffsetDateTime>,
    pub reply_to: Option<Text>,
    pub to: Option<Text>,
    pub properties: Properties,
}

impl Attributes {
    /// Every attribute from where `value` finds it (`None`: not given); every bad one is
    /// listed, in [`Field::ALL`]'s order.
    pub fn parse<'a>(
        mut value: impl FnMut(Field) -> Option<Raw<'a>>,
    ) -> Result<Self, Vec<AttributeError>> {
        let mut errors = Vec::new();
        let mut attributes = Attributes::default();
        for field in Field::ALL {
            let Some(raw) = value(field) else { continue };
            if let Err(message) = attributes.set(field, raw) {
                errors.push(AttributeError::new(field, message));
            }
        }
        if let (Some(session), Some(partition)) =
            (&attributes.session_id, &attributes.partition_key)
        {
            if session != partition {
                errors.push(AttributeError::new(
                    Field::PartitionKey,
                    "must equal session_id when both are given (Service Bus requires it)",
                ));
            }
        }
        if errors.is_empty() {
            Ok(attributes)
        } else {
            Err(errors)
        }
    }

    /// Whether any attribute is given.
    pub fn is_empty(&self) -> bool {
        self == &Attributes::default()
    }

    /// The key one broker send must share (Service Bus: a batch holds one session or
    /// partition key): the session id, else the partition key.
    pub fn ordering_key(&self) -> Option<&str> {
        self.session_id
            .as_ref()
            .or(self.partition_key.as_ref())
            .map(Text::as_str)
    }

    /// The scheduled time as RFC 3339 in UTC (`2026-12-02T08:00:00Z`).
    pub fn scheduled_rfc3339(&self) -> Option<String> {
        self.scheduled_enqueue_time
            .and_then(|t| t.format(&Rfc3339).ok())
    }

    fn set(&mut self, field: Field, raw: Raw<'_>) -> Result<(), String> {
        if let (Raw::JsonText(text), false) = (raw, field == Field::Properties) {
            // Any other field reads as its value: only the properties need the text.
            let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            return self.set(field, Raw::Json(&value));
        }
        match field {
            Field::Subject => self.subject = Some(text(raw, MAX_TEXT_CHARS)?),
            Field::SessionId => self.session_id = Some(text(raw, MAX_KEY_CHARS)?),
            Field::PartitionKey => self.partition_key = Some(text(raw, MAX_KEY_CHARS)?),
            Field::ReplyTo => self.reply_to = Some(text(raw, MAX_TEXT_CHARS)?),
            Field::To => self.to = Some(text(raw, MAX_TEXT_CHARS)?),
            Field::TimeToLive => self.time_to_live = Some(time_to_live(raw)?),
            Field::ScheduledEnqueueTime => {
                let raw = string(raw)?;
                let at = OffsetDateTime::parse(raw.as_ref(), &Rfc3339)
                    .map_err(|_| "must be an RFC 3339 date and time (2026-12-02T08:00:00Z)")?;
                // A valid time in its own offset may be out of range in UTC: `to_offset`
                // panics past the year 9999, and a year before 0000 has no RFC 3339 form
                // (what `queue receive` prints, what Service Bus is sent).
                let utc = at
                    .checked_to_offset(UtcOffset::UTC)
                    .filter(|utc| (0..=9999).contains(&utc.year()))
                    .ok_or("must be within the years 0000 to 9999 once converted to UTC")?;
                self.scheduled_enqueue_time = Some(utc);
            }
            Field::Properties => {
                let object = match raw {
                    Raw::Json(Value::Object(map)) => Properties::parse(map)?,
                    Raw::Json(_) => return Err("must be a JSON object".into()),
                    Raw::Header(bytes) => Properties::parse_text(bytes)?,
                    Raw::JsonText(text) => Properties::parse_text(text.as_bytes())?,
                };
                self.properties = object;
            }
        }
        Ok(())
    }
}

fn string<'a>(raw: Raw<'a>) -> Result<std::borrow::Cow<'a, str>, String> {
    match raw {
        Raw::Json(Value::String(s)) => Ok(std::borrow::Cow::Borrowed(s.as_str())),
        Raw::Json(_) | Raw::JsonText(_) => Err("must be a string".into()),
        Raw::Header(bytes) => std::str::from_utf8(bytes)
            .map(std::borrow::Cow::Borrowed)
            .map_err(|_| "must be UTF-8".into()),
    }
}

fn text(raw: Raw<'_>, max: usize) -> Result<Text, String> {
    Text::parse(&string(raw)?, max)
}

fn time_to_live(raw: Raw<'_>) -> Result<Duration, String> {
    let bad = || format!("must be whole seconds from 1 to {MAX_TIME_TO_LIVE_S}");
    let seconds = match raw {
        Raw::Json(Value::Number(n)) => n.as_u64().ok_or_else(bad)?,
        Raw::Json(_) | Raw::JsonText(_) => return Err(bad()),
        Raw::Header(bytes) => {
            let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            text.parse::<u64>().map_err(|_| bad())?
        }
    };
    if !(1..=MAX_TIME_TO_LIVE_S).contains(&seconds) {
        return Err(bad());
    }
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from_json(entry: Value) -> Result<Attributes, Vec<AttributeError>> {
        let map = entry.as_object().unwrap().clone();
        Attributes::parse(|f| map.get(f.json_name()).map(Raw::Json))
    }

    fn from_headers(headers: &[(&str, &str)]) -> Result<Attributes, Vec<AttributeError>> {
        let headers: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        Attributes::parse(|f| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(f.header_name()))
                .map(|(_, v)| Raw::Header(v.as_slice()))
        })
    }

    fn fields(errors: Vec<AttributeError>) -> Vec<Field> {
        errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn every_attribute_parses_from_either_form_to_the_same_value() {
        let json = from_json(json!({
            "subject": "order.created",
            "session_id": "customer-7",
            "partition_key": "customer-7",
            "time_to_live_s": 90,
            "scheduled_enqueue_time": "2026-12-02T09:30:00+01:00",
            "reply_to": "replies",
            "to": "billing",
            "properties": {"priority": "high", "Attempt": 3, "ratio": 0.5, "urgent": true},
        }))
        .unwrap();
        let headers = from_headers(&[
            ("Message-Subject", "order.created"),
            ("message-session-id", "customer-7"),
            ("Message-Partition-Key", "customer-7"),
            ("Message-Time-To-Live", "90"),
            (
                "Message-Scheduled-Enqueue-Time",
                "2026-12-02T09:30:00+01:00",
            ),
            ("Message-Reply-To", "replies"),
            ("Message-To", "billing"),
            (
                "Message-Properties",
                r#"{"priority":"high","Attempt":3,"ratio":0.5,"urgent":true}"#,
            ),
        ])
        .unwrap();
        assert_eq!(json, headers);
        assert_eq!(json.time_to_live, Some(Duration::from_secs(90)));
        assert_eq!(
            json.scheduled_rfc3339().as_deref(),
            Some("2026-12-02T08:30:00Z"),
            "converted to UTC"
        );
        let props: Vec<_> = json.properties.iter().collect();
        assert_eq!(
            props,
            [
                ("Attempt", &PropertyValue::Integer(3)),
                ("priority", &PropertyValue::String("high".into())),
                ("ratio", &PropertyValue::Float(0.5)),
                ("urgent", &PropertyValue::Bool(true)),
            ],
            "names keep their case, in name order"
        );
        assert_eq!(json.ordering_key(), Some("customer-7"));
        assert!(Attributes::default().is_empty() && !json.is_empty());
        assert!(Attributes::default().properties.is_empty());
        assert!(!json.properties.is_empty() && json.properties.len() == 4);
    }

    #[test]
    fn bad_values_are_each_named() {
        let errors = from_json(json!({
            "subject": "",
            "session_id": "a",
            "partition_key": "b",
            "time_to_live_s": 0,
            "scheduled_enqueue_time": "tomorrow",
            "reply_to": 7,
            "to": "line\nbreak",
            "properties": [],
        }))
        .unwrap_err();
        assert_eq!(
            fields(errors),
            [
                Field::Subject,
                Field::TimeToLive,
                Field::ScheduledEnqueueTime,
                Field::ReplyTo,
                Field::To,
                Field::Properties,
                Field::PartitionKey,
            ]
        );
    }

    #[test]
    fn limits_hold_at_their_boundaries() {
        let key = |n: usize| from_json(json!({"session_id": "é".repeat(n)}));
        assert!(key(MAX_KEY_CHARS).is_ok(), "characters, not bytes");
        assert!(key(MAX_KEY_CHARS + 1).is_err());
        let subject = |n: usize| from_json(json!({"subject": "s".repeat(n)}));
        assert!(subject(MAX_TEXT_CHARS).is_ok());
        assert!(subject(MAX_TEXT_CHARS + 1).is_err());
        let ttl = |v: Value| from_json(json!({ "time_to_live_s": v }));
        assert!(ttl(json!(1)).is_ok());
        assert!(ttl(json!(MAX_TIME_TO_LIVE_S)).is_ok());
        for bad in [
            json!(0),
            json!(MAX_TIME_TO_LIVE_S + 1),
            json!(1.5),
            json!(-1),
            json!("9"),
        ] {
            assert!(ttl(bad.clone()).is_err(), "{bad}");
        }
        for bad in ["", "+9", "9s", " 9", "1e3"] {
            assert!(
                from_headers(&[("Message-Time-To-Live", bad)]).is_err(),
                "{bad:?}"
            );
        }
        let value = |n: usize| from_json(json!({"properties": {"p": "v".repeat(n)}}));
        assert!(value(MAX_PROPERTY_VALUE_BYTES).is_ok());
        assert!(value(MAX_PROPERTY_VALUE_BYTES + 1).is_err());
        // Three values of 24 KiB: each under its limit, together over 64 KiB.
        let big = "v".repeat(24 * 1024);
        assert!(from_json(json!({"properties": {"a": big, "b": big}})).is_ok());
        assert!(from_json(json!({"properties": {"a": big, "b": big, "c": big}})).is_err());
        // Names count with the values: exactly 64 KiB in all is held, a byte more is not.
        let all = |extra: usize| {
            let last = MAX_PROPERTIES_BYTES - 2 * (2 + 30 * 1024) - 2 + extra;
            let (x, y) = ("v".repeat(30 * 1024), "v".repeat(last));
            from_json(json!({"properties": {"aa": x, "bb": x, "cc": y}}))
        };
        assert!(all(0).is_ok());
        assert!(all(1).is_err());
        let name = |n: usize| {
            let mut map = serde_json::Map::new();
            map.insert("n".repeat(n), json!(1));
            from_json(json!({ "properties": map }))
        };
        assert!(name(MAX_PROPERTY_NAME_CHARS).is_ok());
        assert!(name(MAX_PROPERTY_NAME_CHARS + 1).is_err());
        assert!(name(0).is_err());
    }

    #[test]
    fn property_values_are_strings_numbers_or_booleans_and_names_not_reserved() {
        for bad in [json!(null), json!([1]), json!({"a": 1})] {
            assert!(from_json(json!({"properties": {"p": bad}})).is_err());
        }
        assert_eq!(
            from_json(json!({"properties": {"big": 18446744073709551615u64}}))
                .unwrap()
                .properties
                .iter()
                .next()
                .unwrap()
                .1,
            &PropertyValue::Float(18446744073709551615u64 as f64),
            "a number past i64 keeps its value as a float"
        );
        for reserved in [
            "traceparent",
            "TraceState",
            "Diagnostic-Id",
            "sendgate.tenant",
            "SENDGATE.x",
        ] {
            let mut map = serde_json::Map::new();
            map.insert(reserved.into(), json!("x"));
            assert!(
                from_json(json!({ "properties": map })).is_err(),
                "{reserved}"
            );
        }
        assert!(from_json(json!({"properties": {"sendgatex": 1}})).is_ok());
        assert!(from_headers(&[("Message-Properties", "not json")]).is_err());
        assert!(from_headers(&[("Message-Properties", "[1]")]).is_err());
        assert!(from_headers(&[("Message-Properties", "{}")])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_property_name_given_twice_is_refused_in_either_form_not_one_value_dropped() {
        let twice = r#"{"Priority": "high", "attempt": 1, "Priority": "low"}"#;
        let header = from_headers(&[("Message-Properties", twice)]).unwrap_err();
        assert_eq!(fields(header), [Field::Properties]);
        let entry = Attributes::parse(|f| (f == Field::Properties).then_some(Raw::JsonText(twice)));
        let errors = entry.unwrap_err();
        assert_eq!(fields(errors.clone()), [Field::Properties]);
        assert!(errors[0].message.contains("\"Priority\""), "{errors:?}");
        // Names differing only in case are two properties (names are case-sensitive).
        let cased = r#"{"priority": "high", "Priority": "low"}"#;
        let parsed =
            Attributes::parse(|f| (f == Field::Properties).then_some(Raw::JsonText(cased)));
        assert_eq!(parsed.unwrap().properties.len(), 2);
        // The other fields read from their JSON text as from their value.
        let subject =
            Attributes::parse(|f| (f == Field::Subject).then_some(Raw::JsonText(r#""s""#)));
        assert_eq!(subject.unwrap().subject.unwrap().as_str(), "s");
    }

    #[test]
    fn a_schedule_whose_utc_time_is_past_what_rfc_3339_holds_is_refused_not_a_panic() {
        // Valid RFC 3339 in its own offset, but a year 10000 (or -1) once in UTC: the time
        // crate's to_offset panics on it.
        for bad in ["9999-12-31T23:59:59-01:00", "0000-01-01T00:00:00+00:01"] {
            let errors = from_json(json!({ "scheduled_enqueue_time": bad })).unwrap_err();
            assert_eq!(fields(errors), [Field::ScheduledEnqueueTime], "{bad}");
            let errors = from_headers(&[("Message-Scheduled-Enqueue-Time", bad)]).unwrap_err();
            assert_eq!(fields(errors), [Field::ScheduledEnqueueTime], "{bad}");
        }
        let edge = from_json(json!({"scheduled_enqueue_time": "9999-12-31T23:59:59+01:00"}));
        assert_eq!(
            edge.unwrap().scheduled_rfc3339().as_deref(),
            Some("9999-12-31T22:59:59Z")
        );
    }

    #[test]
    fn a_header_must_be_utf8_and_a_field_its_json_type() {
        let bad_utf8 = Attributes::parse(|f| {
            (f == Field::Subject).then_some(Raw::Header(b"\xff\xfe".as_slice()))
        });
        assert_eq!(fields(bad_utf8.unwrap_err()), [Field::Subject]);
        let utf8 =
            Attributes::parse(|f| (f == Field::Subject).then_some(Raw::Header("café".as_bytes())));
        assert_eq!(utf8.unwrap().subject.unwrap().as_str(), "café");
        assert!(from_json(json!({"scheduled_enqueue_time": 1700000000})).is_err());
        assert!(from_json(json!({"subject": true})).is_err());
    }
}
