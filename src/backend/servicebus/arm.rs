//! The ARM depth source: a queue's counts from Azure Resource Manager's queue resource
//! (`GET {arm}{namespace id}/queues/{queue}?api-version=2024-01-01`, "Queues - Get"),
//! which the *Reader* role can read: no data-plane Manage right, unlike the namespace's
//! management endpoint (`atom`).
//!
//! The body is the `SBQueue` resource; the counts sit in `properties.countDetails`
//! (`activeMessageCount`, `scheduledMessageCount`, ...) and `properties.status` says whether
//! the entity accepts sends, as in the ATOM description. Parsed defensively: a body over
//! [`MAX_BODY_BYTES`] or without the counts is a failed read, never a zero.

use serde::Deserialize;

use super::atom::{EntityStatus, QueueRuntime};

/// The Queues - Get API version read (its `SBQueue` carries `countDetails`).
pub const API_VERSION: &str = "2024-01-01";

/// A queue resource is a few KB; more is not one.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArmError {
    #[error("the body is not a queue resource: {0}")]
    Malformed(String),
    #[error("the queue resource holds no properties.countDetails.{0}")]
    MissingCount(&'static str),
}

#[derive(Deserialize)]
struct Resource {
    properties: Option<Properties>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Properties {
    status: Option<String>,
    count_details: Option<CountDetails>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CountDetails {
    active_message_count: Option<u64>,
    scheduled_message_count: Option<u64>,
}

/// The runtime counts and status of a queue resource's JSON body.
pub fn parse_queue(body: &[u8]) -> Result<QueueRuntime, ArmError> {
    let resource: Resource =
        serde_json::from_slice(body).map_err(|e| ArmError::Malformed(e.to_string()))?;
    let properties = resource
        .properties
        .ok_or(ArmError::MissingCount("activeMessageCount"))?;
    let counts = properties
        .count_details
        .ok_or(ArmError::MissingCount("activeMessageCount"))?;
    Ok(QueueRuntime {
        active: counts
            .active_message_count
            .ok_or(ArmError::MissingCount("activeMessageCount"))?,
        scheduled: counts
            .scheduled_message_count
            .ok_or(ArmError::MissingCount("scheduledMessageCount"))?,
        status: status(properties.status.as_deref()),
    })
}

/// ARM's `EntityStatus`: `Disabled` and `SendDisabled` refuse sends; the others
/// (`Active`, `ReceiveDisabled`, `Creating`, ...) do not.
fn status(text: Option<&str>) -> EntityStatus {
    match text {
        Some(s) if s.eq_ignore_ascii_case("Disabled") || s.eq_ignore_ascii_case("SendDisabled") => {
            EntityStatus::SendDisabled
        }
        _ => EntityStatus::AcceptsSends,
    }
}

/// ARM's error body, `{"error": {"code": "...", "message": "..."}}`, as one line.
pub fn error_detail(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Envelope {
        error: Detail,
    }
    #[derive(Deserialize)]
    struct Detail {
        code: Option<String>,
        message: Option<String>,
    }
    let envelope: Envelope = serde_json::from_slice(body).ok()?;
    let parts: Vec<String> = [envelope.error.code, envelope.error.message]
        .into_iter()
        .flatten()
        .collect();
    (!parts.is_empty()).then(|| parts.join(": "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUE: &str = include_str!("../../../tests/data/servicebus/arm_queue_get_200.json");

    fn with(find: &str, replace: &str) -> String {
        assert!(QUEUE.contains(find), "the documented body changed shape");
        QUEUE.replace(find, replace)
    }

    #[test]
    fn the_documented_body_reads_as_its_counts_and_status() {
        let runtime = parse_queue(QUEUE.as_bytes()).unwrap();
        assert_eq!(
            runtime,
            QueueRuntime {
                active: 0,
                scheduled: 0,
                status: EntityStatus::AcceptsSends
            }
        );
        let counted = with("\"activeMessageCount\": 0", "\"activeMessageCount\": 41");
        let counted = counted.replace(
            "\"scheduledMessageCount\": 0",
            "\"scheduledMessageCount\": 2",
        );
        let counted = counted.replace(
            "\"deadLetterMessageCount\": 0",
            "\"deadLetterMessageCount\": 9",
        );
        assert_eq!(parse_queue(counted.as_bytes()).unwrap().backlog(), 43);
    }

    #[test]
    fn a_disabled_queue_refuses_sends_and_others_accept_them() {
        for (text, expected) in [
            ("SendDisabled", EntityStatus::SendDisabled),
            ("Disabled", EntityStatus::SendDisabled),
            ("ReceiveDisabled", EntityStatus::AcceptsSends),
            ("Creating", EntityStatus::AcceptsSends),
        ] {
            let body = with("\"status\": \"Active\"", &format!("\"status\": \"{text}\""));
            assert_eq!(
                parse_queue(body.as_bytes()).unwrap().status,
                expected,
                "{text}"
            );
        }
    }

    #[test]
    fn a_body_without_the_counts_is_a_failed_read_never_zero() {
        let without = with("\"activeMessageCount\": 0,", "");
        assert_eq!(
            parse_queue(without.as_bytes()),
            Err(ArmError::MissingCount("activeMessageCount"))
        );
        let without = with("\"scheduledMessageCount\": 0,", "");
        assert_eq!(
            parse_queue(without.as_bytes()),
            Err(ArmError::MissingCount("scheduledMessageCount"))
        );
        assert_eq!(
            parse_queue(br#"{"properties": {"status": "Active"}}"#),
            Err(ArmError::MissingCount("activeMessageCount"))
        );
        assert_eq!(
            parse_queue(br#"{"name": "q"}"#),
            Err(ArmError::MissingCount("activeMessageCount"))
        );
        assert!(matches!(
            parse_queue(&QUEUE.as_bytes()[..QUEUE.len() / 2]),
            Err(ArmError::Malformed(_))
        ));
        let negative = with("\"activeMessageCount\": 0", "\"activeMessageCount\": -1");
        assert!(matches!(
            parse_queue(negative.as_bytes()),
            Err(ArmError::Malformed(_))
        ));
    }

    #[test]
    fn an_arm_error_body_is_its_code_and_message() {
        assert_eq!(
            error_detail(br#"{"error":{"code":"AuthorizationFailed","message":"no read"}}"#),
            Some("AuthorizationFailed: no read".into())
        );
        assert_eq!(
            error_detail(br#"{"error":{"code":"NotFound"}}"#),
            Some("NotFound".into())
        );
        assert_eq!(error_detail(br#"{"error":{}}"#), None);
        assert_eq!(error_detail(b"<html>"), None);
    }
}
