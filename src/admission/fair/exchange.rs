//! A queue's share book in a fleet (docs/fairness.md, "In a fleet"): every
//! [`EXCHANGE_EVERY`], while the book is asked and has counts to tell, its own round's
//! counts go to the tenants' exchange and the other replicas' sums come back into it.
//!
//! Off the request path: a send never waits for the exchange. A failed exchange is not
//! retried; what was heard before ages out with its round (B4), and the book then decides
//! on its own counts. It knows nothing of the ceiling's ledger (the seat's).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::share::{Cell, Counts, RoundView, ShareBook};
use crate::admission::tenants::{Criticality, TenantIndex, Tenants};
use crate::coordination::shares::{self, RoundCounts, ShareExchange};

/// How often a replica tells its counts and hears the others': a tenant may take about
/// this much of each replica's admissions past its part before every book knows.
pub const EXCHANGE_EVERY: Duration = Duration::from_millis(100);

/// How long a book nobody asks goes on telling its counts: its last round's counts matter
/// to the others for that round and the next (a round is a depth read's interval, a second
/// by default), after which a queue nobody sends to costs no Redis call.
pub const TELL_AFTER_LAST_ASK: Duration = Duration::from_secs(2);

/// Names and indices of the keys file's tenants, for the exchange's wire form (by name:
/// replicas of a rollout may list them in another order, or list others).
pub struct Names {
    names: Vec<String>,
    index: HashMap<String, TenantIndex>,
}

/// Between a tenant's name and the criticality of its counts on the wire: a control
/// character, which no tenant's name holds. A tenant's default counts go by its name alone,
/// as replicas from before the tiers tell all of a tenant's counts.
const LEVEL_MARK: char = '\u{1f}';

impl Names {
    pub fn of(tenants: &Tenants) -> Self {
        Self {
            names: tenants.iter().map(|(_, t)| t.name.clone()).collect(),
            index: tenants.iter().map(|(i, t)| (t.name.clone(), i)).collect(),
        }
    }

    /// A cell's wire name: its tenant's name, and its level unless default.
    fn wire_name(&self, cell: Cell) -> Option<String> {
        let name = self.names.get(usize::from(cell.tenant.0))?;
        Some(match cell.level {
            Criticality::Default => name.clone(),
            level => format!("{name}{LEVEL_MARK}{level}"),
        })
    }

