//! Why the settings were refused: one line naming the variable to fix, never a secret.

use super::vars::Var;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A value that does not parse; `got` is `None` for a secret variable.
    #[error("{var}: {reason}{}", got.as_deref().map(|g| format!(" (got {g:?})")).unwrap_or_default())]
    Invalid {
        var: &'static str,
        reason: String,
        got: Option<String>,
    },
    /// Values that parse but cannot work together, e.g. a namespace and a connection
    /// string of another namespace.
    #[error("{var}: {message}")]
    Other { var: &'static str, message: String },
    #[error("SENDGATE_CONFIG: {0}")]
    File(String),
    #[error("SENDGATE_CONFIG: unknown setting `{key}`{} (keys are the variable names in lower case without SENDGATE_)", did_you_mean(suggestion))]
    UnknownKey {
        key: String,
        suggestion: Option<String>,
    },
    #[error("{name}: not a sendgate variable{}", did_you_mean(suggestion))]
    UnknownVariable {
        name: String,
        suggestion: Option<&'static str>,
    },
}

fn did_you_mean(suggestion: &Option<impl AsRef<str>>) -> String {
    suggestion
        .as_ref()
        .map(|s| format!("; did you mean {}?", s.as_ref()))
        .unwrap_or_default()
}

impl ConfigError {
    /// A value of `var` that does not parse: shown unless the variable is secret or the
    /// value looks like a credential pasted into the wrong variable.
    pub fn invalid(var: &'static Var, value: &str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            var: var.name,
            reason: reason.into(),
            got: (!var.secret && !holds_a_credential(value)).then(|| value.to_owned()),
        }
    }

    pub fn other(var: &'static Var, message: impl Into<String>) -> Self {
        Self::Other {
            var: var.name,
            message: message.into(),
        }
    }

    /// The variable to fix, when the error is about one.
    pub fn variable(&self) -> Option<&str> {
        match self {
            Self::Invalid { var, .. } | Self::Other { var, .. } => Some(var),
            Self::File(_) | Self::UnknownKey { .. } => Some("SENDGATE_CONFIG"),
            Self::UnknownVariable { name, .. } => Some(name),
        }
    }
}

/// A SAS connection string or token, or user info (`user:password@host`, with or without
/// a scheme): what an operator may paste into a variable that is not secret.
fn holds_a_credential(value: &str) -> bool {
    value.contains('@') || value.to_ascii_lowercase().contains("sharedaccess")
}

/// The closest of `candidates` to a misspelled `name`, if it is close enough to be the
/// one meant (a couple of letters swapped, missing or extra).
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|(distance, c)| *distance <= (c.len() / 5).clamp(1, 3))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_name_is_suggested_and_a_far_one_is_not() {
        let names = ["SENDGATE_DEPTH_TTL_MS", "SENDGATE_LISTEN"];
        assert_eq!(
            closest("SENDGATE_DEPHT_TTL_MS", names.into_iter()),
            Some("SENDGATE_DEPTH_TTL_MS")
        );
        assert_eq!(
            closest("SENDGATE_LISTN", names.into_iter()),
            Some("SENDGATE_LISTEN")
        );
        assert_eq!(closest("SENDGATE_COLOUR", names.into_iter()), None);
    }
}
