//! A local stand-in for the Service Bus REST endpoints, on 127.0.0.1 and a random port.
//!
//! Served by [`crate::http_stub`] (plain tokio TCP and a tiny HTTP/1.1 reader), so a test
//! sees the request exactly as it went over the wire. It records every request (method, path and query, headers, body) as soon as it has read
//! it, then answers from the test's script: a scripted status, headers and body after an
//! optional delay, no answer at all, or a closed connection.
//!
//! Routes: `POST …/messages` is a send; any `GET` is a depth read; anything else is 404.
//!
//! A send must be one of Microsoft's two documented forms ([`Recorded::messages`] reads it):
//! - Send Message Batch: `Content-Type: application/vnd.microsoft.servicebus.json`
//!   exactly, a JSON array of `{"Body", "IsBodyBase64"?, "BrokerProperties"?,
//!   "UserProperties"?}`. The form documents no content type for its messages (Message
//!   Headers and Properties maps `ContentType` to the single form's `Content-Type` header
//!   only, and ignores broker properties it does not list): such a message has none.
//! - Send Message: the body is the message, its `Content-Type` header the message's
//!   `ContentType` ("Set the appropriate content type for the posted entity body"; a send
//!   without one is refused here), the `BrokerProperties` header a JSON object, and each
//!   other header not of HTTP itself a custom property, its value as text.
//!
//! In both, the broker properties by their documented names and types. Anything else is
//! answered `400` as Service Bus would, and its reason kept ([`ServiceBusStub::violations`]),
//! so a test fails on it either way.
//!
//! Script the stub before the application starts when the start-up depth read (one per
//! served queue, made while the gateway is `starting`) must get the scripted answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use base64::Engine as _;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio::net::TcpStream;

use crate::http_stub::{answer, listen, read_request, Listening};
pub use crate::http_stub::{Recorded, Reply};

/// The recorded description, counts zero, status Active.
pub const DESCRIPTION: &str =
    include_str!("../../tests/data/servicebus/queue_runtime_properties_200.xml");
pub const NOT_FOUND_FEED: &str =
    include_str!("../../tests/data/servicebus/queue_not_found_200_feed.xml");
pub const CLAIM_EMPTY_401: &str =
    include_str!("../../tests/data/servicebus/management_401_claim_empty.xml");

/// The recorded description with its counts and status rewritten.
pub fn description(active: u64, dead_letters: u64, scheduled: u64, status: &str) -> String {
    let rewritten = DESCRIPTION
        .replace(
            "<d2p1:ActiveMessageCount>0<",
            &format!("<d2p1:ActiveMessageCount>{active}<"),
        )
        .replace(
            "<d2p1:DeadLetterMessageCount>0<",
            &format!("<d2p1:DeadLetterMessageCount>{dead_letters}<"),
        )
        .replace(
            "<d2p1:ScheduledMessageCount>0<",
            &format!("<d2p1:ScheduledMessageCount>{scheduled}<"),
        )
        .replace("<Status>Active<", &format!("<Status>{status}<"));
    assert!(
        rewritten.contains(&format!("<d2p1:ActiveMessageCount>{active}<"))
            && rewritten.contains(&format!("<Status>{status}<")),
        "the recorded body changed shape"
    );
    rewritten
}

impl Recorded {
    /// The queue the request is for: the first path segment (`/requests?…` and
    /// `/requests/messages` are both `requests`).
    pub fn queue(&self) -> &str {
        let path = self.target.split('?').next().unwrap_or_default();
        path.trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default()
    }

    pub fn is_send(&self) -> bool {
        self.route() == Route::Send
    }

    pub fn is_depth_read(&self) -> bool {
        self.route() == Route::Depth
    }

    /// The messages of a send, read strictly by the documented form it takes (the batch
    /// form when its content type says so, else the single form); why not, if the request
    /// is not of that form.
    pub fn messages(&self) -> Result<Vec<StubMessage>, String> {
        match self.header("Content-Type") {
            Some(BATCH_CONTENT_TYPE) => self.batch(),
            Some(t) if t.starts_with(BATCH_CONTENT_TYPE) => Err(format!(
                "Content-Type must be exactly {BATCH_CONTENT_TYPE} (no parameters): {t:?}"
            )),
            _ => self.single().map(|m| vec![m]),
        }
    }

    /// Whether the send took the single form (Send Message).
    pub fn is_single_form(&self) -> bool {
        self.header("Content-Type")
            .is_some_and(|t| !t.starts_with(BATCH_CONTENT_TYPE))
    }

