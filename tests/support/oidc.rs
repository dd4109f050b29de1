//! A local OpenID provider standing in for Microsoft Entra ID, on 127.0.0.1 and a random
//! port: the discovery document of one tenant and its JWKS, with the test keys of
//! `tests/data/oidc` (RSA 2048), and tokens signed by them in Microsoft's v1 and v2 forms.
//!
//! The test drives it: which keys the JWKS publishes (a rollover adds one and removes
//! another), an outage (`503`, or the connection closed unanswered), a slow answer; and it
//! counts the GETs of each document, so a test can say how many fetches the gateway made.
//!
//! Plain tokio TCP and a minimal HTTP/1.1 reading (a GET's request line and headers, one
//! request per connection), as `servicebus_stub.rs` does.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const TENANT: &str = "11111111-2222-3333-4444-555555555555";
pub const OTHER_TENANT: &str = "99999999-2222-3333-4444-555555555555";
/// The gateway's app-id URI, the audience the tests configure.
pub const AUDIENCE: &str = "api://sendgate";

/// One of the committed test keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestKey {
    pub kid: &'static str,
    der: &'static [u8],
}

pub const KEY_A: TestKey = TestKey {
    kid: "key-a",
    der: include_bytes!("../data/oidc/key-a.der"),
};
pub const KEY_B: TestKey = TestKey {
    kid: "key-b",
    der: include_bytes!("../data/oidc/key-b.der"),
};
pub const KEY_C: TestKey = TestKey {
    kid: "key-c",
    der: include_bytes!("../data/oidc/key-c.der"),
};

impl TestKey {
    /// The public half as a JWK, as Entra publishes one.
    pub fn jwk(&self) -> Value {
        let pair = ring::signature::RsaKeyPair::from_der(self.der).expect("a test key");
        let public: ring::signature::RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
        json!({
            "kty": "RSA", "use": "sig", "kid": self.kid,
            "n": URL_SAFE_NO_PAD.encode(&public.n), "e": URL_SAFE_NO_PAD.encode(&public.e),
        })
    }

    /// The public key's DER (what an attacker would use as an HMAC secret).
    pub fn public_der(&self) -> Vec<u8> {
        let pair = ring::signature::RsaKeyPair::from_der(self.der).expect("a test key");
        ring::signature::KeyPair::public_key(&pair)
            .as_ref()
            .to_vec()
    }

    /// `claims` signed RS256 by this key under `kid` (usually its own).
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_der(self.der))
            .expect("a signed token")
    }

    pub fn sign(&self, claims: &Value) -> String {
        self.sign_as(self.kid, claims)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// What the JWKS endpoint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jwks {
    /// Answers the published keys.
    Up,
    /// `503 Service Unavailable`.
    Unavailable,
    /// Closes the connection without an answer.
    Closed,
}

struct State {
    published: Vec<TestKey>,
    jwks: Jwks,
    discovery_up: bool,
    delay: Duration,
}

pub struct OidcProvider {
    pub authority: String,
    state: Mutex<State>,
    jwks_gets: AtomicU64,
    discovery_gets: AtomicU64,
}

