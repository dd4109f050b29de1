//! What the export thread posts: a batch of [`SpanRecord`]s as an OTLP
//! `ExportTraceServiceRequest`, and the metrics' totals as an `ExportMetricsServiceRequest`,
//! in protobuf (OTLP/HTTP's `application/x-protobuf`).
//!
//! Spans are written field by field straight from the records, once, into a buffer of the
//! exact size: the generated message types would allocate a `String` or a `Vec` for every
//! id, name, attribute key and value of every span, which was most of what a span cost
//! (bench comparison 13). The field numbers are those of
//! `opentelemetry/proto/trace/v1/trace.proto`; the tests decode what is written with the
//! generated types. The resource, the scope and the metrics (one export a minute) use the
//! generated types.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::encoding::{encoded_len_varint, WireType};
use prost::Message as _;

use super::meters::{Cell, DURATION_BUCKETS};
use super::record::{attr, Decision, SpanRecord};

/// `Span.kind`: `SPAN_KIND_PRODUCER`.
const SPAN_KIND_PRODUCER: u64 = 4;
/// `Status.code`: `STATUS_CODE_ERROR`.
const STATUS_CODE_ERROR: u64 = 2;
/// `SpanFlags`: the span's parent is known to be local or remote, and it is remote.
const FLAGS_HAS_IS_REMOTE: u32 = 0x100;
const FLAGS_IS_REMOTE: u32 = 0x200;
/// W3C trace flags: sampled.
const FLAGS_SAMPLED: u32 = 0x01;

/// Who exports: the resource (`service.name`, `OTEL_RESOURCE_ATTRIBUTES`) and the
/// instrumentation scope, encoded once.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    resource: Resource,
    scope: InstrumentationScope,
}

impl Origin {
    pub(super) fn new(resource: Resource) -> Self {
        Self {
            resource,
            scope: InstrumentationScope {
                name: "sendgate".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                attributes: Vec::new(),
                dropped_attributes_count: 0,
            },
        }
    }
}

/// What one export thread keeps from batch to batch.
#[derive(Debug, Default)]
pub(super) struct SpanEncoder {
    /// Each span's encoded length, measured before it is written.
    lengths: Vec<usize>,
    statics: Statics,
}

/// The attributes whose key and value are both `&'static str` (the operation, the system,
/// the outcome, a problem code…): each slot keeps its attribute encoded for the value it
/// last had, and a span with the same value (the same string, by address) copies it.
#[derive(Debug, Default)]
struct Statics([Fixed; FIXED_SLOTS]);

const FIXED_SLOTS: usize = 7;

#[derive(Debug, Default)]
struct Fixed {
    /// The value's address and length.
    value: (usize, usize),
    /// The `KeyValue` field (`tag` 9 of `Span`).
    bytes: Vec<u8>,
}

impl Statics {
    fn field(&mut self, slot: usize, key: &'static str, value: &'static str) -> &[u8] {
        let fixed = &mut self.0[slot];
        let id = (value.as_ptr() as usize, value.len());
        if fixed.value != id || fixed.bytes.is_empty() {
            fixed.bytes.clear();
            key_value(&mut fixed.bytes, 9, key, Value::Str(value));
            fixed.value = id;
        }
        &fixed.bytes
    }
}

