//! The runtime overrides (`PATCH /admin/settings`) as typed values, and the one parser
//! that reads them: from a PATCH body, from the data directory's file and from the
//! fleet's Redis hash alike. Each value is parsed with the bounds of the variable it
//! overrides (`config/vars.rs`); a value that variable would silently correct (a ceiling of
//! 0) is refused here instead: an operator's explicit change is never rewritten.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::admission::ceiling::PolicyOverride;
use crate::admission::fair::FairOverride;
use crate::config::vars::{self, Kind, Var};
use crate::config::{ForceBackend, Fraction};
use crate::domain::QueueName;
use sendgate_wire::{FieldError, MAX_FIELD_ERRORS};

/// One overridable value of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QueueField {
    MaxQueueDepth,
    FailClosed,
    FailClosedStreak,
    DepthTtlMs,
    ShedAtSheddable,
    ShedAtDefault,
    FairShareAt,
}

impl QueueField {
    pub const ALL: [QueueField; 7] = [
        Self::MaxQueueDepth,
        Self::FailClosed,
        Self::FailClosedStreak,
        Self::DepthTtlMs,
        Self::ShedAtSheddable,
        Self::ShedAtDefault,
        Self::FairShareAt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::MaxQueueDepth => "max_queue_depth",
            Self::FailClosed => "fail_closed",
            Self::FailClosedStreak => "fail_closed_streak",
            Self::DepthTtlMs => "depth_ttl_ms",
            Self::ShedAtSheddable => "shed_at_sheddable",
            Self::ShedAtDefault => "shed_at_default",
            Self::FairShareAt => "fair_share_at",
        }
    }

    /// The variable whose value this overrides (its default is the override's default).
    pub fn variable(self) -> &'static Var {
        match self {
            Self::MaxQueueDepth => &vars::SERVICEBUS_SEND_MAX_QUEUE_DEPTH,
            Self::FailClosed => &vars::SERVICEBUS_SEND_FAILCLOSED,
            Self::FailClosedStreak => &vars::SERVICEBUS_SEND_FAILCLOSED_STREAK,
            Self::DepthTtlMs => &vars::DEPTH_TTL_MS,
            Self::ShedAtSheddable => &vars::SHED_AT_SHEDDABLE,
            Self::ShedAtDefault => &vars::SHED_AT_DEFAULT,
            Self::FairShareAt => &vars::FAIR_SHARE_AT,
        }
    }

    fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

pub const FORCE_BACKEND: &str = "force_backend";

/// Who set a value (the API key's name, `open` without keys), when (RFC 3339), and the
/// variable's value it was made against (`None` when stored by a build that did not keep
/// it): a start-up with another value drops it under `SENDGATE_OVERRIDES_LAPSE=config_change`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub by: String,
    pub at: String,
    pub configured: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamped<T> {
    pub value: T,
    pub stamp: Stamp,
}

/// One queue's overrides; `None` = the variable's value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueOverrides {
    pub max_queue_depth: Option<Stamped<u64>>,
    pub fail_closed: Option<Stamped<bool>>,
    pub fail_closed_streak: Option<Stamped<u32>>,
    pub depth_ttl_ms: Option<Stamped<u64>>,
    pub shed_at_sheddable: Option<Stamped<Fraction>>,
    pub shed_at_default: Option<Stamped<Fraction>>,
    pub fair_share_at: Option<Stamped<Fraction>>,
}

impl QueueOverrides {
    pub fn is_empty(&self) -> bool {
        self.max_queue_depth.is_none()
            && self.fail_closed.is_none()
            && self.fail_closed_streak.is_none()
            && self.depth_ttl_ms.is_none()
            && self.shed_at_sheddable.is_none()
            && self.shed_at_default.is_none()
            && self.fair_share_at.is_none()
    }

    /// What the queue's gates put on top of the variables' fair policy.
    pub fn fair(&self) -> FairOverride {
        FairOverride {
            share_at: self.fair_share_at.as_ref().map(|s| s.value),
            shed_at_sheddable: self.shed_at_sheddable.as_ref().map(|s| s.value),
            shed_at_default: self.shed_at_default.as_ref().map(|s| s.value),
        }
    }

