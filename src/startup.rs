//! Build the application from [`Settings`], bind, run, and wire signals to the lifecycle.
//!
//! `Application::build` opens the backends (`build_with` takes them injected, for tests),
//! binds, and runs the warm-up (starting → running within a budget), the probe timer and,
//! in a fleet, the settings poll; a signal starts the drain, and once stopped the replica
//! leaves the fleet.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{web, App};

use crate::admission::assemble::{assemble, Assembled};
use crate::admission::fair::quota::RateBook;
use crate::admission::Dispatcher;
use crate::backend::embedded::{EmbeddedQueue, StoreError};
use crate::backend::rabbitmq::RabbitMq;
use crate::backend::servicebus::ServiceBus;
use crate::backend::Backend;
use crate::config::{AuthSettings, BackendSettings, ConfigError, Settings};
use crate::coordination::Coordination;
use crate::domain::QueueName;
use crate::http::auth::{Authenticator, KeysFileError};
use crate::http::body_budget::BodyBudget;
use crate::http::entra_auth::EntraVerifier;
use crate::http::guard::HostCheck;
use crate::http::openapi::Mode;
use crate::http::state::{BodyLimits, Control, Edge, Observability};
use crate::http::{routes, AppState};
use crate::lifecycle::Lifecycle;
use crate::settings::RuntimeSettings;

/// A listener on `addr` with a backlog of 2048, as actix-server binds its own (std's
/// `TcpListener::bind` gives 128, which a reconnect storm overflows: new clients' SYNs
/// were dropped for a second at a time, measured).
fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(2048)?;
    Ok(socket.into())
}

/// The answer to a connection refused at accept (full of busy connections, or its peer at
/// its cap), written before any byte is read.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// The HTTP/1.1 server over `listener`: actix-web's `HttpServer` as it builds itself, with
/// every accepted connection admitted by `connections` and served through its guarded
/// stream (`src/transport`: head deadlines, head bytes, room kept for new clients).
fn serve<F, A>(
    listener: TcpListener,
    app: F,
    workers: usize,
    connections: Arc<crate::transport::Connections>,
) -> std::io::Result<Server>
where
    F: Fn() -> App<A> + Send + Clone + 'static,
    A: actix_web::dev::ServiceFactory<
            actix_web::dev::ServiceRequest,
            Config = (),
            Response = actix_web::dev::ServiceResponse,
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
{
    use actix_service::{fn_service, map_config, IntoServiceFactory as _, ServiceFactoryExt as _};

    let local = listener.local_addr()?;
    let limits = connections.limits();
    let builder = actix_server::Server::build();
    let shutdown = builder.graceful_shutdown_signal();
    // The transport decides how many connections are open; actix-server only stops
    // accepting (leaving new ones in the backlog, unseen) past this, per worker.
    let per_worker = limits.max_connections.saturating_mul(2).max(1);
    let builder = builder
        .workers(workers)
        .max_concurrent_connections(per_worker)
        // The lifecycle owns SIGTERM/SIGINT: the listener must keep accepting while draining.
        .disable_signals()
        .shutdown_timeout(1)
        .listen("sendgate", listener, move || {
            let connections = Arc::clone(&connections);
            let shutdown = shutdown.clone();
            let http = actix_http::HttpService::build()
                .graceful_shutdown_signal(move || {
                    let signal = shutdown.clone();
                    async move { signal.notified().await }
                })
                // Longer than the usual 60 s idle timeout of load balancers in front, so the
                // balancer, not sendgate, closes idle connections (no reset-on-reuse races).
                .keep_alive(Duration::from_secs(75))
                // The transport's deadline is every head's (and answers 408 itself); this one,
                // actix-http's, only the first's, on a clock up to 0.5 s stale: a second later,
                // so the transport's is the one that cuts and counts.
                .client_request_timeout(limits.header_timeout + Duration::from_secs(1))
                .client_disconnect_timeout(Duration::from_secs(1))
                .local_addr(local)
                .h1(map_config(
                    app().into_factory().map_err(|err| err.error_response()),
                    |_| actix_web::dev::AppConfig::default(),
                ));
            fn_service(move |io| admit_connection(&connections, io)).and_then(http)
        })?;
    Ok(builder.run())
}

