//! Credentials for Service Bus REST calls: the `Authorization` header value.
//!
//! - **SAS** from a connection string: a token signed with HMAC-SHA256, one per queue
//!   (its resource is the queue's URL, which both namespace-level and queue-level keys
//!   accept), valid for an hour and renewed after 45 minutes so a token never expires in
//!   flight.
//! - **Entra ID** through `azure_identity`: a bearer token for
//!   `https://servicebus.azure.net/.default`, cached and refreshed five minutes before it
//!   expires. The refresh runs in its own task, so a caller whose deadline passes does not
//!   cancel it: the next caller finds the token ready.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use azure_core::credentials::TokenCredential;
use azure_core::time::OffsetDateTime;
use base64::Engine as _;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::Sha256;
use tokio::time::Instant;

use crate::domain::QueueName;

/// How long a SAS token is valid, and when it is replaced.
pub const SAS_LIFETIME: Duration = Duration::from_secs(60 * 60);
pub const SAS_RENEW_AFTER: Duration = Duration::from_secs(45 * 60);

/// The Entra ID scope of every Service Bus data- and management-plane call.
pub const ENTRA_SCOPE: &str = "https://servicebus.azure.net/.default";
/// An Entra token is refreshed when it has less than this left.
const ENTRA_REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// One credential source may take this long before the chain moves on (an IMDS endpoint
/// that does not exist off Azure can hang rather than refuse).
const ENTRA_SOURCE_BUDGET: Duration = Duration::from_secs(10);
/// After a failed token fetch, sends are refused from the cached failure for a while
/// instead of each one asking Entra ID again: 5 s, doubling with each failure in a row
/// up to 30 s, less up to a fifth at random so a fleet does not retry in step.
const ENTRA_FAILURE_PAUSE_FIRST: Duration = Duration::from_secs(5);
const ENTRA_FAILURE_PAUSE_MAX: Duration = Duration::from_secs(30);

/// What SAS encodes: everything but the unreserved characters, as the Azure SDKs do.
const SAS_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("no token before the deadline")]
    Timeout,
    #[error("{0}")]
    Unavailable(String),
}

// ---------------------------------------------------------------------------------------
// Connection strings
// ---------------------------------------------------------------------------------------

/// `Endpoint=sb://{host}/;SharedAccessKeyName={name};SharedAccessKey={key}[;EntityPath={queue}]`
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionString {
    /// The namespace's host, lower case, e.g. `myns.servicebus.windows.net`.
    pub host: String,
    pub key_name: String,
    key: String,
    /// Set when the key belongs to one queue rather than the namespace.
    pub entity_path: Option<String>,
}

/// Why a connection string was refused. No message ever contains the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionStringError {
    #[error("every part must be Name=value separated by ';'")]
    NotNameValue,
    /// `Endpoint=...,SharedAccessKeyName=...,SharedAccessKey=...`: one long Endpoint value
    /// holding the key, which must not be echoed back.
    #[error("parts must be separated by ';', not ','")]
    CommaSeparated,
    #[error("{0} appears twice")]
    Duplicate(&'static str),
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("Endpoint must look like sb://<namespace>.servicebus.windows.net/ (got {0:?})")]
    BadEndpoint(String),
    #[error("SharedAccessSignature connection strings are not supported; use SharedAccessKeyName and SharedAccessKey")]
    PresignedToken,
}

