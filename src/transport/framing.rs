//! Where each HTTP/1.1 request on a connection begins and ends, read from the bytes a client
//! sends: the head (until the empty line, parsed by httparse as actix-http parses it), then
//! the body its head announces (`Content-Length`, or chunked to the last chunk and its
//! trailers), then the next head. The stream guard needs this to know when a head is
//! arriving (the deadline and the head budget apply) and when a request is in progress
//! (the connection is not closed to make room).
//!
//! What it cannot follow (a head httparse refuses, an upgrade, a malformed chunk) turns it
//! **opaque** for the rest of the connection: the server answers such a request with an
//! error and closes, so nothing more is measured there.

/// As many headers as actix-http accepts: a head with more is refused there too.
const MAX_HEADERS: usize = 96;

/// A chunk-size line longer than this is not one a client sends (the size and short
/// extensions): opaque.
const MAX_CHUNK_LINE: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// A head: the bytes so far (empty while none arrived), and the length of the line
    /// being read, not counting a `\r` at its end.
    Head {
        bytes: Vec<u8>,
        line: usize,
    },
    /// A body of this many bytes still to come.
    Body {
        left: u64,
    },
    /// A chunk-size line being read.
    ChunkSize {
        line: Vec<u8>,
    },
    /// Chunk data still to come, then its line end.
    ChunkData {
        left: u64,
    },
    /// The line end after a chunk's data.
    ChunkEnd,
    /// Trailer lines after the last chunk, until an empty one; the line's length so far.
    Trailers {
        line: usize,
    },
    Opaque,
}

/// What one [`Framing::feed`] saw happen.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// A head's first byte arrived.
    pub heads_started: u32,
    /// A head was complete.
    pub heads_completed: u32,
    /// A request's body (or its absence) ended: the next byte starts a head.
    pub requests_read: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framing {
    state: State,
}

impl Default for Framing {
    fn default() -> Self {
        Self {
            state: State::Head {
                bytes: Vec::new(),
                line: 0,
            },
        }
    }
}

impl Framing {
    /// The bytes of the head being read (0 between requests, in a body, or opaque).
    pub fn head_len(&self) -> usize {
        match &self.state {
            State::Head { bytes, .. } => bytes.len(),
            _ => 0,
        }
    }

    /// Inside a request's body: the request is still arriving.
    pub fn in_body(&self) -> bool {
        !matches!(self.state, State::Head { .. } | State::Opaque)
    }

    pub fn is_opaque(&self) -> bool {
        self.state == State::Opaque
    }

    /// Follow `bytes`, the next the client sent.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Fed {
        let mut fed = Fed::default();
        while !bytes.is_empty() {
            let used = match &mut self.state {
                State::Opaque => return fed,
                State::Head { bytes: head, line } => {
                    if head.is_empty() {
                        fed.heads_started += 1;
                    }
                    let mut used = bytes.len();
                    let mut done = false;
                    for (i, &b) in bytes.iter().enumerate() {
                        match b {
                            // An empty line ends the head (httparse takes `\n` alone too);
                            // before the request line it is skipped, so httparse decides.
                            b'\n' if *line == 0 => {
                                used = i + 1;
                                done = true;
                                break;
                            }
                            b'\n' => *line = 0,
                            b'\r' => {}
                            _ => *line += 1,
                        }
                    }
                    head.extend_from_slice(&bytes[..used]);
                    if done {
                        let head = std::mem::take(head);
                        match next_after_head(&head) {
                            Some(next) => {
                                fed.heads_completed += 1;
                                self.state = next;
                                if self.state == (State::Body { left: 0 }) {
                                    fed.requests_read += 1;
                                    *self = Framing::default();
                                }
                            }
                            // Only empty lines so far: still before the request line.
                            None if head.iter().all(|b| matches!(b, b'\r' | b'\n')) => {
                                self.state = State::Head {
                                    bytes: head,
                                    line: 0,
                                };
                            }
                            None => self.state = State::Opaque,
                        }
                    }
                    used
                }
                State::Body { left } => {
                    let used = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    *left -= used as u64;
                    if *left == 0 {
                        fed.requests_read += 1;
                        *self = Framing::default();
                    }
                    used
                }
                State::ChunkSize { line } => {
                    let end = bytes.iter().position(|&b| b == b'\n');
                    let used = end.map_or(bytes.len(), |i| i + 1);
                    line.extend_from_slice(&bytes[..used]);
                    if line.len() > MAX_CHUNK_LINE {
                        self.state = State::Opaque;
                    } else if end.is_some() {
                        self.state = match httparse::parse_chunk_size(line) {
                            Ok(httparse::Status::Complete((_, 0))) => State::Trailers { line: 0 },
                            Ok(httparse::Status::Complete((_, size))) => {
                                State::ChunkData { left: size }
                            }
                            _ => State::Opaque,
                        };
                    }
                    used
                }
                State::ChunkData { left } => {
                    let used = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    *left -= used as u64;
                    if *left == 0 {
                        self.state = State::ChunkEnd;
                    }
                    used
                }
                State::ChunkEnd => match bytes[0] {
                    b'\r' => 1,
                    b'\n' => {
                        self.state = State::ChunkSize { line: Vec::new() };
                        1
                    }
                    _ => {
                        self.state = State::Opaque;
                        1
                    }
                },
                State::Trailers { line } => {
                    let b = bytes[0];
                    match b {
                        b'\n' if *line == 0 => {
                            fed.requests_read += 1;
                            *self = Framing::default();
                        }
                        b'\n' => *line = 0,
                        b'\r' => {}
                        _ => *line += 1,
                    }
                    1
                }
            };
            bytes = &bytes[used..];
        }
        fed
    }
}

