//! Credentials for Service Bus REST calls: the `Authorization` header value.
//!
//! - **SAS** from a connection string: a token signed with HMAC-SHA256, one per queue
//!   (its resource is the queue's URL, which both namespace-level and queue-level keys
//!   accept), valid for an hour and renewed after 45 minutes so a token never expires in
//!   flight.
//! - **Entra ID**: a bearer token for `https://servicebus.azure.net/.default` from the
//!   shared [`crate::entra`] credential (cached, refreshed five minutes before it expires by
//!   its own task, failures cached for 5–30 s).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::Sha256;
use tokio::time::Instant;

use crate::config::{ConnectionString, Secret};
use crate::domain::QueueName;
pub use sendgate_entra::{CredentialChain, EntraCredential, TokenError};

/// How long a SAS token is valid, and when it is replaced.
pub const SAS_LIFETIME: Duration = Duration::from_secs(60 * 60);
pub const SAS_RENEW_AFTER: Duration = Duration::from_secs(45 * 60);
/// How far behind a cached token's issue time a caller's clock reading may be and still
/// be a race between two calls rather than a clock set back.
const SAS_RACE_SLACK: Duration = Duration::from_secs(5);

/// The Entra ID scope of every Service Bus data- and management-plane call.
pub const ENTRA_SCOPE: &str = "https://servicebus.azure.net/.default";

/// What SAS encodes: everything but the unreserved characters, as the Azure SDKs do.
const SAS_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

// ---------------------------------------------------------------------------------------
// SAS
// ---------------------------------------------------------------------------------------

/// A SAS token for `resource`, valid until `expiry` (Unix seconds). The string signed is
/// `{url-encoded resource}\n{expiry}`; the key is used as its UTF-8 bytes (it looks like
/// base64 but is not decoded).
pub fn sas_token(resource: &str, key_name: &str, key: &str, expiry: u64) -> String {
    let encoded_resource = utf8_percent_encode(resource, SAS_ENCODE).to_string();
    let to_sign = format!("{encoded_resource}\n{expiry}");
    let signature = base64::engine::general_purpose::STANDARD.encode(hmac_sha256(key, &to_sign));
    format!(
        "SharedAccessSignature sr={encoded_resource}&sig={}&se={expiry}&skn={}",
        utf8_percent_encode(&signature, SAS_ENCODE),
        utf8_percent_encode(key_name, SAS_ENCODE),
    )
}

