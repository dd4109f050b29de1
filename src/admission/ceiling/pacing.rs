//! How long a producer refused for room is told to wait (contract section 2, `S`): the
//! refused producers are spread over the time it will take to serve them, instead of all
//! being told the time until the first place opens.
//!
//! A queue's gate keeps a virtual queue of the promises it made: per level, `owed`, the
//! places promised and not yet served. Served at the drain rate `rate`, they shrink by
//! `rate × elapsed` between refusals, at the rate measured *now*: a drain that recovers
//! shortens every wait at once, and a stalled one lengthens them. A refusal for room of
//! `units` (a `queue_full`, or a criticality's `Shed`) is given the next place:
//!
//! ```text
//! owed        = max(0, owed − rate × elapsed)
//! Retry-After = max(base, owed / rate), in whole seconds rounded up, within [1, max]
//! owed        = min(max(owed, base × rate) + units, max × rate)
//! ```
//!
//! `base` is the refusal's own wait (the measured drain's time to the resume level, at
//! least until the next read; a `Shed`'s time to the next read): when the first place
//! opens. From there places open at the drain rate, `rate`: the measured one, in a fleet
//! divided by the replicas the seat counts (each replica spreads its own refusals, so
//! together they promise the fleet's drain). So the `k`-th producer refused while places
//! are promised is told `base + (k − 1)/rate` (not `base` like every other), and one
//! refused once the promises have been served gets `base` again. A producer is told the
//! start of its place, rounded up: it comes back when its place can be open, never before.
//!
//! **By criticality**: a lower criticality is refused first and let in last (docs/
//! fairness.md), so it waits behind every refusal at its level or above, and a higher one
//! behind none below it: a line per level; a refusal takes its place in its own level's
//! line and pushes the lines of the levels below by its units.
//!
//! **No jitter**: the spread is the jitter. Each refusal has its own place, `units/rate`
//! after the one before, and producers refused at different instants come back as spread
//! as they were refused. A random spread around the place would send half of them back
//! before it opens (one more refusal each, the cost this is here to save).
//!
//! **Capped**: a wait is at most `max` (`SENDGATE_RETRY_AFTER_MAX_S`), and no more is
//! owed than `max` of drain: the producers told `max` share its second, and the line does
//! not run on beyond what anyone was told.
//!
//! **Who gets the place**: a producer that retries with the same `Idempotency-Key` has
//! its place kept for it (`claims.rs`): fresh sends do not take the room its place needs.
//! One without a key cannot be told from a new producer: if it sends again before its
//! place, it is refused again and takes another, pushing back those who wait as told.
//!
//! **The head of the line**: a producer back for its place who finds the room taken (the
//! drain slowed after it was promised, or others back at the same moment took it) takes a
//! place in a line of its own ahead of the others (`heads`), served at the same rate from
//! its refusal's own wait: those back together are spread over the places as they open,
//! not all told the next one to be refused together again. A place promised after them at
//! their level or below opens after theirs. The line itself still owes their places: it is
//! served at the rate measured now, so a drain that slowed leaves them owed (owing them
//! again would count them twice, and tell later producers to wait past the line's end
//! while the queue runs dry).
//!
//! With no drain rate measured the refusal's own answer stands (the time to the next read).
//! Other refusals keep theirs: a tenant's share or quota is a wait for a round or a rate of
//! the tenant's own, not a place in the queue's drain.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::policy::Refusal;
use crate::admission::tenants::Criticality;

/// One queue gate's promises to the producers it refused for room.
#[derive(Debug, Default)]
pub struct Pacing {
    lines: Mutex<Book>,
}

/// The line, and ahead of it the producers back for places that had not opened yet (the
/// drain slowed since they were promised), served first at the same rate.
#[derive(Debug, Default)]
struct Book {
    line: Lines,
    heads: Lines,
}

/// The places promised and not yet served at each criticality, indexed by [`level`].
#[derive(Debug, Default)]
struct Lines([Line; 3]);

