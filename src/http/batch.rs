//! `POST /v1/queues/{queue}/messages/batch`: up to `SENDGATE_MAX_BATCH_MESSAGES` messages in
//! one request (contract section 1, "Batches"). Every entry is checked before anything is sent (one
//! bad entry: `400`, nothing sent); capacity is all or nothing (one reservation of all the
//! entries); the backend sends them in as few broker operations as it allows, and the answer
//! is `201` when every entry is queued, else `207` with each entry's result.

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use sendgate_wire::{BatchMessage, BatchPartial, BatchQueued, EntryResult, Loc, Queued, Valid};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::body_budget::Buffered;
use super::context::RequestContext;
use super::errors::{whole_seconds, ApiError, FieldError, Problem, MAX_FIELD_ERRORS};
use super::send::{
    asked_criticality, authorize_send, dry_run, given_trace, nests_deeper_than, read_json_body,
    request_correlation, request_trace, Key,
};
use super::state::{AppState, BodyLimits};
use crate::admission::ceiling::Refusal;
use crate::admission::{BackendRole, DispatchError};
use crate::backend::{OutgoingMessage, SendError, SendReceipt};
use crate::domain::{Attributes, CorrelationId, Field, MessageId, QueueName, Raw, TraceContext};
use crate::metrics::RequestOutcome;

/// A `207`'s status, and the outcome's code in the metrics.
const PARTIAL: &str = BatchPartial::STATUS;

