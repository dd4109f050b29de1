//! A tenant's rate quota in a fleet (docs/fairness.md, "Quotas in a fleet"): the units a
//! replica admits are leased from the fleet's one GCRA per tenant (`coordination::rates`),
//! so the fleet admits the tenant's rate, not the rate on each replica.
//!
//! Leasing is the one step that waits on the store, and it runs before the judge (which
//! decides under locks and never waits): `quota::RateBook::lease` tops the replica's lease up
//! to what a send needs when it is short, then the judge spends the lease as it spends a
//! local bucket. A replica that cannot lease (cut off from the fleet, or its lease call
//! failed) decides alone on its part of the rate: the rate over the most replicas the
//! fleet runs.

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
        }
    }

    /// How many units to ask the fleet for before a send of `units` is judged; `None`:
    /// none (the lease has them, the fleet said none conform yet, they never can, or
    /// the replica decides alone).
    pub(super) fn shortfall(
        &mut self,
        units: u64,
        now: Instant,
        joined: bool,
    ) -> Option<(u64, RateTerms)> {
        self.alone = !joined || now < self.failed_until;
        if self.alone || self.lease >= units || now < self.not_before || units > self.terms.burst {
            return None;
        }
        Some((units.max(self.block) - self.lease, self.terms))
    }

    /// The fleet answered a lease (or failed to) at `now`.
    pub(super) fn answered(&mut self, answer: Result<Grant, RateError>, now: Instant) {
        match answer {
            Ok(grant) => {
                self.lease = self.lease.saturating_add(grant.granted);
                self.not_before = now + grant.wait;
            }
            // Not logged here: a store that fails fails the seats' calls too, which log it
            // and cut the replica off; here it only turns the rate to the replica's part.
            Err(_) => {
                self.alone = true;
                self.failed_until = now + ALONE_AFTER_FAILURE;
            }
        }
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

    #[test]
    fn a_replicas_part_is_the_rate_over_the_most_replicas_and_at_least_one_unit() {
        let part = part_of(rate(90.0, 30), 3);
        assert_eq!((part.per_s(), part.burst()), (30.0, 10));
        let part = part_of(rate(2.0, 2), 5);
        assert_eq!((part.per_s(), part.burst()), (0.4, 1));
        assert_eq!(part_of(rate(2.0, 2), 0), rate(2.0, 2));
    }
}
