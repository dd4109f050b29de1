//! A batch: the messages as entries, planned in order into requests under the gateway's
//! limits, and what each answer means for each entry (only the failed or unknown ones
//! are sent again, with their same ids).

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::HeaderValue;
use sendgate_wire::{
    AnyCode, BatchEntry, CorrelationId, ErrorCode, GatewayState, Loc, MessageAttributes, MessageId,
};
use tokio::time::Instant;

use crate::message::{key_of, traceparent_of};
use crate::retry::{is_retryable_status, RetryKind};
use crate::send_loop::{no_token, Load, Step, Tries};
use crate::transport::{BatchAnswer, OutgoingBatch, Transport, TransportError};
use crate::{AttemptError, Client, GaveUp, Inner, Message, SendOutcome};

impl Client {
    /// The entries packed in order into requests under the limits in use; an entry that
    /// alone is over the byte limit gets its outcome here, without a request.
    pub(crate) fn plan(
        &self,
        entries: Vec<Entry>,
        outcomes: &mut [Option<SendOutcome>],
    ) -> Vec<Vec<Entry>> {
        let max_messages = self.inner.max_batch_messages.load(Ordering::Relaxed).max(1);
        let max_bytes = self.inner.max_batch_bytes.load(Ordering::Relaxed);
        let mut requests: Vec<Vec<Entry>> = Vec::new();
        let mut current: Vec<Entry> = Vec::new();
        let mut bytes = 0;
        for entry in entries {
            let alone = request_bytes(1, entry.json.len());
            if alone > max_bytes {
                outcomes[entry.index] = Some(SendOutcome::Invalid {
                    reason: format!(
                        "alone in a batch request it makes {alone} bytes, over the {max_bytes} a request may have (max_batch_bytes, or the gateway's smaller limit)"
                    ),
                });
                continue;
            }
            let fits = current.len() < max_messages
                && request_bytes(current.len() + 1, bytes + entry.json.len()) <= max_bytes
                && current
                    .first()
                    .is_none_or(|first| first.traceparent == entry.traceparent);
            if !fits {
                requests.push(std::mem::take(&mut current));
                bytes = 0;
            }
            bytes += entry.json.len();
            current.push(entry);
        }
        if !current.is_empty() {
            requests.push(current);
        }
        requests
    }

    /// A request the gateway found too large, planned again under the limits it taught;
    /// in two halves at least, so that every split makes progress.
    pub(crate) fn replan(
        &self,
        entries: Vec<Entry>,
        outcomes: &mut [Option<SendOutcome>],
    ) -> Vec<Vec<Entry>> {
        let count = entries.len();
        let mut again = self.plan(entries, outcomes);
        if again.len() == 1 && count > 1 {
            if let Some(mut whole) = again.pop() {
                let second = whole.split_off(count / 2);
                again = vec![whole, second];
            }
        }
        again
    }
}

/// One entry of a batch, checked and written as its JSON text once.
pub(crate) struct Entry {
    /// Its place in the caller's list.
    index: usize,
    key: MessageId,
    attributes: MessageAttributes,
    /// The text the planner groups by: entries of one request share a trace.
    traceparent: Option<String>,
    traceparent_header: Option<HeaderValue>,
    /// The entry in a request's `messages`, its key in it.
    json: Vec<u8>,
    /// The last attempt's error for this entry (a `207` names one per entry).
    last_error: Option<AttemptError>,
    outcome: Option<SendOutcome>,
}

impl Entry {
    fn is_queued(&self) -> bool {
        matches!(self.outcome, Some(SendOutcome::Queued { .. }))
    }
}

/// A message as a batch entry: an id (made here when it has none), its body checked as
/// JSON (one bad body would make the whole request malformed), its text written once.
pub(crate) fn entry(index: usize, message: Message) -> Result<Entry, String> {
    let key = key_of(message.idempotency_key.as_deref())?;
    if let Some(correlation) = message.correlation_id.as_deref() {
        CorrelationId::parse(correlation).map_err(|e| format!("correlation_id: {e}"))?;
    }
    let traceparent_header = traceparent_of(message.traceparent.as_deref())?;
    let text = String::from_utf8(message.body.to_vec())
        .map_err(|e| format!("body: not valid UTF-8: {e}"))?;
    // serde_json's raw values are on: the wire crate's `BatchEntry` needs them.
    let body = serde_json::value::RawValue::from_string(text)
        .map_err(|e| format!("body: not valid JSON: {e}"))?;
    let wire = BatchEntry {
        body,
        idempotency_key: Some(key.as_str().to_owned()),
        correlation_id: message.correlation_id,
        attributes: message.attributes,
    };
    let json = serde_json::to_vec(&wire).map_err(|e| format!("entry: {e}"))?;
    Ok(Entry {
        index,
        key,
        attributes: wire.attributes,
        traceparent: message.traceparent,
        traceparent_header,
        json,
        last_error: None,
        outcome: None,
    })
}