#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/messages/batch",
    tag = "send",
    operation_id = "send_batch",
    summary = "Put up to SENDGATE_MAX_BATCH_MESSAGES messages on a queue at once, or refuse them all (role sender or admin)",
    description = "The admission order of docs/contract.md section 1, for the batch as a whole: every entry is checked first (one bad entry is a 400 naming it, nothing is sent); the batch is admitted under the ceiling whole or refused whole (429 with `room`); then the backend sends it in as few broker operations as it allows. 201 when every entry is queued, 207 with one result per entry when some are not (retry exactly those, with the same idempotency keys). Every 429 and 503 carries an integer `Retry-After` of at least 1.",
    params(
        ("queue" = String, Path, description = "One of the queues this gateway serves (`SENDGATE_QUEUES`); any other is 404 `unknown_queue`.", example = "requests"),
        ("dry_run" = Option<bool>, Query, description = "Validate and answer 200 `valid` without any backend call (`true`/`false`, or `1`/`0`)."),
        ("traceparent" = Option<String>, Header, nullable = false, description = "W3C trace context: each message gets this trace with a parent id of its own. An invalid one (by the W3C rules) is ignored, never refused: the message gets a new trace."),
        ("tracestate" = Option<String>, Header, nullable = false, description = "W3C trace state, carried to every message with a valid traceparent; an invalid one (by the W3C rules: at most 32 members, 512 characters) is ignored, never refused."),
        ("Sendgate-Criticality" = Option<String>, Header, nullable = false, description = "`critical`, `default` or `sheddable`: lowers the level the send is made at (never above the key's `criticality`); a lower level is refused from its share of the ceiling (429 `queue_full`, `reason: criticality`). Anything else is a 400.", pattern = "^(critical|default|sheddable)$"),
        ("X-Request-Id" = Option<String>, Header, nullable = false, description = "This request's id, echoed; each entry's correlation id when it has none of its own. 1–128 printable ASCII characters.", min_length = 1, max_length = 128, pattern = r"^[ -~]{1,128}$"),
    ),
    request_body(
        description = "`{\"messages\": [...]}`: 1 to `SENDGATE_MAX_BATCH_MESSAGES` entries, at most `SENDGATE_MAX_BATCH_BYTES` in all. Each entry: `body` (any JSON value, at most `SENDGATE_MAX_BODY_BYTES`), optional `idempotency_key` and `correlation_id` (1–128 printable ASCII), and the attributes of docs/contract.md section 1 (Message attributes).",
        content = BatchBodySchema,
        content_type = "application/json",
    ),
    responses(
        (status = 201, description = "`queued`: every entry is in the queue, in the request's order.", body = BatchQueued,
            headers(
                ("X-Sendgate-Backend" = String, description = "`primary` or `fallback`: the backend that took them."),
                ("RateLimit-Policy" = String, description = "Only for a tenant with a rate quota: as on a single send's."),
                ("RateLimit" = String, description = "Only for a tenant with a rate quota: as on a single send's."),
            )),
        (status = 200, description = "`valid`: a dry run that would have been attempted.", body = BatchQueued),
        (status = 207, description = "`partial`: some entries are queued and some are not (`failed`, with the code a single send would have, `outcome: unknown` where the broker may hold it). Retry the failed ones with the same idempotency keys.", body = BatchPartial,
            headers(("X-Sendgate-Backend" = String, description = "The backend the batch went to."))),
        (status = 400, description = "`invalid_request`: malformed JSON, a bad entry (located as `[\"body\", \"messages\", 3, \"properties\"]`), too few or too many entries, or a bad `dry_run`; nothing was sent.", body = sendgate_wire::ErrorBody),
        (status = 401, description = "`unauthenticated`: no bearer token, or one that proves nothing (an unknown key, an Entra ID token that does not verify).", body = sendgate_wire::ErrorBody,
            headers(("WWW-Authenticate" = String, description = "`Bearer` when no token was given; `Bearer error=\"invalid_token\"` when one was (RFC 6750)"))),
        (status = 403, description = "`forbidden` (the key lacks the role or the queue), or `forbidden_host` (open mode).", body = sendgate_wire::ErrorBody),
        (status = 404, description = "`unknown_queue`: the gateway does not serve this queue.", body = sendgate_wire::ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive within `SENDGATE_BODY_TIMEOUT_MS`; nothing was sent.", body = sendgate_wire::ErrorBody),
        (status = 409, description = "`queue_disabled` at the broker.", body = sendgate_wire::ErrorBody),
        (status = 413, description = "`payload_too_large`: the request is over `SENDGATE_MAX_BATCH_BYTES` (`limit_bytes`).", body = sendgate_wire::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not `application/json`.", body = sendgate_wire::ErrorBody),
        (status = 422, description = "`unsupported_attribute`: an entry has an attribute the backend it would go to cannot carry (`attribute`, `backend`); nothing was sent. (An entry whose `idempotency_key` was used for another message, on the embedded backend, is refused in a `207` as `idempotency_key_reused`.)", body = sendgate_wire::ErrorBody),
        (status = 429, description = "`queue_full`: the whole batch does not fit under the ceiling (or its criticality's cut, its tenant's share or quota: `reason`); `room` says how many entries would be admitted now (as a single send's 429 otherwise).", body = sendgate_wire::ErrorBody,
            headers(
                ("Retry-After" = u64, description = "Whole seconds to wait, at least 1."),
                ("RateLimit-Policy" = String, description = "Only for a tenant with a rate quota: as on a single send's."),
                ("RateLimit" = String, description = "Only for a tenant with a rate quota: as on a single send's."),
            )),
        (status = 503, description = "`draining`, `starting`, `saturated`, `capacity_unknown`, `backend_unavailable`: as for a single send, for the whole batch.", body = sendgate_wire::ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds to wait, at least 1."))),
    )
)]
pub async fn send_batch(
    req: HttpRequest,
    context: RequestContext,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let queue_label = state.edge.queue_label(&path);
    let mut tenant = None;
    let mut entries = None;
    let span = super::otel::start(state.observability.otel.as_deref(), queue_label, || {
        given_trace(&req)
    });
    let answer = admit_and_send(
        &req,
        &context,
        &path,
        payload,
        &state,
        (&mut tenant, &mut entries),
        span.as_ref(),
    )
    .await;
    let counted = outcome(&answer);
    state.observability.metrics.request(queue_label, &counted);
    if let Some(span) = span {
        let ended = super::otel::Ended {
            outcome: &counted,
            refusal: answer.as_ref().err(),
            dry_run: matches!(answer, Ok(Answer::Whole { dry_run: true, .. })),
            message_id: None,
            message_count: entries,
            tenant,
        };
        super::otel::end(span, &state.dispatcher, &state.edge.auth, ended);
    }
    let rate_limit =
        tenant.and_then(|t| crate::http::ratelimit::RateLimitFields::for_tenant(&state.rates, t));
    crate::http::ratelimit::on_answer(
        answer.map(|answer| answer.into_response(context.id().as_str())),
        rate_limit,
    )
}

/// The schema of the request body, for the OpenAPI document: an unknown member is refused
/// (`Envelope`, `RawEntry`), so neither schema admits one.
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BatchBodySchema {
    /// 1 to `SENDGATE_MAX_BATCH_MESSAGES` entries.
    #[schema(min_items = 1)]
    messages: Vec<BatchEntrySchema>,
}

/// One entry of a batch (the attributes as contract section 1, "Message attributes" defines them).
#[derive(utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct BatchEntrySchema {
    /// The message itself: any JSON value, delivered as its text.
    body: serde_json::Value,
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -~]{1,128}$")]
    idempotency_key: Option<String>,
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -~]{1,128}$")]
    correlation_id: Option<String>,
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"
    )]
    subject: Option<String>,
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"
    )]
    session_id: Option<String>,
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"
    )]
    partition_key: Option<String>,
    #[schema(minimum = 1, maximum = 4294967)]
    time_to_live_s: Option<u64>,
    #[schema(schema_with = super::schema::scheduled_enqueue_time_or_null)]
    scheduled_enqueue_time: Option<String>,
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"
    )]
    reply_to: Option<String>,
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*$"
    )]
    to: Option<String>,
    /// Application properties (`MessageProperties`).
    #[schema(schema_with = super::schema::message_properties_or_null)]
    properties: Option<HashMap<String, serde_json::Value>>,
}

