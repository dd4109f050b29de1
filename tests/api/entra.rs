//! Entra ID access tokens as callers' credentials (contract section 5), against the local
//! OpenID provider of `tests/support/oidc.rs`: its own keys, discovery and JWKS, a
//! rollover, an outage, a slow answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sendgate::http::entra_auth::keys::{Fetch, FetchError, HttpFetch};
use serde_json::{json, Value};

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::gateway::{body_json, GatewayProcess};
use sendgate_testkit::keys::{App, Key, KeysFile};
use sendgate_testkit::oidc::{
    Jwks, OidcProvider, TestKey, KEY_A, KEY_B, KEY_C, OTHER_TENANT, TENANT,
};

/// The Playground, listed in the keys file: the queue `requests` only, tenant `web`.
const PLAYGROUND: &str = "aaaaaaaa-0000-0000-0000-000000000001";
/// An application the keys file does not list.
const UNLISTED: &str = "aaaaaaaa-0000-0000-0000-000000000002";

const INVALID_TOKEN: &str = "Bearer error=\"invalid_token\"";

struct Setup {
    app: TestApp,
    provider: Arc<OidcProvider>,
    _dir: tempfile::TempDir,
}

/// A gateway with an API key (`ops`, admin) and Entra ID on, pointed at a provider
/// publishing `keys`; `extra` variables on top.
async fn setup_with(keys: &[TestKey], extra: &[(&str, &str)]) -> Setup {
    setup_on(OidcProvider::start(keys).await, extra).await
}

/// [`setup_with`] on a provider the test has already set up (an outage from the start).
async fn setup_on(provider: Arc<OidcProvider>, extra: &[(&str, &str)]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = KeysFile::new()
        .key(Key::new("ops", &["admin"]))
        .app(App::new("playground", PLAYGROUND, &["requests"]).tenant("web"))
        .write_in(dir.path());
    let entra = provider.vars();
    let mut vars: Vec<(&str, &str)> = entra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("SENDGATE_API_KEYS_FILE", path.to_str().unwrap()));
    vars.push(("SENDGATE_QUEUES", "requests,private"));
    vars.extend_from_slice(extra);
    let app = spawn_app_with(&vars).await;
    Setup {
        app,
        provider,
        _dir: dir,
    }
}

