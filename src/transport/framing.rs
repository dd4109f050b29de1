//! Where each HTTP/1.1 request on a connection begins and ends, read from the bytes a client
//! sends: the head (until the empty line, parsed by httparse as actix-http parses it), then
//! the body its head announces (`Content-Length`, or chunked to the last chunk and its
//! trailers), then the next head. The stream guard needs this to know when a head is
//! arriving (the deadline and the head budget apply) and when a request is in progress
//! (the connection is not closed to make room).
//!
//! The same framing, on the server's side ([`Framing::responses`]), tells when an answer
//! has been written whole: interim `1xx` answers do not count, and an answer to `HEAD`,
//! a `204` or a `304` has no body whatever its head says.
//!
//! What it cannot follow (a head httparse refuses, two lengths, a coding other than
//! chunked, `CONNECT` or a WebSocket upgrade, a chunk size past 2^64) turns it **opaque** for
//! the rest of the connection: the server answers such a request with an error and closes,
//! or streams it to the end; the guard gives such a connection only a deadline.

/// As many headers as actix-http accepts: a head with more is refused there too.
const MAX_HEADERS: usize = 96;

/// Request methods remembered for the answers still to come (pipelined requests). The
/// server reads at most its buffer (128 KiB) ahead of what it answered, a few thousand of
/// the smallest requests; past this the framing gives up (opaque) rather than guess.
const MAX_PENDING_METHODS: usize = 16_384;

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
    /// A chunked body, step by step as actix-http's decoder takes it (`h1/chunked.rs`), so
    /// both end it at the same byte: `size` is the chunk's size, or what is left of its data.
    Chunked {
        step: Chunk,
        size: u64,
    },
    Opaque,
}

/// actix-http's chunked states, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    SizeFirst,
    SizeRest,
    SizeLws,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    Trailer,
    TrailerLf,
    EndCr,
    EndLf,
    /// The body's last byte was read.
    End,
}

/// One byte of a chunked body: the next step, `None` where actix-http errs (and closes).
fn chunk_step(step: Chunk, size: &mut u64, b: u8) -> Option<Chunk> {
    let hex = (b as char).to_digit(16).map(u64::from);
    Some(match (step, b) {
        (Chunk::SizeFirst, _) => {
            *size = hex?;
            Chunk::SizeRest
        }
        (Chunk::SizeRest, b'\t' | b' ') => Chunk::SizeLws,
        (Chunk::SizeRest, b';') => Chunk::Extension,
        (Chunk::SizeRest, b'\r') => Chunk::SizeLf,
        (Chunk::SizeRest, _) => {
            *size = size.checked_mul(16)?.checked_add(hex?)?;
            Chunk::SizeRest
        }
        (Chunk::SizeLws, b'\t' | b' ') => Chunk::SizeLws,
        (Chunk::SizeLws, b';') => Chunk::Extension,
        (Chunk::SizeLws, b'\r') => Chunk::SizeLf,
        (Chunk::SizeLws, _) => return None,
        (Chunk::Extension, b'\r') => Chunk::SizeLf,
        (Chunk::Extension, 0x00..=0x08 | 0x0a..=0x1f | 0x7f) => return None,
        (Chunk::Extension, _) => Chunk::Extension,
        (Chunk::SizeLf, b'\n') if *size > 0 => Chunk::Data,
        (Chunk::SizeLf, b'\n') => Chunk::EndCr,
        (Chunk::SizeLf, _) => return None,
        (Chunk::DataCr, b'\r') => Chunk::DataLf,
        (Chunk::DataLf, b'\n') => Chunk::SizeFirst,
        (Chunk::DataCr | Chunk::DataLf, _) => return None,
        (Chunk::Trailer, b'\r') => Chunk::TrailerLf,
        (Chunk::Trailer, _) => Chunk::Trailer,
        (Chunk::TrailerLf, b'\n') => Chunk::EndCr,
        (Chunk::TrailerLf, _) => return None,
        (Chunk::EndCr, b'\r') => Chunk::EndLf,
        (Chunk::EndCr, _) => Chunk::Trailer,
        (Chunk::EndLf, b'\n') => Chunk::End,
        (Chunk::EndLf, _) => return None,
        (Chunk::End, _) => Chunk::End,
        (Chunk::Data, _) => Chunk::Data,
    })
}

