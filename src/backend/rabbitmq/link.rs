//! One long-lived AMQP connection with a few publisher channels, replaced when it dies; or,
//! a reader's link, one for depth reads alone (no publisher, no probe: it never publishes,
//! so a broker in a resource alarm never blocks it).
//!
//! The link hands out a [`Session`] (connection + channels). A session is dropped and a
//! new one made when the connection reports an error, when a channel closes, or after
//! [`TIMEOUTS_BEFORE_REPLACE`] sends in a row end at their deadline (a wedged connection
//! that still looks open: a black-holed socket, a broker that stopped confirming).
//! A single timed-out publish only has its channel recycled: the abandoned confirm stays
//! in the AMQP client's per-channel state until that channel closes, so the channel is
//! swapped for a fresh one and closed once the sends still waiting on it have ended.
//! Reconnects are single-flight and back off exponentially, so a dead broker costs one
//! connect attempt per backoff step, not one per send; sends in between fail fast. A
//! refused connect (nothing listening: a broker restarting) backs off to 1 s at most, other
//! failures to 5 s. A connect attempt is the link's, not a caller's: it runs to its own
//! limit in a task of its own, and callers wait for it each up to its deadline. A caller
//! whose deadline ends first neither ends the attempt nor counts as its failure, so a
//! broker slower to connect than any one send's deadline is still connected to. The price:
//! against a hung broker, a send arriving while an attempt runs waits its whole deadline
//! (with deadlines under the attempt's 5 s, more of them than when each caller cut its own
//! attempt short); between attempts, sends still fail at once.
//!
//! A broker in a resource alarm blocks a connection only once it publishes: the publish
//! that trips the block never completes until the alarm clears, and only then does the
//! connection report itself blocked. So a blocked connection is never taken for a wedged
//! one (its timeouts are the alarm's, and a replacement would not know the broker blocks
//! until it too had published real sends into the alarm), and a new connection publishes
//! an unroutable probe before any send: it is handed out once the broker confirmed the
//! probe, or blocked the connection (then every send is answered busy at once).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use parking_lot::{Mutex, RwLock};
use sendgate_backoff::Doubling;
use tokio::time::Instant;

use crate::domain::QueueName;

/// Publisher channels per connection: confirms are per channel, so several channels let
/// confirms for different sends be waited on independently.
const PUBLISH_CHANNELS: usize = 4;
/// Sends in a row that end at their deadline before the connection is presumed wedged.
pub const TIMEOUTS_BEFORE_REPLACE: u32 = 3;
/// Longest one connect attempt may take (a caller waits for it only up to its deadline).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after the `n`-th failed connect in a row (a timeout, TLS, a refused credential).
const RECONNECT_BACKOFF: Doubling =
    Doubling::new(Duration::from_millis(100), Duration::from_secs(5));
/// The same when nothing listens at the broker's address (a broker restarting): a refused
/// connect costs the broker nothing, and the gateway is back within about a second of it.
const REFUSED_BACKOFF: Doubling = Doubling::new(Duration::from_millis(100), Duration::from_secs(1));
/// Heartbeat asked for when the URL names none: a dead peer is noticed within ~2 of these.
const DEFAULT_HEARTBEAT_S: u16 = 10;
/// Frame size asked for when the URL names none (`?frame_max=` in the URL overrides it).
const DEFAULT_FRAME_MAX: u32 = 16_384;
/// A reading connection's frame size, AMQP's least: a passive declare's frames are tiny,
/// and lapin's buffers are sized by it.
const READ_FRAME_MAX: u32 = 4096;
/// Where a new connection's probe is published (default exchange, not mandatory): no client
/// may declare a queue named `amq.*`, so it never routes and is dropped, yet confirmed.
const PROBE_ROUTING_KEY: &str = "amq.sendgate.probe";
/// How long the probe's channel waits to be closed (an alarm may hold the close frame).
const PROBE_CLOSE_WAIT: Duration = Duration::from_secs(60);
/// How often the probe looks whether the broker blocked the connection (lapin sets a flag
/// when `connection.blocked` arrives).
const BLOCKED_POLL: Duration = Duration::from_millis(5);

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LinkError {
    #[error("the broker refused the credential: {0}")]
    AccessRefused(String),
    #[error("cannot reach the broker: {0}")]
    Unreachable(String),
    /// Nothing listens at the broker's address: the connection was refused.
    #[error("the broker refused the connection (nothing listening): {0}")]
    Refused(String),
    #[error("reconnecting to the broker (next attempt in {0:?})")]
    BackingOff(Duration),
    #[error("the operation ran out of time")]
    Timeout,
}

