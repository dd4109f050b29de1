//! A tenant's rate quota in a fleet (docs/fairness.md, "Quotas in a fleet"): the units a
//! replica admits are leased from the fleet's one GCRA per tenant (`coordination::rates`),
//! so the fleet admits the tenant's rate, not the rate on each replica.
//!
//! Leasing is the one step that waits on the store, and it runs before the judge (which
//! decides under locks and never waits): `quota::RateBook::lease` tops the replica's lease up
//! to what a send needs when it is short, one call at a time per tenant, made in a task of
//! its own so its answer counts whatever becomes of the send; then the judge spends the
//! lease as it spends a local bucket. A replica that cannot lease (cut off from the fleet, or its lease call
//! failed) decides alone on its part of the rate: the rate over the most replicas the
//! fleet runs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::gcra::Gcra;
use crate::admission::tenants::Rate;
use crate::coordination::fleet::Fleet;
use crate::coordination::rates::{Grant, RateError, RateLedger, RateTerms};

/// A lease asks for at least this much of the rate at once: fewer round trips for a fast
/// tenant, at most this much of its rate left unspent on each replica.
pub const LEASE_SPAN: Duration = Duration::from_millis(10);

/// After a lease call failed, the replica decides alone this long before it asks again
/// (the fleet's own probe's pace): a send does not wait out the store's deadline each time.
pub const ALONE_AFTER_FAILURE: Duration = crate::coordination::fleet::REJOIN_EVERY;

/// Where a replica leases its tenants' rates: the fleet's store, while the fleet is joined
/// (`quota::RateBook::lease` asks it).
#[derive(Clone)]
pub struct FleetRates {
    pub ledger: Arc<dyn RateLedger>,
    pub fleet: Arc<Fleet>,
}

/// Whether the fleet's store answers this replica's lease calls: said once when they
/// start failing (a script error the seats' calls never hit would otherwise leave the
/// fleet on its parts of the rate unseen) and once when they answer again; counted for
/// `/metrics`.
#[derive(Debug, Default)]
pub struct LeaseHealth {
    failing: AtomicBool,
    failures: AtomicU64,
}

impl LeaseHealth {
    /// `tenant`'s lease call was answered so.
    pub(super) fn heard(&self, tenant: &str, answer: &Result<Grant, RateError>) {
        match answer {
            Ok(_) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        event = "rate_lease_recovered",
                        tenant,
                        "the fleet's store answers lease calls again: rate quotas are the fleet's"
                    );
                }
            }
            Err(error) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        event = "rate_lease_failed",
                        tenant,
                        error = %error,
                        "a rate lease call failed: each replica decides alone on its part of the rate until one answers"
                    );
                }
            }
        }
    }

    /// The last lease call failed.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Lease calls failed since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// One tenant's rate on a replica of a fleet: the units leased from the fleet and not yet
/// admitted, and the replica's own part of the rate for when it cannot lease.
#[derive(Debug, Clone)]
pub struct Leased {
    terms: RateTerms,
    /// Units one ask takes at least (see [`LEASE_SPAN`]), at most the burst.
    block: u64,
    /// Leased and not yet admitted: this replica's to admit.
    lease: u64,
    /// The fleet said no unit conforms before this: none is asked for until then.
    not_before: Instant,
    /// Deciding alone (cut off, or a lease call failed) rather than on the lease.
    alone: bool,
    /// A lease call failed: alone until then, whatever the fleet's state.
    failed_until: Instant,
    /// The replica's part of the rate while alone.
    own: Gcra,
    /// A lease call is in flight: sends short of the lease wait for it, none starts another.
    asking: bool,
    /// Answers heard, counted so a waiting send knows when its own has come (see [`Ask`]).
    round: u64,
    /// Units of the sends the call in flight was made for.
    serving: u64,
    /// Units of the sends that came short while it was in flight: the next call's.
    queued: u64,
}

/// What a send short of its lease does before it is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    /// Make the one call (in a task of its own): ask the fleet for `want` units; the send
    /// is judged once the round reaches `until`.
    Call {
        want: u64,
        terms: RateTerms,
        until: u64,
    },
    /// A call is in flight: the send waits for the next one's answer (made for it and the
    /// others that came meanwhile), or for the calls to end, both reaching round `until`.
    Wait { until: u64 },
}

