//! The tenants' quotas (docs/fairness.md, "Quotas"), as books the judge (`judging.rs`) asks
//! about a send the ceiling admits: a rate with a burst (GCRA, `gcra.rs`), kept per tenant
//! for the whole gateway (in a fleet, leased from the fleet's: `fleet_rate.rs`), and `max_share`, what a tenant's admissions hold of one queue, kept by
//! each queue's gate. Asking takes nothing: only units the judge admits are taken, so a
//! refusal (for a quota, a share or criticality) costs the tenant none of its quota.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::fleet_rate::{Ask, FleetRates, LeaseHealth, Leased};
pub use super::gcra::Gcra;
use crate::admission::tenants::{Quota, Rate, TenantIndex, Tenants};
use crate::coordination::rates::RateTerms;

/// What a tenant's rate quota stands at, for the `RateLimit` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateState {
    pub rate: Rate,
    /// Units that conform now.
    pub available: u64,
    /// Until one more unit is available; `None` when none is missing.
    pub until_more: Option<Duration>,
}

/// One tenant's rate bucket: its own GCRA (alone by design), or, in a fleet, what it
/// leased of the fleet's ([`Leased`]). The judge asks either the same way.
#[derive(Debug, Clone)]
pub enum RateBucket {
    Alone(Gcra),
    Leased(Leased),
}

impl RateBucket {
    /// How long until `units` conform (zero: now); `None` when they never can.
    pub fn wait(&self, units: u64, now: Instant) -> Option<Duration> {
        match self {
            Self::Alone(g) => g.wait(units, now),
            Self::Leased(l) => l.wait(units, now),
        }
    }

    /// Take `units` at `now` (the judge admitted them).
    pub fn take(&mut self, units: u64, now: Instant) {
        match self {
            Self::Alone(g) => g.take(units, now),
            Self::Leased(l) => l.take(units, now),
        }
    }

    /// Give back `units` taken (see [`Gcra::give_back`]).
    pub fn give_back(&mut self, units: u64) {
        match self {
            Self::Alone(g) => g.give_back(units),
            Self::Leased(l) => l.give_back(units),
        }
    }

    /// Units that conform at `now`.
    pub fn available(&self, now: Instant) -> u64 {
        match self {
            Self::Alone(g) => g.available(now),
            Self::Leased(l) => l.available(now),
        }
    }

    /// How long until one more unit is available; `None` when none is missing.
    pub fn until_more(&self, now: Instant) -> Option<Duration> {
        match self {
            Self::Alone(g) => g.until_more(now),
            Self::Leased(l) => l.until_more(now),
        }
    }

    /// How long until a whole burst conforms again.
    pub fn until_full(&self, now: Instant) -> Duration {
        match self {
            Self::Alone(g) => g.until_full(now),
            Self::Leased(l) => l.until_full(now),
        }
    }
}

/// One tenant's bucket in the book.
#[derive(Debug)]
struct Bucket {
    rate: Rate,
    /// The tenant's name: its key in the fleet's store.
    name: String,
    state: Mutex<RateBucket>,
    /// Woken at each answer to a lease call (see [`Leased`]'s rounds).
    answered: Notify,
}

impl Bucket {
    fn new(rate: Rate, name: String, state: RateBucket) -> Arc<Self> {
        Arc::new(Self {
            rate,
            name,
            state: Mutex::new(state),
            answered: Notify::new(),
        })
    }

    /// Answers heard to its lease calls (never waited on alone by design).
    fn round(&self) -> u64 {
        match &*self.state.lock() {
            RateBucket::Leased(leased) => leased.round(),
            RateBucket::Alone(_) => u64::MAX,
        }
    }

    /// Once the lease calls' answers reach `round`.
    async fn heard(&self, round: u64) {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            // Listening before looking: an answer between the two is not missed.
            answered.as_mut().enable();
            if self.round() >= round {
                return;
            }
            answered.await;
        }
    }
}

/// The lease calls for one tenant, `want` units first, until no send waits for another:
/// a task of its own, so what the fleet grants reaches the lease even when the send that
/// asked is dropped (its client went away) while the store answers.
async fn ask_fleet(
    bucket: Arc<Bucket>,
    fleet: FleetRates,
    health: Arc<LeaseHealth>,
    mut want: u64,
    terms: RateTerms,
) {
    loop {
        let answer = fleet.ledger.lease(&bucket.name, terms, want).await;
        health.heard(&bucket.name, &answer);
        let joined = fleet.fleet.joined();
        let next = match &mut *bucket.state.lock() {
            RateBucket::Leased(leased) => leased.answered(&answer, Instant::now(), joined),
            RateBucket::Alone(_) => None,
        };
        bucket.answered.notify_waiters();
        match next {
            Some(more) => want = more,
            None => return,
        }
    }
}

