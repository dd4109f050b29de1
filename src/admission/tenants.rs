//! The tenants that share a queue's room (docs/fairness.md), as admission sees them: each
//! one's weight, and the criticality a send is made at. Built once from the keys file
//! (`http/auth.rs`); this module knows nothing of keys, tokens or HTTP.

use std::fmt;

use crate::config::Fraction;

/// A tenant's place among the tenants the keys file names (open mode: one tenant, 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantIndex(pub u16);

/// The most tenants a keys file may name: each queue keeps a row per tenant.
pub const MAX_TENANTS: usize = 1000;
/// A tenant's weight: 1 to this (docs/fairness.md: parts follow weights).
pub const MAX_WEIGHT: u32 = 1000;

/// How much a send matters when the queue is nearly full: a lower criticality is refused
/// first (each level refuses from its own fraction of the ceiling). Ordered: `Sheddable` <
/// `Default` < `Critical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Criticality {
    Sheddable,
    Default,
    Critical,
}

impl Criticality {
    pub const ALL: [Criticality; 3] = [
        Criticality::Critical,
        Criticality::Default,
        Criticality::Sheddable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Criticality::Critical => "critical",
            Criticality::Default => "default",
            Criticality::Sheddable => "sheddable",
        }
    }

    /// One of the three words, exactly (lowercase); anything else is `None`.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == word)
    }
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tenant: its name (for health, metrics and the 429), its weight and its quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    pub weight: u32,
    pub quota: Quota,
}

/// A tenant's optional quotas (docs/fairness.md, "Quotas"): each `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// The most of a queue's ceiling the tenant's admissions may hold.
    pub max_share: Option<Fraction>,
    /// A rate with a burst (GCRA), over every queue the gateway serves.
    pub rate: Option<Rate>,
}

impl Quota {
    pub fn is_none(&self) -> bool {
        self.max_share.is_none() && self.rate.is_none()
    }
}

/// Which quota refused a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    Rate,
    MaxShare,
}

impl QuotaKind {
    /// The word the 429's `quota` field says.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKind::Rate => "rate",
            QuotaKind::MaxShare => "max_share",
        }
    }
}

/// A rate quota: `per_s` units a second on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_s: f64,
    burst: u32,
}

/// Never NaN (checked by [`Rate::new`]): equality is an equivalence.
impl Eq for Rate {}

impl Rate {
    /// The slowest rate: one unit in 1,000 s.
    pub const MIN_PER_S: f64 = 0.001;
    pub const MAX_PER_S: f64 = 1_000_000.0;
    pub const MAX_BURST: u32 = 1_000_000;

    /// `per_s` within [`Rate::MIN_PER_S`]–[`Rate::MAX_PER_S`], `burst` within
    /// 1–[`Rate::MAX_BURST`]; without a burst, one second's worth (at least 1).
    pub fn new(per_s: f64, burst: Option<u32>) -> Option<Self> {
        if !(Self::MIN_PER_S..=Self::MAX_PER_S).contains(&per_s) {
            return None;
        }
        let burst = burst.unwrap_or_else(|| (per_s.ceil() as u32).max(1));
        (1..=Self::MAX_BURST)
            .contains(&burst)
            .then_some(Self { per_s, burst })
    }

    pub fn per_s(&self) -> f64 {
        self.per_s
    }

    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The time one unit takes to come back (GCRA's emission interval), in nanoseconds.
    pub fn interval_ns(&self) -> u64 {
        ((1e9 / self.per_s).round() as u64).max(1)
    }

    /// Whole seconds an empty bucket takes to fill again (`RateLimit-Policy`'s `w`), at
    /// least 1.
    pub fn window_s(&self) -> u64 {
        ((f64::from(self.burst) / self.per_s).ceil() as u64).max(1)
    }
}

/// Every tenant, in the order of their indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenants(Vec<Tenant>);

impl Tenants {
    /// Open mode: one tenant, everything the gateway admits is its.
    pub fn open() -> Self {
        Self(vec![Tenant {
            name: "open".into(),
            weight: 1,
            quota: Quota::default(),
        }])
    }

