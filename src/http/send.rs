//! `POST /v1/queues/{queue}/messages`: the admission order of the contract, top to bottom.

use std::sync::Arc;

use actix_web::http::header::{HeaderName, CONTENT_TYPE};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sendgate_wire::{ErrorBody, Queued, Valid};

use super::auth::{Permission, Principal};
use super::body_budget::{BodyPermit, Buffered};
use super::context::RequestContext;
use super::errors::{ApiError, FieldError, Problem, MAX_FIELD_ERRORS};
use super::headers::{
    self, spelling, CORRELATION_ID, IDEMPOTENCY_KEY, SENDGATE_BACKEND, TRACEPARENT, TRACESTATE,
};
use super::state::{authorize, AppState, Edge};
use crate::admission::ceiling::ClaimKey;
use crate::admission::fair::Asker;
use crate::admission::tenants::Criticality;
use crate::admission::BackendRole;
use crate::backend::OutgoingMessage;
use crate::domain::{
    Attributes, CorrelationId, IdError, MessageId, QueueName, Raw, RequestId, TraceContext,
};
use crate::metrics::RequestOutcome;

/// A send the gateway took, or validated on a dry run: what its 201 or 200 says.
struct Accepted {
    queue: QueueName,
    message_id: MessageId,
    correlation: Option<CorrelationId>,
    /// The message's `traceparent`.
    traceparent: String,
    taken: Taken,
}

enum Taken {
    Validated,
    Queued {
        via: Option<BackendRole>,
        duplicate: bool,
    },
}

