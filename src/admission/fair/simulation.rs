//! A gate under sustained overload, simulated on tokio's paused clock (docs/fairness.md,
//! "Tiers" and "Over rounds"): a queue whose consumers drain it at a steady rate behind
//! a local gate with its fairness, and open-loop producers at set rates of tenants and
//! criticalities whose refused sends are not sent again.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{Asker, FairParts, FairPolicy, QueueFairness};
use crate::admission::ceiling::{BacklogEffect, CapacityGate, CapacityPolicy, GateParts, Refusal};
use crate::admission::fair::share::ShareMode;
use crate::admission::tenants::{Criticality, Tenant, TenantIndex, Tenants};
use crate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use crate::config::Fraction;
use crate::domain::QueueName;

/// A queue its consumers drain at `per_s` (as whole messages, while it holds any); its
/// admin plane answers at once with what it holds.
struct DrainingQueue {
    per_s: f64,
    state: Mutex<Held>,
}

struct Held {
    stored: f64,
    at: Instant,
    most: f64,
}

impl DrainingQueue {
    fn new(per_s: f64) -> Self {
        Self {
            per_s,
            state: Mutex::new(Held {
                stored: 0.0,
                at: Instant::now(),
                most: 0.0,
            }),
        }
    }

    /// What it holds now, the consumers having drained it since last asked.
    fn drained(&self) -> parking_lot::MutexGuard<'_, Held> {
        let mut held = self.state.lock();
        let now = Instant::now();
        let gone = self.per_s * (now - held.at).as_secs_f64();
        held.stored = (held.stored - gone).max(0.0);
        held.at = now;
        held
    }

    fn store(&self) {
        let mut held = self.drained();
        held.stored += 1.0;
        held.most = held.most.max(held.stored);
    }
}

#[async_trait]
impl Backend for DrainingQueue {
    fn kind(&self) -> &'static str {
        "draining"
    }
    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        unreachable!("the simulation stores what the gate admits itself")
    }
    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        Ok(Backlog::of(self.drained().stored.ceil() as u64))
    }
}

/// A small deterministic generator (xorshift64*): the same arrivals on every run.
struct Dice(u64);

impl Dice {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Arrivals of a Poisson process of `mean` in one step.
    fn poisson(&mut self, mean: f64) -> u64 {
        let (limit, mut product, mut k) = ((-mean).exp(), self.unit(), 0);
        while product > limit {
            product *= self.unit();
            k += 1;
        }
        k
    }
}

/// Producers of one tenant at one criticality, at `per_s` on average (open loop), or
/// `retrying` producers that each send again at once when admitted and after the answer's
/// `Retry-After` when refused (closed loop, as the project's client does).
#[derive(Clone, Copy)]
struct Senders {
    asker: Asker,
    per_s: f64,
    retrying: usize,
}

fn senders(tenant: u16, criticality: Criticality, per_s: f64) -> Senders {
    Senders {
        asker: Asker {
            tenant: TenantIndex(tenant),
            criticality,
        },
        per_s,
        retrying: 0,
    }
}

/// `n` producers of `tenant` that honour `Retry-After`.
fn retrying(tenant: u16, n: usize) -> Senders {
    Senders {
        retrying: n,
        ..senders(tenant, Criticality::Default, 0.0)
    }
}

/// Per producer group: sent and admitted, in all and from [`STEADY_FROM`] on; and the most
/// the queue held.
struct Outcome {
    sent: Vec<u64>,
    admitted: Vec<u64>,
    steady_sent: Vec<u64>,
    steady_admitted: Vec<u64>,
    most: f64,
}

/// The rounds of a spike's start are not sustained overload: the book has not yet seen a
/// round of everyone's asks.
const STEADY_FROM: Duration = Duration::from_secs(2);

impl Outcome {
    fn admitted_of_sent(&self, group: usize) -> f64 {
        self.admitted[group] as f64 / self.sent[group].max(1) as f64
    }

    fn steady_admitted_of_sent(&self, group: usize) -> f64 {
        self.steady_admitted[group] as f64 / self.steady_sent[group].max(1) as f64
    }

    /// Group `a`'s steady admissions to `b`'s.
    fn steady_ratio(&self, a: usize, b: usize) -> f64 {
        self.steady_admitted[a] as f64 / self.steady_admitted[b].max(1) as f64
    }
}

fn tenants(weights: &[u32]) -> Tenants {
    Tenants::new(
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| Tenant {
                name: format!("t{i}"),
                weight,
                quota: Default::default(),
            })
            .collect(),
    )
    .expect("one to a thousand tenants")
}

