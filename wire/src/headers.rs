//! Header names both sides use. HTTP header names are case-insensitive; these are the
//! spellings the contract shows.

/// Identifies one request in logs and bodies; the gateway echoes or creates it.
pub const REQUEST_ID: &str = "X-Request-Id";
/// The producer's key for a message: every retry of one message carries the same one.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Carried to the message as its correlation id, and echoed.
pub const CORRELATION_ID: &str = "X-Correlation-Id";
/// Which backend took the send (`primary` or `fallback`).
pub const BACKEND: &str = "X-Sendgate-Backend";
/// Lowers the criticality a send is made at (`critical`, `default`, `sheddable`): never
/// above the caller's key's.
pub const CRITICALITY: &str = "Sendgate-Criticality";
/// Whole seconds to wait before trying again (on every 429 and 503).
pub const RETRY_AFTER: &str = "Retry-After";
/// The tenant's rate quota (draft-ietf-httpapi-ratelimit-headers): `"rate";q=<burst>;w=<s>`.
pub const RATELIMIT_POLICY: &str = "RateLimit-Policy";
/// Where the tenant's rate quota stands: `"rate";r=<available>[;t=<s>]`.
pub const RATELIMIT: &str = "RateLimit";