impl SpanEncoder {
    /// `batch` as an `ExportTraceServiceRequest`'s bytes, written once into a buffer of
    /// the exact size: every nested message's length is measured first ([`Count`]).
    pub(super) fn encode(&mut self, origin: &Origin, batch: &[SpanRecord]) -> Vec<u8> {
        self.lengths.clear();
        for record in batch {
            let mut count = Count(0);
            span(&mut count, &mut self.statics, record);
            self.lengths.push(count.0);
        }
        let spans: usize = self.lengths.iter().map(|&len| field_len(len)).sum();
        // ScopeSpans { scope = 1, spans = 2 }
        let scope_spans = field_len(origin.scope.encoded_len()) + spans;
        // ResourceSpans { resource = 1, scope_spans = 2 }
        let resource_spans = field_len(origin.resource.encoded_len()) + field_len(scope_spans);
        // ExportTraceServiceRequest { resource_spans = 1 }
        let mut out = Vec::with_capacity(field_len(resource_spans));
        length_prefix(&mut out, 1, resource_spans);
        prost::encoding::message::encode(1, &origin.resource, &mut out);
        length_prefix(&mut out, 2, scope_spans);
        prost::encoding::message::encode(1, &origin.scope, &mut out);
        for (record, &len) in batch.iter().zip(&self.lengths) {
            length_prefix(&mut out, 2, len);
            span(&mut out, &mut self.statics, record);
        }
        debug_assert_eq!(
            out.len(),
            out.capacity(),
            "the lengths measured are those written"
        );
        out
    }
}

/// Where a span's fields go: the request's bytes, or a count of them.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn put_byte(&mut self, byte: u8);
    /// A base-128 varint, low group first (protobuf's).
    #[inline]
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.put_byte(value as u8 | 0x80);
            value >>= 7;
        }
        self.put_byte(value as u8);
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    #[inline]
    fn put_byte(&mut self, byte: u8) {
        self.push(byte);
    }
}

/// Counts the bytes a message would take.
struct Count(usize);

impl Sink for Count {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
    #[inline]
    fn put_byte(&mut self, _: u8) {
        self.0 += 1;
    }
    #[inline]
    fn varint(&mut self, value: u64) {
        self.0 += encoded_len_varint(value);
    }
}

/// A field's key, for tags below 16 (one byte): `tag << 3 | wire type`.
#[inline]
fn key(sink: &mut impl Sink, tag: u8, wire_type: WireType) {
    debug_assert!(tag < 16, "one byte of key");
    sink.put_byte(tag << 3 | wire_type as u8);
}

/// The bytes of a length-delimited field of tag < 16 holding `len` bytes.
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

#[inline]
fn length_prefix(sink: &mut impl Sink, tag: u8, len: usize) {
    key(sink, tag, WireType::LengthDelimited);
    sink.varint(len as u64);
}

#[inline]
fn bytes_field(sink: &mut impl Sink, tag: u8, bytes: &[u8]) {
    length_prefix(sink, tag, bytes.len());
    sink.put(bytes);
}

#[inline]
fn varint_field(sink: &mut impl Sink, tag: u8, value: u64) {
    key(sink, tag, WireType::Varint);
    sink.varint(value);
}

/// One `Span`'s fields.
fn span(sink: &mut impl Sink, statics: &mut Statics, r: &SpanRecord) {
    span_identity(sink, r);
    span_attributes(sink, statics, r);
    span_status_and_flags(sink, r);
}

/// Fields 1 to 8: the ids, the trace state, the name, the kind and the times.
#[inline]
fn span_identity(sink: &mut impl Sink, r: &SpanRecord) {
    bytes_field(sink, 1, &r.trace_id);
    bytes_field(sink, 2, &r.span_id);
    if let Some(state) = r.trace_state.as_deref() {
        bytes_field(sink, 3, state.as_bytes());
    }
    if let Some(parent) = &r.parent_id {
        bytes_field(sink, 4, parent);
    }
    // name = 5: `send {queue}`, or `send` when the queue is not a served one.
    let named = &*r.queue != "unknown";
    length_prefix(sink, 5, if named { 5 + r.queue.len() } else { 4 });
    sink.put(b"send");
    if named {
        sink.put_byte(b' ');
        sink.put(r.queue.as_bytes());
    }
    varint_field(sink, 6, SPAN_KIND_PRODUCER);
    key(sink, 7, WireType::SixtyFourBit);
    sink.put(&r.start_unix_nanos.to_le_bytes());
    key(sink, 8, WireType::SixtyFourBit);
    sink.put(&r.end_unix_nanos.to_le_bytes());
}

