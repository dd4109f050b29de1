//! The RabbitMQ backend: AMQP 0.9.1 for sends, the management HTTP API (or a passive
//! declare, on a connection that never publishes) for the depth.
//!
//! Sends are persistent messages published to the default exchange with the queue as
//! routing key, `mandatory` (an unroutable publish comes back as an error instead of being
//! dropped), and waited on with publisher confirms: a 2xx means the broker took
//! responsibility for the message. A batch is published back to back on one channel and
//! its confirms awaited together; each message's confirm is mapped as a single send's.
//! The attributes' mapping is `properties.rs`'s.

mod link;
mod management;
mod properties;
pub mod stats;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation};
use tokio::time::Instant;

use super::{Backend, Backlog, DepthError, DepthLag, OutgoingMessage, SendError, SendReceipt};
use crate::config::{DepthSource, RabbitMqSettings};
use crate::domain::{Attributes, Field, QueueName};
use link::{Link, LinkError, Session};
use management::{Management, QueueCount};
use properties::Unfit;
use stats::StatsLag;

/// How long a client is told to wait while the broker blocks publishers (memory or disk alarm).
const BLOCKED_RETRY_AFTER: Duration = Duration::from_secs(5);

pub struct RabbitMq {
    link: Arc<Link>,
    /// Depth reads by passive declare, on a connection of their own: the broker blocks the
    /// publishing one in a resource alarm, and the reads must go on through it.
    reader: Arc<Link>,
    management: Arc<Management>,
    depth_source: DepthSource,
    /// The management source's lag in force, kept measured by `measuring`.
    stats_lag: Arc<StatsLag>,
    /// The task that measures the broker's statistics refresh (started at warm-up with the
    /// management source); aborted when the backend is dropped.
    measuring: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The settings are parsed and fine, but the HTTP client could not be set up (exit 1).
#[derive(Debug, thiserror::Error)]
#[error("rabbitmq: {0}")]
pub struct RabbitInitError(String);

/// A batch's publishes in flight on one channel: the confirms awaited, in order, only
/// when the bytes queued would pass [`PUBLISH_WINDOW_BYTES`] and at the end.
struct Window<'a> {
    /// Each message's result, and whether it was published (a timeout then means "not
    /// confirmed in time", which costs the channel).
    results: Vec<Option<(Result<SendReceipt, SendError>, bool)>>,
    /// Publishes queued and not yet confirmed: the message's index, its bytes, the confirm.
    waiting: VecDeque<(usize, usize, Waiting<'a>)>,
    queued_bytes: usize,
}

impl<'a> Window<'a> {
    fn new(messages: usize) -> Self {
        Self {
            results: vec![None; messages],
            waiting: VecDeque::new(),
            queued_bytes: 0,
        }
    }

    fn decide(&mut self, index: usize, result: Result<SendReceipt, SendError>, published: bool) {
        self.results[index] = Some((result, published));
    }

    /// Confirms in order until a body of `bytes` fits in the window (a body larger than
    /// the window goes alone).
    async fn make_room(&mut self, bytes: usize) {
        while self.queued_bytes + bytes > PUBLISH_WINDOW_BYTES {
            let Some((at, held, publish)) = self.waiting.pop_front() else {
                break;
            };
            self.decide(at, publish.await, true);
            self.queued_bytes -= held;
        }
    }

    /// Polled once here, in the batch's order: that queues its frames, so the channel
    /// carries the messages in this order (and the broker stores them so) without
    /// waiting for one to be written before the next is queued.
    async fn issue(&mut self, index: usize, bytes: usize, mut publish: Waiting<'a>) {
        match std::future::poll_fn(|cx| Poll::Ready(publish.as_mut().poll(cx))).await {
            Poll::Ready(result) => self.decide(index, result, true),
            Poll::Pending => {
                self.queued_bytes += bytes;
                self.waiting.push_back((index, bytes, publish));
            }
        }
    }

    /// Every confirm still awaited; each message's result, and whether a published one
    /// timed out.
    async fn finish(mut self) -> (Vec<Result<SendReceipt, SendError>>, bool) {
        for (at, _, publish) in std::mem::take(&mut self.waiting) {
            self.decide(at, publish.await, true);
        }
        let mut timed_out = false;
        let results = self
            .results
            .into_iter()
            .map(|r| {
                let (result, published) =
                    r.unwrap_or((Err(SendError::Failed("not published".into())), false));
                timed_out |= published && result == Err(SendError::Timeout);
                result
            })
            .collect();
        (results, timed_out)
    }
}

impl RabbitMq {
    pub fn new(settings: &RabbitMqSettings, queues: &[QueueName]) -> Result<Self, RabbitInitError> {
        let uri = settings.uri.expose().clone();
        let management = Management::new(
            settings.management_url.clone(),
            &uri.vhost,
            settings.management_user.clone(),
            settings.management_password.clone(),
        )
        .map_err(|e| RabbitInitError(e.to_string()))?;
        Ok(Self {
            reader: Link::reader(uri.clone()),
            link: Link::new(uri, queues.to_vec()),
            management: Arc::new(management),
            depth_source: settings.depth_source,
            stats_lag: Arc::new(StatsLag::new(settings.stats_lag)),
            measuring: parking_lot::Mutex::new(None),
        })
    }

