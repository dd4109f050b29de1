//! Microsoft Entra ID access tokens as callers' credentials (contract section 5): a bearer
//! token that is a JWT is verified here, and what it proves comes out as a [`Caller`]: the
//! calling application and the app roles it holds. Which queues, tenant or criticality that
//! application gets is `auth.rs`'s business (the keys file's `[[apps]]`); this module knows
//! nothing of queues, tenants or admission.
//!
//! A token is accepted only if every one of these holds, in this order:
//! - at most [`MAX_TOKEN_BYTES`], three base64url parts, a header that parses, `alg`
//!   exactly `RS256` (`none`, HMAC and every other algorithm refused before any key is
//!   looked at, so a token "signed" with a public key as an HMAC secret goes nowhere);
//! - a `kid` among the directory's signing keys (`keys.rs`: fetched, cached, refreshed);
//! - an RS256 signature by that key (ring, through `jsonwebtoken`);
//! - `exp` and `nbf` present and within [`LEEWAY`] of now, `aud` one of
//!   `SENDGATE_ENTRA_AUDIENCE`'s;
//! - `ver` `1.0` with `iss` `https://sts.windows.net/{tenant}/` and the application in
//!   `appid`, or `ver` `2.0` with `iss` the discovered issuer
//!   (`{authority}/{tenant}/v2.0`) and the application in `azp` (Microsoft's two token
//!   forms);
//! - `tid`, when present, the configured tenant;
//! - the application among `SENDGATE_ENTRA_ALLOWED_APPS`, when that is set.
//!
//! The token is never logged, never kept and never echoed; a refusal says why in the log
//! (at most one line a second), never in the answer.

pub mod keys;

#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde::Deserialize;

use crate::config::{EntraCallersSettings, Guid};
use keys::{Fetch, KeyCache, Missing};

/// The longest token looked at: Entra's are 1–3 KiB; a longer one is refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// How far `exp` and `nbf` may be off: clocks drift, a minute is plenty.
pub const LEEWAY: Duration = Duration::from_secs(60);

/// The app roles a token may carry (the API's app registration declares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppRole {
    /// `Sendgate.Sender`
    Sender,
    /// `Sendgate.Observer`
    Observer,
    /// `Sendgate.Admin`
    Admin,
}

impl AppRole {
    /// The role a `roles` value names, if it is one of sendgate's (others are ignored).
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "Sendgate.Sender" => Some(Self::Sender),
            "Sendgate.Observer" => Some(Self::Observer),
            "Sendgate.Admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// Microsoft's two access token forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenVersion {
    V1,
    V2,
}

/// What a valid token proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The calling application's client id (`azp` or `appid`).
    pub app: Guid,
    /// Sendgate's app roles among the token's `roles`; may be empty (then the caller is
    /// authenticated but may do nothing: `403`).
    pub roles: Vec<AppRole>,
    pub version: TokenVersion,
}

/// Why a token was refused: each is the same `401` to the caller; the reason goes only to
/// the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a JWT, or too long")]
    Malformed,
    #[error("not signed with RS256")]
    Algorithm,
    #[error("no signing keys in hand yet")]
    NoKeys,
    #[error("signed by a key the directory does not publish")]
    UnknownKey,
    #[error("the signature does not verify")]
    Signature,
    #[error("expired")]
    Expired,
    #[error("not valid yet")]
    NotYetValid,
    #[error("issued for another audience")]
    Audience,
    #[error("issued by another issuer, or of an unknown version")]
    Issuer,
    #[error("issued in another tenant")]
    Tenant,
    #[error("no calling application (azp or appid) that is a client id")]
    NoApplication,
    #[error("an application SENDGATE_ENTRA_ALLOWED_APPS does not list")]
    ApplicationNotAllowed,
    #[error(
        "a user's token obtained through an application (it has scp), not an application's own"
    )]
    Delegated,
}

impl Refusal {
    /// A stable word for the log's `reason` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Algorithm => "algorithm",
            Self::NoKeys => "no_keys",
            Self::UnknownKey => "unknown_kid",
            Self::Signature => "signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Audience => "audience",
            Self::Issuer => "issuer",
            Self::Tenant => "tenant",
            Self::NoApplication => "no_application",
            Self::ApplicationNotAllowed => "application_not_allowed",
            Self::Delegated => "delegated",
        }
    }
}

/// The claims read after the signature verified (`exp`, `nbf` and `aud` are checked by
/// `jsonwebtoken`).
#[derive(Deserialize)]
struct Claims {
    iss: String,
    ver: Option<String>,
    tid: Option<String>,
    azp: Option<String>,
    appid: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    /// Present in a delegated token (a user's, through an app): its `roles` are the user's
    /// and its `azp` may be any public client, so it names no calling application.
    scp: Option<serde::de::IgnoredAny>,
}

/// One line a second at most: a flood of bad tokens must not become a flood of lines.
static REFUSED_LOG: crate::telemetry::EveryPeriod =
    crate::telemetry::EveryPeriod::new(Duration::from_secs(1));

