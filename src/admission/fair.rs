//! The judge a queue's gate asks about each send its ceiling would admit
//! (docs/fairness.md): first the send's criticality against its level's fraction of the
//! ceiling, then the tenant's quotas, then its share of the room. It only ever refuses, and
//! a quota is taken only from what it admits.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::ceiling::policy::{Judge, Refusal};
use super::quota::QueueQuotas;
use super::share::{ShareBook, ShareMode, Verdict};
use super::tally::Reason;
use super::tenants::{Criticality, QuotaKind, TenantIndex};
use crate::config::Fraction;

/// Who asks: the tenant whose share a send takes, and the criticality it is sent at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asker {
    pub tenant: TenantIndex,
    pub criticality: Criticality,
}

impl Asker {
    /// Open mode's caller: the one tenant, at the default level.
    pub const OPEN: Asker = Asker {
        tenant: TenantIndex(0),
        criticality: Criticality::Default,
    };
}

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

/// A queue's fair policy, swappable at runtime as [`super::ceiling::PolicyCell`] is: the
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

/// One send's judge: its asker, the queue's books, the policy in force.
pub struct ShareJudge<'a> {
    pub book: &'a Mutex<ShareBook>,
    /// The tenants' quotas, when any tenant has one.
    pub quotas: Option<&'a QueueQuotas>,
    pub asker: Asker,
    pub policy: FairPolicy,
    /// In shadow mode, why the send would have been refused (it is admitted): counted per
    /// tenant by the queue's tally.
    pub would_refuse: Option<Reason>,
    /// The book's round the send was counted admitted in, once it is (what a fleet's seat
    /// refusing it takes back).
    pub counted_in: Option<u64>,
}

impl Judge for ShareJudge<'_> {
    fn admits(
        &mut self,
        round: u64,
        units: u64,
        room: u64,
        estimate: u64,
        after: u64,
        limit: u64,
    ) -> Result<(), Refusal> {
        let cut = self.policy.cut(self.asker.criticality, limit);
        if after > cut {
            // As many as the level has room for, weighed as the ceiling weighs them.
            let weight = (after - estimate).div_ceil(units.max(1)).max(1);
            let refusal = Refusal::Shed {
                criticality: self.asker.criticality,
                backlog: estimate,
                cut,
                retry_after: SHARE_RETRY_AFTER,
                room: cut.saturating_sub(estimate) / weight,
            };
            // Shadow mode shadows the cut too: an operator sees both rules' effect before
            // either refuses. The book is still asked, so its parts count this admission.
            if self.policy.mode != ShareMode::Shadow {
                return Err(refusal);
            }
            self.would_refuse = Some(Reason::Criticality);
        }
        let now = Instant::now();
        let tenant = self.asker.tenant;
        // Quotas: asked now, taken only once the share rule admits too (a unit refused for
        // its share costs none of the tenant's quota). Locks in one order: the tenant's
        // bucket, the queue's held book, its share book.
        let bucket = self
            .quotas
            .and_then(|q| q.rates.bucket(tenant))
            .map(|(_, bucket)| bucket.lock());
        if let Some(bucket) = &bucket {
            let wait = bucket.wait(units, now);
            if wait != Some(Duration::ZERO) {
                return Err(Refusal::TenantQuota {
                    quota: QuotaKind::Rate,
                    // More than the burst never conforms: when the bucket is full again,
                    // the answer's `room` is what may be sent.
                    retry_after: wait.unwrap_or_else(|| bucket.until_full(now)),
                    room: bucket.available(now),
                });
            }
        }
        let mut held = self.quotas.map(|q| q.held.lock());
        if let Some(held) = &mut held {
            if let Err(room) = held.check(tenant, units, estimate, limit) {
                return Err(Refusal::TenantQuota {
                    quota: QuotaKind::MaxShare,
                    retry_after: MAX_SHARE_RETRY_AFTER,
                    room,
                });
            }
        }
        let near = estimate as f64 >= self.policy.share_at.get() * limit as f64;
        let verdict = {
            let mut book = self.book.lock();
            // The ceiling's room in all, of which `room` may be this replica's share.
            let whole = limit.saturating_sub(estimate).max(room);
            let verdict =
                book.decide_in_part(tenant, units, (room, whole), near, self.policy.mode, round);
            self.counted_in = Some(book.round());
            verdict
        };
        match verdict {
            Verdict::Admit => {}
            Verdict::WouldRefuse { .. } => {
                // The first rule that would refuse names it, as it would the 429.
                self.would_refuse.get_or_insert(Reason::TenantShare);
            }
            Verdict::Refuse { share, room } => {
                return Err(Refusal::TenantShare {
                    share_milli: (share.clamp(0.0, 1.0) * 1000.0).round() as u16,
                    retry_after: SHARE_RETRY_AFTER,
                    room,
                })
            }
        }
        if let Some(mut bucket) = bucket {
            bucket.take(units, now);
        }
        if let Some(held) = &mut held {
            held.take(tenant, units);
        }
        Ok(())
    }

    fn refused_full(&mut self, round: u64, units: u64) {
        self.book
            .lock()
            .refused_at_ceiling(self.asker.tenant, units, round);
    }
}
