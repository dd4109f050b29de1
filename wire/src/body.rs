//! The bodies of a send's answers: `201` [`Queued`], `200` [`Valid`] (a dry run) and every
//! error's [`ErrorBody`].
//!
//! Text fields are `Cow`: the server fills them with borrowed strings (no copy per answer)
//! and a client reads them owned. Field order is serialization order, and it is the
//! contract's: do not reorder.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::code::AnyCode;

/// `201 Created`: the message is in the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Queued<'a> {
    /// Always [`Queued::STATUS`].
    #[cfg_attr(feature = "openapi", schema(schema_with = schema::queued))]
    pub status: Cow<'a, str>,
    pub queue: Cow<'a, str>,
    pub message_id: Cow<'a, str>,
    pub request_id: Cow<'a, str>,
    /// The broker already held a message with this id (shown only when true).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[cfg_attr(feature = "openapi", schema(schema_with = schema::always_true))]
    pub duplicate: bool,
    /// The message's own W3C `traceparent` (the request's trace, a parent id of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            nullable = false,
            pattern = "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
        )
    )]
    pub traceparent: Option<Cow<'a, str>>,
}

impl<'a> Queued<'a> {
    pub const STATUS: &'static str = "queued";

    pub fn new(queue: &'a str, message_id: &'a str, request_id: &'a str, duplicate: bool) -> Self {
        Self {
            status: Cow::Borrowed(Self::STATUS),
            queue: Cow::Borrowed(queue),
            message_id: Cow::Borrowed(message_id),
            request_id: Cow::Borrowed(request_id),
            duplicate,
            traceparent: None,
        }
    }
}

/// `200 OK` to a dry run: the send would have been attempted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Valid<'a> {
    /// Always [`Valid::STATUS`].
    #[cfg_attr(feature = "openapi", schema(schema_with = schema::valid))]
    pub status: Cow<'a, str>,
    /// Always `true`.
    #[cfg_attr(feature = "openapi", schema(schema_with = schema::always_true))]
    pub dry_run: bool,
    pub queue: Cow<'a, str>,
    pub message_id: Cow<'a, str>,
    pub request_id: Cow<'a, str>,
    /// The `traceparent` the message would carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            nullable = false,
            pattern = "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
        )
    )]
    pub traceparent: Option<Cow<'a, str>>,
}

impl<'a> Valid<'a> {
    pub const STATUS: &'static str = "valid";

    pub fn new(queue: &'a str, message_id: &'a str, request_id: &'a str) -> Self {
        Self {
            status: Cow::Borrowed(Self::STATUS),
            dry_run: true,
            queue: Cow::Borrowed(queue),
            message_id: Cow::Borrowed(message_id),
            request_id: Cow::Borrowed(request_id),
            traceparent: None,
        }
    }
}

/// Most input problems listed in one 400 (the `max_items` of [`ErrorBody::errors`]).
pub const MAX_FIELD_ERRORS: usize = 20;

/// One step of a [`FieldError`]'s place: a name, or an index into an array (a batch's
/// entry: `["body", "messages", 3, "properties"]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Loc {
    Index(u64),
    Name(String),
}

impl Loc {
    /// The name, when this step is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Loc::Name(name) => Some(name),
            Loc::Index(_) => None,
        }
    }
}

impl From<&str> for Loc {
    fn from(name: &str) -> Self {
        Loc::Name(name.to_owned())
    }
}

impl From<usize> for Loc {
    fn from(index: usize) -> Self {
        Loc::Index(index as u64)
    }
}

impl PartialEq<&str> for Loc {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == Some(*other)
    }
}

/// One problem with the request's input: where (`["body"]`, `["header", "Idempotency-Key"]`,
/// `["body", "messages", 3, "properties"]`) and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    pub loc: Vec<Loc>,
    pub msg: String,
}

impl FieldError {
    pub fn new(loc: &[&str], msg: impl Into<String>) -> Self {
        Self {
            loc: loc.iter().map(|s| Loc::from(*s)).collect(),
            msg: msg.into(),
        }
    }

    /// At a place with indices in it.
    pub fn at(loc: Vec<Loc>, msg: impl Into<String>) -> Self {
        Self {
            loc,
            msg: msg.into(),
        }
    }
}

