//! Settings: built-in defaults < optional TOML file (`SENDGATE_CONFIG`) < environment.
//!
//! Every variable the service reads is listed once in [`VARIABLES`]; the TOML key of a
//! variable is its name in lower case without the `SENDGATE_` prefix
//! (`SENDGATE_DEPTH_TTL_MS` → `depth_ttl_ms`, `SERVICEBUS_NAMESPACE` → `servicebus_namespace`).
//! A bad value stops start-up with one line naming the variable (exit status 2), except the
//! three `SERVICEBUS_SEND_*` capacity variables, which follow the forgiving rules of the
//! contract (section 2) because deployed fleets already set them by hand.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::domain::QueueName;

/// One environment variable the service reads.
pub struct Variable {
    pub name: &'static str,
    pub default: Option<&'static str>,
    pub meaning: &'static str,
}

/// Every variable, in the order `.env.example` documents them.
pub const VARIABLES: &[Variable] = &[
    var(
        "SENDGATE_CONFIG",
        None,
        "optional TOML file with the same settings; the environment wins",
    ),
    var(
        "SENDGATE_LISTEN",
        Some("127.0.0.1:8080"),
        "HTTP listen address",
    ),
    var(
        "SENDGATE_BACKEND",
        Some("embedded"),
        "embedded, rabbitmq or servicebus",
    ),
    var(
        "SENDGATE_QUEUES",
        Some("requests"),
        "comma-separated queue names served",
    ),
    var(
        "SENDGATE_DATA_DIR",
        Some("./sendgate-data"),
        "embedded backend's files",
    ),
    var(
        "SENDGATE_RABBITMQ_URL",
        Some("amqp://guest:guest@127.0.0.1:5672/%2f"),
        "AMQP 0.9.1 data plane",
    ),
    var(
        "SENDGATE_RABBITMQ_MANAGEMENT_URL",
        Some("http://127.0.0.1:15672"),
        "RabbitMQ admin plane (management HTTP API)",
    ),
    var(
        "SENDGATE_RABBITMQ_MANAGEMENT_USER",
        None,
        "admin-plane user; defaults to the AMQP URL's user",
    ),
    var(
        "SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD",
        None,
        "admin-plane password; defaults to the AMQP URL's password",
    ),
    var(
        "SENDGATE_RABBITMQ_DEPTH_SOURCE",
        Some("management"),
        "management or amqp",
    ),
    var(
        "SENDGATE_RABBITMQ_STATS_LAG_MS",
        Some("6000"),
        "how far management counts trail the data plane",
    ),
    var(
        "SERVICEBUS_NAMESPACE",
        None,
        "e.g. myns.servicebus.windows.net",
    ),
    var(
        "SERVICEBUS_CONNECTION_STRING",
        None,
        "SAS connection string; without it Entra ID is used",
    ),
    var(
        "SERVICEBUS_ENDPOINT",
        None,
        "override of https://{SERVICEBUS_NAMESPACE}, for tests",
    ),
    var(
        "SERVICEBUS_MANAGE_CONNECTION_STRING",
        None,
        "SAS connection string for depth reads (Manage right); defaults to the send one",
    ),
    var(
        "SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID",
        None,
        "client id of a user-assigned managed identity (Entra ID only)",
    ),
    var(
        "SERVICEBUS_SEND_MAX_QUEUE_DEPTH",
        Some("2000"),
        "backlog ceiling; at or over it sends get 429",
    ),
    var(
        "SERVICEBUS_SEND_FAILCLOSED",
        Some("false"),
        "1/true/yes: refuse sends when the depth cannot be read",
    ),
    var(
        "SERVICEBUS_SEND_FAILCLOSED_STREAK",
        Some("3"),
        "consecutive failed depth reads before failing closed",
    ),
    var(
        "SENDGATE_DEPTH_TTL_MS",
        Some("1000"),
        "reuse a depth read this long; 0 reads before every send",
    ),
    var(
        "SENDGATE_ADMIN_TIMEOUT_MS",
        Some("2000"),
        "deadline of one depth read",
    ),
    var(
        "SENDGATE_SEND_TIMEOUT_MS",
        Some("10000"),
        "deadline of one send to the broker",
    ),
    var(
        "SENDGATE_MAX_IN_FLIGHT",
        Some("256"),
        "backend sends in flight before 503 saturated",
    ),
    var(
        "SENDGATE_MAX_BODY_BYTES",
        Some("262144"),
        "largest accepted message body",
    ),
    var(
        "SENDGATE_DRAIN_TIMEOUT_S",
        Some("30"),
        "longest drain after SIGTERM",
    ),
    var(
        "SENDGATE_API_KEYS_FILE",
        None,
        "TOML file of hashed API keys",
    ),
    var(
        "SENDGATE_AUTH",
        None,
        "none: run without keys on a non-loopback address",
    ),
    var("SENDGATE_LOG_FORMAT", Some("text"), "text or json"),
    var(
        "SENDGATE_WORKERS",
        None,
        "HTTP worker threads; defaults to the number of CPU cores",
    ),
    var(
        "SENDGATE_BREAKER_WINDOW_S",
        Some("60"),
        "breaker: outcomes counted over this window",
    ),
    var(
        "SENDGATE_BREAKER_MIN_FAILURES",
        Some("10"),
        "breaker: fewest failures in the window to open",
    ),
    var(
        "SENDGATE_BREAKER_FAILURE_RATE",
        Some("0.5"),
        "breaker: share of failures in the window to open",
    ),
    var(
        "SENDGATE_BREAKER_OPEN_S",
        Some("15"),
        "breaker: time open before a trial send",
    ),
    var(
        "SENDGATE_PROBE_INTERVAL_S",
        Some("5"),
        "health probe period per backend (0 = off)",
    ),
    var(
        "SENDGATE_FALLBACK_BACKEND",
        None,
        "embedded, rabbitmq or servicebus: used while the primary's breaker is open",
    ),
    var(
        "SENDGATE_FORCE_BACKEND",
        None,
        "primary or fallback: pin routing (primary = never fail over)",
    ),
    var(
        "SENDGATE_FALLBACK_DATA_DIR",
        None,
        "fallback's SENDGATE_DATA_DIR",
    ),
    var(
        "SENDGATE_FALLBACK_RABBITMQ_URL",
        None,
        "fallback's SENDGATE_RABBITMQ_URL",
    ),
    var(
        "SENDGATE_FALLBACK_RABBITMQ_MANAGEMENT_URL",
        None,
        "fallback's SENDGATE_RABBITMQ_MANAGEMENT_URL",
    ),
    var(
        "SENDGATE_FALLBACK_RABBITMQ_MANAGEMENT_USER",
        None,
        "fallback's SENDGATE_RABBITMQ_MANAGEMENT_USER",
    ),
    var(
        "SENDGATE_FALLBACK_RABBITMQ_MANAGEMENT_PASSWORD",
        None,
        "fallback's SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD",
    ),
    var(
        "SENDGATE_FALLBACK_RABBITMQ_DEPTH_SOURCE",
        None,
        "fallback's SENDGATE_RABBITMQ_DEPTH_SOURCE",
    ),
    var(
        "SENDGATE_FALLBACK_RABBITMQ_STATS_LAG_MS",
        None,
        "fallback's SENDGATE_RABBITMQ_STATS_LAG_MS",
    ),
    var(
        "SENDGATE_FALLBACK_SERVICEBUS_NAMESPACE",
        None,
        "fallback's SERVICEBUS_NAMESPACE",
    ),
    var(
        "SENDGATE_FALLBACK_SERVICEBUS_CONNECTION_STRING",
        None,
        "fallback's SERVICEBUS_CONNECTION_STRING",
    ),
    var(
        "SENDGATE_FALLBACK_SERVICEBUS_ENDPOINT",
        None,
        "fallback's SERVICEBUS_ENDPOINT",
    ),
    var(
        "SENDGATE_FALLBACK_SERVICEBUS_MANAGE_CONNECTION_STRING",
        None,
        "fallback's SERVICEBUS_MANAGE_CONNECTION_STRING",
    ),
    var(
        "SENDGATE_FALLBACK_SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID",
        None,
        "fallback's SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID",
    ),
];

