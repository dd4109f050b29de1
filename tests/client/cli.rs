//! `sendgate send`, the real binary, against the real gateway behind the counting proxy.

use std::collections::BTreeSet;
use std::process::{Output, Stdio};
use std::time::Duration;

use sendgate_client::MessageAttributes;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::proxy::Proxy;
use sendgate_testkit::embedded::spawn_app_with;
use sendgate_testkit::gateway::binary;
use sendgate_testkit::keys::{Key, KeysFile};

/// Run `sendgate send ARGS` with a clean environment plus `env`, feeding `stdin`.
async fn sendgate_send(args_in: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    // Names are not checked: usage errors are tested with wrong ones on purpose.
    let env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut args = vec!["send"];
    args.extend_from_slice(args_in);
    let mut cmd = tokio::process::Command::from(binary(&args, &env));
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        // A run that stops early (a usage error) may close its stdin unread.
        let _ = pipe.write_all(text.as_bytes()).await;
        drop(pipe);
    }
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("sendgate send ends on its own")
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn lines(n: usize) -> String {
    (0..n).map(|i| format!("{{\"n\":{i}}}\n")).collect()
}

/// `--batch-size 1`: each line alone on the single-send route, as before batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_json_lines_is_queued_and_exits_0() {
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("messages.jsonl");
    // 25 messages; blank lines and a CRLF ending are not messages.
    std::fs::write(
        &file,
        format!("\n{}  \r\n\n{{\"last\":true}}\r\n", lines(24)),
    )
    .unwrap();

    let out = sendgate_send(
        &[
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "--concurrency",
            "4",
            "--batch-size",
            "1",
            file.to_str().unwrap(),
        ],
        &[],
        None,
    )
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("summary: 25 messages: 25 queued, 0 refused, 0 failed"),
        "{err}"
    );
    assert_eq!(app.stored("requests"), 25);
    assert_eq!(proxy.posts().len(), 25);
    assert!(proxy.batches().is_empty(), "the single-send route only");
    assert_eq!(proxy.probes(), 1);
    let bodies: Vec<String> = app
        .receive_all("requests")
        .iter()
        .map(|m| String::from_utf8(m.body.clone()).unwrap())
        .collect();
    assert!(
        bodies.contains(&r#"{"last":true}"#.to_owned()),
        "{bodies:?}"
    );
}

/// `--retry-budget 0`: a full queue's refusals are not retried (no retry is exempt, the
/// gateway's pacing included), and each such line says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_retry_budget_fails_a_full_queues_refusals_at_once() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "3"),
        // A read before every send: with a cached read, one made in the background at the
        // ceiling may show a send still counted in flight, and count it twice (contract
        // section 2), refusing the third.
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    let proxy = Proxy::start(&app.address).await;
    let out = sendgate_send(
        &[
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "--concurrency",
            "1",
            "--batch-size",
            "1",
            "--deadline",
            "600",
            "--retry-budget",
            "0",
            "-",
        ],
        &[],
        Some(&lines(6)),
    )
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("summary: 6 messages: 3 queued, 0 refused, 3 failed"),
        "{err}"
    );
    assert_eq!(
        err.matches(
            "failed after 1 attempt(s) (not retried: retry budget exhausted): 429 queue_full"
        )
        .count(),
        3,
        "{err}"
    );
    assert!(
        err.contains("requests 6, retries 0, retries refused by the budget 3"),
        "{err}"
    );
    assert_eq!(proxy.posts().len(), 6, "one request per line");
    assert_eq!(app.stored("requests"), 3);
}