    /// A Send Message request: one message, its content type the `Content-Type` header.
    fn single(&self) -> Result<StubMessage, String> {
        let Some(content_type) = self.header("Content-Type") else {
            return Err("a single send sets the message's Content-Type".into());
        };
        if self.header_count("BrokerProperties") > 1 {
            return Err("BrokerProperties given twice".into());
        }
        let broker = match self.header("BrokerProperties") {
            None => Map::new(),
            Some(text) => match serde_json::from_str(text) {
                Ok(Value::Object(map)) => map,
                Ok(other) => return Err(format!("BrokerProperties is not an object: {other}")),
                Err(e) => return Err(format!("BrokerProperties is not JSON: {e}")),
            },
        };
        check_broker(&broker)?;
        let user = self
            .headers
            .iter()
            .filter(|(name, _)| {
                !HTTP_HEADERS
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case(name.as_str()))
            })
            .map(|(name, value)| (name.clone(), Value::String(value.clone())))
            .collect();
        Ok(StubMessage {
            body: self.body.clone(),
            is_body_base64: false,
            content_type: Some(content_type.to_owned()),
            broker,
            user,
        })
    }

    /// A Send Message Batch request.
    fn batch(&self) -> Result<Vec<StubMessage>, String> {
        if self.header_count("BrokerProperties") > 0 {
            return Err("a batch's broker properties go in its body, not a header".into());
        }
        let entries: Vec<Value> = match serde_json::from_slice(&self.body) {
            Ok(Value::Array(entries)) => entries,
            Ok(other) => return Err(format!("the body is not a JSON array: {other}")),
            Err(e) => return Err(format!("the body is not JSON: {e}")),
        };
        if entries.is_empty() {
            return Err("an empty batch".into());
        }
        entries
            .iter()
            .enumerate()
            .map(|(i, entry)| StubMessage::read(entry).map_err(|e| format!("message {i}: {e}")))
            .collect()
    }

    /// The `MessageId`s of a send's messages, in their order (empty if not a batch).
    pub fn message_ids(&self) -> Vec<String> {
        self.messages()
            .unwrap_or_default()
            .iter()
            .map(|m| m.message_id().to_owned())
            .collect()
    }

    fn route(&self) -> Route {
        if self.method == "POST" && self.target.ends_with("/messages") {
            Route::Send
        } else if self.method == "GET" {
            Route::Depth
        } else {
            Route::Other
        }
    }
}

/// The batch form's content type (Send Message Batch: "Set to
/// application/vnd.microsoft.servicebus.json, without parameters such as charset=utf-8").
pub const BATCH_CONTENT_TYPE: &str = "application/vnd.microsoft.servicebus.json";

/// Headers of the request itself, not custom properties of a single send's message.
const HTTP_HEADERS: [&str; 11] = [
    "Host",
    "Authorization",
    "Content-Type",
    "Content-Length",
    "BrokerProperties",
    "x-ms-retrypolicy",
    "Accept",
    "Accept-Encoding",
    "User-Agent",
    "Connection",
    "Expect",
];

