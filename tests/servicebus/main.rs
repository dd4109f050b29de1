//! Black-box tests of the Azure Service Bus backend: the real application on a random
//! port, its backend pointed at a local stub of the Service Bus REST endpoints that
//! serves the recorded bodies (tests/data/servicebus) and records every request.

mod attributes;
mod batch;
mod depth;
#[allow(dead_code)]
#[path = "../support/faulty_backend.rs"]
mod faulty_backend;
#[path = "../support/gateway.rs"]
mod gateway;
mod helpers;
mod send;
mod send_errors;
mod startup;
#[path = "../support/servicebus_stub.rs"]
mod stub;
