//! openloop: an open-loop overload generator for `./bench/overload.sh` and comparison 14
//! (issue 39). Arrivals follow a fixed schedule drawn from a seed, whatever the gateway
//! answers; every attempt's latency is measured from the moment it was *meant* to be sent
//! (no coordinated omission); a consumer drains the queue at a set rate D.
//!
//! ```text
//! openloop --addr 127.0.0.1:P[,127.0.0.1:P2,...] --queue Q --ceiling 200
//!          --drain-rate 100 --phases 0.5:10,5:10,10:10,0.5:10   # factor of D : seconds
//!          [--arrivals poisson|fixed] [--seed 1]
//!          --tenants a:TOKEN[:weight[:share]],b:TOKEN...        # share of the arrivals
//!          [--mix sheddable:60,default:30,critical:10]          # Sendgate-Criticality
//!          [--policy none|naive|honour|client] [--give-up-s 120] [--tail-s 5]
//!          [--drain embedded|amqp|none] [--drain-phases R:S,R:S]  # D over time
//!          [--sendgate BIN --data-dir D] [--tick-ms 100]        # --drain embedded
//!          [--amqp-url amqp://...] [--sample-ms 100]            # --drain amqp
//!          [--max-conns 1024] [--timeline FILE]                    # every event, CSV
//!          [--keys on|off]                                      # Idempotency-Key per message
//! ```
//!
//! Producers' retry policies: `none` (a refusal is dropped), `naive` (three immediate
//! retries), `honour` (wait `Retry-After` plus up to half of it again at random, until the
//! give-up deadline counted from the first intended send; a wait that would pass it gives
//! up at once), `client` (each message handed to the project's `sendgate_client::Client`,
//! one client per tenant and criticality, its deadline the give-up; its attempts are its
//! `stats().requests`, so the per-second refusals of this policy are not seen).
//!
//! `--keys on` (the default): every message sent over HTTP here (`none`, `naive`, `honour`)
//! carries an `Idempotency-Key` of its own, `ol-<run>-<id>`, the same on each of its
//! attempts, as a producer that retries safely would: a `queue_full` refusal then promises
//! the message its place and the retry claims it (docs/contract.md section 2, "Claiming a
//! place"). `--keys off` sends none, for comparing the two on one binary. The `client`
//! policy's keys are the client's own, whatever this says.
//!
//! The consumer takes D messages a second and no more, with no credit for the moments the
//! queue was short: `embedded` runs `sendgate queue receive --max K` every `tick-ms` (the
//! worker beside the embedded backend), reading `sendgate queue depth` just before (the
//! backlog's peak); `amqp` takes messages with `basic.get` (no ack) at D, and a second
//! channel reads the exact depth (passive `queue.declare`) every `sample-ms`. A poll is
//! *short* when it found fewer messages than it asked for.
//!
//! Output: one JSON line per second (`offered`, `admitted`, `refused` by reason,
//! `retry_after` p50/max, latency percentiles of admitted and refused attempts, backlog,
//! the consumer's polls), then a summary line (`"summary": true`, the series repeated in
//! it) with attempts per message, goodput, settle time after each step up, the time
//! refusals stop after each step down, each criticality's admissions, Jain's index per
//! tier, the consumer's short polls while refusing, and Breakwater-style rows per phase.

#![recursion_limit = "256"]

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use sendgate_client::{Client, ClientConfig, Criticality, SendOutcome};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::sync::Semaphore;
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
    eprintln!("openloop: {msg}");
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

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = parse_args(&argv);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(get(&args, "threads", Some(2)))
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (series, summary) = runtime.block_on(run(&args));
    for line in &series {
        println!("{line}");
    }
    println!("{summary}");
    // Tasks still waiting out a Retry-After are not waited for.
    runtime.shutdown_background();
}

// ---------------------------------------------------------------------------------------
// The schedule.

/// splitmix64: a seeded, dependency-free source for the arrival schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

#[derive(Clone)]
struct Tenant {
    name: String,
    token: String,
    weight: f64,
    share: f64,
}

#[derive(Clone, Copy)]
struct Phase {
    factor: f64,
    start: f64,
    secs: f64,
}

#[derive(Clone, Copy)]
struct Arrival {
    id: u64,
    at: f64,
    tenant: usize,
    crit: usize,
}

fn pairs(spec: &str) -> Vec<(String, f64)> {
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|p| {
            let (a, b) = p
                .split_once(':')
                .unwrap_or_else(|| die(&format!("{p:?}: expected A:B")));
            let b = b
                .parse()
                .unwrap_or_else(|_| die(&format!("{p:?}: not a number")));
            (a.to_owned(), b)
        })
        .collect()
}

fn phases(spec: &str) -> Vec<Phase> {
    let mut start = 0.0;
    pairs(spec)
        .into_iter()
        .map(|(f, secs)| {
            let factor = f
                .trim_end_matches('x')
                .parse()
                .unwrap_or_else(|_| die(&format!("phase {f:?}: not a factor")));
            let p = Phase {
                factor,
                start,
                secs,
            };
            start += secs;
            p
        })
        .collect()
}

