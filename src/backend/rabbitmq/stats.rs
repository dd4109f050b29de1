//! How far the management API's queue counts trail the data plane: measured from the
//! broker, not assumed.
//!
//! A count reaches `GET /api/queues/…` through two stages. The queue process emits its
//! counts every `collect_statistics_interval` (the `rabbit` application's, default 5000 ms);
//! the management agent's collector takes what was last emitted every smallest sample
//! interval of its `basic` retention policy (5 s by default, *whatever* the statistics
//! interval is: with the interval at 1 s the local broker still shows a burst up to 5.7 s
//! late). A message stored just after one stage ran waits out both, so a count trails by
//! up to one emission interval plus one collector tick.
//!
//! Neither number is in the management API: no endpoint (`/api/overview`, `/api/nodes`,
//! `/api/nodes/{name}`, in RabbitMQ 3.10 or the current source) returns the application
//! environment, and `/api/overview`'s `sample_retention_policies` keeps only the ages, not
//! the sample intervals. So the refresh is measured instead: a node's `uptime` (ms on the
//! node's own clock) is emitted and collected the same way, so the distinct values
//! `GET /api/nodes?columns=name,uptime` shows in turn are one refresh period `S` apart, as
//! the broker's clock counts it (the poll's timing does not enter). `S` is the slower
//! stage's period (a multiple of the emission interval), so the lag is at most `2 × S`; a
//! second is added for the collector's own work and the HTTP round trip. At RabbitMQ's
//! defaults, `S` = 5 s and the lag 11 s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::management::{Management, NodeUptime, StatsError};
use crate::backend::{DepthLag, LagSource};

/// RabbitMQ's documented default `collect_statistics_interval` (and the management agent's
/// default collector tick): the refresh assumed until one is measured.
pub const DEFAULT_REFRESH: Duration = Duration::from_millis(5000);

/// On top of two refresh periods: the collector's own work and the read's round trip.
const MARGIN: Duration = Duration::from_secs(1);

/// How often the refresh is measured again (a broker restarted with another interval).
const REMEASURE_EVERY: Duration = Duration::from_secs(5 * 60);

/// How long one measurement may take; a refresh longer than about a quarter of it is then
/// measured on one spacing (see [`Spacings::settled`]).
const MEASURE_WINDOW: Duration = Duration::from_secs(3 * 60);

/// Between polls: well under any refresh period a broker is run with, so no value is
/// missed (a missed one only makes a spacing a multiple: longer, the safe side).
const POLL_EVERY: Duration = Duration::from_millis(500);

/// One poll's deadline.
const POLL_TIMEOUT: Duration = Duration::from_secs(5);

/// Spacings wanted per node: when the emission interval does not divide the collector's
/// tick, the spacings alternate between the multiples of the interval on either side of
/// the tick; the longest of three is the upper one.
const SPACINGS: usize = 3;

/// The lag that two refresh periods of `refresh` and the margin make.
pub fn lag_for(refresh: Duration) -> Duration {
    refresh.saturating_mul(2).saturating_add(MARGIN)
}

/// The lag in force for the management depth source: read lock-free by every depth read's
/// caller, written by the measurement.
#[derive(Debug)]
pub struct StatsLag {
    /// `SENDGATE_RABBITMQ_STATS_LAG_MS`, when set.
    configured: Option<Duration>,
    /// The measured refresh in ms; 0 until one is measured.
    refresh_ms: AtomicU64,
}

impl StatsLag {
    pub fn new(configured: Option<Duration>) -> Self {
        Self {
            configured,
            refresh_ms: AtomicU64::new(0),
        }
    }

