//! Queue names, parsed once: a value of this type is a name every backend accepts.

use std::fmt;

/// The name of a queue served by the gateway.
///
/// Restricted to what every backend accepts as an entity name: ASCII letters, digits,
/// `.`, `-` and `_`, starting with a letter or digit, at most 255 bytes (RabbitMQ's limit;
/// Service Bus allows 260).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueNameError {
    #[error("a queue name cannot be empty")]
    Empty,
    #[error("a queue name is at most 255 characters")]
    TooLong,
    #[error("a queue name starts with a letter or digit and holds only letters, digits, '.', '-' and '_'")]
    BadCharacter,
}

impl QueueName {
    pub fn parse(raw: &str) -> Result<Self, QueueNameError> {
        if raw.is_empty() {
            return Err(QueueNameError::Empty);
        }
        if raw.len() > 255 {
            return Err(QueueNameError::TooLong);
        }
        let mut chars = raw.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !(first_ok && rest_ok) {
            return Err(QueueNameError::BadCharacter);
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for QueueName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in ["requests", "a", "jobs.high-priority_2", "0day"] {
            assert_eq!(QueueName::parse(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_names_a_backend_would_refuse() {
        assert_eq!(QueueName::parse(""), Err(QueueNameError::Empty));
        assert_eq!(
            QueueName::parse(&"q".repeat(256)),
            Err(QueueNameError::TooLong)
        );
        for bad in ["-lead", ".lead", "has space", "slash/inside", "ünï", "q\n"] {
            assert_eq!(
                QueueName::parse(bad),
                Err(QueueNameError::BadCharacter),
                "{bad:?}"
            );
        }
    }
}