fn tenants(spec: &str) -> Vec<Tenant> {
    let list: Vec<Tenant> = spec
        .split(',')
        .map(|t| {
            let mut parts = t.split(':');
            let name = parts.next().unwrap_or_default().to_owned();
            let token = parts.next().unwrap_or_default().to_owned();
            let weight = parts.next().map_or(1.0, |w| w.parse().unwrap_or(1.0));
            let share = parts.next().map_or(1.0, |s| s.parse().unwrap_or(1.0));
            Tenant {
                name,
                token,
                weight,
                share,
            }
        })
        .collect();
    if list.is_empty() || list.iter().any(|t| t.name.is_empty()) {
        die("--tenants: name:token[:weight[:share]],...");
    }
    list
}

/// Index into `cumulative` (normalised weights) for a uniform draw.
fn pick(cumulative: &[f64], u: f64) -> usize {
    cumulative
        .iter()
        .position(|c| u <= *c)
        .unwrap_or(cumulative.len() - 1)
}

fn cumulative(weights: &[f64]) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect()
}

fn schedule(
    phases: &[Phase],
    d: f64,
    poisson: bool,
    seed: u64,
    tenants: &[Tenant],
    mix: &[(String, f64)],
) -> Vec<Arrival> {
    let mut rng = Rng(seed);
    let tc = cumulative(&tenants.iter().map(|t| t.share).collect::<Vec<_>>());
    let cc = cumulative(&mix.iter().map(|m| m.1).collect::<Vec<_>>());
    let mut out = Vec::new();
    for p in phases {
        let rate = p.factor * d;
        if rate <= 0.0 {
            continue;
        }
        let mut t = p.start;
        loop {
            t += if poisson {
                -rng.unit().ln() / rate
            } else {
                1.0 / rate
            };
            if t >= p.start + p.secs {
                break;
            }
            out.push(Arrival {
                id: out.len() as u64,
                at: t,
                tenant: pick(&tc, rng.unit()),
                crit: pick(&cc, rng.unit()),
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client (as loadgen's): one request at a time on a keep-alive
// connection, connections pooled per address.

struct HttpConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

struct Answer {
    status: u16,
    keep: bool,
    retry_after: Option<u64>,
    body: Vec<u8>,
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
            buf: Vec::with_capacity(4096),
        })
    }

    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn round_trip(&mut self, request: &[u8]) -> io::Result<Answer> {
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
        let (mut length, mut keep, mut retry_after) = (0usize, true, None);
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().map_err(|_| io::Error::other("length"))?;
            } else if name.eq_ignore_ascii_case("connection") {
                keep = !value.eq_ignore_ascii_case("close");
            } else if name.eq_ignore_ascii_case("retry-after") {
                retry_after = value.parse().ok();
            }
        }
        let total = head_end + 4 + length;
        while self.buf.len() < total {
            self.fill().await?;
        }
        let body = self.buf[head_end + 4..total].to_vec();
        self.buf.drain(..total);
        Ok(Answer {
            status,
            keep,
            retry_after,
            body,
        })
    }
}

/// Every poll, depth read and answered attempt in time order, one CSV row each (`--timeline
/// FILE`): for reading what a per-second summary hides, such as which poll came up short
/// and how long after the last refusal.
fn write_timeline(path: &str, log: &Log) {
    let mut rows: Vec<(f64, String)> = Vec::new();
    rows.extend(
        log.polls
            .iter()
            .map(|p| (p.at, format!("poll,{},{}", p.want, p.got))),
    );
    rows.extend(log.depths.iter().map(|d| (d.0, format!("depth,{},", d.1))));
    rows.extend(
        log.attempts
            .iter()
            .map(|a| (a.done, format!("answer,{},{}", a.status, a.reason))),
    );
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = String::from("t,kind,a,b\n");
    for (t, row) in rows {
        out.push_str(&format!("{t:.4},{row}\n"));
    }
    if let Err(e) = std::fs::write(path, out) {
        eprintln!("openloop: --timeline {path}: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// What happened: every attempt, every message, every poll, every depth read.

#[derive(Clone)]
struct Attempt {
    /// The message's arrival id.
    msg: u64,
    intended: f64,
    done: f64,
    /// 0: the connection failed.
    status: u16,
    reason: String,
    retry_after: Option<u64>,
    first: bool,
    crit: usize,
}

#[derive(Clone)]
struct MessageEnd {
    at: f64,
    tenant: usize,
    crit: usize,
    attempts: u32,
    admitted_at: Option<f64>,
}

struct Poll {
    at: f64,
    want: u64,
    got: u64,
}

#[derive(Default)]
struct Log {
    attempts: Vec<Attempt>,
    messages: Vec<MessageEnd>,
    polls: Vec<Poll>,
    depths: Vec<(f64, u64)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Policy {
    None,
    Naive,
    Honour,
    Client,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Naive => "naive",
            Self::Honour => "honour",
            Self::Client => "client",
        }
    }
}

struct Ctx {
    t0: Instant,
    addrs: Vec<String>,
    pools: Vec<Mutex<Vec<HttpConn>>>,
    conns: Semaphore,
    queue: String,
    tenants: Vec<Tenant>,
    mix: Vec<String>,
    policy: Policy,
    give_up: f64,
    /// `--keys`: the `Idempotency-Key` prefix for this run's messages (`ol-<run>-`), or
    /// `None` to send without keys.
    keys: Option<String>,
    log: Mutex<Log>,
    /// One client per (tenant, criticality) for `--policy client`.
    clients: Vec<Client>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ctx {
    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn request(&self, a: &Arrival, addr: &str) -> Vec<u8> {
        let t = &self.tenants[a.tenant];
        let body = format!("{{\"tenant\":\"{}\",\"n\":{}}}", t.name, a.id);
        let crit = &self.mix[a.crit];
        let crit = if crit == "key" {
            String::new()
        } else {
            format!("Sendgate-Criticality: {crit}\r\n")
        };
        // The same key on every attempt of a message (the body is the same too: on the
        // embedded backend another body under the key would be refused as reused).
        let key = self.keys.as_ref().map_or(String::new(), |prefix| {
            format!("Idempotency-Key: {prefix}{}\r\n", a.id)
        });
        format!(
            "POST /v1/queues/{}/messages HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Authorization: Bearer {}\r\n{crit}{key}Content-Length: {}\r\n\r\n{body}",
            self.queue,
            t.token,
            body.len()
        )
        .into_bytes()
    }

    /// One attempt on a pooled connection; `None` when the connection failed.
    async fn send(&self, a: &Arrival, attempt: u32) -> Option<Answer> {
        let i = (a.id as usize + attempt as usize) % self.addrs.len();
        let addr = &self.addrs[i];
        let _slot = self.conns.acquire().await.ok()?;
        let pooled = lock(&self.pools[i]).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => HttpConn::connect(addr).await.ok()?,
        };
        let request = self.request(a, addr);
        let answer = tokio::time::timeout(Duration::from_secs(10), conn.round_trip(&request))
            .await
            .ok()?
            .ok()?;
        if answer.keep {
            lock(&self.pools[i]).push(conn);
        }
        Some(answer)
    }
}

fn reason_of(status: u16, body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = v.get("code").and_then(Value::as_str).unwrap_or("");
    match (status, v.get("reason").and_then(Value::as_str)) {
        (429, Some(r)) => r.to_owned(),
        (429, None) if code == "queue_full" => "ceiling".into(),
        (_, _) if !code.is_empty() => code.to_owned(),
        _ => format!("status_{status}"),
    }
}

/// The wait before the next attempt, or None to give up.
fn next_wait(
    ctx: &Ctx,
    a: &Arrival,
    attempts: u32,
    answer: Option<&Answer>,
    rng: &mut Rng,
) -> Option<f64> {
    let status = answer.map_or(0, |x| x.status);
    let retryable = matches!(status, 0 | 429 | 502 | 503 | 504);
    if !retryable {
        return None;
    }
    match ctx.policy {
        Policy::None | Policy::Client => None,
        Policy::Naive => (attempts < 4).then_some(0.0),
        Policy::Honour => {
            let ra = answer.and_then(|x| x.retry_after).unwrap_or(1) as f64;
            let wait = ra * (1.0 + 0.5 * rng.unit());
            (ctx.now() + wait <= a.at + ctx.give_up).then_some(wait)
        }
    }
}

async fn message(ctx: Arc<Ctx>, a: Arrival) {
    if ctx.policy == Policy::Client {
        return client_message(ctx, a).await;
    }
    let mut rng = Rng(a.id.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xA5A5);
    let (mut intended, mut attempts) = (a.at, 0u32);
    let admitted_at = loop {
        tokio::time::sleep_until(ctx.t0 + Duration::from_secs_f64(intended)).await;
        let answer = ctx.send(&a, attempts).await;
        let done = ctx.now();
        attempts += 1;
        let (status, reason) = match &answer {
            Some(x) => (x.status, reason_of(x.status, &x.body)),
            None => (0, "connection".into()),
        };
        lock(&ctx.log).attempts.push(Attempt {
            msg: a.id,
            intended,
            done,
            status,
            reason,
            retry_after: answer.as_ref().and_then(|x| x.retry_after),
            first: attempts == 1,
            crit: a.crit,
        });
        if status == 201 {
            break Some(done);
        }
        match next_wait(&ctx, &a, attempts, answer.as_ref(), &mut rng) {
            Some(wait) => intended = done + wait,
            None => break None,
        }
    };
    lock(&ctx.log).messages.push(MessageEnd {
        at: a.at,
        tenant: a.tenant,
        crit: a.crit,
        attempts,
        admitted_at,
    });
}

async fn client_message(ctx: Arc<Ctx>, a: Arrival) {
    tokio::time::sleep_until(ctx.t0 + Duration::from_secs_f64(a.at)).await;
    let client = &ctx.clients[a.tenant * ctx.mix.len() + a.crit];
    let body = format!("{{\"n\":{}}}", a.id);
    let outcome = client.send(&ctx.queue, body, None).await;
    let admitted_at = matches!(outcome, SendOutcome::Queued { .. }).then(|| ctx.now());
    if let Some(done) = admitted_at {
        lock(&ctx.log).attempts.push(Attempt {
            msg: a.id,
            intended: a.at,
            done,
            status: 201,
            reason: String::new(),
            retry_after: None,
            first: true,
            crit: a.crit,
        });
    }
    lock(&ctx.log).messages.push(MessageEnd {
        at: a.at,
        tenant: a.tenant,
        crit: a.crit,
        attempts: 0,
        admitted_at,
    });
}

fn clients(args: &Args, tenants: &[Tenant], mix: &[String], give_up: f64) -> Vec<Client> {
    let addr = get::<String>(args, "addr", None);
    let first = addr.split(',').next().unwrap_or_default().to_owned();
    let mut out = Vec::new();
    for t in tenants {
        for c in mix {
            let mut config = ClientConfig::new(format!("http://{first}"))
                .token(t.token.clone())
                .deadline(Duration::from_secs_f64(give_up));
            if let Some(level) = Criticality::parse(c) {
                config = config.criticality(level);
            }
            out.push(Client::new(config).unwrap_or_else(|e| die(&format!("client: {e}"))));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The consumer and the depth.

struct DrainPlan {
    /// (from second, rate): D over time.
    steps: Vec<(f64, f64)>,
}

impl DrainPlan {
    fn rate_at(&self, t: f64) -> f64 {
        self.steps
            .iter()
            .rev()
            .find(|(from, _)| t >= *from)
            .map_or(0.0, |s| s.1)
    }
}

fn drain_plan(args: &Args, d: f64) -> DrainPlan {
    match args.get("drain-phases") {
        None => DrainPlan {
            steps: vec![(f64::MIN, d)],
        },
        Some(spec) => {
            let mut from = 0.0;
            let mut steps = vec![(f64::MIN, d)];
            for (rate, secs) in pairs(spec) {
                let rate: f64 = rate.parse().unwrap_or_else(|_| die("--drain-phases R:S"));
                steps.push((from, rate));
                from += secs;
            }
            steps.push((from, d));
            DrainPlan { steps }
        }
    }
}

async fn cli(bin: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn drain_embedded(ctx: Arc<Ctx>, args: Args, plan: DrainPlan, stop: Arc<AtomicBool>) {
    let bin: String = get(&args, "sendgate", None);
    let dir: String = get(&args, "data-dir", None);
    let tick = Duration::from_millis(get(&args, "tick-ms", Some(100)));
    let (q, dir) = (ctx.queue.as_str(), dir.as_str());
    let (mut owed, mut last, mut next) = (0.0f64, ctx.now(), Instant::now());
    while !stop.load(Ordering::Relaxed) {
        next += tick;
        let depth = cli(&bin, &["queue", "depth", "--queue", q, "--data-dir", dir]).await;
        if let Some(d) = depth.and_then(|s| s.trim().parse().ok()) {
            let at = ctx.now();
            lock(&ctx.log).depths.push((at, d));
        }
        let now = ctx.now();
        let rate = plan.rate_at(now);
        owed = (owed + rate * (now - last)).min(rate.max(1.0));
        last = now;
        let want = owed.floor() as u64;
        if want > 0 {
            let max = want.to_string();
            let args = [
                "queue",
                "receive",
                "--queue",
                q,
                "--data-dir",
                dir,
                "--max",
                max.as_str(),
            ];
            if let Some(out) = cli(&bin, &args).await {
                let got = out.lines().filter(|l| l.starts_with('{')).count() as u64;
                owed -= got as f64;
                if got < want {
                    owed = 0.0; // a worker that found nothing does not work double later
                }
                let at = ctx.now();
                lock(&ctx.log).polls.push(Poll { at, want, got });
            }
        }
        tokio::time::sleep_until(next).await;
    }
}

/// An AMQP URL as it may be printed: its user and password left out.
fn without_password(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://{host}"),
        _ => url.to_string(),
    }
}

/// The queue's depth every `sample`, by passive declares on a channel of its own, until
/// `stop`.
async fn sample_amqp_depths(
    ctx: Arc<Ctx>,
    sampler: lapin::Channel,
    sample: Duration,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let q = ctx.queue.as_str().into();
        let read = sampler.queue_declare(q, passive, FieldTable::default());
        if let Ok(Ok(q)) = tokio::time::timeout(AMQP_CALL, read).await {
            let at = ctx.now();
            lock(&ctx.log)
                .depths
                .push((at, u64::from(q.message_count())));
        }
        tokio::time::sleep(sample).await;
    }
}

async fn drain_amqp(ctx: Arc<Ctx>, args: Args, plan: DrainPlan, stop: Arc<AtomicBool>) {
    let url: String = get(
        &args,
        "amqp-url",
        Some("amqp://guest:guest@127.0.0.1:5672/%2f".into()),
    );
    let sample = Duration::from_millis(get(&args, "sample-ms", Some(100)));
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            die(&format!(
                "cannot connect to {}: {e}",
                without_password(&url)
            ))
        });
    let consumer = connection
        .create_channel()
        .await
        .unwrap_or_else(|e| die(&format!("{e}")));
    let sampler = connection
        .create_channel()
        .await
        .unwrap_or_else(|e| die(&format!("{e}")));
    let sampling = tokio::spawn(sample_amqp_depths(
        ctx.clone(),
        sampler,
        sample,
        stop.clone(),
    ));
    let (mut owed, mut last) = (0.0f64, ctx.now());
    while !stop.load(Ordering::Relaxed) {
        let now = ctx.now();
        let rate = plan.rate_at(now);
        owed = (owed + rate * (now - last)).min(rate.max(1.0));
        last = now;
        while owed >= 1.0 {
            let get =
                consumer.basic_get(ctx.queue.as_str().into(), BasicGetOptions { no_ack: true });
            let found = matches!(tokio::time::timeout(AMQP_CALL, get).await, Ok(Ok(Some(_))));
            let at = ctx.now();
            lock(&ctx.log).polls.push(Poll {
                at,
                want: 1,
                got: u64::from(found),
            });
            if found {
                owed -= 1.0;
            } else {
                owed = 0.0;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = sampling.await;
    let _ = tokio::time::timeout(AMQP_CALL, connection.close(200, "done".into())).await;
}

/// The longest an AMQP call of the drain may take: lapin leaves a call on a connection the
/// broker closed (a missed heartbeat on a loaded machine) waiting for ever, and the run
/// with it.
const AMQP_CALL: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// The report.

fn percentile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

fn ms(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |x| json!((x * 1e5).round() / 100.0))
}

fn lat_json(v: &mut [f64]) -> Value {
    json!({"p50_ms": ms(percentile(v, 0.5)), "p99_ms": ms(percentile(v, 0.99)),
           "p999_ms": ms(percentile(v, 0.999)), "n": v.len()})
}

fn is_refusal(a: &Attempt) -> bool {
    a.status == 429
}

/// One window's numbers, attempts by the second they were answered in.
fn window(log: &Log, from: f64, to: f64, arrivals: &[Arrival]) -> Value {
    let inside = |t: f64| t >= from && t < to;
    let offered = arrivals.iter().filter(|a| inside(a.at)).count();
    let answered: Vec<&Attempt> = log.attempts.iter().filter(|a| inside(a.done)).collect();
    let mut admitted: Vec<f64> = answered
        .iter()
        .filter(|a| a.status == 201)
        .map(|a| a.done - a.intended)
        .collect();
    let mut refused: Vec<f64> = answered
        .iter()
        .filter(|a| is_refusal(a))
        .map(|a| a.done - a.intended)
        .collect();
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut ras: Vec<f64> = Vec::new();
    for a in answered.iter().filter(|a| a.status != 201) {
        *reasons.entry(a.reason.clone()).or_default() += 1;
        ras.extend(a.retry_after.map(|r| r as f64));
    }
    let depths: Vec<u64> = log
        .depths
        .iter()
        .filter(|d| inside(d.0))
        .map(|d| d.1)
        .collect();
    let polls: Vec<&Poll> = log.polls.iter().filter(|p| inside(p.at)).collect();
    let secs = (to - from).max(1e-9);
    json!({
        "offered": offered, "attempts": answered.len(), "admitted": admitted.len(),
        "refused": refused.len(), "by_reason": reasons,
        "offered_per_s": offered as f64 / secs, "admitted_per_s": admitted.len() as f64 / secs,
        "refused_per_s": refused.len() as f64 / secs,
        "retry_after_p50_s": percentile(&mut ras.clone(), 0.5), "retry_after_max_s": ras.iter().cloned().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x)))),
        "admitted_latency": lat_json(&mut admitted), "refused_latency": lat_json(&mut refused),
        "backlog_max": depths.iter().max(), "backlog_mean": (!depths.is_empty()).then(|| depths.iter().sum::<u64>() as f64 / depths.len() as f64),
        "polls": polls.len(), "short_polls": polls.iter().filter(|p| p.got < p.want).count(),
        "consumed": polls.iter().map(|p| p.got).sum::<u64>(),
    })
}

fn series(
    log: &Log,
    arrivals: &[Arrival],
    phases: &[Phase],
    plan: &DrainPlan,
    end: f64,
) -> Vec<Value> {
    (0..end.ceil() as usize)
        .map(|s| {
            let (from, to) = (s as f64, s as f64 + 1.0);
            let mut w = window(log, from, to, arrivals);
            let factor = phases
                .iter()
                .find(|p| from >= p.start && from < p.start + p.secs)
                .map(|p| p.factor);
            w["t"] = json!(s);
            w["factor"] = json!(factor);
            w["drain_rate"] = json!(plan.rate_at(from + 0.5));
            w
        })
        .collect()
}

/// Seconds after each step up to overload until the admitted rate is within ±10 % of D
/// for 3 consecutive 1 s windows (the first of them; 0 = the step's first second).
fn settle_times(series: &[Value], phases: &[Phase]) -> Vec<Value> {
    let mut out = Vec::new();
    for w in phases.windows(2) {
        let (before, p) = (w[0], w[1]);
        if p.factor <= 1.0 || p.factor <= before.factor {
            continue;
        }
        let start = p.start as usize;
        let end = (p.start + p.secs) as usize;
        let ok = |s: usize| {
            series.get(s).is_some_and(|x| {
                let (a, d) = (
                    x["admitted"].as_f64().unwrap_or(0.0),
                    x["drain_rate"].as_f64().unwrap_or(0.0),
                );
                (a - d).abs() <= 0.1 * d
            })
        };
        let settled = (start..end.saturating_sub(2)).find(|&s| ok(s) && ok(s + 1) && ok(s + 2));
        out.push(
            json!({"from": before.factor, "to": p.factor, "at_s": p.start,
                        "settle_s": settled.map(|s| s - start)}),
        );
    }
    out
}

/// After each step down below D from overload: when the last refusal was answered, from
/// the step (all attempts, and first attempts only: a producer still retrying what it was
/// refused stops only when its own give-up says).
fn refusal_stops(log: &Log, phases: &[Phase]) -> Vec<Value> {
    let mut out = Vec::new();
    for w in phases.windows(2) {
        let (before, p) = (w[0], w[1]);
        if p.factor >= 1.0 || before.factor <= 1.0 {
            continue;
        }
        let (from, to) = (p.start, p.start + p.secs);
        let last = |first_only: bool| {
            log.attempts
                .iter()
                .filter(|a| {
                    is_refusal(a) && a.done >= from && a.done < to && (a.first || !first_only)
                })
                .map(|a| a.done - from)
                .fold(0.0f64, f64::max)
        };
        out.push(
            json!({"from": before.factor, "to": p.factor, "at_s": from, "phase_s": p.secs,
                        "last_refusal_s": last(false), "last_fresh_refusal_s": last(true)}),
        );
    }
    out
}

fn jain(x: &[f64]) -> Option<f64> {
    let (s, s2): (f64, f64) = (x.iter().sum(), x.iter().map(|v| v * v).sum());
    (x.len() > 1 && s2 > 0.0).then(|| s * s / (x.len() as f64 * s2))
}

/// Each criticality's sends and admissions in the overload phases (factor > 1), and
/// Jain's index over its tenants' admissions per unit of weight.
fn tiers(log: &Log, ctx: &Ctx, phases: &[Phase]) -> Value {
    let over = |t: f64| {
        phases
            .iter()
            .any(|p| p.factor > 1.0 && t >= p.start && t < p.start + p.secs)
    };
    let mut out = serde_json::Map::new();
    for (c, name) in ctx.mix.iter().enumerate() {
        let sends: Vec<&Attempt> = log
            .attempts
            .iter()
            .filter(|a| a.crit == c && over(a.intended))
            .collect();
        let msgs: Vec<&MessageEnd> = log
            .messages
            .iter()
            .filter(|m| m.crit == c && over(m.at))
            .collect();
        let admitted_sends = sends.iter().filter(|a| a.status == 201).count();
        let first: Vec<&&Attempt> = sends.iter().filter(|a| a.first).collect();
        let first_ok = first.iter().filter(|a| a.status == 201).count();
        let per_tenant: Vec<f64> = ctx
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| {
                msgs.iter()
                    .filter(|m| m.tenant == i && m.admitted_at.is_some())
                    .count() as f64
                    / t.weight
            })
            .collect();
        let admitted_msgs = msgs.iter().filter(|m| m.admitted_at.is_some()).count();
        out.insert(
            name.clone(),
            json!({
                "sends": sends.len(), "admitted_sends": admitted_sends,
                "admitted_sends_pct": pct(admitted_sends, sends.len()),
                "first_attempts_admitted_pct": pct(first_ok, first.len()),
                "messages": msgs.len(), "messages_admitted_pct": pct(admitted_msgs, msgs.len()),
                "admitted_per_weight_by_tenant": per_tenant, "jain": jain(&per_tenant),
            }),
        );
    }
    Value::Object(out)
}

