//! Settings: built-in defaults < optional TOML file (`SENDGATE_CONFIG`) < environment,
//! parsed once into typed values.
//!
//! - `vars`: every variable, declared once as a typed descriptor ([`vars::VARIABLES`]);
//! - `layers`: the merge, and the typed getters every setting is read through;
//! - `backend`: one backend's settings, parsed through a scope (primary or fallback);
//! - `servicebus`: the Service Bus endpoint and credential plan, resolved;
//! - `forgiving`: the contract's rules for the three `SERVICEBUS_SEND_*` variables;
//! - `otel`: the OpenTelemetry variables sendgate's exporter reads itself;
//! - `secret`: the redacting wrapper; `render`: `.env.example` and docs/configuration.md.
//!
//! The TOML key of a variable is its name in lower case without the `SENDGATE_` prefix
//! (`SENDGATE_DEPTH_TTL_MS` → `depth_ttl_ms`, `SERVICEBUS_NAMESPACE` → `servicebus_namespace`).
//! A bad value, an unknown key or an unknown `SENDGATE_*` variable stops start-up with one
//! line naming the variable (exit status 2).

mod backend;
mod connection_string;
mod coordination;
mod entra_callers;
mod error;
mod forgiving;
mod layers;
mod otel;
pub mod render;
mod secret;
pub mod servicebus;
pub mod vars;

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use backend::{BackendKind, BackendSettings, DepthSource, RabbitMqSettings, Scope};
pub use connection_string::{ConnectionString, ConnectionStringError, ENDPOINT_NOT_SHOWN};
pub use coordination::{CoordinationSettings, KeyPrefix, RedisAuth, RedisSettings};
pub use entra_callers::{EntraCallersSettings, Guid};
pub use error::{closest, ConfigError};
pub use forgiving::{forgiving_flag, forgiving_max_depth, forgiving_streak};
pub use layers::{one_of, servicebus_near_misses, Fraction};
pub use otel::{ExportHeaders, OtelSettings, Protocol as OtlpProtocol, SignalExport};
pub use secret::Secret;
pub use servicebus::{ArmNamespaceId, CredentialPlan, ServiceBusDepthSource, ServiceBusSettings};
pub use vars::{Var, VARIABLES};

