//! Ended spans leave the request path through a bounded buffer, and are exported in
//! batches by a task on the export thread: a send never waits for the collector, and a span
//! that finds the buffer full is dropped and counted.
//!
//! On the request path a span is one [`SpanRecord`] (its ids, its times and what the send
//! was, as plain values) pushed under a short lock, never a wait; the export task is woken
//! only when a batch is full (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`), else it takes what waits
//! every `OTEL_BSP_SCHEDULE_DELAY`. Encoding (`encode.rs`) and the request happen on the
//! export thread, each export bounded by `OTEL_BSP_EXPORT_TIMEOUT`. One export at a time:
//! while it waits on a slow collector the buffer fills, and what does not fit
//! (`OTEL_BSP_MAX_QUEUE_SIZE`) is dropped, not queued without bound.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};

use super::record::SpanRecord;
use crate::telemetry::EveryPeriod;

/// What became of the spans handed to export, for `/metrics`.
#[derive(Debug, Default)]
pub struct SpanCounts {
    exported: AtomicU64,
    /// The buffer was full (a slow or dead collector, or more spans than it takes).
    dropped_queue_full: AtomicU64,
    /// Their export failed or ran out of time, or the collector rejected them (a partial
    /// success).
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

/// The buffer's and the batches' bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) queue: usize,
    pub(super) batch: usize,
    pub(super) delay: Duration,
    pub(super) export_timeout: Duration,
}

/// The request path's side: ended spans into the buffer.
#[derive(Debug)]
pub(super) struct SpanBuffer {
    /// Grown as spans wait, never past `bounds.queue`; a batch leaves from the front.
    waiting: Mutex<VecDeque<SpanRecord>>,
    /// Wakes the export task when a batch is full.
    full: Notify,
    bounds: Bounds,
    counts: Arc<SpanCounts>,
}

impl SpanBuffer {
    pub(super) fn new(bounds: Bounds, counts: Arc<SpanCounts>) -> Self {
        let bounds = Bounds {
            queue: bounds.queue.max(1),
            batch: bounds.batch.clamp(1, bounds.queue.max(1)),
            ..bounds
        };
        Self {
            waiting: Mutex::new(VecDeque::with_capacity(bounds.batch)),
            full: Notify::new(),
            bounds,
            counts,
        }
    }

    /// Queues `span` for export, or drops and counts it when the buffer is full.
    pub(super) fn push(&self, span: SpanRecord) {
        let mut waiting = self.waiting.lock();
        if waiting.len() >= self.bounds.queue {
            drop(waiting);
            self.counts
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        if waiting.len() == waiting.capacity() {
            // Doubling, but never past the bound: what is held is the bound at most.
            let more = waiting.len().clamp(1, self.bounds.queue - waiting.len());
            waiting.reserve_exact(more);
        }
        waiting.push_back(span);
        let batch_full = waiting.len() == self.bounds.batch;
        drop(waiting);
        if batch_full {
            self.full.notify_one();
        }
    }

    /// A full batch of the oldest waiting spans; when `due`, fewer if fewer wait. The
    /// batch is a vector of its own size, taken from the front: the buffer keeps its room
    /// (the sends that refill it never grow it again) and the spans behind are not moved,
    /// so what is held is the buffer's bound plus the batch in flight.
    fn take_batch(&self, due: bool) -> Vec<SpanRecord> {
        let mut waiting = self.waiting.lock();
        let n = if waiting.len() >= self.bounds.batch {
            self.bounds.batch
        } else if due {
            waiting.len()
        } else {
            0
        };
        waiting.drain(..n).collect()
    }
}

/// Where a batch goes: encoded and posted by the caller (`mod.rs`), or a test's fake. `Ok`:
/// taken, but for the spans the collector says it rejected (a partial success).
pub(super) trait Export: Send + Sync + 'static {
    fn export(
        &self,
        batch: Vec<SpanRecord>,
    ) -> impl Future<Output = Result<Rejected, String>> + Send;
}

/// The spans of an accepted export that the collector rejected, and its word on why.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Rejected {
    pub(super) spans: u64,
    pub(super) why: String,
}

