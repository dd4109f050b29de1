//! [`ShareExchange`] on Redis: one script (`lua/shares.lua`) over one hash per queue, run on
//! the [`RedisClient`]'s connection, within its deadline and with its redaction. The hash is not
//! the ceiling's (docs/fleet.md's keys are others); the script stores and answers counts as
//! strings it never reads, so Lua's doubles cannot round them.

use std::sync::LazyLock;

use async_trait::async_trait;
use redis::{Script, Value};

use super::redis_client::{millis, RedisClient, RedisError};
use super::shares::{ExchangeError, RoundCounts, ShareExchange, KEEP_COUNTS};

static SHARES: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/shares.lua")));

#[async_trait]
impl ShareExchange for RedisClient {
    async fn exchange(
        &self,
        key: &str,
        replica: &str,
        mine: &RoundCounts,
    ) -> Result<RoundCounts, ExchangeError> {
        let mut call = SHARES.prepare_invoke();
        call.key(key)
            .arg(replica)
            .arg(millis(KEEP_COUNTS))
            .arg(mine.encode());
        let said = |error: RedisError| ExchangeError(error.to_string());
        let reply = self.run(&call).await.map_err(said)?;
        Ok(RoundCounts::sum_of(
            mine.round,
            others(&reply).map_err(said)?,
        ))
    }
}

/// The other replicas' counts as the script answered them: an array of strings.
fn others(reply: &Value) -> Result<Vec<&[u8]>, RedisError> {
    let Value::Array(items) = reply else {
        return Err(RedisError::Unexpected(format!(
            "the tenants' exchange answered {reply:?}"
        )));
    };
    Ok(items
        .iter()
        .filter_map(|item| match item {
            Value::BulkString(bytes) => Some(bytes.as_slice()),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_is_an_array_of_strings_and_anything_else_is_an_error_not_a_panic() {
        let reply = Value::Array(vec![
            Value::BulkString(b"{}".to_vec()),
            Value::Int(3),
            Value::BulkString(b"x".to_vec()),
        ]);
        assert_eq!(others(&reply).unwrap(), vec![b"{}".as_slice(), b"x"]);
        assert!(others(&Value::Array(vec![])).unwrap().is_empty());
        for bad in [Value::Nil, Value::Int(1), Value::SimpleString("OK".into())] {
            assert!(matches!(others(&bad), Err(RedisError::Unexpected(_))));
        }
    }
}