/// The broker properties a sender may set, as Message Headers and Properties lists them,
/// and the JSON type of each.
const BROKER_PROPERTIES: [(&str, JsonType); 12] = [
    ("CorrelationId", JsonType::String),
    ("ForcePersistence", JsonType::Bool),
    ("Label", JsonType::String),
    ("MessageId", JsonType::String),
    ("PartitionKey", JsonType::String),
    ("ReplyTo", JsonType::String),
    ("ReplyToSessionId", JsonType::String),
    // "DateTime headers are formatted as defined by RFC2616 ... Sun, 06 Nov 1994 08:49:37 GMT"
    ("ScheduledEnqueueTimeUtc", JsonType::HttpDate),
    ("SessionId", JsonType::String),
    // "BrokerProperties {TimeToLive} is the number of seconds of the TimeSpan (double)"
    ("TimeToLive", JsonType::Number),
    ("To", JsonType::String),
    ("ViaPartitionKey", JsonType::String),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonType {
    String,
    Bool,
    Number,
    HttpDate,
}

/// One message of a batch send, as Service Bus would take it.
#[derive(Debug, Clone, PartialEq)]
pub struct StubMessage {
    /// The message's bytes: `Body` decoded from base64 when `IsBodyBase64` is true.
    pub body: Vec<u8>,
    pub is_body_base64: bool,
    /// `ContentType` as Service Bus stores it: the single form's `Content-Type` header;
    /// `None` for a batch entry (that form documents none).
    pub content_type: Option<String>,
    pub broker: Map<String, Value>,
    pub user: Map<String, Value>,
}

impl StubMessage {
    fn read(entry: &Value) -> Result<Self, String> {
        let Value::Object(fields) = entry else {
            return Err(format!("not a JSON object: {entry}"));
        };
        for name in fields.keys() {
            if !["Body", "IsBodyBase64", "BrokerProperties", "UserProperties"]
                .contains(&name.as_str())
            {
                return Err(format!("unknown field {name:?}"));
            }
        }
        let Some(Value::String(body)) = fields.get("Body") else {
            return Err("Body must be a string".into());
        };
        let is_body_base64 = match fields.get("IsBodyBase64") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(format!("IsBodyBase64 must be a boolean: {other}")),
        };
        let body = if is_body_base64 {
            base64::engine::general_purpose::STANDARD
                .decode(body)
                .map_err(|e| format!("Body is not base64: {e}"))?
        } else {
            body.as_bytes().to_vec()
        };
        let object = |name: &str| match fields.get(name) {
            None => Ok(Map::new()),
            Some(Value::Object(map)) => Ok(map.clone()),
            Some(other) => Err(format!("{name} must be an object: {other}")),
        };
        let broker = object("BrokerProperties")?;
        let user = object("UserProperties")?;
        check_broker(&broker)?;
        for (name, value) in &user {
            if !(value.is_string() || value.is_number() || value.is_boolean()) {
                return Err(format!(
                    "UserProperties.{name} must be a string, number or boolean: {value}"
                ));
            }
        }
        Ok(Self {
            body,
            is_body_base64,
            content_type: None,
            broker,
            user,
        })
    }

    pub fn message_id(&self) -> &str {
        self.broker
            .get("MessageId")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// The broker properties by their documented names and JSON types.
fn check_broker(broker: &Map<String, Value>) -> Result<(), String> {
    for (name, value) in broker {
        let Some((_, kind)) = BROKER_PROPERTIES.iter().find(|(n, _)| n == name) else {
            return Err(format!("{name:?} is not a broker property a sender sets"));
        };
        let fits = match kind {
            JsonType::String => value.is_string(),
            JsonType::Bool => value.is_boolean(),
            JsonType::Number => value.is_number(),
            JsonType::HttpDate => value.as_str().is_some_and(is_http_date),
        };
        if !fits {
            return Err(format!(
                "BrokerProperties.{name} is not a {kind:?}: {value}"
            ));
        }
    }
    if let (Some(session), Some(partition)) = (broker.get("SessionId"), broker.get("PartitionKey"))
    {
        if session != partition {
            return Err("SessionId and PartitionKey must be the same value".into());
        }
    }
    Ok(())
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 1123, the form RFC 2616 prefers), its weekday
/// the date's: checked by hand so the stub does not share the code under test's library.
fn is_http_date(text: &str) -> bool {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = text.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if b.len() != 29 || &text[3..5] != ", " || !text.ends_with(" GMT") {
        return false;
    }
    let (Some(day), Some(year), Some(h), Some(m), Some(s)) = (
        digits(5..7),
        digits(12..16),
        digits(17..19),
        digits(20..22),
        digits(23..25),
    ) else {
        return false;
    };
    let Some(month) = MONTHS.iter().position(|mo| text.get(8..11) == Some(*mo)) else {
        return false;
    };
    if b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || b[19] != b':' || b[22] != b':' {
        return false;
    }
    if !(1..=31).contains(&day) || h > 23 || m > 59 || s > 59 {
        return false;
    }
    // Zeller's congruence, 0 = Saturday.
    let (mut y, mut mo) = (year as i64, month as i64 + 1);
    if mo < 3 {
        mo += 12;
        y -= 1;
    }
    let zeller =
        (day as i64 + 13 * (mo + 1) / 5 + y % 100 + (y % 100) / 4 + (y / 100) / 4 + 5 * (y / 100))
            % 7;
    let weekday = DAYS[((zeller + 5) % 7) as usize];
    &text[0..3] == weekday
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Send,
    Depth,
    Other,
}

/// Answers for one route: one-shot answers first, then the standing one.
struct Script {
    once: VecDeque<Reply>,
    always: Reply,
}

impl Script {
    fn next(&mut self) -> Reply {
        self.once.pop_front().unwrap_or_else(|| self.always.clone())
    }
}

struct State {
    sends: Script,
    depth: Script,
    /// Standing depth answers for one queue, ahead of `depth`.
    depth_for: HashMap<String, Reply>,
    /// Standing send answers for a send that holds a message with this `MessageId`,
    /// ahead of `sends`.
    send_holding: Vec<(String, Reply)>,
    /// Why a send was not of the documented form (answered 400).
    violations: Vec<String>,
    requests: Vec<Recorded>,
    connections: usize,
    /// Sends read and not yet answered, now and at most.
    sends_in_flight: usize,
    max_sends_in_flight: usize,
}

pub struct ServiceBusStub {
    listening: Listening,
    state: Arc<Mutex<State>>,
}

impl ServiceBusStub {
    /// Sends answer 201; depth reads answer the recorded description (backlog 0).
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State {
            sends: Script {
                once: VecDeque::new(),
                always: Reply::status(201),
            },
            depth: Script {
                once: VecDeque::new(),
                always: Reply::xml(200, DESCRIPTION).header(
                    "Content-Type",
                    "application/atom+xml;type=entry;charset=utf-8",
                ),
            },
            depth_for: HashMap::new(),
            send_holding: Vec::new(),
            violations: Vec::new(),
            requests: Vec::new(),
            connections: 0,
            sends_in_flight: 0,
            max_sends_in_flight: 0,
        }));
        let shared = state.clone();
        let listening = listen(move |stream| {
            shared.lock().connections += 1;
            serve(stream, shared.clone())
        })
        .await;
        Self { listening, state }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.listening.addr)
    }

    /// Every send from now on gets `reply`.
    pub fn on_send(&self, reply: Reply) {
        self.state.lock().sends.always = reply;
    }

    /// Every depth read from now on gets `reply`.
    pub fn on_depth(&self, reply: Reply) {
        self.state.lock().depth.always = reply;
    }

    /// Every depth read of `queue` from now on gets `reply` (other queues keep the
    /// standing answer of [`Self::on_depth`]).
    pub fn on_depth_for(&self, queue: &str, reply: Reply) {
        self.state.lock().depth_for.insert(queue.to_owned(), reply);
    }

    /// Every send holding a message with this `MessageId` gets `reply` (another send's
    /// answer is unchanged): how a test fails exactly one call of a batch.
    pub fn on_send_holding(&self, message_id: &str, reply: Reply) {
        self.state
            .lock()
            .send_holding
            .push((message_id.to_owned(), reply));
    }

    /// Why sends were refused as not of the documented form, in order.
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().violations.clone()
    }

    /// The next send gets `reply`, then the standing answer again.
    pub fn push_send(&self, reply: Reply) {
        self.state.lock().sends.once.push_back(reply);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().requests.clone()
    }

    pub fn sends(&self) -> Vec<Recorded> {
        self.of(Route::Send)
    }

    pub fn depth_reads(&self) -> Vec<Recorded> {
        self.of(Route::Depth)
    }

    /// The most sends the stub held unanswered at once.
    pub fn max_sends_in_flight(&self) -> usize {
        self.state.lock().max_sends_in_flight
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.lock().connections
    }

    fn of(&self, route: Route) -> Vec<Recorded> {
        self.state
            .lock()
            .requests
            .iter()
            .filter(|r| r.route() == route)
            .cloned()
            .collect()
    }
}

