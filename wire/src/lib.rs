//! The wire vocabulary of sendgate: what the gateway says and what its producers read,
//! defined once so that a code or a state renamed on one side cannot silently break the
//! other. The server serializes these types, the client deserializes them, and the JSON
//! is byte for byte what `docs/contract.md` shows.
//!
//! - `code.rs`: every error code ([`ErrorCode`]), and [`AnyCode`] for reading one a newer
//!   gateway may have added.
//! - `state.rs`: the lifecycle states ([`GatewayState`]).
//! - `body.rs`: the answer bodies of a send ([`Queued`], [`Valid`], [`ErrorBody`]).
//! - `batch.rs`: a batch send's entries and its answers ([`BatchQueued`], [`BatchPartial`]).
//! - `health.rs`: the part of `/health/detailed` a producer reads ([`LifecycleView`]).
//! - `headers.rs`: header names both sides use.
//! - `ids.rs`, `queue_name.rs`: identifiers and queue names that parse instead of validate.
//!
//! Only serde (with serde_json, for a batch entry's body), thiserror and uuid (to generate
//! ids): a producer pays for nothing else.

pub mod batch;
pub mod body;
pub mod code;
pub mod headers;
pub mod health;
pub mod ids;
pub mod queue_name;
pub mod state;

pub use batch::{
    BatchEntry, BatchMessage, BatchPartial, BatchQueued, BatchRequest, EntryResult,
    MessageAttributes,
};
pub use body::{ErrorBody, FieldError, Loc, Queued, Valid, MAX_FIELD_ERRORS};
pub use code::{AnyCode, ErrorCode, UnknownCode};
pub use health::{Drain, LifecycleView};
pub use ids::{CorrelationId, IdError, MessageId, RequestId};
pub use queue_name::{QueueName, QueueNameError};
pub use state::{GatewayState, UnknownState};