/// Field 9, the attributes: those of few values encoded once (`statics`), then the
/// send's own.
#[inline]
fn span_attributes(sink: &mut impl Sink, statics: &mut Statics, r: &SpanRecord) {
    let s = &r.send;
    let mut fixed = |slot, key, value| sink.put(statics.field(slot, key, value));
    fixed(0, attr::MESSAGING_OPERATION_TYPE, "send");
    fixed(1, attr::MESSAGING_OPERATION_NAME, "send");
    fixed(2, attr::MESSAGING_SYSTEM, s.system);
    fixed(3, attr::ADMISSION_OUTCOME, s.decision.as_str());
    if let Some(backend) = s.backend {
        fixed(4, attr::BACKEND_ROLE, backend);
    }
    if let Some(code) = s.error {
        fixed(5, attr::ERROR_TYPE, code);
    }
    if let Some(reason) = s.reason {
        fixed(6, attr::REFUSAL_REASON, reason);
    }
    let mut attribute = |key: &str, value: Value<'_>| key_value(sink, 9, key, value);
    attribute(attr::MESSAGING_DESTINATION_NAME, Value::Str(&r.queue));
    attribute(attr::HTTP_RESPONSE_STATUS_CODE, Value::Int(s.status.into()));
    if s.decision == Decision::Validated {
        attribute(attr::DRY_RUN, Value::Bool(true));
    }
    if let Some(id) = s.message_id.as_deref() {
        attribute(attr::MESSAGING_MESSAGE_ID, Value::Str(id));
    }
    if let Some(n) = s.message_count {
        attribute(
            attr::MESSAGING_BATCH_MESSAGE_COUNT,
            Value::Int(i64::try_from(n).unwrap_or(i64::MAX)),
        );
    }
    if let Some(tenant) = s.tenant.as_deref() {
        attribute(attr::TENANT, Value::Str(tenant));
    }
}

/// Field 15, the status (an error for a `5xx`), and field 16, the flags.
#[inline]
fn span_status_and_flags(sink: &mut impl Sink, r: &SpanRecord) {
    let s = &r.send;
    if s.status >= 500 {
        // status = 15: Status { message = 2, code = 3 }
        let message = s.error.unwrap_or("error");
        length_prefix(sink, 15, field_len(message.len()) + 2);
        bytes_field(sink, 2, message.as_bytes());
        varint_field(sink, 3, STATUS_CODE_ERROR);
    }
    let remote = if r.parent_id.is_some() {
        FLAGS_IS_REMOTE
    } else {
        0
    };
    // flags = 16: the first tag past one byte of key.
    sink.put(&[0x85, 0x01]);
    sink.put(&(FLAGS_SAMPLED | FLAGS_HAS_IS_REMOTE | remote).to_le_bytes());
}

#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
}

/// A `KeyValue { key = 1, value = 2: AnyValue }` as field `tag`.
fn key_value(sink: &mut impl Sink, tag: u8, key_name: &str, value: Value<'_>) {
    // AnyValue { string_value = 1, bool_value = 2, int_value = 3 }
    let any_len = match value {
        Value::Str(s) => field_len(s.len()),
        Value::Int(i) => 1 + encoded_len_varint(i as u64),
        Value::Bool(_) => 2,
    };
    length_prefix(sink, tag, field_len(key_name.len()) + field_len(any_len));
    bytes_field(sink, 1, key_name.as_bytes());
    length_prefix(sink, 2, any_len);
    match value {
        Value::Str(s) => bytes_field(sink, 1, s.as_bytes()),
        Value::Int(i) => varint_field(sink, 3, i as u64),
        Value::Bool(b) => varint_field(sink, 2, u64::from(b)),
    }
}