/// What the batch's answer is.
enum Answer {
    /// Every entry queued (or, on a dry run, valid).
    Whole {
        queue: QueueName,
        via: Option<BackendRole>,
        dry_run: bool,
        entries: Vec<Sent>,
    },
    /// Some entries are not queued.
    Partial {
        queue: QueueName,
        via: Option<BackendRole>,
        entries: Vec<Sent>,
        /// The longest wait a failed entry's broker asked for.
        retry_after: Option<std::time::Duration>,
    },
}

/// One entry's id, trace and result.
struct Sent {
    message_id: MessageId,
    traceparent: String,
    result: Result<SendReceipt, Problem>,
}

fn outcome(answer: &Result<Answer, ApiError>) -> RequestOutcome {
    match answer {
        Ok(answer) => {
            let (status, code) = answer.status();
            RequestOutcome {
                status,
                code,
                backend: answer.via(),
            }
        }
        Err(e) => e.outcome(),
    }
}

/// `tenant` is set once the caller is known (its answers carry its rate quota's fields).
async fn admit_and_send(
    req: &HttpRequest,
    context: &RequestContext,
    queue: &str,
    payload: web::Payload,
    state: &AppState,
    (tenant, count): (
        &mut Option<crate::admission::tenants::TenantIndex>,
        &mut Option<usize>,
    ),
    span: Option<&crate::otel::SendSpan<'_>>,
) -> Result<Answer, ApiError> {
    let edge = &state.edge;
    let (queue, caller, asker) = authorize_send(req, context, queue, edge).await?;
    *tenant = Some(asker.tenant);
    let _in_flight = state
        .lifecycle
        .admit_send()
        .map_err(|n| context.error(n.into()))?;
    let limit = edge.limits.max_batch_bytes;
    let (body, _buffered) = read_json_body(req, payload, edge, limit, Buffered::Twice)
        .await
        .map_err(|problem| context.error(problem))?;
    let mut errors: Vec<FieldError> = context.header_problem().into_iter().collect();
    let asker = asked_criticality(req, asker).unwrap_or_else(|e| {
        errors.push(e);
        asker
    });
    let dry_run = dry_run(req, &mut errors);
    let entries = parse_entries(&body, &edge.limits, &mut errors);
    if !errors.is_empty() {
        errors.truncate(MAX_FIELD_ERRORS);
        return Err(context.error(Problem::InvalidRequest { errors }));
    }
    *count = Some(entries.len());
    // With OpenTelemetry on, the messages are the batch span's children (each with a
    // parent id of its own, as without).
    let trace = request_trace(req);
    let trace = span.and_then(|span| span.trace(&trace)).unwrap_or(trace);
    if dry_run {
        return validate(context, state, queue, entries, &trace);
    }
    dispatch(context, state, queue, caller, asker, entries, &trace).await
}

