//! Schemas for body fields whose Rust type (`&'static str`) is wider than the words they
//! hold, named by the bodies' `#[schema(schema_with = …)]`. A leaf the handlers import, so
//! that `openapi.rs`, which lists the handlers, is imported by none of them.

use utoipa::openapi::schema::{Object, ObjectBuilder, Type};

use crate::admission::breaker::BreakerState;
use crate::backend::LagSource;
use crate::config::BackendKind;

fn words(list: impl IntoIterator<Item = &'static str>) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(list))
        .build()
}

pub fn word_ok() -> Object {
    words(["ok"])
}

pub fn word_ready() -> Object {
    words(["ready"])
}

pub fn word_draining() -> Object {
    words(["draining"])
}

pub fn health_status() -> Object {
    words(["ok", "degraded"])
}

pub fn coordination_mode() -> Object {
    words(["local", "redis"])
}

pub fn settings_store() -> Object {
    words(["file", "redis"])
}

pub fn overrides_lapse() -> Object {
    words(["config_change", "never"])
}

pub fn breaker_action() -> Object {
    words(["open", "close", "reset"])
}

/// `primary`, `fallback` or `null`.
pub fn force_backend() -> Object {
    ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::String,
            Type::Null,
        ]))
        .enum_values(Some([
            serde_json::Value::from("primary"),
            serde_json::Value::from("fallback"),
            serde_json::Value::Null,
        ]))
        .build()
}

pub fn breaker_state() -> Object {
    words(
        [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ]
        .map(BreakerState::as_str),
    )
}

pub fn backend_kind() -> Object {
    words(
        [
            BackendKind::Embedded,
            BackendKind::RabbitMq,
            BackendKind::ServiceBus,
        ]
        .map(BackendKind::as_str),
    )
}

/// `primary`, and `fallback` when configured: each a `BackendHealth`.
pub fn backends() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(
            "primary",
            utoipa::openapi::Ref::from_schema_name("BackendHealth"),
        )
        .property(
            "fallback",
            utoipa::openapi::Ref::from_schema_name("BackendHealth"),
        )
        .required("primary")
        .additional_properties(Some(
            utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
        ))
        .build()
}

/// `schema_with` replaces the field's doc comment, so the description is given here.
pub fn depth_lag_source() -> Object {
    let mut object = words(
        [LagSource::Broker, LagSource::Configured, LagSource::Default].map(LagSource::as_str),
    );
    object.description = Some(
        "Where `depth_lag_ms` comes from: `broker` (2 × the statistics refresh measured \
         on RabbitMQ's management API + 1 s), `configured` \
         (`SENDGATE_RABBITMQ_STATS_LAG_MS`, longer than that) or `default` (not measured \
         yet, or not measurable: RabbitMQ's default refresh, Service Bus's documented \
         1 s). Present with `depth_lag_ms`."
            .into(),
    );
    object
}

/// The name the application properties' schema is registered under: `openapi.rs` adds
/// [`message_properties`] to the components, for a batch entry's `properties` and the
/// `Message-Properties` header alike.
pub const MESSAGE_PROPERTIES: &str = "MessageProperties";

/// A batch entry's `properties`: [`MESSAGE_PROPERTIES`], by name, or `null` (absent).
pub fn message_properties_or_null() -> utoipa::openapi::Schema {
    utoipa::openapi::Schema::OneOf(
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(utoipa::openapi::Ref::from_schema_name(MESSAGE_PROPERTIES))
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .build(),
    )
}

/// Contract section 1's application properties, as `domain::attributes` checks them: names of
/// 1 to 256 characters, no control character, none of the gateway's own (`traceparent`,
/// `tracestate`, `Diagnostic-Id`, `sendgate.*`, in any case); values a string, number or
/// boolean. JSON, not a utoipa type: utoipa 5 has no `not`. A value's limit is in UTF-8
/// bytes, which JSON Schema cannot count: `maxLength` (characters) is the bound for ASCII.
pub fn message_properties() -> serde_json::Value {
    use crate::domain::attributes::{
        MAX_PROPERTIES_BYTES, MAX_PROPERTY_NAME_CHARS, MAX_PROPERTY_VALUE_BYTES, RESERVED_NAMES,
        RESERVED_PREFIX,
    };
    let reserved = RESERVED_NAMES
        .iter()
        .map(|name| format!("^{}$", any_case(name)))
        .chain([format!("^{}", any_case(RESERVED_PREFIX))])
        .collect::<Vec<_>>()
        .join("|");
    serde_json::json!({
        "type": "object",
        "description": format!(
            "Application properties: string, number or boolean values. A string value is at \
             most {MAX_PROPERTY_VALUE_BYTES} bytes of UTF-8, and names and values at most \
             {MAX_PROPERTIES_BYTES} bytes in all (else 400)."
        ),
        "propertyNames": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_PROPERTY_NAME_CHARS,
            "pattern": r"^[^\x00-\x1f\x7f-\x9f]*$",
            "not": {"pattern": reserved},
        },
        "additionalProperties": {
            "type": ["string", "number", "boolean"],
            "maxLength": MAX_PROPERTY_VALUE_BYTES,
        },
    })
}

/// A regular expression matching `text` in any ASCII case (JSON Schema's ECMA-262 patterns
/// carry no flags).
fn any_case(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_ascii_alphabetic() => {
                format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase())
            }
            '.' => r"\.".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// `scheduled_enqueue_time` (a batch entry's) and `Message-Scheduled-Enqueue-Time`: RFC 3339
/// (`date-time`) as `domain::attributes` parses it, stated as a pattern too, since `format`
/// only annotates in JSON Schema 2020-12: uppercase `T` and `Z`, at most 9 fraction digits,
/// no leap second; the years 0000 and 9999 only in UTC (`Z`), where an offset could take
/// the time out of the years 0000 to 9999 once converted to UTC (refused).
pub fn scheduled_enqueue_time() -> Object {
    scheduled_time(Type::String.into())
}

/// A batch entry's: as [`scheduled_enqueue_time`], or `null` (absent).
pub fn scheduled_enqueue_time_or_null() -> Object {
    scheduled_time(utoipa::openapi::schema::SchemaType::from_iter([
        Type::String,
        Type::Null,
    ]))
}

fn scheduled_time(types: utoipa::openapi::schema::SchemaType) -> Object {
    const MONTH_DAY: &str = "(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])";
    const TIME: &str = r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?";
    const OFFSET: &str = "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    const YEAR_1_TO_9998: &str =
        "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])";
    ObjectBuilder::new()
        .schema_type(types)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::DateTime,
        )))
        .min_length(Some("0000-01-01T00:00:00Z".len()))
        .max_length(Some("0000-01-01T00:00:00.000000000+00:00".len()))
        .pattern(Some(format!(
            "^(?:{YEAR_1_TO_9998}-{MONTH_DAY}{TIME}{OFFSET}|(?:0000|9999)-{MONTH_DAY}{TIME}Z)$"
        )))
        .description(Some(
            "RFC 3339: the message is not delivered before this time (converted to UTC). The \
             years 0000 and 9999 only in UTC (`Z`). A backend without scheduling answers 422 \
             unsupported_attribute.",
        ))
        .build()
}
