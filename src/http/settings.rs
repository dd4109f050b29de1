//! `GET`/`PATCH /admin/settings` and `POST /admin/breakers/{backend}` (role `admin`): the
//! runtime settings (see `src/settings/`) and an operator's hand on a breaker.
//!
//! Like `POST /admin/drain`, the changing routes need `Content-Type: application/json`
//! (checked after authentication): a browser cannot send that cross-site without a CORS
//! preflight, which sendgate never answers.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use sendgate_wire::ErrorBody;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::auth::Permission;
use super::context::RequestContext;
use super::errors::{ApiError, FieldError, Problem};
use super::schema;
use super::state::{authorize, AppState};
use crate::admission::breaker::Command;
use crate::admission::Dispatcher;
use crate::settings::overrides::{Key, Overrides, Patch, PatchError, QueueField};
use crate::settings::{default_value, SettingsError};

/// The largest PATCH or breaker body read.
const MAX_ADMIN_BODY: usize = 64 * 1024;

/// One setting: the value in force, the variable's default, and the override if any.
#[derive(Serialize, ToSchema)]
pub struct SettingView {
    /// In force now: the override's value, else the variable's.
    value: Value,
    /// The variable's value (restored by a PATCH with `null`).
    default: Value,
    /// The variable it overrides.
    variable: &'static str,
    /// `null` unless overridden at runtime.
    overridden: Option<Overridden>,
}

/// Who overrode a value, and when.
#[derive(Serialize, ToSchema)]
pub struct Overridden {
    /// The API key's name (`anonymous` without keys).
    by: String,
    /// RFC 3339.
    #[schema(format = DateTime)]
    at: String,
}

/// One queue's settings.
#[derive(Serialize, ToSchema)]
pub struct QueueSettings {
    /// The backlog ceiling (`SERVICEBUS_SEND_MAX_QUEUE_DEPTH`): a whole number ≥ 1.
    max_queue_depth: SettingView,
    /// The fail-closed gate (`SERVICEBUS_SEND_FAILCLOSED`): true or false.
    fail_closed: SettingView,
    /// The streak at which the gate refuses (`SERVICEBUS_SEND_FAILCLOSED_STREAK`): ≥ 1.
    fail_closed_streak: SettingView,
    /// How long one depth read is reused (`SENDGATE_DEPTH_TTL_MS`), 0–3600000.
    depth_ttl_ms: SettingView,
    /// The fraction of the ceiling a sheddable send may fill (`SENDGATE_SHED_AT_SHEDDABLE`):
    /// above 0, at most 1, at most `shed_at_default`.
    shed_at_sheddable: SettingView,
    /// The fraction of the ceiling a default send may fill (`SENDGATE_SHED_AT_DEFAULT`).
    shed_at_default: SettingView,
    /// The fraction of the ceiling from which the queue counts as contended
    /// (`SENDGATE_FAIR_SHARE_AT`).
    fair_share_at: SettingView,
}

/// `GET /admin/settings`, and a PATCH's answer.
#[derive(Serialize, ToSchema)]
pub struct SettingsView {
    /// By queue name.
    queues: BTreeMap<String, QueueSettings>,
    /// The pinned backend (`SENDGATE_FORCE_BACKEND`): `primary`, `fallback` or `null`.
    force_backend: SettingView,
    /// Where overrides are kept: `file` (`SENDGATE_DATA_DIR/settings.json`) or `redis`.
    #[schema(schema_with = schema::settings_store)]
    store: &'static str,
    /// A PATCH's answer: the settings it changed (flat names, e.g.
    /// `queues.requests.max_queue_depth`); empty for a GET or a change to the same values.
    changed: Vec<String>,
    request_id: String,
}

/// A PATCH body. Every member is optional: absent = unchanged, `null` = remove the override
/// (back to the variable's value), a value = override.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct SettingsPatch {
    /// By queue name; each a [`QueuePatch`].
    #[schema(nullable = false)]
    queues: Option<BTreeMap<String, QueuePatch>>,
    /// `primary`, `fallback` (needs a fallback backend) or `null`.
    #[schema(schema_with = schema::force_backend)]
    force_backend: Option<String>,
}

/// One queue's changes.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct QueuePatch {
    /// Accepted up to 2^64 − 1; described up to 2^53 − 1, the largest whole number every
    /// JSON reader holds exactly.
    #[schema(minimum = 1, maximum = 9007199254740991_u64)]
    max_queue_depth: Option<u64>,
    fail_closed: Option<bool>,
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    fail_closed_streak: Option<u32>,
    #[schema(minimum = 0, maximum = 3600000)]
    depth_ttl_ms: Option<u64>,
    /// Above 0, at most 1; with it in force, at most the queue's `shed_at_default` (else 400).
    #[schema(exclusive_minimum = 0, maximum = 1)]
    shed_at_sheddable: Option<f64>,
    /// Above 0, at most 1; at least the queue's `shed_at_sheddable` (else 400).
    #[schema(exclusive_minimum = 0, maximum = 1)]
    shed_at_default: Option<f64>,
    #[schema(exclusive_minimum = 0, maximum = 1)]
    fair_share_at: Option<f64>,
}

