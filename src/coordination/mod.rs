//! How replicas share one ceiling: `local` (this process alone) or `redis` (every replica
//! through the ledger, [`port`], run on Redis by the [`redis_client`], with [`fleet`]
//! tracking whether this replica is in the fleet right now). A third state, unusable, is a
//! fleet cut off for good and said so on health: with `entra` auth, no credential chain
//! could be built.

pub mod entra;
pub mod fleet;
pub mod memory;
pub mod port;
pub mod rates;
pub mod redis_client;
mod redis_port;
mod redis_rates;
mod redis_shares;
pub mod shares;

use std::sync::Arc;
use std::time::SystemTime;

use crate::config::CoordinationSettings;
use fleet::{CoordinationHealth, Fleet};
use redis_client::RedisClient;

/// The coordination this process runs with.
pub enum Coordination {
    /// `SENDGATE_COORDINATION=local`.
    Local { since: SystemTime },
    /// `redis`: in the fleet while Redis answers, cut off while it does not. `redis` is the
    /// client the fleet's ledger runs on, for the tenants' exchange and the runtime
    /// settings' store.
    Fleet {
        fleet: Arc<Fleet>,
        redis: RedisClient,
    },
    /// `redis`, but the settings cannot be used here (with `SENDGATE_REDIS_AUTH=entra`, no
    /// Entra ID credential chain could be built): local for good, said on every health read
    /// rather than refusing to start a replica of a fleet.
    Unusable { since: SystemTime, error: String },
}

impl Coordination {
    /// Needs a tokio runtime for `redis` (the fleet's probe).
    pub fn start(settings: &CoordinationSettings) -> Self {
        let since = SystemTime::now();
        match settings {
            CoordinationSettings::Local => Self::Local { since },
            CoordinationSettings::Redis(settings) => match RedisClient::lazy(settings) {
                Ok(redis) => Self::Fleet {
                    fleet: Fleet::start(Arc::new(redis.clone()), settings.max_replicas),
                    redis,
                },
                Err(e) => {
                    tracing::warn!(
                        event = "coordination_local",
                        error = %e,
                        "cannot use Redis: keeping the ceiling locally"
                    );
                    Self::Unusable {
                        since,
                        error: e.to_string(),
                    }
                }
            },
        }
    }

    pub fn health(&self) -> CoordinationHealth {
        match self {
            Self::Local { since } => CoordinationHealth {
                mode: "local",
                ok: true,
                since: *since,
                last_error: None,
            },
            Self::Fleet { fleet, .. } => fleet.health(),
            Self::Unusable { since, error } => CoordinationHealth {
                mode: "local",
                ok: false,
                since: *since,
                last_error: Some(error.clone()),
            },
        }
    }
}
