//! `sendgate send`, the real binary, against the real gateway behind the counting proxy.

use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::gateway::binary;
use crate::helpers::spawn_app_with;
use crate::keys_file;
use crate::proxy::Proxy;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_line_is_refused_locally_and_exits_1() {
    let app = spawn_app_with(&[]).await;
    let proxy = Proxy::start(&app.address).await;
    let input = "{\"a\":1}\n{broken\n2\n\"three\"\n";

    let out = sendgate_send(
        &["--url", &proxy.address, "--queue", "requests", "-"],
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
    assert_eq!(proxy.posts().len(), 3, "the invalid line is never sent");
    assert_eq!(app.stored("requests"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_stops_at_once_with_exit_2_after_one_send() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys_file(
        dir.path(),
        &[("app", "right-token", "sender,observer", "*")],
    );
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
            "-",
        ],
        &[],
        Some(&lines(20)),
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
    let keys = keys_file(
        dir.path(),
        &[("app", "scoped-token", "sender,observer", "other")],
    );
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
    ] {
        let out = sendgate_send(&args, &[], Some(&lines(1))).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(proxy.seen().is_empty());
}
