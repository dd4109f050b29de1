//! The places promised to refused producers, kept so that the producer who comes back for
//! its place gets it before a fresh send (contract section 2, "Claiming a place").
//!
//! `pacing.rs` tells each producer refused for room when its place opens, as if the
//! places that open went to the line in order. Without more, they do not: a fresh send
//! arriving as a place opens takes it as readily as the producer it was promised to, and
//! under a sustained overload fresh sends take most of them. The producer comes back on
//! time, finds the queue full, and is refused again, behind the whole line.
//!
//! So a gate alone by design keeps the promise it made to a send that carries an
//! `Idempotency-Key` (its [`ClaimKey`]): the place may be claimed from the instant it opens
//! until a window after the wait its producer was told (`lapse`, below), and while
//! promises are outstanding, a fresh send is refused if it would take the room they need.
//! Room is kept from the promise on, not only once the place opens: a place opens as room
//! does, and a fresh send arriving in between would take exactly that room. What must
//! hold, and why each rule keeps it:
//!
//! - **The ceiling is untouched.** A claim is admitted only as any send is, under the
//!   ceiling; the rule here only refuses more (fresh sends), never admits.
//! - **No idle workers for a promise.** The room kept is at most half the ceiling
//!   ([`Claims::kept`]): a fresh send (a batch too) is refused for it only while the queue
//!   holds half its ceiling or more, so never beside an empty queue. It is judged on a
//!   read within its TTL (a stale one is made again first, and the send's decision reuses
//!   it), never on an old one.
//! - **No lock-out.** A promise ends when it is claimed (its send stored, or maybe
//!   stored), or at its lapse. Promises are made only as refusals are, at most one per key,
//!   and at most [`MOST_PROMISES`] at once; a producer that never comes back holds nothing
//!   after its lapse, and one that sends many keys holds at most the half of the room
//!   above, for their lapses, and from its own tenant's fresh sends only. A refused fresh
//!   send is given a place like any other, so it is served in its turn, not shut out.
//! - **Coming back early changes nothing.** A send whose place has not opened is decided as
//!   a fresh one that takes no new place: with room beyond what is kept it is admitted,
//!   else told the rest of its wait, and it keeps its place.
//! - **A late producer is a fresh one.** After the lapse its key is forgotten.
//!
//! `lapse`: the told wait plus half of it, and at least [`LEAST_GRACE`]: a producer that
//! adds its own jitter on top of `Retry-After` (the project's client, up to 0.2 s; a
//! generic one up to half the wait) still finds its place.
//!
//! **Criticality**: a fresh send yields only to the promises at its level and above, as
//! `pacing.rs`'s lines: a `critical` send never waits for room kept for a `sheddable` one.
//!
//! What it assumes: the producer retries with the same `Idempotency-Key` (the project's
//! client always does). In a fleet a retry reaches any replica, which would not know the
//! promise, so a fleet's gates keep none.
//!
//! **Tenants**: a fresh send yields only to its own tenant's promises. Between tenants the
//! shares decide who gets the room (docs/fairness.md); a line may order a tenant's own
//! sends, never one tenant behind another's.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::admission::tenants::TenantIndex;

/// A send's claim on a place: its `Idempotency-Key` as scoped at the broker, hashed (a
/// collision would need a second preimage of SHA-256).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimKey(u128);

impl ClaimKey {
    /// The claim of a send whose message id at the broker is `id`: every retry of one
    /// message by one caller has the same.
    pub fn of(id: &str) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(id.as_bytes());
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        Self(u128::from_be_bytes(first))
    }
}

/// The most promises kept at once; a refusal past it is paced as before but not kept.
pub const MOST_PROMISES: usize = 65_536;

/// The shortest window after a place is due in which its producer may still claim it.
pub const LEAST_GRACE: Duration = Duration::from_secs(2);

