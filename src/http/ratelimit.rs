//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers,
//! structured-field lists of one item each) on the answers to a tenant with a rate quota:
//! the `201`s and `429`s of the send and batch routes (contract section 2, "Quotas").
//!
//! - `RateLimit-Policy: "rate";q=<burst>;w=<seconds an empty bucket takes to fill>`
//! - `RateLimit: "rate";r=<units that conform now>;t=<seconds until one more does>`, `t`
//!   absent when the bucket is full. With `r=0`, `t` is a single send's `Retry-After`.

use actix_web::http::header::{HeaderMap, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use super::errors::{whole_seconds, ApiError};

use super::headers::{RATELIMIT, RATELIMIT_POLICY};
use crate::admission::fair::quota::{RateBook, RateState};
use crate::admission::tenants::TenantIndex;

/// The policy's name in both fields.
pub const POLICY: &str = "rate";

/// The two fields' values for one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitFields {
    policy: HeaderValue,
    limit: HeaderValue,
}

impl RateLimitFields {
    pub fn of(state: &RateState) -> Self {
        let policy = format!(
            "\"{POLICY}\";q={};w={}",
            state.rate.burst(),
            state.rate.window_s()
        );
        let limit = match state.until_more {
            Some(wait) => format!(
                "\"{POLICY}\";r={};t={}",
                state.available,
                whole_seconds(wait)
            ),
            None => format!("\"{POLICY}\";r={}", state.available),
        };
        Self {
            // Digits, letters, quotes and `;=`: always a valid header value.
            policy: HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("")),
            limit: HeaderValue::from_str(&limit).unwrap_or(HeaderValue::from_static("")),
        }
    }

    /// The fields for `tenant` now; `None` when it has no rate quota.
    pub fn for_tenant(rates: &RateBook, tenant: TenantIndex) -> Option<Self> {
        rates
            .state(tenant, tokio::time::Instant::now())
            .map(|s| Self::of(&s))
    }

    pub fn insert(&self, headers: &mut HeaderMap) {
        headers.insert(RATELIMIT_POLICY, self.policy.clone());
        headers.insert(RATELIMIT, self.limit.clone());
    }
}

/// A send route's answer with `fields` on it when it is a `201` or a `429` (a refusal is
/// then written here rather than by actix: nothing downstream reads it back as an error).
pub fn on_answer(
    answer: Result<HttpResponse, ApiError>,
    fields: Option<RateLimitFields>,
) -> Result<HttpResponse, ApiError> {
    let Some(fields) = fields else {
        return answer;
    };
    match answer {
        Ok(mut response) => {
            if response.status() == StatusCode::CREATED {
                fields.insert(response.headers_mut());
            }
            Ok(response)
        }
        Err(e) if e.problem.status() == StatusCode::TOO_MANY_REQUESTS => {
            let mut response = e.error_response();
            fields.insert(response.headers_mut());
            Ok(response)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::tenants::Rate;
    use std::time::Duration;

    #[test]
    fn the_fields_are_one_item_lists_in_the_drafts_syntax() {
        let rate = Rate::new(2.0, Some(10)).unwrap();
        let full = RateLimitFields::of(&RateState {
            rate,
            available: 10,
            until_more: None,
        });
        assert_eq!(full.policy, "\"rate\";q=10;w=5");
        assert_eq!(
            full.limit, "\"rate\";r=10",
            "a full bucket has no effective window"
        );
        let empty = RateLimitFields::of(&RateState {
            rate,
            available: 0,
            until_more: Some(Duration::from_millis(300)),
        });
        assert_eq!(empty.limit, "\"rate\";r=0;t=1", "whole seconds, rounded up");
        let mut headers = HeaderMap::new();
        empty.insert(&mut headers);
        assert_eq!(
            headers.get("ratelimit-policy").unwrap(),
            "\"rate\";q=10;w=5"
        );
        assert_eq!(headers.get("ratelimit").unwrap(), "\"rate\";r=0;t=1");
    }
}
