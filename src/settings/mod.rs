//! Runtime settings: overrides of each queue's ceiling, fail-closed gate and
//! streak, depth TTL, and the forced backend, changed over `PATCH /admin/settings` and put
//! in force for the next send. The variables stay the defaults: removing an override
//! (`null`) restores the variable's value.
//!
//! Local mode keeps them in `SENDGATE_DATA_DIR/settings.json`; fleet mode in a Redis hash
//! under `SENDGATE_REDIS_PREFIX`, read by every replica every [`POLL_EVERY`], so a change
//! made on one replica is in force on all within 2 s. A replica that cannot read the hash
//! keeps the overrides it last saw.
//!
//! Each override keeps the variable's value it was made against. At start-up (a fleet
//! replica: at its first read of the hash) every override whose variable has changed since
//! lapses under `SENDGATE_OVERRIDES_LAPSE=config_change` (the default: the deployment wins)
//! and is dropped from the store (`settings_lapsed`); every override still in force over a
//! different configured value is logged (`settings_overriding`). `/health/detailed` shows
//! both. A lapsed override the store fails to drop (`settings_lapse_drop_failed`) is still
//! out of force here: the deployment wins whatever the store's state, and each later read
//! (local mode: every [`POLL_EVERY`] until it succeeds) tries the drop again.

pub mod overrides;
pub mod store;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use serde_json::Value;

use crate::admission::Dispatcher;
use crate::config::{OverridesLapse, Settings};
use crate::coordination::Coordination;
use overrides::{Changed, Key, Overrides, Patch, PatchError, Scope, Stamp};
use sendgate_wire::FieldError;
use store::{SettingsStoreError, Store, Write};

/// How often a replica of a fleet reads the shared overrides (well inside the 2 s promise,
/// with room for one failed read).
pub const POLL_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Patch(#[from] PatchError),
    #[error("the settings could not be stored: {0}")]
    Store(#[from] SettingsStoreError),
}

/// How the store answered last, for `/health/detailed`.
#[derive(Debug, Clone)]
pub struct StoreHealth {
    pub ok: bool,
    pub last_error: Option<String>,
}

/// An override dropped at start-up because its variable's value changed since it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lapsed {
    pub key: Key,
    pub value: Value,
    /// Who made it, when, and against which value.
    pub stamp: Stamp,
    /// The variable's value now.
    pub configured: Value,
}

pub struct RuntimeSettings {
    scope: Scope,
    store: Store,
    lapse: OverridesLapse,
    /// Whether the start-up check ([`RuntimeSettings::sync`]'s first success) has run.
    checked: AtomicBool,
    /// What the start-up check dropped, for `/health/detailed`.
    lapsed: Mutex<Vec<Lapsed>>,
    /// The lapsed overrides the store still holds (flat name, the `at` read): kept out of
    /// force at every read until a drop succeeds.
    undropped: Mutex<Vec<(String, String)>>,
    /// Whether the last drop failed, so a failing store is logged once, not at every retry.
    drop_failing: AtomicBool,
    /// The overrides in force. Read by the admin and health routes only: sends read the
    /// gates' policies, which are swapped when this changes.
    current: Mutex<Overrides>,
    /// One change (or fleet read) at a time, so a read cannot undo a change it overlapped.
    writing: tokio::sync::Mutex<()>,
    health: Mutex<StoreHealth>,
}

impl RuntimeSettings {
    /// Local mode: the file is read now; a file that cannot be read or holds a value out of
    /// bounds stops start-up (starting with the variables' values instead could admit over
    /// a ceiling an operator lowered). Fleet mode: nothing yet; [`RuntimeSettings::sync`]
    /// reads the hash.
    pub fn open(
        settings: &Settings,
        coordination: &Coordination,
    ) -> Result<Self, SettingsStoreError> {
        let scope = Scope {
            queues: settings.queues.clone(),
            has_fallback: settings.fallback.is_some(),
        };
        let store = match coordination {
            Coordination::Fleet { redis, .. } => Store::redis(redis.clone()),
            Coordination::Local { .. } | Coordination::Unusable { .. } => {
                Store::file(&settings.data_dir)
            }
        };
        let current = match &store {
            Store::File(path) => {
                let flat = store::read_file(path)?;
                let (overrides, skipped) = Overrides::from_flat(&flat, &scope).map_err(|why| {
                    SettingsStoreError::Corrupt {
                        path: path.display().to_string(),
                        why,
                    }
                })?;
                if !skipped.is_empty() {
                    tracing::warn!(
                        event = "settings_ignored",
                        file = %path.display(),
                        ignored = ?skipped,
                        "runtime settings for queues not served (or unknown names) are ignored; the next change drops them"
                    );
                }
                overrides
            }
            Store::Redis { .. } => Overrides::default(),
        };
        Ok(Self {
            scope,
            store,
            lapse: settings.overrides_lapse,
            checked: AtomicBool::new(false),
            lapsed: Mutex::new(Vec::new()),
            undropped: Mutex::new(Vec::new()),
            drop_failing: AtomicBool::new(false),
            current: Mutex::new(current),
            writing: tokio::sync::Mutex::new(()),
            health: Mutex::new(StoreHealth {
                ok: true,
                last_error: None,
            }),
        })
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// `file` or `redis`.
    pub fn store_kind(&self) -> &'static str {
        self.store.kind()
    }

