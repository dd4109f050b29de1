//! The tenants' exchange of a fleet (docs/fairness.md, "In a fleet"): each replica's counts
//! of a round, per tenant, for the others to add to their own books.
//!
//! It knows nothing of the ceiling's ledger: its keys, its script and its losses touch no
//! step of docs/fleet.md. What it carries only ever makes a replica refuse a send its
//! ceiling would admit, so counts that are lost, late or invented move parts, never the
//! ceiling.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Why an exchange failed: the store's own error (its deadline, its connection), as it said
/// it. A replica that cannot exchange judges on its own counts, so no caller tells one
/// failure from another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExchangeError(pub String);

/// How long a replica's counts are kept after it sent them: a round and the next, and a
/// margin for a late exchange. One that stops sending (drained, cut off, gone) is nobody's
/// asker after that.
pub const KEEP_COUNTS: Duration = Duration::from_secs(3);

/// The most tenants one replica's counts may name (a keys file's bound, which admission
/// holds it to): an entry with more is not a replica's, and is ignored.
const MAX_NAMED: usize = 1000;

/// Longer than any replica's counts can be (1000 tenants of 128-byte names, each byte
/// escaped as JSON may escape it, each count at u64's widest, is under 350 KB): a longer
/// entry is not a replica's, and is ignored unparsed.
const MAX_ENTRY_BYTES: usize = 1024 * 1024;

/// One tenant's counts of a round, in units (a batch's entries each count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Asked in the round before (admitted or refused).
    #[serde(rename = "b")]
    pub asked_before: u64,
    /// Asked in this round so far.
    #[serde(rename = "q")]
    pub asked: u64,
    /// Admitted in this round so far.
    #[serde(rename = "a")]
    pub admitted: u64,
}

impl Counts {
    fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

/// What one replica counted in `round` (the share round of the depth read it judged by), or the sum of
/// the other replicas' counts as of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundCounts {
    #[serde(rename = "r")]
    pub round: u64,
    /// A send was refused (at the ceiling or for a share) in this round / in the one before.
    #[serde(rename = "n", default)]
    pub refused_now: bool,
    #[serde(rename = "p", default)]
    pub refused_before: bool,
    /// By tenant name; tenants with nothing counted are left out.
    #[serde(rename = "t", default)]
    pub tenants: BTreeMap<String, Counts>,
}

impl RoundCounts {
    /// Nothing counted, as of `round`.
    pub fn empty(round: u64) -> Self {
        Self {
            round,
            ..Self::default()
        }
    }

    /// These counts as of `round`, as a book rolls its own: the round before's asks become
    /// the asks before and nothing is admitted yet; anything older (or newer: counts
    /// judged by a later read than `round`) is nothing.
    pub fn as_of(self, round: u64) -> Self {
        if self.round == round {
            return self;
        }
        if self.round.checked_add(1) != Some(round) {
            return Self::empty(round);
        }
        Self {
            round,
            refused_now: false,
            refused_before: self.refused_now,
            tenants: self
                .tenants
                .into_iter()
                .filter(|(_, c)| c.asked > 0)
                .map(|(name, c)| {
                    (
                        name,
                        Counts {
                            asked_before: c.asked,
                            ..Counts::default()
                        },
                    )
                })
                .collect(),
        }
    }

    /// Add `other`'s counts (taken as of this round).
    fn add(&mut self, other: RoundCounts) {
        let other = other.as_of(self.round);
        self.refused_now |= other.refused_now;
        self.refused_before |= other.refused_before;
        for (name, c) in other.tenants {
            let sum = self.tenants.entry(name).or_default();
            sum.asked_before = sum.asked_before.saturating_add(c.asked_before);
            sum.asked = sum.asked.saturating_add(c.asked);
            sum.admitted = sum.admitted.saturating_add(c.admitted);
        }
    }

