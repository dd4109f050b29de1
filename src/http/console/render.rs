//! The status page's HTML, rendered on the server with maud (every value escaped by the
//! template, none by hand).
//!
//! The snapshot is rendered from `/health/detailed`'s JSON, the same value the page's
//! script polls, so the page reads the same without JavaScript as with it, and a field
//! another module adds to that body (`drain_rate_per_s`, `refusing_until_backlog`) shows
//! here as soon as it is there. The markup mirrors `app.js`'s `render`: the same sections,
//! words and `data-field` hooks (the browser tests find values by them).

use maud::{html, Markup, DOCTYPE};
use serde_json::Value;

/// Who may see data in a server-rendered page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No keys: any caller may read `/health/detailed`, so the page shows the snapshot.
    Open,
    /// Keys on: the page cannot know the caller's token from a plain GET; it shows the
    /// frame and the token form, and no data.
    Keys,
}

pub const SCRIPT_PATH: &str = "/console/app.js";
pub const STYLE_PATH: &str = "/console/style.css";

/// The whole page. `snapshot` is `/health/detailed`'s body (open mode) or `None` (keys on).
/// `now` is when it was taken, RFC 3339.
pub fn page(mode: Mode, snapshot: Option<&Value>, now: &str) -> Markup {
    let keys = mode == Mode::Keys;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { "sendgate status" }
                link rel="stylesheet" href=(STYLE_PATH);
                script src=(SCRIPT_PATH) defer {}
            }
            body data-auth=(if keys { "keys" } else { "open" }) {
                header.top {
                    h1 { "sendgate status" }
                    p.lead {
                        "What the gateway knows right now, refreshed every 2 seconds from "
                        code { "/health/detailed" } ". Nothing here calls the broker."
                    }
                }
                main {
                    @if keys {
                        (token_section())
                    }
                    p #fetch-error.error role="status" {}
                    div #status aria-live="polite" {
                        @match snapshot {
                            Some(d) => (body(d, now)),
                            None => p.empty { "No data yet: enter an observer token." },
                        }
                    }
                    (settings_form(keys))
                }
            }
        }
    }
}

/// Keys on: the form the script shows to take an observer token (kept in the tab, sent as
/// a bearer header), and where it says how that went.
fn token_section() -> Markup {
    html! {
        section #auth aria-labelledby="auth-title" {
            h2 #auth-title { "Observer token" }
            noscript {
                p.notice {
                    "API keys are on: this page needs JavaScript to send your "
                    "observer token (as an Authorization header, never in a URL)."
                }
            }
            // Shown by the script; without it the form could not keep the token out of a URL.
            form #token-form hidden method="post" autocomplete="off" {
                label for="token" { "Observer token" }
                input #token type="password" name="token" required
                    autocomplete="off" spellcheck="false"
                    aria-describedby="token-help";
                button type="submit" { "Show status" }
                p #token-help.help {
                    "A token with the observer or admin role. It is kept in this tab "
                    "only (sessionStorage) and sent as a bearer token."
                }
            }
            p #auth-error.error role="alert" {}
            p #signed-in hidden {
                "Using the token stored in this tab. "
                button #forget-token type="button" { "Forget token" }
            }
        }
    }
}

