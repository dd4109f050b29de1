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
