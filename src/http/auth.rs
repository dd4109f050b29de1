//! Callers' credentials (contract section 5): API keys, Microsoft Entra ID access tokens,
//! or both.
//!
//! The keys file holds SHA-256 digests, never tokens. A request's bearer token is hashed
//! and compared with every key's digest in constant time, without stopping at a match,
//! so neither the comparison nor the position of a key in the file leaks through timing.
//!
//! With Entra ID on, a bearer that has a JWT's shape goes to the verifier
//! (`entra_auth/`) instead; what it proves (an application and its app roles) becomes a
//! [`Principal`] here: the keys file's `[[apps]]` entry for that application gives its
//! name, queues and fair-share fields exactly as a `[[keys]]` entry does; an application
//! without one is named by its client id, may use every queue, and shares the tenant
//! [`UNLISTED_APPS_TENANT`] with every other such application (so the tenants, and the
//! metrics labelled by them, stay those of the file).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use actix_web::http::header::AUTHORIZATION;
use actix_web::HttpRequest;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::entra_auth::{looks_like_jwt, AppRole, Caller, EntraVerifier};
use crate::admission::tenants::{
    Criticality, Quota, Rate, Tenant, TenantIndex, Tenants, MAX_TENANTS, MAX_WEIGHT,
};
use crate::config::{closest, Fraction, Guid};
use crate::domain::QueueName;

/// The tenant every Entra ID application without an `[[apps]]` entry sends as. A key or
/// an app entry may name it, to give it a weight or quotas.
pub const UNLISTED_APPS_TENANT: &str = "entra";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Sender,
    Observer,
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sender" => Some(Self::Sender),
            "observer" => Some(Self::Observer),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    fn of_app(role: AppRole) -> Self {
        match role {
            AppRole::Sender => Self::Sender,
            AppRole::Observer => Self::Observer,
            AppRole::Admin => Self::Admin,
        }
    }
}

/// The caller when no keys are configured: may do everything.
static ANONYMOUS: LazyLock<Arc<Principal>> = LazyLock::new(|| Arc::new(Principal::anonymous()));

/// What a route needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Send to a queue: role `sender` or `admin`.
    Send,
    /// Read `/health/detailed` and `/metrics`: role `observer` or `admin`.
    Observe,
    /// Operate the gateway (drain): role `admin`.
    Administer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum QueueScope {
    All,
    Only(Vec<String>),
}

/// The caller, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    roles: Vec<Role>,
    queues: QueueScope,
    /// Whose share of a queue's room its sends take (docs/fairness.md).
    pub tenant: TenantIndex,
    /// The highest criticality its sends may be made at.
    pub criticality: Criticality,
}

impl Principal {
    fn anonymous() -> Self {
        Self {
            name: "anonymous".into(),
            roles: vec![Role::Admin],
            queues: QueueScope::All,
            tenant: TenantIndex(0),
            criticality: Criticality::Default,
        }
    }

    pub fn may(&self, permission: Permission) -> bool {
        self.roles.iter().any(|role| {
            matches!(
                (role, permission),
                (Role::Admin, _)
                    | (Role::Sender, Permission::Send)
                    | (Role::Observer, Permission::Observe)
            )
        })
    }

    /// Whether this key's scope is every queue (`queues = ["*"]`): settings and breakers
    /// that serve every queue are changed only by such a key.
    pub fn may_use_every_queue(&self) -> bool {
        self.queues == QueueScope::All
    }

