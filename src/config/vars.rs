//! Every variable sendgate reads, declared once as a typed descriptor.
//!
//! Parsing reads through these constants (`layers.duration(&DEPTH_TTL_MS)`), so a variable
//! that is not declared here cannot be read; `.env.example` and docs/configuration.md are
//! rendered from [`VARIABLES`] (see `render.rs`), and a test keeps both in step.

/// What a variable holds, with its bounds: the parser and the documentation read this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Free text (a user name, a client id).
    Text,
    /// A file or directory.
    Path,
    /// An `http(s)://` base URL.
    HttpUrl,
    /// `IP:PORT` or `localhost:PORT`.
    SocketAddr,
    /// Comma-separated queue names (a TOML array in the file).
    QueueList,
    /// An `amqp://` or `amqps://` URI.
    AmqpUri,
    /// A `redis://` or `rediss://` URL.
    RedisUrl,
    /// A Service Bus host name, `myns` or `myns.servicebus.windows.net`.
    Namespace,
    /// A Service Bus SAS connection string.
    ConnectionString,
    /// One of these words, in any case.
    Choice(&'static [&'static str]),
    /// A whole number within the bounds.
    Whole { min: u64, max: u64 },
    /// A whole number of [`Var::unit`] within the bounds.
    Duration { min: u64, max: u64 },
    /// A number above 0 and at most 1.
    Fraction,
    /// Read by the contract's forgiving rules (section 2): never refused.
    Forgiving,
}

/// The unit of a number, shown in the documentation and used to build durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    None,
    Millis,
    Seconds,
    Bytes,
}

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The gateway (`sendgate serve`).
    Server,
    /// The producer client (`sendgate send`); the server only tolerates it in its environment.
    Client,
    /// The OpenTelemetry specification's variable: read from the environment only (no key
    /// in the `SENDGATE_CONFIG` file), by sendgate's exporter (`src/otel/`) or the
    /// OpenTelemetry SDK, with the specification's meaning.
    OpenTelemetry,
}

/// A section of `.env.example`, in the order they appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    General,
    RabbitMq,
    ServiceBus,
    Capacity,
    Limits,
    Auth,
    Process,
    Breaker,
    Fallback,
    Coordination,
    OpenTelemetry,
    Client,
}

/// One variable.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    /// The value used when neither the file nor the environment sets it.
    pub default: Option<&'static str>,
    /// Without a default: what happens when unset, for docs/configuration.md (e.g. "CPU cores").
    pub unset: Option<&'static str>,
    /// One line, for `.env.example` and docs/configuration.md.
    pub help: &'static str,
    pub side: Side,
    /// Never shown: not in `Debug`, not in an error message.
    pub secret: bool,
    pub group: Group,
    /// For a `SENDGATE_FALLBACK_` variable: the primary's, used when this one is unset.
    pub fallback_of: Option<&'static Var>,
}

impl Var {
    const fn server(name: &'static str, group: Group, kind: Kind, help: &'static str) -> Self {
        Self {
            name,
            kind,
            unit: Unit::None,
            default: None,
            unset: None,
            help,
            side: Side::Server,
            secret: false,
            group,
            fallback_of: None,
        }
    }

    const fn default(self, value: &'static str) -> Self {
        Self {
            default: Some(value),
            ..self
        }
    }

    const fn unset(self, meaning: &'static str) -> Self {
        Self {
            unset: Some(meaning),
            ..self
        }
    }

    const fn unit(self, unit: Unit) -> Self {
        Self { unit, ..self }
    }

    const fn secret(self) -> Self {
        Self {
            secret: true,
            ..self
        }
    }

    /// The fallback backend's copy of a primary variable: same kind and bounds, no default
    /// of its own (unset, the primary's value applies).
    const fn fallback(name: &'static str, primary: &'static Var) -> Self {
        Self {
            name,
            default: None,
            unset: Some("the primary's"),
            help: "",
            group: Group::Fallback,
            fallback_of: Some(primary),
            ..*primary
        }
    }

    /// The key of this variable in the `SENDGATE_CONFIG` file.
    pub fn toml_key(&self) -> String {
        self.name
            .strip_prefix("SENDGATE_")
            .unwrap_or(self.name)
            .to_ascii_lowercase()
    }
}

/// Bounds shared by many variables: a duration larger than these is a mistake, and would
/// overflow the clock when added to "now".
const HOUR_MS: u64 = 3_600_000;
const DAY_S: u64 = 86_400;
const BILLION: u64 = 1_000_000_000;
const BACKENDS: &[&str] = &["embedded", "rabbitmq", "servicebus"];

use Group as G;
use Kind as K;

pub const CONFIG: Var = Var::server(
    "SENDGATE_CONFIG",
    G::General,
    K::Path,
    "Optional TOML file with the same settings; the environment wins.",
);
pub const LISTEN: Var = Var::server(
    "SENDGATE_LISTEN",
    G::General,
    K::SocketAddr,
    "HTTP listen address. A non-loopback address needs API keys or SENDGATE_AUTH=none.",
)
.default("127.0.0.1:8080");
pub const BACKEND: Var = Var::server(
    "SENDGATE_BACKEND",
    G::General,
    K::Choice(BACKENDS),
    "Backend: embedded (local durable queue), rabbitmq or servicebus.",
)
.default("embedded");
pub const QUEUES: Var = Var::server(
    "SENDGATE_QUEUES",
    G::General,
    K::QueueList,
    "Comma-separated queue names served; any other name is 404 unknown_queue.",
)
.default("requests");
pub const DATA_DIR: Var = Var::server(
    "SENDGATE_DATA_DIR",
    G::General,
    K::Path,
    "Where the embedded backend keeps its SQLite database, and (local mode) the runtime settings.",
)
.default("./sendgate-data");

