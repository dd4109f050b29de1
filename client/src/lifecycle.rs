//! The lifecycle probe: may a send go now, or is the gateway draining (or starting) so
//! the producer should wait instead of spending its retries against it?
//!
//! One verdict is cached for `ttl` (5 s; a waiting one for about a second, see below) and
//! shared by every concurrent send of a client, and only one probe is ever in flight
//! (single-flight): callers that find the verdict stale queue on an async mutex, the
//! first one probes, and the rest find its fresh verdict when their turn comes. A burst
//! of 1,000 sends therefore costs one probe.
//!
//! The probe is advisory: any error (transport, timeout, 5xx, a body that does not parse,
//! a 401) reads as "not draining", and the send's own answer stays authoritative — the
//! contract's rule, so a probe can never block a send. A 401 is logged louder (a
//! credential problem, which the send's own 401 then reports for good) but not cached as
//! terminal: something in front of the gateway may guard `/health/detailed` otherwise
//! than the send route. A 403 means the token is known but lacks the `observer` role (a
//! plain `sender` key, the usual producer key): probing simply stops for this client and
//! the sends go ahead; a `503 draining` from a send still makes the client wait
//! ([`LifecycleProbe::observe_defer`]).
//!
//! States: `running` → go. `draining` → wait `drain.remaining_s` (the window left), at
//! most 1 s, then probe again: the window is an upper bound (an idle drain ends after its
//! linger, and the restarted gateway runs a second later), so the end of a drain is
//! noticed within about a second rather than after a cached `ttl`; still one probe at a
//! time, so at most about one `GET` a second per client. `starting` → wait briefly (1 s,
//! the gateway's own `Retry-After` while starting; starting lasts a few seconds at most)
//! and probe again. `stopped` → the process is about to exit; wait 1 s like starting, as
//! the next one is probably on its way. A state this version does not know is an unusable
//! answer (the transport says so), and reads as go.
//!
//! A send that could not connect at all (nothing listening: the gap of a restart on the
//! same port) stored nothing: [`LifecycleProbe::observe_unreachable`] makes every send
//! wait briefly, like `starting`, and then probe again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sendgate_wire::GatewayState;
use tokio::time::Instant;

use super::retry::MAX_RETRY_AFTER;
use super::transport::{ProbeAnswer, Transport};

/// Shortest wait before asking again, so a drain announced with 0.01 s left does not
/// turn into a busy loop of probes.
const MIN_DEFER: Duration = Duration::from_millis(250);
/// How long `starting`, `stopped` and an unreachable gateway defer before the next probe,
/// and the longest a `draining` verdict is kept: a drain's end is noticed this soon.
const BRIEF_DEFER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Send now.
    Go,
    /// Wait until `until`, then ask again; `state` is what the gateway said.
    /// `drain_ends` is when the gateway announced the drain ends (its window's
    /// `remaining_s`, or a `503 draining`'s `Retry-After`, the restart's expected end): a
    /// send's deadline follows it.
    /// The drain may end sooner; `until` is at most 1 s away so that is noticed.
    Defer {
        until: Instant,
        state: GatewayState,
        drain_ends: Option<Instant>,
    },
    /// A send could not connect (nothing stored): wait until `until`, then ask again.
    Unreachable { until: Instant },
}

#[derive(Debug, Clone)]
struct Cached {
    verdict: Verdict,
    expires: Instant,
}

pub struct LifecycleProbe {
    transport: Arc<dyn Transport>,
    ttl: Duration,
    timeout: Duration,
    cached: Mutex<Option<Cached>>,
    /// Held while a probe is in flight; waiting on it is how concurrent callers share one.
    probing: tokio::sync::Mutex<()>,
    /// Set after a 403: this token may not read the health, so never ask again.
    forbidden: AtomicBool,
    probes: AtomicU64,
}

