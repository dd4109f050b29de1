//! The status page (`GET /`) in a real browser: headless Chromium through chromedriver.
//! Needs both (`scripts/ensure-chromium.sh` installs them; without them these tests fail,
//! they never skip).
//!
//! `SENDGATE_SCREENSHOT=1` also writes `docs/console.png` and `docs/settings.png` (the
//! pictures in docs/operations.md); the normal run leaves the committed files alone.

use sendgate_testkit::browser::Browser;
use sendgate_testkit::gateway::{settings_of, Gateway};
use sendgate_testkit::keys::{Key, KeysFile};

/// The page's element for one field of `queue` on the primary.
fn field(queue: &str, name: &str) -> String {
    format!(r#"article[data-backend="primary"][data-queue="{queue}"] [data-field="{name}"]"#)
}

/// The page's cell `name` of `tenant`'s row under `queue` on the primary.
fn tenant(queue: &str, tenant: &str, name: &str) -> String {
    format!(
        r#"article[data-backend="primary"][data-queue="{queue}"] tr[data-tenant="{tenant}"] [data-field="{name}"]"#
    )
}

/// A gateway on the embedded backend in a temporary data directory, with `vars` on top.
async fn gateway(vars: &[(&str, &str)]) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a data directory");
    let data = dir.path().display().to_string();
    let settings = settings_of(&[&[("SENDGATE_DATA_DIR", data.as_str())], vars]);
    (Gateway::start(settings).await, dir)
}

async fn send(app: &Gateway, n: usize) {
    for _ in 0..n {
        assert_eq!(app.send("requests", "{}").await.status(), 201);
    }
}