/// The metrics' totals since `start_unix_nanos`, as of `now_unix_nanos`.
pub(super) fn metrics(
    origin: &Origin,
    cells: &[(Box<str>, Cell)],
    start_unix_nanos: u64,
    now_unix_nanos: u64,
) -> Vec<u8> {
    let mut metrics = vec![durations(cells, start_unix_nanos, now_unix_nanos)];
    let refusal_points = refusal_points(cells, start_unix_nanos, now_unix_nanos);
    // A metric without a point is none: sent only once a refusal was counted.
    if !refusal_points.is_empty() {
        metrics.push(refusals(refusal_points));
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(origin.resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(origin.scope.clone()),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
    .encode_to_vec()
}

/// `messaging.client.operation.duration`: one histogram point per queue, system and error.
fn durations(cells: &[(Box<str>, Cell)], start_unix_nanos: u64, now_unix_nanos: u64) -> Metric {
    let data_points = cells
        .iter()
        .map(|(queue, cell)| {
            let mut attributes = vec![
                kv(attr::MESSAGING_SYSTEM, cell.labels.system),
                kv(attr::MESSAGING_DESTINATION_NAME, queue),
                kv(attr::MESSAGING_OPERATION_NAME, "send"),
                kv(attr::MESSAGING_OPERATION_TYPE, "send"),
            ];
            if let Some(code) = cell.labels.error {
                attributes.push(kv(attr::ERROR_TYPE, code));
            }
            (attributes, cell)
        })
        .fold(Vec::<(Vec<KeyValue>, Cell)>::new(), merge)
        .into_iter()
        .map(|(attributes, cell)| HistogramDataPoint {
            attributes,
            start_time_unix_nano: start_unix_nanos,
            time_unix_nano: now_unix_nanos,
            count: cell.count,
            sum: Some(cell.sum),
            bucket_counts: cell.buckets.to_vec(),
            explicit_bounds: DURATION_BUCKETS.to_vec(),
            exemplars: Vec::new(),
            flags: 0,
            min: Some(cell.min),
            max: Some(cell.max),
        })
        .collect();
    Metric {
        name: "messaging.client.operation.duration".into(),
        description: "Duration of a send request, from its arrival to its answer.".into(),
        unit: "s".into(),
        metadata: Vec::new(),
        data: Some(metric::Data::Histogram(Histogram {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative.into(),
        })),
    }
}

/// `sendgate.refusals`' points: one per code, queue and reason of the refused sends.
fn refusal_points(
    cells: &[(Box<str>, Cell)],
    start_unix_nanos: u64,
    now_unix_nanos: u64,
) -> Vec<NumberDataPoint> {
    cells
        .iter()
        .filter(|(_, cell)| cell.labels.refused)
        .map(|(queue, cell)| {
            let mut attributes = vec![
                kv(attr::ERROR_TYPE, cell.labels.error.unwrap_or("refused")),
                kv(attr::MESSAGING_DESTINATION_NAME, queue),
            ];
            if let Some(reason) = cell.labels.reason {
                attributes.push(kv(attr::REFUSAL_REASON, reason));
            }
            (attributes, cell)
        })
        .fold(Vec::<(Vec<KeyValue>, Cell)>::new(), merge)
        .into_iter()
        .map(|(attributes, cell)| NumberDataPoint {
            attributes,
            start_time_unix_nano: start_unix_nanos,
            time_unix_nano: now_unix_nanos,
            exemplars: Vec::new(),
            flags: 0,
            value: Some(number_data_point::Value::AsInt(
                i64::try_from(cell.count).unwrap_or(i64::MAX),
            )),
        })
        .collect()
}

fn refusals(data_points: Vec<NumberDataPoint>) -> Metric {
    Metric {
        name: "sendgate.refusals".into(),
        description: "Sends the gateway refused, by error.type (the problem code).".into(),
        unit: "{refusal}".into(),
        metadata: Vec::new(),
        data: Some(metric::Data::Sum(Sum {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative.into(),
            is_monotonic: true,
        })),
    }
}

/// Cells whose attributes are the same (the cells differ in labels this metric does not
/// report) are one point.
fn merge(
    mut points: Vec<(Vec<KeyValue>, Cell)>,
    (attributes, cell): (Vec<KeyValue>, &Cell),
) -> Vec<(Vec<KeyValue>, Cell)> {
    match points.iter_mut().find(|(a, _)| *a == attributes) {
        Some((_, into)) => {
            for (sum, add) in into.buckets.iter_mut().zip(cell.buckets) {
                *sum += add;
            }
            into.count += cell.count;
            into.sum += cell.sum;
            into.min = into.min.min(cell.min);
            into.max = into.max.max(cell.max);
        }
        None => points.push((attributes, cell.clone())),
    }
    points
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        key_strindex: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otel::meters::{Labels, Meters};
    use crate::otel::record::tests::record;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{span, status, Span};

    fn origin() -> Origin {
        Origin::new(Resource {
            attributes: vec![kv("service.name", "orders")],
            dropped_attributes_count: 0,
            entity_refs: Vec::new(),
        })
    }

    fn decode(bytes: &[u8]) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest::decode(bytes).expect("valid protobuf")
    }

    fn attribute(span: &Span, key: &str) -> Option<any_value::Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone()?.value)
    }

    fn string(s: &str) -> Option<any_value::Value> {
        Some(any_value::Value::StringValue(s.into()))
    }

    #[test]
    fn a_batch_decodes_as_the_collector_reads_it() {
        let mut accepted = record(7);
        accepted.parent_id = Some([9; 8]);
        accepted.trace_state = Some("congo=t61rcWkgMzE".into());
        accepted.start_unix_nanos = 1_700_000_000_000_000_000;
        accepted.end_unix_nanos = 1_700_000_000_002_000_000;
        accepted.send.message_id = Some("order-1".into());
        accepted.send.backend = Some("primary");
        accepted.send.tenant = Some("playground".into());
        let mut failed = record(8);
        failed.queue = "unknown".into();
        failed.send.status = 503;
        failed.send.error = Some("backend_unavailable");
        failed.send.decision = Decision::Refused;
        failed.send.message_count = Some(300);
        let mut dry = record(9);
        dry.send.decision = Decision::Validated;
        dry.send.status = 200;

        let mut encoder = SpanEncoder::default();
        let request = decode(&encoder.encode(&origin(), &[accepted, failed, dry]));
        let [resource_spans] = &request.resource_spans[..] else {
            panic!("one resource: {request:?}")
        };
        assert_eq!(
            resource_spans
                .resource
                .as_ref()
                .map(|r| r.attributes.clone()),
            Some(vec![kv("service.name", "orders")])
        );
        let [scope_spans] = &resource_spans.scope_spans[..] else {
            panic!("one scope")
        };
        assert_eq!(
            scope_spans.scope.as_ref().map(|s| &*s.name),
            Some("sendgate")
        );
        let [a, f, d] = &scope_spans.spans[..] else {
            panic!("three spans: {:?}", scope_spans.spans)
        };

        assert_eq!(a.trace_id, [1; 16]);
        assert_eq!(a.span_id, [7; 8]);
        assert_eq!(a.parent_span_id, [9; 8]);
        assert_eq!(a.trace_state, "congo=t61rcWkgMzE");
        assert_eq!(a.name, "send requests");
        assert_eq!(a.kind, span::SpanKind::Producer as i32);
        assert_eq!(a.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(a.end_time_unix_nano, 1_700_000_000_002_000_000);
        assert_eq!(a.flags, 0x301);
        assert_eq!(a.status, None);
        for (key, value) in [
            ("messaging.destination.name", "requests"),
            ("messaging.operation.type", "send"),
            ("messaging.operation.name", "send"),
            ("messaging.system", "rabbitmq"),
            ("sendgate.admission.outcome", "admitted"),
            ("sendgate.backend", "primary"),
            ("messaging.message.id", "order-1"),
            ("sendgate.tenant", "playground"),
        ] {
            assert_eq!(attribute(a, key), string(value), "{key}");
        }
        assert_eq!(
            attribute(a, "http.response.status_code"),
            Some(any_value::Value::IntValue(201))
        );
        assert_eq!(a.attributes.len(), 9, "{:?}", a.attributes);

        assert_eq!(f.name, "send");
        assert_eq!(f.parent_span_id, Vec::<u8>::new(), "a root span");
        assert_eq!(f.trace_state, "");
        assert_eq!(f.flags, 0x101);
        assert_eq!(attribute(f, "error.type"), string("backend_unavailable"));
        assert_eq!(
            attribute(f, "sendgate.admission.outcome"),
            string("refused")
        );
        assert_eq!(
            attribute(f, "messaging.batch.message_count"),
            Some(any_value::Value::IntValue(300))
        );
        let status = f.status.clone().expect("an error status");
        assert_eq!(status.code, status::StatusCode::Error as i32);
        assert_eq!(status.message, "backend_unavailable");

        assert_eq!(
            attribute(d, "sendgate.dry_run"),
            Some(any_value::Value::BoolValue(true))
        );
        assert_eq!(
            attribute(d, "sendgate.admission.outcome"),
            string("validated")
        );

        // The encoder's buffers are reused: a second batch holds only its own spans.
        let again = decode(&encoder.encode(&origin(), &[record(1)]));
        assert_eq!(again.resource_spans[0].scope_spans[0].spans.len(), 1);
    }

    /// splitmix64: a seeded generator, so a failing case is the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self) -> bool {
            self.next() & 1 == 1
        }
        fn pick<T: Copy>(&mut self, from: &[T]) -> T {
            from[self.below(from.len() as u64) as usize]
        }
        fn bytes<const N: usize>(&mut self) -> [u8; N] {
            std::array::from_fn(|_| self.next() as u8)
        }
        /// A string of 0 to `max` characters, multi-byte ones among them.
        fn text(&mut self, max: u64) -> String {
            let len = self.below(max + 1);
            (0..len)
                .map(|_| self.pick(&['a', 'Z', '0', '-', '=', ' ', 'é', '€', '𝄞']))
                .collect()
        }
        /// An edge value or any.
        fn nanos(&mut self) -> u64 {
            match self.below(4) {
                0 => self.pick(&[0, 1, 127, 128, u64::MAX]),
                _ => self.next(),
            }
        }
    }

    fn random_record(rng: &mut Rng) -> SpanRecord {
        let codes = [
            "queue_full",
            "backend_unavailable",
            "send_timeout",
            "partial",
        ];
        SpanRecord {
            trace_id: rng.bytes(),
            span_id: rng.bytes(),
            parent_id: rng.chance().then(|| rng.bytes()),
            trace_state: rng.chance().then(|| rng.text(600).into()),
            start_unix_nanos: rng.nanos(),
            end_unix_nanos: rng.nanos(),
            queue: if rng.below(5) == 0 {
                "unknown".into()
            } else {
                rng.text(300).into()
            },
            send: crate::otel::record::OwnedRecord {
                system: rng.pick(&["servicebus", "rabbitmq", "sendgate_embedded"]),
                backend: rng.chance().then(|| rng.pick(&["primary", "fallback"])),
                status: rng.pick(&[0, 200, 201, 207, 400, 429, 499, 500, 503, 504, u16::MAX]),
                error: rng.chance().then(|| rng.pick(&codes)),
                decision: rng.pick(&[Decision::Admitted, Decision::Refused, Decision::Validated]),
                reason: rng.chance().then(|| rng.pick(&["ceiling", "tenant_share"])),
                message_id: rng.chance().then(|| rng.text(200).into()),
                message_count: rng.chance().then(|| {
                    let any = rng.next() as usize;
                    rng.pick(&[0, 1, 300, i64::MAX as usize, usize::MAX, any])
                }),
                tenant: rng.chance().then(|| rng.text(40).into()),
            },
        }
    }

    /// What the contract says `r`'s span is, built with the collector's own types.
    fn expected_span(r: &SpanRecord) -> Span {
        let s = &r.send;
        let value = |value| KeyValue {
            key: String::new(),
            value: Some(AnyValue { value: Some(value) }),
            key_strindex: 0,
        };
        let typed = |key: &str, v| KeyValue {
            key: key.into(),
            ..value(v)
        };
        let mut attributes = vec![
            kv("messaging.operation.type", "send"),
            kv("messaging.operation.name", "send"),
            kv("messaging.system", s.system),
            kv("sendgate.admission.outcome", s.decision.as_str()),
            kv("messaging.destination.name", &r.queue),
            typed(
                "http.response.status_code",
                any_value::Value::IntValue(i64::from(s.status)),
            ),
        ];
        attributes.extend(s.backend.map(|b| kv("sendgate.backend", b)));
        attributes.extend(s.error.map(|e| kv("error.type", e)));
        attributes.extend(s.reason.map(|e| kv("sendgate.refusal.reason", e)));
        if s.decision == Decision::Validated {
            attributes.push(typed("sendgate.dry_run", any_value::Value::BoolValue(true)));
        }
        attributes.extend(
            s.message_id
                .as_deref()
                .map(|id| kv("messaging.message.id", id)),
        );
        attributes.extend(s.message_count.map(|n| {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            typed(
                "messaging.batch.message_count",
                any_value::Value::IntValue(n),
            )
        }));
        attributes.extend(s.tenant.as_deref().map(|t| kv("sendgate.tenant", t)));
        attributes.sort_by(|a, b| a.key.cmp(&b.key));
        Span {
            trace_id: r.trace_id.to_vec(),
            span_id: r.span_id.to_vec(),
            trace_state: r.trace_state.as_deref().unwrap_or_default().to_owned(),
            parent_span_id: r.parent_id.map(|p| p.to_vec()).unwrap_or_default(),
            // W3C flags: sampled (only sampled spans are exported); whether the parent is
            // remote is known (0x100), and it is when there is one (0x200).
            flags: 0x01 | 0x100 | if r.parent_id.is_some() { 0x200 } else { 0 },
            name: if &*r.queue == "unknown" {
                "send".into()
            } else {
                format!("send {}", r.queue)
            },
            kind: span::SpanKind::Producer as i32,
            start_time_unix_nano: r.start_unix_nanos,
            end_time_unix_nano: r.end_unix_nanos,
            attributes,
            dropped_attributes_count: 0,
            events: Vec::new(),
            dropped_events_count: 0,
            links: Vec::new(),
            dropped_links_count: 0,
            status: (s.status >= 500).then(|| opentelemetry_proto::tonic::trace::v1::Status {
                message: s.error.unwrap_or("error").into(),
                code: status::StatusCode::Error as i32,
            }),
        }
    }

    #[test]
    fn random_records_decode_with_every_field_as_written() {
        let mut rng = Rng(0x5e4d_6a7e);
        // One encoder for every batch: its per-value caches carry over, as on the thread.
        let mut encoder = SpanEncoder::default();
        for round in 0..300 {
            let batch: Vec<SpanRecord> =
                (0..rng.below(8)).map(|_| random_record(&mut rng)).collect();
            let request = decode(&encoder.encode(&origin(), &batch));
            let [resource_spans] = &request.resource_spans[..] else {
                panic!("round {round}: one resource")
            };
            assert_eq!(resource_spans.resource, Some(origin().resource));
            let [scope_spans] = &resource_spans.scope_spans[..] else {
                panic!("round {round}: one scope")
            };
            assert_eq!(scope_spans.scope, Some(origin().scope));
            assert_eq!(scope_spans.spans.len(), batch.len(), "round {round}");
            for (got, record) in scope_spans.spans.iter().zip(&batch) {
                let mut got = got.clone();
                got.attributes.sort_by(|a, b| a.key.cmp(&b.key));
                assert_eq!(got, expected_span(record), "round {round}: {record:?}");
            }
        }
    }

    #[test]
    fn varints_are_protobufs_and_counted_as_written() {
        for value in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut ours = Vec::new();
            ours.varint(value);
            let mut theirs = Vec::new();
            prost::encoding::encode_varint(value, &mut theirs);
            assert_eq!(ours, theirs, "{value}");
            let mut count = Count(0);
            count.varint(value);
            assert_eq!(count.0, ours.len(), "{value}");
        }
    }

    #[test]
    fn long_values_take_multi_byte_lengths() {
        let mut long = record(1);
        long.queue = "q".repeat(300).into();
        long.send.message_id = Some("m".repeat(20_000).into());
        let request = decode(&SpanEncoder::default().encode(&origin(), &[long]));
        let span = &request.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.name.len(), 305);
        assert_eq!(
            attribute(span, "messaging.message.id"),
            string(&"m".repeat(20_000))
        );
        assert_eq!(
            attribute(span, "messaging.destination.name"),
            string(&"q".repeat(300))
        );
    }

    #[test]
    fn no_refusal_no_refusals_metric() {
        let meters = Meters::default();
        let ok = Labels {
            system: "rabbitmq",
            error: None,
            refused: false,
            reason: None,
        };
        meters.record("requests", ok, 0.002);
        let bytes = metrics(&origin(), &meters.snapshot(), 10, 20);
        let request = ExportMetricsServiceRequest::decode(&bytes[..]).expect("valid protobuf");
        let names: Vec<&str> = request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, ["messaging.client.operation.duration"]);
    }

    #[test]
    fn metrics_are_cumulative_points_by_their_own_attributes() {
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        let meters = Meters::default();
        let ok = Labels {
            system: "rabbitmq",
            error: None,
            refused: false,
            reason: None,
        };
        let full = |reason| Labels {
            system: "rabbitmq",
            error: Some("queue_full"),
            refused: true,
            reason: Some(reason),
        };
        meters.record("requests", ok, 0.002);
        meters.record("requests", full("ceiling"), 0.001);
        meters.record("requests", full("tenant_share"), 0.003);
        meters.record("requests", full("tenant_share"), 0.004);
        let bytes = metrics(&origin(), &meters.snapshot(), 10, 20);
        let request = ExportMetricsServiceRequest::decode(&bytes[..]).expect("valid protobuf");
        let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
        let Some(Data::Histogram(duration)) = &metrics[0].data else {
            panic!("a histogram: {metrics:?}")
        };
        assert_eq!(metrics[0].name, "messaging.client.operation.duration");
        assert_eq!(
            duration.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        // Reasons are not the histogram's: the three refusals are one point.
        let counts: Vec<(u64, usize)> = duration
            .data_points
            .iter()
            .map(|p| (p.count, p.attributes.len()))
            .collect();
        assert_eq!(counts, [(1, 4), (3, 5)]);
        let refused = &duration.data_points[1];
        assert_eq!(
            (refused.start_time_unix_nano, refused.time_unix_nano),
            (10, 20)
        );
        assert_eq!(refused.bucket_counts.iter().sum::<u64>(), 3);
        assert_eq!(
            refused.bucket_counts.len(),
            refused.explicit_bounds.len() + 1
        );
        assert_eq!((refused.min, refused.max), (Some(0.001), Some(0.004)));
        let sum = refused.sum.expect("a sum");
        assert!(
            (sum - 0.008).abs() < 1e-12,
            "the merged cells' sums add: {sum}"
        );
        let Some(Data::Sum(refusals)) = &metrics[1].data else {
            panic!("a sum")
        };
        assert!(refusals.is_monotonic);
        let by_reason: Vec<(String, Option<number_data_point::Value>)> = refusals
            .data_points
            .iter()
            .map(|p| {
                let reason = p
                    .attributes
                    .iter()
                    .find(|kv| kv.key == attr::REFUSAL_REASON);
                let Some(any_value::Value::StringValue(reason)) =
                    reason.and_then(|kv| kv.value.clone()?.value)
                else {
                    panic!("a reason: {p:?}")
                };
                (reason, p.value)
            })
            .collect();
        assert_eq!(
            by_reason,
            [
                (
                    "ceiling".to_owned(),
                    Some(number_data_point::Value::AsInt(1))
                ),
                (
                    "tenant_share".to_owned(),
                    Some(number_data_point::Value::AsInt(2))
                )
            ]
        );
    }
}