use crate::domain::QueueName;
use layers::Layers;
use vars as v;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The backlog ceiling and the fail-closed gate (contract section 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacitySettings {
    pub max_queue_depth: u64,
    pub fail_closed: bool,
    pub fail_closed_streak: u32,
    pub depth_ttl: Duration,
    pub admin_timeout: Duration,
    /// The longest `Retry-After` a `429 queue_full` asks for (`SENDGATE_RETRY_AFTER_MAX_S`).
    pub retry_after_max: Duration,
    /// Once refusing at the ceiling, refuse until the backlog is at or below this share
    /// of it (`SENDGATE_RESUME_BELOW`; 1 = no hysteresis).
    pub resume_below: Fraction,
}

/// How tenants share a contended queue and how criticality is shed (docs/fairness.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FairSettings {
    /// `SENDGATE_FAIR_SHARE`: `enforce`, `shadow` or `off`.
    pub mode: FairMode,
    pub share_at: Fraction,
    pub shed_at_sheddable: Fraction,
    pub shed_at_default: Fraction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FairMode {
    Enforce,
    /// Nothing refused by the shares or criticality; what they would refuse is counted.
    Shadow,
    Off,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthSettings {
    /// A credential is required on every protected route: an API key from the keys file,
    /// an Entra ID access token, or either (at least one of the two is set). With Entra
    /// on, the keys file may hold only `[[apps]]`.
    Callers {
        keys_file: Option<PathBuf>,
        entra: Option<EntraCallersSettings>,
    },
    /// No keys: allowed on loopback, or anywhere with `SENDGATE_AUTH=none`.
    Open { explicitly_none: bool },
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
    pub force: Option<ForceBackend>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub listen: SocketAddr,
    /// `SENDGATE_DATA_DIR`: the embedded backend's files and, in local mode, the runtime
    /// settings (`settings.json`), whatever the backend.
    pub data_dir: std::path::PathBuf,
    pub queues: Vec<QueueName>,
    /// The backend sends go to.
    pub primary: BackendSettings,
    /// A second backend, used while the primary's circuit is open.
    pub fallback: Option<BackendSettings>,
    pub capacity: CapacitySettings,
    pub fair: FairSettings,
    pub send_timeout: Duration,
    pub max_in_flight: usize,
    pub max_body_bytes: usize,
    /// Most entries in one batch send.
    pub max_batch_messages: usize,
    /// Largest batch request body; between `max_body_bytes` and `max_buffered_bytes`.
    pub max_batch_bytes: usize,
    /// Deepest nesting of arrays and objects a body may have.
    pub max_json_depth: usize,
    /// Longest a request body may take to arrive; never longer than `send_timeout`.
    pub body_timeout: Duration,
    /// Request bodies held in memory at once, in bytes; at least `max_body_bytes`.
    pub max_buffered_bytes: usize,
    /// Open client connections, all workers together.
    pub max_connections: usize,
    /// The connection limits (src/transport): heads' deadline and bytes, per-peer cap.
    pub connections: ConnectionLimits,
    pub drain_timeout: Duration,
    /// Shortest drain, even with nothing in flight; never longer than `drain_timeout`.
    pub drain_linger: Duration,
    /// When a runtime override lapses (`SENDGATE_OVERRIDES_LAPSE`).
    pub overrides_lapse: OverridesLapse,
    pub auth: AuthSettings,
    pub log_format: LogFormat,
    pub workers: Option<usize>,
    pub dispatch: DispatchSettings,
    /// Alone, or one ceiling shared by every replica through Redis.
    pub coordination: CoordinationSettings,
    /// OpenTelemetry export (OTLP/HTTP), off unless an endpoint is set.
    pub otel: OtelSettings,
}

impl Settings {
    /// Settings from the process environment (and the file it names).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(&text_environment(std::env::vars_os())?)
    }

    /// Settings from an explicit set of variables: tests use this instead of mutating the
    /// process environment. Names are checked as in the environment: an unknown
    /// `SENDGATE_*` name is refused.
    pub fn from_vars(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::from_layers(&Layers::build(env)?)
    }

    /// [`Settings::from_vars`] with `file` as the text of the file `SENDGATE_CONFIG`
    /// names, whatever the path: the fuzz target's and its replay's way in, without a disk.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn from_vars_and_file(
        env: &HashMap<String, String>,
        file: &str,
    ) -> Result<Self, ConfigError> {
        Self::from_layers(&Layers::build_with(env, |_| Ok(file.to_owned()))?)
    }

    /// Settings from descriptor-keyed values, e.g. `[(&vars::DEPTH_TTL_MS, "250")]`: a
    /// misspelled override does not compile.
    pub fn from_overrides(overrides: &[(&'static Var, &str)]) -> Result<Self, ConfigError> {
        Self::from_vars(
            &overrides
                .iter()
                .map(|(var, value)| (var.name.to_owned(), (*value).to_owned()))
                .collect(),
        )
    }

    /// Every setting, read in a fixed order (so the first error reported is always the
    /// same one).
    fn from_layers(layers: &Layers) -> Result<Self, ConfigError> {
        let listen = parse_listen(layers)?;
        let queues = parse_queues(layers)?;
        let primary = backend::parse(layers, Scope::Primary, &queues)?
            .ok_or_else(|| ConfigError::other(&v::BACKEND, "must be set"))?;
        let fallback = backend::parse(layers, Scope::Fallback, &queues)?;
        let dispatch = parse_dispatch(layers, fallback.is_some())?;
        let log_format = parse_log_format(layers)?;
        let auth = parse_auth(layers, listen)?;
        let send_timeout = layers.duration(&v::SEND_TIMEOUT_MS)?;
        let max_body_bytes = layers.count(&v::MAX_BODY_BYTES)? as usize;
        let max_buffered_bytes = max_buffered_bytes(layers, max_body_bytes)?;
        let drain_timeout = layers.duration(&v::DRAIN_TIMEOUT_S)?;
        let capacity = capacity_settings(layers)?;
        let fair = fair_settings(layers)?;
        let max_in_flight = layers.count(&v::MAX_IN_FLIGHT)? as usize;
        let max_batch_messages = layers.count(&v::MAX_BATCH_MESSAGES)? as usize;
        let max_batch_bytes = max_batch_bytes(layers, max_body_bytes, max_buffered_bytes)?;
        let max_json_depth = layers.count(&v::MAX_JSON_DEPTH)? as usize;
        let body_timeout = body_timeout(layers, send_timeout)?;
        let max_connections = layers.count(&v::MAX_CONNECTIONS)? as usize;
        let connections = connection_limits(layers, send_timeout)?;
        Ok(Settings {
            listen,
            data_dir: layers.path(&v::DATA_DIR).unwrap_or_default(),
            queues,
            primary,
            fallback,
            capacity,
            fair,
            send_timeout,
            max_in_flight,
            max_body_bytes,
            max_batch_messages,
            max_batch_bytes,
            max_json_depth,
            body_timeout,
            max_buffered_bytes,
            max_connections,
            connections,
            drain_timeout,
            drain_linger: drain_linger(layers, drain_timeout)?,
            overrides_lapse: parse_overrides_lapse(layers)?,
            auth,
            log_format,
            workers: layers.whole(&v::WORKERS)?.map(|n| n as usize),
            dispatch,
            coordination: coordination::parse(layers)?,
            otel: otel::parse(layers)?,
        })
    }

    /// The data directory of the embedded backend, primary first: `sendgate queue` reads it.
    pub fn embedded_data_dir(&self) -> Option<&std::path::Path> {
        [Some(&self.primary), self.fallback.as_ref()]
            .into_iter()
            .flatten()
            .find_map(|b| match b {
                BackendSettings::Embedded { data_dir } => Some(data_dir.as_path()),
                _ => None,
            })
    }
}

/// When a runtime override lapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverridesLapse {
    /// The deployment wins: an override made against a variable's value that has changed
    /// since is dropped at start-up.
    ConfigChange,
    /// An override stays until it is set to `null`, whatever the deployment says.
    Never,
}

fn parse_overrides_lapse(layers: &Layers) -> Result<OverridesLapse, ConfigError> {
    Ok(match layers.choice(&v::OVERRIDES_LAPSE)? {
        Some("never") => OverridesLapse::Never,
        _ => OverridesLapse::ConfigChange,
    })
}

fn parse_log_format(layers: &Layers) -> Result<LogFormat, ConfigError> {
    Ok(match layers.choice(&v::LOG_FORMAT)? {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Text,
    })
}

/// The capacity gate's settings; the Service Bus-compatible variables read by the
/// contract's forgiving rules (never refused).
fn capacity_settings(layers: &Layers) -> Result<CapacitySettings, ConfigError> {
    Ok(CapacitySettings {
        max_queue_depth: forgiving_max_depth(layers.value(&v::SERVICEBUS_SEND_MAX_QUEUE_DEPTH)),
        fail_closed: forgiving_flag(layers.value(&v::SERVICEBUS_SEND_FAILCLOSED)),
        fail_closed_streak: forgiving_streak(layers.value(&v::SERVICEBUS_SEND_FAILCLOSED_STREAK)),
        depth_ttl: layers.duration(&v::DEPTH_TTL_MS)?,
        admin_timeout: layers.duration(&v::ADMIN_TIMEOUT_MS)?,
        retry_after_max: layers.duration(&v::RETRY_AFTER_MAX_S)?,
        resume_below: layers.fraction(&v::RESUME_BELOW)?,
    })
}

/// The transport's bounds on connections and their heads.
fn connection_limits(
    layers: &Layers,
    send_timeout: Duration,
) -> Result<ConnectionLimits, ConfigError> {
    Ok(ConnectionLimits {
        header_timeout: layers.duration(&v::HEADER_TIMEOUT_MS)?,
        max_head_bytes: layers.count(&v::MAX_HEAD_BYTES)? as usize,
        head_budget: layers.count(&v::MAX_BUFFERED_HEAD_BYTES)? as usize,
        max_connections: layers.count(&v::MAX_CONNECTIONS)? as usize,
        per_peer: layers.count(&v::MAX_CONNECTIONS_PER_PEER)? as usize,
        // Longer than any request can take under its own deadlines (the body's, then
        // the send's, with the admission reads between): only a connection whose
        // framing the transport lost, or whose client reads no answer, reaches it.
        answer_timeout: send_timeout * 3 + Duration::from_secs(5),
    })
}

/// The body's own deadline: set, it may not exceed the send deadline (a body still
/// arriving when the send would have timed out is a send that cannot finish); unset, 5 s or
/// the send deadline, the shorter.
fn body_timeout(layers: &Layers, send_timeout: Duration) -> Result<Duration, ConfigError> {
    match layers.optional_duration(&v::BODY_TIMEOUT_MS)? {
        None => Ok(send_timeout.min(Duration::from_secs(5))),
        Some(t) if t > send_timeout => Err(ConfigError::other(
            &v::BODY_TIMEOUT_MS,
            format!(
                "must be at most SENDGATE_SEND_TIMEOUT_MS ({} ms)",
                send_timeout.as_millis()
            ),
        )),
        Some(t) => Ok(t),
    }
}

/// The window ends every drain, so a linger past it could never be honoured: refused when
/// set so (exit 2, like the body deadline), and the default shortened to fit.
fn drain_linger(layers: &Layers, drain_timeout: Duration) -> Result<Duration, ConfigError> {
    match layers.optional_duration(&v::DRAIN_LINGER_S)? {
        None => Ok(drain_timeout.min(DEFAULT_DRAIN_LINGER)),
        Some(t) if t > drain_timeout => Err(ConfigError::other(
            &v::DRAIN_LINGER_S,
            format!(
                "must be at most SENDGATE_DRAIN_TIMEOUT_S ({} s)",
                drain_timeout.as_secs()
            ),
        )),
        Some(t) => Ok(t),
    }
}

/// Long enough for a load balancer to see readiness fail and stop routing here (Kubernetes
/// endpoints and Container Apps' ingress take a few seconds to propagate).
const DEFAULT_DRAIN_LINGER: Duration = Duration::from_secs(5);

/// Room for at least one body of the largest size, or no full-size send could ever pass.
/// What a connection may take (`SENDGATE_HEADER_TIMEOUT_MS`, `SENDGATE_MAX_HEAD_BYTES`,
/// `SENDGATE_MAX_BUFFERED_HEAD_BYTES`, `SENDGATE_MAX_CONNECTIONS`,
/// `SENDGATE_MAX_CONNECTIONS_PER_PEER`), enforced by `crate::transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub max_head_bytes: usize,
    pub head_budget: usize,
    pub max_connections: usize,
    /// 0: no cap.
    pub per_peer: usize,
    /// Longest a request may wait for its answer to be written whole (see
    /// `crate::transport`): a safety net, not a deadline a client meets.
    pub answer_timeout: Duration,
}

