//! The verifier's checks, and the key cache's refresh rules on tokio's paused clock, over
//! a scripted directory (no network).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::keys::{self, Fetch, FetchError};

/// The contract's numbers (section 5), written out so a changed constant fails a test:
/// an unknown `kid` fetches at most once per 30 s; the keys are read again every 24 h.
const ON_DEMAND_EVERY: Duration = Duration::from_secs(30);
const REFRESH_EVERY: Duration = Duration::from_secs(24 * 60 * 60);
/// A token's verification waits at most this long for a fetch of its keys.
const REQUEST_WAIT: Duration = Duration::from_secs(5);
use super::*;

const TENANT: &str = "11111111-2222-3333-4444-555555555555";
const OTHER_TENANT: &str = "99999999-2222-3333-4444-555555555555";
const APP: &str = "aaaaaaaa-0000-0000-0000-000000000001";
const AUDIENCE: &str = "api://sendgate";
const AUTHORITY: &str = "https://login.example";
const KEY_A: &[u8] = include_bytes!("../../../tests/data/oidc/key-a.der");
const KEY_B: &[u8] = include_bytes!("../../../tests/data/oidc/key-b.der");
const KEY_C: &[u8] = include_bytes!("../../../tests/data/oidc/key-c.der");

fn discovery_url() -> String {
    format!("{AUTHORITY}/{TENANT}/v2.0/.well-known/openid-configuration")
}
fn jwks_url() -> String {
    format!("{AUTHORITY}/{TENANT}/discovery/v2.0/keys")
}
fn v2_issuer() -> String {
    format!("{AUTHORITY}/{TENANT}/v2.0")
}

/// A test key's public half as a JWK.
fn jwk(der: &[u8], kid: &str) -> Value {
    let pair = ring::signature::RsaKeyPair::from_der(der).unwrap();
    let public: ring::signature::RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
    json!({"kty": "RSA", "use": "sig", "kid": kid, "n": URL_SAFE_NO_PAD.encode(&public.n), "e": URL_SAFE_NO_PAD.encode(&public.e)})
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A v2 token's claims, valid for an hour, the sender role.
fn v2_claims() -> Value {
    json!({
        "aud": AUDIENCE, "iss": v2_issuer(), "tid": TENANT, "ver": "2.0", "azp": APP,
        "roles": ["Sendgate.Sender"], "iat": now(), "nbf": now() - 5, "exp": now() + 3600,
    })
}

fn v1_claims() -> Value {
    json!({
        "aud": AUDIENCE, "iss": format!("https://sts.windows.net/{TENANT}/"), "tid": TENANT,
        "ver": "1.0", "appid": APP, "roles": ["Sendgate.Observer", "Other.Role"],
        "iat": now(), "nbf": now() - 5, "exp": now() + 3600,
    })
}

fn sign(der: &[u8], kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_der(der)).unwrap()
}

fn with(mut claims: Value, field: &str, value: Value) -> Value {
    claims[field] = value;
    claims
}

/// The directory as the tests script it: documents by URL, failing or slow on demand,
/// each GET counted.
#[derive(Default)]
struct Directory {
    documents: Mutex<HashMap<String, Vec<u8>>>,
    down: AtomicBool,
    delay: Mutex<Duration>,
    gets: Mutex<HashMap<String, u64>>,
    total: AtomicU64,
}

impl Directory {
    fn new(keys: &[(&[u8], &str)]) -> Arc<Self> {
        let directory = Arc::new(Self::default());
        directory.documents.lock().insert(
            discovery_url(),
            json!({"issuer": v2_issuer(), "jwks_uri": jwks_url()})
                .to_string()
                .into_bytes(),
        );
        directory.publish(keys);
        directory
    }

    fn publish(&self, keys: &[(&[u8], &str)]) {
        let keys: Vec<Value> = keys.iter().map(|(der, kid)| jwk(der, kid)).collect();
        self.documents
            .lock()
            .insert(jwks_url(), json!({ "keys": keys }).to_string().into_bytes());
    }

    fn gets(&self, url: &str) -> u64 {
        self.gets.lock().get(url).copied().unwrap_or(0)
    }

    fn jwks_gets(&self) -> u64 {
        self.gets(&jwks_url())
    }
}