pub const RABBITMQ_URL: Var = Var::server(
    "SENDGATE_RABBITMQ_URL",
    G::RabbitMq,
    K::AmqpUri,
    "AMQP 0.9.1 data plane.",
)
.default("amqp://guest:guest@127.0.0.1:5672/%2f")
.secret();
pub const RABBITMQ_MANAGEMENT_URL: Var = Var::server(
    "SENDGATE_RABBITMQ_MANAGEMENT_URL",
    G::RabbitMq,
    K::HttpUrl,
    "RabbitMQ admin plane (the management HTTP API).",
)
.default("http://127.0.0.1:15672");
pub const RABBITMQ_MANAGEMENT_USER: Var = Var::server(
    "SENDGATE_RABBITMQ_MANAGEMENT_USER",
    G::RabbitMq,
    K::Text,
    "Admin-plane user; defaults to the AMQP URL's user.",
)
.unset("the AMQP URL's");
pub const RABBITMQ_MANAGEMENT_PASSWORD: Var = Var::server(
    "SENDGATE_RABBITMQ_MANAGEMENT_PASSWORD",
    G::RabbitMq,
    K::Text,
    "Admin-plane password; defaults to the AMQP URL's password.",
)
.unset("the AMQP URL's")
.secret();
pub const RABBITMQ_DEPTH_SOURCE: Var = Var::server(
    "SENDGATE_RABBITMQ_DEPTH_SOURCE",
    G::RabbitMq,
    K::Choice(&["management", "amqp"]),
    "management (admin plane, lags a few seconds) or amqp (passive declare: exact, ready only).",
)
.default("management");
pub const RABBITMQ_STATS_LAG_MS: Var = Var::server(
    "SENDGATE_RABBITMQ_STATS_LAG_MS",
    G::RabbitMq,
    K::Duration { min: 0, max: HOUR_MS },
    "How far management counts trail the data plane: sends confirmed this long before a depth read count on top of it, so a lagging read never lets one process overshoot the ceiling. In force: the longer of this, when set, and 2 × the broker's statistics refresh period + 1 s (the period measured on the management API at start-up and every 5 min, which needs the monitoring tag; 5000 ms until then). Ignored with the amqp depth source.",
)
.unset("2 × the broker's stats refresh + 1 s (11000 ms at RabbitMQ's default 5 s)")
.unit(Unit::Millis);

pub const SERVICEBUS_NAMESPACE: Var = Var::server(
    "SERVICEBUS_NAMESPACE",
    G::ServiceBus,
    K::Namespace,
    "e.g. myns.servicebus.windows.net (a bare myns gets .servicebus.windows.net).",
)
.unset("from the connection string");
pub const SERVICEBUS_CONNECTION_STRING: Var = Var::server(
    "SERVICEBUS_CONNECTION_STRING",
    G::ServiceBus,
    K::ConnectionString,
    "SAS connection string (Send right); without it Entra ID (managed/workload identity, Azure CLI) is used.",
)
.secret();
pub const SERVICEBUS_ENDPOINT: Var = Var::server(
    "SERVICEBUS_ENDPOINT",
    G::ServiceBus,
    K::HttpUrl,
    "Override of https://{SERVICEBUS_NAMESPACE}, for tests.",
)
.unset("https://{SERVICEBUS_NAMESPACE}");
pub const SERVICEBUS_MANAGE_CONNECTION_STRING: Var = Var::server(
    "SERVICEBUS_MANAGE_CONNECTION_STRING",
    G::ServiceBus,
    K::ConnectionString,
    "SAS connection string for depth reads (needs the Manage right); defaults to the send one.",
)
.unset("the send one")
.secret();
pub const SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID: Var = Var::server(
    "SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID",
    G::ServiceBus,
    K::Text,
    "Client id of a user-assigned managed identity (Entra ID only); unset = system-assigned.",
);

pub const SERVICEBUS_MAX_BATCH_BYTES: Var = Var::server(
    "SENDGATE_SERVICEBUS_MAX_BATCH_BYTES",
    G::ServiceBus,
    K::Whole {
        min: 1024,
        max: 1_048_576,
    },
    "Largest Service Bus batch send, counted as the broker counts what it stores: the JSON entries with each body at its decoded size, not its base64 (the tier's limit: 262144 Standard, 1048576 Premium over HTTP); a batch is split into calls under it, and a message too large alone is refused.",
)
.default("262144")
.unit(Unit::Bytes);

pub const SERVICEBUS_DEPTH_SOURCE: Var = Var::server(
    "SENDGATE_SERVICEBUS_DEPTH_SOURCE",
    G::ServiceBus,
    K::Choice(&["management", "arm"]),
    "Where a queue's backlog is read. management: the namespace's management endpoint (GET {queue}, CountDetails), which needs the Manage right (SAS) or Azure Service Bus Data Owner. arm: Azure Resource Manager's queue resource (properties.countDetails), which needs only Reader on the queue, with an Entra ID token from the same identity chain (SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID names the namespace); ARM throttles reads per subscription, so keep SENDGATE_DEPTH_TTL_MS at a second or more.",
)
.default("management");
pub const SERVICEBUS_ARM_NAMESPACE_ID: Var = Var::server(
    "SENDGATE_SERVICEBUS_ARM_NAMESPACE_ID",
    G::ServiceBus,
    K::Text,
    "The namespace's Azure resource id, /subscriptions/{id}/resourceGroups/{group}/providers/Microsoft.ServiceBus/namespaces/{name}: the arm depth source reads {this}/queues/{queue}.",
)
.unset("required with SENDGATE_SERVICEBUS_DEPTH_SOURCE=arm");
pub const SERVICEBUS_ARM_ENDPOINT: Var = Var::server(
    "SENDGATE_SERVICEBUS_ARM_ENDPOINT",
    G::ServiceBus,
    K::HttpUrl,
    "Azure Resource Manager's base URL for the arm depth source; its token scope is this URL's /.default. The default is the public cloud's: in a sovereign cloud set it (https://management.usgovcloudapi.net for Azure Government, https://management.chinacloudapi.cn for Azure China).",
)
.default("https://management.azure.com");