/// A dry run: what the batch would be refused for before capacity (an attribute the backend
/// cannot carry), else each entry's id and trace as a send would make them; no broker call.
fn validate(
    context: &RequestContext,
    state: &AppState,
    queue: QueueName,
    entries: Vec<Entry>,
    trace: &TraceContext,
) -> Result<Answer, ApiError> {
    for entry in &entries {
        if let Some((attribute, backend)) = state.dispatcher.unsupported(&entry.attributes) {
            return Err(context.error(Problem::UnsupportedAttribute {
                attribute: attribute.json_name(),
                backend,
            }));
        }
    }
    let entries = entries
        .into_iter()
        .map(|entry| Sent {
            message_id: entry.key.unwrap_or_else(MessageId::generate),
            traceparent: trace.for_message().parent.to_string(),
            result: Ok(SendReceipt { duplicate: false }),
        })
        .collect();
    Ok(Answer::Whole {
        queue,
        via: None,
        dry_run: true,
        entries,
    })
}

/// The request body's envelope: the entries, each parsed on its own so a bad one is named.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    #[serde(borrow)]
    messages: Entries<'a>,
}

/// The entries, at most [`MAX_ENTRIES_READ`]: a megabyte of `[1,1,1,…]` would otherwise
/// become half a million references (16 bytes each: eight times the body it came from).
struct Entries<'a>(Vec<&'a RawValue>);

/// More than `SENDGATE_MAX_BATCH_MESSAGES` can be (1000): past it, the count is all the
/// 400 needs.
const MAX_ENTRIES_READ: usize = 1001;

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of entries")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(128));
                while let Some(entry) = seq.next_element::<&'de RawValue>()? {
                    if entries.len() == MAX_ENTRIES_READ {
                        return Err(serde::de::Error::custom(format!(
                            "more than {} entries",
                            MAX_ENTRIES_READ - 1
                        )));
                    }
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_seq(Visit)
    }
}

/// One entry's fields as JSON, before each is parsed; an unknown field is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry<'a> {
    #[serde(borrow)]
    body: &'a RawValue,
    idempotency_key: Option<Value>,
    correlation_id: Option<Value>,
    subject: Option<Value>,
    session_id: Option<Value>,
    partition_key: Option<Value>,
    time_to_live_s: Option<Value>,
    scheduled_enqueue_time: Option<Value>,
    reply_to: Option<Value>,
    to: Option<Value>,
    /// As its text: a name given twice is refused, which a parsed object no longer shows.
    #[serde(borrow)]
    properties: Option<&'a RawValue>,
}

impl RawEntry<'_> {
    fn attribute(&self, field: Field) -> Option<Raw<'_>> {
        let value = match field {
            Field::Subject => self.subject.as_ref(),
            Field::SessionId => self.session_id.as_ref(),
            Field::PartitionKey => self.partition_key.as_ref(),
            Field::TimeToLive => self.time_to_live_s.as_ref(),
            Field::ScheduledEnqueueTime => self.scheduled_enqueue_time.as_ref(),
            Field::ReplyTo => self.reply_to.as_ref(),
            Field::To => self.to.as_ref(),
            Field::Properties => return self.properties.map(|p| Raw::JsonText(p.get())),
        };
        value.map(Raw::Json)
    }
}

/// One entry, parsed.
struct Entry {
    key: Option<MessageId>,
    correlation: Option<CorrelationId>,
    attributes: Arc<Attributes>,
    /// A slice of the request's body: no copy.
    body: Bytes,
}

/// Where an entry's problem is: `["body", "messages", index, ...]`.
fn at(index: usize, field: Option<&str>) -> Vec<Loc> {
    let mut loc = vec![Loc::from("body"), Loc::from("messages"), Loc::from(index)];
    loc.extend(field.map(Loc::from));
    loc
}

