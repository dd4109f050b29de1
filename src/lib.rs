//! sendgate: an HTTP gateway in front of a message queue that refuses work the queue
//! cannot take. See ARCHITECTURE.md for the map of the code.

pub mod admission;
pub mod backend;
pub mod cli;
pub mod config;
pub mod coordination;
pub mod domain;
// The fuzz targets' entry points (fuzz/) and their corpus replay; in no normal build.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod otel;
pub mod settings;
pub mod startup;
pub mod telemetry;
pub mod tls;
pub mod transport;