    pub fn may_use_queue(&self, queue: &QueueName) -> bool {
        match &self.queues {
            QueueScope::All => true,
            QueueScope::Only(names) => names.iter().any(|n| n == queue.as_str()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token")]
    Missing,
    /// A token was given and proves nothing: no key has its digest, or it is an Entra ID
    /// token that does not verify (why is logged by the verifier, never answered).
    #[error("unknown bearer token")]
    Unknown,
}

#[derive(Debug, thiserror::Error)]
pub enum KeysFileError {
    #[error("SENDGATE_API_KEYS_FILE: cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("SENDGATE_API_KEYS_FILE: {path}: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
    #[serde(default)]
    apps: Vec<AppEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: String,
    sha256: String,
    roles: Vec<String>,
    queues: Vec<String>,
    /// Keys of one tenant share its part of a queue's room; default: the key's name.
    tenant: Option<String>,
    /// The tenant's weight (1–1000, default 1), the same on every key of a tenant.
    weight: Option<u32>,
    /// `critical`, `default` or `sheddable`: the highest the key may send at (default
    /// `default`).
    criticality: Option<String>,
    /// The most of a queue's ceiling the tenant's admissions may hold (0 < x ≤ 1).
    max_share: Option<f64>,
    /// The tenant's rate quota, units a second over every queue (GCRA), and its burst.
    rate_per_s: Option<f64>,
    burst: Option<u32>,
}

/// An Entra ID application: a key's fields but `sha256`, plus its client id. Its roles
/// come from its token; `roles` here, when given, is the most it gets of them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppEntry {
    name: String,
    app_id: String,
    roles: Option<Vec<String>>,
    queues: Vec<String>,
    tenant: Option<String>,
    weight: Option<u32>,
    criticality: Option<String>,
    max_share: Option<f64>,
    rate_per_s: Option<f64>,
    burst: Option<u32>,
}

/// What a key and an app entry share, read the same way for both.
struct Grant {
    /// `key "name"` or `app "name"`, for the errors.
    who: String,
    name: String,
    roles: Option<Vec<String>>,
    queues: Vec<String>,
    tenant: Option<String>,
    criticality: Option<String>,
    asked: Asked,
}

impl From<KeyEntry> for Grant {
    fn from(e: KeyEntry) -> Self {
        Self {
            who: format!("key {:?}", e.name),
            name: e.name,
            roles: Some(e.roles),
            queues: e.queues,
            tenant: e.tenant,
            criticality: e.criticality,
            asked: Asked {
                weight: e.weight,
                max_share: e.max_share,
                rate_per_s: e.rate_per_s,
                burst: e.burst,
            },
        }
    }
}

impl AppEntry {
    fn split(self) -> (String, Grant) {
        let grant = Grant {
            who: format!("app {:?}", self.name),
            name: self.name,
            roles: self.roles,
            queues: self.queues,
            tenant: self.tenant,
            criticality: self.criticality,
            asked: Asked {
                weight: self.weight,
                max_share: self.max_share,
                rate_per_s: self.rate_per_s,
                burst: self.burst,
            },
        };
        (self.app_id, grant)
    }
}

/// A grant as read: the principal it makes, its roles `None` when an app entry leaves
/// them to the token.
struct Granted {
    principal: Principal,
    roles: Option<Vec<Role>>,
}

impl Grant {
    fn read(self, tenants: &mut TenantTable) -> Result<Granted, String> {
        let who = self.who;
        let roles = match self.roles {
            None => None,
            Some(roles) => {
                let roles = roles
                    .iter()
                    .map(|r| {
                        Role::parse(r).ok_or_else(|| {
                            format!("{who}: unknown role {r:?} (sender, observer, admin)")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if roles.is_empty() {
                    return Err(format!("{who}: give it at least one role"));
                }
                Some(roles)
            }
        };
        let queues = if self.queues.iter().any(|q| q == "*") {
            QueueScope::All
        } else {
            for q in &self.queues {
                QueueName::parse(q).map_err(|e| format!("{who}: queue {q:?}: {e}"))?;
            }
            QueueScope::Only(self.queues)
        };
        let criticality = match self.criticality.as_deref() {
            None => Criticality::Default,
            Some(word) => Criticality::parse(word).ok_or_else(|| {
                let words = Criticality::ALL.map(Criticality::as_str);
                let hint = closest(word, words.into_iter())
                    .map(|w| format!(" (did you mean {w:?}?)"))
                    .unwrap_or_default();
                format!("{who}: unknown criticality {word:?}{hint}: critical, default or sheddable")
            })?,
        };
        let tenant = tenants.place(
            &who,
            self.tenant.unwrap_or_else(|| self.name.clone()),
            self.asked,
        )?;
        Ok(Granted {
            principal: Principal {
                name: self.name,
                roles: roles.clone().unwrap_or_default(),
                queues,
                tenant,
                criticality,
            },
            roles,
        })
    }
}

/// Every field a key may have, for the "did you mean" of an unknown one.
const KEY_FIELDS: [&str; 10] = [
    "name",
    "sha256",
    "roles",
    "queues",
    "tenant",
    "weight",
    "criticality",
    "max_share",
    "rate_per_s",
    "burst",
];

/// Every field an app entry may have.
const APP_FIELDS: [&str; 10] = [
    "name",
    "app_id",
    "roles",
    "queues",
    "tenant",
    "weight",
    "criticality",
    "max_share",
    "rate_per_s",
    "burst",
];

/// The TOML parser's message, with the closest field named when it is an unknown one (of
/// the table it is in: `[[keys]]` or `[[apps]]`).
fn with_field_hint(text: &str, error: &toml::de::Error) -> String {
    let message = error.message();
    let unknown = message
        .split_once("unknown field `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(field, _)| field);
    let before = &text[..error.span().map_or(0, |s| s.start).min(text.len())];
    let in_apps = before.rfind("[[apps]]") > before.rfind("[[keys]]");
    let fields = if in_apps { APP_FIELDS } else { KEY_FIELDS };
    match unknown.and_then(|field| closest(field, fields.into_iter())) {
        Some(near) => format!("{message} (did you mean {near:?}?)"),
        None => message.to_owned(),
    }
}

/// One configured key: the digest of its token and who it stands for.
pub struct ApiKey {
    digest: [u8; 32],
    principal: Arc<Principal>,
}

/// One `[[apps]]` entry: who the application is here, and the most of its token's roles
/// it gets (`None`: all of sendgate's it holds).
struct ListedApp {
    principal: Principal,
    roles: Option<Vec<Role>>,
}

/// Entra ID callers: the verifier, the keys file's `[[apps]]`, and the tenant of the
/// applications it does not list.
pub struct EntraApps {
    verifier: EntraVerifier,
    listed: HashMap<Guid, ListedApp>,
    unlisted_tenant: TenantIndex,
}

impl EntraApps {
    /// The principal of a verified caller: its entry's, with the token's roles (within
    /// the entry's, when it gives any); else named by its client id, every queue, the
    /// shared tenant, the default criticality.
    fn principal(&self, caller: Caller) -> Principal {
        let held = caller.roles.into_iter().map(Role::of_app);
        match self.listed.get(&caller.app) {
            Some(app) => Principal {
                roles: held
                    .filter(|r| app.roles.as_ref().is_none_or(|most| most.contains(r)))
                    .collect(),
                ..app.principal.clone()
            },
            None => Principal {
                name: caller.app.to_string(),
                roles: held.collect(),
                queues: QueueScope::All,
                tenant: self.unlisted_tenant,
                criticality: Criticality::Default,
            },
        }
    }
}

/// Who may call, when anyone must prove it: keys, Entra ID applications, or both.
pub struct Callers {
    keys: Vec<ApiKey>,
    /// Boxed: the verifier is large, and most gateways run without it.
    entra: Option<Box<EntraApps>>,
    /// The tenants keys and apps name (index = [`TenantIndex`]).
    tenants: Tenants,
}

/// How requests are authenticated.
pub enum Authenticator {
    /// No keys configured: every caller may do everything (loopback, or `SENDGATE_AUTH=none`).
    Open,
    /// API keys, Entra ID tokens, or both.
    Callers(Callers),
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open => f.write_str("Open"),
            Self::Callers(callers) => f
                .debug_list()
                .entries(callers.keys.iter().map(|k| &k.principal.name))
                .entries(
                    callers
                        .entra
                        .iter()
                        .flat_map(|e| e.listed.values().map(|a| &a.principal.name)),
                )
                .finish(),
        }
    }
}

impl Authenticator {
    /// API keys from the file at `path` (no Entra ID).
    pub fn from_file(path: &Path) -> Result<Self, KeysFileError> {
        Self::from_parts(Some(path), None)
    }

    /// The keys file at `path` (if any) and the Entra ID verifier (if any): at least one.
    pub fn from_parts(
        path: Option<&Path>,
        entra: Option<EntraVerifier>,
    ) -> Result<Self, KeysFileError> {
        let shown = path.map(|p| p.display().to_string()).unwrap_or_default();
        let text = match path {
            None => None,
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| KeysFileError::Read {
                        path: shown.clone(),
                        source,
                    })?,
                )
            }
        };
        Self::parse(text.as_deref(), entra).map_err(|message| KeysFileError::Invalid {
            path: shown,
            message,
        })
    }

    /// API keys from the text of a keys file (no Entra ID).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        Self::parse(Some(text), None)
    }

    /// A keys file's text (if any) and the Entra ID verifier (if any).
    pub fn parse(text: Option<&str>, verifier: Option<EntraVerifier>) -> Result<Self, String> {
        let file: KeysFile = match text {
            Some(text) => toml::from_str(text).map_err(|e| with_field_hint(text, &e))?,
            None => KeysFile {
                keys: Vec::new(),
                apps: Vec::new(),
            },
        };
        file.check_ways_in(text.is_some(), verifier.is_some())?;
        let mut tenants = TenantTable::default();
        let keys = api_keys(file.keys, &mut tenants)?;
        let entra = match verifier {
            None => None,
            Some(verifier) => Some(Box::new(entra_apps(verifier, file.apps, &mut tenants)?)),
        };
        Ok(Self::Callers(Callers {
            keys,
            entra,
            tenants: tenants.finish()?,
        }))
    }

    /// The tenants sends are shared among: the keys file's, or open mode's one.
    pub fn tenants(&self) -> Tenants {
        match self {
            Self::Open => Tenants::open(),
            Self::Callers(callers) => callers.tenants.clone(),
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self, Self::Open)
    }

    /// The name of tenant `index` (none in open mode: its one tenant is nobody's).
    pub fn tenant_name(&self, index: TenantIndex) -> Option<&str> {
        match self {
            Self::Open => None,
            Self::Callers(callers) => callers.tenants.get(index).map(|t| t.name.as_str()),
        }
    }

    /// Whether API keys are a way in (a keys file with `[[keys]]`).
    pub fn accepts_keys(&self) -> bool {
        matches!(self, Self::Callers(c) if !c.keys.is_empty())
    }

    /// The Entra ID verifier, when Entra ID tokens are a way in.
    pub fn entra(&self) -> Option<&EntraVerifier> {
        match self {
            Self::Callers(Callers {
                entra: Some(entra), ..
            }) => Some(&entra.verifier),
            _ => None,
        }
    }

    /// The caller behind the request's bearer token; shared, so nothing is copied per
    /// request (a key's). A JWT goes to Entra ID when that is on; anything else, and every
    /// bearer with Entra off, to the keys.
    pub async fn authenticate(&self, req: &HttpRequest) -> Result<Arc<Principal>, AuthError> {
        let callers = match self {
            Self::Open => return Ok(ANONYMOUS.clone()),
            Self::Callers(callers) => callers,
        };
        let token = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or(AuthError::Missing)?;
        if let Some(entra) = &callers.entra {
            if looks_like_jwt(token) {
                let caller = entra
                    .verifier
                    .verify(token)
                    .await
                    .map_err(|_| AuthError::Unknown)?;
                return Ok(Arc::new(entra.principal(caller)));
            }
        }
        callers.key(token)
    }
}

impl KeysFile {
    /// At least one way in: API keys, or Entra ID; and `[[apps]]` only with Entra ID on.
    fn check_ways_in(&self, from_a_file: bool, entra: bool) -> Result<(), String> {
        match (entra, self.keys.is_empty(), self.apps.is_empty()) {
            (false, true, _) if !from_a_file => {
                Err("neither keys nor Entra ID: nothing to authenticate with".into())
            }
            (false, true, true) => Err("the file has no [[keys]] entries".into()),
            (false, _, false) => Err(
                "[[apps]] entries are Entra ID applications: set SENDGATE_ENTRA_TENANT_ID, or remove them"
                    .into(),
            ),
            (true, true, true) if from_a_file => {
                Err("the file has no [[keys]] or [[apps]] entries".into())
            }
            _ => Ok(()),
        }
    }
}

/// The `[[keys]]` entries, each placed in its tenant.
fn api_keys(entries: Vec<KeyEntry>, tenants: &mut TenantTable) -> Result<Vec<ApiKey>, String> {
    let mut keys = Vec::with_capacity(entries.len());
    for entry in entries {
        let sha256 = entry.sha256.clone();
        let granted = Grant::from(entry).read(tenants)?;
        let name = &granted.principal.name;
        let digest: [u8; 32] = hex::decode(sha256.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| format!("key {name:?}: sha256 must be 64 hex characters"))?;
        keys.push(ApiKey {
            digest,
            principal: Arc::new(granted.principal),
        });
    }
    Ok(keys)
}

/// The `[[apps]]` entries, each an application `verifier` allows, placed in its tenant; the
/// applications without one share a tenant of their own.
fn entra_apps(
    verifier: EntraVerifier,
    entries: Vec<AppEntry>,
    tenants: &mut TenantTable,
) -> Result<EntraApps, String> {
    let mut listed = HashMap::with_capacity(entries.len());
    for entry in entries {
        let (app_id, grant) = entry.split();
        let who = grant.who.clone();
        let app = Guid::parse(app_id.trim()).ok_or_else(|| {
            format!("{who}: app_id must be the application's client id, a GUID, not {app_id:?}")
        })?;
        if !verifier.allows(&app) {
            return Err(format!(
                "{who}: app_id {app} is not in SENDGATE_ENTRA_ALLOWED_APPS, so it could never call"
            ));
        }
        let granted = grant.read(tenants)?;
        let entry = ListedApp {
            principal: granted.principal,
            roles: granted.roles,
        };
        if listed.insert(app.clone(), entry).is_some() {
            return Err(format!("{who}: app_id {app} has another [[apps]] entry"));
        }
    }
    let unlisted_tenant = tenants.place(
        "the applications without an [[apps]] entry",
        UNLISTED_APPS_TENANT.to_owned(),
        Asked::NOTHING,
    )?;
    Ok(EntraApps {
        verifier,
        listed,
        unlisted_tenant,
    })
}

impl Callers {
    fn key(&self, token: &str) -> Result<Arc<Principal>, AuthError> {
        let digest = token_digest(token);
        let mut found: Option<&ApiKey> = None;
        for key in &self.keys {
            // No early exit: every key is compared.
            if bool::from(same_digest(&key.digest, &digest)) {
                found = Some(key);
            }
        }
        found.map(|k| k.principal.clone()).ok_or(AuthError::Unknown)
    }
}

/// Constant time, a 64-bit word at a time: `subtle`'s byte slices compare one byte at a
/// time behind an optimisation barrier each, ~0.5k instructions per key per request.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> subtle::Choice {
    let (a, _) = a.as_chunks::<8>();
    let (b, _) = b.as_chunks::<8>();
    a.iter()
        .zip(b)
        .fold(subtle::Choice::from(1), |same, (a, b)| {
            same & u64::from_ne_bytes(*a).ct_eq(&u64::from_ne_bytes(*b))
        })
}

fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// What one key says of its tenant: each field, when given, must be the same on every key
/// of the tenant that gives it.
struct Asked {
    weight: Option<u32>,
    max_share: Option<f64>,
    rate_per_s: Option<f64>,
    burst: Option<u32>,
}

impl Asked {
    const NOTHING: Self = Self {
        weight: None,
        max_share: None,
        rate_per_s: None,
        burst: None,
    };

    /// Each field given is within its bounds (`who` names the entry in the error).
    fn check(&self, who: &str) -> Result<(), String> {
        if let Some(w) = self.weight {
            if !(1..=MAX_WEIGHT).contains(&w) {
                return Err(format!("{who}: weight must be 1 to {MAX_WEIGHT}, not {w}"));
            }
        }
        if let Some(share) = self.max_share {
            if Fraction::new(share).is_none() {
                return Err(format!(
                    "{who}: max_share must be above 0 and at most 1, not {share}"
                ));
            }
        }
        if let Some(rate) = self.rate_per_s {
            if Rate::new(rate, Some(1)).is_none() {
                return Err(format!(
                    "{who}: rate_per_s must be {} to {}, not {rate}",
                    Rate::MIN_PER_S,
                    Rate::MAX_PER_S
                ));
            }
        }
        if let Some(burst) = self.burst {
            if !(1..=Rate::MAX_BURST).contains(&burst) {
                return Err(format!(
                    "{who}: burst must be 1 to {}, not {burst}",
                    Rate::MAX_BURST
                ));
            }
        }
        Ok(())
    }
}

