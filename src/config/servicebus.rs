//! From the `SERVICEBUS_*` variables (or the fallback's) to where the backend sends and
//! with which credential: every inconsistency is found here, while the settings are
//! parsed, naming the variable the operator set.

use super::connection_string::ConnectionString;
use super::error::ConfigError;
use super::vars::Var;
use crate::domain::QueueName;

/// The public-cloud suffix added to a bare namespace name (`myns`).
const PUBLIC_CLOUD_SUFFIX: &str = ".servicebus.windows.net";

/// The Service Bus backend, resolved: where the calls go and how each plane authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceBusSettings {
    /// `https://{namespace}` or `SERVICEBUS_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    /// Sends (the data plane): needs the Send right.
    pub send: CredentialPlan,
    /// Depth reads on the management plane: needs Manage, or the Data Owner role. Unused
    /// with the ARM depth source.
    pub manage: CredentialPlan,
    /// Where the backlog is read.
    pub depth_source: ServiceBusDepthSource,
    /// A user-assigned managed identity, when Entra ID is used.
    pub managed_identity_client_id: Option<String>,
    /// The largest JSON body of one batch send (`SENDGATE_SERVICEBUS_MAX_BATCH_BYTES`): the
    /// tier's batch limit, which the namespace does not tell a sender over REST.
    pub max_batch_bytes: usize,
}

/// Where a queue's backlog is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceBusDepthSource {
    /// The namespace's management endpoint (ATOM `CountDetails`), with [`ServiceBusSettings::manage`].
    Management,
    /// Azure Resource Manager's queue resource, `{endpoint}{namespace_id}/queues/{queue}`,
    /// with an Entra ID token for `{endpoint}/.default`: Reader on the queue suffices.
    Arm {
        /// `https://management.azure.com`, without a trailing slash.
        endpoint: String,
        namespace_id: ArmNamespaceId,
    },
}

/// A Service Bus namespace's Azure resource id,
/// `/subscriptions/{id}/resourceGroups/{group}/providers/Microsoft.ServiceBus/namespaces/{name}`,
/// parsed once: the depth reads' URLs are built from it as it is, so a value that would
/// read another resource cannot be one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmNamespaceId(String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ArmNamespaceIdError {
    #[error("expected /subscriptions/{{id}}/resourceGroups/{{group}}/providers/Microsoft.ServiceBus/namespaces/{{name}}")]
    Shape,
    /// A URL resolves `.` and `..` away: `/subscriptions/../x` would read another path.
    #[error("a segment is {0:?}, which a URL resolves to another resource's path")]
    DotSegment(&'static str),
}

impl ArmNamespaceId {
    /// Segment names are compared without case (ARM's are case-insensitive); the values are
    /// ARM's characters (letters, digits and `-._()`), none of them `.` or `..`.
    pub fn parse(text: &str) -> Result<Self, ArmNamespaceIdError> {
        let id = text.trim();
        let parts: Vec<&str> = id.split('/').collect();
        let [empty, subscriptions, subscription, groups, group, providers, namespace_type, namespaces, name] =
            parts.as_slice()
        else {
            return Err(ArmNamespaceIdError::Shape);
        };
        let fixed = [
            (*subscriptions, "subscriptions"),
            (*groups, "resourceGroups"),
            (*providers, "providers"),
            (*namespace_type, "Microsoft.ServiceBus"),
            (*namespaces, "namespaces"),
        ];
        let valid = |v: &str| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '(' | ')'))
        };
        let shaped = empty.is_empty()
            && fixed
                .iter()
                .all(|(got, want)| got.eq_ignore_ascii_case(want))
            && [subscription, group, name].iter().all(|v| valid(v));
        if !shaped {
            return Err(ArmNamespaceIdError::Shape);
        }
        for value in [subscription, group, name] {
            match *value {
                "." => return Err(ArmNamespaceIdError::DotSegment(".")),
                ".." => return Err(ArmNamespaceIdError::DotSegment("..")),
                _ => {}
            }
        }
        Ok(Self(id.to_owned()))
    }

    /// The namespace's name: the last segment.
    pub fn name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or_default()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ArmNamespaceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A connection string's key never shows: it is a `Secret`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialPlan {
    Sas(ConnectionString),
    EntraId,
}