/// What one [`Framing::feed`] saw happen.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// A head's first byte arrived.
    pub heads_started: u32,
    /// A head was complete (requests: every one; answers: final ones, not `1xx`).
    pub heads_completed: u32,
    /// A message's body (or its absence) ended: the next byte starts a head.
    pub requests_read: u32,
}

/// Which way the bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Side {
    /// Requests, with whether each complete head since [`Framing::read_heads`] was `HEAD`.
    Requests {
        read: std::collections::VecDeque<bool>,
    },
    /// Answers, with the methods of the requests still to answer (`true`: `HEAD`).
    Answers {
        heads: std::collections::VecDeque<bool>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framing {
    state: State,
    side: Side,
}

const START: State = State::Head {
    bytes: Vec::new(),
    line: 0,
};

impl Default for Framing {
    /// The client's side: requests.
    fn default() -> Self {
        Self {
            state: START,
            side: Side::Requests {
                read: std::collections::VecDeque::new(),
            },
        }
    }
}

impl Framing {
    /// The server's side: answers, each to a request [`Framing::expect`] was told of.
    pub fn responses() -> Self {
        Self {
            state: START,
            side: Side::Answers {
                heads: std::collections::VecDeque::new(),
            },
        }
    }

    /// A request was read whose answer is to come (`head`: its method is `HEAD`).
    pub fn expect(&mut self, head: bool) {
        if let Side::Answers { heads } = &mut self.side {
            if heads.len() == MAX_PENDING_METHODS {
                self.state = State::Opaque;
                return;
            }
            heads.push_back(head);
        }
    }

    /// The requests read whole since the last call, in order: `true` for a `HEAD`.
    pub fn read_heads(&mut self) -> impl Iterator<Item = bool> + '_ {
        let read = match &mut self.side {
            Side::Requests { read } => Some(read),
            Side::Answers { .. } => None,
        };
        read.into_iter().flat_map(|r| r.drain(..))
    }

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

    /// Follow `bytes`, the next sent this way.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Fed {
        let mut fed = Fed::default();
        while !bytes.is_empty() {
            let (used, then) = match &mut self.state {
                State::Opaque => return fed,
                State::Head { bytes: head, line } => {
                    if head.is_empty() {
                        fed.heads_started += 1;
                    }
                    read_head(head, line, bytes)
                }
                State::Body { left } => read_body(left, bytes),
                State::Chunked { step, size } => read_chunked(step, size, bytes),
            };
            match then {
                Then::Same => {}
                Then::HeadEnded(head) => self.head_done(head, &mut fed),
                Then::MessageEnded => {
                    fed.requests_read += 1;
                    self.state = START;
                }
                Then::Lost => self.state = State::Opaque,
            }
            bytes = &bytes[used..];
        }
        fed
    }

    /// A complete head: what follows it.
    fn head_done(&mut self, head: Vec<u8>, fed: &mut Fed) {
        let next = match &mut self.side {
            Side::Requests { read } => {
                let next = next_after_head(&head);
                if next.is_some() && read.len() < MAX_PENDING_METHODS {
                    read.push_back(head.trim_ascii_start().starts_with(b"HEAD "));
                }
                next
            }
            Side::Answers { heads } => next_after_answer(&head, heads),
        };
        match next {
            Some((next, final_head)) => {
                fed.heads_completed += u32::from(final_head);
                self.state = next;
                if self.state == (State::Body { left: 0 }) {
                    fed.requests_read += u32::from(final_head);
                    self.state = START;
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
}

/// What reading some bytes in one state leads to.
enum Then {
    /// More of the same state.
    Same,
    /// The head is complete: these are its bytes.
    HeadEnded(Vec<u8>),
    /// The body (its last chunk and trailers) ended: the next byte starts a head.
    MessageEnded,
    /// A byte where actix-http errs: nothing more can be followed.
    Lost,
}

/// A head's bytes up to its empty line, if it comes in `bytes`: how many belong to the
/// head, and the whole head once that line was read. `line` is the length of the line
/// being read, carried from one call to the next.
fn read_head(head: &mut Vec<u8>, line: &mut usize, bytes: &[u8]) -> (usize, Then) {
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
        (used, Then::HeadEnded(std::mem::take(head)))
    } else {
        (used, Then::Same)
    }
}

/// Up to `left` bytes of a body of known length.
fn read_body(left: &mut u64, bytes: &[u8]) -> (usize, Then) {
    let used = usize::try_from(*left)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    *left -= used as u64;
    let then = if *left == 0 {
        Then::MessageEnded
    } else {
        Then::Same
    };
    (used, then)
}

/// A chunk's data, as much of it as `bytes` holds, or else one byte of the chunked
/// framing around it.
fn read_chunked(step: &mut Chunk, size: &mut u64, bytes: &[u8]) -> (usize, Then) {
    if *step == Chunk::Data {
        let used = usize::try_from(*size)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        *size -= used as u64;
        if *size == 0 {
            *step = Chunk::DataCr;
        }
        return (used, Then::Same);
    }
    let then = match chunk_step(*step, size, bytes[0]) {
        Some(Chunk::End) => Then::MessageEnded,
        Some(next) => {
            *step = next;
            Then::Same
        }
        None => Then::Lost,
    };
    (1, then)
}

const CHUNK_SIZE: State = State::Chunked {
    step: Chunk::SizeFirst,
    size: 0,
};

/// What follows a complete request head: its body, or nothing (`Body { left: 0 }`), and
/// `true` (every request is final); `None` while httparse finds it partial (only empty
/// lines), opaque for what this cannot follow.
fn next_after_head(head: &[u8]) -> Option<(State, bool)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some((State::Opaque, true)),
    }
    // The server streams these to the end of the connection: no next head to follow.
    let websocket = req.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("upgrade") && h.value.eq_ignore_ascii_case(b"websocket")
    });
    if req.method == Some("CONNECT") || websocket {
        return Some((State::Opaque, true));
    }
    body_of(req.headers).map(|state| (state, true))
}

