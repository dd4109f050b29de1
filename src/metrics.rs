//! `GET /metrics`: Prometheus text format.
//!
//! Two kinds of series. Those the hot path must count as they happen (requests by queue,
//! status, code and backend; the send-latency, request-latency, `Retry-After` and
//! depth-read histograms) live in a per-application registry — per application, not
//! global, so several gateways in one process (tests) never share counts; the process's
//! own (`process_*`) and `sendgate_build_info` are in it too. Everything that is state
//! (backlog, streak, breaker, in-flight, lifecycle, depth reads, the drain rate) is read
//! from its owner at scrape time, so the request path pays nothing for it.
//!
//! The depth reads are timed by [`TimedReads`], a decorator start-up puts around each
//! backend: every read the gates and the probes make goes through it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::coordination::Coordination;
use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use actix_web::http::StatusCode;

use crate::admission::breaker::BreakerState;
use crate::admission::{BackendRole, Dispatcher};
use crate::backend::{
    Backend, Backlog, DepthError, DepthLag, OutgoingMessage, SendError, SendReceipt, StoreHealth,
};
use crate::domain::{Attributes, Field, QueueName};
use crate::lifecycle::{GatewayState, Lifecycle};
use crate::otel::SpanCounts;
use crate::transport::Connections;

/// How one send request was answered, as the handler decided it: what
/// `sendgate_requests_total` counts it under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestOutcome {
    pub status: StatusCode,
    /// `queued`, `valid`, or the error code of the refusal.
    pub code: &'static str,
    /// The backend the send was routed to, if it got that far.
    pub backend: Option<BackendRole>,
}

impl RequestOutcome {
    /// The `status`, `code` and `backend` labels (`backend="none"` when no lane was chosen).
    fn labels<'b>(&self, status_buf: &'b mut [u8; 3]) -> [&'b str; 3] {
        [
            status_str(self.status.as_u16(), status_buf),
            self.code,
            self.backend.map_or("none", BackendRole::as_str),
        ]
    }
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    send_seconds: HistogramVec,
    request_seconds: HistogramVec,
    retry_after: HistogramVec,
    depth_read_seconds: HistogramVec,
}

