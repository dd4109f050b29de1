//! From the `SERVICEBUS_*` settings to where the backend sends and with which credential:
//! every inconsistency is found here, at start-up, naming the variable to fix.

use crate::config::ServiceBusSettings;
use crate::domain::QueueName;

use super::auth::{ConnectionString, ConnectionStringError};

/// The public-cloud suffix added to a bare namespace name (`myns`).
const PUBLIC_CLOUD_SUFFIX: &str = ".servicebus.windows.net";

/// Where the calls go and how each plane authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `https://{namespace}` or `SERVICEBUS_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    /// Sends (the data plane): needs the Send right.
    pub send: CredentialPlan,
    /// Depth reads (the management plane): needs Manage, or the Data Owner role.
    pub manage: CredentialPlan,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialPlan {
    Sas(ConnectionString),
    EntraId,
}

/// A setting that cannot work; shown as `{var}: {message}`, never with a key in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {message}")]
pub struct SettingError {
    pub var: &'static str,
    pub message: String,
}

fn setting(var: &'static str, message: impl Into<String>) -> SettingError {
    SettingError {
        var,
        message: message.into(),
    }
}

pub fn resolve(settings: &ServiceBusSettings, queues: &[QueueName]) -> Result<Plan, SettingError> {
    let parse = |var: &'static str, raw: Option<&str>| {
        raw.map(ConnectionString::parse)
            .transpose()
            .map_err(|e: ConnectionStringError| setting(var, e.to_string()))
    };
    let send = parse(
        "SERVICEBUS_CONNECTION_STRING",
        settings.connection_string.as_ref().map(|s| s.expose()),
    )?;
    let manage = parse(
        "SERVICEBUS_MANAGE_CONNECTION_STRING",
        settings
            .manage_connection_string
            .as_ref()
            .map(|s| s.expose()),
    )?;
    let namespace = settings
        .namespace
        .as_deref()
        .map(normalize_namespace)
        .transpose()?;

    for (var, connection) in [
        ("SERVICEBUS_CONNECTION_STRING", &send),
        ("SERVICEBUS_MANAGE_CONNECTION_STRING", &manage),
    ] {
        let Some(connection) = connection else {
            continue;
        };
        // A key signs for its own namespace only: a mismatch could never authenticate.
        if let Some(ns) = &namespace {
            if *ns != connection.host {
                return Err(setting(
                    "SERVICEBUS_NAMESPACE",
                    format!(
                        "{ns} is not the namespace of {var} ({}); they must name the same namespace",
                        connection.host
                    ),
                ));
            }
        }
        if let Some(entity) = &connection.entity_path {
            if let Some(other) = queues
                .iter()
                .find(|q| !q.as_str().eq_ignore_ascii_case(entity))
            {
                return Err(setting(
                    var,
                    format!(
                        "its key is scoped to the queue {entity:?} (EntityPath) but SENDGATE_QUEUES also names {:?}",
                        other.as_str()
                    ),
                ));
            }
        }
    }
    if let (Some(s), Some(m)) = (&send, &manage) {
        if s.host != m.host {
            return Err(setting(
                "SERVICEBUS_MANAGE_CONNECTION_STRING",
                format!(
                    "its namespace ({}) differs from SERVICEBUS_CONNECTION_STRING's ({})",
                    m.host, s.host
                ),
            ));
        }
    }

    let endpoint = match settings.endpoint.as_deref() {
        Some(raw) => normalize_endpoint(raw)?,
        None => {
            let host = namespace
                .or_else(|| send.as_ref().map(|c| c.host.clone()))
                .or_else(|| manage.as_ref().map(|c| c.host.clone()))
                .ok_or_else(|| {
                    setting(
                        "SERVICEBUS_NAMESPACE",
                        "the servicebus backend needs a namespace: set SERVICEBUS_NAMESPACE (e.g. myns.servicebus.windows.net), or SERVICEBUS_CONNECTION_STRING, or SERVICEBUS_ENDPOINT",
                    )
                })?;
            format!("https://{host}")
        }
    };

    let manage = match (manage, &send) {
        (Some(m), _) => CredentialPlan::Sas(m),
        (None, Some(s)) => CredentialPlan::Sas(s.clone()),
        (None, None) => CredentialPlan::EntraId,
    };
    let send = send.map_or(CredentialPlan::EntraId, CredentialPlan::Sas);
    Ok(Plan {
        endpoint,
        send,
        manage,
    })
}

