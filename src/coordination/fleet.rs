//! This replica's place in the fleet: the ledger it shares, and whether it is in the fleet
//! right now or running alone.
//!
//! Redis is a helper, never a single point of failure: the first ledger call that errs or
//! misses its deadline turns the replica to local mode at once (its sends go on under its
//! own gate, fail-closed unchanged), and a probe pings Redis every
//! [`REJOIN_EVERY`] until it answers, when the replica rejoins.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::ledger::{Ledger, LedgerError};

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
}

pub struct Fleet {
    ledger: Ledger,
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
            }),
        });
        tokio::spawn(Arc::clone(&fleet).rejoin_when_redis_answers());
        fleet
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

    /// Ping until Redis answers, then rejoin. One such task runs per turn to local mode.
    async fn rejoin_when_redis_answers(self: Arc<Self>) {
        let mut said = self.status.lock().last_error.is_some();
        loop {
            match self.ledger.ping().await {
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
        {
            let mut status = self.status.lock();
            status.joined = true;
            status.since = SystemTime::now();
            // It said why the replica was local; in the fleet again, there is nothing to
            // say (the `coordination_local` event keeps the history).
            status.last_error = None;
        }
        tracing::info!(
            event = "coordination_joined",
            "Redis answers again: sharing the ceiling with the fleet"
        );
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
