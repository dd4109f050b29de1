//! The send loop against a scripted transport, on tokio's paused clock: what is retried,
//! when, with which key, and what is reported.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::retry::{Backoff, BudgetConfig};
use super::transport::{Answer, ProbeAnswer, Transport, TransportError};
use super::{AttemptError, Client, ClientConfig, ErrorCode, GatewayState, GaveUp, SendOutcome};

type Reply = Result<Answer, TransportError>;

/// Answers sends from a script (the last entry repeats) and probes with one answer,
/// recording when each send came and with which key.
struct Scripted {
    replies: Mutex<Vec<Reply>>,
    probe: ProbeAnswer,
    posts: Mutex<Vec<(Instant, String)>>,
}

impl Scripted {
    fn new(replies: Vec<Reply>) -> Arc<Self> {
        Self::probing(replies, running())
    }

    fn probing(replies: Vec<Reply>, probe: ProbeAnswer) -> Arc<Self> {
        Arc::new(Self {
            replies: Mutex::new(replies),
            probe,
            posts: Mutex::new(Vec::new()),
        })
    }

    fn posts(&self) -> Vec<(Instant, String)> {
        self.posts.lock().clone()
    }
}

#[async_trait]
impl Transport for Scripted {
    async fn post(&self, _queue: &str, _body: Bytes, key: &str) -> Reply {
        self.posts.lock().push((Instant::now(), key.to_owned()));
        let mut r = self.replies.lock();
        if r.len() > 1 {
            r.remove(0)
        } else {
            r[0].clone()
        }
    }

    async fn probe(&self) -> ProbeAnswer {
        self.probe.clone()
    }
}

fn running() -> ProbeAnswer {
    ProbeAnswer::State {
        gateway_state: GatewayState::Running,
        remaining: None,
    }
}

fn answer(status: u16, code: ErrorCode, retry_after_s: Option<u64>) -> Reply {
    Ok(Answer {
        status,
        code: Some(code.into()),
        message_id: None,
        retry_after: retry_after_s.map(Duration::from_secs),
    })
}

fn created(id: &str) -> Reply {
    Ok(Answer {
        status: 201,
        code: None,
        message_id: Some(id.into()),
        retry_after: None,
    })
}

fn client(t: &Arc<Scripted>, config: ClientConfig) -> Client {
    Client::with_transport(config, t.clone())
}

fn config() -> ClientConfig {
    ClientConfig::new("http://unused")
}