fn pct(a: usize, b: usize) -> Option<f64> {
    (b > 0).then(|| 100.0 * a as f64 / b as f64)
}

/// How near a refusal a poll must be to count as taken while refusing: the embedded
/// consumer's tick, ten of the AMQP consumer's takes at D = 100/s.
const NEAR_REFUSAL_S: f64 = 0.1;

/// The consumer's short polls while some send was refused for the queue (a `429`, any reason
/// but a tenant's quota): those with such a refusal answered within [`NEAR_REFUSAL_S`]
/// either side. `by_second` counts instead every poll in a second with a refusal in it,
/// which also takes in a second's polls from before its first refusal (a fleet's start:
/// polls while the sends wait out its grace, then the burst refused at its end).
fn short_while_refusing(log: &Log) -> Value {
    let mut refusals: Vec<f64> = log
        .attempts
        .iter()
        .filter(|a| is_refusal(a) && a.reason != "tenant_quota")
        .map(|a| a.done)
        .collect();
    refusals.sort_by(f64::total_cmp);
    let near = |t: f64| {
        let i = refusals.partition_point(|r| *r < t - NEAR_REFUSAL_S);
        refusals.get(i).is_some_and(|r| *r <= t + NEAR_REFUSAL_S)
    };
    let seconds: std::collections::HashSet<i64> =
        refusals.iter().map(|t| t.floor() as i64).collect();
    let count = |polls: Vec<&Poll>| {
        let short = polls.iter().filter(|p| p.got < p.want).count();
        json!({"polls": polls.len(), "short": short, "short_pct": pct(short, polls.len()),
               "empty": polls.iter().filter(|p| p.got == 0).count()})
    };
    let mut out = count(log.polls.iter().filter(|p| near(p.at)).collect());
    out["by_second"] = count(
        log.polls
            .iter()
            .filter(|p| seconds.contains(&(p.at.floor() as i64)))
            .collect(),
    );
    out
}

