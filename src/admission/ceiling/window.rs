//! A replica's own admissions, by the ledger epoch that counts them (docs/fleet.md, "what a
//! replica holds"). Two numbers come out of it: the **carry** (those of the last hold the
//! ledger of the current epoch does not hold: made alone, or from an older epoch's blocks),
//! reported with every call, and the **recent** count the fail-open rule weighs (all of
//! them, over the longer span that rule needs).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Admissions are counted in buckets this wide, each stamped with its end, so an admission
/// counts for at least the span asked for (a bucket counts until `span` after its end).
pub const BUCKET: Duration = Duration::from_millis(100);

/// The epoch of an admission made alone: no ledger counts it.
pub const ALONE: u64 = 0;

#[derive(Debug, Default)]
pub struct Window {
    /// `(end, epoch, count)`, oldest first. Bounded: one bucket per `BUCKET` per epoch
    /// switch within the `keep` of the latest [`Window::record`].
    buckets: VecDeque<(Instant, u64, u64)>,
}

impl Window {
    /// One admission at `now`, counted by the ledger of `epoch` ([`ALONE`]: by none); what
    /// ended more than `keep` ago (the longest span any count asks for) is forgotten.
    /// Returns the end of its bucket, to take it back by.
    pub fn record(&mut self, now: Instant, epoch: u64, keep: Duration) -> Instant {
        while self
            .buckets
            .front()
            .is_some_and(|(end, _, _)| *end + keep <= now)
        {
            self.buckets.pop_front();
        }
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
    /// been counted since, and taking one of theirs would end its span early.
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
    pub fn carry(&self, now: Instant, hold: Duration, current: u64) -> u64 {
        self.count(now, hold, |e| e != current)
    }

    /// Every admission of the last `span`, whatever counts it.
    pub fn recent(&self, now: Instant, span: Duration) -> u64 {
        self.count(now, span, |_| true)
    }

    fn count(&self, now: Instant, span: Duration, which: impl Fn(u64) -> bool) -> u64 {
        self.buckets
            .iter()
            .filter(|(end, e, _)| *end + span > now && which(*e))
            .map(|(_, _, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(10);
    const KEEP: Duration = Duration::from_secs(25);

    #[tokio::test(start_paused = true)]
    async fn an_admission_counts_for_the_whole_hold_and_not_after() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, ALONE, KEEP);
        assert_eq!(w.recent(t0 + HOLD, HOLD), 1);
        assert_eq!(w.recent(t0 + HOLD + BUCKET, HOLD), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_carry_is_what_the_current_epoch_does_not_hold() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 7, KEEP);
        w.record(t0, 7, KEEP);
        w.record(t0, ALONE, KEEP);
        w.record(t0, 9, KEEP);
        assert_eq!(w.carry(t0, HOLD, 9), 3);
        assert_eq!(w.carry(t0, HOLD, 7), 2);
        assert_eq!(w.recent(t0, HOLD), 4, "recent counts every epoch");
    }

    /// The fail-open rule counts over a longer span than the carry: counting the carry
    /// must not forget what that rule still needs, and a record forgets what is older
    /// than the longest span.
    #[tokio::test(start_paused = true)]
    async fn admissions_are_kept_for_the_longest_span_and_then_forgotten() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 7, KEEP);
        let later = t0 + HOLD + BUCKET;
        assert_eq!(w.carry(later, HOLD, 9), 0, "past the carry's hold");
        assert_eq!(w.recent(later, KEEP), 1, "within the longer span");
        w.record(t0 + KEEP, 7, KEEP);
        assert_eq!(w.buckets.len(), 2, "not yet past the keep");
        w.record(t0 + KEEP + BUCKET, 7, KEEP);
        assert_eq!(
            w.recent(t0 + KEEP + BUCKET, KEEP * 2),
            2,
            "the first forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn admissions_share_a_bucket_only_within_its_width_and_epoch() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 1, KEEP);
        w.record(t0 + BUCKET / 2, 1, KEEP);
        w.record(t0 + BUCKET, 1, KEEP);
        w.record(t0 + BUCKET, 2, KEEP);
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
        let refused = w.record(t0, ALONE, KEEP);
        let later = t0 + Duration::from_millis(1500);
        w.record(later, ALONE, KEEP);
        w.unrecord(ALONE, refused);
        assert_eq!(
            w.recent(later + HOLD, HOLD),
            1,
            "the later one's hold ended early"
        );
        assert_eq!(w.recent(later + BUCKET + HOLD, HOLD), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_admission_is_taken_back() {
        let mut w = Window::default();
        let t0 = Instant::now();
        let alone = w.record(t0, ALONE, KEEP);
        w.record(t0, 3, KEEP);
        w.unrecord(ALONE, alone);
        assert_eq!(w.recent(t0, HOLD), 1);
        assert_eq!(w.carry(t0, HOLD, 5), 1);
        w.unrecord(ALONE, alone);
        assert_eq!(w.carry(t0, HOLD, 5), 1);
    }
}
