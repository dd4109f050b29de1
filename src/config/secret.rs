//! A value that must never be shown: AMQP URLs with their password, SAS keys, connection
//! strings, the management password, tokens. `Secret<T>`'s `Debug` and `Display` never show
//! the value, so no error that formats one echoes it.

use std::fmt;

/// `Debug` and `Display` print a placeholder; only [`Secret::expose`] gives the value, so
/// every place that uses one is a place that means to.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T = String>(T);

impl Secret<String> {
    pub fn new(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl<T> Secret<T> {
    pub fn wrap(value: T) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(secret)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neither_debug_nor_display_shows_the_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "Secret(..) (secret)");
        assert_eq!(s.expose(), "hunter2");
        let nested = Secret::wrap(vec!["hunter2"]);
        assert!(!format!("{nested:?}").contains("hunter2"));
    }
}
