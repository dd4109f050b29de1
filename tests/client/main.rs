//! The producer client (the `sendgate-client` crate and `sendgate send`) against the real
//! gateway, spawned in-process on a random port with the embedded backend.

mod cli;
mod library;
mod proxy;