/// The latency buckets (seconds) of the send, request and depth-read histograms.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The buckets (whole seconds) of the `Retry-After` values given: 1 s up to the longest
/// `SENDGATE_RETRY_AFTER_MAX_S` and drain window a deployment is likely to set.
const RETRY_AFTER_BUCKETS: [f64; 11] = [
    1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// The commit the binary was built from, when the build said (`SENDGATE_GIT_SHA` in the
/// build's environment, as the Dockerfile passes it); `unknown` otherwise.
pub const GIT_SHA: &str = match option_env!("SENDGATE_GIT_SHA") {
    Some(sha) if !sha.is_empty() => sha,
    _ => "unknown",
};

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "sendgate_requests_total",
                "Send requests answered, by queue, HTTP status, code and backend.",
            ),
            &["queue", "status", "code", "backend"],
        )
        .expect("valid metric definition");
        let send_seconds = histogram_vec(
            "sendgate_send_duration_seconds",
            "Time the backend took to take a message, by backend.",
            &["backend"],
            &LATENCY_BUCKETS,
        );
        let request_seconds = histogram_vec(
            "sendgate_request_duration_seconds",
            "Time from a send request reaching its route to its answer (the body read, admission, the send), by queue, route (message, batch) and HTTP status.",
            &["queue", "route", "status"],
            &LATENCY_BUCKETS,
        );
        let retry_after = histogram_vec(
            "sendgate_retry_after_seconds",
            "The Retry-After (whole seconds) given on the send routes' refusals, by queue and code.",
            &["queue", "code"],
            &RETRY_AFTER_BUCKETS,
        );
        let depth_read_seconds = histogram_vec(
            "sendgate_depth_read_duration_seconds",
            "Time one depth read took at the admin plane (the gates' reads and the probes'), by backend, queue and result (ok, failed: an error, or its deadline passed; a read its caller stopped waiting for before its deadline is not timed).",
            &["backend", "queue", "result"],
            &LATENCY_BUCKETS,
        );
        for collector in [
            Box::new(requests.clone()) as Box<dyn Collector>,
            Box::new(send_seconds.clone()),
            Box::new(request_seconds.clone()),
            Box::new(retry_after.clone()),
            Box::new(depth_read_seconds.clone()),
            Box::new(build_info()),
        ] {
            registry.register(collector).expect("registered once");
        }
        register_process_collector(&registry);
        Self {
            registry,
            requests,
            send_seconds,
            request_seconds,
            retry_after,
            depth_read_seconds,
        }
    }

    /// Count one answered send request. `queue` must be a configured queue or "unknown", so
    /// the label set stays bounded whatever clients send.
    pub fn request(&self, queue: &str, outcome: &RequestOutcome) {
        let mut buf = [0u8; 3];
        let [status, code, backend] = outcome.labels(&mut buf);
        self.requests
            .with_label_values(&[queue, status, code, backend])
            .inc();
    }

    pub fn send_latency(&self, backend: &str, took: Duration) {
        self.send_seconds
            .with_label_values(&[backend])
            .observe(took.as_secs_f64());
    }

    /// One send request answered: how long it took from its route to its answer.
    pub fn request_latency(&self, queue: &str, route: &str, status: u16, took: Duration) {
        let mut buf = [0u8; 3];
        self.request_seconds
            .with_label_values(&[queue, route, status_str(status, &mut buf)])
            .observe(took.as_secs_f64());
    }

    /// A refusal on a send route told its client to wait `seconds` (its `Retry-After`).
    pub fn retry_after_given(&self, queue: &str, code: &str, seconds: u64) {
        self.retry_after
            .with_label_values(&[queue, code])
            .observe(seconds as f64);
    }

    /// `backend`, with each of its depth reads timed into
    /// `sendgate_depth_read_duration_seconds` under `role`.
    pub fn time_depth_reads(
        &self,
        backend: Arc<dyn Backend>,
        role: BackendRole,
    ) -> Arc<dyn Backend> {
        Arc::new(TimedReads {
            inner: backend,
            role,
            seconds: self.depth_read_seconds.clone(),
        })
    }

    /// The whole exposition: the registry's series plus the state read now.
    pub fn render(
        &self,
        dispatcher: &Dispatcher,
        lifecycle: &Lifecycle,
        coordination: &Coordination,
        connections: &Connections,
        otel: Option<&SpanCounts>,
    ) -> String {
        let mut families = self.registry.gather();
        families.extend(state_families(dispatcher, lifecycle));
        families.extend(drain_families(dispatcher));
        families.extend(rate_lease_families(dispatcher));
        families.extend(coordination_families(coordination));
        families.extend(connection_families(connections));
        families.extend(otel.map(otel_families).unwrap_or_default());
        // A family with no series (no probe has run: SENDGATE_PROBE_INTERVAL_S=0) makes the
        // encoder stop with an error half way through the text: leave such families out.
        families.retain(|f| !f.get_metric().is_empty());
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// `sendgate_build_info{version,git_sha}`: 1.
fn build_info() -> IntGaugeVec {
    let info = gauge_vec(
        "sendgate_build_info",
        "1, with the version and the git commit (unknown when the build did not say) as labels.",
        &["version", "git_sha"],
    );
    info.with_label_values(&[env!("CARGO_PKG_VERSION"), GIT_SHA])
        .set(1);
    info
}

/// The process's own series (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, `process_start_time_seconds`, ...): the prometheus crate's collector,
/// which reads `/proc` (Linux only; elsewhere there are none).
#[cfg(target_os = "linux")]
fn register_process_collector(registry: &Registry) {
    let collector = prometheus::process_collector::ProcessCollector::for_self();
    // Its descriptions are fixed and registered once per registry: this cannot fail.
    let _ = registry.register(Box::new(collector));
}

#[cfg(not(target_os = "linux"))]
fn register_process_collector(_: &Registry) {}

/// `sendgate_drain_rate_per_second{backend,queue}`: the drain rate the gate measured (what a
/// `429 queue_full`'s `Retry-After` is made from); no series until a drain was measured.
fn drain_families(dispatcher: &Dispatcher) -> Vec<prometheus::proto::MetricFamily> {
    let rate = prometheus::GaugeVec::new(
        Opts::new(
            "sendgate_drain_rate_per_second",
            "Messages a second the consumers were measured to take from the queue (between depth reads); absent until measured.",
        ),
        &["backend", "queue"],
    )
    .expect("valid metric definition");
    for lane in dispatcher.lanes() {
        for gate in lane.gates() {
            if let Some(r) = gate.snapshot().drain_rate {
                rate.with_label_values(&[lane.role.as_str(), gate.queue().as_str()])
                    .set(r.per_second());
            }
        }
    }
    rate.collect()
}

/// A backend whose depth reads are timed (everything else passes through as it is).
struct TimedReads {
    inner: Arc<dyn Backend>,
    role: BackendRole,
    seconds: HistogramVec,
}

/// One depth read on its way: observed when it ends, or when it is dropped unfinished at
/// or past its deadline (a `timeout_at` around a backend that overran it), then as
/// `failed`. Dropped before its deadline, its caller stopped waiting (a request gone, a
/// start-up budget spent): not a read that failed, so not observed at all.
struct ReadTimer<'a> {
    seconds: &'a HistogramVec,
    role: BackendRole,
    queue: &'a QueueName,
    started: Instant,
    deadline: Instant,
    /// `None` while the read is on its way.
    result: Option<&'static str>,
}