    pub fn is_fleet(&self) -> bool {
        matches!(self.store, Store::Redis { .. })
    }

    /// Whether [`RuntimeSettings::sync`] has work left: in a fleet always (the hash is read
    /// again); in local mode until the start-up check ran and what lapsed left the file.
    pub fn needs_sync(&self) -> bool {
        self.is_fleet() || !self.checked.load(Ordering::SeqCst) || !self.undropped.lock().is_empty()
    }

    pub fn overrides(&self) -> Overrides {
        self.current.lock().clone()
    }

    pub fn health(&self) -> StoreHealth {
        self.health.lock().clone()
    }

    /// `SENDGATE_OVERRIDES_LAPSE`.
    pub fn lapse(&self) -> OverridesLapse {
        self.lapse
    }

    /// The overrides the start-up check dropped.
    pub fn lapsed(&self) -> Vec<Lapsed> {
        self.lapsed.lock().clone()
    }

    /// Put the overrides in force on every lane's gates and on routing.
    pub fn apply(&self, dispatcher: &Dispatcher) {
        let current = self.current.lock().clone();
        apply(&current, dispatcher);
    }

    /// Apply `patch` as the key `by`'s change: stored first, then in force for the next
    /// send. Returns what changed (each also logged as `settings_changed`).
    pub async fn patch(
        &self,
        dispatcher: &Dispatcher,
        patch: &Patch,
        by: &str,
    ) -> Result<Vec<Changed>, SettingsError> {
        let _turn = self.writing.lock().await;
        // In a fleet, change the latest shared values (another replica may have changed
        // some within the last poll), so the old values logged are the real ones.
        let mut next = match &self.store {
            Store::Redis { .. } => self.without_undropped(self.read_shared().await?),
            Store::File(_) => self.current.lock().clone(),
        };
        let stamp = Stamp {
            by: by.to_owned(),
            at: now_rfc3339(),
            configured: None,
        };
        let changed = next.apply(patch, &stamp);
        for c in changed.iter().filter(|c| c.new.is_some()) {
            next.made_against(&c.key, default_value(&c.key, dispatcher));
        }
        let crossed = crossed_levels(&next, patch, dispatcher);
        if !crossed.is_empty() {
            return Err(PatchError::Invalid(crossed).into());
        }
        if !changed.is_empty() {
            self.store_changes(&next, &changed).await?;
        }
        apply(&next, dispatcher);
        *self.current.lock() = next;
        for c in &changed {
            let default = || default_value(&c.key, dispatcher);
            tracing::info!(
                event = "settings_changed",
                setting = %c.key.flat(),
                variable = c.key.variable().name,
                old = %c.old.clone().unwrap_or_else(default),
                new = %c.new.clone().unwrap_or_else(default),
                overridden = c.new.is_some(),
                by,
                store = self.store.kind(),
                "runtime setting changed"
            );
        }
        Ok(changed)
    }

    /// Store `changed` as `next` has them: the file whole, the hash's changed fields.
    async fn store_changes(
        &self,
        next: &Overrides,
        changed: &[Changed],
    ) -> Result<(), SettingsStoreError> {
        let all = next.to_flat();
        let mut write = Write::default();
        for c in changed {
            let name = c.key.flat();
            match all.get(&name) {
                Some(value) => {
                    write.set.insert(name, value.clone());
                }
                None => write.removed.push(name),
            }
        }
        let written = self.store.write(&all, &write).await;
        self.mark(written.as_ref().map(|_| ()));
        if written.is_ok() && matches!(self.store, Store::File(_)) {
            // The file was rewritten whole from overrides that hold nothing lapsed.
            self.undropped.lock().clear();
            self.drop_failing.store(false, Ordering::SeqCst);
        }
        written
    }