/// One value and the variable it was read from (the fallback's own, or the primary's).
#[derive(Debug, Clone, Copy)]
pub struct Sourced<'a> {
    pub var: &'static Var,
    pub value: &'a str,
}

/// What [`resolve`] reads, each value with the variable that set it.
pub struct ServiceBusInput<'a> {
    pub namespace: Option<Sourced<'a>>,
    pub connection_string: Option<Sourced<'a>>,
    pub endpoint: Option<Sourced<'a>>,
    pub manage_connection_string: Option<Sourced<'a>>,
    pub managed_identity_client_id: Option<&'a str>,
    /// Already within its variable's bounds (the layers check them).
    pub max_batch_bytes: u64,
    /// `arm` when the ARM depth source is chosen (the layers checked the word).
    pub arm_depth: bool,
    pub arm_namespace_id: Option<Sourced<'a>>,
    /// Set or defaulted.
    pub arm_endpoint: Option<Sourced<'a>>,
    /// Named in the "needs a namespace id" error.
    pub arm_namespace_id_var: &'static Var,
    /// Named in the "needs a namespace" error.
    pub namespace_var: &'static Var,
}

/// A parsed connection string and where it came from.
struct Connection {
    var: &'static Var,
    parsed: ConnectionString,
}

fn connection(source: Option<Sourced<'_>>) -> Result<Option<Connection>, ConfigError> {
    source
        .map(|s| {
            ConnectionString::parse(s.value)
                .map(|parsed| Connection { var: s.var, parsed })
                // The error names a part, never the key: safe to show.
                .map_err(|e| ConfigError::other(s.var, e.to_string()))
        })
        .transpose()
}

pub fn resolve(
    input: &ServiceBusInput<'_>,
    queues: &[QueueName],
) -> Result<ServiceBusSettings, ConfigError> {
    let send = connection(input.connection_string)?;
    let manage = connection(input.manage_connection_string)?;
    let namespace = input
        .namespace
        .map(|s| normalize_namespace(s).map(|host| (s.var, host)))
        .transpose()?;

    for connection in [&send, &manage].into_iter().flatten() {
        check_connection(connection, namespace.as_ref(), queues)?;
    }
    if let (Some(s), Some(m)) = (&send, &manage) {
        if s.parsed.host != m.parsed.host {
            return Err(ConfigError::other(
                m.var,
                format!(
                    "its namespace ({}) differs from {}'s ({})",
                    m.parsed.host, s.var.name, s.parsed.host
                ),
            ));
        }
    }

    let endpoint = match input.endpoint {
        Some(source) => normalize_endpoint(source, NAMESPACE_EXAMPLE)?,
        None => {
            let host = namespace
                .map(|(_, host)| host)
                .or_else(|| send.as_ref().map(|c| c.parsed.host.clone()))
                .or_else(|| manage.as_ref().map(|c| c.parsed.host.clone()))
                .ok_or_else(|| {
                    ConfigError::other(
                        input.namespace_var,
                        "the servicebus backend needs a namespace: set SERVICEBUS_NAMESPACE (e.g. myns.servicebus.windows.net), or SERVICEBUS_CONNECTION_STRING, or SERVICEBUS_ENDPOINT",
                    )
                })?;
            format!("https://{host}")
        }
    };

    let manage = match (manage, &send) {
        (Some(m), _) => CredentialPlan::Sas(m.parsed),
        (None, Some(s)) => CredentialPlan::Sas(s.parsed.clone()),
        (None, None) => CredentialPlan::EntraId,
    };
    let send = send.map_or(CredentialPlan::EntraId, |c| CredentialPlan::Sas(c.parsed));
    let depth_source = depth_source(input, &endpoint)?;
    Ok(ServiceBusSettings {
        endpoint,
        send,
        manage,
        depth_source,
        managed_identity_client_id: input.managed_identity_client_id.map(str::to_owned),
        // At most 1 MiB (its bounds): it fits a usize on every target.
        max_batch_bytes: usize::try_from(input.max_batch_bytes).unwrap_or(usize::MAX),
    })
}