fn hmac_sha256(key: &str, message: &str) -> Vec<u8> {
    // HMAC takes a key of any length (long keys are hashed first), so this cannot fail;
    // the fallback only keeps the code free of panics.
    match Hmac::<Sha256>::new_from_slice(key.as_bytes()) {
        Ok(mut mac) => {
            mac.update(message.as_bytes());
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

struct CachedSas {
    header: String,
    issued_at: SystemTime,
}

/// Signs SAS tokens with one key, one cached token per queue.
pub struct SasCredential {
    host: String,
    key_name: String,
    key: Secret,
    tokens: Mutex<HashMap<QueueName, CachedSas>>,
}

impl SasCredential {
    pub fn new(connection: &ConnectionString) -> Self {
        Self {
            host: connection.host.clone(),
            key_name: connection.key_name.clone(),
            key: connection.key.clone(),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    pub fn key_name(&self) -> &str {
        &self.key_name
    }

    /// The URI a token for `queue` is signed for.
    pub fn resource(&self, queue: &QueueName) -> String {
        format!("https://{}/{}", self.host, queue.as_str())
    }

    /// The `Authorization` value for a call on `queue` at `now`: the cached token while
    /// it is younger than [`SAS_RENEW_AFTER`], else a fresh one.
    pub fn authorization_at(&self, queue: &QueueName, now: SystemTime) -> String {
        let mut tokens = self.tokens.lock();
        if let Some(cached) = tokens.get(queue) {
            // Callers read the clock before they wait for this lock, so a `now` a little
            // before the token was issued is a race between two calls, not a clock that
            // went backwards; a clock that jumped back further renews (the expiry is from
            // the old clock).
            let young = match now.duration_since(cached.issued_at) {
                Ok(age) => age < SAS_RENEW_AFTER,
                Err(behind) => behind.duration() < SAS_RACE_SLACK,
            };
            if young {
                return cached.header.clone();
            }
        }
        let expiry = now
            .checked_add(SAS_LIFETIME)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let header = sas_token(
            &self.resource(queue),
            &self.key_name,
            self.key.expose(),
            expiry,
        );
        tokens.insert(
            queue.clone(),
            CachedSas {
                header: header.clone(),
                issued_at: now,
            },
        );
        header
    }
}

// ---------------------------------------------------------------------------------------
// Either
// ---------------------------------------------------------------------------------------

pub enum Credential {
    /// Shared by both planes when they sign with one key: one cached token per queue.
    Sas(Arc<SasCredential>),
    Entra(Arc<EntraCredential>),
}

impl Credential {
    /// The `Authorization` header value for a call on `queue`, by `deadline`.
    pub async fn authorization(
        &self,
        queue: &QueueName,
        deadline: Instant,
    ) -> Result<String, TokenError> {
        match self {
            Self::Sas(sas) => Ok(sas.authorization_at(queue, SystemTime::now())),
            Self::Entra(entra) => entra
                .token(deadline)
                .await
                .map(|token| format!("Bearer {}", token.secret())),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Sas(sas) => format!("SAS key {:?}", sas.key_name()),
            Self::Entra(_) => "Entra ID".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEND: &str = "Endpoint=sb://test.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0LWtleS0xMjM0NTY3ODkw";

    fn queue(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    #[test]
    fn sas_token_matches_a_vector_computed_with_openssl() {
        // Computed outside Rust, and the same with Python's hmac + urllib.parse.quote_plus
        // (the encoding the Azure Python SDK uses):
        //   printf 'https%%3A%%2F%%2Fmyns.servicebus.windows.net%%2Forders\n1700000000' \
        //     | openssl dgst -sha256 -hmac 'SGVsbG9LZXk9PQ==' -binary | base64
        //   → wsSpo/ibVlBTwFJf3b0CYuqCDpcuCWm0i+lKR3Hm/xo=
        let token = sas_token(
            "https://myns.servicebus.windows.net/orders",
            "RootManageSharedAccessKey",
            "SGVsbG9LZXk9PQ==",
            1_700_000_000,
        );
        assert_eq!(
            token,
            "SharedAccessSignature sr=https%3A%2F%2Fmyns.servicebus.windows.net%2Forders\
             &sig=wsSpo%2FibVlBTwFJf3b0CYuqCDpcuCWm0i%2BlKR3Hm%2Fxo%3D&se=1700000000&skn=RootManageSharedAccessKey"
        );
    }

    #[test]
    fn the_sas_resource_is_the_queue_url_on_the_namespace() {
        let sas = SasCredential::new(&ConnectionString::parse(SEND).unwrap());
        assert_eq!(
            sas.resource(&queue("requests")),
            "https://test.servicebus.windows.net/requests"
        );
    }

    #[test]
    fn a_sas_token_is_valid_an_hour_and_renewed_after_45_minutes() {
        let sas = SasCredential::new(&ConnectionString::parse(SEND).unwrap());
        let q = queue("requests");
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let first = sas.authorization_at(&q, t0);
        assert!(
            first.contains(&format!("&se={}&", 1_800_000_000 + 3600)),
            "{first}"
        );
        assert_eq!(
            sas.authorization_at(&q, t0 + Duration::from_secs(44 * 60)),
            first,
            "reused while young"
        );
        let renewed = sas.authorization_at(&q, t0 + Duration::from_secs(45 * 60));
        assert_ne!(renewed, first);
        assert!(renewed.contains(&format!("&se={}&", 1_800_000_000 + 45 * 60 + 3600)));
        // A caller that read the clock just before another one issued the token reuses it.
        assert_eq!(
            sas.authorization_at(
                &q,
                t0 + Duration::from_secs(45 * 60) - Duration::from_millis(3)
            ),
            renewed,
            "a racing caller's slightly older clock reading"
        );
        // A clock that went backwards gets a fresh token too.
        assert_ne!(
            sas.authorization_at(&q, t0 - Duration::from_secs(60)),
            renewed
        );
        // Each queue has its own token, signed for its own URL.
        let other = sas.authorization_at(&queue("other"), t0);
        assert!(other.contains("sr=https%3A%2F%2Ftest.servicebus.windows.net%2Fother&"));
    }

    /// The Service Bus credential asks the shared Entra cache for the Service Bus scope and
    /// sends the token as a bearer.
    #[tokio::test]
    async fn the_entra_credential_is_a_bearer_for_the_service_bus_scope() {
        let source = sendgate_entra::testing::FakeSource::new(
            ENTRA_SCOPE,
            false,
            Duration::ZERO,
            Duration::from_secs(3600),
        );
        let entra = EntraCredential::new(CredentialChain::new(ENTRA_SCOPE, vec![("fake", source)]));
        let credential = Credential::Entra(Arc::new(entra));
        let far = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            credential.authorization(&queue("q"), far).await.unwrap(),
            "Bearer token-1"
        );
    }
}
