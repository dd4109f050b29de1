//! The fuzz targets' entry points, one per surface that parses outside input: a send's
//! headers and body, the ATOM answers of Service Bus, a SAS connection string, the
//! configuration layers (variables and the TOML file) and the API keys file.
//!
//! Each takes the fuzzer's bytes, decodes them into that surface's input, calls the very
//! function the server calls, and checks what the result promises beyond "no panic"
//! (errors are typed and one line, secrets are not echoed, parsed values round-trip).
//! A broken promise is a panic, which is what libFuzzer and the replay both catch.
//!
//! Compiled for the fuzz crate (`fuzz/`, feature `fuzzing`) and for this crate's unit
//! tests, where `tests` replays every committed input (`fuzz/corpus/<target>/` and
//! `fuzz/seeds/<target>/`) through the same functions, so the targets and the replay cannot drift apart. Not part
//! of the server's API: no normal build contains it.

use std::collections::HashMap;

use actix_web::body::MessageBody;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::{StatusCode, Uri};
use actix_web::test::TestRequest;
use actix_web::{FromRequest, ResponseError};
use sendgate_wire::{ErrorBody, ErrorCode};

use crate::backend::servicebus::atom::{self, QueueDescription};
use crate::config::{vars, ConnectionString, ConnectionStringError, Settings, ENDPOINT_NOT_SHOWN};
use crate::domain::{CorrelationId, MessageId};
use crate::http::auth::Authenticator;
use crate::http::context::RequestContext;
use crate::http::errors::{Problem, MAX_FIELD_ERRORS};
use crate::http::send::{self, Input};

/// A fuzz target: the fuzzer's bytes in, a panic out when a promise is broken.
pub type Target = fn(&[u8]);

/// Every target by name: `fuzz/fuzz_targets/<name>.rs` calls the function, and
/// `fuzz/corpus/<name>/` and `fuzz/seeds/<name>/` hold the inputs the replay feeds it.
pub const TARGETS: &[(&str, Target)] = &[
    ("send_input", send_input),
    ("atom", atom),
    ("connection_string", connection_string),
    ("config", config),
    ("keys_file", keys_file),
];

/// The path every fuzzed send is addressed to; a `?query` line is appended to it.
const SEND_PATH: &str = "/v1/queues/requests/messages";

/// A pseudo-header naming the caller a send's Idempotency-Key is scoped to.
const CALLER: &str = "x-fuzz-caller";

/// A send as an HTTP/1 head, a blank line, then the body: `name: value` lines are
/// headers (invalid ones skipped, as a server would never see them), a `?...` line the
/// query string. Input without a blank line is all body.
pub fn send_input(data: &[u8]) {
    let (head, body) = split_once(data, b"\n\n").unwrap_or((&[], data));
    let (req, caller) = fuzzed_request(head);
    let Ok(context) = RequestContext::extract(&req).into_inner() else {
        panic!("the request context is built for every request");
    };
    std::hint::black_box(send::is_json(&req));

    match Input::parse(&req, body, 127, context.header_problem()) {
        Ok(input) => check_accepted(&req, body, &input, &caller),
        Err(problem) => check_refused(&context, problem),
    }
}

/// The request `head`'s lines describe, and the caller its Idempotency-Key is scoped to.
fn fuzzed_request(head: &[u8]) -> (actix_web::HttpRequest, String) {
    let mut request = TestRequest::post();
    let mut uri = SEND_PATH.to_owned();
    let mut caller = String::from("fuzz");
    for line in head.split(|b| *b == b'\n') {
        if let Some(query) = line.strip_prefix(b"?") {
            // Only a query the URI grammar takes: actix's test request panics on others.
            if let Ok(query) = std::str::from_utf8(query) {
                let candidate = format!("{SEND_PATH}?{query}");
                if Uri::try_from(candidate.as_str()).is_ok() {
                    uri = candidate;
                }
            }
            continue;
        }
        let Some((name, value)) = split_once(line, b":") else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim_ascii()),
            HeaderValue::from_bytes(value.trim_ascii()),
        ) else {
            continue;
        };
        if name == CALLER {
            caller = String::from_utf8_lossy(value.as_bytes()).into_owned();
            continue;
        }
        request = request.append_header((name, value));
    }
    (request.uri(&uri).to_http_request(), caller)
}

