//! The directory's signing keys: discovery (`{authority}/{tenant}/v2.0/.well-known/
//! openid-configuration`: the v2 issuer and the `jwks_uri`), then the JWKS, kept in memory.
//!
//! The rules (contract section 5), all on tokio's clock:
//! - one fetch at a time (single flight): every caller that needs one joins the fetch in
//!   flight; the fetch runs in a task of its own, so a caller that gives up (its client
//!   gone, its wait over) does not cancel it for the others;
//! - a token whose `kid` is not in the set starts a fetch at most once per
//!   [`ON_DEMAND_EVERY`] (a storm of made-up `kid`s costs the directory one request);
//! - a background task fetches every [`REFRESH_EVERY`] (discovery and JWKS), and after a
//!   failure retries from 1 s, doubling, up to [`RETRY_MAX`] (so a directory unreachable
//!   at start-up is retried until it answers; until then every token is refused); a
//!   token's fetch in flight when the timer fires does not stand for the timer's, which
//!   follows it (a token's reads only the JWKS, and the `jwks_uri` can move);
//! - a token's fetch reads the JWKS where discovery last said it is, and discovery again
//!   only when that fails (it may have moved), or while none has succeeded;
//! - a failed fetch keeps the keys in hand: a directory that is down does not stop
//!   callers whose keys are known, and an unknown `kid` is then refused, never let pass;
//! - a fetch that succeeds replaces the set: a key the directory removed is gone.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use jsonwebtoken::DecodingKey;
use parking_lot::Mutex;
use sendgate_backoff::Doubling;
use serde::Deserialize;
use tokio::time::Instant;

/// An unknown `kid` starts a fetch at most this often.
pub const ON_DEMAND_EVERY: Duration = Duration::from_secs(30);
/// The keys are fetched again this often, whatever the tokens say.
pub const REFRESH_EVERY: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest pause between two attempts while fetches fail.
pub const RETRY_MAX: Duration = Duration::from_secs(5 * 60);
/// The longest a request waits for a fetch it joined before it is answered without it.
pub const REQUEST_WAIT: Duration = Duration::from_secs(5);
/// One GET's deadline (connect, headers and body).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest discovery document or JWKS read (Entra's JWKS is a few KiB): a larger one is
/// refused, by its `Content-Length` before any of it is read, else once this much arrived.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// The most keys kept from one JWKS.
pub const MAX_KEYS: usize = 64;

/// Why a GET brought no document. Each names the URL (public: no secret in it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("GET {url}: no complete answer within {limit:?}")]
    Timeout { url: String, limit: Duration },
    #[error("GET {url}: {detail}")]
    Transport { url: String, detail: String },
    /// Any status but `200`, a redirect included: it is not followed.
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: more than {limit} bytes")]
    TooLarge { url: String, limit: usize },
}

/// Why a fetch brought no keys to use (logged; the keys in hand are kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("the discovery document does not parse: {0}")]
    DiscoveryUnparsable(String),
    #[error("the discovery document's issuer {issuer:?} is not of tenant {tenant}")]
    ForeignIssuer { issuer: String, tenant: String },
    #[error("the discovery document's jwks_uri {0:?} is not https")]
    InsecureJwksUri(String),
    #[error("the JWKS does not parse: {0}")]
    JwksUnparsable(String),
    #[error("the JWKS has no RSA signing key with a kid")]
    NoSigningKey,
}

/// A GET of a document: the production one is [`HttpFetch`]; the unit tests script one.
#[async_trait::async_trait]
pub trait Fetch: Send + Sync {
    /// The body of a `200` answer to `url`, or why not.
    async fn get(&self, url: &str) -> Result<Vec<u8>, FetchError>;
}

/// GETs through reqwest on rustls with ring (`crate::tls`), each under [`FETCH_TIMEOUT`]
/// (reqwest's own deadline, and tokio's around the whole GET: a fetch is the one in flight
/// for every token that waits on it, so no way of hanging may outlive the deadline), at
/// most [`MAX_DOCUMENT_BYTES`] read, no redirect followed.
pub struct HttpFetch {
    client: reqwest::Client,
}

