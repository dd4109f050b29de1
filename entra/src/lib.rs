//! Microsoft Entra ID access tokens through `azure_identity`, for whatever a sendgate
//! process calls with its identity: the server's Service Bus
//! (`https://servicebus.azure.net/.default`) and Azure Managed Redis
//! (`https://redis.azure.com/.default`), a producer's gateway (its API's scope,
//! `api://…/.default`).
//!
//! One [`EntraCredential`] per scope: a cached token, refreshed five minutes before it
//! expires by one task at a time (the refresh runs in its own task, so a caller whose
//! deadline passes does not cancel it: the next caller finds the token ready), and a failed
//! fetch answered from the cache for 5–30 s so a burst of callers does not hammer Entra ID.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use azure_core::time::OffsetDateTime;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use sendgate_backoff::{Doubling, Jitter};
use tokio::time::Instant;

/// A token is refreshed when it has less than this left.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// One credential source may take this long before the chain moves on (an IMDS endpoint
/// that does not exist off Azure can hang rather than refuse).
const SOURCE_BUDGET: Duration = Duration::from_secs(10);
/// After a failed token fetch, callers are answered from the cached failure for a while
/// instead of each one asking Entra ID again: 5 s, doubling with each failure in a row
/// up to 30 s, less up to a fifth at random so a fleet does not retry in step.
pub const FAILURE_PAUSE_FIRST: Duration = Duration::from_secs(5);
const FAILURE_PAUSE: Doubling = Doubling::new(FAILURE_PAUSE_FIRST, Duration::from_secs(30))
    .with_jitter(Jitter::Shave { percent: 20 });

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("no token before the deadline")]
    Timeout,
    #[error("{0}")]
    Unavailable(String),
}

/// Tries credential sources in order; the first that gives a token is used from then on
/// (the shape of the other Azure SDKs' `DefaultAzureCredential`, which `azure_identity`
/// 1.0 leaves to the application).
pub struct CredentialChain {
    scope: Cow<'static, str>,
    sources: Vec<(&'static str, Arc<dyn TokenCredential>)>,
    chosen: AtomicUsize,
}

const NONE_CHOSEN: usize = usize::MAX;

impl CredentialChain {
    /// Tokens for `scope` (e.g. `https://redis.azure.com/.default`) from `sources`, tried
    /// in order.
    pub fn new(
        scope: impl Into<Cow<'static, str>>,
        sources: Vec<(&'static str, Arc<dyn TokenCredential>)>,
    ) -> Self {
        Self {
            scope: scope.into(),
            sources,
            chosen: AtomicUsize::new(NONE_CHOSEN),
        }
    }

    /// Workload identity (when its environment is set, e.g. on AKS: `AZURE_TENANT_ID`,
    /// `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE`), then managed identity
    /// (`user_assigned_client_id` picks a user-assigned one; azure_identity's managed
    /// identity does not read `AZURE_CLIENT_ID`), then the developer tools (Azure CLI,
    /// Azure Developer CLI). Nothing here touches the network.
    pub fn from_environment(
        scope: impl Into<Cow<'static, str>>,
        user_assigned_client_id: Option<&str>,
    ) -> Result<Self, String> {
        use azure_identity::{
            DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
            UserAssignedId, WorkloadIdentityCredential,
        };
        // The credentials build azure_core's reqwest client, which needs the provider.
        install_ring();
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
        Ok(Self::new(scope, sources))
    }

    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The names of the sources, in the order they are tried.
    pub fn source_names(&self) -> Vec<&'static str> {
        self.sources.iter().map(|(name, _)| *name).collect()
    }