impl OidcProvider {
    /// A provider publishing `keys`.
    pub async fn start(keys: &[TestKey]) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        let provider = Arc::new(Self {
            authority: format!("http://{address}"),
            state: Mutex::new(State {
                published: keys.to_vec(),
                jwks: Jwks::Up,
                discovery_up: true,
                delay: Duration::ZERO,
            }),
            jwks_gets: AtomicU64::new(0),
            discovery_gets: AtomicU64::new(0),
        });
        let serving = Arc::downgrade(&provider);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let Some(provider) = serving.upgrade() else {
                    return;
                };
                tokio::spawn(async move { provider.serve(stream).await });
            }
        });
        provider
    }

    /// The gateway's variables that point it at this provider.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("SENDGATE_ENTRA_TENANT_ID", TENANT.to_owned()),
            ("SENDGATE_ENTRA_AUDIENCE", AUDIENCE.to_owned()),
            ("SENDGATE_ENTRA_AUTHORITY", self.authority.clone()),
        ]
    }

    pub fn v2_issuer(&self) -> String {
        format!("{}/{TENANT}/v2.0", self.authority)
    }

    pub fn jwks_uri(&self) -> String {
        format!("{}/{TENANT}/discovery/v2.0/keys", self.authority)
    }

    /// The JWKS from now on publishes exactly `keys` (a rollover: add one, drop another).
    pub fn publish(&self, keys: &[TestKey]) {
        self.state.lock().published = keys.to_vec();
    }

    pub fn set_jwks(&self, jwks: Jwks) {
        self.state.lock().jwks = jwks;
    }

    pub fn set_discovery_up(&self, up: bool) {
        self.state.lock().discovery_up = up;
    }

    /// Every answer waits this long first.
    pub fn set_delay(&self, delay: Duration) {
        self.state.lock().delay = delay;
    }

    pub fn jwks_gets(&self) -> u64 {
        self.jwks_gets.load(Ordering::SeqCst)
    }

    pub fn discovery_gets(&self) -> u64 {
        self.discovery_gets.load(Ordering::SeqCst)
    }

    /// A v2 access token's claims for `app`, valid for an hour, with these app roles.
    pub fn v2_claims(&self, app: &str, roles: &[&str]) -> Value {
        json!({
            "aud": AUDIENCE, "iss": self.v2_issuer(), "tid": TENANT, "ver": "2.0",
            "azp": app, "azpacr": "1", "idtyp": "app", "oid": app, "sub": app,
            "roles": roles, "iat": now(), "nbf": now() - 5, "exp": now() + 3600,
        })
    }

    /// A v1 access token's claims (what a managed identity gets by default).
    pub fn v1_claims(&self, app: &str, roles: &[&str]) -> Value {
        json!({
            "aud": AUDIENCE, "iss": format!("https://sts.windows.net/{TENANT}/"), "tid": TENANT,
            "ver": "1.0", "appid": app, "appidacr": "2", "idtyp": "app", "oid": app,
            "sub": app, "roles": roles, "iat": now(), "nbf": now() - 5, "exp": now() + 3600,
        })
    }

    async fn serve(&self, mut stream: TcpStream) {
        let mut buffer = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
            if buffer.len() > 64 * 1024 {
                return;
            }
        }
        let head = String::from_utf8_lossy(&buffer).into_owned();
        let path = head
            .lines()
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .unwrap_or_default()
            .to_owned();
        let (delay, answer) = {
            let state = self.state.lock();
            let answer = if path == format!("/{TENANT}/v2.0/.well-known/openid-configuration") {
                self.discovery_gets.fetch_add(1, Ordering::SeqCst);
                state.discovery_up.then(|| {
                    (
                        200,
                        json!({
                            "issuer": self.v2_issuer(),
                            "jwks_uri": self.jwks_uri(),
                            "token_endpoint": format!("{}/{TENANT}/oauth2/v2.0/token", self.authority),
                            "id_token_signing_alg_values_supported": ["RS256"],
                        })
                        .to_string(),
                    )
                })
                .or(Some((503, String::new())))
            } else if path == format!("/{TENANT}/discovery/v2.0/keys") {
                self.jwks_gets.fetch_add(1, Ordering::SeqCst);
                match state.jwks {
                    Jwks::Up => {
                        let keys: Vec<Value> = state.published.iter().map(TestKey::jwk).collect();
                        Some((200, json!({ "keys": keys }).to_string()))
                    }
                    Jwks::Unavailable => Some((503, String::new())),
                    Jwks::Closed => None,
                }
            } else {
                Some((404, String::new()))
            };
            (state.delay, answer)
        };
        tokio::time::sleep(delay).await;
        let Some((status, body)) = answer else {
            return; // closed unanswered
        };
        let reason = match status {
            200 => "OK",
            404 => "Not Found",
            _ => "Service Unavailable",
        };
        let response = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}