#[tokio::test(start_paused = true)]
async fn retry_after_30_from_fail_closed_is_honoured_to_the_second() {
    let t = Scripted::new(vec![
        answer(503, ErrorCode::CapacityUnknown, Some(30)),
        created("k-1"),
    ]);
    let c = client(&t, config());
    let start = Instant::now();
    let send = tokio::spawn({
        let c = c.clone();
        async move { c.send("requests", "{}", Some("k-1")).await }
    });

    // The paused clock jumps to each timer: no retry may be due before 30 s, and the
    // jitter on top of it is at most the first retry's 200 ms.
    tokio::time::sleep(Duration::from_millis(29_999)).await;
    assert_eq!(t.posts().len(), 1, "no retry before Retry-After");
    tokio::time::sleep(Duration::from_millis(202)).await;
    assert_eq!(t.posts().len(), 2, "the retry comes within 30.2 s");

    assert_eq!(
        send.await.unwrap(),
        SendOutcome::Queued {
            message_id: "k-1".into()
        }
    );
    let posts = t.posts();
    let waited = posts[1].0 - start;
    assert!(
        waited >= Duration::from_secs(30) && waited <= Duration::from_millis(30_200),
        "{waited:?}"
    );
    assert!(posts.iter().all(|(_, key)| key == "k-1"));
    assert_eq!(c.stats().retries, 1);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_carries_the_same_key_and_exhaustion_is_failed_never_sent() {
    let t = Scripted::new(vec![answer(504, ErrorCode::SendTimeout, None)]);
    let c = client(
        &t,
        config().backoff(Backoff {
            max_attempts: 4,
            ..Backoff::default()
        }),
    );
    let outcome = c.send("requests", "{}", None).await;
    assert_eq!(
        outcome,
        SendOutcome::Failed {
            last_error: AttemptError::Status {
                status: 504,
                code: Some(ErrorCode::SendTimeout.into())
            },
            attempts: 4,
            gave_up: GaveUp::Attempts,
        }
    );
    let posts = t.posts();
    assert_eq!(posts.len(), 4);
    let key = &posts[0].1;
    assert!(uuid::Uuid::parse_str(key).is_ok(), "a generated key: {key}");
    assert!(
        posts.iter().all(|(_, k)| k == key),
        "one key for all attempts"
    );
    // Backoff between attempts stays under the doubling ceiling (200, 400, 800 ms).
    for (n, pair) in posts.windows(2).enumerate() {
        let gap = pair[1].0 - pair[0].0;
        assert!(gap <= Duration::from_millis(200 << n), "{n}: {gap:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_and_auth_errors_are_final_after_one_attempt() {
    for (status, code) in [
        (400, ErrorCode::InvalidRequest),
        (404, ErrorCode::UnknownQueue),
        (409, ErrorCode::QueueDisabled),
        (413, ErrorCode::PayloadTooLarge),
        (415, ErrorCode::UnsupportedMediaType),
    ] {
        let t = Scripted::new(vec![answer(status, code, None), created("x")]);
        let outcome = client(&t, config()).send("requests", "{}", None).await;
        assert_eq!(
            outcome,
            SendOutcome::Refused {
                status,
                code: Some(code.into())
            }
        );
        assert_eq!(t.posts().len(), 1, "{status} is not retried");
    }
    for (status, code) in [
        (401, ErrorCode::Unauthenticated),
        (403, ErrorCode::Forbidden),
    ] {
        let t = Scripted::new(vec![answer(status, code, None), created("x")]);
        let outcome = client(&t, config()).send("requests", "{}", None).await;
        assert_eq!(
            outcome,
            SendOutcome::AuthFailed {
                status,
                code: Some(code.into())
            }
        );
        assert_eq!(t.posts().len(), 1);
    }
    let t = Scripted::new(vec![answer(502, ErrorCode::SendFailed, None), created("x")]);
    let outcome = client(&t, config()).send("requests", "{}", None).await;
    assert!(matches!(
        outcome,
        SendOutcome::Failed {
            attempts: 1,
            gave_up: GaveUp::NotRetryable,
            ..
        }
    ));
    // A body that is not the gateway's JSON (a proxy's error page) keeps its status.
    let t = Scripted::new(vec![Ok(Answer {
        status: 413,
        code: None,
        message_id: None,
        retry_after: None,
    })]);
    let outcome = client(&t, config()).send("requests", "{}", None).await;
    assert_eq!(
        outcome,
        SendOutcome::Refused {
            status: 413,
            code: None
        }
    );
    assert_eq!(outcome.to_string(), "refused: 413 http_413");
}

#[tokio::test(start_paused = true)]
async fn transport_errors_429_and_503_are_retried() {
    let t = Scripted::new(vec![
        Err(TransportError::Unknown("timed out".into())),
        answer(429, ErrorCode::QueueFull, Some(1)),
        answer(503, ErrorCode::Saturated, Some(1)),
        created("m"),
    ]);
    let outcome = client(&t, config()).send("requests", "{}", Some("m")).await;
    assert_eq!(
        outcome,
        SendOutcome::Queued {
            message_id: "m".into()
        }
    );
    let posts = t.posts();
    assert_eq!(posts.len(), 4);
    assert!(posts[2].0 - posts[1].0 >= Duration::from_secs(1));
    assert!(posts[3].0 - posts[2].0 >= Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_draining_answer_is_waited_out_without_spending_an_attempt() {
    // One attempt allowed, no retry: yet the message gets through the drain.
    let t = Scripted::new(vec![
        answer(503, ErrorCode::Draining, Some(3)),
        created("d"),
    ]);
    let c = client(
        &t,
        config().backoff(Backoff {
            max_attempts: 1,
            ..Backoff::default()
        }),
    );
    let outcome = c.send("requests", "{}", Some("d")).await;
    assert_eq!(
        outcome,
        SendOutcome::Queued {
            message_id: "d".into()
        }
    );
    let posts = t.posts();
    assert_eq!(posts.len(), 2);
    // Asked again after a second, not the 3 s announced (a window, an upper bound): the
    // probe then says running.
    assert_eq!(posts[1].0 - posts[0].0, Duration::from_secs(1));
    assert_eq!(c.stats().probes, 2);
    let stats = c.stats();
    assert_eq!(stats.retries, 0, "a wait is not a retry");
    assert!(stats.deferrals >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_drain_that_outlasts_the_deadline_is_failed_without_a_send() {
    let t = Scripted::probing(
        vec![created("never")],
        ProbeAnswer::State {
            gateway_state: GatewayState::Draining,
            remaining: Some(Duration::from_secs(20)),
        },
    );
    // A cap equal to the deadline: the announced drain cannot stretch it.
    let c = client(
        &t,
        config()
            .deadline(Duration::from_secs(12))
            .deadline_cap(Duration::from_secs(12)),
    );
    let start = Instant::now();
    let outcome = c.send("requests", "{}", None).await;
    assert_eq!(
        outcome,
        SendOutcome::Failed {
            last_error: AttemptError::StillDeferred {
                state: GatewayState::Draining
            },
            attempts: 0,
            gave_up: GaveUp::Deadline,
        }
    );
    assert_eq!(start.elapsed(), Duration::from_secs(12));
    assert!(t.posts().is_empty());
    // Re-probed as each draining verdict expired (1 s), not more often.
    assert_eq!(c.stats().probes, 13);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_deadline_fails_at_once_instead_of_retrying_early() {
    let t = Scripted::new(vec![
        answer(503, ErrorCode::CapacityUnknown, Some(30)),
        created("x"),
    ]);
    let c = client(&t, config().deadline(Duration::from_secs(5)));
    let start = Instant::now();
    let outcome = c.send("requests", "{}", None).await;
    assert_eq!(
        outcome,
        SendOutcome::Failed {
            last_error: AttemptError::Status {
                status: 503,
                code: Some(ErrorCode::CapacityUnknown.into())
            },
            attempts: 1,
            gave_up: GaveUp::Deadline,
        }
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(t.posts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_shared_budget_holds_a_failing_burst_to_a_fifth_in_retries() {
    let t = Scripted::new(vec![answer(503, ErrorCode::Saturated, Some(1))]);
    let c = client(
        &t,
        config().budget(BudgetConfig {
            ratio: 0.2,
            min_per_second: 0.0,
            window: Duration::from_secs(10),
        }),
    );
    let sends: Vec<_> = (0..100)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.send("requests", "{}", None).await })
        })
        .collect();
    let mut by_budget = 0;
    for s in sends {
        match s.await.unwrap() {
            SendOutcome::Failed {
                gave_up: GaveUp::Budget,
                ..
            } => by_budget += 1,
            SendOutcome::Failed { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    let stats = c.stats();
    assert_eq!(stats.retries, 20, "100 first attempts × 0.2");
    assert_eq!(stats.requests, 120);
    assert_eq!(by_budget, 100, "every message ended on the spent budget");
}

#[tokio::test(start_paused = true)]
async fn a_probe_401_never_blocks_the_send_whose_own_answer_decides() {
    // Contract §7: any error on the probe reads as "not draining". Something in front of
    // the gateway may guard /health/detailed on its own: the send goes and is queued.
    let refused_probe = || ProbeAnswer::Unauthenticated {
        code: ErrorCode::Unauthenticated.into(),
    };
    let t = Scripted::probing(vec![created("p-1")], refused_probe());
    let c = client(&t, config());
    assert_eq!(
        c.send("requests", "{}", Some("p-1")).await,
        SendOutcome::Queued {
            message_id: "p-1".into()
        }
    );
    assert_eq!(t.posts().len(), 1);
    assert_eq!(c.stats().deferrals, 0, "no wait either");

    // When the token really is refused, the send's own 401 says so, once, never retried.
    let t = Scripted::probing(
        vec![answer(401, ErrorCode::Unauthenticated, None), created("x")],
        refused_probe(),
    );
    let c = client(&t, config());
    assert_eq!(
        c.send("requests", "{}", None).await,
        SendOutcome::AuthFailed {
            status: 401,
            code: Some(ErrorCode::Unauthenticated.into())
        }
    );
    assert_eq!(t.posts().len(), 1, "an auth failure is never retried");
    assert_eq!(c.stats().retries, 0);

    // Any other probe failure: the same.
    let t = Scripted::probing(
        vec![created("u")],
        ProbeAnswer::Unusable("health answered 500".into()),
    );
    assert!(matches!(
        client(&t, config()).send("requests", "{}", None).await,
        SendOutcome::Queued { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_follows_a_drain_announced_longer_than_itself() {
    // The gateway drains with a 200 s window (probe and sends say so) until the drain is
    // over, 150 s in, past the 120 s deadline.
    let t = Arc::new(DrainsUntil {
        ends: Instant::now() + Duration::from_secs(150),
        window_left: Duration::from_secs(200),
    });
    let c = Client::with_transport(config(), t);
    let start = Instant::now();
    let outcome = c.send("requests", "{}", Some("long-drain")).await;
    assert_eq!(
        outcome,
        SendOutcome::Queued {
            message_id: "long-drain".into()
        }
    );
    assert!(
        start.elapsed() > Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(c.stats().retries, 0, "a drain is waited out, not retried");
}

#[tokio::test(start_paused = true)]
async fn an_announced_drain_stretches_the_deadline_only_up_to_the_cap() {
    let t = Scripted::new(vec![answer(503, ErrorCode::Draining, Some(2000))]);
    let c = client(&t, config().deadline_cap(Duration::from_secs(600)));
    let start = Instant::now();
    let outcome = c.send("requests", "{}", None).await;
    assert_eq!(
        outcome,
        SendOutcome::Failed {
            last_error: AttemptError::StillDeferred {
                state: GatewayState::Draining
            },
            attempts: 0,
            gave_up: GaveUp::Deadline,
        }
    );
    assert_eq!(start.elapsed(), Duration::from_secs(600));

    // A cap below the deadline never shortens it.
    let t = Scripted::new(vec![answer(503, ErrorCode::Draining, Some(2000))]);
    let c = client(
        &t,
        config()
            .deadline(Duration::from_secs(30))
            .deadline_cap(Duration::from_secs(1)),
    );
    let start = Instant::now();
    c.send("requests", "{}", None).await;
    assert_eq!(start.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_429_retry_after_is_never_shortened_and_the_jitter_only_adds() {
    // Forty producers refused together, all told `Retry-After: 1`: each comes back no
    // sooner than 1 s, within the first retry's 200 ms of jitter, and not all at once.
    let mut replies: Vec<Reply> = (0..40)
        .map(|_| answer(429, ErrorCode::QueueFull, Some(1)))
        .collect();
    replies.push(created("ok"));
    let t = Scripted::new(replies);
    let c = client(
        &t,
        config().budget(BudgetConfig {
            ratio: 1.0,
            ..BudgetConfig::default()
        }),
    );
    let sends: Vec<_> = (0..40)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.send("requests", "{}", Some(&format!("j-{i}"))).await })
        })
        .collect();
    for s in sends {
        assert!(matches!(s.await.unwrap(), SendOutcome::Queued { .. }));
    }
    let posts = t.posts();
    assert_eq!(posts.len(), 80);
    let mut gaps = Vec::new();
    for i in 0..40 {
        let key = format!("j-{i}");
        let at: Vec<Instant> = posts.iter().filter(|p| p.1 == key).map(|p| p.0).collect();
        gaps.push(at[1] - at[0]);
    }
    for gap in &gaps {
        assert!(
            *gap >= Duration::from_secs(1),
            "sooner than Retry-After: {gap:?}"
        );
        assert!(*gap <= Duration::from_millis(1200), "{gap:?}");
    }
    gaps.sort();
    gaps.dedup();
    assert!(gaps.len() > 10, "spread, not one wave at 1 s: {gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn waiting_out_a_drain_is_logged_as_client_deferred_with_the_wait_and_the_reason() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(logs.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let t = Scripted::new(vec![
        answer(503, ErrorCode::Draining, Some(3)),
        created("d"),
    ]);
    let c = client(&t, config());
    assert!(matches!(
        c.send("requests", "{}", Some("d")).await,
        SendOutcome::Queued { .. }
    ));
    let deferred: Vec<serde_json::Value> = logs
        .lines()
        .into_iter()
        .filter(|l| l["fields"]["event"] == "client_deferred")
        .collect();
    assert_eq!(deferred.len(), 1, "{deferred:?}");
    // The announced 3 s, checked again after 1 s (the drain may end sooner).
    assert_eq!(deferred[0]["fields"]["wait_ms"], 1000);
    assert_eq!(deferred[0]["fields"]["reason"], "draining");
    assert_eq!(c.stats().deferrals, 1, "beside the counter");
}

/// Log lines written by a tracing subscriber, kept for the test to read.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn lines(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.0.lock())
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test(start_paused = true)]
async fn a_bad_queue_or_key_is_refused_locally() {
    let t = Scripted::new(vec![created("never")]);
    let c = client(&t, config());
    assert!(matches!(
        c.send("no/such", "{}", None).await,
        SendOutcome::Invalid { .. }
    ));
    assert!(matches!(
        c.send("requests", "{}", Some("tab\there")).await,
        SendOutcome::Invalid { .. }
    ));
    assert!(t.posts().is_empty());
}

/// A gateway that drains (probe and sends say so, announcing the window left) until
/// `ends`, then runs again: what a producer sees across a restart on the same port.
struct DrainsUntil {
    ends: Instant,
    window_left: Duration,
}

#[async_trait]
impl Transport for DrainsUntil {
    async fn post(&self, _queue: &str, _body: Bytes, key: &str) -> Reply {
        if Instant::now() < self.ends {
            answer(503, ErrorCode::Draining, Some(self.window_left.as_secs()))
        } else {
            created(key)
        }
    }

    async fn probe(&self) -> ProbeAnswer {
        if Instant::now() < self.ends {
            ProbeAnswer::State {
                gateway_state: GatewayState::Draining,
                remaining: Some(self.window_left),
            }
        } else {
            running()
        }
    }
}

/// Review 15: a drain announces its *window* (30 s by default) though an idle drain ends
/// after the linger (5 s) and the restarted gateway may run a second later. The client
/// caches the "draining" verdict for its full 5 s TTL, so every producer idles up to 5 s
/// after the gateway is back (observed live: ~5 s waits per restart). While draining —
/// exactly when the state is about to change — the verdict should be re-checked soon
/// (about a second), not held for the TTL.
#[tokio::test(start_paused = true)]
async fn the_end_of_a_drain_is_noticed_within_about_a_second_not_the_verdict_ttl() {
    let start = Instant::now();
    let t = Arc::new(DrainsUntil {
        ends: start + Duration::from_millis(1500),
        window_left: Duration::from_secs(28),
    });
    let c = Client::with_transport(config(), t.clone());
    let outcome = c.send("requests", "{}", Some("r-1")).await;
    assert_eq!(
        outcome,
        SendOutcome::Queued {
            message_id: "r-1".into()
        }
    );
    let queued_after = start.elapsed();
    assert!(
        queued_after <= Duration::from_millis(2600),
        "the gateway ran again at 1.5 s; the message went at {queued_after:?}"
    );
}

/// Review 15: a restart on the same port leaves a gap with nothing listening (the old
/// process has exited, the new one has not bound yet). The probe's transport error reads
/// as "go" for 5 s and each refused connection is a retry: 5 attempts with full jitter
/// (≤ 0.2 + 0.4 + 0.8 + 1.6 s) are spent in under 3 s, so a 4 s gap fails the message
/// although the deadline (120 s, "so a rolling restart is waited out") is far away.
#[tokio::test(start_paused = true)]
async fn a_short_restart_gap_does_not_fail_a_message_whose_deadline_is_far() {
    struct Gap {
        back_at: Instant,
    }
    #[async_trait]
    impl Transport for Gap {
        async fn post(&self, _queue: &str, _body: Bytes, key: &str) -> Reply {
            if Instant::now() < self.back_at {
                Err(TransportError::Connect("connection refused".into()))
            } else {
                created(key)
            }
        }
        async fn probe(&self) -> ProbeAnswer {
            if Instant::now() < self.back_at {
                ProbeAnswer::Unusable("connection refused".into())
            } else {
                running()
            }
        }
    }
    let t = Arc::new(Gap {
        back_at: Instant::now() + Duration::from_secs(4),
    });
    let c = Client::with_transport(config(), t);
    let outcome = c.send("requests", "{}", Some("g-1")).await;
    assert_eq!(
        outcome,
        SendOutcome::Queued {
            message_id: "g-1".into()
        }
    );
}

/// A gateway that never comes back: the closed port is waited on (logged and counted as
/// a deferral, never an attempt nor a retry) until the deadline, which still ends it.
#[tokio::test(start_paused = true)]
async fn an_unreachable_gateway_is_waited_on_until_the_deadline_without_an_attempt() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(logs.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let t = Scripted::probing(
        vec![Err(TransportError::Connect("connection refused".into()))],
        ProbeAnswer::Unusable("could not connect".into()),
    );
    let c = client(&t, config().deadline(Duration::from_secs(5)));
    let start = Instant::now();
    let outcome = c.send("requests", "{}", Some("u-1")).await;
    assert_eq!(
        outcome,
        SendOutcome::Failed {
            last_error: AttemptError::Transport("connection refused".into()),
            attempts: 0,
            gave_up: GaveUp::Deadline,
        }
    );
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let posts = t.posts();
    // One connection a second (1 s plus at most 200 ms of jitter), never faster: at 0 s,
    // then four more before the deadline.
    assert_eq!(posts.len(), 5);
    for pair in posts.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(gap >= Duration::from_secs(1) && gap <= Duration::from_millis(1200));
    }
    let stats = c.stats();
    assert_eq!((stats.retries, stats.budget_refusals), (0, 0));
    assert_eq!(stats.requests, 0, "no request ever reached a gateway");
    // Each refused connection was followed by a wait (the last one cut by the deadline).
    assert_eq!(stats.deferrals, posts.len() as u64);
    let unreachable = logs
        .lines()
        .into_iter()
        .filter(|l| {
            l["fields"]["event"] == "client_deferred" && l["fields"]["reason"] == "unreachable"
        })
        .count();
    assert_eq!(unreachable as u64, stats.deferrals);
}

/// Review 15 (bench comparison 7, Jain 0.74–0.87): producers refused together at a full
/// queue are all told `Retry-After: 1`, and the gate opens again at its next depth read,
/// its free slots taken within tens of milliseconds by whoever is there. A jitter that
/// grows with the attempt (full jitter's `base·2^(n-1)`: ≤ 0.2, 0.4, 0.8, 1.6 s on top of
/// the second) sends a message refused three times back 1.8 s later, past the opening,
/// while a producer on a fresh message comes back within 1.2 s and takes the slots: the
/// producers that waited longest are pushed back furthest, and a few keep winning. The
/// gateway's `Retry-After` already says when its answer can change; the client's jitter
/// on top only spreads producers refused together, so it stays the first retry's on every
/// attempt.
#[tokio::test(start_paused = true)]
async fn the_jitter_on_a_retry_after_does_not_grow_with_the_attempts() {
    let mut replies: Vec<Reply> = Vec::new();
    for _ in 0..4 {
        replies.extend((0..40).map(|_| answer(429, ErrorCode::QueueFull, Some(1))));
    }
    replies.push(created("ok"));
    let t = Scripted::new(replies);
    let c = client(
        &t,
        config().budget(BudgetConfig {
            ratio: 5.0,
            ..BudgetConfig::default()
        }),
    );
    let sends: Vec<_> = (0..40)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.send("requests", "{}", Some(&format!("g-{i}"))).await })
        })
        .collect();
    for s in sends {
        assert!(matches!(s.await.unwrap(), SendOutcome::Queued { .. }));
    }
    let posts = t.posts();
    assert_eq!(posts.len(), 200, "five attempts each");
    for i in 0..40 {
        let key = format!("g-{i}");
        let at: Vec<Instant> = posts.iter().filter(|p| p.1 == key).map(|p| p.0).collect();
        for (n, pair) in at.windows(2).enumerate() {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= Duration::from_secs(1) && gap <= Duration::from_millis(1200),
                "{key}, retry {}: {gap:?} (Retry-After 1 s plus at most the first retry's 200 ms)",
                n + 1
            );
        }
    }
}

/// Review 15 (a review of the change below): with the attempt cap no longer ending a paced
/// message, the shared retry budget did, within a second or two, for any client with more
/// than one message in flight (`sendgate send` keeps 8): each paced retry took a token, and
/// the budget refills at about one a second. A retry the gateway paced (`429 queue_full`
/// with a `Retry-After` of at least a second) is at the rate the gateway asked for: it
/// takes no token. Eight messages refused for 20 s are all queued once room comes.
#[tokio::test(start_paused = true)]
async fn paced_retries_of_many_messages_in_flight_do_not_spend_the_retry_budget() {
    let mut replies: Vec<Reply> = (0..8 * 20)
        .map(|_| answer(429, ErrorCode::QueueFull, Some(1)))
        .collect();
    replies.push(created("ok"));
    let t = Scripted::new(replies);
    let c = client(&t, config());
    let sends: Vec<_> = (0..8)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.send("requests", "{}", Some(&format!("m-{i}"))).await })
        })
        .collect();
    for s in sends {
        let outcome = s.await.unwrap();
        assert!(matches!(outcome, SendOutcome::Queued { .. }), "{outcome:?}");
    }
    assert_eq!(c.stats().budget_refusals, 0);
    // A Retry-After of 0 is no pacing (the gateway never says less than 1 s): it counts.
    let t = Scripted::new(vec![answer(429, ErrorCode::QueueFull, Some(0))]);
    let outcome = client(&t, config()).send("requests", "{}", None).await;
    assert!(
        matches!(
            outcome,
            SendOutcome::Failed {
                gave_up: GaveUp::Attempts,
                ..
            }
        ),
        "{outcome:?}"
    );
}

/// Review 15 (bench comparison 7: 42–75 messages failed per 60 s side, at a queue its
/// consumer drained at 200 msg/s the whole time): a `429 queue_full` with a `Retry-After`
/// is the gateway pacing its producers (the queue is at its ceiling and says when to ask
/// again), not an attempt that failed; five of them ended a message after ~5 s although
/// its deadline was 120 s away and its share of the room was coming. Such answers are
/// bounded by the deadline and the retry budget, not by the attempt cap; every other
/// retryable answer (a `503`, a `504`, a `429` that is not the gateway's) still is.
#[tokio::test(start_paused = true)]
async fn a_full_queue_that_says_when_to_ask_again_is_waited_on_past_the_attempt_cap() {
    let mut replies: Vec<Reply> = (0..12)
        .map(|_| answer(429, ErrorCode::QueueFull, Some(1)))
        .collect();
    replies.push(created("p-1"));
    let t = Scripted::new(replies);
    let c = client(&t, config());
    assert_eq!(
        c.send("requests", "{}", Some("p-1")).await,
        SendOutcome::Queued {
            message_id: "p-1".into()
        }
    );
    assert_eq!(t.posts().len(), 13);

    // The deadline still ends it...
    let t = Scripted::new(vec![answer(429, ErrorCode::QueueFull, Some(1))]);
    let c = client(&t, config().deadline(Duration::from_secs(10)));
    let start = Instant::now();
    let outcome = c.send("requests", "{}", Some("p-2")).await;
    assert!(
        matches!(
            outcome,
            SendOutcome::Failed {
                gave_up: GaveUp::Deadline,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(start.elapsed() <= Duration::from_secs(10));
    let n = t.posts().len();
    assert!((9..=10).contains(&n), "about one a second: {n}");

    // ...and a 429 that is not the gateway's (a proxy's page), or without a Retry-After,
    // counts against the cap like any other retryable answer.
    for reply in [
        Ok(Answer {
            status: 429,
            code: None,
            message_id: None,
            retry_after: Some(Duration::from_secs(1)),
        }),
        answer(429, ErrorCode::QueueFull, None),
    ] {
        let t = Scripted::new(vec![reply]);
        let outcome = client(&t, config()).send("requests", "{}", None).await;
        assert!(
            matches!(
                outcome,
                SendOutcome::Failed {
                    attempts: 5,
                    gave_up: GaveUp::Attempts,
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
}
