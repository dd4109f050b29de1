//! Spans leave the request path through a bounded queue, and are exported in batches by a
//! task on the export thread: a send never waits for the collector, and a span that finds
//! the queue full is dropped and counted.
//!
//! Why not the SDK's `BatchSpanProcessor`: it drops on a full queue too, but keeps the count
//! to itself (an internal log line at shutdown), and the count is what an operator needs on
//! `/metrics` to see that the collector is slow or gone. So this processor: `on_end` is one
//! `try_send` into a bounded channel (`OTEL_BSP_MAX_QUEUE_SIZE`), never a wait; the task
//! sends a batch when `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` spans wait or the first of them has
//! waited `OTEL_BSP_SCHEDULE_DELAY`, each export bounded by `OTEL_BSP_EXPORT_TIMEOUT`. One
//! export at a time: while it waits on a slow collector the queue fills, and what does not
//! fit is dropped, not queued without bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::telemetry::EveryPeriod;

/// What became of the spans handed to export, for `/metrics`.
#[derive(Debug, Default)]
pub struct SpanCounts {
    exported: AtomicU64,
    /// The queue was full (a slow or dead collector, or more spans than it takes).
    dropped_queue_full: AtomicU64,
    /// Their export failed or ran out of time.
    dropped_export_failed: AtomicU64,
}

impl SpanCounts {
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    pub fn dropped_queue_full(&self) -> u64 {
        self.dropped_queue_full.load(Ordering::Relaxed)
    }

    pub fn dropped_export_failed(&self) -> u64 {
        self.dropped_export_failed.load(Ordering::Relaxed)
    }
}

/// The queue's and the batches' bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) queue: usize,
    pub(super) batch: usize,
    pub(super) delay: Duration,
    pub(super) export_timeout: Duration,
}

/// The SDK's side: ended spans into the queue.
#[derive(Debug)]
pub(super) struct BoundedQueue {
    queue: mpsc::Sender<SpanData>,
    counts: Arc<SpanCounts>,
}

impl SpanProcessor for BoundedQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        // Recorded but not sampled (a sampler's RecordOnly): nothing to export.
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(span).is_err() {
            self.counts
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// The export task is stopped (and what is queued sent) by [`Exporting::stop`], within
    /// the drain's time: nothing to wait for here.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task's side: stop it, and wait for what was queued to be sent.
pub(super) struct Exporting {
    stop: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

impl Exporting {
    /// Stops taking spans, exports those queued (each batch within its deadline), and waits
    /// for that at most `within`; what is still queued then is lost with the process.
    pub(super) async fn stop(self, within: Duration) -> bool {
        let _ = self.stop.send(());
        tokio::time::timeout(within, self.done).await.is_ok()
    }
}

/// The processor for the SDK, and the task to run on the export thread's runtime.
pub(super) fn pipeline<E: SpanExporter + 'static>(
    exporter: E,
    bounds: Bounds,
    counts: Arc<SpanCounts>,
) -> (
    BoundedQueue,
    Exporting,
    impl std::future::Future<Output = ()> + Send,
) {
    let (queue, spans) = mpsc::channel(bounds.queue.max(1));
    let (stop, stopped) = oneshot::channel();
    let (finished, done) = oneshot::channel();
    let task = {
        let counts = Arc::clone(&counts);
        async move {
            export_loop(exporter, spans, stopped, bounds, &counts).await;
            let _ = finished.send(());
        }
    };
    (
        BoundedQueue { queue, counts },
        Exporting { stop, done },
        task,
    )
}

async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut stop: oneshot::Receiver<()>,
    bounds: Bounds,
    counts: &SpanCounts,
) {
    let batch_size = bounds.batch.max(1);
    let mut batch = Vec::with_capacity(batch_size);
    'taking: loop {
        // The first span of a batch (or the stop).
        tokio::select! {
            biased;
            _ = &mut stop => break 'taking,
            span = spans.recv() => match span {
                Some(span) => batch.push(span),
                None => break 'taking,
            },
        }
        // More, until the batch is full or its first span has waited the delay.
        let due = Instant::now() + bounds.delay;
        let mut stopping = false;
        while batch.len() < batch_size {
            tokio::select! {
                biased;
                _ = &mut stop => { stopping = true; break; }
                () = tokio::time::sleep_until(due) => break,
                span = spans.recv() => match span {
                    Some(span) => batch.push(span),
                    None => { stopping = true; break; }
                },
            }
        }
        export(&exporter, &mut batch, bounds.export_timeout, counts).await;
        if stopping {
            break 'taking;
        }
    }
    // Stopping: no new span gets in; those queued go out.
    spans.close();
    while let Some(span) = spans.recv().await {
        batch.push(span);
        if batch.len() == batch_size {
            export(&exporter, &mut batch, bounds.export_timeout, counts).await;
        }
    }
    export(&exporter, &mut batch, bounds.export_timeout, counts).await;
}