    /// The sum of `entries` (other replicas' counts, as stored) as of `round`, or as of
    /// the round after it when an entry already counts in that one: a replica that has
    /// heard of a newer depth read than this one moves the sum on with it, so the book
    /// that hears it rolls forward instead of dropping the fleet's newest counts. Entries
    /// further ahead, or older than the round before, count nothing. An entry that is not
    /// a replica's counts (a foreign or damaged value) is skipped: it must not take a
    /// replica down.
    pub fn sum_of<'a>(round: u64, entries: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let parsed: Vec<RoundCounts> = entries
            .into_iter()
            .filter(|entry| entry.len() <= MAX_ENTRY_BYTES)
            .filter_map(|entry| serde_json::from_slice::<RoundCounts>(entry).ok())
            .filter(|counts| counts.tenants.len() <= MAX_NAMED)
            .collect();
        let next = round.checked_add(1);
        let newest = if parsed.iter().any(|c| Some(c.round) == next) {
            next.unwrap_or(round)
        } else {
            round
        };
        let mut sum = Self::empty(newest);
        for counts in parsed {
            sum.add(counts);
        }
        sum
    }

    /// The wire form the exchange stores (compact JSON), without the tenants that counted
    /// nothing.
    pub fn encode(&self) -> String {
        let mut lean = self.clone();
        lean.tenants.retain(|_, c| !c.is_zero());
        serde_json::to_string(&lean).unwrap_or_default()
    }
}

/// The exchange as a replica's gate sees it: one call per queue per period.
#[async_trait]
pub trait ShareExchange: Send + Sync {
    /// Keep `mine` as `replica`'s counts of the queue at `key` for [`KEEP_COUNTS`], and
    /// answer the sum of every other replica's counts still kept, as of `mine.round` or
    /// the round after it ([`RoundCounts::sum_of`]).
    async fn exchange(
        &self,
        key: &str,
        replica: &str,
        mine: &RoundCounts,
    ) -> Result<RoundCounts, ExchangeError>;
}

/// The exchange in memory, on tokio's clock (the gate's unit tests; two gates on one of
/// these are two replicas).
#[derive(Default)]
pub struct MemoryShares {
    kept: parking_lot::Mutex<HashMap<String, Kept>>,
}

/// One queue's counts: by replica, until when and in the wire form.
type Kept = HashMap<String, (tokio::time::Instant, String)>;

impl MemoryShares {
    /// Forget everything, as a flushed Redis would.
    pub fn flush(&self) {
        self.kept.lock().clear();
    }
}

