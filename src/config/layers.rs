//! The layers, built-in defaults < `SENDGATE_CONFIG` file (TOML) < environment, stacked by
//! the `config` crate, and the typed getters every setting is read through.
//!
//! The descriptor table ([`VARIABLES`]) is the one list of names: each layer is made from
//! it (the declared defaults, the file's keys that are declared, the declared variables of
//! the environment), `config` stacks the three, and each value keeps its origin, so a value
//! set by the file or the environment stays apart from a default ([`Layers::raw`]). The
//! typing is the getters', not serde's: a variable's kind, bounds and the error that names
//! it come from its descriptor, where a serde struct would be a second list of the same
//! names answering with other messages.
//!
//! Only declared variables are stored, and a getter takes a descriptor, not a name: a
//! setting cannot be read under a name that is not in [`VARIABLES`]. An empty value counts
//! as unset in its layer: it is left out of the layer before the stacking.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use config::{Format, Source};

use super::error::{closest, ConfigError};
use super::secret::Secret;
use super::vars::{self, Kind, Side, Unit, Var, VARIABLES};

pub struct Layers {
    /// Every declared variable with a value in some layer, trimmed.
    values: HashMap<&'static str, Stacked>,
    /// The variables a layer gave with an empty value (unset in that layer): for the few
    /// whose unset meaning is the permissive one, where an empty value must not pass for it.
    blank: HashSet<&'static str>,
}

/// A variable's value after the stacking, and whether the file or the environment gave it
/// (else it is the declared default).
struct Stacked {
    text: String,
    set: bool,
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
        let mut blank = HashSet::new();
        let file = match env.get(vars::CONFIG.name).filter(|p| !p.trim().is_empty()) {
            Some(path) => Some(file_layer(path, &read(path)?, &mut blank)?),
            None => None,
        };
        let environment = environment_layer(env, &mut blank);
        let stacked = stack(file, environment)?;
        let values = VARIABLES
            .iter()
            .filter_map(|v| {
                let value = stacked.get(&v.toml_key())?;
                let set = value.origin().is_some();
                let text = value.clone().into_string().ok()?;
                Some((
                    v.name,
                    Stacked {
                        text: text.trim().to_owned(),
                        set,
                    },
                ))
            })
            .collect();
        Ok(Self { values, blank })
    }

    /// The value set in the file or the environment, trimmed; `None` when unset.
    pub fn raw(&self, var: &'static Var) -> Option<&str> {
        self.values
            .get(var.name)
            .filter(|v| v.set)
            .map(|v| v.text.as_str())
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
        self.values.get(var.name).map(|v| v.text.as_str())
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

/// The built-in defaults < the file < the environment, stacked by `config`: the values by
/// file key, each with its origin (none for a default).
fn stack(
    file: Option<Layer>,
    environment: config::Environment,
) -> Result<config::Map<String, config::Value>, ConfigError> {
    let failed = |e: config::ConfigError| ConfigError::File(e.to_string());
    let mut builder = config::Config::builder();
    for v in VARIABLES {
        if let Some(default) = v.default {
            builder = builder.set_default(v.toml_key(), default).map_err(failed)?;
        }
    }
    if let Some(file) = file {
        builder = builder.add_source(file);
    }
    builder
        .add_source(environment)
        .build()
        .and_then(|stacked| stacked.collect())
        .map_err(failed)
}

/// One layer's values by file key, every one a string with its origin.
#[derive(Debug, Clone)]
struct Layer(config::Map<String, config::Value>);

impl Source for Layer {
    fn clone_into_box(&self) -> Box<dyn Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<config::Map<String, config::Value>, config::ConfigError> {
        Ok(self.0.clone())
    }
}

/// The file's layer: its TOML read by `config`, every key a declared server variable's
/// (else [`ConfigError::UnknownKey`]), each value as the environment would give it (a list
/// `["a", "b"]` as `a,b`); an empty one is left out and noted in `blank`.
fn file_layer(
    path: &str,
    text: &str,
    blank: &mut HashSet<&'static str>,
) -> Result<Layer, ConfigError> {
    let table = config::FileFormat::Toml
        .parse(None, text)
        .map_err(|e| not_toml(path, text, e.as_ref()))?;
    let server = || VARIABLES.iter().filter(|v| v.side == Side::Server);
    let origin = path.to_owned();
    let mut layer = config::Map::new();
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
            continue;
        }
        layer.insert(key, config::Value::new(Some(&origin), text));
    }
    Ok(Layer(layer))
}

/// Why the file is not TOML, said without the parser's own message, which quotes the
/// offending line, and that line may hold a secret (`rabbitmq_url = amqp://user:password@…`):
/// the error says where and why, never what.
fn not_toml(path: &str, text: &str, error: &(dyn std::error::Error + 'static)) -> ConfigError {
    let Some(e) = error.downcast_ref::<toml::de::Error>() else {
        // `config`'s own (a number out of range): it quotes no text.
        return ConfigError::File(format!("{path}: not valid TOML: {error}"));
    };
    let at = e.span().map_or(0, |span| span.start);
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    ConfigError::File(format!(
        "{path}: not valid TOML at line {line}, column {column}: {}",
        e.message()
    ))
}

/// The environment's layer: the declared variables of the server and of OpenTelemetry (the
/// client's are only tolerated), by file key; an empty one is left out and noted in `blank`.
fn environment_layer(
    env: &HashMap<String, String>,
    blank: &mut HashSet<&'static str>,
) -> config::Environment {
    let mut layer = config::Map::new();
    for v in VARIABLES.iter().filter(|v| v.side != Side::Client) {
        match env.get(v.name) {
            Some(value) if !value.trim().is_empty() => {
                layer.insert(v.toml_key(), value.clone());
            }
            Some(_) => {
                blank.insert(v.name);
            }
            None => {}
        }
    }
    config::Environment::default().source(Some(layer))
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
