//! The connections the server holds, as a budget no unauthenticated client can take whole
//! (contract §1, "Connections"). What holds, and why:
//!
//! - **Every head has a deadline.** A request head must be complete within
//!   `header_timeout` of its first byte (of the accept, for a connection's first request),
//!   whatever trickles in meanwhile: past it the connection answers `408` (when no answer
//!   is being written) and closes. actix-http cuts only a connection's first head; a reused
//!   connection's head would otherwise have no deadline at all.
//! - **Heads are a memory budget.** One head holds at most `max_head_bytes`, and the
//!   bytes of every unfinished head together at most `head_budget`: a read past either
//!   answers `431` and closes at once, giving its bytes back.
//! - **Room is kept for well-behaved clients.** At most `max_connections` are open. A new
//!   connection past that closes the one that has waited longest without a request in
//!   progress (idle between requests, or its head still arriving); when every one has a
//!   request in progress, the new one is closed. A request in progress is never closed to
//!   make room.
//! - **One peer cannot take it all.** At most `per_peer` connections from one address (0:
//!   no cap). Behind a proxy or ingress the peer is the proxy: `X-Forwarded-For` is not
//!   read, as any client can write it.
//!
//! This module knows nothing of routes, handlers or actix-web: it sees bytes
//! ([`framing`] tells a head from a body) and the server's writes and flushes.

pub mod framing;
mod registry;
mod stream;

pub use crate::config::ConnectionLimits as Limits;
pub use registry::{Closed, ConnectionCounts, Connections, Phase, Seat};
pub use stream::Guarded;

#[cfg(test)]
mod tests;