/// The variables' defaults.
fn defaults() -> FairPolicy {
    FairPolicy {
        mode: ShareMode::Enforce,
        share_at: Fraction::new(0.9).expect("a fraction"),
        shed_at_sheddable: Fraction::new(0.8).expect("a fraction"),
        shed_at_default: Fraction::ONE,
    }
}

const STEP: Duration = Duration::from_millis(10);

/// A gate of ceiling `limit`, depth read every second (the default TTL), over `queue`,
/// with `tenants`' fairness at the variables' defaults.
fn overloaded_gate(queue: &Arc<DrainingQueue>, tenants: Tenants, limit: u64) -> Arc<CapacityGate> {
    let name = QueueName::parse("requests").expect("a queue name");
    let policy = CapacityPolicy {
        limit,
        fail_closed: false,
        streak_threshold: 3,
        ttl: Duration::from_secs(1),
        read_timeout: Duration::from_secs(2),
        retry_after_max: Duration::from_secs(300),
        resume_below: Fraction::ONE,
    };
    let fairness = QueueFairness::new(FairParts {
        queue: name.clone(),
        tenants,
        policy: defaults(),
        quotas: None,
        exchange: None,
    });
    let backend: Arc<dyn Backend> = queue.clone();
    CapacityGate::new(GateParts {
        fairness: Some(fairness),
        ..GateParts::alone(name, policy, backend)
    })
}

/// One step's sends, in a random order (no group first in every step): each open-loop
/// group's arrivals (its index), and each retrying producer that is due (`groups.len()` +
/// its index).
fn arrivals(dice: &mut Dice, groups: &[Senders], producers: &[(usize, Instant)]) -> Vec<usize> {
    let now = Instant::now();
    let mut arrivals: Vec<usize> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let n = dice.poisson(group.per_s * STEP.as_secs_f64());
        arrivals.extend(std::iter::repeat_n(g, n as usize));
    }
    let due = (0..producers.len()).filter(|&p| producers[p].1 <= now);
    arrivals.extend(due.map(|p| groups.len() + p));
    for i in (1..arrivals.len()).rev() {
        let j = (dice.unit() * (i + 1) as f64) as usize;
        arrivals.swap(i, j.min(i));
    }
    arrivals
}

/// `groups` send for `seconds` to a queue of ceiling `limit` drained at `drain_per_s`.
async fn simulate(
    tenants: Tenants,
    limit: u64,
    drain_per_s: f64,
    groups: &[Senders],
    seconds: u64,
) -> Outcome {
    let queue = Arc::new(DrainingQueue::new(drain_per_s));
    let gate = overloaded_gate(&queue, tenants, limit);
    let mut dice = Dice(0x5eed_0039);
    let zeros = vec![0; groups.len()];
    let mut outcome = Outcome {
        sent: zeros.clone(),
        admitted: zeros.clone(),
        steady_sent: zeros.clone(),
        steady_admitted: zeros,
        most: 0.0,
    };
    let steady_at = Instant::now() + STEADY_FROM;
    // Each retrying producer: its group, and when it sends next.
    let mut producers: Vec<(usize, Instant)> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, group)| std::iter::repeat_n((g, Instant::now()), group.retrying))
        .collect();
    for _ in 0..seconds * 100 {
        let (now, steady) = (Instant::now(), Instant::now() >= steady_at);
        for arrival in arrivals(&mut dice, groups, &producers) {
            let producer = arrival.checked_sub(groups.len());
            let g = producer.map_or(arrival, |p| producers[p].0);
            outcome.sent[g] += 1;
            outcome.steady_sent[g] += u64::from(steady);
            let answer = gate.admit_units_for(groups[g].asker, 1).await;
            if let Some(p) = producer {
                producers[p].1 = now + answer.as_ref().err().map_or(STEP, retry_after);
            }
            if let Ok(sent) = answer {
                queue.store();
                sent.finish(BacklogEffect::Stored);
                outcome.admitted[g] += 1;
                outcome.steady_admitted[g] += u64::from(steady);
            }
        }
        tokio::time::advance(STEP).await;
    }
    outcome.most = queue.drained().most;
    outcome
}

/// The `Retry-After` a refusal answers with (a second for those that carry none).
fn retry_after(refusal: &Refusal) -> Duration {
    match refusal {
        Refusal::QueueFull { retry_after, .. }
        | Refusal::Shed { retry_after, .. }
        | Refusal::TenantShare { retry_after, .. }
        | Refusal::TenantQuota { retry_after, .. } => *retry_after,
        _ => Duration::from_secs(1),
    }
}