/// Each refusal's `Retry-After` against the wait its producer needed: the time until the
/// consumer had taken as many messages as were in line at the refusal, up to and including
/// this one (a message is in line from its first refusal until it is admitted or its
/// producer gives up; the line is served in the order of first refusals). That is the wait
/// the places that actually opened allowed, whatever the gateway told anyone; refusals whose
/// wait the run's takes never covered are counted apart. Meaningful for the `honour` policy.
/// A lower bound where fresh sends take opened places (they are not in the line), and a
/// message that gives up is counted in line until it does.
fn retry_after_vs_needed(log: &Log) -> Value {
    let mut first: HashMap<u64, f64> = HashMap::new();
    let mut last: HashMap<u64, f64> = HashMap::new();
    for a in &log.attempts {
        if is_refusal(a) && a.reason != "tenant_quota" {
            first.entry(a.msg).or_insert(a.done);
        }
        let end = last.entry(a.msg).or_insert(a.done);
        *end = end.max(a.done);
    }
    // A message leaves the line at its last answer: its admission, or the refusal it gave up on.
    let line: Vec<(f64, f64)> = first.iter().map(|(m, t)| (*t, last[m])).collect();
    let mut takes: Vec<(f64, u64)> = log
        .polls
        .iter()
        .filter(|p| p.got > 0)
        .map(|p| (p.at, p.got))
        .collect();
    takes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut advertised = Vec::new();
    let mut needed = Vec::new();
    let mut ratios = Vec::new();
    let mut uncovered = 0usize;
    for a in log
        .attempts
        .iter()
        .filter(|a| is_refusal(a) && a.reason != "tenant_quota")
    {
        let Some(ra) = a.retry_after else { continue };
        let mine = first[&a.msg];
        let place = line
            .iter()
            .filter(|(f, end)| *f <= mine && *end >= a.done)
            .count() as u64;
        let mut taken = 0u64;
        let wait = takes.iter().filter(|t| t.0 > a.done).find_map(|t| {
            taken += t.1;
            (taken >= place).then_some(t.0 - a.done)
        });
        match wait {
            Some(w) => {
                advertised.push(ra as f64);
                needed.push(w);
                ratios.push(ra as f64 / w.max(1e-3));
            }
            None => uncovered += 1,
        }
    }
    let within = ratios.iter().filter(|r| (0.8..=1.2).contains(*r)).count();
    json!({"refusals": ratios.len(), "uncovered": uncovered,
           "advertised_p50_s": percentile(&mut advertised, 0.5), "needed_p50_s": percentile(&mut needed.clone(), 0.5),
           "needed_p90_s": percentile(&mut needed, 0.9),
           "ratio_p50": percentile(&mut ratios, 0.5), "within_20pct": pct(within, ratios.len())})
}