pub const SERVICEBUS_SEND_MAX_QUEUE_DEPTH: Var = Var::server(
    "SERVICEBUS_SEND_MAX_QUEUE_DEPTH",
    G::Capacity,
    K::Forgiving,
    "Backlog ceiling: at or over it, sends get 429 queue_full. Below 1 becomes 1; not a number means 2000.",
)
.default("2000");
pub const SERVICEBUS_SEND_FAILCLOSED: Var = Var::server(
    "SERVICEBUS_SEND_FAILCLOSED",
    G::Capacity,
    K::Forgiving,
    "Fail-closed gate: 1, true or yes (any case) turn it on; anything else leaves it off.",
)
.default("false");
pub const SERVICEBUS_SEND_FAILCLOSED_STREAK: Var = Var::server(
    "SERVICEBUS_SEND_FAILCLOSED_STREAK",
    G::Capacity,
    K::Forgiving,
    "Consecutive failed depth reads before failing closed. Below 1 becomes 1; not a number means 3.",
)
.default("3");
pub const DEPTH_TTL_MS: Var = Var::server(
    "SENDGATE_DEPTH_TTL_MS",
    G::Capacity,
    K::Duration {
        min: 0,
        max: HOUR_MS,
    },
    "Reuse one depth read this long; 0 reads before every send.",
)
.default("1000")
.unit(Unit::Millis);
pub const OVERRIDES_LAPSE: Var = Var::server(
    "SENDGATE_OVERRIDES_LAPSE",
    G::Capacity,
    K::Choice(&["config_change", "never"]),
    "When a runtime override (PATCH /admin/settings) lapses: config_change (the deployment wins: an override is dropped at start-up once the variable's value it was made against has changed) or never (kept until set to null).",
)
.default("config_change");
pub const ADMIN_TIMEOUT_MS: Var = Var::server(
    "SENDGATE_ADMIN_TIMEOUT_MS",
    G::Capacity,
    K::Duration {
        min: 1,
        max: HOUR_MS,
    },
    "Deadline of one depth read.",
)
.default("2000")
.unit(Unit::Millis);
pub const RETRY_AFTER_MAX_S: Var = Var::server(
    "SENDGATE_RETRY_AFTER_MAX_S",
    G::Capacity,
    K::Duration {
        min: 1,
        max: HOUR_MS / 1000,
    },
    "Longest Retry-After of a 429 queue_full (estimated from the measured drain rate).",
)
.default("300")
.unit(Unit::Seconds);
pub const RESUME_BELOW: Var = Var::server(
    "SENDGATE_RESUME_BELOW",
    G::Capacity,
    K::Fraction,
    "Once a queue refuses at its ceiling, refuse until the backlog is at or below this share of it (1 = off).",
)
.default("1.0");

pub const FAIR_SHARE: Var = Var::server(
    "SENDGATE_FAIR_SHARE",
    G::Capacity,
    K::Choice(&["enforce", "shadow", "off"]),
    "Tenants' shares of a contended queue's room and the criticality cuts (docs/fairness.md): enforce; shadow (nothing refused by them, what they would refuse counted per tenant); off (shares off, criticality still applies).",
)
.default("enforce");
pub const FAIR_SHARE_AT: Var = Var::server(
    "SENDGATE_FAIR_SHARE_AT",
    G::Capacity,
    K::Fraction,
    "A queue is contended, and its room shared by weight, once its backlog is at or over this share of the ceiling (or it refused a send, at the ceiling or for a tenant's share, this round of depth reads or the last).",
)
.default("0.9");
pub const SHED_AT_SHEDDABLE: Var = Var::server(
    "SENDGATE_SHED_AT_SHEDDABLE",
    G::Capacity,
    K::Fraction,
    "A sheddable send is refused once it would take the backlog past this share of the ceiling (at most SENDGATE_SHED_AT_DEFAULT).",
)
.default("0.8");
pub const SHED_AT_DEFAULT: Var = Var::server(
    "SENDGATE_SHED_AT_DEFAULT",
    G::Capacity,
    K::Fraction,
    "A send at the default criticality is refused once it would take the backlog past this share of the ceiling (critical sends: at the ceiling).",
)
.default("1.0");

pub const SEND_TIMEOUT_MS: Var = Var::server(
    "SENDGATE_SEND_TIMEOUT_MS",
    G::Limits,
    K::Duration {
        min: 1,
        max: HOUR_MS,
    },
    "Deadline of one send to the broker; past it: 504 send_timeout, outcome unknown.",
)
.default("10000")
.unit(Unit::Millis);
pub const MAX_IN_FLIGHT: Var = Var::server(
    "SENDGATE_MAX_IN_FLIGHT",
    G::Limits,
    K::Whole {
        min: 1,
        max: BILLION,
    },
    "Backend sends in flight before 503 saturated.",
)
.default("256");
pub const MAX_BODY_BYTES: Var = Var::server(
    "SENDGATE_MAX_BODY_BYTES",
    G::Limits,
    K::Whole {
        min: 1,
        max: BILLION,
    },
    "Largest accepted message body (the Service Bus Standard limit).",
)
.default("262144")
.unit(Unit::Bytes);
pub const MAX_BATCH_MESSAGES: Var = Var::server(
    "SENDGATE_MAX_BATCH_MESSAGES",
    G::Limits,
    K::Whole { min: 1, max: 1000 },
    "Most entries in one batch send (POST .../messages/batch; 400 past it).",
)
.default("100");
pub const MAX_BATCH_BYTES: Var = Var::server(
    "SENDGATE_MAX_BATCH_BYTES",
    G::Limits,
    K::Whole {
        min: 1,
        max: BILLION,
    },
    "Largest batch send request body, all entries together (413 past it); at least SENDGATE_MAX_BODY_BYTES, at most SENDGATE_MAX_BUFFERED_BYTES.",
)
.default("1048576")
.unit(Unit::Bytes);
pub const MAX_JSON_DEPTH: Var = Var::server(
    "SENDGATE_MAX_JSON_DEPTH",
    G::Limits,
    K::Whole { min: 1, max: 127 },
    "Deepest nesting of arrays and objects accepted in a body (400 past it): at most 127, the deepest serde_json parses (it refuses 128), so nothing a worker cannot parse is queued.",
)
.default("127");
pub const BODY_TIMEOUT_MS: Var = Var::server(
    "SENDGATE_BODY_TIMEOUT_MS",
    G::Limits,
    K::Duration {
        min: 1,
        max: HOUR_MS,
    },
    "Longest a request body may take to arrive (a slow or stalled client; past it 408 request_timeout); at most the send deadline.",
)
.unset("5000 or SENDGATE_SEND_TIMEOUT_MS, the shorter")
.unit(Unit::Millis);
pub const MAX_BUFFERED_BYTES: Var = Var::server(
    "SENDGATE_MAX_BUFFERED_BYTES",
    G::Limits,
    K::Whole {
        min: 1,
        max: BILLION * 4,
    },
    "Request bodies held in memory at once (a batch counts twice its length: its bytes and its messages' copies on the way to the broker); a send that would pass it is 503 saturated at once.",
)
.default("67108864")
.unit(Unit::Bytes);
pub const MAX_CONNECTIONS: Var = Var::server(
    "SENDGATE_MAX_CONNECTIONS",
    G::Limits,
    K::Whole {
        min: 1,
        max: 1_000_000,
    },
    "Open client connections, all workers together. Past it a new connection closes the one idle longest (between requests, or its head still arriving); one with a request in progress is never closed to make room, and when all have one the new connection is closed.",
)
.default("10000");
pub const MAX_CONNECTIONS_PER_PEER: Var = Var::server(
    "SENDGATE_MAX_CONNECTIONS_PER_PEER",
    G::Limits,
    K::Whole {
        min: 0,
        max: 1_000_000,
    },
    "Open connections from one peer address; past it a new one is closed at once (0: no cap). Behind a proxy or ingress the peer is the proxy (X-Forwarded-For is not read: any client can write it).",
)
.default("1000");
pub const HEADER_TIMEOUT_MS: Var = Var::server(
    "SENDGATE_HEADER_TIMEOUT_MS",
    G::Limits,
    K::Duration {
        min: 100,
        max: 300_000,
    },
    "Longest a request head may take to arrive, from its first byte (from the accept for a connection's first): past it 408 and the connection closes, however slowly bytes trickle in. Idle keep-alive connections close after 75 s.",
)
.default("5000")
.unit(Unit::Millis);
pub const MAX_HEAD_BYTES: Var = Var::server(
    "SENDGATE_MAX_HEAD_BYTES",
    G::Limits,
    K::Whole {
        min: 1024,
        max: 131_072,
    },
    "Largest request head (request line and headers); past it 431 and the connection closes.",
)
.default("32768")
.unit(Unit::Bytes);
pub const MAX_BUFFERED_HEAD_BYTES: Var = Var::server(
    "SENDGATE_MAX_BUFFERED_HEAD_BYTES",
    G::Limits,
    K::Whole {
        min: 131_072,
        max: BILLION,
    },
    "Bytes of unfinished request heads held at once, all connections together; a read past it answers 431 and closes that connection at once.",
)
.default("8388608")
.unit(Unit::Bytes);
pub const DRAIN_TIMEOUT_S: Var = Var::server(
    "SENDGATE_DRAIN_TIMEOUT_S",
    G::Limits,
    K::Duration { min: 0, max: DAY_S },
    "Longest drain after SIGTERM/SIGINT.",
)
.default("30")
.unit(Unit::Seconds);
pub const DRAIN_LINGER_S: Var = Var::server(
    "SENDGATE_DRAIN_LINGER_S",
    G::Limits,
    K::Duration { min: 0, max: DAY_S },
    "Shortest drain: after SIGTERM/SIGINT or POST /admin/drain the gateway keeps answering 503 draining (readiness 503) at least this long, even with no send in flight, so load balancers stop routing here before the port closes; 0: exit as soon as no send is in flight. At most the drain timeout.",
)
.unset("5 s or SENDGATE_DRAIN_TIMEOUT_S, the shorter")
.unit(Unit::Seconds);

