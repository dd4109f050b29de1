//! The syntax of a Service Bus connection string
//! (`Endpoint=sb://{host}/;SharedAccessKeyName={name};SharedAccessKey={key}`): a setting's
//! value, parsed while the settings are read, so a malformed one stops start-up naming its
//! variable. The backend signs with what this yields.

use super::secret::Secret;

/// `Endpoint=sb://{host}/;SharedAccessKeyName={name};SharedAccessKey={key}[;EntityPath={queue}]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionString {
    /// The namespace's host, lower case, e.g. `myns.servicebus.windows.net`.
    pub host: String,
    pub key_name: String,
    /// The SAS key: the one part never shown.
    pub key: Secret,
    /// Set when the key belongs to one queue rather than the namespace.
    pub entity_path: Option<String>,
}

/// Why a connection string was refused. No message ever contains the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionStringError {
    #[error("every part must be Name=value separated by ';'")]
    NotNameValue,
    /// `Endpoint=...,SharedAccessKeyName=...,SharedAccessKey=...`: one long Endpoint value
    /// holding the key, which must not be echoed back.
    #[error("parts must be separated by ';', not ','")]
    CommaSeparated,
    #[error("{0} appears twice")]
    Duplicate(&'static str),
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("Endpoint must look like sb://<namespace>.servicebus.windows.net/ (got {0:?})")]
    BadEndpoint(String),
    #[error("SharedAccessSignature connection strings are not supported; use SharedAccessKeyName and SharedAccessKey")]
    PresignedToken,
}

impl ConnectionString {
    pub fn parse(raw: &str) -> Result<Self, ConnectionStringError> {
        let mut endpoint = None;
        let mut key_name = None;
        let mut key = None;
        let mut entity_path = None;
        for part in raw.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or(ConnectionStringError::NotNameValue)?;
            let (slot, field) = match name.trim().to_ascii_lowercase().as_str() {
                "endpoint" => (&mut endpoint, "Endpoint"),
                "sharedaccesskeyname" => (&mut key_name, "SharedAccessKeyName"),
                "sharedaccesskey" => (&mut key, "SharedAccessKey"),
                "entitypath" => (&mut entity_path, "EntityPath"),
                "sharedaccesssignature" => return Err(ConnectionStringError::PresignedToken),
                // TransportType, UseDevelopmentEmulator, ...: nothing the REST client uses.
                _ => continue,
            };
            if value.contains(',') {
                return Err(ConnectionStringError::CommaSeparated);
            }
            if slot.replace(value.trim().to_owned()).is_some() {
                return Err(ConnectionStringError::Duplicate(field));
            }
        }
        let endpoint = endpoint
            .filter(|e| !e.is_empty())
            .ok_or(ConnectionStringError::Missing("Endpoint"))?;
        let host = endpoint_host(&endpoint)
            .ok_or_else(|| ConnectionStringError::BadEndpoint(shown_endpoint(&endpoint)))?;
        let key_name = key_name
            .filter(|k| !k.is_empty())
            .ok_or(ConnectionStringError::Missing("SharedAccessKeyName"))?;
        let key = key
            .filter(|k| !k.is_empty())
            .map(Secret::wrap)
            .ok_or(ConnectionStringError::Missing("SharedAccessKey"))?;
        let entity_path = entity_path
            // `/orders/`, ` / orders`: neither slashes nor spaces are part of a queue name.
            .map(|p| {
                p.trim_matches(|c: char| c == '/' || c.is_whitespace())
                    .to_owned()
            })
            .filter(|p| !p.is_empty());
        Ok(Self {
            host,
            key_name,
            key,
            entity_path,
        })
    }
}

/// What [`ConnectionStringError::BadEndpoint`] says instead of an Endpoint value that
/// may hold the key.
pub const ENDPOINT_NOT_SHOWN: &str = "a value that holds more than an endpoint; not shown";

/// An Endpoint value fit to print: one holding `=` or spaces has swallowed other parts
/// (perhaps the key), so it is not shown.
fn shown_endpoint(endpoint: &str) -> String {
    if endpoint.contains('=') || endpoint.contains(char::is_whitespace) {
        ENDPOINT_NOT_SHOWN.to_owned()
    } else {
        endpoint.to_owned()
    }
}