/// What a link's connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Sends: publisher channels in confirm mode, the served queues declared, a probe
    /// published before the first send.
    Publish,
    /// Depth reads (passive declares) only. It never publishes, so a broker in a resource
    /// alarm never blocks it (RabbitMQ blocks a connection once it publishes): the reads go
    /// on while the publishing connection is blocked.
    Read,
}

impl Purpose {
    fn as_str(self) -> &'static str {
        match self {
            Self::Publish => "publish",
            Self::Read => "read",
        }
    }
}

pub struct Session {
    pub connection: Connection,
    publishers: Vec<PublisherSlot>,
    next: AtomicUsize,
    /// A channel for passive declares (depth reads); a failed declare closes it.
    declarer: tokio::sync::Mutex<Option<Channel>>,
    generation: u64,
}

/// One publisher channel, replaceable while sends use it.
struct PublisherSlot {
    channel: RwLock<Channel>,
    /// A replacement is being opened: one at a time per slot.
    recycling: AtomicBool,
}

/// The channel a publish went out on, and which slot it came from.
pub struct Publisher {
    slot: usize,
    pub channel: Channel,
}

impl Session {
    /// A publisher channel, round robin (a publishing link's session: a reading one has none).
    pub fn publisher(&self) -> Publisher {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.publishers.len();
        Publisher {
            slot,
            channel: self.publishers[slot].channel.read().clone(),
        }
    }

    fn healthy(&self) -> bool {
        self.connection.status().connected()
            && self
                .publishers
                .iter()
                .all(|p| p.channel.read().status().connected())
    }

    /// Swap `publisher`'s channel for a fresh one in the background, and close the old
    /// one after `grace` (by then every send that was waiting on it has hit its deadline),
    /// which drops the confirms abandoned on it. Swapped at most once at a time per slot;
    /// the old channel is only closed if it is still the one in the slot's past.
    fn recycle(self: &Arc<Self>, publisher: &Publisher, grace: Duration) {
        let slot = &self.publishers[publisher.slot];
        if slot.channel.read().id() != publisher.channel.id()
            || slot.recycling.swap(true, Ordering::AcqRel)
        {
            return; // already replaced, or being replaced
        }
        let session = Arc::downgrade(self);
        let index = publisher.slot;
        tokio::spawn(async move {
            let Some(session) = session.upgrade() else {
                return;
            };
            let fresh =
                tokio::time::timeout(CONNECT_TIMEOUT, open_publisher(&session.connection)).await;
            let slot = &session.publishers[index];
            let old = match fresh {
                Ok(Ok(fresh)) => {
                    let new_id = fresh.id();
                    let old = std::mem::replace(&mut *slot.channel.write(), fresh);
                    tracing::info!(
                        event = "amqp_channel_recycled",
                        generation = session.generation,
                        old_channel = old.id(),
                        new_channel = new_id,
                        "replaced a publisher channel after a publish timed out"
                    );
                    Some(old)
                }
                // The connection cannot open a channel: the timeouts in a row (or the
                // health check) replace the whole session instead.
                _ => None,
            };
            slot.recycling.store(false, Ordering::Release);
            drop(session);
            if let Some(old) = old {
                tokio::time::sleep(grace).await;
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), old.close(200, "recycled".into()))
                        .await;
            }
        });
    }

    /// Ready messages in `queue`, by a passive declare: exact, needs no admin right.
    pub async fn ready_messages(&self, queue: &QueueName) -> Result<u64, lapin::Error> {
        if self.connection.status().blocked() {
            // The client writes nothing on a blocked connection: the declare would wait
            // for the alarm to clear (or the read's deadline), holding the send behind it.
            return Err(lapin::ErrorKind::IOError(Arc::new(std::io::Error::other(
                "the broker blocks this connection (memory or disk alarm)",
            )))
            .into());
        }
        let mut slot = self.declarer.lock().await;
        let channel = match slot.as_ref().filter(|c| c.status().connected()) {
            Some(c) => c.clone(),
            None => {
                let c = self.connection.create_channel().await?;
                *slot = Some(c.clone());
                c
            }
        };
        let declared = channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        if declared.is_err() {
            // The broker closes the channel on a failed passive declare.
            *slot = None;
        }
        Ok(u64::from(declared?.message_count()))
    }
}