#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/messages",
    tag = "send",
    operation_id = "send",
    summary = "Put one message on a queue, or refuse it (role sender or admin)",
    description = "The admission order of docs/contract.md section 1: the first rule that applies answers. Every 429 and 503 carries an integer `Retry-After` of at least 1.",
    params(
        ("queue" = String, Path, description = "One of the queues this gateway serves (`SENDGATE_QUEUES`); any other is 404 `unknown_queue`.", example = "requests"),
        ("dry_run" = Option<bool>, Query, description = "Validate and answer 200 `valid` without any backend call (`true`/`false`, or `1`/`0`)."),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, description = "Becomes the broker message id (scoped to the caller's key name when keys are on): 1–128 printable ASCII characters. Without it the gateway makes one (a UUID).", min_length = 1, max_length = 128, pattern = r"^[ -~]{1,128}$"),
        ("X-Correlation-Id" = Option<String>, Header, nullable = false, description = "The message's correlation id; echoed. 1–128 printable ASCII characters.", min_length = 1, max_length = 128, pattern = r"^[ -~]{1,128}$"),
        ("X-Request-Id" = Option<String>, Header, nullable = false, description = "This request's id, echoed on the answer; the message's correlation id when no X-Correlation-Id is given. 1–128 printable ASCII characters; on this route an invalid one is a 400.", min_length = 1, max_length = 128, pattern = r"^[ -~]{1,128}$"),
        ("Message-Subject" = Option<String>, Header, nullable = false, description = "The message's subject (Service Bus `Label`): 1–1024 characters, no control characters.", min_length = 1, max_length = 1024, pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"),
        ("Message-Session-Id" = Option<String>, Header, nullable = false, description = "The message's session id: 1–128 characters, no control characters; equal to Message-Partition-Key when both are given.", min_length = 1, max_length = 128, pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"),
        ("Message-Partition-Key" = Option<String>, Header, nullable = false, description = "The message's partition key: 1–128 characters, no control characters.", min_length = 1, max_length = 128, pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"),
        ("Message-Time-To-Live" = Option<u64>, Header, nullable = false, description = "Whole seconds the message lives in the queue before it expires: 1 to 4294967.", minimum = 1, maximum = 4294967),
        ("Message-Scheduled-Enqueue-Time" = Option<String>, Header, nullable = false, description = "RFC 3339: the message is not delivered before this time (converted to UTC). A backend without scheduling answers 422 unsupported_attribute.", format = DateTime),
        ("Message-Reply-To" = Option<String>, Header, nullable = false, description = "Where replies go: 1–1024 characters, no control characters.", min_length = 1, max_length = 1024, pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"),
        ("Message-To" = Option<String>, Header, nullable = false, description = "The message's destination address: 1–1024 characters, no control characters.", min_length = 1, max_length = 1024, pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"),
        // Its `schema` becomes `content` (JSON, `MessageProperties`), and the scheduled
        // time's its pattern, in openapi.rs: the tuple form here takes neither.
        ("Message-Properties" = Option<String>, Header, nullable = false, description = "Application properties as a JSON object (`MessageProperties`): string, number or boolean values (each at most 32 KiB, all at most 64 KiB); traceparent, tracestate, Diagnostic-Id and sendgate.* are the gateway's. The whole request head is at most `SENDGATE_MAX_HEAD_BYTES` (32 KiB by default, else 431); a batch entry's `properties` has no such bound."),
        ("traceparent" = Option<String>, Header, nullable = false, description = "W3C trace context: the message gets this trace with a parent id of its own (answered as `traceparent`). An invalid one (by the W3C rules) is ignored, never refused: the message gets a new trace."),
        ("tracestate" = Option<String>, Header, nullable = false, description = "W3C trace state, carried to the message with a valid traceparent; an invalid one (by the W3C rules: at most 32 members, 512 characters) is ignored, never refused."),
        ("Sendgate-Criticality" = Option<String>, Header, nullable = false, description = "`critical`, `default` or `sheddable`: lowers the level the send is made at (never above the key's `criticality`); a lower level is refused from its share of the ceiling (429 `queue_full`, `reason: criticality`). Anything else is a 400.", pattern = "^(critical|default|sheddable)$"),
    ),
    request_body(
        description = "The message itself, delivered byte for byte: any JSON value, at most `SENDGATE_MAX_BODY_BYTES` bytes.",
        content = serde_json::Value,
        content_type = "application/json",
    ),
    responses(
        (status = 201, description = "`queued`: the message is in the queue.", body = Queued,
            headers(
                ("X-Sendgate-Backend" = String, description = "`primary` or `fallback`: the backend that took it."),
                ("X-Correlation-Id" = String, description = "The request's X-Correlation-Id, when it had one."),
                ("RateLimit-Policy" = String, description = "Only for a tenant with a rate quota (draft-ietf-httpapi-ratelimit-headers): `\"rate\";q=<burst>;w=<seconds an empty bucket takes to fill>`."),
                ("RateLimit" = String, description = "Only for a tenant with a rate quota: `\"rate\";r=<units that conform now>;t=<seconds until one more does>` (`t` absent when none is missing)."),
            )),
        (status = 200, description = "`valid`: a dry run that would have been attempted.", body = Valid,
            headers(("X-Correlation-Id" = String, description = "The request's X-Correlation-Id, when it had one."))),
        (status = 400, description = "`invalid_request`: malformed JSON, a bad header (an id or a `Message-*` attribute) or `dry_run`; `errors` lists each problem (at most 20).", body = ErrorBody),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the role or the queue), or `forbidden_host` (open mode).", body = ErrorBody),
        (status = 404, description = "`unknown_queue`: the gateway does not serve this queue.", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive within `SENDGATE_BODY_TIMEOUT_MS`; nothing was sent, the same request may be sent again.", body = ErrorBody),
        (status = 409, description = "`queue_disabled` at the broker.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`, with `limit_bytes`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not `application/json`.", body = ErrorBody),
        (status = 422, description = "`unsupported_attribute`: the backend the send would go to cannot carry one of its attributes (`attribute`, `backend`); nothing was sent. `idempotency_key_reused` (embedded backend): the `Idempotency-Key` was used inside the duplicate-detection window for another body or other attributes; nothing was sent, and the same request is refused again.", body = ErrorBody),
        (status = 429, description = "`queue_full`: the backlog is at or over its ceiling (or, with `reason`, the send's criticality is refused from its level's share of it, `criticality`; or its tenant is past its part of a contended queue's room, `tenant_share` with `share`; or past one of its quotas, `tenant_quota` with `quota`: `rate` or `max_share`), or, with `SENDGATE_RESUME_BELOW`, not yet back at the resume level (`backlog`, `limit`, `retry_after_s`: the header's value, `drain_rate_per_s`: the measured drain rate or null).", body = ErrorBody,
            headers(
                ("Retry-After" = u64, description = "Whole seconds to wait, at least 1."),
                ("RateLimit-Policy" = String, description = "Only for a tenant with a rate quota: as on the 201."),
                ("RateLimit" = String, description = "Only for a tenant with a rate quota: as on the 201; with `r=0`, `t` is the Retry-After of a single send."),
            )),
        (status = 502, description = "`backend_auth_failed`, or `send_failed` (with `outcome: unknown` and `message_id` when the broker may hold the message).", body = ErrorBody,
            headers(("X-Sendgate-Backend" = String, description = "The backend the send went to."))),
        (status = 503, description = "`draining` (with `retry_after_s`), `starting`, `saturated`, `capacity_unknown` (with `consecutive_failures`), `backend_unavailable` or `backend_busy`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds to wait, at least 1."))),
        (status = 504, description = "`send_timeout`: the broker did not confirm in time; `outcome: unknown` and the `message_id` to retry with.", body = ErrorBody,
            headers(("X-Sendgate-Backend" = String, description = "The backend the send went to."))),
    )
)]
pub async fn send_message(
    req: HttpRequest,
    context: RequestContext,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    // A configured queue's name or "unknown", so the label set stays bounded.
    let queue_label = state.edge.queue_label(&path);
    let mut tenant = None;
    let span = super::otel::start(state.observability.otel.as_deref(), queue_label, || {
        given_trace(&req)
    });
    let answer = admit_and_send(
        &req,
        &context,
        &path,
        payload,
        &state,
        &mut tenant,
        span.as_ref(),
    )
    .await;
    let counted = outcome(&answer);
    state.observability.metrics.request(queue_label, &counted);
    if let Some(span) = span {
        let ended = super::otel::Ended {
            outcome: &counted,
            refusal: answer.as_ref().err(),
            dry_run: matches!(
                answer,
                Ok(Accepted {
                    taken: Taken::Validated,
                    ..
                })
            ),
            message_id: answer.as_ref().ok().map(|a| a.message_id.as_str()),
            message_count: None,
            tenant,
        };
        super::otel::end(span, &state.dispatcher, &state.edge.auth, ended);
    }
    let rate_limit =
        tenant.and_then(|t| crate::http::ratelimit::RateLimitFields::for_tenant(&state.rates, t));
    crate::http::ratelimit::on_answer(
        answer.map(|accepted| accepted.into_response(context.id())),
        rate_limit,
    )
}

