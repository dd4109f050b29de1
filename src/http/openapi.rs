//! The OpenAPI 3.1 document, generated from the code: the routes' `#[utoipa::path]`
//! annotations (beside each handler) and the bodies' `ToSchema` (the wire types, and the
//! health and admin bodies). `GET /openapi.json` serves the document of the gateway that
//! serves it: with API keys, every route that needs a token declares the bearer scheme;
//! with Entra ID callers, the OpenID Connect scheme with the directory's discovery URL
//! (both, either one satisfying, when keys are on as well); open, nothing declares a
//! security requirement (no route asks for one). `sendgate openapi` prints the keys
//! document, and `docs/openapi.json` is its committed copy (tests/api/openapi.rs keeps the
//! three equal).
//!
//! The route is open, like `/health/live`: it describes the API, which is public
//! (docs/contract.md), and a client generator must be able to read it without a key.

use actix_web::{web, HttpResponse};
use serde_json::Value;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};

use super::auth::Authenticator;
use utoipa::{Modify, OpenApi};

use super::headers::spelling;
use super::schema;
use super::state::AppState;
use crate::admission::BackendRole;
use crate::domain::Field;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sendgate",
        description = "An HTTP gateway in front of a message queue that refuses work the queue cannot take. The promise in words is docs/contract.md; this document is generated from the code.",
        license(name = "MIT", identifier = "MIT"),
    ),
    servers((url = "http://127.0.0.1:8080", description = "the default SENDGATE_LISTEN")),
    paths(
        super::send::send_message,
        super::batch::send_batch,
        super::health::live,
        super::health::ready,
        super::health::detailed,
        super::metrics::metrics,
        super::admin::drain,
        super::settings::get_settings,
        super::settings::patch_settings,
        super::settings::breaker,
        openapi_json,
        super::console::page,
    ),
    // `backends` is described by `schema::backends` (schema_with), which only refers to
    // BackendHealth by name: registered here, or the reference would dangle.
    components(schemas(super::health::BackendHealth)),
    // Every route needs a bearer token when keys are configured, unless it says otherwise.
    security(("bearer" = [])),
    modifiers(&Bearer),
    tags(
        (name = "send", description = "docs/contract.md sections 1 and 2"),
        (name = "health", description = "docs/contract.md section 3"),
        (name = "observability", description = "docs/contract.md section 6"),
        (name = "admin", description = "docs/contract.md sections 3 and 5"),
        (name = "meta", description = "this document"),
        (name = "console", description = "the operator's status page (docs/contract.md section 6)"),
    )
)]
struct ApiDoc;

/// The `bearer` scheme of contract section 5.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut scheme = Http::new(HttpAuthScheme::Bearer);
        scheme.description = Some(
            "An API key's token (`SENDGATE_API_KEYS_FILE`). Without a keys file the gateway runs open and no route needs one."
                .into(),
        );
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// Headers that are on the answers where the document names them, always: `required`,
/// which utoipa 5's `Header` cannot say, is added to each.
const ALWAYS_SET: [&str; 5] = [
    sendgate_wire::headers::RETRY_AFTER,
    "WWW-Authenticate",
    // The status page's (http/console).
    "Content-Security-Policy",
    "X-Content-Type-Options",
    "Cache-Control",
];

/// Which gateway a document describes: how its callers authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// No keys file: no route needs a token.
    Open,
    /// `SENDGATE_API_KEYS_FILE`: bearer tokens.
    Keys,
    /// Entra ID access tokens (`SENDGATE_ENTRA_TENANT_ID`): the `entra` OpenID Connect
    /// scheme, with the directory's discovery URL; with `and_keys`, API keys as well, and
    /// either scheme satisfies a route.
    Entra {
        discovery_url: String,
        and_keys: bool,
    },
}

impl Mode {
    /// The document a gateway authenticating with `auth` serves.
    pub fn of(auth: &Authenticator) -> Self {
        match auth.entra() {
            Some(verifier) => Self::Entra {
                discovery_url: verifier.keys().discovery_url().to_owned(),
                and_keys: auth.accepts_keys(),
            },
            None if auth.is_open() => Self::Open,
            None => Self::Keys,
        }
    }
}

