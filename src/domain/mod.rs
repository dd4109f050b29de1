//! Types that parse instead of validate: once built, each value is known to be valid,
//! so code further down the request path never re-checks it.
//!
//! The identifiers and queue names travel on the wire, so they are defined once in
//! `sendgate-wire` (the client parses them too) and re-exported here. A message's
//! attributes and trace context are the server's own: only it parses them.

pub mod attributes;
pub mod trace;

pub use attributes::{AttributeError, Attributes, Field, PropertyValue, Raw};
pub use sendgate_wire::ids::{CorrelationId, IdError, MessageId, RequestId};
pub use sendgate_wire::queue_name::{QueueName, QueueNameError};
pub use trace::{TraceContext, TraceParent, TraceState};
