//! loadgen: the measuring side of `./bench/run.sh`. Every run prints one JSON line.
//!
//! ```text
//! loadgen http  --addr 127.0.0.1:P[,127.0.0.1:P2,...] --path /v1/queues/bench/messages
//!               --concurrency 64 --duration 10 [--warmup 1] [--rate R] [--size 1024] [--token T]
//!               [--count-addr 127.0.0.1:Q] [--metrics-token T] [--redis-addr 127.0.0.1:6379]
//!               [--batch N] [--cpu-pids gateway:PID,broker:PID]
//! loadgen amqp  --url amqp://guest:guest@127.0.0.1:5672/%2f --queue bench --concurrency 64
//!               --duration 10 [--warmup 1] [--channels 4] [--size 1024] [--batch N]
//!               [--trace-headers 1] [--cpu-pids broker:PID]
//! loadgen bigbatch --addr 127.0.0.1:P --path /v1/queues/bench/messages/batch --token T
//!               --connections 64 [--extra 16] [--entries 100] [--request-bytes 1048576]
//!               [--withhold 4096] [--hold 3] --watch-pid PID [--metrics-token T]
//! loadgen hold  --addr 127.0.0.1:P --connections 1000 --hold 10 --ready-file F
//! loadgen hostile --addr 127.0.0.1:P --connections 5000 --kind heads|trickle|idle[,kind...]
//!               --duration 15 [--head-bytes 130000] [--trickle-ms 2000] [--ready-file F]
//!               [--watch-pid PID] [--metrics-token T] [--after 5] [--connect-gate 256]
//! loadgen proxy --listen 127.0.0.1:P --upstream 127.0.0.1:15672 --control 127.0.0.1:Q
//!               [--max-secs 3600]
//! ```
//!
//! - `http`: one keep-alive connection per worker (a minimal HTTP/1.1 client, so the load
//!   generator costs as little CPU as possible on a machine it shares with the server).
//!   Closed loop by default (`concurrency` requests in flight); with `--rate` each worker is
//!   paced so the total is `rate` requests/s. With `--count-addr` it reads the counting
//!   proxy's total of admin-plane requests at the start and end of the measured window; with
//!   `--metrics-token` it does the same with `sendgate_depth_reads_total` from `/metrics`
//!   (when the gateway has that route). Several addresses (a fleet): the connections are
//!   spread over them round robin and `/metrics` is summed over all of them. With
//!   `--redis-addr` it reads Redis's `INFO stats commandstats` at the window's edges and
//!   reports the commands Redis processed in between (its own `INFO` taken out), in total
//!   and per command. Every mode also reports the 1-minute load average when it started
//!   (`loadavg_before`) and when its window ended (`loadavg_after`). With `--batch N` each
//!   request is a batch send (`POST .../messages/batch`, the default path then) of N entries
//!   whose bodies are the same 1 KB JSON, and `messages` / `msgs_per_s` count the messages
//!   queued (N per `201`, the `queued` of a `207`), not the requests.
//! - `amqp`: the direct baseline: the same 1 KB persistent messages published with lapin on
//!   one connection with `--channels` publisher channels (confirms on, round robin, like the
//!   gateway's link), `concurrency` publishes in flight, each awaited on its confirm. With
//!   `--batch N` each of the `concurrency` tasks publishes N messages back to back on one
//!   channel (each publish polled once, in order, so its frames are queued before the next:
//!   what the gateway's batch does) and awaits their confirms together; `messages` counts
//!   the acked ones. `--trace-headers 1` puts the gateway's trace context on each message
//!   (`traceparent` and `Diagnostic-Id` AMQP headers, a value of its own per message);
//!   `--trace-headers 2` the `traceparent` alone.
//! - `--cpu-pids name:PID,...` (`http`, `amqp`): each process's utime + stime
//!   (`/proc/PID/stat`) over the measured window, in total and per message counted; the load
//!   generator's own is always reported (`cpu.loadgen`).
//! - `bigbatch`: `connections` clients each send the head and all but `withhold` bytes of a
//!   batch of `entries` entries whose `Content-Length` is exactly `request-bytes`, then hold
//!   for `hold` seconds (under the gateway's body deadline) while `VmRSS` of `watch-pid` is
//!   sampled every 25 ms; halfway through, `extra` more clients send the same batch whole
//!   (their answers are recorded: `503 saturated` when the body budget is spent); then the
//!   held clients send the rest and read their answers, RSS still sampled, and once more 2 s
//!   after. With `--metrics-token`, `/health/detailed`'s view of the body budget while held.
//! - `hold`: opens `connections` keep-alive connections, makes one request on each (so the
//!   server set the connection up fully), writes `ready-file`, holds them, then exits.
//! - `hostile`: `connections` clients that never make a useful request (issue 23), each
//!   kept at it for `duration` seconds once all have connected, reconnecting at once
//!   whenever the server closes it. `trickle`: one `GET /health/live`, then the next head
//!   one byte every `trickle-ms` (the slowloris); `heads`: an unfinished head of
//!   `head-bytes` written as fast as the server takes it, then held; `idle`: one request,
//!   then nothing. Several kinds (`trickle,idle`) are dealt out round robin. Reports the
//!   connections open over time (sampled every 250 ms: max, min, a series per second), the
//!   closes it saw by what the server said (`408`, `431`, `eof`: closed without a word,
//!   `reset`), how fast it got back (from a close seen to connected again, and to its first
//!   answer or head written again) and how long a connection lived. With `--watch-pid` it
//!   samples that process's `VmRSS`/`VmHWM` before, during and `--after` seconds after the
//!   clients have gone; with `--metrics-token` the gateway's `sendgate_connection*` series
//!   at the same moments (and `sendgate_connection_head_bytes` once a second). Raises its
//!   own `RLIMIT_NOFILE` to the hard limit (10,000 sockets need it).
//! - `proxy`: a TCP proxy in front of RabbitMQ's management port that counts the
//!   `GET /api/queues/...` requests going through it; the count is served as plain text on
//!   the control address. Exits by itself after `max-secs`.
//!
//! Latency is measured from just before the request is written to when its answer has been
//! read in full (or the confirm arrived), per request, in microseconds; percentiles are
//! nearest-rank over every request that started inside the measured window.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
    eprintln!("loadgen: {msg}");
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
    let Some((mode, rest)) = argv.split_first() else {
        die("usage: loadgen http|amqp|bigbatch|hold|hostile|proxy --key value ...");
    };
    let args = parse_args(rest);
    let threads: usize = get(&args, "threads", Some(2));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let out = runtime.block_on(async {
        match mode.as_str() {
            "http" => http(&args).await,
            "amqp" => amqp(&args).await,
            "bigbatch" => bigbatch(&args).await,
            "hold" => hold(&args).await,
            "hostile" => hostile(&args).await,
            "proxy" => proxy(&args).await,
            other => die(&format!("unknown mode {other:?}")),
        }
    });
    println!("{out}");
}

/// The 1-minute load average (`/proc/loadavg`), to note how busy the shared machine was.
fn loadavg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The 1 KB JSON body every send carries (exactly `size` bytes).
fn body(size: usize) -> Vec<u8> {
    let head = br#"{"bench":true,"pad":""#;
    let tail = br#""}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut b = Vec::with_capacity(size);
    b.extend_from_slice(head);
    b.extend(std::iter::repeat_n(b'x', pad));
    b.extend_from_slice(tail);
    b
}

/// A batch send's body: `{"messages": [{"body": <body>}, ...]}` with `n` entries.
fn batch_body(body: &[u8], n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + n * (body.len() + 12));
    b.extend_from_slice(b"{\"messages\":[");
    for i in 0..n {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(b"{\"body\":");
        b.extend_from_slice(body);
        b.push(b'}');
    }
    b.extend_from_slice(b"]}");
    b
}

