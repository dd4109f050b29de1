//! The merged layers (built-in defaults < `SENDGATE_CONFIG` file < environment) and the
//! typed getters every setting is read through.
//!
//! Only declared variables are stored, and a getter takes a descriptor, not a name: a
//! setting cannot be read under a name that is not in [`VARIABLES`]. An empty value counts
//! as unset in its layer.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::error::{closest, ConfigError};
use super::secret::Secret;
use super::vars::{self, Kind, Side, Unit, Var, VARIABLES};

pub struct Layers {
    values: HashMap<&'static str, String>,
    /// The variables a layer gave with an empty value (unset in that layer): for the few
    /// whose unset meaning is the permissive one, where an empty value must not pass for it.
    blank: std::collections::HashSet<&'static str>,
}

impl Layers {
    pub fn build(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::build_with(env, |path| {
            std::fs::read_to_string(path)
                .map_err(|e| ConfigError::File(format!("cannot read {path}: {e}")))
        })
    }

    /// [`Layers::build`] with the file named by `SENDGATE_CONFIG` read by `read`: the
    /// parse is pure, so the fuzz target and its corpus replay give the text directly.
    pub fn build_with(
        env: &HashMap<String, String>,
        read: impl FnOnce(&str) -> Result<String, ConfigError>,
    ) -> Result<Self, ConfigError> {
        refuse_unknown_variables(env)?;
        let server = || VARIABLES.iter().filter(|v| v.side == Side::Server);
        let mut builder = config::Config::builder();
        if let Some(path) = env.get(vars::CONFIG.name).filter(|p| !p.trim().is_empty()) {
            let text = read(path)?;
            check_toml(path, &text)?;
            builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
        }
        let mut blank = std::collections::HashSet::new();
        for v in server() {
            match env.get(v.name) {
                Some(value) if !value.trim().is_empty() => {
                    builder = builder
                        .set_override(v.toml_key(), value.as_str())
                        .map_err(|e| ConfigError::File(e.to_string()))?;
                }
                Some(_) => {
                    blank.insert(v.name);
                }
                None => {}
            }
        }
        let table: HashMap<String, config::Value> = builder
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| ConfigError::File(e.to_string()))?;

        let mut values = HashMap::new();
        for (key, value) in table {
            let Some(v) = server().find(|v| v.toml_key() == key) else {
                let keys: Vec<String> = server().map(|v| v.toml_key()).collect();
                let suggestion = closest(&key, keys.iter().map(String::as_str)).map(str::to_owned);
                return Err(ConfigError::UnknownKey { key, suggestion });
            };
            let text = match value.kind {
                // `queues = ["a", "b"]` in the file reads like SENDGATE_QUEUES=a,b.
                config::ValueKind::Array(items) => items
                    .into_iter()
                    .map(|i| i.into_string().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(","),
                config::ValueKind::Nil => continue,
                other => config::Value::new(None, other)
                    .into_string()
                    .map_err(|e| ConfigError::other(v, e.to_string()))?,
            };
            if text.trim().is_empty() {
                blank.insert(v.name);
            }
            values.insert(v.name, text);
        }
        // The OpenTelemetry specification's variables come from the environment alone.
        for v in VARIABLES.iter().filter(|v| v.side == Side::OpenTelemetry) {
            if let Some(value) = env.get(v.name).filter(|s| !s.trim().is_empty()) {
                values.insert(v.name, value.clone());
            }
        }
        Ok(Self { values, blank })
    }

    /// The value set in the file or the environment, trimmed; `None` when unset.
    pub fn raw(&self, var: &'static Var) -> Option<&str> {
        self.values
            .get(var.name)
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
    }

    /// Whether the file or the environment sets `var`.
    pub fn is_set(&self, var: &'static Var) -> bool {
        self.raw(var).is_some()
    }

    /// Whether the file or the environment gives `var` with an empty value (so it reads as
    /// unset, unless another layer sets it).
    pub fn is_given_empty(&self, var: &'static Var) -> bool {
        self.blank.contains(var.name)
    }

    /// The value set, or the declared default.
    pub fn value(&self, var: &'static Var) -> Option<&str> {
        self.raw(var).or(var.default)
    }

    pub fn text(&self, var: &'static Var) -> Option<String> {
        self.value(var).map(str::to_owned)
    }

    pub fn path(&self, var: &'static Var) -> Option<PathBuf> {
        self.value(var).map(PathBuf::from)
    }

    pub fn secret(&self, var: &'static Var) -> Option<Secret> {
        self.value(var).map(Secret::new)
    }

