//! The real binary: start-up refusals, exit codes, and the `queue` and `keys` commands.

use std::process::Output;

use sendgate_testkit::embedded::spawn_in;
use sendgate_testkit::gateway::{binary, run_binary, stderr};

fn sendgate(args: &[&str], env: &[(&str, &str)]) -> Output {
    run_binary(args, env)
}

#[test]
fn a_non_loopback_listen_without_keys_refuses_to_start() {
    let out = sendgate(&["serve"], &[("SENDGATE_LISTEN", "0.0.0.0:0")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("non-loopback") && err.contains("SENDGATE_AUTH=none"),
        "{err}"
    );
}

#[test]
fn a_bad_value_stops_start_up_with_one_line_naming_the_variable() {
    for (var, value) in [
        ("SENDGATE_DEPTH_TTL_MS", "soon"),
        ("SENDGATE_BACKEND", "kafka"),
        ("SENDGATE_SEND_TIMEOUT_MS", "-1"),
        ("SENDGATE_LISTEN", "everywhere"),
    ] {
        let out = sendgate(&[], &[(var, value)]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{var}={value}: {}",
            stderr(&out)
        );
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(var), "{err}");
    }
}

/// Set but empty, the allowed applications would read as unset, "every application of the
/// tenant": the binary refuses to start instead (contract section 4).
#[test]
fn an_empty_list_of_allowed_entra_applications_stops_start_up() {
    let out = sendgate(
        &["serve"],
        &[
            (
                "SENDGATE_ENTRA_TENANT_ID",
                "11111111-2222-3333-4444-555555555555",
            ),
            ("SENDGATE_ENTRA_AUDIENCE", "api://sendgate"),
            ("SENDGATE_ENTRA_ALLOWED_APPS", ""),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("SENDGATE_ENTRA_ALLOWED_APPS") && err.contains("names no application"),
        "{err}"
    );
}

#[test]
fn the_forgiving_capacity_variables_never_stop_start_up() {
    // With garbage in the three SERVICEBUS_SEND_* variables the server still starts; a bad
    // SENDGATE_ variable next to them is what stops it, proving the others parsed.
    let out = sendgate(
        &[],
        &[
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "lots"),
            ("SERVICEBUS_SEND_FAILCLOSED", "perhaps"),
            ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "abc"),
            ("SENDGATE_MAX_BODY_BYTES", "big"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("SENDGATE_MAX_BODY_BYTES"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bad_keys_file_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    std::fs::write(
        &path,
        "[[keys]]\nname = \"x\"\nsha256 = \"short\"\nroles = [\"sender\"]\nqueues = [\"*\"]\n",
    )
    .unwrap();
    let out = sendgate(
        &[],
        &[
            ("SENDGATE_API_KEYS_FILE", path.to_str().unwrap()),
            ("SENDGATE_LISTEN", "127.0.0.1:0"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("SENDGATE_API_KEYS_FILE"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn queue_receive_and_depth_work_beside_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let app = spawn_in(dir.path(), &[]).await;
    for body in [r#"{"a":1}"#, "[\n  2\n]", r#""three""#] {
        assert_eq!(
            app.send_with("requests", body, &[("X-Correlation-Id", "c-1")])
                .await
                .status(),
            201
        );
    }
    let env = [("SENDGATE_DATA_DIR", data.as_str())];
    let depth = sendgate(&["queue", "depth", "--queue", "requests"], &env);
    assert_eq!(String::from_utf8_lossy(&depth.stdout).trim(), "3");

    let out = sendgate(
        &["queue", "receive", "--queue", "requests", "--max", "2"],
        &env,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["body"], serde_json::json!({"a": 1}));
    assert_eq!(lines[1]["body"], serde_json::json!([2]));
    assert_eq!(lines[0]["correlation_id"], "c-1");
    assert_eq!(lines[0]["queue"], "requests");
    assert!(lines[0]["message_id"].is_string() && lines[0]["enqueued_at"].is_string());

    // The server sees the consumer's work on its next read.
    assert_eq!(app.stored("requests"), 1);
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[tokio::test]
async fn peek_lock_leases_hides_and_completes_by_lock_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let app = spawn_in(dir.path(), &[]).await;
    for i in 0..3 {
        assert_eq!(app.send("requests", &i.to_string()).await.status(), 201);
    }
    let env = [("SENDGATE_DATA_DIR", data.as_str())];
    let receive = |max: &str| {
        let args = [
            "queue", "receive", "--queue", "requests", "--max", max, "--lock-s", "60",
        ];
        let out = sendgate(&args, &env);
        assert!(out.status.success(), "{}", stderr(&out));
        json_lines(&out)
    };
    let first = receive("2");
    assert_eq!(first.len(), 2);
    assert_eq!(first[0]["body"], 0);
    assert_eq!(first[0]["delivery_count"], 1);
    assert!(first[0]["lock_token"].is_string() && first[0]["locked_until"].is_string());
    let second = receive("10");
    assert_eq!(second.len(), 1, "leased messages go to nobody else");
    assert_eq!(second[0]["body"], 2);
    assert_eq!(app.stored("requests"), 3, "leased, not deleted");

    let token = first[0]["lock_token"].as_str().unwrap();
    let complete = |queue: &str| {
        sendgate(
            &["queue", "complete", "--queue", queue, "--lock-token", token],
            &env,
        )
    };
    let elsewhere = complete("other");
    assert_eq!(
        elsewhere.status.code(),
        Some(1),
        "a token completes only in the queue it was leased from"
    );
    assert_eq!(app.stored("requests"), 3);
    let done = complete("requests");
    assert!(done.status.success(), "{}", stderr(&done));
    assert_eq!(app.stored("requests"), 2);
    let again = complete("requests");
    assert_eq!(
        again.status.code(),
        Some(1),
        "a lock completed twice is lost"
    );
    assert!(stderr(&again).contains("lock lost"), "{}", stderr(&again));

    let too_long = sendgate(
        &["queue", "receive", "--queue", "requests", "--lock-s", "301"],
        &env,
    );
    assert_eq!(too_long.status.code(), Some(2), "{}", stderr(&too_long));
}

/// Issue 41: stdout carries the token alone; the entry (only its hash) goes to the keys
/// file, with the tenant and weight asked; a name already in the file is refused.
#[tokio::test]
async fn keys_new_prints_only_the_token_and_appends_an_entry_holding_only_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let file = keys.to_str().unwrap();
    let new = |args: &[&str]| {
        let mut all = vec!["keys", "new", "--keys-file", file];
        all.extend_from_slice(args);
        sendgate(&all, &[])
    };
    let out = new(&[
        "--name", "batch", "--role", "sender", "--queue", "requests", "--tenant", "jobs",
        "--weight", "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "the token alone: {stdout:?}");
    let token = stdout.trim_end().to_owned();
    assert!(token.starts_with("sg_") && !token.contains(' '), "{token}");
    assert_eq!(stdout, format!("{token}\n"));
    assert!(stderr(&out).contains(file), "says where: {}", stderr(&out));
    assert!(!stderr(&out).contains(&token), "{}", stderr(&out));

    // A second key of the tenant, another weight: the gateway would refuse that file.
    let other_weight = new(&[
        "--name", "batch-2", "--role", "sender", "--tenant", "jobs", "--weight", "2",
    ]);
    assert_eq!(
        other_weight.status.code(),
        Some(2),
        "{}",
        stderr(&other_weight)
    );
    assert!(other_weight.stdout.is_empty());
    let again = new(&["--name", "batch", "--role", "observer"]);
    assert_eq!(
        again.status.code(),
        Some(2),
        "a name twice: {}",
        stderr(&again)
    );
    assert!(stderr(&again).contains("\"batch\""), "{}", stderr(&again));
    assert!(again.stdout.is_empty(), "no token for a key not made");
    let observer = new(&["--name", "ops", "--role", "observer"]);
    assert!(observer.status.success(), "{}", stderr(&observer));

    let entries = std::fs::read_to_string(&keys).unwrap();
    assert!(
        !entries.contains(&token),
        "the keys file never holds the token"
    );
    assert_eq!(entries.matches("[[keys]]").count(), 2, "{entries}");
    assert!(
        entries.contains("tenant = \"jobs\"") && entries.contains("weight = 3"),
        "{entries}"
    );
    let app = sendgate_testkit::embedded::spawn_app_with(&[("SENDGATE_API_KEYS_FILE", file)]).await;
    let auth = format!("Bearer {token}");
    assert_eq!(
        app.send_with("requests", "{}", &[("Authorization", auth.as_str())])
            .await
            .status(),
        201
    );
    assert_eq!(app.send("requests", "{}").await.status(), 401);
    let detailed = app
        .client
        .get(app.url("/health/detailed"))
        .header("Authorization", auth.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(detailed.status(), 403, "a sender key, not an observer");

    let bad = new(&["--name", "x", "--role", "root"]);
    assert_eq!(bad.status.code(), Some(2));
    let unweighable = new(&["--name", "y", "--role", "sender", "--weight", "0"]);
    assert_eq!(unweighable.status.code(), Some(2));
}

/// Issue 41's review: `keys new` run many times at once on one keys file (a script making
/// a team's keys in parallel) loses no entry, and of two at once under one name exactly one
/// makes the key: each read-modify-write of the file holds it alone.
#[test]
fn concurrent_keys_new_lose_no_entry_and_make_a_name_once() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let file = keys.to_str().unwrap();
    let spawn = |name: &str| {
        binary(
            &[
                "keys",
                "new",
                "--keys-file",
                file,
                "--name",
                name,
                "--role",
                "sender",
            ],
            &Default::default(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    const MANY: usize = 24;
    let names: Vec<String> = (0..MANY).map(|i| format!("key-{i}")).collect();
    let mut children: Vec<_> = names.iter().map(|n| spawn(n)).collect();
    // The same name twice more, at once with the others.
    children.push(spawn("twice"));
    children.push(spawn("twice"));
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for out in &outputs[..MANY] {
        assert!(out.status.success(), "{}", stderr(out));
    }
    let twice: Vec<_> = outputs[MANY..].iter().map(|o| o.status.code()).collect();
    assert!(
        twice.contains(&Some(0)) && twice.contains(&Some(2)),
        "one made, one refused: {twice:?}"
    );
    let entries = std::fs::read_to_string(&keys).unwrap();
    for name in names.iter().map(String::as_str).chain(["twice"]) {
        assert_eq!(
            entries.matches(&format!("name = \"{name}\"\n")).count(),
            1,
            "{name}: {entries}"
        );
    }
    assert_eq!(entries.matches("[[keys]]").count(), MANY + 1, "{entries}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["keys.toml"], "no temporary file left behind");
}

/// Issue 41's review: a closed stdout (`sendgate keys new ... | head -0`) is an error said
/// on stderr with a plain exit, never a panic.
#[test]
fn keys_new_into_a_closed_pipe_exits_without_a_panic() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    // The reading end closed before the command starts: a real broken pipe, whenever the
    // token is written.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = binary(
        &[
            "keys",
            "new",
            "--keys-file",
            keys.to_str().unwrap(),
            "--name",
            "piped",
            "--role",
            "sender",
        ],
        &Default::default(),
    )
    .stdout(writer)
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = stderr(&out);
    assert!(!said.contains("panicked"), "{said}");
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("stdout"), "says what failed: {said}");
}

/// Issue 41: `queue depth` says where it looks, and a directory holding no store is
/// refused, not read as an empty queue (nor made), unless `--create` asks for one.
#[test]
fn queue_depth_refuses_a_missing_store_and_says_where_it_looked() {
    let cwd = tempfile::tempdir().unwrap();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut all = vec!["queue", "depth", "--queue", "requests"];
        all.extend_from_slice(args);
        sendgate_testkit::gateway::binary(&all, &env)
            .current_dir(cwd.path())
            .output()
            .unwrap()
    };
    let out = run(&[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "no depth printed");
    let err = stderr(&out);
    assert!(
        err.contains("./sendgate-data")
            && err.contains("SENDGATE_DATA_DIR")
            && err.contains("--create"),
        "{err}"
    );
    assert!(!cwd.path().join("sendgate-data").exists(), "nothing made");

    let elsewhere = cwd.path().join("elsewhere");
    let shown = elsewhere.to_str().unwrap();
    let out = run(&[], &[("SENDGATE_DATA_DIR", shown)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(shown), "{}", stderr(&out));
    let out = run(&["--data-dir", shown], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    let out = run(&["--create"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n");
    assert!(
        stderr(&out).contains("./sendgate-data"),
        "the default said: {}",
        stderr(&out)
    );
    let out = run(&[], &[]);
    assert!(out.status.success(), "now there is one: {}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n");
}

#[test]
fn a_misspelled_variable_stops_start_up_and_names_the_one_meant() {
    let out = sendgate(&[], &[("SENDGATE_DEPHT_TTL_MS", "5")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("SENDGATE_DEPHT_TTL_MS"), "{err}");
    assert!(err.contains("did you mean SENDGATE_DEPTH_TTL_MS?"), "{err}");
}

#[test]
fn a_bad_fallback_url_is_named_by_the_fallbacks_variable() {
    let out = sendgate(
        &[],
        &[
            ("SENDGATE_FALLBACK_BACKEND", "rabbitmq"),
            ("SENDGATE_FALLBACK_RABBITMQ_URL", "http://127.0.0.1:5672/"),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("sendgate: SENDGATE_FALLBACK_RABBITMQ_URL: "),
        "{err}"
    );
}

#[test]
fn a_secret_in_a_bad_setting_is_never_echoed() {
    let secret = "Pw0rdN0tForY0urEyes";
    let url = format!("amqp:guest:{secret}@127.0.0.1");
    let connection = format!(
        "Endpoint=sb://ns.servicebus.windows.net/,SharedAccessKeyName=send,SharedAccessKey={secret}"
    );
    for (env, var) in [
        (
            [
                ("SENDGATE_BACKEND", "rabbitmq"),
                ("SENDGATE_RABBITMQ_URL", url.as_str()),
            ],
            "SENDGATE_RABBITMQ_URL",
        ),
        (
            [
                ("SENDGATE_BACKEND", "servicebus"),
                ("SERVICEBUS_CONNECTION_STRING", connection.as_str()),
            ],
            "SERVICEBUS_CONNECTION_STRING",
        ),
    ] {
        let out = sendgate(&[], &env);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(var), "{err}");
        assert!(!err.contains(secret), "{err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(secret));
    }
}

#[test]
fn text_logs_written_to_a_file_or_pipe_carry_no_colour_codes() {
    // Taken port: start-up logs its auth_open warning, then cannot bind and exits 1.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let out = sendgate(&["serve"], &[("SENDGATE_LISTEN", listen.as_str())]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("auth_open"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "ANSI escapes in piped logs: {err:?}"
    );
}

#[test]
fn a_misspelled_servicebus_variable_is_named_at_start_up_without_stopping_it() {
    // SERVICEBUS_* is shared with other tools, so an unknown one cannot stop start-up;
    // a near miss of a declared one (the ceiling, here) is said out loud.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let out = sendgate(
        &["serve"],
        &[
            ("SENDGATE_LISTEN", listen.as_str()),
            ("SERVICEBUS_SEND_MAX_QUEUE_DEPT", "5"),
            ("SERVICEBUS_UNRELATED_TOOL_SETTING", "x"),
        ],
    );
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "it got as far as binding: {err}"
    );
    assert!(err.contains("unknown_variable"), "{err}");
    assert!(
        err.contains("SERVICEBUS_SEND_MAX_QUEUE_DEPT")
            && err.contains("SERVICEBUS_SEND_MAX_QUEUE_DEPTH"),
        "{err}"
    );
    assert!(!err.contains("SERVICEBUS_UNRELATED_TOOL_SETTING"), "{err}");
}

#[test]
fn a_variable_that_is_not_utf8_never_panics_the_binary() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let run = |name: &str, value: &[u8]| {
        let mut cmd = sendgate_testkit::gateway::binary(
            &["queue", "depth", "--queue", "requests", "--create"],
            &[("SENDGATE_DATA_DIR".to_owned(), data.clone())].into(),
        );
        cmd.env(name, std::ffi::OsStr::from_bytes(value));
        cmd.output().expect("the binary runs")
    };
    // Another program's variable: none of our business.
    let out = run("SOMEONE_ELSES", b"caf\xe9");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    // One of ours: refused in one line, its value never shown.
    let out = run("SENDGATE_RABBITMQ_URL", b"amqp://u:s3cr3tpw\xff@h");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("SENDGATE_RABBITMQ_URL") && !err.contains("s3cr3tpw"),
        "{err}"
    );
}
