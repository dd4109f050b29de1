//! Micro-benchmarks of the admission decision on the hot path (issue 9, part 5).
//!
//! `cargo bench --bench admission` (or `./bench/run.sh`, which writes the numbers into
//! docs/benchmarks.md). Under `cargo test --all-targets` each benchmark runs once, as a
//! smoke test, with no timing.
//!
//! Everything here goes through the library's public API with an in-memory stub backend,
//! so it measures the gateway's own work, not a broker's:
//! - `auth/*`: `Authenticator::authenticate` (SHA-256 of the token, constant-time compare
//!   against every key) with 1, 5 and 20 keys, the token matching the last key; and
//!   `auth/entra_token`: the same call with an Entra ID access token (a v2 RS256 JWT of
//!   ~0.9 KB, its key in hand: the header and payload decoded, the RSA-2048 signature
//!   verified with ring, the claims checked, the principal made), beside the 20 keys;
//! - `lifecycle/admit_send`: the drain accounting of one send (admit, then drop the guard);
//! - `capacity/*`: `CapacityGate::admit` on a cached (fresh) read, admitted (then finished)
//!   and refused (the 429 path), with and without a lag window (RabbitMQ's management API
//!   source keeps one, `SENDGATE_RABBITMQ_STATS_LAG_MS`);
//! - `decision/*`: the in-process steps of a send in the contract's order (auth, role and
//!   queue scope, lifecycle, JSON check of a 1 KB body, then `Dispatcher::send`: route,
//!   capacity, in-flight slot, breaker, the stub's send), ending in a 429 or a 201;
//! - `parts/*`: pieces the decision pays for on every request, for scale (a UUID v4 id,
//!   the JSON validity check of the 1 KB body).

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use actix_web::test::TestRequest;
use actix_web::HttpRequest;
use async_trait::async_trait;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use futures_util::FutureExt;
use tokio::time::Instant;

use sendgate::admission::breaker::BreakerPolicy;
use sendgate::admission::ceiling::{BacklogEffect, CapacityGate, CapacityPolicy, GateParts};
use sendgate::admission::inflight::InFlight;
use sendgate::admission::{BackendRole, DispatchError, Dispatcher, Lane};
use sendgate::backend::{Backend, Backlog, DepthError, OutgoingMessage, SendError, SendReceipt};
use sendgate::config::{CapacitySettings, Settings};
use sendgate::config::{EntraCallersSettings, Guid};
use sendgate::domain::{MessageId, QueueName};
use sendgate::http::auth::{token_digest, Authenticator, Permission};
use sendgate::http::entra_auth::keys::{Fetch, FetchError};
use sendgate::http::entra_auth::EntraVerifier;
use sendgate::lifecycle::Lifecycle;

/// A broker that answers at once: a fixed backlog, and every send acknowledged.
struct Stub {
    backlog: u64,
    /// How far its depth trails (RabbitMQ's management API: a lag window is kept).
    lag: Duration,
}

#[async_trait]
impl Backend for Stub {
    fn kind(&self) -> &'static str {
        "stub"
    }

    fn depth_lag(&self) -> Duration {
        self.lag
    }

    async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
        Ok(SendReceipt { duplicate: false })
    }

    async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
        Ok(Backlog::of(self.backlog))
    }
}

const TOKEN: &str = "sg_bench_token_0123456789abcdef0123456789abcdef0123456789abcdef01";

/// A keys file of `n` sender keys; `TOKEN` is the last one.
fn authenticator(n: usize) -> Authenticator {
    let mut text = String::new();
    for i in 0..n {
        let token = if i + 1 == n {
            TOKEN.to_owned()
        } else {
            format!("other-token-{i}")
        };
        text.push_str(&format!(
            "[[keys]]\nname = \"key{i}\"\nsha256 = \"{}\"\nroles = [\"sender\"]\nqueues = [\"bench\", \"other\"]\n",
            hex::encode(token_digest(&token))
        ));
    }
    Authenticator::from_toml(&text).expect("keys")
}

fn request() -> HttpRequest {
    TestRequest::post()
        .uri("/v1/queues/bench/messages")
        .insert_header(("Authorization", format!("Bearer {TOKEN}")))
        .insert_header(("Content-Type", "application/json"))
        .to_http_request()
}

