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
mod health;
mod hostile;
mod leaks;
mod metrics;
mod openapi;
mod otel;
mod quota;
mod request_id;
mod routing;
mod send;
mod settings;
