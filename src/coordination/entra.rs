//! `SENDGATE_REDIS_AUTH=entra`: the Redis client's connections authenticate as the URL's
//! user (the identity's object id) with a Microsoft Entra token as the password, and
//! re-authenticate with each new token before the old one expires.
//!
//! redis's connection manager asks a [`StreamingCredentialsProvider`] twice per connection:
//! the first item of one stream is the AUTH of the new connection; a second stream, read for
//! the connection's life, yields every later token, each sent as a new AUTH on the live
//! connection. All streams draw from one [`EntraCredential`], so the whole process shares one
//! token, one refresh in flight and one failure pause.
//!
//! A token that cannot be had is an error of the connection (the Redis call fails, the
//! replica falls back to local mode and rejoins when a token comes). No error or log line
//! carries a token: [`EntraToken`]'s `Debug` hides it and the errors built here hold only
//! the credential chain's own message.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use redis::auth::{BasicAuth, StreamingCredentialsProvider};
use tokio::time::Instant;

use sendgate_entra::{EntraCredential, EntraToken, TokenError, FAILURE_PAUSE_FIRST};

/// The Entra ID scope of Azure Managed Redis (and Azure Cache for Redis).
pub const REDIS_SCOPE: &str = "https://redis.azure.com/.default";

/// How long one connection attempt waits for a token. The fetch goes on in its own task
/// past it (see [`EntraCredential`]), so a slow first fetch delays the fleet, not for ever.
const FETCH_DEADLINE: Duration = Duration::from_secs(15);

/// After a failed refresh (or one that brought back the token already sent), the next try.
/// The credential answers from its failure cache meanwhile, so this costs no fetch.
const RETRY_AFTER: Duration = FAILURE_PAUSE_FIRST;

/// Credentials for the Redis client's connections: `user` from the URL, a token as the
/// password.
#[derive(Clone)]
pub struct EntraRedisCredentials {
    user: Arc<str>,
    credential: Arc<EntraCredential>,
}

impl EntraRedisCredentials {
    pub fn new(user: &str, credential: Arc<EntraCredential>) -> Self {
        Self {
            user: user.into(),
            credential,
        }
    }

    pub fn credential(&self) -> &Arc<EntraCredential> {
        &self.credential
    }

    /// The stream every subscriber reads: the current token now, then each new token
    /// when the one before is due for renewal ([`EntraToken::refresh_at`]).
    fn stream(&self) -> impl Stream<Item = redis::RedisResult<BasicAuth>> + Send + 'static {
        let this = self.clone();
        futures_util::stream::unfold(Cursor::default(), move |cursor| {
            let this = this.clone();
            async move {
                let (item, cursor) = this.next_item(cursor).await;
                Some((item, cursor))
            }
        })
    }

    async fn next_item(&self, mut cursor: Cursor) -> (redis::RedisResult<BasicAuth>, Cursor) {
        loop {
            if let Some(at) = cursor.wake_at {
                tokio::time::sleep_until(at).await;
            }
            match self.credential.token(Instant::now() + FETCH_DEADLINE).await {
                Ok(token)
                    if cursor
                        .sent
                        .as_ref()
                        .is_some_and(|sent| sent.same_as(&token)) =>
                {
                    // The renewal has not brought a new token yet (Entra ID failing, the
                    // old token still valid): nothing to send; look again shortly.
                    cursor.wake_at = Some(retry_at(&token));
                }
                Ok(token) => {
                    let auth = BasicAuth::new(self.user.to_string(), token.secret().to_owned());
                    cursor.wake_at = Some(token.refresh_at());
                    cursor.sent = Some(token);
                    return (Ok(auth), cursor);
                }
                Err(e) => {
                    cursor.wake_at = Some(Instant::now() + RETRY_AFTER);
                    return (Err(token_error(&e)), cursor);
                }
            }
        }
    }
}

/// Where one subscriber's stream stands.
#[derive(Default)]
struct Cursor {
    /// The token last yielded.
    sent: Option<EntraToken>,
    /// When to ask the credential next (`None`: at once).
    wake_at: Option<Instant>,
}

/// The next look while `token` is still the newest: soon, but never past its expiry.
fn retry_at(token: &EntraToken) -> Instant {
    (Instant::now() + RETRY_AFTER).min(token.expires_at().max(Instant::now()))
}

/// What a connection reports when no token could be had. The chain's message names the
/// sources and why each failed; it never holds a token (there was none to hold).
fn token_error(e: &TokenError) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::AuthenticationFailed,
        "no Microsoft Entra token for Redis",
        e.to_string(),
    ))
}

