//! The tenants' rate quotas across a fleet (docs/fairness.md, "Quotas in a fleet"): one
//! GCRA per tenant in the shared store, from which each replica leases the units it admits.
//!
//! It knows nothing of the ceiling's ledger: its keys, its script and its losses touch no
//! step of docs/fleet.md. A lost key only refills a tenant's bucket (one burst more at
//! worst); a replica that cannot lease falls back to its own part of the rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

/// Why a lease failed: the store's own error (its deadline, its connection, a reply it
/// should not have given), as it said it. A replica that cannot lease decides alone for a
/// while, so no caller tells one failure from another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RateError(pub String);

/// A tenant's rate as the store's GCRA takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateTerms {
    /// Nanoseconds one unit takes to come back (`Rate::interval_ns`).
    pub interval_ns: u64,
    /// Units a full bucket holds.
    pub burst: u64,
}

/// What the fleet's GCRA granted of the units asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Units granted (taken from the fleet's bucket): the replica's to admit.
    pub granted: u64,
    /// How long until one more unit conforms, after this grant.
    pub wait: Duration,
}

/// The fleet's GCRA per tenant.
#[async_trait]
pub trait RateLedger: Send + Sync {
    /// Take as many of `want` units of `tenant`'s bucket as conform now (none past its
    /// burst; `want` 0 only looks), atomically for the whole fleet.
    async fn lease(&self, tenant: &str, terms: RateTerms, want: u64) -> Result<Grant, RateError>;
}

/// [`RateLedger`] in one process over tokio's clock, with the script's rule (tests).
#[derive(Debug, Default)]
pub struct MemoryRates {
    /// Each tenant's theoretical arrival time.
    tats: Mutex<HashMap<String, Instant>>,
    /// While set, every lease fails (Redis down or cut off).
    down: Mutex<bool>,
    /// Leases asked, failed ones included.
    calls: AtomicU64,
}

impl MemoryRates {
    /// Every key lost (a flush): every bucket is full again.
    pub fn lose_everything(&self) {
        self.tats.lock().clear();
    }

    pub fn set_down(&self, on: bool) {
        *self.down.lock() = on;
    }

    /// Leases asked so far, failed ones included.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl RateLedger for MemoryRates {
    async fn lease(&self, tenant: &str, terms: RateTerms, want: u64) -> Result<Grant, RateError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if *self.down.lock() {
            return Err(RateError("down".into()));
        }
        let now = Instant::now();
        let mut tats = self.tats.lock();
        let tat = tats.get(tenant).copied().unwrap_or(now).max(now);
        let interval = u128::from(terms.interval_ns.max(1));
        let tolerance = interval * u128::from(terms.burst);
        let used = tat.duration_since(now).as_nanos();
        let fits = tolerance.saturating_sub(used) / interval;
        let granted = u64::try_from(fits).unwrap_or(u64::MAX).min(want);
        let tat = tat + nanos(u128::from(granted) * interval);
        tats.insert(tenant.to_owned(), tat);
        let used = tat.duration_since(now).as_nanos();
        Ok(Grant {
            granted,
            wait: nanos((used + interval).saturating_sub(tolerance)),
        })
    }
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: RateTerms = RateTerms {
        interval_ns: 100_000_000,
        burst: 3,
    };

    #[tokio::test(start_paused = true)]
    async fn the_memory_rule_grants_what_conforms_and_says_when_more_does() {
        let rates = MemoryRates::default();
        let grant = rates.lease("a", TERMS, 2).await.unwrap();
        assert_eq!(
            grant,
            Grant {
                granted: 2,
                wait: Duration::ZERO
            }
        );
        let grant = rates.lease("a", TERMS, 5).await.unwrap();
        assert_eq!(grant.granted, 1, "the burst's last unit only");
        assert_eq!(grant.wait, Duration::from_millis(100));
        assert_eq!(
            rates.lease("b", TERMS, 1).await.unwrap().granted,
            1,
            "per tenant"
        );
        tokio::time::advance(Duration::from_millis(250)).await;
        let grant = rates.lease("a", TERMS, 5).await.unwrap();
        assert_eq!(grant.granted, 2);
        assert_eq!(grant.wait, Duration::from_millis(50));
        rates.lose_everything();
        assert_eq!(rates.lease("a", TERMS, 5).await.unwrap().granted, 3);
        rates.set_down(true);
        assert!(rates.lease("a", TERMS, 1).await.is_err());
        assert_eq!(rates.calls(), 6);
    }
}