impl Drop for ReadTimer<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let result = match self.result {
            Some(result) => result,
            None if now >= self.deadline => "failed",
            None => return,
        };
        self.seconds
            .with_label_values(&[self.role.as_str(), self.queue.as_str(), result])
            .observe(now.duration_since(self.started).as_secs_f64());
    }
}

#[async_trait]
impl Backend for TimedReads {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn send(
        &self,
        message: OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        self.inner.send(message, deadline).await
    }

    async fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
        deadline: Instant,
    ) -> Vec<Result<SendReceipt, SendError>> {
        self.inner.send_batch(messages, deadline).await
    }

    fn unsupported(&self, attributes: &Attributes) -> Option<Field> {
        self.inner.unsupported(attributes)
    }

    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError> {
        let mut timer = ReadTimer {
            seconds: &self.seconds,
            role: self.role,
            queue,
            started: Instant::now(),
            deadline,
            result: None,
        };
        let read = self.inner.backlog(queue, deadline).await;
        timer.result = Some(if read.is_ok() { "ok" } else { "failed" });
        read
    }

    fn depth_lag(&self) -> Duration {
        self.inner.depth_lag()
    }

    fn depth_lag_in_force(&self) -> Option<DepthLag> {
        self.inner.depth_lag_in_force()
    }

    fn store_health(&self) -> Option<StoreHealth> {
        self.inner.store_health()
    }

    async fn warm_up(&self, deadline: Instant) -> Result<(), String> {
        self.inner.warm_up(deadline).await
    }
}