/// What the answer is counted as, from the typed result (never read back from a response).
fn outcome(answer: &Result<Accepted, ApiError>) -> RequestOutcome {
    match answer {
        Ok(accepted) => {
            let (status, code) = accepted.taken.answer();
            RequestOutcome {
                status,
                code,
                backend: accepted.taken.via(),
            }
        }
        Err(e) => e.outcome(),
    }
}

impl Taken {
    /// The two successes: 200 `valid` for a dry run, 201 `queued` for a send.
    fn answer(&self) -> (StatusCode, &'static str) {
        match self {
            Taken::Validated => (StatusCode::OK, Valid::STATUS),
            Taken::Queued { .. } => (StatusCode::CREATED, Queued::STATUS),
        }
    }

    /// The backend that took the send (none on a dry run).
    fn via(&self) -> Option<BackendRole> {
        match self {
            Taken::Validated => None,
            Taken::Queued { via, .. } => *via,
        }
    }
}

/// Steps 2 to 8 of the contract's admission order, each its own function. `tenant` is set
/// once the caller is known (its answers carry its rate quota's fields).
async fn admit_and_send(
    req: &HttpRequest,
    context: &RequestContext,
    queue: &str,
    payload: web::Payload,
    state: &AppState,
    tenant: &mut Option<crate::admission::tenants::TenantIndex>,
    span: Option<&crate::otel::SendSpan<'_>>,
) -> Result<Accepted, ApiError> {
    // 2. Who is asking, and may they send to this queue?
    let (queue, caller, asker) = authorize_send(req, context, queue, &state.edge).await?;
    *tenant = Some(asker.tenant);
    // 3. Lifecycle: the guard keeps a drain waiting until this send is answered.
    let _in_flight = state
        .lifecycle
        .admit_send()
        .map_err(|n| context.error(n.into()))?;
    // 4. Input.
    // `_buffered` holds the body's bytes in the budget until the send has ended.
    let (input, body, _buffered) = read_input(req, context, payload, &state.edge)
        .await
        .map_err(|problem| context.error(problem))?;
    let asker = asked_criticality(req, asker)
        .map_err(|e| context.error(Problem::InvalidRequest { errors: vec![e] }))?;
    // The message's own context: with OpenTelemetry on, the send span's (the consumer's
    // trace goes on from the send); else the request's trace with a parent id of its own.
    let trace = match span.and_then(|span| span.trace(&input.trace)) {
        Some(trace) => trace,
        None => input.trace.for_message(),
    };
    if input.dry_run {
        // What a send would be refused for before capacity: an attribute the backend
        // cannot carry (no broker call either way).
        if let Some((attribute, backend)) = state.dispatcher.unsupported(&input.attributes) {
            return Err(context.error(Problem::UnsupportedAttribute {
                attribute: attribute.json_name(),
                backend,
            }));
        }
        return Ok(Accepted {
            queue,
            message_id: input.message_id.unwrap_or_else(MessageId::generate),
            correlation: input.correlation_header,
            traceparent: trace.parent.to_string(),
            taken: Taken::Validated,
        });
    }
    // 5.–8. Route, capacity, in-flight limit, breaker, the send under its deadline.
    let key = Key {
        given: input.message_id,
        caller,
    };
    let message = Message {
        correlation: input.correlation_header,
        attributes: std::sync::Arc::new(input.attributes),
        trace,
        body,
    };
    dispatch(context, state, queue, key, asker, message).await
}

