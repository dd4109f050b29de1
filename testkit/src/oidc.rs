//! A local OpenID provider standing in for Microsoft Entra ID, on 127.0.0.1 and a random
//! port: the discovery document of one tenant and its JWKS, with the test keys of
//! `tests/data/oidc` (RSA 2048), and tokens signed by them in Microsoft's v1 and v2 forms.
//!
//! The test drives it: which keys the JWKS publishes (a rollover adds one and removes
//! another), an outage (`503`, or the connection closed unanswered), a slow answer, a
//! hostile one (a body that never ends, one larger than any JWKS, discovery redirected);
//! and it counts the GETs of each document, so a test can say how many fetches the gateway
//! made, and when the gateway hung up on a hostile answer.
//!
//! Plain tokio TCP and a minimal HTTP/1.1 reading (a GET's request line and headers, one
//! request per connection), as `servicebus_stub.rs` does.

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
    der: include_bytes!("../../tests/data/oidc/key-a.der"),
};
pub const KEY_B: TestKey = TestKey {
    kid: "key-b",
    der: include_bytes!("../../tests/data/oidc/key-b.der"),
};
pub const KEY_C: TestKey = TestKey {
    kid: "key-c",
    der: include_bytes!("../../tests/data/oidc/key-c.der"),
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

    /// `claims` signed by this key, padded (a `pad` claim, and the header's `cty` when the
    /// payload's base64 cannot land on it) to exactly `len` characters.
    pub fn sign_to_length(&self, claims: &Value, len: usize) -> String {
        for cty in 0..4 {
            let mut header = Header::new(Algorithm::RS256);
            header.kid = Some(self.kid.to_owned());
            header.cty = (cty > 0).then(|| "x".repeat(cty));
            let sign = |pad: usize| {
                let mut claims = claims.clone();
                claims["pad"] = Value::String("p".repeat(pad));
                jsonwebtoken::encode(&header, &claims, &EncodingKey::from_rsa_der(self.der))
                    .expect("a signed token")
            };
            let bare = sign(0).len();
            // Base64 makes 4 characters of 3 bytes: start a little short and walk up.
            let mut pad = (len.saturating_sub(bare) * 3 / 4).saturating_sub(4);
            loop {
                let token = sign(pad);
                match token.len().cmp(&len) {
                    std::cmp::Ordering::Equal => return token,
                    std::cmp::Ordering::Greater => break,
                    std::cmp::Ordering::Less => pad += 1,
                }
            }
        }
        panic!("no padding lands on {len} characters")
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
    /// `200` with a `Content-Length` of a few KiB, a few bytes of it, then nothing more
    /// (the connection kept open until the client hangs up).
    Stalled,
    /// `200` declaring [`OVERSIZED_BYTES`] in its `Content-Length`, then sending them.
    Oversized,
    /// `200` chunked, with no length: chunks until the client hangs up.
    Endless,
}

/// The body [`Jwks::Oversized`] declares: 4 MiB, far past what a gateway should read.
pub const OVERSIZED_BYTES: usize = 4 * 1024 * 1024;

struct State {
    published: Vec<TestKey>,
    jwks: Jwks,
    discovery_up: bool,
    /// Discovery answers `302 Found` to this path of the provider, which serves the
    /// document too (a client that follows redirects would get it).
    discovery_moved_to: Option<String>,
    delay: Duration,
}

pub struct OidcProvider {
    pub authority: String,
    state: Mutex<State>,
    jwks_gets: AtomicU64,
    discovery_gets: AtomicU64,
    moved_gets: AtomicU64,
    /// How long each hostile JWKS answer (stalled, oversized, endless) went on before the
    /// client hung up, and how many bytes of its body were written by then.
    hangups: Mutex<Vec<(Duration, usize)>>,
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
                discovery_moved_to: None,
                delay: Duration::ZERO,
            }),
            jwks_gets: AtomicU64::new(0),
            discovery_gets: AtomicU64::new(0),
            moved_gets: AtomicU64::new(0),
            hangups: Mutex::new(Vec::new()),
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

    /// Discovery answers `302` to `path` (on this provider, serving the document), or,
    /// with `None`, the document again.
    pub fn set_discovery_moved_to(&self, path: Option<&str>) {
        self.state.lock().discovery_moved_to = path.map(str::to_owned);
    }

    pub fn discovery_url(&self) -> String {
        format!(
            "{}/{TENANT}/v2.0/.well-known/openid-configuration",
            self.authority
        )
    }

    pub fn jwks_gets(&self) -> u64 {
        self.jwks_gets.load(Ordering::SeqCst)
    }

    pub fn discovery_gets(&self) -> u64 {
        self.discovery_gets.load(Ordering::SeqCst)
    }

    /// GETs of the path discovery was moved to.
    pub fn moved_gets(&self) -> u64 {
        self.moved_gets.load(Ordering::SeqCst)
    }

    /// Each hostile JWKS answer's time until the client hung up, and its body bytes
    /// written by then.
    pub fn hangups(&self) -> Vec<(Duration, usize)> {
        self.hangups.lock().clone()
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
            let discovery = || {
                json!({
                    "issuer": self.v2_issuer(),
                    "jwks_uri": self.jwks_uri(),
                    "token_endpoint": format!("{}/{TENANT}/oauth2/v2.0/token", self.authority),
                    "id_token_signing_alg_values_supported": ["RS256"],
                })
                .to_string()
            };
            let answer = if path == format!("/{TENANT}/v2.0/.well-known/openid-configuration") {
                self.discovery_gets.fetch_add(1, Ordering::SeqCst);
                match (&state.discovery_moved_to, state.discovery_up) {
                    (Some(to), _) => Answer::Redirect(to.clone()),
                    (None, true) => Answer::Whole(200, discovery()),
                    (None, false) => Answer::Whole(503, String::new()),
                }
            } else if state.discovery_moved_to.as_deref() == Some(path.as_str()) {
                self.moved_gets.fetch_add(1, Ordering::SeqCst);
                Answer::Whole(200, discovery())
            } else if path == format!("/{TENANT}/discovery/v2.0/keys") {
                self.jwks_gets.fetch_add(1, Ordering::SeqCst);
                match state.jwks {
                    Jwks::Up => {
                        let keys: Vec<Value> = state.published.iter().map(TestKey::jwk).collect();
                        Answer::Whole(200, json!({ "keys": keys }).to_string())
                    }
                    Jwks::Unavailable => Answer::Whole(503, String::new()),
                    Jwks::Closed => Answer::Closed,
                    Jwks::Stalled | Jwks::Oversized | Jwks::Endless => Answer::Hostile(state.jwks),
                }
            } else {
                Answer::Whole(404, String::new())
            };
            (state.delay, answer)
        };
        tokio::time::sleep(delay).await;
        let (status, body) = match answer {
            Answer::Closed => return,
            Answer::Hostile(how) => return self.hostile(stream, how).await,
            Answer::Redirect(to) => {
                let response = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {}{to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.authority
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
                return;
            }
            Answer::Whole(status, body) => (status, body),
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

    /// A JWKS answer no client should wait out or read whole; records when the client hung
    /// up and how much body it had been sent by then.
    async fn hostile(&self, mut stream: TcpStream, how: Jwks) {
        let started = std::time::Instant::now();
        // A JSON prefix a lenient reader would start parsing, then blanks (valid JSON
        // whitespace), so the body is refused for its length or its end, not its syntax.
        let chunk = vec![b' '; 16 * 1024];
        let mut written = 0usize;
        let head = match how {
            Jwks::Stalled => "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n".to_owned(),
            Jwks::Oversized => format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {OVERSIZED_BYTES}\r\n\r\n"),
            _ => "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned(),
        };
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        match how {
            Jwks::Stalled => {
                if stream.write_all(b"{\"keys\": [").await.is_ok() {
                    written = 10;
                    // Nothing more: wait for the client to give up (EOF or reset).
                    let mut sink = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut sink).await {
                        if n == 0 {
                            break;
                        }
                    }
                }
            }
            Jwks::Oversized => {
                while written < OVERSIZED_BYTES {
                    let n = chunk.len().min(OVERSIZED_BYTES - written);
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                    written += n;
                }
            }
            _ => loop {
                let framed =
                    [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
                if stream.write_all(&framed).await.is_err() {
                    break;
                }
                written += chunk.len();
                // Never past what a bounded test should push through loopback.
                if started.elapsed() > Duration::from_secs(30) {
                    break;
                }
            },
        }
        self.hangups.lock().push((started.elapsed(), written));
    }
}

/// What one GET gets.
enum Answer {
    Whole(u16, String),
    Closed,
    Redirect(String),
    Hostile(Jwks),
}