/// Every tenant's rate bucket (index = [`TenantIndex`]; `None`: no rate quota), shared
/// by every queue's gate and the HTTP edge's headers; in a fleet, leased from the fleet.
#[derive(Default)]
pub struct RateBook {
    buckets: Vec<Option<Arc<Bucket>>>,
    fleet: Option<FleetRates>,
    health: Arc<LeaseHealth>,
}

impl std::fmt::Debug for RateBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateBook")
            .field("buckets", &self.buckets)
            .field("fleet", &self.fleet.is_some())
            .finish()
    }
}

impl RateBook {
    /// Full buckets at `now` for the tenants with a rate quota, kept by this process alone.
    pub fn new(quotas: &[Quota], now: Instant) -> Self {
        let buckets = quotas.iter().map(|q| {
            q.rate.map(|rate| {
                Bucket::new(rate, String::new(), RateBucket::Alone(Gcra::new(rate, now)))
            })
        });
        Self {
            buckets: buckets.collect(),
            fleet: None,
            health: Arc::default(),
        }
    }

    /// The tenants' rate quotas held across the fleet: each replica leases from `fleet`'s
    /// store what it admits (docs/fairness.md, "Quotas in a fleet").
    pub fn in_fleet(tenants: &Tenants, fleet: FleetRates, now: Instant) -> Self {
        let max_replicas = fleet.fleet.max_replicas();
        let buckets = tenants.iter().map(|(_, tenant)| {
            tenant.quota.rate.map(|rate| {
                let leased = Leased::new(rate, max_replicas, now);
                Bucket::new(rate, tenant.name.clone(), RateBucket::Leased(leased))
            })
        });
        Self {
            buckets: buckets.collect(),
            fleet: Some(fleet),
            health: Arc::default(),
        }
    }

    /// In a fleet, `tenant`'s lease topped up to `units` when it is short (a call to the
    /// fleet's store, or the one in flight and the next); at once for a tenant without a
    /// rate quota, and alone by design.
    pub async fn lease(&self, tenant: TenantIndex, units: u64) {
        let Some(fleet) = &self.fleet else {
            return;
        };
        let Some(Some(bucket)) = self.buckets.get(usize::from(tenant.0)) else {
            return;
        };
        let joined = fleet.fleet.joined();
        let ask = match &mut *bucket.state.lock() {
            RateBucket::Leased(leased) => leased.shortfall(units, Instant::now(), joined),
            RateBucket::Alone(_) => None,
        };
        let until = match ask {
            None => return,
            Some(Ask::Wait { until }) => until,
            Some(Ask::Call { want, terms, until }) => {
                let calls = ask_fleet(
                    Arc::clone(bucket),
                    fleet.clone(),
                    Arc::clone(&self.health),
                    want,
                    terms,
                );
                tokio::spawn(calls);
                until
            }
        };
        bucket.heard(until).await;
    }

    /// How this replica's lease calls fare.
    pub fn lease_health(&self) -> &LeaseHealth {
        &self.health
    }

    /// Lease calls failed since start; `None` outside a fleet (nothing is leased).
    pub fn lease_failures(&self) -> Option<u64> {
        self.fleet.as_ref().map(|_| self.health.failures())
    }

    /// The tenant's rate and bucket, when it has a rate quota.
    pub fn bucket(&self, tenant: TenantIndex) -> Option<(Rate, &Mutex<RateBucket>)> {
        self.buckets
            .get(usize::from(tenant.0))?
            .as_ref()
            .map(|b| (b.rate, &b.state))
    }

    /// Where the tenant's rate quota stands at `now`; `None` without one.
    pub fn state(&self, tenant: TenantIndex, now: Instant) -> Option<RateState> {
        let (rate, bucket) = self.bucket(tenant)?;
        let bucket = bucket.lock();
        Some(RateState {
            rate,
            available: bucket.available(now),
            until_more: bucket.until_more(now),
        })
    }
}

/// One queue's estimate of what each tenant's admissions hold of it, for `max_share`.
///
/// `held_i` grows by what tenant `i` is admitted; whenever the gate's estimate of the
/// queue is below `Σ held`, every `held_i` is scaled down by `estimate / Σ held`: the queue
/// holds no more than its backlog, and what drained is taken from every tenant in
/// proportion to what it held. Messages of producers the gate does not count (other
/// replicas, other clients of the broker) only keep the estimate higher: each tenant is
/// taken to hold its admissions for longer, the side of refusing.
#[derive(Debug)]
pub struct HeldBook {
    caps: Vec<Option<crate::config::Fraction>>,
    held: Vec<f64>,
}

