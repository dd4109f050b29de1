//! The plain Redis client: one multiplexed connection with its deadline, its redaction (no
//! error carries the URL, the password or an Entra token), Entra auth, and the names of each
//! queue's state. It knows no protocol: the fleet's ledger runs on it as scripts
//! (`redis_port.rs`, [`LedgerPort`](super::port::LedgerPort) for [`RedisClient`]), the
//! tenants' exchange as another (`redis_shares.rs`), and the runtime settings' store uses
//! [`RedisClient::query`] on the same connection.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

use super::entra::{EntraRedisCredentials, REDIS_SCOPE};
use crate::config::{BackendKind, RedisAuth, RedisSettings};
use crate::domain::QueueName;
use sendgate_entra::{CredentialChain, EntraCredential};

/// Why a Redis call failed. None of them names the Redis URL or its password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisError {
    #[error("Redis did not answer within the deadline")]
    Timeout,
    /// Redis, or the connection to it, answered with an error.
    #[error("Redis: {0}")]
    Failed(String),
    #[error("unexpected reply from Redis: {0}")]
    Unexpected(String),
    /// `SENDGATE_REDIS_AUTH=entra`, but no Entra ID credential chain could be built here.
    #[error("SENDGATE_REDIS_AUTH=entra: {0}")]
    Entra(String),
}

/// The longest the first connection (TCP, TLS, AUTH, PING) may take. Longer than one
/// call's deadline: it happens once, off the request path.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(1);

/// Counts travel through Lua, whose numbers are doubles: above 2^53 they would lose units.
/// Every count sent is clamped here; no queue comes near it.
pub(super) const MAX_EXACT: u64 = (1 << 53) - 1;

/// After this many calls in a row failed on the connection (not on a script), the
/// connection manager is replaced: see [`Connection`].
const REBUILD_AFTER: u32 = 3;

/// redis's `ConnectionManager` with two gaps closed. It reconnects only after an I/O error,
/// so a first connection that failed otherwise (wrong password, `LOADING` while Redis
/// restarts) would fail every call for ever, and a peer gone silent (no RST) keeps its
/// connection until TCP gives up, many minutes later. Both show as calls failing in a row:
/// after [`REBUILD_AFTER`] of them a fresh manager replaces the old one.
struct Connection {
    client: redis::Client,
    config: ConnectionManagerConfig,
    current: parking_lot::Mutex<ConnectionManager>,
    failures: AtomicU32,
}

impl Connection {
    fn new(client: redis::Client, config: ConnectionManagerConfig) -> redis::RedisResult<Self> {
        let current = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(Self {
            client,
            config,
            current: parking_lot::Mutex::new(current),
            failures: AtomicU32::new(0),
        })
    }

    fn get(&self) -> ConnectionManager {
        self.current.lock().clone()
    }

    /// Whether a call failed on the connection (see [`failed_on_the_connection`]).
    fn record(&self, connection_failed: bool) {
        if !connection_failed {
            self.failures.store(0, Ordering::Relaxed);
            return;
        }
        if self.failures.fetch_add(1, Ordering::Relaxed) + 1 < REBUILD_AFTER {
            return;
        }
        self.failures.store(0, Ordering::Relaxed);
        // Lazy: nothing is awaited here; the next call connects.
        if let Ok(fresh) =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
        {
            *self.current.lock() = fresh;
        }
    }
}

/// A replica's Redis client: cheap to clone (one multiplexed connection, shared).
#[derive(Clone)]
pub struct RedisClient {
    conn: std::sync::Arc<Connection>,
    prefix: String,
    timeout: Duration,
    /// Strings no error may carry (the URL, its password).
    redact: std::sync::Arc<[String]>,
    /// With Entra auth: the token source, whose current token no error may carry either.
    entra: Option<std::sync::Arc<EntraCredential>>,
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClient")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisClient {
    /// Connect now and check Redis answers, all within [`CONNECT_DEADLINE`] (or the call
    /// deadline, if longer).
    pub async fn connect(settings: &RedisSettings) -> Result<Self, RedisError> {
        let client = Self::lazy(settings)?;
        let deadline = CONNECT_DEADLINE.max(settings.timeout);
        client.ping_within(deadline).await.map(|()| client)
    }

    /// A client that connects on its first call (and reconnects in the background after a
    /// failure): for a replica that starts while Redis is down and joins when it answers.
    /// Fails only on settings it cannot use.
    pub fn lazy(settings: &RedisSettings) -> Result<Self, RedisError> {
        let entra = match &settings.auth {
            RedisAuth::Url => None,
            RedisAuth::Entra {
                managed_identity_client_id,
            } => {
                let chain = CredentialChain::from_environment(
                    REDIS_SCOPE,
                    managed_identity_client_id.as_deref(),
                )
                .map_err(RedisError::Entra)?;
                Some(std::sync::Arc::new(EntraCredential::new(chain)))
            }
        };
        Self::build(settings, entra)
    }

