//! The server and the client speak one vocabulary (`sendgate-wire`): every code the wire
//! names is one the server gives, every refusal the server gives is a wire code, and the
//! body the server writes is the body the client reads.

use std::time::Duration;

use actix_web::ResponseError;
use sendgate::domain::RequestId;
use sendgate::http::errors::{ApiError, FieldError, Problem};
use sendgate::lifecycle::{GatewayState, Lifecycle};
use sendgate_client::transport::Answer;
use sendgate_wire::{ErrorBody, ErrorCode};

/// A refusal for each wire code. The match has no wildcard, so a code added to the wire
/// without a `Problem` giving it does not compile.
fn problem_for(code: ErrorCode) -> Problem {
    let wait = Duration::from_secs(3);
    match code {
        ErrorCode::NotFound => Problem::NotFound,
        ErrorCode::MethodNotAllowed => Problem::MethodNotAllowed { allow: "POST" },
        ErrorCode::UnknownQueue => Problem::UnknownQueue { queue: "q".into() },
        ErrorCode::Unauthenticated => Problem::Unauthenticated { token_given: true },
        ErrorCode::Forbidden => Problem::Forbidden { action: "send" },
        ErrorCode::ForbiddenHost => Problem::ForbiddenHost,
        ErrorCode::Starting => Problem::Starting,
        ErrorCode::Draining => Problem::Draining { retry_after: wait },
        ErrorCode::UnsupportedMediaType => Problem::UnsupportedMediaType,
        ErrorCode::PayloadTooLarge => Problem::PayloadTooLarge { limit: 64 },
        ErrorCode::InvalidRequest => Problem::InvalidRequest {
            errors: vec![FieldError::new(&["body"], "not JSON")],
        },
        ErrorCode::RequestTimeout => Problem::RequestTimeout,
        ErrorCode::QueueFull => Problem::QueueFull {
            backlog: 10,
            limit: 10,
            retry_after: wait,
            drain_rate: None,
            room: Some(4),
        },
        ErrorCode::CapacityUnknown => Problem::CapacityUnknown {
            consecutive_failures: 3,
            cause: sendgate::admission::ceiling::Unknown::AdminPlane,
        },
        ErrorCode::Saturated => Problem::Saturated,
        ErrorCode::BackendUnavailable => Problem::BackendUnavailable { retry_after: wait },
        ErrorCode::SendTimeout => Problem::SendTimeout {
            message_id: "m-1".into(),
        },
        ErrorCode::BackendAuthFailed => Problem::BackendAuthFailed,
        ErrorCode::BackendBusy => Problem::BackendBusy { retry_after: wait },
        ErrorCode::QueueDisabled => Problem::QueueDisabled,
        ErrorCode::SendFailed => Problem::SendFailed {
            detail: "broken".into(),
            unknown_message_id: Some("m-2".into()),
        },
        ErrorCode::SettingsUnavailable => Problem::SettingsUnavailable {
            detail: "Redis: timed out".into(),
        },
        ErrorCode::UnsupportedAttribute => Problem::UnsupportedAttribute {
            attribute: "scheduled_enqueue_time",
            backend: "rabbitmq",
        },
        ErrorCode::IdempotencyKeyReused => Problem::IdempotencyKeyReused,
    }
}

/// Every `Problem` variant is listed here without a wildcard, so a refusal added to the
/// server without a wire code (and a case above) does not compile either.
fn is_covered(p: &Problem) -> bool {
    match p {
        Problem::NotFound
        | Problem::MethodNotAllowed { .. }
        | Problem::UnknownQueue { .. }
        | Problem::Unauthenticated { .. }
        | Problem::Forbidden { .. }
        | Problem::ForbiddenHost
        | Problem::Starting
        | Problem::Draining { .. }
        | Problem::UnsupportedMediaType
        | Problem::PayloadTooLarge { .. }
        | Problem::InvalidRequest { .. }
        | Problem::RequestTimeout
        | Problem::QueueFull { .. }
        // `queue_full` with a `reason` (docs/fairness.md): the same code and status.
        | Problem::Shed { .. }
        | Problem::TenantShare { .. }
        | Problem::TenantQuota { .. }
        | Problem::CapacityUnknown { .. }
        | Problem::Saturated
        | Problem::BackendUnavailable { .. }
        | Problem::SendTimeout { .. }
        | Problem::BackendAuthFailed
        | Problem::BackendBusy { .. }
        | Problem::QueueDisabled
        | Problem::IdempotencyKeyReused
        | Problem::SendFailed { .. }
        | Problem::SettingsUnavailable { .. }
        | Problem::UnsupportedAttribute { .. } => true,
        // A 404 of the breaker route, answered with the router's code `not_found`.
        Problem::UnknownBackend { .. } => true,
    }
}

#[test]
fn every_wire_code_is_a_refusal_the_server_gives_and_round_trips() {
    for code in ErrorCode::ALL {
        let problem = problem_for(code);
        assert!(is_covered(&problem));
        assert_eq!(problem.code(), code, "{problem:?}");
        assert_eq!(ErrorCode::parse(problem.code().as_str()), Some(code));
    }
}

#[actix_web::test]
async fn the_body_the_server_writes_is_the_body_the_client_reads() {
    let request_id = RequestId::parse("r-1").unwrap();
    for code in ErrorCode::ALL {
        let problem = problem_for(code);
        let response = ApiError::new(problem.clone(), &request_id).error_response();
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(sendgate_wire::headers::RETRY_AFTER)
            .map(|v| Duration::from_secs(v.to_str().unwrap().parse().unwrap()));
        let bytes = actix_web::body::to_bytes(response.into_body())
            .await
            .unwrap();
        let body: ErrorBody = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body.code.known(), Some(code), "{problem:?}");
        assert_eq!(body.request_id, "r-1");
        assert_eq!(body.message, problem.to_string());
        if let Some(seconds) = body.retry_after_s {
            assert_eq!(
                Some(Duration::from_secs(seconds)),
                retry_after,
                "retry_after_s is the header's value: {problem:?}"
            );
        }

        // The client's one decision made from a code alone: a 503 draining or starting is
        // a wait, every other answer is not.
        let answer = Answer {
            status,
            code: Some(body.code.clone()),
            outcome_unknown: body.outcome_unknown(),
            message_id: body.message_id.map(|m| m.into_owned()),
            retry_after,
        };
        let expected = match code {
            ErrorCode::Draining => Some(GatewayState::Draining),
            ErrorCode::Starting => Some(GatewayState::Starting),
            _ => None,
        };
        assert_eq!(
            answer.deferral().map(|(state, _)| state),
            expected,
            "{code}"
        );
    }
}

#[test]
fn the_servers_lifecycle_announces_the_wire_states() {
    let life = Lifecycle::new();
    let mut seen = vec![life.state()];
    life.set_running();
    seen.push(life.state());
    life.begin_drain(Duration::from_secs(1));
    seen.push(life.state());
    life.set_stopped();
    seen.push(life.state());
    assert_eq!(seen, GatewayState::ALL);
    let words: Vec<_> = seen
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
    assert_eq!(
        words,
        [
            r#""starting""#,
            r#""running""#,
            r#""draining""#,
            r#""stopped""#
        ]
    );
}
