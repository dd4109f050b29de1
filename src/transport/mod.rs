//! The connections the server holds, as a budget no unauthenticated client can take whole
//! (contract §1, "Connections"). What holds, and why:
//!
//! - **Every head has a deadline.** A request head must be complete within
//!   `header_timeout` of its first byte (of the accept, for a connection's first request),
//!   whatever trickles in meanwhile: past it the connection answers `408` (when no answer
//!   is being written) and closes. actix-http cuts only a connection's first head; a reused
//!   connection's head would otherwise have no deadline at all.
//! - **What a client owes has a deadline too**: once its request is answered, the rest of
//!   the body (actix-http drains what a handler did not read, with no deadline of its own),
//!   or going away when the framing can no longer be followed; and reading its answers (a
//!   write the socket takes none of for `header_timeout` closes it). A request being
//!   answered owes nothing, up to `answer_timeout` (3 send deadlines and 5 s: longer than any
//!   request takes under its own deadlines, so only a lost framing reaches it).
//! - **Heads are a memory budget.** One head holds at most `max_head_bytes` (`431`, close);
//!   the bytes of every unfinished head together at most `head_budget`: past it the head
//!   arriving longest is closed (`431`) to make room, the new one only if it is that head.
//!   Of more than `SAMPLE` (64) that owe, "longest" is the longest of a random sample and
//!   the new one: choosing costs the same at 10,000 as at 64.
//! - **Room is kept for well-behaved clients.** At most `max_connections` are open. A new
//!   connection past that closes one with no request in progress — one that owes something
//!   before an idle one (a flood's fresh connections owe heads; a client's pooled one is
//!   idle), the longest in its phase first — of more than `SAMPLE` (64) in the phase, the
//!   longest of a random sample of them. A request in progress is never closed to make
//!   room: when every connection has one, the new one is answered `503` and closed.
//! - **One peer cannot take it all.** At most `per_peer` connections from one IPv4 address
//!   or IPv6 /64 (0: no cap), `503` past it. Behind a proxy or ingress the peer is the
//!   proxy: `X-Forwarded-For` is not read, as any client can write it.
//!
//! This module knows nothing of routes, handlers or actix-web: it sees bytes
//! ([`framing`] tells a head from a body) and the server's writes and flushes.

pub mod framing;
mod registry;
mod stream;
mod trim;

pub use crate::config::ConnectionLimits as Limits;
pub use registry::{Closed, ConnectionCounts, Connections, Phase, Seat};
pub use stream::Guarded;

#[cfg(test)]
mod tests;