/// The runtime settings form (`PATCH /admin/settings`). Outside the refreshed region, so a
/// poll never wipes what is being typed; shown by the script (it sends the JSON and the
/// admin token as a bearer header: the page's CSP lets no form submit by itself).
fn settings_form(keys: bool) -> Markup {
    html! {
        section #settings aria-labelledby="settings-title" {
            h2 #settings-title { "Runtime settings" }
            noscript {
                p.notice { "Changing settings needs JavaScript (it sends them as JSON with an admin token)." }
            }
            form #settings-form hidden method="post" autocomplete="off" novalidate {
                p.help {
                    "Overrides of the variables, in force from the next send (role admin). "
                    "An empty field is left as it is."
                }
                @if keys {
                    (admin_token())
                }
                div.setting {
                    label for="settings-queue" { "Queue" }
                    select #settings-queue {}
                }
                (number_setting("set-max_queue_depth", "Ceiling (max_queue_depth)", 1, None))
                div.setting {
                    label for="set-fail_closed" { "Fail-closed gate" }
                    select #set-fail_closed aria-describedby="set-fail_closed-now" {
                        option value="" { "leave as it is" }
                        option value="true" { "on" }
                        option value="false" { "off" }
                        option value="null" { "back to the default" }
                    }
                    p.help #set-fail_closed-now {}
                }
                (number_setting("set-fail_closed_streak", "Fail-closed streak", 1, Some(u64::from(u32::MAX))))
                (number_setting("set-depth_ttl_ms", "Depth TTL (ms)", 0, Some(3_600_000)))
                (fraction_setting("set-shed_at_sheddable", "Sheddable sends refused from (shed_at_sheddable)"))
                (fraction_setting("set-shed_at_default", "Default sends refused from (shed_at_default)"))
                (fraction_setting("set-fair_share_at", "Shares apply from (fair_share_at)"))
                div.setting {
                    label for="set-force_backend" { "Forced backend (all queues)" }
                    select #set-force_backend aria-describedby="set-force_backend-now" {
                        option value="" { "leave as it is" }
                        option value="primary" { "primary" }
                        option value="fallback" { "fallback" }
                        option value="null" { "back to the default" }
                    }
                    p.help #set-force_backend-now {}
                }
                button type="submit" { "Apply" }
                p #settings-result role="status" {}
                ul #settings-errors.error role="alert" {}
            }
        }
    }
}

/// A whole-number setting's field, with its "back to the default" box and where the
/// script writes the value in force.
fn number_setting(id: &str, label: &str, min: u64, max: Option<u64>) -> Markup {
    html! {
        div.setting {
            label for=(id) { (label) }
            input id=(id) type="number" min=(min) max=[max] step="1" inputmode="numeric"
                aria-describedby={ (id) "-now" };
            label.inline { input id={ (id) "-default" } type="checkbox"; " back to the default" }
            p.help id={ (id) "-now" } {}
        }
    }
}

/// A share of the queue's ceiling (docs/contract.md, section 6: above 0, at most 1), as
/// [`number_setting`] otherwise.
fn fraction_setting(id: &str, label: &str) -> Markup {
    html! {
        div.setting {
            label for=(id) { (label) }
            input id=(id) type="number" min="0" max="1" step="0.01" inputmode="decimal"
                aria-describedby={ (id) "-now" };
            label.inline { input id={ (id) "-default" } type="checkbox"; " back to the default" }
            p.help id={ (id) "-now" } {}
        }
    }
}

/// Keys on: the admin token the settings are sent with.
fn admin_token() -> Markup {
    html! {
        div.setting {
            label for="admin-token" { "Admin token" }
            input #admin-token type="password" autocomplete="off" spellcheck="false"
                aria-describedby="admin-token-help";
            p #admin-token-help.help {
                "A token with the admin role, kept in this tab only (sessionStorage) "
                "and sent as a bearer token."
            }
        }
    }
}

/// The refreshed region's content: `app.js` builds the same from each poll.
fn body(d: &Value, now: &str) -> Markup {
    let status = word(&d["status"]);
    html! {
        p.summary {
            "Gateway "
            span class=(badge(status == "ok")) data-field="status" { (status) }
            " · state " strong data-field="gateway_state" { (word(&d["gateway_state"])) }
            " · version " (word(&d["version"]))
            " · pid " (number(&d["pid"]))
            " · as of " span data-field="as_of" { (now) }
        }
        div.grid {
            section.card aria-labelledby="lifecycle-title" {
                h2 #lifecycle-title { "Lifecycle" }
                dl {
                    dt { "State" } dd { (word(&d["gateway_state"])) }
                    dt { "Drain" } dd data-field="drain" { (drain(&d["drain"])) }
                }
            }
            section.card aria-labelledby="coordination-title" {
                h2 #coordination-title { "Coordination" }
                (coordination(&d["coordination"]))
            }
            section.card aria-labelledby="overrides-title" {
                h2 #overrides-title { "Runtime overrides" }
                (overrides(&d["settings"]))
            }
        }
        @if let Some(backends) = d["backends"].as_object() {
            @for (role, backend) in backends {
                (backend_section(role, backend, queues_of(d, role, backend), &d["settings"]["overridden"]))
            }
        }
    }
}