/// Each phase's window, with its factor of D and its length.
fn per_phase(log: &Log, phases: &[Phase], arrivals: &[Arrival]) -> Vec<Value> {
    phases
        .iter()
        .map(|p| {
            let mut w = window(log, p.start, p.start + p.secs, arrivals);
            w["factor"] = json!(p.factor);
            w["secs"] = json!(p.secs);
            w
        })
        .collect()
}

fn summary(
    ctx: &Ctx,
    log: &Log,
    arrivals: &[Arrival],
    phases: &[Phase],
    series: &[Value],
    ceiling: u64,
    end: f64,
) -> Value {
    let attempts: u64 = if ctx.policy == Policy::Client {
        ctx.clients.iter().map(|c| c.stats().requests).sum()
    } else {
        log.attempts.len() as u64
    };
    let admitted = log
        .messages
        .iter()
        .filter(|m| m.admitted_at.is_some())
        .count();
    let in_flight = arrivals.len() - log.messages.len();
    let sched_end = phases.last().map_or(0.0, |p| p.start + p.secs);
    let per_phase = per_phase(log, phases, arrivals);
    let mut refused_lat: Vec<f64> = log
        .attempts
        .iter()
        .filter(|a| is_refusal(a))
        .map(|a| a.done - a.intended)
        .collect();
    let max_backlog = log.depths.iter().map(|d| d.1).max();
    let over = log.depths.iter().filter(|d| d.1 > ceiling).count();
    let ras: Vec<f64> = log
        .attempts
        .iter()
        .filter_map(|a| a.retry_after.map(|r| r as f64))
        .collect();
    json!({
        "summary": true,
        "policy": ctx.policy.name(), "give_up_s": ctx.give_up, "ceiling": ceiling,
        "keys": ctx.keys.is_some() && ctx.policy != Policy::Client,
        "duration_s": end, "messages": arrivals.len(), "messages_ended": log.messages.len(),
        "messages_in_flight_at_end": in_flight, "attempts": attempts,
        "attempts_per_message": attempts as f64 / arrivals.len().max(1) as f64,
        "admitted_messages": admitted, "goodput_per_s": admitted as f64 / sched_end.max(1e-9),
        "gave_up": log.messages.iter().filter(|m| m.admitted_at.is_none()).count(),
        "max_attempts_per_message": log.messages.iter().map(|m| m.attempts).max(),
        "settle": settle_times(series, phases), "refusals_stop": refusal_stops(log, phases),
        "tiers": tiers(log, ctx, phases), "short_polls_while_refusing": short_while_refusing(log),
        "retry_after_vs_needed": retry_after_vs_needed(log),
        "refused_latency": lat_json(&mut refused_lat),
        "retry_after_p50_s": percentile(&mut ras.clone(), 0.5), "retry_after_p99_s": percentile(&mut ras.clone(), 0.99),
        "backlog_max": max_backlog, "depth_samples": log.depths.len(), "depth_samples_over_ceiling": over,
        "phases": per_phase, "series": series,
        "client": (ctx.policy == Policy::Client).then(|| client_retries(ctx, log)),
    })
}

