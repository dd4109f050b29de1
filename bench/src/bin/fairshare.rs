//! fairshare: the tenants' scenarios of `./bench/run.sh` comparison 12 (issue 25, fair
//! shares of the ceiling). One JSON line.
//!
//! ```text
//! fairshare --addr 127.0.0.1:P[,127.0.0.1:P2,...] --queue Q --ceiling 40 --duration 60
//!           --tenants a,b
//!           --a-token T --a-kind greedy --a-threads 12 --a-retry-ms 20 [--a-on 0,1,2]
//!           --b-token T --b-kind paced --b-rate 10 [--b-on 0] [--b-criticality sheddable]
//!           [--drain none|embedded|amqp] [--drain-rate 50] [--tick-ms 100]
//!           [--sendgate BIN --data-dir D]       # --drain embedded
//!           [--amqp-url amqp://...]             # --drain amqp
//!           [--sample-ms 100]
//! ```
//!
//! Each tenant (`--tenants`, a prefix for its own flags) sends to the addresses `--X-on`
//! names (indices into `--addr`; default all of them), one keep-alive connection per
//! thread, a small JSON message per request:
//! - `greedy`: `threads` threads, each sending one message after another; after anything
//!   but a `201` it waits `retry-ms` (ignoring `Retry-After`, as the issue's greedy tenant
//!   does) and sends again. Threads are dealt out round robin over the addresses.
//! - `paced`: `rate` new messages a second from one thread, each sent once (a refused
//!   message is not retried): what a producer honouring the contract offers.
//!
//! `--X-criticality` sends a `Sendgate-Criticality` header on every request.
//!
//! The drain takes `drain-rate` messages a second off the queue, no more, and no credit
//! for the moments the queue was empty: `embedded` runs `sendgate queue receive --max K`
//! every `tick-ms` (what a worker beside the embedded backend does), reading
//! `sendgate queue depth` just before each receive (the backlog's peaks are just before a
//! drain); `amqp` takes messages with `basic.get` (no ack) on one channel while a second
//! one reads the exact depth (passive `queue.declare`) every `sample-ms`; `none` consumes
//! nothing (the depth is then read every `sample-ms` as for `embedded`, when it is given).
//! A take that finds too little counts as the worker finding the queue empty only once it
//! has taken a first message: the drain starts before the producers have connected, and
//! its polls of the still-empty queue then (one every 5 ms on `amqp`) say nothing of the
//! gateway.
//!
//! Reported per tenant: requests, admitted (`201`), statuses, the 429s by `reason`
//! (`ceiling` when the answer names none), admitted per second, the first refusal (when,
//! its `backlog`, `limit`, `reason`, `criticality`, and every tenant's admissions so far),
//! and admissions of requests sent after that first refusal came back. Overall: what was
//! consumed, admitted in total, and the depth's samples (max, mean, over the ceiling).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::time::Instant;

type Args = HashMap<String, String>;

fn parse_args(raw: &[String]) -> Args {
    let mut args = Args::new();
    let mut it = raw.iter();
    while let Some(key) = it.next() {
        let Some(name) = key.strip_prefix("--") else {
            die(&format!("unexpected argument {key:?}"));
        };
        let value = it
            .next()
            .unwrap_or_else(|| die(&format!("--{name} needs a value")));
        args.insert(name.to_owned(), value.clone());
    }
    args
}

fn die(msg: &str) -> ! {
    eprintln!("fairshare: {msg}");
    std::process::exit(2)
}

fn get<T: std::str::FromStr>(args: &Args, key: &str, default: Option<T>) -> T {
    match args.get(key) {
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| die(&format!("--{key}: bad value {v:?}"))),
        None => default.unwrap_or_else(|| die(&format!("--{key} is required"))),
    }
}

fn loadavg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = parse_args(&argv);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(get(&args, "threads", Some(2)))
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!("{}", runtime.block_on(run(&args)));
}

// ---------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client (as loadgen's): one request at a time on a keep-alive connection.