/// The primary's queues are the top-level `queues`; a fallback carries its own.
fn queues_of<'a>(d: &'a Value, role: &str, backend: &'a Value) -> &'a Value {
    if role == "primary" {
        &d["queues"]
    } else {
        &backend["queues"]
    }
}

/// The overrides in force over another configured value, and those that lapsed at start-up.
fn overrides(s: &Value) -> Markup {
    let listed = |field: &str| {
        s[field]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, o)| (name.clone(), o.clone()))
            .collect::<Vec<_>>()
    };
    let differing: Vec<_> = listed("overridden")
        .into_iter()
        .filter(|(_, o)| o["differs"].as_bool() == Some(true))
        .collect();
    let lapsed = listed("lapsed");
    html! {
        p data-field="overrides_lapse" { "Lapse: " (word(&s["lapse"])) }
        @if differing.is_empty() {
            p data-field="overriding" { "None in force over the configuration." }
        } @else {
            ul data-field="overriding" {
                @for (name, o) in &differing {
                    li { code { (name) } " = " (o["value"].to_string()) " over the configured "
                        (o["configured"].to_string()) " (by " (word(&o["by"])) ")" }
                }
            }
        }
        @if !lapsed.is_empty() {
            ul data-field="lapsed" {
                @for (name, l) in &lapsed {
                    li { code { (name) } " = " (l["value"].to_string()) " lapsed at start-up: made against "
                        (l["made_against"].to_string()) ", configured now " (l["configured"].to_string()) }
                }
            }
        }
    }
}

fn coordination(c: &Value) -> Markup {
    let ok = c["ok"].as_bool().unwrap_or(false);
    html! {
        dl {
            dt { "Mode" } dd data-field="coordination_mode" { (word(&c["mode"])) }
            dt { "Healthy" }
            dd data-field="coordination_ok" {
                span class=(badge(ok)) { (if ok { "yes" } else { "no" }) }
            }
            dt { "Since" } dd { (when(&c["since"]).unwrap_or_else(|| "—".into())) }
            dt { "Last error" } dd data-field="coordination_error" { (or_none(&c["last_error"])) }
        }
    }
}

fn backend_section(role: &str, b: &Value, queues: &Value, overridden: &Value) -> Markup {
    let breaker = word(&b["breaker"]);
    html! {
        section.backend data-backend=(role) aria-label={ "Backend " (role) } {
            h2 { "Backend " (role) ": " (word(&b["kind"])) }
            dl.facts {
                dt { "Breaker" }
                dd data-field="breaker" {
                    span class=(badge(breaker == "closed")) { (breaker) }
                    @if let Some(s) = b["next_trial_in_s"].as_f64() {
                        " · next trial in " (seconds(s))
                    }
                }
                dt { "Sends in flight" }
                dd data-field="in_flight" {
                    (number(&b["sends_in_flight"])) " of " (number(&b["max_in_flight"]))
                }
                dt { "Last probe" } dd { (probe(&b["probe"])) }
            }
            div.queues {
                @if let Some(queues) = queues.as_object() {
                    @for (name, q) in queues {
                        (queue_card(role, name, q, overridden))
                    }
                }
            }
        }
    }
}

