//! A local stand-in for Azure Resource Manager's Service Bus queue resource ("Queues - Get"),
//! on 127.0.0.1 and a random port: the ARM depth source's peer.
//!
//! It checks what the REST reference says a caller sends: `GET
//! /subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.ServiceBus/namespaces/{ns}/queues/{queue}`
//! with an `api-version` query and an `Authorization: Bearer …` header; anything else is
//! answered as ARM would (`400`, `401`) and its reason kept ([`ArmStub::violations`]). A
//! good read is answered with the documented queue resource
//! (`tests/data/servicebus/arm_queue_get_200.json`), its counts and status rewritten by the
//! test, or the test's scripted reply.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::TcpStream;

use crate::http_stub::{answer, listen, read_request, Listening, Recorded, Reply};

/// The documented queue resource: counts zero, status Active.
pub const QUEUE: &str = include_str!("../../tests/data/servicebus/arm_queue_get_200.json");

/// ARM's refusal of a principal without a read right on the scope (its error envelope).
pub const AUTHORIZATION_FAILED_403: &str = r#"{"error":{"code":"AuthorizationFailed","message":"The client 'c' with object id 'o' does not have authorization to perform action 'Microsoft.ServiceBus/namespaces/queues/read' over scope '/subscriptions/s/resourceGroups/g/providers/Microsoft.ServiceBus/namespaces/test/queues/requests' or the scope is invalid. If access was recently granted, please refresh your credentials."}}"#;

/// The documented resource with its counts and status rewritten.
pub fn queue(active: u64, dead_letters: u64, scheduled: u64, status: &str) -> String {
    let rewritten = QUEUE
        .replace(
            "\"activeMessageCount\": 0",
            &format!("\"activeMessageCount\": {active}"),
        )
        .replace(
            "\"deadLetterMessageCount\": 0",
            &format!("\"deadLetterMessageCount\": {dead_letters}"),
        )
        .replace(
            "\"scheduledMessageCount\": 0",
            &format!("\"scheduledMessageCount\": {scheduled}"),
        )
        .replace(
            "\"status\": \"Active\"",
            &format!("\"status\": \"{status}\""),
        );
    assert!(
        rewritten.contains(&format!("\"activeMessageCount\": {active}"))
            && rewritten.contains(&format!("\"status\": \"{status}\"")),
        "the documented body changed shape"
    );
    rewritten
}

/// A JSON answer, as ARM sends it.
pub fn json(status: u16, body: &str) -> Reply {
    Reply::status(status)
        .header("Content-Type", "application/json; charset=utf-8")
        .body(body.as_bytes())
}

struct State {
    /// Standing answers per queue name; a queue without one gets [`QUEUE`].
    replies: HashMap<String, Reply>,
    requests: Vec<Recorded>,
    violations: Vec<String>,
}

pub struct ArmStub {
    listening: Listening,
    state: Arc<Mutex<State>>,
}

impl ArmStub {
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State {
            replies: HashMap::new(),
            requests: Vec::new(),
            violations: Vec::new(),
        }));
        let shared = state.clone();
        let listening = listen(move |stream| serve(stream, shared.clone())).await;
        Self { listening, state }
    }

    /// The base URL, in place of `https://management.azure.com`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.listening.addr)
    }

    /// Every read of `queue` from now on gets `reply`.
    pub fn on_queue(&self, queue: &str, reply: Reply) {
        self.state.lock().replies.insert(queue.to_owned(), reply);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().requests.clone()
    }

    /// Why requests were refused as not of the documented form, in order.
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().violations.clone()
    }
}

/// The queue a request reads, or why it is not a documented Queues - Get.
fn queue_of(request: &Recorded) -> Result<(String, u16), (String, u16)> {
    if request.method != "GET" {
        return Err((format!("{} is not a read", request.method), 400));
    }
    let (path, query) = request
        .target
        .split_once('?')
        .unwrap_or((&request.target, ""));
    if !query
        .split('&')
        .any(|p| p.starts_with("api-version=") && p.len() > 12)
    {
        return Err(("no api-version".into(), 400));
    }
    let parts: Vec<&str> = path.split('/').collect();
    let shape = [
        "",
        "subscriptions",
        "*",
        "resourceGroups",
        "*",
        "providers",
        "Microsoft.ServiceBus",
        "namespaces",
        "*",
        "queues",
        "*",
    ];
    let fits = parts.len() == shape.len()
        && parts.iter().zip(shape).all(|(got, want)| {
            if want == "*" {
                !got.is_empty()
            } else {
                got.eq_ignore_ascii_case(want)
            }
        });
    if !fits {
        return Err((format!("not a queue resource: {path}"), 404));
    }
    match request.header("Authorization") {
        Some(v) if v.starts_with("Bearer ") && v.len() > 7 => Ok((parts[10].to_owned(), 200)),
        other => Err((format!("no bearer token: {other:?}"), 401)),
    }
}

async fn serve(mut stream: TcpStream, state: Arc<Mutex<State>>) {
    let mut buffer = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buffer).await {
        let reply = record(&mut state.lock(), request);
        if !answer(&mut stream, reply).await {
            return;
        }
    }
}

/// Keep `request` and pick its answer: the queue's scripted one, else the documented
/// resource; a request not of the documented form is refused as ARM would, its reason kept.
fn record(state: &mut State, request: Recorded) -> Reply {
    let reply = match queue_of(&request) {
        Ok((queue, _)) => state
            .replies
            .get(&queue)
            .cloned()
            .unwrap_or_else(|| json(200, QUEUE)),
        Err((why, status)) => {
            state.violations.push(why.clone());
            json(
                status,
                &format!(r#"{{"error":{{"code":"Stub","message":"{why}"}}}}"#),
            )
        }
    };
    state.requests.push(request);
    reply
}