/// The fallback backend's variable for one of the primary's: `SENDGATE_X` →
/// `SENDGATE_FALLBACK_X`, `SERVICEBUS_X` → `SENDGATE_FALLBACK_SERVICEBUS_X`. Unset, the
/// fallback uses the primary's value (so a fallback of another kind needs no new names).
fn fallback_var(name: &'static str) -> &'static str {
    let wanted = match name.strip_prefix("SENDGATE_") {
        Some(rest) => format!("SENDGATE_FALLBACK_{rest}"),
        None => format!("SENDGATE_FALLBACK_{name}"),
    };
    VARIABLES
        .iter()
        .find(|v| v.name == wanted)
        .map_or(name, |v| v.name)
}

const fn var(name: &'static str, default: Option<&'static str>, meaning: &'static str) -> Variable {
    Variable {
        name,
        default,
        meaning,
    }
}

/// The TOML key for a variable.
fn key_of(name: &str) -> String {
    name.strip_prefix("SENDGATE_")
        .unwrap_or(name)
        .to_ascii_lowercase()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{var}: {reason} (got {value:?})")]
    Invalid {
        var: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("{var}: {0}", var = "SENDGATE_CONFIG")]
    File(String),
    #[error("SENDGATE_CONFIG: unknown setting `{0}` (keys are the variable names in lower case without SENDGATE_)")]
    UnknownKey(String),
    #[error("{var}: {message}")]
    Other { var: &'static str, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Embedded,
    RabbitMq,
    ServiceBus,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::RabbitMq => "rabbitmq",
            Self::ServiceBus => "servicebus",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepthSource {
    Management,
    Amqp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// A secret that never shows in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: &str) -> Self {
        Self(value.to_owned())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The backlog ceiling and the fail-closed gate (contract section 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacitySettings {
    pub max_queue_depth: u64,
    pub fail_closed: bool,
    pub fail_closed_streak: u32,
    pub depth_ttl: Duration,
    pub admin_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RabbitMqSettings {
    pub url: String,
    pub management_url: String,
    pub management_user: Option<String>,
    pub management_password: Option<Secret>,
    pub depth_source: DepthSource,
    /// How far the management API's counts trail the data plane.
    pub stats_lag: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceBusSettings {
    pub namespace: Option<String>,
    pub connection_string: Option<Secret>,
    pub endpoint: Option<String>,
    /// Depth reads use this key when set (it needs the Manage right), the send key otherwise.
    pub manage_connection_string: Option<Secret>,
    /// A user-assigned managed identity, when Entra ID is used.
    pub managed_identity_client_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthSettings {
    /// Keys from this file are required on every protected route.
    KeysFile(PathBuf),
    /// No keys: allowed on loopback, or anywhere with `SENDGATE_AUTH=none`.
    Open { explicitly_none: bool },
}

/// A second backend, used while the primary's circuit is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackSettings {
    pub backend: BackendKind,
    pub data_dir: PathBuf,
    pub rabbitmq: RabbitMqSettings,
    pub servicebus: ServiceBusSettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceBackend {
    Primary,
    Fallback,
}

/// The request-path circuit breaker and the health probes.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchSettings {
    pub breaker_window: Duration,
    pub breaker_min_failures: u32,
    pub breaker_failure_rate: f64,
    pub breaker_open: Duration,
    pub probe_interval: Duration,
    pub fallback: Option<FallbackSettings>,
    pub force: Option<ForceBackend>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub listen: SocketAddr,
    pub backend: BackendKind,
    pub queues: Vec<QueueName>,
    pub data_dir: PathBuf,
    pub rabbitmq: RabbitMqSettings,
    pub servicebus: ServiceBusSettings,
    pub capacity: CapacitySettings,
    pub send_timeout: Duration,
    pub max_in_flight: usize,
    pub max_body_bytes: usize,
    pub drain_timeout: Duration,
    pub auth: AuthSettings,
    pub log_format: LogFormat,
    pub workers: Option<usize>,
    pub dispatch: DispatchSettings,
}

impl Settings {
    /// Settings from the process environment (and the file it names).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(&std::env::vars().collect())
    }

    /// Settings from an explicit set of variables: tests use this instead of mutating the
    /// process environment.
    pub fn from_vars(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let raw = Layers::build(env)?;
        Self::from_layers(&raw)
    }

    fn from_layers(raw: &Layers) -> Result<Self, ConfigError> {
        let listen = parse_listen(raw.req("SENDGATE_LISTEN"))?;
        let backend = parse_backend_kind("SENDGATE_BACKEND", raw.req("SENDGATE_BACKEND"))?;
        let queues = parse_queues(raw.req("SENDGATE_QUEUES"))?;
        let primary = BackendParts::parse(raw, false)?;
        let dispatch = parse_dispatch(raw)?;
        let log_format = match raw.req("SENDGATE_LOG_FORMAT").to_ascii_lowercase().as_str() {
            "text" | "" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(invalid(
                    "SENDGATE_LOG_FORMAT",
                    other,
                    "expected text or json",
                ))
            }
        };
        let auth = match (raw.opt("SENDGATE_API_KEYS_FILE"), raw.opt("SENDGATE_AUTH")) {
            (Some(_), Some(mode)) if mode.eq_ignore_ascii_case("none") => {
                return Err(ConfigError::Other {
                    var: "SENDGATE_AUTH",
                    message: "`none` cannot be combined with SENDGATE_API_KEYS_FILE".into(),
                })
            }
            (_, Some(mode)) if !mode.eq_ignore_ascii_case("none") => {
                return Err(invalid(
                    "SENDGATE_AUTH",
                    mode,
                    "the only accepted value is none",
                ))
            }
            (Some(file), _) => AuthSettings::KeysFile(PathBuf::from(file)),
            (None, mode) => AuthSettings::Open {
                explicitly_none: mode.is_some(),
            },
        };
        if let AuthSettings::Open {
            explicitly_none: false,
        } = auth
        {
            if !listen.ip().is_loopback() {
                return Err(ConfigError::Other {
                    var: "SENDGATE_API_KEYS_FILE",
                    message: format!(
                        "refusing to listen on non-loopback {listen} without API keys; set SENDGATE_API_KEYS_FILE, or SENDGATE_AUTH=none to run open on purpose"
                    ),
                });
            }
        }
        let workers = match raw.opt("SENDGATE_WORKERS") {
            None => None,
            Some(v) => Some(parse_positive("SENDGATE_WORKERS", v)? as usize),
        };

        Ok(Settings {
            listen,
            backend,
            queues,
            data_dir: primary.data_dir,
            rabbitmq: primary.rabbitmq,
            servicebus: primary.servicebus,
            capacity: CapacitySettings {
                max_queue_depth: forgiving_max_depth(raw.opt("SERVICEBUS_SEND_MAX_QUEUE_DEPTH")),
                fail_closed: forgiving_flag(raw.opt("SERVICEBUS_SEND_FAILCLOSED")),
                fail_closed_streak: forgiving_streak(raw.opt("SERVICEBUS_SEND_FAILCLOSED_STREAK")),
                depth_ttl: Duration::from_millis(parse_u64(
                    "SENDGATE_DEPTH_TTL_MS",
                    raw.req("SENDGATE_DEPTH_TTL_MS"),
                )?),
                admin_timeout: Duration::from_millis(parse_positive(
                    "SENDGATE_ADMIN_TIMEOUT_MS",
                    raw.req("SENDGATE_ADMIN_TIMEOUT_MS"),
                )?),
            },
            send_timeout: Duration::from_millis(parse_positive(
                "SENDGATE_SEND_TIMEOUT_MS",
                raw.req("SENDGATE_SEND_TIMEOUT_MS"),
            )?),
            max_in_flight: parse_positive(
                "SENDGATE_MAX_IN_FLIGHT",
                raw.req("SENDGATE_MAX_IN_FLIGHT"),
            )? as usize,
            max_body_bytes: parse_positive(
                "SENDGATE_MAX_BODY_BYTES",
                raw.req("SENDGATE_MAX_BODY_BYTES"),
            )? as usize,
            drain_timeout: Duration::from_secs(parse_u64(
                "SENDGATE_DRAIN_TIMEOUT_S",
                raw.req("SENDGATE_DRAIN_TIMEOUT_S"),
            )?),
            auth,
            log_format,
            workers,
            dispatch,
        })
    }
}

/// One backend's own settings, read from the primary's variables or, for the fallback,
/// from the `SENDGATE_FALLBACK_` ones falling back to the primary's.
struct BackendParts {
    data_dir: PathBuf,
    rabbitmq: RabbitMqSettings,
    servicebus: ServiceBusSettings,
}

impl BackendParts {
    fn parse(raw: &Layers, fallback: bool) -> Result<Self, ConfigError> {
        // (the name to blame in errors, its value)
        let opt = |name: &'static str| -> Option<(&'static str, &str)> {
            if fallback {
                let fb = fallback_var(name);
                if let Some(v) = raw.opt(fb) {
                    return Some((fb, v));
                }
            }
            raw.opt(name).map(|v| (name, v))
        };
        let req = |name: &'static str| opt(name).unwrap_or((name, raw.req(name)));
        let (var, value) = req("SENDGATE_RABBITMQ_DEPTH_SOURCE");
        let depth_source = match value.to_ascii_lowercase().as_str() {
            "management" => DepthSource::Management,
            "amqp" => DepthSource::Amqp,
            _ => return Err(invalid(var, value, "expected management or amqp")),
        };
        let (lag_var, lag) = req("SENDGATE_RABBITMQ_STATS_LAG_MS");
        Ok(Self {
            data_dir: PathBuf::from(req("SENDGATE_DATA_DIR").1),
            rabbitmq: RabbitMqSettings {
                url: req("SENDGATE_RABBITMQ_URL").1.to_owned(),
                management_url: req("SENDGATE_RABBITMQ_MANAGEMENT_URL").1.to_owned(),
                management_user: opt("SENDGATE_RABBITMQ_MANAGEMENT_USER")
                    .map(|(_, v)| v.to_owned()),
                management_password: opt("SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD")
                    .map(|(_, v)| Secret::new(v)),
                depth_source,
                stats_lag: Duration::from_millis(parse_u64(lag_var, lag)?),
            },
            servicebus: ServiceBusSettings {
                namespace: opt("SERVICEBUS_NAMESPACE").map(|(_, v)| v.to_owned()),
                connection_string: opt("SERVICEBUS_CONNECTION_STRING").map(|(_, v)| Secret::new(v)),
                endpoint: opt("SERVICEBUS_ENDPOINT").map(|(_, v)| v.to_owned()),
                manage_connection_string: opt("SERVICEBUS_MANAGE_CONNECTION_STRING")
                    .map(|(_, v)| Secret::new(v)),
                managed_identity_client_id: opt("SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID")
                    .map(|(_, v)| v.to_owned()),
            },
        })
    }
}

fn parse_backend_kind(var: &'static str, value: &str) -> Result<BackendKind, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "embedded" => Ok(BackendKind::Embedded),
        "rabbitmq" => Ok(BackendKind::RabbitMq),
        "servicebus" => Ok(BackendKind::ServiceBus),
        _ => Err(invalid(
            var,
            value,
            "expected embedded, rabbitmq or servicebus",
        )),
    }
}

fn parse_dispatch(raw: &Layers) -> Result<DispatchSettings, ConfigError> {
    let rate_var = "SENDGATE_BREAKER_FAILURE_RATE";
    let rate: f64 = raw
        .req(rate_var)
        .trim()
        .parse()
        .ok()
        .filter(|r: &f64| *r > 0.0 && *r <= 1.0)
        .ok_or_else(|| {
            invalid(
                rate_var,
                raw.req(rate_var),
                "expected a number above 0 and at most 1",
            )
        })?;
    let fallback = match raw.opt("SENDGATE_FALLBACK_BACKEND") {
        None => None,
        Some(kind) => {
            let parts = BackendParts::parse(raw, true)?;
            Some(FallbackSettings {
                backend: parse_backend_kind("SENDGATE_FALLBACK_BACKEND", kind)?,
                data_dir: parts.data_dir,
                rabbitmq: parts.rabbitmq,
                servicebus: parts.servicebus,
            })
        }
    };
    let force = match raw
        .opt("SENDGATE_FORCE_BACKEND")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None => None,
        Some("primary") => Some(ForceBackend::Primary),
        Some("fallback") if fallback.is_some() => Some(ForceBackend::Fallback),
        Some("fallback") => {
            return Err(ConfigError::Other {
                var: "SENDGATE_FORCE_BACKEND",
                message: "fallback needs SENDGATE_FALLBACK_BACKEND".into(),
            })
        }
        Some(other) => {
            return Err(invalid(
                "SENDGATE_FORCE_BACKEND",
                other,
                "expected primary or fallback",
            ))
        }
    };
    Ok(DispatchSettings {
        breaker_window: Duration::from_secs(parse_positive(
            "SENDGATE_BREAKER_WINDOW_S",
            raw.req("SENDGATE_BREAKER_WINDOW_S"),
        )?),
        breaker_min_failures: parse_positive(
            "SENDGATE_BREAKER_MIN_FAILURES",
            raw.req("SENDGATE_BREAKER_MIN_FAILURES"),
        )?
        .min(u64::from(u32::MAX)) as u32,
        breaker_failure_rate: rate,
        breaker_open: Duration::from_secs(parse_positive(
            "SENDGATE_BREAKER_OPEN_S",
            raw.req("SENDGATE_BREAKER_OPEN_S"),
        )?),
        probe_interval: Duration::from_secs(parse_u64(
            "SENDGATE_PROBE_INTERVAL_S",
            raw.req("SENDGATE_PROBE_INTERVAL_S"),
        )?),
        fallback,
        force,
    })
}

/// The merged layers, as strings keyed by variable name.
struct Layers(HashMap<&'static str, String>);

impl Layers {
    fn build(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut builder = config::Config::builder();
        for v in VARIABLES {
            if let Some(default) = v.default {
                builder = builder
                    .set_default(key_of(v.name), default)
                    .map_err(|e| ConfigError::File(e.to_string()))?;
            }
        }
        if let Some(path) = env.get("SENDGATE_CONFIG").filter(|p| !p.is_empty()) {
            builder = builder
                .add_source(config::File::new(path, config::FileFormat::Toml).required(true));
        }
        for v in VARIABLES {
            if let Some(value) = env.get(v.name) {
                builder = builder
                    .set_override(key_of(v.name), value.as_str())
                    .map_err(|e| ConfigError::File(e.to_string()))?;
            }
        }
        let merged = builder
            .build()
            .map_err(|e| ConfigError::File(e.to_string()))?;
        let table: HashMap<String, config::Value> = merged
            .try_deserialize()
            .map_err(|e| ConfigError::File(e.to_string()))?;

        let mut values = HashMap::new();
        for (key, value) in table {
            let Some(v) = VARIABLES.iter().find(|v| key_of(v.name) == key) else {
                return Err(ConfigError::UnknownKey(key));
            };
            let text = match value.kind {
                // `queues = ["a", "b"]` in the file reads like SENDGATE_QUEUES=a,b.
                config::ValueKind::Array(items) => items
                    .into_iter()
                    .map(|i| i.into_string().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(","),
                config::ValueKind::Nil => continue,
                other => config::Value::new(None, other).into_string().map_err(|e| {
                    ConfigError::Other {
                        var: v.name,
                        message: e.to_string(),
                    }
                })?,
            };
            values.insert(v.name, text);
        }
        Ok(Self(values))
    }

    /// A variable that has a default, so it is always present.
    fn req(&self, name: &'static str) -> &str {
        self.0.get(name).map(String::as_str).unwrap_or_default()
    }

    /// A variable without a default; empty counts as unset.
    fn opt(&self, name: &'static str) -> Option<&str> {
        self.0.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
    }
}

fn invalid(var: &'static str, value: &str, reason: &'static str) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        reason,
    }
}

/// Whole numbers, with a ceiling set by the unit the name ends in: an hour for `_MS`, a
/// day for `_S`, a billion otherwise. Larger values are mistakes, and a duration that big
/// would overflow the clock when added to "now".
fn parse_u64(var: &'static str, value: &str) -> Result<u64, ConfigError> {
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|_| invalid(var, value, "expected a whole number"))?;
    let (max, reason) = if var.ends_with("_MS") {
        (3_600_000, "must be at most 3600000 (one hour)")
    } else if var.ends_with("_S") {
        (86_400, "must be at most 86400 (one day)")
    } else {
        (1_000_000_000, "must be at most 1000000000")
    };
    if n > max {
        return Err(invalid(var, value, reason));
    }
    Ok(n)
}

fn parse_positive(var: &'static str, value: &str) -> Result<u64, ConfigError> {
    match parse_u64(var, value)? {
        0 => Err(invalid(var, value, "must be at least 1")),
        n => Ok(n),
    }
}

fn parse_listen(value: &str) -> Result<SocketAddr, ConfigError> {
    let reason = "expected IP:PORT, e.g. 127.0.0.1:8080 or [::]:8080";
    if let Some(port) = value.strip_prefix("localhost:") {
        let port = port
            .parse()
            .map_err(|_| invalid("SENDGATE_LISTEN", value, reason))?;
        return Ok(SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port));
    }
    value
        .parse()
        .map_err(|_| invalid("SENDGATE_LISTEN", value, reason))
}

