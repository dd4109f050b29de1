//! producers: the client-side scenarios of `./bench/run.sh` (issue 15). One JSON line each.
//!
//! ```text
//! producers amplify --addr 127.0.0.1:P --queue Q --ceiling N [--token T] [--producers 16]
//!                   [--duration 60] [--consume-rate 200] [--sample-ms 100]
//!                   [--amqp-url amqp://guest:guest@127.0.0.1:5672/%2f]
//! producers restart --sendgate BIN --port P --data-dir D --queue Q [--producers 4]
//!                   [--rate 25] [--duration 20] [--restart-at 6] [--concurrency 4]
//!                   [--ceiling 1000000] [--log-dir DIR]
//! ```
//!
//! - `amplify` (retry amplification): `producers` tasks, each with its own
//!   `sendgate_client::Client` (its own retry budget, as independent producers have), send
//!   one message after another to a queue held over its ceiling, while a consumer takes
//!   messages off the RabbitMQ queue at a fixed rate (`basic.get`, no ack: the rate is
//!   exact and never banked while the queue is empty) and a sampler reads the queue's exact
//!   depth (passive `queue.declare`) every `sample-ms`. Reports HTTP requests (sends and
//!   probes) per accepted message, Jain's fairness index over the producers' accepted
//!   counts, and the depth's maximum against the ceiling. Sends still waiting when the
//!   window closes are abandoned (their requests counted, their messages not).
//! - `restart` (restart under load): `producers` `sendgate send` processes, each fed one
//!   JSON line per message at `rate` per second on its stdin (each message gets its own
//!   `Idempotency-Key` from the CLI), against a gateway on the embedded backend that this
//!   tool starts, stops with SIGTERM at `restart-at` (a drain) and starts again on the
//!   same port and data directory. The gateway's ceiling (`--ceiling`) is set far above
//!   what the window sends: nothing consumes the queue here, and a queue at its ceiling
//!   (the default 2,000) answers `429 queue_full`, which is comparison 7's subject, not a
//!   restart's. Then every stored message is taken off the queue
//!   (`sendgate queue receive`) and counted: failed (not queued by the CLI), stored twice,
//!   missing (queued but not stored), and the longest wait from a line written to its
//!   outcome printed.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use sendgate_client::{Client, ClientConfig, SendOutcome};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
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
    eprintln!("producers: {msg}");
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
        die("usage: producers amplify|restart --key value ...");
    };
    let args = parse_args(rest);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(get(&args, "threads", Some(2)))
        .enable_all()
        .build()
        .expect("tokio runtime");
    let out = runtime.block_on(async {
        match mode.as_str() {
            "amplify" => amplify(&args).await,
            "restart" => restart(&args).await,
            other => die(&format!("unknown mode {other:?}")),
        }
    });
    println!("{out}");
}

fn loadavg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Jain's fairness index: 1 when every producer got the same, 1/n when one got it all.
fn jain(xs: &[u64]) -> Option<f64> {
    let sum: f64 = xs.iter().map(|&x| x as f64).sum();
    let squares: f64 = xs.iter().map(|&x| (x as f64) * (x as f64)).sum();
    (squares > 0.0).then(|| sum * sum / (xs.len() as f64 * squares))
}

// ---------------------------------------------------------------------------------------
// Retry amplification.