/// The keys document of a gateway without a fallback backend, as pretty JSON with a final
/// newline: byte for byte `docs/openapi.json`.
pub fn json() -> String {
    json_for(Mode::Keys)
}

/// The document of a gateway in `mode` without a fallback backend, as pretty JSON with a
/// final newline.
pub fn json_for(mode: Mode) -> String {
    json_with(mode, false)
}

/// The document of a gateway in `mode`, with or without a `fallback` backend.
///
/// Object keys come out sorted (serde_json's map), so the committed file diffs stably.
pub fn json_with(mode: Mode, fallback: bool) -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or(Value::Null);
    finish(&mut doc);
    attribute_rules(&mut doc);
    backends(&mut doc, fallback);
    match mode {
        Mode::Open => open(&mut doc),
        Mode::Keys => {}
        Mode::Entra {
            discovery_url,
            and_keys,
        } => entra(&mut doc, &discovery_url, and_keys),
    }
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

/// An open gateway's document: no security requirement anywhere (top level or per
/// operation), no scheme to refer to, and no `401` answer (an open gateway never gives
/// one), so a client or a fuzzer is told the truth, that no route asks for a token.
fn open(doc: &mut Value) {
    let Some(root) = doc.as_object_mut() else {
        return;
    };
    root.remove("security");
    if let Some(components) = root.get_mut("components").and_then(Value::as_object_mut) {
        components.remove("securitySchemes");
    }
    let Some(paths) = root.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for operation in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(Value::as_object_mut)
    {
        operation.remove("security");
        if let Some(responses) = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
        {
            responses.remove("401");
        }
    }
}

/// An Entra ID gateway's document: the `entra` scheme (OpenID Connect, the discovery URL)
/// required where the keys document requires `bearer`; with keys on too, either of the
/// two (a list of alternatives, OpenAPI 3.1 §4.8.30), else `entra` alone.
fn entra(doc: &mut Value, discovery_url: &str, and_keys: bool) {
    let Some(root) = doc.as_object_mut() else {
        return;
    };
    let bearer = serde_json::json!({"bearer": []});
    let entra = serde_json::json!({"entra": []});
    let required = if and_keys {
        Value::Array(vec![bearer.clone(), entra.clone()])
    } else {
        Value::Array(vec![entra.clone()])
    };
    let replace = |security: &mut Value| {
        if security.as_array().is_some_and(|s| s.contains(&bearer)) {
            *security = required.clone();
        }
    };
    if let Some(security) = root.get_mut("security") {
        replace(security);
    }
    if let Some(components) = root.get_mut("components").and_then(Value::as_object_mut) {
        let schemes = components
            .entry("securitySchemes")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(schemes) = schemes.as_object_mut() {
            if !and_keys {
                schemes.remove("bearer");
            }
            schemes.insert(
                "entra".into(),
                serde_json::json!({
                    "type": "openIdConnect",
                    "openIdConnectUrl": discovery_url,
                    "description": "A Microsoft Entra ID access token for this API (`aud`: SENDGATE_ENTRA_AUDIENCE) carrying the app role Sendgate.Sender, Sendgate.Observer or Sendgate.Admin, sent as `Authorization: Bearer`.",
                }),
            );
        }
    }
    let Some(paths) = root.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for operation in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(Value::as_object_mut)
    {
        if let Some(security) = operation.get_mut("security") {
            replace(security);
        }
    }
}

/// What the annotations cannot say: every answer's `X-Request-Id` (set by
/// `context.rs` on all of them), `required` on the headers that are always there,
/// `Retry-After`'s floor of 1, and the transport's `431` on every operation.
fn finish(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    let operations = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let Some(responses) = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        for response in responses.values_mut().filter_map(Value::as_object_mut) {
            let headers = response
                .entry("headers")
                .or_insert_with(|| Value::Object(Default::default()));
            let Some(headers) = headers.as_object_mut() else {
                continue;
            };
            headers.insert(
                spelling::REQUEST_ID.to_owned(),
                serde_json::json!({
                    "description": "This request's id: the client's valid X-Request-Id, or one the gateway made.",
                    "required": true,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[ -~]{1,128}$"},
                }),
            );
            for name in ALWAYS_SET {
                if let Some(header) = headers.get_mut(name).and_then(Value::as_object_mut) {
                    header.insert("required".into(), Value::Bool(true));
                    if name == sendgate_wire::headers::RETRY_AFTER {
                        if let Some(schema) =
                            header.get_mut("schema").and_then(Value::as_object_mut)
                        {
                            schema.insert("minimum".into(), Value::from(1));
                        }
                    }
                }
            }
        }
        responses.insert("431".into(), head_too_large());
    }
}