/// What a single send's message is made of, besides its id.
struct Message {
    correlation: Option<CorrelationId>,
    attributes: std::sync::Arc<Attributes>,
    trace: TraceContext,
    body: Bytes,
}

/// What the message's id is made from: the client's Idempotency-Key (if any) and, with
/// keys on, the caller it is scoped to.
pub(crate) struct Key {
    pub(crate) given: Option<MessageId>,
    pub(crate) caller: Option<Arc<Principal>>,
}

impl Key {
    /// The place a refusal may have promised this send: its id at the broker, when the
    /// client gave a key (a made-up id is never sent again).
    fn claim(&self) -> Option<ClaimKey> {
        let key = self.given.as_ref()?;
        Some(match &self.caller {
            Some(caller) => ClaimKey::of(scoped_message_id(&caller.name, key).as_str()),
            None => ClaimKey::of(key.as_str()),
        })
    }

    /// The id as the client knows it (echoed in every answer), and as the broker stores it.
    /// A client's key is scoped to the caller at the broker: another key holder on the
    /// same queue cannot suppress this message by reusing its Idempotency-Key.
    pub(crate) fn ids(self) -> (MessageId, MessageId) {
        match (self.given, self.caller) {
            (Some(key), Some(caller)) => {
                let at_broker = scoped_message_id(&caller.name, &key);
                (key, at_broker)
            }
            (Some(key), None) => (key.clone(), key),
            (None, _) => {
                let id = MessageId::generate();
                (id.clone(), id)
            }
        }
    }
}