/// The fair-share settings; a lower criticality never gets more of the ceiling than a
/// higher one (contract section 2: it is refused first).
fn fair_settings(layers: &Layers) -> Result<FairSettings, ConfigError> {
    let shed_at_sheddable = layers.fraction(&v::SHED_AT_SHEDDABLE)?;
    let shed_at_default = layers.fraction(&v::SHED_AT_DEFAULT)?;
    if shed_at_sheddable.get() > shed_at_default.get() {
        return Err(ConfigError::other(
            &v::SHED_AT_SHEDDABLE,
            format!(
                "must be at most SENDGATE_SHED_AT_DEFAULT ({}): a sheddable send is refused before a default one",
                shed_at_default.get()
            ),
        ));
    }
    Ok(FairSettings {
        mode: match layers.choice(&v::FAIR_SHARE)? {
            Some("off") => FairMode::Off,
            Some("shadow") => FairMode::Shadow,
            _ => FairMode::Enforce,
        },
        share_at: layers.fraction(&v::FAIR_SHARE_AT)?,
        shed_at_sheddable,
        shed_at_default,
    })
}

fn max_buffered_bytes(layers: &Layers, max_body_bytes: usize) -> Result<usize, ConfigError> {
    let n = layers.count(&v::MAX_BUFFERED_BYTES)?;
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if n < max_body_bytes {
        return Err(ConfigError::other(
            &v::MAX_BUFFERED_BYTES,
            format!("must be at least SENDGATE_MAX_BODY_BYTES ({max_body_bytes})"),
        ));
    }
    Ok(n)
}