/// A tenant's value of one field and the entry that gave it (`key "a"`, for the error
/// naming both).
type Given<T> = Option<(T, String)>;

/// One tenant as the keys file describes it so far.
struct Described {
    name: String,
    weight: Given<u32>,
    max_share: Given<f64>,
    rate_per_s: Given<f64>,
    burst: Given<u32>,
}

/// The tenants as the keys file names them, in the order first named: a key's tenant is
/// its `tenant` field or its own name; a tenant's weight and quotas are given on any of its
/// keys and must be the same on each that gives them.
#[derive(Default)]
struct TenantTable {
    tenants: Vec<Described>,
}

/// `value` as the tenant's `field`: the first key to give it sets it, any other must agree.
fn agree<T: PartialEq + std::fmt::Display + Copy>(
    given: &mut Given<T>,
    value: Option<T>,
    field: &str,
    who: &str,
    tenant: &str,
) -> Result<(), String> {
    let Some(value) = value else {
        return Ok(());
    };
    match given {
        Some((first, by)) if *first != value => Err(format!(
            "{who}: tenant {tenant:?} has {field} {first} on {by}, not {value}: \
             a tenant has one {field}"
        )),
        Some(_) => Ok(()),
        None => {
            *given = Some((value, who.to_owned()));
            Ok(())
        }
    }
}

