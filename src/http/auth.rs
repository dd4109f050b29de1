//! API keys (contract section 5).
//!
//! The keys file holds SHA-256 digests, never tokens. A request's bearer token is hashed
//! and compared with every key's digest in constant time, without stopping at a match,
//! so neither the comparison nor the position of a key in the file leaks through timing.

use std::path::Path;
use std::sync::{Arc, LazyLock};

use actix_web::http::header::AUTHORIZATION;
use actix_web::HttpRequest;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::admission::tenants::{
    Criticality, Quota, Rate, Tenant, TenantIndex, Tenants, MAX_TENANTS, MAX_WEIGHT,
};
use crate::config::{closest, Fraction};
use crate::domain::QueueName;

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

/// The TOML parser's message, with the closest field named when it is an unknown one.
fn with_field_hint(message: &str) -> String {
    let unknown = message
        .split_once("unknown field `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(field, _)| field);
    match unknown.and_then(|field| closest(field, KEY_FIELDS.into_iter())) {
        Some(near) => format!("{message} (did you mean {near:?}?)"),
        None => message.to_owned(),
    }
}

/// One configured key: the digest of its token and who it stands for.
pub struct ApiKey {
    digest: [u8; 32],
    principal: Arc<Principal>,
}

/// How requests are authenticated.
pub enum Authenticator {
    /// No keys configured: every caller may do everything (loopback, or `SENDGATE_AUTH=none`).
    Open,
    /// The keys, and the tenants they name (index = [`TenantIndex`]).
    Keys(Vec<ApiKey>, Tenants),
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open => f.write_str("Open"),
            Self::Keys(keys, _) => f
                .debug_list()
                .entries(keys.iter().map(|k| &k.principal.name))
                .finish(),
        }
    }
}