/// Messages a send's answer says were queued: one per single `201`, a batch's entries per
/// `201`, a `207`'s `queued`; none otherwise.
fn queued_messages(status: u16, batch: usize, body: &[u8]) -> u64 {
    match status {
        201 => batch.max(1) as u64,
        207 => serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("queued")?.as_u64())
            .unwrap_or(0),
        _ => 0,
    }
}

/// utime + stime of `pid` in clock ticks (`/proc/PID/stat`, fields 14 and 15; `self` for
/// this process).
fn cpu_ticks(pid: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name, the state is field 3: utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if n > 0 {
        n as f64
    } else {
        100.0
    }
}

/// The processes whose CPU a window reports: `name:PID,...` from `--cpu-pids`, and always
/// the load generator itself.
fn cpu_targets(args: &Args) -> Vec<(String, String)> {
    let mut targets = vec![("loadgen".to_owned(), "self".to_owned())];
    if let Some(list) = args.get("cpu-pids") {
        for item in list.split(',').filter(|s| !s.is_empty()) {
            let Some((name, pid)) = item.split_once(':') else {
                die(&format!("--cpu-pids: {item:?} is not name:PID"));
            };
            targets.push((name.to_owned(), pid.to_owned()));
        }
    }
    targets
}

fn cpu_sample(targets: &[(String, String)]) -> Vec<Option<u64>> {
    targets.iter().map(|(_, pid)| cpu_ticks(pid)).collect()
}

/// `{name: {ms, ms_per_msg, util}}` over a window of `secs` in which `messages` were counted.
fn cpu_report(
    targets: &[(String, String)],
    start: &[Option<u64>],
    end: &[Option<u64>],
    secs: f64,
    messages: u64,
) -> Value {
    let hz = ticks_per_s();
    let mut out = serde_json::Map::new();
    for (((name, _), a), b) in targets.iter().zip(start).zip(end) {
        let (Some(a), Some(b)) = (a, b) else {
            out.insert(name.clone(), Value::Null);
            continue;
        };
        let ms = b.saturating_sub(*a) as f64 * 1000.0 / hz;
        out.insert(
            name.clone(),
            json!({
                "ms": ms,
                "us_per_msg": if messages > 0 { Some(ms * 1000.0 / messages as f64) } else { None },
                // Cores' worth of CPU used over the window (2 = both cores of this machine).
                "cores": ms / 1000.0 / secs,
            }),
        );
    }
    Value::Object(out)
}

#[derive(Default)]
struct Recorder {
    latency_us: Vec<u32>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    /// The first answer that was not a 2xx, for the record (a 429 run keeps its 429 body).
    first_refusal: Option<String>,
    /// Messages queued by the requests counted (a batch counts its entries).
    messages: u64,
}

impl Recorder {
    fn record(&mut self, status: u16, took: Duration) {
        self.latency_us
            .push(took.as_micros().min(u128::from(u32::MAX)) as u32);
        *self.statuses.entry(status).or_default() += 1;
    }

    fn merge(&mut self, other: Recorder) {
        self.latency_us.extend(other.latency_us);
        for (k, v) in other.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
        self.errors += other.errors;
        self.messages += other.messages;
        if self.first_refusal.is_none() {
            self.first_refusal = other.first_refusal;
        }
    }

    fn summary(mut self, secs: f64) -> Value {
        self.latency_us.sort_unstable();
        let n = self.latency_us.len();
        let pct = |q: f64| -> Option<f64> {
            if n == 0 {
                return None;
            }
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            Some(f64::from(self.latency_us[rank - 1]) / 1000.0)
        };
        let mean = if n == 0 {
            None
        } else {
            Some(self.latency_us.iter().map(|&u| f64::from(u)).sum::<f64>() / n as f64 / 1000.0)
        };
        json!({
            "requests": n,
            "secs": secs,
            "rps": n as f64 / secs,
            "p50_ms": pct(0.50),
            "p90_ms": pct(0.90),
            "p99_ms": pct(0.99),
            "max_ms": pct(1.0),
            "mean_ms": mean,
            "statuses": self.statuses.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
            "errors": self.errors,
            "first_refusal": self.first_refusal,
            "messages": self.messages,
            "msgs_per_s": self.messages as f64 / secs,
        })
    }
}

/// When the measured window starts and ends; requests before `start` are warm-up.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn new(args: &Args) -> Self {
        let warmup: f64 = get(args, "warmup", Some(1.0));
        let duration: f64 = get(args, "duration", None);
        let start = Instant::now() + Duration::from_secs_f64(warmup);
        Self {
            start,
            end: start + Duration::from_secs_f64(duration),
        }
    }

    fn secs(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

// ---------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client: one request at a time on a keep-alive connection.

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

/// One GET with `Connection: close`; the body when the answer is 200.
async fn get_once(addr: &str, path: &str, token: Option<&str>) -> Option<String> {
    let mut conn = HttpConn::connect(addr).await.ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    let (status, _, body) =
        tokio::time::timeout(Duration::from_secs(5), conn.round_trip(req.as_bytes()))
            .await
            .ok()?
            .ok()?;
    (status == 200).then(|| String::from_utf8_lossy(&body).into_owned())
}

/// Sum of every `sendgate_depth_reads_total{...}` sample, if `/metrics` exists.
async fn depth_reads_metric(addr: &str, token: &str) -> Option<f64> {
    let text = get_once(addr, "/metrics", Some(token)).await?;
    let mut sum = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("sendgate_depth_reads_total") {
            if rest.starts_with('{') || rest.starts_with(' ') {
                let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
                *sum.get_or_insert(0.0) += v;
            }
        }
    }
    sum
}

/// The counting proxy's totals: requests seen, and the sum of their latencies (µs, from
/// the request's first bytes to the answer's first bytes).
async fn proxy_count(addr: &str) -> Option<(u64, u64)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).await.ok()?;
    let mut parts = text.split_whitespace();
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Redis's command counters: `total_commands_processed` and `cmdstat_<name>` calls, from
/// one `INFO stats commandstats` (RESP by hand: one command, one bulk-string answer).
async fn redis_counters(addr: &str) -> Option<(u64, BTreeMap<String, u64>)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"*3\r\n$4\r\nINFO\r\n$5\r\nstats\r\n$12\r\ncommandstats\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    let text = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 16384];
        loop {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            let head_end = find(&buf, b"\r\n")?;
            let len: usize = std::str::from_utf8(buf.get(1..head_end)?)
                .ok()?
                .parse()
                .ok()?;
            if buf.len() >= head_end + 2 + len {
                return Some(
                    String::from_utf8_lossy(&buf[head_end + 2..head_end + 2 + len]).into_owned(),
                );
            }
        }
    })
    .await
    .ok()??;
    let mut total = None;
    let mut by_cmd = BTreeMap::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("total_commands_processed:") {
            total = v.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            by_cmd.insert(name.to_owned(), calls);
        }
    }
    Some((total?, by_cmd))
}