impl TenantTable {
    fn place(&mut self, who: &str, tenant: String, asked: Asked) -> Result<TenantIndex, String> {
        if tenant.is_empty() || tenant.len() > 128 || tenant.chars().any(char::is_control) {
            return Err(format!(
                "{who}: a tenant is 1 to 128 bytes without control characters"
            ));
        }
        asked.check(who)?;
        let at = match self.tenants.iter().position(|t| t.name == tenant) {
            Some(at) => at,
            None => {
                if self.tenants.len() == MAX_TENANTS {
                    return Err(format!("{who}: at most {MAX_TENANTS} tenants"));
                }
                self.tenants.push(Described {
                    name: tenant.clone(),
                    weight: None,
                    max_share: None,
                    rate_per_s: None,
                    burst: None,
                });
                self.tenants.len() - 1
            }
        };
        let t = &mut self.tenants[at];
        agree(&mut t.weight, asked.weight, "weight", who, &tenant)?;
        agree(&mut t.max_share, asked.max_share, "max_share", who, &tenant)?;
        agree(
            &mut t.rate_per_s,
            asked.rate_per_s,
            "rate_per_s",
            who,
            &tenant,
        )?;
        agree(&mut t.burst, asked.burst, "burst", who, &tenant)?;
        Ok(TenantIndex(u16::try_from(at).unwrap_or(u16::MAX)))
    }

    fn finish(self) -> Result<Tenants, String> {
        let mut tenants = Vec::with_capacity(self.tenants.len());
        for t in self.tenants {
            let rate = match (t.rate_per_s, t.burst) {
                (None, None) => None,
                (None, Some((_, by))) => {
                    return Err(format!(
                        "{by}: tenant {:?} has a burst but no rate_per_s: a burst is of a rate",
                        t.name
                    ))
                }
                // Both checked as each key was placed; the default burst may still be too
                // large for the largest rates.
                (Some((per_s, by)), burst) => {
                    Some(Rate::new(per_s, burst.map(|(b, _)| b)).ok_or_else(|| {
                        format!(
                            "{by}: rate_per_s {per_s} needs a burst of at most {}",
                            Rate::MAX_BURST
                        )
                    })?)
                }
            };
            tenants.push(Tenant {
                name: t.name,
                weight: t.weight.map_or(1, |(w, _)| w),
                quota: Quota {
                    max_share: t.max_share.and_then(|(s, _)| Fraction::new(s)),
                    rate,
                },
            });
        }
        // Bounded and checked as each key was placed.
        Ok(Tenants::new(tenants).unwrap_or_else(Tenants::open))
    }
}

pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A fresh random token: 32 bytes from the OS's generator, hex encoded, with a prefix that
/// makes it easy to spot in a secret scanner.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!("sg_{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;
    use futures_util::FutureExt as _;

    /// A key's answer: ready at once (only an Entra ID token may wait for a fetch).
    fn now(auth: &Authenticator, req: &HttpRequest) -> Result<Arc<Principal>, AuthError> {
        auth.authenticate(req)
            .now_or_never()
            .expect("keys never wait")
    }

    fn ring() -> Authenticator {
        let text = format!(
            "[[keys]]\nname = \"play\"\nsha256 = \"{}\"\nroles = [\"sender\"]\nqueues = [\"requests\"]\n\
             [[keys]]\nname = \"ops\"\nsha256 = \"{}\"\nroles = [\"observer\"]\nqueues = [\"*\"]\n",
            hex::encode(token_digest("play-token")),
            hex::encode(token_digest("ops-token")),
        );
        Authenticator::from_toml(&text).unwrap()
    }

    #[test]
    fn digests_are_the_same_only_when_every_byte_is() {
        let digest = token_digest("play-token");
        assert!(bool::from(same_digest(&digest, &digest)));
        for byte in [0, 7, 8, 15, 16, 24, 31] {
            let mut other = digest;
            other[byte] ^= 0x01;
            assert!(!bool::from(same_digest(&digest, &other)), "byte {byte}");
        }
    }

    #[test]
    fn bearer_tokens_map_to_their_key() {
        let auth = ring();
        let req = TestRequest::default()
            .insert_header(("Authorization", "Bearer play-token"))
            .to_http_request();
        let p = now(&auth, &req).unwrap();
        assert_eq!(p.name, "play");
        assert!(p.may(Permission::Send));
        assert!(!p.may(Permission::Observe));
        assert!(p.may_use_queue(&QueueName::parse("requests").unwrap()));
        assert!(!p.may_use_queue(&QueueName::parse("other").unwrap()));

        let req = TestRequest::default()
            .insert_header(("Authorization", "bearer ops-token"))
            .to_http_request();
        let p = now(&auth, &req).unwrap();
        assert!(p.may(Permission::Observe) && !p.may(Permission::Send));
    }

    #[test]
    fn missing_or_unknown_tokens_are_refused() {
        let auth = ring();
        let none = TestRequest::default().to_http_request();
        assert_eq!(now(&auth, &none), Err(AuthError::Missing));
        let basic = TestRequest::default()
            .insert_header(("Authorization", "Basic abc"))
            .to_http_request();
        assert_eq!(now(&auth, &basic), Err(AuthError::Missing));
        let wrong = TestRequest::default()
            .insert_header(("Authorization", "Bearer nope"))
            .to_http_request();
        assert_eq!(now(&auth, &wrong), Err(AuthError::Unknown));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(Authenticator::from_toml("")
            .unwrap_err()
            .contains("no [[keys]]"));
        let bad_hex = "[[keys]]\nname=\"a\"\nsha256=\"zz\"\nroles=[\"sender\"]\nqueues=[\"*\"]\n";
        assert!(Authenticator::from_toml(bad_hex)
            .unwrap_err()
            .contains("64 hex"));
        let bad_role = format!(
            "[[keys]]\nname=\"a\"\nsha256=\"{}\"\nroles=[\"root\"]\nqueues=[\"*\"]\n",
            "00".repeat(32)
        );
        assert!(Authenticator::from_toml(&bad_role)
            .unwrap_err()
            .contains("unknown role"));
    }

    fn key(name: &str, extra: &str) -> String {
        format!(
            "[[keys]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = [\"sender\"]\nqueues = [\"*\"]\n{extra}\n",
            hex::encode(token_digest(&format!("{name}-token")))
        )
    }

    fn principal(auth: &Authenticator, name: &str) -> Arc<Principal> {
        let req = TestRequest::default()
            .insert_header(("Authorization", format!("Bearer {name}-token")))
            .to_http_request();
        now(auth, &req).unwrap()
    }

    #[test]
    fn keys_name_their_tenant_its_weight_and_their_criticality() {
        let text = [
            key(
                "play",
                "tenant = \"web\"\nweight = 3\ncriticality = \"critical\"",
            ),
            key("play-2", "tenant = \"web\""),
            key("batch", "criticality = \"sheddable\""),
            key("script", ""),
        ]
        .concat();
        let auth = Authenticator::from_toml(&text).unwrap();
        let tenants = auth.tenants();
        let rows: Vec<_> = tenants
            .iter()
            .map(|(i, t)| (i.0, t.name.clone(), t.weight))
            .collect();
        assert_eq!(
            rows,
            [
                (0, "web".to_owned(), 3),
                (1, "batch".to_owned(), 1),
                (2, "script".to_owned(), 1)
            ],
            "a key's tenant defaults to its name; keys of one tenant share it and its weight"
        );
        let (play, play2) = (principal(&auth, "play"), principal(&auth, "play-2"));
        assert_eq!(
            (play.tenant, play2.tenant),
            (TenantIndex(0), TenantIndex(0))
        );
        assert_eq!(play.criticality, Criticality::Critical);
        assert_eq!(play2.criticality, Criticality::Default, "the default");
        assert_eq!(
            principal(&auth, "batch").criticality,
            Criticality::Sheddable
        );
        assert_eq!(principal(&auth, "script").tenant, TenantIndex(2));
        assert_eq!(Authenticator::Open.tenants(), Tenants::open());
    }

    #[test]
    fn bad_tenant_fields_are_refused_naming_the_key() {
        let refused = |text: String| Authenticator::from_toml(&text).unwrap_err();
        let typo = refused(key("a", "criticality = \"critcal\""));
        assert!(
            typo.contains("key \"a\"") && typo.contains("did you mean \"critical\"?"),
            "{typo}"
        );
        let far = refused(key("a", "criticality = \"urgent\""));
        assert!(
            !far.contains("did you mean") && far.contains("critical, default or sheddable"),
            "{far}"
        );
        for w in [0, MAX_WEIGHT + 1] {
            let e = refused(key("a", &format!("weight = {w}")));
            assert!(e.contains("weight must be 1 to 1000"), "{e}");
        }
        let two = refused(
            [
                key("a", "tenant = \"t\"\nweight = 2"),
                key("b", "tenant = \"t\"\nweight = 5"),
            ]
            .concat(),
        );
        assert!(
            two.contains("key \"b\"") && two.contains("weight 2 on key \"a\""),
            "{two}"
        );
        let empty = refused(key("a", "tenant = \"\""));
        assert!(empty.contains("a tenant is 1 to 128 bytes"), "{empty}");
        // Unknown fields stay refused (a quota this version does not know is not ignored).
        let unknown = refused(key("a", "max_shares = 0.2"));
        assert!(unknown.contains("unknown field"), "{unknown}");
        // The same weight given twice is one weight.
        let same = [
            key("a", "tenant = \"t\"\nweight = 2"),
            key("b", "tenant = \"t\"\nweight = 2"),
        ]
        .concat();
        assert_eq!(
            Authenticator::from_toml(&same).unwrap().tenants().weights(),
            vec![2]
        );
    }

    #[test]
    fn a_tenant_carries_its_quotas_from_any_of_its_keys() {
        let text = [
            key("a", "tenant = \"t\"\nmax_share = 0.2"),
            key("b", "tenant = \"t\"\nrate_per_s = 2.5\nburst = 10"),
            key("c", "rate_per_s = 4"),
            key("d", ""),
        ]
        .concat();
        let quotas = Authenticator::from_toml(&text).unwrap().tenants().quotas();
        assert_eq!(quotas[0].max_share, Fraction::new(0.2));
        assert_eq!(quotas[0].rate, Rate::new(2.5, Some(10)));
        assert_eq!(quotas[1].max_share, None);
        assert_eq!(
            quotas[1].rate.map(|r| r.burst()),
            Some(4),
            "a burst defaults to a second's worth"
        );
        assert!(quotas[2].is_none());
    }

    #[test]
    fn bad_quotas_are_refused_naming_the_key_and_the_bound() {
        let refused = |text: String| Authenticator::from_toml(&text).unwrap_err();
        for bad in ["0", "-0.1", "1.5", "nan"] {
            let e = refused(key("a", &format!("max_share = {bad}")));
            assert!(
                e.contains("key \"a\"") && e.contains("max_share must be above 0 and at most 1"),
                "{bad}: {e}"
            );
        }
        for bad in ["0", "0.0001", "2000000"] {
            let e = refused(key("a", &format!("rate_per_s = {bad}")));
            assert!(
                e.contains("rate_per_s must be 0.001 to 1000000"),
                "{bad}: {e}"
            );
        }
        for bad in [0, Rate::MAX_BURST + 1] {
            let e = refused(key("a", &format!("rate_per_s = 1\nburst = {bad}")));
            assert!(e.contains("burst must be 1 to 1000000"), "{bad}: {e}");
        }
        let lone = refused(key("a", "burst = 5"));
        assert!(lone.contains("no rate_per_s"), "{lone}");
        // One value per tenant, the error naming both keys.
        for (field, one, two) in [
            ("max_share", "0.2", "0.3"),
            ("rate_per_s", "1", "2"),
            ("burst", "3", "4"),
        ] {
            // A burst is of a rate.
            let rate = if field == "burst" {
                "rate_per_s = 1\n"
            } else {
                ""
            };
            let e = refused(
                [
                    key("a", &format!("tenant = \"t\"\n{rate}{field} = {one}")),
                    key("b", &format!("tenant = \"t\"\n{field} = {two}")),
                ]
                .concat(),
            );
            assert!(
                e.contains("key \"b\"")
                    && e.contains(&format!("{field} {one} on key \"a\""))
                    && e.contains(&format!("a tenant has one {field}")),
                "{field}: {e}"
            );
        }
        // A typo of a field is named; a far one is still refused, without a guess.
        let typo = refused(key("a", "rate_per_sec = 5"));
        assert!(
            typo.contains("unknown field") && typo.contains("did you mean \"rate_per_s\"?"),
            "{typo}"
        );
        let far = refused(key("a", "colour = \"red\""));
        assert!(
            far.contains("unknown field") && !far.contains("did you mean"),
            "{far}"
        );
    }

    #[test]
    fn new_tokens_are_random_and_long() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), 3 + 64);
    }

    mod apps {
        use super::*;
        use crate::config::EntraCallersSettings;
        use crate::http::entra_auth::keys::{Fetch, FetchError};
        use crate::http::entra_auth::TokenVersion;

        const APP: &str = "aaaaaaaa-0000-0000-0000-000000000001";
        const OTHER: &str = "aaaaaaaa-0000-0000-0000-000000000002";

        /// A directory never asked: these tests build principals from verified callers.
        struct Unreachable;

        #[async_trait::async_trait]
        impl Fetch for Unreachable {
            async fn get(&self, url: &str) -> Result<Vec<u8>, FetchError> {
                Err(FetchError::Transport {
                    url: url.to_owned(),
                    detail: "not in these tests".into(),
                })
            }
        }

        fn verifier(allowed: Option<&[&str]>) -> EntraVerifier {
            let settings = EntraCallersSettings {
                tenant: Guid::parse("11111111-2222-3333-4444-555555555555").unwrap(),
                audiences: vec!["api://sendgate".into()],
                authority: "https://login.example".into(),
                allowed_apps: allowed
                    .map(|apps| apps.iter().map(|a| Guid::parse(a).unwrap()).collect()),
            };
            EntraVerifier::new(&settings, Arc::new(Unreachable))
        }

        fn app(name: &str, id: &str, extra: &str) -> String {
            format!("[[apps]]\nname = \"{name}\"\napp_id = \"{id}\"\nqueues = [\"requests\"]\n{extra}\n")
        }

        fn callers(text: &str) -> Result<Authenticator, String> {
            Authenticator::parse(Some(text), Some(verifier(None)))
        }

        fn principal_of(auth: &Authenticator, app: &str, roles: &[AppRole]) -> Principal {
            let Authenticator::Callers(Callers {
                entra: Some(entra), ..
            }) = auth
            else {
                panic!("Entra on");
            };
            entra.principal(Caller {
                app: Guid::parse(app).unwrap(),
                roles: roles.to_vec(),
                version: TokenVersion::V2,
            })
        }

        #[test]
        fn an_app_entry_names_the_application_its_queues_and_its_tenant() {
            let text = [
                key("play", "tenant = \"web\"\nweight = 3"),
                app(
                    "playground",
                    &APP.to_uppercase(),
                    "tenant = \"web\"\ncriticality = \"critical\"\nrate_per_s = 5",
                ),
            ]
            .concat();
            let auth = callers(&text).unwrap();
            assert!(auth.accepts_keys() && auth.entra().is_some());
            let p = principal_of(&auth, APP, &[AppRole::Sender, AppRole::Observer]);
            assert_eq!(p.name, "playground");
            assert_eq!(p.roles, [Role::Sender, Role::Observer], "the token's roles");
            assert!(p.may_use_queue(&QueueName::parse("requests").unwrap()));
            assert!(!p.may_use_queue(&QueueName::parse("other").unwrap()));
            assert_eq!(p.tenant, TenantIndex(0), "the key's tenant, shared");
            assert_eq!(p.criticality, Criticality::Critical);
            let names: Vec<_> = auth.tenants().iter().map(|(_, t)| t.name.clone()).collect();
            assert_eq!(names, ["web", UNLISTED_APPS_TENANT]);
            assert_eq!(auth.tenants().weights(), [3, 1]);
            assert!(auth.tenants().quotas()[0].rate.is_some());
        }

        #[test]
        fn an_unlisted_application_is_named_by_its_id_and_shares_one_tenant() {
            let auth = callers(&app("playground", APP, "")).unwrap();
            assert!(!auth.accepts_keys(), "apps only: no key is a way in");
            let p = principal_of(&auth, OTHER, &[AppRole::Sender]);
            assert_eq!(p.name, OTHER);
            assert!(p.may_use_every_queue() && p.may(Permission::Send));
            assert_eq!(p.criticality, Criticality::Default);
            let q = principal_of(&auth, "aaaaaaaa-0000-0000-0000-000000000003", &[]);
            assert_eq!(p.tenant, q.tenant, "every unlisted app, one tenant");
            assert_eq!(auth.tenants().len(), 2, "the entry's and the shared one");
            assert!(
                !q.may(Permission::Send) && !q.may(Permission::Observe),
                "no role: 403"
            );
            // Entra alone, no file: one tenant, the shared one.
            let alone = Authenticator::parse(None, Some(verifier(None))).unwrap();
            assert_eq!(alone.tenants().len(), 1);
            // The shared tenant takes a weight from an entry that names it.
            let named = callers(&app("batch", APP, "tenant = \"entra\"\nweight = 7")).unwrap();
            assert_eq!(named.tenants().weights(), [7]);
        }

        #[test]
        fn an_app_entrys_roles_are_the_most_its_token_gets() {
            let auth = callers(&app("ops", APP, "roles = [\"observer\"]")).unwrap();
            let p = principal_of(&auth, APP, &[AppRole::Admin, AppRole::Observer]);
            assert_eq!(p.roles, [Role::Observer]);
            let p = principal_of(&auth, APP, &[AppRole::Sender]);
            assert!(p.roles.is_empty());
        }

        #[test]
        fn bad_app_entries_are_refused_naming_the_app() {
            let refused = |text: String| callers(&text).unwrap_err();
            let e = refused(app("a", "my-app", ""));
            assert!(e.contains("app \"a\"") && e.contains("GUID"), "{e}");
            let e = refused([app("a", APP, ""), app("b", APP, "")].concat());
            assert!(
                e.contains("app \"b\"") && e.contains("another [[apps]] entry"),
                "{e}"
            );
            let e = refused(app("a", APP, "roles = []"));
            assert!(e.contains("at least one role"), "{e}");
            let e = refused(app("a", APP, "roles = [\"root\"]"));
            assert!(e.contains("unknown role"), "{e}");
            let e = refused(app("a", APP, "weight = 0"));
            assert!(e.contains("app \"a\": weight must be 1 to 1000"), "{e}");
            let e = refused(
                [
                    key("k", "tenant = \"t\"\nweight = 2"),
                    app("a", APP, "tenant = \"t\"\nweight = 3"),
                ]
                .concat(),
            );
            assert!(
                e.contains("app \"a\"") && e.contains("weight 2 on key \"k\""),
                "{e}"
            );
            // Unknown fields, with a hint from the app's own fields.
            let e = refused(app("a", APP, "app_di = 1"));
            assert!(e.contains("did you mean \"app_id\"?"), "{e}");
            let e = refused(app("a", APP, "sha256 = \"00\""));
            assert!(
                e.contains("unknown field") && !e.contains("did you mean"),
                "{e}"
            );
            let e = refused([app("a", APP, ""), key("k", "sha265 = 1")].concat());
            assert!(e.contains("did you mean \"sha256\"?"), "{e}");
            // Not in SENDGATE_ENTRA_ALLOWED_APPS: it could never call.
            let e = Authenticator::parse(Some(&app("a", APP, "")), Some(verifier(Some(&[OTHER]))))
                .unwrap_err();
            assert!(e.contains("SENDGATE_ENTRA_ALLOWED_APPS"), "{e}");
            // Apps without Entra on; an empty file with it.
            let e =
                Authenticator::from_toml(&[key("k", ""), app("a", APP, "")].concat()).unwrap_err();
            assert!(e.contains("SENDGATE_ENTRA_TENANT_ID"), "{e}");
            let e = callers("").unwrap_err();
            assert!(e.contains("no [[keys]] or [[apps]]"), "{e}");
        }

        #[tokio::test]
        async fn a_jwt_goes_to_entra_and_anything_else_to_the_keys() {
            let auth = callers(&key("k", "")).unwrap();
            let req = |token: &str| {
                TestRequest::default()
                    .insert_header(("Authorization", format!("Bearer {token}")))
                    .to_http_request()
            };
            assert_eq!(now(&auth, &req("k-token")).unwrap().name, "k");
            // A JWT is Entra's to judge: here the directory is unreachable, so 401,
            // without a look at the keys.
            let jwt = req("eyJhbGciOiJSUzI1NiIsImtpZCI6ImEifQ.e30.c2ln");
            assert_eq!(auth.authenticate(&jwt).await, Err(AuthError::Unknown));
            // With Entra off, a JWT is just an unknown key.
            let keys_only = Authenticator::from_toml(&key("k", "")).unwrap();
            assert_eq!(now(&keys_only, &jwt), Err(AuthError::Unknown));
        }
    }
}