impl ConnectionString {
    pub fn parse(raw: &str) -> Result<Self, ConnectionStringError> {
        let mut endpoint = None;
        let mut key_name = None;
        let mut key = None;
        let mut entity_path = None;
        for part in raw.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or(ConnectionStringError::NotNameValue)?;
            let (slot, field) = match name.trim().to_ascii_lowercase().as_str() {
                "endpoint" => (&mut endpoint, "Endpoint"),
                "sharedaccesskeyname" => (&mut key_name, "SharedAccessKeyName"),
                "sharedaccesskey" => (&mut key, "SharedAccessKey"),
                "entitypath" => (&mut entity_path, "EntityPath"),
                "sharedaccesssignature" => return Err(ConnectionStringError::PresignedToken),
                // TransportType, UseDevelopmentEmulator, ...: nothing the REST client uses.
                _ => continue,
            };
            if value.contains(',') {
                return Err(ConnectionStringError::CommaSeparated);
            }
            if slot.replace(value.trim().to_owned()).is_some() {
                return Err(ConnectionStringError::Duplicate(field));
            }
        }
        let endpoint = endpoint
            .filter(|e| !e.is_empty())
            .ok_or(ConnectionStringError::Missing("Endpoint"))?;
        let host = endpoint_host(&endpoint)
            .ok_or_else(|| ConnectionStringError::BadEndpoint(shown_endpoint(&endpoint)))?;
        let key_name = key_name
            .filter(|k| !k.is_empty())
            .ok_or(ConnectionStringError::Missing("SharedAccessKeyName"))?;
        let key = key
            .filter(|k| !k.is_empty())
            .ok_or(ConnectionStringError::Missing("SharedAccessKey"))?;
        let entity_path = entity_path
            // `/orders/`, ` / orders`: neither slashes nor spaces are part of a queue name.
            .map(|p| {
                p.trim_matches(|c: char| c == '/' || c.is_whitespace())
                    .to_owned()
            })
            .filter(|p| !p.is_empty());
        Ok(Self {
            host,
            key_name,
            key,
            entity_path,
        })
    }
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionString")
            .field("host", &self.host)
            .field("key_name", &self.key_name)
            .field("key", &"..")
            .field("entity_path", &self.entity_path)
            .finish()
    }
}

/// What [`ConnectionStringError::BadEndpoint`] says instead of an Endpoint value that
/// may hold the key.
pub const ENDPOINT_NOT_SHOWN: &str = "a value that holds more than an endpoint; not shown";

/// An Endpoint value fit to print: one holding `=` or spaces has swallowed other parts
/// (perhaps the key), so it is not shown.
fn shown_endpoint(endpoint: &str) -> String {
    if endpoint.contains('=') || endpoint.contains(char::is_whitespace) {
        ENDPOINT_NOT_SHOWN.to_owned()
    } else {
        endpoint.to_owned()
    }
}

/// `sb://host/` → `host` (lower case); `None` for anything else.
fn endpoint_host(endpoint: &str) -> Option<String> {
    let scheme_end = endpoint.find("://")?;
    if !endpoint[..scheme_end].eq_ignore_ascii_case("sb") {
        return None;
    }
    let rest = &endpoint[scheme_end + 3..];
    let host = rest.strip_suffix('/').unwrap_or(rest);
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    valid.then(|| host.to_ascii_lowercase())
}

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
    key: String,
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
            // A clock that went backwards also renews: the expiry is from the old clock.
            let age = now.duration_since(cached.issued_at).ok();
            if age.is_some_and(|age| age < SAS_RENEW_AFTER) {
                return cached.header.clone();
            }
        }
        let expiry = now
            .checked_add(SAS_LIFETIME)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let header = sas_token(&self.resource(queue), &self.key_name, &self.key, expiry);
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
// Entra ID
// ---------------------------------------------------------------------------------------