    /// [`RedisClient::lazy`] with Entra auth through `credential` (whatever `settings.auth`
    /// says): the URL's user authenticates with `credential`'s tokens for
    /// `https://redis.azure.com/.default`. For tests, and for a process that already holds
    /// a credential.
    pub fn lazy_with_entra(
        settings: &RedisSettings,
        credential: std::sync::Arc<EntraCredential>,
    ) -> Result<Self, RedisError> {
        Self::build(settings, Some(credential))
    }

    fn build(
        settings: &RedisSettings,
        entra: Option<std::sync::Arc<EntraCredential>>,
    ) -> Result<Self, RedisError> {
        let url = settings.url.expose();
        let redact: Vec<String> = std::iter::once(url.as_str().to_owned())
            .chain(url.password().filter(|p| !p.is_empty()).map(str::to_owned))
            .collect();
        let redact: std::sync::Arc<[String]> = redact.into();
        let fail = |e: redis::RedisError| redis_error(&redact, None, e);
        if url.scheme() == "rediss" {
            crate::tls::install_ring();
        }
        let client = redis::Client::open(url.as_str()).map_err(fail)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_DEADLINE.max(settings.timeout)))
            // A backstop only: every call's deadline is `RedisClient::within`'s, which looks at a
            // reply that arrived by then once more before calling it late (the client's own
            // timer would race it and drop that reply).
            .set_response_timeout(Some(settings.timeout.saturating_mul(2)))
            // One quick retry per connection attempt, so a call meets the real error (refused,
            // WRONGPASS) rather than its deadline; the next call tries again, and the fleet is
            // rejoined as soon as Redis answers.
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(200))
            .set_number_of_retries(1);
        let config = match &entra {
            // The URL's user with a token as its password, a new AUTH on every live
            // connection before the token expires (see `super::entra`).
            Some(credential) => config.set_credentials_provider(EntraRedisCredentials::new(
                url.username(),
                credential.clone(),
            )),
            None => config,
        };
        let conn = Connection::new(client, config).map_err(fail)?;
        Ok(Self {
            conn: std::sync::Arc::new(conn),
            prefix: settings.prefix.as_str().to_owned(),
            timeout: settings.timeout,
            redact,
            entra,
        })
    }

    /// The deadline of one call: an answer may arrive this long after its script ran.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One queue's state in the fleet protocol (docs/fleet.md): the one hash
    /// `{prefix}:{kind/queue}` of the primary lane, the base the old keys' names extend.
    pub fn queue_key(&self, backend: BackendKind, queue: &QueueName) -> String {
        queue_base(&self.prefix, backend.as_str(), queue)
    }

    /// [`RedisClient::queue_key`] of the fallback lane, named as [`RedisClient::fallback_keys`] names
    /// its keys (`{fallback/kind/queue}` beside a primary of the same kind).
    pub fn fallback_queue_key(
        &self,
        primary: BackendKind,
        fallback: BackendKind,
        queue: &QueueName,
    ) -> String {
        queue_base(&self.prefix, &fallback_scope(primary, fallback), queue)
    }

    pub async fn ping(&self) -> Result<(), RedisError> {
        self.ping_within(self.timeout).await
    }

    async fn ping_within(&self, deadline: Duration) -> Result<(), RedisError> {
        let mut conn = self.conn.get();
        let cmd = redis::cmd("PING");
        let answer = self
            .within(deadline, cmd.query_async::<Value>(&mut conn))
            .await?;
        match answer {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            other => Err(RedisError::Unexpected(format!("PING answered {other:?}"))),
        }
    }

    pub(super) async fn run(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, RedisError> {
        let mut conn = self.conn.get();
        self.within(self.timeout, call.invoke_async::<Value>(&mut conn))
            .await
    }

    /// Every call ends by its deadline, whatever the connection does; how it ended is
    /// recorded for the connection's health.
    async fn within<T>(
        &self,
        deadline: Duration,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, RedisError> {
        match answer_by(deadline, call).await {
            Ok(Ok(value)) => {
                self.conn.record(false);
                Ok(value)
            }
            Ok(Err(e)) => {
                self.conn.record(failed_on_the_connection(&e));
                let token = self.entra.as_ref().and_then(|c| c.cached_secret());
                Err(redis_error(&self.redact, token.as_deref(), e))
            }
            Err(_) => {
                self.conn.record(true);
                Err(RedisError::Timeout)
            }
        }
    }
}

/// Plain commands for the runtime settings (`src/settings/store.rs`), on the client's
/// connection, deadline and redaction.
impl RedisClient {
    /// A deployment-wide key under this deployment's prefix.
    pub fn deployment_key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// One command or pipeline, bounded by the call deadline.
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, RedisError> {
        let mut conn = self.conn.get();
        self.within(self.timeout, pipe.query_async::<T>(&mut conn))
            .await
    }
}

/// `call`'s answer, or `Elapsed` once `deadline` has passed. When it passes, this process may
/// not have been running (a busy machine descheduled it): the reply can be in the socket,
/// waiting for the connection's own task to read it. The tasks that are ready run once
/// (that task among them) and the call is looked at again without waiting: a reply that
/// came in time is not a miss, and nothing waits longer than one turn of the scheduler
/// past the deadline.
async fn answer_by<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = T>,
) -> Result<T, tokio::time::error::Elapsed> {
    let mut call = std::pin::pin!(call);
    match tokio::time::timeout(deadline, &mut call).await {
        Ok(answer) => Ok(answer),
        Err(_) => {
            tokio::task::yield_now().await;
            tokio::time::timeout(Duration::ZERO, &mut call).await
        }
    }
}

