//! This replica's place in the fleet: the ledger it shares, and whether it is in the fleet
//! right now or running alone.
//!
//! [`FAILURES_TO_CUT_OFF`] ledger calls in a row that err or miss their deadline cut the
//! replica off (what it may still admit is the seat's rule: docs/fleet.md, step 6), and a probe asks
//! the ledger (each shared queue's state, through a script) every [`REJOIN_EVERY`] until it
//! answers, when the replica rejoins.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::port::{LedgerError, LedgerPort, QueueRef, Terms};

/// Calls that fail in a row before the replica is cut off: one slow answer on a loaded
/// host is not a partition (the call is made again; what the failed one may have reserved
/// comes back when its lease ends), while a cut-off replica fails open or closed by its
/// own rule (docs/fleet.md, step 6).
pub const FAILURES_TO_CUT_OFF: u32 = 2;

/// How often a replica cut off asks Redis whether it is back. A heartbeat, not more: a
/// Redis restart cuts every replica off at once, and the new epoch's grace counts on each
/// replica Redis answers again rejoining (and reporting its carry) within it. At 1 s, the
/// replicas probing out of step with the first one back rejoined too late for the grace.
pub const REJOIN_EVERY: Duration = HEARTBEAT;

/// A queue's state outlives its last write this long, so a deleted queue or deployment
/// leaves nothing behind for ever.
pub const IDLE: Duration = Duration::from_secs(24 * 60 * 60);

/// A replica counts in the fleet's size this long after its last call.
pub const MEMBER_FOR: Duration = Duration::from_secs(10);

/// A replica in the fleet calls each queue's ledger at least this often (its seat's
/// heartbeat when it made no other call), so a new epoch is learnt within the grace.
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// What `/health/detailed` and `/metrics` show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinationHealth {
    /// `redis` while this replica shares the fleet's ceiling, `local` while it runs alone.
    pub mode: &'static str,
    /// Redis answered the last call (false while fallen back).
    pub ok: bool,
    /// When the current mode began.
    pub since: SystemTime,
    /// Why the replica is local (the last failed Redis call); `None` while in the fleet.
    pub last_error: Option<String>,
}

#[derive(Debug)]
struct Status {
    joined: bool,
    since: SystemTime,
    /// When this replica last turned local (or started, local): a local gate's read made
    /// before it predates sends the fleet admitted meanwhile, so it is not reused.
    local_since: tokio::time::Instant,
    last_error: Option<String>,
    /// Joined once already: a later join is a return.
    ever_joined: bool,
    /// Calls failed since the last that answered.
    failed_in_a_row: u32,
}

pub struct Fleet {
    ledger: Arc<dyn LedgerPort>,
    /// The queues whose state must answer before the replica rejoins (see
    /// [`Fleet::register`]).
    queues: Mutex<Vec<(String, Terms)>>,
    /// Names this replica's blocks and read leases.
    replica: String,
    /// The most replicas the fleet runs at once (`SENDGATE_FLEET_MAX_REPLICAS`).
    max_replicas: u64,
    status: Mutex<Status>,
}

impl Fleet {
    /// Start in local mode and join the fleet as soon as Redis answers (the first ping
    /// goes out at once): start-up never waits on Redis. Needs a tokio runtime.
    pub fn start(ledger: Arc<dyn LedgerPort>, max_replicas: u64) -> Arc<Self> {
        let fleet = Arc::new(Self {
            ledger,
            replica: uuid::Uuid::new_v4().simple().to_string(),
            max_replicas: max_replicas.max(1),
            status: Mutex::new(Status {
                joined: false,
                since: SystemTime::now(),
                local_since: tokio::time::Instant::now(),
                last_error: None,
                ever_joined: false,
                failed_in_a_row: 0,
            }),
            queues: Mutex::new(Vec::new()),
        });
        tokio::spawn(Arc::clone(&fleet).rejoin_when_redis_answers());
        fleet
    }

    /// A queue shared through the fleet: rejoining waits until its scripts run. A PING alone
    /// can answer while every script fails (a key of the wrong type under the prefix, writes
    /// paused during a failover): rejoining on it would turn the replica local again on the
    /// next send, every second, and each turn costs a fresh admin-plane read.
    pub fn register(&self, key: String, terms: Terms) {
        let mut queues = self.queues.lock();
        if !queues.iter().any(|(k, _)| *k == key) {
            queues.push((key, terms));
        }
    }