/// Tries credential sources in order; the first that gives a token is used from then on
/// (the shape of the other Azure SDKs' `DefaultAzureCredential`, which `azure_identity`
/// 1.0 leaves to the application).
pub struct CredentialChain {
    sources: Vec<(&'static str, Arc<dyn TokenCredential>)>,
    chosen: AtomicUsize,
}

const NONE_CHOSEN: usize = usize::MAX;

impl CredentialChain {
    pub fn new(sources: Vec<(&'static str, Arc<dyn TokenCredential>)>) -> Self {
        Self {
            sources,
            chosen: AtomicUsize::new(NONE_CHOSEN),
        }
    }

    /// Workload identity (when its environment is set, e.g. on AKS), then managed
    /// identity (`user_assigned_client_id` picks a user-assigned one), then the developer
    /// tools (Azure CLI, Azure Developer CLI). Nothing here touches the network.
    pub fn from_environment(user_assigned_client_id: Option<&str>) -> Result<Self, String> {
        use azure_identity::{
            DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
            UserAssignedId, WorkloadIdentityCredential,
        };
        // The credentials build azure_core's reqwest client, which needs the provider.
        crate::tls::install_ring();
        let mut sources: Vec<(&'static str, Arc<dyn TokenCredential>)> = Vec::new();
        // Only built when AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_FEDERATED_TOKEN_FILE
        // are set; otherwise it is simply not a candidate.
        if let Ok(workload) = WorkloadIdentityCredential::new(None) {
            sources.push(("workload identity", workload));
        }
        let managed = ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions {
            user_assigned_id: user_assigned_client_id.map(|id| UserAssignedId::ClientId(id.into())),
            ..Default::default()
        }))
        .map_err(|e| format!("managed identity: {e}"))?;
        sources.push(("managed identity", managed));
        let developer =
            DeveloperToolsCredential::new(None).map_err(|e| format!("developer tools: {e}"))?;
        sources.push(("developer tools (Azure CLI)", developer));
        Ok(Self::new(sources))
    }

    async fn token(&self) -> Result<azure_core::credentials::AccessToken, String> {
        let chosen = self.chosen.load(Ordering::Relaxed);
        if let Some((name, source)) = self.sources.get(chosen) {
            // Bounded like the first pass: a hung identity endpoint must not hold the one
            // refresh in flight (and with it every send) for ever.
            return match tokio::time::timeout(
                ENTRA_SOURCE_BUDGET,
                source.get_token(&[ENTRA_SCOPE], None),
            )
            .await
            {
                Ok(result) => result.map_err(|e| format!("{name}: {e}")),
                Err(_) => Err(format!("{name}: no answer in {ENTRA_SOURCE_BUDGET:?}")),
            };
        }
        let mut errors = Vec::new();
        for (index, (name, source)) in self.sources.iter().enumerate() {
            match tokio::time::timeout(ENTRA_SOURCE_BUDGET, source.get_token(&[ENTRA_SCOPE], None))
                .await
            {
                Ok(Ok(token)) => {
                    self.chosen.store(index, Ordering::Relaxed);
                    tracing::info!(
                        event = "servicebus_entra_source",
                        source = name,
                        "Entra ID tokens come from {name}"
                    );
                    return Ok(token);
                }
                Ok(Err(e)) => errors.push(format!("{name}: {e}")),
                Err(_) => errors.push(format!("{name}: no answer in {ENTRA_SOURCE_BUDGET:?}")),
            }
        }
        Err(format!(
            "no Entra ID credential gave a token ({})",
            errors.join("; ")
        ))
    }
}

#[derive(Clone)]
struct CachedBearer {
    header: String,
    expires_on: OffsetDateTime,
}

type Refresh = Shared<BoxFuture<'static, Result<CachedBearer, String>>>;

#[derive(Default)]
struct EntraState {
    token: Option<CachedBearer>,
    refreshing: Option<Refresh>,
    /// The last fetch failed: its error, answered without a new fetch until `until`.
    failed: Option<FailedFetch>,
    /// Fetches failed in a row (for the pause's doubling).
    failures_in_a_row: u32,
}

#[derive(Clone)]
struct FailedFetch {
    error: String,
    until: Instant,
}

/// How long a failed fetch is answered from the cache: failure number `n` in a row
/// (counting from 1) waits 5 s × 2^(n−1), at most 30 s, times `unit` in [0.8, 1.0]
/// (`unit` is random in production: jitter).
fn failure_pause(n: u32, unit: f64) -> Duration {
    let doubled = ENTRA_FAILURE_PAUSE_FIRST
        .saturating_mul(1u32 << n.saturating_sub(1).min(8))
        .min(ENTRA_FAILURE_PAUSE_MAX);
    doubled.mul_f64(0.8 + 0.2 * unit.clamp(0.0, 1.0))
}

/// Bearer tokens from a [`CredentialChain`], cached, refreshed by one task at a time.
pub struct EntraCredential {
    chain: Arc<CredentialChain>,
    state: Arc<Mutex<EntraState>>,
}

impl EntraCredential {
    pub fn new(chain: CredentialChain) -> Self {
        Self {
            chain: Arc::new(chain),
            state: Arc::default(),
        }
    }