struct HttpConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl HttpConn {
    async fn connect(addr: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(8192),
        })
    }

    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16384];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Send `request` and read one answer: (status, keep-alive?, body).
    async fn round_trip(&mut self, request: &[u8]) -> io::Result<(u16, bool, Vec<u8>)> {
        self.stream.write_all(request).await?;
        let head_end = loop {
            if let Some(pos) = find(&self.buf, b"\r\n\r\n") {
                break pos;
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end])
            .map_err(|_| io::Error::other("non-UTF-8 response head"))?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other("bad status line"))?;
        let mut length = 0usize;
        let mut keep = true;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value
                    .parse()
                    .map_err(|_| io::Error::other("bad content-length"))?;
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                keep = false;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(io::Error::other("chunked answers are not supported"));
            }
        }
        let total = head_end + 4 + length;
        while self.buf.len() < total {
            self.fill().await?;
        }
        let body = self.buf[head_end + 4..total].to_vec();
        self.buf.drain(..total);
        Ok((status, keep, body))
    }
}

// ---------------------------------------------------------------------------------------
// Tenants.

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Greedy,
    Paced,
}

struct TenantSpec {
    name: String,
    token: String,
    kind: Kind,
    threads: usize,
    retry: Duration,
    rate: f64,
    on: Vec<String>,
    criticality: Option<String>,
}

#[derive(Default)]
struct Stats {
    requests: u64,
    admitted: u64,
    errors: u64,
    statuses: BTreeMap<u16, u64>,
    reasons: BTreeMap<String, u64>,
    admitted_by_addr: BTreeMap<String, u64>,
    per_second: Vec<u64>,
    first_refusal: Option<Value>,
    /// When the first refusal's answer came back: a request sent after it that is admitted
    /// counts in `admitted_after_first_refusal`.
    first_refusal_at: Option<Instant>,
    admitted_after_first_refusal: u64,
    shares_seen: Vec<f64>,
}

/// Every tenant's admissions so far, for the first refusal's context.
type Admitted = Arc<Vec<(String, Arc<AtomicU64>)>>;

struct Shared {
    start: Instant,
    end: Instant,
    queue: String,
    admitted: Admitted,
}

fn request_bytes(t: &TenantSpec, queue: &str, addr: &str, n: u64) -> Vec<u8> {
    let body = format!("{{\"tenant\":\"{}\",\"n\":{n}}}", t.name);
    let crit = t
        .criticality
        .as_ref()
        .map(|c| format!("Sendgate-Criticality: {c}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /v1/queues/{queue}/messages HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {}\r\n{crit}Content-Length: {}\r\n\r\n{body}",
        t.token,
        body.len()
    )
    .into_bytes()
}

/// One send on `conn` (connecting first when there is none); the status, or None when the
/// connection failed. Everything about the answer goes into `stats`.
async fn send_one(
    t: &TenantSpec,
    sh: &Shared,
    addr: &str,
    conn: &mut Option<HttpConn>,
    n: u64,
    stats: &Mutex<Stats>,
    mine: &AtomicU64,
) -> Option<u16> {
    let sent_at = Instant::now();
    if conn.is_none() {
        match HttpConn::connect(addr).await {
            Ok(c) => *conn = Some(c),
            Err(_) => {
                stats.lock().unwrap_or_else(|e| e.into_inner()).errors += 1;
                return None;
            }
        }
    }
    let request = request_bytes(t, &sh.queue, addr, n);
    let c = conn.as_mut()?;
    let answer = tokio::time::timeout(Duration::from_secs(10), c.round_trip(&request)).await;
    let (status, keep, body) = match answer {
        Ok(Ok(a)) => a,
        _ => {
            *conn = None;
            stats.lock().unwrap_or_else(|e| e.into_inner()).errors += 1;
            return None;
        }
    };
    if !keep {
        *conn = None;
    }
    let now = Instant::now();
    if now > sh.end {
        // Answered after the window: not counted (the window is what the drain saw).
        return Some(status);
    }
    if status == 201 {
        mine.fetch_add(1, Ordering::Relaxed);
    }
    let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
    s.requests += 1;
    *s.statuses.entry(status).or_default() += 1;
    if status == 201 {
        s.admitted += 1;
        *s.admitted_by_addr.entry(addr.to_owned()).or_default() += 1;
        let sec = (now - sh.start).as_secs() as usize;
        if s.per_second.len() <= sec {
            s.per_second.resize(sec + 1, 0);
        }
        s.per_second[sec] += 1;
        if s.first_refusal_at.is_some_and(|at| sent_at > at) {
            s.admitted_after_first_refusal += 1;
        }
    } else if status == 429 {
        let b: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let reason = b
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("ceiling")
            .to_owned();
        *s.reasons.entry(reason.clone()).or_default() += 1;
        if let Some(share) = b.get("share").and_then(Value::as_f64) {
            if s.shares_seen.len() < 100_000 {
                s.shares_seen.push(share);
            }
        }
        if s.first_refusal.is_none() {
            let so_far: BTreeMap<String, u64> = sh
                .admitted
                .iter()
                .map(|(n, a)| (n.clone(), a.load(Ordering::Relaxed)))
                .collect();
            s.first_refusal = Some(json!({
                "at_s": (now - sh.start).as_secs_f64(),
                "reason": reason,
                "backlog": b.get("backlog"),
                "limit": b.get("limit"),
                "criticality": b.get("criticality"),
                "share": b.get("share"),
                "admitted_so_far": so_far,
                "admitted_total_so_far": so_far.values().sum::<u64>(),
            }));
            s.first_refusal_at = Some(now);
        }
    }
    Some(status)
}

async fn greedy_thread(
    t: Arc<TenantSpec>,
    sh: Arc<Shared>,
    addr: String,
    stats: Arc<Mutex<Stats>>,
    mine: Arc<AtomicU64>,
    id: u64,
) {
    let mut conn = None;
    let mut n = id << 32;
    while Instant::now() < sh.end {
        n += 1;
        let status = send_one(&t, &sh, &addr, &mut conn, n, &stats, &mine).await;
        if status != Some(201) {
            tokio::time::sleep(t.retry).await;
        }
    }
}

async fn paced_thread(
    t: Arc<TenantSpec>,
    sh: Arc<Shared>,
    stats: Arc<Mutex<Stats>>,
    mine: Arc<AtomicU64>,
) {
    let mut conns: Vec<Option<HttpConn>> = t.on.iter().map(|_| None).collect();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / t.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        tick.tick().await;
        if Instant::now() >= sh.end {
            break;
        }
        let i = n as usize % t.on.len();
        n += 1;
        send_one(&t, &sh, &t.on[i], &mut conns[i], n, &stats, &mine).await;
    }
}