pub const API_KEYS_FILE: Var = Var::server(
    "SENDGATE_API_KEYS_FILE",
    G::Auth,
    K::Path,
    "TOML file of hashed API keys (see `sendgate keys new`).",
);
pub const AUTH: Var = Var::server(
    "SENDGATE_AUTH",
    G::Auth,
    K::Choice(&["none"]),
    "none: run without keys on a non-loopback address (on purpose).",
);
pub const ENTRA_TENANT_ID: Var = Var::server(
    "SENDGATE_ENTRA_TENANT_ID",
    G::Auth,
    K::Text,
    "Accept Microsoft Entra ID access tokens of this directory (a tenant id, a GUID) as callers' bearer tokens, beside API keys; roles from the token's Sendgate.Sender/Observer/Admin app roles, the caller from its azp/appid ([[apps]] in the keys file).",
)
.unset("Entra ID tokens are not accepted");
pub const ENTRA_AUDIENCE: Var = Var::server(
    "SENDGATE_ENTRA_AUDIENCE",
    G::Auth,
    K::Text,
    "The aud a token must carry: this API's application id and/or app-id URI (api://...), comma-separated, at most 4; list what your tokens carry (v1 tokens usually the URI, v2 the id).",
)
.unset("required with SENDGATE_ENTRA_TENANT_ID");
pub const ENTRA_AUTHORITY: Var = Var::server(
    "SENDGATE_ENTRA_AUTHORITY",
    G::Auth,
    K::HttpUrl,
    "Where the keys are discovered: {authority}/{tenant}/v2.0/.well-known/openid-configuration. https (http only on loopback, for tests).",
)
.default("https://login.microsoftonline.com");
pub const ENTRA_ALLOWED_APPS: Var = Var::server(
    "SENDGATE_ENTRA_ALLOWED_APPS",
    G::Auth,
    K::Text,
    "Comma-separated client ids (GUIDs): the only applications whose tokens are accepted; every [[apps]] entry must be among them. Unset: every application of the tenant with a Sendgate role; set but naming none (empty): start-up refused.",
)
.unset("every application of the tenant");

pub const LOG_FORMAT: Var = Var::server(
    "SENDGATE_LOG_FORMAT",
    G::Process,
    K::Choice(&["text", "json"]),
    "text or json (JSON lines). RUST_LOG sets the level (default info).",
)
.default("text");
pub const WORKERS: Var = Var::server(
    "SENDGATE_WORKERS",
    G::Process,
    K::Whole {
        min: 1,
        max: BILLION,
    },
    "HTTP worker threads; defaults to the number of CPU cores.",
)
.unset("CPU cores");

pub const BREAKER_WINDOW_S: Var = Var::server(
    "SENDGATE_BREAKER_WINDOW_S",
    G::Breaker,
    K::Duration { min: 1, max: DAY_S },
    "Breaker: outcomes counted over this window.",
)
.default("60")
.unit(Unit::Seconds);
pub const BREAKER_MIN_FAILURES: Var = Var::server(
    "SENDGATE_BREAKER_MIN_FAILURES",
    G::Breaker,
    K::Whole {
        min: 1,
        max: BILLION,
    },
    "Breaker: fewest failures in the window to open.",
)
.default("10");
pub const BREAKER_FAILURE_RATE: Var = Var::server(
    "SENDGATE_BREAKER_FAILURE_RATE",
    G::Breaker,
    K::Fraction,
    "Breaker: share of failures in the window to open.",
)
.default("0.5");
pub const BREAKER_OPEN_S: Var = Var::server(
    "SENDGATE_BREAKER_OPEN_S",
    G::Breaker,
    K::Duration { min: 1, max: DAY_S },
    "Breaker: time open before one real send is the trial.",
)
.default("15")
.unit(Unit::Seconds);
pub const PROBE_INTERVAL_S: Var = Var::server(
    "SENDGATE_PROBE_INTERVAL_S",
    G::Breaker,
    K::Duration { min: 0, max: DAY_S },
    "Probe each backend's admin plane this often for /health/detailed (0 = off).",
)
.default("5")
.unit(Unit::Seconds);