/// An accepted send: its body is text, and its ids are the headers sent, parsed back to
/// themselves (the key scoped to `caller` deterministically).
fn check_accepted(req: &actix_web::HttpRequest, body: &[u8], input: &Input, caller: &str) {
    assert!(
        std::str::from_utf8(body).is_ok(),
        "a body that is not UTF-8 was accepted"
    );
    let key = input.message_id.as_ref();
    assert_eq!(
        key.map(MessageId::as_str),
        header_text(req, "idempotency-key"),
        "the message id is not the Idempotency-Key sent"
    );
    if let Some(key) = key {
        assert_eq!(MessageId::parse(key.as_str()).as_ref(), Ok(key));
        let scoped = send::scoped_message_id(caller, key);
        assert_eq!(
            scoped,
            send::scoped_message_id(caller, key),
            "not deterministic"
        );
        assert_eq!(MessageId::parse(scoped.as_str()).as_ref(), Ok(&scoped));
    }
    let correlation = input.correlation_header.as_ref();
    assert_eq!(
        correlation.map(CorrelationId::as_str),
        header_text(req, "x-correlation-id"),
        "the correlation id is not the one sent"
    );
    if let Some(c) = correlation {
        assert_eq!(CorrelationId::parse(c.as_str()).as_ref(), Ok(c));
    }
}

/// A refused send: only as `invalid_request`, each problem placed in the body, a header
/// or the query, and the 400 read back as the client reads it, listing every problem.
fn check_refused(context: &RequestContext, problem: Problem) {
    let Problem::InvalidRequest { errors } = &problem else {
        panic!("input is refused only as invalid_request, not {problem:?}");
    };
    assert!((1..=MAX_FIELD_ERRORS).contains(&errors.len()), "{errors:?}");
    for e in errors {
        let place = e.loc.first().and_then(|l| l.as_str());
        assert!(
            matches!(place, Some("body" | "header" | "query")),
            "{:?}",
            e.loc
        );
    }
    let count = errors.len();
    let response = context.error(problem).error_response();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let Ok(bytes) = response.into_body().try_into_bytes() else {
        panic!("an error body is built in memory");
    };
    let body: ErrorBody<'_> = match serde_json::from_slice(&bytes) {
        Ok(body) => body,
        Err(e) => panic!("the 400 body does not read back: {e}"),
    };
    assert_eq!(body.code, ErrorCode::InvalidRequest);
    assert_eq!(body.errors.map(|e| e.len()), Some(count));
}

