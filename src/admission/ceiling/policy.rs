//! What a queue's ceiling is and what it answers: the policy (with its runtime overrides),
//! the refusals, how a send ended, and what health shows. A leaf: the local gate, the fleet's
//! seat, the settings and the HTTP edge all speak these types, and they import nothing of
//! theirs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

use crate::admission::drain::{self, DrainRate};
use crate::admission::tenants::{Criticality, QuotaKind};
use crate::config::{CapacitySettings, Fraction};

/// The shortest share round: over less, a round's room would be a few units, and which
/// tenant's ask lands before a read would decide more than the weights (docs/fairness.md, B1).
pub const SHARE_ROUND: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityPolicy {
    pub limit: u64,
    pub fail_closed: bool,
    pub streak_threshold: u32,
    pub ttl: Duration,
    pub read_timeout: Duration,
    /// The longest `Retry-After` a `429` asks for.
    pub retry_after_max: Duration,
    /// Refusing at the ceiling, resume at or below this share of it (1 = at once under it).
    pub resume_below: Fraction,
}

/// The runtime overrides of one queue's policy (`PATCH /admin/settings`): each `Some`
/// replaces its variable's value; `None` keeps the variable's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyOverride {
    pub limit: Option<u64>,
    pub fail_closed: Option<bool>,
    pub streak_threshold: Option<u32>,
    pub ttl: Option<Duration>,
}

/// A gate's policy, swappable at runtime: the variables' policy (`base`) and the one in
/// force (`base` with the overrides on top). Sends read the policy in force without a
/// lock (one atomic load); a change takes effect for the next decision.
#[derive(Debug)]
pub struct PolicyCell {
    base: CapacityPolicy,
    current: ArcSwap<CapacityPolicy>,
}

impl PolicyCell {
    pub fn new(base: CapacityPolicy) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(base.clone()),
            base,
        })
    }

    /// The policy in force.
    pub fn load(&self) -> arc_swap::Guard<Arc<CapacityPolicy>> {
        self.current.load()
    }

    /// The policy in force, to keep.
    pub fn load_full(&self) -> Arc<CapacityPolicy> {
        self.current.load_full()
    }

    /// The policy the variables give.
    pub fn base(&self) -> &CapacityPolicy {
        &self.base
    }

    /// Put `overrides` in force on top of the variables' policy (an empty one restores it).
    pub fn apply(&self, overrides: &PolicyOverride) {
        let base = &self.base;
        self.current.store(Arc::new(CapacityPolicy {
            limit: overrides.limit.unwrap_or(base.limit).max(1),
            fail_closed: overrides.fail_closed.unwrap_or(base.fail_closed),
            streak_threshold: overrides
                .streak_threshold
                .unwrap_or(base.streak_threshold)
                .max(1),
            ttl: overrides.ttl.unwrap_or(base.ttl),
            ..base.clone()
        }));
    }
}

impl CapacityPolicy {
    pub fn from_settings(s: &CapacitySettings) -> Self {
        Self {
            limit: s.max_queue_depth.max(1),
            fail_closed: s.fail_closed,
            streak_threshold: s.fail_closed_streak.max(1),
            ttl: s.depth_ttl,
            read_timeout: s.admin_timeout,
            retry_after_max: s.retry_after_max,
            resume_below: s.resume_below,
        }
    }

    /// The share round (docs/fairness.md) the depth read of generation `read` belongs to:
    /// reads are taken [`Self::reads_per_round`] at a time, so a round spans whole reads
    /// (room opens only when a read shows the drain) and at least [`SHARE_ROUND`].
    pub fn share_round(&self, read: u64) -> u64 {
        read / self.reads_per_round()
    }

    /// How long a share round lasts when reads come as often as the TTL allows (at least
    /// [`SHARE_ROUND`]).
    pub fn share_round_span(&self) -> Duration {
        let per_round = u32::try_from(self.reads_per_round()).unwrap_or(u32::MAX);
        self.ttl.saturating_mul(per_round).max(SHARE_ROUND)
    }

    /// Depth reads per share round: enough reads, at least a TTL apart, to span
    /// [`SHARE_ROUND`] (a TTL of 0 counted as 1 ms).
    pub fn reads_per_round(&self) -> u64 {
        let ttl = self.ttl.as_millis().max(1);
        u64::try_from(SHARE_ROUND.as_millis().div_ceil(ttl))
            .unwrap_or(1)
            .max(1)
    }

    /// The backlog at or below which a queue refusing at the ceiling admits again.
    pub fn resume_at(&self) -> u64 {
        drain::resume_at(self.limit, self.resume_below)
    }

    /// A `429`'s answer for an `estimate` at or over the ceiling.
    pub fn queue_full(
        &self,
        estimate: u64,
        rate: Option<DrainRate>,
        until_next_read: Duration,
    ) -> Refusal {
        Refusal::QueueFull {
            backlog: estimate,
            limit: self.limit,
            retry_after: drain::retry_after(
                estimate,
                self.resume_at(),
                rate,
                until_next_read,
                self.retry_after_max,
            ),
            drain_rate: rate,
            room: 0,
        }
    }
}

/// A fixed policy, for a gate or seat that is never changed at runtime (tests, benches).
impl From<CapacityPolicy> for Arc<PolicyCell> {
    fn from(policy: CapacityPolicy) -> Self {
        PolicyCell::new(policy)
    }
}