/// Verifies Entra ID access tokens for one tenant and audience.
pub struct EntraVerifier {
    keys: Arc<KeyCache>,
    validation: Validation,
    tenant: Guid,
    /// `https://sts.windows.net/{tenant}/`: v1 tokens' issuer, whatever the authority.
    v1_issuer: String,
    allowed: Option<HashSet<Guid>>,
}

impl EntraVerifier {
    /// A verifier fetching through `fetch`; nothing is fetched until [`Self::keep_fresh`]
    /// or a token asks.
    pub fn new(settings: &EntraCallersSettings, fetch: Arc<dyn Fetch>) -> Self {
        let mut validation = Validation::new(Algorithm::RS256);
        validation.algorithms = vec![Algorithm::RS256];
        validation.leeway = LEEWAY.as_secs();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_audience(&settings.audiences);
        validation.set_required_spec_claims(&["exp", "nbf", "aud", "iss"]);
        Self {
            keys: KeyCache::new(fetch, settings.discovery_url(), settings.tenant.as_str()),
            validation,
            tenant: settings.tenant.clone(),
            v1_issuer: format!("https://sts.windows.net/{}/", settings.tenant),
            allowed: settings
                .allowed_apps
                .as_ref()
                .map(|apps| apps.iter().cloned().collect()),
        }
    }

    /// The production verifier: fetches over HTTPS, and starts the background refresh
    /// (needs a Tokio runtime).
    pub fn start(settings: &EntraCallersSettings) -> Result<Self, String> {
        let verifier = Self::new(settings, Arc::new(keys::HttpFetch::new()?));
        verifier.keep_fresh();
        Ok(verifier)
    }

    /// Fetch the keys now and keep them fresh in the background.
    pub fn keep_fresh(&self) {
        self.keys.keep_fresh();
    }

    pub fn keys(&self) -> &Arc<KeyCache> {
        &self.keys
    }

    /// Whether `allowed` (when set) lets `app` in.
    pub fn allows(&self, app: &Guid) -> bool {
        self.allowed.as_ref().is_none_or(|apps| apps.contains(app))
    }

    /// The caller a token proves, or why it proves nothing (logged, at most once a second).
    pub async fn verify(&self, token: &str) -> Result<Caller, Refusal> {
        let verdict = self.check(token).await;
        if let Err(refusal) = verdict {
            if let Some(held_back) = REFUSED_LOG.admit() {
                tracing::info!(
                    event = "entra_token_refused",
                    reason = refusal.as_str(),
                    held_back,
                    "an Entra ID token was refused: {refusal}"
                );
            }
        }
        verdict
    }

    async fn check(&self, token: &str) -> Result<Caller, Refusal> {
        if token.len() > MAX_TOKEN_BYTES || !looks_like_jwt(token) {
            return Err(Refusal::Malformed);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Malformed)?;
        if header.alg != Algorithm::RS256 {
            return Err(Refusal::Algorithm);
        }
        let kid = header.kid.ok_or(Refusal::UnknownKey)?;
        let (key, set) = self.keys.key(&kid).await.map_err(|missing| match missing {
            Missing::NoKeys => Refusal::NoKeys,
            Missing::UnknownKid => Refusal::UnknownKey,
        })?;
        let claims = jsonwebtoken::decode::<Claims>(token, &key, &self.validation)
            .map_err(|e| refusal_of(e.kind()))?
            .claims;
        let (version, app) = match claims.ver.as_deref() {
            Some("1.0") if claims.iss == self.v1_issuer => (TokenVersion::V1, claims.appid),
            Some("2.0") if claims.iss == set.discovery.issuer => (TokenVersion::V2, claims.azp),
            _ => return Err(Refusal::Issuer),
        };
        if claims
            .tid
            .is_some_and(|tid| Guid::parse(&tid).as_ref() != Some(&self.tenant))
        {
            return Err(Refusal::Tenant);
        }
        if claims.scp.is_some() {
            return Err(Refusal::Delegated);
        }
        let app = app
            .as_deref()
            .and_then(Guid::parse)
            .ok_or(Refusal::NoApplication)?;
        if !self.allows(&app) {
            return Err(Refusal::ApplicationNotAllowed);
        }
        let mut roles: Vec<AppRole> = Vec::new();
        for role in claims.roles.iter().filter_map(|r| AppRole::parse(r)) {
            if !roles.contains(&role) {
                roles.push(role);
            }
        }
        Ok(Caller {
            app,
            roles,
            version,
        })
    }
}

/// Three non-empty parts of base64url (the signature may be empty only for `alg: none`,
/// which is refused anyway): how a bearer is told apart from an API key (`sg_<hex>`).
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = 0;
    for part in token.split('.') {
        parts += 1;
        let base64url = part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !base64url || (parts < 3 && part.is_empty()) {
            return false;
        }
    }
    parts == 3
}

fn refusal_of(kind: &ErrorKind) -> Refusal {
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat
        | ErrorKind::Crypto(_) => Refusal::Signature,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Refusal::Algorithm,
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidAudience => Refusal::Audience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => Refusal::Audience,
        ErrorKind::InvalidIssuer => Refusal::Issuer,
        _ => Refusal::Malformed,
    }
}