#[derive(Default)]
struct ReconnectBackoff {
    next_attempt: Option<Instant>,
    /// Connects failed in a row: the next failure pauses `RECONNECT_BACKOFF`'s wait for one more.
    failures: u32,
    /// Why the last attempt failed: a refused credential stays the answer while backing off.
    last_error: Option<LinkError>,
}

/// A connect attempt under way, or its outcome once it ended.
type Attempt = tokio::sync::watch::Receiver<Option<Result<Arc<Session>, LinkError>>>;

/// An attempt's task ended before its connect did (a panic in it, its runtime shut down):
/// counted as a failed connect, so the next attempt waits out the backoff rather than
/// every send starting one that may fail the same way.
struct Unfinished(Option<Arc<Link>>);

impl Unfinished {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(link) = self.0.take() {
            let _ = link.record(Err(LinkError::Unreachable(
                "the connect attempt ended unfinished".into(),
            )));
        }
    }
}

/// What a caller without a live session found.
enum Joined {
    /// An attempt that ended since the caller looked left a session.
    Live(Arc<Session>),
    /// The attempt to wait for.
    Waiting(Attempt),
}

pub struct Link {
    purpose: Purpose,
    uri: AMQPUri,
    queues: Vec<QueueName>,
    current: RwLock<Option<Arc<Session>>>,
    /// The last connect attempt: one at a time.
    attempt: Mutex<Option<Attempt>>,
    backoff: Mutex<ReconnectBackoff>,
    timeouts_in_a_row: AtomicU32,
    generations: AtomicU64,
}

impl Link {
    /// The publishing link: it declares `queues` (unless they exist) on each connection.
    pub fn new(uri: AMQPUri, queues: Vec<QueueName>) -> Arc<Self> {
        Self::for_purpose(Purpose::Publish, uri, queues)
    }

    /// A link for depth reads alone, on a connection of its own.
    pub fn reader(mut uri: AMQPUri) -> Arc<Self> {
        uri.query.frame_max = Some(READ_FRAME_MAX);
        Self::for_purpose(Purpose::Read, uri, Vec::new())
    }

    fn for_purpose(purpose: Purpose, mut uri: AMQPUri, queues: Vec<QueueName>) -> Arc<Self> {
        if uri.query.heartbeat.is_none() {
            uri.query.heartbeat = Some(DEFAULT_HEARTBEAT_S);
        }
        // lapin keeps two ring buffers of 32 frames each (send and receive). With the
        // broker's default frame_max (128 KiB, what lapin gets when the URL names none) that
        // is 8 MiB, all of it resident (zero-filled when grown, then cycled through by the
        // traffic): nearly half of an idle gateway's RSS. 16 KiB frames bound it to 1 MiB; a
        // larger message just goes out in several body frames.
        if uri.query.frame_max.is_none() {
            uri.query.frame_max = Some(DEFAULT_FRAME_MAX);
        }
        Arc::new(Self {
            purpose,
            uri,
            queues,
            current: RwLock::new(None),
            attempt: Mutex::new(None),
            backoff: Mutex::new(ReconnectBackoff::default()),
            timeouts_in_a_row: AtomicU32::new(0),
            generations: AtomicU64::new(0),
        })
    }