impl LifecycleProbe {
    pub fn new(transport: Arc<dyn Transport>, ttl: Duration, timeout: Duration) -> Self {
        Self {
            transport,
            // Bounded so that `now + ttl` can never overflow the clock.
            ttl: ttl.clamp(Duration::from_millis(1), Duration::from_secs(3600)),
            timeout,
            cached: Mutex::new(None),
            probing: tokio::sync::Mutex::new(()),
            forbidden: AtomicBool::new(false),
            probes: AtomicU64::new(0),
        }
    }

    /// Probes made so far (each one a `GET /health/detailed`).
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    /// Whether the token was found unable to read the health (a 403): no more probes.
    pub fn forbidden(&self) -> bool {
        self.forbidden.load(Ordering::Relaxed)
    }

    /// The verdict for a send about to go: cached, or from the one probe in flight.
    pub async fn verdict(&self) -> Verdict {
        if let Some(v) = self.fresh(Instant::now()) {
            return v;
        }
        let _turn = self.probing.lock().await;
        // Whoever held the lock before us may have just probed.
        if let Some(v) = self.fresh(Instant::now()) {
            return v;
        }
        if self.forbidden.load(Ordering::Relaxed) {
            return Verdict::Go;
        }
        self.probes.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::time::timeout(self.timeout, self.transport.probe())
            .await
            .unwrap_or_else(|_| ProbeAnswer::Unusable("health probe timed out".into()));
        let now = Instant::now();
        let (verdict, expires) = match answer {
            ProbeAnswer::State {
                gateway_state,
                remaining,
            } => match gateway_state {
                GatewayState::Draining => self.defer(now, remaining, gateway_state),
                GatewayState::Starting | GatewayState::Stopped => {
                    self.defer(now, None, gateway_state)
                }
                GatewayState::Running => (Verdict::Go, now + self.ttl),
            },
            ProbeAnswer::Unauthenticated { code } => {
                // Not terminal (contract §7: any probe error reads as "not draining"): the
                // send's own answer decides, and a 401 there is final.
                tracing::warn!(
                    event = "client_probe_failed",
                    status = 401,
                    code = code.as_str(),
                    "lifecycle probe refused the token; sending anyway, the send's own answer decides"
                );
                (Verdict::Go, now + self.ttl)
            }
            ProbeAnswer::Forbidden => {
                tracing::info!(
                    event = "client_probe_forbidden",
                    "the token may not read /health/detailed (no observer role); drains are learnt from the sends' own answers"
                );
                self.forbidden.store(true, Ordering::Relaxed);
                return Verdict::Go;
            }
            ProbeAnswer::Unusable(why) => {
                tracing::debug!(event = "client_probe_failed", error = %why, "lifecycle probe failed; sending anyway");
                (Verdict::Go, now + self.ttl)
            }
        };
        *self.cached.lock() = Some(Cached {
            verdict: verdict.clone(),
            expires,
        });
        verdict
    }

    /// A send was answered `503 draining` or `starting`: share that with every other send
    /// until its `Retry-After` (at most `ttl`) instead of letting each one find out alone.
    /// Returns the verdict, so the send that met the drain follows it like the others.
    pub fn observe_defer(&self, state: GatewayState, retry_after: Option<Duration>) -> Verdict {
        let (verdict, expires) = self.defer(Instant::now(), retry_after, state);
        *self.cached.lock() = Some(Cached {
            verdict: verdict.clone(),
            expires,
        });
        verdict
    }

    /// A send could not connect: nothing listens (a restart's gap). Every send waits
    /// BRIEF_DEFER (at most the ttl) and then probes again, instead of spending its
    /// attempts on a closed port. Returns the verdict, like [`Self::observe_defer`].
    pub fn observe_unreachable(&self) -> Verdict {
        let until = Instant::now() + BRIEF_DEFER.min(self.ttl);
        let verdict = Verdict::Unreachable { until };
        *self.cached.lock() = Some(Cached {
            verdict: verdict.clone(),
            expires: until,
        });
        verdict
    }