    async fn token(&self) -> Result<azure_core::credentials::AccessToken, String> {
        let scopes = [self.scope.as_ref()];
        let chosen = self.chosen.load(Ordering::Relaxed);
        if let Some((name, source)) = self.sources.get(chosen) {
            // Bounded like the first pass: a hung identity endpoint must not hold the one
            // refresh in flight (and with it every caller) for ever.
            return match tokio::time::timeout(SOURCE_BUDGET, source.get_token(&scopes, None)).await
            {
                Ok(result) => result.map_err(|e| format!("{name}: {e}")),
                Err(_) => Err(format!("{name}: no answer in {SOURCE_BUDGET:?}")),
            };
        }
        let mut errors = Vec::new();
        for (index, (name, source)) in self.sources.iter().enumerate() {
            match tokio::time::timeout(SOURCE_BUDGET, source.get_token(&scopes, None)).await {
                Ok(Ok(token)) => {
                    self.chosen.store(index, Ordering::Relaxed);
                    tracing::info!(
                        event = "entra_source",
                        scope = %self.scope,
                        source = name,
                        "Entra ID tokens for {} come from {name}",
                        self.scope
                    );
                    return Ok(token);
                }
                Ok(Err(e)) => errors.push(format!("{name}: {e}")),
                Err(_) => errors.push(format!("{name}: no answer in {SOURCE_BUDGET:?}")),
            }
        }
        Err(format!(
            "no Entra ID credential gave a token ({})",
            errors.join("; ")
        ))
    }
}

/// One access token. Its `Debug` never shows the secret.
#[derive(Clone)]
pub struct EntraToken {
    secret: Arc<str>,
    /// On the monotonic clock, converted once when the token arrived: a wall clock that
    /// jumps moves neither the refresh nor the expiry.
    expires_at: Instant,
    /// When a holder that must present a new token in time (a Redis connection's re-AUTH)
    /// asks again: [`REFRESH_BEFORE`] before the expiry, or at three quarters of a lifetime
    /// shorter than four times that.
    refresh_at: Instant,
}

impl EntraToken {
    fn new(secret: &str, lifetime: Duration, now: Instant) -> Self {
        let expires_at = now + lifetime;
        Self {
            secret: secret.into(),
            expires_at,
            refresh_at: expires_at - REFRESH_BEFORE.min(lifetime / 4),
        }
    }

    /// The secret, shared (no copy per request).
    pub fn shared_secret(&self) -> Arc<str> {
        Arc::clone(&self.secret)
    }

    pub fn secret(&self) -> &str {
        &self.secret
    }

    pub fn expires_at(&self) -> Instant {
        self.expires_at
    }

    pub fn refresh_at(&self) -> Instant {
        self.refresh_at
    }

    /// The same token (not merely the same secret fetched again).
    pub fn same_as(&self, other: &Self) -> bool {
        self.secret == other.secret && self.expires_at == other.expires_at
    }
}

impl fmt::Debug for EntraToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntraToken")
            .field("secret", &"(redacted)")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

type Refresh = Shared<BoxFuture<'static, Result<EntraToken, String>>>;

#[derive(Default)]
struct EntraState {
    token: Option<EntraToken>,
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
pub(crate) fn failure_pause(n: u32, unit: f64) -> Duration {
    FAILURE_PAUSE.wait(n, unit)
}

/// Tokens of one scope from a [`CredentialChain`], cached, refreshed by one task at a time.
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

    pub fn scope(&self) -> &str {
        &self.chain.scope
    }

    /// The cached token's secret, if any (for scrubbing it out of error texts).
    pub fn cached_secret(&self) -> Option<Arc<str>> {
        self.state.lock().token.as_ref().map(|t| t.secret.clone())
    }

