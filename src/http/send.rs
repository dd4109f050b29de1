//! `POST /v1/queues/{queue}/messages`: the admission order of the contract, top to bottom.

use actix_web::http::header::CONTENT_TYPE;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sendgate_wire::{Queued, Valid};

use super::auth::{AuthError, Permission};
use super::errors::{ApiError, FieldError, Problem, MAX_FIELD_ERRORS};
use super::{request_id, AppState};
use crate::backend::OutgoingMessage;
use crate::domain::{CorrelationId, IdError, MessageId};

pub async fn send_message(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let queue_label = match state.queues.get_key_value(path.as_str()) {
        Some((name, _)) => name.clone(),
        None => "unknown".to_owned(),
    };
    let answer = admit_and_send(req, path, payload, &state).await;
    let (status, code, backend) = match &answer {
        Ok(r) => {
            let code = if r.status() == actix_web::http::StatusCode::CREATED {
                "queued"
            } else {
                "valid"
            };
            let backend = r
                .headers()
                .get("X-Sendgate-Backend")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none");
            (r.status().as_u16(), code, backend)
        }
        Err(e) => (
            e.problem.status().as_u16(),
            e.problem.code().as_str(),
            e.via.unwrap_or("none"),
        ),
    };
    state.metrics.request(&queue_label, status, code, backend);
    answer
}

async fn admit_and_send(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: &AppState,
) -> Result<HttpResponse, ApiError> {
    let (request_id, request_id_problem) = request_id(&req);
    let fail = |problem: Problem| ApiError::new(problem, &request_id);

    // 2. Who is asking, and may they?
    let principal = state.auth.authenticate(&req).map_err(|e| {
        fail(Problem::Unauthenticated {
            token_given: e == AuthError::Unknown,
        })
    })?;
    if !principal.may(Permission::Send) {
        return Err(fail(Problem::Forbidden {
            action: "send messages",
        }));
    }
    let queue = state
        .queues
        .get(path.as_str())
        .ok_or_else(|| {
            fail(Problem::UnknownQueue {
                queue: path.clone(),
            })
        })?
        .clone();
    if !principal.may_use_queue(&queue) {
        return Err(fail(Problem::Forbidden {
            action: "send to this queue",
        }));
    }

    // 3. Lifecycle: the guard keeps a drain waiting until this send is answered.
    let _in_flight = state.lifecycle.admit_send().map_err(|n| fail(n.into()))?;

    // 4. Input.
    if !is_json(&req) {
        return Err(fail(Problem::UnsupportedMediaType));
    }
    // A client that stops mid-body must not hold its request (and the drain) open: the
    // body gets the send's own deadline to arrive.
    let body = tokio::time::timeout(
        state.body_timeout,
        read_body(&req, payload, state.max_body_bytes),
    )
    .await
    .unwrap_or_else(|_| {
        Err(Problem::InvalidRequest {
            errors: vec![FieldError::new(
                &["body"],
                "the body did not arrive in time",
            )],
        })
    })
    .map_err(fail)?;
    let input = Input::parse(&req, &body, request_id_problem).map_err(fail)?;
    let message_id = input.message_id.unwrap_or_else(MessageId::generate);

    let mut response_headers = vec![("X-Request-Id", request_id.to_string())];
    let echoed_correlation = input.correlation_header.as_ref().map(|c| c.to_string());
    if let Some(c) = &echoed_correlation {
        response_headers.push(("X-Correlation-Id", c.clone()));
    }

    if input.dry_run {
        let mut ok = HttpResponse::Ok();
        for h in response_headers {
            ok.insert_header(h);
        }
        return Ok(ok.json(Valid::new(
            queue.as_str(),
            message_id.as_str(),
            request_id.as_str(),
        )));
    }

    // 5.–8. Capacity, in-flight limit, the send under its deadline.
    let correlation_id = input.correlation_header.or_else(|| {
        CorrelationId::parse(request_id.as_str())
            .ok()
            .filter(|_| input.request_id_given)
    });
    let message = OutgoingMessage {
        queue: queue.clone(),
        message_id: message_id.clone(),
        correlation_id,
        body,
    };
    let dispatched = state.dispatcher.send(message).await;
    let via = dispatched.via.map(|role| role.as_str());
    if let (Some(via), Some(took)) = (via, dispatched.send_time) {
        state.metrics.send_latency(via, took);
    }
    if let Some(via) = via {
        response_headers.push(("X-Sendgate-Backend", via.to_owned()));
    }
    match dispatched.result {
        Ok(receipt) => {
            let mut created = HttpResponse::Created();
            for h in response_headers {
                created.insert_header(h);
            }
            Ok(created.json(Queued::new(
                queue.as_str(),
                message_id.as_str(),
                request_id.as_str(),
                receipt.duplicate,
            )))
        }
        Err(e) => Err(
            fail(Problem::from_dispatch(e, &message_id, state.max_body_bytes))
                .via(via)
                .correlation(echoed_correlation),
        ),
    }
}

