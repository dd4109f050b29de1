//! The operator's status page: `GET /` and its two assets, all embedded in the binary.
//!
//! The page is plain HTML rendered on the server (`render.rs`), so it shows the current
//! snapshot without JavaScript in open mode; its script (`app.js`) then polls
//! `/health/detailed` every 2 s and redraws it, with a chart of each queue's backlog. Like
//! `/health`, nothing here calls the broker: the snapshot is what the gateway already knows.
//!
//! With keys on, a plain GET carries no token, so the page is the frame and a token form;
//! the script sends the observer token as `Authorization: Bearer` to `/health/detailed`
//! (never in a URL). The page needs no token itself: it holds no data.
//!
//! Headers: a Content-Security-Policy that allows scripts, styles and requests from this
//! origin only (no inline script or style, no form submission, no framing), `nosniff`,
//! and `no-store` on the HTML, which may hold a snapshot.

mod render;

use actix_web::http::header::{
    CacheControl, CacheDirective, ContentType, CONTENT_SECURITY_POLICY, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS,
};
use actix_web::{web, HttpResponse, HttpResponseBuilder};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::state::AppState;
use render::Mode;
pub use render::{SCRIPT_PATH, STYLE_PATH};

const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

/// Same origin only; nothing inline; forms may not submit (the token form is the script's);
/// the page may not be framed.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; \
    base-uri 'none'";

#[utoipa::path(
    get,
    path = "/",
    tag = "console",
    operation_id = "console",
    summary = "The operator's status page (HTML; its script and style are /console/app.js and /console/style.css)",
    description = "In open mode the page holds the current `/health/detailed` snapshot, rendered on the server; with keys on it holds no data and asks for an observer token, which its script sends to `/health/detailed` as a bearer token. Never calls the broker.",
    security(()),
    responses(
        (status = 200, description = "The page.", body = String, content_type = "text/html",
            headers(
                ("Content-Security-Policy" = String, description = "Scripts, styles and requests from this origin only; nothing inline."),
                ("X-Content-Type-Options" = String, description = "`nosniff`"),
                ("Cache-Control" = String, description = "`no-store`"),
            )),
        (status = 403, description = "`forbidden_host` (open mode, a Host that is not loopback).", body = sendgate_wire::ErrorBody),
    )
)]
pub async fn page(state: web::Data<AppState>) -> HttpResponse {
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default();
    let markup = if state.edge.auth.is_open() {
        let snapshot = serde_json::to_value(super::health::snapshot(&state)).ok();
        render::page(Mode::Open, snapshot.as_ref(), &now)
    } else {
        render::page(Mode::Keys, None, &now)
    };
    guarded(HttpResponse::Ok())
        .insert_header(CacheControl(vec![CacheDirective::NoStore]))
        .content_type(ContentType::html())
        .body(markup.into_string())
}

pub async fn script() -> HttpResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn stylesheet() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE)
}

/// An asset holds no data, but it changes with the binary: revalidate, never guess.
fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    guarded(HttpResponse::Ok())
        .insert_header(CacheControl(vec![CacheDirective::NoCache]))
        .content_type(content_type)
        .body(body)
}

fn guarded(mut builder: HttpResponseBuilder) -> HttpResponseBuilder {
    builder
        .insert_header((CONTENT_SECURITY_POLICY, CSP))
        .insert_header((X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((REFERRER_POLICY, "no-referrer"));
    builder
}