    /// A [`Kind::Choice`] variable: the declared option it names (any case).
    pub fn choice(&self, var: &'static Var) -> Result<Option<&'static str>, ConfigError> {
        let Kind::Choice(options) = var.kind else {
            return Err(not_of_kind(var, "a choice"));
        };
        let Some(value) = self.value(var) else {
            return Ok(None);
        };
        match options.iter().find(|o| o.eq_ignore_ascii_case(value)) {
            Some(option) => Ok(Some(option)),
            None => Err(ConfigError::invalid(
                var,
                value,
                format!("expected {}", one_of(options)),
            )),
        }
    }

    /// A [`Kind::Whole`] variable, within its bounds.
    pub fn whole(&self, var: &'static Var) -> Result<Option<u64>, ConfigError> {
        let Kind::Whole { min, max } = var.kind else {
            return Err(not_of_kind(var, "a whole number"));
        };
        self.value(var)
            .map(|value| bounded(var, value, min, max))
            .transpose()
    }

    /// A [`Kind::Whole`] variable that has a default, so always has a value.
    pub fn count(&self, var: &'static Var) -> Result<u64, ConfigError> {
        self.whole(var)?.ok_or_else(|| required(var))
    }

    /// A [`Kind::Duration`] variable that has a default, so always has a value.
    pub fn duration(&self, var: &'static Var) -> Result<Duration, ConfigError> {
        self.optional_duration(var)?.ok_or_else(|| required(var))
    }

    /// A [`Kind::Duration`] variable, within its bounds, in its unit; `None` when unset.
    pub fn optional_duration(&self, var: &'static Var) -> Result<Option<Duration>, ConfigError> {
        let Kind::Duration { min, max } = var.kind else {
            return Err(not_of_kind(var, "a duration"));
        };
        let Some(value) = self.value(var) else {
            return Ok(None);
        };
        let n = bounded(var, value, min, max)?;
        match var.unit {
            Unit::Millis => Ok(Some(Duration::from_millis(n))),
            Unit::Seconds => Ok(Some(Duration::from_secs(n))),
            Unit::None | Unit::Bytes => Err(not_of_kind(var, "a duration in ms or s")),
        }
    }

    /// A [`Kind::Fraction`] variable: above 0, at most 1.
    pub fn fraction(&self, var: &'static Var) -> Result<Fraction, ConfigError> {
        let value = self.value(var).ok_or_else(|| required(var))?;
        value.parse().ok().and_then(Fraction::new).ok_or_else(|| {
            ConfigError::invalid(var, value, "expected a number above 0 and at most 1")
        })
    }
}

/// A number above 0 and at most 1 ([`Kind::Fraction`], read by [`Layers::fraction`]);
/// never NaN, so equality is an equivalence.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Fraction(f64);

impl Eq for Fraction {}

impl Fraction {
    pub const ONE: Fraction = Fraction(1.0);

    /// `None` unless `0 < value <= 1`.
    pub fn new(value: f64) -> Option<Self> {
        (value > 0.0 && value <= 1.0).then_some(Self(value))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// The file's text, checked to be TOML here because the parser's own message quotes the
/// offending line, which may hold a secret (`rabbitmq_url = amqp://user:password@…`): the
/// error says where and why, never what.
fn check_toml(path: &str, text: &str) -> Result<(), ConfigError> {
    if let Err(e) = text.parse::<toml::Table>() {
        let at = e.span().map_or(0, |span| span.start);
        let before = &text[..at.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        return Err(ConfigError::File(format!(
            "{path}: not valid TOML at line {line}, column {column}: {}",
            e.message()
        )));
    }
    Ok(())
}

/// An unknown `SENDGATE_*` variable is a typo until proven otherwise: refuse it, as an
/// unknown file key is refused. `SERVICEBUS_*` is shared with other tools: only the
/// declared ones are read, the rest ignored.
fn refuse_unknown_variables(env: &HashMap<String, String>) -> Result<(), ConfigError> {
    let mut unknown: Vec<&String> = env
        .keys()
        .filter(|k| k.starts_with("SENDGATE_") && vars::find(k).is_none())
        .collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(name) => Err(ConfigError::UnknownVariable {
            name: (*name).clone(),
            suggestion: closest(name, VARIABLES.iter().map(|v| v.name)),
        }),
    }
}

/// Unknown `SERVICEBUS_*` variables that are a near miss of a declared one, with it:
/// they cannot stop start-up (other tools share the prefix), but are worth a warning.
pub fn servicebus_near_misses(names: impl Iterator<Item = String>) -> Vec<(String, &'static str)> {
    let mut near: Vec<(String, &'static str)> = names
        .filter(|k| k.starts_with("SERVICEBUS_") && vars::find(k).is_none())
        .filter_map(|k| closest(&k, VARIABLES.iter().map(|v| v.name)).map(|known| (k, known)))
        .collect();
    near.sort();
    near
}

fn bounded(var: &'static Var, value: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n: u64 = value
        .parse()
        .map_err(|_| ConfigError::invalid(var, value, "expected a whole number"))?;
    let unit = match var.unit {
        Unit::Millis => " ms",
        Unit::Seconds => " s",
        Unit::Bytes => " bytes",
        Unit::None => "",
    };
    if n < min {
        return Err(ConfigError::invalid(
            var,
            value,
            format!("must be at least {min}{unit}"),
        ));
    }
    if n > max {
        return Err(ConfigError::invalid(
            var,
            value,
            format!("must be at most {max}{unit}"),
        ));
    }
    Ok(n)
}

/// `a`, `a or b`, `a, b or c`.
pub fn one_of(options: &[&str]) -> String {
    match options {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

fn required(var: &'static Var) -> ConfigError {
    ConfigError::other(var, "must be set")
}

/// A getter used on a variable of another kind: a mistake in this crate, reported as a
/// setting error rather than a panic.
fn not_of_kind(var: &'static Var, wanted: &str) -> ConfigError {
    ConfigError::other(var, format!("is not declared as {wanted}"))
}