/// `application/json`, in any case, optionally followed by parameters (`; charset=utf-8`).
/// A byte comparison: a full media-type parse on every send costs more than it checks.
fn is_json(req: &HttpRequest) -> bool {
    const JSON: &[u8] = b"application/json";
    let Some(value) = req.headers().get(CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes().trim_ascii();
    value.len() >= JSON.len()
        && value[..JSON.len()].eq_ignore_ascii_case(JSON)
        && matches!(
            value[JSON.len()..].trim_ascii_start().first(),
            None | Some(b';')
        )
}

/// The body, refusing it as soon as it is known to be too large (from `Content-Length`
/// before reading, or while streaming when the length was not announced).
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, Problem> {
    let announced = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(Problem::PayloadTooLarge { limit });
    }
    let mut body = BytesMut::with_capacity(announced.unwrap_or(1024).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| Problem::InvalidRequest {
            errors: vec![FieldError::new(
                &["body"],
                format!("the body could not be read: {e}"),
            )],
        })?;
        if body.len() + chunk.len() > limit {
            return Err(Problem::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The parts of the request that are input, all checked before any is rejected so one 400
/// lists every problem.
struct Input {
    message_id: Option<MessageId>,
    correlation_header: Option<CorrelationId>,
    request_id_given: bool,
    dry_run: bool,
}

impl Input {
    fn parse(
        req: &HttpRequest,
        body: &[u8],
        request_id_problem: Option<FieldError>,
    ) -> Result<Self, Problem> {
        let mut errors: Vec<FieldError> = request_id_problem.into_iter().collect();

        // JSON text is UTF-8; serde_json's slice reader would skip over invalid bytes
        // inside strings, so check the encoding first.
        match std::str::from_utf8(body) {
            Err(e) => errors.push(FieldError::new(&["body"], format!("not valid UTF-8: {e}"))),
            Ok(text) => {
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                    errors.push(FieldError::new(&["body"], format!("not valid JSON: {e}")));
                }
            }
        }
        let message_id = header_id(req, "Idempotency-Key", MessageId::parse, &mut errors);
        let correlation_header =
            header_id(req, "X-Correlation-Id", CorrelationId::parse, &mut errors);
        let dry_run = match query_value(req, "dry_run") {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => true,
            Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => false,
            Some(_) => {
                errors.push(FieldError::new(
                    &["query", "dry_run"],
                    "must be true or false",
                ));
                false
            }
        };
        if !errors.is_empty() {
            errors.truncate(MAX_FIELD_ERRORS);
            return Err(Problem::InvalidRequest { errors });
        }
        Ok(Self {
            message_id,
            correlation_header,
            request_id_given: req.headers().contains_key("X-Request-Id"),
            dry_run,
        })
    }
}

fn header_id<T>(
    req: &HttpRequest,
    name: &str,
    parse: fn(&str) -> Result<T, IdError>,
    errors: &mut Vec<FieldError>,
) -> Option<T> {
    let value = req.headers().get(name)?;
    match value
        .to_str()
        .map_err(|_| IdError::NotPrintable)
        .and_then(parse)
    {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(FieldError::new(&["header", name], e.to_string()));
            None
        }
    }
}

fn query_value(req: &HttpRequest, key: &str) -> Option<String> {
    if req.query_string().is_empty() {
        return None;
    }
    serde_urlencoded::from_str::<Vec<(String, String)>>(req.query_string())
        .unwrap_or_default()
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    fn with_type(value: &str) -> bool {
        is_json(
            &TestRequest::default()
                .insert_header((CONTENT_TYPE, value))
                .to_http_request(),
        )
    }

    #[test]
    fn only_application_json_with_optional_parameters_is_json() {
        for yes in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            " application/json ;x=y",
        ] {
            assert!(with_type(yes), "{yes:?}");
        }
        for no in [
            "application/jsonx",
            "text/json",
            "application/xml",
            "",
            "application/json-seq",
        ] {
            assert!(!with_type(no), "{no:?}");
        }
        assert!(!is_json(&TestRequest::default().to_http_request()));
    }
}
