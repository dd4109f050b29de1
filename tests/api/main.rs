//! Black-box tests: the real application on a random port, driven over HTTP.

mod admin;
mod auth;
mod batch;
mod binary;
mod capacity;
mod competing;
mod console;
mod drain;
mod embedded_attributes;
mod entra;
mod fairness;
#[path = "../support/faulty_backend.rs"]
mod faulty_backend;
#[path = "../support/gateway.rs"]
mod gateway;
mod health;
mod helpers;
mod hostile;
mod leaks;
mod metrics;
#[path = "../support/oidc.rs"]
mod oidc;
mod openapi;
mod otel;
#[path = "../support/otlp.rs"]
mod otlp;
mod quota;
mod request_id;
mod routing;
mod send;
mod settings;