/// A place promised: it opens `opens` from the refusal, its producer was told `told`
/// (`opens` rounded up to whole seconds), for `units` of `tenant` at `level`.
#[derive(Debug, Clone, Copy)]
pub struct Place {
    pub opens: Duration,
    pub told: Duration,
    pub units: u64,
    pub tenant: TenantIndex,
    pub level: usize,
}

/// What a gate has promised and not yet seen claimed or lapse (`/health/detailed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promised {
    pub promises: u64,
    pub units: u64,
}

/// Where a send stands with the promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// No promise for it (no key, none made, or lapsed): a fresh send.
    Fresh,
    /// Its place is due: it goes before fresh sends.
    Due,
    /// Its place opens in this long: it is told so, and keeps it.
    Early(Duration),
}

/// One promise: its place opens at `due`, it may be claimed until `lapse`, for `units` of
/// `tenant` at a criticality's `level` (0 the lowest).
#[derive(Debug, Clone, Copy)]
struct Promise {
    due: Instant,
    lapse: Instant,
    units: u64,
    tenant: TenantIndex,
    level: usize,
}

/// The promises of one queue's gate.
#[derive(Debug, Default)]
pub struct Claims {
    book: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    promises: HashMap<ClaimKey, Promise>,
    /// The same promises, by their lapse: `(lapse, key)`.
    lapses: BTreeSet<(Instant, ClaimKey)>,
    /// The units of all the promises, by tenant and level (a tenant with none has no entry).
    units: HashMap<TenantIndex, [u64; LEVELS]>,
}

/// The criticalities a promise may be made at (`pacing.rs`'s lines).
pub const LEVELS: usize = 3;

impl Book {
    /// Forget the promises past their lapse.
    fn lapse(&mut self, now: Instant) {
        while let Some(&(lapse, key)) = self.lapses.first() {
            if lapse > now {
                break;
            }
            self.forget(key);
        }
    }

    /// Drop the promise made to `key`, if any.
    fn forget(&mut self, key: ClaimKey) {
        if let Some(promise) = self.promises.remove(&key) {
            self.lapses.remove(&(promise.lapse, key));
            if let Some(levels) = self.units.get_mut(&promise.tenant) {
                levels[promise.level] -= promise.units;
                if levels.iter().all(|u| *u == 0) {
                    self.units.remove(&promise.tenant);
                }
            }
        }
    }
}

impl Claims {
    /// Where a send with `key` stands at `now`.
    pub fn standing(&self, key: Option<ClaimKey>, now: Instant) -> Standing {
        let Some(key) = key else {
            return Standing::Fresh;
        };
        let mut book = self.book.lock();
        book.lapse(now);
        match book.promises.get(&key) {
            None => Standing::Fresh,
            Some(promise) if promise.due > now => Standing::Early(promise.due - now),
            Some(_) => Standing::Due,
        }
    }

    /// The room kept at `now`, from a fresh send of `tenant` at `level`, for the places
    /// promised to the same tenant at that level or above (a lower criticality waits behind
    /// a higher one, never a higher behind a lower; a tenant behind its own line, never
    /// another's: their shares decide between them): their units, at most half of `limit`.
    pub fn kept(&self, limit: u64, tenant: TenantIndex, level: usize, now: Instant) -> u64 {
        let mut book = self.book.lock();
        book.lapse(now);
        let units: u64 = book
            .units
            .get(&tenant)
            .map_or(0, |levels| levels[level.min(LEVELS - 1)..].iter().sum());
        units.min(limit / 2)
    }