/// `{key name}:{Idempotency-Key}`, or, when that is not a valid id (too long, a name that
/// is not printable ASCII), the key's SHA-256 after the name, or the SHA-256 of both.
/// Deterministic, so every retry of one message by one caller has the same broker id.
pub(crate) fn scoped_message_id(caller: &str, key: &MessageId) -> MessageId {
    use sha2::{Digest, Sha256};
    let plain = format!("{caller}:{}", key.as_str());
    if let Ok(id) = MessageId::parse(&plain) {
        return id;
    }
    let hashed_key = format!("{caller}:{}", hex::encode(Sha256::digest(key.as_str())));
    if let Ok(id) = MessageId::parse(&hashed_key) {
        return id;
    }
    let both = hex::encode(Sha256::digest(plain.as_bytes()));
    MessageId::parse(&both).unwrap_or_else(|_| MessageId::generate())
}

/// Step 2: the key may send, the queue is served, and the key's scope includes it. With
/// keys on, also the caller's name (what its Idempotency-Keys are scoped to); and who asks
/// for the queue's room: the key's tenant, at its criticality or the lower one
/// `Sendgate-Criticality` asks for.
pub(crate) async fn authorize_send(
    req: &HttpRequest,
    context: &RequestContext,
    queue: &str,
    edge: &Edge,
) -> Result<(QueueName, Option<Arc<Principal>>, Asker), ApiError> {
    let principal = authorize(req, context, &edge.auth, Permission::Send, "send messages").await?;
    let queue = edge.queues.get(queue).ok_or_else(|| {
        context.error(Problem::UnknownQueue {
            queue: queue.to_owned(),
        })
    })?;
    context.record_queue(queue.as_str());
    if !principal.may_use_queue(queue) {
        return Err(context.error(Problem::Forbidden {
            action: "send to this queue",
        }));
    }
    // The key's level; step 4 reads the header that may lower it.
    let asker = Asker {
        tenant: principal.tenant,
        criticality: principal.criticality,
    };
    let caller = (!edge.auth.is_open()).then_some(principal);
    Ok((queue.clone(), caller, asker))
}

/// Step 4's `Sendgate-Criticality`: the level the caller's key allows, or the lower one
/// the header asks for (never a higher one); anything but the three words is a 400.
pub(crate) fn asked_criticality(req: &HttpRequest, asker: Asker) -> Result<Asker, FieldError> {
    let Some(value) = req.headers().get(headers::CRITICALITY) else {
        return Ok(asker);
    };
    value
        .to_str()
        .ok()
        .and_then(Criticality::parse)
        .map(|asked| Asker {
            criticality: asked.min(asker.criticality),
            ..asker
        })
        .ok_or_else(|| {
            FieldError::new(
                &["header", headers::spelling::CRITICALITY],
                "must be critical, default or sheddable",
            )
        })
}

/// Step 4: content type, size, JSON validity, headers and `dry_run`.
async fn read_input(
    req: &HttpRequest,
    context: &RequestContext,
    payload: web::Payload,
    edge: &Edge,
) -> Result<(Input, Bytes, BodyPermit), Problem> {
    let limits = &edge.limits;
    let (body, permit) =
        read_json_body(req, payload, edge, limits.max_body_bytes, Buffered::Once).await?;
    let input = Input::parse(req, &body, limits.max_json_depth, context.header_problem())?;
    Ok((input, body, permit))
}