/// An accepted connection, admitted by `connections` (its seat taken now, at accept) and
/// guarded; or refused, told why first.
fn admit_connection(
    connections: &Arc<crate::transport::Connections>,
    io: tokio::net::TcpStream,
) -> impl std::future::Future<
    Output = Result<
        (
            crate::transport::Guarded<tokio::net::TcpStream>,
            Option<std::net::SocketAddr>,
        ),
        actix_http::error::DispatchError,
    >,
> {
    let peer = io.peer_addr().ok();
    let admitted = connections.admit(peer.map(|p| p.ip()));
    async move {
        let _ = io.set_nodelay(true);
        match admitted {
            Ok(seat) => Ok((crate::transport::Guarded::new(io, seat), peer)),
            Err(why) => Err(refuse(io, why.as_str()).await),
        }
    }
}

/// Tell a refused connection why before it is dropped, if the socket takes it at once: a
/// client can tell "busy, try again" from a crash.
async fn refuse(
    mut io: tokio::net::TcpStream,
    why: &'static str,
) -> actix_http::error::DispatchError {
    use tokio::io::AsyncWriteExt as _;
    let told = async {
        io.write_all(REFUSED).await?;
        io.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_millis(20), told).await;
    actix_http::error::DispatchError::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        why,
    ))
}

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Keys(#[from] KeysFileError),
    #[error("SENDGATE_DATA_DIR: {0}")]
    Embedded(#[from] StoreError),
    /// The backend could not be set up although its settings are well-formed (exit 1).
    #[error("backend: {0}")]
    BackendInit(String),
    /// The runtime settings kept in the data directory cannot be used.
    #[error("runtime settings: {0}")]
    Settings(#[from] crate::settings::store::SettingsStoreError),
    /// The client that fetches the Entra ID signing keys could not be built (exit 1).
    #[error("SENDGATE_ENTRA_TENANT_ID: {0}")]
    EntraInit(String),
    /// The OpenTelemetry exporter could not be built (its settings, or the environment).
    #[error(transparent)]
    Otel(#[from] crate::otel::OtelError),
    #[error("SENDGATE_LISTEN: cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

impl StartupError {
    /// 2 for a setting that is wrong, 1 for an environment that failed us.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Keys(_) => 2,
            // A file that is not a settings file is a setting that is wrong; one that cannot
            // be read, an environment that failed us.
            Self::Settings(crate::settings::store::SettingsStoreError::Corrupt { .. }) => 2,
            Self::Otel(_) => 1,
            Self::Embedded(_)
            | Self::Bind { .. }
            | Self::BackendInit(_)
            | Self::EntraInit(_)
            | Self::Settings(_) => 1,
        }
    }
}

/// The longest the stop waits for OpenTelemetry's last export, after the drain.
const OTEL_FLUSH_BUDGET: Duration = Duration::from_secs(5);

/// How long start-up waits for the backend to connect, on top of one depth read's timeout.
const STARTUP_CONNECT_BUDGET: Duration = Duration::from_secs(5);

/// `starting` → `running`: connect the backend and make each queue's first depth read
/// (success or failure, both bounded), then admit sends. A backend that is down does not
/// keep the gateway `starting` for ever: after the budget it runs, and the capacity rules
/// (fail open, or fail closed after the streak) decide what happens to sends.
async fn warm_up(state: web::Data<AppState>, budget: Duration) {
    let deadline = tokio::time::Instant::now() + budget;
    if let Err(e) = state.dispatcher.warm_up(deadline).await {
        tracing::warn!(event = "backend_unreachable_at_start", error = %e, "the backend is not reachable yet");
    }
    let _ = tokio::time::timeout_at(deadline, state.dispatcher.prime_capacity()).await;
    // A replica of a fleet starts with the fleet's runtime settings when Redis answers
    // within a second; otherwise with the variables', until its next read succeeds.
    let settings_by = tokio::time::Instant::now() + Duration::from_secs(1);
    while !state.control.settings.sync(&state.dispatcher).await
        && tokio::time::Instant::now() < settings_by
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    state.lifecycle.set_running();
    tracing::info!(event = "started", "sendgate is running");
}

/// What a caller keeps while the server runs: the lifecycle, to wait for `running` or to
/// start a drain without a signal.
#[derive(Clone)]
pub struct AppHandle {
    pub lifecycle: Lifecycle,
}

/// The backends the gateway dispatches to. [`Backends::open`] makes them from the
/// settings; tests build their own (real backends wrapped in fault-injecting decorators)
/// and hand them to [`Application::build_with`].
pub struct Backends {
    pub primary: Arc<dyn Backend>,
    /// Used while the primary's breaker is open (`SENDGATE_FALLBACK_BACKEND`).
    pub fallback: Option<Arc<dyn Backend>>,
}

impl Backends {
    /// Open the backends the settings name. Nothing is connected yet: that happens during
    /// warm-up, so a broker that is down does not stop start-up.
    pub fn open(settings: &Settings) -> Result<Self, StartupError> {
        let primary = open_backend(&settings.primary, &settings.queues)?;
        let fallback = match &settings.fallback {
            None => None,
            Some(f) => Some(open_backend(f, &settings.queues)?),
        };
        Ok(Self { primary, fallback })
    }

    /// Each backend with its depth reads timed into `metrics` (whoever opened it).
    fn with_depth_reads_timed(self, metrics: &crate::metrics::Metrics) -> Self {
        use crate::admission::BackendRole;
        Self {
            primary: metrics.time_depth_reads(self.primary, BackendRole::Primary),
            fallback: self
                .fallback
                .map(|f| metrics.time_depth_reads(f, BackendRole::Fallback)),
        }
    }
}

fn open_backend(
    settings: &BackendSettings,
    queues: &[QueueName],
) -> Result<Arc<dyn Backend>, StartupError> {
    Ok(match settings {
        BackendSettings::Embedded { data_dir } => Arc::new(EmbeddedQueue::open(data_dir)?),
        BackendSettings::RabbitMq(rabbitmq) => Arc::new(
            RabbitMq::new(rabbitmq, queues)
                .map_err(|e| StartupError::BackendInit(e.to_string()))?,
        ),
        BackendSettings::ServiceBus(plan) => {
            Arc::new(ServiceBus::new(plan).map_err(|e| StartupError::BackendInit(e.to_string()))?)
        }
    })
}

/// Open without keys on a loopback listener, only loopback `Host` names are served: a
/// web page must not reach the gateway through DNS rebinding (see `http/guard.rs`).
fn host_check(settings: &Settings) -> HostCheck {
    match settings.auth {
        AuthSettings::Open {
            explicitly_none: false,
        } => HostCheck::LoopbackOnly,
        AuthSettings::Open {
            explicitly_none: true,
        }
        | AuthSettings::Callers { .. } => HostCheck::Off,
    }
}

/// Probe every backend's admin plane on a timer, for `/health/detailed`. Probes have their
/// own deadline and never take a request-path slot or feed the breaker.
async fn probe_forever(state: web::Data<AppState>, every: Duration, timeout: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if state.lifecycle.state() == crate::lifecycle::GatewayState::Stopped {
            return;
        }
        futures_util::future::join_all(state.dispatcher.lanes().map(|lane| lane.probe(timeout)))
            .await;
    }
}

/// [`RuntimeSettings::sync`] every [`crate::settings::POLL_EVERY`]: in a fleet for ever, so
/// an override made on another replica is in force here too; in local mode until the
/// start-up check has run and what lapsed is dropped from the file (a failed drop retried).
async fn poll_settings_forever(state: web::Data<AppState>) {
    let settings = &state.control.settings;
    let mut tick = tokio::time::interval(crate::settings::POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while settings.needs_sync() {
        tick.tick().await;
        settings.sync(&state.dispatcher).await;
    }
}

/// Who may call: the keys file and Entra ID, or nobody checked (open mode, said loudly).
fn authenticator(settings: &Settings) -> Result<Authenticator, StartupError> {
    Ok(match &settings.auth {
        AuthSettings::Callers { keys_file, entra } => {
            // The first fetch of the directory's keys starts here, in the background:
            // an unreachable directory delays Entra ID callers (401 until it answers),
            // never the gateway.
            let verifier = entra
                .as_ref()
                .map(EntraVerifier::start)
                .transpose()
                .map_err(StartupError::EntraInit)?;
            Authenticator::from_parts(keys_file.as_deref(), verifier)?
        }
        AuthSettings::Open { explicitly_none } => {
            tracing::warn!(
                event = "auth_open",
                explicitly_none,
                listen = %settings.listen,
                "no API keys configured: every caller may send, observe and use the admin routes (POST /admin/drain); only loopback Host names are served unless SENDGATE_AUTH=none"
            );
            Authenticator::Open
        }
    })
}

/// The runtime settings, read from where they are kept and in force on `dispatcher`.
fn control(
    settings: &Settings,
    coordination: Coordination,
    dispatcher: &Dispatcher,
) -> Result<Control, StartupError> {
    let runtime = RuntimeSettings::open(settings, &coordination)?;
    runtime.apply(dispatcher);
    Ok(Control {
        settings: Arc::new(runtime),
        coordination,
        drain_window: settings.drain_timeout,
    })
}

/// What a request meets before admission: `auth`, the served queues, the bodies' limits
/// and their budget.
fn edge(settings: &Settings, auth: Authenticator) -> Edge {
    Edge {
        auth,
        queues: settings
            .queues
            .iter()
            .map(|q| (q.to_string(), q.clone()))
            .collect::<HashMap<_, _>>(),
        limits: BodyLimits {
            max_body_bytes: settings.max_body_bytes,
            max_batch_messages: settings.max_batch_messages,
            max_batch_bytes: settings.max_batch_bytes,
            max_json_depth: settings.max_json_depth,
            body_timeout: settings.body_timeout,
        },
        body_budget: BodyBudget::new(settings.max_buffered_bytes),
    }
}

fn observability(
    settings: &Settings,
    metrics: crate::metrics::Metrics,
) -> Result<Observability, StartupError> {
    Ok(Observability {
        metrics,
        otel: crate::otel::Otel::build(&settings.otel)?.map(Arc::new),
        connections: crate::transport::Connections::new(settings.connections),
    })
}

/// Bind `SENDGATE_LISTEN` and serve the routes over it, behind the host check and the
/// request context; the port bound (the setting may ask for any).
fn bind_and_serve(
    settings: &Settings,
    state: &web::Data<AppState>,
) -> Result<(Server, u16), StartupError> {
    let bind_error = |source| StartupError::Bind {
        addr: settings.listen.to_string(),
        source,
    };
    let listener = listen(settings.listen).map_err(bind_error)?;
    let port = listener.local_addr().map_err(bind_error)?.port();
    let app_state = state.clone();
    let host_check = host_check(settings);
    let app = move || {
        App::new()
            // Inside the request context, so a refusal carries its X-Request-Id.
            .wrap(actix_web::middleware::from_fn(move |req, next| {
                crate::http::guard::refuse_foreign_hosts(host_check, req, next)
            }))
            .wrap(crate::http::RequestIdentity)
            .app_data(app_state.clone())
            .configure(routes)
    };
    let workers = settings.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let connections = Arc::clone(&state.observability.connections);
    let server = serve(listener, app, workers, connections).map_err(bind_error)?;
    tracing::info!(
        event = "listening",
        listen = %settings.listen,
        port,
        backend = settings.primary.kind().as_str(),
        queues = ?settings.queues.iter().map(|q| q.as_str()).collect::<Vec<_>>(),
        "sendgate is listening; starting"
    );
    Ok((server, port))
}

/// What runs beside the server: the backends' probes, the fleet's settings poll, and the
/// warm-up that turns the gateway `running`.
fn spawn_background(settings: &Settings, state: &web::Data<AppState>) {
    let budget = STARTUP_CONNECT_BUDGET + settings.capacity.admin_timeout;
    if !settings.dispatch.probe_interval.is_zero() {
        tokio::spawn(probe_forever(
            state.clone(),
            settings.dispatch.probe_interval,
            settings.capacity.admin_timeout,
        ));
    }
    tokio::spawn(poll_settings_forever(state.clone()));
    tokio::spawn(warm_up(state.clone(), budget));
}

pub struct Application {
    server: Server,
    port: u16,
    handle: AppHandle,
    /// For the goodbye to the fleet once drained.
    state: web::Data<AppState>,
    drain_timeout: Duration,
    drain_linger: Duration,
}

impl Application {
    /// Open the configured backends and bind the listener. The gateway is `starting` when
    /// this returns; it turns `running` once the backends are warmed up (see [`warm_up`]).
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        let backends = Backends::open(&settings)?;
        Self::build_with(settings, backends)
    }

    /// Assemble the gateway from settings and backends that are already open, bind the
    /// listener and start warming up. Needs a Tokio runtime.
    pub fn build_with(settings: Settings, backends: Backends) -> Result<Self, StartupError> {
        let auth = authenticator(&settings)?;
        let metrics = crate::metrics::Metrics::new();
        let backends = backends.with_depth_reads_timed(&metrics);
        let (dispatcher, coordination, rates) = Self::dispatcher(&settings, backends, &auth);
        let control = control(&settings, coordination, &dispatcher)?;
        // A send admitted before a drain has its body's deadline, then its send's.
        let longest_send = settings.body_timeout + settings.send_timeout;
        let lifecycle = Lifecycle::with_drain(settings.drain_linger, longest_send);
        let state = web::Data::new(AppState {
            openapi: crate::http::openapi::served(Mode::of(&auth), settings.fallback.is_some()),
            edge: edge(&settings, auth),
            dispatcher,
            rates,
            lifecycle: lifecycle.clone(),
            control,
            observability: observability(&settings, metrics)?,
        });
        let (server, port) = bind_and_serve(&settings, &state)?;
        spawn_background(&settings, &state);
        Ok(Self {
            server,
            port,
            handle: AppHandle { lifecycle },
            state,
            drain_timeout: settings.drain_timeout,
            drain_linger: settings.drain_linger,
        })
    }

    /// The dispatcher over the primary's lane and the fallback's, their gates shared among
    /// the tenants and, in a fleet, joined to it; with the coordination it joined and the
    /// tenants' rate book.
    fn dispatcher(
        settings: &Settings,
        backends: Backends,
        auth: &Authenticator,
    ) -> (Dispatcher, Coordination, Arc<RateBook>) {
        // Tenants share each queue's room, and criticality is shed, by the keys file's
        // tenants (open mode: one tenant, every send at the default level).
        let tenants = auth.tenants();
        let coordination = Coordination::start(&settings.coordination);
        let Assembled { dispatcher, rates } = assemble(
            settings,
            backends.primary,
            backends.fallback,
            &tenants,
            &coordination,
        );
        (dispatcher, coordination, rates)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn handle(&self) -> AppHandle {
        self.handle.clone()
    }

    /// Serve until a drain (started by `signals`, or through the handle) completes: no send
    /// in flight and the linger over, or the window closed (see `lifecycle.rs`). Until then
    /// the listener keeps answering, so a balancer still routing here meets `503 draining`.
    /// With `signals`, SIGTERM or SIGINT starts the drain and a second one ends it at once.
    /// The server then stops, and a replica of a fleet leaves it (see `FleetSeat::leave`).
    pub async fn run_until_stopped(self, signals: bool) -> std::io::Result<()> {
        let server_handle = self.server.handle();
        let mut server = tokio::spawn(self.server);
        let lifecycle = self.handle.lifecycle.clone();
        // One listener counts every signal: the first starts the drain, the second ends it.
        // A drain started another way (POST /admin/drain) is not ended by the platform's
        // first SIGTERM: only a second signal received cuts it short.
        let (count, mut received) = tokio::sync::watch::channel(0u32);
        if signals {
            tokio::spawn(count_signals(count, lifecycle.clone(), self.drain_timeout));
        }

        tokio::select! {
            finished = &mut server => return finished.unwrap_or_else(|e| Err(std::io::Error::other(e))),
            () = lifecycle.drain_started() => {}
        }
        tracing::info!(
            event = "drain_started",
            in_flight = lifecycle.sends_in_flight(),
            window_s = self.drain_timeout.as_secs(),
            linger_s = self.drain_linger.as_secs(),
            "draining: new sends get 503 until the process exits"
        );
        let cut_off = tokio::select! {
            left = lifecycle.drained() => left,
            _ = received.wait_for(|n| *n >= 2) => {
                tracing::warn!(event = "drain_interrupted", "second signal: ending the drain now");
                lifecycle.sends_in_flight()
            }
        };
        lifecycle.set_stopped();
        tracing::info!(event = "drain_finished", cut_off, "drain finished");
        stop(server_handle, server, &self.state, cut_off).await
    }
}

/// Count SIGTERM and SIGINT into `count`: the first begins the drain (with `window`), the
/// second is the caller's to see.
async fn count_signals(
    count: tokio::sync::watch::Sender<u32>,
    lifecycle: Lifecycle,
    window: Duration,
) {
    let Ok(mut stream) = SignalStream::new() else {
        tracing::error!(
            event = "signals_unavailable",
            "cannot listen for SIGTERM/SIGINT"
        );
        return;
    };
    loop {
        stream.next().await;
        let n = *count.borrow() + 1;
        count.send_replace(n);
        if n == 1 {
            lifecycle.begin_drain(window);
        }
    }
}

/// Stopped: nothing is admitted any more. The server goes first (at once when `cut_off`
/// sends were still in flight), so no handler runs after the goodbye (a send cut off mid-way
/// drops its reservation, settled as Unknown); a send still in the pipeline meanwhile finds
/// its seat leaving and is refused. Then, in a fleet, settle what is left and leave it, so
/// the others get this replica's share of the room now rather than once it has not been
/// heard from for a member horizon (bounded by three Redis deadlines: a settle on its way
/// and the settle batch queued behind it, then the goodbye; a failure is logged, the share
/// expires).
async fn stop(
    server_handle: actix_web::dev::ServerHandle,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    state: &AppState,
    cut_off: usize,
) -> std::io::Result<()> {
    server_handle.stop(cut_off == 0).await;
    let served = server
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    state.dispatcher.leave_fleet().await;
    // The last spans and metrics, within a bound of their own: a dead collector never
    // holds the exit.
    if let Some(otel) = &state.observability.otel {
        otel.shutdown(OTEL_FLUSH_BUDGET).await;
    }
    served
}

/// SIGTERM and SIGINT as one stream.
#[cfg(unix)]
struct SignalStream {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl SignalStream {
    fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(not(unix))]
struct SignalStream;

#[cfg(not(unix))]
impl SignalStream {
    fn new() -> std::io::Result<Self> {
        Ok(Self)
    }

    async fn next(&mut self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}