const REQUEST_HEAD: &[u8] = br#"{"messages":["#;
const REQUEST_TAIL: &[u8] = b"]}";

/// The size of a request's body holding `entries` entries of `entry_bytes` bytes in all.
fn request_bytes(entries: usize, entry_bytes: usize) -> usize {
    REQUEST_HEAD.len() + entry_bytes + entries.saturating_sub(1) + REQUEST_TAIL.len()
}

/// The entries of one batch request, as the send loop carries them.
pub(crate) struct Batch {
    entries: Vec<Entry>,
    traceparent: Option<HeaderValue>,
    /// Positions in `entries` still undecided, in order.
    pending: Vec<usize>,
    /// Positions the last request carried.
    sent: Vec<usize>,
    /// A `429 queue_full` named room for this many: the next request carries only them...
    room: Option<usize>,
    /// ...and the rest wait until then (a retry of this kind).
    rest: Option<(Instant, RetryKind)>,
    /// The last request carried only the room of a 429: another 429 is waited out.
    room_round: bool,
}

impl Batch {
    pub(crate) fn new(entries: Vec<Entry>) -> Self {
        Self {
            traceparent: entries.first().and_then(|e| e.traceparent_header.clone()),
            pending: (0..entries.len()).collect(),
            entries,
            sent: Vec::new(),
            room: None,
            rest: None,
            room_round: false,
        }
    }

    /// The outcomes decided, by the caller's index, and the entries still undecided (to be
    /// planned again after a split).
    pub(crate) fn into_parts(self) -> (Vec<(usize, SendOutcome)>, Vec<Entry>) {
        let mut done = Vec::new();
        let mut left = Vec::new();
        for mut entry in self.entries {
            match entry.outcome.take() {
                Some(outcome) => done.push((entry.index, outcome)),
                None => left.push(entry),
            }
        }
        (done, left)
    }

    fn decide(&mut self, position: usize, outcome: SendOutcome) {
        if let Some(entry) = self.entries.get_mut(position) {
            entry.outcome = Some(outcome);
        }
    }

    /// Every entry the last request carried gets `outcome`.
    fn decide_sent(&mut self, outcome: impl Fn() -> SendOutcome) {
        for position in self.sent.clone() {
            self.decide(position, outcome());
        }
    }

    /// Read the answer for the entries sent; what is left, and when it goes.
    fn read(
        &mut self,
        tries: &mut Tries,
        answer: Result<BatchAnswer, TransportError>,
        client: &Inner,
    ) -> Step {
        let a = match answer {
            Ok(a) => a,
            Err(e) => return self.read_unanswered(tries, e),
        };
        let status = a.status;
        if status == 207 {
            return self.read_partial(tries, &a);
        }
        if (200..300).contains(&status) {
            self.read_queued(tries, &a);
            return Step::Done;
        }
        if status == 401 || status == 403 {
            // No entry can go with this credential: the unsent ones neither.
            for position in self.pending.clone() {
                self.decide(
                    position,
                    SendOutcome::AuthFailed {
                        status,
                        code: a.code.clone(),
                    },
                );
            }
            return Step::Done;
        }
        let known = a.code.as_ref().and_then(AnyCode::known);
        match (status, known) {
            (400, Some(ErrorCode::InvalidRequest)) => self.read_invalid(&a, client),
            (413, _) if self.sent.len() > 1 => {
                if let Some(limit) = a.limit_bytes {
                    client
                        .max_batch_bytes
                        .fetch_min(limit.max(1), Ordering::Relaxed);
                }
                Step::Split
            }
            (422, Some(ErrorCode::UnsupportedAttribute)) => self.read_unsupported_attribute(&a),
            _ => self.read_failed(tries, &a, known),
        }
    }