/// Issue 41: with stderr not a terminal (no bar), a message waiting at a full queue is
/// said every few seconds, not only when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_at_a_full_queue_is_said_every_few_seconds() {
    let app = spawn_app_with(&[
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1"),
        ("SENDGATE_DEPTH_TTL_MS", "3000"),
    ])
    .await;
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    let started = std::time::Instant::now();
    let out = sendgate_send(
        &[
            "--url",
            &app.address,
            "--queue",
            "requests",
            "--deadline",
            "12",
            "--max-attempts",
            "20",
            "-",
        ],
        &[],
        Some(&lines(1)),
    )
    .await;
    let took = started.elapsed();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let waiting: Vec<&str> = err.lines().filter(|l| l.starts_with("waiting: ")).collect();
    assert!(
        !waiting.is_empty() && waiting.len() <= 3,
        "a line every 5 s of {took:?}: {err}"
    );
    assert!(
        waiting[0].starts_with("waiting: 1 of 1 message not answered yet after ")
            && waiting[0].contains(" requests, "),
        "{err}"
    );
    let summary = err.find("summary:").expect("a summary");
    assert!(err.find("waiting: ").unwrap() < summary, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_line_is_refused_locally_and_exits_1() {
    // Alone, three requests; in a batch, one request of three entries.
    for (batch_size, requests) in [("1", 3), ("100", 1)] {
        let app = spawn_app_with(&[]).await;
        let proxy = Proxy::start(&app.address).await;
        let input = "{\"a\":1}\n{broken\n2\n\"three\"\n";

        let out = sendgate_send(
            &[
                "--url",
                &proxy.address,
                "--queue",
                "requests",
                "--batch-size",
                batch_size,
                "-",
            ],
            &[],
            Some(input),
        )
        .await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("summary: 4 messages: 3 queued, 1 refused, 0 failed"),
            "{err}"
        );
        assert!(err.contains("refused invalid_json (local): 1"), "{err}");
        assert!(err.contains("line 2: refused locally"), "{err}");
        let posts = proxy.posts();
        assert_eq!(posts.len(), requests, "the invalid line is never sent");
        if batch_size != "1" {
            assert_eq!(
                proxy.batches().iter().map(Vec::len).collect::<Vec<_>>(),
                [3]
            );
        }
        assert_eq!(app.stored("requests"), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_250_lines_goes_in_three_batch_requests_and_each_is_stored_once() {
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("messages.jsonl");
    std::fs::write(&file, lines(250)).unwrap();

    let out = sendgate_send(
        &[
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "--batch-size",
            "100",
            // One request at a time: the file's order is then the queue's (with more in
            // flight, two batches may reach the gateway in either order).
            "--concurrency",
            "1",
            file.to_str().unwrap(),
        ],
        &[],
        None,
    )
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("summary: 250 messages: 250 queued, 0 refused, 0 failed"),
        "{err}"
    );
    assert!(err.contains("requests 3, retries 0"), "{err}");
    // Counted on the wire: three POSTs, all to the batch route, of 100, 100 and 50.
    let posts = proxy.posts();
    assert_eq!(posts.len(), 3, "{posts:?}");
    assert!(posts
        .iter()
        .all(|p| p.path == "/v1/queues/requests/messages/batch" && p.status == 201));
    let batches = proxy.batches();
    assert_eq!(
        batches.iter().map(Vec::len).collect::<Vec<_>>(),
        [100, 100, 50]
    );
    // Every entry carried a key made by the client, and each key is stored once.
    let keys: BTreeSet<String> = batches.concat().into_iter().map(Option::unwrap).collect();
    assert_eq!(keys.len(), 250);
    let stored = app.receive_all("requests");
    assert_eq!(stored.len(), 250);
    let ids: BTreeSet<String> = stored.iter().map(|m| m.message_id.clone()).collect();
    assert_eq!(ids, keys);
    // In the file's order, each body once.
    let bodies: Vec<String> = stored
        .iter()
        .map(|m| String::from_utf8(m.body.clone()).unwrap())
        .collect();
    assert_eq!(bodies, lines(250).lines().collect::<Vec<_>>());
    // One line per message, as before batches.
    assert_eq!(err.matches(": queued as ").count(), 250, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelope_lines_arrive_with_their_attributes_alone_or_in_a_batch() {
    for batch_size in ["1", "100"] {
        let app = spawn_app_with(&[]).await;
        let proxy = Proxy::start(&app.address).await;
        let input = [
            r#"{"body": {"order": 1}, "idempotency_key": "o-1", "correlation_id": "c-1", "subject": "order", "session_id": "s-1", "time_to_live_s": 600, "reply_to": "replies", "to": "billing", "properties": {"tier": "gold", "n": 3, "rush": true}}"#,
            r#"{"body": [1, 2], "partition_key": "p-7", "properties": {"café": "crème"}}"#,
            r#"{"body": "plain"}"#,
            r#"{"body": 4, "subjct": "typo"}"#,
            r#"{"body": 5, "idempotency_key": "o-5", "subject": ""}"#,
        ]
        .join("
");
        let out = sendgate_send(
            &[
                "--url",
                &proxy.address,
                "--queue",
                "requests",
                "--envelope",
                "--batch-size",
                batch_size,
                // One request at a time: the stored order below is the input's.
                "--concurrency",
                "1",
                "-",
            ],
            &[],
            Some(&input),
        )
        .await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{batch_size}: {err}");
        assert!(
            err.contains("summary: 5 messages: 3 queued, 2 refused, 0 failed"),
            "{batch_size}: {err}"
        );
        assert!(err.contains("refused invalid_envelope (local): 1"), "{err}");
        assert!(err.contains("line 4: refused locally"), "{err}");
        assert!(err.contains("\"subjct\""), "{err}");
        // The gateway refuses the empty subject: that line only, the others are stored.
        assert!(
            err.contains("line 5: refused: 400 invalid_request"),
            "{err}"
        );

        let stored = app.receive_all("requests");
        assert_eq!(stored.len(), 3, "{batch_size}");
        let first = &stored[0];
        assert_eq!(first.message_id, "o-1");
        assert_eq!(first.correlation_id.as_deref(), Some("c-1"));
        assert_eq!(first.body, br#"{"order": 1}"#, "the body's text as written");
        let mut expected = MessageAttributes {
            subject: Some("order".into()),
            session_id: Some("s-1".into()),
            time_to_live_s: Some(600),
            reply_to: Some("replies".into()),
            to: Some("billing".into()),
            ..MessageAttributes::default()
        };
        expected.properties.insert("tier".into(), json!("gold"));
        expected.properties.insert("n".into(), json!(3));
        expected.properties.insert("rush".into(), json!(true));
        assert_eq!(first.attributes, expected, "{batch_size}");
        assert!(first.trace_properties.contains_key("traceparent"));

        let second = &stored[1];
        assert_eq!(second.body, b"[1, 2]");
        assert_eq!(second.attributes.partition_key.as_deref(), Some("p-7"));
        assert_eq!(second.attributes.properties["café"], json!("crème"));
        assert!(
            uuid::Uuid::parse_str(&second.message_id).is_ok(),
            "a key made by the client: {}",
            second.message_id
        );
        assert_eq!(stored[2].attributes, MessageAttributes::default());

        let posts = proxy.posts();
        if batch_size == "1" {
            assert!(proxy.batches().is_empty());
            assert_eq!(posts.len(), 4, "lines 1, 2, 3 and 5, each alone");
        } else {
            // One batch; the gateway named entry 3 (line 5), the other three went again.
            let batches = proxy.batches();
            assert_eq!(batches.len(), 2, "{batches:?}");
            assert_eq!(batches[0].len(), 4);
            assert_eq!(batches[1], batches[0][..3].to_vec());
            assert_eq!(posts[0].status, 400);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_stops_at_once_with_exit_2_after_one_send() {
    for batch_size in ["1", "100"] {
        a_refused_token_costs_one_request(batch_size).await;
    }
}

async fn a_refused_token_costs_one_request(batch_size: &str) {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("app", &["sender", "observer"]).token("right-token"))
        .write_in(dir.path());
    let app = spawn_app_with(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let proxy = Proxy::start(&app.address).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "wrong-token\n").unwrap();

    let out = sendgate_send(
        &[
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "--token-file",
            token.to_str().unwrap(),
            "--concurrency",
            "8",
            "--batch-size",
            batch_size,
            "-",
        ],
        &[],
        // More than one batch: the first request alone is all the run costs.
        Some(&lines(250)),
    )
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("401 unauthenticated"), "{err}");
    assert!(err.contains("stopped"), "{err}");
    // The probe's 401 only reads as "not draining" (contract §7); the one send's own 401
    // is what stops the run, never retried.
    assert_eq!(proxy.probes(), 1);
    let posts = proxy.posts();
    assert_eq!(posts.len(), 1, "exactly one send: {posts:?}");
    assert_eq!(posts[0].status, 401);
    assert!(
        proxy
            .seen()
            .iter()
            .all(|s| s.authorization && s.status == 401),
        "the token was sent and refused"
    );
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_send_stops_at_once_with_exit_2_after_one_send() {
    // The key may read the health and send, but only to another queue: the probe passes
    // and the first send is refused with 403.
    let dir = tempfile::tempdir().unwrap();
    let scoped = Key::new("app", &["sender", "observer"])
        .token("scoped-token")
        .queues(&["other"]);
    let keys = KeysFile::new().key(scoped).write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
        ("SENDGATE_QUEUES", "requests,other"),
    ])
    .await;
    let proxy = Proxy::start(&app.address).await;

    let out = sendgate_send(
        &["--url", &proxy.address, "--queue", "requests"],
        &[("SENDGATE_TOKEN", "scoped-token")],
        Some(&lines(20)),
    )
    .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("403 forbidden"), "{err}");
    let posts = proxy.posts();
    assert_eq!(posts.len(), 1, "exactly one send: {posts:?}");
    assert_eq!(posts[0].status, 403);
    assert_eq!(proxy.probes(), 1);
    assert_eq!(app.stored("requests"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_outcome_is_printed_as_it_comes_while_the_input_stays_open() {
    use tokio::io::AsyncBufReadExt;

    let app = spawn_app_with(&[]).await;
    let mut args = vec!["send"];
    args.extend_from_slice(&["--url", &app.address, "--queue", "requests", "-"]);
    let mut child = tokio::process::Command::from(binary(&args, &Default::default()))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    let mut err = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    // Three lines with room for eight in flight: before, the outcomes of lines 2 and 3
    // waited until a slot was needed or the input ended.
    pipe.write_all(lines(3).as_bytes()).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        let mut queued = 0;
        while let Some(l) = err.next_line().await.unwrap() {
            if l.contains(": queued as ") {
                queued += 1;
                if queued == 3 {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(
        seen,
        Ok(true),
        "three outcomes printed with stdin still open"
    );
    drop(pipe);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(app.stored("requests"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2_before_any_request() {
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    for args in [
        vec!["--url", "not a url", "--queue", "requests"],
        vec!["--url", &proxy.address, "--queue", "no/such"],
        vec![
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "/no/such/file",
        ],
        vec![
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "--token-file",
            empty.to_str().unwrap(),
        ],
        vec![
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "--concurrency",
            "0",
        ],
        vec![
            "--url",
            &proxy.address,
            "--queue",
            "requests",
            "--batch-size",
            "0",
        ],
    ] {
        let out = sendgate_send(&args, &[], Some(&lines(1))).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(proxy.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entra_scope_is_checked_before_any_request_and_takes_no_second_credential() {
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "a-token\n").unwrap();
    let base = ["--url", proxy.address.as_str(), "--queue", "requests"];
    fn with<'a>(base: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
        base.iter().chain(more).copied().collect()
    }
    // (arguments, environment, what the error says)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            with(&base, &["--entra-scope", "api://sendgate"]),
            vec![],
            "did you mean \"api://sendgate/.default\"",
        ),
        (
            with(&base, &["--entra-scope", "/.default"]),
            vec![],
            "expected api://<app id>/.default",
        ),
        (
            with(
                &base,
                &[
                    "--entra-scope",
                    "api://sendgate/.default",
                    "--token-file",
                    token.to_str().unwrap(),
                ],
            ),
            vec![],
            "cannot be used with",
        ),
        (
            with(&base, &["--entra-scope", "api://sendgate/.default"]),
            vec![("SENDGATE_TOKEN", "a-token")],
            "both set",
        ),
        (
            with(
                &base,
                &["--entra-client-id", "00000000-0000-0000-0000-000000000001"],
            ),
            vec![],
            "--entra-scope",
        ),
    ];
    for (args, env, says) in cases {
        let out = sendgate_send(&args, &env, Some(&lines(1))).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(proxy.seen().is_empty());
}