    /// What the queue's gates put on top of the variables' policy.
    pub fn policy(&self) -> PolicyOverride {
        PolicyOverride {
            limit: self.max_queue_depth.as_ref().map(|s| s.value),
            fail_closed: self.fail_closed.as_ref().map(|s| s.value),
            streak_threshold: self.fail_closed_streak.as_ref().map(|s| s.value),
            ttl: self
                .depth_ttl_ms
                .as_ref()
                .map(|s| Duration::from_millis(s.value)),
        }
    }

    /// The override of `field` as JSON, with its stamp.
    pub fn get(&self, field: QueueField) -> Option<(Value, &Stamp)> {
        match field {
            QueueField::MaxQueueDepth => self
                .max_queue_depth
                .as_ref()
                .map(|s| (Value::from(s.value), &s.stamp)),
            QueueField::FailClosed => self
                .fail_closed
                .as_ref()
                .map(|s| (Value::from(s.value), &s.stamp)),
            QueueField::FailClosedStreak => self
                .fail_closed_streak
                .as_ref()
                .map(|s| (Value::from(s.value), &s.stamp)),
            QueueField::DepthTtlMs => self
                .depth_ttl_ms
                .as_ref()
                .map(|s| (Value::from(s.value), &s.stamp)),
            QueueField::ShedAtSheddable => fraction_json(&self.shed_at_sheddable),
            QueueField::ShedAtDefault => fraction_json(&self.shed_at_default),
            QueueField::FairShareAt => fraction_json(&self.fair_share_at),
        }
    }

    fn set(&mut self, value: Parsed, stamp: Stamp) {
        match value {
            Parsed::Depth(value) => self.max_queue_depth = Some(Stamped { value, stamp }),
            Parsed::Flag(value) => self.fail_closed = Some(Stamped { value, stamp }),
            Parsed::Streak(value) => self.fail_closed_streak = Some(Stamped { value, stamp }),
            Parsed::TtlMs(value) => self.depth_ttl_ms = Some(Stamped { value, stamp }),
            Parsed::Level(field, value) => {
                let slot = match field {
                    LevelField::ShedAtSheddable => &mut self.shed_at_sheddable,
                    LevelField::ShedAtDefault => &mut self.shed_at_default,
                    LevelField::FairShareAt => &mut self.fair_share_at,
                };
                *slot = Some(Stamped { value, stamp });
            }
            Parsed::Force(_) => {}
        }
    }

    fn clear(&mut self, field: QueueField) {
        match field {
            QueueField::MaxQueueDepth => self.max_queue_depth = None,
            QueueField::FailClosed => self.fail_closed = None,
            QueueField::FailClosedStreak => self.fail_closed_streak = None,
            QueueField::DepthTtlMs => self.depth_ttl_ms = None,
            QueueField::ShedAtSheddable => self.shed_at_sheddable = None,
            QueueField::ShedAtDefault => self.shed_at_default = None,
            QueueField::FairShareAt => self.fair_share_at = None,
        }
    }
}

fn fraction_json(slot: &Option<Stamped<Fraction>>) -> Option<(Value, &Stamp)> {
    slot.as_ref()
        .map(|s| (Value::from(s.value.get()), &s.stamp))
}

/// Every override in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub queues: BTreeMap<QueueName, QueueOverrides>,
    pub force_backend: Option<Stamped<ForceBackend>>,
}

/// What the parser needs to know of this gateway.
#[derive(Debug, Clone)]
pub struct Scope {
    pub queues: Vec<QueueName>,
    pub has_fallback: bool,
}

/// One change of a PATCH: absent (keep), `null` (remove the override), or a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<T> {
    Clear,
    Set(T),
}

/// A parsed value, of the field it was parsed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    Depth(u64),
    Flag(bool),
    Streak(u32),
    TtlMs(u64),
    /// A fraction of the ceiling, for one of the fair policy's levels.
    Level(LevelField, Fraction),
    Force(ForceBackend),
}

/// The fair policy's fields a queue may override (each a [`QueueField`] too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelField {
    ShedAtSheddable,
    ShedAtDefault,
    FairShareAt,
}

/// Where a change applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Queue(QueueName, QueueField),
    ForceBackend,
}

impl Key {
    /// The flat name: `queues.{queue}.{field}` or `force_backend` (the file's and the Redis
    /// hash's field names, and what `/health/detailed` calls the setting).
    pub fn flat(&self) -> String {
        match self {
            Self::Queue(queue, field) => format!("queues.{queue}.{}", field.name()),
            Self::ForceBackend => FORCE_BACKEND.to_owned(),
        }
    }