/// One export; a failure or a timeout drops its spans (counted, logged once a minute).
async fn export<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    deadline: Duration,
    counts: &SpanCounts,
) {
    static FAILED: EveryPeriod = EveryPeriod::new(Duration::from_secs(60));
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    let spans = std::mem::take(batch);
    let error = match tokio::time::timeout(deadline, exporter.export(spans)).await {
        Ok(Ok(())) => {
            counts.exported.fetch_add(n, Ordering::Relaxed);
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {} ms", deadline.as_millis()),
    };
    counts.dropped_export_failed.fetch_add(n, Ordering::Relaxed);
    if let Some(held_back) = FAILED.admit() {
        tracing::warn!(
            event = "otel_export_failed",
            spans = n,
            error = %error,
            failures_held_back = held_back,
            "could not export spans; they are dropped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use std::sync::Mutex;

    /// An exporter that takes `hold` to answer, and keeps what it got.
    #[derive(Debug, Default, Clone)]
    struct Slow {
        hold: Duration,
        got: Arc<Mutex<Vec<usize>>>,
    }

    impl SpanExporter for Slow {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            tokio::time::sleep(self.hold).await;
            self.got.lock().unwrap().push(batch.len());
            Ok(())
        }
    }

    fn span(sampled: bool) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes([1; 16]),
                SpanId::from_bytes([2; 8]),
                TraceFlags::default().with_sampled(sampled),
                false,
                TraceState::NONE,
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Producer,
            name: "send requests".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("t").build(),
        }
    }

    fn bounds(queue: usize, batch: usize) -> Bounds {
        Bounds {
            queue,
            batch,
            delay: Duration::from_millis(100),
            export_timeout: Duration::from_secs(30),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_and_counts_and_never_waits() {
        let exporter = Slow {
            hold: Duration::from_secs(3600),
            ..Slow::default()
        };
        let counts = Arc::new(SpanCounts::default());
        let (processor, _exporting, task) = pipeline(exporter, bounds(4, 2), Arc::clone(&counts));
        tokio::spawn(task);
        // The task takes the first 2 and hangs on their export; 4 more fill the queue.
        for _ in 0..2 {
            processor.on_end(span(true));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..10 {
            processor.on_end(span(true));
        }
        assert_eq!(counts.dropped_queue_full(), 6);
        processor.on_end(span(false));
        assert_eq!(
            counts.dropped_queue_full(),
            6,
            "an unsampled span is not queued"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn batches_go_when_full_or_due_and_stopping_sends_what_is_queued() {
        let exporter = Slow::default();
        let got = Arc::clone(&exporter.got);
        let counts = Arc::new(SpanCounts::default());
        let (processor, exporting, task) = pipeline(exporter, bounds(100, 3), Arc::clone(&counts));
        tokio::spawn(task);
        for _ in 0..4 {
            processor.on_end(span(true));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*got.lock().unwrap(), [3], "a full batch at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(*got.lock().unwrap(), [3, 1], "the rest once due");
        for _ in 0..5 {
            processor.on_end(span(true));
        }
        assert!(exporting.stop(Duration::from_secs(1)).await);
        assert_eq!(*got.lock().unwrap(), [3, 1, 3, 2]);
        assert_eq!(counts.exported(), 9);
    }

    #[tokio::test(start_paused = true)]
    async fn an_export_past_its_deadline_drops_its_spans_and_the_next_goes_on() {
        let exporter = Slow {
            hold: Duration::from_secs(60),
            ..Slow::default()
        };
        let counts = Arc::new(SpanCounts::default());
        let mut b = bounds(100, 2);
        b.export_timeout = Duration::from_secs(1);
        let (processor, exporting, task) = pipeline(exporter, b, Arc::clone(&counts));
        tokio::spawn(task);
        processor.on_end(span(true));
        processor.on_end(span(true));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(counts.dropped_export_failed(), 2);
        assert!(exporting.stop(Duration::from_secs(5)).await);
    }
}
