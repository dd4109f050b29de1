//! A batch send (`POST /v1/queues/{queue}/messages/batch`): the request's entries as a
//! producer writes them, and the two answers, `201` ([`BatchQueued`]: every entry queued,
//! or `200` on a dry run) and `207` ([`BatchPartial`]: per-entry results).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::code::AnyCode;

/// A message's attributes as JSON: a batch entry's fields, and what `sendgate queue
/// receive` prints. The gateway checks them (docs/contract.md section 1, "Message attributes"); this type only
/// carries them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageAttributes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_live_s: Option<u64>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_enqueue_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Application properties: string, number or boolean values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, serde_json::Value>,
}

impl MessageAttributes {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One entry of a batch request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchEntry {
    /// The message itself: any JSON value, delivered as its text.
    pub body: Box<serde_json::value::RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(flatten)]
    pub attributes: MessageAttributes,
}

/// A batch request's body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchRequest {
    pub messages: Vec<BatchEntry>,
}

/// One queued (or, on a dry run, valid) entry, in the request's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchMessage<'a> {
    pub message_id: Cow<'a, str>,
    pub traceparent: Cow<'a, str>,
    /// The broker already held a message with this id (shown only when true).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// `201`: every entry is in the queue; `200` with `dry_run`: every entry would be tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchQueued<'a> {
    /// `queued`, or `valid` on a dry run.
    pub status: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    pub queue: Cow<'a, str>,
    pub request_id: Cow<'a, str>,
    pub count: usize,
    pub messages: Vec<BatchMessage<'a>>,
}

/// One entry's result in a `207`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EntryResult<'a> {
    /// Its place in the request (0-based).
    pub index: usize,
    /// `queued` or `failed`.
    pub status: Cow<'a, str>,
    /// The id to retry it with (the same `idempotency_key` gives the same id).
    pub message_id: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<Cow<'a, str>>,
    /// A failed entry's code, as a single send's would be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::ErrorCode>, nullable = false))]
    pub code: Option<AnyCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub message: Option<Cow<'a, str>>,
    /// `unknown`: the broker may hold it (retry with the same id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub outcome: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

impl EntryResult<'_> {
    pub const QUEUED: &'static str = "queued";
    pub const FAILED: &'static str = "failed";

    /// Whether sending it again is needed: failed, whatever the outcome.
    pub fn failed(&self) -> bool {
        self.status == Self::FAILED
    }
}

/// `207`: some entries are queued and some are not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchPartial<'a> {
    /// Always `partial`.
    pub status: Cow<'a, str>,
    pub queue: Cow<'a, str>,
    pub request_id: Cow<'a, str>,
    /// Entries queued.
    pub queued: usize,
    /// Entries not queued (or whose outcome is unknown).
    pub failed: usize,
    pub results: Vec<EntryResult<'a>>,
}

impl BatchPartial<'_> {
    pub const STATUS: &'static str = "partial";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_its_body_ids_and_attributes_flat() {
        let entry: BatchEntry = serde_json::from_str(
            r#"{"body":{"n":1},"idempotency_key":"k","subject":"s","time_to_live_s":5,"properties":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!(entry.body.get(), r#"{"n":1}"#);
        assert_eq!(entry.attributes.subject.as_deref(), Some("s"));
        assert_eq!(entry.attributes.time_to_live_s, Some(5));
        let back = serde_json::to_string(&entry).unwrap();
        assert_eq!(
            back,
            r#"{"body":{"n":1},"idempotency_key":"k","subject":"s","time_to_live_s":5,"properties":{"a":1}}"#
        );
    }
}