async fn http(args: &Args) -> Value {
    let loadavg_before = loadavg_1m();
    let addrs: Vec<String> = get::<String>(args, "addr", None)
        .split(',')
        .map(str::to_owned)
        .collect();
    let batch: usize = get(args, "batch", Some(0));
    let default_path = if batch > 0 {
        "/v1/queues/bench/messages/batch"
    } else {
        "/v1/queues/bench/messages"
    };
    let path: String = get(args, "path", Some(default_path.into()));
    let concurrency: usize = get(args, "concurrency", None);
    let size: usize = get(args, "size", Some(1024));
    let rate: f64 = get(args, "rate", Some(0.0));
    let token = args.get("token").cloned();
    let count_addr = args.get("count-addr").cloned();
    let metrics_token = args.get("metrics-token").cloned();
    let redis_addr = args.get("redis-addr").cloned();
    let cpu = cpu_targets(args);

    let body = if batch > 0 {
        batch_body(&body(size), batch)
    } else {
        body(size)
    };
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let request = Arc::new(request);

    let window = Window::new(args);
    let pace = (rate > 0.0).then(|| Duration::from_secs_f64(concurrency as f64 / rate));
    let workers: Vec<_> = (0..concurrency)
        .map(|i| {
            let (addr, request) = (addrs[i % addrs.len()].clone(), request.clone());
            // Stagger paced workers evenly over one period.
            let first =
                Instant::now() + pace.map_or(Duration::ZERO, |p| p * i as u32 / concurrency as u32);
            tokio::spawn(http_worker(addr, request, pace, first, window, batch))
        })
        .collect();

    // Read the counters at the edges of the measured window.
    tokio::time::sleep_until(window.start).await;
    let cpu_at_start = cpu_sample(&cpu);
    let reads_at_start = match &count_addr {
        Some(a) => proxy_count(a).await,
        None => None,
    };
    let metric_at_start = match &metrics_token {
        Some(t) => depth_reads_sum(&addrs, t).await,
        None => None,
    };
    let redis_at_start = match &redis_addr {
        Some(a) => redis_counters(a).await,
        None => None,
    };
    tokio::time::sleep_until(window.end).await;
    let cpu_at_end = cpu_sample(&cpu);
    let redis_at_end = match &redis_addr {
        Some(a) => redis_counters(a).await,
        None => None,
    };
    let reads_at_end = match &count_addr {
        Some(a) => proxy_count(a).await,
        None => None,
    };
    let metric_at_end = match &metrics_token {
        Some(t) => depth_reads_sum(&addrs, t).await,
        None => None,
    };
    let loadavg_after = loadavg_1m();

    let mut all = Recorder::default();
    for w in workers {
        all.merge(w.await.expect("worker"));
    }
    let messages = all.messages;
    let mut out = all.summary(window.secs());
    out["mode"] = json!("http");
    out["batch"] = json!(batch);
    out["request_bytes"] = json!(request.len());
    out["cpu"] = cpu_report(&cpu, &cpu_at_start, &cpu_at_end, window.secs(), messages);
    // Tells bench/report.py that `/metrics` counts each process's own reads (older results
    // had the fleet-wide count on every replica).
    out["reads_per_process"] = json!(true);
    out["addrs"] = json!(addrs.len());
    out["loadavg_before"] = json!(loadavg_before);
    out["loadavg_after"] = json!(loadavg_after);
    out["concurrency"] = json!(concurrency);
    out["target_rate"] = json!(rate);
    if let (Some((a, la)), Some((b, lb))) = (reads_at_start, reads_at_end) {
        out["admin_reads"] = json!(b - a);
        out["admin_reads_per_s"] = json!((b - a) as f64 / window.secs());
        if b > a {
            out["admin_read_mean_ms"] = json!((lb - la) as f64 / (b - a) as f64 / 1000.0);
        }
    }
    if let (Some((a, ma)), Some((b, mb))) = (metric_at_start, metric_at_end) {
        out["metric_depth_reads"] = json!(b - a);
        out["metric_depth_reads_per_s"] = json!((b - a) / window.secs());
        if addrs.len() > 1 {
            out["metric_depth_reads_max"] = json!(mb - ma);
            out["metric_depth_reads_max_per_s"] = json!((mb - ma) / window.secs());
        }
    }
    if let (Some((a, ca)), Some((b, cb))) = (redis_at_start, redis_at_end) {
        // The first INFO is counted in the second's numbers; the second in neither.
        let mut by_cmd = BTreeMap::new();
        for (name, calls) in cb {
            let before = ca.get(&name).copied().unwrap_or(0);
            let own = u64::from(name == "info");
            let delta = calls.saturating_sub(before + own);
            if delta > 0 {
                by_cmd.insert(name, delta);
            }
        }
        out["redis_commands"] = json!(b.saturating_sub(a + 1));
        out["redis_commands_by_cmd"] = json!(by_cmd);
    }
    out
}

/// `sendgate_depth_reads_total` of every gateway of a side: (sum, highest). Each process
/// counts its own reads (on Redis too), so the sum is the side's. None if one lacks it.
async fn depth_reads_sum(addrs: &[String], token: &str) -> Option<(f64, f64)> {
    let (mut sum, mut max) = (0.0, 0.0f64);
    for addr in addrs {
        let v = depth_reads_metric(addr, token).await?;
        sum += v;
        max = max.max(v);
    }
    Some((sum, max))
}