/// Every error answer's body: `code`, `message`, `request_id`, and the fields its code
/// carries. Fields are in alphabetical order, so the JSON is byte for byte what the
/// gateway's earlier `serde_json::Map` (a BTreeMap) produced; absent ones are omitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody<'a> {
    /// `unsupported_attribute`: the attribute (its batch field's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub attribute: Option<Cow<'a, str>>,
    /// `unsupported_attribute`: the kind of backend that cannot carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub backend: Option<Cow<'a, str>>,
    /// `queue_full`: the backlog read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub backlog: Option<u64>,
    #[cfg_attr(feature = "openapi", schema(value_type = crate::ErrorCode))]
    pub code: AnyCode,
    /// `capacity_unknown`: failed depth reads in a row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub consecutive_failures: Option<u32>,
    /// `queue_full` with `reason: criticality`: the level the send was made at
    /// (`critical`, `default`, `sheddable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub criticality: Option<Cow<'a, str>>,
    /// `queue_full`: how many messages a second the queue's consumers were measured to
    /// take, `null` while unknown (then `Retry-After` is the time until the next depth
    /// read).
    // Absent (`None`) on other codes; `Some(None)` is the `null`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, nullable = true, minimum = 0))]
    pub drain_rate_per_s: Option<Option<f64>>,
    /// `invalid_request`: what is wrong, where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<FieldError>>, nullable = false, max_items = 20))]
    pub errors: Option<Cow<'a, [FieldError]>>,
    /// `queue_full`: the backlog ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub limit: Option<u64>,
    /// `payload_too_large`: the largest body accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub limit_bytes: Option<usize>,
    pub message: Cow<'a, str>,
    /// With `outcome`: the id to retry with (the same `Idempotency-Key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub message_id: Option<Cow<'a, str>>,
    /// [`ErrorBody::OUTCOME_UNKNOWN`] when the broker may hold the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = schema::outcome_unknown))]
    pub outcome: Option<Cow<'a, str>>,
    /// `unknown_queue`: the name asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub queue: Option<Cow<'a, str>>,
    /// `queue_full` with `reason: tenant_quota`: the quota the tenant is past, `rate`
    /// (its `rate_per_s`) or `max_share` (what its admissions may hold of the ceiling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub quota: Option<Cow<'a, str>>,
    /// `queue_full`: why, when not the ceiling itself: `tenant_share` (the caller's
    /// tenant is past its part of the room), `tenant_quota` (past one of its quotas) or
    /// `criticality` (the send's level is refused from its fraction of the ceiling).
    /// `capacity_unknown`: the dependency that failed: `admin_plane` (the depth reads) or
    /// `ledger` (the fleet's Redis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub reason: Option<Cow<'a, str>>,
    pub request_id: Cow<'a, str>,
    /// `draining`: whole seconds left in the drain window; `queue_full`: the expected time
    /// until sends are admitted again. Always the `Retry-After` header's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false, minimum = 1))]
    pub retry_after_s: Option<u64>,
    /// A batch's `queue_full`: how many of its entries would be admitted now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false, minimum = 0))]
    pub room: Option<u64>,
    /// `queue_full` with `reason: tenant_share`: the tenant's part of the room this
    /// round offers (0 to 1); with `quota: max_share`, the tenant's `max_share`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(nullable = false, minimum = 0, maximum = 1)
    )]
    pub share: Option<f64>,
}

impl<'a> ErrorBody<'a> {
    pub const OUTCOME_UNKNOWN: &'static str = "unknown";

    /// A body with only the three fields every error carries.
    pub fn new(code: impl Into<AnyCode>, message: Cow<'a, str>, request_id: &'a str) -> Self {
        Self {
            attribute: None,
            backend: None,
            backlog: None,
            code: code.into(),
            consecutive_failures: None,
            criticality: None,
            drain_rate_per_s: None,
            errors: None,
            limit: None,
            limit_bytes: None,
            message,
            message_id: None,
            outcome: None,
            queue: None,
            quota: None,
            reason: None,
            request_id: Cow::Borrowed(request_id),
            retry_after_s: None,
            room: None,
            share: None,
        }
    }

    /// Whether the broker may hold the message although the send was not confirmed.
    pub fn outcome_unknown(&self) -> bool {
        self.outcome.as_deref() == Some(Self::OUTCOME_UNKNOWN)
    }
}