fn queue_card(role: &str, name: &str, q: &Value, overridden: &Value) -> Markup {
    let ceiling_set = &overridden[format!("queues.{name}.max_queue_depth")];
    let refusing = q["fail_closed"].as_bool().unwrap_or(false);
    let streak = match q["streak_threshold"].as_u64() {
        Some(t) => format!("{} of {t}", number(&q["consecutive_failures"])),
        None => number(&q["consecutive_failures"]),
    };
    html! {
        article.queue data-backend=(role) data-queue=(name) aria-label={ "Queue " (name) " on " (role) } {
            h3 { "Queue " (name) }
            p.backlog-line {
                "Backlog "
                span.big data-field="backlog" { (or_unknown(&q["backlog"])) }
                " of ceiling "
                span.big data-field="limit" { (number(&q["limit"])) }
                @if ceiling_set.is_object() {
                    " "
                    span.override data-field="limit_overridden" {
                        "(runtime setting by " (word(&ceiling_set["by"])) ")"
                    }
                }
            }
            @if let (Some(backlog), Some(limit)) = (q["backlog"].as_u64(), q["limit"].as_u64()) {
                meter min="0" max=(limit) value=(backlog.min(limit)) high=(limit.saturating_mul(8) / 10)
                    optimum="0" aria-label={ "Backlog of " (name) " against its ceiling" } {
                    (backlog) " of " (limit)
                }
            }
            div.chart data-field="chart" {
                p.help { "The chart of the last 5 minutes is drawn by the page's script." }
            }
            dl {
                dt { "Read failures in a row" } dd data-field="streak" { (streak) }
                dt { "Fail-closed gate" }
                dd data-field="fail_closed_enabled" {
                    (if q["fail_closed_enabled"].as_bool().unwrap_or(false) { "on" } else { "off" })
                }
                dt { "Refusing now" }
                dd data-field="refusing" {
                    @if refusing {
                        span.badge.bad { "yes: refusing sends (capacity unknown)" }
                    } @else {
                        span.badge.ok { "no" }
                    }
                }
                @if let Some(rate) = q["drain_rate_per_s"].as_f64() {
                    dt { "Drain rate (estimated)" }
                    dd data-field="drain_rate" { (format!("{rate:.1}")) " messages/s" }
                }
                @if let Some(until) = q["refusing_until_backlog"].as_u64() {
                    dt { "Refusing until backlog" }
                    dd data-field="refusing_until_backlog" { (until) }
                }
                dt { "Last good read" } dd data-field="last_read_ok_at" { (when(&q["last_read_ok_at"]).unwrap_or_else(|| "never".into())) }
            }
            (tenants(name, &q["tenants"]))
        }
    }
}

/// A row per tenant the queue has answered (none before any send).
fn tenants(queue: &str, tenants: &Value) -> Markup {
    let Some(rows) = tenants.as_array().filter(|rows| !rows.is_empty()) else {
        return html! {};
    };
    html! {
        // Six columns outgrow a narrow card: they scroll within it, not past its edge.
        div.scroll { table.tenants data-field="tenants" {
            caption { "Tenants of " (queue) ", per second over the last 10 s" }
            thead {
                tr {
                    th scope="col" { "Tenant" }
                    th scope="col" { "Weight" }
                    th scope="col" { "Admitted/s" }
                    th scope="col" { "Refused/s" }
                    th scope="col" { "Would refuse/s (shadow)" }
                    th scope="col" { "Share now" }
                }
            }
            tbody {
                @for t in rows {
                    tr data-tenant=(word(&t["name"])) {
                        th scope="row" data-field="tenant_name" { (word(&t["name"])) }
                        td data-field="tenant_weight" { (number(&t["weight"])) }
                        td data-field="tenant_admitted" { (rate(&t["admitted_per_s"])) }
                        td data-field="tenant_refused" { (by_reason(&t["refused_per_s"])) }
                        td data-field="tenant_would_refuse" { (by_reason(&t["would_refuse_per_s"])) }
                        td data-field="tenant_share" { (number(&t["share"])) }
                    }
                }
            }
        } }
    }
}

fn rate(v: &Value) -> String {
    v.as_f64().map_or_else(|| "?".into(), |r| format!("{r:.1}"))
}

/// Rates by reason as `app.js`'s `byReason`: their sum, then each reason above zero
/// (`0.5 (queue_full 0.2, tenant_share 0.3)`).
fn by_reason(v: &Value) -> String {
    let Some(reasons) = v.as_object() else {
        return "?".into();
    };
    let sum: f64 = reasons.values().filter_map(Value::as_f64).sum();
    let some: Vec<String> = reasons
        .iter()
        .filter_map(|(reason, r)| {
            r.as_f64()
                .filter(|r| *r > 0.0)
                .map(|r| format!("{reason} {r:.1}"))
        })
        .collect();
    if some.is_empty() {
        format!("{sum:.1}")
    } else {
        format!("{sum:.1} ({})", some.join(", "))
    }
}

fn drain(d: &Value) -> String {
    match d["remaining_s"].as_f64() {
        Some(left) => format!(
            "draining: {} left, {} in flight",
            seconds(left),
            number(&d["in_flight"])
        ),
        None => "not draining".into(),
    }
}