/// What the project's client's retries bought, approximately (the client does not say
/// how many attempts a message took): a message admitted within half a second of its
/// arrival is taken as in at its first attempt (a retry after a `429` waits a second or
/// more; one after a transient failure only the backoff, so it would count as a first
/// attempt), the others admitted as in on a retry, and the rest of the retries as refused
/// again (a retry cut off at the end of the run too).
fn client_retries(ctx: &Ctx, log: &Log) -> Value {
    let stats = ctx.clients.iter().map(|c| c.stats()).fold((0, 0), |(r, b), s| {
        (r + s.retries, b + s.budget_refusals)
    });
    let admitted = log.messages.iter().filter_map(|m| m.admitted_at.map(|t| t - m.at));
    let (first, later) = admitted.fold((0u64, 0u64), |(f, l), waited| {
        if waited < 0.5 { (f + 1, l) } else { (f, l + 1) }
    });
    json!({
        "retries": stats.0, "budget_refusals": stats.1,
        "admitted_at_first_attempt": first, "admitted_on_a_retry": later,
        "retries_refused_again": stats.0.saturating_sub(later),
    })
}

// ---------------------------------------------------------------------------------------

/// The producers' retry policy (`--policy`).
fn policy(args: &Args) -> Policy {
    match get::<String>(args, "policy", Some("none".into())).as_str() {
        "none" => Policy::None,
        "naive" => Policy::Naive,
        "honour" | "honor" => Policy::Honour,
        "client" => Policy::Client,
        other => die(&format!("--policy: unknown {other:?}")),
    }
}

