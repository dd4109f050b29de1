//! What one attempt at an export is, whichever the transport: the signal it is for, the
//! bound on the answer read, and its failure. A leaf: the transports and the retry loop
//! import it, it imports none of them.

use std::time::Duration;

/// The most of a collector's answer read.
pub(crate) const MAX_ANSWER: usize = 64 * 1024;

/// Which collector service an export is for (gRPC names the method; HTTP has it in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    Traces,
    Metrics,
}

/// One attempt's failure, and whether (and after how long, if the collector said) it may
/// be tried again.
pub(crate) struct Failed {
    pub(crate) error: String,
    pub(crate) retry: Option<Option<Duration>>,
}

/// `error` and its causes (a transport's own message often says only "error sending
/// request"; the cause says refused, reset, DNS or TLS). None of them holds a header.
pub(crate) fn described(error: &(dyn std::error::Error + 'static)) -> String {
    with_causes(error.to_string(), error.source())
}

/// `text`, then each of `cause` and its causes that it does not say already (some errors
/// repeat their cause's text in their own).
pub(crate) fn with_causes(
    mut text: String,
    mut cause: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    while let Some(e) = cause {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn the_causes_are_said_once_each() {
        let refused = Layer("connection refused", None);
        let connect = Layer("tcp connect error", Some(Box::new(refused)));
        let error = Layer("error sending request", Some(Box::new(connect)));
        assert_eq!(
            described(&error),
            "error sending request: tcp connect error: connection refused"
        );
        let repeated = Layer(
            "transport error: corrupt message",
            Some(Box::new(Layer("corrupt message", None))),
        );
        assert_eq!(described(&repeated), "transport error: corrupt message");
    }
}
