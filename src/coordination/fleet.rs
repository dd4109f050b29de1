//! This replica's place in the fleet: the ledger it shares, and whether it is in the fleet
//! right now or running alone.
//!
//! Redis is a helper, never a single point of failure: the first ledger call that errs or
//! misses its deadline turns the replica to local mode at once (its sends go on under its
//! own gate, fail-closed unchanged), and a probe asks Redis (a PING, then each shared
//! queue's read script: a PING alone can answer while the scripts fail) every
//! [`REJOIN_EVERY`] until it answers, when the replica rejoins.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::ledger::{Ledger, LedgerError, QueueKeys};

/// How often a replica in local mode asks Redis whether it is back.
pub const REJOIN_EVERY: Duration = Duration::from_secs(1);

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
}

pub struct Fleet {
    ledger: Ledger,
    /// The queues whose scripts must answer before the replica rejoins (see
    /// [`Fleet::register`]).
    queues: Mutex<Vec<QueueKeys>>,
    /// Names this replica's blocks and read leases.
    replica: String,
    status: Mutex<Status>,
}

impl Fleet {
    /// Start in local mode and join the fleet as soon as Redis answers (the first ping
    /// goes out at once): start-up never waits on Redis. Needs a tokio runtime.
    pub fn start(ledger: Ledger) -> Arc<Self> {
        let fleet = Arc::new(Self {
            ledger,
            replica: uuid::Uuid::new_v4().simple().to_string(),
            status: Mutex::new(Status {
                joined: false,
                since: SystemTime::now(),
                local_since: tokio::time::Instant::now(),
                last_error: None,
                ever_joined: false,
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
    pub fn register(&self, keys: QueueKeys) {
        let mut queues = self.queues.lock();
        if !queues.contains(&keys) {
            queues.push(keys);
        }
    }

    /// Redis answers a PING and every registered queue's shared read (a script, which also
    /// prunes, so a write).
    async fn answers(&self) -> Result<(), LedgerError> {
        self.ledger.ping().await?;
        let queues = self.queues.lock().clone();
        // As an onlooker: a replica is heard from again (its share recomputed) by its seats'
        // own calls, after they settled what it stored alone (see `FleetSeat`).
        for keys in &queues {
            self.ledger.shared_read(keys).await?;
        }
        Ok(())
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn replica(&self) -> &str {
        &self.replica
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

    /// A ledger call failed: run alone until Redis answers again. Logged once per turn.
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
            "Redis did not answer: keeping the ceiling locally until it does"
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
                            "Redis does not answer: keeping the ceiling locally until it does"
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
