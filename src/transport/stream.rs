//! A connection's byte stream under the limits of [`super::Connections`]: it follows the
//! client's requests and the server's answers ([`super::framing`], both ways), times what a
//! client owes, counts its head bytes, and closes the connection (an I/O error to the
//! server, which drops it) when a limit is passed or the registry asks. A refusal's answer
//! (`408`, `431`) is written by the stream itself, and only when every request read so far
//! has been answered whole, so it never lands inside an answer of the server's.
//!
//! What a client owes, and by when (`header_timeout` each, from when it began to owe it):
//! - a head: from its first byte (a connection's first head: from the accept);
//! - the rest of a body once its request was answered (the server drains what its handler
//!   did not read, and no deadline of its own covers that);
//! - going away, once answered, on a connection whose framing is opaque.
//!
//! While a request is answered (read, and its answer not yet written whole) nothing is
//! owed and the connection is busy: never closed to make room. Busy has a limit of its own,
//! `answer_timeout` without an answer written whole, longer than any request takes under
//! its own deadlines: only a client that reads no answer, or a connection whose framing
//! the transport lost, reaches it, and such a connection closes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::framing::Framing;
use super::registry::{Closed, Phase, Seat};

const TIMED_OUT: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
const TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// What the client owes while a deadline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    Head,
    /// The rest of an answered request's body, or going away (opaque).
    Leftover,
    /// Nothing: the server owes an answer (busy), within `answer_timeout`.
    Answer,
}

pub struct Guarded<S> {
    io: S,
    seat: Seat,
    requests: Framing,
    answers: Framing,
    /// Requests read whole, and answers written whole (final ones).
    read: u64,
    answered: u64,
    /// No byte read yet: the first head is owed from the accept.
    fresh: bool,
    deadline: Option<(Owed, Pin<Box<Sleep>>)>,
    /// While the socket takes none of an answer: the client owes reading it, within
    /// `header_timeout` (the server may not read again until it can write).
    write_stalled: Option<Pin<Box<Sleep>>>,
    /// Closed: every later call fails at once.
    closed: Option<Closed>,
}

impl<S> Guarded<S> {
    /// The stream of a connection just given `seat`: its first head is due within the
    /// deadline from now.
    pub fn new(io: S, seat: Seat) -> Self {
        let mut guarded = Self {
            io,
            seat,
            requests: Framing::default(),
            answers: Framing::responses(),
            read: 0,
            answered: 0,
            fresh: true,
            deadline: None,
            write_stalled: None,
            closed: None,
        };
        guarded.settle();
        guarded
    }

    pub fn get_ref(&self) -> &S {
        &self.io
    }

    fn busy(&self) -> bool {
        self.read > self.answered
    }

    /// What the client owes now, if anything.
    fn owed(&self) -> Option<Owed> {
        if self.busy() {
            Some(Owed::Answer)
        } else if self.requests.is_opaque() || self.requests.in_body() {
            Some(Owed::Leftover)
        } else if self.fresh || self.requests.head_len() > 0 {
            Some(Owed::Head)
        } else {
            None
        }
    }

    /// The deadline and the phase for what is owed now: a deadline runs from when its
    /// debt began (a new head, after one was read, starts a new one).
    fn settle(&mut self) {
        let owed = self.owed();
        if owed != self.deadline.as_ref().map(|(o, _)| *o) {
            self.deadline = owed.map(|o| {
                let limits = self.seat.connections.limits;
                let timeout = match o {
                    Owed::Answer => limits.answer_timeout,
                    Owed::Head | Owed::Leftover => limits.header_timeout,
                };
                (
                    o,
                    Box::pin(tokio::time::sleep_until(Instant::now() + timeout)),
                )
            });
        }
        self.seat.set_phase(match owed {
            None => Phase::Idle,
            Some(Owed::Answer) => Phase::Busy,
            Some(_) => Phase::Head,
        });
    }

    fn failure(why: Closed) -> io::Error {
        let kind = match why {
            Closed::HeaderTimeout | Closed::Stalled => io::ErrorKind::TimedOut,
            _ => io::ErrorKind::ConnectionAborted,
        };
        io::Error::new(kind, why.as_str())
    }
}

impl<S: AsyncWrite + Unpin> Guarded<S> {
    /// Close for `why`: the answer it calls for, if every request read is answered (best
    /// effort: a client that reads nothing gets nothing), then an error for the server.
    fn close(&mut self, cx: &mut Context<'_>, why: Closed) -> io::Error {
        if self.closed.is_none() {
            self.closed = Some(why);
            self.seat.ending(why);
            self.seat.release_head();
            let answer = match why {
                Closed::HeaderTimeout => Some(TIMED_OUT),
                Closed::HeadTooLarge | Closed::HeadBudget => Some(TOO_LARGE),
                _ => None,
            };
            if let Some(answer) = answer.filter(|_| !self.busy()) {
                let _ = Pin::new(&mut self.io).poll_write(cx, answer);
                let _ = Pin::new(&mut self.io).poll_flush(cx);
            }
        }
        Self::failure(why)
    }

    /// Closed already, asked to close (honoured only while no request is being answered),
    /// or past a deadline.
    fn check(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        if let Some(why) = self.closed {
            return Err(Self::failure(why));
        }
        self.seat.wake_me(cx.waker());
        if !self.busy() {
            if let Some(why) = self.seat.asked_to_close() {
                return Err(self.close(cx, why));
            }
        }
        self.check_deadline(cx)
    }

    fn check_deadline(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        if let Some((owed, deadline)) = self.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                let why = match owed {
                    Owed::Head => Closed::HeaderTimeout,
                    Owed::Leftover | Owed::Answer => Closed::Stalled,
                };
                return Err(self.close(cx, why));
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.check(cx)?;
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let bytes = &buf.filled()[before..];
        if bytes.is_empty() {
            return Poll::Ready(Ok(()));
        }
        this.fresh = false;
        let fed = this.requests.feed(bytes);
        for head in this.requests.read_heads() {
            this.answers.expect(head);
        }
        this.read += u64::from(fed.heads_completed);
        if fed.heads_completed > 0 {
            // A head read: the next one owes its own deadline, from its own first byte.
            this.deadline = None;
        }
        if let Err(why) = this.seat.hold_head(this.requests.head_len()) {
            return Poll::Ready(Err(this.close(cx, why)));
        }
        this.settle();
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(why) = this.closed {
            return Poll::Ready(Err(Self::failure(why)));
        }
        // A client that reads no answer blocks the write: the server may never read again,
        // so the answer's limit is checked here too.
        this.check_deadline(cx)?;
        let n = match Pin::new(&mut this.io).poll_write(cx, bytes) {
            Poll::Ready(result) => {
                this.write_stalled = None;
                result?
            }
            Poll::Pending => {
                let timeout = this.seat.connections.limits.header_timeout;
                let stalled = this.write_stalled.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(Instant::now() + timeout))
                });
                if stalled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(this.close(cx, Closed::Stalled)));
                }
                return Poll::Pending;
            }
        };
        let fed = this.answers.feed(&bytes[..n]);
        if fed.requests_read > 0 {
            this.answered += u64::from(fed.requests_read);
            // An answer written whole is progress: the next one has its own limit.
            this.deadline = None;
            this.settle();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
