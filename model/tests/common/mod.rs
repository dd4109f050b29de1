//! What the model's tests share: run a check, say what it took, show a trace.
use std::time::Instant;

use sendgate_model::{Action, Config, Fleet, State, ADMITTED, CEILING, FULL};
use stateright::{Checker, HasDiscoveries, Model};

/// Checks `cfg` exhaustively (breadth first, one thread): the invariant holds in every
/// reachable state, sends are admitted and the queue reaches the ceiling in some, and so do
/// the `reached` properties named (what the configuration's faults should lead to).
#[allow(dead_code)] // each test file uses one of the two
pub fn holds(name: &str, cfg: Config, reached: &[&'static str]) {
    let started = Instant::now();
    let checker = Fleet::new(cfg).checker().spawn_bfs().join();
    eprintln!(
        "{name}: {} states ({} generated), depth {}, {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert!(checker.is_done());
    if let Some(path) = checker.discovery(CEILING) {
        panic!(
            "{name}: the ceiling is passed:\n{}",
            checker.model().explain(&path.into_vec())
        );
    }
    for p in [ADMITTED, FULL].iter().chain(reached) {
        assert!(checker.discovery(p).is_some(), "{name}: never reached: {p}");
    }
}

/// Searches `cfg` breadth first for a counterexample to the invariant and returns the
/// shortest one, as steps (printed in words).
#[allow(dead_code)]
pub fn counterexample(name: &str, cfg: Config) -> Option<Vec<(State, Option<Action>)>> {
    let started = Instant::now();
    let checker = Fleet::new(cfg)
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    eprintln!(
        "{name}: {} states, depth {}, {:.1?}",
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    let path = checker.discovery(CEILING)?.into_vec();
    eprintln!("{}", checker.model().explain(&path));
    Some(path)
}