async fn setup() -> Setup {
    setup_with(&[KEY_A], &[]).await
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

impl Setup {
    async fn send_as(&self, queue: &str, token: &str) -> reqwest::Response {
        self.app
            .send_with(queue, "{}", &[("Authorization", &bearer(token))])
            .await
    }

    /// A valid v2 token of `app` with `roles`, signed by key a.
    fn token(&self, app: &str, roles: &[&str]) -> String {
        KEY_A.sign(&self.provider.v2_claims(app, roles))
    }

    /// Wait until the gateway has the provider's keys (fetched in the background at
    /// start-up): a valid token sends.
    async fn until_keys(&self) {
        let token = self.token(PLAYGROUND, &["Sendgate.Sender"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.send_as("requests", &token).await.status() == 201 {
                return;
            }
            assert!(Instant::now() < deadline, "the gateway never got the keys");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A `401` for a token that proves nothing: the RFC 6750 challenge, the usual body,
/// nothing that says why.
async fn assert_invalid_token(response: reqwest::Response, case: &str) {
    assert_eq!(response.status(), 401, "{case}");
    assert_eq!(
        response.headers()["WWW-Authenticate"],
        INVALID_TOKEN,
        "{case}"
    );
    let body = body_json(response).await;
    assert_eq!(body["code"], "unauthenticated", "{case}");
    assert_eq!(
        body["message"], "A valid bearer token is required.",
        "{case}: no detail"
    );
}

fn with(mut claims: Value, field: &str, value: Value) -> Value {
    claims[field] = value;
    claims
}

#[tokio::test]
async fn a_valid_token_sends_within_its_role_and_queues() {
    let s = setup().await;
    s.until_keys().await;
    let sender = s.token(PLAYGROUND, &["Sendgate.Sender"]);
    let response = s.send_as("requests", &sender).await;
    assert_eq!(response.status(), 201);
    // The [[apps]] entry's queues: not `private`.
    let response = s.send_as("private", &sender).await;
    assert_eq!(response.status(), 403);
    assert_eq!(body_json(response).await["code"], "forbidden");
    // The role: a sender does not observe.
    let metrics = s
        .app
        .client
        .get(s.app.url("/metrics"))
        .header("Authorization", bearer(&sender))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 403);
    // A v1 token (a managed identity's by default): the same application.
    let v1 = KEY_A.sign(&s.provider.v1_claims(PLAYGROUND, &["Sendgate.Sender"]));
    assert_eq!(s.send_as("requests", &v1).await.status(), 201);
    // An unlisted application: named by its id, every queue its roles allow.
    let other = s.token(UNLISTED, &["Sendgate.Sender"]);
    assert_eq!(s.send_as("private", &other).await.status(), 201);
    // API keys work beside tokens.
    let key = s
        .app
        .send_with("private", "{}", &[("Authorization", "Bearer ops-secret")])
        .await;
    assert_eq!(key.status(), 201);
    assert_eq!(s.app.stored("requests"), 3);
    assert_eq!(s.app.stored("private"), 2);
}

#[tokio::test]
async fn an_observer_sending_and_a_token_without_a_role_are_403() {
    let s = setup().await;
    s.until_keys().await;
    let observer = s.token(PLAYGROUND, &["Sendgate.Observer"]);
    let response = s.send_as("requests", &observer).await;
    assert_eq!(response.status(), 403);
    assert_eq!(body_json(response).await["code"], "forbidden");
    let metrics = s
        .app
        .client
        .get(s.app.url("/metrics"))
        .header("Authorization", bearer(&observer))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    // Valid, but none of sendgate's roles: authenticated, permitted nothing.
    let none = s.token(UNLISTED, &["Other.Role"]);
    assert_eq!(s.send_as("requests", &none).await.status(), 403);
}

#[tokio::test]
async fn every_token_that_proves_nothing_is_401_invalid_token() {
    let s = setup().await;
    s.until_keys().await;
    let p = &s.provider;
    let good = p.v2_claims(PLAYGROUND, &["Sendgate.Sender"]);
    let part = |value: Value| URL_SAFE_NO_PAD.encode(value.to_string());
    let hs256 = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(KEY_A.kid.into());
        jsonwebtoken::encode(
            &header,
            &good,
            &jsonwebtoken::EncodingKey::from_secret(&KEY_A.public_der()),
        )
        .unwrap()
    };
    let t = good["iat"].as_u64().unwrap();
    let cases: Vec<(&str, String)> = vec![
        (
            "wrong audience",
            KEY_A.sign(&with(good.clone(), "aud", json!("api://another"))),
        ),
        (
            "wrong issuer",
            KEY_A.sign(&with(
                good.clone(),
                "iss",
                json!(format!("{}/{OTHER_TENANT}/v2.0", p.authority)),
            )),
        ),
        (
            "a v1 issuer on a v2 token",
            KEY_A.sign(&with(
                good.clone(),
                "iss",
                json!(format!("https://sts.windows.net/{TENANT}/")),
            )),
        ),
        (
            "expired",
            KEY_A.sign(&with(good.clone(), "exp", json!(t - 600))),
        ),
        (
            "not yet valid",
            KEY_A.sign(&with(good.clone(), "nbf", json!(t + 600))),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                part(json!({"alg": "none", "typ": "JWT", "kid": KEY_A.kid})),
                part(good.clone())
            ),
        ),
        ("HS256 signed with the public key", hs256),
        (
            "another tenant",
            KEY_A.sign(&with(good.clone(), "tid", json!(OTHER_TENANT))),
        ),
        (
            "signed by a key the directory does not publish, under its kid",
            KEY_C.sign_as(KEY_A.kid, &good),
        ),
        ("not a JWT", "eyJ.not-a.jwt!".into()),
        (
            "a v1 token of another tenant, without tid",
            KEY_A.sign(&{
                let mut claims = with(
                    p.v1_claims(PLAYGROUND, &["Sendgate.Sender"]),
                    "iss",
                    json!(format!("https://sts.windows.net/{OTHER_TENANT}/")),
                );
                claims.as_object_mut().unwrap().remove("tid");
                claims
            }),
        ),
    ];
    for (case, token) in &cases {
        assert_invalid_token(s.send_as("requests", token).await, case).await;
    }
    assert_eq!(s.app.stored("requests"), 1, "only until_keys' send");
    assert_eq!(s.app.backend_calls(), 1);
}

#[tokio::test]
async fn an_application_not_allowed_is_401() {
    let s = setup_with(&[KEY_A], &[("SENDGATE_ENTRA_ALLOWED_APPS", PLAYGROUND)]).await;
    s.until_keys().await;
    let other = s.token(UNLISTED, &["Sendgate.Sender"]);
    assert_invalid_token(s.send_as("requests", &other).await, "not allowed").await;
}

#[tokio::test]
async fn a_storm_of_unknown_kids_costs_the_directory_one_fetch() {
    let s = setup().await;
    s.until_keys().await;
    let before = s.provider.jwks_gets();
    let claims = s.provider.v2_claims(PLAYGROUND, &["Sendgate.Sender"]);
    let storm: Vec<_> = (0..40)
        .map(|i| {
            let client = s.app.client.clone();
            let url = s.app.url("/v1/queues/requests/messages");
            let token = KEY_A.sign_as(&format!("made-up-{i}"), &claims);
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("Content-Type", "application/json")
                    .header("Authorization", format!("Bearer {token}"))
                    .body("{}")
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    for request in storm {
        assert_eq!(request.await.unwrap(), 401);
    }
    assert_eq!(
        s.provider.jwks_gets(),
        before + 1,
        "one refresh for the storm"
    );
    // And none for a second wave within 30 s.
    let again = KEY_A.sign_as("made-up-again", &claims);
    assert_eq!(s.send_as("requests", &again).await.status(), 401);
    assert_eq!(s.provider.jwks_gets(), before + 1);
}

#[tokio::test]
async fn a_rollover_is_followed_and_a_removed_key_refused() {
    let s = setup().await;
    s.until_keys().await;
    let claims = s.provider.v2_claims(PLAYGROUND, &["Sendgate.Sender"]);
    // Entra publishes b beside a, then drops a: the first token signed by b fetches the
    // set again, and from then on a's signature is refused.
    s.provider.publish(&[KEY_B]);
    let before = s.provider.jwks_gets();
    assert_eq!(
        s.send_as("requests", &KEY_B.sign(&claims)).await.status(),
        201
    );
    assert_eq!(s.provider.jwks_gets(), before + 1);
    assert_invalid_token(
        s.send_as("requests", &KEY_A.sign(&claims)).await,
        "a removed key",
    )
    .await;
}

#[tokio::test]
async fn with_the_jwks_endpoint_down_sends_with_known_keys_go_on() {
    let s = setup().await;
    s.until_keys().await;
    let token = s.token(PLAYGROUND, &["Sendgate.Sender"]);
    // b is published: only the outage keeps it from being fetched.
    s.provider.publish(&[KEY_A, KEY_B]);
    for outage in [Jwks::Unavailable, Jwks::Closed] {
        s.provider.set_jwks(outage);
        s.provider.set_discovery_up(false);
        // A new kid asks the directory, which fails: refused, never let through.
        let claims = s.provider.v2_claims(PLAYGROUND, &["Sendgate.Sender"]);
        let unknown = KEY_B.sign(&claims);
        assert_invalid_token(s.send_as("requests", &unknown).await, "unknown kid").await;
        // The keys in hand still serve.
        for _ in 0..3 {
            assert_eq!(
                s.send_as("requests", &token).await.status(),
                201,
                "{outage:?}"
            );
        }
    }
    assert_eq!(s.app.stored("requests"), 7);
}

#[tokio::test]
async fn a_slow_directory_delays_only_a_new_kid_and_not_past_five_seconds() {
    let s = setup().await;
    s.until_keys().await;
    s.provider.set_delay(Duration::from_secs(8));
    let claims = s.provider.v2_claims(PLAYGROUND, &["Sendgate.Sender"]);
    let started = Instant::now();
    let waiting = {
        let client = s.app.client.clone();
        let url = s.app.url("/v1/queues/requests/messages");
        let token = KEY_B.sign(&claims);
        tokio::spawn(async move {
            client
                .post(url)
                .header("Content-Type", "application/json")
                .header("Authorization", format!("Bearer {token}"))
                .body("{}")
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A known key is answered at once while the fetch hangs.
    let quick = Instant::now();
    assert_eq!(
        s.send_as("requests", &KEY_A.sign(&claims)).await.status(),
        201
    );
    assert!(
        quick.elapsed() < Duration::from_secs(2),
        "{:?}",
        quick.elapsed()
    );
    assert_eq!(waiting.await.unwrap(), 401);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(7),
        "{waited:?}"
    );
}

#[tokio::test]
async fn a_directory_down_at_start_up_is_retried_and_keys_work_meanwhile() {
    let provider = OidcProvider::start(&[KEY_A]).await;
    provider.set_discovery_up(false);
    let dir = tempfile::tempdir().unwrap();
    let path = KeysFile::new()
        .key(Key::new("ops", &["admin"]))
        .write_in(dir.path());
    let entra = provider.vars();
    let mut vars: Vec<(&str, &str)> = entra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("SENDGATE_API_KEYS_FILE", path.to_str().unwrap()));
    let app = spawn_app_with(&vars).await;
    let token = KEY_A.sign(&provider.v2_claims(UNLISTED, &["Sendgate.Sender"]));
    let header = bearer(&token);
    let response = app
        .send_with("requests", "{}", &[("Authorization", &header)])
        .await;
    assert_invalid_token(response, "no keys yet").await;
    let key = app
        .send_with("requests", "{}", &[("Authorization", "Bearer ops-secret")])
        .await;
    assert_eq!(key.status(), 201, "keys do not wait for the directory");
    // The directory comes back: the gateway's retries (1 s, 2 s, 4 s ...) find it.
    provider.set_discovery_up(true);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = app
            .send_with("requests", "{}", &[("Authorization", &header)])
            .await;
        if response.status() == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "never retried");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(provider.discovery_gets() >= 2);
}

#[tokio::test]
async fn entra_alone_needs_no_keys_file() {
    let provider = OidcProvider::start(&[KEY_A]).await;
    let entra = provider.vars();
    let mut vars: Vec<(&str, &str)> = entra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("SENDGATE_LISTEN", "0.0.0.0:0"));
    let app = spawn_app_with(&vars).await;
    // No token: the bare challenge.
    let response = app.send("requests", "{}").await;
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["WWW-Authenticate"], "Bearer");
    let token = KEY_A.sign(&provider.v1_claims(UNLISTED, &["Sendgate.Admin"]));
    let deadline = Instant::now() + Duration::from_secs(20);
    while app
        .send_with("requests", "{}", &[("Authorization", &bearer(&token))])
        .await
        .status()
        != 201
    {
        assert!(Instant::now() < deadline, "the gateway never got the keys");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An API key-shaped bearer is just unknown.
    let response = app
        .send_with("requests", "{}", &[("Authorization", "Bearer sg_123")])
        .await;
    assert_invalid_token(response, "no keys").await;
}

#[tokio::test]
async fn the_served_openapi_document_declares_the_entra_scheme_and_its_discovery_url() {
    let s = setup().await;
    let served: Value = s
        .app
        .client
        .get(s.app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let discovery = format!(
        "{}/{TENANT}/v2.0/.well-known/openid-configuration",
        s.provider.authority
    );
    let schemes = &served["components"]["securitySchemes"];
    assert_eq!(schemes["entra"]["type"], "openIdConnect");
    assert_eq!(schemes["entra"]["openIdConnectUrl"], discovery.as_str());
    assert_eq!(schemes["bearer"]["scheme"], "bearer", "keys are on too");
    assert_eq!(served["security"], json!([{"bearer": []}, {"entra": []}]));
    // The discovery URL the document names is the one the gateway reads.
    let doc: Value = s
        .app
        .client
        .get(&discovery)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["issuer"], s.provider.v2_issuer().as_str());
}

/// The gateway's own fetcher (`HttpFetch`) against answers no directory should give: a body
/// that stops coming ends at the fetch's deadline, one longer than any JWKS at the size
/// limit (declared or not, long before the deadline), a redirect is not followed. A fetch is
/// the one in flight for every token waiting on it, so none of these may hold it longer.
#[tokio::test]
async fn a_jwks_that_stalls_or_is_too_large_ends_in_time_and_a_redirect_is_not_followed() {
    // The contract's numbers (section 5): each GET within 5 s, at most 256 KiB read.
    const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
    const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
    let provider = OidcProvider::start(&[KEY_A]).await;
    let fetch = HttpFetch::new().unwrap();
    let jwks = provider.jwks_uri();
    assert!(fetch.get(&jwks).await.is_ok(), "a JWKS as Entra serves one");

    provider.set_jwks(Jwks::Stalled);
    let started = Instant::now();
    let stalled = fetch.get(&jwks).await;
    let took = started.elapsed();
    assert!(
        matches!(stalled, Err(FetchError::Timeout { .. })),
        "{stalled:?}"
    );
    assert!(
        took >= FETCH_TIMEOUT - Duration::from_millis(100)
            && took < FETCH_TIMEOUT + Duration::from_secs(2),
        "{took:?}"
    );

    for hostile in [Jwks::Oversized, Jwks::Endless] {
        provider.set_jwks(hostile);
        let started = Instant::now();
        let refused = fetch.get(&jwks).await;
        let took = started.elapsed();
        assert!(
            matches!(refused, Err(FetchError::TooLarge { limit, .. }) if limit == MAX_DOCUMENT_BYTES),
            "{hostile:?}: {refused:?}"
        );
        assert!(
            took < Duration::from_secs(2),
            "{hostile:?}: {took:?}, not the deadline"
        );
    }
    // The provider saw the gateway hang up on each of the three.
    let deadline = Instant::now() + Duration::from_secs(5);
    while provider.hangups().len() < 3 {
        assert!(Instant::now() < deadline, "{:?}", provider.hangups());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Discovery redirected, even to a path of the same host that serves the document.
    provider.set_discovery_moved_to(Some("/moved/openid-configuration"));
    let moved = fetch.get(&provider.discovery_url()).await;
    assert!(
        matches!(moved, Err(FetchError::Status { status: 302, .. })),
        "{moved:?}"
    );
    assert_eq!(provider.moved_gets(), 0, "the redirect was not followed");
}

/// A JWKS endpoint that fails while the gateway has no keys at all (its first fetch at
/// start-up, and the first token's): every token is `401 invalid_token`, none stored, the
/// gateway keeps trying, and once the endpoint answers the same token sends.
async fn no_keys_yet_then_recovery(outage: Jwks) {
    let provider = OidcProvider::start(&[KEY_A]).await;
    provider.set_jwks(outage);
    let s = setup_on(provider, &[]).await;
    let token = s.token(PLAYGROUND, &["Sendgate.Sender"]);
    for attempt in 0..3 {
        assert_invalid_token(
            s.send_as("requests", &token).await,
            &format!("{outage:?}, attempt {attempt}"),
        )
        .await;
    }
    assert!(s.provider.jwks_gets() >= 1, "the gateway asked");
    assert_eq!(s.app.stored("requests"), 0, "never a pass");
    assert_eq!(s.app.backend_calls(), 0);
    s.provider.set_jwks(Jwks::Up);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if s.send_as("requests", &token).await.status() == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "{outage:?}: never recovered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(s.app.stored("requests"), 1);
}

#[tokio::test]
async fn a_jwks_endpoint_closed_with_no_keys_in_hand_refuses_then_recovers() {
    no_keys_yet_then_recovery(Jwks::Closed).await;
}

/// The same with a JWKS that never finishes its body: the fetch ends at its deadline, so
/// the one fetch in flight does not stand in the way of the retries for ever.
#[tokio::test]
async fn a_jwks_endpoint_stalled_with_no_keys_in_hand_refuses_then_recovers() {
    no_keys_yet_then_recovery(Jwks::Stalled).await;
}

/// A bearer past 16 KiB is refused unread: no fetch, at once, even signed by a key the
/// directory publishes and the gateway has not fetched yet (read, it would send). One
/// exactly at the limit is read and verified.
#[tokio::test]
async fn a_bearer_past_16_kib_is_refused_unread_and_one_at_the_limit_is_verified() {
    // The longest token the gateway reads (Entra's are 1–3 KiB), written as a number: the
    // test pins it, whatever the constant in src/http/entra_auth says.
    const LIMIT: usize = 16 * 1024;
    let s = setup().await;
    s.until_keys().await;
    let claims = s.provider.v2_claims(PLAYGROUND, &["Sendgate.Sender"]);
    let at_limit = KEY_A.sign_to_length(&claims, LIMIT);
    assert_eq!(at_limit.len(), LIMIT);
    assert_eq!(s.send_as("requests", &at_limit).await.status(), 201);

    // key-b is published now, after the gateway fetched key-a's set: a token of b's that
    // were read would fetch the set again and send.
    s.provider.publish(&[KEY_A, KEY_B]);
    let before = s.provider.jwks_gets();
    let past = KEY_B.sign_to_length(&claims, LIMIT + 1);
    let started = Instant::now();
    let response = s.send_as("requests", &past).await;
    let took = started.elapsed();
    assert_invalid_token(response, "past the limit").await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(s.provider.jwks_gets(), before, "no fetch for it");
    assert_eq!(
        s.app.stored("requests"),
        2,
        "until_keys' and the one at the limit"
    );
    // Read, b's token of a usual length does fetch, and sends.
    assert_eq!(
        s.send_as("requests", &KEY_B.sign(&claims)).await.status(),
        201
    );
    assert_eq!(s.provider.jwks_gets(), before + 1);
}

/// Why a token was refused is logged as a stable reason word (contract section 5), and
/// the token never is: the real binary, its JSON log read back.
#[tokio::test]
async fn a_refusal_is_logged_with_its_reason_and_never_the_token() {
    let provider = OidcProvider::start(&[KEY_A]).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").display().to_string();
    let log_path = dir.path().join("sendgate.log");
    let entra = provider.vars();
    let mut vars: Vec<(&str, &str)> = entra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("SENDGATE_DATA_DIR", data.as_str()));
    vars.push(("SENDGATE_LOG_FORMAT", "json"));
    let gw =
        GatewayProcess::start_logging_to(&vars, std::fs::File::create(&log_path).unwrap()).await;
    let send = |token: String| {
        gw.client
            .post(gw.url("/v1/queues/requests/messages"))
            .bearer_auth(token)
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
    };
    let good = provider.v2_claims(PLAYGROUND, &["Sendgate.Sender"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while send(KEY_A.sign(&good)).await.unwrap().status() != 201 {
        assert!(Instant::now() < deadline, "the gateway never got the keys");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A refusal logged while the keys were coming ends its second before the cases.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let t = good["iat"].as_u64().unwrap();
    let cases = [
        (
            "expired",
            KEY_A.sign(&with(good.clone(), "exp", json!(t - 600))),
        ),
        ("unknown_kid", KEY_B.sign(&good)),
        (
            "audience",
            KEY_A.sign(&with(good.clone(), "aud", json!("api://x"))),
        ),
    ];
    let lines_so_far = || std::fs::read_to_string(&log_path).unwrap().lines().count();
    for (reason, token) in &cases {
        // Only what this case logs: a word logged by an earlier one does not count.
        let before = lines_so_far();
        assert_eq!(send(token.clone()).await.unwrap().status(), 401, "{reason}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let refusals: Vec<Value> = std::fs::read_to_string(&log_path)
                .unwrap()
                .lines()
                .skip(before)
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|l| l["event"] == "entra_token_refused")
                .collect();
            if refusals.iter().any(|l| l["reason"] == *reason) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no refusal logged as {reason}: {refusals:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // At most one line a second: the next refusal waits to be logged.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    // RS256 signs the same claims the same way: the accepted token is the one sent above.
    let accepted = ("accepted", KEY_A.sign(&good));
    for (reason, token) in cases.iter().chain([&accepted]) {
        let signature = token.rsplit('.').next().unwrap();
        assert!(!log.contains(signature), "{reason}: the token was logged");
    }
}
