//! The sends' two metrics, kept here and read by the export thread: the duration histogram
//! (`messaging.client.operation.duration`) by system, queue and `error.type`, and the
//! refusals (`sendgate.refusals`) by `error.type`, queue and reason. Cumulative: each
//! export reports the totals since start-up.
//!
//! A send adds to one cell under a short lock: the queue's cells found by its name, the
//! cell among them by the send's static labels. Every label is a configured queue's name
//! or `unknown`, or a `&'static str` of the code, so the set of cells is bounded whatever
//! clients send.

use std::collections::HashMap;

use parking_lot::Mutex;

/// The semantic conventions' advice for `messaging.client.operation.duration` (seconds).
pub(super) const DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// One send, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Labels {
    pub(super) system: &'static str,
    /// The problem code (`error.type`); `None`: a success.
    pub(super) error: Option<&'static str>,
    /// Refused by the gateway (counted in `sendgate.refusals` too).
    pub(super) refused: bool,
    pub(super) reason: Option<&'static str>,
}

/// The sends of one queue with one set of labels.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Cell {
    pub(super) labels: Labels,
    /// One count per bucket of [`DURATION_BUCKETS`], and one past the last.
    pub(super) buckets: [u64; DURATION_BUCKETS.len() + 1],
    pub(super) count: u64,
    pub(super) sum: f64,
    pub(super) min: f64,
    pub(super) max: f64,
}

impl Cell {
    fn new(labels: Labels) -> Self {
        Self {
            labels,
            buckets: [0; DURATION_BUCKETS.len() + 1],
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    fn add(&mut self, seconds: f64) {
        // OpenTelemetry's explicit buckets are upper-inclusive: (prev, bound].
        let bucket = DURATION_BUCKETS.partition_point(|&bound| bound < seconds);
        self.buckets[bucket] += 1;
        self.count += 1;
        self.sum += seconds;
        self.min = self.min.min(seconds);
        self.max = self.max.max(seconds);
    }
}

#[derive(Debug, Default)]
pub(super) struct Meters {
    cells: Mutex<HashMap<Box<str>, Vec<Cell>, foldhash::fast::RandomState>>,
}

impl Meters {
    /// Counts one send to `queue` that took `seconds`.
    pub(super) fn record(&self, queue: &str, labels: Labels, seconds: f64) {
        let mut cells = self.cells.lock();
        let queue_cells = match cells.get_mut(queue) {
            Some(c) => c,
            None => cells.entry(Box::from(queue)).or_default(),
        };
        match queue_cells.iter_mut().find(|c| c.labels == labels) {
            Some(cell) => cell.add(seconds),
            None => {
                let mut cell = Cell::new(labels);
                cell.add(seconds);
                queue_cells.push(cell);
            }
        }
    }

    /// Every cell's totals now, by queue.
    pub(super) fn snapshot(&self) -> Vec<(Box<str>, Cell)> {
        let cells = self.cells.lock();
        let mut out: Vec<(Box<str>, Cell)> = cells
            .iter()
            .flat_map(|(queue, cells)| cells.iter().map(|c| (queue.clone(), c.clone())))
            .collect();
        drop(cells);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: Labels = Labels {
        system: "rabbitmq",
        error: None,
        refused: false,
        reason: None,
    };
    const FULL: Labels = Labels {
        system: "rabbitmq",
        error: Some("queue_full"),
        refused: true,
        reason: Some("ceiling"),
    };

    #[test]
    fn a_duration_falls_in_the_bucket_whose_bound_is_the_first_at_or_above_it() {
        let mut cell = Cell::new(OK);
        for seconds in [0.0, 0.005, 0.0051, 0.01, 10.0, 10.5] {
            cell.add(seconds);
        }
        let mut want = [0; 15];
        want[0] = 2; // 0 and 0.005: (-inf, 0.005]
        want[1] = 2; // 0.0051 and 0.01
        want[13] = 1; // 10.0
        want[14] = 1; // past the last bound
        assert_eq!(cell.buckets, want);
        assert_eq!(cell.count, 6);
        assert!((cell.sum - 20.5201).abs() < 1e-9, "{}", cell.sum);
        assert_eq!((cell.min, cell.max), (0.0, 10.5));
    }

    #[test]
    fn sends_are_counted_by_queue_and_labels() {
        let meters = Meters::default();
        meters.record("requests", OK, 0.001);
        meters.record("requests", OK, 0.002);
        meters.record("requests", FULL, 0.001);
        meters.record("batch", OK, 0.3);
        let snapshot = meters.snapshot();
        let counts: Vec<(&str, Labels, u64)> = snapshot
            .iter()
            .map(|(q, c)| (&**q, c.labels, c.count))
            .collect();
        assert_eq!(
            counts,
            [("batch", OK, 1), ("requests", OK, 2), ("requests", FULL, 1)]
        );
        assert!((snapshot[1].1.sum - 0.003).abs() < 1e-12);
    }
}