impl HeldBook {
    pub fn new(quotas: &[Quota]) -> Self {
        Self {
            caps: quotas.iter().map(|q| q.max_share).collect(),
            held: vec![0.0; quotas.len()],
        }
    }

    /// Scale what the tenants hold down to what the queue holds.
    fn settle(&mut self, estimate: u64) {
        let total: f64 = self.held.iter().sum();
        let estimate = estimate as f64;
        if total > estimate {
            let scale = estimate / total;
            for h in &mut self.held {
                *h *= scale;
            }
        }
    }

    /// What `tenant` is taken to hold now (for tests and health).
    pub fn held(&self, tenant: TenantIndex) -> f64 {
        self.held.get(usize::from(tenant.0)).copied().unwrap_or(0.0)
    }

    /// Whether `units` more keep `tenant` within `max_share × limit` (rounded down, at
    /// least 1) of a queue holding `estimate`; `Err(room)`: how many would.
    pub fn check(
        &mut self,
        tenant: TenantIndex,
        units: u64,
        estimate: u64,
        limit: u64,
    ) -> Result<(), u64> {
        self.settle(estimate);
        let index = usize::from(tenant.0);
        let Some(Some(share)) = self.caps.get(index) else {
            return Ok(());
        };
        let cap = ((limit as f64 * share.get()).floor() as u64).max(1) as f64;
        let held = self.held[index];
        // A sliver of a unit over (the scaling's rounding) is not a unit.
        if held + units as f64 <= cap + 1e-9 {
            Ok(())
        } else {
            Err((cap - held + 1e-9).floor().max(0.0) as u64)
        }
    }

    /// `tenant` was admitted `units`.
    pub fn take(&mut self, tenant: TenantIndex, units: u64) {
        if let Some(h) = self.held.get_mut(usize::from(tenant.0)) {
            *h += units as f64;
        }
    }

    /// `units` admitted to `tenant` were not sent after all.
    pub fn give_back(&mut self, tenant: TenantIndex, units: u64) {
        if let Some(h) = self.held.get_mut(usize::from(tenant.0)) {
            *h = (*h - units as f64).max(0.0);
        }
    }
}

/// A queue's quotas: the gateway's rate book and the queue's own held book.
#[derive(Debug)]
pub struct QueueQuotas {
    pub rates: std::sync::Arc<RateBook>,
    pub held: Mutex<HeldBook>,
}

