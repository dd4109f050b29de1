//! `SENDGATE_ENTRA_*`: Microsoft Entra ID access tokens as callers' credentials (contract
//! section 5). On when `SENDGATE_ENTRA_TENANT_ID` is set; then the audience is required.
//! Nothing here touches the network: discovery happens once the gateway runs.

use reqwest::Url;

use super::error::ConfigError;
use super::layers::Layers;
use super::vars::{self as v, Var};

/// Where Entra ID answers unless `SENDGATE_ENTRA_AUTHORITY` says otherwise.
pub const PUBLIC_CLOUD: &str = "https://login.microsoftonline.com";

/// The most audiences `SENDGATE_ENTRA_AUDIENCE` may list: an API has an application id and
/// an app-id URI or two; a longer list is a mistake (a list of apps belongs in
/// `SENDGATE_ENTRA_ALLOWED_APPS`).
pub const MAX_AUDIENCES: usize = 4;

/// A GUID as Entra ID writes one: 8-4-4-4-12 hexadecimal digits, kept in lower case (a
/// tenant id, an application's client id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Guid(String);

impl Guid {
    pub fn parse(text: &str) -> Option<Self> {
        let groups: Vec<&str> = text.split('-').collect();
        let shape = [8, 4, 4, 4, 12];
        let fits = groups.len() == shape.len()
            && groups
                .iter()
                .zip(shape)
                .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
        fits.then(|| Self(text.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Guid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Entra ID callers: whose tokens, for which API, from where, and (optionally) which apps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntraCallersSettings {
    /// The directory whose tokens are accepted (`tid`, and both issuers name it).
    pub tenant: Guid,
    /// The `aud` values accepted: the API's application id and/or app-id URI.
    pub audiences: Vec<String>,
    /// `https://login.microsoftonline.com` or another cloud's; `http` only on loopback
    /// (tests). No trailing slash.
    pub authority: String,
    /// When set, the only applications (`azp`/`appid`) accepted.
    pub allowed_apps: Option<Vec<Guid>>,
}

impl EntraCallersSettings {
    /// `{authority}/{tenant}/v2.0/.well-known/openid-configuration`.
    pub fn discovery_url(&self) -> String {
        format!(
            "{}/{}/v2.0/.well-known/openid-configuration",
            self.authority, self.tenant
        )
    }
}

/// The Entra settings, or `None` when `SENDGATE_ENTRA_TENANT_ID` is unset (then none of
/// the others may be set: they would be ignored, which an operator would not expect).
pub(super) fn parse(layers: &Layers) -> Result<Option<EntraCallersSettings>, ConfigError> {
    let Some(raw) = layers.raw(&v::ENTRA_TENANT_ID) else {
        return none_set_without_a_tenant(layers).map(|()| None);
    };
    let tenant = tenant(raw)?;
    let audiences = audiences(layers)?;
    let authority = parse_authority(layers.value(&v::ENTRA_AUTHORITY).unwrap_or(PUBLIC_CLOUD))?;
    let allowed_apps = allowed_apps(layers)?;
    Ok(Some(EntraCallersSettings {
        tenant,
        audiences,
        authority,
        allowed_apps,
    }))
}

/// Without a tenant, the other Entra variables would be ignored: refused instead.
fn none_set_without_a_tenant(layers: &Layers) -> Result<(), ConfigError> {
    for var in [
        &v::ENTRA_AUDIENCE,
        &v::ENTRA_AUTHORITY,
        &v::ENTRA_ALLOWED_APPS,
    ] {
        if layers.is_set(var) {
            return Err(ConfigError::other(
                &v::ENTRA_TENANT_ID,
                format!("{} is set but SENDGATE_ENTRA_TENANT_ID is not: set the tenant to accept Entra ID tokens", var.name),
            ));
        }
    }
    Ok(())
}

fn tenant(raw: &str) -> Result<Guid, ConfigError> {
    Guid::parse(raw).ok_or_else(|| {
        ConfigError::invalid(
            &v::ENTRA_TENANT_ID,
            raw,
            "expected the directory's tenant id, a GUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
        )
    })
}

/// The accepted `aud` values: at least one, at most [`MAX_AUDIENCES`].
fn audiences(layers: &Layers) -> Result<Vec<String>, ConfigError> {
    let audiences = list(layers, &v::ENTRA_AUDIENCE);
    if audiences.is_empty() {
        return Err(ConfigError::other(
            &v::ENTRA_AUDIENCE,
            "required with SENDGATE_ENTRA_TENANT_ID: the API's application id or app-id URI (api://...)",
        ));
    }
    if audiences.len() > MAX_AUDIENCES {
        return Err(ConfigError::other(
            &v::ENTRA_AUDIENCE,
            format!(
                "at most {MAX_AUDIENCES} values (the API's application id and app-id URIs), not {}",
                audiences.len()
            ),
        ));
    }
    Ok(audiences)
}

/// The applications whose tokens are accepted; `None`: every application of the tenant.
///
/// Unset means every application of the tenant: an empty value, which would read as
/// unset (every other variable's does), or a list of nothing but commas must not open
/// the gateway to all of them, nor be taken to mean "none" (every token refused).
fn allowed_apps(layers: &Layers) -> Result<Option<Vec<Guid>>, ConfigError> {
    let names_none = || {
        ConfigError::other(
            &v::ENTRA_ALLOWED_APPS,
            "is set but names no application: list the client ids (GUIDs, comma-separated) whose tokens are accepted, or unset it to accept every application of the tenant",
        )
    };
    if layers.raw(&v::ENTRA_ALLOWED_APPS).is_none() {
        if layers.is_given_empty(&v::ENTRA_ALLOWED_APPS) {
            return Err(names_none());
        }
        return Ok(None);
    }
    let mut apps = Vec::new();
    for app in list(layers, &v::ENTRA_ALLOWED_APPS) {
        let id = Guid::parse(&app).ok_or_else(|| {
            ConfigError::invalid(
                &v::ENTRA_ALLOWED_APPS,
                &app,
                "expected applications' client ids, GUIDs, comma-separated",
            )
        })?;
        if !apps.contains(&id) {
            apps.push(id);
        }
    }
    if apps.is_empty() {
        return Err(names_none());
    }
    Ok(Some(apps))
}

/// A comma-separated list, each item trimmed, empty ones dropped, duplicates kept once.
fn list(layers: &Layers, var: &'static Var) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    for item in layers.value(var).unwrap_or_default().split(',') {
        let item = item.trim();
        if !item.is_empty() && !items.iter().any(|i| i == item) {
            items.push(item.to_owned());
        }
    }
    items
}

/// `https://host[:port][/path]`; `http` only on a loopback host (a local stub in tests):
/// keys fetched in the clear could be swapped by anyone on the path.
fn parse_authority(raw: &str) -> Result<String, ConfigError> {
    let var = &v::ENTRA_AUTHORITY;
    let url =
        Url::parse(raw).map_err(|e| ConfigError::invalid(var, raw, format!("not a URL ({e})")))?;
    let loopback = url.host_str().is_some_and(|host| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(ConfigError::invalid(
                var,
                raw,
                "must be https (http only on a loopback host, for tests)",
            ))
        }
        _ => return Err(ConfigError::invalid(var, raw, "expected an https:// URL")),
    }
    if url.host_str().is_none()
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(ConfigError::invalid(
            var,
            raw,
            "expected scheme, host and optional path only, e.g. https://login.microsoftonline.com",
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_are_five_groups_of_hex_kept_in_lower_case() {
        let id = Guid::parse("72F988BF-86f1-41af-91ab-2d7cd011db47").unwrap();
        assert_eq!(id.as_str(), "72f988bf-86f1-41af-91ab-2d7cd011db47");
        for bad in [
            "",
            "common",
            "72f988bf86f141af91ab2d7cd011db47",
            "72f988bf-86f1-41af-91ab-2d7cd011db4",
            "72f988bf-86f1-41af-91ab-2d7cd011db477",
            "72f988bf-86f1-41af-91ab-2d7cd011dbzz",
            "{72f988bf-86f1-41af-91ab-2d7cd011db47}",
            "72f988bf-86f1-41af-91ab-2d7cd011-db47",
        ] {
            assert_eq!(Guid::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_authority_is_https_or_http_on_loopback_only() {
        assert_eq!(
            parse_authority("https://login.microsoftonline.com/").unwrap(),
            "https://login.microsoftonline.com"
        );
        assert_eq!(
            parse_authority("http://127.0.0.1:4000").unwrap(),
            "http://127.0.0.1:4000"
        );
        assert_eq!(
            parse_authority("http://localhost:4000/x/").unwrap(),
            "http://localhost:4000/x"
        );
        assert!(parse_authority("http://[::1]:4000").is_ok());
        for bad in [
            "http://login.microsoftonline.com",
            "http://10.0.0.1",
            "ftp://127.0.0.1",
            "login.microsoftonline.com",
            "https://user:pw@login.microsoftonline.com",
            "https://login.microsoftonline.com/?x=1",
        ] {
            let e = parse_authority(bad).unwrap_err();
            assert_eq!(e.variable(), Some("SENDGATE_ENTRA_AUTHORITY"), "{bad}");
        }
    }
}