/// A JSON request's body, at most `limit` bytes: the content type, room in the body budget
/// (held until the send ends, by the permit returned), and the body within its deadline.
/// A single send's and a batch's alike.
pub(crate) async fn read_json_body(
    req: &HttpRequest,
    payload: web::Payload,
    edge: &Edge,
    limit: usize,
    buffered: Buffered,
) -> Result<(Bytes, BodyPermit), Problem> {
    if !is_json(req) {
        return Err(Problem::UnsupportedMediaType);
    }
    // Room for the body in memory first, held until the send ends; none left: refused now.
    let announced = announced_length(req);
    let expected = announced.map_or(limit, |n| n.min(limit));
    let weigh = |n: usize| buffered.weigh(n, edge.body_budget.capacity());
    let mut permit = edge
        .body_budget
        .try_acquire(weigh(expected))
        .ok_or(Problem::Saturated)?;
    // A client that stops mid-body must not hold its request (and the drain) open: the
    // body has its own deadline to arrive (`SENDGATE_BODY_TIMEOUT_MS`).
    let timeout = edge.limits.body_timeout;
    let body = tokio::time::timeout(timeout, read_body(payload, announced, limit))
        .await
        .unwrap_or(Err(Problem::RequestTimeout))?;
    // A body sent without a length was reserved at the largest size: keep only its own.
    permit.shrink_to(weigh(body.len()));
    Ok((body, permit))
}

/// Steps 5 to 8, in the dispatcher; the answer names the backend the send went to. The
/// message (and its id) is made only once the send is admitted: a refusal needs neither.
async fn dispatch(
    context: &RequestContext,
    state: &AppState,
    queue: QueueName,
    key: Key,
    asker: Asker,
    message: Message,
) -> Result<Accepted, ApiError> {
    let Message {
        correlation,
        attributes,
        trace,
        body,
    } = message;
    let traceparent = trace.parent.to_string();
    let mut answered: Option<MessageId> = None;
    let claim = key.claim();
    let dispatched = state
        .dispatcher
        .send_with(&queue, &attributes, asker, claim, || {
            let (id, at_broker) = key.ids();
            answered = Some(id);
            OutgoingMessage {
                queue: queue.clone(),
                message_id: at_broker,
                correlation_id: correlation.clone().or_else(|| request_correlation(context)),
                body,
                attributes: std::sync::Arc::clone(&attributes),
                trace,
            }
        })
        .await;
    if let (Some(via), Some(took)) = (dispatched.via, dispatched.send_time) {
        state.observability.metrics.send_latency(via.as_str(), took);
    }
    match dispatched.result {
        Ok(receipt) => Ok(Accepted {
            queue,
            // A send that reached the backend was built, so its id is there.
            message_id: answered.unwrap_or_else(MessageId::generate),
            correlation,
            traceparent,
            taken: Taken::Queued {
                via: dispatched.via,
                duplicate: receipt.duplicate,
            },
        }),
        Err(e) => Err(context
            .error(Problem::from_dispatch(
                e,
                answered.as_ref(),
                state.edge.limits.max_body_bytes,
            ))
            .via(dispatched.via)
            .correlation(correlation.map(|c| c.to_string()))),
    }
}

/// Without a correlation id of its own, a message carries the client's request id (when
/// the client gave one that is a valid correlation id).
pub(crate) fn request_correlation(context: &RequestContext) -> Option<CorrelationId> {
    context
        .id_given()
        .then(|| CorrelationId::parse(context.id().as_str()).ok())
        .flatten()
}

impl Accepted {
    /// 201 `queued`, or 200 `valid` for a dry run (`X-Request-Id` comes from the context).
    fn into_response(self, request_id: &RequestId) -> HttpResponse {
        let mut answer = HttpResponse::build(self.taken.answer().0);
        if let Some(c) = &self.correlation {
            answer.insert_header((CORRELATION_ID, c.as_str()));
        }
        let traceparent = Some(self.traceparent.as_str().into());
        match self.taken {
            Taken::Validated => answer.json(Valid {
                traceparent,
                ..Valid::new(
                    self.queue.as_str(),
                    self.message_id.as_str(),
                    request_id.as_str(),
                )
            }),
            Taken::Queued { via, duplicate } => {
                if let Some(via) = via {
                    answer.insert_header((SENDGATE_BACKEND, via.as_str()));
                }
                answer.json(Queued {
                    traceparent,
                    ..Queued::new(
                        self.queue.as_str(),
                        self.message_id.as_str(),
                        request_id.as_str(),
                        duplicate,
                    )
                })
            }
        }
    }
}

