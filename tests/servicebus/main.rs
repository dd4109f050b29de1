//! Black-box tests of the Azure Service Bus backend: the real application on a random
//! port, its backend pointed at a local stub of the Service Bus REST endpoints that
//! serves the recorded bodies (tests/data/servicebus) and records every request.

mod arm_depth;
mod attributes;
mod batch;
mod depth;
mod helpers;
mod send;
mod send_errors;
mod startup;