/// The ARM depth source needs the namespace's resource id, and it must name the namespace
/// the sends go to when that can be told (a `*.servicebus.*` host).
fn depth_source(
    input: &ServiceBusInput<'_>,
    endpoint: &str,
) -> Result<ServiceBusDepthSource, ConfigError> {
    if !input.arm_depth {
        return Ok(ServiceBusDepthSource::Management);
    }
    let Some(id) = input.arm_namespace_id else {
        return Err(ConfigError::other(
            input.arm_namespace_id_var,
            "the arm depth source needs the namespace's resource id, e.g. /subscriptions/{id}/resourceGroups/{group}/providers/Microsoft.ServiceBus/namespaces/{name}",
        ));
    };
    let namespace_id = ArmNamespaceId::parse(id.value)
        .map_err(|e| ConfigError::invalid(id.var, id.value, e.to_string()))?;
    let name = namespace_id.name();
    let host = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .to_ascii_lowercase();
    if let Some((first, _)) = host.split_once(".servicebus.") {
        if !first.eq_ignore_ascii_case(name) {
            return Err(ConfigError::other(
                id.var,
                format!("it names the namespace {name:?}, but the sends go to {host}"),
            ));
        }
    }
    let endpoint = match input.arm_endpoint {
        Some(source) => normalize_endpoint(source, PUBLIC_CLOUD_ARM)?,
        None => PUBLIC_CLOUD_ARM.to_owned(),
    };
    Ok(ServiceBusDepthSource::Arm {
        endpoint,
        namespace_id,
    })
}

/// A key signs for its own namespace only, and a queue-scoped key for its queue only: a
/// mismatch could never authenticate.
fn check_connection(
    connection: &Connection,
    namespace: Option<&(&'static Var, String)>,
    queues: &[QueueName],
) -> Result<(), ConfigError> {
    let host = &connection.parsed.host;
    if let Some((ns_var, ns)) = namespace {
        if ns != host {
            return Err(ConfigError::other(
                ns_var,
                format!(
                    "{ns} is not the namespace of {} ({host}); they must name the same namespace",
                    connection.var.name
                ),
            ));
        }
    }
    if let Some(entity) = &connection.parsed.entity_path {
        if let Some(other) = queues
            .iter()
            .find(|q| !q.as_str().eq_ignore_ascii_case(entity))
        {
            return Err(ConfigError::other(
                connection.var,
                format!(
                    "its key is scoped to the queue {entity:?} (EntityPath) but SENDGATE_QUEUES also names {:?}",
                    other.as_str()
                ),
            ));
        }
    }
    Ok(())
}

/// `myns`, `myns.servicebus.windows.net`, `https://myns.servicebus.windows.net/` → the host.
fn normalize_namespace(source: Sourced<'_>) -> Result<String, ConfigError> {
    let raw = source.value;
    let lower = raw.trim().to_ascii_lowercase();
    let host = ["https://", "sb://"]
        .iter()
        .find_map(|scheme| lower.strip_prefix(scheme))
        .unwrap_or(&lower);
    let host = host.strip_suffix('/').unwrap_or(host);
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
    if !valid {
        return Err(ConfigError::invalid(
            source.var,
            raw,
            "expected a host name such as myns.servicebus.windows.net",
        ));
    }
    Ok(if host.contains('.') {
        host.to_owned()
    } else {
        format!("{host}{PUBLIC_CLOUD_SUFFIX}")
    })
}

/// The example a bad namespace endpoint's error shows.
const NAMESPACE_EXAMPLE: &str = "https://myns.servicebus.windows.net";
/// The public cloud's Resource Manager: the default, and the example a bad ARM endpoint's
/// error shows.
const PUBLIC_CLOUD_ARM: &str = "https://management.azure.com";

/// An `http(s)://host[:port][/path]` URL, without its trailing slash; an error shows
/// `example`, a URL of the variable's own kind.
fn normalize_endpoint(source: Sourced<'_>, example: &str) -> Result<String, ConfigError> {
    let raw = source.value;
    let bad = |why: &str| {
        ConfigError::invalid(source.var, raw, format!("{why}; expected e.g. {example}"))
    };
    let url = reqwest::Url::parse(raw.trim()).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        // Not echoed: it holds credentials.
        return Err(ConfigError::other(
            source.var,
            format!("no credentials allowed in the URL; expected e.g. {example}"),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("no query or fragment allowed"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}
