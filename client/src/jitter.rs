//! The client's randomness: the retries' jitter and the adaptive throttle's draws, from
//! one source per client. It is seeded from the OS unless the config names a seed, so a
//! run (a test on the paused clock, a storm replayed) can be repeated draw for draw.

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

pub(crate) struct Jitter(Mutex<StdRng>);

impl Jitter {
    pub(crate) fn new(seed: Option<u64>) -> Self {
        Self(Mutex::new(
            seed.map_or_else(rand::make_rng, StdRng::seed_from_u64),
        ))
    }

    /// A number in `[0, 1)`: what `retry.rs` and `throttle.rs` take as `unit`.
    pub(crate) fn unit(&self) -> f64 {
        self.0.lock().random()
    }
}

#[cfg(test)]
mod tests {
    use super::Jitter;

    #[test]
    fn one_seed_draws_the_same_units_and_every_unit_is_below_one() {
        let (a, b) = (Jitter::new(Some(7)), Jitter::new(Some(7)));
        let drawn: Vec<f64> = (0..1000).map(|_| a.unit()).collect();
        assert!(drawn.iter().all(|u| (0.0..1.0).contains(u)));
        assert!(drawn
            .iter()
            .zip((0..1000).map(|_| b.unit()))
            .all(|(x, y)| *x == y));
        assert_ne!(drawn[0], Jitter::new(Some(8)).unit());
    }

    #[test]
    fn unseeded_sources_differ() {
        assert_ne!(Jitter::new(None).unit(), Jitter::new(None).unit());
    }
}