    /// The frame size asked for (the broker may lower it; the session's connection has
    /// the one negotiated).
    pub fn frame_max(&self) -> u32 {
        self.uri.query.frame_max.unwrap_or(DEFAULT_FRAME_MAX)
    }

    /// The current session, connecting first if there is none (or it died): the attempt
    /// under way, or a new one unless the link is backing off, waited for up to `deadline`.
    pub async fn session(self: &Arc<Self>, deadline: Instant) -> Result<Arc<Session>, LinkError> {
        if let Some(s) = self.live_session() {
            return Ok(s);
        }
        let mut attempt = match self.join_or_start()? {
            Joined::Live(session) => return Ok(session),
            Joined::Waiting(attempt) => attempt,
        };
        let ended = tokio::time::timeout_at(deadline, attempt.wait_for(Option::is_some))
            .await
            .map_err(|_| LinkError::Timeout)?
            // The attempt's task was dropped unfinished (the runtime is shutting down).
            .map_err(|_| LinkError::Unreachable("the connect attempt was dropped".into()))?
            .clone();
        ended.unwrap_or(Err(LinkError::Timeout))
    }

    /// The connect attempt to wait for: the one under way, or a new one unless backing off
    /// (then the reason, at once). A live session set since the caller looked is no reason
    /// to connect: the attempt that set it has ended with it.
    fn join_or_start(self: &Arc<Self>) -> Result<Joined, LinkError> {
        let mut attempt = self.attempt.lock();
        // An attempt whose task was dropped unfinished (a panic, its runtime shut down)
        // closed its channel without an outcome: it is not under way.
        if let Some(under_way) = attempt
            .as_ref()
            .filter(|a| a.borrow().is_none() && !a.is_closed())
        {
            return Ok(Joined::Waiting(under_way.clone()));
        }
        if let Some(session) = self.live_session() {
            return Ok(Joined::Live(session));
        }
        {
            let backoff = self.backoff.lock();
            if let Some(at) = backoff.next_attempt.filter(|at| *at > Instant::now()) {
                return Err(match &backoff.last_error {
                    Some(refused @ LinkError::AccessRefused(_)) => refused.clone(),
                    _ => LinkError::BackingOff(at - Instant::now()),
                });
            }
        }
        let (ended, started) = tokio::sync::watch::channel(None);
        let link = Arc::clone(self);
        tokio::spawn(async move {
            let unfinished = Unfinished(Some(Arc::clone(&link)));
            let outcome = tokio::time::timeout(CONNECT_TIMEOUT, link.connect())
                .await
                .unwrap_or(Err(LinkError::Timeout));
            unfinished.disarm();
            let outcome = link.record(outcome);
            // The waiters have their own receivers; the link keeps no ended attempt (nor
            // the session in its outcome, which may be discarded before the next attempt).
            let mut slot = link.attempt.lock();
            let _ = ended.send(Some(outcome));
            *slot = None;
        });
        *attempt = Some(started.clone());
        Ok(Joined::Waiting(started))
    }

