//! A replica's own admissions, by the ledger epoch that counts them (docs/fleet.md, "what a
//! replica holds"), and how each ended. Three numbers come out of it: the **carry** (those
//! of the last hold the ledger of the current epoch does not hold, made alone or from an
//! older epoch's blocks, whose outcome is still open), reported with every call; the
//! **recount** (those of another epoch known stored, settled into the current one when it
//! is adopted: step 5); and the **recent** count the fail-open rule weighs (all of them,
//! over the longer span that rule needs).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Admissions are counted in buckets this wide, each stamped with its end, so an admission
/// counts for at least the span asked for (a bucket counts until `span` after its end).
pub const BUCKET: Duration = Duration::from_millis(100);

/// The epoch of an admission made alone: no ledger counts it.
pub const ALONE: u64 = 0;

/// The admissions of one epoch in one [`BUCKET`], and how many of them ended how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    end: Instant,
    epoch: u64,
    admitted: u64,
    /// Without a known outcome (none yet, or an unknown one): may be stored by `a + D`.
    open: u64,
    /// Known stored.
    stored: u64,
}

/// How an admission ended, as far as the ledger's count of it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Stored,
    NotStored,
}

#[derive(Debug, Default)]
pub struct Window {
    /// Oldest first. Bounded: one bucket per `BUCKET` per epoch switch within the `keep` of
    /// the latest [`Window::record`].
    buckets: VecDeque<Bucket>,
}

impl Window {
    /// One admission at `now`, counted by the ledger of `epoch` ([`ALONE`]: by none); what
    /// ended more than `keep` ago (the longest span any count asks for) is forgotten.
    /// Returns the end of its bucket, to take it back by.
    pub fn record(&mut self, now: Instant, epoch: u64, keep: Duration) -> Instant {
        while self.buckets.front().is_some_and(|b| b.end + keep <= now) {
            self.buckets.pop_front();
        }
        match self.buckets.back_mut() {
            Some(b) if b.epoch == epoch && b.end > now => {
                b.admitted += 1;
                b.open += 1;
                b.end
            }
            _ => {
                self.buckets.push_back(Bucket {
                    end: now + BUCKET,
                    epoch,
                    admitted: 1,
                    open: 1,
                    stored: 0,
                });
                now + BUCKET
            }
        }
    }

    /// `units` admissions at once (a batch), in one bucket: its end.
    pub fn record_units(
        &mut self,
        now: Instant,
        epoch: u64,
        keep: Duration,
        units: u64,
    ) -> Instant {
        let bucket = self.record(now, epoch, keep);
        for _ in 1..units {
            self.record(now, epoch, keep);
        }
        bucket
    }

    /// An admission of `epoch` counted in `bucket` (the end [`Window::record`] returned)
    /// ended: it is no longer open, and if stored it is one to recount. An unknown outcome
    /// is not told here: it stays open. Nothing if the bucket was forgotten.
    pub fn ended(&mut self, epoch: u64, bucket: Instant, how: Ended) {
        if let Some(b) = self
            .buckets
            .iter_mut()
            .rev()
            .find(|b| b.epoch == epoch && b.end == bucket && b.open > 0)
        {
            b.open -= 1;
            if how == Ended::Stored {
                b.stored += 1;
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
            .rposition(|b| b.epoch == epoch && b.end == bucket && b.open > 0)
        {
            let b = &mut self.buckets[pos];
            b.admitted -= 1;
            b.open -= 1;
            if b.admitted == 0 {
                self.buckets.remove(pos);
            }
        }
    }

    /// Admissions of the last `hold` the ledger of epoch `current` does not hold, whose
    /// outcome is still open.
    pub fn carry(&self, now: Instant, hold: Duration, current: u64) -> u64 {
        self.count(now, hold, |b| b.epoch != current, |b| b.open)
    }

    /// Admissions of the last `hold` of another epoch than `current` known stored: to be
    /// settled into `current` as stored sends of no block (docs/fleet.md, step 5).
    pub fn recount(&self, now: Instant, hold: Duration, current: u64) -> u64 {
        self.count(now, hold, |b| b.epoch != current, |b| b.stored)
    }

    /// Every admission of the last `span`, whatever counts it.
    pub fn recent(&self, now: Instant, span: Duration) -> u64 {
        self.count(now, span, |_| true, |b| b.admitted)
    }

    fn count(
        &self,
        now: Instant,
        span: Duration,
        which: impl Fn(&Bucket) -> bool,
        of: impl Fn(&Bucket) -> u64,
    ) -> u64 {
        self.buckets
            .iter()
            .filter(|b| b.end + span > now && which(b))
            .map(of)
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

    /// docs/fleet.md, step 5 (what a loss costs): an admission whose outcome is known
    /// leaves the carry; known stored, it is one to recount instead; unknown, it stays.
    #[tokio::test(start_paused = true)]
    async fn a_known_outcome_leaves_the_carry_and_a_stored_one_is_recounted() {
        let mut w = Window::default();
        let t0 = Instant::now();
        let bucket = w.record_units(t0, 7, KEEP, 3);
        w.ended(7, bucket, Ended::Stored);
        w.ended(7, bucket, Ended::NotStored);
        assert_eq!(w.carry(t0, HOLD, 9), 1, "the one still open");
        assert_eq!(w.recount(t0, HOLD, 9), 1, "the one stored");
        assert_eq!(
            w.recount(t0, HOLD, 7),
            0,
            "its own epoch's ledger counts it"
        );
        assert_eq!(w.recent(t0, HOLD), 3, "the fail-open rule counts all");
        assert_eq!(w.recount(t0 + BUCKET + HOLD, HOLD, 9), 0, "past its hold");
        w.ended(7, bucket, Ended::Stored);
        w.ended(7, bucket, Ended::Stored);
        assert_eq!(
            w.recount(t0, HOLD, 9),
            2,
            "no more outcomes than admissions"
        );
    }

    /// An outcome goes back to the bucket its admission was counted in: put in an older
    /// one, the younger admission still open would be carried for the older one's hold.
    #[tokio::test(start_paused = true)]
    async fn an_outcome_goes_back_to_its_own_bucket() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 7, KEEP);
        let later = t0 + Duration::from_millis(1500);
        let young = w.record(later, 7, KEEP);
        w.ended(7, young, Ended::NotStored);
        assert_eq!(w.carry(t0 + HOLD, HOLD, 9), 1, "the old one, open");
        assert_eq!(w.carry(t0 + BUCKET + HOLD, HOLD, 9), 0, "its hold is over");
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
