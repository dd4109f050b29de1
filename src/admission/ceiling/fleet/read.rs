//! The fleet's admin-plane read (docs/fleet.md, step 4): one replica per TTL takes the
//! lease, reads and publishes; the others wait for it, or start it ahead of expiry. At the
//! ceiling a replica reads again sooner, so room shows as soon as consumers make it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::local::NEAR_CEILING;
use super::state::SeatState;
use super::{FleetSeat, AHEAD_RETRY, CEILING_READ_FLOOR, WAIT_POLL};
use crate::backend::DepthError;
use crate::coordination::port::{LedgerError, ReadFor, ReadOutcome, ReadState, ReadTicket, View};

impl FleetSeat {
    /// Make the fleet's read fresh: read the admin plane if this replica gets the lease,
    /// otherwise (when `wait`) wait for the replica that holds it to publish. A read made
    /// here counts in the streak when `counts`; true if one that counts was published.
    ///
    /// A send that waited for its turn while another's refresh failed on Redis makes no
    /// call of its own here (nothing published, `Ok(false)`) and goes on to reserve, a
    /// call made beside the others': with Redis slower than its deadline, sends queued for
    /// the turn would otherwise be answered one deadline apart, past a connection's limit.
    pub(super) async fn refresh(
        self: &Arc<Self>,
        wait: bool,
        counts: bool,
    ) -> Result<bool, LedgerError> {
        let queued_at = self.state.lock().refreshes.0;
        let _turn = self.read_turn.lock().await;
        let (finished, failed) = self.state.lock().refreshes;
        if finished != queued_at && failed {
            return Ok(false);
        }
        let refreshed = self.refresh_in_turn(wait, counts).await;
        let mut state = self.state.lock();
        state.refreshes = (state.refreshes.0 + 1, refreshed.is_err());
        drop(state);
        refreshed
    }

