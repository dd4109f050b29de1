//! One backend's settings, parsed through a scope: the primary's variables, or the
//! fallback's `SENDGATE_FALLBACK_` ones, each falling back to the primary's when unset.
//! Errors name the variable that was actually read.

use std::path::PathBuf;
use std::time::Duration;

use lapin::uri::AMQPUri;
use reqwest::Url;

use super::error::ConfigError;
use super::layers::Layers;
use super::secret::Secret;
use super::servicebus::{self, ServiceBusInput, ServiceBusSettings, Sourced};
use super::vars::{BackendVars, Var, FALLBACK_VARS, PRIMARY_VARS};
use crate::domain::QueueName;

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

/// The backend to open, with exactly the settings it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSettings {
    Embedded { data_dir: PathBuf },
    RabbitMq(RabbitMqSettings),
    ServiceBus(ServiceBusSettings),
}

impl BackendSettings {
    pub fn kind(&self) -> BackendKind {
        match self {
            Self::Embedded { .. } => BackendKind::Embedded,
            Self::RabbitMq(_) => BackendKind::RabbitMq,
            Self::ServiceBus(_) => BackendKind::ServiceBus,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepthSource {
    Management,
    Amqp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RabbitMqSettings {
    /// The data plane, parsed; secret because it holds the password.
    pub uri: Secret<AMQPUri>,
    /// The admin plane's base URL.
    pub management_url: Url,
    /// The admin-plane user: `SENDGATE_RABBITMQ_MANAGEMENT_USER`, else the AMQP URL's.
    pub management_user: String,
    /// The admin-plane password: `SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD`, else the AMQP URL's.
    pub management_password: Secret,
    pub depth_source: DepthSource,
    /// How far the management API's counts trail the data plane, when set: the lag in
    /// force is the longer of this and the one derived from the broker (see
    /// `backend::rabbitmq::stats`); unset, the derived one alone.
    pub stats_lag: Option<Duration>,
}

/// Which variables a backend is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Primary,
    /// `SENDGATE_FALLBACK_*`, each unset one read from the primary's variable.
    Fallback,
}

impl Scope {
    fn vars(self) -> &'static BackendVars {
        match self {
            Self::Primary => &PRIMARY_VARS,
            Self::Fallback => &FALLBACK_VARS,
        }
    }
}

/// A scope over the layers: picks, for each setting, the variable to read.
struct Scoped<'a> {
    layers: &'a Layers,
    scope: Scope,
}

impl Scoped<'_> {
    /// The scope's own variable when it is set, else the primary's (whose default applies).
    fn pick(&self, setting: fn(&BackendVars) -> &'static Var) -> &'static Var {
        let own = setting(self.scope.vars());
        if self.scope == Scope::Primary || self.layers.is_set(own) {
            own
        } else {
            setting(&PRIMARY_VARS)
        }
    }

    fn sourced(&self, setting: fn(&BackendVars) -> &'static Var) -> Option<Sourced<'_>> {
        let var = self.pick(setting);
        self.layers.value(var).map(|value| Sourced { var, value })
    }
}

/// The backend of `scope`: `None` for a fallback that is not configured.
pub fn parse(
    layers: &Layers,
    scope: Scope,
    queues: &[QueueName],
) -> Result<Option<BackendSettings>, ConfigError> {
    let scoped = Scoped { layers, scope };
    let kind = match layers.choice(scope.vars().kind)? {
        None => return Ok(None),
        Some("rabbitmq") => BackendKind::RabbitMq,
        Some("servicebus") => BackendKind::ServiceBus,
        Some(_) => BackendKind::Embedded,
    };
    Ok(Some(match kind {
        BackendKind::Embedded => BackendSettings::Embedded {
            data_dir: layers.path(scoped.pick(|v| v.data_dir)).unwrap_or_default(),
        },
        BackendKind::RabbitMq => BackendSettings::RabbitMq(rabbitmq(&scoped)?),
        BackendKind::ServiceBus => {
            let input = ServiceBusInput {
                namespace: scoped.sourced(|v| v.servicebus_namespace),
                connection_string: scoped.sourced(|v| v.servicebus_connection_string),
                endpoint: scoped.sourced(|v| v.servicebus_endpoint),
                manage_connection_string: scoped.sourced(|v| v.servicebus_manage_connection_string),
                managed_identity_client_id: scoped
                    .sourced(|v| v.servicebus_managed_identity_client_id)
                    .map(|s| s.value),
                max_batch_bytes: layers.count(scoped.pick(|v| v.servicebus_max_batch_bytes))?,
                namespace_var: scoped.pick(|v| v.servicebus_namespace),
                arm_depth: layers.choice(scoped.pick(|v| v.servicebus_depth_source))?
                    == Some("arm"),
                arm_namespace_id: scoped.sourced(|v| v.servicebus_arm_namespace_id),
                arm_endpoint: scoped.sourced(|v| v.servicebus_arm_endpoint),
                arm_namespace_id_var: scoped.pick(|v| v.servicebus_arm_namespace_id),
            };
            BackendSettings::ServiceBus(servicebus::resolve(&input, queues)?)
        }
    }))
}

fn rabbitmq(scoped: &Scoped<'_>) -> Result<RabbitMqSettings, ConfigError> {
    let layers = scoped.layers;
    let url_var = scoped.pick(|v| v.rabbitmq_url);
    let uri = parse_amqp_uri(url_var, layers.value(url_var).unwrap_or_default())?;
    let management_var = scoped.pick(|v| v.rabbitmq_management_url);
    let management_url = parse_management_url(
        management_var,
        layers.value(management_var).unwrap_or_default(),
    )?;
    let depth_source = match layers.choice(scoped.pick(|v| v.rabbitmq_depth_source))? {
        Some("amqp") => DepthSource::Amqp,
        _ => DepthSource::Management,
    };
    let management_user = layers
        .text(scoped.pick(|v| v.rabbitmq_management_user))
        .unwrap_or_else(|| uri.authority.userinfo.username.clone());
    let management_password = layers
        .secret(scoped.pick(|v| v.rabbitmq_management_password))
        .unwrap_or_else(|| Secret::new(&uri.authority.userinfo.password));
    Ok(RabbitMqSettings {
        uri: Secret::wrap(uri),
        management_url,
        management_user,
        management_password,
        depth_source,
        stats_lag: layers.optional_duration(scoped.pick(|v| v.rabbitmq_stats_lag_ms))?,
    })
}

/// lapin's own parse error quotes the whole input ("Invalid URL: 'amqp://user:pw@…'"), so
/// the reason is ours, built from the `url` crate's message (which never quotes input).
fn parse_amqp_uri(var: &'static Var, raw: &str) -> Result<AMQPUri, ConfigError> {
    let refuse = |why: &str| {
        ConfigError::invalid(
            var,
            raw,
            format!("{why}; expected e.g. amqp://user:password@host:5672/%2f"),
        )
    };
    let url = Url::parse(raw).map_err(|e| refuse(&format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "amqp" | "amqps") {
        return Err(refuse("the scheme must be amqp or amqps"));
    }
    if url.cannot_be_a_base() || url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("no host"));
    }
    // What lapin still refuses here: a number, UTF-8 in the user info, or the
    // auth_mechanism, which it quotes lower-cased (so a password typed there would pass a
    // comparison with the URL's). Only its messages that quote nothing (no `:`) are shown.
    raw.parse::<AMQPUri>().map_err(|lapin_says| {
        refuse(if lapin_says.starts_with("Invalid SASL mechanism") {
            "auth_mechanism must be plain, amqplain, external, anonymous or rabbit-cr-demo"
        } else if lapin_says.contains(':') || lapin_says.contains(raw) {
            "not a valid AMQP URI"
        } else {
            &lapin_says
        })
    })
}

/// Credentials in this URL would never be used (the admin plane authenticates with
/// `SENDGATE_RABBITMQ_MANAGEMENT_USER`/`_PASSWORD`) yet would be printed by `Debug` and by
/// every failed depth read (reqwest's errors name the URL): refused, and never echoed, even
/// when the URL does not parse.
fn parse_management_url(var: &'static Var, raw: &str) -> Result<Url, ConfigError> {
    let may_hold_credentials = raw.contains('@');
    let refuse = |why: String| {
        if may_hold_credentials {
            ConfigError::other(
                var,
                format!("{why} (value not shown: it may hold a password)"),
            )
        } else {
            ConfigError::invalid(var, raw, why)
        }
    };
    let url = Url::parse(raw).map_err(|e| refuse(format!("not a URL: {e}")))?;
    if url.cannot_be_a_base() || !matches!(url.scheme(), "http" | "https") {
        return Err(refuse("not an http(s) base URL".to_owned()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::other(
            var,
            "no credentials allowed in the URL; set SENDGATE_RABBITMQ_MANAGEMENT_USER and SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD",
        ));
    }
    Ok(url)
}