/// The consumer (`--drain`), until `stop`.
async fn drain(ctx: Arc<Ctx>, args: Args, plan: DrainPlan, stop: Arc<AtomicBool>) {
    let kind: String = get(&args, "drain", Some("none".into()));
    match kind.as_str() {
        "embedded" => drain_embedded(ctx, args, plan, stop).await,
        "amqp" => drain_amqp(ctx, args, plan, stop).await,
        "none" => {}
        other => die(&format!("--drain: unknown {other:?}")),
    }
}

/// `--keys`: `on` (the default) or `off`.
fn keys_on(args: &Args) -> bool {
    match get::<String>(args, "keys", Some("on".into())).as_str() {
        "on" | "1" | "true" => true,
        "off" | "0" | "false" => false,
        other => die(&format!("--keys: on or off, not {other:?}")),
    }
}

/// This run's `Idempotency-Key` prefix: a message's key must not be one an earlier run
/// used (its dedup window, on a gateway or broker that outlives a run, would take the
/// message for a retry of another), and the schedule's ids repeat from run to run.
fn run_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("ol-{:x}{:x}-", nanos, std::process::id())
}

/// What every message's task shares: the gateways, the connection cap, the producers'
/// policy, the run's keys and the log.
fn context(
    args: &Args,
    tenants: Vec<Tenant>,
    mix: Vec<(String, f64)>,
    policy: Policy,
    give_up: f64,
) -> Arc<Ctx> {
    let addrs: Vec<String> = get::<String>(args, "addr", None)
        .split(',')
        .map(str::to_owned)
        .collect();
    let mix_names: Vec<String> = mix.iter().map(|m| m.0.clone()).collect();
    let clients = if policy == Policy::Client {
        clients(args, &tenants, &mix_names, give_up)
    } else {
        Vec::new()
    };
    Arc::new(Ctx {
        t0: Instant::now() + Duration::from_millis(500),
        pools: addrs.iter().map(|_| Mutex::default()).collect(),
        addrs,
        conns: Semaphore::new(get(args, "max-conns", Some(1024))),
        queue: get(args, "queue", None),
        tenants,
        mix: mix_names,
        policy,
        give_up,
        keys: keys_on(args).then(run_prefix),
        log: Mutex::default(),
        clients,
    })
}