#[async_trait::async_trait]
impl Fetch for Directory {
    async fn get(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        *self.gets.lock().entry(url.to_owned()).or_default() += 1;
        self.total.fetch_add(1, Ordering::SeqCst);
        let delay = *self.delay.lock();
        tokio::time::sleep(delay).await;
        let status = |status| FetchError::Status {
            url: url.to_owned(),
            status,
        };
        if self.down.load(Ordering::SeqCst) {
            return Err(status(503));
        }
        self.documents
            .lock()
            .get(url)
            .cloned()
            .ok_or_else(|| status(404))
    }
}

fn settings() -> EntraCallersSettings {
    EntraCallersSettings {
        tenant: Guid::parse(TENANT).unwrap(),
        audiences: vec![
            AUDIENCE.into(),
            "bbbbbbbb-0000-0000-0000-000000000002".into(),
        ],
        authority: AUTHORITY.into(),
        allowed_apps: None,
    }
}

fn verifier(directory: &Arc<Directory>) -> EntraVerifier {
    EntraVerifier::new(&settings(), directory.clone())
}

/// A verifier as the gateway starts one: the background task has fetched the keys.
async fn started(directory: &Arc<Directory>) -> EntraVerifier {
    let v = verifier(directory);
    v.keep_fresh();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(v.keys().current().is_some(), "fetched at start");
    v
}

#[tokio::test(start_paused = true)]
async fn a_v2_and_a_v1_token_name_their_application_and_roles() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = verifier(&directory);
    let caller = v.verify(&sign(KEY_A, "a", &v2_claims())).await.unwrap();
    assert_eq!(
        caller,
        Caller {
            app: Guid::parse(APP).unwrap(),
            roles: vec![AppRole::Sender],
            version: TokenVersion::V2
        }
    );
    let caller = v.verify(&sign(KEY_A, "a", &v1_claims())).await.unwrap();
    assert_eq!(caller.version, TokenVersion::V1);
    assert_eq!(caller.roles, [AppRole::Observer], "other roles ignored");
    let all = with(
        v2_claims(),
        "roles",
        json!(["Sendgate.Admin", "Sendgate.Observer", "Sendgate.Sender"]),
    );
    assert_eq!(
        v.verify(&sign(KEY_A, "a", &all)).await.unwrap().roles,
        [AppRole::Admin, AppRole::Observer, AppRole::Sender],
        "each of sendgate's three roles"
    );
    // aud as the app id, or as an array holding one configured value.
    let by_id = with(
        v2_claims(),
        "aud",
        json!("bbbbbbbb-0000-0000-0000-000000000002"),
    );
    assert!(v.verify(&sign(KEY_A, "a", &by_id)).await.is_ok());
    let many = with(v2_claims(), "aud", json!(["x", AUDIENCE]));
    assert!(v.verify(&sign(KEY_A, "a", &many)).await.is_ok());
    // No sendgate role: a caller all the same (403 later, not 401).
    let none = with(v2_claims(), "roles", json!([]));
    assert_eq!(v.verify(&sign(KEY_A, "a", &none)).await.unwrap().roles, []);
    let absent = {
        let mut c = v2_claims();
        c.as_object_mut().unwrap().remove("roles");
        c
    };
    assert!(v.verify(&sign(KEY_A, "a", &absent)).await.is_ok());
    // tid absent: the issuer already names the tenant.
    let no_tid = {
        let mut c = v2_claims();
        c.as_object_mut().unwrap().remove("tid");
        c
    };
    assert!(v.verify(&sign(KEY_A, "a", &no_tid)).await.is_ok());
    assert_eq!(directory.jwks_gets(), 1, "one fetch served them all");
}