    /// The cell a wire name counts; `None` for a tenant this keys file does not name.
    fn cell(&self, wire: &str) -> Option<Cell> {
        let (name, level) = match wire.split_once(LEVEL_MARK) {
            Some((name, level)) => (name, Criticality::parse(level)?),
            None => (wire, Criticality::Default),
        };
        let tenant = *self.index.get(name)?;
        Some(Cell { tenant, level })
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
                .filter_map(|(cell, c)| {
                    Some((
                        self.wire_name(cell)?,
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
                    Some((
                        self.cell(&name)?,
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

/// Where one queue's book exchanges: the exchange, the queue's key there, this replica.
pub struct Place {
    pub exchange: Arc<dyn ShareExchange>,
    pub key: String,
    pub replica: String,
}

/// Exchange `book`'s counts every [`EXCHANGE_EVERY`] until the book is dropped.
pub async fn run(book: Weak<Mutex<ShareBook>>, names: Names, place: Place) {
    let mut tick = tokio::time::interval(EXCHANGE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Units asked as of the last tick, and when they last moved.
    let mut asks = (0, Instant::now());
    loop {
        tick.tick().await;
        let Some(book) = book.upgrade() else { return };
        let now = Instant::now();
        let mine = {
            let book = book.lock();
            if book.asks() != asks.0 {
                asks = (book.asks(), now);
            }
            book.own_round()
        };
        let asked_lately = now.saturating_duration_since(asks.1) <= TELL_AFTER_LAST_ASK;
        let Some(mine) = mine.filter(|_| asked_lately) else {
            continue;
        };
        let mine = names.write_wire(mine);
        // The book is not held across the call: sends go on deciding meanwhile.
        let answer = place
            .exchange
            .exchange(&place.key, &place.replica, &mine)
            .await;
        if let Ok(others) = answer {
            book.lock().hear(names.read_wire(others));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::fair::share::{ShareMode, Verdict};
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
            counts: vec![
                (TenantIndex(0).into(), counts(3)),
                (TenantIndex(1).into(), counts(5)),
                (
                    Cell {
                        tenant: TenantIndex(1),
                        level: Criticality::Critical,
                    },
                    counts(2),
                ),
            ],
        };
        let heard = there.read_wire(here.write_wire(view));
        assert_eq!(heard.round, 9);
        assert!(heard.refused_now);
        let mut by_index = heard.counts;
        by_index.sort_by_key(|(i, _)| *i);
        // "b" is 0 there, "a" is 2; each level's counts stay that level's.
        assert_eq!(
            by_index,
            vec![
                (TenantIndex(0).into(), counts(5)),
                (
                    Cell {
                        tenant: TenantIndex(0),
                        level: Criticality::Critical,
                    },
                    counts(2),
                ),
                (TenantIndex(2).into(), counts(3)),
            ]
        );
        // A tenant the other keys file does not name is nobody's.
        let only_c = there.write_wire(RoundView {
            round: 9,
            counts: vec![(TenantIndex(1).into(), counts(1))],
            ..RoundView::default()
        });
        assert!(here.read_wire(only_c).counts.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn two_replicas_books_hear_each_others_tenants_and_a_spread_tenant_gets_one_part() {
        let exchange: Arc<dyn ShareExchange> = Arc::new(MemoryShares::default());
        let names = tenants(&["greedy", "modest"]);
        let books: Vec<Arc<Mutex<ShareBook>>> = (0..2)
            .map(|_| Arc::new(Mutex::new(ShareBook::new(&[1, 1]))))
            .collect();
        for (i, book) in books.iter().enumerate() {
            tokio::spawn(run(
                Arc::downgrade(book),
                Names::of(&names),
                Place {
                    exchange: Arc::clone(&exchange),
                    key: "q".into(),
                    replica: format!("r{i}"),
                },
            ));
        }
        let (greedy, modest) = (TenantIndex(0), TenantIndex(1));
        // By the fleet's read 1000: the greedy tenant is refused at the ceiling on both
        // replicas (100 each), the modest one on replica 1 only (20).
        for book in &books {
            book.lock().refused_at_ceiling(greedy, 100, 1000);
        }
        books[1].lock().refused_at_ceiling(modest, 20, 1000);
        tokio::time::sleep(EXCHANGE_EVERY * 2).await;
        // Read 1001 shows 40 units of room fleet-wide: the modest tenant is owed its 20.
        // The greedy one, on replica 0 where the modest one never asked, still stops at 20.
        let mut greedy_admitted = 0;
        for _ in 0..40 {
            let v = books[0].lock().decide(
                greedy,
                1,
                40 - greedy_admitted,
                true,
                ShareMode::Enforce,
                1001,
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
        // After an exchange, replica 1 (its seat still at read 1000, say) knows of read 1001
        // and that the greedy tenant took its part of it on replica 0.
        tokio::time::sleep(EXCHANGE_EVERY * 2).await;
        assert_eq!(books[1].lock().round(), 1001);
        let v = books[1]
            .lock()
            .decide(greedy, 1, 20, true, ShareMode::Enforce, 1000);
        assert!(matches!(v, Verdict::Refuse { .. }), "{v:?}");
        for _ in 0..20 {
            let v = books[1]
                .lock()
                .decide(modest, 1, 20, true, ShareMode::Enforce, 1001);
            assert_eq!(v, Verdict::Admit);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_book_nobody_asks_stops_telling_its_counts() {
        #[derive(Default)]
        struct Counted(std::sync::atomic::AtomicU64);
        #[async_trait::async_trait]
        impl ShareExchange for Counted {
            async fn exchange(
                &self,
                _: &str,
                _: &str,
                mine: &RoundCounts,
            ) -> Result<RoundCounts, crate::coordination::shares::ExchangeError> {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(RoundCounts::empty(mine.round))
            }
        }
        let exchange = Arc::new(Counted::default());
        let book = Arc::new(Mutex::new(ShareBook::new(&[1, 1])));
        tokio::spawn(run(
            Arc::downgrade(&book),
            Names::of(&tenants(&["a", "b"])),
            Place {
                exchange: Arc::clone(&exchange) as Arc<dyn ShareExchange>,
                key: "q".into(),
                replica: "r".into(),
            },
        ));
        let calls = || exchange.0.load(std::sync::atomic::Ordering::SeqCst);
        // Nothing asked yet: nothing to tell.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls(), 0);
        // Asked once: told every exchange for as long as the last ask matters, then no more.
        book.lock().refused_at_ceiling(TenantIndex(0), 1, 7);
        tokio::time::sleep(TELL_AFTER_LAST_ASK + EXCHANGE_EVERY * 3).await;
        let told = calls();
        let expected = (TELL_AFTER_LAST_ASK.as_millis() / EXCHANGE_EVERY.as_millis()) as u64;
        assert!(
            (expected..=expected + 2).contains(&told),
            "{told} exchanges, about {expected} expected"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(calls(), told, "idle: no call");
        // Asked again: told again.
        book.lock().refused_at_ceiling(TenantIndex(0), 1, 7);
        tokio::time::sleep(EXCHANGE_EVERY * 2).await;
        assert!(calls() > told);
    }
}
