//! What the seat owes the ledger: its sends' outcomes, settled in batches (docs/fleet.md,
//! step 3), and its goodbye (step 7).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::policy::BacklogEffect;
use super::super::window::Ended;
use super::{FleetSeat, Goodbye, Held, SETTLE_EVERY};
use crate::coordination::port::{LedgerError, Settle};

/// Outcomes to settle, by `(epoch, block turn)`: (stored, not stored).
type Pending = BTreeMap<(u64, u64), (u64, u64)>;

/// A settle batch's rows as owned ids and counts: `(block id, stored, not stored)`.
type Rows = Vec<(String, u64, u64)>;

impl FleetSeat {
    /// A send admitted through the fleet ended: its outcome is settled with the next batch,
    /// and told to the window (an unknown one stays open there). Near the ceiling it starts
    /// a read at the ceiling when one is due: started at admission, the read could show
    /// the send stored while its unit is still counted on top, one place taken twice until
    /// the next read; now the read settles the outcome first.
    pub fn finish(self: &Arc<Self>, held: Held, effect: BacklogEffect) {
        self.record_outcome(held, effect);
        self.read_at_ceiling_if_due();
    }

    fn record_outcome(self: &Arc<Self>, held: Held, effect: BacklogEffect) {
        let stored = effect != BacklogEffect::NotStored;
        {
            let mut state = self.state.lock();
            let (epoch, bucket) = held.admitted();
            match effect {
                BacklogEffect::Stored => state.window.ended(epoch, bucket, Ended::Stored),
                BacklogEffect::NotStored => state.window.ended(epoch, bucket, Ended::NotStored),
                BacklogEffect::Unknown => {}
            }
            let current = state.seen.id;
            if epoch != current {
                // Of an epoch already replaced (step 5): known stored, it is recounted into
                // this one; open, it stays in the carry; not stored, it is counted nowhere.
                if effect == BacklogEffect::Stored {
                    state.pending.entry((current, 0)).or_default().0 += 1;
                    *state.open.entry(current).or_default() += 1;
                }
                drop(state);
                self.schedule_settle();
                return;
            }
            let row = match held {
                Held::Block { epoch, turn, .. } => (epoch, turn),
                Held::Open { epoch, .. } => (epoch, 0),
            };
            let entry = state.pending.entry(row).or_default();
            match (held, stored) {
                (_, true) => entry.0 += 1,
                (Held::Block { .. }, false) => entry.1 += 1,
                (Held::Open { epoch, .. }, false) => {
                    // Never stored: it need not be counted any more.
                    if let Some(open) = state.open.get_mut(&epoch) {
                        *open = open.saturating_sub(1);
                    }
                }
            }
        }
        self.schedule_settle();
    }

    pub(super) fn schedule_settle(self: &Arc<Self>) {
        let schedule = {
            let mut state = self.state.lock();
            !state.pending.is_empty() && !std::mem::replace(&mut state.running.settle, true)
        };
        if schedule {
            self.runtime.spawn(Arc::clone(self).settle_until_counted());
        }
    }

    /// Settle the batch; while Redis fails, keep what was stored and try again each
    /// [`REJOIN_EVERY`](crate::coordination::fleet::REJOIN_EVERY). One task per seat.
    async fn settle_until_counted(self: Arc<Self>) {
        let mut wait = SETTLE_EVERY;
        loop {
            tokio::time::sleep(wait).await;
            let Err(error) = self.settle_pending().await else {
                return;
            };
            self.fall_back(&error);
            if std::mem::replace(&mut self.state.lock().running.settle, true) {
                return; // a send finished meanwhile and scheduled the next batch
            }
            wait = crate::coordination::fleet::REJOIN_EVERY;
        }
    }

    /// `pending`'s rows of `epoch` (another epoch's sends are in the carry), by block id.
    fn rows_of(&self, pending: Pending, epoch: u64) -> Rows {
        pending
            .into_iter()
            .filter(|((e, _), _)| *e == epoch)
            .map(|((_, turn), (stored, not))| (self.block_id(turn), stored, not))
            .collect()
    }

