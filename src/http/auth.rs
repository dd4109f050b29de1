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
}

impl Principal {
    fn anonymous() -> Self {
        Self {
            name: "anonymous".into(),
            roles: vec![Role::Admin],
            queues: QueueScope::All,
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
    Keys(Vec<ApiKey>),
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open => f.write_str("Open"),
            Self::Keys(keys) => f
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
        let file: KeysFile = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        if file.keys.is_empty() {
            return Err("the file has no [[keys]] entries".into());
        }
        let mut keys = Vec::with_capacity(file.keys.len());
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
            keys.push(ApiKey {
                digest,
                principal: Arc::new(Principal {
                    name,
                    roles,
                    queues,
                }),
            });
        }
        Ok(Self::Keys(keys))
    }

    pub fn is_open(&self) -> bool {
        matches!(self, Self::Open)
    }

    /// The caller behind the request's bearer token; shared, so nothing is copied per request.
    pub fn authenticate(&self, req: &HttpRequest) -> Result<Arc<Principal>, AuthError> {
        let keys = match self {
            Self::Open => return Ok(ANONYMOUS.clone()),
            Self::Keys(keys) => keys,
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

    #[test]
    fn new_tokens_are_random_and_long() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert_eq!(a.len(), 3 + 64);
    }
}