/// What follows a complete answer head: its body (none for `HEAD`, `204`, `304`, `1xx`),
/// and whether it is a final answer (`1xx` are interim: the answer is still to come).
fn next_after_answer(
    head: &[u8],
    heads: &mut std::collections::VecDeque<bool>,
) -> Option<(State, bool)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    match res.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some((State::Opaque, true)),
    }
    let code = res.code.unwrap_or(0);
    if code == 101 {
        return Some((State::Opaque, true));
    }
    if (100..200).contains(&code) {
        return Some((State::Body { left: 0 }, false));
    }
    let to_head = heads.pop_front().unwrap_or(false);
    if to_head || code == 204 || code == 304 {
        return Some((State::Body { left: 0 }, true));
    }
    let body = body_of(res.headers)?;
    Some((body, true))
}

/// The body a message's headers announce; opaque for what the server refuses.
fn body_of(headers: &[httparse::Header<'_>]) -> Option<State> {
    let mut length: Option<u64> = None;
    let mut chunked = None;
    for h in headers.iter() {
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
        (Some(()), None) => CHUNK_SIZE,
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
            b"GET / HTTP/1.1\r\nUpgrade: WebSocket\r\n\r\n",
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
        f.feed(&[b'1'; 17]);
        assert!(f.is_opaque(), "a chunk size past 2^64");
    }

    /// A chunk's data is data whatever it holds: a blank line or a request head inside it
    /// neither ends the body nor counts as a request.
    #[test]
    fn a_chunk_holding_a_blank_line_and_a_head_is_data() {
        let inside = b"\r\n\r\nGET /x HTTP/1.1\r\n\r\n";
        let mut text = format!(
            "POST /v1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            inside.len()
        )
        .into_bytes();
        text.extend_from_slice(inside);
        text.extend_from_slice(b"\r\n0\r\n\r\n");
        for step in [1, 5, text.len()] {
            let mut f = Framing::default();
            let fed = fed_in_bytes_of(&mut f, &text, step);
            assert_eq!((fed.heads_completed, fed.requests_read), (1, 1), "{step}");
            assert!(!f.in_body() && !f.is_opaque(), "{step}");
        }
    }

    #[test]
    fn a_chunk_extension_of_any_length_is_followed() {
        let mut f = Framing::default();
        f.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;");
        f.feed(&[b'x'; 100_000]);
        let fed = f.feed(b"\r\nab\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n");
        assert!(!f.is_opaque());
        assert_eq!(fed.requests_read, 2);
    }

    #[test]
    fn answers_end_after_their_body_interim_ones_do_not_count_and_head_has_none() {
        let mut a = Framing::responses();
        a.expect(false);
        let fed = a.feed(b"HTTP/1.1 100 Continue\r\n\r\n");
        assert_eq!((fed.heads_completed, fed.requests_read), (0, 0), "interim");
        let fed = a.feed(b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\n{}");
        assert_eq!(fed.requests_read, 0, "its body is still to come");
        assert_eq!(a.feed(b"{}").requests_read, 1);
        // An answer to HEAD announces a length it does not send.
        a.expect(true);
        a.expect(false);
        let fed = a.feed(
            b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n\
              HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
        );
        assert_eq!(fed.requests_read, 2);
        let fed =
            a.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
        assert_eq!(fed.requests_read, 1);
    }

    /// actix-http ends a trailer line at `\r` only (h1/chunked.rs `read_trailer`: every
    /// other byte, a bare `\n` too, is trailer content), and so does this framing: after
    /// `0\r\nX\n\n`, counting the next head a request that actix-http reads as trailers
    /// and never answers would leave `read > answered` for ever: busy, no deadline, never
    /// evicted.
    #[test]
    fn a_bare_newline_in_trailers_is_not_where_actix_ends_the_body() {
        let mut f = Framing::default();
        let fed = f.feed(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              0\r\nX\n\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert_eq!(
            fed.heads_completed, 1,
            "actix-http reads one request here (the GET is trailer bytes to it)"
        );
    }

    /// actix-http reads up to 128 KiB of pipelined requests at once (h1/dispatcher.rs
    /// `read_available`, decoder MAX_BUFFER_SIZE), so many heads are read before the first
    /// answer: each one's method is kept (up to MAX_PENDING_METHODS), else an answer to `HEAD` would be taken to carry
    /// its `content-length` body and swallow the next answers.
    #[test]
    fn a_hundred_pipelined_head_requests_are_all_answered() {
        let mut requests = Framing::default();
        let mut answers = Framing::responses();
        let head = b"HEAD /health/live HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(requests.feed(&head.repeat(100)).heads_completed, 100);
        for h in requests.read_heads() {
            answers.expect(h);
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\n";
        let fed = answers.feed(&answer.repeat(100));
        assert_eq!(fed.requests_read, 100, "every answer to HEAD is bodiless");
    }

    /// Empty lines before a request line are no request: they add no method for the
    /// answers to wait for (an extra one would keep the connection busy for ever).
    #[test]
    fn empty_lines_before_a_request_add_no_method_to_answer() {
        let mut f = Framing::default();
        f.feed(b"\r\n\r\n");
        f.feed(b"HEAD / HTTP/1.1\r\n\r\n");
        assert_eq!(f.read_heads().collect::<Vec<_>>(), [true]);
    }

    /// The methods kept for the answers are capped: past the cap none is kept (the answers'
    /// side then follows no more and gives up, as `expect` says).
    #[test]
    fn at_most_the_cap_of_methods_is_kept_for_the_answers() {
        let mut f = Framing::default();
        let head = b"GET / HTTP/1.1\r\n\r\n";
        f.feed(&head.repeat(MAX_PENDING_METHODS + 3));
        assert_eq!(f.read_heads().count(), MAX_PENDING_METHODS);
    }

    #[test]
    fn requests_read_say_which_were_head() {
        let mut f = Framing::default();
        f.feed(b"HEAD / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n");
        assert_eq!(f.read_heads().collect::<Vec<_>>(), [true, false]);
        assert_eq!(f.read_heads().count(), 0);
    }
}