    pub fn variable(&self) -> &'static Var {
        match self {
            Self::Queue(_, field) => field.variable(),
            Self::ForceBackend => &vars::FORCE_BACKEND,
        }
    }

    /// The flat name read back; `None` for a name that is no setting. A queue this gateway
    /// does not serve is still a key (a fleet's other replicas may serve it).
    pub fn parse_flat(name: &str) -> Option<Self> {
        if name == FORCE_BACKEND {
            return Some(Self::ForceBackend);
        }
        let (queue, field) = name.strip_prefix("queues.")?.rsplit_once('.')?;
        Some(Self::Queue(
            QueueName::parse(queue).ok()?,
            QueueField::named(field)?,
        ))
    }
}

/// A PATCH body, parsed: every change, in key order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    pub changes: BTreeMap<Key, Change<Parsed>>,
    /// Every queue the body names, with or without fields: a key's scope must cover each.
    pub queues: BTreeSet<QueueName>,
}

/// Why a PATCH body is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("the request names a queue this gateway does not serve: {0}")]
    UnknownQueue(String),
    #[error("the request is not valid")]
    Invalid(Vec<FieldError>),
}

const QUEUE_FIELDS: &str = "max_queue_depth, fail_closed, fail_closed_streak, depth_ttl_ms, \
                            shed_at_sheddable, shed_at_default or fair_share_at";

impl Patch {
    /// `{"queues": {"<queue>": {"<field>": value | null, ...}}, "force_backend": value | null}`.
    /// Every bad field is named (up to [`MAX_FIELD_ERRORS`]); a queue that is not served is
    /// [`PatchError::UnknownQueue`] (the send route's 404).
    pub fn parse(body: &Value, scope: &Scope) -> Result<Self, PatchError> {
        let Some(top) = body.as_object() else {
            return Err(PatchError::Invalid(vec![FieldError::new(
                &["body"],
                "expected a JSON object",
            )]));
        };
        let mut reading = Reading {
            scope,
            patch: Patch::default(),
            errors: Vec::new(),
        };
        for (name, value) in top {
            match name.as_str() {
                "queues" => reading.queues(value)?,
                FORCE_BACKEND => reading.set(Key::ForceBackend, value, &["body", FORCE_BACKEND]),
                other => reading.errors.push(FieldError::new(
                    &["body", other],
                    "unknown field; expected queues or force_backend",
                )),
            }
        }
        reading.finish()
    }
}

/// A PATCH body being read: the changes so far and every bad field met.
struct Reading<'a> {
    scope: &'a Scope,
    patch: Patch,
    errors: Vec<FieldError>,
}

impl Reading<'_> {
    /// `"queues": {"<queue>": {...}, ...}`: a queue this gateway does not serve ends the
    /// reading.
    fn queues(&mut self, value: &Value) -> Result<(), PatchError> {
        let Some(queues) = value.as_object() else {
            self.errors.push(FieldError::new(
                &["body", "queues"],
                "expected an object of queue names",
            ));
            return Ok(());
        };
        for (queue_name, fields) in queues {
            let scope = self.scope;
            let Some(queue) = scope.queues.iter().find(|q| q.as_str() == queue_name) else {
                return Err(PatchError::UnknownQueue(queue_name.clone()));
            };
            self.patch.queues.insert(queue.clone());
            self.queue_fields(queue, queue_name, fields);
        }
        Ok(())
    }

    /// One queue's `{"<field>": value | null, ...}`.
    fn queue_fields(&mut self, queue: &QueueName, queue_name: &str, fields: &Value) {
        let Some(fields) = fields.as_object() else {
            self.errors.push(FieldError::new(
                &["body", "queues", queue_name],
                format!("expected an object of {QUEUE_FIELDS}"),
            ));
            return;
        };
        for (field_name, value) in fields {
            let loc = ["body", "queues", queue_name, field_name.as_str()];
            match QueueField::named(field_name) {
                Some(field) => self.set(Key::Queue(queue.clone(), field), value, &loc),
                None => self.errors.push(FieldError::new(
                    &loc,
                    format!("unknown field; expected {QUEUE_FIELDS}"),
                )),
            }
        }
    }

    /// `key`'s change, or the error at `loc`.
    fn set(&mut self, key: Key, value: &Value, loc: &[&str]) {
        match change(&key, value, self.scope) {
            Ok(c) => {
                self.patch.changes.insert(key, c);
            }
            Err(msg) => self.errors.push(FieldError::new(loc, msg)),
        }
    }

    fn finish(mut self) -> Result<Patch, PatchError> {
        if self.errors.is_empty() {
            Ok(self.patch)
        } else {
            self.errors.truncate(MAX_FIELD_ERRORS);
            Err(PatchError::Invalid(self.errors))
        }
    }
}

