//! The dispatcher built whole at start-up, from the settings, the backends, the tenants and
//! the coordination: a lane per backend, a gate per queue of each, and each gate with its
//! fairness (the tenants' shares and quotas) and, in a fleet, its seat. Where a gate's
//! seat, book or quotas come from is this file.

use std::sync::Arc;

use tokio::time::Instant;

use super::breaker::BreakerPolicy;
use super::ceiling::{CapacityGate, CapacityPolicy, FleetSeat, GateParts, PolicyCell};
use super::fair::fleet_rate::FleetRates;
use super::fair::quota::{QueueQuotas, RateBook};
use super::fair::share::ShareMode;
use super::fair::{FairParts, FairPolicy, Place, QueueFairness};
use super::inflight::InFlight;
use super::lane::{BackendRole, Lane};
use super::tenants::{Quota, Tenants};
use super::Dispatcher;
use crate::backend::Backend;
use crate::config::{FairMode, FairSettings, Settings};
use crate::coordination::fleet::Fleet;
use crate::coordination::redis_client::RedisClient;
use crate::coordination::shares::ShareExchange;
use crate::coordination::Coordination;
use crate::domain::QueueName;

/// What start-up gets: the dispatcher, and the tenants' rate buckets the HTTP edge's
/// `RateLimit` headers read.
pub struct Assembled {
    pub dispatcher: Dispatcher,
    /// One rate bucket per tenant for the whole gateway (every queue, either backend); in a
    /// fleet, what it leased of the fleet's.
    pub rates: Arc<RateBook>,
}

/// Build the dispatcher over the `primary` backend and the `fallback` one, if any.
pub fn assemble(
    settings: &Settings,
    primary: Arc<dyn Backend>,
    fallback: Option<Arc<dyn Backend>>,
    tenants: &Tenants,
    coordination: &Coordination,
) -> Assembled {
    let quotas = tenants.quotas();
    let rates = Arc::new(rate_book(tenants, coordination));
    let plan = Plan {
        settings,
        tenants,
        // Tenants share each queue's room, and criticality is shed, by the keys file's
        // tenants (open mode: one tenant, every send at the default level).
        fair: fair_policy(&settings.fair),
        // A held book per queue's gate, for max_share.
        quotas: tenants.have_quotas().then_some(quotas),
        rates: &rates,
        fleet: match coordination {
            Coordination::Fleet { fleet, redis } => Some(InFleet {
                fleet,
                redis,
                shares: Arc::new(redis.clone()),
            }),
            Coordination::Local { .. } | Coordination::Unusable { .. } => None,
        },
    };
    let primary_kind = settings.primary.kind();
    let primary = plan.lane(BackendRole::Primary, primary, |redis, queue| {
        Some(redis.queue_key(primary_kind, queue))
    });
    let fallback = fallback.map(|backend| {
        plan.lane(BackendRole::Fallback, backend, |redis, queue| {
            let fallback = settings.fallback.as_ref()?.kind();
            Some(redis.fallback_queue_key(primary_kind, fallback, queue))
        })
    });
    let dispatcher = Dispatcher::new(
        primary,
        fallback,
        settings.dispatch.force,
        InFlight::new(settings.max_in_flight),
        settings.send_timeout,
    );
    Assembled { dispatcher, rates }
}

/// What every gate is built from.
struct Plan<'a> {
    settings: &'a Settings,
    tenants: &'a Tenants,
    fair: FairPolicy,
    /// Each tenant's quotas, when any has one.
    quotas: Option<Vec<Quota>>,
    rates: &'a Arc<RateBook>,
    fleet: Option<InFleet<'a>>,
}

/// The fleet a replica's gates join: its Redis (the ceiling's ledger), and the tenants' exchange (the
/// same Redis).
struct InFleet<'a> {
    fleet: &'a Arc<Fleet>,
    redis: &'a RedisClient,
    shares: Arc<dyn ShareExchange>,
}

