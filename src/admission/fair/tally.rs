//! What each tenant of a queue was answered (contract section 6): units admitted, refused
//! by reason, and — in shadow mode — the refusals the shares and criticality would have
//! made. Counted once per decision, after the ceiling and its judge, by whoever decided
//! (the local gate, or the fleet's seat): as totals for `/metrics`, and over the last
//! [`WINDOW_S`] seconds in 1-second buckets for the rates on `/health/detailed`. A refusal
//! that is the tenant's own (criticality, its share) is also logged as `tenant_refused`,
//! at most once per depth read per tenant: the first after each read says how many units
//! were refused since the last line.
//!
//! Rows are fixed at start-up, one per tenant of the keys file (at most
//! [`MAX_TENANTS`](crate::admission::tenants::MAX_TENANTS)): memory, series and health rows are bounded
//! by it whatever clients send. Knows nothing of HTTP or of how the room is measured.

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::admission::ceiling::policy::Refusal;
use crate::admission::tenants::{TenantIndex, Tenants};
use crate::domain::QueueName;

/// The rates' window: the last this many whole seconds, the current one included.
pub const WINDOW_S: u64 = 10;
const BUCKETS: usize = WINDOW_S as usize;

/// Why a tenant's units were refused (or would have been, in shadow mode). New reasons
/// (a tenant's quota) are a variant, a word and a place in [`Reason::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// At the ceiling: the queue's refusal, everyone's alike.
    QueueFull,
    /// Past the cut of the send's criticality.
    Criticality,
    /// Past the tenant's part of a contended queue's room.
    TenantShare,
    /// Past one of the tenant's quotas (never shadowed: quotas refuse in every mode).
    TenantQuota,
}

/// How many reasons there are: the counters' width.
const REASONS: usize = Reason::ALL.len();

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::QueueFull,
        Reason::Criticality,
        Reason::TenantShare,
        Reason::TenantQuota,
    ];

    /// The word `/metrics`, `/health/detailed` and the log name it by (the 429's `reason`,
    /// and `queue_full` for the ceiling's own).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::QueueFull => "queue_full",
            Reason::Criticality => "criticality",
            Reason::TenantShare => "tenant_share",
            Reason::TenantQuota => "tenant_quota",
        }
    }

    /// The reasons shadow mode may count as would-be refusals: the judge's (the ceiling
    /// itself is never shadowed).
    pub fn shadowed() -> impl Iterator<Item = Reason> {
        Self::ALL
            .into_iter()
            .filter(|r| r.is_tenants_own() && *r != Reason::TenantQuota)
    }

    /// What a refusal counts under; `None` for refusals about no room at all (the depth
    /// unknown, the queue disabled, the replica stopped): those are no tenant's.
    pub fn of(refusal: &Refusal) -> Option<Reason> {
        match refusal {
            Refusal::QueueFull { .. } => Some(Reason::QueueFull),
            Refusal::Shed { .. } => Some(Reason::Criticality),
            Refusal::TenantShare { .. } => Some(Reason::TenantShare),
            Refusal::TenantQuota { .. } => Some(Reason::TenantQuota),
            Refusal::CapacityUnknown { .. } | Refusal::QueueDisabled | Refusal::Stopped => None,
        }
    }

    /// Refused for what the tenant sent (logged as `tenant_refused`), not for the queue
    /// being full, which refuses every tenant at once.
    fn is_tenants_own(self) -> bool {
        self != Reason::QueueFull
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How one decision counts for its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Admitted,
    /// Admitted, though the judge would have refused it for this reason (shadow mode).
    WouldRefuse(Reason),
    Refused(Reason),
}

impl Answer {
    /// The answer of a gate's decision (`result`), given what its judge would have refused
    /// in shadow mode (`would`); `None` when it counts for no tenant ([`Reason::of`]).
    pub fn of(result: &Result<(), Refusal>, would: Option<Reason>) -> Option<Answer> {
        match result {
            Ok(()) => Some(would.map_or(Answer::Admitted, Answer::WouldRefuse)),
            Err(refusal) => Reason::of(refusal).map(Answer::Refused),
        }
    }
}

/// Units counted by answer. A would-be refusal is admitted too: it counts in both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub admitted: u64,
    refused: [u64; REASONS],
    would_refuse: [u64; REASONS],
}

impl Counts {
    pub fn refused(&self, reason: Reason) -> u64 {
        self.refused[reason.index()]
    }

    pub fn would_refuse(&self, reason: Reason) -> u64 {
        self.would_refuse[reason.index()]
    }

    fn add(&mut self, answer: Answer, units: u64) {
        let slot = match answer {
            Answer::Admitted => &mut self.admitted,
            Answer::WouldRefuse(reason) => {
                self.admitted = self.admitted.saturating_add(units);
                &mut self.would_refuse[reason.index()]
            }
            Answer::Refused(reason) => &mut self.refused[reason.index()],
        };
        *slot = slot.saturating_add(units);
    }

    fn merge(&mut self, other: &Counts) {
        self.admitted = self.admitted.saturating_add(other.admitted);
        for i in 0..REASONS {
            self.refused[i] = self.refused[i].saturating_add(other.refused[i]);
            self.would_refuse[i] = self.would_refuse[i].saturating_add(other.would_refuse[i]);
        }
    }
}

/// Units a second over the window, by answer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub admitted: f64,
    refused: [f64; REASONS],
    would_refuse: [f64; REASONS],
}

impl Rates {
    pub fn refused(&self, reason: Reason) -> f64 {
        self.refused[reason.index()]
    }

    pub fn would_refuse(&self, reason: Reason) -> f64 {
        self.would_refuse[reason.index()]
    }

