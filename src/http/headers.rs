//! The names of the headers the API reads and writes that the `http` crate does not
//! define: the one place they are spelled.
//!
//! Each comes twice: as a [`HeaderName`] for look-ups and answers (lower case, as `http`
//! requires and as it goes on the wire), and as the contract spells it, for the `loc` of a
//! 400's field errors (`["header", "Idempotency-Key"]`). A test keeps the pairs in step.
//! The W3C trace context's two are the exception: lower case in every spelling, they are
//! spelled in `domain/trace.rs`, which the backends (below `http`) read as well.

use actix_web::http::header::HeaderName;

/// Identifies one HTTP request; set on every answer.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Becomes the broker message id.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Carried to the message as its correlation id; echoed.
pub const CORRELATION_ID: HeaderName = HeaderName::from_static("x-correlation-id");
/// The backend a send went to (`primary` or `fallback`).
pub const SENDGATE_BACKEND: HeaderName = HeaderName::from_static("x-sendgate-backend");
/// Lowers the criticality a send is made at.
pub const CRITICALITY: HeaderName = HeaderName::from_static("sendgate-criticality");
/// A tenant's rate quota, and where it stands (`http/ratelimit.rs`).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The W3C trace context a request carries (spelled once in `domain/trace.rs`, which the
/// backends' message properties use too): a `&str` name would be parsed at every look-up.
pub const TRACEPARENT: HeaderName = HeaderName::from_static(crate::domain::trace::TRACEPARENT);
pub const TRACESTATE: HeaderName = HeaderName::from_static(crate::domain::trace::TRACESTATE);

/// The contract's spelling of each name above: the wire vocabulary's, which the
/// producer client uses too.
pub mod spelling {
    pub use sendgate_wire::headers::{
        BACKEND as SENDGATE_BACKEND, CORRELATION_ID, CRITICALITY, IDEMPOTENCY_KEY, RATELIMIT,
        RATELIMIT_POLICY, REQUEST_ID,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_matches_its_contract_spelling() {
        for (name, spelled) in [
            (REQUEST_ID, spelling::REQUEST_ID),
            (IDEMPOTENCY_KEY, spelling::IDEMPOTENCY_KEY),
            (CORRELATION_ID, spelling::CORRELATION_ID),
            (SENDGATE_BACKEND, spelling::SENDGATE_BACKEND),
            (CRITICALITY, spelling::CRITICALITY),
            (RATELIMIT_POLICY, spelling::RATELIMIT_POLICY),
            (RATELIMIT, spelling::RATELIMIT),
        ] {
            assert!(name.as_str().eq_ignore_ascii_case(spelled), "{spelled}");
        }
    }
}