async fn amplify(args: &Args) -> Value {
    let loadavg_before = loadavg_1m();
    let addr: String = get(args, "addr", None);
    let queue: String = get(args, "queue", None);
    let ceiling: u64 = get(args, "ceiling", None);
    let token = args.get("token").cloned();
    let producers: usize = get(args, "producers", Some(16));
    let duration = Duration::from_secs_f64(get(args, "duration", Some(60.0)));
    let consume_rate: f64 = get(args, "consume-rate", Some(200.0));
    let sample = Duration::from_millis(get(args, "sample-ms", Some(100)));
    let url: String = get(
        args,
        "amqp-url",
        Some("amqp://guest:guest@127.0.0.1:5672/%2f".into()),
    );

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

    let start = Instant::now();
    let end = start + duration;
    let stop = Arc::new(AtomicBool::new(false));

    // The consumer: `consume_rate` messages a second, no more, and no credit for the
    // moments the queue was empty.
    let consumed = Arc::new(AtomicU64::new(0));
    let consumer_task = tokio::spawn({
        let (queue, consumed, stop) = (queue.clone(), consumed.clone(), stop.clone());
        async move {
            let mut owed = 0.0f64;
            let mut last = Instant::now();
            let mut errors = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                owed = (owed + consume_rate * (now - last).as_secs_f64()).min(consume_rate);
                last = now;
                while owed >= 1.0 {
                    match consumer
                        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                        .await
                    {
                        Ok(Some(_)) => {
                            owed -= 1.0;
                            consumed.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => {
                            owed = 0.0;
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
            errors
        }
    });

    // The sampler: the queue's exact depth (ready messages; the consumer never holds any).
    let sampler_task = tokio::spawn({
        let (queue, stop) = (queue.clone(), stop.clone());
        async move {
            let mut depths = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(q) = sampler
                    .queue_declare(
                        queue.as_str().into(),
                        QueueDeclareOptions {
                            passive: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                {
                    depths.push(u64::from(q.message_count()));
                }
                tokio::time::sleep(sample).await;
            }
            depths
        }
    });

    // Each producer counts what it got accepted inside the window; the tasks are
    // aborted when it closes, mid-send or mid-wait.
    let mut clients = Vec::with_capacity(producers);
    let mut counts = Vec::with_capacity(producers);
    let mut tasks = Vec::with_capacity(producers);
    // Why messages failed: the last answer's code and why the client gave up.
    let failed_reasons: Arc<std::sync::Mutex<HashMap<String, u64>>> = Arc::default();
    for p in 0..producers {
        let reasons = failed_reasons.clone();
        let mut config = ClientConfig::new(format!("http://{addr}"));
        config.token = token.clone();
        let client = Client::new(config).unwrap_or_else(|e| die(&format!("client: {e}")));
        let count = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        clients.push(client.clone());
        counts.push(count.clone());
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            for n in 1u64.. {
                let body = format!("{{\"p\":{p},\"n\":{n}}}");
                let slot = match client.send(&queue, body, None).await {
                    SendOutcome::Queued { .. } if Instant::now() <= end => 0,
                    SendOutcome::Queued { .. } => continue,
                    SendOutcome::Failed {
                        last_error,
                        gave_up,
                        ..
                    } => {
                        *reasons
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .entry(format!("{} ({gave_up})", last_error.code()))
                            .or_default() += 1;
                        1
                    }
                    _ => 2,
                };
                count[slot].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep_until(end).await;
    for t in &tasks {
        t.abort();
    }
    let per_producer: Vec<u64> = counts
        .iter()
        .map(|c| c[0].load(Ordering::Relaxed))
        .collect();
    let per_producer_failed: Vec<u64> = counts
        .iter()
        .map(|c| c[1].load(Ordering::Relaxed))
        .collect();
    let per_producer_requests: Vec<u64> = clients
        .iter()
        .map(|c| c.stats().requests + c.stats().probes)
        .collect();
    let failed: u64 = per_producer_failed.iter().sum();
    let other: u64 = counts.iter().map(|c| c[2].load(Ordering::Relaxed)).sum();
    let (mut requests, mut probes, mut retries, mut budget_refusals, mut deferrals) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    for c in &clients {
        let s = c.stats();
        requests += s.requests;
        probes += s.probes;
        retries += s.retries;
        budget_refusals += s.budget_refusals;
        deferrals += s.deferrals;
    }
    stop.store(true, Ordering::Relaxed);
    let consumer_errors = consumer_task.await.unwrap_or(0);
    let depths = sampler_task.await.unwrap_or_default();
    let _ = connection.close(200, "done".into()).await;

    let accepted: u64 = per_producer.iter().sum();
    let secs = duration.as_secs_f64();
    let depth_max = depths.iter().copied().max();
    let mean_depth = if depths.is_empty() {
        None
    } else {
        Some(depths.iter().sum::<u64>() as f64 / depths.len() as f64)
    };
    json!({
        "mode": "amplify",
        "producers": producers,
        "duration_s": secs,
        "consume_rate": consume_rate,
        "accepted": accepted,
        "accepted_per_s": accepted as f64 / secs,
        "per_producer": per_producer,
        "per_producer_failed": per_producer_failed,
        "failed_reasons": *failed_reasons.lock().unwrap_or_else(|e| e.into_inner()),
        "per_producer_requests": per_producer_requests,
        "jain": jain(&per_producer),
        "failed_messages": failed,
        "other_outcomes": other,
        "requests": requests,
        "probes": probes,
        "http_requests": requests + probes,
        "requests_per_accepted": (accepted > 0).then(|| (requests + probes) as f64 / accepted as f64),
        "requests_per_s": (requests + probes) as f64 / secs,
        "retries": retries,
        "budget_refusals": budget_refusals,
        "deferrals": deferrals,
        "consumed": consumed.load(Ordering::Relaxed),
        "consumer_errors": consumer_errors,
        "ceiling": ceiling,
        "depth_max": depth_max,
        "depth_mean": mean_depth,
        "depth_samples": depths.len(),
        "depth_over_ceiling": depths.iter().filter(|&&d| d > ceiling).count(),
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg_1m(),
    })
}

// ---------------------------------------------------------------------------------------
// Restart under load.

async fn restart(args: &Args) -> Value {
    let loadavg_before = loadavg_1m();
    let bin: String = get(args, "sendgate", None);
    let port: u16 = get(args, "port", None);
    let data_dir: String = get(args, "data-dir", None);
    let queue: String = get(args, "queue", Some("requests".into()));
    let producers: usize = get(args, "producers", Some(4));
    let rate: f64 = get(args, "rate", Some(25.0));
    let duration = Duration::from_secs_f64(get(args, "duration", Some(20.0)));
    let restart_at = Duration::from_secs_f64(get(args, "restart-at", Some(6.0)));
    let concurrency: u16 = get(args, "concurrency", Some(4));
    let log_dir = args.get("log-dir").cloned();
    let ceiling: u64 = get(args, "ceiling", Some(1_000_000));

    let gateway = |n: u32| {
        let mut cmd = Command::new(&bin);
        cmd.env("SENDGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("SENDGATE_BACKEND", "embedded")
            .env("SENDGATE_DATA_DIR", &data_dir)
            .env("SENDGATE_QUEUES", &queue)
            .env("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", ceiling.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        match log_dir
            .as_ref()
            .and_then(|d| std::fs::File::create(format!("{d}/restart-gateway-{n}.log")).ok())
        {
            Some(f) => cmd.stderr(f),
            None => cmd.stderr(Stdio::null()),
        };
        cmd.kill_on_drop(true);
        cmd.spawn()
            .unwrap_or_else(|e| die(&format!("cannot start {bin}: {e}")))
    };
    let mut old = gateway(1);
    if !ready(port, Duration::from_secs(30)).await {
        die("the gateway did not become ready");
    }

    let start = Instant::now();
    let end = start + duration;
    let mut runs = Vec::with_capacity(producers);
    for p in 0..producers {
        let mut child = Command::new(&bin)
            .args([
                "send",
                "--url",
                &format!("http://127.0.0.1:{port}"),
                "--queue",
                &queue,
            ])
            .args(["--concurrency", &concurrency.to_string(), "-"])
            .env_remove("SENDGATE_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| die(&format!("cannot start {bin} send: {e}")));
        let mut stdin = child.stdin.take().expect("piped stdin");
        let stderr = child.stderr.take().expect("piped stderr");
        // Line k (from 1) is written at start + (k-1)/rate, staggered per producer.
        let writer = tokio::spawn(async move {
            let offset = Duration::from_secs_f64(p as f64 / (rate * producers as f64));
            let mut written = Vec::new();
            for k in 0u64.. {
                let at = start + offset + Duration::from_secs_f64(k as f64 / rate);
                if at >= end {
                    break;
                }
                tokio::time::sleep_until(at).await;
                let line = format!("{{\"p\":{p},\"n\":{}}}\n", k + 1);
                if stdin.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
                written.push(Instant::now());
            }
            drop(stdin);
            written
        });
        // `line N: queued as …` or `line N: failed …`, one per message, as they end; the
        // whole of it also kept in `restart-cli-P.log` for reading afterwards.
        let mut cli_log = log_dir
            .as_ref()
            .and_then(|d| std::fs::File::create(format!("{d}/restart-cli-{p}.log")).ok());
        let reader = tokio::spawn(async move {
            let mut outcomes: HashMap<u64, (Instant, bool)> = HashMap::new();
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Some(f) = cli_log.as_mut() {
                    let at = (Instant::now() - start).as_secs_f64();
                    let _ = std::io::Write::write_all(f, format!("{at:8.3} {l}\n").as_bytes());
                }
                let Some(rest) = l.strip_prefix("line ") else {
                    continue;
                };
                let Some((n, what)) = rest.split_once(": ") else {
                    continue;
                };
                if let Ok(n) = n.parse::<u64>() {
                    outcomes.insert(n, (Instant::now(), what.starts_with("queued")));
                }
            }
            outcomes
        });
        runs.push((child, writer, reader));
    }

    // The rolling restart: SIGTERM (a drain), the old process exits, a new one starts on
    // the same port and data.
    tokio::time::sleep_until(start + restart_at).await;
    let term_at = Instant::now();
    signal_term(&old);
    let drained = tokio::time::timeout(Duration::from_secs(60), old.wait()).await;
    let exited_at = Instant::now();
    let old_status = drained.ok().and_then(|r| r.ok()).and_then(|s| s.code());
    let mut new = gateway(2);
    let back = ready(port, Duration::from_secs(30)).await;
    let ready_at = Instant::now();

    let (mut sent, mut queued, mut not_queued, mut no_outcome) = (0u64, 0u64, 0u64, 0u64);
    let mut waits_ms = Vec::new();
    let mut queued_keys = Vec::new();
    let mut exit_codes = Vec::new();
    for (p, (mut child, writer, reader)) in runs.into_iter().enumerate() {
        let written = writer.await.unwrap_or_default();
        // The CLI's deadline is 120 s: bounded well past it.
        let status = tokio::time::timeout(Duration::from_secs(180), child.wait()).await;
        if status.is_err() {
            let _ = child.start_kill();
        }
        exit_codes.push(status.ok().and_then(|r| r.ok()).and_then(|s| s.code()));
        let outcomes = reader.await.unwrap_or_default();
        sent += written.len() as u64;
        for (k, at) in written.iter().enumerate() {
            let n = k as u64 + 1;
            match outcomes.get(&n) {
                Some((done, ok)) => {
                    waits_ms.push((*done - *at).as_secs_f64() * 1000.0);
                    if *ok {
                        queued += 1;
                        queued_keys.push((p as u64, n));
                    } else {
                        not_queued += 1;
                    }
                }
                None => no_outcome += 1,
            }
        }
    }
    signal_term(&new);
    let _ = tokio::time::timeout(Duration::from_secs(60), new.wait()).await;

    // Everything stored, taken off the queue and counted by (producer, line).
    let received = Command::new(&bin)
        .args(["queue", "receive", "--queue", &queue, "--max", "100000000"])
        .args(["--data-dir", &data_dir])
        .stderr(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| die(&format!("queue receive: {e}")));
    let mut stored: HashMap<(u64, u64), u64> = HashMap::new();
    for line in String::from_utf8_lossy(&received.stdout).lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let (Some(p), Some(n)) = (v["body"]["p"].as_u64(), v["body"]["n"].as_u64()) else {
            continue;
        };
        *stored.entry((p, n)).or_default() += 1;
    }
    let stored_total: u64 = stored.values().sum();
    let stored_twice = stored.values().filter(|&&c| c > 1).count();
    let missing = queued_keys
        .iter()
        .filter(|k| !stored.contains_key(k))
        .count();
    waits_ms.sort_by(|a, b| a.total_cmp(b));
    let pct = |q: f64| -> Option<f64> {
        (!waits_ms.is_empty()).then(|| {
            let i = ((q * waits_ms.len() as f64).ceil() as usize).clamp(1, waits_ms.len()) - 1;
            waits_ms[i]
        })
    };
    json!({
        "mode": "restart",
        "producers": producers,
        "rate_per_producer": rate,
        "duration_s": duration.as_secs_f64(),
        "restart_at_s": restart_at.as_secs_f64(),
        "ceiling": ceiling,
        "sent": sent,
        "queued": queued,
        "failed_messages": not_queued + no_outcome,
        "failed_with_outcome": not_queued,
        "no_outcome": no_outcome,
        "stored": stored_total,
        "stored_distinct": stored.len(),
        "stored_twice": stored_twice,
        "missing": missing,
        "longest_wait_ms": waits_ms.last(),
        "p50_wait_ms": pct(0.50),
        "p99_wait_ms": pct(0.99),
        "drain_ms": (exited_at - term_at).as_secs_f64() * 1000.0,
        "downtime_ms": (ready_at - term_at).as_secs_f64() * 1000.0,
        "old_exit_code": old_status,
        "restarted": back,
        "cli_exit_codes": exit_codes,
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg_1m(),
    })
}

/// SIGTERM through kill(1): the bench crate keeps no libc binding of its own.
fn signal_term(child: &Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
}

/// Poll `/health/ready` until it answers 200 (true) or `within` passes (false).
async fn ready(port: u16, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await {
            let req = "GET /health/ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            if s.write_all(req.as_bytes()).await.is_ok() {
                let mut buf = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
                if buf.starts_with(b"HTTP/1.1 200") {
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