impl QueueQuotas {
    /// The queue's books for tenants with these `quotas` (index = [`TenantIndex`]);
    /// `rates` is the gateway's, shared by every queue.
    pub fn new(quotas: &[Quota], rates: std::sync::Arc<RateBook>) -> Self {
        Self {
            rates,
            held: Mutex::new(HeldBook::new(quotas)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Fraction;

    const MS: Duration = Duration::from_millis(1);

    fn rate(per_s: f64, burst: u32) -> Rate {
        Rate::new(per_s, Some(burst)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_bucket_gives_its_burst_at_once_then_the_steady_rate() {
        let now = Instant::now();
        let mut g = Gcra::new(rate(10.0, 5), now);
        assert_eq!(g.available(now), 5);
        assert_eq!(g.until_more(now), None, "full");
        for left in (0..5).rev() {
            assert_eq!(g.wait(1, now), Some(Duration::ZERO));
            g.take(1, now);
            assert_eq!(g.available(now), left);
        }
        assert_eq!(
            g.wait(1, now),
            Some(100 * MS),
            "the next unit in one interval"
        );
        assert_eq!(g.until_more(now), Some(100 * MS));
        assert_eq!(g.until_full(now), 500 * MS);
        // Steady: one unit every 100 ms, none sooner.
        tokio::time::advance(99 * MS).await;
        let t = Instant::now();
        assert_eq!(g.wait(1, t), Some(MS));
        assert_eq!(g.until_more(t), Some(MS));
        tokio::time::advance(MS).await;
        for _ in 0..20 {
            let t = Instant::now();
            assert_eq!(g.wait(1, t), Some(Duration::ZERO));
            g.take(1, t);
            assert_eq!(g.wait(1, t), Some(100 * MS));
            tokio::time::advance(100 * MS).await;
        }
        // Idle long enough, the bucket is full again, and no fuller.
        tokio::time::advance(Duration::from_secs(60)).await;
        let t = Instant::now();
        assert_eq!(g.available(t), 5);
        assert_eq!(g.until_full(t), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_conforms_whole_or_waits_and_never_past_the_burst() {
        let now = Instant::now();
        let mut g = Gcra::new(rate(10.0, 5), now);
        g.take(3, now);
        assert_eq!(g.available(now), 2);
        assert_eq!(g.wait(2, now), Some(Duration::ZERO));
        assert_eq!(
            g.wait(3, now),
            Some(100 * MS),
            "3 of a full 5 after one interval"
        );
        assert_eq!(g.wait(5, now), Some(300 * MS));
        assert_eq!(g.wait(6, now), None, "more than the burst never conforms");
        g.take(2, now);
        assert_eq!(g.available(now), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn units_given_back_conform_again() {
        let now = Instant::now();
        let mut g = Gcra::new(rate(1.0, 3), now);
        g.take(3, now);
        g.give_back(2);
        assert_eq!(g.available(now), 2);
        assert_eq!(g.wait(2, now), Some(Duration::ZERO));
        let mut book = HeldBook::new(&[capped(0.5)]);
        book.take(TenantIndex(0), 5);
        book.give_back(TenantIndex(0), 7);
        assert_eq!(book.held(TenantIndex(0)), 0.0, "never below nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn asking_takes_nothing() {
        let now = Instant::now();
        let g = Gcra::new(rate(1.0, 2), now);
        for _ in 0..100 {
            assert_eq!(g.wait(2, now), Some(Duration::ZERO));
            let _ = g.wait(3, now);
        }
        assert_eq!(g.available(now), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_rate_and_a_fast_one_keep_their_interval() {
        let now = Instant::now();
        let mut slow = Gcra::new(rate(0.5, 1), now);
        slow.take(1, now);
        assert_eq!(slow.wait(1, now), Some(Duration::from_secs(2)));
        let mut fast = Gcra::new(rate(Rate::MAX_PER_S, 1000), now);
        fast.take(1000, now);
        assert_eq!(fast.wait(1, now), Some(Duration::from_micros(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_book_keeps_a_bucket_only_for_tenants_with_a_rate() {
        let now = Instant::now();
        let quotas = [
            Quota::default(),
            Quota {
                rate: Some(rate(2.0, 4)),
                max_share: None,
            },
        ];
        let book = RateBook::new(&quotas, now);
        assert!(book.bucket(TenantIndex(0)).is_none());
        assert!(book.state(TenantIndex(0), now).is_none());
        assert!(book.bucket(TenantIndex(9)).is_none());
        let (r, bucket) = book.bucket(TenantIndex(1)).unwrap();
        assert_eq!(r.burst(), 4);
        bucket.lock().take(1, now);
        assert_eq!(
            book.state(TenantIndex(1), now),
            Some(RateState {
                rate: r,
                available: 3,
                until_more: Some(Duration::from_millis(500)),
            })
        );
    }

    fn capped(share: f64) -> Quota {
        Quota {
            max_share: Fraction::new(share),
            rate: None,
        }
    }

    #[test]
    fn max_share_caps_what_a_tenant_holds_and_drains_in_proportion() {
        let (a, b) = (TenantIndex(0), TenantIndex(1));
        let mut book = HeldBook::new(&[capped(0.2), Quota::default()]);
        // Ceiling 100: A may hold 20.
        assert_eq!(book.check(a, 20, 0, 100), Ok(()));
        book.take(a, 20);
        assert_eq!(book.check(a, 1, 20, 100), Err(0));
        assert_eq!(book.check(b, 50, 20, 100), Ok(()), "B has no cap");
        book.take(b, 60);
        // The queue holds 80, as admitted: nothing drained, A still at its cap.
        assert_eq!(book.check(a, 1, 80, 100), Err(0));
        // Half of it drained: A is taken to hold half of its 20.
        assert_eq!(book.check(a, 11, 40, 100), Err(10));
        assert!((book.held(a) - 10.0).abs() < 1e-9);
        assert!((book.held(b) - 30.0).abs() < 1e-9);
        assert_eq!(book.check(a, 10, 40, 100), Ok(()));
        // A batch over the cap is refused whole, with the room it has.
        assert_eq!(book.check(a, 30, 40, 100), Err(10));
    }

    #[test]
    fn a_refused_check_takes_nothing_and_a_tiny_cap_is_one_unit() {
        let a = TenantIndex(0);
        let mut book = HeldBook::new(&[capped(0.01)]);
        assert_eq!(book.check(a, 2, 0, 10), Err(1), "0.1 of a unit rounds to 1");
        assert_eq!(book.held(a), 0.0);
        assert_eq!(book.check(a, 1, 0, 10), Ok(()));
        book.take(a, 1);
        assert_eq!(book.check(a, 1, 1, 10), Err(0));
        // An unknown tenant has no cap.
        assert_eq!(book.check(TenantIndex(7), 100, 0, 10), Ok(()));
    }
}
