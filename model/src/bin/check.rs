//! `cargo run -p sendgate-model --bin check -- <config> [depth]`: check one configuration
//! (a name of `configs::by_name`), breadth first, stopping at the first counterexample;
//! print its state count, its time and the counterexample in words.
use std::time::Instant;

use sendgate_model::{configs, Fleet, CEILING};
use stateright::{Checker, HasDiscoveries, Model};

fn main() {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fail_closed".into());
    let Some(cfg) = configs::by_name(&name) else {
        eprintln!(
            "unknown configuration {name}; one of: {}",
            configs::NAMES.join(", ")
        );
        std::process::exit(2);
    };
    let started = Instant::now();
    let checker = Fleet::new(cfg)
        .checker()
        .finish_when(HasDiscoveries::AnyFailures)
        .target_max_depth(
            std::env::args()
                .nth(2)
                .map_or(usize::MAX, |d| d.parse().unwrap()),
        )
        .spawn_bfs()
        .join();
    println!(
        "{name}: {} states ({} generated), depth {}, {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    match checker.discovery(CEILING) {
        None => println!("invariant holds"),
        Some(path) => {
            println!("counterexample:");
            print!("{}", checker.model().explain(&path.into_vec()));
        }
    }
}