/// A batch holds at least one largest body, and fits the memory budget for bodies (the
/// default shrinks to a smaller budget; a value set past it is refused).
fn max_batch_bytes(
    layers: &Layers,
    max_body_bytes: usize,
    max_buffered_bytes: usize,
) -> Result<usize, ConfigError> {
    let mut n = usize::try_from(layers.count(&v::MAX_BATCH_BYTES)?).unwrap_or(usize::MAX);
    if !layers.is_set(&v::MAX_BATCH_BYTES) {
        n = n.min(max_buffered_bytes).max(max_body_bytes);
    }
    if n < max_body_bytes {
        return Err(ConfigError::other(
            &v::MAX_BATCH_BYTES,
            format!("must be at least SENDGATE_MAX_BODY_BYTES ({max_body_bytes})"),
        ));
    }
    if n > max_buffered_bytes {
        return Err(ConfigError::other(
            &v::MAX_BATCH_BYTES,
            format!("must be at most SENDGATE_MAX_BUFFERED_BYTES ({max_buffered_bytes})"),
        ));
    }
    Ok(n)
}

/// The environment as text. `std::env::vars` panics on a name or value that is not
/// UTF-8; another program's variable like that is none of our business and is skipped,
/// while one of ours is refused (its value never shown: it may be a secret).
fn text_environment(
    vars: impl Iterator<Item = (OsString, OsString)>,
) -> Result<HashMap<String, String>, ConfigError> {
    let mut env = HashMap::new();
    for (name, value) in vars {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => {
                env.insert(name, value);
            }
            (Ok(name), Err(_)) => {
                if let Some(var) = v::find(&name) {
                    return Err(ConfigError::other(var, "is not valid UTF-8"));
                }
                if name.starts_with("SENDGATE_") {
                    // Refused as unknown by the layers, as it would be with a text value.
                    env.insert(name, String::new());
                }
            }
            (Err(name), _) => {
                let name = name.to_string_lossy();
                if name.starts_with("SENDGATE_") {
                    return Err(ConfigError::UnknownVariable {
                        name: name.into_owned(),
                        suggestion: None,
                    });
                }
            }
        }
    }
    Ok(env)
}