fn tenant_spec(args: &Args, name: &str, addrs: &[String]) -> TenantSpec {
    let key = |k: &str| format!("{name}-{k}");
    let kind = match args.get(&key("kind")).map(String::as_str) {
        Some("greedy") | None => Kind::Greedy,
        Some("paced") => Kind::Paced,
        Some(other) => die(&format!("--{name}-kind: unknown {other:?}")),
    };
    let on: Vec<String> = match args.get(&key("on")) {
        Some(list) => list
            .split(',')
            .map(|i| {
                let i: usize = i
                    .parse()
                    .unwrap_or_else(|_| die(&format!("--{name}-on: bad index {i:?}")));
                addrs
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| die(&format!("--{name}-on: no address {i}")))
            })
            .collect(),
        None => addrs.to_vec(),
    };
    TenantSpec {
        name: name.to_owned(),
        token: get(args, &key("token"), None),
        kind,
        threads: get(args, &key("threads"), Some(1)),
        retry: Duration::from_millis(get(args, &key("retry-ms"), Some(20))),
        rate: get(args, &key("rate"), Some(10.0)),
        on,
        criticality: args.get(&key("criticality")).cloned(),
    }
}

// ---------------------------------------------------------------------------------------
// The drain and the depth.

struct DrainOut {
    consumed: u64,
    /// Takes that found too little, after the first message was taken.
    starved_ticks: u64,
    errors: u64,
    depths: Vec<u64>,
}

async fn cli_depth(bin: &str, queue: &str, data_dir: &str) -> Option<u64> {
    let out = Command::new(bin)
        .args(["queue", "depth", "--queue", queue, "--data-dir", data_dir])
        .env("RUST_LOG", "error")
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

async fn cli_receive(bin: &str, queue: &str, data_dir: &str, max: u64) -> Option<u64> {
    let out = Command::new(bin)
        .args(["queue", "receive", "--queue", queue, "--data-dir", data_dir])
        .args(["--max", &max.to_string()])
        .env("RUST_LOG", "error")
        .output()
        .await
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with('{'))
            .count() as u64
    })
}