fn probe(p: &Value) -> String {
    match p["ok"].as_bool() {
        None => "none yet".into(),
        Some(true) => format!("ok at {}", when(&p["at"]).unwrap_or_else(|| "—".into())),
        Some(false) => format!(
            "failed at {}: {}",
            when(&p["at"]).unwrap_or_else(|| "—".into()),
            or_none(&p["error"])
        ),
    }
}

/// Status in words and in a class: the colour only repeats what the text says.
fn badge(good: bool) -> &'static str {
    if good {
        "badge ok"
    } else {
        "badge bad"
    }
}

fn seconds(s: f64) -> String {
    format!("{s:.1} s")
}

fn word(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}

fn number(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        _ => "?".into(),
    }
}

fn or_unknown(v: &Value) -> String {
    if v.is_null() {
        "unknown".into()
    } else {
        number(v)
    }
}

/// An RFC 3339 time to the second (`2026-12-01T06:24:28Z`), as `app.js`'s `when`: the
/// fraction of a second is dropped, the zone kept.
fn when(v: &Value) -> Option<String> {
    let t = v.as_str()?;
    let trimmed = t.find('.').and_then(|dot| {
        let digits = t[dot + 1..].bytes().take_while(u8::is_ascii_digit).count();
        (digits > 0).then(|| format!("{}{}", &t[..dot], &t[dot + 1 + digits..]))
    });
    Some(trimmed.unwrap_or_else(|| t.to_owned()))
}