async fn http_worker(
    addr: String,
    request: Arc<Vec<u8>>,
    pace: Option<Duration>,
    first: Instant,
    window: Window,
    batch: usize,
) -> Recorder {
    let mut rec = Recorder::default();
    let mut conn: Option<HttpConn> = None;
    let mut ticker = pace.map(|p| {
        let mut t = tokio::time::interval_at(first, p);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        if let Some(t) = ticker.as_mut() {
            t.tick().await;
        }
        if Instant::now() >= window.end {
            break;
        }
        if conn.is_none() {
            match HttpConn::connect(&addr).await {
                Ok(c) => conn = Some(c),
                Err(_) => {
                    rec.errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected");
        let t0 = Instant::now();
        match c.round_trip(&request).await {
            Ok((status, keep, body)) => {
                if t0 >= window.start && t0 < window.end {
                    rec.record(status, t0.elapsed());
                    rec.messages += queued_messages(status, batch, &body);
                }
                // A 207 (some entries of a batch not queued) is worth seeing too.
                let refused = !(200..300).contains(&status) || status == 207;
                if refused && rec.first_refusal.is_none() {
                    let shown = &body[..body.len().min(300)];
                    rec.first_refusal =
                        Some(format!("{status} {}", String::from_utf8_lossy(shown)));
                }
                if !keep {
                    conn = None;
                }
            }
            Err(_) => {
                rec.errors += 1;
                conn = None;
            }
        }
    }
    rec
}

// ---------------------------------------------------------------------------------------
// The direct baseline: lapin, publisher confirms.

async fn amqp(args: &Args) -> Value {
    let loadavg_before = loadavg_1m();
    let url: String = get(
        args,
        "url",
        Some("amqp://guest:guest@127.0.0.1:5672/%2f".into()),
    );
    let queue: String = get(args, "queue", Some("bench".into()));
    let concurrency: usize = get(args, "concurrency", None);
    let channels: usize = get(args, "channels", Some(4));
    let size: usize = get(args, "size", Some(1024));
    // Messages per publish round: 0 or 1 = one publish awaited on its confirm.
    let batch: usize = get::<usize>(args, "batch", Some(0)).max(1);
    // `--trace-headers 1`: each message also carries the gateway's trace context, a
    // `traceparent` and a `Diagnostic-Id` (the same value) of its own in the AMQP headers,
    // as the gateway puts on every message (contract section 1, "Trace context").
    // `--trace-headers 2`: the `traceparent` alone (what one header of the two costs).
    let trace_headers: u8 = get(args, "trace-headers", Some(0));
    let cpu = cpu_targets(args);

    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| die(&format!("cannot connect to {url}: {e}")));
    let mut publishers = Vec::with_capacity(channels);
    for _ in 0..channels {
        let channel = connection
            .create_channel()
            .await
            .unwrap_or_else(|e| die(&format!("channel: {e}")));
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap_or_else(|e| die(&format!("confirm.select: {e}")));
        publishers.push(channel);
    }
    let publishers = Arc::new(publishers);
    let next = Arc::new(AtomicUsize::new(0));
    let body = Arc::new(body(size));

    let window = Window::new(args);
    let workers: Vec<_> = (0..concurrency)
        .map(|task| {
            let (publishers, next, body, queue) = (
                publishers.clone(),
                next.clone(),
                body.clone(),
                queue.clone(),
            );
            tokio::spawn(async move {
                let mut rec = Recorder::default();
                let mut seq: u64 = 0;
                while Instant::now() < window.end {
                    // One channel per round, round robin, as the gateway's batch takes one.
                    let channel =
                        &publishers[next.fetch_add(1, Ordering::Relaxed) % publishers.len()];
                    let publishes = (0..batch).map(|_| {
                        seq += 1;
                        // A UUID-shaped id, like the gateway's generated message ids.
                        let id = format!("{task:08x}-0000-4000-8000-{seq:012x}");
                        let mut properties = BasicProperties::default()
                            .with_delivery_mode(2)
                            .with_content_type("application/json".into())
                            .with_message_id(id.as_str().into());
                        if trace_headers > 0 {
                            let parent = format!(
                                "00-{task:016x}{seq:016x}-{:016x}-00",
                                seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                            );
                            let mut headers = std::collections::BTreeMap::new();
                            let names = ["traceparent", "Diagnostic-Id"];
                            for name in &names[..if trace_headers == 2 { 1 } else { 2 }] {
                                headers.insert(
                                    (*name).into(),
                                    AMQPValue::LongString(parent.as_str().into()),
                                );
                            }
                            properties = properties.with_headers(FieldTable::from(headers));
                        }
                        let (body, queue) = (body.clone(), queue.clone());
                        async move {
                            channel
                                .basic_publish(
                                    "".into(),
                                    queue.as_str().into(),
                                    BasicPublishOptions {
                                        mandatory: true,
                                        ..BasicPublishOptions::default()
                                    },
                                    &body,
                                    properties,
                                )
                                .await?
                                .await
                        }
                    });
                    let t0 = Instant::now();
                    // join_all polls each publish once, in order, before any waits: the
                    // frames of all are queued back to back, then every confirm is awaited.
                    let outcomes = futures_util::future::join_all(publishes).await;
                    let (mut status, mut acked, mut failed) = (201, 0u64, false);
                    for outcome in outcomes {
                        let this = match outcome {
                            Ok(Confirmation::Ack(None)) => 201,
                            Ok(Confirmation::Ack(Some(_))) => 502,
                            Ok(Confirmation::Nack(_)) => 503,
                            Ok(Confirmation::NotRequested) => 500,
                            Err(_) => {
                                failed = true;
                                continue;
                            }
                        };
                        if this == 201 {
                            acked += 1;
                        } else if status == 201 {
                            status = this;
                        }
                    }
                    if failed {
                        rec.errors += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    if t0 >= window.start && t0 < window.end {
                        rec.record(status, t0.elapsed());
                        rec.messages += acked;
                    }
                }
                rec
            })
        })
        .collect();
    tokio::time::sleep_until(window.start).await;
    let cpu_at_start = cpu_sample(&cpu);
    tokio::time::sleep_until(window.end).await;
    let cpu_at_end = cpu_sample(&cpu);
    let mut all = Recorder::default();
    for w in workers {
        all.merge(w.await.expect("worker"));
    }
    let loadavg_after = loadavg_1m();
    let _ = connection.close(200, "done".into()).await;
    let messages = all.messages;
    let mut out = all.summary(window.secs());
    out["mode"] = json!("amqp");
    out["batch"] = json!(batch);
    out["trace_headers"] = json!(trace_headers);
    out["cpu"] = cpu_report(&cpu, &cpu_at_start, &cpu_at_end, window.secs(), messages);
    out["loadavg_before"] = json!(loadavg_before);
    out["loadavg_after"] = json!(loadavg_after);
    out["concurrency"] = json!(concurrency);
    out["channels"] = json!(channels);
    out
}

// ---------------------------------------------------------------------------------------
// Large batches held in flight (comparison 11): memory against the body budget.

/// A batch body of `entries` entries of equal 1 KB-style JSON bodies, exactly `total` bytes.
fn sized_batch(entries: usize, total: usize) -> Vec<u8> {
    let entries = entries.max(1);
    // `{"messages":[` + entries × `{"body":…}` + the commas between them + `]}`.
    let envelope = 13 + 2 + entries * 9 + (entries - 1);
    let room = total
        .checked_sub(envelope)
        .unwrap_or_else(|| die("--request-bytes is too small for that many entries"));
    let each = room / entries;
    let mut b = Vec::with_capacity(total);
    b.extend_from_slice(b"{\"messages\":[");
    for i in 0..entries {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(b"{\"body\":");
        // The first entry takes the remainder, so the total is exact.
        let size = if i == 0 {
            room - each * (entries - 1)
        } else {
            each
        };
        b.extend_from_slice(&body(size));
        b.push(b'}');
    }
    b.extend_from_slice(b"]}");
    assert_eq!(b.len(), total, "the batch body's length");
    b
}

/// Read one answer (head and `Content-Length` body) from `r`: (status, body).
async fn read_answer<R: AsyncReadExt + Unpin>(r: &mut R) -> io::Result<(u16, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16384];
    let head_end = loop {
        if let Some(pos) = find(&buf, b"\r\n\r\n") {
            break pos;
        }
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("bad status line"))?;
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < head_end + 4 + length {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok((status, buf[head_end + 4..head_end + 4 + length].to_vec()))
}

/// What one client of `bigbatch` got: its answer's status and code (or the error), the
/// messages it says were queued, and how long from its last byte written to the answer.
#[derive(Default)]
struct BigAnswer {
    status: Option<u16>,
    code: Option<String>,
    queued: u64,
    error: Option<String>,
    took_ms: f64,
}

fn answer_of(outcome: io::Result<(u16, Vec<u8>)>, batch: usize, took: Duration) -> BigAnswer {
    match outcome {
        Ok((status, body)) => {
            let code = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| Some(v.get("code")?.as_str()?.to_owned()));
            BigAnswer {
                status: Some(status),
                code,
                queued: queued_messages(status, batch, &body),
                error: None,
                took_ms: took.as_secs_f64() * 1000.0,
            }
        }
        Err(e) => BigAnswer {
            error: Some(e.kind().to_string()),
            took_ms: took.as_secs_f64() * 1000.0,
            ..BigAnswer::default()
        },
    }
}

/// Answers by status (or `error:<kind>`), and by error code.
fn tally(answers: &[BigAnswer]) -> Value {
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
    for a in answers {
        let key = match (a.status, &a.error) {
            (Some(s), _) => s.to_string(),
            (None, Some(e)) => format!("error:{e}"),
            (None, None) => "none".into(),
        };
        *by_status.entry(key).or_default() += 1;
        if let Some(c) = &a.code {
            *by_code.entry(c.clone()).or_default() += 1;
        }
    }
    let mut took: Vec<u64> = answers
        .iter()
        .map(|a| (a.took_ms * 1000.0) as u64)
        .collect();
    took.sort_unstable();
    json!({
        "statuses": by_status,
        "codes": by_code,
        "queued": answers.iter().map(|a| a.queued).sum::<u64>(),
        "took": spread_ms(took),
    })
}

async fn bigbatch(args: &Args) -> Value {
    let loadavg_before = loadavg_1m();
    let nofile = raise_nofile();
    let addr: String = get(args, "addr", None);
    let path: String = get(args, "path", Some("/v1/queues/bench/messages/batch".into()));
    let token = args.get("token").cloned();
    let connections: usize = get(args, "connections", None);
    let extra: usize = get(args, "extra", Some(16));
    let entries: usize = get(args, "entries", Some(100));
    let request_bytes: usize = get(args, "request-bytes", Some(1_048_576));
    let withhold: usize = get(args, "withhold", Some(4096));
    let hold: f64 = get(args, "hold", Some(3.0));
    let after: f64 = get(args, "after", Some(2.0));
    let watch_pid: u32 = get(args, "watch-pid", None);
    if withhold == 0 || withhold >= request_bytes {
        die("--withhold must be between 1 and --request-bytes - 1");
    }

    let body = sized_batch(entries, request_bytes);
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    let head_len = request.len();
    request.extend_from_slice(&body);
    let request = Arc::new(request);
    let split = request.len() - withhold;

    let idle = rss_hwm(watch_pid);
    // VmRSS every 25 ms until the end, with the time since t0.
    let t0 = Instant::now();
    let samples: Arc<std::sync::Mutex<Vec<(f64, u64)>>> = Arc::default();
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            loop {
                tick.tick().await;
                if let Some((rss, _)) = rss_hwm(watch_pid) {
                    samples
                        .lock()
                        .expect("lock")
                        .push((t0.elapsed().as_secs_f64(), rss));
                }
            }
        })
    };

    // The held clients: head and all but `withhold` bytes, then wait to be released.
    let written = Arc::new(AtomicUsize::new(0));
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let holders: Vec<_> = (0..connections)
        .map(|_| {
            let (addr, request, written) = (addr.clone(), request.clone(), written.clone());
            let mut go = release_rx.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut stream = match TcpStream::connect(&addr).await {
                    Ok(s) => s,
                    Err(e) => {
                        written.fetch_add(1, Ordering::SeqCst);
                        return (answer_of(Err(e), entries, Duration::ZERO), 0.0);
                    }
                };
                let _ = stream.set_nodelay(true);
                let (mut r, mut w) = stream.split();
                // Written while watching for an early answer (a refusal before the body).
                let first = tokio::select! {
                    res = w.write_all(&request[..split]) => res.err(),
                    res = read_answer(&mut r) => {
                        written.fetch_add(1, Ordering::SeqCst);
                        return (answer_of(res, entries, started.elapsed()), 0.0);
                    }
                };
                written.fetch_add(1, Ordering::SeqCst);
                if let Some(e) = first {
                    return (answer_of(Err(e), entries, started.elapsed()), 0.0);
                }
                let _ = go.wait_for(|v| *v).await;
                let held_s = started.elapsed().as_secs_f64();
                let t = Instant::now();
                let outcome = tokio::time::timeout(Duration::from_secs(30), async {
                    w.write_all(&request[split..]).await?;
                    read_answer(&mut r).await
                })
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()));
                (answer_of(outcome, entries, t.elapsed()), held_s)
            })
        })
        .collect();
    // Every held client has written its part (or failed): the ramp is over.
    let ramp_deadline = Instant::now() + Duration::from_secs(30);
    while written.load(Ordering::SeqCst) < connections && Instant::now() < ramp_deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t_written = t0.elapsed().as_secs_f64();

    // Halfway through the hold, the extra clients send the same batch whole.
    tokio::time::sleep(Duration::from_secs_f64(hold / 2.0)).await;
    let t_extra = t0.elapsed().as_secs_f64();
    let extras: Vec<_> = (0..extra)
        .map(|_| {
            let (addr, request) = (addr.clone(), request.clone());
            tokio::spawn(async move {
                let t = Instant::now();
                let outcome = tokio::time::timeout(Duration::from_secs(30), async {
                    let mut stream = TcpStream::connect(&addr).await?;
                    let _ = stream.set_nodelay(true);
                    let (mut r, mut w) = stream.split();
                    // A refusal may come before the body is read: read while writing.
                    let (wrote, answer) = tokio::join!(w.write_all(&request), read_answer(&mut r));
                    match answer {
                        Ok(a) => Ok(a),
                        Err(e) => Err(wrote.err().unwrap_or(e)),
                    }
                })
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()));
                answer_of(outcome, entries, t.elapsed())
            })
        })
        .collect();
    let mut extra_answers = Vec::with_capacity(extra);
    for e in extras {
        extra_answers.push(e.await.expect("extra client"));
    }
    let t_extra_done = t0.elapsed().as_secs_f64();
    let remaining = (t_written + hold - t0.elapsed().as_secs_f64()).max(0.0);
    tokio::time::sleep(Duration::from_secs_f64(remaining)).await;
    let held_rss = rss_hwm(watch_pid);

    // Release: the held clients send the rest and read their answers.
    let t_release = t0.elapsed().as_secs_f64();
    let _ = release_tx.send(true);
    let mut held_answers = Vec::with_capacity(connections);
    let mut held_longest = 0.0f64;
    for h in holders {
        let (a, held_s) = h.await.expect("held client");
        held_longest = held_longest.max(held_s);
        held_answers.push(a);
    }
    let t_answered = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(after)).await;
    let end = rss_hwm(watch_pid);
    let t_end = t0.elapsed().as_secs_f64();
    sampler.abort();
    let samples = samples.lock().expect("lock").clone();
    let max_in = |a: f64, b: f64| {
        samples
            .iter()
            .filter(|(t, _)| *t >= a && *t <= b)
            .map(|s| s.1)
            .max()
    };
    json!({
        "mode": "bigbatch",
        "connections": connections,
        "extra": extra,
        "entries": entries,
        "request_bytes": request.len(),
        "body_bytes": body.len(),
        "head_bytes": head_len,
        "withhold": withhold,
        "hold_s": hold,
        "nofile_limit": nofile,
        "ramp_s": t_written,
        "held_longest_s": held_longest,
        "rss_idle_kib": idle.map(|r| r.0),
        "hwm_idle_kib": idle.map(|r| r.1),
        // While every held client has its batch in (all but `withhold` bytes of it).
        "rss_held_max_kib": max_in(t_written, t_release),
        "rss_held_end_kib": held_rss.map(|r| r.0),
        // From the release until every answer is read (the batches at the broker).
        "rss_dispatch_max_kib": max_in(t_release, t_answered + 0.1),
        "rss_max_kib": samples.iter().map(|s| s.1).max(),
        "rss_after_kib": end.map(|r| r.0),
        "hwm_end_kib": end.map(|r| r.1),
        "after_s": after,
        "samples": samples.len(),
        "dispatch_s": t_answered - t_release,
        "extra_s": t_extra_done - t_extra,
        "held": tally(&held_answers),
        "extras": tally(&extra_answers),
        "series": samples.iter().step_by(4).map(|(t, r)| json!([(t * 100.0).round() / 100.0, r])).collect::<Vec<_>>(),
        "phases_s": {"written": t_written, "extras": t_extra, "extras_done": t_extra_done,
                     "release": t_release, "answered": t_answered, "end": t_end},
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg_1m(),
    })
}