fn view(state: &AppState, changed: Vec<String>, request_id: &str) -> SettingsView {
    let settings = &state.control.settings;
    let overrides = settings.overrides();
    let d = &state.dispatcher;
    let one = |key: Key| setting_view(&overrides, d, &key);
    let queues = settings
        .scope()
        .queues
        .iter()
        .map(|q| {
            let f = |field| one(Key::Queue(q.clone(), field));
            (
                q.to_string(),
                QueueSettings {
                    max_queue_depth: f(QueueField::MaxQueueDepth),
                    fail_closed: f(QueueField::FailClosed),
                    fail_closed_streak: f(QueueField::FailClosedStreak),
                    depth_ttl_ms: f(QueueField::DepthTtlMs),
                    shed_at_sheddable: f(QueueField::ShedAtSheddable),
                    shed_at_default: f(QueueField::ShedAtDefault),
                    fair_share_at: f(QueueField::FairShareAt),
                },
            )
        })
        .collect();
    SettingsView {
        queues,
        force_backend: one(Key::ForceBackend),
        store: settings.store_kind(),
        changed,
        request_id: request_id.to_owned(),
    }
}

fn setting_view(overrides: &Overrides, dispatcher: &Dispatcher, key: &Key) -> SettingView {
    let default = default_value(key, dispatcher);
    let over = overrides.get(key);
    SettingView {
        value: over
            .as_ref()
            .map_or_else(|| default.clone(), |(v, _)| v.clone()),
        default,
        variable: key.variable().name,
        overridden: over.map(|(_, stamp)| Overridden {
            by: stamp.by.clone(),
            at: stamp.at.clone(),
        }),
    }
}

#[utoipa::path(
    get,
    path = "/admin/settings",
    tag = "admin",
    operation_id = "get_settings",
    summary = "The runtime settings: each value in force, its variable's default and any override (role admin)",
    responses(
        (status = 200, description = "The settings.", body = SettingsView),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the admin role), or `forbidden_host` (open mode).", body = ErrorBody),
    )
)]
pub async fn get_settings(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(
        &req,
        &context,
        &state.edge.auth,
        Permission::Administer,
        "read the runtime settings",
    )
    .await?;
    Ok(HttpResponse::Ok().json(view(&state, Vec::new(), context.id().as_str())))
}