    /// No answer: the token source had none (nothing was sent), or the request was cut or
    /// timed out after it was sent.
    fn read_unanswered(&mut self, tries: &mut Tries, error: TransportError) -> Step {
        match error {
            TransportError::NoToken(e) => {
                // Nothing was sent: no entry can go until the source has a token.
                for position in self.pending.clone() {
                    let last_error = self.entries[position].last_error.clone();
                    self.decide(position, no_token(e.clone(), last_error, tries.attempts));
                }
                Step::Done
            }
            e => {
                // Cut or timed out after it was sent: every entry's outcome is unknown.
                tries.attempts += 1;
                tries.refused = true;
                let error = AttemptError::Transport(e.to_string());
                self.fail_sent(&error);
                tries.last_error = Some(error);
                Step::Retry {
                    retry_after: None,
                    kind: RetryKind::Transient,
                }
            }
        }
    }

    /// A `2xx`: every entry sent is queued, under the id the gateway names (else its key).
    fn read_queued(&mut self, tries: &mut Tries, a: &BatchAnswer) {
        tries.queued = true;
        for (k, position) in self.sent.clone().into_iter().enumerate() {
            let message_id = match a.queued.get(k) {
                Some(m) => m.message_id.to_string(),
                None => self.entries[position].key.to_string(),
            };
            self.decide(position, SendOutcome::Queued { message_id });
        }
    }

    /// A `422 unsupported_attribute`: the entries that carry the attribute are refused, as
    /// each would be alone, and the others sent again at once; when none carries it,
    /// every entry is refused.
    fn read_unsupported_attribute(&mut self, a: &BatchAnswer) -> Step {
        let refused = || SendOutcome::Refused {
            status: a.status,
            code: a.code.clone(),
        };
        let carrying: Vec<usize> = self
            .sent
            .iter()
            .copied()
            .filter(|&p| {
                a.attribute
                    .as_deref()
                    .is_some_and(|name| has_attribute(&self.entries[p].attributes, name))
            })
            .collect();
        if carrying.is_empty() {
            self.decide_sent(refused);
            return Step::Done;
        }
        for position in carrying {
            self.decide(position, refused());
        }
        Step::Now
    }

    /// Any other answer: an attempt that failed for every entry sent, retried when its
    /// status allows, else each entry's final outcome.
    fn read_failed(
        &mut self,
        tries: &mut Tries,
        a: &BatchAnswer,
        known: Option<ErrorCode>,
    ) -> Step {
        let status = a.status;
        tries.attempts += 1;
        let error = AttemptError::Status {
            status,
            code: a.code.clone(),
        };
        if is_retryable_status(status) {
            let kind = RetryKind::of(status, a.retry_after);
            tries.refused = true;
            self.fail_sent(&error);
            tries.last_error = Some(error);
            // Room for some: those go at once (never more than the room), the rest after
            // the Retry-After. Once per 429: a second one is waited out whole.
            let room = a.room.and_then(|r| usize::try_from(r).ok()).unwrap_or(0);
            if known == Some(ErrorCode::QueueFull)
                && room > 0
                && room < self.sent.len()
                && !self.room_round
            {
                self.room = Some(room);
                self.rest = Some((Instant::now() + a.retry_after.unwrap_or_default(), kind));
                return Step::Now;
            }
            return Step::Retry {
                retry_after: a.retry_after,
                kind,
            };
        }
        if status >= 500 {
            let attempts = tries.attempts;
            self.decide_sent(|| SendOutcome::Failed {
                last_error: error.clone(),
                attempts,
                gave_up: GaveUp::NotRetryable,
            });
        } else {
            self.decide_sent(|| SendOutcome::Refused {
                status,
                code: a.code.clone(),
            });
        }
        Step::Done
    }

    fn fail_sent(&mut self, error: &AttemptError) {
        for position in self.sent.clone() {
            self.entries[position].last_error = Some(error.clone());
        }
    }

