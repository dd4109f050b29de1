//! What the HTTP stand-ins share ([`crate::servicebus_stub`], [`crate::arm_stub`]): a
//! listener on 127.0.0.1 and a random port, a tiny HTTP/1.1 reader (request line, headers,
//! a `Content-Length` body; keep-alive) so a test sees each request exactly as it went over
//! the wire, the [`Recorded`] request, and the scripted [`Reply`] written back.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A listener serving each connection with a task of its own, until dropped.
pub struct Listening {
    pub addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Accept on 127.0.0.1 and a random port; each connection is served by `serve`.
pub async fn listen<S, F>(serve: S) -> Listening
where
    S: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    Listening { addr, accept }
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
    /// When the stub had read it whole.
    pub received_at: std::time::Instant,
    /// When the stub had written its answer (`None`: not answered, or not yet).
    pub answered_at: Option<std::time::Instant>,
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

    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    }
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

/// Write `reply` on `stream` (after its delay). Returns whether the connection stays open
/// for the next request: not after [`Reply::Close`] or a failed write; [`Reply::Hang`]
/// never returns.
pub async fn answer(stream: &mut TcpStream, reply: Reply) -> bool {
    let (status, headers, body, delay) = match reply {
        Reply::Hang => std::future::pending().await,
        Reply::Close => return false,
        Reply::Respond {
            status,
            headers,
            body,
            delay,
        } => (status, headers, body, delay),
    };
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
    stream.write_all(&bytes).await.is_ok()
}

/// Read one request off the connection; `None` when the peer closed it or sent garbage.
pub async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Recorded> {
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
    let length: usize = match headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        Some((_, v)) => v.parse().ok()?,
        None => 0,
    };
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
        received_at: std::time::Instant::now(),
        answered_at: None,
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