    /// The longer of the configured lag and the derived one (from the measured refresh, or
    /// the default before one is measured). A tie is shown as `configured`: the operator's
    /// number is the one in force.
    pub fn in_force(&self) -> DepthLag {
        let measured = match self.refresh_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        };
        let derived = DepthLag {
            lag: lag_for(measured.unwrap_or(DEFAULT_REFRESH)),
            source: if measured.is_some() {
                LagSource::Broker
            } else {
                LagSource::Default
            },
        };
        match self.configured {
            Some(lag) if lag >= derived.lag => DepthLag {
                lag,
                source: LagSource::Configured,
            },
            _ => derived,
        }
    }

    /// A measured refresh, rounded to the nearest 100 ms: the scheduler adds a few ms to
    /// each period (5015 ms for 5000), which the margin covers.
    pub fn set_refresh(&self, refresh: Duration) {
        let ms = u64::try_from(refresh.as_millis()).unwrap_or(u64::MAX);
        let rounded = (ms.saturating_add(50) / 100 * 100).max(100);
        self.refresh_ms.store(rounded, Ordering::Relaxed);
    }

    pub fn refresh(&self) -> Option<Duration> {
        match self.refresh_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// The spacings between successive distinct `uptime`s, per node.
#[derive(Debug, Default)]
pub struct Spacings {
    nodes: HashMap<String, Node>,
}

#[derive(Debug, Default)]
struct Node {
    last: Option<u64>,
    spacings: Vec<u64>,
}

impl Spacings {
    /// One answer of `/api/nodes`. An uptime that went back is a restarted node: what was
    /// seen of it before no longer counts.
    pub fn observe(&mut self, answer: &[NodeUptime]) {
        for n in answer {
            let node = self.nodes.entry(n.node.clone()).or_default();
            match node.last {
                Some(last) if n.uptime_ms > last => node.spacings.push(n.uptime_ms - last),
                Some(last) if n.uptime_ms == last => {}
                _ => node.spacings.clear(),
            }
            node.last = Some(n.uptime_ms);
        }
    }

    /// The refresh: the longest spacing of any node, once every node seen has `wanted`
    /// spacings (or, when `window_over`, at least one). `None` while that is not so, or
    /// when no node was seen at all.
    pub fn settled(&self, wanted: usize, window_over: bool) -> Option<Duration> {
        let needed = if window_over { 1 } else { wanted.max(1) };
        if self.nodes.is_empty() || self.nodes.values().any(|n| n.spacings.len() < needed) {
            return None;
        }
        self.nodes
            .values()
            .flat_map(|n| n.spacings.iter().copied())
            .max()
            .map(Duration::from_millis)
    }
}

/// Poll the node list until the refresh can be told (about [`SPACINGS`] + 1 periods: 20 s
/// at the defaults), or the window ends. `Ok(None)`: the broker answered but never showed
/// a node's uptime changing within the window (statistics disabled, or no node listed).
pub async fn measure(
    management: &Management,
    window: Duration,
) -> Result<Option<Duration>, StatsError> {
    let until = Instant::now() + window;
    let mut spacings = Spacings::default();
    loop {
        let deadline = (Instant::now() + POLL_TIMEOUT).min(until);
        spacings.observe(&management.node_uptimes(deadline).await?);
        let window_over = Instant::now() + POLL_EVERY >= until;
        if let Some(refresh) = spacings.settled(SPACINGS, window_over) {
            return Ok(Some(refresh));
        }
        if window_over {
            return Ok(None);
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Measure the refresh now and every [`REMEASURE_EVERY`] after, for as long as the backend
/// lives (the task is aborted when it is dropped). Runs on its own task: never on a send's
/// or a depth read's path. A failed measurement keeps what was known (the last measured
/// refresh, else the default).
pub async fn keep_measured(management: Arc<Management>, lag: Arc<StatsLag>) {
    loop {
        let before = lag.in_force();
        match measure(&management, MEASURE_WINDOW).await {
            Ok(Some(refresh)) => {
                lag.set_refresh(refresh);
                let now = lag.in_force();
                if now != before {
                    tracing::info!(
                        event = "stats_lag_measured",
                        refresh_ms = refresh.as_millis() as u64,
                        lag_ms = now.lag.as_millis() as u64,
                        source = now.source.as_str(),
                        "measured the management API's statistics refresh"
                    );
                }
            }
            Ok(None) => tracing::warn!(
                event = "stats_lag_not_measured",
                lag_ms = before.lag.as_millis() as u64,
                source = before.source.as_str(),
                "no node's statistics changed on the management API; the stats lag stays as it was"
            ),
            Err(e) => tracing::warn!(
                event = "stats_lag_not_measured",
                error = %e,
                lag_ms = before.lag.as_millis() as u64,
                source = before.source.as_str(),
                "could not measure the management API's statistics refresh; the stats lag stays as it was"
            ),
        }
        tokio::time::sleep(REMEASURE_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn answer(nodes: &[(&str, u64)]) -> Vec<NodeUptime> {
        nodes
            .iter()
            .map(|(n, u)| NodeUptime {
                node: (*n).to_owned(),
                uptime_ms: *u,
            })
            .collect()
    }

    #[test]
    fn the_lag_is_two_refreshes_and_a_second() {
        assert_eq!(lag_for(DEFAULT_REFRESH), ms(11_000));
        assert_eq!(lag_for(ms(1000)), ms(3000));
        assert_eq!(lag_for(ms(30_000)), ms(61_000));
        assert_eq!(lag_for(Duration::ZERO), ms(1000));
        assert_eq!(
            lag_for(Duration::MAX),
            Duration::MAX,
            "saturates, never panics"
        );
    }

    #[test]
    fn the_lag_in_force_is_the_longer_of_the_configured_and_the_derived() {
        let unset = StatsLag::new(None);
        assert_eq!(
            unset.in_force(),
            DepthLag {
                lag: ms(11_000),
                source: LagSource::Default
            },
            "nothing measured, nothing set: the default interval's"
        );
        unset.set_refresh(ms(5015));
        assert_eq!(unset.refresh(), Some(ms(5000)), "rounded to 100 ms");
        assert_eq!(
            unset.in_force(),
            DepthLag {
                lag: ms(11_000),
                source: LagSource::Broker
            }
        );
        unset.set_refresh(ms(30_000));
        assert_eq!(unset.in_force().lag, ms(61_000), "re-measured: the new one");

        let short = StatsLag::new(Some(ms(6000)));
        assert_eq!(
            short.in_force(),
            DepthLag {
                lag: ms(11_000),
                source: LagSource::Default
            },
            "the old 6 s default, set explicitly, is too short to be in force"
        );
        short.set_refresh(ms(1000));
        assert_eq!(
            short.in_force(),
            DepthLag {
                lag: ms(6000),
                source: LagSource::Configured
            },
            "a broker refreshing every second derives 3 s: the configured 6 s is longer"
        );

        let long = StatsLag::new(Some(ms(20_000)));
        long.set_refresh(ms(5000));
        assert_eq!(long.in_force().source, LagSource::Configured);
        assert_eq!(long.in_force().lag, ms(20_000));
        let tie = StatsLag::new(Some(ms(11_000)));
        assert_eq!(tie.in_force().source, LagSource::Configured);

        let tiny = StatsLag::new(None);
        tiny.set_refresh(ms(3));
        assert_eq!(
            tiny.refresh(),
            Some(ms(100)),
            "never 0, which means unmeasured"
        );
    }

    #[test]
    fn the_refresh_is_the_longest_spacing_once_every_node_has_enough() {
        let mut s = Spacings::default();
        assert_eq!(s.settled(3, true), None, "nothing seen");
        s.observe(&[]);
        assert_eq!(s.settled(3, true), None, "no node listed");
        // The local broker: interval 1 s, collector 5 s.
        for uptime in [509_908, 509_908, 514_923, 514_923, 519_944, 524_960] {
            s.observe(&answer(&[("rabbit@a", uptime)]));
        }
        assert_eq!(s.settled(3, false), Some(ms(5021)), "5015, 5021, 5016");

        // Interval 3 s under a 5 s collector: spacings of 6 and 3; the longest is taken.
        let mut s = Spacings::default();
        for uptime in [0, 6000, 9000] {
            s.observe(&answer(&[("a", uptime)]));
        }
        assert_eq!(s.settled(3, false), None, "two spacings so far");
        s.observe(&answer(&[("a", 15_000)]));
        assert_eq!(s.settled(3, false), Some(ms(6000)));
    }

    #[test]
    fn every_node_must_have_shown_its_refresh_and_a_restart_starts_over() {
        let mut s = Spacings::default();
        s.observe(&answer(&[("a", 1000), ("b", 500)]));
        s.observe(&answer(&[("a", 6000), ("b", 500)]));
        assert_eq!(s.settled(3, false), None);
        assert_eq!(s.settled(3, true), None, "b never changed");
        s.observe(&answer(&[("a", 11_000), ("b", 10_500)]));
        assert_eq!(
            s.settled(3, true),
            Some(ms(10_000)),
            "the window is over: one spacing each, the longest wins"
        );

        let mut s = Spacings::default();
        s.observe(&answer(&[("a", 50_000)]));
        s.observe(&answer(&[("a", 55_000)]));
        s.observe(&answer(&[("a", 200)])); // restarted
        assert_eq!(s.settled(1, true), None, "nothing since the restart");
        s.observe(&answer(&[("a", 1200)]));
        assert_eq!(s.settled(1, true), Some(ms(1000)));
    }

    /// A management API that answers `/api/nodes` with these bodies in turn (the last one
    /// for ever after).
    async fn stub(bodies: &[&'static str]) -> Management {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = reqwest::Url::parse(&format!("http://{}", listener.local_addr().unwrap()));
        let bodies = bodies.to_vec();
        tokio::spawn(async move {
            for i in 0.. {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let mut request = [0u8; 2048];
                let _ = socket.read(&mut request).await;
                let body = bodies[i.min(bodies.len() - 1)];
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        Management::new(
            url.unwrap(),
            "/",
            "u".into(),
            crate::config::Secret::new("p"),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_malformed_or_incomplete_answer_leaves_the_default_in_force() {
        let lag = StatsLag::new(None);
        let m = stub(&["<html>"]).await;
        assert!(matches!(
            measure(&m, ms(1000)).await,
            Err(StatsError::Malformed(_))
        ));
        let m = stub(&[r#"[{"name":"rabbit@a"}]"#, r#"{"uptime":5}"#]).await;
        assert!(matches!(
            measure(&m, ms(3000)).await,
            Err(StatsError::Malformed(_))
        ));
        // No uptime at all (statistics off): the window ends with nothing measured.
        let m = stub(&[r#"[{"name":"rabbit@a","running":true}]"#]).await;
        assert_eq!(measure(&m, ms(1200)).await, Ok(None));
        assert_eq!(lag.in_force().source, LagSource::Default);
        assert_eq!(lag.in_force().lag, ms(11_000));
    }

    #[tokio::test]
    async fn successive_uptimes_measure_the_refresh() {
        let m = stub(&[
            r#"[{"name":"rabbit@a","uptime":1000}]"#,
            r#"[{"name":"rabbit@a","uptime":3000}]"#,
            r#"[{"name":"rabbit@a","uptime":5000}]"#,
            r#"[{"name":"rabbit@a","uptime":7000}]"#,
        ])
        .await;
        let refresh = measure(&m, ms(10_000)).await.unwrap();
        assert_eq!(refresh, Some(ms(2000)));
        let lag = StatsLag::new(None);
        lag.set_refresh(refresh.unwrap());
        assert_eq!(
            lag.in_force(),
            DepthLag {
                lag: ms(5000),
                source: LagSource::Broker
            }
        );
    }
}