    /// Wait for the time announced (a drain's time left, a `Retry-After`; BRIEF_DEFER
    /// without one), at least MIN_DEFER and at most the ttl; a drain at most BRIEF_DEFER,
    /// as it may end long before its window does. Only a drain's announcement is a drain
    /// end the send's deadline may follow.
    fn defer(
        &self,
        now: Instant,
        announced: Option<Duration>,
        state: GatewayState,
    ) -> (Verdict, Instant) {
        let announced = announced.map(|a| a.min(MAX_RETRY_AFTER));
        let longest = match state {
            GatewayState::Draining => self.ttl.min(BRIEF_DEFER),
            _ => self.ttl,
        };
        // Not `clamp`: it panics when the caller's ttl is below MIN_DEFER.
        let until = now + announced.unwrap_or(BRIEF_DEFER).max(MIN_DEFER).min(longest);
        let drain_ends = match state {
            GatewayState::Draining => announced.map(|a| now + a),
            _ => None,
        };
        (
            Verdict::Defer {
                until,
                state,
                drain_ends,
            },
            until,
        )
    }

    fn fresh(&self, now: Instant) -> Option<Verdict> {
        match &*self.cached.lock() {
            Some(c) if now < c.expires => Some(c.verdict.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Answer, BatchAnswer, Outgoing, OutgoingBatch, TransportError};
    use async_trait::async_trait;
    use sendgate_wire::ErrorCode;

    /// Answers every probe with the next scripted answer (the last one repeats), after a
    /// delay, counting calls.
    struct Scripted {
        answers: Mutex<Vec<ProbeAnswer>>,
        delay: Duration,
        calls: AtomicU64,
    }

    impl Scripted {
        fn new(answers: Vec<ProbeAnswer>, delay: Duration) -> Arc<Self> {
            Arc::new(Self {
                answers: Mutex::new(answers),
                delay,
                calls: AtomicU64::new(0),
            })
        }
    }

    #[async_trait]
    impl Transport for Scripted {
        async fn post(&self, _: &str, _: &Outgoing) -> Result<Answer, TransportError> {
            Err(TransportError::Unknown("not in this test".into()))
        }

        async fn post_batch(
            &self,
            _: &str,
            _: &OutgoingBatch,
        ) -> Result<BatchAnswer, TransportError> {
            Err(TransportError::Unknown("not in this test".into()))
        }

        async fn probe(&self) -> ProbeAnswer {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            let mut a = self.answers.lock();
            if a.len() > 1 {
                a.remove(0)
            } else {
                a[0].clone()
            }
        }
    }

    fn state(s: GatewayState, remaining: Option<f64>) -> ProbeAnswer {
        ProbeAnswer::State {
            gateway_state: s,
            remaining: remaining.map(Duration::from_secs_f64),
        }
    }

    fn probe_of(t: &Arc<Scripted>) -> Arc<LifecycleProbe> {
        Arc::new(LifecycleProbe::new(
            t.clone(),
            Duration::from_secs(5),
            Duration::from_secs(3),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_concurrent_callers_share_one_probe_per_ttl() {
        let t = Scripted::new(
            vec![state(GatewayState::Running, None)],
            Duration::from_millis(200),
        );
        let probe = probe_of(&t);
        let callers: Vec<_> = (0..1000)
            .map(|_| {
                let p = probe.clone();
                tokio::spawn(async move { p.verdict().await })
            })
            .collect();
        for c in callers {
            assert_eq!(c.await.unwrap(), Verdict::Go);
        }
        assert_eq!(t.calls.load(Ordering::SeqCst), 1);
        assert_eq!(probe.probes(), 1);

        // Still fresh 4 s later; stale after 5 s, when exactly one more probe is made.
        tokio::time::advance(Duration::from_secs(4)).await;
        probe.verdict().await;
        assert_eq!(probe.probes(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        let again: Vec<_> = (0..100)
            .map(|_| {
                let p = probe.clone();
                tokio::spawn(async move { p.verdict().await })
            })
            .collect();
        for c in again {
            c.await.unwrap();
        }
        assert_eq!(probe.probes(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_draining_gateway_defers_for_the_window_left_but_at_most_a_second() {
        let t = Scripted::new(
            vec![
                state(GatewayState::Draining, Some(0.5)),
                state(GatewayState::Draining, Some(40.0)),
                state(GatewayState::Draining, None),
                state(GatewayState::Running, None),
            ],
            Duration::ZERO,
        );
        let probe = probe_of(&t);
        let start = Instant::now();
        let Verdict::Defer { until, state, .. } = probe.verdict().await else {
            panic!("draining defers")
        };
        assert_eq!(state, GatewayState::Draining);
        assert_eq!(until - start, Duration::from_millis(500));
        // Everyone asking before then gets the same verdict without a probe.
        assert!(matches!(probe.verdict().await, Verdict::Defer { .. }));
        assert_eq!(probe.probes(), 1);

        tokio::time::sleep_until(until).await;
        let Verdict::Defer { until, .. } = probe.verdict().await else {
            panic!()
        };
        assert_eq!(
            until - Instant::now(),
            BRIEF_DEFER,
            "the window is an upper bound: asked again within a second"
        );
        tokio::time::sleep_until(until).await;
        let Verdict::Defer { until, .. } = probe.verdict().await else {
            panic!()
        };
        assert_eq!(until - Instant::now(), BRIEF_DEFER, "no hint: a brief wait");
        tokio::time::sleep_until(until).await;
        assert_eq!(probe.verdict().await, Verdict::Go);
    }

    #[tokio::test(start_paused = true)]
    async fn a_ttl_shorter_than_the_shortest_defer_caps_the_wait_without_panicking() {
        // `probe_ttl` is the caller's: one below MIN_DEFER must not turn a draining answer
        // into a panic (`Duration::clamp` with min > max).
        let ttl = Duration::from_millis(100);
        let t = Scripted::new(
            vec![state(GatewayState::Draining, Some(2.0))],
            Duration::ZERO,
        );
        let probe = LifecycleProbe::new(t.clone(), ttl, Duration::from_secs(3));
        let start = Instant::now();
        let Verdict::Defer { until, .. } = probe.verdict().await else {
            panic!("draining defers")
        };
        assert_eq!(until - start, ttl);
        probe.observe_defer(GatewayState::Draining, Some(Duration::from_secs(3)));
        let Verdict::Defer { until, .. } = probe.verdict().await else {
            panic!("still deferred")
        };
        assert_eq!(until - Instant::now(), ttl);
    }

    #[tokio::test(start_paused = true)]
    async fn starting_and_stopped_defer_briefly() {
        for s in [GatewayState::Starting, GatewayState::Stopped] {
            let t = Scripted::new(vec![state(s, None)], Duration::ZERO);
            let probe = probe_of(&t);
            let now = Instant::now();
            let Verdict::Defer { until, .. } = probe.verdict().await else {
                panic!("{s} defers")
            };
            assert_eq!(until - now, Duration::from_secs(1), "{s}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn any_probe_failure_reads_as_not_draining_and_is_cached_too() {
        for answer in [
            ProbeAnswer::Unusable("health answered 500".into()),
            ProbeAnswer::Unusable("could not connect".into()),
            ProbeAnswer::Unusable("health names an unknown gateway_state \"sideways\"".into()),
        ] {
            let t = Scripted::new(vec![answer.clone()], Duration::ZERO);
            let probe = probe_of(&t);
            assert_eq!(probe.verdict().await, Verdict::Go, "{answer:?}");
            probe.verdict().await;
            assert_eq!(probe.probes(), 1, "a failed probe is not repeated per send");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_hangs_times_out_after_3_s_as_not_draining() {
        let t = Scripted::new(
            vec![state(GatewayState::Draining, Some(20.0))],
            Duration::from_secs(60),
        );
        let probe = probe_of(&t);
        let start = Instant::now();
        assert_eq!(probe.verdict().await, Verdict::Go);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_401_reads_as_not_draining_and_is_asked_again_after_the_ttl() {
        // Contract §7: any probe error reads as "not draining"; a 401 is not terminal.
        let t = Scripted::new(
            vec![ProbeAnswer::Unauthenticated {
                code: ErrorCode::Unauthenticated.into(),
            }],
            Duration::ZERO,
        );
        let probe = probe_of(&t);
        assert_eq!(probe.verdict().await, Verdict::Go);
        assert_eq!(probe.verdict().await, Verdict::Go);
        assert_eq!(probe.probes(), 1, "cached like any failed probe");
        // A send's 503 draining is followed as usual.
        probe.observe_defer(GatewayState::Draining, Some(Duration::from_secs(3)));
        assert!(matches!(probe.verdict().await, Verdict::Defer { .. }));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(probe.verdict().await, Verdict::Go);
        assert_eq!(
            probe.probes(),
            2,
            "asked again: the credential may have been fixed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_403_stops_probing_but_not_sending() {
        let t = Scripted::new(vec![ProbeAnswer::Forbidden], Duration::ZERO);
        let probe = probe_of(&t);
        assert_eq!(probe.verdict().await, Verdict::Go);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(probe.verdict().await, Verdict::Go);
        assert_eq!(probe.probes(), 1, "never asked again");
        // Drains are still learnt from the sends.
        probe.observe_defer(GatewayState::Draining, Some(Duration::from_secs(2)));
        assert!(matches!(probe.verdict().await, Verdict::Defer { .. }));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(probe.verdict().await, Verdict::Go);
        assert_eq!(probe.probes(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_drain_announces_an_end_the_deadline_may_follow() {
        let t = Scripted::new(
            vec![state(GatewayState::Draining, Some(400.0))],
            Duration::ZERO,
        );
        let probe = probe_of(&t);
        let now = Instant::now();
        let Verdict::Defer {
            until, drain_ends, ..
        } = probe.verdict().await
        else {
            panic!("draining defers")
        };
        assert_eq!(until - now, BRIEF_DEFER, "asks again within a second");
        assert_eq!(drain_ends, Some(now + Duration::from_secs(400)));
        let Verdict::Defer { drain_ends, .. } =
            probe.observe_defer(GatewayState::Draining, Some(Duration::from_secs(90)))
        else {
            panic!()
        };
        assert_eq!(drain_ends, Some(now + Duration::from_secs(90)));
        let Verdict::Defer { drain_ends, .. } =
            probe.observe_defer(GatewayState::Starting, Some(Duration::from_secs(1)))
        else {
            panic!()
        };
        assert_eq!(drain_ends, None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_gateway_makes_every_send_wait_a_second_then_probe_again() {
        let t = Scripted::new(vec![state(GatewayState::Running, None)], Duration::ZERO);
        let probe = probe_of(&t);
        assert_eq!(probe.verdict().await, Verdict::Go);
        let now = Instant::now();
        let seen = probe.observe_unreachable();
        assert_eq!(
            seen,
            Verdict::Unreachable {
                until: now + BRIEF_DEFER
            }
        );
        // Shared without a probe, though the earlier "go" was cached for 5 s...
        assert_eq!(probe.verdict().await, seen);
        assert_eq!(probe.probes(), 1);
        // ...and asked again once the brief wait is over.
        tokio::time::advance(BRIEF_DEFER).await;
        assert_eq!(probe.verdict().await, Verdict::Go);
        assert_eq!(probe.probes(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_that_meets_a_drain_makes_every_send_wait_without_a_probe() {
        let t = Scripted::new(vec![state(GatewayState::Running, None)], Duration::ZERO);
        let probe = probe_of(&t);
        assert_eq!(probe.verdict().await, Verdict::Go);
        probe.observe_defer(GatewayState::Draining, Some(Duration::from_secs(30)));
        let now = Instant::now();
        let Verdict::Defer { until, state, .. } = probe.verdict().await else {
            panic!()
        };
        assert_eq!((until - now, state), (BRIEF_DEFER, GatewayState::Draining));
        assert_eq!(probe.probes(), 1);
    }
}