    /// Start measuring the broker's statistics refresh, once: a measurement spans a few
    /// refresh periods (about 20 s at the defaults), longer than start-up should wait, so it
    /// runs on a task of its own and the default lag is in force until it is done.
    fn start_measuring(&self) {
        let mut measuring = self.measuring.lock();
        if measuring.is_none() {
            *measuring = Some(tokio::spawn(stats::keep_measured(
                Arc::clone(&self.management),
                Arc::clone(&self.stats_lag),
            )));
        }
    }

    async fn ready_messages(
        &self,
        queue: &QueueName,
        deadline: Instant,
    ) -> Result<u64, DepthError> {
        let read = async {
            let session = self
                .reader
                .session(deadline)
                .await
                .map_err(|e| DepthError::Failed(e.to_string()))?;
            session
                .ready_messages(queue)
                .await
                .map_err(|e| match e.kind() {
                    lapin::ErrorKind::ProtocolError(p) if p.get_id() == 404 => {
                        DepthError::QueueNotFound
                    }
                    _ => DepthError::Failed(e.to_string()),
                })
        };
        tokio::time::timeout_at(deadline, read)
            .await
            .unwrap_or(Err(DepthError::Timeout))
    }
}

/// The most bytes of one batch's bodies queued at the broker client and not yet
/// confirmed. lapin copies a body into its frames when its publish is queued, so a batch
/// queued whole would hold its bodies twice (and a future per message) until the last is
/// written: 64 batches of 1 MiB in flight held ~2× the body budget. With the window a
/// batch holds at most this much more; a batch of 100 × 1 KB still goes in one window,
/// with no confirm round trip added.
const PUBLISH_WINDOW_BYTES: usize = 256 * 1024;

/// A batch's publish that was queued (polled once) and is waiting for its confirm.
type Waiting<'a> = Pin<Box<dyn Future<Output = Result<SendReceipt, SendError>> + Send + 'a>>;

impl RabbitMq {
    /// The session to publish on, or why nothing may be published now (every message of a
    /// send or a batch then fails the same way).
    async fn publishing_session(&self, deadline: Instant) -> Result<Arc<Session>, SendError> {
        let session = self.link.session(deadline).await.map_err(|e| match e {
            LinkError::AccessRefused(why) => SendError::AuthFailed(why),
            other => SendError::Unavailable(other.to_string()),
        })?;
        if session.connection.status().blocked() {
            // A blocked connection accepts publishes and never confirms them: answer now.
            return Err(SendError::Busy {
                reason: "the broker is blocking publishers (memory or disk alarm)".into(),
                retry_after: Some(BLOCKED_RETRY_AFTER),
            });
        }
        // A publish is never issued past its deadline (docs/fleet.md, A2): the fleet stops
        // counting an admission a hold after it, which assumes it was stored by then or never.
        if Instant::now() >= deadline {
            return Err(SendError::Timeout);
        }
        Ok(session)
    }

    /// Publish `message` on `channel` and wait for its confirm until `deadline`; the
    /// result as a send's. `Timeout` here always means published and not confirmed in
    /// time: what that costs the channel is the caller's to note, once per send or batch.
    /// Its frames are queued on the channel when the future is first polled (lapin queues
    /// them before it waits for anything), which `send_batch` relies on for its order.
    async fn publish(
        &self,
        session: &Session,
        channel: &Channel,
        message: &OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        // The broker may have lowered the frame size asked for: what `unsupported` let
        // through can still not fit, and is then refused here, before anything is sent.
        let frame_max = session.connection.configuration().frame_max() as usize;
        let properties = properties::check_frame(message, frame_max)
            .and_then(|()| properties::properties_of(message))
            .map_err(|unfit| match unfit {
                Unfit::Header { .. } => SendError::TooLarge,
                Unfit::ShortString(_) => SendError::Failed(unfit.to_string()),
            })?;
        let confirmed = async {
            channel
                .basic_publish(
                    "".into(),
                    message.queue.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &message.body,
                    properties,
                )
                .await?
                .await
        };
        match tokio::time::timeout_at(deadline, confirmed).await {
            Ok(confirmed) => self.settle(session, confirmed),
            Err(_) => Err(SendError::Timeout),
        }
    }