impl Authenticator {
    pub fn from_file(path: &Path) -> Result<Self, KeysFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| KeysFileError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| KeysFileError::Invalid {
            path: shown,
            message,
        })
    }

    pub fn from_toml(text: &str) -> Result<Self, String> {
        let file: KeysFile = toml::from_str(text).map_err(|e| with_field_hint(e.message()))?;
        if file.keys.is_empty() {
            return Err("the file has no [[keys]] entries".into());
        }
        let mut keys = Vec::with_capacity(file.keys.len());
        let mut tenants = TenantTable::default();
        for entry in file.keys {
            let name = entry.name;
            let digest: [u8; 32] = hex::decode(entry.sha256.trim())
                .ok()
                .and_then(|bytes| bytes.try_into().ok())
                .ok_or_else(|| format!("key {name:?}: sha256 must be 64 hex characters"))?;
            let roles = entry
                .roles
                .iter()
                .map(|r| {
                    Role::parse(r).ok_or_else(|| {
                        format!("key {name:?}: unknown role {r:?} (sender, observer, admin)")
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if roles.is_empty() {
                return Err(format!("key {name:?}: give it at least one role"));
            }
            let queues = if entry.queues.iter().any(|q| q == "*") {
                QueueScope::All
            } else {
                for q in &entry.queues {
                    QueueName::parse(q).map_err(|e| format!("key {name:?}: queue {q:?}: {e}"))?;
                }
                QueueScope::Only(entry.queues)
            };
            let criticality = match entry.criticality.as_deref() {
                None => Criticality::Default,
                Some(word) => Criticality::parse(word).ok_or_else(|| {
                    let words = Criticality::ALL.map(Criticality::as_str);
                    let hint = closest(word, words.into_iter())
                        .map(|w| format!(" (did you mean {w:?}?)"))
                        .unwrap_or_default();
                    format!(
                        "key {name:?}: unknown criticality {word:?}{hint}: critical, default or sheddable"
                    )
                })?,
            };
            let asked = Asked {
                weight: entry.weight,
                max_share: entry.max_share,
                rate_per_s: entry.rate_per_s,
                burst: entry.burst,
            };
            let tenant = tenants.place(&name, entry.tenant, asked)?;
            keys.push(ApiKey {
                digest,
                principal: Arc::new(Principal {
                    name,
                    roles,
                    queues,
                    tenant,
                    criticality,
                }),
            });
        }
        Ok(Self::Keys(keys, tenants.finish()?))
    }

    /// The tenants sends are shared among: the keys file's, or open mode's one.
    pub fn tenants(&self) -> Tenants {
        match self {
            Self::Open => Tenants::open(),
            Self::Keys(_, tenants) => tenants.clone(),
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self, Self::Open)
    }

    /// The caller behind the request's bearer token; shared, so nothing is copied per request.
    pub fn authenticate(&self, req: &HttpRequest) -> Result<Arc<Principal>, AuthError> {
        let keys = match self {
            Self::Open => return Ok(ANONYMOUS.clone()),
            Self::Keys(keys, _) => keys,
        };
        let token = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or(AuthError::Missing)?;
        let digest = token_digest(token);
        let mut found: Option<&ApiKey> = None;
        for key in keys {
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

/// A tenant's value of one field and the key that gave it (for the error naming both).
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
    key: &str,
    tenant: &str,
) -> Result<(), String> {
    let Some(value) = value else {
        return Ok(());
    };
    match given {
        Some((first, by)) if *first != value => Err(format!(
            "key {key:?}: tenant {tenant:?} has {field} {first} on key {by:?}, not {value}: \
             a tenant has one {field}"
        )),
        Some(_) => Ok(()),
        None => {
            *given = Some((value, key.to_owned()));
            Ok(())
        }
    }
}

impl TenantTable {
    fn place(
        &mut self,
        key: &str,
        tenant: Option<String>,
        asked: Asked,
    ) -> Result<TenantIndex, String> {
        let tenant = tenant.unwrap_or_else(|| key.to_owned());
        if tenant.is_empty() || tenant.len() > 128 || tenant.chars().any(char::is_control) {
            return Err(format!(
                "key {key:?}: a tenant is 1 to 128 bytes without control characters"
            ));
        }
        if let Some(w) = asked.weight {
            if !(1..=MAX_WEIGHT).contains(&w) {
                return Err(format!(
                    "key {key:?}: weight must be 1 to {MAX_WEIGHT}, not {w}"
                ));
            }
        }
        if let Some(share) = asked.max_share {
            if Fraction::new(share).is_none() {
                return Err(format!(
                    "key {key:?}: max_share must be above 0 and at most 1, not {share}"
                ));
            }
        }
        if let Some(rate) = asked.rate_per_s {
            if Rate::new(rate, Some(1)).is_none() {
                return Err(format!(
                    "key {key:?}: rate_per_s must be {} to {}, not {rate}",
                    Rate::MIN_PER_S,
                    Rate::MAX_PER_S
                ));
            }
        }
        if let Some(burst) = asked.burst {
            if !(1..=Rate::MAX_BURST).contains(&burst) {
                return Err(format!(
                    "key {key:?}: burst must be 1 to {}, not {burst}",
                    Rate::MAX_BURST
                ));
            }
        }
        let at = match self.tenants.iter().position(|t| t.name == tenant) {
            Some(at) => at,
            None => {
                if self.tenants.len() == MAX_TENANTS {
                    return Err(format!("key {key:?}: at most {MAX_TENANTS} tenants"));
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
        agree(&mut t.weight, asked.weight, "weight", key, &tenant)?;
        agree(&mut t.max_share, asked.max_share, "max_share", key, &tenant)?;
        agree(
            &mut t.rate_per_s,
            asked.rate_per_s,
            "rate_per_s",
            key,
            &tenant,
        )?;
        agree(&mut t.burst, asked.burst, "burst", key, &tenant)?;
        Ok(TenantIndex(u16::try_from(at).unwrap_or(u16::MAX)))
    }

    fn finish(self) -> Result<Tenants, String> {
        let mut tenants = Vec::with_capacity(self.tenants.len());
        for t in self.tenants {
            let rate = match (t.rate_per_s, t.burst) {
                (None, None) => None,
                (None, Some((_, by))) => {
                    return Err(format!(
                    "key {by:?}: tenant {:?} has a burst but no rate_per_s: a burst is of a rate",
                    t.name
                ))
                }
                // Both checked as each key was placed; the default burst may still be too
                // large for the largest rates.
                (Some((per_s, by)), burst) => {
                    Some(Rate::new(per_s, burst.map(|(b, _)| b)).ok_or_else(|| {
                        format!(
                            "key {by:?}: rate_per_s {per_s} needs a burst of at most {}",
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
        let p = auth.authenticate(&req).unwrap();
        assert_eq!(p.name, "play");
        assert!(p.may(Permission::Send));
        assert!(!p.may(Permission::Observe));
        assert!(p.may_use_queue(&QueueName::parse("requests").unwrap()));
        assert!(!p.may_use_queue(&QueueName::parse("other").unwrap()));

        let req = TestRequest::default()
            .insert_header(("Authorization", "bearer ops-token"))
            .to_http_request();
        let p = auth.authenticate(&req).unwrap();
        assert!(p.may(Permission::Observe) && !p.may(Permission::Send));
    }

    #[test]
    fn missing_or_unknown_tokens_are_refused() {
        let auth = ring();
        let none = TestRequest::default().to_http_request();
        assert_eq!(auth.authenticate(&none), Err(AuthError::Missing));
        let basic = TestRequest::default()
            .insert_header(("Authorization", "Basic abc"))
            .to_http_request();
        assert_eq!(auth.authenticate(&basic), Err(AuthError::Missing));
        let wrong = TestRequest::default()
            .insert_header(("Authorization", "Bearer nope"))
            .to_http_request();
        assert_eq!(auth.authenticate(&wrong), Err(AuthError::Unknown));
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
        auth.authenticate(&req).unwrap()
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
}
