//! Microsoft Entra ID access tokens as callers' credentials (contract section 5): whose
//! tokens, for which API, from where. Nothing here touches the network: discovery happens
//! once the gateway runs.

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
}