    /// A `207`: each entry's own result. Only the failed ones a retry can help (a retryable
    /// code, or an outcome unknown: the same id keeps a retry from storing it twice) stay.
    fn read_partial(&mut self, tries: &mut Tries, a: &BatchAnswer) -> Step {
        let mut again: Option<AttemptError> = None;
        let attempts = tries.attempts + 1;
        for (k, position) in self.sent.clone().into_iter().enumerate() {
            let result = a.results.iter().find(|r| r.index == k);
            match self.read_entry(position, result, attempts) {
                Some(error) => {
                    again.get_or_insert(error);
                }
                None => tries.queued |= self.entries[position].is_queued(),
            }
        }
        match again {
            None => Step::Done,
            Some(error) => {
                let kind = match &error {
                    AttemptError::Status { status, .. } => RetryKind::of(*status, a.retry_after),
                    _ => RetryKind::Transient,
                };
                tries.attempts = attempts;
                tries.refused = true;
                tries.last_error = Some(error);
                Step::Retry {
                    retry_after: a.retry_after,
                    kind,
                }
            }
        }
    }

    /// One entry's result in a `207`: its outcome decided, or the error it is sent again
    /// after. `None` (not named: a body that did not parse) is an outcome unknown.
    fn read_entry(
        &mut self,
        position: usize,
        result: Option<&sendgate_wire::EntryResult<'_>>,
        attempts: u32,
    ) -> Option<AttemptError> {
        let Some(result) = result else {
            let error = AttemptError::Status {
                status: 207,
                code: None,
            };
            self.entries[position].last_error = Some(error.clone());
            return Some(error);
        };
        if !result.failed() {
            let message_id = result.message_id.to_string();
            self.decide(position, SendOutcome::Queued { message_id });
            return None;
        }
        let code = result.code.clone();
        let status = code.as_ref().map_or(502, status_of);
        let error = AttemptError::Status {
            status,
            code: code.clone(),
        };
        if result.outcome.as_deref() == Some(sendgate_wire::ErrorBody::OUTCOME_UNKNOWN)
            || is_retryable_status(status)
        {
            self.entries[position].last_error = Some(error.clone());
            return Some(error);
        }
        let outcome = if status == 401 || status == 403 {
            SendOutcome::AuthFailed { status, code }
        } else if status >= 500 {
            SendOutcome::Failed {
                last_error: error,
                attempts,
                gave_up: GaveUp::NotRetryable,
            }
        } else {
            SendOutcome::Refused { status, code }
        };
        self.decide(position, outcome);
        None
    }

    /// A `400`: the entries it names (`["body", "messages", 3, ...]`) are refused and the
    /// others sent again at once; one on the number of entries (`["body", "messages"]`)
    /// splits the request; anything else refuses every entry.
    fn read_invalid(&mut self, a: &BatchAnswer, client: &Inner) -> Step {
        let refused = || SendOutcome::Refused {
            status: 400,
            code: a.code.clone(),
        };
        let named: Option<Vec<usize>> = a
            .errors
            .iter()
            .map(|e| match e.loc.as_slice() {
                [body, messages, Loc::Index(k), ..]
                    if *body == "body" && *messages == "messages" =>
                {
                    usize::try_from(*k)
                        .ok()
                        .and_then(|k| self.sent.get(k).copied())
                }
                _ => None,
            })
            .collect();
        match named {
            Some(positions) if !positions.is_empty() => {
                for position in positions {
                    self.decide(position, refused());
                }
                Step::Now
            }
            _ => {
                let on_the_count = a.errors.len() == 1
                    && a.errors[0].loc.len() == 2
                    && a.errors[0].loc[0] == "body"
                    && a.errors[0].loc[1] == "messages";
                if on_the_count && self.sent.len() > 1 {
                    client
                        .max_batch_messages
                        .fetch_min((self.sent.len() / 2).max(1), Ordering::Relaxed);
                    return Step::Split;
                }
                self.decide_sent(refused);
                Step::Done
            }
        }
    }
}

#[async_trait]
impl Load for Batch {
    type Answer = BatchAnswer;