fn change(key: &Key, value: &Value, scope: &Scope) -> Result<Change<Parsed>, String> {
    if value.is_null() {
        return Ok(Change::Clear);
    }
    parse_value(key, value, scope).map(Change::Set)
}

/// One value for `key`, within its variable's bounds.
pub fn parse_value(key: &Key, value: &Value, scope: &Scope) -> Result<Parsed, String> {
    let var = key.variable();
    match key {
        Key::Queue(_, QueueField::MaxQueueDepth) => {
            whole(value, var, 1, u64::MAX, "").map(Parsed::Depth)
        }
        Key::Queue(_, QueueField::FailClosedStreak) => {
            whole(value, var, 1, u64::from(u32::MAX), "").map(|n| Parsed::Streak(n as u32))
        }
        Key::Queue(_, QueueField::DepthTtlMs) => {
            let Kind::Duration { min, max } = var.kind else {
                return Err(format!("{} is not declared as a duration", var.name));
            };
            whole(value, var, min, max, " ms").map(Parsed::TtlMs)
        }
        Key::Queue(_, QueueField::FailClosed) => value
            .as_bool()
            .map(Parsed::Flag)
            .ok_or_else(|| format!("expected true or false (as {})", var.name)),
        Key::Queue(_, QueueField::ShedAtSheddable) => {
            level(value, var, LevelField::ShedAtSheddable)
        }
        Key::Queue(_, QueueField::ShedAtDefault) => level(value, var, LevelField::ShedAtDefault),
        Key::Queue(_, QueueField::FairShareAt) => level(value, var, LevelField::FairShareAt),
        Key::ForceBackend => force_backend(value, var, scope),
    }
}

/// A whole number within `[min, max]` (`unit` for the message).
fn whole(value: &Value, var: &Var, min: u64, max: u64, unit: &str) -> Result<u64, String> {
    let n = value
        .as_u64()
        .ok_or_else(|| format!("expected a whole number (as {})", var.name))?;
    if n < min {
        return Err(format!("must be at least {min}{unit} (as {})", var.name));
    }
    if n > max {
        return Err(format!("must be at most {max}{unit} (as {})", var.name));
    }
    Ok(n)
}

/// A level of the backlog: a number above 0 and at most 1.
fn level(value: &Value, var: &Var, level: LevelField) -> Result<Parsed, String> {
    value
        .as_f64()
        .and_then(Fraction::new)
        .map(|f| Parsed::Level(level, f))
        .ok_or_else(|| format!("expected a number above 0 and at most 1 (as {})", var.name))
}

/// `primary` or `fallback` (any case); `fallback` only with a fallback backend.
fn force_backend(value: &Value, var: &Var, scope: &Scope) -> Result<Parsed, String> {
    let Kind::Choice(options) = var.kind else {
        return Err(format!("{} is not declared as a choice", var.name));
    };
    let expected = || {
        format!(
            "expected {} (as {})",
            crate::config::one_of(options),
            var.name
        )
    };
    let word = value.as_str().ok_or_else(expected)?;
    match options.iter().find(|o| o.eq_ignore_ascii_case(word)) {
        Some(&"fallback") if !scope.has_fallback => {
            Err("fallback needs SENDGATE_FALLBACK_BACKEND".to_owned())
        }
        Some(&"fallback") => Ok(Parsed::Force(ForceBackend::Fallback)),
        Some(_) => Ok(Parsed::Force(ForceBackend::Primary)),
        None => Err(expected()),
    }
}

pub fn force_word(f: ForceBackend) -> &'static str {
    match f {
        ForceBackend::Primary => "primary",
        ForceBackend::Fallback => "fallback",
    }
}

/// One change made, for the `settings_changed` log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub key: Key,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

impl Overrides {
    /// The override of `key`, as JSON with its stamp.
    pub fn get(&self, key: &Key) -> Option<(Value, &Stamp)> {
        match key {
            Key::Queue(queue, field) => self.queues.get(queue)?.get(*field),
            Key::ForceBackend => self
                .force_backend
                .as_ref()
                .map(|s| (Value::from(force_word(s.value)), &s.stamp)),
        }
    }