/// `myns`, `myns.servicebus.windows.net`, `https://myns.servicebus.windows.net/` → the host.
fn normalize_namespace(raw: &str) -> Result<String, SettingError> {
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
        return Err(setting(
            "SERVICEBUS_NAMESPACE",
            format!("expected a host name such as myns.servicebus.windows.net (got {raw:?})"),
        ));
    }
    Ok(if host.contains('.') {
        host.to_owned()
    } else {
        format!("{host}{PUBLIC_CLOUD_SUFFIX}")
    })
}

/// An `http(s)://host[:port][/path]` URL, without its trailing slash.
fn normalize_endpoint(raw: &str) -> Result<String, SettingError> {
    let bad = |why: &str| {
        setting(
            "SERVICEBUS_ENDPOINT",
            format!("{why}; expected e.g. https://myns.servicebus.windows.net (got {raw:?})"),
        )
    };
    let url = reqwest::Url::parse(raw.trim()).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(bad("no query, fragment or credentials allowed"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use std::collections::HashMap;

    const KEY: &str = "c2VjcmV0LWtleS0xMjM0NTY3ODkw";

    fn conn(host: &str, name: &str, entity: Option<&str>) -> String {
        let mut s =
            format!("Endpoint=sb://{host}/;SharedAccessKeyName={name};SharedAccessKey={KEY}");
        if let Some(e) = entity {
            s.push_str(&format!(";EntityPath={e}"));
        }
        s
    }

    fn plan_of(vars: &[(&str, &str)]) -> Result<Plan, SettingError> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let settings = Settings::from_vars(&env).unwrap();
        resolve(&settings.servicebus, &settings.queues)
    }

    fn key_name(p: &CredentialPlan) -> Option<&str> {
        match p {
            CredentialPlan::Sas(c) => Some(c.key_name.as_str()),
            CredentialPlan::EntraId => None,
        }
    }

    #[test]
    fn nothing_set_is_an_error_naming_servicebus_namespace() {
        let err = plan_of(&[]).unwrap_err();
        assert_eq!(err.var, "SERVICEBUS_NAMESPACE");
    }

    #[test]
    fn the_endpoint_comes_from_the_override_the_namespace_or_the_connection_string() {
        let cs = conn("fromconn.servicebus.windows.net", "send", None);
        let p = plan_of(&[("SERVICEBUS_CONNECTION_STRING", &cs)]).unwrap();
        assert_eq!(p.endpoint, "https://fromconn.servicebus.windows.net");

        let p = plan_of(&[("SERVICEBUS_NAMESPACE", "myns.servicebus.windows.net")]).unwrap();
        assert_eq!(p.endpoint, "https://myns.servicebus.windows.net");
        let p = plan_of(&[("SERVICEBUS_NAMESPACE", "MyNs")]).unwrap();
        assert_eq!(p.endpoint, "https://myns.servicebus.windows.net");
        let p = plan_of(&[(
            "SERVICEBUS_NAMESPACE",
            "https://myns.servicebus.windows.net/",
        )])
        .unwrap();
        assert_eq!(p.endpoint, "https://myns.servicebus.windows.net");

        let p = plan_of(&[
            ("SERVICEBUS_NAMESPACE", "myns.servicebus.windows.net"),
            ("SERVICEBUS_ENDPOINT", "http://127.0.0.1:9999/"),
        ])
        .unwrap();
        assert_eq!(p.endpoint, "http://127.0.0.1:9999");
    }

    #[test]
    fn bad_endpoints_and_namespaces_are_refused() {
        for bad in [
            "ftp://x",
            "not a url",
            "https://x/?a=b",
            "https://user:pw@x",
        ] {
            let err = plan_of(&[("SERVICEBUS_ENDPOINT", bad)]).unwrap_err();
            assert_eq!(err.var, "SERVICEBUS_ENDPOINT", "{bad}");
        }
        for bad in ["my ns", "ns/queue", "https://"] {
            let err = plan_of(&[("SERVICEBUS_NAMESPACE", bad)]).unwrap_err();
            assert_eq!(err.var, "SERVICEBUS_NAMESPACE", "{bad}");
        }
    }

    #[test]
    fn credentials_per_plane() {
        let send = conn("ns.servicebus.windows.net", "send", None);
        let manage = conn("ns.servicebus.windows.net", "manage", None);

        let p = plan_of(&[("SERVICEBUS_CONNECTION_STRING", &send)]).unwrap();
        assert_eq!(
            (key_name(&p.send), key_name(&p.manage)),
            (Some("send"), Some("send"))
        );

        let p = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &send),
            ("SERVICEBUS_MANAGE_CONNECTION_STRING", &manage),
        ])
        .unwrap();
        assert_eq!(
            (key_name(&p.send), key_name(&p.manage)),
            (Some("send"), Some("manage"))
        );

        let p = plan_of(&[("SERVICEBUS_NAMESPACE", "ns")]).unwrap();
        assert_eq!(
            (&p.send, &p.manage),
            (&CredentialPlan::EntraId, &CredentialPlan::EntraId)
        );

        let p = plan_of(&[("SERVICEBUS_MANAGE_CONNECTION_STRING", &manage)]).unwrap();
        assert_eq!(p.send, CredentialPlan::EntraId);
        assert_eq!(key_name(&p.manage), Some("manage"));
        assert_eq!(p.endpoint, "https://ns.servicebus.windows.net");
    }

    #[test]
    fn a_malformed_connection_string_names_its_variable_and_hides_the_key() {
        let raw = format!("Endpoint=http://ns/;SharedAccessKeyName=send;SharedAccessKey={KEY}");
        for var in [
            "SERVICEBUS_CONNECTION_STRING",
            "SERVICEBUS_MANAGE_CONNECTION_STRING",
        ] {
            let err = plan_of(&[(var, &raw)]).unwrap_err();
            assert_eq!(err.var, var);
            assert!(!err.to_string().contains(KEY), "{err}");
        }
    }

    #[test]
    fn namespaces_must_agree() {
        let cs = conn("a.servicebus.windows.net", "send", None);
        let err = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &cs),
            ("SERVICEBUS_NAMESPACE", "b.servicebus.windows.net"),
        ])
        .unwrap_err();
        assert_eq!(err.var, "SERVICEBUS_NAMESPACE");
        let other = conn("b.servicebus.windows.net", "manage", None);
        let err = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &cs),
            ("SERVICEBUS_MANAGE_CONNECTION_STRING", &other),
        ])
        .unwrap_err();
        assert_eq!(err.var, "SERVICEBUS_MANAGE_CONNECTION_STRING");
    }

    #[test]
    fn a_queue_scoped_key_serves_only_its_queue() {
        let cs = conn("ns.servicebus.windows.net", "send", Some("requests"));
        assert!(plan_of(&[("SERVICEBUS_CONNECTION_STRING", &cs)]).is_ok());
        let err = plan_of(&[
            ("SERVICEBUS_CONNECTION_STRING", &cs),
            ("SENDGATE_QUEUES", "requests,other"),
        ])
        .unwrap_err();
        assert_eq!(err.var, "SERVICEBUS_CONNECTION_STRING");
        assert!(err.message.contains("\"other\""), "{err}");
    }
}