pub const FALLBACK_BACKEND: Var = Var::server(
    "SENDGATE_FALLBACK_BACKEND",
    G::Fallback,
    K::Choice(BACKENDS),
    "embedded, rabbitmq or servicebus: used while the primary's circuit is open.",
);
pub const FORCE_BACKEND: Var = Var::server(
    "SENDGATE_FORCE_BACKEND",
    G::Fallback,
    K::Choice(&["primary", "fallback"]),
    "primary (never fail over) or fallback: pin routing.",
);
pub const FALLBACK_DATA_DIR: Var = Var::fallback("SENDGATE_FALLBACK_DATA_DIR", &DATA_DIR);
pub const FALLBACK_RABBITMQ_URL: Var =
    Var::fallback("SENDGATE_FALLBACK_RABBITMQ_URL", &RABBITMQ_URL);
pub const FALLBACK_RABBITMQ_MANAGEMENT_URL: Var = Var::fallback(
    "SENDGATE_FALLBACK_RABBITMQ_MANAGEMENT_URL",
    &RABBITMQ_MANAGEMENT_URL,
);
pub const FALLBACK_RABBITMQ_MANAGEMENT_USER: Var = Var::fallback(
    "SENDGATE_FALLBACK_RABBITMQ_MANAGEMENT_USER",
    &RABBITMQ_MANAGEMENT_USER,
);
pub const FALLBACK_RABBITMQ_MANAGEMENT_PASSWORD: Var = Var::fallback(
    "SENDGATE_FALLBACK_RABBITMQ_MANAGEMENT_PASSWORD",
    &RABBITMQ_MANAGEMENT_PASSWORD,
);
pub const FALLBACK_RABBITMQ_DEPTH_SOURCE: Var = Var::fallback(
    "SENDGATE_FALLBACK_RABBITMQ_DEPTH_SOURCE",
    &RABBITMQ_DEPTH_SOURCE,
);
pub const FALLBACK_RABBITMQ_STATS_LAG_MS: Var = Var::fallback(
    "SENDGATE_FALLBACK_RABBITMQ_STATS_LAG_MS",
    &RABBITMQ_STATS_LAG_MS,
);
pub const FALLBACK_SERVICEBUS_NAMESPACE: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_NAMESPACE",
    &SERVICEBUS_NAMESPACE,
);
pub const FALLBACK_SERVICEBUS_CONNECTION_STRING: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_CONNECTION_STRING",
    &SERVICEBUS_CONNECTION_STRING,
);
pub const FALLBACK_SERVICEBUS_ENDPOINT: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_ENDPOINT",
    &SERVICEBUS_ENDPOINT,
);
pub const FALLBACK_SERVICEBUS_MANAGE_CONNECTION_STRING: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_MANAGE_CONNECTION_STRING",
    &SERVICEBUS_MANAGE_CONNECTION_STRING,
);
pub const FALLBACK_SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID",
    &SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID,
);
pub const FALLBACK_SERVICEBUS_MAX_BATCH_BYTES: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_MAX_BATCH_BYTES",
    &SERVICEBUS_MAX_BATCH_BYTES,
);

pub const FALLBACK_SERVICEBUS_DEPTH_SOURCE: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_DEPTH_SOURCE",
    &SERVICEBUS_DEPTH_SOURCE,
);
pub const FALLBACK_SERVICEBUS_ARM_NAMESPACE_ID: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_ARM_NAMESPACE_ID",
    &SERVICEBUS_ARM_NAMESPACE_ID,
);
pub const FALLBACK_SERVICEBUS_ARM_ENDPOINT: Var = Var::fallback(
    "SENDGATE_FALLBACK_SERVICEBUS_ARM_ENDPOINT",
    &SERVICEBUS_ARM_ENDPOINT,
);

pub const COORDINATION: Var = Var::server(
    "SENDGATE_COORDINATION",
    G::Coordination,
    K::Choice(&["local", "redis"]),
    "local: this process alone keeps the ceiling. redis: every replica shares one depth read, fail-closed streak and admitted count per queue.",
)
.default("local");
pub const REDIS_URL: Var = Var::server(
    "SENDGATE_REDIS_URL",
    G::Coordination,
    K::RedisUrl,
    "redis:// or rediss:// (TLS), with user:password for ACL auth; with Entra auth (see SENDGATE_REDIS_AUTH) the user is the managed identity's object id and there is no password.",
)
.unset("required with SENDGATE_COORDINATION=redis")
.secret();
pub const REDIS_AUTH: Var = Var::server(
    "SENDGATE_REDIS_AUTH",
    G::Coordination,
    K::Choice(&["url", "entra"]),
    "url: the credentials in SENDGATE_REDIS_URL (or none). entra: a Microsoft Entra token (scope https://redis.azure.com/.default) as the password of the URL's user, from the same chain as Service Bus (workload identity, managed identity, Azure CLI), renewed 5 min before it expires on every open connection; a user-assigned identity is picked by SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID (AZURE_CLIENT_ID is read only by workload identity). No token: the replica runs local until one comes.",
)
.default("url");
pub const REDIS_PREFIX: Var = Var::server(
    "SENDGATE_REDIS_PREFIX",
    G::Coordination,
    K::Text,
    "Prefix of every key this deployment uses (1-64 of A-Z a-z 0-9 . _ : -): one per deployment sharing a Redis.",
)
.default("sendgate");
pub const REDIS_TIMEOUT_MS: Var = Var::server(
    "SENDGATE_REDIS_TIMEOUT_MS",
    G::Coordination,
    K::Duration {
        min: 1,
        max: 60_000,
    },
    "Deadline of one Redis call; past it the replica falls back to local mode until Redis answers again. Long enough that a busy replica's own scheduling delay is not taken for a partition.",
)
.default("250")
.unit(Unit::Millis);
pub const FLEET_MAX_REPLICAS: Var = Var::server(
    "SENDGATE_FLEET_MAX_REPLICAS",
    G::Coordination,
    K::Whole { min: 1, max: 10_000 },
    "The most replicas the fleet runs at once (count both revisions of a rollout). A replica cut off from Redis with SERVICEBUS_SEND_FAILCLOSED off admits alone at most its part of the room, the room over the larger of this and the fleet's size it last saw, so the parts cannot add up past the ceiling.",
)
.default("10");

