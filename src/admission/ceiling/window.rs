//! A replica's own admissions of the last hold, by the ledger epoch that counts them
//! (docs/fleet.md, "what a replica holds"). Two numbers come out of it: the **carry** (those
//! the ledger of the current epoch does not hold: made alone, or from an older epoch's
//! blocks), reported with every call, and the **alone** count the fail-open rule weighs.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Admissions are counted in buckets this wide, each stamped with its end, so an admission
/// is kept at least `hold` after it was made (a bucket is dropped `hold` after its end).
pub const BUCKET: Duration = Duration::from_millis(100);

/// The epoch of an admission made alone: no ledger counts it.
pub const ALONE: u64 = 0;

#[derive(Debug, Default)]
pub struct Window {
    /// `(end, epoch, count)`, oldest first. Bounded: one bucket per `BUCKET` per epoch
    /// switch within `hold`.
    buckets: VecDeque<(Instant, u64, u64)>,
}

impl Window {
    /// One admission at `now`, counted by the ledger of `epoch` ([`ALONE`]: by none).
    /// Returns the end of its bucket, to take it back by.
    pub fn record(&mut self, now: Instant, epoch: u64) -> Instant {
        match self.buckets.back_mut() {
            Some((end, e, n)) if *e == epoch && *end > now => {
                *n += 1;
                *end
            }
            _ => {
                self.buckets.push_back((now + BUCKET, epoch, 1));
                now + BUCKET
            }
        }
    }

    /// Take back an admission [`Window::record`] made (the send was refused after all), from
    /// the bucket it was counted in (`bucket`, the end `record` returned): others may have
    /// been counted since, and taking one of theirs would end its hold early.
    pub fn unrecord(&mut self, epoch: u64, bucket: Instant) {
        if let Some(pos) = self
            .buckets
            .iter()
            .rposition(|(end, e, _)| *e == epoch && *end == bucket)
        {
            let bucket = &mut self.buckets[pos];
            bucket.2 -= 1;
            if bucket.2 == 0 {
                self.buckets.remove(pos);
            }
        }
    }

    /// Admissions of the last `hold` the ledger of epoch `current` does not hold.
    pub fn carry(&mut self, now: Instant, hold: Duration, current: u64) -> u64 {
        self.count(now, hold, |e| e != current)
    }

    /// Admissions of the last `hold` made alone.
    pub fn alone(&mut self, now: Instant, hold: Duration) -> u64 {
        self.count(now, hold, |e| e == ALONE)
    }

    fn count(&mut self, now: Instant, hold: Duration, which: impl Fn(u64) -> bool) -> u64 {
        while self
            .buckets
            .front()
            .is_some_and(|(end, _, _)| *end + hold <= now)
        {
            self.buckets.pop_front();
        }
        self.buckets
            .iter()
            .filter(|(_, e, _)| which(*e))
            .map(|(_, _, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn an_admission_counts_for_the_whole_hold_and_not_after() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, ALONE);
        assert_eq!(w.alone(t0 + HOLD, HOLD), 1);
        assert_eq!(w.alone(t0 + HOLD + BUCKET, HOLD), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_carry_is_what_the_current_epoch_does_not_hold() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 7);
        w.record(t0, 7);
        w.record(t0, ALONE);
        w.record(t0, 9);
        assert_eq!(w.carry(t0, HOLD, 9), 3);
        assert_eq!(w.carry(t0, HOLD, 7), 2);
        assert_eq!(w.alone(t0, HOLD), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn admissions_share_a_bucket_only_within_its_width_and_epoch() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 1);
        w.record(t0 + BUCKET / 2, 1);
        w.record(t0 + BUCKET, 1);
        w.record(t0 + BUCKET, 2);
        assert_eq!(w.buckets.len(), 3);
        // The first bucket ends at t0 + BUCKET: gone at its end plus the hold.
        assert_eq!(w.carry(t0 + BUCKET + HOLD, HOLD, 0), 2);
    }

    /// Sends counted alone are decided by the replica's own gate, which may read first: a
    /// later one may be counted meanwhile. Taking back the earlier, refused one must leave
    /// the later counted for its whole hold, not in the earlier one's bucket.
    #[tokio::test(start_paused = true)]
    async fn taking_back_a_refused_admission_leaves_a_later_one_in_its_own_bucket() {
        let mut w = Window::default();
        let t0 = Instant::now();
        let refused = w.record(t0, ALONE);
        let later = t0 + Duration::from_millis(1500);
        w.record(later, ALONE);
        w.unrecord(ALONE, refused);
        assert_eq!(
            w.alone(later + HOLD, HOLD),
            1,
            "the later one's hold ended early"
        );
        assert_eq!(w.alone(later + BUCKET + HOLD, HOLD), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_admission_is_taken_back() {
        let mut w = Window::default();
        let t0 = Instant::now();
        let alone = w.record(t0, ALONE);
        w.record(t0, 3);
        w.unrecord(ALONE, alone);
        assert_eq!(w.alone(t0, HOLD), 0);
        assert_eq!(w.carry(t0, HOLD, 5), 1);
        w.unrecord(ALONE, alone);
        assert_eq!(w.carry(t0, HOLD, 5), 1);
    }
}
