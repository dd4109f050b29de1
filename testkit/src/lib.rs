//! The harness of sendgate's black-box suites (`tests/`), compiled once as a dev-dependency
//! of the server's package instead of into every test binary: each suite takes the parts it
//! uses.
//!
//! - Gateways: [`gateway`] (in-process on a random port, or the real binary), [`embedded`]
//!   (the api and client suites' app in a data directory of its own), [`rabbitmq_app`] (on
//!   the local broker), [`fleet`] (real binaries sharing a ceiling through Redis), and
//!   [`faulty_backend`] (the backend decorator that counts calls and injects faults).
//! - The keys file every suite with API keys writes: [`keys`].
//! - Services on this machine: [`ensure`] starts them; [`rabbit`], [`local_redis`] and
//!   [`redis_server`] talk to them; [`fault_proxy`] sits between sendgate and one;
//!   [`rabbit_node`] is a RabbitMQ node of a test's own, to alarm, stop or restart.
//! - Stand-ins for what a test cannot run itself: [`servicebus_stub`], [`arm_stub`] (Azure
//!   Resource Manager's queue resource), both served by [`http_stub`]; [`oidc`] (Entra ID's
//!   OpenID provider), [`entra`] (a token credential), [`otlp`] (a collector), [`browser`]
//!   (headless Chromium).

pub mod arm_stub;
pub mod browser;
pub mod embedded;
pub mod ensure;
pub mod entra;
pub mod fault_proxy;
pub mod faulty_backend;
pub mod fleet;
pub mod gateway;
pub mod http_stub;
pub mod keys;
pub mod local_redis;
pub mod oidc;
pub mod otlp;
pub mod rabbit;
pub mod rabbit_node;
pub mod rabbitmq_app;
pub mod redis_server;
pub mod servicebus_stub;