/// One level's promises: `owed` places (units) as of `at`.
#[derive(Debug, Default, Clone, Copy)]
struct Line {
    owed: f64,
    at: Option<Instant>,
}

impl Line {
    /// What is still owed at `now`, served at `per_second` since the last refusal.
    fn served_until(&mut self, now: Instant, per_second: f64) {
        let elapsed = self
            .at
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        self.owed = (self.owed - per_second * elapsed).max(0.0);
        self.at = Some(now);
    }
}

/// What one refusal's place is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    pub criticality: Criticality,
    /// The refused sends (a batch's entries).
    pub units: u64,
    /// Messages a second this gate's refused producers are served at (the drain rate, in
    /// a fleet this replica's share of it); `None` until drain has been measured.
    pub per_second: Option<f64>,
    /// The longest wait (`SENDGATE_RETRY_AFTER_MAX_S`).
    pub max: Duration,
}

/// A criticality's line, 0 the lowest.
pub(super) fn level(criticality: Criticality) -> usize {
    match criticality {
        Criticality::Sheddable => 0,
        Criticality::Default => 1,
        Criticality::Critical => 2,
    }
}

impl Pacing {
    /// [`Self::place`]'s refusal alone.
    #[cfg(test)]
    pub fn pace(&self, refusal: Refusal, ask: Ask) -> Refusal {
        self.place(refusal, ask).0
    }

    /// `refusal` with its wait spread behind the producers refused before it (a refusal
    /// for room with a drain rate measured; any other as it is), and when the refused
    /// producer's place opens, to the instant (what it is told is that, rounded up to
    /// whole seconds); `None` for a refusal not paced.
    pub fn place(&self, refusal: Refusal, ask: Ask) -> (Refusal, Option<Duration>) {
        let Some((place, max)) = Place::of(&refusal, &ask) else {
            return (refusal, None);
        };
        let (level, now) = (level(ask.criticality), Instant::now());
        let mut book = self.lines.lock();
        let Book { line, heads } = &mut *book;
        heads.serve(level, now, place.per_second);
        let opens = line.promise(level, now, place, max, heads.0[level].owed);
        (refusal.told(whole_seconds(opens).min(max)), Some(opens))
    }

    /// As [`Self::place`], for a producer back for its place who found the room taken
    /// (the drain slowed after it was promised, so the places open later than said). It
    /// keeps the head of the line: behind only the others back for theirs, spread with
    /// them at the drain rate (not all told the same next opening, to come back together
    /// and be refused again). A refusal placed after it at its level or below is placed
    /// after it.
    pub fn head(&self, refusal: Refusal, ask: Ask) -> (Refusal, Option<Duration>) {
        let Some((place, max)) = Place::of(&refusal, &ask) else {
            return (refusal, None);
        };
        let (level, now) = (level(ask.criticality), Instant::now());
        let opens = self.lines.lock().heads.promise(level, now, place, max, 0.0);
        (refusal.told(whole_seconds(opens).min(max)), Some(opens))
    }
}

