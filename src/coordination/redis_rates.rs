//! [`RateLedger`] on Redis: one script (`lua/rate.lua`) over one string key per tenant,
//! `{prefix}:rates:{tenant}`, run on the [`RedisClient`]'s connection, within its deadline
//! and with its redaction. The key lives only while its TAT is ahead of Redis's clock.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::rates::{Grant, RateError, RateLedger, RateTerms};
use super::redis_client::{RedisClient, RedisError};

static RATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/rate.lua")));

impl RedisClient {
    /// Where `tenant`'s rate quota is kept for the fleet.
    pub fn rate_key(&self, tenant: &str) -> String {
        self.deployment_key(&format!("rates:{tenant}"))
    }
}

#[async_trait]
impl RateLedger for RedisClient {
    async fn lease(&self, tenant: &str, terms: RateTerms, want: u64) -> Result<Grant, RateError> {
        let mut call = RATE.prepare_invoke();
        call.key(self.rate_key(tenant))
            .arg(terms.interval_ns)
            .arg(terms.burst)
            .arg(want);
        let said = |error: RedisError| RateError(error.to_string());
        let reply = self.run(&call).await.map_err(said)?;
        grant(&reply, want).map_err(said)
    }
}

/// The script's `{granted, wait in µs}`; anything else (or more granted than asked) is an
/// error, not a panic nor a unit more.
fn grant(reply: &Value, want: u64) -> Result<Grant, RedisError> {
    let unexpected = || RedisError::Unexpected(format!("the rate script answered {reply:?}"));
    let Value::Array(items) = reply else {
        return Err(unexpected());
    };
    let [Value::Int(granted), Value::Int(wait)] = items.as_slice() else {
        return Err(unexpected());
    };
    let granted = u64::try_from(*granted).map_err(|_| unexpected())?;
    let wait = u64::try_from(*wait).map_err(|_| unexpected())?;
    if granted > want {
        return Err(unexpected());
    }
    Ok(Grant {
        granted,
        wait: Duration::from_micros(wait),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_is_two_counts_and_anything_else_is_an_error_not_a_panic() {
        let reply = Value::Array(vec![Value::Int(2), Value::Int(1500)]);
        assert_eq!(
            grant(&reply, 3).unwrap(),
            Grant {
                granted: 2,
                wait: Duration::from_micros(1500)
            }
        );
        for bad in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(-1), Value::Int(0)]),
            Value::Array(vec![Value::Int(4), Value::Int(0)]),
            Value::Array(vec![Value::Int(1), Value::Int(-5)]),
        ] {
            assert!(
                matches!(grant(&bad, 3), Err(RedisError::Unexpected(_))),
                "{bad:?}"
            );
        }
    }
}