    /// An attempt's outcome, kept: its session becomes the current one, or its failure
    /// sets the next attempt's time.
    fn record(&self, outcome: Result<Arc<Session>, LinkError>) -> Result<Arc<Session>, LinkError> {
        let mut backoff = self.backoff.lock();
        match outcome {
            Ok(session) => {
                *backoff = ReconnectBackoff::default();
                self.timeouts_in_a_row.store(0, Ordering::Relaxed);
                *self.current.write() = Some(session.clone());
                tracing::info!(
                    event = "amqp_connected",
                    purpose = self.purpose.as_str(),
                    generation = session.generation,
                    blocked = session.connection.status().blocked(),
                    "connected to RabbitMQ"
                );
                Ok(session)
            }
            Err(e) => {
                backoff.failures = backoff.failures.saturating_add(1);
                let pause = match e {
                    LinkError::Refused(_) => REFUSED_BACKOFF,
                    _ => RECONNECT_BACKOFF,
                }
                .wait(backoff.failures, 0.0);
                backoff.next_attempt = Some(Instant::now() + pause);
                tracing::warn!(
                    event = "amqp_connect_failed",
                    purpose = self.purpose.as_str(),
                    error = %e,
                    retry_in_ms = pause.as_millis() as u64,
                    "cannot connect to RabbitMQ"
                );
                backoff.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    fn live_session(&self) -> Option<Arc<Session>> {
        let current = self.current.read();
        current.as_ref().filter(|s| s.healthy()).cloned()
    }

    async fn connect(&self) -> Result<Arc<Session>, LinkError> {
        let connection = Connection::connect_uri(
            self.uri.clone(),
            ConnectionProperties::default().with_connection_name(
                match self.purpose {
                    Purpose::Publish => "sendgate",
                    Purpose::Read => "sendgate-depth",
                }
                .into(),
            ),
        )
        .await
        .map_err(classify_connect_error)?;
        let mut publishers = Vec::with_capacity(PUBLISH_CHANNELS);
        if self.purpose == Purpose::Publish {
            for _ in 0..PUBLISH_CHANNELS {
                let channel = open_publisher(&connection)
                    .await
                    .map_err(classify_connect_error)?;
                publishers.push(PublisherSlot {
                    channel: RwLock::new(channel),
                    recycling: AtomicBool::new(false),
                });
            }
        }
        let session = Session {
            connection,
            publishers,
            next: AtomicUsize::new(0),
            declarer: tokio::sync::Mutex::new(None),
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
        };
        if self.purpose == Purpose::Publish {
            self.ensure_queues(&session).await?;
            probe_before_sends(&session.connection).await?;
        }
        Ok(Arc::new(session))
    }

    /// Declare each served queue (durable) unless it exists already. An existing queue is
    /// left exactly as it is, whatever its arguments (overflow, length limits).
    async fn ensure_queues(&self, session: &Session) -> Result<(), LinkError> {
        for queue in &self.queues {
            if session.ready_messages(queue).await.is_ok() {
                continue;
            }
            let channel = session
                .connection
                .create_channel()
                .await
                .map_err(classify_connect_error)?;
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await
                .map_err(classify_connect_error)?;
            let _ = channel.close(200, "declared".into()).await;
            tracing::info!(event = "queue_declared", queue = %queue, "declared durable queue");
        }
        Ok(())
    }

    /// A send on `publisher` ended at its deadline. Enough of these in a row and the
    /// session is replaced; a lone one recycles the channel (closing the old one after
    /// `grace`, the longest a send still waiting on it can take).
    pub fn note_timeout(&self, session: &Arc<Session>, publisher: &Publisher, grace: Duration) {
        // A send that began on a session already replaced (every send still waiting on a
        // wedged connection ends this way, one by one): its channels close with it. Counted,
        // it would charge the old connection's wedge to its successor and warn once per send.
        if !self.is_current(session) {
            return;
        }
        // The broker blocks publishers (a memory or disk alarm): the send waited on the
        // alarm, not on a wedged connection. A replacement would be as blocked without
        // knowing it, and no channel can be opened on this one until the alarm clears
        // (the abandoned confirm arrives then), so neither is done.
        if session.connection.status().blocked() {
            return;
        }
        let n = self.timeouts_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= TIMEOUTS_BEFORE_REPLACE {
            tracing::warn!(
                event = "amqp_wedged",
                timeouts_in_a_row = n,
                "replacing a connection that stopped confirming"
            );
            self.discard(session);
        } else {
            session.recycle(publisher, grace);
        }
    }

    fn is_current(&self, session: &Session) -> bool {
        self.current
            .read()
            .as_ref()
            .is_some_and(|s| s.generation == session.generation)
    }

    pub fn note_success(&self) {
        self.timeouts_in_a_row.store(0, Ordering::Relaxed);
    }

    /// Drop `session` (if it is still the current one) and close it in the background.
    pub fn discard(&self, session: &Session) {
        let mut current = self.current.write();
        if current
            .as_ref()
            .is_some_and(|s| s.generation == session.generation)
        {
            if let Some(old) = current.take() {
                self.timeouts_in_a_row.store(0, Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        old.connection.close(320, "replaced".into()),
                    )
                    .await;
                });
            }
        }
    }
}

/// The new connection's probe (see [`probe`]), on a channel of its own closed after: no
/// publisher channel keeps its confirm, and the channels' publish counts are the sends'.
async fn probe_before_sends(connection: &Connection) -> Result<(), LinkError> {
    let probing = open_publisher(connection)
        .await
        .map_err(classify_connect_error)?;
    let probed = probe(connection, &probing).await;
    tokio::spawn(async move {
        // Written once the broker reads the connection again (after an alarm).
        let _ = tokio::time::timeout(PROBE_CLOSE_WAIT, probing.close(200, "probed".into())).await;
    });
    probed.map_err(classify_connect_error)
}

/// A channel in confirm mode, for publishing.
async fn open_publisher(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

/// Publish an empty, unroutable message on `channel` and wait until the broker confirms it
/// (it reads this connection: sends may go) or blocks the connection (an alarm: sends are
/// answered busy until it unblocks), whichever comes first. Bounded by the connect attempt.
async fn probe(connection: &Connection, channel: &Channel) -> Result<(), lapin::Error> {
    let confirmed = async {
        channel
            .basic_publish(
                "".into(),
                PROBE_ROUTING_KEY.into(),
                BasicPublishOptions::default(),
                b"",
                BasicProperties::default(),
            )
            .await?
            .await
            .map(|_| ())
    };
    let blocked = async {
        while !connection.status().blocked() {
            tokio::time::sleep(BLOCKED_POLL).await;
        }
    };
    tokio::select! {
        confirmed = confirmed => confirmed,
        () = blocked => Ok(()),
    }
}

/// 403 ACCESS_REFUSED (bad credentials, no permission) and 530 NOT_ALLOWED (no access to
/// the vhost) are the credential's fault; a refused TCP connect is nothing listening;
/// everything else is reachability.
fn classify_connect_error(e: lapin::Error) -> LinkError {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) if matches!(amqp.get_id(), 403 | 530) => {
            LinkError::AccessRefused(amqp.get_message().to_string())
        }
        lapin::ErrorKind::IOError(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            LinkError::Refused(e.to_string())
        }
        _ => LinkError::Unreachable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link to a port of this machine that `listen` serves (or nothing does, `None`).
    fn link_to(port: u16) -> Arc<Link> {
        let uri = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
        Link::new(uri.parse().expect("a valid URI"), Vec::new())
    }

    /// The machine's RabbitMQ (started if it is down).
    fn machine_broker() -> std::net::SocketAddr {
        sendgate_testkit::ensure::rabbitmq();
        sendgate_testkit::rabbit::AMQP.parse().expect("an address")
    }

    /// A port nothing listens on: connects to it are refused.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("its address").port()
    }

