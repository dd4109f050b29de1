//! A queue's fairness (docs/fairness.md): who gets the room its ceiling admits when not
//! everyone can. [`QueueFairness`] owns it whole — the share book, the tally of answers,
//! the tenants' quotas, the units judged in a fleet and not yet answered — behind one seam:
//! the ceiling asks it for the `judging::Judging` of one send, hands that its view of the room,
//! and settles it with how the send was decided. The ceiling knows nothing else of it.
//!
//! ```text
//! mod.rs ──▶ judging.rs ──▶ policy.rs, share.rs, quota.rs, tally.rs
//!                      quota.rs ──▶ gcra.rs, fleet_rate.rs ──▶ coordination::rates
//!    └─────▶ exchange.rs ──▶ share.rs, coordination::shares
//! ```
//! It only ever refuses what the ceiling would admit: it never admits past the ceiling.

mod exchange;
pub mod fleet_rate;
mod gcra;
pub mod judging;
pub mod policy;
pub mod quota;
pub mod share;
pub mod tally;

#[cfg(test)]
mod simulation;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::admission::ceiling::policy::{CapacityPolicy, GateSnapshot};
use crate::admission::tenants::{Criticality, Tenant, TenantIndex, Tenants};
use crate::domain::QueueName;
use exchange::Names;
pub use exchange::Place;
use policy::FairCell;
pub use policy::{FairOverride, FairPolicy};
use quota::QueueQuotas;
use share::{ShareBook, ShareMode};
use tally::{Tally, TenantCounts};

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

    /// Where the share book counts its sends: its tenant at its criticality.
    pub fn cell(self) -> share::Cell {
        share::Cell {
            tenant: self.tenant,
            level: self.criticality,
        }
    }
}

/// What a queue's fairness is made of (at start-up).
pub struct FairParts {
    /// The queue it is for (named by the `tenant_refused` log line).
    pub queue: QueueName,
    /// Who shares the queue's room, and by what weights.
    pub tenants: Tenants,
    /// How the shares and the levels apply, from the variables.
    pub policy: FairPolicy,
    /// With tenants that have quotas: their books (docs/fairness.md, "Quotas").
    pub quotas: Option<QueueQuotas>,
    /// In a fleet: where the book's counts are exchanged (docs/fairness.md, "In a fleet").
    pub exchange: Option<Place>,
}

/// One queue's fairness: its share book, how it applies, what each tenant was answered,
/// and its tenants' quotas.
pub struct QueueFairness {
    queue: QueueName,
    book: Arc<Mutex<ShareBook>>,
    /// The variables' policy with the queue's runtime overrides on top.
    policy: FairCell,
    /// Counted once per decision, by whoever decided, after its judge.
    tally: Tally,
    quotas: Option<QueueQuotas>,
    /// In a fleet: units the judge admitted that the seat has not answered yet. The view
    /// the judge weighs a send by cannot show them, so it adds them: else concurrent sends
    /// judged by one view would each take the room another tenant is owed.
    unanswered: AtomicU64,
}

/// One tenant of a queue as health and metrics show it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantView {
    pub tenant: Tenant,
    /// Its part of the room this round offers (0–1), as the share rule computes it now.
    pub share: f64,
    pub counts: TenantCounts,
}

impl QueueFairness {
    /// Built whole; in a fleet its book's counts are exchanged from now on (a task of its
    /// own, needing a tokio runtime). With one tenant nobody is owed anything, and with
    /// shares off nobody's counts change a decision (the criticality cut weighs the
    /// estimate alone), so nothing is exchanged.
    pub fn new(parts: FairParts) -> Self {
        let FairParts {
            queue,
            tenants,
            policy,
            quotas,
            exchange,
        } = parts;
        let book = Arc::new(Mutex::new(ShareBook::new(&tenants.weights())));
        if let Some(place) = exchange {
            if tenants.len() >= 2 && policy.mode != ShareMode::Off {
                tokio::spawn(exchange::run(
                    Arc::downgrade(&book),
                    Names::of(&tenants),
                    place,
                ));
            }
        }
        Self {
            queue,
            book,
            policy: FairCell::new(policy),
            tally: Tally::new(&tenants),
            quotas,
            unanswered: AtomicU64::new(0),
        }
    }

    /// Put the queue's runtime overrides of the fair policy in force (an empty one
    /// restores the variables').
    pub fn apply(&self, overrides: &FairOverride) {
        self.policy.apply(overrides);
    }

    /// In a fleet, `tenant`'s rate quota leased up to `units` when it is short, before
    /// the send is judged (the judge never waits): at once for a tenant without one.
    pub async fn lease_rate(&self, tenant: TenantIndex, units: u64) {
        if let Some(quotas) = &self.quotas {
            quotas.rates.lease(tenant, units).await;
        }
    }

    /// The rate quotas' failed lease calls, in a fleet (the book is the gateway's: every
    /// queue answers the same).
    pub fn rate_lease_failures(&self) -> Option<u64> {
        self.quotas.as_ref()?.rates.lease_failures()
    }

    /// The fair policy in force.
    pub fn policy(&self) -> FairPolicy {
        self.policy.load()
    }

    /// The fair policy the variables give.
    pub fn base(&self) -> FairPolicy {
        *self.policy.base()
    }

    /// Every tenant answered at least once, as of now.
    pub fn counts(&self) -> Vec<TenantCounts> {
        self.tally.counts()
    }

    /// Each tenant answered at least once: its counts, its rates and its part of the room
    /// `snapshot` leaves now under `ceiling`.
    pub fn tenants(&self, snapshot: &GateSnapshot, ceiling: &CapacityPolicy) -> Vec<TenantView> {
        let counts = self.counts();
        if counts.is_empty() {
            return Vec::new();
        }
        // Unknown backlog: the room is taken as the whole ceiling (nothing to judge by).
        let room = snapshot
            .limit
            .saturating_sub(snapshot.backlog.unwrap_or_default());
        let parts = self
            .book
            .lock()
            .shares_now(room, tokio::time::Instant::now(), idle(ceiling));
        counts
            .into_iter()
            .filter_map(|counts| {
                let tenant = self.tally.tenants().get(counts.tenant)?.clone();
                let share = parts.get(usize::from(counts.tenant.0)).copied()?;
                Some(TenantView {
                    tenant,
                    share,
                    counts,
                })
            })
            .collect()
    }
}

/// How long the share book may go unasked before it forgets its counts: the round and the
/// next (docs/fairness.md), and the longest a send may take between asking and being
/// counted (a depth read's deadline).
fn idle(ceiling: &CapacityPolicy) -> Duration {
    ceiling
        .share_round_span()
        .saturating_mul(2)
        .saturating_add(ceiling.read_timeout)
}
