//! Runtime settings: `GET`/`PATCH /admin/settings` and
//! `POST /admin/breakers/{backend}`, role `admin`; a change applies to the next send, is
//! kept in the data directory across a restart, and shows on `/health/detailed`.

use serde_json::{json, Value};
use std::time::Duration;

use sendgate_testkit::embedded::{spawn_app_with, TestApp};
use sendgate_testkit::gateway::{body_json, run_binary, stderr, GatewayProcess};
use sendgate_testkit::keys::{Key, KeysFile};

async fn patch(app: &TestApp, token: Option<&str>, body: Value) -> reqwest::Response {
    let mut req = app
        .client
        .patch(app.url("/admin/settings"))
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

async fn breaker(
    app: &TestApp,
    backend: &str,
    token: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req = app
        .client
        .post(app.url(&format!("/admin/breakers/{backend}")))
        .header("Content-Type", "application/json")
        .body(body.to_owned());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn only_an_admin_key_reads_or_changes_settings_or_breakers() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::one_per_role().write_in(dir.path());
    let app = spawn_app_with(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let get = |token: Option<&'static str>| {
        let mut req = app.client.get(app.url("/admin/settings"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let change = json!({"queues": {"requests": {"max_queue_depth": 7}}});
    assert_eq!(get(None).await.unwrap().status(), 401);
    assert_eq!(patch(&app, None, change.clone()).await.status(), 401);
    assert_eq!(
        breaker(&app, "primary", None, r#"{"action":"open"}"#)
            .await
            .status(),
        401
    );
    for token in ["sender-token", "observer-token"] {
        assert_eq!(get(Some(token)).await.unwrap().status(), 403, "{token}");
        assert_eq!(patch(&app, Some(token), change.clone()).await.status(), 403);
        assert_eq!(
            breaker(&app, "primary", Some(token), r#"{"action":"open"}"#)
                .await
                .status(),
            403
        );
    }
    let body = body_json(get(Some("admin-token")).await.unwrap()).await;
    assert_eq!(
        body["queues"]["requests"]["max_queue_depth"]["value"], 2000,
        "refused changes changed nothing"
    );
    let health = app
        .client
        .get(app.url("/health/detailed"))
        .bearer_auth("admin-token")
        .send()
        .await
        .unwrap();
    assert_eq!(
        body_json(health).await["backends"]["primary"]["breaker"],
        "closed"
    );

    let response = patch(&app, Some("admin-token"), change).await;
    assert_eq!(response.status(), 200);
    let body = body_json(response).await;
    let depth = &body["queues"]["requests"]["max_queue_depth"];
    assert_eq!(depth["value"], 7);
    assert_eq!(depth["default"], 2000);
    assert_eq!(depth["variable"], "SERVICEBUS_SEND_MAX_QUEUE_DEPTH");
    assert_eq!(depth["overridden"]["by"], "deployer");
    assert_eq!(body["changed"], json!(["queues.requests.max_queue_depth"]));
    assert_eq!(body["store"], "file");
}

#[tokio::test]
async fn an_admin_key_scoped_to_some_queues_changes_only_those() {
    // A key with role admin and `queues = ["audit"]` may not lower another queue's
    // ceiling, pin every queue's backend or hold a breaker open.
    let dir = tempfile::tempdir().unwrap();
    let audit_admin = Key::new("audit-ops", &["admin"])
        .token("audit-admin")
        .queues(&["audit"]);
    let keys = KeysFile::new().key(audit_admin).write_in(dir.path());
    let app = spawn_app_with(&[
        ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
        ("SENDGATE_QUEUES", "requests,audit"),
    ])
    .await;
    let token = Some("audit-admin");
    let other = json!({"queues": {"requests": {"max_queue_depth": 1}}});
    assert_eq!(patch(&app, token, other).await.status(), 403);
    let both =
        json!({"queues": {"audit": {"max_queue_depth": 5}, "requests": {"max_queue_depth": 1}}});
    assert_eq!(
        patch(&app, token, both).await.status(),
        403,
        "nothing of it applies"
    );
    let pin = json!({"force_backend": "primary"});
    assert_eq!(
        patch(&app, token, pin).await.status(),
        403,
        "the pin is every queue's"
    );
    assert_eq!(
        breaker(&app, "primary", token, r#"{"action":"open"}"#)
            .await
            .status(),
        403,
        "a breaker serves every queue"
    );
    let empty = json!({"queues": {"requests": {}}});
    assert_eq!(
        patch(&app, token, empty).await.status(),
        403,
        "naming a queue outside the scope, even with nothing in it"
    );
    let drain = app
        .client
        .post(app.url("/admin/drain"))
        .header("Content-Type", "application/json")
        .bearer_auth("audit-admin")
        .send()
        .await
        .unwrap();
    assert_eq!(drain.status(), 403, "a drain stops every queue");
    assert_eq!(body_json(drain).await["code"], "forbidden");
    assert_eq!(app.handle.lifecycle.state().as_str(), "running");
    let own = json!({"queues": {"audit": {"max_queue_depth": 5}}});
    assert_eq!(patch(&app, token, own).await.status(), 200);
    let settings = body_json(
        app.client
            .get(app.url("/admin/settings"))
            .bearer_auth("audit-admin")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        settings["queues"]["requests"]["max_queue_depth"]["value"],
        2000
    );
    assert_eq!(settings["queues"]["audit"]["max_queue_depth"]["value"], 5);
    assert_eq!(settings["force_backend"]["value"], Value::Null);
}

#[tokio::test]
async fn an_admin_body_that_stops_arriving_is_given_up_at_the_body_deadline() {
    // The admin routes read their body under the deadline a send has, or any local process
    // (open mode) could hold connections open with a stalled PATCH.
    let app = spawn_app_with(&[("SENDGATE_BODY_TIMEOUT_MS", "300")]).await;
    for request in ["PATCH /admin/settings", "POST /admin/breakers/primary"] {
        let (text, took) = crate::send::stalled_upload_to(&app, request).await;
        assert!(text.starts_with("HTTP/1.1 408"), "{request}: {text}");
        assert!(
            text.contains(r#""code":"request_timeout""#),
            "{request}: {text}"
        );
        assert!(took < Duration::from_secs(3), "{request}: {took:?}");
    }
}

#[tokio::test]
async fn a_lowered_ceiling_refuses_the_next_send_and_null_restores_the_default() {
    let app = spawn_app_with(&[]).await;
    for n in 0..3 {
        assert_eq!(app.send("requests", &n.to_string()).await.status(), 201);
    }
    let response = patch(
        &app,
        None,
        json!({"queues": {"requests": {"max_queue_depth": 3}}}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let refused = app.send("requests", "4").await;
    assert_eq!(
        refused.status(),
        429,
        "the very next send meets the new ceiling"
    );
    let body = body_json(refused).await;
    assert_eq!(body["code"], "queue_full");
    assert_eq!(body["limit"], 3);
    assert_eq!(app.detailed().await["queues"]["requests"]["limit"], 3);

    let response = patch(
        &app,
        None,
        json!({"queues": {"requests": {"max_queue_depth": null}}}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let body = body_json(response).await;
    assert_eq!(body["queues"]["requests"]["max_queue_depth"]["value"], 2000);
    assert_eq!(
        body["queues"]["requests"]["max_queue_depth"]["overridden"],
        Value::Null
    );
    assert_eq!(app.send("requests", "5").await.status(), 201);
}

#[tokio::test]
async fn the_fail_closed_gate_and_its_streak_can_be_turned_on_at_runtime() {
    let app = spawn_app_with(&[("SENDGATE_DEPTH_TTL_MS", "0")]).await;
    app.faults().fail_depth_reads(true);
    assert_eq!(
        app.send("requests", "1").await.status(),
        201,
        "gate off: fails open"
    );
    let response = patch(
        &app,
        None,
        json!({"queues": {"requests": {"fail_closed": true, "fail_closed_streak": 2}}}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let refused = app.send("requests", "2").await;
    assert_eq!(refused.status(), 503);
    assert_eq!(body_json(refused).await["code"], "capacity_unknown");
    let q = &app.detailed().await["queues"]["requests"];
    assert_eq!(q["fail_closed_enabled"], true);
    assert_eq!(q["streak_threshold"], 2);
}

#[tokio::test]
async fn a_bad_patch_names_every_bad_field_and_changes_nothing() {
    let app = spawn_app_with(&[]).await;
    let response = patch(
        &app,
        None,
        json!({
            "queues": {"requests": {"max_queue_depth": 5, "fail_closed_streak": 0,
                                    "depth_ttl_ms": "fast", "colour": 1}},
            "force_backend": "fallback",
            "extra": true
        }),
    )
    .await;
    assert_eq!(response.status(), 400);
    let body = body_json(response).await;
    assert_eq!(body["code"], "invalid_request");
    let locs: Vec<String> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["loc"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect();
    for loc in [
        "body.queues.requests.fail_closed_streak",
        "body.queues.requests.depth_ttl_ms",
        "body.queues.requests.colour",
        "body.force_backend",
        "body.extra",
    ] {
        assert!(locs.iter().any(|l| l == loc), "{loc} missing from {locs:?}");
    }
    assert_eq!(locs.len(), 5, "the valid field is not an error: {locs:?}");
    assert_eq!(
        app.detailed().await["queues"]["requests"]["limit"],
        2000,
        "all or nothing: the valid field was not applied"
    );

    let unknown = patch(
        &app,
        None,
        json!({"queues": {"nope": {"max_queue_depth": 1}}}),
    )
    .await;
    assert_eq!(unknown.status(), 404);
    assert_eq!(body_json(unknown).await["code"], "unknown_queue");

    let not_json = app
        .client
        .patch(app.url("/admin/settings"))
        .header("Content-Type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);
    let form = app
        .client
        .patch(app.url("/admin/settings"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("queues=1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        form.status(),
        415,
        "a cross-site form cannot change settings"
    );
    let method = app
        .client
        .delete(app.url("/admin/settings"))
        .send()
        .await
        .unwrap();
    assert_eq!(method.status(), 405);
    assert_eq!(method.headers()["allow"], "GET, PATCH");
}

#[tokio::test]
async fn an_override_shows_on_health_detailed_with_its_key_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::one_per_role().write_in(dir.path());
    let app = spawn_app_with(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let before = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let response = patch(
        &app,
        Some("admin-token"),
        json!({"queues": {"requests": {"depth_ttl_ms": 250}}}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let health = body_json(
        app.client
            .get(app.url("/health/detailed"))
            .bearer_auth("observer-token")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let settings = &health["settings"];
    assert_eq!(settings["store"], "file");
    assert_eq!(settings["ok"], true);
    let o = &settings["overridden"]["queues.requests.depth_ttl_ms"];
    assert_eq!(o["value"], 250);
    assert_eq!(o["variable"], "SENDGATE_DEPTH_TTL_MS");
    assert_eq!(o["by"], "deployer");
    let at = time::OffsetDateTime::parse(
        o["at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("RFC 3339");
    assert!(at >= before, "{at} before {before}");
    assert_eq!(settings["overridden"].as_object().unwrap().len(), 1);
}

#[tokio::test]
async fn an_operator_holds_a_breaker_open_and_closes_it() {
    let app = spawn_app_with(&[]).await;
    let held = breaker(&app, "primary", None, r#"{"action":"open"}"#).await;
    assert_eq!(held.status(), 200);
    let body = body_json(held).await;
    assert_eq!(
        (body["breaker"].as_str(), body["held"].as_bool()),
        (Some("open"), Some(true))
    );
    let refused = app.send("requests", "1").await;
    assert_eq!(refused.status(), 503);
    assert_eq!(body_json(refused).await["code"], "backend_unavailable");
    let primary = &app.detailed().await["backends"]["primary"];
    assert_eq!(primary["held"], true);
    assert_eq!(
        primary["next_trial_in_s"],
        Value::Null,
        "no trial while held"
    );

    assert_eq!(
        breaker(&app, "primary", None, r#"{"action":"reset"}"#)
            .await
            .status(),
        200
    );
    assert_eq!(app.send("requests", "2").await.status(), 201);

    let unknown = breaker(&app, "fallback", None, r#"{"action":"open"}"#).await;
    assert_eq!(unknown.status(), 404, "no fallback configured");
    assert_eq!(body_json(unknown).await["code"], "not_found");
    let bad = breaker(&app, "primary", None, r#"{"action":"explode"}"#).await;
    assert_eq!(bad.status(), 400);
    assert_eq!(
        body_json(bad).await["errors"][0]["loc"],
        json!(["body", "action"])
    );
}

#[tokio::test]
async fn overrides_survive_a_restart_of_the_binary_and_a_corrupt_file_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    let vars = [("SENDGATE_DATA_DIR", data.as_str())];
    let mut first = GatewayProcess::start(&vars).await;
    let response = first
        .client
        .patch(first.url("/admin/settings"))
        .header("Content-Type", "application/json")
        .body(r#"{"queues": {"requests": {"max_queue_depth": 1}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    first.signal("TERM");
    let (code, _) = first.exit(Duration::from_secs(20)).await;
    assert_eq!(code, 0);

    let second = GatewayProcess::start(&vars).await;
    let health = second.detailed().await;
    assert_eq!(health["queues"]["requests"]["limit"], 1);
    assert_eq!(
        health["settings"]["overridden"]["queues.requests.max_queue_depth"]["by"],
        "anonymous"
    );
    assert_eq!(second.send("requests", "1").await.unwrap(), 201);
    assert_eq!(second.send("requests", "2").await.unwrap(), 429);
    drop(second);

    std::fs::write(dir.path().join("settings.json"), "{not json").unwrap();
    let out = run_binary(
        &["serve"],
        &[
            ("SENDGATE_DATA_DIR", data.as_str()),
            ("SENDGATE_LISTEN", "127.0.0.1:0"),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("settings.json"), "{}", stderr(&out));
}

#[tokio::test]
async fn each_change_logs_settings_changed_with_old_and_new_and_the_key_never_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::one_per_role().write_in(dir.path());
    let data = dir.path().join("data").display().to_string();
    let log_path = dir.path().join("sendgate.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let gw = GatewayProcess::start_logging_to(
        &[
            ("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap()),
            ("SENDGATE_DATA_DIR", data.as_str()),
            ("SENDGATE_LOG_FORMAT", "json"),
        ],
        log,
    )
    .await;
    let patch = |body: &'static str| {
        gw.client
            .patch(gw.url("/admin/settings"))
            .bearer_auth("admin-token")
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let set = r#"{"queues": {"requests": {"max_queue_depth": 7}}}"#;
    assert_eq!(patch(set).await.unwrap().status(), 200);
    assert_eq!(
        patch(set).await.unwrap().status(),
        200,
        "the same value: no change"
    );
    let clear = r#"{"queues": {"requests": {"max_queue_depth": null}}}"#;
    assert_eq!(patch(clear).await.unwrap().status(), 200);

    let started = std::time::Instant::now();
    let lines = loop {
        let text = std::fs::read_to_string(&log_path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["event"] == "settings_changed")
            .collect();
        if lines.len() >= 2 || started.elapsed() > Duration::from_secs(5) {
            assert!(!text.contains("admin-token"), "a token in the log");
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        lines.len(),
        2,
        "one line per change, none for the no-op: {lines:?}"
    );
    let field = |l: &Value, f: &str| {
        l[f].as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| l[f].to_string())
    };
    let first = &lines[0];
    assert_eq!(field(first, "setting"), "queues.requests.max_queue_depth");
    assert_eq!(field(first, "variable"), "SERVICEBUS_SEND_MAX_QUEUE_DEPTH");
    assert_eq!(
        (field(first, "old"), field(first, "new")),
        ("2000".into(), "7".into())
    );
    assert_eq!(field(first, "by"), "deployer");
    assert_eq!(field(first, "overridden"), "true");
    let second = &lines[1];
    assert_eq!(
        (field(second, "old"), field(second, "new")),
        ("7".into(), "2000".into())
    );
    assert_eq!(field(second, "overridden"), "false");
}

/// The binary on `data` with `SERVICEBUS_SEND_MAX_QUEUE_DEPTH=ceiling` and `vars`, logging
/// JSON lines to `log`.
async fn restarted(
    data: &str,
    ceiling: &str,
    vars: &[(&str, &str)],
    log: &std::path::Path,
) -> GatewayProcess {
    let mut all = vec![
        ("SENDGATE_DATA_DIR", data),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", ceiling),
        ("SENDGATE_LOG_FORMAT", "json"),
    ];
    all.extend_from_slice(vars);
    GatewayProcess::start_logging_to(&all, std::fs::File::create(log).unwrap()).await
}

/// The log lines of `event` in `log`, waited for (at most 5 s) until there is one.
async fn logged(log: &std::path::Path, event: &str) -> Vec<Value> {
    let started = std::time::Instant::now();
    loop {
        let lines: Vec<Value> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["event"] == event)
            .collect();
        if !lines.is_empty() || started.elapsed() > Duration::from_secs(5) {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stop(mut gw: GatewayProcess) {
    gw.signal("TERM");
    assert_eq!(gw.exit(Duration::from_secs(20)).await.0, 0);
}

/// Issue 41 item 3: an override in force over the deployment's value is said at start-up
/// and on `/health/detailed`; by default it lapses once the deployment changes the value it
/// was made against (`SENDGATE_OVERRIDES_LAPSE=config_change`); `never` keeps it.
#[tokio::test]
async fn a_restart_with_an_override_in_force_says_so_and_a_changed_deployment_wins() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").display().to_string();
    let log = dir.path().join("sendgate.log");
    let setting = "queues.requests.max_queue_depth";

    let first = restarted(&data, "500", &[], &log).await;
    let response = first
        .client
        .patch(first.url("/admin/settings"))
        .header("Content-Type", "application/json")
        .body(r#"{"queues": {"requests": {"max_queue_depth": 3}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    stop(first).await;

    // The same deployment: the override stays, and is said.
    let same = restarted(&data, "500", &[], &log).await;
    let d = same.detailed().await;
    assert_eq!(d["queues"]["requests"]["limit"], 3);
    let o = &d["settings"]["overridden"][setting];
    assert_eq!(
        (&o["configured"], &o["made_against"]),
        (&json!(500), &json!(500))
    );
    assert_eq!(o["differs"], true);
    assert_eq!(d["settings"]["lapse"], "config_change");
    let said = logged(&log, "settings_overriding").await;
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0]["setting"], setting);
    assert_eq!(said[0]["value"].to_string().trim_matches('"'), "3");
    assert_eq!(said[0]["configured"].to_string().trim_matches('"'), "500");
    stop(same).await;

    // The deployment raised the ceiling: the override lapses, from the file too.
    let raised = restarted(&data, "600", &[], &log).await;
    let d = raised.detailed().await;
    assert_eq!(d["queues"]["requests"]["limit"], 600, "the deployment wins");
    assert!(d["settings"]["overridden"].get(setting).is_none(), "{d}");
    let lapsed = &d["settings"]["lapsed"][setting];
    assert_eq!(
        (
            &lapsed["value"],
            &lapsed["made_against"],
            &lapsed["configured"]
        ),
        (&json!(3), &json!(500), &json!(600))
    );
    assert_eq!(logged(&log, "settings_lapsed").await.len(), 1);
    let file = std::fs::read_to_string(dir.path().join("data/settings.json")).unwrap();
    assert!(!file.contains(setting), "dropped from the store: {file}");
    // An override made now is made against 600.
    let response = raised
        .client
        .patch(raised.url("/admin/settings"))
        .header("Content-Type", "application/json")
        .body(r#"{"queues": {"requests": {"max_queue_depth": 3}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    stop(raised).await;

    // `never`: the override outlives a changed deployment, and says so.
    let kept = restarted(&data, "700", &[("SENDGATE_OVERRIDES_LAPSE", "never")], &log).await;
    let d = kept.detailed().await;
    assert_eq!(d["queues"]["requests"]["limit"], 3);
    assert_eq!(d["settings"]["lapse"], "never");
    assert_eq!(d["settings"]["overridden"][setting]["made_against"], 600);
    assert_eq!(d["settings"]["overridden"][setting]["configured"], 700);
    assert_eq!(logged(&log, "settings_overriding").await.len(), 1);
    assert!(logged(&log, "settings_lapsed").await.is_empty());
    stop(kept).await;
}
