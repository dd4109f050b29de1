//! The judge a queue's gate asks about each send its ceiling would admit
//! (docs/fairness.md): first the send's criticality against its level's fraction of the
//! ceiling, then the tenant's share of the room. It only ever refuses.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::ceiling::policy::{Judge, Refusal};
use super::share::{ShareBook, ShareMode, Verdict};
use super::tally::Reason;
use super::tenants::{Criticality, TenantIndex};
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

/// The answer's `Retry-After` for a share refusal: the next round opens the tenant's part.
pub const SHARE_RETRY_AFTER: Duration = Duration::from_secs(1);

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

/// One send's judge: its asker, the queue's book, the policy in force.
pub struct ShareJudge<'a> {
    pub book: &'a Mutex<ShareBook>,
    pub asker: Asker,
    pub policy: FairPolicy,
    /// In shadow mode, why the send would have been refused (it is admitted): counted per
    /// tenant by the queue's tally.
    pub would_refuse: Option<Reason>,
}

impl Judge for ShareJudge<'_> {
    fn admits(
        &mut self,
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
        let near = estimate as f64 >= self.policy.share_at.get() * limit as f64;
        let verdict = self.book.lock().decide(
            self.asker.tenant,
            units,
            room,
            near,
            self.policy.mode,
            Instant::now(),
        );
        match verdict {
            Verdict::Admit => Ok(()),
            Verdict::WouldRefuse { .. } => {
                // The first rule that would refuse names it, as it would the 429.
                self.would_refuse.get_or_insert(Reason::TenantShare);
                Ok(())
            }
            Verdict::Refuse { share, room } => Err(Refusal::TenantShare {
                share_milli: (share.clamp(0.0, 1.0) * 1000.0).round() as u16,
                retry_after: SHARE_RETRY_AFTER,
                room,
            }),
        }
    }

    fn refused_full(&mut self, units: u64) {
        self.book
            .lock()
            .refused_at_ceiling(self.asker.tenant, units, Instant::now());
    }
}