#[tokio::test(start_paused = true)]
async fn every_claim_that_is_wrong_is_refused_for_its_reason() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = verifier(&directory);
    let t = now();
    let v1_issuer = format!("https://sts.windows.net/{TENANT}/");
    let cases: Vec<(Value, Refusal)> = vec![
        (
            with(v2_claims(), "aud", json!("api://other")),
            Refusal::Audience,
        ),
        (with(v2_claims(), "aud", json!([])), Refusal::Audience),
        (
            with(
                v2_claims(),
                "iss",
                json!(format!("{AUTHORITY}/{OTHER_TENANT}/v2.0")),
            ),
            Refusal::Issuer,
        ),
        // Each form with the other's issuer.
        (with(v2_claims(), "iss", json!(v1_issuer)), Refusal::Issuer),
        (
            with(v1_claims(), "iss", json!(v2_issuer())),
            Refusal::Issuer,
        ),
        (with(v2_claims(), "ver", json!("3.0")), Refusal::Issuer),
        // A v1 token of another tenant without a tid: its issuer alone refuses it.
        (
            {
                let mut claims = with(
                    v1_claims(),
                    "iss",
                    json!(format!("https://sts.windows.net/{OTHER_TENANT}/")),
                );
                claims.as_object_mut().unwrap().remove("tid");
                claims
            },
            Refusal::Issuer,
        ),
        (with(v2_claims(), "ver", Value::Null), Refusal::Issuer),
        (
            with(v2_claims(), "tid", json!(OTHER_TENANT)),
            Refusal::Tenant,
        ),
        (with(v2_claims(), "exp", json!(t - 120)), Refusal::Expired),
        (
            with(v2_claims(), "nbf", json!(t + 120)),
            Refusal::NotYetValid,
        ),
        (
            with(v2_claims(), "azp", json!("not-a-guid")),
            Refusal::NoApplication,
        ),
        // A v2 token's application is its azp: appid alone does not do.
        (
            with(with(v2_claims(), "azp", Value::Null), "appid", json!(APP)),
            Refusal::NoApplication,
        ),
        (
            with(v1_claims(), "appid", Value::Null),
            Refusal::NoApplication,
        ),
        // A user's token through the app: its roles are the user's, not the app's.
        (
            with(v2_claims(), "scp", json!("user_impersonation")),
            Refusal::Delegated,
        ),
        (with(v1_claims(), "scp", json!("")), Refusal::Delegated),
    ];
    for (claims, refusal) in cases {
        assert_eq!(
            v.verify(&sign(KEY_A, "a", &claims)).await,
            Err(refusal),
            "{claims}"
        );
    }
    // Missing time claims are not a pass.
    for claim in ["exp", "nbf", "aud"] {
        let mut claims = v2_claims();
        claims.as_object_mut().unwrap().remove(claim);
        assert!(
            v.verify(&sign(KEY_A, "a", &claims)).await.is_err(),
            "{claim}"
        );
    }
    // Within the leeway: accepted.
    let late = with(v2_claims(), "exp", json!(t - 30));
    assert!(v.verify(&sign(KEY_A, "a", &late)).await.is_ok());
    let early = with(v2_claims(), "nbf", json!(t + 30));
    assert!(v.verify(&sign(KEY_A, "a", &early)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn none_hmac_and_foreign_signatures_are_refused() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = verifier(&directory);
    let part = |value: Value| URL_SAFE_NO_PAD.encode(value.to_string());
    // alg none, with and without a signature part.
    let none = format!(
        "{}.{}.",
        part(json!({"alg": "none", "kid": "a"})),
        part(v2_claims())
    );
    assert_eq!(v.verify(&none).await, Err(Refusal::Malformed));
    let none_signed = format!("{none}AAAA");
    assert_eq!(v.verify(&none_signed).await, Err(Refusal::Malformed));
    // HS256 keyed with the public key (the key confusion): refused before any key is used.
    let pair = ring::signature::RsaKeyPair::from_der(KEY_A).unwrap();
    let public_der = pair.public().as_ref().to_vec();
    let jwk_json = jwk(KEY_A, "a").to_string();
    for secret in [public_der.as_slice(), jwk_json.as_bytes()] {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("a".into());
        let forged =
            jsonwebtoken::encode(&header, &v2_claims(), &EncodingKey::from_secret(secret)).unwrap();
        assert_eq!(v.verify(&forged).await, Err(Refusal::Algorithm));
    }
    // RS512, PS256, ES256 headers: not RS256.
    for alg in ["RS512", "PS256", "ES256"] {
        let token = format!(
            "{}.{}.AAAA",
            part(json!({"alg": alg, "kid": "a"})),
            part(v2_claims())
        );
        assert_eq!(v.verify(&token).await, Err(Refusal::Algorithm), "{alg}");
    }
    // Signed by a key the directory does not publish, under a kid it does.
    let forged = sign(KEY_C, "a", &v2_claims());
    assert_eq!(v.verify(&forged).await, Err(Refusal::Signature));
    // A valid token with its payload changed.
    let good = sign(KEY_A, "a", &v2_claims());
    let mut parts: Vec<&str> = good.split('.').collect();
    let admin = part(with(v2_claims(), "roles", json!(["Sendgate.Admin"])));
    parts[1] = &admin;
    assert_eq!(v.verify(&parts.join(".")).await, Err(Refusal::Signature));
    // No kid.
    let mut header = Header::new(Algorithm::RS256);
    header.kid = None;
    let no_kid =
        jsonwebtoken::encode(&header, &v2_claims(), &EncodingKey::from_rsa_der(KEY_A)).unwrap();
    assert_eq!(v.verify(&no_kid).await, Err(Refusal::UnknownKey));
    // Not a JWT, or too long.
    for bad in ["", "a.b", "a.b.c.d", "a..c", "é.b.c", "sg_0123"] {
        assert_eq!(v.verify(bad).await, Err(Refusal::Malformed), "{bad:?}");
    }
    let long = format!("{}.{}.{}", "a".repeat(MAX_TOKEN_BYTES), "b", "c");
    assert_eq!(v.verify(&long).await, Err(Refusal::Malformed));
}

#[tokio::test(start_paused = true)]
async fn allowed_apps_let_only_those_in() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let mut s = settings();
    s.allowed_apps = Some(vec![
        Guid::parse("aaaaaaaa-0000-0000-0000-000000000009").unwrap()
    ]);
    let v = EntraVerifier::new(&s, directory.clone());
    assert_eq!(
        v.verify(&sign(KEY_A, "a", &v2_claims())).await,
        Err(Refusal::ApplicationNotAllowed)
    );
    let other = with(
        v2_claims(),
        "azp",
        json!("AAAAAAAA-0000-0000-0000-000000000009"),
    );
    assert!(
        v.verify(&sign(KEY_A, "a", &other)).await.is_ok(),
        "GUIDs compared in any case"
    );
}