/// An OpenTelemetry variable (the specification's name and meaning): see [`Side::OpenTelemetry`].
const fn otel(name: &'static str, kind: Kind, help: &'static str) -> Var {
    Var {
        side: Side::OpenTelemetry,
        ..Var::server(name, G::OpenTelemetry, kind, help)
    }
}

pub const OTEL_SDK_DISABLED: Var = otel(
    "OTEL_SDK_DISABLED",
    K::Choice(&["true", "false"]),
    "true: nothing is exported and no exporter is built, whatever else is set.",
)
.default("false");
pub const OTEL_EXPORTER_OTLP_ENDPOINT: Var = otel(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    K::HttpUrl,
    "The collector's base URL. Over OTLP/HTTP (e.g. http://localhost:4318) spans go to /v1/traces and metrics to /v1/metrics under it; over gRPC (e.g. http://localhost:4317) it is used as it is. Unset, and no signal's own endpoint below: nothing is exported, nothing is built.",
)
.unset("nothing exported");
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Var = otel(
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    K::HttpUrl,
    "The spans' own URL, used as it is (set alone: spans only).",
)
.unset("from the base endpoint");
pub const OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: Var = otel(
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    K::HttpUrl,
    "The metrics' own URL, used as it is (set alone: metrics only).",
)
.unset("from the base endpoint");
pub const OTEL_EXPORTER_OTLP_PROTOCOL: Var = otel(
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    K::Text,
    "grpc (OTLP over gRPC: what the Azure Container Apps managed agent takes) or http/protobuf. Another value (http/json) is logged at start-up (otel_protocol_unsupported) and ignored, as the specification asks.",
)
.unset("http/protobuf");
pub const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: Var = otel(
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    K::Text,
    "The spans' own protocol, in place of OTEL_EXPORTER_OTLP_PROTOCOL.",
)
.unset("OTEL_EXPORTER_OTLP_PROTOCOL");
pub const OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: Var = otel(
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    K::Text,
    "The metrics' own protocol, in place of OTEL_EXPORTER_OTLP_PROTOCOL.",
)
.unset("OTEL_EXPORTER_OTLP_PROTOCOL");
pub const OTEL_EXPORTER_OTLP_COMPRESSION: Var = otel(
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    K::Text,
    "No compression is built in: gzip (or any value but none) is logged at start-up (otel_compression_unsupported) and the exports go uncompressed.",
)
.unset("none");
pub const OTEL_EXPORTER_OTLP_HEADERS: Var = otel(
    "OTEL_EXPORTER_OTLP_HEADERS",
    K::Text,
    "key=value pairs, comma-separated, values percent-encoded, sent with every export (a collector's API key). Over gRPC they are the calls' metadata: names of 0-9, a-z, -, _ and . only (another stops start-up), a name ending in -bin has its value sent in base64.",
)
.secret();
pub const OTEL_EXPORTER_OTLP_TRACES_HEADERS: Var = otel(
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    K::Text,
    "The spans' own headers, in place of OTEL_EXPORTER_OTLP_HEADERS.",
)
.secret();
pub const OTEL_EXPORTER_OTLP_METRICS_HEADERS: Var = otel(
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    K::Text,
    "The metrics' own headers, in place of OTEL_EXPORTER_OTLP_HEADERS.",
)
.secret();
pub const OTEL_EXPORTER_OTLP_TIMEOUT: Var = otel(
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    K::Duration {
        min: 1,
        max: HOUR_MS,
    },
    "Deadline of one export, both signals, its retries included: over HTTP a 429, 502, 503 or 504 answer, or none, over gRPC the retryable codes of the OTLP specification (UNAVAILABLE, RESOURCE_EXHAUSTED with a RetryInfo, ...), are sent again (backoff from 100 ms, at most 3 retries, a Retry-After in seconds or a RetryInfo's delay waited) while time is left; any other failure is final.",
)
.default("10000")
.unit(Unit::Millis);
pub const OTEL_SERVICE_NAME: Var = otel(
    "OTEL_SERVICE_NAME",
    K::Text,
    "service.name on every span and metric; read by the OpenTelemetry SDK (service.name in OTEL_RESOURCE_ATTRIBUTES counts too).",
)
.unset("sendgate");
pub const OTEL_RESOURCE_ATTRIBUTES: Var = otel(
    "OTEL_RESOURCE_ATTRIBUTES",
    K::Text,
    "key=value pairs, comma-separated, on every span and metric (e.g. deployment.environment.name=prod); read by the OpenTelemetry SDK. Without a service.instance.id here, each process gets a random one (a UUID), so replicas export series of their own.",
);
pub const OTEL_TRACES_SAMPLER: Var = otel(
    "OTEL_TRACES_SAMPLER",
    K::Text,
    "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio; read by the OpenTelemetry SDK. A parent is the request's traceparent.",
)
.unset("parentbased_always_on");
pub const OTEL_TRACES_SAMPLER_ARG: Var = otel(
    "OTEL_TRACES_SAMPLER_ARG",
    K::Text,
    "The ratio of the traceidratio samplers, 0 to 1; read by the OpenTelemetry SDK.",
)
.unset("1.0");
pub const OTEL_METRICS_EXPORTER: Var = otel(
    "OTEL_METRICS_EXPORTER",
    K::Choice(&["otlp", "none"]),
    "otlp: the metrics go where the endpoints say; none: no metrics are exported (the spans still are), for a collector that takes no metrics, as the Container Apps managed agent's Application Insights destination. A comma-separated list, as the specification has it: empty is the default; a name other than otlp and none (prometheus) is logged at start-up (otel_metrics_exporter_unsupported) and ignored, as the specification asks, and the metrics go over OTLP. /metrics (Prometheus) is served either way.",
)
.default("otlp");
pub const OTEL_METRIC_EXPORT_INTERVAL: Var = otel(
    "OTEL_METRIC_EXPORT_INTERVAL",
    K::Duration {
        min: 1,
        max: HOUR_MS,
    },
    "How often the metrics are exported.",
)
.default("60000")
.unit(Unit::Millis);
pub const OTEL_BSP_MAX_QUEUE_SIZE: Var = otel(
    "OTEL_BSP_MAX_QUEUE_SIZE",
    K::Whole {
        min: 1,
        max: 1_000_000,
    },
    "Ended spans waiting for export, at most. A span past it is dropped and counted (sendgate_otel_spans_dropped_total): a send never waits for the collector.",
)
.default("2048");
pub const OTEL_BSP_MAX_EXPORT_BATCH_SIZE: Var = otel(
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    K::Whole {
        min: 1,
        max: 1_000_000,
    },
    "Spans in one export request, at most (no more than OTEL_BSP_MAX_QUEUE_SIZE).",
)
.default("512");
pub const OTEL_BSP_SCHEDULE_DELAY: Var = otel(
    "OTEL_BSP_SCHEDULE_DELAY",
    K::Duration {
        min: 1,
        max: HOUR_MS,
    },
    "Longest a span waits for its export to start when fewer than a batch are waiting.",
)
.default("5000")
.unit(Unit::Millis);
pub const OTEL_BSP_EXPORT_TIMEOUT: Var = otel(
    "OTEL_BSP_EXPORT_TIMEOUT",
    K::Duration {
        min: 1,
        max: HOUR_MS,
    },
    "Longest one export of spans may take, the exporter's retries included; its spans are then dropped and counted.",
)
.default("30000")
.unit(Unit::Millis);