    /// Fleet mode: read the shared overrides and put them in force when they changed.
    /// On failure the replica keeps the overrides it last saw. Returns whether the read
    /// succeeded (local mode: always). The first success (local mode: the first call) is the
    /// start-up check: overrides made against another configured value lapse or are logged.
    /// What lapsed and the store still holds is never put in force, and is dropped again.
    pub async fn sync(&self, dispatcher: &Dispatcher) -> bool {
        if !self.needs_sync() {
            return true;
        }
        let checked = self.checked.load(Ordering::SeqCst);
        let _turn = if checked {
            match self.writing.try_lock() {
                Ok(turn) => turn,
                Err(_) => return true, // a change is being made here; it puts its result in force
            }
        } else {
            self.writing.lock().await
        };
        let read = match &self.store {
            Store::Redis { .. } => self.read_shared().await,
            Store::File(_) => Ok(self.current.lock().clone()),
        };
        let Ok(mut shared) = read else {
            return false;
        };
        // Read again under the turn: another call may have made the check while this one
        // waited for it.
        let first = !self.checked.load(Ordering::SeqCst);
        if first {
            shared = self.check_at_start(shared, dispatcher);
        }
        let shared = self.without_undropped(shared);
        if *self.current.lock() != shared {
            apply(&shared, dispatcher);
            *self.current.lock() = shared.clone();
        }
        // Checked only once in force: a call that finds the turn taken and `checked` set
        // returns at once, counting on what is in force.
        if first {
            self.checked.store(true, Ordering::SeqCst);
        }
        self.drop_lapsed(&shared).await;
        true
    }

    /// The start-up check of `overrides`: those whose variable's value changed since they
    /// were made lapse (under `config_change`: dropped here, and marked for the store to
    /// drop); those in force over another value are logged. Returns what stays in force.
    fn check_at_start(&self, mut overrides: Overrides, dispatcher: &Dispatcher) -> Overrides {
        let mut lapsed = Vec::new();
        for key in overrides.keys() {
            let Some((value, stamp)) = overrides.get(&key).map(|(v, s)| (v, s.clone())) else {
                continue;
            };
            let configured = default_value(&key, dispatcher);
            let made_against = stamp.configured.clone().unwrap_or_default();
            let moved = stamp.configured.as_ref().is_some_and(|c| *c != configured);
            if moved && self.lapse == OverridesLapse::ConfigChange {
                overrides.remove(&key);
                lapsed.push(Lapsed {
                    key,
                    value,
                    stamp,
                    configured,
                });
            } else if value != configured {
                tracing::warn!(
                    event = "settings_overriding",
                    setting = %key.flat(),
                    variable = key.variable().name,
                    value = %value,
                    configured = %configured,
                    made_against = %made_against,
                    by = %stamp.by,
                    at = %stamp.at,
                    store = self.store.kind(),
                    "a runtime override is in force over the configured value (PATCH it to null to restore the variable's)"
                );
            }
        }
        self.undropped
            .lock()
            .extend(lapsed.iter().map(|l| (l.key.flat(), l.stamp.at.clone())));
        for l in &lapsed {
            let made_against = l.stamp.configured.clone().unwrap_or_default();
            tracing::warn!(
                event = "settings_lapsed",
                setting = %l.key.flat(),
                variable = l.key.variable().name,
                value = %l.value,
                made_against = %made_against,
                configured = %l.configured,
                by = %l.stamp.by,
                at = %l.stamp.at,
                store = self.store.kind(),
                "a runtime override lapsed: the variable's value it was made against has changed (SENDGATE_OVERRIDES_LAPSE=config_change)"
            );
        }
        *self.lapsed.lock() = lapsed;
        overrides
    }

    /// `overrides` without those that lapsed here and the store may still hold: the same
    /// flat name and `at`. A change made since (another `at`) is a new override, in force.
    fn without_undropped(&self, mut overrides: Overrides) -> Overrides {
        for (name, at) in self.undropped.lock().iter() {
            let Some(key) = Key::parse_flat(name) else {
                continue;
            };
            if overrides
                .get(&key)
                .is_some_and(|(_, stamp)| stamp.at == *at)
            {
                overrides.remove(&key);
            }
        }
        overrides
    }

    /// Remove what lapsed from the store, `kept` being what stays in force. The hash's
    /// fields are removed only while they still hold the override read (same `at`), so a
    /// change another replica made since survives. A failure is logged once until a drop
    /// succeeds; the next read tries again.
    async fn drop_lapsed(&self, kept: &Overrides) {
        let dropped = self.undropped.lock().clone();
        if dropped.is_empty() {
            return;
        }
        let result = self
            .store
            .drop_if_unchanged(&kept.to_flat(), &dropped)
            .await;
        self.mark(result.as_ref().map(|_| ()));
        match result {
            Ok(()) => {
                self.undropped.lock().retain(|d| !dropped.contains(d));
                self.drop_failing.store(false, Ordering::SeqCst);
            }
            Err(e) if !self.drop_failing.swap(true, Ordering::SeqCst) => {
                let settings: Vec<&str> = dropped.iter().map(|(name, _)| name.as_str()).collect();
                tracing::warn!(
                    event = "settings_lapse_drop_failed",
                    settings = ?settings,
                    store = self.store.kind(),
                    location = %self.store.location(),
                    error = %e,
                    "lapsed runtime overrides could not be dropped from the store; they are not in force here, and the drop is tried again at the next read"
                );
            }
            Err(_) => {}
        }
    }