/// Every entry, or every problem with them (in `errors`); nothing is sent unless all parse.
fn parse_entries(body: &Bytes, limits: &BodyLimits, errors: &mut Vec<FieldError>) -> Vec<Entry> {
    let text = match std::str::from_utf8(body) {
        Ok(text) => text,
        Err(e) => {
            errors.push(FieldError::new(&["body"], format!("not valid UTF-8: {e}")));
            return Vec::new();
        }
    };
    // The envelope, the array and the entry hold each body three levels down.
    let depth = limits.max_json_depth + 3;
    if nests_deeper_than(text, depth) {
        errors.push(FieldError::new(
            &["body"],
            format!(
                "an entry's body is nested deeper than {} levels of arrays and objects \
                 (SENDGATE_MAX_JSON_DEPTH)",
                limits.max_json_depth
            ),
        ));
        return Vec::new();
    }
    let envelope: Envelope = match serde_json::from_str(text) {
        Ok(envelope) => envelope,
        Err(e) => {
            errors.push(FieldError::new(
                &["body"],
                format!("must be {{\"messages\": [...]}}: {e}"),
            ));
            return Vec::new();
        }
    };
    let count = envelope.messages.0.len();
    if count == 0 || count > limits.max_batch_messages {
        errors.push(FieldError::new(
            &["body", "messages"],
            format!(
                "must hold 1 to {} entries (SENDGATE_MAX_BATCH_MESSAGES), not {count}",
                limits.max_batch_messages
            ),
        ));
        return Vec::new();
    }
    let mut seen: HashMap<MessageId, usize> = HashMap::new();
    let mut entries = Vec::with_capacity(count);
    for (index, raw) in envelope.messages.0.into_iter().enumerate() {
        // Past the most one 400 lists, the rest is not worth parsing: nothing is sent anyway.
        if errors.len() >= MAX_FIELD_ERRORS {
            break;
        }
        let max_body_bytes = limits.max_body_bytes;
        if let Some(entry) = parse_entry(index, raw, body, max_body_bytes, &mut seen, errors) {
            entries.push(entry);
        }
    }
    entries
}

/// Entry `index`, or its problems (in `errors`); `seen` holds the keys of the entries
/// before it, so one batch cannot hold one message twice.
fn parse_entry(
    index: usize,
    raw: &RawValue,
    body: &Bytes,
    max_body_bytes: usize,
    seen: &mut HashMap<MessageId, usize>,
    errors: &mut Vec<FieldError>,
) -> Option<Entry> {
    let entry: RawEntry = match serde_json::from_str(raw.get()) {
        Ok(entry) => entry,
        Err(e) => {
            errors.push(FieldError::at(
                at(index, None),
                format!("must be an object with a body: {e}"),
            ));
            return None;
        }
    };
    let before = errors.len();
    let message = entry.body.get();
    if message.len() > max_body_bytes {
        errors.push(FieldError::at(
            at(index, Some("body")),
            format!("must be at most {max_body_bytes} bytes (SENDGATE_MAX_BODY_BYTES)"),
        ));
    }
    let key = entry_key(index, &entry, seen, errors);
    let correlation = id_field(
        index,
        "correlation_id",
        entry.correlation_id.as_ref(),
        CorrelationId::parse,
        errors,
    );
    let attributes = entry_attributes(index, &entry, errors);
    (errors.len() == before).then(|| Entry {
        key,
        correlation,
        attributes: Arc::new(attributes),
        body: body.slice_ref(message.as_bytes()),
    })
}

/// Entry `index`'s idempotency key, or its problem: not an id, or one an entry before it has.
fn entry_key(
    index: usize,
    entry: &RawEntry<'_>,
    seen: &mut HashMap<MessageId, usize>,
    errors: &mut Vec<FieldError>,
) -> Option<MessageId> {
    let key = id_field(
        index,
        "idempotency_key",
        entry.idempotency_key.as_ref(),
        MessageId::parse,
        errors,
    )?;
    if let Some(first) = seen.insert(key.clone(), index) {
        errors.push(FieldError::at(
            at(index, Some("idempotency_key")),
            format!("repeats entry {first}'s: one batch cannot hold one message twice"),
        ));
    }
    Some(key)
}

/// Entry `index`'s attributes, or each bad one's problem (and none).
fn entry_attributes(
    index: usize,
    entry: &RawEntry<'_>,
    errors: &mut Vec<FieldError>,
) -> Attributes {
    match Attributes::parse(|field| entry.attribute(field)) {
        Ok(attributes) => attributes,
        Err(bad) => {
            errors.extend(
                bad.into_iter()
                    .map(|e| FieldError::at(at(index, Some(e.field.json_name())), e.message)),
            );
            Attributes::default()
        }
    }
}