fn parse_listen(layers: &Layers) -> Result<SocketAddr, ConfigError> {
    let var = &v::LISTEN;
    let value = layers.value(var).unwrap_or_default();
    let reason = "expected IP:PORT, e.g. 127.0.0.1:8080 or [::]:8080";
    if let Some(port) = value.strip_prefix("localhost:") {
        let port = port
            .parse()
            .map_err(|_| ConfigError::invalid(var, value, reason))?;
        return Ok(SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port));
    }
    value
        .parse()
        .map_err(|_| ConfigError::invalid(var, value, reason))
}

fn parse_queues(layers: &Layers) -> Result<Vec<QueueName>, ConfigError> {
    let var = &v::QUEUES;
    let value = layers.value(var).unwrap_or_default();
    let mut queues: Vec<QueueName> = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let name = QueueName::parse(part)
            .map_err(|e| ConfigError::other(var, format!("{part:?}: {e}")))?;
        if !queues.contains(&name) {
            queues.push(name);
        }
    }
    if queues.is_empty() {
        return Err(ConfigError::invalid(var, value, "name at least one queue"));
    }
    Ok(queues)
}

fn parse_auth(layers: &Layers, listen: SocketAddr) -> Result<AuthSettings, ConfigError> {
    let keys_file = layers.path(&v::API_KEYS_FILE);
    let entra = entra_callers::parse(layers)?;
    let explicitly_none = layers.choice(&v::AUTH)?.is_some();
    let auth = match (keys_file, entra, explicitly_none) {
        (Some(_), _, true) => {
            return Err(ConfigError::other(
                &v::AUTH,
                "`none` cannot be combined with SENDGATE_API_KEYS_FILE",
            ))
        }
        (None, Some(_), true) => {
            return Err(ConfigError::other(
                &v::AUTH,
                "`none` cannot be combined with SENDGATE_ENTRA_TENANT_ID",
            ))
        }
        (None, None, explicitly_none) => AuthSettings::Open { explicitly_none },
        (keys_file, entra, false) => AuthSettings::Callers { keys_file, entra },
    };
    if auth
        == (AuthSettings::Open {
            explicitly_none: false,
        })
        && !listen.ip().is_loopback()
    {
        return Err(ConfigError::other(
            &v::API_KEYS_FILE,
            format!(
                "refusing to listen on non-loopback {listen} without API keys; set SENDGATE_API_KEYS_FILE, or SENDGATE_AUTH=none to run open on purpose"
            ),
        ));
    }
    Ok(auth)
}

fn parse_dispatch(layers: &Layers, has_fallback: bool) -> Result<DispatchSettings, ConfigError> {
    let force = match layers.choice(&v::FORCE_BACKEND)? {
        None => None,
        Some("fallback") if !has_fallback => {
            return Err(ConfigError::other(
                &v::FORCE_BACKEND,
                "fallback needs SENDGATE_FALLBACK_BACKEND",
            ))
        }
        Some("fallback") => Some(ForceBackend::Fallback),
        Some(_) => Some(ForceBackend::Primary),
    };
    Ok(DispatchSettings {
        breaker_window: layers.duration(&v::BREAKER_WINDOW_S)?,
        breaker_min_failures: u32::try_from(layers.count(&v::BREAKER_MIN_FAILURES)?)
            .unwrap_or(u32::MAX),
        breaker_failure_rate: layers.fraction(&v::BREAKER_FAILURE_RATE)?.get(),
        breaker_open: layers.duration(&v::BREAKER_OPEN_S)?,
        probe_interval: layers.duration(&v::PROBE_INTERVAL_S)?,
        force,
    })
}

#[cfg(test)]
mod tests;