impl Plan<'_> {
    /// A lane over `backend`; in a fleet each of its queues' gates takes its seat under
    /// the key `key` names (none: the lane stays alone).
    fn lane(
        &self,
        role: BackendRole,
        backend: Arc<dyn Backend>,
        key: impl Fn(&RedisClient, &QueueName) -> Option<String>,
    ) -> Lane {
        let gates = self.settings.queues.iter().map(|queue| {
            let key = self.fleet.as_ref().and_then(|f| key(f.redis, queue));
            self.gate(queue, &backend, key)
        });
        let gates: Vec<_> = gates.collect();
        Lane::new(role, backend, gates, self.breaker())
    }

    /// One queue's gate, whole: its policy, its fairness and, with a fleet `key`, its seat
    /// (sharing the gate's policy) and its book's exchange.
    fn gate(
        &self,
        queue: &QueueName,
        backend: &Arc<dyn Backend>,
        key: Option<String>,
    ) -> Arc<CapacityGate> {
        let policy = PolicyCell::new(CapacityPolicy::from_settings(&self.settings.capacity));
        let in_fleet = self.fleet.as_ref().zip(key);
        let fairness = QueueFairness::new(FairParts {
            queue: queue.clone(),
            tenants: self.tenants.clone(),
            policy: self.fair,
            quotas: self
                .quotas
                .as_ref()
                .map(|quotas| QueueQuotas::new(quotas, Arc::clone(self.rates))),
            exchange: in_fleet.as_ref().map(|(f, key)| Place {
                exchange: Arc::clone(&f.shares),
                key: format!("{key}:tenants"),
                replica: f.fleet.replica().to_owned(),
            }),
        });
        let seat = in_fleet.map(|(f, key)| {
            FleetSeat::new(
                Arc::clone(f.fleet),
                key,
                queue.clone(),
                Arc::clone(&policy),
                Arc::clone(backend),
                self.settings.send_timeout,
            )
        });
        CapacityGate::new(GateParts {
            queue: queue.clone(),
            policy,
            backend: Arc::clone(backend),
            fairness: Some(fairness),
            seat,
        })
    }

    fn breaker(&self) -> BreakerPolicy {
        let d = &self.settings.dispatch;
        BreakerPolicy {
            window: d.breaker_window,
            min_failures: d.breaker_min_failures,
            failure_rate: d.breaker_failure_rate,
            open_for: d.breaker_open,
            // The streak rule and the unsent window are not settings: fixed by the
            // contract (section 1, step 7).
            ..BreakerPolicy::default()
        }
    }
}

/// The tenants' rate quotas: in a fleet, leased from the fleet's (the same Redis);
/// otherwise this process's own.
fn rate_book(tenants: &Tenants, coordination: &Coordination) -> RateBook {
    let now = Instant::now();
    match coordination {
        Coordination::Fleet { fleet, redis } => {
            let fleet = FleetRates {
                ledger: Arc::new(redis.clone()),
                fleet: Arc::clone(fleet),
            };
            RateBook::in_fleet(tenants, fleet, now)
        }
        Coordination::Local { .. } | Coordination::Unusable { .. } => {
            RateBook::new(&tenants.quotas(), now)
        }
    }
}

/// The settings' fair-share policy as admission takes it.
fn fair_policy(fair: &FairSettings) -> FairPolicy {
    FairPolicy {
        mode: match fair.mode {
            FairMode::Enforce => ShareMode::Enforce,
            FairMode::Shadow => ShareMode::Shadow,
            FairMode::Off => ShareMode::Off,
        },
        share_at: fair.share_at,
        shed_at_sheddable: fair.shed_at_sheddable,
        shed_at_default: fair.shed_at_default,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use async_trait::async_trait;

    use super::*;
    use crate::admission::breaker::{BreakerState, Outcome};
    use crate::backend::{Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
    use crate::config::vars;

    /// A broker that is never asked: the lanes are only built.
    struct Idle;

    #[async_trait]
    impl Backend for Idle {
        fn kind(&self) -> &'static str {
            "idle"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            Ok(SendReceipt { duplicate: false })
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            Ok(Backlog::of(0))
        }
    }

    fn assembled(overrides: &[(&'static vars::Var, &str)]) -> Assembled {
        let settings = Settings::from_overrides(overrides).expect("settings");
        assemble(
            &settings,
            Arc::new(Idle),
            Some(Arc::new(Idle)),
            &Tenants::open(),
            &Coordination::Local {
                since: SystemTime::now(),
            },
        )
    }

    /// Each lane's breaker takes the dispatch settings: one failure opens it when one is
    /// the least the variables ask for (the default asks for 10), and it stays open for
    /// the variable's span, not the default 15 s.
    #[tokio::test(start_paused = true)]
    async fn each_lanes_breaker_is_built_from_the_breaker_variables() {
        let Assembled { dispatcher, .. } = assembled(&[
            (&vars::BREAKER_MIN_FAILURES, "1"),
            (&vars::BREAKER_OPEN_S, "40"),
        ]);
        for lane in dispatcher.lanes() {
            let ticket = lane.breaker.try_acquire().expect("a closed breaker");
            ticket.record(Outcome::Failure);
            assert_eq!(lane.breaker.state(), BreakerState::Open, "{:?}", lane.role);
            tokio::time::advance(Duration::from_secs(20)).await;
            assert_eq!(lane.breaker.state(), BreakerState::Open, "{:?}", lane.role);
        }
    }

    /// The lanes exist for the backends given, a gate for every queue of the settings on
    /// each.
    #[tokio::test]
    async fn every_queue_has_a_gate_on_each_lane() {
        let Assembled { dispatcher, .. } = assembled(&[(&vars::QUEUES, "a,b")]);
        assert!(dispatcher.fallback().is_some());
        for lane in dispatcher.lanes() {
            let queues: Vec<_> = lane.gates().map(|g| g.queue().to_string()).collect();
            assert_eq!(queues.len(), 2, "{queues:?}");
        }
    }
}