#[test]
fn jwts_are_told_apart_from_api_keys() {
    assert!(looks_like_jwt("eyJh.eyJz.c2ln"));
    assert!(looks_like_jwt("a-_.b.")); // an empty signature part is still the shape
    for other in [
        "sg_0123abcd",
        "a.b",
        "a.b.c.d",
        ".b.c",
        "a..c",
        "a.b.c=",
        "a+b.c.d",
        "",
    ] {
        assert!(!looks_like_jwt(other), "{other:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_unknown_kids_fetches_once_per_30_seconds() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = Arc::new(started(&directory).await);
    assert!(v.verify(&sign(KEY_A, "a", &v2_claims())).await.is_ok());
    assert_eq!(directory.jwks_gets(), 1);
    let storm: Vec<_> = (0..50)
        .map(|i| {
            let v = v.clone();
            let token = sign(KEY_A, &format!("made-up-{i}"), &v2_claims());
            tokio::spawn(async move { v.verify(&token).await })
        })
        .collect();
    for refused in storm {
        assert_eq!(refused.await.unwrap(), Err(Refusal::UnknownKey));
    }
    assert_eq!(directory.jwks_gets(), 2, "the storm cost one fetch");
    assert_eq!(
        directory.gets(&discovery_url()),
        1,
        "a kid's fetch is the JWKS only"
    );
    tokio::time::advance(ON_DEMAND_EVERY - Duration::from_secs(1)).await;
    let token = sign(KEY_A, "made-up", &v2_claims());
    assert_eq!(v.verify(&token).await, Err(Refusal::UnknownKey));
    assert_eq!(directory.jwks_gets(), 2, "still within 30 s");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(v.verify(&token).await, Err(Refusal::UnknownKey));
    assert_eq!(directory.jwks_gets(), 3, "30 s on: one more");
    // Known keys never wait for, nor cause, a fetch.
    assert!(v.verify(&sign(KEY_A, "a", &v2_claims())).await.is_ok());
    assert_eq!(directory.jwks_gets(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_rollover_is_picked_up_by_the_new_kid_and_a_removed_key_is_gone() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = started(&directory).await;
    assert!(v.verify(&sign(KEY_A, "a", &v2_claims())).await.is_ok());
    // The directory adds b: the first token signed by b fetches the set again.
    directory.publish(&[(KEY_A, "a"), (KEY_B, "b")]);
    assert!(v.verify(&sign(KEY_B, "b", &v2_claims())).await.is_ok());
    assert_eq!(directory.jwks_gets(), 2);
    // Then removes a and adds c (30 s later): c's first token fetches; a's are refused.
    tokio::time::advance(ON_DEMAND_EVERY).await;
    directory.publish(&[(KEY_B, "b"), (KEY_C, "c")]);
    assert!(v.verify(&sign(KEY_C, "c", &v2_claims())).await.is_ok());
    assert_eq!(
        v.verify(&sign(KEY_A, "a", &v2_claims())).await,
        Err(Refusal::UnknownKey)
    );
    assert_eq!(directory.jwks_gets(), 3);
}

#[tokio::test(start_paused = true)]
async fn with_the_directory_down_the_keys_in_hand_are_kept_and_unknown_kids_refused() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = started(&directory).await;
    assert_eq!(directory.jwks_gets(), 1);
    directory.down.store(true, Ordering::SeqCst);
    // The day's refresh fails: the keys stay, retried later.
    tokio::time::sleep(REFRESH_EVERY).await;
    assert_eq!(directory.jwks_gets(), 1, "discovery failed first");
    assert_eq!(directory.gets(&discovery_url()), 2);
    assert!(v.verify(&sign(KEY_A, "a", &v2_claims())).await.is_ok());
    // A new kid is refused, never let through, while the directory is down.
    directory.publish(&[(KEY_A, "a"), (KEY_B, "b")]);
    assert_eq!(
        v.verify(&sign(KEY_B, "b", &v2_claims())).await,
        Err(Refusal::UnknownKey)
    );
    assert!(v.verify(&sign(KEY_A, "a", &v2_claims())).await.is_ok());
    // Retried (1 s, 2 s, 4 s ...): back up, the next retry has b.
    directory.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await;
    tokio::time::advance(ON_DEMAND_EVERY).await;
    assert!(v.verify(&sign(KEY_B, "b", &v2_claims())).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_directory_unreachable_at_start_is_retried_until_it_answers() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    directory.down.store(true, Ordering::SeqCst);
    let v = verifier(&directory);
    v.keep_fresh();
    let token = sign(KEY_A, "a", &v2_claims());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(v.verify(&token).await, Err(Refusal::NoKeys));
    // The timer's attempts at 0, 1, 3, 7 and 15 s, and the token's own at 10 ms.
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert_eq!(directory.gets(&discovery_url()), 6);
    // Doubling up to 5 min.
    assert_eq!(keys::retry_after(9), Duration::from_secs(256));
    assert_eq!(keys::retry_after(10), Duration::from_secs(300));
    assert_eq!(keys::retry_after(100), Duration::from_secs(300));
    directory.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert!(v.verify(&token).await.is_ok());
    let fetched = v.keys().current().unwrap();
    assert_eq!(fetched.len(), 1);
    // The next fetch only a day later.
    let gets = directory.total.load(Ordering::SeqCst);
    tokio::time::sleep(REFRESH_EVERY - Duration::from_secs(60)).await;
    assert_eq!(directory.total.load(Ordering::SeqCst), gets);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        directory.total.load(Ordering::SeqCst),
        gets + 2,
        "discovery and JWKS"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_directory_holds_only_the_tokens_that_need_it_and_only_so_long() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = Arc::new(started(&directory).await);
    assert!(v.verify(&sign(KEY_A, "a", &v2_claims())).await.is_ok());
    *directory.delay.lock() = Duration::from_secs(60);
    directory.publish(&[(KEY_A, "a"), (KEY_B, "b")]);
    let started = tokio::time::Instant::now();
    let waiting = {
        let v = v.clone();
        let token = sign(KEY_B, "b", &v2_claims());
        tokio::spawn(async move { v.verify(&token).await })
    };
    tokio::task::yield_now().await;
    // A known key is answered at once, the fetch in flight notwithstanding.
    assert!(v.verify(&sign(KEY_A, "a", &v2_claims())).await.is_ok());
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(waiting.await.unwrap(), Err(Refusal::UnknownKey));
    assert_eq!(
        started.elapsed(),
        REQUEST_WAIT,
        "waited for the fetch no longer"
    );
    // The fetch went on in its own task: once it lands, b is known without another.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(v.verify(&sign(KEY_B, "b", &v2_claims())).await.is_ok());
    assert_eq!(directory.jwks_gets(), 2);
}

/// Where the JWKS moves to in the tests that move it.
fn moved_jwks_url() -> String {
    format!("{AUTHORITY}/{TENANT}/discovery/v2.0/keys-moved")
}

impl Directory {
    /// Discovery from now on names [`moved_jwks_url`], which publishes `keys`.
    fn move_jwks(&self, keys: &[(&[u8], &str)]) {
        let keys: Vec<Value> = keys.iter().map(|(der, kid)| jwk(der, kid)).collect();
        let mut documents = self.documents.lock();
        documents.insert(
            moved_jwks_url(),
            json!({ "keys": keys }).to_string().into_bytes(),
        );
        documents.insert(
            discovery_url(),
            json!({"issuer": v2_issuer(), "jwks_uri": moved_jwks_url()})
                .to_string()
                .into_bytes(),
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_days_refresh_reads_discovery_again_even_when_a_tokens_fetch_is_in_flight() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = Arc::new(started(&directory).await);
    assert_eq!(directory.gets(&discovery_url()), 1);
    // Just before the day is over the JWKS moves, and every GET starts taking 10 s.
    tokio::time::sleep(REFRESH_EVERY - Duration::from_secs(2)).await;
    directory.move_jwks(&[(KEY_A, "a"), (KEY_B, "b")]);
    *directory.delay.lock() = Duration::from_secs(10);
    // A token's unknown kid starts a fetch (the JWKS where it was) that is still in flight
    // when the day's timer fires.
    let waiting = {
        let v = v.clone();
        let token = sign(KEY_B, "b", &v2_claims());
        tokio::spawn(async move { v.verify(&token).await })
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(waiting.await.unwrap(), Err(Refusal::UnknownKey));
    // The timer did not take the token's fetch for its own: it read discovery again, and
    // found the keys where they are now.
    assert_eq!(directory.gets(&discovery_url()), 2, "discovery read again");
    assert_eq!(directory.gets(&moved_jwks_url()), 1);
    let set = v.keys().current().unwrap();
    assert_eq!(set.discovery.jwks_uri, moved_jwks_url());
    assert!(set.key("b").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_jwks_gone_from_its_place_makes_a_tokens_fetch_read_discovery_again() {
    let directory = Directory::new(&[(KEY_A, "a")]);
    let v = started(&directory).await;
    // The JWKS moves and the old place is gone: a token signed by the new key finds it at
    // once, not after the day's refresh.
    directory.move_jwks(&[(KEY_A, "a"), (KEY_B, "b")]);
    directory.documents.lock().remove(&jwks_url());
    assert!(v.verify(&sign(KEY_B, "b", &v2_claims())).await.is_ok());
    assert_eq!(directory.gets(&discovery_url()), 2);
    assert_eq!(directory.jwks_gets(), 2, "the old place tried first");
    // The JWKS down where discovery still says it is: one discovery GET more, no second
    // GET of the same JWKS, the keys in hand kept.
    tokio::time::advance(ON_DEMAND_EVERY).await;
    directory.documents.lock().remove(&moved_jwks_url());
    let token = sign(KEY_C, "c", &v2_claims());
    assert_eq!(v.verify(&token).await, Err(Refusal::UnknownKey));
    assert_eq!(directory.gets(&discovery_url()), 3);
    assert_eq!(directory.gets(&moved_jwks_url()), 2);
    assert!(v.verify(&sign(KEY_B, "b", &v2_claims())).await.is_ok());
}

#[test]
fn discovery_must_name_the_tenant_and_publish_keys_over_https() {
    let doc = |issuer: &str, jwks: &str| json!({"issuer": issuer, "jwks_uri": jwks}).to_string();
    let ok =
        keys::parse_discovery(doc(&v2_issuer(), &jwks_url()).as_bytes(), TENANT, false).unwrap();
    assert_eq!(ok.issuer, v2_issuer());
    let foreign = doc(&format!("{AUTHORITY}/{OTHER_TENANT}/v2.0"), &jwks_url());
    assert!(keys::parse_discovery(foreign.as_bytes(), TENANT, false).is_err());
    let plain = doc(&v2_issuer(), "http://login.example/keys");
    assert!(keys::parse_discovery(plain.as_bytes(), TENANT, false).is_err());
    assert!(keys::parse_discovery(plain.as_bytes(), TENANT, true).is_ok());
    assert!(keys::parse_discovery(b"<html>", TENANT, false).is_err());
}

#[test]
fn discovery_names_the_tenant_as_its_issuers_own_path_segment_not_anywhere_in_it() {
    let parse = |issuer: &str, plain: bool| {
        let doc = json!({"issuer": issuer, "jwks_uri": jwks_url()}).to_string();
        keys::parse_discovery(doc.as_bytes(), TENANT, plain)
    };
    for good in [
        v2_issuer(),
        format!("https://login.example/some/path/{TENANT}/v2.0"),
    ] {
        assert!(parse(&good, false).is_ok(), "{good}");
    }
    assert!(parse(&format!("http://127.0.0.1:4000/{TENANT}/v2.0"), true).is_ok());
    for foreign in [
        format!("{AUTHORITY}/{TENANT}-x/v2.0"),
        format!("{AUTHORITY}/x{TENANT}/v2.0"),
        format!("{AUTHORITY}/{TENANT}{TENANT}/v2.0"),
        format!("https://{TENANT}.evil.example/common/v2.0"),
        format!("{AUTHORITY}/common/v2.0?tenant={TENANT}"),
        format!("{AUTHORITY}/common/v2.0#{TENANT}"),
        format!("{AUTHORITY}/common/v2.0/{TENANT}"),
        format!("{AUTHORITY}/{OTHER_TENANT}/v2.0/{TENANT}/v2.0/x"),
        format!("{AUTHORITY}/{TENANT}/v2.0/"),
        format!("{AUTHORITY}/{TENANT}/v1.0"),
        format!("{AUTHORITY}/{TENANT}/V2.0"),
        format!("{AUTHORITY}/{TENANT}"),
        format!("https://user:{TENANT}@login.example/common/v2.0"),
        format!("ftp://login.example/{TENANT}/v2.0"),
        format!("http://login.example/{TENANT}/v2.0"),
        format!("{TENANT}/v2.0"),
    ] {
        assert!(
            matches!(
                parse(&foreign, false),
                Err(keys::KeysError::ForeignIssuer { .. })
            ),
            "{foreign}"
        );
    }
}

#[test]
fn a_jwks_keeps_only_rsa_signing_keys_with_a_kid() {
    let mut enc = jwk(KEY_B, "enc");
    enc["use"] = json!("enc");
    let mut es = jwk(KEY_B, "es");
    es["alg"] = json!("ES256");
    let mut no_kid = jwk(KEY_B, "x");
    no_kid.as_object_mut().unwrap().remove("kid");
    let ec = json!({"kty": "EC", "kid": "ec", "crv": "P-256", "x": "AA", "y": "AA"});
    let body = json!({"keys": [jwk(KEY_A, "a"), enc, es, no_kid, ec]}).to_string();
    let keys = keys::parse_jwks(body.as_bytes()).unwrap();
    assert_eq!(keys.keys().collect::<Vec<_>>(), ["a"]);
    assert!(
        keys::parse_jwks(br#"{"keys": []}"#).is_err(),
        "an empty set keeps the old"
    );
    assert!(keys::parse_jwks(b"{}").is_err());
    let many: Vec<Value> = (0..100).map(|i| jwk(KEY_A, &format!("k{i}"))).collect();
    let body = json!({ "keys": many }).to_string();
    assert_eq!(
        keys::parse_jwks(body.as_bytes()).unwrap().len(),
        keys::MAX_KEYS
    );
}
