//! The tenants that share a queue's room (docs/fairness.md), as admission sees them: each
//! one's weight, and the criticality a send is made at. Built once from the keys file
//! (`http/auth.rs`); this module knows nothing of keys, tokens or HTTP.

use std::fmt;

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

/// One tenant: its name (for health, metrics and the 429) and its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    pub weight: u32,
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
    }
}
