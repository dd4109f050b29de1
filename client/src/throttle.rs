//! Client-side adaptive throttling (the Google SRE book, "Handling Overload"): a client
//! that sees most of its recent requests refused holds some of its attempts back itself,
//! instead of spending the gateway's time on refusals.
//!
//! Over a window (two minutes by default) it counts `requests` (every attempt the client
//! wanted to make, held ones included) and `accepts` (attempts the gateway took: anything
//! but a refusal or failure worth a retry), and holds an attempt with probability
//! `max(0, (requests − K·accepts) / (requests + 1))`. While the gateway takes at least
//! one request in K, nothing is held; past that, what goes on the wire settles near K
//! times what is accepted, however much more the client wants to send.
//!
//! Held means delayed, not dropped: a batch producer wants its messages delivered within
//! their deadline, and a message failed locally would only be sent again later by the job,
//! with less information than the client has now. The held attempt asks again after a
//! short wait, until its deadline. A client sends at one criticality (`ClientConfig::
//! criticality`), so a client's throttle is that criticality's: a critical client's
//! accepts are never diluted by a sheddable one's refusals.
//!
//! Pure like `retry.rs`: the time and the randomness are passed in.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The adaptive throttle's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleConfig {
    /// How many requests per accept the client may make before it holds any (the SRE
    /// book's K; 2 by default: up to half refused costs nothing locally).
    pub k: f64,
    /// How long a request or an accept counts.
    pub window: Duration,
    /// A held attempt asks again after a wait picked in `[hold / 2, hold]`.
    pub hold: Duration,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        Self {
            k: 2.0,
            window: Duration::from_secs(120),
            hold: Duration::from_secs(1),
        }
    }
}

/// Requests and accepts in one slice of the window.
#[derive(Debug, Clone, Copy)]
struct Slice {
    start: Instant,
    requests: u64,
    accepts: u64,
}

/// The window is kept as this many slices: a count expires at most one slice late.
const SLICES: u32 = 24;

/// One client's adaptive throttle (shared by its clones). Thread-safe; the lock is held
/// for a few additions only.
#[derive(Debug)]
pub struct AdaptiveThrottle {
    config: ThrottleConfig,
    slice: Duration,
    slices: Mutex<VecDeque<Slice>>,
}

impl AdaptiveThrottle {
    pub fn new(config: ThrottleConfig) -> Self {
        Self {
            slice: (config.window / SLICES).max(Duration::from_millis(1)),
            config,
            slices: Mutex::new(VecDeque::with_capacity(SLICES as usize + 1)),
        }
    }

    pub fn config(&self) -> ThrottleConfig {
        self.config
    }

    /// The chance an attempt asking now is held.
    pub fn hold_probability(&self, now: Instant) -> f64 {
        let mut slices = self.slices.lock();
        self.expire(&mut slices, now);
        self.probability(&slices)
    }

    /// Whether an attempt asking now goes (`unit` a number in `[0, 1)`); `false` holds it.
    /// Nothing is counted here: see [`request`](Self::request).
    pub fn admit(&self, now: Instant, unit: f64) -> bool {
        unit >= self.hold_probability(now)
    }

    /// One attempt the client wanted to make: counted once, when its answer comes or when
    /// it is first held, whichever is first. Counting attempts in flight would hold back
    /// most of a burst sent before any answer came; counting a held attempt each time it
    /// asks again would count how often it asked, not what the client wants to send, and
    /// keep the hold near certain long after the gateway recovered.
    pub fn request(&self, now: Instant) {
        let mut slices = self.slices.lock();
        self.expire(&mut slices, now);
        self.record(&mut slices, now, 1, 0);
    }

    /// The gateway took an attempt.
    pub fn accept(&self, now: Instant) {
        let mut slices = self.slices.lock();
        self.expire(&mut slices, now);
        self.record(&mut slices, now, 0, 1);
    }

