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
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let next = e.to_string();
        // Some errors repeat their cause's text in their own.
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}
