//! How a queue's shares and criticality levels apply (docs/fairness.md): the policy the
//! variables give, a queue's runtime overrides on top, and the `Retry-After` of the
//! judge's refusals.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::share::ShareMode;
use crate::admission::tenants::Criticality;
use crate::config::Fraction;

/// How the shares and the levels apply (from the variables, at start-up).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FairPolicy {
    pub mode: ShareMode,
    /// Contended at or over this fraction of the ceiling.
    pub share_at: Fraction,
    /// A sheddable send is refused once it would take the queue past this fraction.
    pub shed_at_sheddable: Fraction,
    /// A default send likewise; a critical one only at the ceiling.
    pub shed_at_default: Fraction,
}

/// The answer's `Retry-After` for a share refusal: the next round, at the next depth read
/// (a second apart by default), opens the tenant's part.
pub const SHARE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answer's `Retry-After` for a `max_share` refusal: what the tenant holds shrinks as
/// the queue drains, which the next depth reads show.
pub const MAX_SHARE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One queue's runtime overrides of the fair policy (`PATCH /admin/settings`); `None`
/// keeps the variable's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FairOverride {
    pub share_at: Option<Fraction>,
    pub shed_at_sheddable: Option<Fraction>,
    pub shed_at_default: Option<Fraction>,
}

/// A queue's fair policy, swappable at runtime as the ceiling's `PolicyCell` is: the
/// variables' policy and the one in force (one lock-free load per decision).
#[derive(Debug)]
pub struct FairCell {
    base: FairPolicy,
    current: ArcSwap<FairPolicy>,
}

impl FairCell {
    pub fn new(base: FairPolicy) -> Self {
        Self {
            base,
            current: ArcSwap::from_pointee(base),
        }
    }

    /// The policy in force.
    pub fn load(&self) -> FairPolicy {
        **self.current.load()
    }

    /// The policy the variables give.
    pub fn base(&self) -> &FairPolicy {
        &self.base
    }

    /// Put `overrides` in force on top of the variables' policy (an empty one restores
    /// it). The settings refuse a sheddable level above the default one; should the two
    /// still cross (an override kept while a variable changed), sheddable is held to
    /// default, so a sheddable send is never admitted where a default one is refused.
    pub fn apply(&self, overrides: &FairOverride) {
        let base = self.base;
        let shed_at_default = overrides.shed_at_default.unwrap_or(base.shed_at_default);
        let shed_at_sheddable = match overrides
            .shed_at_sheddable
            .unwrap_or(base.shed_at_sheddable)
        {
            above if above > shed_at_default => shed_at_default,
            level => level,
        };
        self.current.store(Arc::new(FairPolicy {
            share_at: overrides.share_at.unwrap_or(base.share_at),
            shed_at_sheddable,
            shed_at_default,
            ..base
        }));
    }
}

impl FairPolicy {
    /// The most the queue may hold after a send at `level` (the ceiling for critical).
    pub fn cut(&self, level: Criticality, limit: u64) -> u64 {
        let fraction = match level {
            Criticality::Critical => return limit,
            Criticality::Default => self.shed_at_default,
            Criticality::Sheddable => self.shed_at_sheddable,
        };
        // Rounded down: a level never admits past its fraction.
        ((limit as f64) * fraction.get()).floor() as u64
    }
}