    /// Every registered queue's state can be looked at (a script: a PING alone can answer
    /// while every script fails). As an onlooker: the seats speak for the replica, with its
    /// carry, in their own next calls.
    async fn answers(&self) -> Result<(), LedgerError> {
        // The seats register right after the fleet starts: with none yet there is nothing
        // to ask, and nothing to join for.
        while self.queues.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let queues = self.queues.lock().clone();
        for (key, terms) in &queues {
            self.ledger.look(QueueRef { key, terms: *terms }).await?;
        }
        Ok(())
    }

    pub fn ledger(&self) -> &Arc<dyn LedgerPort> {
        &self.ledger
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// What a replica deciding alone divides the room by, at least: the fleet it may be
    /// one of, whether or not it ever saw the others (docs/fleet.md, step 6).
    pub fn max_replicas(&self) -> u64 {
        self.max_replicas
    }

    pub fn joined(&self) -> bool {
        self.status.lock().joined
    }

    /// Redis answered this replica once at least: it has been in the fleet.
    pub fn ever_joined(&self) -> bool {
        self.status.lock().ever_joined
    }

    /// When this replica last turned local (or started). While in the fleet, other
    /// replicas fill the queue through Redis; a local read made before this instant does not
    /// see what they (and this replica) admitted since, so the local gate reads again.
    pub fn local_since(&self) -> tokio::time::Instant {
        self.status.lock().local_since
    }

    /// A ledger call answered: the failures in a row start again.
    pub fn answered(&self) {
        self.status.lock().failed_in_a_row = 0;
    }

    /// A ledger call failed: after [`FAILURES_TO_CUT_OFF`] in a row, the replica is cut
    /// off until Redis answers again (logged once per turn). Whether it is cut off now.
    pub fn failed(self: &Arc<Self>, error: &LedgerError) -> bool {
        {
            let mut status = self.status.lock();
            status.failed_in_a_row = status.failed_in_a_row.saturating_add(1);
            if status.joined && status.failed_in_a_row < FAILURES_TO_CUT_OFF {
                return false;
            }
        }
        self.fall_back(error);
        true
    }

    /// Cut off from the fleet now, until Redis answers again. Logged once per turn.
    pub fn fall_back(self: &Arc<Self>, error: &LedgerError) {
        {
            let mut status = self.status.lock();
            status.last_error = Some(error.to_string());
            if !status.joined {
                return;
            }
            status.joined = false;
            status.since = SystemTime::now();
            status.local_since = tokio::time::Instant::now();
        }
        tracing::warn!(
            event = "coordination_local",
            error = %error,
            "Redis did not answer: cut off from the fleet until it does (docs/fleet.md, step 6)"
        );
        tokio::spawn(Arc::clone(self).rejoin_when_redis_answers());
    }

    /// Ask until Redis answers (see [`Fleet::answers`]), then rejoin. One such task runs per turn to local mode.
    async fn rejoin_when_redis_answers(self: Arc<Self>) {
        let mut said = self.status.lock().last_error.is_some();
        loop {
            match self.answers().await {
                Ok(()) => break,
                Err(e) => {
                    if !said {
                        // Unreachable at start-up: say so once, like a fall back.
                        tracing::warn!(
                            event = "coordination_local",
                            error = %e,
                            "Redis does not answer: cut off from the fleet until it does (docs/fleet.md, step 6)"
                        );
                        said = true;
                    }
                    self.status.lock().last_error = Some(e.to_string());
                }
            }
            tokio::time::sleep(REJOIN_EVERY).await;
        }
        let returned = {
            let mut status = self.status.lock();
            status.joined = true;
            status.failed_in_a_row = 0;
            status.since = SystemTime::now();
            // It said why the replica was local; in the fleet again, there is nothing to
            // say (the `coordination_local` event keeps the history).
            status.last_error = None;
            std::mem::replace(&mut status.ever_joined, true)
        };
        if returned {
            tracing::info!(
                event = "coordination_joined",
                "Redis answers again: sharing the ceiling with the fleet"
            );
        } else {
            tracing::info!(
                event = "coordination_joined",
                "Redis answers: sharing the ceiling with the fleet"
            );
        }
    }

    pub fn health(&self) -> CoordinationHealth {
        let status = self.status.lock();
        CoordinationHealth {
            mode: if status.joined { "redis" } else { "local" },
            ok: status.joined,
            since: status.since,
            last_error: status.last_error.clone(),
        }
    }
}