/// An error Redis answered on a working connection (a script's error, WRONGTYPE) says
/// nothing against the connection; any other (refused, reset, timed out, AUTH refused while
/// connecting, LOADING while Redis restarts) does.
fn failed_on_the_connection(e: &redis::RedisError) -> bool {
    !matches!(e.kind(), redis::ErrorKind::Server(kind) if kind != redis::ServerErrorKind::BusyLoading)
}

/// `redact` (the URL, its password) and the Entra `token` in use are cut out of the text.
fn redis_error(redact: &[String], token: Option<&str>, e: redis::RedisError) -> RedisError {
    if e.is_timeout() {
        return RedisError::Timeout;
    }
    let mut text = e.to_string();
    let secrets = redact.iter().map(String::as_str).chain(token);
    for secret in secrets.filter(|s| !s.is_empty()) {
        text = text.replace(secret, "(redacted)");
    }
    RedisError::Failed(text)
}

/// `{prefix}:{scope/queue}`: one hash tag, so one cluster slot for everything of the queue.
fn queue_base(prefix: &str, scope: &str, queue: &QueueName) -> String {
    format!("{prefix}:{{{scope}/{queue}}}")
}

/// The hash tag's scope of the fallback lane's keys (see [`RedisClient::fallback_keys`]).
fn fallback_scope(primary: BackendKind, fallback: BackendKind) -> String {
    if fallback == primary {
        format!("fallback/{}", fallback.as_str())
    } else {
        fallback.as_str().to_owned()
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .min(MAX_EXACT)
}

pub(super) fn exact(n: u64) -> u64 {
    n.min(MAX_EXACT)
}

// ---- Replies. Scripts answer arrays of integers; anything else is `Unexpected`, never a
// panic: a changed script, a proxy or a foreign key must not take a replica down.

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reply_ready_when_the_deadline_fires_is_taken_not_called_late() {
        let deadline = Duration::from_millis(50);
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The connection's task: its reply is there at the deadline, but the task has not
        // run yet when the caller's timer fires (the caller's timer was armed first).
        let caller = tokio::spawn(answer_by(deadline, rx));
        tokio::task::yield_now().await; // the caller arms its timer
        tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            let _ = tx.send(7);
        });
        assert_eq!(caller.await.unwrap().map(Result::ok), Ok(Some(7)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_not_there_by_the_deadline_is_late() {
        let (_tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let started = tokio::time::Instant::now();
        assert!(answer_by(Duration::from_millis(50), rx).await.is_err());
        assert_eq!(started.elapsed(), Duration::from_millis(50));
    }

    #[test]
    fn a_fallback_of_the_primarys_kind_has_a_key_of_its_own_and_the_primary_keeps_its_name() {
        let q = QueueName::parse("orders.eu-1").unwrap();
        let primary = queue_base("sg", BackendKind::RabbitMq.as_str(), &q);
        let same = queue_base(
            "sg",
            &fallback_scope(BackendKind::RabbitMq, BackendKind::RabbitMq),
            &q,
        );
        assert_eq!(primary, "sg:{rabbitmq/orders.eu-1}");
        assert_eq!(same, "sg:{fallback/rabbitmq/orders.eu-1}");
        // Of another kind, the fallback's queue keeps the name it always had.
        let other = queue_base(
            "sg",
            &fallback_scope(BackendKind::RabbitMq, BackendKind::ServiceBus),
            &q,
        );
        assert_eq!(other, "sg:{servicebus/orders.eu-1}");
    }

    #[test]
    fn errors_never_carry_the_url_or_password() {
        let redact = [
            "redis://u:hunter2@host:6379".to_owned(),
            "hunter2".to_owned(),
        ];
        let e = redis::RedisError::from((
            redis::ErrorKind::Io,
            "connect failed",
            "redis://u:hunter2@host:6379 said hunter2".to_owned(),
        ));
        let text = redis_error(&redact, None, e).to_string();
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn errors_never_carry_the_entra_token_in_use() {
        let e = redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "AUTH refused",
            "for eyJ0eXAi.tok3n.sig".to_owned(),
        ));
        let text = redis_error(&[], Some("eyJ0eXAi.tok3n.sig"), e).to_string();
        assert!(!text.contains("tok3n"), "{text}");
        assert!(text.contains("(redacted)"), "{text}");
    }
}
