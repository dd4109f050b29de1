//! The gateway's lifecycle states, as `/health/*` announces them:
//! `starting` → `running` → `draining` → `stopped`, in that order (hence `Ord`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
// serde is hand-written below (forgiving reads); the schema spells the same words.
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::ToSchema),
    schema(rename_all = "lowercase")
)]
pub enum GatewayState {
    Starting,
    Running,
    Draining,
    Stopped,
}

/// A state this version does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown gateway state {0:?}")]
pub struct UnknownState(pub String);

impl GatewayState {
    pub const ALL: [GatewayState; 4] =
        [Self::Starting, Self::Running, Self::Draining, Self::Stopped];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Draining => "draining",
            Self::Stopped => "stopped",
        }
    }

    /// Forgiving: surrounding spaces and case are ignored (`" Draining "` is draining).
    /// `None` for a state this version does not know.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        Self::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(raw))
    }
}

impl FromStr for GatewayState {
    type Err = UnknownState;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Self::parse(raw).ok_or_else(|| UnknownState(raw.to_owned()))
    }
}

impl fmt::Display for GatewayState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for GatewayState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for GatewayState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_serialize_as_the_contracts_words_and_parse_back() {
        let words = ["starting", "running", "draining", "stopped"];
        for (state, word) in GatewayState::ALL.into_iter().zip(words) {
            assert_eq!(state.as_str(), word);
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{word}\"")
            );
            assert_eq!(GatewayState::parse(word), Some(state));
            let back: GatewayState = serde_json::from_str(&format!("\"{word}\"")).unwrap();
            assert_eq!(back, state);
        }
    }

    #[test]
    fn parsing_forgives_case_and_spaces_but_not_unknown_states() {
        assert_eq!(
            GatewayState::parse(" Draining\n"),
            Some(GatewayState::Draining)
        );
        assert_eq!(GatewayState::parse("RUNNING"), Some(GatewayState::Running));
        assert_eq!(GatewayState::parse("sideways"), None);
        assert_eq!(GatewayState::parse(""), None);
        assert!(serde_json::from_str::<GatewayState>("\"sideways\"").is_err());
    }

    #[test]
    fn the_lifecycle_only_moves_forward() {
        use GatewayState::*;
        assert!(Starting < Running && Running < Draining && Draining < Stopped);
    }
}