async fn drain_embedded(args: &Args, queue: String, rate: f64, stop: Arc<AtomicBool>) -> DrainOut {
    let bin: String = get(args, "sendgate", None);
    let data_dir: String = get(args, "data-dir", None);
    let tick = Duration::from_millis(get(args, "tick-ms", Some(100)));
    let mut out = DrainOut {
        consumed: 0,
        starved_ticks: 0,
        errors: 0,
        depths: Vec::new(),
    };
    let mut owed = 0.0f64;
    let mut last = Instant::now();
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        next += tick;
        match cli_depth(&bin, &queue, &data_dir).await {
            Some(d) => out.depths.push(d),
            None => out.errors += 1,
        }
        let now = Instant::now();
        owed = (owed + rate * (now - last).as_secs_f64()).min(rate);
        last = now;
        let want = owed.floor() as u64;
        if rate > 0.0 && want > 0 {
            match cli_receive(&bin, &queue, &data_dir, want).await {
                Some(got) => {
                    out.consumed += got;
                    owed -= got as f64;
                    if got < want {
                        // The queue was empty: no credit for the moment (a worker that finds
                        // nothing does not do double work later).
                        owed = 0.0;
                        out.starved_ticks += u64::from(out.consumed > 0);
                    }
                }
                None => out.errors += 1,
            }
        }
        tokio::time::sleep_until(next).await;
    }
    out
}