/// A field that is present, `null` included: `Some(None)` for `null`, where a plain
/// `Option` would read it as absent.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Schemas for the fields whose Rust type is wider than what the gateway writes.
#[cfg(feature = "openapi")]
mod schema {
    use utoipa::openapi::schema::{Object, ObjectBuilder, Type};

    fn word(text: &'static str) -> Object {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some([text]))
            .build()
    }

    pub fn queued() -> Object {
        word(super::Queued::STATUS)
    }

    pub fn valid() -> Object {
        word(super::Valid::STATUS)
    }

    pub fn outcome_unknown() -> Object {
        word(super::ErrorBody::OUTCOME_UNKNOWN)
    }

    /// `true`: a dry run's `dry_run`, and `duplicate`, which is shown only when true.
    pub fn always_true() -> Object {
        ObjectBuilder::new()
            .schema_type(Type::Boolean)
            .enum_values(Some([true]))
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code::ErrorCode;

    #[test]
    fn queued_and_valid_serialize_in_the_contracts_order() {
        let q = Queued::new("requests", "m-1", "r-1", false);
        assert_eq!(
            serde_json::to_string(&q).unwrap(),
            r#"{"status":"queued","queue":"requests","message_id":"m-1","request_id":"r-1"}"#
        );
        let dup = Queued::new("requests", "m-1", "r-1", true);
        assert!(serde_json::to_string(&dup)
            .unwrap()
            .ends_with(r#""request_id":"r-1","duplicate":true}"#));
        let back: Queued = serde_json::from_str(&serde_json::to_string(&q).unwrap()).unwrap();
        assert_eq!(back, q);

        let v = Valid::new("requests", "m-1", "r-1");
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"status":"valid","dry_run":true,"queue":"requests","message_id":"m-1","request_id":"r-1"}"#
        );
    }

    #[test]
    fn an_error_body_is_alphabetical_omits_what_is_absent_and_reads_back() {
        let mut b = ErrorBody::new(ErrorCode::SendTimeout, "late".into(), "r-1");
        b.outcome = Some(ErrorBody::OUTCOME_UNKNOWN.into());
        b.message_id = Some("m-1".into());
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(
            json,
            r#"{"code":"send_timeout","message":"late","message_id":"m-1","outcome":"unknown","request_id":"r-1"}"#
        );
        let back: ErrorBody = serde_json::from_str(&json).unwrap();
        assert_eq!(back, b);
        assert!(back.outcome_unknown());

        let errors = [FieldError::new(&["body"], "not JSON")];
        let mut b = ErrorBody::new(ErrorCode::InvalidRequest, "bad".into(), "r");
        b.errors = Some(Cow::Borrowed(&errors));
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"code":"invalid_request","errors":[{"loc":["body"],"msg":"not JSON"}],"message":"bad","request_id":"r"}"#
        );
    }

    #[test]
    fn a_queue_full_body_says_null_for_an_unknown_drain_rate_and_reads_it_back() {
        let mut b = ErrorBody::new(ErrorCode::QueueFull, "full".into(), "r");
        b.backlog = Some(10);
        b.limit = Some(10);
        b.retry_after_s = Some(3);
        b.drain_rate_per_s = Some(None);
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(
            json,
            r#"{"backlog":10,"code":"queue_full","drain_rate_per_s":null,"limit":10,"message":"full","request_id":"r","retry_after_s":3}"#
        );
        assert_eq!(serde_json::from_str::<ErrorBody>(&json).unwrap(), b);
        b.drain_rate_per_s = Some(Some(2.5));
        let json = serde_json::to_string(&b).unwrap();
        assert!(json.contains(r#""drain_rate_per_s":2.5,"#), "{json}");
        assert_eq!(serde_json::from_str::<ErrorBody>(&json).unwrap(), b);
    }

    #[test]
    fn a_body_with_a_newer_code_and_extra_fields_still_reads() {
        let b: ErrorBody = serde_json::from_str(
            r#"{"code":"rate_limited","message":"m","request_id":"r","new_field":[1]}"#,
        )
        .unwrap();
        assert_eq!(b.code, AnyCode::Unknown("rate_limited".into()));
    }
}