/// The export task's side: stop it, and wait for what was queued to be sent.
pub(super) struct Exporting {
    stop: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

impl Exporting {
    /// Stops the periodic export, sends what is buffered (each batch within its deadline),
    /// and waits for that at most `within`; what is still buffered then is lost with the
    /// process.
    pub(super) async fn stop(self, within: Duration) -> bool {
        let _ = self.stop.send(());
        tokio::time::timeout(within, self.done).await.is_ok()
    }
}

/// The buffer for the request path, and the task to run on the export thread's runtime.
pub(super) fn pipeline<E: Export>(
    exporter: E,
    bounds: Bounds,
    counts: Arc<SpanCounts>,
) -> (Arc<SpanBuffer>, Exporting, impl Future<Output = ()> + Send) {
    let buffer = Arc::new(SpanBuffer::new(bounds, Arc::clone(&counts)));
    let (stop, stopped) = oneshot::channel();
    let (finished, done) = oneshot::channel();
    let task = {
        let buffer = Arc::clone(&buffer);
        async move {
            export_loop(&exporter, &buffer, stopped, &counts).await;
            let _ = finished.send(());
        }
    };
    (buffer, Exporting { stop, done }, task)
}

async fn export_loop<E: Export>(
    exporter: &E,
    buffer: &SpanBuffer,
    mut stop: oneshot::Receiver<()>,
    counts: &SpanCounts,
) {
    let bounds = buffer.bounds;
    loop {
        let (due, stopping) = tokio::select! {
            biased;
            _ = &mut stop => (true, true),
            () = buffer.full.notified() => (false, false),
            () = tokio::time::sleep(bounds.delay) => (true, false),
        };
        // Every full batch now; a partial one too when it is due (or stopping).
        loop {
            let batch = buffer.take_batch(due);
            if batch.is_empty() {
                break;
            }
            export(exporter, batch, bounds.export_timeout, counts).await;
        }
        if stopping {
            return;
        }
    }
}

/// One export; a failure or a timeout drops its spans, a partial success those it rejected
/// (counted, logged once a minute).
async fn export<E: Export>(
    exporter: &E,
    batch: Vec<SpanRecord>,
    deadline: Duration,
    counts: &SpanCounts,
) {
    static FAILED: EveryPeriod = EveryPeriod::new(Duration::from_secs(60));
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    let (dropped, error) = match tokio::time::timeout(deadline, exporter.export(batch)).await {
        Ok(Ok(rejected)) => {
            let dropped = rejected.spans.min(n);
            counts.exported.fetch_add(n - dropped, Ordering::Relaxed);
            if dropped == 0 {
                return;
            }
            let why = rejected.why.chars().take(200).collect::<String>();
            (dropped, format!("the collector rejected them: {why}"))
        }
        Ok(Err(e)) => (n, e),
        Err(_) => (n, format!("no answer within {} ms", deadline.as_millis())),
    };
    counts
        .dropped_export_failed
        .fetch_add(dropped, Ordering::Relaxed);
    if let Some(held_back) = FAILED.admit() {
        tracing::warn!(
            event = "otel_export_failed",
            spans = dropped,
            error = %error,
            failures_held_back = held_back,
            "could not export spans; they are dropped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otel::record::tests::record;

    /// An exporter that takes `hold` to answer, and keeps the sizes of what it got.
    #[derive(Debug, Default, Clone)]
    struct Slow {
        hold: Duration,
        got: Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl Export for Slow {
        async fn export(&self, batch: Vec<SpanRecord>) -> Result<Rejected, String> {
            tokio::time::sleep(self.hold).await;
            self.got.lock().expect("not poisoned").push(batch.len());
            Ok(Rejected::default())
        }
    }

    impl Slow {
        fn got(&self) -> Vec<usize> {
            self.got.lock().expect("not poisoned").clone()
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
    async fn a_full_buffer_drops_and_counts_and_never_waits() {
        let exporter = Slow {
            hold: Duration::from_secs(3600),
            ..Slow::default()
        };
        let counts = Arc::new(SpanCounts::default());
        let (buffer, _exporting, task) = pipeline(exporter, bounds(4, 2), Arc::clone(&counts));
        tokio::spawn(task);
        // The task takes the first 2 (a full batch) and hangs on their export; 4 more fill
        // the buffer.
        buffer.push(record(1));
        buffer.push(record(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
        for n in 0..10 {
            buffer.push(record(n));
        }
        assert_eq!(counts.dropped_queue_full(), 6);
        assert_eq!(buffer.waiting.lock().len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_the_rest_when_due_and_stopping_sends_what_waits() {
        let exporter = Slow::default();
        let counts = Arc::new(SpanCounts::default());
        let (buffer, exporting, task) =
            pipeline(exporter.clone(), bounds(100, 3), Arc::clone(&counts));
        tokio::spawn(task);
        for n in 0..4 {
            buffer.push(record(n));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(exporter.got(), [3], "a full batch at once");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(exporter.got(), [3, 1], "the rest once due");
        for n in 0..5 {
            buffer.push(record(n));
        }
        // The fifth filled a second batch of three, which went at once.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(exporter.got(), [3, 1, 3]);
        assert!(exporting.stop(Duration::from_secs(1)).await);
        assert_eq!(exporter.got(), [3, 1, 3, 2]);
        assert_eq!(counts.exported(), 9);
        assert_eq!(counts.dropped_queue_full(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn spans_are_exported_oldest_first_in_batches() {
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Keep(Arc<std::sync::Mutex<Vec<u8>>>);
        impl Export for Keep {
            async fn export(&self, batch: Vec<SpanRecord>) -> Result<Rejected, String> {
                let ids = batch.iter().map(|s| s.span_id[0]);
                self.0.lock().expect("not poisoned").extend(ids);
                Ok(Rejected::default())
            }
        }
        let counts = Arc::new(SpanCounts::default());
        let (buffer, exporting, task) =
            pipeline(Keep(Arc::clone(&got)), bounds(10, 4), Arc::clone(&counts));
        // Not running yet: ten wait, in order.
        for n in 0..10 {
            buffer.push(record(n));
        }
        tokio::spawn(task);
        assert!(exporting.stop(Duration::from_secs(1)).await);
        assert_eq!(
            *got.lock().expect("not poisoned"),
            (0..10).collect::<Vec<u8>>()
        );
        assert_eq!(counts.exported(), 10);
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
        let (buffer, exporting, task) = pipeline(exporter, b, Arc::clone(&counts));
        tokio::spawn(task);
        buffer.push(record(1));
        buffer.push(record(2));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(counts.dropped_export_failed(), 2);
        buffer.push(record(3));
        assert!(
            !exporting.stop(Duration::from_millis(500)).await,
            "still exporting"
        );
        assert_eq!(counts.dropped_export_failed(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn spans_a_collector_rejects_are_dropped_not_exported() {
        struct Partial;
        impl Export for Partial {
            async fn export(&self, _: Vec<SpanRecord>) -> Result<Rejected, String> {
                Ok(Rejected {
                    spans: 2,
                    why: "too old".into(),
                })
            }
        }
        let counts = Arc::new(SpanCounts::default());
        let (buffer, exporting, task) = pipeline(Partial, bounds(10, 3), Arc::clone(&counts));
        tokio::spawn(task);
        for n in 0..3 {
            buffer.push(record(n));
        }
        assert!(exporting.stop(Duration::from_secs(1)).await);
        assert_eq!(counts.exported(), 1);
        assert_eq!(counts.dropped_export_failed(), 2);
    }

    #[test]
    fn what_is_held_is_the_bound_and_one_batch() {
        let buffer = SpanBuffer::new(bounds(10, 4), Arc::default());
        // A collector too slow to take anything: the buffer fills to its bound.
        for n in 0..15 {
            buffer.push(record(n));
        }
        assert_eq!(buffer.waiting.lock().len(), 10);
        assert!(buffer.waiting.lock().capacity() <= 10 + 1);
        let batch = buffer.take_batch(false);
        assert_eq!(
            batch.iter().map(|s| s.span_id[0]).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(
            batch.capacity(),
            4,
            "a batch holds itself, not the buffer's room"
        );
        // Refilled while the batch is in flight: the room it had is reused, not grown.
        for n in 0..4 {
            buffer.push(record(n));
        }
        assert!(buffer.waiting.lock().capacity() <= 10 + 1);
        let due: Vec<usize> = std::iter::from_fn(|| {
            let batch = buffer.take_batch(true);
            (!batch.is_empty()).then_some(batch.len())
        })
        .collect();
        assert_eq!(due, [4, 4, 2]);
    }

    #[test]
    fn a_batch_is_never_larger_than_the_buffer() {
        let buffer = SpanBuffer::new(bounds(3, 10), Arc::default());
        assert_eq!(buffer.bounds.batch, 3);
        let buffer = SpanBuffer::new(bounds(0, 0), Arc::default());
        assert_eq!((buffer.bounds.queue, buffer.bounds.batch), (1, 1));
    }
}