/// `sb://host/` → `host` (lower case); `None` for anything else.
fn endpoint_host(endpoint: &str) -> Option<String> {
    let scheme_end = endpoint.find("://")?;
    if !endpoint[..scheme_end].eq_ignore_ascii_case("sb") {
        return None;
    }
    let rest = &endpoint[scheme_end + 3..];
    let host = rest.strip_suffix('/').unwrap_or(rest);
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    valid.then(|| host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEND: &str = "Endpoint=sb://test.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0LWtleS0xMjM0NTY3ODkw";

    #[test]
    fn a_connection_string_parses_with_or_without_entity_path() {
        let c = ConnectionString::parse(SEND).unwrap();
        assert_eq!(c.host, "test.servicebus.windows.net");
        assert_eq!(c.key_name, "send");
        assert_eq!(c.key.expose(), "c2VjcmV0LWtleS0xMjM0NTY3ODkw");
        assert_eq!(c.entity_path, None);

        // Names in any case, spaces around parts, a key ending in '=', extra parts.
        let c = ConnectionString::parse(
            " endpoint=SB://MyNs.servicebus.windows.net ; sharedaccesskeyname=k;SharedAccessKey=abc==;EntityPath=orders;TransportType=Amqp;",
        )
        .unwrap();
        assert_eq!(c.host, "myns.servicebus.windows.net");
        assert_eq!(c.key.expose(), "abc==");
        assert_eq!(c.entity_path.as_deref(), Some("orders"));
    }

    #[test]
    fn an_entity_path_is_trimmed_of_spaces_inside_its_slashes_too() {
        // Found by the connection_string fuzz target: "/ orders" kept its space, so the
        // parsed value did not survive being written back (and named no queue).
        for raw in ["/ orders", "orders /", " / orders / "] {
            let c = ConnectionString::parse(&format!(
                "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=x;EntityPath={raw}"
            ))
            .unwrap();
            assert_eq!(c.entity_path.as_deref(), Some("orders"), "{raw:?}");
        }
        let c = ConnectionString::parse(
            "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=x;EntityPath= / ",
        )
        .unwrap();
        assert_eq!(c.entity_path, None);
    }

    #[test]
    fn malformed_connection_strings_are_refused_without_echoing_the_key() {
        let key = "TopSecretKeyValue";
        let cases = [
            (
                format!("SharedAccessKeyName=send;SharedAccessKey={key}"),
                ConnectionStringError::Missing("Endpoint"),
            ),
            (
                format!("Endpoint=sb://x.servicebus.windows.net/;SharedAccessKey={key}"),
                ConnectionStringError::Missing("SharedAccessKeyName"),
            ),
            (
                "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=send".into(),
                ConnectionStringError::Missing("SharedAccessKey"),
            ),
            (
                format!("Endpoint=https://x.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={key}"),
                ConnectionStringError::BadEndpoint("https://x.servicebus.windows.net/".into()),
            ),
            (
                format!("Endpoint=sb://;SharedAccessKeyName=send;SharedAccessKey={key}"),
                ConnectionStringError::BadEndpoint("sb://".into()),
            ),
            (
                format!("Endpoint=sb://x/;SharedAccessKeyName=send;{key}"),
                ConnectionStringError::NotNameValue,
            ),
            (
                format!("Endpoint=sb://x/;SharedAccessKeyName=a;SharedAccessKeyName=b;SharedAccessKey={key}"),
                ConnectionStringError::Duplicate("SharedAccessKeyName"),
            ),
            (
                format!("Endpoint=sb://x/;SharedAccessSignature=SharedAccessSignature sr=a&sig={key}"),
                ConnectionStringError::PresignedToken,
            ),
            (key.to_owned(), ConnectionStringError::NotNameValue),
            (
                format!("Endpoint=sb://x.servicebus.windows.net/,SharedAccessKeyName=send,SharedAccessKey={key}"),
                ConnectionStringError::CommaSeparated,
            ),
            (
                format!("SharedAccessKeyName=send,SharedAccessKey={key};Endpoint=sb://x/"),
                ConnectionStringError::CommaSeparated,
            ),
            (
                format!("Endpoint=sb://x.servicebus.windows.net/ SharedAccessKey={key}"),
                ConnectionStringError::BadEndpoint(
                    "a value that holds more than an endpoint; not shown".into(),
                ),
            ),
        ];
        for (raw, expected) in cases {
            let err = ConnectionString::parse(&raw).unwrap_err();
            assert_eq!(err, expected, "{raw}");
            assert!(!err.to_string().contains(key), "{err}");
        }
        let parsed = ConnectionString::parse(SEND).unwrap();
        assert!(!format!("{parsed:?}").contains("c2VjcmV0"));
    }
}