impl Leased {
    /// Nothing leased yet at `now`; alone, this replica takes `rate` over `max_replicas`.
    pub fn new(rate: Rate, max_replicas: u64, now: Instant) -> Self {
        let burst = u64::from(rate.burst());
        let block = (rate.per_s() * LEASE_SPAN.as_secs_f64()).ceil() as u64;
        Self {
            terms: RateTerms {
                interval_ns: rate.interval_ns(),
                burst,
            },
            block: block.clamp(1, burst),
            lease: 0,
            not_before: now,
            alone: false,
            failed_until: now,
            own: Gcra::new(part_of(rate, max_replicas), now),
            asking: false,
            round: 0,
            serving: 0,
            queued: 0,
        }
    }

    /// What a send of `units` does before it is judged; `None`: nothing (the lease has
    /// them, the fleet said none conform yet, they never can, or the replica decides
    /// alone). One call at a time: a send finding one in flight queues for the next.
    pub(super) fn shortfall(&mut self, units: u64, now: Instant, joined: bool) -> Option<Ask> {
        self.alone = !joined || now < self.failed_until;
        if self.alone || self.lease >= units || now < self.not_before || units > self.terms.burst {
            return None;
        }
        if self.asking {
            self.queued = self.queued.saturating_add(units);
            return Some(Ask::Wait {
                until: self.round + 2,
            });
        }
        self.asking = true;
        self.serving = units;
        Some(Ask::Call {
            want: units.max(self.block) - self.lease,
            terms: self.terms,
            until: self.round + 1,
        })
    }

    /// The fleet answered the call in flight (or it failed) at `now`: the next call's
    /// `want`, for the sends that queued meanwhile, or `None`: the calls end and every
    /// waiting send is judged on the lease as it is.
    pub(super) fn answered(
        &mut self,
        answer: &Result<Grant, RateError>,
        now: Instant,
        joined: bool,
    ) -> Option<u64> {
        self.round += 1;
        let heard = match answer {
            Ok(grant) => {
                self.lease = self.lease.saturating_add(grant.granted);
                self.not_before = now + grant.wait;
                true
            }
            Err(_) => {
                self.alone = true;
                self.failed_until = now + ALONE_AFTER_FAILURE;
                false
            }
        };
        // The sends just answered have not taken their units yet: their demand stands.
        let demand = self.serving.saturating_add(self.queued);
        let want = demand.max(self.block).saturating_sub(self.lease);
        if heard && joined && self.queued > 0 && now >= self.not_before && want > 0 {
            self.serving = std::mem::take(&mut self.queued);
            return Some(want);
        }
        self.asking = false;
        self.round += 1;
        self.serving = 0;
        self.queued = 0;
        None
    }

    /// Answers heard so far (see [`Ask`]).
    pub(super) fn round(&self) -> u64 {
        self.round
    }

    fn interval(&self) -> Duration {
        Duration::from_nanos(self.terms.interval_ns)
    }

    /// How long until `units` may be admitted (zero: now); `None`: never (past the burst).
    pub fn wait(&self, units: u64, now: Instant) -> Option<Duration> {
        if self.alone {
            return self.own.wait(units, now);
        }
        if units > self.terms.burst {
            return None;
        }
        if self.lease >= units {
            return Some(Duration::ZERO);
        }
        // The fleet's first unit when it said, else (another send took what this one
        // leased) one interval away; the rest an interval apart at best.
        let first = match self.not_before.saturating_duration_since(now) {
            Duration::ZERO => self.interval(),
            first => first,
        };
        let rest = u32::try_from(units - self.lease - 1).unwrap_or(u32::MAX);
        Some(first.saturating_add(self.interval().saturating_mul(rest)))
    }

    pub fn take(&mut self, units: u64, now: Instant) {
        if self.alone {
            self.own.take(units, now);
        } else {
            self.lease = self.lease.saturating_sub(units);
        }
    }

    /// Given back (the seat refused): this replica's again, for its next send; no call.
    pub fn give_back(&mut self, units: u64) {
        if self.alone {
            self.own.give_back(units);
        } else {
            self.lease = self.lease.saturating_add(units);
        }
    }

    pub fn available(&self, now: Instant) -> u64 {
        if self.alone {
            self.own.available(now)
        } else {
            self.lease
        }
    }

    /// Until one more unit may be admitted; `None` while the lease holds some.
    pub fn until_more(&self, now: Instant) -> Option<Duration> {
        if self.alone {
            self.own.until_more(now)
        } else if self.lease > 0 {
            None
        } else {
            self.wait(1, now)
        }
    }

    /// How long a whole burst takes to come back (the fleet's bucket is not seen here).
    pub fn until_full(&self, now: Instant) -> Duration {
        if self.alone {
            self.own.until_full(now)
        } else {
            let burst = u32::try_from(self.terms.burst).unwrap_or(u32::MAX);
            self.interval().saturating_mul(burst)
        }
    }
}