    /// Every reason's refusals together.
    pub fn refused_all(&self) -> f64 {
        self.refused.iter().sum()
    }

    fn of(window: &Counts) -> Self {
        // Units over the window's seconds, to a tenth (one unit in the window is 0.1/s).
        let per_s = |n: u64| (n as f64 / WINDOW_S as f64 * 10.0).round() / 10.0;
        Self {
            admitted: per_s(window.admitted),
            refused: window.refused.map(per_s),
            would_refuse: window.would_refuse.map(per_s),
        }
    }
}

/// One second's counts: which second (since the tally's epoch) and what it holds.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    second: u64,
    counts: Counts,
}

#[derive(Debug, Clone, Default)]
struct Row {
    total: Counts,
    /// Second `s` is kept in `buckets[s % BUCKETS]`; one stamped with an older second is
    /// stale (nothing was counted in its place since).
    buckets: [Bucket; BUCKETS],
    /// The read whose refusals were last logged, and the units refused (for the tenant's
    /// own reasons) not logged since.
    logged_read: Option<u64>,
    unlogged: u64,
}

/// A `tenant_refused` line owed: the first refusal of the tenant's own after a new read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToLog {
    pub tenant: TenantIndex,
    pub reason: Reason,
    /// Units refused for the tenant's own reasons since the last line, these included.
    pub refused_since_last_log: u64,
}

/// What one tenant was answered, for health and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantCounts {
    pub tenant: TenantIndex,
    pub total: Counts,
    pub per_s: Rates,
}

/// One queue's counts, pure: the caller holds it under a lock and brings the time.
#[derive(Debug)]
pub struct TallyBook {
    epoch: Instant,
    rows: Vec<Row>,
}

impl TallyBook {
    /// A row for each of `tenants` tenants, all zero.
    pub fn new(tenants: usize, now: Instant) -> Self {
        Self {
            epoch: now,
            rows: vec![Row::default(); tenants],
        }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_secs()
    }

    /// Count `units` of one decision for `tenant`, decided on the depth read `read` (any
    /// number that changes with each read): the line to log, when one is owed.
    pub fn record(
        &mut self,
        tenant: TenantIndex,
        units: u64,
        answer: Answer,
        read: impl FnOnce() -> u64,
        now: Instant,
    ) -> Option<ToLog> {
        let second = self.second(now);
        let row = self.rows.get_mut(usize::from(tenant.0))?;
        row.total.add(answer, units);
        let bucket = &mut row.buckets[(second % WINDOW_S) as usize];
        if bucket.second != second {
            *bucket = Bucket {
                second,
                counts: Counts::default(),
            };
        }
        bucket.counts.add(answer, units);
        let Answer::Refused(reason) = answer else {
            return None;
        };
        if !reason.is_tenants_own() {
            return None;
        }
        row.unlogged = row.unlogged.saturating_add(units);
        let read = read();
        if row.logged_read == Some(read) {
            return None;
        }
        row.logged_read = Some(read);
        Some(ToLog {
            tenant,
            reason,
            refused_since_last_log: std::mem::take(&mut row.unlogged),
        })
    }

    /// Every tenant that has been answered at least once (the others have nothing to show),
    /// with its totals and its rates over the window ending `now`.
    pub fn counts(&self, now: Instant) -> Vec<TenantCounts> {
        let second = self.second(now);
        let oldest = second.saturating_sub(WINDOW_S - 1);
        self.rows
            .iter()
            .enumerate()
            .filter(|(_, row)| row.total != Counts::default())
            .map(|(i, row)| {
                let mut window = Counts::default();
                for b in &row.buckets {
                    if (oldest..=second).contains(&b.second) {
                        window.merge(&b.counts);
                    }
                }
                TenantCounts {
                    tenant: TenantIndex(u16::try_from(i).unwrap_or(u16::MAX)),
                    total: row.total,
                    per_s: Rates::of(&window),
                }
            })
            .collect()
    }
}

/// A queue's tally as the gate keeps it: the book under its own lock, and the tenants'
/// names for the log line.
#[derive(Debug)]
pub struct Tally {
    book: Mutex<TallyBook>,
    tenants: Tenants,
}

impl Tally {
    pub fn new(tenants: &Tenants) -> Self {
        Self {
            book: Mutex::new(TallyBook::new(tenants.len(), Instant::now())),
            tenants: tenants.clone(),
        }
    }

    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// Count one decision of `queue`'s, once, after the ceiling and its judge answered
    /// `result` (`would`: what the judge would have refused in shadow mode). `read` names
    /// the depth read it was decided on; it is asked only for a refusal that may be logged.
    /// The `tenant_refused` line, when owed, is written after the lock is released.
    pub fn count(
        &self,
        queue: &QueueName,
        tenant: TenantIndex,
        units: u64,
        result: &Result<(), Refusal>,
        would: Option<Reason>,
        read: impl FnOnce() -> u64,
    ) {
        let Some(answer) = Answer::of(result, would) else {
            return;
        };
        let log = self
            .book
            .lock()
            .record(tenant, units, answer, read, Instant::now());
        if let Some(log) = log {
            let name = self.tenants.get(log.tenant).map_or("", |t| t.name.as_str());
            tracing::warn!(
                event = "tenant_refused",
                queue = %queue,
                tenant = name,
                reason = log.reason.as_str(),
                refused_since_last_log = log.refused_since_last_log,
                "a tenant's sends are refused (its criticality or its share)"
            );
        }
    }

    /// Every tenant answered at least once, as of now.
    pub fn counts(&self) -> Vec<TenantCounts> {
        self.book.lock().counts(Instant::now())
    }
}

#[cfg(test)]
mod tests;