// ---------------------------------------------------------------------------------------
// Keep-alive connections held open.

async fn hold(args: &Args) -> Value {
    let addr: String = get(args, "addr", None);
    let connections: usize = get(args, "connections", None);
    let hold_secs: f64 = get(args, "hold", None);
    let ready_file: String = get(args, "ready-file", None);
    let request = b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n";

    let mut held = Vec::with_capacity(connections);
    let mut failed = 0u64;
    // Open in batches so the listen backlog is never the limit.
    for batch in (0..connections).collect::<Vec<_>>().chunks(100) {
        let opened: Vec<_> = batch
            .iter()
            .map(|_| {
                let addr = addr.clone();
                tokio::spawn(async move {
                    let mut c = HttpConn::connect(&addr).await?;
                    let (status, keep, _) = c.round_trip(request).await?;
                    if status == 200 && keep {
                        Ok(c)
                    } else {
                        Err(io::Error::other(format!("status {status}")))
                    }
                })
            })
            .collect();
        for o in opened {
            match o.await.expect("task") {
                Ok(c) => held.push(c),
                Err(_) => failed += 1,
            }
        }
    }
    std::fs::write(&ready_file, format!("{}\n", held.len())).expect("ready file");
    tokio::time::sleep(Duration::from_secs_f64(hold_secs)).await;
    // Still open at the end? (The server would have closed idle ones past its keep-alive.)
    let mut still_open = 0;
    for c in &mut held {
        if c.round_trip(request).await.is_ok() {
            still_open += 1;
        }
    }
    json!({"mode": "hold", "held": held.len(), "failed": failed, "still_open": still_open})
}