    pub async fn authorization(&self, deadline: Instant) -> Result<String, TokenError> {
        let now = OffsetDateTime::now_utc();
        let (cached, refresh) = {
            let mut state = self.state.lock();
            if let Some(token) = &state.token {
                if token.expires_on - now > ENTRA_REFRESH_BEFORE {
                    return Ok(token.header.clone());
                }
            }
            let usable = state.token.clone().filter(|t| t.expires_on > now);
            if let Some(failed) = state.failed.clone().filter(|f| Instant::now() < f.until) {
                // Entra ID failed a moment ago: do not ask again for every send.
                return usable
                    .map(|t| t.header)
                    .ok_or(TokenError::Unavailable(failed.error));
            }
            (state.token.clone(), self.refresh(&mut state))
        };
        // Still valid, though due for renewal: good enough if the refresh fails or is slow.
        let usable = cached.filter(|t| t.expires_on > now).map(|t| t.header);
        match tokio::time::timeout_at(deadline, refresh).await {
            Ok(Ok(token)) => Ok(token.header),
            Ok(Err(e)) => usable.ok_or(TokenError::Unavailable(e)),
            Err(_) => usable.ok_or(TokenError::Timeout),
        }
    }

    /// The refresh in flight, or a new one run as its own task.
    fn refresh(&self, state: &mut EntraState) -> Refresh {
        if let Some(refresh) = &state.refreshing {
            return refresh.clone();
        }
        let chain = self.chain.clone();
        let shared_state = self.state.clone();
        let task = tokio::spawn(async move {
            let result = chain.token().await.map(|t| CachedBearer {
                header: format!("Bearer {}", t.token.secret()),
                expires_on: t.expires_on,
            });
            let mut state = shared_state.lock();
            state.refreshing = None;
            match &result {
                Ok(token) => {
                    state.token = Some(token.clone());
                    state.failed = None;
                    state.failures_in_a_row = 0;
                }
                Err(e) => {
                    state.failures_in_a_row = state.failures_in_a_row.saturating_add(1);
                    let pause = failure_pause(state.failures_in_a_row, rand::random());
                    state.failed = Some(FailedFetch {
                        error: e.clone(),
                        until: Instant::now() + pause,
                    });
                    tracing::warn!(event = "servicebus_entra_failed", error = %e, retry_in_s = pause.as_secs_f64(), "could not get an Entra ID token")
                }
            }
            result
        });
        let cleanup = self.state.clone();
        let refresh = async move {
            task.await.unwrap_or_else(|e| {
                // The task died before clearing its slot: clear it, so the next call retries.
                cleanup.lock().refreshing = None;
                Err(format!("the token refresh stopped: {e}"))
            })
        }
        .boxed()
        .shared();
        state.refreshing = Some(refresh.clone());
        refresh
    }
}

// ---------------------------------------------------------------------------------------
// Either
// ---------------------------------------------------------------------------------------

pub enum Credential {
    Sas(SasCredential),
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
            Self::Entra(entra) => entra.authorization(deadline).await,
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
    use std::sync::atomic::{AtomicBool, AtomicU32};

    const SEND: &str = "Endpoint=sb://test.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0LWtleS0xMjM0NTY3ODkw";

