//! A local stand-in for the Service Bus REST endpoints, on 127.0.0.1 and a random port.
//!
//! Plain tokio TCP and a tiny HTTP/1.1 parser (request line, headers, a `Content-Length`
//! body; keep-alive), so a test sees the request exactly as it went over the wire. It
//! records every request (method, path and query, headers, body) as soon as it has read
//! it, then answers from the test's script: a scripted status, headers and body after an
//! optional delay, no answer at all, or a closed connection.
//!
//! Routes: `POST …/messages` is a send; any `GET` is a depth read; anything else is 404.
//!
//! Script the stub before the application starts when the start-up depth read (one per
//! served queue, made while the gateway is `starting`) must get the scripted answer.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The recorded description, counts zero, status Active.
pub const DESCRIPTION: &str = include_str!("../data/servicebus/queue_runtime_properties_200.xml");
pub const NOT_FOUND_FEED: &str = include_str!("../data/servicebus/queue_not_found_200_feed.xml");
pub const CLAIM_EMPTY_401: &str = include_str!("../data/servicebus/management_401_claim_empty.xml");

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

/// One request as the stub read it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query, as on the request line.
    pub target: String,
    pub version: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn request_line(&self) -> String {
        format!("{} {} {}", self.method, self.target, self.version)
    }

    /// The value of a header (names compared without case); `None` if absent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

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

    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Send,
    Depth,
    Other,
}

/// How the stub answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        delay: Duration,
    },
    /// Read the request, never answer, keep the connection open.
    Hang,
    /// Close the connection without a byte of answer.
    Close,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self::Respond {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// An XML body, as the management endpoint sends it.
    pub fn xml(status: u16, body: &str) -> Self {
        Self::status(status)
            .header("Content-Type", "application/xml; charset=utf-8")
            .body(body.as_bytes())
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        if let Self::Respond { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }

    pub fn body(mut self, bytes: &[u8]) -> Self {
        if let Self::Respond { body, .. } = &mut self {
            *body = bytes.to_vec();
        }
        self
    }

    pub fn after(mut self, wait: Duration) -> Self {
        if let Self::Respond { delay, .. } = &mut self {
            *delay = wait;
        }
        self
    }
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
    requests: Vec<Recorded>,
    connections: usize,
}

pub struct ServiceBusStub {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for ServiceBusStub {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl ServiceBusStub {
    /// Sends answer 201; depth reads answer the recorded description (backlog 0).
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
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
            requests: Vec::new(),
            connections: 0,
        }));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                shared.lock().connections += 1;
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Self {
            addr,
            state,
            accept,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
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
    loop {
        let Some(request) = read_request(&mut stream, &mut buffer).await else {
            return;
        };
        let reply = {
            let mut state = state.lock();
            let reply = match request.route() {
                Route::Send => state.sends.next(),
                Route::Depth => match state.depth_for.get(request.queue()) {
                    Some(reply) => reply.clone(),
                    None => state.depth.next(),
                },
                Route::Other => Reply::status(404),
            };
            state.requests.push(request);
            reply
        };
        match reply {
            Reply::Hang => {
                std::future::pending::<()>().await;
            }
            Reply::Close => return,
            Reply::Respond {
                status,
                headers,
                body,
                delay,
            } => {
                tokio::time::sleep(delay).await;
                let mut head = format!(
                    "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\n",
                    reason(status),
                    body.len()
                );
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let mut bytes = head.into_bytes();
                bytes.extend_from_slice(&body);
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Read one request off the connection; `None` when the peer closed it or sent garbage.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Recorded> {
    let head_end = loop {
        if let Some(at) = find(buffer, b"\r\n\r\n") {
            break at;
        }
        assert!(buffer.len() < 64 * 1024, "request head too large");
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, target, version) = (
        request_line.next()?.to_owned(),
        request_line.next()?.to_owned(),
        request_line.next()?.to_owned(),
    );
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.parse().unwrap());
    assert!(
        !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("transfer-encoding")),
        "the stub reads Content-Length bodies only"
    );
    let body_start = head_end + 4;
    while buffer.len() < body_start + length {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[body_start..body_start + length].to_vec();
    buffer.drain(..body_start + length);
    Some(Recorded {
        method,
        target,
        version,
        headers,
        body,
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        410 => "Gone",
        413 => "Request Entity Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