    /// A token with more than [`REFRESH_BEFORE`] left from the cache, else a refresh (one
    /// for all callers) awaited until `deadline`. A token still valid though due for
    /// renewal serves while the refresh fails or is slow.
    pub async fn token(&self, deadline: Instant) -> Result<EntraToken, TokenError> {
        let now = Instant::now();
        let (cached, refresh) = {
            let mut state = self.state.lock();
            if let Some(token) = &state.token {
                if token.expires_at.saturating_duration_since(now) > REFRESH_BEFORE {
                    return Ok(token.clone());
                }
            }
            let usable = state.token.clone().filter(|t| t.expires_at > now);
            if let Some(failed) = state.failed.clone().filter(|f| now < f.until) {
                // Entra ID failed a moment ago: do not ask again for every caller.
                return usable.ok_or(TokenError::Unavailable(failed.error));
            }
            (state.token.clone(), self.refresh(&mut state))
        };
        let usable = cached.filter(|t| t.expires_at > now);
        match tokio::time::timeout_at(deadline, refresh).await {
            Ok(Ok(token)) => Ok(token),
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
            let result = chain.token().await.map(|t| {
                let lifetime = t.expires_on - OffsetDateTime::now_utc();
                let lifetime = Duration::try_from(lifetime).unwrap_or(Duration::ZERO);
                EntraToken::new(t.token.secret(), lifetime, Instant::now())
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
                    tracing::warn!(event = "entra_failed", scope = %chain.scope, error = %e, retry_in_s = pause.as_secs_f64(), "could not get an Entra ID token")
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

/// Installs ring as the process-level rustls provider unless one is installed already
/// (then that one is kept). azure_core's reqwest is built with `rustls-no-provider` (one TLS
/// stack, no aws-lc-rs) and panics building a client without one.
fn install_ring() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Err only means a provider is installed already, which is what is needed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A fake credential source for tests, this crate's and (feature `testing`) others'
/// (tests/support/entra.rs has its twin for the server's integration tests).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32};

    /// A source that hands out `token-{n}` after a delay, or fails; it refuses a scope
    /// other than `scope`.
    #[derive(Debug)]
    pub struct FakeSource {
        scope: &'static str,
        calls: AtomicU32,
        fail: AtomicBool,
        delay: Duration,
        lifetime: Duration,
    }

    impl FakeSource {
        pub fn new(
            scope: &'static str,
            fail: bool,
            delay: Duration,
            lifetime: Duration,
        ) -> Arc<Self> {
            Arc::new(Self {
                scope,
                calls: AtomicU32::new(0),
                fail: AtomicBool::new(fail),
                delay,
                lifetime,
            })
        }
        pub fn calls(&self) -> u32 {
            self.calls.load(Ordering::SeqCst)
        }
        pub fn set_failing(&self, fail: bool) {
            self.fail.store(fail, Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl TokenCredential for FakeSource {
        async fn get_token(
            &self,
            scopes: &[&str],
            _: Option<azure_core::credentials::TokenRequestOptions<'_>>,
        ) -> azure_core::Result<azure_core::credentials::AccessToken> {
            if scopes != [self.scope] {
                return Err(azure_core::Error::with_message(
                    azure_core::error::ErrorKind::Credential,
                    format!("asked for {scopes:?}, not {}", self.scope),
                ));
            }
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
}

#[cfg(test)]
mod tests {
    use super::testing::FakeSource;
    use super::*;

    const SCOPE: &str = "https://example.test/.default";

    fn fake(fail: bool, delay: Duration, lifetime: Duration) -> Arc<FakeSource> {
        FakeSource::new(SCOPE, fail, delay, lifetime)
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    async fn secret(entra: &EntraCredential) -> Result<String, TokenError> {
        entra.token(far()).await.map(|t| t.secret().to_owned())
    }

    /// The Entra ID chain is built from azure_identity with default features off: it must
    /// still get its HTTP client (azure_core's reqwest, rustls with our ring provider: run
    /// alone, this panics in reqwest if from_environment does not install it) and the
    /// managed identity and Azure CLI sources, without touching the network.
    #[test]
    fn the_chain_builds_with_the_trimmed_azure_features() {
        let chain =
            CredentialChain::from_environment(SCOPE, Some("00000000-0000-0000-0000-000000000001"))
                .expect("the chain builds");
        let names = chain.source_names();
        assert!(
            names.ends_with(&["managed identity", "developer tools (Azure CLI)"]),
            "{names:?}"
        );
        assert_eq!(chain.scope(), SCOPE);
    }

    #[tokio::test]
    async fn the_first_source_that_works_is_kept() {
        let broken = fake(true, Duration::ZERO, Duration::ZERO);
        let working = fake(false, Duration::ZERO, Duration::from_secs(3600));
        let entra = EntraCredential::new(CredentialChain::new(
            SCOPE,
            vec![("broken", broken.clone()), ("working", working.clone())],
        ));
        assert_eq!(secret(&entra).await.unwrap(), "token-1");
        assert_eq!(secret(&entra).await.unwrap(), "token-1");
        assert_eq!((broken.calls(), working.calls()), (1, 1), "cached");
        assert_eq!(entra.cached_secret().as_deref(), Some("token-1"));
    }

    #[tokio::test]
    async fn a_token_near_its_expiry_is_refreshed_and_the_chain_not_retried() {
        let broken = fake(true, Duration::ZERO, Duration::ZERO);
        // Four minutes: inside the five-minute refresh window from the start.
        let short = fake(false, Duration::ZERO, Duration::from_secs(240));
        let entra = EntraCredential::new(CredentialChain::new(
            SCOPE,
            vec![("broken", broken.clone()), ("short", short.clone())],
        ));
        assert_eq!(secret(&entra).await.unwrap(), "token-1");
        assert_eq!(secret(&entra).await.unwrap(), "token-2");
        assert_eq!(broken.calls(), 1, "the chosen source is asked directly");
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_refresh() {
        let slow = fake(false, Duration::from_millis(50), Duration::from_secs(3600));
        let entra = Arc::new(EntraCredential::new(CredentialChain::new(
            SCOPE,
            vec![("slow", slow.clone())],
        )));
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let entra = entra.clone();
                tokio::spawn(async move { secret(&entra).await })
            })
            .collect();
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap(), "token-1");
        }
        assert_eq!(slow.calls(), 1);
    }

    #[tokio::test]
    async fn a_deadline_does_not_cancel_the_refresh() {
        let slow = fake(false, Duration::from_millis(200), Duration::from_secs(3600));
        let entra = EntraCredential::new(CredentialChain::new(SCOPE, vec![("slow", slow.clone())]));
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(entra.token(soon).await.unwrap_err(), TokenError::Timeout);
        // The refresh went on; the next caller gets its token without a second fetch.
        assert_eq!(secret(&entra).await.unwrap(), "token-1");
        assert_eq!(slow.calls(), 1);
    }

    #[tokio::test]
    async fn no_working_source_is_an_error_naming_each() {
        let a = fake(true, Duration::ZERO, Duration::ZERO);
        let entra = EntraCredential::new(CredentialChain::new(SCOPE, vec![("first", a.clone())]));
        match secret(&entra).await {
            Err(TokenError::Unavailable(e)) => assert!(e.contains("first: "), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_scope_asked_for_is_the_chains() {
        let source = FakeSource::new(
            "https://other/.default",
            false,
            Duration::ZERO,
            Duration::from_secs(3600),
        );
        let entra = EntraCredential::new(CredentialChain::new(SCOPE, vec![("s", source)]));
        match secret(&entra).await {
            Err(TokenError::Unavailable(e)) => assert!(e.contains(SCOPE), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_fetch_is_answered_from_the_cache_for_its_pause_then_retried() {
        let a = fake(true, Duration::ZERO, Duration::ZERO);
        let entra = EntraCredential::new(CredentialChain::new(SCOPE, vec![("first", a.clone())]));
        assert!(secret(&entra).await.is_err());
        assert_eq!(a.calls(), 1);
        // Every caller in the next seconds gets the same answer without asking Entra ID.
        for _ in 0..100 {
            match secret(&entra).await {
                Err(TokenError::Unavailable(e)) => assert!(e.contains("first: "), "{e}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(a.calls(), 1, "the failure is cached");
        // The first pause is 4 to 5 s: after it, one new fetch (which fails again).
        tokio::time::advance(Duration::from_millis(5_001)).await;
        assert!(secret(&entra).await.is_err());
        assert_eq!(a.calls(), 2, "a failed refresh does not stick for ever");
        // The second failure in a row pauses longer (8 to 10 s).
        tokio::time::advance(Duration::from_millis(5_001)).await;
        assert!(secret(&entra).await.is_err());
        assert_eq!(a.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_still_valid_is_used_through_a_failure_pause() {
        // Four minutes: valid, but inside the five-minute renewal window.
        let short = fake(false, Duration::ZERO, Duration::from_secs(240));
        let entra =
            EntraCredential::new(CredentialChain::new(SCOPE, vec![("short", short.clone())]));
        assert_eq!(secret(&entra).await.unwrap(), "token-1");
        short.set_failing(true);
        // The renewal fails: the old token still serves, and keeps serving in the pause.
        assert_eq!(secret(&entra).await.unwrap(), "token-1");
        assert_eq!(short.calls(), 2);
        assert_eq!(secret(&entra).await.unwrap(), "token-1");
        assert_eq!(short.calls(), 2, "no new fetch during the pause");
    }

    #[test]
    fn the_refresh_point_is_five_minutes_before_expiry_or_at_three_quarters() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let hour = EntraToken::new("x", s(3600), now);
        assert_eq!(hour.refresh_at() - now, s(3300));
        assert_eq!(hour.expires_at() - now, s(3600));
        let short = EntraToken::new("x", s(240), now);
        assert_eq!(short.refresh_at() - now, s(180));
    }

    #[test]
    fn a_tokens_debug_hides_its_secret() {
        let token = EntraToken::new(
            "eyJ0eXAiOiJKV1Q-tok3n",
            Duration::from_secs(60),
            Instant::now(),
        );
        assert!(!format!("{token:?}").contains("tok3n"), "{token:?}");
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