    async fn send(
        &mut self,
        transport: &dyn Transport,
        queue: &str,
    ) -> Result<BatchAnswer, TransportError> {
        self.room_round = self.room.is_some();
        let take = self.room.take().unwrap_or(self.pending.len());
        if !self.room_round {
            self.rest = None;
        }
        self.sent = self.pending.iter().copied().take(take).collect();
        let entry_bytes: usize = self.sent.iter().map(|&p| self.entries[p].json.len()).sum();
        let mut body = Vec::with_capacity(request_bytes(self.sent.len(), entry_bytes));
        body.extend_from_slice(REQUEST_HEAD);
        for (k, &position) in self.sent.iter().enumerate() {
            if k > 0 {
                body.push(b',');
            }
            body.extend_from_slice(&self.entries[position].json);
        }
        body.extend_from_slice(REQUEST_TAIL);
        let batch = OutgoingBatch {
            body: Bytes::from(body),
            traceparent: self.traceparent.clone(),
        };
        transport.post_batch(queue, &batch).await
    }

    fn deferral(answer: &BatchAnswer) -> Option<(GatewayState, Option<Duration>)> {
        answer.deferral()
    }

    fn judge(
        &mut self,
        tries: &mut Tries,
        answer: Result<BatchAnswer, TransportError>,
        client: &Inner,
    ) -> Step {
        let step = self.read(tries, answer, client);
        let entries = &self.entries;
        self.pending.retain(|&p| entries[p].outcome.is_none());
        if self.pending.is_empty() {
            return Step::Done;
        }
        // After a request that carried only a 429's room, the rest wait for its
        // Retry-After, whatever the room's own answer was.
        if let Some((at, rest_kind)) = self.rest.take_if(|_| self.room_round) {
            let wait = at.saturating_duration_since(Instant::now());
            return match step {
                Step::Retry { retry_after, kind } => Step::Retry {
                    retry_after: Some(retry_after.unwrap_or_default().max(wait)),
                    kind,
                },
                Step::Split => Step::Split,
                Step::Done | Step::Now => Step::Retry {
                    retry_after: Some(wait),
                    kind: rest_kind,
                },
            };
        }
        match step {
            // Entries left that the answer did not name: they go again at once.
            Step::Done => Step::Now,
            other => other,
        }
    }

    fn give_up(&mut self, gave_up: GaveUp, attempts: u32, last_error: AttemptError) {
        for position in self.pending.clone() {
            let entry = &mut self.entries[position];
            entry.outcome = Some(SendOutcome::Failed {
                last_error: entry
                    .last_error
                    .clone()
                    .unwrap_or_else(|| last_error.clone()),
                attempts,
                gave_up,
            });
        }
    }
}

/// Whether `attributes` sets the attribute named `name` (its batch field's name, as a
/// `422 unsupported_attribute` names it).
fn has_attribute(attributes: &MessageAttributes, name: &str) -> bool {
    match name {
        "subject" => attributes.subject.is_some(),
        "session_id" => attributes.session_id.is_some(),
        "partition_key" => attributes.partition_key.is_some(),
        "time_to_live_s" => attributes.time_to_live_s.is_some(),
        "scheduled_enqueue_time" => attributes.scheduled_enqueue_time.is_some(),
        "reply_to" => attributes.reply_to.is_some(),
        "to" => attributes.to.is_some(),
        "properties" => !attributes.properties.is_empty(),
        _ => false,
    }
}

/// The status a single send answers with `code`: a `207`'s entries carry codes only, and
/// the client decides by the status as for a single send (contract section 4's table).
/// A code this version does not know reads as a `502`: a failure it cannot place, not
/// retried unless its outcome is unknown.
fn status_of(code: &AnyCode) -> u16 {
    use ErrorCode as C;
    match code.known() {
        Some(C::NotFound | C::UnknownQueue) => 404,
        Some(C::MethodNotAllowed) => 405,
        Some(C::Unauthenticated) => 401,
        Some(C::Forbidden | C::ForbiddenHost) => 403,
        Some(C::UnsupportedMediaType) => 415,
        Some(C::PayloadTooLarge) => 413,
        Some(C::InvalidRequest) => 400,
        Some(C::RequestTimeout) => 408,
        Some(C::QueueFull) => 429,
        Some(
            C::Starting
            | C::Draining
            | C::CapacityUnknown
            | C::Saturated
            | C::BackendUnavailable
            | C::BackendBusy
            | C::SettingsUnavailable,
        ) => 503,
        Some(C::SendTimeout) => 504,
        Some(C::QueueDisabled) => 409,
        Some(C::UnsupportedAttribute | C::IdempotencyKeyReused) => 422,
        Some(C::BackendAuthFailed | C::SendFailed) | None => 502,
    }
}