    /// `tenants` in index order: at least one, at most [`MAX_TENANTS`], weights within
    /// 1–[`MAX_WEIGHT`] (the keys file's parser checks each and names the key).
    pub fn new(tenants: Vec<Tenant>) -> Option<Self> {
        let fits = !tenants.is_empty()
            && tenants.len() <= MAX_TENANTS
            && tenants.iter().all(|t| (1..=MAX_WEIGHT).contains(&t.weight));
        fits.then_some(Self(tenants))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, index: TenantIndex) -> Option<&Tenant> {
        self.0.get(usize::from(index.0))
    }

    /// Each tenant's weight, by index (what a [`super::share::ShareBook`] is made from).
    pub fn weights(&self) -> Vec<u32> {
        self.0.iter().map(|t| t.weight).collect()
    }

    /// Each tenant's quotas, by index.
    pub fn quotas(&self) -> Vec<Quota> {
        self.0.iter().map(|t| t.quota).collect()
    }

    /// Whether any tenant has a quota (without, the gates keep no quota books).
    pub fn have_quotas(&self) -> bool {
        self.0.iter().any(|t| !t.quota.is_none())
    }

    pub fn iter(&self) -> impl Iterator<Item = (TenantIndex, &Tenant)> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, t)| (TenantIndex(u16::try_from(i).unwrap_or(u16::MAX)), t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criticality_is_ordered_and_read_only_as_its_three_words() {
        assert!(Criticality::Sheddable < Criticality::Default);
        assert!(Criticality::Default < Criticality::Critical);
        for c in Criticality::ALL {
            assert_eq!(Criticality::parse(c.as_str()), Some(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        for bad in ["Critical", "crit", "", "default "] {
            assert_eq!(Criticality::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tenants_hold_one_to_a_thousand_with_weights_in_bounds() {
        let t = |name: &str, weight| Tenant {
            name: name.into(),
            weight,
            quota: Quota::default(),
        };
        assert!(Tenants::new(vec![]).is_none());
        assert!(Tenants::new(vec![t("a", 0)]).is_none());
        assert!(Tenants::new(vec![t("a", MAX_WEIGHT + 1)]).is_none());
        let two = Tenants::new(vec![t("a", 3), t("b", MAX_WEIGHT)]).unwrap();
        assert_eq!(two.weights(), vec![3, MAX_WEIGHT]);
        assert_eq!(two.get(TenantIndex(1)).unwrap().name, "b");
        assert!(two.get(TenantIndex(2)).is_none());
        assert_eq!(two.len(), 2);
        assert!(!two.is_empty());
        let names: Vec<_> = two.iter().map(|(i, t)| (i.0, t.name.as_str())).collect();
        assert_eq!(names, [(0, "a"), (1, "b")]);
        assert!(Tenants::new((0..MAX_TENANTS).map(|i| t(&i.to_string(), 1)).collect()).is_some());
        assert!(Tenants::new((0..=MAX_TENANTS).map(|i| t(&i.to_string(), 1)).collect()).is_none());
        assert_eq!(Tenants::open().weights(), vec![1]);
        assert!(!Tenants::open().have_quotas());
    }

    #[test]
    fn a_rate_is_within_its_bounds_and_its_burst_defaults_to_a_seconds_worth() {
        for bad in [
            0.0,
            -1.0,
            Rate::MIN_PER_S / 2.0,
            Rate::MAX_PER_S * 2.0,
            f64::NAN,
        ] {
            assert!(Rate::new(bad, None).is_none(), "{bad}");
        }
        assert!(Rate::new(1.0, Some(0)).is_none());
        assert!(Rate::new(1.0, Some(Rate::MAX_BURST + 1)).is_none());
        let r = Rate::new(2.5, None).unwrap();
        assert_eq!((r.per_s(), r.burst()), (2.5, 3));
        assert_eq!(Rate::new(0.1, None).unwrap().burst(), 1, "at least one");
        assert_eq!(r.interval_ns(), 400_000_000);
        assert_eq!(r.window_s(), 2, "3 units at 2.5/s: 1.2 s, rounded up");
        assert_eq!(
            Rate::new(100.0, Some(1)).unwrap().window_s(),
            1,
            "at least 1 s"
        );
        assert_eq!(
            Rate::new(Rate::MIN_PER_S, None).unwrap().interval_ns(),
            1_000_000_000_000
        );
        assert_eq!(QuotaKind::Rate.as_str(), "rate");
        assert_eq!(QuotaKind::MaxShare.as_str(), "max_share");
    }
}