    /// One settle call with this epoch's rows (another epoch's sends are in the carry).
    /// On failure the stored sends are kept, to be settled again as open (whether the call
    /// took their units is unknown: counted twice meanwhile, the safe side); units not
    /// taken stay in their block until its lease ends.
    pub(super) async fn settle_pending(self: &Arc<Self>) -> Result<(), LedgerError> {
        let (rows, epoch, open) = {
            let mut state = self.state.lock();
            state.running.settle = false;
            let epoch = state.seen.id;
            let pending = std::mem::take(&mut state.pending);
            let open = pending.get(&(epoch, 0)).map_or(0, |(stored, _)| *stored);
            (self.rows_of(pending, epoch), epoch, open)
        };
        if rows.is_empty() {
            return Ok(());
        }
        let batch = settle_batch(&rows);
        let settled = self
            .fleet
            .ledger()
            .settle(self.queue_ref(), self.caller(), &batch)
            .await;
        match settled {
            Ok(view) => {
                // Open sends stay in the carry until now (this call's carry counted them
                // too: twice for a moment, the safe side), never in neither.
                if let Some(left) = self.state.lock().open.get_mut(&epoch) {
                    *left = left.saturating_sub(open);
                }
                self.see(view);
                Ok(())
            }
            Err(error) => {
                let unsettled: u64 = batch.iter().map(|s| s.stored).sum();
                if unsettled > 0 {
                    let mut state = self.state.lock();
                    state.pending.entry((epoch, 0)).or_default().0 += unsettled;
                    // Row (epoch, 0) is counted in the carry: the block sends now in it too.
                    *state.open.entry(epoch).or_default() += unsettled.saturating_sub(open);
                }
                Err(error)
            }
        }
    }

    /// The replica drained and its HTTP server stopped: settle what its sends left, give
    /// back what its blocks did not hand out, and leave, in one call. From the moment this
    /// starts the seat admits nothing. What it admitted that no read shows yet stays
    /// counted: sends in flight in their blocks' leases, its carry until its hold.
    pub async fn leave(self: &Arc<Self>) -> Result<Goodbye, LedgerError> {
        self.state.lock().mode.leave();
        // A reservation asked for ahead and still out would put this replica back in the
        // fleet after its goodbye (every call names it a member): its grant is given back
        // below instead.
        drop(self.next_block_turn.lock().await);
        if !self.fleet.ever_joined() {
            return Ok(Goodbye::NeverJoined);
        }
        let rows = self.rows_to_leave_with();
        let batch = settle_batch(&rows);
        let caller = self.caller();
        let named = caller.seen.id;
        let view = self
            .fleet
            .ledger()
            .leave(self.queue_ref(), caller, &batch)
            .await?;
        if view.epoch.id != named {
            // The state was made anew (and named another epoch): the goodbye recorded no
            // carry and settled nothing. Adopted, every admission of the hold is carry now
            // (its rows are dropped with the old epoch): said again, the carry is kept until
            // its hold ends, as step 7 promises.
            self.see(view);
            self.fleet
                .ledger()
                .leave(self.queue_ref(), self.caller(), &[])
                .await?;
        }
        Ok(Goodbye::Left)
    }

    /// Everything the seat owes the ledger as it leaves: the outcomes to settle, and every
    /// block's units not handed out, given back.
    fn rows_to_leave_with(&self) -> Rows {
        let mut state = self.state.lock();
        let epoch = state.seen.id;
        // The leave script settles these rows with the carry it records, in one step: the
        // open sends among them leave the carry as they enter `since_read` (the carry
        // outlives the goodbye by a hold, and would count them twice that long).
        let settled_open = state
            .pending
            .get(&(epoch, 0))
            .map_or(0, |(stored, _)| *stored);
        if let Some(open) = state.open.get_mut(&epoch) {
            *open = open.saturating_sub(settled_open);
        }
        for block in std::mem::take(&mut state.blocks) {
            if block.left > 0 {
                state.give_back(block.epoch, block.turn, block.left);
            }
        }
        let pending = std::mem::take(&mut state.pending);
        self.rows_of(pending, epoch)
    }

    /// [`FleetSeat::leave`], and say how it went (a failure is only logged: what it holds
    /// then expires as a killed replica's would).
    pub async fn say_goodbye(self: &Arc<Self>) -> Result<Goodbye, LedgerError> {
        let goodbye = self.leave().await;
        match &goodbye {
            Ok(Goodbye::Left) => tracing::info!(
                event = "coordination_left",
                queue = %self.queue,
                "drained: left the fleet, what its blocks did not use is the others' again"
            ),
            Ok(Goodbye::NeverJoined) => {}
            Err(error) => tracing::warn!(
                event = "coordination_leave_failed",
                queue = %self.queue,
                error = %error,
                "could not leave the fleet: what this replica held comes back when its leases end"
            ),
        }
        goodbye
    }
}

/// The ledger's form of `rows`.
fn settle_batch(rows: &Rows) -> Vec<Settle<'_>> {
    rows.iter()
        .map(|(id, stored, not_stored)| Settle {
            block_id: id,
            stored: *stored,
            not_stored: *not_stored,
        })
        .collect()
}
