//! `SENDGATE_COORDINATION` and the Redis it names: how replicas share one ceiling.
//!
//! A malformed Redis URL stops start-up (exit 2) naming the variable, never its value: the
//! URL may hold a password. An unreachable Redis does not: that is a runtime condition the
//! replica survives in local mode.

use std::time::Duration;

use reqwest::Url;

use super::layers::Layers;
use super::vars::{self as v, Var};
use super::{ConfigError, Secret};

/// Who keeps the ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordinationSettings {
    /// This process alone (one replica).
    Local,
    /// Every replica through one Redis.
    Redis(RedisSettings),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub url: Secret<Url>,
    pub auth: RedisAuth,
    pub prefix: KeyPrefix,
    /// Deadline of one Redis call.
    pub timeout: Duration,
    /// The most replicas running at once: what a replica cut off divides the room by.
    pub max_replicas: u64,
}

/// How the replica authenticates to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisAuth {
    /// Whatever the URL carries (ACL user and password, a password, or nothing).
    Url,
    /// A Microsoft Entra token of the process's identity, as the password of the URL's
    /// user (the identity's object id). The token comes from the same chain as Service
    /// Bus's (workload identity, managed identity, Azure CLI); a user-assigned managed
    /// identity is picked by `SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID`, the one identity
    /// the deployment gives the gateway.
    Entra {
        managed_identity_client_id: Option<String>,
    },
}

/// The prefix of every key one deployment uses: short, printable, no spaces, so a key is
/// always `{prefix}:{...}` and two deployments sharing a Redis never meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    pub fn parse(raw: &str) -> Result<Self, &'static str> {
        if raw.is_empty() || raw.len() > 64 {
            return Err("must be 1 to 64 characters");
        }
        if !raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        {
            return Err("may hold only A-Z a-z 0-9 . _ : -");
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub(super) fn parse(layers: &Layers) -> Result<CoordinationSettings, ConfigError> {
    if layers.choice(&v::COORDINATION)? != Some("redis") {
        return Ok(CoordinationSettings::Local);
    }
    let auth = match layers.choice(&v::REDIS_AUTH)? {
        Some("entra") => RedisAuth::Entra {
            managed_identity_client_id: layers
                .value(&v::SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID)
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .map(str::to_owned),
        },
        _ => RedisAuth::Url,
    };
    let raw = layers.value(&v::REDIS_URL).ok_or_else(|| {
        ConfigError::other(
            &v::REDIS_URL,
            "must be set with SENDGATE_COORDINATION=redis",
        )
    })?;
    let url = parse_redis_url(&v::REDIS_URL, raw, &auth)?;
    let prefix_raw = layers.value(&v::REDIS_PREFIX).unwrap_or_default();
    let prefix = KeyPrefix::parse(prefix_raw)
        .map_err(|why| ConfigError::invalid(&v::REDIS_PREFIX, prefix_raw, why))?;
    Ok(CoordinationSettings::Redis(RedisSettings {
        url: Secret::wrap(url),
        auth,
        prefix,
        timeout: layers.duration(&v::REDIS_TIMEOUT_MS)?,
        max_replicas: layers.count(&v::FLEET_MAX_REPLICAS)?,
    }))
}

/// `redis://[user[:password]@]host[:port][/db]` or `rediss://…` (TLS). The reasons never
/// quote the value: it may hold a password.
fn parse_redis_url(var: &'static Var, raw: &str, auth: &RedisAuth) -> Result<Url, ConfigError> {
    let refuse = |why: &str| {
        ConfigError::other(
            var,
            format!(
                "{why}; expected e.g. redis://127.0.0.1:6379 or rediss://user:password@host:6380"
            ),
        )
    };
    let url = Url::parse(raw).map_err(|e| refuse(&format!("not a URL ({e})")))?;
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(refuse("the scheme must be redis or rediss"));
    }
    if url.cannot_be_a_base() || url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("no host"));
    }
    let db = url.path().trim_start_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Err(refuse("the path may only be a database number"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refuse("no query or fragment is read"));
    }
    if matches!(auth, RedisAuth::Entra { .. }) {
        if url.username().is_empty() {
            return Err(refuse(
                "with SENDGATE_REDIS_AUTH=entra the user must be the managed identity's object id",
            ));
        }
        if url.password().is_some() {
            return Err(refuse(
                "with SENDGATE_REDIS_AUTH=entra the URL carries no password",
            ));
        }
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> Result<Url, ConfigError> {
        parse_redis_url(&v::REDIS_URL, raw, &RedisAuth::Url)
    }

    #[test]
    fn plain_tls_acl_and_database_urls_parse() {
        for ok in [
            "redis://127.0.0.1:6379",
            "rediss://cache.example.net:10000",
            "redis://user:p%40ss@host:6379/2",
            "redis://:password@host",
        ] {
            assert!(url(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn malformed_urls_are_refused_without_echoing_the_password() {
        for bad in [
            "http://user:hunter2@host",
            "redis://user:hunter2@/",
            "redis://user:hunter2@host/notadb",
            "redis://user:hunter2@host?x=1",
            "user:hunter2@host:6379",
            "redis://user:hunter2@host:99999",
        ] {
            let e = url(bad).expect_err(bad).to_string();
            assert!(e.contains("SENDGATE_REDIS_URL"), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn entra_needs_a_user_and_no_password() {
        let auth = RedisAuth::Entra {
            managed_identity_client_id: None,
        };
        let entra = |raw| parse_redis_url(&v::REDIS_URL, raw, &auth);
        assert!(entra("rediss://00000000-1111-2222-3333-444444444444@host:10000").is_ok());
        assert!(entra("rediss://host:10000").is_err());
        assert!(entra("rediss://user:secret@host:10000").is_err());
    }

    #[test]
    fn prefixes_are_short_printable_words() {
        assert!(KeyPrefix::parse("sendgate").is_ok());
        assert!(KeyPrefix::parse("prod:eu-1.sg_2").is_ok());
        assert!(KeyPrefix::parse("").is_err());
        assert!(KeyPrefix::parse("has space").is_err());
        assert!(KeyPrefix::parse("{slot}").is_err());
        assert!(
            KeyPrefix::parse(&"x".repeat(64)).is_ok(),
            "64 is the longest"
        );
        assert!(KeyPrefix::parse(&"x".repeat(65)).is_err());
    }
}