#[utoipa::path(
    patch,
    path = "/admin/settings",
    tag = "admin",
    operation_id = "patch_settings",
    summary = "Override runtime settings, in force from the next send (role admin)",
    description = "A merge patch: absent = unchanged, `null` = back to the variable's value, a value = override. Validated whole before anything changes; stored (data directory, or the fleet's Redis) before it is in force.",
    request_body(content = SettingsPatch, content_type = "application/json"),
    responses(
        (status = 200, description = "In force; `changed` names what changed.", body = SettingsView),
        (status = 400, description = "`invalid_request`: not JSON, or `errors` names each bad field.", body = ErrorBody),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the admin role, or the patch names a queue outside its scope, or `force_backend` and its scope is not every queue), or `forbidden_host` (open mode).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`: the body names a queue this gateway does not serve.", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive within `SENDGATE_BODY_TIMEOUT_MS`; nothing was changed.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: over 64 KiB.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not `application/json` (checked after authentication).", body = ErrorBody),
        (status = 503, description = "`settings_unavailable`: the change could not be stored; nothing changed.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds, at least 1."))),
    )
)]
pub async fn patch_settings(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(
        &req,
        &context,
        &state.edge.auth,
        Permission::Administer,
        "change the runtime settings",
    )
    .await?;
    let body = json_body(&req, &state, payload)
        .await
        .map_err(|p| context.error(p))?;
    let settings = &state.control.settings;
    let patch = Patch::parse(&body, settings.scope()).map_err(|e| {
        context.error(match e {
            PatchError::UnknownQueue(queue) => Problem::UnknownQueue { queue },
            PatchError::Invalid(errors) => Problem::InvalidRequest { errors },
        })
    })?;
    // An admin key scoped to some queues names only theirs (an empty object too); the
    // forced backend serves every queue. Checked for the whole patch before any of it applies.
    if !patch
        .queues
        .iter()
        .all(|queue| principal.may_use_queue(queue))
    {
        return Err(context.error(Problem::Forbidden {
            action: "change the settings of a queue outside this key's scope",
        }));
    }
    if patch.changes.contains_key(&Key::ForceBackend) && !principal.may_use_every_queue() {
        return Err(context.error(Problem::Forbidden {
            action: "pin the backend of every queue (this key's scope is not every queue)",
        }));
    }
    let changed = settings
        .patch(&state.dispatcher, &patch, &principal.name)
        .await
        .map_err(|e| {
            context.error(match e {
                SettingsError::Patch(PatchError::UnknownQueue(queue)) => {
                    Problem::UnknownQueue { queue }
                }
                SettingsError::Patch(PatchError::Invalid(errors)) => {
                    Problem::InvalidRequest { errors }
                }
                SettingsError::Store(e) => Problem::SettingsUnavailable {
                    detail: e.to_string(),
                },
            })
        })?;
    let changed = changed.iter().map(|c| c.key.flat()).collect();
    Ok(HttpResponse::Ok().json(view(&state, changed, context.id().as_str())))
}

/// `POST /admin/breakers/{backend}`'s body.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BreakerCommand {
    /// `open`: hold it open (no send, no trial) until `close` or `reset`; `close`: closed
    /// now, the window's outcomes kept; `reset`: closed now, the window forgotten.
    #[schema(schema_with = schema::breaker_action)]
    action: String,
}

/// `POST /admin/breakers/{backend}`'s answer.
#[derive(Serialize, ToSchema)]
pub struct BreakerView {
    /// `primary` or `fallback`.
    backend: String,
    #[schema(schema_with = schema::breaker_state)]
    breaker: &'static str,
    /// Held open by an operator (no trial until `close` or `reset`).
    held: bool,
    request_id: String,
}

#[utoipa::path(
    post,
    path = "/admin/breakers/{backend}",
    tag = "admin",
    operation_id = "breaker",
    summary = "Open (hold), close or reset a backend's circuit breaker on this replica (role admin)",
    params(("backend" = String, Path, description = "`primary`, or `fallback` when one is configured")),
    request_body(content = BreakerCommand, content_type = "application/json"),
    responses(
        (status = 200, description = "Done; the breaker's state now.", body = BreakerView),
        (status = 400, description = "`invalid_request`: not JSON, or no known `action`.", body = ErrorBody),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the admin role, or its scope is not every queue: a breaker serves them all), or `forbidden_host` (open mode).", body = ErrorBody),
        (status = 404, description = "`not_found`: no such backend here.", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive within `SENDGATE_BODY_TIMEOUT_MS`; nothing was changed.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: over 64 KiB.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not `application/json` (checked after authentication).", body = ErrorBody),
    )
)]
pub async fn breaker(
    req: HttpRequest,
    context: RequestContext,
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let principal = authorize(
        &req,
        &context,
        &state.edge.auth,
        Permission::Administer,
        "operate a circuit breaker",
    )
    .await?;
    if !principal.may_use_every_queue() {
        return Err(context.error(Problem::Forbidden {
            action: "operate a circuit breaker (it serves every queue; this key's scope is not every queue)",
        }));
    }
    if !super::send::is_json(&req) {
        return Err(context.error(Problem::UnsupportedMediaType));
    }
    let backend = path.into_inner();
    let Some(lane) = state.dispatcher.lane(&backend) else {
        return Err(context.error(Problem::UnknownBackend { backend }));
    };
    let body = json_body(&req, &state, payload)
        .await
        .map_err(|p| context.error(p))?;
    let invalid = |msg: &str| {
        context.error(Problem::InvalidRequest {
            errors: vec![FieldError::new(&["body", "action"], msg)],
        })
    };
    let command: BreakerCommand = serde_json::from_value(body)
        .map_err(|_| invalid("expected {\"action\": \"open\" | \"close\" | \"reset\"}"))?;
    let command = match command.action.as_str() {
        "open" => Command::Open,
        "close" => Command::Close,
        "reset" => Command::Reset,
        _ => return Err(invalid("expected open, close or reset")),
    };
    lane.breaker.command(command, &principal.name);
    Ok(HttpResponse::Ok().json(BreakerView {
        backend,
        breaker: lane.breaker.state().as_str(),
        held: lane.breaker.held(),
        request_id: context.id().as_str().to_owned(),
    }))
}

/// The body as JSON, after the content-type check (415), within [`MAX_ADMIN_BODY`] and the
/// body's deadline (`SENDGATE_BODY_TIMEOUT_MS`, as for a send: a client that stops mid-body
/// must not hold its request open).
async fn json_body(
    req: &HttpRequest,
    state: &AppState,
    payload: web::Payload,
) -> Result<Value, Problem> {
    if !super::send::is_json(req) {
        return Err(Problem::UnsupportedMediaType);
    }
    let read = super::send::read_body(payload, super::send::announced_length(req), MAX_ADMIN_BODY);
    let bytes = tokio::time::timeout(state.edge.limits.body_timeout, read)
        .await
        .unwrap_or(Err(Problem::RequestTimeout))?;
    serde_json::from_slice(&bytes).map_err(|e| Problem::InvalidRequest {
        errors: vec![FieldError::new(&["body"], format!("not valid JSON: {e}"))],
    })
}
