//! A queue's share book in a fleet (docs/fairness.md, "In a fleet"): every
//! [`EXCHANGE_EVERY`], while the book has counts to tell, its own round's counts go to the
//! tenants' exchange and the other replicas' sums come back into it.
//!
//! Off the request path: a send never waits for the exchange. A failed exchange is not
//! retried; what was heard before ages out with its round (B4), and the book then decides
//! on its own counts. It knows nothing of the ceiling's ledger (the seat's).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::share::{Counts, RoundView, ShareBook};
use super::tenants::{TenantIndex, Tenants};
use crate::coordination::shares::{self, RoundCounts, ShareExchange};

/// How often a replica tells its counts and hears the others': a tenant may take about
/// this much of each replica's admissions past its part before every book knows.
pub const EXCHANGE_EVERY: Duration = Duration::from_millis(100);

/// The time since the Unix epoch, which a fleet's rounds are cut by (B3).
pub fn wall_clock() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Names, indices and weights of the keys file's tenants, for the exchange's wire form (by name:
/// replicas of a rollout may list them in another order, or list others).
pub struct Names {
    names: Vec<String>,
    weights: Vec<u32>,
    index: HashMap<String, TenantIndex>,
}

impl Names {
    pub fn of(tenants: &Tenants) -> Self {
        Self {
            names: tenants.iter().map(|(_, t)| t.name.clone()).collect(),
            weights: tenants.weights(),
            index: tenants.iter().map(|(i, t)| (t.name.clone(), i)).collect(),
        }
    }

    /// A round of this book's, by name.
    fn write_wire(&self, view: RoundView) -> RoundCounts {
        RoundCounts {
            round: view.round,
            refused_now: view.refused_now,
            refused_before: view.refused_before,
            tenants: view
                .counts
                .into_iter()
                .filter_map(|(i, c)| {
                    let name = self.names.get(usize::from(i.0))?;
                    Some((
                        name.clone(),
                        shares::Counts {
                            asked_before: c.asked_before,
                            asked: c.asked,
                            admitted: c.admitted,
                        },
                    ))
                })
                .collect(),
        }
    }

    /// The others' sums, by this book's indices; tenants this keys file does not name are
    /// nobody's here.
    fn read_wire(&self, sums: RoundCounts) -> RoundView {
        RoundView {
            round: sums.round,
            refused_now: sums.refused_now,
            refused_before: sums.refused_before,
            counts: sums
                .tenants
                .into_iter()
                .filter_map(|(name, c)| {
                    let index = *self.index.get(&name)?;
                    Some((
                        index,
                        Counts {
                            asked_before: c.asked_before,
                            asked: c.asked,
                            admitted: c.admitted,
                        },
                    ))
                })
                .collect(),
        }
    }
}

/// Where one queue's book exchanges: the exchange, the queue's key there, this replica,
/// and the wall clock the fleet's rounds are cut by ([`wall_clock`]; a test's own on the
/// paused clock).
pub struct Place {
    pub exchange: Arc<dyn ShareExchange>,
    pub key: String,
    pub replica: String,
    pub wall: Arc<dyn Fn() -> Duration + Send + Sync>,
}

/// Exchange `book`'s counts every [`EXCHANGE_EVERY`] until the book is dropped.
pub async fn run(book: Weak<Mutex<ShareBook>>, names: Names, place: Place) {
    let mut tick = tokio::time::interval(EXCHANGE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(book) = book.upgrade() else { return };
        let (now, wall) = (Instant::now(), (place.wall)());
        let mine = {
            let mut book = book.lock();
            if book.off_the_wall_clock(now, wall) {
                // Stepped (NTP) or slept: lined up again, what it counted forgotten.
                *book = ShareBook::on_wall_clock(&names.weights, now, wall);
            }
            book.own_round(now)
        };
        let Some(mine) = mine else {
            continue;
        };
        let mine = names.write_wire(mine);
        // The book is not held across the call: sends go on deciding meanwhile.
        let answer = place
            .exchange
            .exchange(&place.key, &place.replica, &mine)
            .await;
        if let Ok(others) = answer {
            book.lock().hear(names.read_wire(others), Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::share::{ShareMode, Verdict};
    use crate::admission::tenants::Tenant;
    use crate::coordination::shares::MemoryShares;

    fn tenants(names: &[&str]) -> Tenants {
        Tenants::new(
            names
                .iter()
                .map(|n| Tenant {
                    name: (*n).into(),
                    weight: 1,
                    quota: Default::default(),
                })
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn the_wire_form_goes_by_name_so_replicas_may_list_tenants_in_another_order() {
        let here = Names::of(&tenants(&["a", "b"]));
        let there = Names::of(&tenants(&["b", "c", "a"]));
        let counts = |q| Counts {
            asked_before: 0,
            asked: q,
            admitted: q,
        };
        let view = RoundView {
            round: 9,
            refused_now: true,
            refused_before: false,
            counts: vec![(TenantIndex(0), counts(3)), (TenantIndex(1), counts(5))],
        };
        let heard = there.read_wire(here.write_wire(view));
        assert_eq!(heard.round, 9);
        assert!(heard.refused_now);
        let mut by_index = heard.counts;
        by_index.sort_by_key(|(i, _)| *i);
        // "b" is 0 there, "a" is 2.
        assert_eq!(
            by_index,
            vec![(TenantIndex(0), counts(5)), (TenantIndex(2), counts(3))]
        );
        // A tenant the other keys file does not name is nobody's.
        let only_c = there.write_wire(RoundView {
            round: 9,
            counts: vec![(TenantIndex(1), counts(1))],
            ..RoundView::default()
        });
        assert!(here.read_wire(only_c).counts.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn two_replicas_books_hear_each_others_tenants_and_a_spread_tenant_gets_one_part() {
        let exchange: Arc<dyn ShareExchange> = Arc::new(MemoryShares::default());
        let names = tenants(&["greedy", "modest"]);
        let wall = Duration::from_secs(1_000);
        let start = Instant::now();
        let books: Vec<Arc<Mutex<ShareBook>>> = (0..2)
            .map(|_| {
                Arc::new(Mutex::new(ShareBook::on_wall_clock(
                    &[1, 1],
                    Instant::now(),
                    wall,
                )))
            })
            .collect();
        for (i, book) in books.iter().enumerate() {
            tokio::spawn(run(
                Arc::downgrade(book),
                Names::of(&names),
                Place {
                    exchange: Arc::clone(&exchange),
                    key: "q".into(),
                    replica: format!("r{i}"),
                    wall: Arc::new(move || wall + start.elapsed()),
                },
            ));
        }
        let (greedy, modest) = (TenantIndex(0), TenantIndex(1));
        // Round 1000: the greedy tenant is refused at the ceiling on both replicas (100
        // each), the modest one on replica 1 only (20).
        for book in &books {
            book.lock().refused_at_ceiling(greedy, 100, Instant::now());
        }
        books[1]
            .lock()
            .refused_at_ceiling(modest, 20, Instant::now());
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Round 1001, 40 units of room fleet-wide: the modest tenant is owed its 20. The
        // greedy one, on replica 0 where the modest one never asked, still stops at 20.
        let mut greedy_admitted = 0;
        for _ in 0..40 {
            let v = books[0].lock().decide(
                greedy,
                1,
                40 - greedy_admitted,
                true,
                ShareMode::Enforce,
                Instant::now(),
            );
            if v != Verdict::Admit {
                break;
            }
            greedy_admitted += 1;
        }
        assert_eq!(
            greedy_admitted, 20,
            "replica 0 heard the modest tenant's asks"
        );
        // After an exchange, replica 1 knows the greedy tenant took its part on replica 0.
        tokio::time::sleep(EXCHANGE_EVERY * 2).await;
        let v = books[1]
            .lock()
            .decide(greedy, 1, 20, true, ShareMode::Enforce, Instant::now());
        assert!(matches!(v, Verdict::Refuse { .. }), "{v:?}");
        for _ in 0..20 {
            let v = books[1]
                .lock()
                .decide(modest, 1, 20, true, ShareMode::Enforce, Instant::now());
            assert_eq!(v, Verdict::Admit);
        }
    }
}