pub const TOKEN: Var = Var {
    side: Side::Client,
    ..Var::server(
        "SENDGATE_TOKEN",
        G::Client,
        K::Text,
        "The bearer token `sendgate send` sends when --token-file is not given (a token printed by `sendgate keys new`).",
    )
    .secret()
};

/// Every variable, in the order `.env.example` documents them.
pub const VARIABLES: &[&Var] = &[
    &CONFIG,
    &LISTEN,
    &BACKEND,
    &QUEUES,
    &DATA_DIR,
    &RABBITMQ_URL,
    &RABBITMQ_MANAGEMENT_URL,
    &RABBITMQ_MANAGEMENT_USER,
    &RABBITMQ_MANAGEMENT_PASSWORD,
    &RABBITMQ_DEPTH_SOURCE,
    &RABBITMQ_STATS_LAG_MS,
    &SERVICEBUS_NAMESPACE,
    &SERVICEBUS_CONNECTION_STRING,
    &SERVICEBUS_ENDPOINT,
    &SERVICEBUS_MANAGE_CONNECTION_STRING,
    &SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID,
    &SERVICEBUS_MAX_BATCH_BYTES,
    &SERVICEBUS_DEPTH_SOURCE,
    &SERVICEBUS_ARM_NAMESPACE_ID,
    &SERVICEBUS_ARM_ENDPOINT,
    &SERVICEBUS_SEND_MAX_QUEUE_DEPTH,
    &SERVICEBUS_SEND_FAILCLOSED,
    &SERVICEBUS_SEND_FAILCLOSED_STREAK,
    &DEPTH_TTL_MS,
    &OVERRIDES_LAPSE,
    &ADMIN_TIMEOUT_MS,
    &RETRY_AFTER_MAX_S,
    &RESUME_BELOW,
    &FAIR_SHARE,
    &FAIR_SHARE_AT,
    &SHED_AT_SHEDDABLE,
    &SHED_AT_DEFAULT,
    &SEND_TIMEOUT_MS,
    &MAX_IN_FLIGHT,
    &MAX_BODY_BYTES,
    &MAX_BATCH_MESSAGES,
    &MAX_BATCH_BYTES,
    &MAX_JSON_DEPTH,
    &BODY_TIMEOUT_MS,
    &MAX_BUFFERED_BYTES,
    &MAX_CONNECTIONS,
    &MAX_CONNECTIONS_PER_PEER,
    &HEADER_TIMEOUT_MS,
    &MAX_HEAD_BYTES,
    &MAX_BUFFERED_HEAD_BYTES,
    &DRAIN_TIMEOUT_S,
    &DRAIN_LINGER_S,
    &API_KEYS_FILE,
    &AUTH,
    &ENTRA_TENANT_ID,
    &ENTRA_AUDIENCE,
    &ENTRA_AUTHORITY,
    &ENTRA_ALLOWED_APPS,
    &LOG_FORMAT,
    &WORKERS,
    &BREAKER_WINDOW_S,
    &BREAKER_MIN_FAILURES,
    &BREAKER_FAILURE_RATE,
    &BREAKER_OPEN_S,
    &PROBE_INTERVAL_S,
    &FALLBACK_BACKEND,
    &FORCE_BACKEND,
    &FALLBACK_DATA_DIR,
    &FALLBACK_RABBITMQ_URL,
    &FALLBACK_RABBITMQ_MANAGEMENT_URL,
    &FALLBACK_RABBITMQ_MANAGEMENT_USER,
    &FALLBACK_RABBITMQ_MANAGEMENT_PASSWORD,
    &FALLBACK_RABBITMQ_DEPTH_SOURCE,
    &FALLBACK_RABBITMQ_STATS_LAG_MS,
    &FALLBACK_SERVICEBUS_NAMESPACE,
    &FALLBACK_SERVICEBUS_CONNECTION_STRING,
    &FALLBACK_SERVICEBUS_ENDPOINT,
    &FALLBACK_SERVICEBUS_MANAGE_CONNECTION_STRING,
    &FALLBACK_SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID,
    &FALLBACK_SERVICEBUS_MAX_BATCH_BYTES,
    &FALLBACK_SERVICEBUS_DEPTH_SOURCE,
    &FALLBACK_SERVICEBUS_ARM_NAMESPACE_ID,
    &FALLBACK_SERVICEBUS_ARM_ENDPOINT,
    &COORDINATION,
    &REDIS_URL,
    &REDIS_AUTH,
    &REDIS_PREFIX,
    &REDIS_TIMEOUT_MS,
    &FLEET_MAX_REPLICAS,
    &OTEL_SDK_DISABLED,
    &OTEL_EXPORTER_OTLP_ENDPOINT,
    &OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    &OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    &OTEL_METRICS_EXPORTER,
    &OTEL_EXPORTER_OTLP_PROTOCOL,
    &OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    &OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    &OTEL_EXPORTER_OTLP_COMPRESSION,
    &OTEL_EXPORTER_OTLP_HEADERS,
    &OTEL_EXPORTER_OTLP_TRACES_HEADERS,
    &OTEL_EXPORTER_OTLP_METRICS_HEADERS,
    &OTEL_EXPORTER_OTLP_TIMEOUT,
    &OTEL_SERVICE_NAME,
    &OTEL_RESOURCE_ATTRIBUTES,
    &OTEL_TRACES_SAMPLER,
    &OTEL_TRACES_SAMPLER_ARG,
    &OTEL_METRIC_EXPORT_INTERVAL,
    &OTEL_BSP_MAX_QUEUE_SIZE,
    &OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    &OTEL_BSP_SCHEDULE_DELAY,
    &OTEL_BSP_EXPORT_TIMEOUT,
    &TOKEN,
];