/// What follows a complete head: its body, or nothing (`Body { left: 0 }`); `None` while
/// httparse finds it partial (only empty lines), opaque for what this cannot follow.
fn next_after_head(head: &[u8]) -> Option<State> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some(State::Opaque),
    }
    if req.method == Some("CONNECT") {
        return Some(State::Opaque);
    }
    let mut length: Option<u64> = None;
    let mut chunked = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("upgrade") {
            return Some(State::Opaque);
        }
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked only as the last coding; anything else the server refuses.
            let last = h.value.rsplit(|&b| b == b',').next().unwrap_or_default();
            let is_chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
            if chunked.is_some() || !is_chunked {
                return Some(State::Opaque);
            }
            chunked = Some(());
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok());
            match (n, length) {
                (Some(n), None) => length = Some(n),
                // Two lengths, or one that is not a number: refused by the server.
                _ => return Some(State::Opaque),
            }
        }
    }
    Some(match (chunked, length) {
        (Some(()), None) => State::ChunkSize { line: Vec::new() },
        (Some(()), Some(_)) => State::Opaque,
        (None, n) => State::Body {
            left: n.unwrap_or(0),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed_in_bytes_of(framing: &mut Framing, text: &[u8], step: usize) -> Fed {
        let mut total = Fed::default();
        for piece in text.chunks(step) {
            let fed = framing.feed(piece);
            total.heads_started += fed.heads_started;
            total.heads_completed += fed.heads_completed;
            total.requests_read += fed.requests_read;
        }
        total
    }

    const GET: &[u8] = b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn a_head_without_a_body_is_a_request_however_it_is_cut() {
        for step in [1, 2, 7, GET.len()] {
            let mut f = Framing::default();
            let fed = fed_in_bytes_of(&mut f, GET, step);
            assert_eq!(
                (fed.heads_started, fed.heads_completed, fed.requests_read),
                (1, 1, 1),
                "step {step}"
            );
            assert_eq!(f.head_len(), 0);
        }
    }

    #[test]
    fn the_head_len_counts_the_unfinished_head_only() {
        let mut f = Framing::default();
        f.feed(b"GET / HTTP/1.1\r\nX-Long: ");
        assert_eq!(f.head_len(), 24);
        f.feed(b"aaaa");
        assert_eq!(f.head_len(), 28);
        f.feed(b"\r\n\r\n");
        assert_eq!(f.head_len(), 0);
    }

    #[test]
    fn a_content_length_body_then_the_next_head() {
        let two = b"POST /v1 HTTP/1.1\r\nContent-Length: 5\r\n\r\n[1,2]GET / HTTP/1.1\r\n\r\n";
        for step in [1, 3, two.len()] {
            let mut f = Framing::default();
            let fed = fed_in_bytes_of(&mut f, two, step);
            assert_eq!((fed.heads_completed, fed.requests_read), (2, 2), "{step}");
        }
        let mut f = Framing::default();
        f.feed(b"POST /v1 HTTP/1.1\r\nContent-Length: 5\r\n\r\n[1,");
        assert!(f.in_body());
        assert_eq!(f.head_len(), 0, "a body is not a head");
        assert_eq!(f.feed(b"2]").requests_read, 1);
        assert!(!f.in_body());
    }

    #[test]
    fn a_chunked_body_with_extensions_and_trailers_then_the_next_head() {
        let text = b"POST /v1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
            3;ext=1\r\n[1,\r\n2\r\n2]\r\n0\r\nX-Trailer: t\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        for step in [1, 4, text.len()] {
            let mut f = Framing::default();
            let fed = fed_in_bytes_of(&mut f, text, step);
            assert_eq!((fed.heads_completed, fed.requests_read), (2, 2), "{step}");
            assert!(!f.is_opaque());
        }
    }

    #[test]
    fn leading_empty_lines_are_part_of_the_head_and_bare_newlines_end_it() {
        let mut f = Framing::default();
        let fed = f.feed(b"\r\n\r\n\r\n");
        assert_eq!((fed.heads_started, fed.heads_completed), (1, 0));
        assert_eq!(
            f.head_len(),
            6,
            "a trickle of empty lines is a head arriving"
        );
        let fed = f.feed(b"GET / HTTP/1.1\nHost: x\n\n");
        assert_eq!((fed.heads_completed, fed.requests_read), (1, 1));
    }

    #[test]
    fn what_the_server_refuses_turns_it_opaque() {
        for head in [
            &b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT x:443 HTTP/1.1\r\n\r\n",
            b"NOT A REQUEST\r\n\r\n",
        ] {
            let mut f = Framing::default();
            f.feed(head);
            assert!(f.is_opaque(), "{}", String::from_utf8_lossy(head));
            assert_eq!(f.feed(GET), Fed::default(), "nothing followed once opaque");
        }
        let mut f = Framing::default();
        f.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        assert!(f.is_opaque(), "a chunk size that is not hex");
        let mut f = Framing::default();
        f.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        f.feed(&[b'1'; MAX_CHUNK_LINE + 1]);
        assert!(f.is_opaque(), "a chunk line without end");
    }
}