#[async_trait]
impl ShareExchange for MemoryShares {
    async fn exchange(
        &self,
        key: &str,
        replica: &str,
        mine: &RoundCounts,
    ) -> Result<RoundCounts, ExchangeError> {
        let now = tokio::time::Instant::now();
        let mut kept = self.kept.lock();
        let queue = kept.entry(key.to_owned()).or_default();
        queue.insert(replica.to_owned(), (now + KEEP_COUNTS, mine.encode()));
        queue.retain(|_, (until, _)| now < *until);
        let others = queue
            .iter()
            .filter(|(name, _)| name.as_str() != replica)
            .map(|(_, (_, value))| value.as_bytes());
        Ok(RoundCounts::sum_of(mine.round, others))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(round: u64, tenants: &[(&str, u64, u64, u64)]) -> RoundCounts {
        RoundCounts {
            round,
            refused_now: false,
            refused_before: false,
            tenants: tenants
                .iter()
                .map(|&(name, b, q, a)| {
                    (
                        name.to_owned(),
                        Counts {
                            asked_before: b,
                            asked: q,
                            admitted: a,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn counts_of_the_round_before_move_back_one_and_older_ones_are_nothing() {
        let mut c = counts(7, &[("a", 5, 9, 4), ("b", 3, 0, 0)]);
        c.refused_now = true;
        assert_eq!(c.clone().as_of(7), c);
        let moved = c.clone().as_of(8);
        assert_eq!(moved.tenants, counts(8, &[("a", 9, 0, 0)]).tenants);
        assert!(moved.refused_before && !moved.refused_now);
        assert_eq!(c.clone().as_of(9), RoundCounts::empty(9));
        // Counts of a later read than the one asked about: nothing.
        assert_eq!(c.as_of(6), RoundCounts::empty(6));
    }

    #[test]
    fn the_sum_adds_each_tenant_and_skips_what_is_not_a_replicas_counts() {
        let one = counts(4, &[("a", 1, 2, 3)]).encode();
        let mut two = counts(3, &[("a", 0, 10, 10), ("b", 0, 5, 1)]);
        two.refused_now = true;
        let two = two.encode();
        let junk = [b"not json".as_slice(), b"{\"r\":\"x\"}", b"[]"];
        let entries = [one.as_bytes(), two.as_bytes()].into_iter().chain(junk);
        let sum = RoundCounts::sum_of(4, entries);
        assert_eq!(
            sum.tenants,
            counts(4, &[("a", 11, 2, 3), ("b", 5, 0, 0)]).tenants
        );
        assert!(sum.refused_before && !sum.refused_now);
        // Counts cannot overflow a sum.
        let big = counts(1, &[("a", u64::MAX, u64::MAX, u64::MAX)]).encode();
        let sum = RoundCounts::sum_of(1, [big.as_bytes(), big.as_bytes()]);
        assert_eq!(sum.tenants["a"].admitted, u64::MAX);
    }

    #[test]
    fn a_replica_a_read_ahead_moves_the_sum_on_and_one_further_ahead_is_ignored() {
        let behind = counts(4, &[("a", 0, 3, 3)]).encode();
        let ahead = counts(5, &[("a", 3, 2, 1), ("b", 0, 1, 0)]).encode();
        let far = counts(6, &[("c", 0, 9, 9)]).encode();
        let sum = RoundCounts::sum_of(4, [behind.as_bytes(), ahead.as_bytes(), far.as_bytes()]);
        assert_eq!(sum.round, 5);
        assert_eq!(
            sum.tenants,
            counts(5, &[("a", 6, 2, 1), ("b", 0, 1, 0)]).tenants
        );
        // Nobody ahead: the sum stays at the asker's round.
        assert_eq!(RoundCounts::sum_of(4, [behind.as_bytes()]).round, 4);
        assert_eq!(
            RoundCounts::sum_of(u64::MAX, [far.as_bytes()]).round,
            u64::MAX
        );
    }

    #[test]
    fn the_wire_form_leaves_out_tenants_that_counted_nothing() {
        let c = counts(2, &[("a", 0, 0, 0), ("b", 0, 1, 1)]);
        assert_eq!(
            c.encode(),
            r#"{"r":2,"n":false,"p":false,"t":{"b":{"b":0,"q":1,"a":1}}}"#
        );
    }

    #[test]
    fn an_entry_naming_more_tenants_than_a_keys_file_may_is_ignored() {
        let names: Vec<(String, u64, u64, u64)> =
            (0..=MAX_NAMED).map(|i| (i.to_string(), 1, 1, 1)).collect();
        let refs: Vec<(&str, u64, u64, u64)> = names
            .iter()
            .map(|(n, b, q, a)| (n.as_str(), *b, *q, *a))
            .collect();
        let too_many = counts(1, &refs).encode();
        assert!(RoundCounts::sum_of(1, [too_many.as_bytes()])
            .tenants
            .is_empty());
    }

    #[test]
    fn an_entry_longer_than_any_replicas_is_ignored_unparsed() {
        let entry = counts(1, &[("t", 0, 4, 4)]).encode();
        let at_most = entry.clone() + &" ".repeat(MAX_ENTRY_BYTES - entry.len());
        let over = format!("{at_most} ");
        assert_eq!(
            RoundCounts::sum_of(1, [at_most.as_bytes()]).tenants.len(),
            1
        );
        assert!(RoundCounts::sum_of(1, [over.as_bytes()]).tenants.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn in_memory_each_replica_hears_the_others_until_their_counts_expire() {
        let shares = MemoryShares::default();
        let a = counts(1, &[("t", 0, 4, 4)]);
        let b = counts(1, &[("t", 0, 6, 2)]);
        assert_eq!(
            shares.exchange("q", "ra", &a).await.unwrap().tenants,
            BTreeMap::new()
        );
        let heard = shares.exchange("q", "rb", &b).await.unwrap();
        assert_eq!(heard.tenants, a.tenants);
        // Another queue hears nothing of these.
        assert!(shares
            .exchange("q2", "rb", &b)
            .await
            .unwrap()
            .tenants
            .is_empty());
        tokio::time::advance(KEEP_COUNTS).await;
        assert!(shares
            .exchange("q", "rb", &b)
            .await
            .unwrap()
            .tenants
            .is_empty());
        shares.exchange("q", "ra", &a).await.unwrap();
        shares.flush();
        assert!(shares
            .exchange("q", "rb", &b)
            .await
            .unwrap()
            .tenants
            .is_empty());
    }
}