impl HttpFetch {
    pub fn new() -> Result<Self, String> {
        crate::tls::install_ring();
        let client = reqwest::Client::builder()
            .connect_timeout(FETCH_TIMEOUT)
            .timeout(FETCH_TIMEOUT)
            // The directory's documents are where discovery says; a redirect is not followed.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self { client })
    }
}

#[async_trait::async_trait]
impl Fetch for HttpFetch {
    async fn get(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        tokio::time::timeout(FETCH_TIMEOUT, self.get_within(url))
            .await
            .unwrap_or_else(|_| {
                Err(FetchError::Timeout {
                    url: url.to_owned(),
                    limit: FETCH_TIMEOUT,
                })
            })
    }
}

impl HttpFetch {
    async fn get_within(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                FetchError::Timeout {
                    url: url.to_owned(),
                    limit: FETCH_TIMEOUT,
                }
            } else {
                FetchError::Transport {
                    url: url.to_owned(),
                    detail: without_url(&e),
                }
            }
        };
        let too_large = || FetchError::TooLarge {
            url: url.to_owned(),
            limit: MAX_DOCUMENT_BYTES,
        };
        let mut response = self
            .client
            .get(url)
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(transport)?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(FetchError::Status {
                url: url.to_owned(),
                status: response.status().as_u16(),
            });
        }
        // A declared length past the limit is refused before a byte of it is read.
        if response
            .content_length()
            .is_some_and(|n| n > MAX_DOCUMENT_BYTES as u64)
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// reqwest's error without the URL it repeats (already in the message).
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "no answer in time"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "failed"
    };
    let mut detail = String::from(kind);
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        detail.push_str(": ");
        detail.push_str(&cause.to_string());
        source = cause.source();
    }
    detail
}

/// What discovery says: whose v2 tokens, and where the keys are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    pub issuer: String,
    pub jwks_uri: String,
}

/// The keys in hand: by `kid`, from one JWKS, with the discovery it came through.
pub struct KeySet {
    pub discovery: Discovery,
    keys: HashMap<String, Arc<DecodingKey>>,
    pub fetched_at: Instant,
}

impl KeySet {
    pub fn key(&self, kid: &str) -> Option<Arc<DecodingKey>> {
        self.keys.get(kid).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

/// Why a key was not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// No keys yet: discovery or the first JWKS has not succeeded.
    NoKeys,
    /// Keys in hand, none with this `kid` (after a fetch, or with fetches paused).
    UnknownKid,
}

/// Which fetch: the timer's reads discovery again, a token's only the JWKS (discovery too
/// while none has succeeded, or when the JWKS is not where discovery said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Timer,
    UnknownKid,
}

type InFlight = Shared<BoxFuture<'static, bool>>;

/// The fetch in flight, and whether it reads discovery first (the timer's must).
struct Fetching {
    fetch: InFlight,
    discovers: bool,
}

#[derive(Default)]
struct Refreshing {
    in_flight: Option<Fetching>,
    /// When a token's unknown `kid` last started a fetch.
    last_on_demand: Option<Instant>,
}

/// The cache: one per gateway, shared by every worker.
pub struct KeyCache {
    fetch: Arc<dyn Fetch>,
    discovery_url: String,
    /// Discovery's issuer must name it.
    tenant: String,
    /// A `jwks_uri` may be `http` only when the authority is (a loopback stub).
    plain_http_allowed: bool,
    current: ArcSwapOption<KeySet>,
    refreshing: Mutex<Refreshing>,
    /// Where fetches run: the runtime the cache was made on (the gateway's main one), not
    /// the HTTP worker whose request needed the fetch (its runtime ends with the worker).
    runtime: Option<tokio::runtime::Handle>,
}