/// A replica's part of `rate` when it decides alone: the rate and the burst over the most
/// replicas the fleet runs, so the fleet, every replica alone, stays within the rate.
fn part_of(rate: Rate, max_replicas: u64) -> Rate {
    let n = max_replicas.max(1);
    let per_s = (rate.per_s() / n as f64).max(Rate::MIN_PER_S);
    let burst = u32::try_from(u64::from(rate.burst()) / n)
        .unwrap_or(u32::MAX)
        .max(1);
    Rate::new(per_s, Some(burst)).unwrap_or(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_s: f64, burst: u32) -> Rate {
        Rate::new(per_s, Some(burst)).unwrap()
    }

    fn granted(granted: u64, wait: Duration) -> Result<Grant, RateError> {
        Ok(Grant { granted, wait })
    }

    /// One call at a time: sends short while it is in flight queue for the next, which is
    /// made only for what the lease will not cover, while the fleet has more; each
    /// waiting send's round comes when its call is answered or the calls end.
    #[tokio::test(start_paused = true)]
    async fn one_call_at_a_time_and_the_next_only_for_what_queued() {
        let now = Instant::now();
        let mut l = Leased::new(rate(1000.0, 100), 3, now);
        let terms = l.terms;
        let first = Ask::Call {
            want: 10,
            terms,
            until: 1,
        };
        assert_eq!(l.shortfall(1, now, true), Some(first));
        assert_eq!(l.shortfall(5, now, true), Some(Ask::Wait { until: 2 }));
        assert_eq!(l.shortfall(15, now, true), Some(Ask::Wait { until: 2 }));
        // 10 leased for the asker's 1; 20 queued: (1 + 20) − 10 more.
        assert_eq!(
            l.answered(&granted(10, Duration::ZERO), now, true),
            Some(11)
        );
        assert_eq!(l.round(), 1, "the asker is answered, the queued are not");
        assert_eq!(l.shortfall(30, now, true), Some(Ask::Wait { until: 3 }));
        l.take(1, now);
        // The fleet grants part of it and has no more now: the calls end.
        let wait = Duration::from_millis(3);
        assert_eq!(l.answered(&granted(4, wait), now, true), None);
        assert_eq!(l.round(), 3, "every waiting send's round has come");
        assert_eq!(l.available(now), 13);
        assert_eq!(
            l.shortfall(20, now, true),
            None,
            "none conforms until the wait"
        );
        let later = now + wait;
        assert!(matches!(
            l.shortfall(20, later, true),
            Some(Ask::Call {
                want: 7,
                until: 4,
                ..
            })
        ));
    }

    /// A failed call, a replica cut off, or a lease that covers the queued sends: no next
    /// call, and the round moves past every waiting send.
    #[tokio::test(start_paused = true)]
    async fn the_calls_end_on_a_failure_a_cut_or_a_covering_lease() {
        let now = Instant::now();
        let ask = |l: &mut Leased| {
            assert!(matches!(l.shortfall(1, now, true), Some(Ask::Call { .. })));
            assert!(matches!(l.shortfall(1, now, true), Some(Ask::Wait { .. })));
        };
        let mut l = Leased::new(rate(1000.0, 100), 3, now);
        ask(&mut l);
        assert_eq!(l.answered(&Err(RateError("down".into())), now, true), None);
        assert_eq!(l.round(), 2);
        assert_eq!(l.shortfall(1, now, true), None, "alone after a failure");
        assert_eq!(l.wait(1, now), Some(Duration::ZERO), "on its own part");
        let mut l = Leased::new(rate(1000.0, 100), 3, now);
        ask(&mut l);
        assert_eq!(l.answered(&granted(10, Duration::ZERO), now, false), None);
        let mut l = Leased::new(rate(1000.0, 100), 3, now);
        ask(&mut l);
        assert_eq!(
            l.answered(&granted(10, Duration::ZERO), now, true),
            None,
            "10 cover both"
        );
        assert_eq!(l.round(), 2);
        assert!(matches!(
            l.shortfall(11, now, true),
            Some(Ask::Call {
                want: 1,
                until: 3,
                ..
            })
        ));
    }

    #[test]
    fn a_replicas_part_is_the_rate_over_the_most_replicas_and_at_least_one_unit() {
        let part = part_of(rate(90.0, 30), 3);
        assert_eq!((part.per_s(), part.burst()), (30.0, 10));
        let part = part_of(rate(2.0, 2), 5);
        assert_eq!((part.per_s(), part.burst()), (0.4, 1));
        assert_eq!(part_of(rate(2.0, 2), 0), rate(2.0, 2));
    }
}
