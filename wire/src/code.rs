//! The error codes: the `code` field of every error body, one per way a request can be
//! refused. The server picks one per `Problem`; the client decides by them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Every error code this version of the gateway answers with (`docs/contract.md`).
///
/// Serialized as its snake_case name (`QueueFull` → `"queue_full"`), the same text as
/// [`ErrorCode::as_str`]. Deserializing is strict; a reader that must survive a newer
/// gateway's codes reads an [`AnyCode`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    NotFound,
    MethodNotAllowed,
    UnknownQueue,
    Unauthenticated,
    Forbidden,
    /// Open mode (no API keys) serves loopback `Host` names only (DNS rebinding).
    ForbiddenHost,
    Starting,
    Draining,
    UnsupportedMediaType,
    PayloadTooLarge,
    InvalidRequest,
    /// The request's body did not arrive within the gateway's deadline: nothing was sent,
    /// so the same request may be repeated.
    RequestTimeout,
    QueueFull,
    CapacityUnknown,
    Saturated,
    BackendUnavailable,
    SendTimeout,
    BackendAuthFailed,
    BackendBusy,
    QueueDisabled,
    SendFailed,
    /// `PATCH /admin/settings`: the change could not be stored (data directory, or the
    /// fleet's Redis), so it is not in force.
    SettingsUnavailable,
    /// The backend the send would go to cannot carry one of its attributes faithfully (a
    /// scheduled enqueue on RabbitMQ): refused rather than sent without it.
    UnsupportedAttribute,
    /// The `Idempotency-Key` was used inside the duplicate-detection window for another
    /// message (another body or other attributes): nothing was sent, and repeating the
    /// request is refused again.
    IdempotencyKeyReused,
}

/// A code this version does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error code {0:?}")]
pub struct UnknownCode(pub String);

impl ErrorCode {
    /// Every code, in the contract's order.
    pub const ALL: [ErrorCode; 24] = [
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::UnknownQueue,
        Self::Unauthenticated,
        Self::Forbidden,
        Self::ForbiddenHost,
        Self::Starting,
        Self::Draining,
        Self::UnsupportedMediaType,
        Self::PayloadTooLarge,
        Self::InvalidRequest,
        Self::RequestTimeout,
        Self::QueueFull,
        Self::CapacityUnknown,
        Self::Saturated,
        Self::BackendUnavailable,
        Self::SendTimeout,
        Self::BackendAuthFailed,
        Self::BackendBusy,
        Self::QueueDisabled,
        Self::SendFailed,
        Self::SettingsUnavailable,
        Self::UnsupportedAttribute,
        Self::IdempotencyKeyReused,
    ];

    /// The code as it appears in a body (and as a metric label): static, so the server's
    /// hot path never allocates for it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::UnknownQueue => "unknown_queue",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::ForbiddenHost => "forbidden_host",
            Self::Starting => "starting",
            Self::Draining => "draining",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::PayloadTooLarge => "payload_too_large",
            Self::InvalidRequest => "invalid_request",
            Self::RequestTimeout => "request_timeout",
            Self::QueueFull => "queue_full",
            Self::CapacityUnknown => "capacity_unknown",
            Self::Saturated => "saturated",
            Self::BackendUnavailable => "backend_unavailable",
            Self::SendTimeout => "send_timeout",
            Self::BackendAuthFailed => "backend_auth_failed",
            Self::BackendBusy => "backend_busy",
            Self::QueueDisabled => "queue_disabled",
            Self::SendFailed => "send_failed",
            Self::SettingsUnavailable => "settings_unavailable",
            Self::UnsupportedAttribute => "unsupported_attribute",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
        }
    }

    /// The code named exactly `raw`, or `None` for one this version does not know.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == raw)
    }
}

impl FromStr for ErrorCode {
    type Err = UnknownCode;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Self::parse(raw).ok_or_else(|| UnknownCode(raw.to_owned()))
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A code as read off the wire: one this version knows, or one a newer gateway added
/// (kept as sent, so it can still be reported). Serializes as the bare string either way.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AnyCode {
    Known(ErrorCode),
    Unknown(String),
}

impl AnyCode {
    /// Never fails: an unknown code becomes [`AnyCode::Unknown`].
    pub fn parse(raw: &str) -> Self {
        ErrorCode::parse(raw).map_or_else(|| Self::Unknown(raw.to_owned()), Self::Known)
    }

    /// The known code, for deciding; `None` for a code this version does not know.
    pub fn known(&self) -> Option<ErrorCode> {
        match self {
            Self::Known(code) => Some(*code),
            Self::Unknown(_) => None,
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Known(code) => code.as_str(),
            Self::Unknown(raw) => raw,
        }
    }
}

impl From<ErrorCode> for AnyCode {
    fn from(code: ErrorCode) -> Self {
        Self::Known(code)
    }
}

impl PartialEq<ErrorCode> for AnyCode {
    fn eq(&self, other: &ErrorCode) -> bool {
        self.known() == Some(*other)
    }
}

impl fmt::Display for AnyCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AnyCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AnyCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::parse(&raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_and_as_str_agree_and_every_code_parses_back() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            assert_eq!(AnyCode::parse(code.as_str()), code);
        }
        let distinct: std::collections::HashSet<_> =
            ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(distinct.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn a_newer_gateways_code_is_kept_not_refused() {
        assert_eq!(ErrorCode::parse("rate_limited"), None);
        assert_eq!(
            "rate_limited".parse::<ErrorCode>(),
            Err(UnknownCode("rate_limited".into()))
        );
        assert!(serde_json::from_str::<ErrorCode>("\"rate_limited\"").is_err());
        let any: AnyCode = serde_json::from_str("\"rate_limited\"").unwrap();
        assert_eq!(any, AnyCode::Unknown("rate_limited".into()));
        assert_eq!(any.known(), None);
        assert_eq!(serde_json::to_string(&any).unwrap(), "\"rate_limited\"");
        // Codes are exact: no case folding, so a typo is not mistaken for a known code.
        assert_eq!(ErrorCode::parse("Queue_Full"), None);
    }
}