/// The header's value as text, when present and text (what the parsers were given).
fn header_text<'r>(req: &'r actix_web::HttpRequest, name: &str) -> Option<&'r str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// A body the management endpoint answered, read as a queue description and as an error.
pub fn atom(data: &[u8]) {
    match atom::parse_queue_description(data) {
        Ok(QueueDescription::Found(q)) => {
            assert!(q.backlog() >= q.active.max(q.scheduled));
        }
        Ok(QueueDescription::NotFound) => {}
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Some(detail) = atom::error_detail(data) {
        assert!(!detail.is_empty());
        assert!(
            detail.chars().count() <= atom::MAX_DETAIL_CHARS + 1,
            "{detail:?}"
        );
    }
    let text = String::from_utf8_lossy(data);
    let max = data.len() % 64;
    let short = atom::shorten(&text, max);
    assert!(short.chars().count() <= max + 1);
    let kept = short.strip_suffix('…').unwrap_or(&short);
    assert!(
        text.starts_with(kept),
        "{short:?} is not a prefix of the text"
    );
}

/// A SAS connection string, as `SERVICEBUS_CONNECTION_STRING` holds it.
pub fn connection_string(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    // The value as the parser reads it: `;`-separated, names in any case, trimmed.
    let part = |wanted: &str| {
        raw.split(';')
            .filter_map(|p| p.split_once('='))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case(wanted))
            .map(|(_, value)| value.trim())
    };
    let key = part("SharedAccessKey").unwrap_or_default();
    match ConnectionString::parse(raw) {
        Ok(parsed) => {
            assert!(!parsed.host.is_empty() && !parsed.key_name.is_empty());
            assert_eq!(parsed.host, parsed.host.to_ascii_lowercase());
            // Debug shows the host, the key name and the entity path, and no key.
            let shown = format!("{parsed:?}");
            let mut rest = shown.clone();
            for field in [
                format!("{:?}", parsed.host),
                format!("{:?}", parsed.key_name),
                format!("{:?}", parsed.entity_path),
            ] {
                rest = rest.replacen(&field, "", 1);
            }
            assert_eq!(
                rest, r#"ConnectionString { host: , key_name: , key: Secret(..), entity_path:  }"#,
                "Debug shows more than it should: {shown}"
            );
            // Written back in the canonical form, it parses to the same value.
            let mut canonical = format!(
                "Endpoint=sb://{}/;SharedAccessKeyName={};SharedAccessKey={key}",
                parsed.host, parsed.key_name
            );
            if let Some(entity) = &parsed.entity_path {
                canonical.push_str(&format!(";EntityPath={entity}"));
            }
            assert_eq!(
                ConnectionString::parse(&canonical).as_ref(),
                Ok(&parsed),
                "{canonical:?} does not parse back"
            );
        }
        Err(ConnectionStringError::BadEndpoint(shown)) => {
            // Exactly the Endpoint value, or the fixed text that shows nothing of it.
            let endpoint = part("Endpoint").unwrap_or_default();
            assert!(
                shown == endpoint || shown == ENDPOINT_NOT_SHOWN,
                "the error shows more than the endpoint: {shown:?}"
            );
        }
        // The other errors hold only static text.
        Err(_) => {}
    }
}

/// The configuration layers: `NAME=value` lines (the environment), then optionally a
/// `%%` line and the text of the file `SENDGATE_CONFIG` names.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (lines, file) = match text.split_once("\n%%\n") {
        Some((lines, file)) => (lines, Some(file)),
        None => (text, None),
    };
    let mut env: HashMap<String, String> = lines
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    let result = match file {
        Some(file) => {
            env.insert(vars::CONFIG.name.to_owned(), "fuzz.toml".to_owned());
            Settings::from_vars_and_file(&env, file)
        }
        None => Settings::from_vars(&env),
    };
    match result {
        Ok(settings) => {
            assert!(!settings.queues.is_empty());
            assert!(settings.body_timeout <= settings.send_timeout);
            assert!(settings.max_buffered_bytes >= settings.max_body_bytes);
        }
        Err(e) => {
            let message = e.to_string();
            assert!(!message.contains('\n'), "not one line: {message:?}");
            assert!(e.variable().is_some(), "names no variable: {message}");
            for secret in secrets(&env, file) {
                assert!(
                    !message.contains(&secret),
                    "the error shows the secret {secret:?}: {message}"
                );
            }
        }
    }
}

/// The values of secret variables (from the environment and the file) long enough to be
/// told apart, and found nowhere else in the input, so an error showing one leaked it.
fn secrets(env: &HashMap<String, String>, file: Option<&str>) -> Vec<String> {
    let mut public = String::new();
    let mut secret = Vec::new();
    for (name, value) in env {
        public.push_str(name);
        public.push('\n');
        match vars::find(name) {
            Some(v) if v.secret => secret.push(value.trim().to_owned()),
            _ => public.push_str(value),
        }
    }
    let table = file.and_then(|f| f.parse::<toml::Table>().ok());
    for (key, value) in table.iter().flatten() {
        public.push_str(key);
        public.push('\n');
        let is_secret = vars::VARIABLES
            .iter()
            .any(|v| v.secret && v.toml_key() == *key);
        match (is_secret, value) {
            (true, toml::Value::String(s)) => secret.push(s.trim().to_owned()),
            (true, _) => {}
            (false, other) => public.push_str(&other.to_string()),
        }
    }
    secret.retain(|s| s.len() >= 8 && !public.contains(s.as_str()));
    secret
}

