//! Types that parse instead of validate: once built, each value is known to be valid,
//! so code further down the request path never re-checks it.

mod ids;
mod queue_name;

pub use ids::{CorrelationId, IdError, MessageId, RequestId};
pub use queue_name::{QueueName, QueueNameError};