    /// Apply `patch` as `stamp`'s change; returns what actually changed (a value set to
    /// what it already was is no change, and keeps its first stamp).
    pub fn apply(&mut self, patch: &Patch, stamp: &Stamp) -> Vec<Changed> {
        let mut changed = Vec::new();
        for (key, change) in &patch.changes {
            let old = self.get(key).map(|(v, _)| v);
            match change {
                Change::Clear => self.remove(key),
                Change::Set(value) => {
                    if old.as_ref() == Some(&parsed_json(*value)) {
                        continue;
                    }
                    self.insert(key, *value, stamp.clone());
                }
            }
            let new = self.get(key).map(|(v, _)| v);
            if old != new {
                changed.push(Changed {
                    key: key.clone(),
                    old,
                    new,
                });
            }
        }
        changed
    }

    fn insert(&mut self, key: &Key, value: Parsed, stamp: Stamp) {
        match (key, value) {
            (Key::ForceBackend, Parsed::Force(value)) => {
                self.force_backend = Some(Stamped { value, stamp })
            }
            (Key::Queue(queue, _), value) => {
                self.queues
                    .entry(queue.clone())
                    .or_default()
                    .set(value, stamp);
            }
            (Key::ForceBackend, _) => {}
        }
    }

    /// Every key with an override, in key order.
    pub fn keys(&self) -> Vec<Key> {
        self.queues
            .iter()
            .flat_map(|(q, o)| {
                QueueField::ALL
                    .into_iter()
                    .filter(|f| o.get(*f).is_some())
                    .map(|f| Key::Queue(q.clone(), f))
            })
            .chain(self.force_backend.as_ref().map(|_| Key::ForceBackend))
            .collect()
    }

    /// Record the variable's value `key`'s override was made against.
    pub fn made_against(&mut self, key: &Key, configured: Value) {
        if let Some(stamp) = self.stamp_mut(key) {
            stamp.configured = Some(configured);
        }
    }

    fn stamp_mut(&mut self, key: &Key) -> Option<&mut Stamp> {
        match key {
            Key::ForceBackend => self.force_backend.as_mut().map(|s| &mut s.stamp),
            Key::Queue(queue, field) => {
                let q = self.queues.get_mut(queue)?;
                match field {
                    QueueField::MaxQueueDepth => q.max_queue_depth.as_mut().map(|s| &mut s.stamp),
                    QueueField::FailClosed => q.fail_closed.as_mut().map(|s| &mut s.stamp),
                    QueueField::FailClosedStreak => {
                        q.fail_closed_streak.as_mut().map(|s| &mut s.stamp)
                    }
                    QueueField::DepthTtlMs => q.depth_ttl_ms.as_mut().map(|s| &mut s.stamp),
                    QueueField::ShedAtSheddable => {
                        q.shed_at_sheddable.as_mut().map(|s| &mut s.stamp)
                    }
                    QueueField::ShedAtDefault => q.shed_at_default.as_mut().map(|s| &mut s.stamp),
                    QueueField::FairShareAt => q.fair_share_at.as_mut().map(|s| &mut s.stamp),
                }
            }
        }
    }

    /// Drop `key`'s override.
    pub fn remove(&mut self, key: &Key) {
        match key {
            Key::ForceBackend => self.force_backend = None,
            Key::Queue(queue, field) => {
                if let Some(q) = self.queues.get_mut(queue) {
                    q.clear(*field);
                    if q.is_empty() {
                        self.queues.remove(queue);
                    }
                }
            }
        }
    }

    /// Every override, by its flat name: the file's body and the Redis hash's fields.
    pub fn to_flat(&self) -> BTreeMap<String, StoredValue> {
        let mut flat = BTreeMap::new();
        let keys = self
            .queues
            .keys()
            .flat_map(|q| QueueField::ALL.map(|f| Key::Queue(q.clone(), f)))
            .chain(std::iter::once(Key::ForceBackend));
        for key in keys {
            if let Some((value, stamp)) = self.get(&key) {
                flat.insert(
                    key.flat(),
                    StoredValue {
                        value,
                        by: stamp.by.clone(),
                        at: stamp.at.clone(),
                        configured: stamp.configured.clone(),
                    },
                );
            }
        }
        flat
    }