async fn run(args: &Args) -> (Vec<Value>, Value) {
    let d: f64 = get(args, "drain-rate", Some(100.0));
    let ceiling: u64 = get(args, "ceiling", Some(0));
    let phases = phases(&get::<String>(
        args,
        "phases",
        Some("0.5:10,5:10,0.5:10".into()),
    ));
    let tenants = tenants(&get::<String>(args, "tenants", None));
    let mix = pairs(&get::<String>(args, "mix", Some("key:100".into())));
    let policy = policy(args);
    let give_up: f64 = get(args, "give-up-s", Some(120.0));
    let poisson = get::<String>(args, "arrivals", Some("poisson".into())) == "poisson";
    let arrivals = schedule(
        &phases,
        d,
        poisson,
        get(args, "seed", Some(1)),
        &tenants,
        &mix,
    );
    let ctx = context(args, tenants, mix, policy, give_up);
    let plan = drain_plan(args, d);
    let stop = Arc::new(AtomicBool::new(false));
    let drain = tokio::spawn(drain(ctx.clone(), args.clone(), plan, stop.clone()));
    let sched_end = phases.last().map_or(0.0, |p| p.start + p.secs);
    let end = sched_end + get::<f64>(args, "tail-s", Some(5.0));
    let tasks: Vec<_> = arrivals
        .iter()
        .map(|a| tokio::spawn(message(ctx.clone(), *a)))
        .collect();
    tokio::time::sleep_until(ctx.t0 + Duration::from_secs_f64(end)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = drain.await;
    for t in &tasks {
        t.abort();
    }
    let log = std::mem::take(&mut *lock(&ctx.log));
    if let Some(path) = args.get("timeline") {
        write_timeline(path, &log);
    }
    let plan = drain_plan(args, d);
    let series = series(&log, &arrivals, &phases, &plan, end);
    let summary = summary(&ctx, &log, &arrivals, &phases, &series, ceiling, end);
    (series, summary)
}