// ---------------------------------------------------------------------------------------
// Hostile clients (issue 23): connections that take the server's room and memory and never
// make a useful request, reconnecting at once whenever the server closes them.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One `GET /health/live`, then the next head one byte every `trickle` (slowloris).
    Trickle,
    /// An unfinished head of `head_bytes`, written as fast as the server reads, then held.
    Heads,
    /// One `GET /health/live`, then nothing.
    Idle,
}

impl Kind {
    fn parse(s: &str) -> Kind {
        match s {
            "trickle" => Kind::Trickle,
            "heads" => Kind::Heads,
            "idle" => Kind::Idle,
            other => die(&format!(
                "--kind: unknown kind {other:?} (trickle, heads, idle)"
            )),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Kind::Trickle => "trickle",
            Kind::Heads => "heads",
            Kind::Idle => "idle",
        }
    }
}

/// Raise `RLIMIT_NOFILE`'s soft limit to the hard one; the soft limit in force after.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by reference.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim = want;
            }
        }
    }
    lim.rlim_cur
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn rss_hwm(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The gateway's `sendgate_connection*` series from `/metrics`, by series (name and labels).
async fn connection_metrics(addr: &str, token: &str) -> Option<BTreeMap<String, f64>> {
    let text = get_once(addr, "/metrics", Some(token)).await?;
    let mut series = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with("sendgate_connection") {
            let (name, value) = line.rsplit_once(' ')?;
            series.insert(name.to_owned(), value.parse().ok()?);
        }
    }
    Some(series)
}

/// `{label value: n}` of the series `name{label="..."}` in a metrics snapshot; with
/// `since`, the increase from that earlier snapshot.
fn by_label(
    now: &BTreeMap<String, f64>,
    since: Option<&BTreeMap<String, f64>>,
    name: &str,
) -> BTreeMap<String, f64> {
    let prefix = format!("{name}{{");
    let mut out = BTreeMap::new();
    for (series, v) in now {
        let Some(labels) = series.strip_prefix(&prefix) else {
            continue;
        };
        let label = labels
            .split_once('"')
            .and_then(|(_, rest)| rest.split_once('"'))
            .map_or(labels, |(value, _)| value);
        let before = since.and_then(|s| s.get(series)).copied().unwrap_or(0.0);
        out.insert(label.to_owned(), v - before);
    }
    out
}

fn metrics_summary(
    now: Option<&BTreeMap<String, f64>>,
    since: Option<&BTreeMap<String, f64>>,
) -> Value {
    let Some(now) = now else {
        return Value::Null;
    };
    json!({
        "connections": by_label(now, None, "sendgate_connections"),
        "closed": by_label(now, since, "sendgate_connections_closed_total"),
        "head_bytes": now.get("sendgate_connection_head_bytes"),
    })
}