/// The attributes' rules the annotations cannot carry (contract section 1, "Message
/// attributes"): `Message-Properties` holds JSON, so the parameter states it as `content`
/// (OpenAPI 3.1 §4.8.12.1) with the `MessageProperties` schema, which a batch entry's
/// `properties` names as well; `Message-Scheduled-Enqueue-Time`'s schema is a batch entry's
/// `scheduled_enqueue_time`'s, pattern and all.
fn attribute_rules(doc: &mut Value) {
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.insert(
            schema::MESSAGE_PROPERTIES.to_owned(),
            schema::message_properties(),
        );
    }
    let properties = serde_json::json!({"application/json": {"schema": {
        "$ref": format!("#/components/schemas/{}", schema::MESSAGE_PROPERTIES),
    }}});
    let scheduled = serde_json::to_value(schema::scheduled_enqueue_time()).unwrap_or_default();
    for param in parameters(doc, "/v1/queues/{queue}/messages", "post") {
        let name = param.get("name").and_then(Value::as_str);
        if name == Some(Field::Properties.header_name()) {
            param.remove("schema");
            param.insert("content".into(), properties.clone());
        } else if name == Some(Field::ScheduledEnqueueTime.header_name()) {
            param.insert("schema".into(), scheduled.clone());
        }
    }
}

/// The backends this gateway has: `fallback` is offered (to `force_backend`, to the
/// breakers' route) only by a gateway with one, since any other gateway refuses it (400,
/// 404): a client is not told of a value it cannot use.
fn backends(doc: &mut Value, fallback: bool) {
    let mut names = vec![Value::from(BackendRole::Primary.as_str())];
    if fallback {
        names.push(Value::from(BackendRole::Fallback.as_str()));
    }
    if let Some(force) = doc
        .pointer_mut("/components/schemas/SettingsPatch/properties/force_backend")
        .and_then(Value::as_object_mut)
    {
        let mut values = names.clone();
        values.push(Value::Null);
        force.insert("enum".into(), Value::Array(values));
    }
    for param in parameters(doc, "/admin/breakers/{backend}", "post") {
        if param.get("name").and_then(Value::as_str) == Some("backend") {
            param.insert(
                "schema".into(),
                serde_json::json!({"type": "string", "enum": names}),
            );
        }
    }
}

/// The parameters of one operation, as objects.
fn parameters<'d>(
    doc: &'d mut Value,
    path: &str,
    method: &str,
) -> impl Iterator<Item = &'d mut serde_json::Map<String, Value>> {
    doc.get_mut("paths")
        .and_then(|paths| paths.get_mut(path))
        .and_then(|item| item.get_mut(method))
        .and_then(|operation| operation.get_mut("parameters"))
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// The transport's answer to a head past `SENDGATE_MAX_HEAD_BYTES` or past the budget of
/// all heads (docs/contract.md section 1): written before any route runs, so it has no
/// body and no `X-Request-Id`, on every operation alike.
fn head_too_large() -> Value {
    serde_json::json!({
        "description": "The request head (request line and headers) is larger than `SENDGATE_MAX_HEAD_BYTES`, or unfinished heads hold `SENDGATE_MAX_BUFFERED_HEAD_BYTES` and this one arrived longest: no body, and the connection closes.",
    })
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    operation_id = "openapi",
    summary = "This document (OpenAPI 3.1)",
    security(()),
    responses(
        (status = 200, description = "The document of this gateway: with API keys, the same bytes as docs/openapi.json; open, the same without any security requirement; with Entra ID callers, the OpenID Connect scheme `entra` (its discovery URL) instead of or beside `bearer`.", body = Object, content_type = "application/json"),
        (status = 403, description = "`forbidden_host` (open mode, a Host that is not loopback).", body = sendgate_wire::ErrorBody),
    )
)]
pub async fn openapi_json(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(state.openapi.clone())
}