/// A wait as `Retry-After` says it: whole seconds, rounded up, at least one.
pub(super) fn whole_seconds(wait: Duration) -> Duration {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

/// One refusal's place: when the first place opens, its units, and the rate places open at.
#[derive(Debug, Clone, Copy)]
struct Place {
    base: Duration,
    units: f64,
    per_second: f64,
}

impl Place {
    /// `refusal`'s place and the longest wait, for a refusal for room once a drain rate
    /// is measured.
    fn of(refusal: &Refusal, ask: &Ask) -> Option<(Self, Duration)> {
        let per_second = ask.per_second.filter(|r| r.is_finite() && *r > 0.0)?;
        let place = Place {
            base: refusal.room_wait()?,
            units: ask.units.max(1) as f64,
            per_second,
        };
        Some((
            place,
            Duration::from_secs(ask.max.as_secs()).max(Duration::from_secs(1)),
        ))
    }
}

impl Lines {
    /// When a place at `level` opens (at most `max`, whole seconds), behind `ahead` units
    /// owed before the line, adding the place's units to its line and every lower level's.
    fn promise(
        &mut self,
        level: usize,
        now: Instant,
        place: Place,
        max: Duration,
        ahead: f64,
    ) -> Duration {
        let rate = place.per_second;
        let base = place.base.min(max).as_secs_f64();
        let most = max.as_secs_f64() * rate;
        self.serve(level, now, rate);
        let wait = base.max(self.0[level].owed.max(ahead) / rate);
        for line in &mut self.0[..=level] {
            line.owed = (line.owed.max(ahead).max(base * rate) + place.units).min(most);
        }
        Duration::try_from_secs_f64(wait).unwrap_or(max).min(max)
    }

    /// The lines at `level` and below as served at `per_second` until `now`.
    fn serve(&mut self, level: usize, now: Instant, per_second: f64) {
        for line in &mut self.0[..=level] {
            line.served_until(now, per_second);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::admission::drain::DrainRate;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn full(base: Duration) -> Refusal {
        Refusal::QueueFull {
            backlog: 200,
            limit: 200,
            retry_after: base,
            drain_rate: Some(DrainRate::measured(100.0)),
            room: 0,
        }
    }

    fn ask(criticality: Criticality, units: u64, per_second: f64) -> Ask {
        Ask {
            criticality,
            units,
            per_second: Some(per_second),
            max: secs(300),
        }
    }

    fn wait(refusal: &Refusal) -> Duration {
        match refusal {
            Refusal::QueueFull { retry_after, .. } | Refusal::Shed { retry_after, .. } => {
                *retry_after
            }
            other => panic!("not a refusal for room: {other:?}"),
        }
    }

    /// A refusal at a full queue (base 1 s), at `level`, of `units`, with the drain at 100/s.
    fn refuse(p: &Pacing, criticality: Criticality, units: u64) -> Duration {
        wait(&p.pace(full(secs(1)), ask(criticality, units, 100.0)))
    }

    /// A rate that is no rate (none measured, zero, not a number, infinite) paces
    /// nothing: the refusal's own wait stands, and no place is promised.
    #[tokio::test(start_paused = true)]
    async fn a_rate_that_is_no_rate_promises_no_place() {
        let p = Pacing::default();
        for per_second in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let (refusal, opens) = p.place(full(secs(7)), ask(Criticality::Default, 1, per_second));
            assert_eq!((wait(&refusal), opens), (secs(7), None), "{per_second}");
            let (refusal, opens) = p.head(full(secs(7)), ask(Criticality::Default, 1, per_second));
            assert_eq!((wait(&refusal), opens), (secs(7), None), "{per_second}");
        }
        let unmeasured = Ask {
            per_second: None,
            ..ask(Criticality::Default, 1, 1.0)
        };
        assert_eq!(p.place(full(secs(7)), unmeasured).1, None);
    }

    /// Producers back together for places a slowed drain has not opened yet are each told
    /// a place of their own ahead of the line, at the drain rate, not all the next opening;
    /// a refusal after them waits behind them.
    #[tokio::test(start_paused = true)]
    async fn producers_back_for_places_not_yet_open_are_spread_ahead_of_the_line() {
        let p = Pacing::default();
        for _ in 0..30 {
            p.pace(full(secs(1)), ask(Criticality::Default, 1, 10.0));
        }
        tokio::time::advance(secs(4)).await;
        let heads: Vec<_> = (0..20)
            .map(|_| {
                let (refusal, opens) = p.head(full(secs(1)), ask(Criticality::Default, 1, 10.0));
                (wait(&refusal), opens.expect("paced"))
            })
            .collect();
        // At 10/s the 20 heads' places open from 1 s to 2.9 s.
        assert_eq!(heads[0], (secs(1), secs(1)));
        assert_eq!(heads[19].1, Duration::from_millis(2900));
        assert_eq!(heads[19].0, secs(3));
        assert!(heads.windows(2).all(|w| w[0].1 < w[1].1), "{heads:?}");
        // The line (its 30 served at 10/s in 3 s) owes nothing more; a new refusal comes
        // after the 20 heads.
        let behind = p.place(full(secs(1)), ask(Criticality::Default, 1, 10.0));
        assert_eq!(behind.1, Some(Duration::from_secs(3)), "after the heads");
    }

    /// The line, served at the rate measured now, still owes the places of producers
    /// refused on their claims once the drain slowed: a refusal after them is not put
    /// behind those places twice. 30 places at 10/s from 1 s (due 1.0…3.9 s); the drain
    /// halves, measured at once; each producer comes back when told and is refused. At
    /// 3.9 s, 40 places were promised and 19.5 served at 5/s: about 20 owed, 4.1 s (the
    /// heads' line says 4.3 s), not 50.5 and 10.1 s.
    #[tokio::test(start_paused = true)]
    async fn a_place_the_slowed_line_still_owes_is_not_owed_twice() {
        let p = Pacing::default();
        for _ in 0..30 {
            p.pace(full(secs(1)), ask(Criticality::Default, 1, 10.0));
        }
        let mut t = Duration::ZERO;
        for k in 0..30u64 {
            let due = Duration::from_millis(1000 + 100 * k);
            tokio::time::advance(due - t).await;
            t = due;
            p.head(full(secs(1)), ask(Criticality::Default, 1, 5.0));
        }
        let fresh = p.place(full(secs(1)), ask(Criticality::Default, 1, 5.0));
        let opens = fresh.1.expect("paced");
        assert!(
            opens <= secs(6),
            "told {:?}, opens {opens:?}",
            wait(&fresh.0)
        );
    }

    /// Issue 39: at 5× a drain of 100/s, ~400 producers are refused a second. Each was
    /// told 1 s (the time until one place opens); spread over the time it takes to serve
    /// them, they are told 1 s to 4 s, a quarter of them each second.
    #[tokio::test(start_paused = true)]
    async fn four_hundred_refusals_in_a_second_are_spread_over_the_four_seconds_they_need() {
        let p = Pacing::default();
        let mut seen = BTreeMap::new();
        let started = Instant::now();
        for k in 0..400u64 {
            let w = refuse(&p, Criticality::Default, 1);
            // The k-th place starts 1 s + k/100 s after the first refusal: never told sooner.
            let back = Instant::now() + w;
            let place = started + secs(1) + Duration::from_millis(10 * k);
            assert!(back >= place, "refusal {k} told {w:?}");
            *seen.entry(w.as_secs()).or_insert(0) += 1;
            tokio::time::advance(Duration::from_micros(2500)).await;
        }
        assert_eq!(
            seen.keys().copied().collect::<Vec<_>>(),
            [1, 2, 3, 4],
            "{seen:?}"
        );
        assert!(
            seen[&4] >= 100 && seen[&2] >= 100 && seen[&3] >= 100,
            "{seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn once_the_promises_have_passed_a_refusal_is_told_the_base_again() {
        let p = Pacing::default();
        for _ in 0..400 {
            refuse(&p, Criticality::Default, 1);
        }
        assert_eq!(
            refuse(&p, Criticality::Default, 1),
            secs(5),
            "behind 400 places"
        );
        // Its place starts at 5 s, the next at 5.01 s.
        tokio::time::advance(secs(3)).await;
        assert_eq!(
            refuse(&p, Criticality::Default, 1),
            secs(3),
            "still promised"
        );
        tokio::time::advance(secs(2)).await;
        assert_eq!(refuse(&p, Criticality::Default, 1), secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_is_capped_and_the_line_is_not_pushed_past_the_cap() {
        let p = Pacing::default();
        let capped = |p: &Pacing| {
            let a = Ask {
                max: secs(10),
                ..ask(Criticality::Default, 1, 1.0)
            };
            wait(&p.pace(full(secs(1)), a))
        };
        let waits: Vec<u64> = (0..100).map(|_| capped(&p).as_secs()).collect();
        assert_eq!(waits[..10], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert!(waits[10..].iter().all(|&w| w == 10), "{waits:?}");
        // The 90 told 10 s share its second: 10 s on, the line is back to the base.
        tokio::time::advance(secs(10)).await;
        assert_eq!(capped(&p), secs(1));
    }

    /// Review of issue 39: the promises were fixed times, so a drain that stalled for a
    /// few seconds (a measured rate of ~0.7/s) pushed every wait to the cap, and the waits
    /// stayed there for the cap's length after the drain recovered. What is owed is
    /// served at the rate measured now.
    #[tokio::test(start_paused = true)]
    async fn a_drain_that_recovers_shortens_the_waits_at_once() {
        let p = Pacing::default();
        let slow = |p: &Pacing| wait(&p.pace(full(secs(1)), ask(Criticality::Default, 1, 0.7)));
        let waits: Vec<u64> = (0..400).map(|_| slow(&p).as_secs()).collect();
        assert_eq!(waits[399], 300, "a stalled drain: the cap");
        tokio::time::advance(secs(1)).await;
        // The drain is back at 100/s: what is owed (300 s of 0.7/s, 210 places) took 2.1 s
        // from the last refusal, 1.1 s of it still to come.
        assert_eq!(refuse(&p, Criticality::Default, 1), secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_as_many_places_as_its_units() {
        let p = Pacing::default();
        assert_eq!(refuse(&p, Criticality::Default, 250), secs(1));
        // 250 units at 100/s: the next place starts 2.5 s after the first.
        assert_eq!(refuse(&p, Criticality::Default, 1), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_criticality_waits_behind_a_higher_one_and_not_the_reverse() {
        let p = Pacing::default();
        assert_eq!(refuse(&p, Criticality::Sheddable, 300), secs(1));
        assert_eq!(
            refuse(&p, Criticality::Critical, 1),
            secs(1),
            "critical is let in before sheddable: it waits behind none of it"
        );
        assert_eq!(refuse(&p, Criticality::Critical, 200), secs(2));
        assert_eq!(
            refuse(&p, Criticality::Default, 1),
            secs(4),
            "behind critical's 201"
        );
        assert_eq!(
            refuse(&p, Criticality::Sheddable, 1),
            secs(7),
            "behind its own 300, then critical's 201 and default's 1: 6.02 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_base_is_the_refusals_own_and_a_shed_refusal_is_paced_as_well() {
        let p = Pacing::default();
        let a = ask(Criticality::Sheddable, 1, 1.0);
        assert_eq!(wait(&p.pace(full(Duration::from_millis(7200)), a)), secs(8));
        let shed = Refusal::Shed {
            criticality: Criticality::Sheddable,
            backlog: 170,
            cut: 160,
            retry_after: secs(1),
            room: 0,
        };
        assert_eq!(wait(&p.pace(shed, a)), secs(9), "behind the one at 7.2 s");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_rate_or_for_a_tenants_own_limits_the_answer_stands() {
        let p = Pacing::default();
        let unmeasured = Ask {
            per_second: None,
            ..ask(Criticality::Default, 1, 1.0)
        };
        for _ in 0..10 {
            let r = p.pace(full(Duration::from_millis(700)), unmeasured);
            assert_eq!(wait(&r), Duration::from_millis(700));
        }
        let share = Refusal::TenantShare {
            share_milli: 250,
            retry_after: secs(1),
            room: 0,
        };
        for _ in 0..10 {
            let r = p.pace(share.clone(), ask(Criticality::Default, 1, 1.0));
            assert_eq!(r, share);
        }
        assert_eq!(
            refuse(&p, Criticality::Default, 1),
            secs(1),
            "none of them took a place"
        );
    }
}