/// `application/json`, in any case, optionally followed by parameters (`; charset=utf-8`).
/// A byte comparison: a full media-type parse on every send costs more than it checks.
pub(crate) fn is_json(req: &HttpRequest) -> bool {
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

/// The `Content-Length` the client announced, when it is a number.
pub(crate) fn announced_length(req: &HttpRequest) -> Option<usize> {
    req.headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

/// The body, refusing it as soon as it is known to be too large (from `Content-Length`
/// before reading, or while streaming when the length was not announced).
pub(crate) async fn read_body(
    mut payload: web::Payload,
    announced: Option<usize>,
    limit: usize,
) -> Result<Bytes, Problem> {
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

/// Whether `text` opens more than `limit` arrays and objects inside each other. Brackets in
/// strings do not count; the text need not be valid JSON (serde_json judges that after).
pub(crate) fn nests_deeper_than(text: &str, limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The parts of the request that are input, all checked before any is rejected so one 400
/// lists every problem.
pub(crate) struct Input {
    pub(crate) message_id: Option<MessageId>,
    pub(crate) correlation_header: Option<CorrelationId>,
    pub(crate) dry_run: bool,
    pub(crate) attributes: Attributes,
    /// The request's trace context (a new trace without a valid `traceparent`).
    pub(crate) trace: TraceContext,
}

impl Input {
    pub(crate) fn parse(
        req: &HttpRequest,
        body: &[u8],
        max_depth: usize,
        request_id_problem: Option<FieldError>,
    ) -> Result<Self, Problem> {
        let mut errors: Vec<FieldError> = request_id_problem.into_iter().collect();

        // JSON text is UTF-8; serde_json's slice reader would skip over invalid bytes
        // inside strings, so check the encoding first.
        match std::str::from_utf8(body) {
            Err(e) => errors.push(FieldError::new(&["body"], format!("not valid UTF-8: {e}"))),
            Ok(text) if nests_deeper_than(text, max_depth) => errors.push(FieldError::new(
                &["body"],
                format!(
                    "nested deeper than {max_depth} levels of arrays and objects \
                     (SENDGATE_MAX_JSON_DEPTH)"
                ),
            )),
            Ok(text) => {
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                    errors.push(FieldError::new(&["body"], format!("not valid JSON: {e}")));
                }
            }
        }
        let message_id = header_id(
            req,
            (&IDEMPOTENCY_KEY, spelling::IDEMPOTENCY_KEY),
            MessageId::parse,
            &mut errors,
        );
        let correlation_header = header_id(
            req,
            (&CORRELATION_ID, spelling::CORRELATION_ID),
            CorrelationId::parse,
            &mut errors,
        );
        let dry_run = dry_run(req, &mut errors);
        let attributes = header_attributes(req, &mut errors);
        if !errors.is_empty() {
            errors.truncate(MAX_FIELD_ERRORS);
            return Err(Problem::InvalidRequest { errors });
        }
        Ok(Self {
            message_id,
            correlation_header,
            dry_run,
            attributes,
            trace: request_trace(req),
        })
    }
}

/// `?dry_run=true|false|1|0`, or its problem.
pub(crate) fn dry_run(req: &HttpRequest, errors: &mut Vec<FieldError>) -> bool {
    match query_value(req, "dry_run") {
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
    }
}

/// The `Message-*` headers as attributes; each bad one (or one given twice) named.
fn header_attributes(req: &HttpRequest, errors: &mut Vec<FieldError>) -> Attributes {
    let headers = req.headers();
    let mut twice = Vec::new();
    let parsed = Attributes::parse(|field| {
        let mut values = headers.get_all(field.header_name());
        let first = values.next()?;
        if values.next().is_some() {
            twice.push(field);
        }
        Some(Raw::Header(first.as_bytes()))
    });
    for field in twice {
        errors.push(FieldError::new(
            &["header", field.header_name()],
            "must be given once",
        ));
    }
    match parsed {
        Ok(attributes) => attributes,
        Err(bad) => {
            errors.extend(
                bad.into_iter()
                    .map(|e| FieldError::new(&["header", e.field.header_name()], e.message)),
            );
            Attributes::default()
        }
    }
}

/// The request's W3C trace context: one `traceparent` (two make it invalid, as the spec
/// says), the `tracestate` headers joined; an invalid one is ignored, never a 400.
pub(crate) fn request_trace(req: &HttpRequest) -> TraceContext {
    with_trace_headers(req, TraceContext::from_request)
}

/// The request's trace context when it gave a valid one (an OpenTelemetry span's parent).
pub(crate) fn given_trace(req: &HttpRequest) -> Option<TraceContext> {
    with_trace_headers(req, TraceContext::given)
}

fn with_trace_headers<T>(req: &HttpRequest, f: impl FnOnce(Option<&str>, Option<&str>) -> T) -> T {
    let headers = req.headers();
    let mut parents = headers.get_all(TRACEPARENT);
    let parent = match (parents.next(), parents.next()) {
        (Some(one), None) => one.to_str().ok(),
        _ => None,
    };
    let states: Vec<&str> = headers
        .get_all(TRACESTATE)
        .filter_map(|v| v.to_str().ok())
        .collect();
    let state = (!states.is_empty()).then(|| states.join(","));
    f(parent, state.as_deref())
}

/// The header `name` parsed, or its problem (named with the contract's `spelled` name).
fn header_id<T>(
    req: &HttpRequest,
    (name, spelled): (&HeaderName, &str),
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
            errors.push(FieldError::new(&["header", spelled], e.to_string()));
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

    #[test]
    fn nesting_counts_arrays_and_objects_but_not_brackets_in_strings() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!nests_deeper_than(&nested(128), 128));
        assert!(nests_deeper_than(&nested(129), 128));
        assert!(!nests_deeper_than(r#"{"a":[{"b":1}],"c":{}}"#, 3));
        assert!(nests_deeper_than(r#"{"a":[{"b":1}]}"#, 2));
        assert!(!nests_deeper_than(r#"["[[[[", "\"[[[[", "{{{{\\"]"#, 1));
        assert!(
            nests_deeper_than(r#"["\\", [[]]]"#, 2),
            "an escaped backslash ends"
        );
        assert!(
            !nests_deeper_than("]]]]][", 1),
            "unbalanced: never below zero"
        );
    }
    use actix_web::test::TestRequest;

    fn with_type(value: &str) -> bool {
        is_json(
            &TestRequest::default()
                .insert_header((CONTENT_TYPE, value))
                .to_http_request(),
        )
    }

    #[test]
    fn a_key_is_scoped_to_its_caller_and_always_a_valid_deterministic_id() {
        let key = MessageId::parse("order-42").unwrap();
        assert_eq!(scoped_message_id("batch", &key).as_str(), "batch:order-42");
        assert_ne!(
            scoped_message_id("batch", &key),
            scoped_message_id("web", &key)
        );
        // Too long together: the key's hash after the name, the same every time.
        let long = MessageId::parse(&"k".repeat(128)).unwrap();
        let scoped = scoped_message_id("batch", &long);
        assert!(scoped.as_str().starts_with("batch:") && scoped.as_str().len() == 6 + 64);
        assert_eq!(scoped, scoped_message_id("batch", &long));
        // A name that cannot be part of an id: the hash of both.
        let odd = scoped_message_id("équipe bleue", &key);
        assert_eq!(odd.as_str().len(), 64);
        assert_eq!(odd, scoped_message_id("équipe bleue", &key));
        assert_ne!(odd, scoped_message_id("équipe rouge", &key));
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