/// The 1 KB JSON body the load benchmarks send.
fn body() -> Bytes {
    let mut b = br#"{"bench":true,"pad":""#.to_vec();
    b.extend(std::iter::repeat_n(b'x', 1024 - b.len() - 2));
    b.extend_from_slice(br#""}"#);
    Bytes::from(b)
}

/// The capacity settings the gateway would have with these variables set (defaults else).
fn capacity(vars: &[(&str, &str)]) -> CapacitySettings {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_vars(&env).expect("settings").capacity
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

fn queue() -> QueueName {
    QueueName::parse("bench").expect("queue name")
}

/// A gate whose first read has been made (and stays fresh for an hour).
fn primed_gate(backlog: u64, limit: u64, lag: Duration) -> Arc<CapacityGate> {
    let settings = capacity(&[
        ("SENDGATE_DEPTH_TTL_MS", "3600000"),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", &limit.to_string()),
    ]);
    let stub = Arc::new(Stub { backlog, lag });
    let gate = CapacityGate::new(GateParts::alone(
        queue(),
        CapacityPolicy::from_settings(&settings),
        stub,
    ));
    // The read runs under a deadline (a tokio timer), so it needs a runtime; the cached
    // admits measured below never reach a timer.
    runtime().block_on(gate.prime());
    gate
}

fn bench_auth(c: &mut Criterion) {
    let req = request();
    let mut group = c.benchmark_group("auth");
    for n in [1usize, 5, 20] {
        let auth = authenticator(n);
        group.bench_with_input(BenchmarkId::new("authenticate", n), &auth, |b, auth| {
            b.iter(|| {
                // A key's answer is ready at once (only an Entra ID token may wait).
                let p = auth
                    .authenticate(black_box(&req))
                    .now_or_never()
                    .expect("keys never wait")
                    .expect("known token");
                black_box(p.may(Permission::Send))
            })
        });
    }
    group.finish();
}

const TENANT: &str = "11111111-2222-3333-4444-555555555555";
const APP: &str = "aaaaaaaa-0000-0000-0000-000000000001";
const AUTHORITY: &str = "https://login.bench";
/// A test key of the local OpenID provider (tests/support/oidc.rs).
const KEY: &[u8] = include_bytes!("../tests/data/oidc/key-a.der");

/// The directory, answering from memory: its discovery document and one key.
struct Directory;

#[async_trait]
impl Fetch for Directory {
    async fn get(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let body = if url.ends_with("openid-configuration") {
            serde_json::json!({
                "issuer": format!("{AUTHORITY}/{TENANT}/v2.0"),
                "jwks_uri": format!("{AUTHORITY}/{TENANT}/discovery/v2.0/keys"),
            })
        } else {
            let pair = ring::signature::RsaKeyPair::from_der(KEY).expect("a test key");
            let public: ring::signature::RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
            serde_json::json!({"keys": [{"kty": "RSA", "kid": "a", "n": b64.encode(&public.n), "e": b64.encode(&public.e)}]})
        };
        Ok(body.to_string().into_bytes())
    }
}

/// The 20 keys of `authenticator(20)` and Entra ID on, its key fetched; a request bearing
/// a valid v2 token of an application listed in `[[apps]]`.
fn entra_authenticator(rt: &tokio::runtime::Runtime) -> (Authenticator, HttpRequest) {
    let settings = EntraCallersSettings {
        tenant: Guid::parse(TENANT).expect("a GUID"),
        audiences: vec!["api://sendgate".into()],
        authority: AUTHORITY.into(),
        allowed_apps: None,
    };
    let verifier = EntraVerifier::new(&settings, Arc::new(Directory));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let claims = serde_json::json!({
        "aud": "api://sendgate", "iss": format!("{AUTHORITY}/{TENANT}/v2.0"), "tid": TENANT,
        "ver": "2.0", "azp": APP, "azpacr": "1", "idtyp": "app", "oid": APP, "sub": APP,
        "roles": ["Sendgate.Sender"], "iat": now, "nbf": now, "exp": now + 3600,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("a".into());
    let token = jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_rsa_der(KEY),
    )
    .expect("a token");
    let mut text = String::new();
    for i in 0..20 {
        text.push_str(&format!(
            "[[keys]]\nname = \"key{i}\"\nsha256 = \"{}\"\nroles = [\"sender\"]\nqueues = [\"bench\"]\n",
            hex::encode(token_digest(&format!("other-token-{i}")))
        ));
    }
    text.push_str(&format!(
        "[[apps]]\nname = \"playground\"\napp_id = \"{APP}\"\nqueues = [\"bench\"]\n"
    ));
    let auth = Authenticator::parse(Some(&text), Some(verifier)).expect("keys and apps");
    let req = TestRequest::post()
        .uri("/v1/queues/bench/messages")
        .insert_header(("Authorization", format!("Bearer {token}")))
        .insert_header(("Content-Type", "application/json"))
        .to_http_request();
    // The first token fetches the keys (a task on the runtime); every later one finds them.
    let first = rt.block_on(auth.authenticate(&req)).expect("a valid token");
    assert_eq!(first.name, "playground");
    (auth, req)
}

fn bench_entra(c: &mut Criterion) {
    let rt = runtime();
    let (auth, req) = entra_authenticator(&rt);
    let mut group = c.benchmark_group("auth");
    group.bench_function("entra_token", |b| {
        b.iter(|| {
            // Its key in hand, a token is judged without waiting.
            let p = auth
                .authenticate(black_box(&req))
                .now_or_never()
                .expect("keys in hand never wait")
                .expect("a valid token");
            black_box(p.may(Permission::Send))
        })
    });
    group.finish();
}

fn bench_lifecycle(c: &mut Criterion) {
    let life = Lifecycle::new();
    life.set_running();
    let mut group = c.benchmark_group("lifecycle");
    group.bench_function("admit_send", |b| {
        b.iter(|| drop(black_box(life.admit_send().expect("running"))))
    });
    group.finish();
}

fn bench_capacity(c: &mut Criterion) {
    let mut group = c.benchmark_group("capacity");
    for (name, lag) in [
        ("admit_cached", Duration::ZERO),
        ("admit_cached_lag6s", Duration::from_secs(6)),
    ] {
        let gate = primed_gate(0, u64::MAX / 2, lag);
        group.bench_function(name, |b| {
            b.iter(|| {
                let r = gate
                    .admit()
                    .now_or_never()
                    .expect("cached: no await")
                    .expect("admitted");
                r.finish(BacklogEffect::Stored);
            })
        });
    }
    let gate = primed_gate(10, 1, Duration::from_secs(6));
    group.bench_function("refuse_cached_429", |b| {
        b.iter(|| {
            let refused = gate.admit().now_or_never().expect("cached: no await");
            black_box(refused.is_err())
        })
    });
    group.finish();
}

/// One send's in-process decision, as `POST /v1/queues/{queue}/messages` runs it.
async fn decide(
    auth: &Authenticator,
    req: &HttpRequest,
    life: &Lifecycle,
    dispatcher: &Dispatcher,
    queues: &HashMap<String, QueueName>,
    body: &Bytes,
) -> Result<(), DispatchError> {
    let principal = auth.authenticate(req).await.expect("known token");
    assert!(principal.may(Permission::Send));
    let queue = queues.get("bench").expect("served").clone();
    assert!(principal.may_use_queue(&queue));
    let _guard = life.admit_send().expect("running");
    serde_json::from_slice::<serde::de::IgnoredAny>(body).expect("valid JSON");
    let message = OutgoingMessage::new(queue, MessageId::generate(), None, body.clone());
    dispatcher.send(message).await.result.map(|_| ())
}

fn bench_decision(c: &mut Criterion) {
    let runtime = runtime();
    let auth = authenticator(5);
    let req = request();
    let body = body();
    let life = Lifecycle::new();
    life.set_running();
    let queues: HashMap<String, QueueName> = [("bench".to_owned(), queue())].into();

    let mut group = c.benchmark_group("decision");
    for (name, backlog, limit) in [
        ("reject_429", 10u64, "1"),
        ("accept_201_stub", 0, "1000000000000"),
    ] {
        let settings = capacity(&[
            ("SENDGATE_DEPTH_TTL_MS", "3600000"),
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", limit),
        ]);
        let stub: Arc<dyn Backend> = Arc::new(Stub {
            backlog,
            lag: Duration::ZERO,
        });
        let policy = CapacityPolicy::from_settings(&settings);
        let gate = CapacityGate::new(GateParts::alone(queue(), policy, Arc::clone(&stub)));
        let route = Lane::new(BackendRole::Primary, stub, [gate], BreakerPolicy::default());
        let dispatcher = Dispatcher::new(
            route,
            None,
            None,
            InFlight::new(256),
            Duration::from_secs(10),
        );
        runtime.block_on(dispatcher.prime_capacity());
        let want_ok = backlog == 0;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        let out = decide(&auth, &req, &life, &dispatcher, &queues, &body).await;
                        assert_eq!(out.is_ok(), want_ok);
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

fn bench_parts(c: &mut Criterion) {
    let body = body();
    let mut group = c.benchmark_group("parts");
    group.bench_function("uuid_v4_message_id", |b| {
        b.iter(|| black_box(MessageId::generate()))
    });
    group.bench_function("json_check_1k", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).expect("JSON"))
    });
    group.bench_function("sha256_token", |b| {
        b.iter(|| black_box(token_digest(black_box(TOKEN))))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    targets = bench_auth, bench_entra, bench_lifecycle, bench_capacity, bench_decision, bench_parts
}
criterion_main!(benches);