/// `sendgate_connections{phase}` (open now), `sendgate_connections_closed_total{reason}`
/// (each connection once, when it ended) and `sendgate_connection_head_bytes`.
fn connection_families(connections: &Connections) -> Vec<prometheus::proto::MetricFamily> {
    let counts = connections.counts();
    let open = gauge_vec(
        "sendgate_connections",
        "Open client connections by phase: idle (between requests), head (a request head arriving), busy (a request in progress).",
        &["phase"],
    );
    for (phase, n) in counts.open {
        open.with_label_values(&[phase.as_str()])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    let closed = counter_vec(
        "sendgate_connections_closed_total",
        "Client connections ended, by reason: done (by the client, or idle), header_timeout, head_too_large, head_budget, evicted (to make room), peer_limit, full (refused: every connection busy).",
        &["reason"],
    );
    for (reason, n) in counts.closed {
        closed.with_label_values(&[reason.as_str()]).inc_by(n);
    }
    let head = IntGauge::new(
        "sendgate_connection_head_bytes",
        "Bytes of unfinished request heads held now (SENDGATE_MAX_BUFFERED_HEAD_BYTES caps it).",
    )
    .expect("valid");
    head.set(i64::try_from(counts.head_bytes).unwrap_or(i64::MAX));
    let mut families = open.collect();
    families.extend(closed.collect());
    families.extend(head.collect());
    families
}

/// What became of the OpenTelemetry spans (only while exporting): exported, or dropped
/// by reason (`queue_full`: the collector is slow or gone and the queue is full;
/// `export_failed`: an export failed or ran out of time, or the collector rejected them).
fn otel_families(counts: &SpanCounts) -> Vec<prometheus::proto::MetricFamily> {
    let exported = prometheus::IntCounter::new(
        "sendgate_otel_spans_exported_total",
        "Spans the OTLP collector took.",
    )
    .expect("valid metric definition");
    exported.inc_by(counts.exported());
    let dropped = counter_vec(
        "sendgate_otel_spans_dropped_total",
        "Spans dropped instead of exported, by reason: queue_full (OTEL_BSP_MAX_QUEUE_SIZE reached: a slow or dead collector; no send waits), export_failed (the collector failed, timed out, or rejected them in a partial success).",
        &["reason"],
    );
    dropped
        .with_label_values(&["queue_full"])
        .inc_by(counts.dropped_queue_full());
    dropped
        .with_label_values(&["export_failed"])
        .inc_by(counts.dropped_export_failed());
    let mut families = exported.collect();
    families.extend(dropped.collect());
    families
}

/// `sendgate_coordination_mode{mode}` (one-hot: `local` or `redis`) and
/// `sendgate_coordination_ok` (0 while Redis is configured but not answering).
fn coordination_families(coordination: &Coordination) -> Vec<prometheus::proto::MetricFamily> {
    let health = coordination.health();
    let mode = gauge_vec(
        "sendgate_coordination_mode",
        "1 for the mode this replica keeps the ceiling in: local, or redis (the fleet's).",
        &["mode"],
    );
    for m in ["local", "redis"] {
        mode.with_label_values(&[m])
            .set(i64::from(m == health.mode));
    }
    let ok = IntGauge::new(
        "sendgate_coordination_ok",
        "0 while Redis is configured but not answering (the replica runs local).",
    )
    .expect("valid");
    ok.set(i64::from(health.ok));
    let mut families = mode.collect();
    families.extend(ok.collect());
    families
}

/// Per tenant and queue (a tenant once it has been answered on the queue):
/// `sendgate_tenant_admitted_total`, `sendgate_tenant_refused_total{reason}`,
/// `sendgate_tenant_would_refuse_total{reason}` (shadow mode) and `sendgate_tenant_share`.
/// The `tenant` label takes only the keys file's tenants (at most 1000; open mode: `open`).
fn tenant_families(dispatcher: &Dispatcher) -> Vec<prometheus::proto::MetricFamily> {
    use crate::admission::fair::tally::Reason;

    let admitted = counter_vec(
        "sendgate_tenant_admitted_total",
        "Units (a batch's entries) admitted per tenant, shadow mode's would-be refusals included.",
        &["backend", "queue", "tenant"],
    );
    let refused = counter_vec(
        "sendgate_tenant_refused_total",
        "Units refused per tenant, by reason: queue_full (the ceiling), criticality, tenant_share, tenant_quota.",
        &["backend", "queue", "tenant", "reason"],
    );
    let would_refuse = counter_vec(
        "sendgate_tenant_would_refuse_total",
        "Units admitted in shadow mode (SENDGATE_FAIR_SHARE=shadow) that enforce would have refused, by reason.",
        &["backend", "queue", "tenant", "reason"],
    );
    let share = prometheus::GaugeVec::new(
        Opts::new(
            "sendgate_tenant_share",
            "The tenant's part of the room the queue's round offers now (0-1).",
        ),
        &["backend", "queue", "tenant"],
    )
    .expect("valid metric definition");
    for lane in dispatcher.lanes() {
        let role = lane.role.as_str();
        for gate in lane.gates() {
            let q = gate.queue().as_str();
            for view in gate.tenants(&gate.snapshot()) {
                let t = view.tenant.name.as_str();
                let total = &view.counts.total;
                admitted
                    .with_label_values(&[role, q, t])
                    .inc_by(total.admitted);
                for reason in Reason::ALL {
                    refused
                        .with_label_values(&[role, q, t, reason.as_str()])
                        .inc_by(total.refused(reason));
                }
                for reason in Reason::shadowed() {
                    would_refuse
                        .with_label_values(&[role, q, t, reason.as_str()])
                        .inc_by(total.would_refuse(reason));
                }
                share.with_label_values(&[role, q, t]).set(view.share);
            }
        }
    }
    let mut families = admitted.collect();
    families.extend(refused.collect());
    families.extend(would_refuse.collect());
    families.extend(share.collect());
    families
}

/// `sendgate_rate_lease_failures_total`: the rate quotas' lease calls that failed (in a
/// fleet, with a tenant that has a rate quota; one book for every queue).
fn rate_lease_families(dispatcher: &Dispatcher) -> Vec<prometheus::proto::MetricFamily> {
    let failures = dispatcher
        .lanes()
        .flat_map(|lane| lane.gates())
        .find_map(|gate| gate.fairness()?.rate_lease_failures());
    let Some(failures) = failures else {
        return Vec::new();
    };
    let counter = prometheus::IntCounter::new(
        "sendgate_rate_lease_failures_total",
        "Calls leasing a tenant's rate quota from the fleet's Redis that failed (the replica then decides alone on its part of the rate).",
    )
    .expect("valid metric definition");
    counter.inc_by(failures);
    counter.collect()
}

/// The status as its three digits, without allocating on the hot path.
fn status_str(status: u16, buf: &mut [u8; 3]) -> &str {
    let s = status.clamp(100, 999);
    buf[0] = b'0' + (s / 100) as u8;
    buf[1] = b'0' + (s / 10 % 10) as u8;
    buf[2] = b'0' + (s % 10) as u8;
    std::str::from_utf8(buf).unwrap_or("000")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition")
}

fn histogram_vec(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric definition")
}

/// The gateway's state at the scrape: its queues', its lanes' and its lifecycle's.
fn state_families(
    dispatcher: &Dispatcher,
    lifecycle: &Lifecycle,
) -> Vec<prometheus::proto::MetricFamily> {
    let mut families = tenant_families(dispatcher);
    families.extend(gate_families(dispatcher));
    families.extend(lane_families(dispatcher));
    families.extend(lifecycle_families(dispatcher, lifecycle));
    families
}

/// Each queue's gate: its backlog, ceiling, read streak, fail-closed flag and reads.
fn gate_families(dispatcher: &Dispatcher) -> Vec<prometheus::proto::MetricFamily> {
    use prometheus::core::Collector;

    let backlog = gauge_vec(
        "sendgate_backlog",
        "Messages waiting in the queue, as the gate counts them.",
        &["backend", "queue"],
    );
    let limit = gauge_vec(
        "sendgate_backlog_limit",
        "The backlog ceiling.",
        &["backend", "queue"],
    );
    let streak = gauge_vec(
        "sendgate_depth_read_failure_streak",
        "Consecutive failed depth reads.",
        &["backend", "queue"],
    );
    let fail_closed = gauge_vec(
        "sendgate_fail_closed",
        "1 while sends are refused for an unknown depth.",
        &["backend", "queue"],
    );
    let reads = counter_vec(
        "sendgate_depth_reads_total",
        "Depth reads from the admin plane, by result.",
        &["backend", "queue", "result"],
    );
    for lane in dispatcher.lanes() {
        let role = lane.role.as_str();
        for gate in lane.gates() {
            let s = gate.snapshot();
            let q = gate.queue().as_str();
            if let Some(b) = s.backlog {
                backlog
                    .with_label_values(&[role, q])
                    .set(i64::try_from(b).unwrap_or(i64::MAX));
            }
            limit
                .with_label_values(&[role, q])
                .set(i64::try_from(s.limit).unwrap_or(i64::MAX));
            streak
                .with_label_values(&[role, q])
                .set(i64::from(s.consecutive_failures));
            fail_closed
                .with_label_values(&[role, q])
                .set(i64::from(s.fail_closed));
            reads.with_label_values(&[role, q, "ok"]).inc_by(s.reads_ok);
            reads
                .with_label_values(&[role, q, "failed"])
                .inc_by(s.reads_failed);
        }
    }
    let mut families = Vec::new();
    for c in [&backlog, &limit, &streak, &fail_closed] {
        families.extend(c.collect());
    }
    families.extend(reads.collect());
    families
}

/// Each backend lane: its breaker's state and openings, and its last probe.
fn lane_families(dispatcher: &Dispatcher) -> Vec<prometheus::proto::MetricFamily> {
    use prometheus::core::Collector;

    let breaker = gauge_vec(
        "sendgate_breaker_state",
        "1 for the breaker's current state.",
        &["backend", "kind", "state"],
    );
    let opened = counter_vec(
        "sendgate_breaker_opened_total",
        "Times the breaker opened.",
        &["backend"],
    );
    let probe_ok = gauge_vec(
        "sendgate_probe_ok",
        "1 when the last admin-plane probe passed.",
        &["backend"],
    );
    for lane in dispatcher.lanes() {
        let role = lane.role.as_str();
        let current = lane.breaker.state();
        for st in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            breaker
                .with_label_values(&[role, lane.kind(), st.as_str()])
                .set(i64::from(st == current));
        }
        opened
            .with_label_values(&[role])
            .inc_by(lane.breaker.opened_total());
        if let Some(p) = lane.last_probe() {
            probe_ok.with_label_values(&[role]).set(i64::from(p.ok));
        }
    }
    let mut families = breaker.collect();
    families.extend(probe_ok.collect());
    families.extend(opened.collect());
    families
}