fn parse_queues(value: &str) -> Result<Vec<QueueName>, ConfigError> {
    let mut queues: Vec<QueueName> = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let name = QueueName::parse(part).map_err(|e| ConfigError::Other {
            var: "SENDGATE_QUEUES",
            message: format!("{part:?}: {e}"),
        })?;
        if !queues.contains(&name) {
            queues.push(name);
        }
    }
    if queues.is_empty() {
        return Err(invalid("SENDGATE_QUEUES", value, "name at least one queue"));
    }
    Ok(queues)
}

/// `SERVICEBUS_SEND_FAILCLOSED`: `1`, `true` or `yes` in any case turn it on; anything else is off.
pub fn forgiving_flag(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        let v = v.trim();
        v == "1" || v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes")
    })
}

/// `SERVICEBUS_SEND_FAILCLOSED_STREAK`: default 3, below 1 becomes 1, a non-integer means 3
/// (an integer too large to hold is still an integer: it becomes the largest streak).
pub fn forgiving_streak(value: Option<&str>) -> u32 {
    match value.map(|v| v.trim().parse::<i128>()) {
        Some(Ok(n)) => n.clamp(1, i128::from(u32::MAX)) as u32,
        _ => 3,
    }
}

/// `SERVICEBUS_SEND_MAX_QUEUE_DEPTH`: default 2000, below 1 becomes 1, a non-integer means 2000.
pub fn forgiving_max_depth(value: Option<&str>) -> u64 {
    match value.map(|v| v.trim().parse::<i128>()) {
        Some(Ok(n)) => n.clamp(1, i128::from(u64::MAX)) as u64,
        _ => 2000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_the_contract() {
        let s = Settings::from_vars(&HashMap::new()).unwrap();
        assert_eq!(s.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(s.backend, BackendKind::Embedded);
        assert_eq!(s.queues, vec![QueueName::parse("requests").unwrap()]);
        assert_eq!(s.data_dir, PathBuf::from("./sendgate-data"));
        assert_eq!(s.capacity.max_queue_depth, 2000);
        assert!(!s.capacity.fail_closed);
        assert_eq!(s.capacity.fail_closed_streak, 3);
        assert_eq!(s.capacity.depth_ttl, Duration::from_millis(1000));
        assert_eq!(s.capacity.admin_timeout, Duration::from_millis(2000));
        assert_eq!(s.send_timeout, Duration::from_millis(10000));
        assert_eq!(s.max_in_flight, 256);
        assert_eq!(s.max_body_bytes, 262_144);
        assert_eq!(s.drain_timeout, Duration::from_secs(30));
        assert_eq!(s.rabbitmq.depth_source, DepthSource::Management);
        assert_eq!(
            s.auth,
            AuthSettings::Open {
                explicitly_none: false
            }
        );
    }

    #[test]
    fn failclosed_flag_accepts_exactly_1_true_yes_in_any_case() {
        for on in ["1", "true", "TRUE", "yes", "Yes", " true "] {
            assert!(forgiving_flag(Some(on)), "{on:?}");
        }
        for off in ["0", "false", "on", "y", "2", "", "enabled"] {
            assert!(!forgiving_flag(Some(off)), "{off:?}");
        }
        assert!(!forgiving_flag(None));
    }

    #[test]
    fn streak_below_one_is_one_and_garbage_is_three() {
        assert_eq!(forgiving_streak(Some("0")), 1);
        assert_eq!(forgiving_streak(Some("-4")), 1);
        assert_eq!(forgiving_streak(Some("5")), 5);
        assert_eq!(forgiving_streak(Some("abc")), 3);
        assert_eq!(forgiving_streak(Some("2.5")), 3);
        assert_eq!(forgiving_streak(None), 3);
        assert_eq!(forgiving_streak(Some("99999999999999999999")), u32::MAX);
    }

    #[test]
    fn max_depth_below_one_is_one() {
        assert_eq!(forgiving_max_depth(Some("0")), 1);
        assert_eq!(forgiving_max_depth(Some("-10")), 1);
        assert_eq!(forgiving_max_depth(Some("50")), 50);
        assert_eq!(forgiving_max_depth(Some("lots")), 2000);
        assert_eq!(
            forgiving_max_depth(Some("99999999999999999999999")),
            u64::MAX
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err = Settings::from_vars(&vars(&[("SENDGATE_DEPTH_TTL_MS", "soon")])).unwrap_err();
        assert!(
            err.to_string().starts_with("SENDGATE_DEPTH_TTL_MS:"),
            "{err}"
        );
        let err = Settings::from_vars(&vars(&[("SENDGATE_BACKEND", "kafka")])).unwrap_err();
        assert!(err.to_string().starts_with("SENDGATE_BACKEND:"), "{err}");
        let err = Settings::from_vars(&vars(&[("SENDGATE_MAX_IN_FLIGHT", "0")])).unwrap_err();
        assert!(
            err.to_string().starts_with("SENDGATE_MAX_IN_FLIGHT:"),
            "{err}"
        );
        let err = Settings::from_vars(&vars(&[("SENDGATE_QUEUES", "ok,bad name")])).unwrap_err();
        assert!(err.to_string().starts_with("SENDGATE_QUEUES:"), "{err}");
    }

    #[test]
    fn durations_too_large_for_the_clock_are_refused() {
        for (var, value) in [
            ("SENDGATE_DRAIN_TIMEOUT_S", "9223372036854775808"),
            ("SENDGATE_BREAKER_OPEN_S", "86401"),
            ("SENDGATE_SEND_TIMEOUT_MS", "3600001"),
        ] {
            let err = Settings::from_vars(&vars(&[(var, value)])).unwrap_err();
            assert!(err.to_string().starts_with(var), "{err}");
        }
        assert!(Settings::from_vars(&vars(&[("SENDGATE_DRAIN_TIMEOUT_S", "86400")])).is_ok());
    }

    #[test]
    fn non_loopback_without_keys_refuses_unless_auth_none() {
        let err = Settings::from_vars(&vars(&[("SENDGATE_LISTEN", "0.0.0.0:8080")])).unwrap_err();
        assert!(err.to_string().contains("non-loopback"), "{err}");
        let s = Settings::from_vars(&vars(&[
            ("SENDGATE_LISTEN", "0.0.0.0:8080"),
            ("SENDGATE_AUTH", "none"),
        ]))
        .unwrap();
        assert_eq!(
            s.auth,
            AuthSettings::Open {
                explicitly_none: true
            }
        );
        let s = Settings::from_vars(&vars(&[
            ("SENDGATE_LISTEN", "[::]:80"),
            ("SENDGATE_API_KEYS_FILE", "/k.toml"),
        ]))
        .unwrap();
        assert_eq!(s.auth, AuthSettings::KeysFile("/k.toml".into()));
        assert!(Settings::from_vars(&vars(&[("SENDGATE_LISTEN", "localhost:9000")])).is_ok());
    }

    #[test]
    fn file_layer_sits_between_defaults_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sendgate.toml");
        std::fs::write(
            &path,
            "queues = [\"a\", \"b\"]\ndepth_ttl_ms = 250\nservicebus_send_max_queue_depth = 7\nsend_timeout_ms = 500\n",
        )
        .unwrap();
        let s = Settings::from_vars(&vars(&[
            ("SENDGATE_CONFIG", path.to_str().unwrap()),
            ("SENDGATE_SEND_TIMEOUT_MS", "900"),
        ]))
        .unwrap();
        assert_eq!(s.queues.len(), 2);
        assert_eq!(s.capacity.depth_ttl, Duration::from_millis(250));
        assert_eq!(s.capacity.max_queue_depth, 7);
        assert_eq!(
            s.send_timeout,
            Duration::from_millis(900),
            "environment wins over the file"
        );
    }

    #[test]
    fn a_fallback_reads_its_own_variables_then_the_primarys() {
        let s = Settings::from_vars(&vars(&[
            ("SENDGATE_BACKEND", "rabbitmq"),
            ("SENDGATE_RABBITMQ_URL", "amqp://a/%2f"),
            ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
            ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
            ("SENDGATE_FALLBACK_RABBITMQ_URL", "amqp://b/%2f"),
        ]))
        .unwrap();
        let fb = s.dispatch.fallback.unwrap();
        assert_eq!(fb.backend, BackendKind::RabbitMq);
        assert_eq!(fb.rabbitmq.url, "amqp://b/%2f");
        assert_eq!(s.rabbitmq.url, "amqp://a/%2f");
        assert_eq!(fb.rabbitmq.depth_source, DepthSource::Amqp, "inherited");
        let err =
            Settings::from_vars(&vars(&[("SENDGATE_FORCE_BACKEND", "fallback")])).unwrap_err();
        assert!(
            err.to_string().starts_with("SENDGATE_FORCE_BACKEND"),
            "{err}"
        );
        let err = Settings::from_vars(&vars(&[
            ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
            ("SENDGATE_FALLBACK_RABBITMQ_DEPTH_SOURCE", "x"),
        ]))
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("SENDGATE_FALLBACK_RABBITMQ_DEPTH_SOURCE"),
            "{err}"
        );
        let err =
            Settings::from_vars(&vars(&[("SENDGATE_BREAKER_FAILURE_RATE", "1.5")])).unwrap_err();
        assert!(
            err.to_string().starts_with("SENDGATE_BREAKER_FAILURE_RATE"),
            "{err}"
        );
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sendgate.toml");
        std::fs::write(&path, "depht_ttl_ms = 5\n").unwrap();
        let err =
            Settings::from_vars(&vars(&[("SENDGATE_CONFIG", path.to_str().unwrap())])).unwrap_err();
        assert_eq!(err, ConfigError::UnknownKey("depht_ttl_ms".into()));
    }
}