/// Nearest-rank percentiles of `values` (in µs) as ms.
fn spread_ms(mut values: Vec<u64>) -> Value {
    values.sort_unstable();
    let n = values.len();
    if n == 0 {
        return json!({"n": 0});
    }
    let at = |q: f64| values[((q * n as f64).ceil() as usize).clamp(1, n) - 1] as f64 / 1000.0;
    json!({"n": n, "p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99), "max_ms": at(1.0)})
}

/// (seconds since the start, the clients' open connections, the gateway's `VmRSS` KiB).
type Sample = (f64, u64, Option<u64>);

struct HostileCfg {
    addr: String,
    /// The unfinished head heads clients write (one copy for all of them).
    head: Vec<u8>,
    trickle: Duration,
}

#[derive(Default)]
struct HostileStats {
    /// Connected and not yet seen closed.
    open: AtomicU64,
    /// Clients whose first connection got as far as its first request (or its end).
    ramped: AtomicUsize,
    connects: AtomicU64,
    connect_errors: AtomicU64,
    closes: AtomicU64,
    bytes_sent: AtomicU64,
    /// Closes seen, by kind and by what the server said.
    closed_by: std::sync::Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    /// Statuses of the one `GET /health/live` of trickle and idle clients.
    first_answers: std::sync::Mutex<BTreeMap<u16, u64>>,
    /// From a close seen to connected again (µs).
    reconnect_us: std::sync::Mutex<Vec<u64>>,
    /// From a close seen to working again: the GET answered, or the head's first bytes sent.
    ready_again_us: std::sync::Mutex<Vec<u64>>,
    /// From connected to closed by the server (µs).
    lifetime_us: std::sync::Mutex<Vec<u64>>,
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

/// What the server said before it closed: its status code, or `eof` (closed without a
/// word), `reset`, `error`.
fn close_reason(seen: &[u8], err: Option<&io::Error>) -> String {
    if let Some(status) = seen
        .strip_prefix(b"HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| std::str::from_utf8(code).ok())
    {
        return status.to_owned();
    }
    match err.map(io::Error::kind) {
        None | Some(io::ErrorKind::UnexpectedEof) => "eof".into(),
        Some(io::ErrorKind::ConnectionReset) => "reset".into(),
        Some(io::ErrorKind::BrokenPipe) => "broken_pipe".into(),
        Some(_) => "error".into(),
    }
}

/// Read until the server closes: what it said (the first bytes) and how it ended.
async fn watch_close(
    r: &mut tokio::net::tcp::ReadHalf<'_>,
    seen: &mut Vec<u8>,
) -> Option<io::Error> {
    let mut chunk = [0u8; 1024];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) => return None,
            Ok(n) => {
                if seen.len() < 64 {
                    seen.extend_from_slice(&chunk[..n.min(64 - seen.len())]);
                }
            }
            Err(e) => return Some(e),
        }
    }
}

/// Write `bytes` (or, with `trickle`, one byte per period, then `a` for ever), then hold;
/// returns only on a write error.
async fn hostile_writes(
    w: &mut tokio::net::tcp::WriteHalf<'_>,
    bytes: &[u8],
    trickle: Option<Duration>,
    stats: &HostileStats,
) -> io::Error {
    match trickle {
        Some(every) => {
            let mut i = 0;
            loop {
                let byte = bytes.get(i).copied().unwrap_or(b'a');
                if let Err(e) = w.write_all(&[byte]).await {
                    return e;
                }
                stats.bytes_sent.fetch_add(1, Ordering::Relaxed);
                i += 1;
                tokio::time::sleep(every).await;
            }
        }
        None => {
            for chunk in bytes.chunks(16384) {
                if let Err(e) = w.write_all(chunk).await {
                    return e;
                }
                stats
                    .bytes_sent
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            std::future::pending().await
        }
    }
}

/// One hostile client: connect, misbehave until the server closes, reconnect, for ever
/// (the caller drops it at the end of the window).
async fn hostile_client(
    kind: Kind,
    cfg: Arc<HostileCfg>,
    stats: Arc<HostileStats>,
    gate: Arc<tokio::sync::Semaphore>,
) {
    const GET: &[u8] = b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n";
    const NEXT: &[u8] = b"GET /health/live HTTP/1.1\r\nHost: localhost\r\nX-Trickle: ";
    let mut ramped = false;
    let mut closed_at: Option<Instant> = None;
    loop {
        let connected = {
            let _permit = gate.acquire().await.expect("gate");
            TcpStream::connect(&cfg.addr).await
        };
        let stream = match connected {
            Ok(s) => s,
            Err(_) => {
                stats.connect_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let t_conn = Instant::now();
        stats.connects.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        if let Some(at) = closed_at {
            stats
                .reconnect_us
                .lock()
                .expect("lock")
                .push(micros(at.elapsed()));
        }
        let _ = stream.set_nodelay(true);
        let mut seen = Vec::new();
        let ready = |stats: &HostileStats, ramped: &mut bool| {
            if let Some(at) = closed_at {
                stats
                    .ready_again_us
                    .lock()
                    .expect("lock")
                    .push(micros(at.elapsed()));
            }
            if !*ramped {
                *ramped = true;
                stats.ramped.fetch_add(1, Ordering::Relaxed);
            }
        };
        let ended: Option<io::Error> = 'conn: {
            let mut stream = stream;
            if kind != Kind::Heads {
                let mut c = HttpConn {
                    stream,
                    buf: Vec::new(),
                };
                match c.round_trip(GET).await {
                    Ok((status, keep, _)) => {
                        *stats
                            .first_answers
                            .lock()
                            .expect("lock")
                            .entry(status)
                            .or_default() += 1;
                        if !keep {
                            seen = format!("HTTP/1.1 {status}").into_bytes();
                            break 'conn None;
                        }
                    }
                    Err(e) => break 'conn Some(e),
                }
                ready(&stats, &mut ramped);
                stream = c.stream;
            } else {
                ready(&stats, &mut ramped);
            }
            let (mut r, mut w) = stream.split();
            let writes = async {
                match kind {
                    Kind::Trickle => hostile_writes(&mut w, NEXT, Some(cfg.trickle), &stats).await,
                    Kind::Heads => hostile_writes(&mut w, &cfg.head, None, &stats).await,
                    Kind::Idle => std::future::pending().await,
                }
            };
            tokio::select! {
                e = watch_close(&mut r, &mut seen) => e,
                e = writes => {
                    // The server closed under a write: what it said is likely in flight.
                    match tokio::time::timeout(Duration::from_millis(200), watch_close(&mut r, &mut seen)).await {
                        Ok(read_end) => read_end.or(Some(e)),
                        Err(_) => Some(e),
                    }
                }
            }
        };
        if !ramped {
            ramped = true;
            stats.ramped.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        stats.open.fetch_sub(1, Ordering::Relaxed);
        stats.closes.fetch_add(1, Ordering::Relaxed);
        stats
            .lifetime_us
            .lock()
            .expect("lock")
            .push(micros(now - t_conn));
        let reason = close_reason(&seen, ended.as_ref());
        *stats
            .closed_by
            .lock()
            .expect("lock")
            .entry(kind.as_str().to_owned())
            .or_default()
            .entry(reason)
            .or_default() += 1;
        closed_at = Some(now);
    }
}

async fn hostile(args: &Args) -> Value {
    let loadavg_before = loadavg_1m();
    let nofile = raise_nofile();
    let addr: String = get(args, "addr", None);
    let connections: usize = get(args, "connections", None);
    let kinds: Vec<Kind> = get::<String>(args, "kind", None)
        .split(',')
        .map(Kind::parse)
        .collect();
    let duration: f64 = get(args, "duration", None);
    let head_bytes: usize = get(args, "head-bytes", Some(130_000));
    let trickle_ms: u64 = get(args, "trickle-ms", Some(2000));
    let after: f64 = get(args, "after", Some(0.0));
    let ramp_max: f64 = get(args, "ramp-max", Some(120.0));
    let gate_n: usize = get(args, "connect-gate", Some(256));
    let ready_file = args.get("ready-file").cloned();
    let probe_ms: u64 = get(args, "probe-ms", Some(0));
    let watch_pid: Option<u32> = args.get("watch-pid").map(|_| get(args, "watch-pid", None));
    let metrics_token = args.get("metrics-token").cloned();
    if nofile > 0 && (nofile as usize) < connections + 64 {
        eprintln!(
            "loadgen: RLIMIT_NOFILE is {nofile}: fewer sockets than --connections {connections}"
        );
    }

    let metrics = |token: &Option<String>| {
        let (addr, token) = (addr.clone(), token.clone());
        async move {
            match token {
                Some(t) => connection_metrics(&addr, &t).await,
                None => None,
            }
        }
    };
    let rss = || watch_pid.and_then(rss_hwm);
    let before_rss = rss();
    let before_metrics = metrics(&metrics_token).await;

    const PAD: &[u8] = b"GET /health/live HTTP/1.1\r\nHost: localhost\r\nX-Pad: ";
    let cfg = Arc::new(HostileCfg {
        addr: addr.clone(),
        head: PAD
            .iter()
            .copied()
            .chain(std::iter::repeat(b'a'))
            .take(head_bytes.max(PAD.len()))
            .collect(),
        trickle: Duration::from_millis(trickle_ms),
    });
    let stats = Arc::new(HostileStats::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(gate_n.max(1)));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..connections)
        .map(|i| {
            tokio::spawn(hostile_client(
                kinds[i % kinds.len()],
                cfg.clone(),
                stats.clone(),
                gate.clone(),
            ))
        })
        .collect();

    // Sampled every 250 ms: the clients' open connections and the gateway's RSS; every
    // second, the gateway's head bytes (a `/metrics` read is a request of its own).
    let samples: Arc<std::sync::Mutex<Vec<Sample>>> = Arc::default();
    let sampler = {
        let (stats, samples) = (stats.clone(), samples.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let rss = watch_pid.and_then(rss_hwm).map(|(r, _)| r);
                let open = stats.open.load(Ordering::Relaxed);
                samples
                    .lock()
                    .expect("lock")
                    .push((t0.elapsed().as_secs_f64(), open, rss));
            }
        })
    };
    let head_samples: Arc<std::sync::Mutex<Vec<(f64, f64)>>> = Arc::default();
    let head_sampler = metrics_token.clone().map(|token| {
        let (addr, head_samples) = (addr.clone(), head_samples.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let Some(m) = connection_metrics(&addr, &token).await {
                    if let Some(v) = m.get("sendgate_connection_head_bytes") {
                        head_samples
                            .lock()
                            .expect("lock")
                            .push((t0.elapsed().as_secs_f64(), *v));
                    }
                }
            }
        })
    });

    // A newcomer's view: every `probe-ms`, a fresh connection and one `GET /health/live`
    // (`Connection: close`), timed from the connect to the answer read in full.
    let probe_window: Arc<std::sync::Mutex<Option<(Instant, Instant)>>> = Arc::default();
    let probe_rec: Arc<std::sync::Mutex<Recorder>> = Arc::default();
    let prober = (probe_ms > 0).then(|| {
        let (addr, window, rec) = (addr.clone(), probe_window.clone(), probe_rec.clone());
        tokio::spawn(async move {
            const GET_CLOSE: &[u8] =
                b"GET /health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            let mut tick = tokio::time::interval(Duration::from_millis(probe_ms));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let t = Instant::now();
                let outcome = tokio::time::timeout(Duration::from_secs(10), async {
                    let mut c = HttpConn::connect(&addr).await?;
                    c.round_trip(GET_CLOSE).await
                })
                .await;
                let counted =
                    matches!(*window.lock().expect("lock"), Some((a, b)) if t >= a && t < b);
                if !counted {
                    continue;
                }
                let mut rec = rec.lock().expect("lock");
                match outcome {
                    Ok(Ok((status, _, _))) => rec.record(status, t.elapsed()),
                    _ => rec.errors += 1,
                }
            }
        })
    });

    // The ramp: until every client got its first connection as far as its first request.
    let ramp_deadline = t0 + Duration::from_secs_f64(ramp_max);
    while stats.ramped.load(Ordering::Relaxed) < connections && Instant::now() < ramp_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ramp_s = t0.elapsed().as_secs_f64();
    let ramped = stats.ramped.load(Ordering::Relaxed);
    if let Some(f) = &ready_file {
        std::fs::write(f, format!("{}\n", stats.open.load(Ordering::Relaxed))).expect("ready file");
    }
    let (connects0, closes0) = (
        stats.connects.load(Ordering::Relaxed),
        stats.closes.load(Ordering::Relaxed),
    );
    let window_start = t0.elapsed().as_secs_f64();
    *probe_window.lock().expect("lock") = Some((
        Instant::now(),
        Instant::now() + Duration::from_secs_f64(duration),
    ));
    tokio::time::sleep(Duration::from_secs_f64(duration)).await;
    let window_end = t0.elapsed().as_secs_f64();
    let (connects1, closes1) = (
        stats.connects.load(Ordering::Relaxed),
        stats.closes.load(Ordering::Relaxed),
    );
    let open_at_end = stats.open.load(Ordering::Relaxed);
    let end_rss = rss();
    let end_metrics = metrics(&metrics_token).await;
    let loadavg_end = loadavg_1m();

    // Gone: every client dropped with its socket.
    for c in &clients {
        c.abort();
    }
    for c in clients {
        let _ = c.await;
    }
    sampler.abort();
    if let Some(p) = prober {
        p.abort();
    }
    if let Some(h) = head_sampler {
        h.abort();
    }
    let (after_rss, after_metrics) = if after > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(after)).await;
        (rss(), metrics(&metrics_token).await)
    } else {
        (None, None)
    };

    let samples = samples.lock().expect("lock").clone();
    let in_window: Vec<_> = samples
        .iter()
        .filter(|(t, _, _)| *t >= window_start && *t <= window_end)
        .collect();
    let open_max = in_window.iter().map(|s| s.1).max();
    let open_min = in_window.iter().map(|s| s.1).min();
    let mut rss_window: Vec<u64> = in_window.iter().filter_map(|s| s.2).collect();
    rss_window.sort_unstable();
    let rss_max = rss_window.last().copied();
    let rss_median = rss_window.get(rss_window.len() / 2).copied();
    // One sample a second for the record.
    let series: Vec<Value> = samples
        .iter()
        .step_by(4)
        .map(|(t, open, rss)| json!([(t * 10.0).round() / 10.0, open, rss]))
        .collect();
    let heads = head_samples.lock().expect("lock").clone();
    let head_in_window: Vec<f64> = heads
        .iter()
        .filter(|(t, _)| *t >= window_start && *t <= window_end)
        .map(|(_, v)| *v)
        .collect();
    let head_max = heads.iter().map(|(_, v)| *v).reduce(f64::max);
    let window = window_end - window_start;
    let take = |m: &std::sync::Mutex<Vec<u64>>| std::mem::take(&mut *m.lock().expect("lock"));

    let probe = (probe_ms > 0).then(|| {
        let mut p = std::mem::take(&mut *probe_rec.lock().expect("lock"))
            .summary(window_end - window_start);
        p["every_ms"] = json!(probe_ms);
        p
    });
    let mut out = json!({
        "mode": "hostile",
        "probe": probe,
        "kinds": kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        "connections": connections,
        "duration_s": duration,
        "head_bytes": head_bytes,
        "trickle_ms": trickle_ms,
        "nofile_limit": nofile,
        "ramp_s": ramp_s,
        "ramped": ramped,
        "window_s": window,
        "open_max": open_max,
        "open_min": open_min,
        "open_at_end": open_at_end,
        "connects": stats.connects.load(Ordering::Relaxed),
        "connect_errors": stats.connect_errors.load(Ordering::Relaxed),
        "closes": stats.closes.load(Ordering::Relaxed),
        "closes_in_window": closes1 - closes0,
        "reconnects_per_s": (connects1 - connects0) as f64 / window,
        "closed_by": *stats.closed_by.lock().expect("lock"),
        "first_answers": stats.first_answers.lock().expect("lock").iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        "bytes_sent": stats.bytes_sent.load(Ordering::Relaxed),
    });
    let more = json!({
        "reconnect": spread_ms(take(&stats.reconnect_us)),
        "ready_again": spread_ms(take(&stats.ready_again_us)),
        "lifetime": spread_ms(take(&stats.lifetime_us)),
        "rss_before_kib": before_rss.map(|r| r.0),
        "hwm_before_kib": before_rss.map(|r| r.1),
        "rss_during_max_kib": rss_max,
        "rss_during_median_kib": rss_median,
        "rss_end_kib": end_rss.map(|r| r.0),
        "hwm_end_kib": end_rss.map(|r| r.1),
        "rss_after_kib": after_rss.map(|r| r.0),
        "hwm_after_kib": after_rss.map(|r| r.1),
        "after_s": after,
        "head_bytes_max": head_max,
        "head_bytes_window_max": head_in_window.iter().copied().reduce(f64::max),
        "head_bytes_samples": head_in_window.len(),
        "metrics_before": metrics_summary(before_metrics.as_ref(), None),
        "metrics_end": metrics_summary(end_metrics.as_ref(), before_metrics.as_ref()),
        "metrics_after": metrics_summary(after_metrics.as_ref(), before_metrics.as_ref()),
        "series": series,
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg_end,
    });
    if let (Value::Object(out), Value::Object(more)) = (&mut out, more) {
        out.extend(more);
    }
    out
}