    async fn read_shared(&self) -> Result<Overrides, SettingsStoreError> {
        let read = match self.store.load().await {
            Ok(flat) => Ok(Overrides::from_flat_lenient(&flat, &self.scope).0),
            Err(e) => Err(e),
        };
        self.mark(read.as_ref().map(|_| ()));
        read
    }

    fn mark(&self, result: Result<(), &SettingsStoreError>) {
        let mut health = self.health.lock();
        match result {
            Ok(()) => {
                health.ok = true;
                health.last_error = None;
            }
            Err(e) => {
                health.ok = false;
                health.last_error = Some(e.to_string());
            }
        }
    }
}

/// The queues `patch` names whose sheddable level would be above their default one with
/// it in force (the variables' rule, per queue): each a 400's field error.
fn crossed_levels(next: &Overrides, patch: &Patch, dispatcher: &Dispatcher) -> Vec<FieldError> {
    use overrides::{Change, Key, QueueField};
    let mut errors = Vec::new();
    for queue in &patch.queues {
        let Some(base) = dispatcher
            .primary()
            .gate(queue)
            .and_then(|g| g.fairness())
            .map(|f| f.base())
        else {
            continue;
        };
        let fair = next
            .queues
            .get(queue)
            .map(overrides::QueueOverrides::fair)
            .unwrap_or_default();
        let sheddable = fair.shed_at_sheddable.unwrap_or(base.shed_at_sheddable);
        let default = fair.shed_at_default.unwrap_or(base.shed_at_default);
        if sheddable <= default {
            continue;
        }
        // Named where the patch set a value: the sheddable level if it did, else default.
        let set = |field| {
            matches!(
                patch.changes.get(&Key::Queue(queue.clone(), field)),
                Some(Change::Set(_))
            )
        };
        let (field, msg) = if set(QueueField::ShedAtSheddable) || !set(QueueField::ShedAtDefault) {
            (
                QueueField::ShedAtSheddable,
                format!(
                    "must be at most shed_at_default ({} for this queue): a sheddable send is refused before a default one",
                    default.get()
                ),
            )
        } else {
            (
                QueueField::ShedAtDefault,
                format!(
                    "must be at least shed_at_sheddable ({} for this queue): a sheddable send is refused before a default one",
                    sheddable.get()
                ),
            )
        };
        errors.push(FieldError::new(
            &["body", "queues", queue.as_str(), field.name()],
            msg,
        ));
    }
    errors
}

fn apply(overrides: &Overrides, dispatcher: &Dispatcher) {
    for lane in dispatcher.lanes() {
        for gate in lane.gates() {
            let queue = overrides.queues.get(gate.queue());
            let policy = queue
                .map(overrides::QueueOverrides::policy)
                .unwrap_or_default();
            gate.policy_cell().apply(&policy);
            let fair = queue
                .map(overrides::QueueOverrides::fair)
                .unwrap_or_default();
            if let Some(fairness) = gate.fairness() {
                fairness.apply(&fair);
            }
        }
    }
    dispatcher.set_force(
        overrides
            .force_backend
            .as_ref()
            .map(|s| s.value)
            .or(dispatcher.force_default()),
    );
}

/// The variable's value of `key` (what removing its override restores), as JSON.
pub fn default_value(key: &overrides::Key, dispatcher: &Dispatcher) -> Value {
    use overrides::{Key, QueueField};
    match key {
        Key::ForceBackend => dispatcher
            .force_default()
            .map_or(Value::Null, |f| overrides::force_word(f).into()),
        Key::Queue(queue, field) => dispatcher.primary().gate(queue).map_or(Value::Null, |g| {
            let base = g.policy_cell().base();
            let level =
                |pick: fn(&crate::admission::fair::FairPolicy) -> crate::config::Fraction| {
                    g.fairness()
                        .map_or(Value::Null, |f| pick(&f.base()).get().into())
                };
            match field {
                QueueField::ShedAtSheddable => level(|f| f.shed_at_sheddable),
                QueueField::ShedAtDefault => level(|f| f.shed_at_default),
                QueueField::FairShareAt => level(|f| f.share_at),
                QueueField::MaxQueueDepth => base.limit.into(),
                QueueField::FailClosed => base.fail_closed.into(),
                QueueField::FailClosedStreak => base.streak_threshold.into(),
                QueueField::DepthTtlMs => u64::try_from(base.ttl.as_millis())
                    .unwrap_or(u64::MAX)
                    .into(),
            }
        }),
    }
}

pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

pub fn rfc3339(t: SystemTime) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from(t)
        .format(&Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