async fn drain_amqp(args: &Args, queue: String, rate: f64, stop: Arc<AtomicBool>) -> DrainOut {
    let url: String = get(
        args,
        "amqp-url",
        Some("amqp://guest:guest@127.0.0.1:5672/%2f".into()),
    );
    let sample = Duration::from_millis(get(args, "sample-ms", Some(100)));
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| die(&format!("cannot connect to {url}: {e}")));
    let consumer = connection
        .create_channel()
        .await
        .unwrap_or_else(|e| die(&format!("channel: {e}")));
    let sampler = connection
        .create_channel()
        .await
        .unwrap_or_else(|e| die(&format!("channel: {e}")));
    let sampler_task = tokio::spawn({
        let (queue, stop) = (queue.clone(), stop.clone());
        async move {
            let mut depths = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                if let Ok(q) = sampler
                    .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                    .await
                {
                    depths.push(u64::from(q.message_count()));
                }
                tokio::time::sleep(sample).await;
            }
            depths
        }
    });
    let (mut consumed, mut starved, mut errors) = (0u64, 0u64, 0u64);
    let mut owed = 0.0f64;
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        owed = (owed + rate * (now - last).as_secs_f64()).min(rate);
        last = now;
        while owed >= 1.0 {
            match consumer
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
            {
                Ok(Some(_)) => {
                    owed -= 1.0;
                    consumed += 1;
                }
                Ok(None) => {
                    owed = 0.0;
                    starved += u64::from(consumed > 0);
                    break;
                }
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let depths = sampler_task.await.unwrap_or_default();
    let _ = connection.close(200, "done".into()).await;
    DrainOut {
        consumed,
        starved_ticks: starved,
        errors,
        depths,
    }
}

// ---------------------------------------------------------------------------------------

async fn run(args: &Args) -> Value {
    let loadavg_before = loadavg_1m();
    let addrs: Vec<String> = get::<String>(args, "addr", None)
        .split(',')
        .map(str::to_owned)
        .collect();
    let queue: String = get(args, "queue", None);
    let ceiling: u64 = get(args, "ceiling", None);
    let duration = Duration::from_secs_f64(get(args, "duration", Some(60.0)));
    let drain_kind: String = get(args, "drain", Some("none".into()));
    let drain_rate: f64 = get(args, "drain-rate", Some(50.0));
    let names: Vec<String> = get::<String>(args, "tenants", None)
        .split(',')
        .map(str::to_owned)
        .collect();
    let specs: Vec<Arc<TenantSpec>> = names
        .iter()
        .map(|n| Arc::new(tenant_spec(args, n, &addrs)))
        .collect();
    let counters: Vec<Arc<AtomicU64>> = specs.iter().map(|_| Arc::default()).collect();
    let admitted: Admitted = Arc::new(
        names
            .iter()
            .cloned()
            .zip(counters.iter().cloned())
            .collect(),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let drain = {
        let (queue, stop, args) = (queue.clone(), stop.clone(), args.clone());
        tokio::spawn(async move {
            match drain_kind.as_str() {
                "embedded" => Some(drain_embedded(&args, queue, drain_rate, stop).await),
                // Nothing consumes: the depth is still read, when the CLI can.
                "none" if args.contains_key("sendgate") => {
                    Some(drain_embedded(&args, queue, 0.0, stop).await)
                }
                "none" => None,
                "amqp" => Some(drain_amqp(&args, queue, drain_rate, stop).await),
                other => die(&format!("--drain: unknown {other:?}")),
            }
        })
    };

    let start = Instant::now();
    let shared = Arc::new(Shared {
        start,
        end: start + duration,
        queue: queue.clone(),
        admitted,
    });
    let stats: Vec<Arc<Mutex<Stats>>> = specs.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (i, t) in specs.iter().enumerate() {
        match t.kind {
            Kind::Greedy => {
                for th in 0..t.threads {
                    let addr = t.on[th % t.on.len()].clone();
                    tasks.push(tokio::spawn(greedy_thread(
                        t.clone(),
                        shared.clone(),
                        addr,
                        stats[i].clone(),
                        counters[i].clone(),
                        (i * 1000 + th) as u64,
                    )));
                }
            }
            Kind::Paced => tasks.push(tokio::spawn(paced_thread(
                t.clone(),
                shared.clone(),
                stats[i].clone(),
                counters[i].clone(),
            ))),
        }
    }
    tokio::time::sleep_until(shared.end).await;
    stop.store(true, Ordering::Relaxed);
    // A request still out when the window closes is not counted; give them a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for t in &tasks {
        t.abort();
    }
    let drained = drain.await.ok().flatten();

    let secs = duration.as_secs_f64();
    let mut tenants = serde_json::Map::new();
    let mut admitted_total = 0u64;
    for (t, s) in specs.iter().zip(&stats) {
        let s = s.lock().unwrap_or_else(|e| e.into_inner());
        admitted_total += s.admitted;
        let share_mean = (!s.shares_seen.is_empty())
            .then(|| s.shares_seen.iter().sum::<f64>() / s.shares_seen.len() as f64);
        tenants.insert(
            t.name.clone(),
            json!({
                "kind": if t.kind == Kind::Greedy { "greedy" } else { "paced" },
                "threads": if t.kind == Kind::Greedy { t.threads } else { 1 },
                "retry_ms": t.retry.as_millis() as u64,
                "rate": (t.kind == Kind::Paced).then_some(t.rate),
                "on": t.on,
                "criticality": t.criticality,
                "requests": s.requests,
                "admitted": s.admitted,
                "admitted_fraction": (s.requests > 0).then(|| s.admitted as f64 / s.requests as f64),
                "admitted_per_s": s.admitted as f64 / secs,
                "errors": s.errors,
                "statuses": s.statuses.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "refused_by_reason": s.reasons,
                "admitted_by_addr": s.admitted_by_addr,
                "admitted_per_second": s.per_second,
                "first_refusal": s.first_refusal,
                "admitted_after_first_refusal": s.admitted_after_first_refusal,
                "share_in_refusals_mean": share_mean,
            }),
        );
    }
    let (consumed, depth) = match &drained {
        Some(d) => {
            let max = d.depths.iter().copied().max();
            let mean = (!d.depths.is_empty())
                .then(|| d.depths.iter().sum::<u64>() as f64 / d.depths.len() as f64);
            (
                Some(d.consumed),
                json!({
                    "max": max,
                    "mean": mean,
                    "samples": d.depths.len(),
                    "over_ceiling": d.depths.iter().filter(|&&x| x > ceiling).count(),
                    "last": d.depths.last(),
                }),
            )
        }
        None => (None, Value::Null),
    };
    json!({
        "mode": "fairshare",
        "duration_s": secs,
        "ceiling": ceiling,
        "addrs": addrs,
        "drain": {
            "kind": args.get("drain").cloned().unwrap_or_else(|| "none".into()),
            "rate": drain_rate,
            "consumed": consumed,
            "consumed_per_s": consumed.map(|c| c as f64 / secs),
            "starved_ticks": drained.as_ref().map(|d| d.starved_ticks),
            "errors": drained.as_ref().map(|d| d.errors),
        },
        "depth": depth,
        "depth_max": drained.as_ref().and_then(|d| d.depths.iter().copied().max()),
        "tenants": tenants,
        "admitted_total": admitted_total,
        "admitted_per_consumed": consumed.filter(|&c| c > 0).map(|c| admitted_total as f64 / c as f64),
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg_1m(),
    })
}