    /// How long the link will wait before its next connect attempt (from the failure), after
    /// one more attempt made now with `failures` failed in a row before it (waited for to
    /// its end: past its own limit).
    async fn pause_after_another_failure(link: &Arc<Link>, failures: u32) -> (LinkError, Duration) {
        *link.backoff.lock() = ReconnectBackoff {
            failures,
            ..ReconnectBackoff::default()
        };
        let deadline = Instant::now() + CONNECT_TIMEOUT + Duration::from_secs(1);
        let error = match link.session(deadline).await {
            Ok(_) => panic!("connected to a broker that is not there"),
            Err(e) => e,
        };
        let next = link.backoff.lock().next_attempt.expect("backing off");
        (error, next.saturating_duration_since(Instant::now()))
    }

    /// Nothing listening (a broker restarting) is cheap to try again: however many connects
    /// were refused before, the next attempt is at most a second away, so the gateway is
    /// back within about a second of its broker.
    #[tokio::test]
    async fn a_refused_connect_is_tried_again_within_a_second_however_many_came_before() {
        let link = link_to(closed_port());
        for failures in [0, 3, 10, 100] {
            let (error, pause) = pause_after_another_failure(&link, failures).await;
            assert!(matches!(error, LinkError::Refused(_)), "{error:?}");
            assert!(
                pause <= Duration::from_secs(1),
                "{pause:?} after {failures} refused before ({error})"
            );
        }
    }