    async fn refresh_in_turn(
        self: &Arc<Self>,
        wait: bool,
        counts: bool,
    ) -> Result<bool, LedgerError> {
        // The send before this one in line made the read fresh: no Redis call.
        if wait && self.fresh(&self.state.lock(), Instant::now()) {
            return Ok(false);
        }
        self.look_past_grace(wait).await?;
        if self.read_since(wait, Instant::now()) {
            return Ok(false); // another replica published while this one queued
        }
        // This replica's outcomes first, as for a read at the ceiling: a send stored before
        // the read and settled after its ticket is counted twice until the next read.
        self.settle_pending().await?;
        let ledger = self.fleet.ledger();
        let lease = self.policy.load().ttl.max(Duration::from_millis(1));
        let (ticket, view) = ledger
            .lease_read(self.queue_ref(), self.caller(), lease)
            .await?;
        self.see(view);
        match ticket {
            Some(ticket) => {
                self.read_for_the_fleet(ticket, Self::ttl_read(counts))
                    .await?;
                Ok(counts)
            }
            // A reader that died holds the lease until it ends: once one send waited that
            // read out, those queued behind it do not each wait it out again.
            None if wait && self.state.lock().waited_out != Some(view.generation) => {
                self.wait_for_the_read(view).await?;
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// A read the TTL paces, in the streak when `in_streak`; it ends its lease, to let the
    /// reads at the ceiling follow (the ledger still takes one that does not: a replica of
    /// the build before, which read a queue shared by weight once per TTL).
    fn ttl_read(in_streak: bool) -> ReadFor {
        ReadFor::Ttl {
            in_streak,
            ends_lease: true,
        }
    }

    /// Whether the read last seen makes this one needless: fresh, for a send waiting on
    /// it; not yet within the lead of its TTL, for one ahead (the lease ends when a read is
    /// published, so it alone does not keep a second read of the same TTL out).
    fn read_since(&self, wait: bool, now: Instant) -> bool {
        let state = self.state.lock();
        if wait {
            return self.fresh(&state, now);
        }
        let lead = self.ahead_lead(&state);
        state.last.is_some_and(|(view, seen)| {
            view.read != ReadState::Never
                && view.paced_age + (now - seen) + lead < self.policy.load().ttl
        })
    }

    /// How long before the TTL's end a read is started ahead: twice the last read's
    /// duration, at least [`AHEAD_RETRY`], at most half the TTL.
    fn ahead_lead(&self, state: &SeatState) -> Duration {
        let ttl = self.policy.load().ttl;
        (state.last_read_took * 2).max(AHEAD_RETRY).min(ttl / 2)
    }

    /// See the fleet's state. When `wait` and a new epoch's grace is running (step 5: it
    /// grants nothing), see it again once the grace is over: the read is made after it, so
    /// the reservation that follows finds it fresh rather than read again (a failed read
    /// counts in the streak).
    async fn look_past_grace(self: &Arc<Self>, wait: bool) -> Result<(), LedgerError> {
        let ledger = self.fleet.ledger();
        let seen = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
        self.see(seen);
        if wait && seen.grace_left > Duration::ZERO {
            tokio::time::sleep(seen.grace_left.min(self.terms().grace)).await;
            let seen = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
            self.see(seen);
        }
        Ok(())
    }

    /// This replica holds the lease: read the admin plane, publish, and say a failed read.
    async fn read_for_the_fleet(
        self: &Arc<Self>,
        ticket: ReadTicket,
        for_: ReadFor,
    ) -> Result<(), LedgerError> {
        let started = Instant::now();
        let (published, error) = self.read_and_publish(ticket, for_).await?;
        if let Some(error) = error {
            tracing::warn!(
                event = "depth_read_failed",
                queue = %self.queue,
                consecutive_failures = published.streak,
                error = %error,
                "could not read the queue depth (published to the fleet)"
            );
        }
        self.state.lock().last_read_took = started.elapsed();
        self.see(published);
        Ok(())
    }

    /// Read the admin plane with `ticket` and publish what it found, made `for_` what it
    /// names: the view the publish answered, and why the read failed, if it did.
    async fn read_and_publish(
        &self,
        ticket: ReadTicket,
        for_: ReadFor,
    ) -> Result<(View, Option<DepthError>), LedgerError> {
        let (outcome, error) = self.read_admin_plane().await;
        let published = self
            .fleet
            .ledger()
            .publish_read(self.queue_ref(), self.caller(), ticket, outcome, for_)
            .await?;
        Self::count_read(&mut self.state.lock(), &outcome);
        Ok((published, error))
    }

    /// Another replica holds the lease (`leased` saw it taken): wait for its read, at most a
    /// read's deadline, looking every [`WAIT_POLL`] whether it was published.
    async fn wait_for_the_read(self: &Arc<Self>, leased: View) -> Result<(), LedgerError> {
        let ledger = self.fleet.ledger();
        let deadline = Instant::now() + self.policy.base().read_timeout;
        loop {
            if Instant::now() >= deadline {
                self.state.lock().waited_out = Some(leased.generation);
                return Ok(());
            }
            tokio::time::sleep(WAIT_POLL).await;
            let now = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
            self.see(now);
            if now.generation != leased.generation || now.epoch.id != leased.epoch.id {
                return Ok(());
            }
        }
    }

    async fn read_admin_plane(&self) -> (ReadOutcome, Option<DepthError>) {
        let deadline = Instant::now() + self.policy.base().read_timeout;
        let read = self.backend.backlog(&self.queue, deadline);
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(backlog)) => (
                ReadOutcome::Ok {
                    backlog: backlog.messages,
                    send_disabled: backlog.send_disabled,
                },
                None,
            ),
            Ok(Err(error)) => (ReadOutcome::Failed, Some(error)),
            Err(_) => (ReadOutcome::Failed, Some(DepthError::Timeout)),
        }
    }

    /// Read the fleet's state once at start-up (a failed read does not count in the streak).
    pub async fn prime(self: &Arc<Self>) -> Result<(), LedgerError> {
        let _turn = self.read_turn.lock().await;
        let ledger = self.fleet.ledger();
        let seen = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
        self.see(seen);
        if self.fresh(&self.state.lock(), Instant::now()) {
            return Ok(());
        }
        let lease = self.policy.load().ttl.max(Duration::from_millis(1));
        let (ticket, view) = ledger
            .lease_read(self.queue_ref(), self.caller(), lease)
            .await?;
        self.see(view);
        if let Some(ticket) = ticket {
            let (published, _) = self.read_and_publish(ticket, Self::ttl_read(false)).await?;
            self.see(published);
        }
        Ok(())
    }

    fn count_read(state: &mut SeatState, outcome: &ReadOutcome) {
        match outcome {
            ReadOutcome::Ok { .. } => state.own_reads.0 += 1,
            ReadOutcome::Failed => state.own_reads.1 += 1,
        }
    }

    /// Whether this send should start a read ahead of expiry (throttled while another
    /// replica holds the lease).
    pub(super) fn ahead_due(
        &self,
        state: &mut SeatState,
        age: Option<Duration>,
        now: Instant,
    ) -> bool {
        let Some(age) = age else { return false };
        if age + self.ahead_lead(state) < self.policy.load().ttl {
            return false;
        }
        if state.running.read_ahead
            || state
                .ahead_tried_at
                .is_some_and(|at| now < at + AHEAD_RETRY)
        {
            return false;
        }
        state.ahead_tried_at = Some(now);
        state.running.read_ahead = true;
        true
    }

    pub(super) fn spawn_ahead(self: &Arc<Self>, ahead: bool) {
        if !ahead {
            return;
        }
        let seat = Arc::clone(self);
        self.runtime.spawn(async move {
            let refreshed = seat.refresh(false, true).await;
            seat.state.lock().running.read_ahead = false;
            if let Err(e) = refreshed {
                seat.fall_back(&e);
            }
        });
    }

    /// A send the judge refused never reaches the seat, so it starts the read ahead when
    /// one is due, as a send's would: else a replica whose sends the judge all refuses would
    /// judge by one old read for as long as they come. A send that reaches the seat makes
    /// its own read (one failed read per send in the streak, contract section 2).
    pub fn read_ahead_if_due(self: &Arc<Self>) {
        let now = Instant::now();
        let ahead = {
            let mut state = self.state.lock();
            let age = state.last.map(|(view, seen)| view.paced_age + (now - seen));
            self.ahead_due(&mut state, age, now)
        };
        self.spawn_ahead(ahead);
        self.read_at_ceiling_if_due();
    }

    /// At the ceiling, read again once the fleet's good read is a ceiling-read interval
    /// old (docs/fleet.md, step 4, "again at the ceiling"): between the TTL's reads the
    /// estimate credits none of what consumers took, so with a ceiling under a TTL's drain
    /// room would show once per TTL while the queue runs dry. Called by a send refused
    /// `queue_full`, by one admitted near the ceiling when it ends, and by one the judge
    /// refused; the read
    /// runs in the background, one at a time in this replica and, by the lease, in the fleet.
    pub(super) fn read_at_ceiling_if_due(self: &Arc<Self>) {
        if !self.ceiling_read_due(&mut self.state.lock(), Instant::now()) {
            return;
        }
        let seat = Arc::clone(self);
        self.runtime.spawn(async move {
            let read = seat.read_at_ceiling().await;
            seat.state.lock().running.ceiling_read = false;
            if let Err(error) = read {
                seat.fall_back(&error);
            }
        });
    }

    /// Whether a read at the ceiling is due: the last view has a good read that leaves
    /// this replica near the ceiling ([`near_ceiling`]), at least a ceiling-read interval
    /// old, no such read runs here, and none failed since the TTL's last read.
    fn ceiling_read_due(&self, state: &mut SeatState, now: Instant) -> bool {
        let Some((view, seen)) = state.last else {
            return false;
        };
        let Some(estimate) = view.estimate() else {
            return false;
        };
        let near = near_ceiling(estimate, self.policy.load().limit, view.replicas);
        let age = view.read_age + now.saturating_duration_since(seen);
        if !near
            || state.running.ceiling_read
            || state.ceiling_read_failed == Some(view.paced)
            || age < self.ceiling_read_interval(state.last_read_took)
        {
            return false;
        }
        state.running.ceiling_read = true;
        true
    }

    /// How old the fleet's read is before a read at the ceiling: twice the last read's
    /// duration (the admin plane spends at most a third of its time on this queue), at
    /// least [`CEILING_READ_FLOOR`] (a settle's period: `since_read` moves no faster), half
    /// the lag of an admin plane whose counts trail (they move no faster), at most the TTL.
    /// The read lease lasts as long: one such read per interval, fleet-wide.
    fn ceiling_read_interval(&self, took: Duration) -> Duration {
        (took * 2)
            .max(CEILING_READ_FLOOR)
            .max(self.backend.depth_lag() / 2)
            .min(self.policy.load().ttl.max(CEILING_READ_FLOOR))
    }

    /// The read at the ceiling: taken with the lease when no other replica holds it, and
    /// published only if good (it counts in neither the streak nor the share rounds). A
    /// failed one leaves the fleet's read standing, and none is made again before the
    /// TTL's next read.
    ///
    /// This replica's outcomes are settled first: a send stored before the read and
    /// settled after its ticket is counted twice (in the read, and on top of it) until the
    /// next read, and at the ceiling reads come often enough for that to be most of the
    /// room they show.
    async fn read_at_ceiling(self: &Arc<Self>) -> Result<(), LedgerError> {
        let Ok(_turn) = self.read_turn.try_lock() else {
            return Ok(()); // a read of the TTL's runs: it will show the room
        };
        self.settle_pending().await?;
        let lease = self.ceiling_read_interval(self.state.lock().last_read_took);
        let ledger = self.fleet.ledger();
        let (ticket, view) = ledger
            .lease_read(self.queue_ref(), self.caller(), lease)
            .await?;
        self.see(view);
        let Some(ticket) = ticket else { return Ok(()) };
        let started = Instant::now();
        let (outcome, _) = self.read_admin_plane().await;
        Self::count_read(&mut self.state.lock(), &outcome);
        if outcome == ReadOutcome::Failed {
            self.state.lock().ceiling_read_failed = Some(view.paced);
            return Ok(());
        }
        let published = ledger
            .publish_read(
                self.queue_ref(),
                self.caller(),
                ticket,
                outcome,
                ReadFor::Ceiling,
            )
            .await?;
        self.state.lock().last_read_took = started.elapsed();
        self.see(published);
        Ok(())
    }
}

/// Near the ceiling, for reading again: a replica's part of the room, `⌊(L − E)/N⌋` of the
/// `L − E` left among `N` replicas, within a tenth of the ceiling (alone: the estimate
/// within a tenth of it). A replica's judge shares out that part, keeping back what the
/// other tenants are owed, so it refuses sends while the whole room is still a few tenths
/// of the ceiling, and between reads the estimate credits none of what consumers took:
/// read only within a tenth of the whole ceiling, the queue ran dry while sends were
/// refused for their share (the fleet admitted 0.89 of what it did with shares off). Never
/// with more than half the ceiling free: one read a TTL shows room enough there, however
/// many replicas share it.
pub(super) fn near_ceiling(estimate: u64, limit: u64, replicas: u64) -> bool {
    let room = limit.saturating_sub(estimate);
    let tenth = (limit / NEAR_CEILING).max(1);
    // Half rounded down, but never under the tenth (alone with a ceiling of 1: one).
    room / replicas.max(1) <= tenth && room <= (limit / 2).max(tenth)
}