impl KeyCache {
    pub fn new(fetch: Arc<dyn Fetch>, discovery_url: String, tenant: &str) -> Arc<Self> {
        Arc::new(Self {
            plain_http_allowed: discovery_url.starts_with("http://"),
            fetch,
            discovery_url,
            tenant: tenant.to_owned(),
            current: ArcSwapOption::empty(),
            refreshing: Mutex::new(Refreshing::default()),
            runtime: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// Start the background task: the first fetch now, then every [`REFRESH_EVERY`], with
    /// retries after a failure. It holds the cache weakly and ends once the cache is gone.
    pub fn keep_fresh(self: &Arc<Self>) {
        tokio::spawn(keep_fresh(Arc::downgrade(self)));
    }

    /// `{authority}/{tenant}/v2.0/.well-known/openid-configuration`.
    pub fn discovery_url(&self) -> &str {
        &self.discovery_url
    }

    /// The keys in hand, if any.
    pub fn current(&self) -> Option<Arc<KeySet>> {
        self.current.load_full()
    }

    /// The key of `kid` with the discovery it came with; when it is not in hand, one
    /// fetch (joined if one is in flight, started if none started for a token in the last
    /// [`ON_DEMAND_EVERY`]), waited for at most [`REQUEST_WAIT`].
    pub async fn key(
        self: &Arc<Self>,
        kid: &str,
    ) -> Result<(Arc<DecodingKey>, Arc<KeySet>), Missing> {
        if let Some(found) = self.lookup(kid) {
            return Ok(found);
        }
        let joined = {
            let mut refreshing = self.refreshing.lock();
            match &refreshing.in_flight {
                Some(fetching) => Some(fetching.fetch.clone()),
                None => {
                    let now = Instant::now();
                    let paused = refreshing
                        .last_on_demand
                        .is_some_and(|at| now.duration_since(at) < ON_DEMAND_EVERY);
                    if paused {
                        None
                    } else {
                        refreshing.last_on_demand = Some(now);
                        Some(self.start(&mut refreshing, Why::UnknownKid))
                    }
                }
            }
        };
        if let Some(fetch) = joined {
            // Past the wait the fetch goes on in its own task; this request is answered.
            let _ = tokio::time::timeout(REQUEST_WAIT, fetch).await;
        }
        self.lookup(kid).ok_or_else(|| self.missing())
    }

    fn lookup(&self, kid: &str) -> Option<(Arc<DecodingKey>, Arc<KeySet>)> {
        let set = self.current.load_full()?;
        set.key(kid).map(|key| (key, set))
    }

    fn missing(&self) -> Missing {
        match self.current.load().as_ref() {
            Some(_) => Missing::UnknownKid,
            None => Missing::NoKeys,
        }
    }

    /// The timer's: the fetch in flight and whether it reads discovery, or a new one that
    /// does.
    fn refresh(self: &Arc<Self>) -> (InFlight, bool) {
        let mut refreshing = self.refreshing.lock();
        match &refreshing.in_flight {
            Some(fetching) => (fetching.fetch.clone(), fetching.discovers),
            None => (self.start(&mut refreshing, Why::Timer), true),
        }
    }

    /// A fetch in a task of its own, recorded as the one in flight (the lock is held, so
    /// the task cannot clear it before it is recorded). The task clears it when it ends,
    /// or is dropped unfinished (its runtime shutting down): a fetch that never finishes
    /// must not stand for the one in flight for ever.
    fn start(self: &Arc<Self>, refreshing: &mut Refreshing, why: Why) -> InFlight {
        // Read here, under the lock, so what is recorded is what the task does (no other
        // fetch can change the keys in hand before it runs: this one is the only one).
        let known = match why {
            Why::Timer => None,
            Why::UnknownKid => self
                .current
                .load()
                .as_ref()
                .map(|set| set.discovery.clone()),
        };
        let discovers = known.is_none();
        let this = Arc::clone(self);
        let fetching = async move {
            let _done = NoneInFlight(Arc::clone(&this));
            this.fetch_now(why, known).await
        };
        let task = match &self.runtime {
            Some(runtime) => runtime.spawn(fetching),
            None => tokio::spawn(fetching),
        };
        let fetch = async move { task.await.unwrap_or(false) }.boxed().shared();
        refreshing.in_flight = Some(Fetching {
            fetch: fetch.clone(),
            discovers,
        });
        fetch
    }

    /// Discovery (unless `known` is given: a token's fetch with keys in hand) and the JWKS;
    /// the keys in hand are replaced only by a set that parsed, and kept on any failure.
    async fn fetch_now(&self, why: Why, known: Option<Discovery>) -> bool {
        let result = match known {
            None => match self.discover().await {
                Ok(discovery) => self.jwks(discovery).await,
                Err(e) => Err(e),
            },
            Some(known) => match self.jwks(known.clone()).await {
                Ok(set) => Ok(set),
                // Not where discovery said: it may have moved. Ask discovery, and the new
                // place if it names one (the same place just failed: not asked twice).
                Err(failed) => match self.discover().await {
                    Ok(discovery) if discovery.jwks_uri != known.jwks_uri => {
                        self.jwks(discovery).await
                    }
                    Ok(_) => Err(failed),
                    Err(e) => Err(e),
                },
            },
        };
        match result {
            Ok(set) => {
                let kids: Vec<&str> = set.keys.keys().map(String::as_str).collect();
                tracing::info!(
                    event = "entra_keys_refreshed",
                    keys = set.keys.len(),
                    kids = ?kids,
                    issuer = %set.discovery.issuer,
                    by = match why { Why::Timer => "timer", Why::UnknownKid => "unknown kid" },
                    "Entra ID signing keys fetched"
                );
                self.current.store(Some(Arc::new(set)));
                true
            }
            Err(reason) => {
                let kept = self.current.load().as_ref().map_or(0, |set| set.len());
                tracing::warn!(
                    event = "entra_keys_refresh_failed",
                    reason = %reason,
                    kept,
                    "Entra ID signing keys could not be fetched; the keys in hand are kept ({kept}), tokens signed by others are refused"
                );
                false
            }
        }
    }

    async fn jwks(&self, discovery: Discovery) -> Result<KeySet, KeysError> {
        let body = self.fetch.get(&discovery.jwks_uri).await?;
        Ok(KeySet {
            keys: parse_jwks(&body)?,
            discovery,
            fetched_at: Instant::now(),
        })
    }

    async fn discover(&self) -> Result<Discovery, KeysError> {
        let body = self.fetch.get(&self.discovery_url).await?;
        parse_discovery(&body, &self.tenant, self.plain_http_allowed)
    }
}

/// Clears the fetch in flight when dropped: at the end of the fetch's task, finished or not.
struct NoneInFlight(Arc<KeyCache>);

impl Drop for NoneInFlight {
    fn drop(&mut self) {
        self.0.refreshing.lock().in_flight = None;
    }
}

/// The background task: fetch, then wait [`REFRESH_EVERY`], or after a failure 1 s,
/// doubling up to [`RETRY_MAX`].
async fn keep_fresh(cache: Weak<KeyCache>) {
    let mut failures: u32 = 0;
    loop {
        let fetched = loop {
            let Some((fetch, discovers)) = cache.upgrade().map(|c| c.refresh()) else {
                return;
            };
            let fetched = fetch.await;
            // A token's fetch (the JWKS alone) was in flight: it is over, and the timer's
            // own, discovery first, starts now (the jwks_uri can move).
            if discovers {
                break fetched;
            }
        };
        let pause = if fetched {
            failures = 0;
            REFRESH_EVERY
        } else {
            failures = failures.saturating_add(1);
            retry_after(failures)
        };
        tokio::time::sleep(pause).await;
    }
}

/// 1 s after the first failure, doubling, at most [`RETRY_MAX`].
pub fn retry_after(failures: u32) -> Duration {
    const RETRY: Doubling = Doubling::new(Duration::from_secs(1), RETRY_MAX);
    RETRY.wait(failures, 0.0)
}

#[derive(Deserialize)]
struct DiscoveryDocument {
    issuer: String,
    jwks_uri: String,
}

/// The discovery document: its issuer must be the tenant's v2 issuer (a document of
/// another directory is refused), and its `jwks_uri` must be https (http only when the
/// authority is a loopback stub).
pub fn parse_discovery(
    body: &[u8],
    tenant: &str,
    plain_http_allowed: bool,
) -> Result<Discovery, KeysError> {
    let doc: DiscoveryDocument =
        serde_json::from_slice(body).map_err(|e| KeysError::DiscoveryUnparsable(e.to_string()))?;
    if !is_tenants_issuer(&doc.issuer, tenant, plain_http_allowed) {
        return Err(KeysError::ForeignIssuer {
            issuer: doc.issuer,
            tenant: tenant.to_owned(),
        });
    }
    let secure = doc.jwks_uri.starts_with("https://")
        || (plain_http_allowed && doc.jwks_uri.starts_with("http://"));
    if !secure {
        return Err(KeysError::InsecureJwksUri(doc.jwks_uri));
    }
    Ok(Discovery {
        issuer: doc.issuer,
        jwks_uri: doc.jwks_uri,
    })
}

/// Whether `issuer` is `{scheme}://{host}[/{path}]/{tenant}/v2.0`, Entra ID's v2 issuer
/// of `tenant`: the tenant is the path's segment before the last, exactly (a GUID, in any
/// case), and nothing else of the URL names it (no user, query or fragment). Containing
/// the tenant somewhere is not enough: `/{tenant}-x/`, a host `{tenant}.example` or a query
/// `?tenant={tenant}` would.
fn is_tenants_issuer(issuer: &str, tenant: &str, plain_http_allowed: bool) -> bool {
    let Ok(url) = reqwest::Url::parse(issuer) else {
        return false;
    };
    let scheme_ok = url.scheme() == "https" || (plain_http_allowed && url.scheme() == "http");
    let bare = url.host_str().is_some()
        && url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none();
    let segments: Vec<&str> = url
        .path_segments()
        .map(Iterator::collect)
        .unwrap_or_default();
    let names_tenant = matches!(
        segments.as_slice(),
        [.., segment, "v2.0"] if segment.eq_ignore_ascii_case(tenant)
    );
    scheme_ok && bare && names_tenant
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    alg: Option<String>,
    kid: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

/// The RSA signing keys of a JWKS by `kid` (at most [`MAX_KEYS`]); a key of another type
/// or use, or without a `kid`, is skipped. A set with no usable key is an error: it would
/// refuse every token, so the keys in hand are kept instead.
pub fn parse_jwks(body: &[u8]) -> Result<HashMap<String, Arc<DecodingKey>>, KeysError> {
    let jwks: Jwks =
        serde_json::from_slice(body).map_err(|e| KeysError::JwksUnparsable(e.to_string()))?;
    let mut keys = HashMap::new();
    for jwk in jwks.keys {
        let usable = jwk.kty.as_deref() == Some("RSA")
            && jwk.usage.as_deref().is_none_or(|u| u == "sig")
            && jwk.alg.as_deref().is_none_or(|a| a == "RS256");
        let (Some(kid), Some(n), Some(e)) = (jwk.kid, jwk.n, jwk.e) else {
            continue;
        };
        if !usable || kid.is_empty() || kid.len() > 256 || keys.len() == MAX_KEYS {
            continue;
        }
        if let Ok(key) = DecodingKey::from_rsa_components(&n, &e) {
            keys.insert(kid, Arc::new(key));
        }
    }
    if keys.is_empty() {
        return Err(KeysError::NoSigningKey);
    }
    Ok(keys)
}