#[tokio::test]
async fn the_page_shows_the_backlog_and_ceiling_health_detailed_reports_and_follows_them() {
    let (app, _dir) = gateway(&[("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "25")]).await;
    send(&app, 4).await;
    let browser = Browser::start().await;
    browser.client.goto(&app.url("/")).await.unwrap();

    let d = app.detailed().await;
    let q = &d["queues"]["requests"];
    assert_eq!(q["backlog"], 4);
    let backlog = browser
        .wait_text(&field("requests", "backlog"), "4", |t| t == "4")
        .await;
    assert_eq!(backlog, q["backlog"].to_string());
    let limit = browser.text(&field("requests", "limit")).await.unwrap();
    assert_eq!(limit, q["limit"].to_string());
    assert_eq!(limit, "25");

    // A row per tenant the queue answered (open mode: the one tenant, `open`), as
    // /health/detailed's `tenants` says.
    let row = q["tenants"][0].clone();
    assert_eq!(row["name"], "open", "{q}");
    let admitted = browser
        .wait_text(
            &tenant("requests", "open", "tenant_admitted"),
            "a rate",
            |t| t.parse::<f64>().is_ok_and(|r| r > 0.0),
        )
        .await;
    assert!(
        admitted.parse::<f64>().unwrap() <= 0.4,
        "4 sends over 10 s: {admitted}"
    );
    for (name, text) in [
        ("tenant_name", "open"),
        ("tenant_weight", "1"),
        ("tenant_refused", "0.0"),
    ] {
        assert_eq!(
            browser
                .text(&tenant("requests", "open", name))
                .await
                .unwrap(),
            text,
            "{name}"
        );
    }
    let share = browser
        .text(&tenant("requests", "open", "tenant_share"))
        .await
        .unwrap();
    assert!(
        share.parse::<f64>().is_ok_and(|s| (0.0..=1.0).contains(&s)),
        "{share}"
    );
    // The tenants' table stays inside its queue's card (it scrolls within it if it must).
    let overflow = browser
        .eval(
            r#"var card = document.querySelector('article[data-queue="requests"]');
               return card.scrollWidth - card.clientWidth;"#,
        )
        .await;
    assert!(
        overflow.as_f64().is_some_and(|px| px <= 0.0),
        "the tenants' table draws {overflow} px past its card"
    );

    // The script redraws from /health/detailed: more sends show up without a reload, and
    // the chart (drawn only by the script) has its line.
    send(&app, 3).await;
    browser
        .wait_text(&field("requests", "backlog"), "7", |t| t == "7")
        .await;
    assert_eq!(app.detailed().await["queues"]["requests"]["backlog"], 7);
    browser
        .wait_count(
            r#"article[data-queue="requests"] svg.spark polyline.backlog"#,
            1,
        )
        .await;
    assert_eq!(
        browser
            .count(r#"article[data-queue="requests"] svg.spark line.ceiling"#)
            .await,
        1
    );
    assert_eq!(
        browser.text(&field("requests", "refusing")).await.unwrap(),
        "no"
    );

    if std::env::var_os("SENDGATE_SCREENSHOT").is_some_and(|v| v == "1") {
        // A few more polls with the backlog moving, so the chart has a shape.
        for n in [5, 3, 6] {
            send(&app, n).await;
            tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        }
        browser
            .wait_text(&field("requests", "backlog"), "21", |t| t == "21")
            .await;
        let png = browser.client.screenshot().await.expect("a screenshot");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/console.png");
        std::fs::write(path, png).expect("docs/console.png is written");
    }
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn without_javascript_the_page_still_shows_the_current_snapshot() {
    let (app, _dir) = gateway(&[("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "25")]).await;
    send(&app, 2).await;
    let browser = Browser::without_javascript().await;
    browser.client.goto(&app.url("/")).await.unwrap();
    let d = app.detailed().await;
    assert_eq!(
        browser.text(&field("requests", "backlog")).await.unwrap(),
        d["queues"]["requests"]["backlog"].to_string()
    );
    assert_eq!(
        browser.text(&field("requests", "limit")).await.unwrap(),
        "25"
    );
    let chart = browser.text(&field("requests", "chart")).await.unwrap();
    assert!(chart.contains("drawn by the page's script"), "{chart}");
    assert_eq!(
        browser
            .text(&tenant("requests", "open", "tenant_name"))
            .await
            .unwrap(),
        "open",
        "the tenants' rows are in the snapshot too"
    );
    assert_eq!(browser.count("svg.spark").await, 0, "no script ran");
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn with_the_admin_plane_failing_the_page_shows_the_streak_rise_then_refusing() {
    let (app, _dir) = gateway(&[
        ("SERVICEBUS_SEND_FAILCLOSED", "1"),
        ("SERVICEBUS_SEND_FAILCLOSED_STREAK", "3"),
        ("SENDGATE_DEPTH_TTL_MS", "0"),
    ])
    .await;
    let browser = Browser::start().await;
    browser.client.goto(&app.url("/")).await.unwrap();
    let streak = field("requests", "streak");
    browser
        .wait_text(&streak, "0 of 3", |t| t == "0 of 3")
        .await;
    assert_eq!(
        browser
            .text(&field("requests", "fail_closed_enabled"))
            .await
            .unwrap(),
        "on"
    );
    assert_eq!(
        browser.text(&field("requests", "refusing")).await.unwrap(),
        "no"
    );

    app.primary.fail_depth_reads(true);
    // Below the threshold the gate fails open: the sends are queued, the streak rises.
    send(&app, 1).await;
    browser
        .wait_text(&streak, "1 of 3", |t| t == "1 of 3")
        .await;
    send(&app, 1).await;
    browser
        .wait_text(&streak, "2 of 3", |t| t == "2 of 3")
        .await;
    assert_eq!(
        browser.text(&field("requests", "refusing")).await.unwrap(),
        "no"
    );
    let refused = app.send("requests", "{}").await;
    assert_eq!(
        refused.status(),
        503,
        "the third failed read closes the gate"
    );
    browser
        .wait_text(&streak, "3 of 3", |t| t == "3 of 3")
        .await;
    let refusing = browser
        .wait_text(&field("requests", "refusing"), "refusing", |t| {
            t.contains("refusing")
        })
        .await;
    assert!(refusing.starts_with("yes"), "{refusing}");
    assert_eq!(
        browser.text(&field("requests", "backlog")).await.unwrap(),
        "unknown"
    );
    assert_eq!(
        app.detailed().await["queues"]["requests"]["fail_closed"],
        true,
        "the page says what /health/detailed says"
    );
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn with_keys_on_a_wrong_token_shows_an_error_and_no_data_and_the_right_one_shows_data() {
    let observer = format!("obs-{}", uuid::Uuid::new_v4().simple());
    let sender = format!("snd-{}", uuid::Uuid::new_v4().simple());
    let keys_dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("ops", &["observer"]).token(&observer))
        .key(Key::new("app", &["sender"]).token(&sender))
        .write_in(keys_dir.path());
    let (app, _dir) = gateway(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let browser = Browser::start().await;
    browser.client.goto(&app.url("/")).await.unwrap();

    let form = fantoccini::Locator::Css("#token-form");
    let input = fantoccini::Locator::Css("#token");
    let submit = fantoccini::Locator::Css("#token-form button[type=submit]");
    let stored = "return window.sessionStorage.getItem('sendgate.observerToken')";
    let any_data = "article[data-queue]";

    // The form is the script's (hidden without it): wait until it is shown.
    let started = std::time::Instant::now();
    while !browser
        .client
        .find(form)
        .await
        .unwrap()
        .is_displayed()
        .await
        .unwrap()
    {
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(browser.count(any_data).await, 0);
    assert_eq!(
        browser.text("label[for=token]").await.unwrap(),
        "Observer token"
    );

    // An unknown token (401), then a token without the observer role (403): an error,
    // no data, nothing kept.
    for (wrong, status) in [("not-a-key", "401"), (sender.as_str(), "403")] {
        browser
            .client
            .find(input)
            .await
            .unwrap()
            .send_keys(wrong)
            .await
            .unwrap();
        browser
            .client
            .find(submit)
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let error = browser
            .wait_text("#auth-error", status, |t| t.contains(status))
            .await;
        assert!(error.contains("refused"), "{error}");
        assert_eq!(browser.count(any_data).await, 0, "no data after a {status}");
        assert_eq!(browser.eval(stored).await, serde_json::Value::Null);
    }

    // The observer's token: data, and the token kept for this tab only.
    browser
        .client
        .find(input)
        .await
        .unwrap()
        .send_keys(&observer)
        .await
        .unwrap();
    browser
        .client
        .find(submit)
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait_text(&field("requests", "limit"), "the ceiling", |t| t == "2000")
        .await;
    assert_eq!(browser.text("#auth-error").await.unwrap_or_default(), "");
    assert_eq!(browser.eval(stored).await, observer.as_str());

    // A reload keeps the tab's token: data again without asking.
    browser.client.refresh().await.unwrap();
    browser
        .wait_text(&field("requests", "limit"), "the ceiling", |t| t == "2000")
        .await;

    // The token was never in a URL: not the page's, not any request's it made.
    let url = browser.client.current_url().await.unwrap();
    assert_eq!(url.as_str(), app.url("/"));
    let requested = browser
        .eval(
            "return performance.getEntriesByType('navigation')
                .concat(performance.getEntriesByType('resource'))
                .map(function (e) { return e.name; })",
        )
        .await;
    let requested: Vec<String> = serde_json::from_value(requested).unwrap();
    assert!(
        requested.iter().any(|u| u.ends_with("/health/detailed")),
        "{requested:?}"
    );
    for u in &requested {
        assert!(
            !u.contains(&observer) && !u.contains(&sender) && !u.contains("not-a-key"),
            "a token in {u}"
        );
        assert!(!u.contains('?'), "no query at all: {u}");
    }
    browser.close().await;
    app.stop().await;
}

/// Wait until the element `css` is displayed (the settings form is the script's).
async fn wait_displayed(browser: &Browser, css: &str) {
    let started = std::time::Instant::now();
    loop {
        if let Ok(e) = browser.client.find(fantoccini::Locator::Css(css)).await {
            if e.is_displayed().await.unwrap_or(false) {
                return;
            }
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{css} never shown"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn type_into(browser: &Browser, css: &str, text: &str) {
    let input = browser
        .client
        .find(fantoccini::Locator::Css(css))
        .await
        .unwrap();
    input.clear().await.unwrap();
    input.send_keys(text).await.unwrap();
}

async fn apply_settings(browser: &Browser) {
    browser
        .client
        .find(fantoccini::Locator::Css(
            "#settings-form button[type=submit]",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_ceiling_lowered_in_the_settings_form_refuses_the_next_send_over_it() {
    let (app, _dir) = gateway(&[]).await;
    send(&app, 3).await;
    let browser = Browser::start().await;
    browser.client.goto(&app.url("/")).await.unwrap();
    wait_displayed(&browser, "#settings-form").await;
    assert_eq!(
        browser
            .text("label[for=set-max_queue_depth]")
            .await
            .unwrap(),
        "Ceiling (max_queue_depth)"
    );
    browser
        .wait_text("#set-max_queue_depth-now", "the value in force", |t| {
            t.contains("In force: 2000")
        })
        .await;

    // A value out of the variable's bounds: the 400's errors are shown, nothing changes.
    type_into(&browser, "#set-max_queue_depth", "0").await;
    apply_settings(&browser).await;
    let errors = browser
        .wait_text("#settings-errors", "the 400's errors", |t| !t.is_empty())
        .await;
    assert!(
        errors.contains("queues.requests.max_queue_depth") && errors.contains("at least 1"),
        "{errors}"
    );
    assert_eq!(app.detailed().await["queues"]["requests"]["limit"], 2000);

    // Lowered to the backlog: the next send over it is refused (through the HTTP API).
    type_into(&browser, "#set-max_queue_depth", "3").await;
    apply_settings(&browser).await;
    let result = browser
        .wait_text("#settings-result", "the change", |t| !t.is_empty())
        .await;
    assert!(
        result.contains("queues.requests.max_queue_depth"),
        "{result}"
    );
    assert_eq!(
        browser.text("#settings-errors").await.unwrap_or_default(),
        ""
    );
    let refused = app.send("requests", "{}").await;
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(
        (body["code"].as_str(), body["limit"].as_u64()),
        (Some("queue_full"), Some(3))
    );
    browser
        .wait_text(&field("requests", "limit"), "the new ceiling", |t| t == "3")
        .await;
    browser
        .wait_text(&field("requests", "limit_overridden"), "marked", |t| {
            t == "(runtime setting by anonymous)"
        })
        .await;
    let now = browser.text("#set-max_queue_depth-now").await.unwrap();
    assert!(
        now.contains("In force: 3") && now.contains("overridden by anonymous"),
        "{now}"
    );
    // The Runtime overrides card (drawn by the script from /health/detailed) says it is in
    // force over the configured value.
    browser
        .wait_text(
            "[data-field=overriding]",
            "the override over the configuration",
            |t| {
                t.contains(
                    "queues.requests.max_queue_depth = 3 over the configured 2000 (by anonymous)",
                )
            },
        )
        .await;

    if std::env::var_os("SENDGATE_SCREENSHOT").is_some_and(|v| v == "1") {
        browser
            .eval("document.getElementById('settings').scrollIntoView(); return null")
            .await;
        let png = browser.client.screenshot().await.expect("a screenshot");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.png");
        std::fs::write(path, png).expect("docs/settings.png is written");
    }

    // Back to the default from the form.
    browser
        .client
        .find(fantoccini::Locator::Css("#set-max_queue_depth-default"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    apply_settings(&browser).await;
    browser
        .wait_text("#set-max_queue_depth-now", "the default again", |t| {
            t.contains("In force: 2000") && !t.contains("overridden")
        })
        .await;
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn a_sheddable_level_lowered_in_the_settings_form_refuses_the_next_sheddable_send() {
    let (app, _dir) = gateway(&[("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "10")]).await;
    send(&app, 3).await;
    let sheddable = [("Sendgate-Criticality", "sheddable")];
    let browser = Browser::start().await;
    browser.client.goto(&app.url("/")).await.unwrap();
    wait_displayed(&browser, "#settings-form").await;
    assert_eq!(
        browser
            .text("label[for=set-shed_at_sheddable]")
            .await
            .unwrap(),
        "Sheddable sends refused from (shed_at_sheddable)"
    );
    browser
        .wait_text("#set-shed_at_sheddable-now", "the value in force", |t| {
            t.contains("In force: 0.8") && t.contains("SENDGATE_SHED_AT_SHEDDABLE")
        })
        .await;
    for (id, value) in [("fair_share_at", "0.9"), ("shed_at_default", "1")] {
        let now = browser.text(&format!("#set-{id}-now")).await.unwrap();
        assert!(now.contains(&format!("In force: {value}")), "{id}: {now}");
    }

    // Above the default level: the 400 names the field, nothing changes.
    type_into(&browser, "#set-shed_at_sheddable", "1.5").await;
    apply_settings(&browser).await;
    let errors = browser
        .wait_text("#settings-errors", "the 400's errors", |t| !t.is_empty())
        .await;
    assert!(
        errors.contains("queues.requests.shed_at_sheddable"),
        "{errors}"
    );
    assert_eq!(
        app.send_with("requests", "{}", &sheddable).await.status(),
        201
    );

    // A fraction, typed as a number field takes one (".25"): sent as a number, and the
    // next sheddable send over it is refused for its criticality while a default one is
    // admitted.
    type_into(&browser, "#set-shed_at_sheddable", ".25").await;
    apply_settings(&browser).await;
    browser
        .wait_text("#settings-result", "the change", |t| {
            t.contains("queues.requests.shed_at_sheddable")
        })
        .await;
    browser
        .wait_text("#set-shed_at_sheddable-now", "the new level", |t| {
            t.contains("In force: 0.25") && t.contains("overridden by anonymous")
        })
        .await;
    let refused = app.send_with("requests", "{}", &sheddable).await;
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(
        (
            body["reason"].as_str(),
            body["criticality"].as_str(),
            body["limit"].as_u64()
        ),
        (Some("criticality"), Some("sheddable"), Some(2))
    );
    assert_eq!(app.send("requests", "{}").await.status(), 201);
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn with_keys_on_the_settings_form_needs_an_admin_token_kept_out_of_urls() {
    let admin = format!("adm-{}", uuid::Uuid::new_v4().simple());
    let observer = format!("obs-{}", uuid::Uuid::new_v4().simple());
    let keys_dir = tempfile::tempdir().unwrap();
    let keys = KeysFile::new()
        .key(Key::new("root", &["admin"]).token(&admin))
        .key(Key::new("ops", &["observer"]).token(&observer))
        .write_in(keys_dir.path());
    let (app, _dir) = gateway(&[("SENDGATE_API_KEYS_FILE", keys.to_str().unwrap())]).await;
    let browser = Browser::start().await;
    browser.client.goto(&app.url("/")).await.unwrap();
    wait_displayed(&browser, "#settings-form").await;
    assert_eq!(
        browser.text("label[for=admin-token]").await.unwrap(),
        "Admin token"
    );
    let stored = "return window.sessionStorage.getItem('sendgate.adminToken')";

    // The observer's token may not use the form: the 403 is said, nothing is kept.
    type_into(&browser, "#admin-token", &observer).await;
    type_into(&browser, "#set-fail_closed_streak", "5").await; // leaving the token field
    browser
        .wait_text("#settings-errors", "the 403", |t| t.contains("403"))
        .await;
    assert_eq!(browser.eval(stored).await, serde_json::Value::Null);
    assert_eq!(browser.count("#settings-queue option").await, 0, "no data");

    // The admin's token: the queues and values come, the change applies, the token is kept
    // for this tab.
    type_into(&browser, "#admin-token", &admin).await;
    type_into(&browser, "#set-fail_closed_streak", "5").await;
    browser.wait_count("#settings-queue option", 1).await;
    browser
        .wait_text("#set-fail_closed_streak-now", "the value in force", |t| {
            t.contains("In force: 3")
        })
        .await;
    assert_eq!(browser.eval(stored).await, admin.as_str());
    apply_settings(&browser).await;
    browser
        .wait_text("#settings-result", "the change", |t| {
            t.contains("queues.requests.fail_closed_streak")
        })
        .await;
    assert_eq!(browser.eval(stored).await, admin.as_str());
    let health: serde_json::Value = app
        .client
        .get(app.url("/health/detailed"))
        .bearer_auth(&observer)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["queues"]["requests"]["streak_threshold"], 5);
    assert_eq!(
        health["settings"]["overridden"]["queues.requests.fail_closed_streak"]["by"],
        "root"
    );

    // No token in any URL the page used.
    let requested = browser
        .eval(
            "return performance.getEntriesByType('navigation')
                .concat(performance.getEntriesByType('resource'))
                .map(function (e) { return e.name; })",
        )
        .await;
    let requested: Vec<String> = serde_json::from_value(requested).unwrap();
    assert!(
        requested.iter().any(|u| u.ends_with("/admin/settings")),
        "{requested:?}"
    );
    for u in &requested {
        assert!(
            !u.contains(&admin) && !u.contains(&observer),
            "a token in {u}"
        );
    }

    // "Forget token" forgets both: the admin's token does not stay in the tab.
    type_into(&browser, "#token", &observer).await;
    browser
        .client
        .find(fantoccini::Locator::Css("#token-form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_displayed(&browser, "#forget-token").await;
    browser
        .client
        .find(fantoccini::Locator::Css("#forget-token"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let observer_stored = "return window.sessionStorage.getItem('sendgate.observerToken')";
    assert_eq!(browser.eval(observer_stored).await, serde_json::Value::Null);
    assert_eq!(
        browser.eval(stored).await,
        serde_json::Value::Null,
        "the admin token stayed"
    );
    assert_eq!(
        browser
            .eval("return document.getElementById('admin-token').value")
            .await,
        ""
    );
    browser.close().await;
    app.stop().await;
}
