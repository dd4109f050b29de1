//! Black-box tests: the real application on a random port, driven over HTTP.

mod admin;
mod auth;
mod binary;
mod capacity;
mod health;
mod helpers;
mod leaks;
mod metrics;
mod request_id;
mod routing;
mod send;