/// An id field of an entry (a JSON string, parsed), or its problem.
fn id_field<T>(
    index: usize,
    name: &str,
    value: Option<&Value>,
    parse: fn(&str) -> Result<T, crate::domain::IdError>,
    errors: &mut Vec<FieldError>,
) -> Option<T> {
    let value = value?;
    let parsed = match value {
        Value::String(s) => parse(s).map_err(|e| e.to_string()),
        _ => Err("must be a string".to_owned()),
    };
    match parsed {
        Ok(id) => Some(id),
        Err(msg) => {
            errors.push(FieldError::at(at(index, Some(name)), msg));
            None
        }
    }
}

/// Steps 5 to 8 for the batch; the messages (and their ids) are made once it is admitted.
async fn dispatch(
    context: &RequestContext,
    state: &AppState,
    queue: QueueName,
    caller: Option<Arc<crate::http::auth::Principal>>,
    asker: crate::admission::fair::Asker,
    entries: Vec<Entry>,
    trace: &TraceContext,
) -> Result<Answer, ApiError> {
    let attributes: Vec<Arc<Attributes>> =
        entries.iter().map(|e| Arc::clone(&e.attributes)).collect();
    let refs: Vec<&Attributes> = attributes.iter().map(Arc::as_ref).collect();
    let request_correlation = request_correlation(context);
    let mut answered: Vec<(MessageId, String)> = Vec::new();
    let dispatched = state
        .dispatcher
        .send_batch(&queue, &refs, asker, || {
            entries
                .into_iter()
                .map(|entry| {
                    let made = outgoing(entry, &queue, &caller, &request_correlation, trace);
                    answered.push(made.answered);
                    made.message
                })
                .collect()
        })
        .await;
    if let (Some(via), Some(took)) = (dispatched.via, dispatched.send_time) {
        state.observability.metrics.send_latency(via.as_str(), took);
    }
    let max_body_bytes = state.edge.limits.max_body_bytes;
    match dispatched.result {
        Ok(results) => Ok(answer(
            queue,
            dispatched.via,
            answered,
            results,
            max_body_bytes,
        )),
        Err(e) => Err(refused(context, max_body_bytes, e).via(dispatched.via)),
    }
}

/// One entry's message, and its id and traceparent as the answer gives them.
struct Made {
    message: OutgoingMessage,
    answered: (MessageId, String),
}

/// An entry made a message: its id scoped to the caller, a trace context of its own, and
/// the request's id as its correlation id when it has none of its own.
fn outgoing(
    entry: Entry,
    queue: &QueueName,
    caller: &Option<Arc<crate::http::auth::Principal>>,
    request_correlation: &Option<CorrelationId>,
    trace: &TraceContext,
) -> Made {
    let (id, at_broker) = Key {
        given: entry.key,
        caller: caller.clone(),
    }
    .ids();
    let trace = trace.for_message();
    let answered = (id, trace.parent.to_string());
    let message = OutgoingMessage {
        queue: queue.clone(),
        message_id: at_broker,
        correlation_id: entry.correlation.or_else(|| request_correlation.clone()),
        body: entry.body,
        attributes: entry.attributes,
        trace,
    };
    Made { message, answered }
}

/// The batch as sent: whole when every entry is queued, else partial, waiting as long as
/// the longest wait a failed entry's broker asked for.
fn answer(
    queue: QueueName,
    via: Option<BackendRole>,
    answered: Vec<(MessageId, String)>,
    results: Vec<Result<SendReceipt, SendError>>,
    max_body_bytes: usize,
) -> Answer {
    let mut retry_after = None;
    let entries: Vec<Sent> = answered
        .into_iter()
        .zip(results)
        .map(|((message_id, traceparent), result)| {
            let result = result.map_err(|e| {
                let problem = Problem::from_dispatch(
                    DispatchError::Send(e),
                    Some(&message_id),
                    max_body_bytes,
                );
                retry_after = retry_after.max(problem.retry_after());
                problem
            });
            Sent {
                message_id,
                traceparent,
                result,
            }
        })
        .collect();
    if entries.iter().all(|e| e.result.is_ok()) {
        Answer::Whole {
            queue,
            via,
            dry_run: false,
            entries,
        }
    } else {
        Answer::Partial {
            queue,
            via,
            entries,
            retry_after,
        }
    }
}