    /// Promise `key` a place of `units` at `level` that opens `opens` from `now`, its
    /// producer told to come back in `told` (`opens` rounded up to whole seconds). A promise
    /// already made to the key is replaced: the latest answer is the one it heard.
    pub fn promise(&self, key: Option<ClaimKey>, now: Instant, place: Place) {
        let Some(key) = key else {
            return;
        };
        let mut book = self.book.lock();
        book.lapse(now);
        book.forget(key);
        if book.promises.len() >= MOST_PROMISES {
            return;
        }
        let Place {
            opens,
            told,
            units,
            tenant,
            level,
        } = place;
        let level = level.min(LEVELS - 1);
        let due = now + opens;
        let lapse = now + told + (told / 2).max(LEAST_GRACE);
        book.promises.insert(
            key,
            Promise {
                due,
                lapse,
                units,
                tenant,
                level,
            },
        );
        book.lapses.insert((lapse, key));
        book.units.entry(tenant).or_default()[level] += units;
    }

    /// The promises outstanding at `now`, and their units.
    pub fn outstanding(&self, now: Instant) -> Promised {
        let mut book = self.book.lock();
        book.lapse(now);
        Promised {
            promises: book.promises.len() as u64,
            units: book.units.values().flatten().sum(),
        }
    }

    /// The send with `key` was admitted and stored (or may have been): its promise, if
    /// any, is kept. One admitted but never sent keeps its place (`Reservation::finish`).
    pub fn claimed(&self, key: Option<ClaimKey>) {
        if let Some(key) = key {
            self.book.lock().forget(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> Option<ClaimKey> {
        Some(ClaimKey::of(&format!("message-{n}")))
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn place(opens: f64, told: f64, units: u64) -> Place {
        Place {
            opens: secs(opens),
            told: secs(told),
            units,
            tenant: T,
            level: 1,
        }
    }

    const T: TenantIndex = TenantIndex(0);

    #[tokio::test(start_paused = true)]
    async fn a_promise_is_early_then_due_until_its_lapse_then_forgotten() {
        let claims = Claims::default();
        let start = Instant::now();
        claims.promise(key(1), start, place(1.4, 2.0, 1));
        assert_eq!(claims.standing(None, start), Standing::Fresh);
        assert_eq!(claims.standing(key(2), start), Standing::Fresh);
        assert_eq!(
            claims.standing(key(1), start + secs(0.4)),
            Standing::Early(secs(1.0))
        );
        assert_eq!(claims.standing(key(1), start + secs(1.4)), Standing::Due);
        // Told 2 s: due until 2 s + the least grace (2 s, more than half of 2 s).
        assert_eq!(claims.standing(key(1), start + secs(3.99)), Standing::Due);
        assert_eq!(claims.kept(100, T, 0, start + secs(3.99)), 1);
        assert_eq!(claims.standing(key(1), start + secs(4.0)), Standing::Fresh);
        assert_eq!(claims.kept(100, T, 0, start + secs(4.0)), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_wait_may_be_claimed_until_half_of_it_again() {
        let claims = Claims::default();
        let start = Instant::now();
        claims.promise(key(1), start, place(9.5, 10.0, 3));
        assert_eq!(claims.standing(key(1), start + secs(14.99)), Standing::Due);
        assert_eq!(claims.kept(100, T, 0, start + secs(14.99)), 3);
        assert_eq!(claims.standing(key(1), start + secs(15.0)), Standing::Fresh);
    }

    #[tokio::test(start_paused = true)]
    async fn the_room_kept_is_every_promise_at_most_half_the_ceiling() {
        let claims = Claims::default();
        let now = Instant::now();
        for n in 0..8 {
            claims.promise(key(n), now, place(5.0, 5.0, 2));
        }
        assert_eq!(claims.kept(100, T, 0, now), 16);
        assert_eq!(claims.kept(20, T, 0, now), 10);
        assert_eq!(claims.kept(21, T, 0, now), 10);
        assert_eq!(claims.kept(1, T, 0, now), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_send_yields_to_the_promises_at_its_level_and_above_only() {
        let claims = Claims::default();
        let now = Instant::now();
        for (n, level) in [(1, 0), (2, 1), (3, 1), (4, 2)] {
            let place = Place {
                level,
                ..place(1.0, 1.0, 1)
            };
            claims.promise(key(n), now, place);
        }
        assert_eq!(claims.kept(100, T, 0, now), 4, "sheddable waits behind all");
        assert_eq!(claims.kept(100, T, 1, now), 3);
        assert_eq!(
            claims.kept(100, T, 2, now),
            1,
            "critical behind critical alone"
        );
        assert_eq!(claims.kept(100, T, 9, now), 1, "past the top is the top");
        // One of two at a level: the tenant's other promises, every level, stay counted.
        claims.claimed(key(2));
        assert_eq!(claims.kept(100, T, 0, now), 3);
        claims.promise(key(2), now, place(1.0, 1.0, 1));
        claims.claimed(key(4));
        assert_eq!(claims.kept(100, T, 2, now), 0);
        assert_eq!(claims.kept(100, T, 9, now), 0);
        // The tenant's other promises stay counted when one level empties.
        assert_eq!(claims.kept(100, T, 0, now), 3);
        claims.claimed(key(2));
        claims.claimed(key(3));
        claims.claimed(key(1));
        assert_eq!(
            claims.outstanding(now),
            Promised {
                promises: 0,
                units: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_send_yields_to_its_own_tenants_promises_only() {
        let claims = Claims::default();
        let now = Instant::now();
        let other = TenantIndex(3);
        claims.promise(key(1), now, place(1.0, 1.0, 2));
        let theirs = Place {
            tenant: other,
            ..place(1.0, 1.0, 5)
        };
        claims.promise(key(2), now, theirs);
        assert_eq!(claims.kept(100, T, 0, now), 2);
        assert_eq!(claims.kept(100, other, 0, now), 5);
        assert_eq!(claims.kept(100, TenantIndex(1), 0, now), 0);
        assert_eq!(
            claims.outstanding(now),
            Promised {
                promises: 2,
                units: 7
            }
        );
        claims.claimed(key(2));
        assert_eq!(claims.kept(100, other, 0, now), 0);
        assert_eq!(
            claims.outstanding(now),
            Promised {
                promises: 1,
                units: 2
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimed_or_replaced_promise_keeps_nothing_more() {
        let claims = Claims::default();
        let now = Instant::now();
        claims.promise(key(1), now, place(1.0, 1.0, 2));
        claims.promise(key(1), now, place(3.0, 3.0, 1));
        assert_eq!(
            claims.kept(100, T, 0, now),
            1,
            "the latest promise replaces the first"
        );
        assert_eq!(
            claims.standing(key(1), now + secs(1.0)),
            Standing::Early(secs(2.0))
        );
        claims.promise(key(2), now, place(1.0, 1.0, 4));
        claims.claimed(key(1));
        claims.claimed(None);
        assert_eq!(claims.kept(100, T, 0, now), 4);
        assert_eq!(claims.standing(key(1), now + secs(2.0)), Standing::Fresh);
        // Forgotten from the lapse order too: its old lapse takes nothing from the others.
        assert_eq!(claims.kept(100, T, 0, now + secs(2.9)), 4);
        claims.promise(None, now, place(1.0, 1.0, 9));
        assert_eq!(claims.kept(100, T, 0, now), 4, "no key, no promise");
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_most_promises_are_kept() {
        let claims = Claims::default();
        let now = Instant::now();
        for n in 0..=MOST_PROMISES as u32 {
            claims.promise(key(n), now, place(1.0, 1.0, 1));
        }
        assert_eq!(claims.kept(u64::MAX, T, 0, now), MOST_PROMISES as u64);
        let last = key(MOST_PROMISES as u32);
        assert_eq!(claims.standing(last, now + secs(1.0)), Standing::Fresh);
        // A key already promised may still be promised again at the cap.
        claims.promise(key(0), now, place(2.0, 2.0, 1));
        assert_eq!(
            claims.standing(key(0), now + secs(1.0)),
            Standing::Early(secs(1.0))
        );
    }
}