    fn queue(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    /// The Entra ID chain is built from azure_identity with default features off: it must
    /// still get its HTTP client (azure_core's reqwest, rustls with our ring provider: run
    /// alone, this panics in reqwest if from_environment does not install it) and the
    /// managed identity and Azure CLI sources, without touching the network.
    #[test]
    fn the_entra_chain_builds_with_the_trimmed_azure_features() {
        let chain = CredentialChain::from_environment(Some("00000000-0000-0000-0000-000000000001"))
            .expect("the chain builds");
        let names: Vec<&str> = chain.sources.iter().map(|(name, _)| *name).collect();
        assert!(
            names.ends_with(&["managed identity", "developer tools (Azure CLI)"]),
            "{names:?}"
        );
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
    fn a_connection_string_parses_with_or_without_entity_path() {
        let c = ConnectionString::parse(SEND).unwrap();
        assert_eq!(c.host, "test.servicebus.windows.net");
        assert_eq!(c.key_name, "send");
        assert_eq!(c.key, "c2VjcmV0LWtleS0xMjM0NTY3ODkw");
        assert_eq!(c.entity_path, None);

        // Names in any case, spaces around parts, a key ending in '=', extra parts.
        let c = ConnectionString::parse(
            " endpoint=SB://MyNs.servicebus.windows.net ; sharedaccesskeyname=k;SharedAccessKey=abc==;EntityPath=orders;TransportType=Amqp;",
        )
        .unwrap();
        assert_eq!(c.host, "myns.servicebus.windows.net");
        assert_eq!(c.key, "abc==");
        assert_eq!(c.entity_path.as_deref(), Some("orders"));
    }

    #[test]
    fn an_entity_path_is_trimmed_of_spaces_inside_its_slashes_too() {
        // Found by the connection_string fuzz target: "/ orders" kept its space, so the
        // parsed value did not survive being written back (and named no queue).
        for raw in ["/ orders", "orders /", " / orders / "] {
            let c = ConnectionString::parse(&format!(
                "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=x;EntityPath={raw}"
            ))
            .unwrap();
            assert_eq!(c.entity_path.as_deref(), Some("orders"), "{raw:?}");
        }
        let c = ConnectionString::parse(
            "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=x;EntityPath= / ",
        )
        .unwrap();
        assert_eq!(c.entity_path, None);
    }

    #[test]
    fn malformed_connection_strings_are_refused_without_echoing_the_key() {
        let key = "TopSecretKeyValue";
        let cases = [
            (
                format!("SharedAccessKeyName=send;SharedAccessKey={key}"),
                ConnectionStringError::Missing("Endpoint"),
            ),
            (
                format!("Endpoint=sb://x.servicebus.windows.net/;SharedAccessKey={key}"),
                ConnectionStringError::Missing("SharedAccessKeyName"),
            ),
            (
                "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=send".into(),
                ConnectionStringError::Missing("SharedAccessKey"),
            ),
            (
                format!("Endpoint=https://x.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={key}"),
                ConnectionStringError::BadEndpoint("https://x.servicebus.windows.net/".into()),
            ),
            (
                format!("Endpoint=sb://;SharedAccessKeyName=send;SharedAccessKey={key}"),
                ConnectionStringError::BadEndpoint("sb://".into()),
            ),
            (
                format!("Endpoint=sb://x/;SharedAccessKeyName=send;{key}"),
                ConnectionStringError::NotNameValue,
            ),
            (
                format!("Endpoint=sb://x/;SharedAccessKeyName=a;SharedAccessKeyName=b;SharedAccessKey={key}"),
                ConnectionStringError::Duplicate("SharedAccessKeyName"),
            ),
            (
                format!("Endpoint=sb://x/;SharedAccessSignature=SharedAccessSignature sr=a&sig={key}"),
                ConnectionStringError::PresignedToken,
            ),
            (key.to_owned(), ConnectionStringError::NotNameValue),
            (
                format!("Endpoint=sb://x.servicebus.windows.net/,SharedAccessKeyName=send,SharedAccessKey={key}"),
                ConnectionStringError::CommaSeparated,
            ),
            (
                format!("SharedAccessKeyName=send,SharedAccessKey={key};Endpoint=sb://x/"),
                ConnectionStringError::CommaSeparated,
            ),
            (
                format!("Endpoint=sb://x.servicebus.windows.net/ SharedAccessKey={key}"),
                ConnectionStringError::BadEndpoint(
                    "a value that holds more than an endpoint; not shown".into(),
                ),
            ),
        ];
        for (raw, expected) in cases {
            let err = ConnectionString::parse(&raw).unwrap_err();
            assert_eq!(err, expected, "{raw}");
            assert!(!err.to_string().contains(key), "{err}");
        }
        let parsed = ConnectionString::parse(SEND).unwrap();
        assert!(!format!("{parsed:?}").contains("c2VjcmV0"));
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
        // A clock that went backwards gets a fresh token too.
        assert_ne!(
            sas.authorization_at(&q, t0 - Duration::from_secs(60)),
            renewed
        );
        // Each queue has its own token, signed for its own URL.
        let other = sas.authorization_at(&queue("other"), t0);
        assert!(other.contains("sr=https%3A%2F%2Ftest.servicebus.windows.net%2Fother&"));
    }

    /// A credential that hands out numbered tokens after a delay, or fails.
    #[derive(Debug)]
    struct FakeCredential {
        calls: AtomicU32,
        fail: AtomicBool,
        delay: Duration,
        lifetime: Duration,
    }

    impl FakeCredential {
        fn new(fail: bool, delay: Duration, lifetime: Duration) -> Arc<Self> {
            Arc::new(Self {
                calls: AtomicU32::new(0),
                fail: AtomicBool::new(fail),
                delay,
                lifetime,
            })
        }
        fn calls(&self) -> u32 {
            self.calls.load(Ordering::SeqCst)
        }
        fn start_failing(&self) {
            self.fail.store(true, Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl TokenCredential for FakeCredential {
        async fn get_token(
            &self,
            scopes: &[&str],
            _: Option<azure_core::credentials::TokenRequestOptions<'_>>,
        ) -> azure_core::Result<azure_core::credentials::AccessToken> {
            assert_eq!(scopes, [ENTRA_SCOPE]);
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(self.delay).await;
            if self.fail.load(Ordering::SeqCst) {
                return Err(azure_core::Error::with_message(
                    azure_core::error::ErrorKind::Credential,
                    "not here",
                ));
            }
            Ok(azure_core::credentials::AccessToken::new(
                format!("token-{n}"),
                OffsetDateTime::now_utc() + self.lifetime,
            ))
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn the_first_source_that_works_is_kept() {
        let broken = FakeCredential::new(true, Duration::ZERO, Duration::ZERO);
        let working = FakeCredential::new(false, Duration::ZERO, Duration::from_secs(3600));
        let entra = EntraCredential::new(CredentialChain::new(vec![
            ("broken", broken.clone()),
            ("working", working.clone()),
        ]));
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-1");
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-1");
        assert_eq!((broken.calls(), working.calls()), (1, 1), "cached");
    }

    #[tokio::test]
    async fn a_token_near_its_expiry_is_refreshed_and_the_chain_not_retried() {
        let broken = FakeCredential::new(true, Duration::ZERO, Duration::ZERO);
        // Four minutes: inside the five-minute refresh window from the start.
        let short = FakeCredential::new(false, Duration::ZERO, Duration::from_secs(240));
        let entra = EntraCredential::new(CredentialChain::new(vec![
            ("broken", broken.clone()),
            ("short", short.clone()),
        ]));
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-1");
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-2");
        assert_eq!(broken.calls(), 1, "the chosen source is asked directly");
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_refresh() {
        let slow = FakeCredential::new(false, Duration::from_millis(50), Duration::from_secs(3600));
        let entra = Arc::new(EntraCredential::new(CredentialChain::new(vec![(
            "slow",
            slow.clone(),
        )])));
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let entra = entra.clone();
                tokio::spawn(async move { entra.authorization(far()).await })
            })
            .collect();
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap(), "Bearer token-1");
        }
        assert_eq!(slow.calls(), 1);
    }

    #[tokio::test]
    async fn a_deadline_does_not_cancel_the_refresh() {
        let slow =
            FakeCredential::new(false, Duration::from_millis(200), Duration::from_secs(3600));
        let entra = EntraCredential::new(CredentialChain::new(vec![("slow", slow.clone())]));
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(entra.authorization(soon).await, Err(TokenError::Timeout));
        // The refresh went on; the next caller gets its token without a second fetch.
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-1");
        assert_eq!(slow.calls(), 1);
    }

    #[tokio::test]
    async fn no_working_source_is_an_error_naming_each() {
        let a = FakeCredential::new(true, Duration::ZERO, Duration::ZERO);
        let entra = EntraCredential::new(CredentialChain::new(vec![("first", a.clone())]));
        match entra.authorization(far()).await {
            Err(TokenError::Unavailable(e)) => assert!(e.contains("first: "), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_fetch_is_answered_from_the_cache_for_its_pause_then_retried() {
        let a = FakeCredential::new(true, Duration::ZERO, Duration::ZERO);
        let entra = EntraCredential::new(CredentialChain::new(vec![("first", a.clone())]));
        assert!(entra.authorization(far()).await.is_err());
        assert_eq!(a.calls(), 1);
        // Every send in the next seconds gets the same answer without asking Entra ID.
        for _ in 0..100 {
            match entra.authorization(far()).await {
                Err(TokenError::Unavailable(e)) => assert!(e.contains("first: "), "{e}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(a.calls(), 1, "the failure is cached");
        // The first pause is 4 to 5 s: after it, one new fetch (which fails again).
        tokio::time::advance(Duration::from_millis(5_001)).await;
        assert!(entra.authorization(far()).await.is_err());
        assert_eq!(a.calls(), 2, "a failed refresh does not stick for ever");
        // The second failure in a row pauses longer (8 to 10 s).
        tokio::time::advance(Duration::from_millis(5_001)).await;
        assert!(entra.authorization(far()).await.is_err());
        assert_eq!(a.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_still_valid_is_used_through_a_failure_pause() {
        // Four minutes: valid, but inside the five-minute renewal window.
        let short = FakeCredential::new(false, Duration::ZERO, Duration::from_secs(240));
        let entra = EntraCredential::new(CredentialChain::new(vec![("short", short.clone())]));
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-1");
        short.start_failing();
        // The renewal fails: the old token still serves, and keeps serving in the pause.
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-1");
        assert_eq!(short.calls(), 2);
        assert_eq!(entra.authorization(far()).await.unwrap(), "Bearer token-1");
        assert_eq!(short.calls(), 2, "no new fetch during the pause");
    }

    #[test]
    fn the_failure_pause_doubles_to_thirty_seconds_with_jitter_below() {
        let s = Duration::from_secs;
        assert_eq!(failure_pause(1, 1.0), s(5));
        assert_eq!(failure_pause(2, 1.0), s(10));
        assert_eq!(failure_pause(3, 1.0), s(20));
        assert_eq!(failure_pause(4, 1.0), s(30));
        assert_eq!(failure_pause(u32::MAX, 1.0), s(30));
        assert_eq!(failure_pause(1, 0.0), s(4));
        assert_eq!(failure_pause(4, 0.0), s(24));
        assert_eq!(failure_pause(0, 1.0), s(5), "never below the first pause");
        assert_eq!(failure_pause(1, 7.0), s(5), "the unit is clamped");
    }
}
