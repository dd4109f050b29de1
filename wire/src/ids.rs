//! Identifiers that travel in headers: 1–128 printable ASCII characters (space to `~`).
//! 128 is the Service Bus `MessageId` limit and fits an AMQP short string.

use std::fmt;

#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most 128 characters")]
    TooLong,
    #[error("must be printable ASCII")]
    NotPrintable,
}

fn check(raw: &str) -> Result<(), IdError> {
    if raw.is_empty() {
        return Err(IdError::Empty);
    }
    if raw.len() > 128 {
        return Err(IdError::TooLong);
    }
    if !raw.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(IdError::NotPrintable);
    }
    Ok(())
}

macro_rules! header_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn parse(raw: &str) -> Result<Self, IdError> {
                check(raw).map(|()| Self(raw.to_owned()))
            }

            /// A fresh random identifier (a UUID v4), for when the client sent none.
            /// Encoded into a stack buffer and copied once: `to_string()` would run the
            /// formatter and grow the `String` several times, on every request.
            pub fn generate() -> Self {
                let mut buf = uuid::Uuid::encode_buffer();
                Self(
                    uuid::Uuid::new_v4()
                        .hyphenated()
                        .encode_lower(&mut buf)
                        .to_owned(),
                )
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

header_id!(
    /// The broker message id: the client's `Idempotency-Key`, or a generated UUID.
    MessageId
);
header_id!(
    /// Carried to the message as its correlation id.
    CorrelationId
);
header_id!(
    /// Identifies one HTTP request in logs and bodies; echoed as `X-Request-Id`.
    RequestId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_to_128_printable_ascii() {
        assert!(MessageId::parse("order-42").is_ok());
        assert!(MessageId::parse("with space ~").is_ok());
        assert!(MessageId::parse(&"k".repeat(128)).is_ok());
        assert_eq!(MessageId::parse(""), Err(IdError::Empty));
        assert_eq!(MessageId::parse(&"k".repeat(129)), Err(IdError::TooLong));
        assert_eq!(MessageId::parse("tab\there"), Err(IdError::NotPrintable));
        assert_eq!(MessageId::parse("é"), Err(IdError::NotPrintable));
    }

    #[test]
    fn generated_ids_parse() {
        let id = MessageId::generate();
        // The same text as the UUID's `Display`: 36 characters, hyphenated, lower case.
        let uuid = uuid::Uuid::parse_str(id.as_str()).unwrap();
        assert_eq!(uuid.get_version_num(), 4);
        assert_eq!(id.as_str(), uuid.to_string());
        assert_eq!(MessageId::parse(id.as_str()), Ok(id));
    }
}