    /// Overrides read back from their flat form, each value through the PATCH parser.
    /// Entries for a queue this gateway does not serve are skipped (`skipped`), so are
    /// names that are no setting; a value out of bounds is an error naming it.
    pub fn from_flat(
        flat: &BTreeMap<String, StoredValue>,
        scope: &Scope,
    ) -> Result<(Self, Vec<String>), String> {
        Self::from_flat_with(flat, scope, Strictness::Strict)
    }

    /// [`Overrides::from_flat`] for the fleet's shared hash: a value this replica cannot take
    /// (written by a newer build, or `force_backend = fallback` from a replica that has one)
    /// is skipped like a queue it does not serve, instead of failing the whole read — which
    /// would freeze this replica's settings, and refuse the PATCH that could repair them.
    pub fn from_flat_lenient(
        flat: &BTreeMap<String, StoredValue>,
        scope: &Scope,
    ) -> (Self, Vec<String>) {
        // A lenient read has nothing to fail on: every value it cannot take is skipped.
        Self::from_flat_with(flat, scope, Strictness::Lenient)
            .unwrap_or_else(|_| (Overrides::default(), Vec::new()))
    }

    fn from_flat_with(
        flat: &BTreeMap<String, StoredValue>,
        scope: &Scope,
        strictness: Strictness,
    ) -> Result<(Self, Vec<String>), String> {
        let mut overrides = Overrides::default();
        let mut skipped = Vec::new();
        for (name, stored) in flat {
            let Some(key) = Key::parse_flat(name) else {
                skipped.push(name.clone());
                continue;
            };
            if let Key::Queue(queue, _) = &key {
                if !scope.queues.contains(queue) {
                    skipped.push(name.clone());
                    continue;
                }
            }
            let value = match parse_value(&key, &stored.value, scope) {
                Ok(value) => value,
                Err(_) if strictness == Strictness::Lenient => {
                    skipped.push(name.clone());
                    continue;
                }
                Err(e) => return Err(format!("{name}: {e}")),
            };
            overrides.insert(
                &key,
                value,
                Stamp {
                    by: stored.by.clone(),
                    at: stored.at.clone(),
                    configured: stored.configured.clone(),
                },
            );
        }
        Ok((overrides, skipped))
    }
}