// ---------------------------------------------------------------------------------------
// A counting proxy in front of the management API.

async fn proxy(args: &Args) -> Value {
    let listen: String = get(args, "listen", None);
    let upstream: String = get(args, "upstream", Some("127.0.0.1:15672".into()));
    let control: String = get(args, "control", None);
    let max_secs: u64 = get(args, "max-secs", Some(3600));
    let count = Arc::new(AtomicU64::new(0));
    let latency_us = Arc::new(AtomicU64::new(0));

    let listener = TcpListener::bind(&listen)
        .await
        .unwrap_or_else(|e| die(&format!("listen {listen}: {e}")));
    let control_listener = TcpListener::bind(&control)
        .await
        .unwrap_or_else(|e| die(&format!("listen {control}: {e}")));

    let (counter, latency) = (count.clone(), latency_us.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = control_listener.accept().await {
            let n = counter.load(Ordering::SeqCst);
            let l = latency.load(Ordering::SeqCst);
            let _ = s.write_all(format!("{n} {l}\n").as_bytes()).await;
        }
    });
    let (counter, latency) = (count.clone(), latency_us.clone());
    let serve = async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let (upstream, counter, latency) = (upstream.clone(), counter.clone(), latency.clone());
            // When the request now waiting for its answer was seen (HTTP/1.1: one at a time).
            let asked: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
            let asked_up = asked.clone();
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (mut ri, mut wi) = inbound.into_split();
                let (mut ro, mut wo) = outbound.into_split();
                let up = async move {
                    const PATTERN: &[u8] = b"GET /api/queues/";
                    let mut carry: Vec<u8> = Vec::new();
                    let mut chunk = vec![0u8; 16384];
                    loop {
                        let n = match ri.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        carry.extend_from_slice(&chunk[..n]);
                        let hits = carry
                            .windows(PATTERN.len())
                            .filter(|w| *w == PATTERN)
                            .count();
                        counter.fetch_add(hits as u64, Ordering::SeqCst);
                        if hits > 0 {
                            *asked_up.lock().expect("lock") = Some(Instant::now());
                        }
                        // Keep the tail that could start a match split across reads.
                        let keep = carry.len().min(PATTERN.len() - 1);
                        carry.drain(..carry.len() - keep);
                        if wo.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = wo.shutdown().await;
                };
                let down = async move {
                    let mut chunk = vec![0u8; 16384];
                    loop {
                        let n = match ro.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if let Some(at) = asked.lock().expect("lock").take() {
                            latency.fetch_add(at.elapsed().as_micros() as u64, Ordering::SeqCst);
                        }
                        if wi.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = wi.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(max_secs), serve).await;
    json!({"mode": "proxy", "admin_reads": count.load(Ordering::SeqCst)})
}