/// Jain's fairness index of admissions against weights: 1 when each got in proportion.
fn jain(admitted: &[u64], weights: &[u32]) -> f64 {
    let x: Vec<f64> = admitted
        .iter()
        .zip(weights)
        .map(|(&a, &w)| a as f64 / f64::from(w))
        .collect();
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    sum * sum / (x.len() as f64 * squares)
}

/// The priority mix: 5× a drain of 100/s at a ceiling of 200, 60 % sheddable,
/// 30 % default, 10 % critical, one tenant. Critical demand (50/s) is below the drain: from
/// the spike's second round on all of it is admitted, and sheddable is refused before
/// default.
#[tokio::test(start_paused = true)]
async fn at_five_times_the_drain_critical_sends_find_room_and_lower_levels_are_refused_first() {
    use Criticality::{Critical, Default as D, Sheddable};
    let groups = [
        senders(0, Sheddable, 300.0),
        senders(0, D, 150.0),
        senders(0, Critical, 50.0),
    ];
    let outcome = simulate(Tenants::open(), 200, 100.0, &groups, 60).await;
    let shown = format!("{:?} of {:?}", outcome.admitted, outcome.sent);
    let critical = outcome.steady_admitted_of_sent(2);
    assert!(
        critical >= 0.994,
        "critical admitted {critical:.4}: {shown}"
    );
    // The spike's first round included.
    let all = outcome.admitted_of_sent(2);
    assert!(all >= 0.99, "critical admitted {all:.4} in all: {shown}");
    assert!(
        outcome.steady_admitted_of_sent(0) < outcome.steady_admitted_of_sent(1),
        "sheddable before default: {shown}"
    );
    assert!(
        outcome.most <= 200.0,
        "backlog {} over the ceiling",
        outcome.most
    );
    // The queue is kept busy: what was admitted is about what was drained (60 s × 100).
    let admitted: u64 = outcome.admitted.iter().sum();
    assert!(admitted >= 5_800, "admitted {admitted} of a drain of 6000");
}

/// Two tenants weighted 3:1, both sending far more than a ceiling of 20 drained at 8/s
/// can take (producers that honour `Retry-After`), or at 2/s (open loop): a round's room is
/// a few units, or two, and over a minute admissions follow the weights.
#[tokio::test(start_paused = true)]
async fn at_a_small_ceiling_admissions_follow_the_weights_over_rounds() {
    use Criticality::Default as D;
    let weights = [3, 1];
    let runs = [
        (8.0, [retrying(0, 8), retrying(1, 8)]),
        (2.0, [senders(0, D, 40.0), senders(1, D, 40.0)]),
    ];
    for (drain, groups) in runs {
        let outcome = simulate(tenants(&weights), 20, drain, &groups, 60).await;
        let ratio = outcome.steady_ratio(0, 1);
        let shown = format!("{:?} of {:?} at {drain}/s", outcome.admitted, outcome.sent);
        assert!((2.85..=3.15).contains(&ratio), "{ratio:.2} to 1: {shown}");
        let index = jain(&outcome.steady_admitted, &weights);
        assert!(index >= 0.95, "Jain's index {index:.3}: {shown}");
        assert!(
            outcome.most <= 20.0,
            "backlog {} over the ceiling",
            outcome.most
        );
    }
}

/// A third tenant sends critical sends (4/s, below a drain of 8/s, and above its weighted
/// part of the room, 8/5) beside two weighted 3:1 at default, the lighter one sending three
/// times as often: the critical sends are all admitted, and the two others share what is
/// left 3:1.
#[tokio::test(start_paused = true)]
async fn a_critical_tenant_is_not_held_to_its_share_and_the_others_keep_their_weights() {
    use Criticality::{Critical, Default as D};
    let weights = [3, 1, 1];
    let groups = [
        senders(0, D, 20.0),
        senders(1, D, 60.0),
        senders(2, Critical, 4.0),
    ];
    let outcome = simulate(tenants(&weights), 20, 8.0, &groups, 60).await;
    let shown = format!("{:?} of {:?}", outcome.admitted, outcome.sent);
    let critical = outcome.steady_admitted_of_sent(2);
    assert!(
        critical >= 0.994,
        "critical admitted {critical:.4}: {shown}"
    );
    let ratio = outcome.steady_ratio(0, 1);
    assert!((2.85..=3.15).contains(&ratio), "{ratio:.2} to 1: {shown}");
    let index = jain(&outcome.steady_admitted[..2], &weights[..2]);
    assert!(index >= 0.95, "Jain's index {index:.3}: {shown}");
}