fn or_none(v: &Value) -> String {
    v.as_str().unwrap_or("none").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Value {
        serde_json::json!({
            "status": "degraded", "gateway_state": "running", "version": "0.1.0", "pid": 7,
            "drain": null,
            "queues": {"requests": {"backlog": 12, "limit": 40, "consecutive_failures": 2,
                "fail_closed": false, "last_read_ok_at": null, "fail_closed_enabled": true,
                "streak_threshold": 3}},
            "backends": {"primary": {"kind": "embedded", "breaker": "open", "next_trial_in_s": 4.3,
                "sends_in_flight": 1, "max_in_flight": 256, "probe": null}},
            "coordination": {"mode": "local", "ok": false, "since": null,
                "last_error": "<script>alert(1)</script>"}
        })
    }

    #[test]
    fn open_mode_shows_the_snapshot_and_escapes_every_value() {
        let html = page(Mode::Open, Some(&sample()), "now").into_string();
        assert!(html.contains(r#"data-queue="requests""#));
        assert!(html.contains(r#"<span class="big" data-field="backlog">12</span>"#));
        assert!(html.contains(r#"data-field="limit">40<"#));
        assert!(html.contains(r#"data-field="streak">2 of 3<"#));
        assert!(html.contains("next trial in 4.3 s"));
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("drain_rate"), "absent fields are not shown");
        assert!(!html.contains("token-form"), "no token form in open mode");
        assert!(html.contains(r#"<label for="set-max_queue_depth">"#));
        assert!(!html.contains("admin-token"), "no admin token in open mode");
    }

    #[test]
    fn fields_added_to_the_health_body_show_when_present() {
        let mut d = sample();
        d["queues"]["requests"]["drain_rate_per_s"] = serde_json::json!(3.3);
        d["queues"]["requests"]["refusing_until_backlog"] = serde_json::json!(30);
        let html = page(Mode::Open, Some(&d), "now").into_string();
        assert!(
            html.contains(r#"data-field="drain_rate">3.3 messages/s<"#),
            "{html}"
        );
        assert!(html.contains(r#"data-field="refusing_until_backlog">30<"#));
    }

    #[test]
    fn a_ceiling_set_at_runtime_is_marked_with_who_set_it() {
        let mut d = sample();
        assert!(!page(Mode::Open, Some(&d), "now")
            .into_string()
            .contains("limit_overridden"));
        d["settings"] = serde_json::json!({"store": "file", "ok": true, "last_error": null,
            "overridden": {"queues.requests.max_queue_depth": {"value": 40,
                "variable": "SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "by": "ops", "at": "t"}}});
        let html = page(Mode::Open, Some(&d), "now").into_string();
        assert!(
            html.contains(r#"data-field="limit_overridden">(runtime setting by ops)<"#),
            "{html}"
        );
    }

    #[test]
    fn overrides_over_the_configuration_and_lapsed_ones_are_listed() {
        let mut d = sample();
        d["settings"] = serde_json::json!({"store": "file", "ok": true, "last_error": null,
            "lapse": "config_change",
            "overridden": {
                "queues.requests.max_queue_depth": {"value": 3, "configured": 500,
                    "differs": true, "made_against": 500, "by": "ops", "at": "t",
                    "variable": "SERVICEBUS_SEND_MAX_QUEUE_DEPTH"},
                "queues.requests.fail_closed": {"value": false, "configured": false,
                    "differs": false, "made_against": true, "by": "ops", "at": "t",
                    "variable": "SERVICEBUS_SEND_FAILCLOSED"}},
            "lapsed": {"queues.requests.depth_ttl_ms": {"value": 50, "configured": 900,
                "made_against": 1000, "by": "ops", "at": "t",
                "variable": "SENDGATE_DEPTH_TTL_MS"}}});
        let html = page(Mode::Open, Some(&d), "now").into_string();
        assert!(
            html.contains(
                "<code>queues.requests.max_queue_depth</code> = 3 over the configured 500 (by ops)"
            ),
            "{html}"
        );
        assert!(
            !html.contains("<code>queues.requests.fail_closed</code>"),
            "equal to the configuration: not listed"
        );
        assert!(html.contains("<code>queues.requests.depth_ttl_ms</code> = 50 lapsed at start-up: made against 1000, configured now 900"), "{html}");
        assert!(html.contains(r#"data-field="overrides_lapse">Lapse: config_change<"#));
    }

    #[test]
    fn a_queue_shows_a_row_per_tenant_with_its_rates_by_reason() {
        let mut d = sample();
        d["queues"]["requests"]["tenants"] = serde_json::json!([
            {"name": "web<b>", "weight": 3, "share": 0.75, "admitted_per_s": 2.5,
             "refused_per_s": {"criticality": 0.0, "queue_full": 0.2, "tenant_share": 0.3},
             "would_refuse_per_s": {"criticality": 0.0, "tenant_share": 0.0}}
        ]);
        let html = page(Mode::Open, Some(&d), "now").into_string();
        assert!(
            html.contains(r#"<tr data-tenant="web&lt;b&gt;">"#),
            "{html}"
        );
        assert!(html.contains(r#"data-field="tenant_weight">3<"#));
        assert!(html.contains(r#"data-field="tenant_admitted">2.5<"#));
        assert!(
            html.contains(r#"data-field="tenant_refused">0.5 (queue_full 0.2, tenant_share 0.3)<"#)
        );
        assert!(html.contains(r#"data-field="tenant_would_refuse">0.0<"#));
        assert!(html.contains(r#"data-field="tenant_share">0.75<"#));
        // No tenant answered yet: no table.
        let html = page(Mode::Open, Some(&sample()), "now").into_string();
        assert!(!html.contains("data-field=\"tenants\""));
    }

    #[test]
    fn times_are_shown_to_the_second() {
        let t = |s: &str| when(&Value::from(s));
        assert_eq!(
            t("2026-12-01T06:24:28.536196966Z").unwrap(),
            "2026-12-01T06:24:28Z"
        );
        assert_eq!(
            t("2026-12-01T06:24:28.5+01:00").unwrap(),
            "2026-12-01T06:24:28+01:00"
        );
        assert_eq!(t("2026-12-01T06:24:28Z").unwrap(), "2026-12-01T06:24:28Z");
        assert_eq!(when(&Value::Null), None);
    }

    #[test]
    fn with_keys_the_page_is_the_frame_and_the_form_only() {
        let html = page(Mode::Keys, None, "now").into_string();
        assert!(html.contains(r#"<label for="token">Observer token</label>"#));
        assert!(html.contains(r#"<label for="admin-token">Admin token</label>"#));
        assert!(html.contains(r#"type="password""#));
        assert!(!html.contains("data-queue"));
        assert!(html.contains(r#"aria-live="polite""#));
        assert!(!html.contains("<script>"), "no inline script: {html}");
        assert!(!html.contains("style="), "no inline style");
    }
}