/// The text of the API keys file.
pub fn keys_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Authenticator::from_toml(text) {
        Ok(auth) => {
            assert!(!auth.is_open(), "a keys file always means keys");
            // Debug lists names only; requests are checked against every key.
            std::hint::black_box(format!("{auth:?}"));
            let req = TestRequest::default()
                .insert_header(("authorization", "Bearer fuzz"))
                .to_http_request();
            // Keys never wait (only an Entra ID token may): ready at once.
            let answer = futures_util::FutureExt::now_or_never(auth.authenticate(&req));
            std::hint::black_box(answer.and_then(Result::ok));
        }
        Err(message) => assert!(!message.is_empty()),
    }
}

fn split_once<'a>(data: &'a [u8], separator: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    data.windows(separator.len())
        .position(|w| w == separator)
        .map(|at| (&data[..at], &data[at + separator.len()..]))
}

/// The replay: every committed corpus input through its target, in the normal suite.
#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::panic::catch_unwind;
    use std::path::{Path, PathBuf};

    use super::TARGETS;

    fn fuzz_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
    }

    fn files_in(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        files
    }

    #[test]
    fn every_corpus_input_replays_through_its_target_without_a_panic() {
        let mut failed = Vec::new();
        for (name, target) in TARGETS {
            // corpus/: what the fuzzer found, minimised; seeds/: written by hand, and the
            // inputs of every crash found (named for what they caught).
            let mut files = Vec::new();
            for dir in ["corpus", "seeds"] {
                let found = files_in(&fuzz_dir().join(dir).join(name));
                assert!(!found.is_empty(), "fuzz/{dir}/{name} holds no input");
                files.extend(found);
            }
            for file in files {
                let data = std::fs::read(&file).unwrap();
                if catch_unwind(|| target(&data)).is_err() {
                    failed.push(file.display().to_string());
                }
            }
        }
        assert!(failed.is_empty(), "inputs that panicked: {failed:#?}");
    }

    #[test]
    fn every_target_has_its_fuzz_target_file_and_every_file_a_target() {
        let files: BTreeSet<String> = files_in(&fuzz_dir().join("fuzz_targets"))
            .iter()
            .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
            .collect();
        let names: BTreeSet<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(files, names);
        let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
        for name in &names {
            let target = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
            let source = std::fs::read_to_string(&target).unwrap();
            assert!(
                source.contains(&format!("sendgate::fuzzing::{name}(")),
                "{} does not call sendgate::fuzzing::{name}",
                target.display()
            );
            assert!(
                manifest.contains(&format!("name = \"{name}\"")),
                "fuzz/Cargo.toml has no [[bin]] {name}"
            );
        }
    }

    /// Every version of each crate a lock file holds, by name.
    fn locked_versions(lock: &Path) -> std::collections::BTreeMap<String, BTreeSet<String>> {
        let text = std::fs::read_to_string(lock).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let mut versions = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
        for package in table["package"].as_array().unwrap() {
            versions
                .entry(package["name"].as_str().unwrap().to_owned())
                .or_default()
                .insert(package["version"].as_str().unwrap().to_owned());
        }
        versions
    }

    #[test]
    fn the_fuzz_lock_file_pins_the_versions_the_server_is_built_with() {
        // fuzz/ is its own workspace with its own Cargo.lock: a crate at another version
        // there than in the root lock means the fuzzer exercises code the shipped binary
        // does not run, and a stale lock is rewritten (from crates.io) by the next
        // scripts/fuzz.sh. Regenerate: cp Cargo.lock fuzz/Cargo.lock, then
        // `cargo metadata --offline --format-version 1 --manifest-path fuzz/Cargo.toml`.
        let root = locked_versions(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"));
        let fuzz = locked_versions(&fuzz_dir().join("Cargo.lock"));
        let differing: Vec<String> = fuzz
            .iter()
            .filter(|(name, _)| name.as_str() != "sendgate-fuzz")
            .filter_map(|(name, versions)| match root.get(name) {
                // Every version the fuzzer builds is one the root lock holds (the root may
                // hold more: a test-only dependency's older copy, never in the binary).
                Some(shipped) if versions.is_subset(shipped) => None,
                Some(shipped) => Some(format!("{name}: fuzz {versions:?}, root {shipped:?}")),
                None if FUZZ_ONLY.contains(&name.as_str()) => None,
                None => Some(format!("{name}: fuzz {versions:?}, not in the root lock")),
            })
            .collect();
        assert!(
            differing.is_empty(),
            "fuzz/Cargo.lock differs from Cargo.lock:\n{}",
            differing.join("\n")
        );
    }

    /// What only the fuzz workspace needs: libFuzzer's bindings and their build.
    const FUZZ_ONLY: &[&str] = &["arbitrary", "jobserver", "libfuzzer-sys"];

    /// Each crates.io package's dependencies by name (`"regex 1.13.2"` → `regex`), by
    /// name and version: a feature switched on in one workspace only adds an edge.
    fn locked_edges(lock: &Path) -> std::collections::BTreeMap<(String, String), BTreeSet<String>> {
        let text = std::fs::read_to_string(lock).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let mut edges = std::collections::BTreeMap::new();
        for package in table["package"].as_array().unwrap() {
            // Workspace members (no source) differ by their dev-dependencies.
            if package.get("source").is_none() {
                continue;
            }
            let name = package["name"].as_str().unwrap().to_owned();
            let version = package["version"].as_str().unwrap().to_owned();
            let deps = package
                .get("dependencies")
                .and_then(|d| d.as_array())
                .into_iter()
                .flatten()
                .filter_map(|d| d.as_str()?.split(' ').next())
                .filter(|d| !FUZZ_ONLY.contains(d))
                .map(str::to_owned)
                .collect();
            edges.insert((name, version), deps);
        }
        edges
    }

    /// The fuzz lock has every dependency edge the server's has, not only the same
    /// versions: a lock that kept actix-router and actix-web without the `regex` edge the
    /// root's `unicode` feature adds passes the version check above.
    #[test]
    fn the_fuzz_lock_file_has_the_dependencies_the_server_is_built_with() {
        let root = locked_edges(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"));
        let fuzz = locked_edges(&fuzz_dir().join("Cargo.lock"));
        // Edges only the tests' OTLP/gRPC collector adds to the root lock (tonic's server
        // and the collector services' generated code, dev-dependencies): no build of the
        // server, shipped or fuzzed, has them.
        const TEST_ONLY: [(&str, &str); 4] = [
            ("hyper", "httpdate"),
            ("opentelemetry-proto", "tonic"),
            ("opentelemetry-proto", "tonic-prost"),
            ("tonic", "socket2"),
        ];
        let differing: Vec<String> = fuzz
            .iter()
            // `cc` builds libFuzzer with its jobserver (and so libc) in the fuzz workspace.
            .filter(|((name, _), _)| name.as_str() != "cc")
            .filter_map(|(package, deps)| {
                let shipped: BTreeSet<&String> = root
                    .get(package)?
                    .iter()
                    .filter(|dep| !TEST_ONLY.contains(&(package.0.as_str(), dep.as_str())))
                    .collect();
                let fuzzed: BTreeSet<&String> = deps.iter().collect();
                (fuzzed != shipped).then(|| format!("{package:?}: fuzz {deps:?}, root {shipped:?}"))
            })
            .collect();
        assert!(
            differing.is_empty(),
            "fuzz/Cargo.lock's dependency edges differ from Cargo.lock's (regenerate as above):\n{}",
            differing.join("\n")
        );
    }
}