    /// A failed connect counts once, and until the backoff's pause has passed every caller
    /// is answered at once, without another attempt.
    #[tokio::test]
    async fn between_attempts_callers_are_answered_at_once_and_a_failure_counts_once() {
        let link = link_to(closed_port());
        let soon = || Instant::now() + Duration::from_secs(2);
        let first = link.session(soon()).await.err();
        assert!(matches!(first, Some(LinkError::Refused(_))), "{first:?}");
        assert_eq!(link.backoff.lock().failures, 1);
        for _ in 0..5 {
            let next = link.session(soon()).await.err();
            assert!(matches!(next, Some(LinkError::BackingOff(_))), "{next:?}");
        }
        assert_eq!(
            link.backoff.lock().failures,
            1,
            "no attempt while backing off"
        );
    }

    /// A live session is handed to every caller: one connection, not one per send.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_session_is_shared_by_the_callers() {
        let link = link_to(machine_broker().port());
        let deadline = || Instant::now() + CONNECT_TIMEOUT;
        let first = link.session(deadline()).await.expect("connected");
        let second = link.session(deadline()).await.expect("connected");
        assert!(Arc::ptr_eq(&first, &second));
    }

    /// A depth read never declares: a queue the broker lacks is a failed read, and is still
    /// missing after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_depth_read_of_a_missing_queue_fails_and_creates_nothing() {
        let link = Link::reader(
            format!("amqp://guest:guest@{}/%2f", machine_broker())
                .parse()
                .expect("a valid URI"),
        );
        let session = link
            .session(Instant::now() + CONNECT_TIMEOUT)
            .await
            .expect("connected");
        let missing =
            QueueName::parse(&sendgate_testkit::rabbit::unique("sg-missing")).expect("a name");
        for _ in 0..2 {
            assert!(session.ready_messages(&missing).await.is_err());
        }
    }

    /// A refused credential stays the answer while backing off: the producer hears that the
    /// credential is wrong (`backend_auth_failed`), not that a reconnect is on its way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_credential_is_the_answer_while_backing_off() {
        let uri = format!("amqp://nobody:wrong@{}/%2f", machine_broker());
        let link = Link::new(uri.parse().expect("a valid URI"), Vec::new());
        let deadline = || Instant::now() + CONNECT_TIMEOUT;
        let first = link.session(deadline()).await.err();
        assert!(
            matches!(first, Some(LinkError::AccessRefused(_))),
            "{first:?}"
        );
        let next = link.session(deadline()).await.err();
        assert!(
            matches!(next, Some(LinkError::AccessRefused(_))),
            "{next:?}"
        );
        assert_eq!(
            link.backoff.lock().failures,
            1,
            "answered without an attempt"
        );
    }

    /// A broker slow to connect (every byte 30 ms late: a handshake, four publisher channels
    /// and the probe take over a second) behind sends of half a second each: the
    /// connect is the link's, not a caller's, so one ending at its deadline does not end
    /// the connect, and a later send finds the session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connect_slower_than_every_callers_deadline_still_connects() {
        let proxy = sendgate_testkit::fault_proxy::FaultProxy::start(machine_broker()).await;
        proxy.set(sendgate_testkit::fault_proxy::Fault::Delay(
            Duration::from_millis(30),
        ));
        let link = link_to(proxy.addr().port());
        let started = Instant::now();
        let mut timed_out = 0;
        let connected = loop {
            match link
                .session(Instant::now() + Duration::from_millis(500))
                .await
            {
                Ok(_) => break started.elapsed(),
                Err(LinkError::Timeout) => timed_out += 1,
                Err(e) => assert!(
                    matches!(e, LinkError::BackingOff(_)),
                    "{e:?} after {:?}",
                    started.elapsed()
                ),
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never connected: {timed_out} sends timed out"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!("connected after {connected:?}; {timed_out} sends timed out before");
        assert!(timed_out >= 1, "the connect was not slower than a send");
        assert!(connected < CONNECT_TIMEOUT, "{connected:?}");
    }

    /// Callers arriving while an attempt is under way join it: one connection at the broker
    /// for any number of callers whose deadlines end first, and none of those endings
    /// counts as a failed connect (no backoff while the attempt runs).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_during_an_attempt_join_it_and_their_deadlines_are_no_failure() {
        // A hung broker: the kernel accepts, nothing speaks AMQP.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let link = link_to(listener.local_addr().expect("its address").port());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counting = Arc::clone(&accepted);
        let serving = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counting.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        // One after another, then several at once, each for 100 ms: 1.2 s in all.
        for _ in 0..6 {
            let e = link
                .session(Instant::now() + Duration::from_millis(100))
                .await;
            assert_eq!(e.err(), Some(LinkError::Timeout));
        }
        let at_once: Vec<_> = (0..6)
            .map(|_| {
                let link = Arc::clone(&link);
                tokio::spawn(async move {
                    link.session(Instant::now() + Duration::from_millis(600))
                        .await
                })
            })
            .collect();
        for caller in at_once {
            let e = caller.await.expect("the caller ran");
            assert_eq!(e.err(), Some(LinkError::Timeout));
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "connections at the broker"
        );
        let backoff = link.backoff.lock();
        assert_eq!(backoff.failures, 0);
        assert!(backoff.next_attempt.is_none());
        drop(backoff);
        serving.abort();
    }

    /// An attempt whose task is dropped unfinished (its runtime shut down; a panic inside
    /// the connect ends a task the same way) leaves no attempt under way: the next caller
    /// starts another, rather than joining the dropped one for ever.
    #[test]
    fn an_attempt_dropped_unfinished_does_not_wedge_the_link() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
        };
        // A hung broker first (the attempt runs to its 5 s), nothing listening after.
        let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let link = link_to(hung.local_addr().expect("its address").port());
        let first = runtime();
        let early = first.block_on(link.session(Instant::now() + Duration::from_millis(200)));
        assert_eq!(early.err(), Some(LinkError::Timeout));
        drop(first); // drops the attempt's task, unfinished
        assert!(
            link.backoff.lock().next_attempt.is_some(),
            "counted as a failed connect"
        );
        drop(hung);
        let second = runtime();
        for _ in 0..3 {
            let later = second.block_on(async {
                tokio::time::sleep(Duration::from_millis(1100)).await; // past any backoff
                link.session(Instant::now() + Duration::from_secs(2)).await
            });
            let later = later.err();
            assert!(matches!(later, Some(LinkError::Refused(_))), "{later:?}");
        }
    }

    /// A session discarded (a wedged connection) is let go of: nothing of the link's keeps
    /// it (its connection, its channels and their buffers) until the next connect.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_discarded_session_is_not_kept_by_the_link() {
        let link = link_to(machine_broker().port());
        let session = link
            .session(Instant::now() + CONNECT_TIMEOUT)
            .await
            .expect("connected");
        link.discard(&session);
        let weak = Arc::downgrade(&session);
        drop(session);
        tokio::time::sleep(Duration::from_millis(1500)).await; // the close, in the background
        assert!(
            weak.upgrade().is_none(),
            "the discarded session is still held"
        );
    }

    /// A connect that does not complete (a listener that never speaks AMQP: a hung broker)
    /// keeps the longer backoff, up to 5 s.
    #[tokio::test]
    async fn a_connect_that_times_out_backs_off_up_to_five_seconds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let link = link_to(listener.local_addr().expect("its address").port());
        let (error, pause) = pause_after_another_failure(&link, 10).await;
        assert_eq!(error, LinkError::Timeout);
        assert!(
            (Duration::from_millis(4900)..=Duration::from_secs(5)).contains(&pause),
            "{pause:?}"
        );
    }
}