/// The document a gateway in `mode` serves, made once at start-up: the route is open and a
/// document is ~100 KB, so each answer shares the one copy (a `Bytes` clone counts a
/// reference; a `String`'s would copy it per request).
pub fn served(mode: Mode, fallback: bool) -> bytes::Bytes {
    bytes::Bytes::from(json_with(mode, fallback))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_serves_its_own_document() {
        for mode in [Mode::Open, Mode::Keys] {
            assert_eq!(served(mode.clone(), false), json_for(mode).into_bytes());
        }
        assert_ne!(served(Mode::Open, false), served(Mode::Keys, false));
    }

    #[test]
    fn every_answer_a_route_writes_names_its_request_id() {
        let doc: Value = serde_json::from_str(&json()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut answers = 0;
        for item in doc["paths"].as_object().unwrap().values() {
            for operation in item.as_object().unwrap().values() {
                let responses = operation["responses"].as_object().unwrap();
                for (status, response) in responses {
                    if status == "431" {
                        continue;
                    }
                    assert_eq!(response["headers"]["X-Request-Id"]["required"], true);
                    answers += 1;
                }
            }
        }
        assert!(answers > 20, "{answers}");
    }

    #[test]
    fn the_open_document_declares_no_security_and_the_keys_one_bearer_on_its_routes() {
        let keys: Value = serde_json::from_str(&json_for(Mode::Keys)).unwrap();
        let open: Value = serde_json::from_str(&json_for(Mode::Open)).unwrap();
        assert_eq!(keys["security"], serde_json::json!([{"bearer": []}]));
        assert!(keys["components"]["securitySchemes"]["bearer"].is_object());
        let openapi = &keys["paths"]["/openapi.json"]["get"]["security"];
        assert_eq!(
            *openapi,
            serde_json::json!([{}]),
            "an open route of the keys gateway"
        );
        let send = &keys["paths"]["/v1/queues/{queue}/messages"]["post"]["responses"];
        assert!(send["401"].is_object());
        let send = &open["paths"]["/v1/queues/{queue}/messages"]["post"]["responses"];
        assert!(send.get("401").is_none(), "open: no 401");
        assert!(send["201"].is_object());
        let text = json_for(Mode::Open);
        assert!(
            !text.contains("\"security\""),
            "open: no requirement anywhere"
        );
        assert!(open["components"].get("securitySchemes").is_none());
        // Otherwise the same document.
        assert_eq!(
            open["paths"].as_object().unwrap().len(),
            keys["paths"].as_object().unwrap().len()
        );
    }

    #[test]
    fn the_entra_document_declares_openid_connect_with_or_instead_of_bearer() {
        let url = "https://login.example/t/v2.0/.well-known/openid-configuration";
        let keys: Value = serde_json::from_str(&json_for(Mode::Keys)).unwrap();
        for and_keys in [false, true] {
            let mode = Mode::Entra {
                discovery_url: url.into(),
                and_keys,
            };
            let doc: Value = serde_json::from_str(&json_for(mode)).unwrap();
            let schemes = &doc["components"]["securitySchemes"];
            assert_eq!(schemes["entra"]["type"], "openIdConnect");
            assert_eq!(schemes["entra"]["openIdConnectUrl"], url);
            let either = if and_keys {
                assert!(schemes["bearer"].is_object());
                serde_json::json!([{"bearer": []}, {"entra": []}])
            } else {
                assert!(schemes.get("bearer").is_none(), "no keys: no bearer scheme");
                serde_json::json!([{"entra": []}])
            };
            assert_eq!(doc["security"], either);
            let send = &doc["paths"]["/v1/queues/{queue}/messages"]["post"];
            assert!(send["responses"]["401"].is_object());
            // Open routes stay open; the rest is the keys document.
            assert_eq!(
                doc["paths"]["/openapi.json"]["get"]["security"],
                serde_json::json!([{}])
            );
            assert_eq!(doc["paths"], keys["paths"]);
            let text = serde_json::to_string(&doc).unwrap();
            assert_eq!(text.contains("\"bearer\""), and_keys, "{and_keys}");
        }
    }

    /// Issue 40, item 10: schema-valid attributes the gateway refused (`Message-Properties:
    /// ""`, `"scheduled_enqueue_time": ""`). The header's JSON is stated as `content`, with
    /// the batch entry's schema; both scheduled times have the pattern.
    #[test]
    fn the_attributes_rules_are_stated_in_the_header_and_the_batch_entry_alike() {
        let doc: Value = serde_json::from_str(&json()).unwrap();
        let params = doc["paths"]["/v1/queues/{queue}/messages"]["post"]["parameters"]
            .as_array()
            .unwrap();
        let param = |name: &str| params.iter().find(|p| p["name"] == name).unwrap();
        let properties = param("Message-Properties");
        assert!(properties.get("schema").is_none(), "{properties}");
        let reference = "#/components/schemas/MessageProperties";
        assert_eq!(
            properties["content"]["application/json"]["schema"]["$ref"],
            reference
        );
        let entry = &doc["components"]["schemas"]["BatchEntrySchema"]["properties"];
        assert_eq!(entry["properties"]["oneOf"][0]["$ref"], reference);
        assert_eq!(entry["properties"]["oneOf"][1]["type"], "null");
        let schema = &doc["components"]["schemas"]["MessageProperties"];
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["propertyNames"]["minLength"], 1);
        let reserved = schema["propertyNames"]["not"]["pattern"].as_str().unwrap();
        assert!(reserved.contains("^[tT][rR][aA][cC][eE][pP]"), "{reserved}");
        assert!(
            reserved.contains(r"|^[sS][eE][nN][dD][gG][aA][tT][eE]\."),
            "{reserved}"
        );
        assert_eq!(
            schema["additionalProperties"]["type"],
            serde_json::json!(["string", "number", "boolean"])
        );
        let header = &param("Message-Scheduled-Enqueue-Time")["schema"];
        assert_eq!(header["format"], "date-time");
        assert_eq!(header["minLength"], 20);
        assert!(header["pattern"].as_str().unwrap().starts_with('^'));
        let field = &entry["scheduled_enqueue_time"];
        assert_eq!(header["pattern"], field["pattern"]);
        assert_eq!(header["minLength"], field["minLength"]);
        assert_eq!(field["type"], serde_json::json!(["string", "null"]));
        // No control character in a text attribute; no member the gateway does not know.
        let no_control = r"^[^\x00-\x1f\x7f-\x9f]*$";
        for field in [
            Field::Subject,
            Field::SessionId,
            Field::PartitionKey,
            Field::ReplyTo,
            Field::To,
        ] {
            assert_eq!(param(field.header_name())["schema"]["pattern"], no_control);
            assert_eq!(entry[field.json_name()]["pattern"], no_control, "{field}");
        }
        for body in ["BatchEntrySchema", "BatchBodySchema"] {
            let schema = &doc["components"]["schemas"][body];
            assert_eq!(schema["additionalProperties"], false, "{body}");
        }
    }

    /// Issue 40, item 10: `force_backend: "fallback"` was schema-valid on a gateway without a
    /// fallback, which refuses it (400). Only a gateway with one offers it.
    #[test]
    fn only_a_gateway_with_a_fallback_offers_it() {
        for (doc, names) in [
            (json(), serde_json::json!(["primary"])),
            (
                json_with(Mode::Keys, true),
                serde_json::json!(["primary", "fallback"]),
            ),
        ] {
            let doc: Value = serde_json::from_str(&doc).unwrap();
            let force = &doc["components"]["schemas"]["SettingsPatch"]["properties"]
                ["force_backend"]["enum"];
            let mut values = names.as_array().unwrap().clone();
            values.push(Value::Null);
            assert_eq!(*force, Value::Array(values));
            let breaker = &doc["paths"]["/admin/breakers/{backend}"]["post"]["parameters"][0];
            assert_eq!(breaker["name"], "backend");
            assert_eq!(breaker["schema"]["enum"], names);
        }
    }

    #[test]
    fn every_operation_names_the_transports_431_without_a_request_id() {
        let doc: Value = serde_json::from_str(&json()).unwrap();
        let mut operations = 0;
        for item in doc["paths"].as_object().unwrap().values() {
            for operation in item.as_object().unwrap().values() {
                let answer = &operation["responses"]["431"];
                assert!(answer["description"].is_string(), "{operation}");
                assert!(answer.get("headers").is_none(), "{answer}");
                assert!(answer.get("content").is_none(), "{answer}");
                operations += 1;
            }
        }
        assert!(operations >= 12, "{operations}");
    }
}