/// The variables one backend reads; a backend is parsed through one of these sets.
#[derive(Debug, Clone, Copy)]
pub struct BackendVars {
    pub kind: &'static Var,
    pub data_dir: &'static Var,
    pub rabbitmq_url: &'static Var,
    pub rabbitmq_management_url: &'static Var,
    pub rabbitmq_management_user: &'static Var,
    pub rabbitmq_management_password: &'static Var,
    pub rabbitmq_depth_source: &'static Var,
    pub rabbitmq_stats_lag_ms: &'static Var,
    pub servicebus_namespace: &'static Var,
    pub servicebus_connection_string: &'static Var,
    pub servicebus_endpoint: &'static Var,
    pub servicebus_manage_connection_string: &'static Var,
    pub servicebus_managed_identity_client_id: &'static Var,
    pub servicebus_max_batch_bytes: &'static Var,
    pub servicebus_depth_source: &'static Var,
    pub servicebus_arm_namespace_id: &'static Var,
    pub servicebus_arm_endpoint: &'static Var,
}

pub const PRIMARY_VARS: BackendVars = BackendVars {
    kind: &BACKEND,
    data_dir: &DATA_DIR,
    rabbitmq_url: &RABBITMQ_URL,
    rabbitmq_management_url: &RABBITMQ_MANAGEMENT_URL,
    rabbitmq_management_user: &RABBITMQ_MANAGEMENT_USER,
    rabbitmq_management_password: &RABBITMQ_MANAGEMENT_PASSWORD,
    rabbitmq_depth_source: &RABBITMQ_DEPTH_SOURCE,
    rabbitmq_stats_lag_ms: &RABBITMQ_STATS_LAG_MS,
    servicebus_namespace: &SERVICEBUS_NAMESPACE,
    servicebus_connection_string: &SERVICEBUS_CONNECTION_STRING,
    servicebus_endpoint: &SERVICEBUS_ENDPOINT,
    servicebus_manage_connection_string: &SERVICEBUS_MANAGE_CONNECTION_STRING,
    servicebus_managed_identity_client_id: &SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID,
    servicebus_max_batch_bytes: &SERVICEBUS_MAX_BATCH_BYTES,
    servicebus_depth_source: &SERVICEBUS_DEPTH_SOURCE,
    servicebus_arm_namespace_id: &SERVICEBUS_ARM_NAMESPACE_ID,
    servicebus_arm_endpoint: &SERVICEBUS_ARM_ENDPOINT,
};

pub const FALLBACK_VARS: BackendVars = BackendVars {
    kind: &FALLBACK_BACKEND,
    data_dir: &FALLBACK_DATA_DIR,
    rabbitmq_url: &FALLBACK_RABBITMQ_URL,
    rabbitmq_management_url: &FALLBACK_RABBITMQ_MANAGEMENT_URL,
    rabbitmq_management_user: &FALLBACK_RABBITMQ_MANAGEMENT_USER,
    rabbitmq_management_password: &FALLBACK_RABBITMQ_MANAGEMENT_PASSWORD,
    rabbitmq_depth_source: &FALLBACK_RABBITMQ_DEPTH_SOURCE,
    rabbitmq_stats_lag_ms: &FALLBACK_RABBITMQ_STATS_LAG_MS,
    servicebus_namespace: &FALLBACK_SERVICEBUS_NAMESPACE,
    servicebus_connection_string: &FALLBACK_SERVICEBUS_CONNECTION_STRING,
    servicebus_endpoint: &FALLBACK_SERVICEBUS_ENDPOINT,
    servicebus_manage_connection_string: &FALLBACK_SERVICEBUS_MANAGE_CONNECTION_STRING,
    servicebus_managed_identity_client_id: &FALLBACK_SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID,
    servicebus_max_batch_bytes: &FALLBACK_SERVICEBUS_MAX_BATCH_BYTES,
    servicebus_depth_source: &FALLBACK_SERVICEBUS_DEPTH_SOURCE,
    servicebus_arm_namespace_id: &FALLBACK_SERVICEBUS_ARM_NAMESPACE_ID,
    servicebus_arm_endpoint: &FALLBACK_SERVICEBUS_ARM_ENDPOINT,
};

/// The declared variable of this name, if any.
pub fn find(name: &str) -> Option<&'static Var> {
    VARIABLES.iter().copied().find(|v| v.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_every_scoped_variable_is_declared() {
        let mut seen = HashSet::new();
        for v in VARIABLES {
            assert!(seen.insert(v.name), "{} twice", v.name);
        }
        for set in [PRIMARY_VARS, FALLBACK_VARS] {
            for v in [
                set.kind,
                set.data_dir,
                set.rabbitmq_url,
                set.rabbitmq_management_url,
                set.rabbitmq_management_user,
                set.rabbitmq_management_password,
                set.rabbitmq_depth_source,
                set.rabbitmq_stats_lag_ms,
                set.servicebus_namespace,
                set.servicebus_connection_string,
                set.servicebus_endpoint,
                set.servicebus_manage_connection_string,
                set.servicebus_managed_identity_client_id,
                set.servicebus_max_batch_bytes,
                set.servicebus_depth_source,
                set.servicebus_arm_namespace_id,
                set.servicebus_arm_endpoint,
            ] {
                assert!(seen.contains(v.name), "{} is not in VARIABLES", v.name);
            }
        }
    }

    #[test]
    fn a_fallback_variable_keeps_its_primarys_kind_and_secrecy() {
        for v in VARIABLES.iter().filter(|v| v.fallback_of.is_some()) {
            let primary = v.fallback_of.unwrap();
            assert_eq!(v.kind, primary.kind, "{}", v.name);
            assert_eq!(v.secret, primary.secret, "{}", v.name);
            assert!(v.default.is_none(), "{}", v.name);
        }
    }

    #[test]
    fn defaults_are_within_their_bounds() {
        for v in VARIABLES {
            let Some(default) = v.default else { continue };
            if let Kind::Whole { min, max } | Kind::Duration { min, max } = v.kind {
                let n: u64 = default.parse().unwrap();
                assert!((min..=max).contains(&n), "{}", v.name);
            }
            if let Kind::Choice(options) = v.kind {
                assert!(options.contains(&default), "{}", v.name);
            }
        }
    }
}