/// The whole batch refused: as a single send's refusal, a `429` naming the room there is.
fn refused(context: &RequestContext, max_body_bytes: usize, e: DispatchError) -> ApiError {
    let room = match &e {
        DispatchError::Refused(
            Refusal::QueueFull { room, .. }
            | Refusal::Shed { room, .. }
            | Refusal::TenantShare { room, .. }
            | Refusal::TenantQuota { room, .. },
        ) => Some(*room),
        _ => None,
    };
    let mut problem = Problem::from_dispatch(e, None, max_body_bytes);
    if let Problem::QueueFull { room: r, .. }
    | Problem::Shed { room: r, .. }
    | Problem::TenantShare { room: r, .. }
    | Problem::TenantQuota { room: r, .. } = &mut problem
    {
        *r = room;
    }
    context.error(problem)
}

impl Answer {
    /// The three successes: 200 `valid` (a dry run), 201 `queued`, 207 `partial`.
    fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Answer::Whole { dry_run: true, .. } => (StatusCode::OK, Valid::STATUS),
            Answer::Whole { .. } => (StatusCode::CREATED, Queued::STATUS),
            Answer::Partial { .. } => (StatusCode::MULTI_STATUS, PARTIAL),
        }
    }

    /// The backend the batch went to (none on a dry run, or refused before one was chosen).
    fn via(&self) -> Option<BackendRole> {
        match self {
            Answer::Whole { via, .. } | Answer::Partial { via, .. } => *via,
        }
    }

    fn into_response(self, request_id: &str) -> HttpResponse {
        let (status, code) = self.status();
        let mut answer = HttpResponse::build(status);
        if let Some(via) = self.via() {
            answer.insert_header((super::headers::SENDGATE_BACKEND, via.as_str()));
        }
        match self {
            Answer::Whole {
                queue,
                dry_run,
                entries,
                ..
            } => answer.json(BatchQueued {
                status: code.into(),
                dry_run,
                queue: queue.as_str().into(),
                request_id: request_id.into(),
                count: entries.len(),
                messages: entries.iter().map(Sent::message).collect(),
            }),
            Answer::Partial {
                queue,
                entries,
                retry_after,
                ..
            } => {
                if let Some(after) = retry_after {
                    answer.insert_header((
                        actix_web::http::header::RETRY_AFTER,
                        whole_seconds(after),
                    ));
                }
                let results: Vec<EntryResult> = entries
                    .iter()
                    .enumerate()
                    .map(|(index, e)| entry_result(index, e))
                    .collect();
                let failed = results.iter().filter(|r| r.failed()).count();
                answer.json(BatchPartial {
                    status: code.into(),
                    queue: queue.as_str().into(),
                    request_id: request_id.into(),
                    queued: results.len() - failed,
                    failed,
                    results,
                })
            }
        }
    }
}

impl Sent {
    /// A queued (or, on a dry run, valid) entry as a `201`'s list gives it.
    fn message(&self) -> BatchMessage<'_> {
        BatchMessage {
            message_id: self.message_id.as_str().into(),
            traceparent: self.traceparent.as_str().into(),
            duplicate: self.result.as_ref().is_ok_and(|r| r.duplicate),
        }
    }
}

fn entry_result(index: usize, e: &Sent) -> EntryResult<'_> {
    let base = EntryResult {
        index,
        status: EntryResult::QUEUED.into(),
        message_id: e.message_id.as_str().into(),
        traceparent: Some(e.traceparent.as_str().into()),
        code: None,
        message: None,
        outcome: None,
        duplicate: false,
    };
    match &e.result {
        Ok(receipt) => EntryResult {
            duplicate: receipt.duplicate,
            ..base
        },
        Err(problem) => EntryResult {
            status: EntryResult::FAILED.into(),
            code: Some(problem.code().into()),
            message: Some(problem.to_string().into()),
            outcome: matches!(
                problem,
                Problem::SendTimeout { .. }
                    | Problem::SendFailed {
                        unknown_message_id: Some(_),
                        ..
                    }
            )
            .then(|| sendgate_wire::ErrorBody::OUTCOME_UNKNOWN.into()),
            ..base
        },
    }
}