    /// How long a held attempt waits before asking again.
    pub fn hold_for(&self, unit: f64) -> Duration {
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.config.hold.mul_f64(0.5 + unit / 2.0)
    }

    fn probability(&self, slices: &VecDeque<Slice>) -> f64 {
        let (requests, accepts) = slices.iter().fold((0u64, 0u64), |(r, a), s| {
            (r.saturating_add(s.requests), a.saturating_add(s.accepts))
        });
        let (requests, accepts) = (requests as f64, accepts as f64);
        let k = if self.config.k.is_finite() {
            self.config.k.max(0.0)
        } else {
            f64::MAX
        };
        ((requests - k * accepts) / (requests + 1.0)).max(0.0)
    }

    fn record(&self, slices: &mut VecDeque<Slice>, now: Instant, requests: u64, accepts: u64) {
        match slices.back_mut() {
            Some(s) if now.saturating_duration_since(s.start) < self.slice => {
                s.requests = s.requests.saturating_add(requests);
                s.accepts = s.accepts.saturating_add(accepts);
            }
            _ => slices.push_back(Slice {
                start: now,
                requests,
                accepts,
            }),
        }
    }

    fn expire(&self, slices: &mut VecDeque<Slice>, now: Instant) {
        while slices
            .front()
            .is_some_and(|s| now.saturating_duration_since(s.start) >= self.config.window)
        {
            slices.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn nothing_is_held_while_the_gateway_takes_one_request_in_k() {
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default());
        let now = Instant::now();
        for i in 0..100 {
            // Even the unluckiest roll goes.
            assert!(throttle.admit(now, 0.0));
            throttle.request(now);
            if i % 2 == 0 {
                throttle.accept(now);
            }
        }
        assert_eq!(throttle.hold_probability(now), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn past_k_requests_per_accept_the_hold_probability_is_the_sre_books() {
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default());
        let now = Instant::now();
        // 100 requests, 10 accepted: (100 − 2·10) / 101.
        for i in 0..100 {
            throttle.request(now);
            if i < 10 {
                throttle.accept(now);
            }
        }
        let p = throttle.hold_probability(now);
        assert!((p - 80.0 / 101.0).abs() < 1e-9, "{p}");
        // A roll under it is held, one above goes; asking counts nothing.
        assert!(!throttle.admit(now, 0.79));
        assert!(throttle.admit(now, 0.8));
        assert_eq!(throttle.hold_probability(now), p);
        // K = 1: every refusal weighs.
        let strict = AdaptiveThrottle::new(ThrottleConfig {
            k: 1.0,
            ..ThrottleConfig::default()
        });
        for i in 0..10 {
            strict.request(now);
            if i < 5 {
                strict.accept(now);
            }
        }
        let p = strict.hold_probability(now);
        assert!((p - 5.0 / 11.0).abs() < 1e-9, "{p}");
    }

    #[tokio::test(start_paused = true)]
    async fn what_the_window_forgets_holds_nothing_back() {
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default());
        let start = Instant::now();
        for _ in 0..1000 {
            throttle.request(start);
        }
        assert!(throttle.hold_probability(start) > 0.99);
        let later = start + Duration::from_secs(60);
        assert!(
            throttle.hold_probability(later) > 0.99,
            "still in the window"
        );
        let gone = start + Duration::from_secs(121);
        assert_eq!(throttle.hold_probability(gone), 0.0);
    }

    #[test]
    fn a_held_attempt_waits_between_half_the_hold_and_the_hold() {
        let throttle = AdaptiveThrottle::new(ThrottleConfig::default());
        assert_eq!(throttle.hold_for(0.0), Duration::from_millis(500));
        assert_eq!(throttle.hold_for(0.5), Duration::from_millis(750));
        assert_eq!(throttle.hold_for(1.0), Duration::from_secs(1));
        assert_eq!(throttle.hold_for(f64::NAN), Duration::from_millis(500));
    }
}
