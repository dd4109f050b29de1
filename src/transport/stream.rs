//! A connection's byte stream under the limits of [`super::Connections`]: it follows the
//! client's requests ([`super::framing`]), times each head, counts its bytes, and closes the
//! connection (an I/O error to the server, which drops it) when a limit is passed or the
//! registry asks. A refusal's answer (`408`, `431`) is written by the stream itself, and
//! only when the server is not writing one of its own.

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

pub struct Guarded<S> {
    io: S,
    seat: Seat,
    framing: Framing,
    /// The head's deadline, while one is arriving.
    deadline: Option<Pin<Box<Sleep>>>,
    /// A request's answer is not yet written and flushed.
    answering: bool,
    /// The server wrote since the last request's head was complete.
    wrote: bool,
    /// Closed: every later call fails at once.
    closed: Option<Closed>,
}

impl<S> Guarded<S> {
    /// The stream of a connection just given `seat`: its first head is due within the
    /// deadline from now.
    pub fn new(io: S, seat: Seat) -> Self {
        let timeout = seat.connections.limits.header_timeout;
        Self {
            io,
            seat,
            framing: Framing::default(),
            deadline: Some(Box::pin(tokio::time::sleep_until(Instant::now() + timeout))),
            answering: false,
            wrote: false,
            closed: None,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.io
    }

    fn phase(&self) -> Phase {
        if self.answering || self.framing.in_body() {
            Phase::Busy
        } else if self.deadline.is_some() {
            Phase::Head
        } else {
            Phase::Idle
        }
    }

    fn refresh_phase(&self) {
        self.seat.set_phase(self.phase());
    }

    fn failure(why: Closed) -> io::Error {
        let kind = match why {
            Closed::HeaderTimeout => io::ErrorKind::TimedOut,
            _ => io::ErrorKind::ConnectionAborted,
        };
        io::Error::new(kind, why.as_str())
    }
}

impl<S: AsyncWrite + Unpin> Guarded<S> {
    /// Close for `why`: the answer it calls for, if the server is not writing one (best
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
            if let Some(answer) = answer.filter(|_| !self.answering) {
                let _ = Pin::new(&mut self.io).poll_write(cx, answer);
                let _ = Pin::new(&mut self.io).poll_flush(cx);
            }
        }
        Self::failure(why)
    }

    /// Closed already, asked to close, or past the head's deadline.
    fn check(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        if let Some(why) = self.closed {
            return Err(Self::failure(why));
        }
        self.seat.wake_me(cx.waker());
        if let Some(why) = self.seat.asked_to_close() {
            return Err(self.close(cx, why));
        }
        if let Some(deadline) = self.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                return Err(self.close(cx, Closed::HeaderTimeout));
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
        let fed = this.framing.feed(&buf.filled()[before..]);
        if fed.heads_completed > 0 {
            this.answering = true;
            this.wrote = false;
        }
        if fed.heads_completed > 0 || this.framing.is_opaque() {
            this.deadline = None;
        }
        let arriving = this.framing.head_len();
        if arriving > 0 && this.deadline.is_none() {
            // A head began with these bytes: its deadline runs from now (a connection's
            // first head's, from the accept, is still running).
            let timeout = this.seat.connections.limits.header_timeout;
            this.deadline = Some(Box::pin(tokio::time::sleep_until(Instant::now() + timeout)));
        }
        if let Err(why) = this.seat.hold_head(arriving) {
            return Poll::Ready(Err(this.close(cx, why)));
        }
        this.refresh_phase();
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
        if let Some(why) = this.closed.or_else(|| this.seat.asked_to_close()) {
            return Poll::Ready(Err(this.close(cx, why)));
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, bytes))?;
        this.wrote |= n > 0;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(Pin::new(&mut this.io).poll_flush(cx))?;
        // Written and flushed after the whole request arrived: answered.
        if this.wrote && this.answering && !this.framing.in_body() {
            this.answering = false;
            this.refresh_phase();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