impl StreamingCredentialsProvider for EntraRedisCredentials {
    fn subscribe(
        &self,
    ) -> Pin<Box<dyn Stream<Item = redis::RedisResult<BasicAuth>> + Send + 'static>> {
        Box::pin(self.stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use sendgate_entra::testing::FakeSource;
    use sendgate_entra::CredentialChain;

    const USER: &str = "00000000-1111-2222-3333-444444444444";
    const HOUR: Duration = Duration::from_secs(3600);

    fn provider(source: Arc<FakeSource>) -> EntraRedisCredentials {
        let chain = CredentialChain::new(REDIS_SCOPE, vec![("fake", source)]);
        EntraRedisCredentials::new(USER, Arc::new(EntraCredential::new(chain)))
    }

    #[tokio::test]
    async fn it_yields_the_url_user_and_the_token_as_password() {
        let source = FakeSource::new(REDIS_SCOPE, false, Duration::ZERO, HOUR);
        let provider = provider(source.clone());
        let auth = provider.subscribe().next().await.unwrap().unwrap();
        assert_eq!(auth.username(), USER);
        assert_eq!(auth.password(), "token-1");
        // A second subscriber (the connection's re-AUTH stream) shares the cached token.
        let again = provider.subscribe().next().await.unwrap().unwrap();
        assert_eq!(again.password(), "token-1");
        assert_eq!(source.calls(), 1, "one token for every connection");
        assert!(!format!("{auth:?}").contains("token-1"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_token_comes_five_minutes_before_the_old_one_expires() {
        let source = FakeSource::new(REDIS_SCOPE, false, Duration::ZERO, HOUR);
        let provider = provider(source.clone());
        let mut stream = provider.subscribe();
        let start = Instant::now();
        assert_eq!(stream.next().await.unwrap().unwrap().password(), "token-1");
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(second.password(), "token-2");
        assert_eq!(second.username(), USER);
        let waited = start.elapsed();
        assert!(
            // Less a few microseconds: the lifetime is measured when the token arrives.
            waited > Duration::from_secs(55 * 60 - 1) && waited <= Duration::from_secs(55 * 60),
            "renewed {waited:?} after the first token (expected 55 min: 5 min before expiry)"
        );
        assert_eq!(source.calls(), 2);
        let third = stream.next().await.unwrap().unwrap();
        assert_eq!(third.password(), "token-3");
        let waited = start.elapsed();
        assert!(
            waited > Duration::from_secs(110 * 60 - 1) && waited <= Duration::from_secs(110 * 60),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_renewal_keeps_the_old_token_and_retries_until_a_new_one_comes() {
        let source = FakeSource::new(REDIS_SCOPE, false, Duration::ZERO, HOUR);
        let provider = provider(source.clone());
        let mut stream = provider.subscribe();
        let start = Instant::now();
        assert_eq!(stream.next().await.unwrap().unwrap().password(), "token-1");
        source.set_failing(true);
        let renewing = tokio::spawn(async move { stream.next().await.unwrap() });
        // At 55 min the renewal fails; the old token is still valid, so nothing is yielded
        // (no error either: the connection is fine) and the stream keeps trying.
        tokio::time::sleep(Duration::from_secs(57 * 60)).await;
        assert!(!renewing.is_finished());
        let calls = source.calls();
        assert!(calls >= 3, "retried in the renewal window: {calls} fetches");
        source.set_failing(false);
        let next = renewing.await.unwrap().unwrap();
        assert!(next.password().starts_with("token-"));
        assert_ne!(next.password(), "token-1");
        assert!(start.elapsed() < HOUR, "renewed before the expiry");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_credential_is_an_error_without_the_token() {
        let source = FakeSource::new(REDIS_SCOPE, false, Duration::ZERO, HOUR);
        let provider = provider(source.clone());
        assert_eq!(
            provider
                .subscribe()
                .next()
                .await
                .unwrap()
                .unwrap()
                .password(),
            "token-1"
        );
        source.set_failing(true);
        // Past the expiry: nothing valid is left, the fetch fails.
        tokio::time::advance(HOUR + Duration::from_secs(1)).await;
        let err = provider.subscribe().next().await.unwrap().unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(text.contains("no Microsoft Entra token"), "{text}");
        assert!(text.contains("fake: "), "names the source: {text}");
        assert!(!text.contains("token-1"), "{text}");
        assert_eq!(err.kind(), redis::ErrorKind::AuthenticationFailed);
    }
}