/// Which dependency left the depth unknown: named in the answer and the log, so the alert
/// pages the owners of what failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// The broker's admin plane: its depth reads failed (the streak counts them).
    AdminPlane,
    /// The fleet's ledger (Redis) did not answer: the replica is cut off, or could not
    /// reserve, whatever the admin plane says.
    Ledger,
}

impl Unknown {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AdminPlane => "admin_plane",
            Self::Ledger => "ledger",
        }
    }
}

/// Why a send is refused before it reaches the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    QueueFull {
        backlog: u64,
        limit: u64,
        retry_after: Duration,
        /// The measured drain rate; `None` until drain has been observed.
        drain_rate: Option<DrainRate>,
        /// How many sends would be admitted now (a batch larger than this is refused
        /// whole); 0 when the queue is at or over its ceiling.
        room: u64,
    },
    CapacityUnknown {
        consecutive_failures: u32,
        /// Which dependency left it unknown.
        cause: Unknown,
    },
    /// The admin plane says the queue does not accept sends.
    QueueDisabled,
    /// The replica drained and is leaving (or left) the fleet: it admits nothing more, in
    /// the fleet or alone. Answered as a send after the drain is (`503 draining`).
    Stopped,
    /// The send's criticality is refused once it would take the queue past `cut`, its
    /// level's fraction of the ceiling (docs/fairness.md).
    Shed {
        criticality: Criticality,
        backlog: u64,
        cut: u64,
        retry_after: Duration,
        /// How many sends would be admitted at this level now (a batch is refused whole).
        room: u64,
    },
    /// The tenant is past its part of the room this round offers (docs/fairness.md);
    /// `share_milli`: its part, in thousandths.
    TenantShare {
        share_milli: u16,
        retry_after: Duration,
        /// How many sends the tenant could take now (a batch is refused whole).
        room: u64,
    },
    /// The tenant is past one of its quotas (docs/fairness.md, "Quotas"): its rate (the
    /// wait is when its next units conform) or its `max_share` of the ceiling.
    TenantQuota {
        quota: QuotaKind,
        retry_after: Duration,
        /// How many sends the quota lets through now (a batch is refused whole).
        room: u64,
    },
}

/// The ceiling's view of the room for a send it would admit, as its judge weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CeilingView {
    /// The share round ([`CapacityPolicy::share_round`]) of the read it is judged by.
    pub round: u64,
    /// The send's units (a batch's entries).
    pub units: u64,
    /// The room left before them (in a fleet, this replica's share of it).
    pub room: u64,
    /// What the queue holds before them.
    pub estimate: u64,
    /// What it holds with them, as the ceiling weighs them (a replica deciding alone weighs
    /// its own sends by the fleet's size).
    pub after: u64,
    /// The ceiling in force.
    pub limit: u64,
}

/// What else decides a send the ceiling admits (the tenants' shares and criticality,
/// docs/fairness.md), asked by a gate under its lock with the ceiling's view of the queue.
/// It may only refuse: what the ceiling refuses never reaches [`Judge::judge`].
pub trait Judge {
    /// The ceiling would admit `view.units` with `view.room` left before them: admitted
    /// unless this refuses.
    fn judge(&mut self, view: &CeilingView) -> Result<(), Refusal>;
    /// The ceiling refused `units` as the queue is full, in share round `round`.
    fn refused_full(&mut self, round: u64, units: u64);
}

impl Refusal {
    /// A refusal for room (a `queue_full`, or a criticality's `Shed`): how long it says to
    /// wait; any other: `None`.
    pub fn room_wait(&self) -> Option<Duration> {
        match self {
            Refusal::QueueFull { retry_after, .. } | Refusal::Shed { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// A refusal for room told to wait `wait` instead; any other as it is.
    pub fn told(mut self, wait: Duration) -> Self {
        if let Refusal::QueueFull { retry_after, .. } | Refusal::Shed { retry_after, .. } =
            &mut self
        {
            *retry_after = wait;
        }
        self
    }

    /// A `queue_full` that names the `room` there was (a batch refused whole); any other
    /// refusal as it is.
    pub fn with_room(self, room: u64) -> Self {
        match self {
            Refusal::QueueFull {
                backlog,
                limit,
                retry_after,
                drain_rate,
                ..
            } => Refusal::QueueFull {
                backlog,
                limit,
                retry_after,
                drain_rate,
                room,
            },
            other => other,
        }
    }
}

/// How an admitted send ended, as far as the queue's backlog is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BacklogEffect {
    /// A new message is in the queue.
    Stored,
    /// Definitely nothing new in the queue (refused, or a detected duplicate).
    NotStored,
    /// It may be in the queue (timeout, cancelled): counted as stored, to stay under the ceiling.
    Unknown,
}

/// What `/health/detailed` and `/metrics` show of one queue's gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSnapshot {
    /// The estimate the ceiling decides by: the last read plus the sends counted since.
    pub backlog: Option<u64>,
    /// The last good depth read itself (in a fleet, the fleet's read in force).
    pub depth_read: Option<DepthRead>,
    pub limit: u64,
    pub consecutive_failures: u32,
    pub fail_closed: bool,
    pub last_read_ok_at: Option<SystemTime>,
    pub reads_ok: u64,
    pub reads_failed: u64,
    pub drain_rate: Option<DrainRate>,
    /// While refusing at the ceiling: the backlog at or below which sends are admitted again.
    pub refusing_until_backlog: Option<u64>,
}

/// A depth read as the admin plane answered it, and how long ago.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthRead {
    pub backlog: u64,
    pub age: Duration,
}