    /// What the broker's confirm (or the error instead of one) means for the send, and for
    /// the connection's health.
    fn settle(
        &self,
        session: &Session,
        confirmed: Result<Confirmation, lapin::Error>,
    ) -> Result<SendReceipt, SendError> {
        match confirmed {
            Ok(Confirmation::Ack(None)) => {
                self.link.note_success();
                Ok(SendReceipt { duplicate: false })
            }
            Ok(Confirmation::Ack(Some(returned))) => {
                self.link.note_success();
                // 312 NO_ROUTE: the default exchange found no queue of that name.
                Err(if returned.reply_code == 312 {
                    SendError::QueueNotFound
                } else {
                    SendError::Failed(format!("returned by the broker: {}", returned.reply_text))
                })
            }
            // RabbitMQ nacks a publish when the queue is at its `x-max-length` with
            // `overflow=reject-publish` (or the queue's process failed): one queue's
            // trouble, which must not take its broker's other queues down with it.
            Ok(Confirmation::Nack(_)) => {
                self.link.note_success();
                Err(SendError::QueueFull)
            }
            Ok(Confirmation::NotRequested) => {
                Err(SendError::Failed("publisher confirms are off".into()))
            }
            Err(e) => {
                self.link.discard(session);
                Err(match e.kind() {
                    lapin::ErrorKind::ProtocolError(p) if p.get_id() == 403 => {
                        SendError::AuthFailed(p.get_message().to_string())
                    }
                    lapin::ErrorKind::ProtocolError(p) if p.get_id() == 404 => {
                        SendError::QueueNotFound
                    }
                    // The connection died between publish and confirm: it may be stored.
                    _ => SendError::Uncertain(e.to_string()),
                })
            }
        }
    }
}

#[async_trait]
impl Backend for RabbitMq {
    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    async fn send(
        &self,
        message: OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let session = self.publishing_session(deadline).await?;
        let publisher = session.publisher();
        let result = self
            .publish(&session, &publisher.channel, &message, deadline)
            .await;
        if result == Err(SendError::Timeout) {
            // Dropping the publish future abandons the confirm, but the channel keeps
            // its state until it closes: the channel is recycled. Sends that began on
            // it after this one end within about one budget; twice that is the grace.
            self.link.note_timeout(&session, &publisher, budget * 2);
        }
        result
    }

    /// All on one publisher channel, back to back, then every confirm awaited together: one
    /// round trip's wait for the batch, not one per message; each result as `send` maps it.
    async fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
        deadline: Instant,
    ) -> Vec<Result<SendReceipt, SendError>> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let session = match self.publishing_session(deadline).await {
            Ok(session) => session,
            Err(e) => return vec![Err(e); messages.len()],
        };
        let publisher = session.publisher();
        let mut window = Window::new(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let bytes = message.body.len();
            window.make_room(bytes).await;
            if Instant::now() >= deadline {
                // As a single send past its deadline before it is issued.
                window.decide(index, Err(SendError::Timeout), false);
                continue;
            }
            let publish = Box::pin(self.publish(&session, &publisher.channel, message, deadline));
            window.issue(index, bytes, publish).await;
        }
        let (results, timed_out) = window.finish().await;
        if timed_out {
            // As for one send: the abandoned confirms stay on the channel, which is
            // recycled; the batch counts as one send that ended at its deadline.
            self.link.note_timeout(&session, &publisher, budget * 2);
        }
        results
    }

    /// A scheduled enqueue (no delayed delivery without a plugin), and what AMQP's
    /// encoding cannot hold (`properties.rs`): refused, never sent without them.
    fn unsupported(&self, attributes: &Attributes) -> Option<Field> {
        properties::unsupported(attributes, self.link.frame_max() as usize)
    }

    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError> {
        match self.depth_source {
            DepthSource::Amqp => self.ready_messages(queue, deadline).await.map(Backlog::of),
            DepthSource::Management => match self.management.count(queue, deadline).await? {
                QueueCount::Messages(n) => Ok(Backlog::of(n)),
                // A queue whose statistics are not published yet: read the exact ready
                // count from the data plane instead, so a new queue neither trips
                // fail-closed nor goes unguarded.
                QueueCount::NotReported => {
                    self.ready_messages(queue, deadline).await.map(Backlog::of)
                }
            },
        }
    }

    /// Connect and declare the queues before the gateway says `running` (failing here is not
    /// fatal: sends connect on demand); with the management source, start measuring its lag.
    async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        if self.depth_source == DepthSource::Management {
            self.start_measuring();
        }
        self.link
            .session(deadline)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Management: the longer of the configured lag and 2 × the measured (until then the
    /// default) refresh + 1 s, as it is now; `amqp` reads are exact.
    fn depth_lag_in_force(&self) -> Option<DepthLag> {
        match self.depth_source {
            DepthSource::Management => Some(self.stats_lag.in_force()),
            DepthSource::Amqp => None,
        }
    }
}

impl Drop for RabbitMq {
    fn drop(&mut self) {
        if let Some(task) = self.measuring.get_mut().take() {
            task.abort();
        }
    }
}