fn parsed_json(value: Parsed) -> Value {
    match value {
        Parsed::Depth(n) | Parsed::TtlMs(n) => Value::from(n),
        Parsed::Streak(n) => Value::from(n),
        Parsed::Flag(b) => Value::from(b),
        Parsed::Level(_, f) => Value::from(f.get()),
        Parsed::Force(f) => Value::from(force_word(f)),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strictness {
    /// A value that does not parse fails the read (the data directory's file).
    Strict,
    /// It is skipped (the fleet's shared hash).
    Lenient,
}

/// One override as stored: the value, who set it, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredValue {
    pub value: Value,
    pub by: String,
    pub at: String,
    /// The variable's value when the override was made (absent from what older builds stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope(has_fallback: bool) -> Scope {
        Scope {
            queues: vec![
                QueueName::parse("requests").unwrap(),
                QueueName::parse("audit.v1").unwrap(),
            ],
            has_fallback,
        }
    }

    fn q(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    fn invalid(body: Value) -> Vec<FieldError> {
        match Patch::parse(&body, &scope(false)) {
            Err(PatchError::Invalid(errors)) => errors,
            other => panic!("expected 400, got {other:?}"),
        }
    }

    #[test]
    fn a_patch_sets_clears_and_keeps() {
        let p = Patch::parse(
            &json!({"queues": {"requests": {"max_queue_depth": 10, "fail_closed": null}},
                    "force_backend": "PRIMARY"}),
            &scope(false),
        )
        .unwrap();
        assert_eq!(
            p.changes,
            BTreeMap::from([
                (
                    Key::Queue(q("requests"), QueueField::MaxQueueDepth),
                    Change::Set(Parsed::Depth(10))
                ),
                (
                    Key::Queue(q("requests"), QueueField::FailClosed),
                    Change::Clear
                ),
                (
                    Key::ForceBackend,
                    Change::Set(Parsed::Force(ForceBackend::Primary))
                ),
            ])
        );
        assert_eq!(
            Patch::parse(&json!({}), &scope(false)).unwrap(),
            Patch::default()
        );
    }

    #[test]
    fn every_bad_field_is_named_with_its_variables_bound() {
        let errors = invalid(json!({
            "queues": {"requests": {
                "max_queue_depth": 0,
                "fail_closed": "yes",
                "fail_closed_streak": 2.5,
                "depth_ttl_ms": 3_600_001,
                "ceiling": 5
            }},
            "force_backend": "fallback",
            "colour": "red"
        }));
        let at = |field: &str| {
            errors
                .iter()
                .find(|e| e.loc.last().and_then(|l| l.as_str()) == Some(field))
                .unwrap_or_else(|| panic!("no error for {field}: {errors:?}"))
                .msg
                .clone()
        };
        assert_eq!(errors.len(), 7, "{errors:?}");
        assert!(at("max_queue_depth").contains("at least 1"));
        assert!(at("max_queue_depth").contains("SERVICEBUS_SEND_MAX_QUEUE_DEPTH"));
        assert!(at("fail_closed").contains("true or false"));
        assert!(at("fail_closed_streak").contains("whole number"));
        assert!(at("depth_ttl_ms").contains("at most 3600000 ms"));
        assert!(at("ceiling").contains("unknown field"));
        assert!(at("force_backend").contains("SENDGATE_FALLBACK_BACKEND"));
        assert!(at("colour").contains("unknown field"));
        assert_eq!(
            errors[0].loc.first().and_then(|l| l.as_str()),
            Some("body"),
            "{errors:?}"
        );
    }

    #[test]
    fn the_bounds_themselves_are_accepted() {
        let p = Patch::parse(
            &json!({"queues": {"audit.v1": {"max_queue_depth": 1, "fail_closed_streak": 4_294_967_295_u64,
                                             "depth_ttl_ms": 0}}}),
            &scope(true),
        )
        .unwrap();
        assert_eq!(p.changes.len(), 3);
        assert!(invalid(
            json!({"queues": {"requests": {"fail_closed_streak": 4_294_967_296_u64}}})
        )[0]
        .msg
        .contains("at most"));
        assert!(
            invalid(json!({"queues": {"requests": {"max_queue_depth": -1}}}))[0]
                .msg
                .contains("whole number")
        );
    }

    #[test]
    fn an_unknown_queue_is_its_own_error_and_shapes_are_checked() {
        assert_eq!(
            Patch::parse(&json!({"queues": {"nope": {}}}), &scope(false)),
            Err(PatchError::UnknownQueue("nope".into()))
        );
        assert_eq!(invalid(json!([1]))[0].loc, ["body"]);
        assert_eq!(invalid(json!({"queues": 3}))[0].loc, ["body", "queues"]);
        assert_eq!(
            invalid(json!({"queues": {"requests": true}}))[0].loc,
            ["body", "queues", "requests"]
        );
    }

    fn stamp(by: &str) -> Stamp {
        Stamp {
            by: by.into(),
            at: "2026-12-01T08:00:00Z".into(),
            configured: None,
        }
    }

    #[test]
    fn applying_reports_old_and_new_and_null_restores_the_default() {
        let mut o = Overrides::default();
        let set = Patch::parse(
            &json!({"queues": {"requests": {"max_queue_depth": 10}}}),
            &scope(false),
        )
        .unwrap();
        let changed = o.apply(&set, &stamp("ops"));
        assert_eq!(
            changed,
            [Changed {
                key: Key::Queue(q("requests"), QueueField::MaxQueueDepth),
                old: None,
                new: Some(json!(10)),
            }]
        );
        assert_eq!(o.queues[&q("requests")].policy().limit, Some(10));
        assert!(
            o.apply(&set, &stamp("other")).is_empty(),
            "the same value again is no change"
        );
        assert_eq!(
            o.queues[&q("requests")]
                .max_queue_depth
                .as_ref()
                .unwrap()
                .stamp
                .by,
            "ops",
            "and keeps its first stamp"
        );
        let clear = Patch::parse(
            &json!({"queues": {"requests": {"max_queue_depth": null}}}),
            &scope(false),
        )
        .unwrap();
        let changed = o.apply(&clear, &stamp("ops"));
        assert_eq!(changed[0].old, Some(json!(10)));
        assert_eq!(changed[0].new, None);
        assert_eq!(o, Overrides::default());
    }

    #[test]
    fn a_queues_fair_levels_are_fractions_and_reach_its_fair_override() {
        let p = Patch::parse(
            &json!({"queues": {"requests": {"shed_at_sheddable": 0.5, "shed_at_default": 1,
                                             "fair_share_at": 0.75}}}),
            &scope(false),
        )
        .unwrap();
        let mut o = Overrides::default();
        let changed = o.apply(&p, &stamp("ops"));
        assert_eq!(changed.len(), 3);
        let fair = o.queues[&q("requests")].fair();
        assert_eq!(fair.shed_at_sheddable, Fraction::new(0.5));
        assert_eq!(fair.shed_at_default, Fraction::new(1.0));
        assert_eq!(fair.share_at, Fraction::new(0.75));
        assert_eq!(
            o.queues[&q("requests")].policy(),
            PolicyOverride::default(),
            "nothing of the ceiling's policy"
        );
        let (back, _) = Overrides::from_flat(&o.to_flat(), &scope(false)).unwrap();
        assert_eq!(back, o, "the flat form round-trips");
        let errors = invalid(json!({"queues": {"requests": {
            "shed_at_sheddable": 0, "shed_at_default": 1.01, "fair_share_at": "high"}}}));
        assert_eq!(errors.len(), 3, "{errors:?}");
        for e in &errors {
            assert!(e.msg.contains("above 0 and at most 1"), "{e:?}");
        }
        assert!(errors
            .iter()
            .any(|e| e.msg.contains("SENDGATE_SHED_AT_SHEDDABLE")));
        let clear = Patch::parse(
            &json!({"queues": {"requests": {"shed_at_sheddable": null, "shed_at_default": null,
                                             "fair_share_at": null}}}),
            &scope(false),
        )
        .unwrap();
        o.apply(&clear, &stamp("ops"));
        assert_eq!(o, Overrides::default());
    }

    #[test]
    fn the_flat_form_round_trips_and_is_checked_on_the_way_back() {
        let mut o = Overrides::default();
        let p = Patch::parse(
            &json!({"queues": {"audit.v1": {"depth_ttl_ms": 250, "fail_closed": true}},
                    "force_backend": "fallback"}),
            &scope(true),
        )
        .unwrap();
        o.apply(&p, &stamp("ops"));
        let flat = o.to_flat();
        assert_eq!(
            flat.keys().collect::<Vec<_>>(),
            [
                "force_backend",
                "queues.audit.v1.fail_closed",
                "queues.audit.v1.depth_ttl_ms"
            ]
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
        );
        let (back, skipped) = Overrides::from_flat(&flat, &scope(true)).unwrap();
        assert_eq!(back, o);
        assert!(skipped.is_empty());

        let mut other = flat.clone();
        other.insert(
            "queues.gone.max_queue_depth".into(),
            StoredValue {
                value: json!(5),
                by: "x".into(),
                at: "y".into(),
                configured: None,
            },
        );
        let (_, skipped) = Overrides::from_flat(&other, &scope(true)).unwrap();
        assert_eq!(skipped, ["queues.gone.max_queue_depth"]);

        let mut bad = flat;
        bad.insert(
            "queues.requests.max_queue_depth".into(),
            StoredValue {
                value: json!(0),
                by: "x".into(),
                at: "y".into(),
                configured: None,
            },
        );
        let error = Overrides::from_flat(&bad, &scope(true)).unwrap_err();
        assert!(
            error.starts_with("queues.requests.max_queue_depth: must be at least 1"),
            "{error}"
        );
        // The fleet's hash: the bad value is skipped, the good ones still apply (review:
        // one unreadable field froze every replica's settings and refused the repair).
        let (lenient, skipped) = Overrides::from_flat_lenient(&bad, &scope(true));
        assert_eq!(skipped, ["queues.requests.max_queue_depth"]);
        assert_ne!(
            lenient,
            Overrides::default(),
            "the other values still apply"
        );
        // force_backend = fallback, written by a replica that has one, read by one without.
        let pinned = BTreeMap::from([(
            "force_backend".to_owned(),
            StoredValue {
                value: json!("fallback"),
                by: "x".into(),
                at: "y".into(),
                configured: None,
            },
        )]);
        assert!(Overrides::from_flat(&pinned, &scope(false)).is_err());
        let (_, skipped) = Overrides::from_flat_lenient(&pinned, &scope(false));
        assert_eq!(skipped, ["force_backend"]);
    }
}