async fn serve(mut stream: TcpStream, state: Arc<Mutex<State>>) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buffer).await {
        let is_send = request.is_send();
        let (reply, index) = record(&mut state.lock(), request);
        // Whatever happens to this answer (written, or the connection gone), the request
        // is no longer held.
        let _done = Answered {
            state: state.clone(),
            is_send,
        };
        if !answer(&mut stream, reply).await {
            return;
        }
        state.lock().requests[index].answered_at = Some(std::time::Instant::now());
    }
}

/// Keep `request` (a send counted in flight) and pick its answer; its index among the
/// requests recorded.
fn record(state: &mut State, request: Recorded) -> (Reply, usize) {
    let reply = reply_to(state, &request);
    if request.is_send() {
        state.sends_in_flight += 1;
        state.max_sends_in_flight = state.max_sends_in_flight.max(state.sends_in_flight);
    }
    state.requests.push(request);
    (reply, state.requests.len() - 1)
}

/// The scripted answer to `request` by its route; a send not of a documented form is
/// refused `400` and its reason kept.
fn reply_to(state: &mut State, request: &Recorded) -> Reply {
    match request.route() {
        Route::Send => match request.messages() {
            Err(why) => {
                state.violations.push(why.clone());
                Reply::status(400).body(why.as_bytes())
            }
            Ok(messages) => {
                let holding = state
                    .send_holding
                    .iter()
                    .find(|(id, _)| messages.iter().any(|m| m.message_id() == id.as_str()));
                match holding {
                    Some((_, reply)) => reply.clone(),
                    None => state.sends.next(),
                }
            }
        },
        Route::Depth => match state.depth_for.get(request.queue()) {
            Some(reply) => reply.clone(),
            None => state.depth.next(),
        },
        Route::Other => Reply::status(404),
    }
}

/// Counts a send out of flight when its answer is done with (written, refused, or the
/// task dropped with the stub).
struct Answered {
    state: Arc<Mutex<State>>,
    is_send: bool,
}

impl Drop for Answered {
    fn drop(&mut self) {
        if self.is_send {
            self.state.lock().sends_in_flight -= 1;
        }
    }
}

/// The management endpoint's answers.
impl Reply {
    /// An XML body, as the management endpoint sends it.
    pub fn xml(status: u16, body: &str) -> Self {
        Self::status(status)
            .header("Content-Type", "application/xml; charset=utf-8")
            .body(body.as_bytes())
    }
}