/// The gateway's lifecycle state and its sends in flight against their limit.
fn lifecycle_families(
    dispatcher: &Dispatcher,
    lifecycle: &Lifecycle,
) -> Vec<prometheus::proto::MetricFamily> {
    use prometheus::core::Collector;

    let state = gauge_vec(
        "sendgate_gateway_state",
        "1 for the gateway's lifecycle state.",
        &["state"],
    );
    let in_flight = IntGauge::new(
        "sendgate_sends_in_flight",
        "Backend sends holding an in-flight slot.",
    )
    .expect("valid");
    let max_in_flight =
        IntGauge::new("sendgate_sends_in_flight_max", "The in-flight limit.").expect("valid");
    let current = lifecycle.state();
    for st in [
        GatewayState::Starting,
        GatewayState::Running,
        GatewayState::Draining,
        GatewayState::Stopped,
    ] {
        state
            .with_label_values(&[st.as_str()])
            .set(i64::from(st == current));
    }
    in_flight.set(dispatcher.in_flight().current() as i64);
    max_in_flight.set(dispatcher.in_flight().max() as i64);
    let mut families = state.collect();
    families.extend(in_flight.collect());
    families.extend(max_in_flight.collect());
    families
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_gives_its_status_code_and_backend_as_labels() {
        let mut buf = [0; 3];
        let queued = RequestOutcome {
            status: StatusCode::CREATED,
            code: "queued",
            backend: Some(BackendRole::Fallback),
        };
        assert_eq!(queued.labels(&mut buf), ["201", "queued", "fallback"]);
        let refused = RequestOutcome {
            status: StatusCode::NOT_FOUND,
            code: "unknown_queue",
            backend: None,
        };
        assert_eq!(refused.labels(&mut buf), ["404", "unknown_queue", "none"]);
    }

    #[test]
    fn a_counted_outcome_is_one_series_with_those_labels() {
        let metrics = Metrics::new();
        let full = RequestOutcome {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "queue_full",
            backend: Some(BackendRole::Primary),
        };
        metrics.request("requests", &full);
        metrics.request("requests", &full);
        let count = metrics
            .requests
            .with_label_values(&["requests", "429", "queue_full", "primary"])
            .get();
        assert_eq!(count, 2);
    }

    /// A broker whose depth reads never end (and ignore their deadline).
    struct Hung;

    #[async_trait]
    impl Backend for Hung {
        fn kind(&self) -> &'static str {
            "hung"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            std::future::pending().await
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            std::future::pending().await
        }
    }

    fn timed_reads(metrics: &Metrics, result: &str) -> u64 {
        metrics
            .depth_read_seconds
            .with_label_values(&["primary", "q", result])
            .get_sample_count()
    }

    /// Issue 41's review: a read its caller stops waiting for before its deadline (the
    /// future dropped) is no failed read; one dropped at its deadline (the gate's
    /// `timeout_at` around a backend that overran it) is.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_depth_read_is_not_timed_as_failed_and_an_overrun_one_is() {
        let metrics = Metrics::new();
        let backend = metrics.time_depth_reads(Arc::new(Hung), BackendRole::Primary);
        let queue = QueueName::parse("q").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);

        let abandoned =
            tokio::time::timeout(Duration::from_secs(1), backend.backlog(&queue, deadline)).await;
        assert!(abandoned.is_err(), "the caller stopped waiting");
        assert_eq!(timed_reads(&metrics, "failed"), 0, "abandoned, not failed");
        assert_eq!(timed_reads(&metrics, "ok"), 0);

        let overrun = tokio::time::timeout_at(deadline, backend.backlog(&queue, deadline)).await;
        assert!(overrun.is_err());
        assert_eq!(timed_reads(&metrics, "failed"), 1, "its deadline passed");
    }

    #[test]
    fn status_codes_render_as_three_digits() {
        let mut buf = [0; 3];
        assert_eq!(status_str(201, &mut buf), "201");
        assert_eq!(status_str(429, &mut buf), "429");
        assert_eq!(status_str(5, &mut buf), "100");
    }
}
