//! A memory alarm on a RabbitMQ node of the test's own, under steady load (issue 40, item 1).
//!
//! RabbitMQ blocks a connection only when it publishes during an alarm: the publish that
//! trips it never completes until the alarm clears, and the connection then reports itself
//! blocked. Contract §1: a blocked broker is busy, `503 backend_busy` with `Retry-After`, at
//! once. What must never happen is the cycle the issue saw: the sends stuck at the alarm's
//! onset taken for a wedged connection (`amqp_wedged`), the blocked connection replaced by
//! one that does not know the broker is blocking, and the next sends published into the
//! alarm again, each ending `504` after the whole deadline and stored once it clears.
//!
//! The node is private (its own name, ports, data and cookie), so the alarm touches no
//! other test and the shared broker is never stopped or alarmed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sendgate_testkit::gateway::GatewayProcess;
use sendgate_testkit::rabbit_node::RabbitNode;

const SENDERS: usize = 8;
const SEND_TIMEOUT_MS: u64 = 3000;
const ALARM: Duration = Duration::from_secs(10);
const ALARMS: usize = 3;
/// How long past the send's deadline a request may go unanswered before it is counted so.
const UNANSWERED: Duration = Duration::from_secs(5);

/// One answer: when the request started (since the test began), how long it took, the
/// status and the body's code.
#[derive(Debug, Clone)]
struct Answer {
    at: Duration,
    took: Duration,
    status: u16,
    code: String,
    retry_after: bool,
}

async fn sender(
    gateway: Arc<GatewayProcess>,
    queue: String,
    epoch: Instant,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
) {
    let url = gateway.url(&format!("/v1/queues/{queue}/messages"));
    while !stop.load(Ordering::Relaxed) {
        let at = epoch.elapsed();
        let sent = gateway
            .client
            .post(&url)
            .header("Content-Type", "application/json")
            .body("{}")
            .timeout(Duration::from_millis(SEND_TIMEOUT_MS) + UNANSWERED)
            .send()
            .await;
        let took = epoch.elapsed() - at;
        let Ok(response) = sent else {
            // Not answered long past the send's deadline: recorded as status 0.
            answers.lock().push(Answer {
                at,
                took,
                status: 0,
                code: "unanswered".into(),
                retry_after: false,
            });
            continue;
        };
        let status = response.status().as_u16();
        let retry_after = response.headers().contains_key("Retry-After");
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let code = body["code"].as_str().unwrap_or("").to_owned();
        answers.lock().push(Answer {
            at,
            took,
            status,
            code,
            retry_after,
        });
        // A steady load, not a flood: the queue has no consumer.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// sendgate as a process on `node`, serving `queue`, logging to `log`, with `more` variables.
async fn start_gateway(
    node: &RabbitNode,
    queue: &str,
    log: &PathBuf,
    more: &[(&str, &str)],
) -> GatewayProcess {
    let timeout = SEND_TIMEOUT_MS.to_string();
    let url = node.amqp_url();
    let mut vars = vec![
        ("SENDGATE_BACKEND", "rabbitmq"),
        ("SENDGATE_QUEUES", queue),
        ("SENDGATE_RABBITMQ_URL", url.as_str()),
        ("SENDGATE_RABBITMQ_DEPTH_SOURCE", "amqp"),
        ("SENDGATE_SEND_TIMEOUT_MS", timeout.as_str()),
        ("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1000000"),
    ];
    vars.extend_from_slice(more);
    GatewayProcess::start_logging_to(&vars, std::fs::File::create(log).unwrap()).await
}

fn by_code<'a>(answers: impl Iterator<Item = &'a Answer>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in answers {
        *counts
            .entry(format!("{} {}", a.status, a.code))
            .or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_alarm_under_load_is_503_backend_busy_throughout_never_a_wedge() {
    let node = RabbitNode::start();
    let queue = format!(
        "sg-alarm-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    // Outside the node's folder, so a failed run leaves it to read.
    let log = std::env::temp_dir().join(format!("{queue}-gateway.log"));
    let gateway = Arc::new(start_gateway(&node, &queue, &log, &[]).await);
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            tokio::spawn(sender(
                gateway.clone(),
                queue.clone(),
                epoch,
                stop.clone(),
                answers.clone(),
            ))
        })
        .collect();

    let mut alarms = Vec::new();
    let mut recovered = Vec::new();
    for _ in 0..ALARMS {
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The window is what is surely inside the alarm: from the command that raised it
        // returning to the one that clears it starting.
        let raise = epoch.elapsed();
        node.alarm(true);
        let on = epoch.elapsed();
        tokio::time::sleep(ALARM).await;
        let off = epoch.elapsed();
        node.alarm(false);
        let cleared = epoch.elapsed();
        alarms.push((raise, on, off));
        let since = Instant::now();
        loop {
            let first = answers
                .lock()
                .iter()
                .filter(|a| a.status == 201 && a.at >= off)
                .map(|a| a.at + a.took)
                .min();
            if let Some(first) = first {
                recovered.push((first.saturating_sub(off), first.saturating_sub(cleared)));
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "no 201 after the alarm: {:?} (log {log:?})",
                by_code(answers.lock().iter().filter(|a| a.at >= off))
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.await.unwrap();
    }
    let answers = answers.lock().clone();
    let created = answers.iter().filter(|a| a.status == 201).count() as u64;
    let wedged = std::fs::read_to_string(&log)
        .unwrap()
        .matches("amqp_wedged")
        .count();
    let stored = node.messages(&queue);
    let mut report = String::new();
    let mut failures = Vec::new();
    for (i, (raise, on, off)) in alarms.iter().enumerate() {
        let during: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.at >= *on && a.at < *off)
            .collect();
        // From the raising command's start to the first 201 after: the onset included.
        let whole: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.at >= *raise && a.at < *off + recovered[i].0)
            .collect();
        let longest = whole.iter().map(|a| a.took).max().unwrap_or_default();
        let longest_busy = whole
            .iter()
            .filter(|a| a.code == "backend_busy")
            .map(|a| a.took)
            .max()
            .unwrap_or_default();
        // What the gateway could not yet know: sends that began before the first busy
        // answer of this alarm (the publishes that tripped the block).
        let first_busy = during
            .iter()
            .filter(|a| a.code == "backend_busy")
            .map(|a| a.at + a.took)
            .min()
            .unwrap_or(*off);
        let after_known = || during.iter().filter(|a| a.at >= first_busy);
        report += &format!(
            "alarm {i}: {:?} with the onset; inside it {:?} (after the first busy answer: \
             {:?}); longest {longest:?} (a busy answer: {longest_busy:?}); first 201 {:?} after the \
             clearing command began ({:?} after it returned)\n",
            by_code(whole.iter().copied()),
            by_code(during.iter().copied()),
            by_code(after_known().copied()),
            recovered[i].0,
            recovered[i].1,
        );
        if let Some(bad) = after_known().find(|a| a.code != "backend_busy" || !a.retry_after) {
            failures.push(format!(
                "alarm {i}: {bad:?} once the broker was known blocked"
            ));
        }
        // Only the publishes that tripped the block may end at their deadline.
        let timeouts = whole.iter().filter(|a| a.status == 504).count();
        if timeouts > SENDERS {
            failures.push(format!("alarm {i}: {timeouts} answers 504"));
        }
        if longest > Duration::from_millis(SEND_TIMEOUT_MS + 500) {
            failures.push(format!("alarm {i}: a send took {longest:?}"));
        }
        if recovered[i].0 > Duration::from_secs(5) {
            failures.push(format!("alarm {i}: first 201 {:?} after", recovered[i].0));
        }
    }
    report +=
        &format!("amqp_wedged logged {wedged} times; stored {stored}, acknowledged {created}\n");
    eprintln!("{report}");
    assert_eq!(
        wedged, 0,
        "a blocked broker taken for a wedged connection\n{report}"
    );
    assert!(failures.is_empty(), "{failures:#?}\n{report}");
    assert!(
        stored >= created && stored - created <= (SENDERS * ALARMS) as u64,
        "only the sends in flight at an alarm's onset (504, outcome unknown) may be stored \
         without a 201\n{report}"
    );
    let _ = std::fs::remove_file(&log);
}

/// A gateway that connects during an alarm knows the broker blocks before it publishes a
/// send: every send is answered busy at once, none is published into the alarm (so none is
/// stored without its 201), and the first send after the alarm is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_made_during_an_alarm_publishes_no_send_into_it() {
    let node = RabbitNode::start();
    node.alarm(true);
    let queue = format!(
        "sg-alarm-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let log = std::env::temp_dir().join(format!("{queue}-gateway.log"));
    let gateway = start_gateway(&node, &queue, &log, &[]).await;
    let url = gateway.url(&format!("/v1/queues/{queue}/messages"));
    let send = || {
        gateway
            .client
            .post(&url)
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
    };
    let mut during = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let response = send().await.unwrap();
        let took = started.elapsed();
        let after = response.headers().contains_key("Retry-After");
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        during.push((
            status,
            body["code"].as_str().unwrap_or("").to_owned(),
            after,
            took,
        ));
    }
    let cleared = Instant::now();
    node.alarm(false);
    let mut created = 0;
    loop {
        if send().await.unwrap().status() == 201 {
            created += 1;
            break;
        }
        assert!(
            cleared.elapsed() < Duration::from_secs(15),
            "no 201 after the alarm"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = cleared.elapsed();
    for _ in 0..5 {
        created += u64::from(send().await.unwrap().status() == 201);
    }
    let stored = node.messages(&queue);
    eprintln!("during the alarm: {during:?}; first 201 {first:?} after the clearing command began");
    for (status, code, after, took) in &during {
        assert_eq!(
            (*status, code.as_str(), *after),
            (503, "backend_busy", true),
            "{during:?}"
        );
        assert!(*took < Duration::from_secs(1), "{during:?}");
    }
    assert_eq!(stored, created, "nothing stored without its 201");
    let _ = std::fs::remove_file(&log);
}

/// Leftover of issue 40: the exact depth source (`amqp`, a passive declare) with fail-closed
/// on. An alarm is `503 backend_busy` throughout, never `503 capacity_unknown`: the broker
/// blocks only a connection that publishes, and the depth is read on one that never does,
/// so the reads go on during the alarm (the queue's streak of failed reads stays 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_amqp_depth_and_fail_closed_an_alarm_is_busy_throughout_and_the_depth_still_read()
{
    let node = RabbitNode::start();
    let queue = format!(
        "sg-alarm-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let log = std::env::temp_dir().join(format!("{queue}-gateway.log"));
    let gateway = start_gateway(
        &node,
        &queue,
        &log,
        &[("SERVICEBUS_SEND_FAILCLOSED", "true")],
    )
    .await;
    let url = gateway.url(&format!("/v1/queues/{queue}/messages"));
    let send = || {
        gateway
            .client
            .post(&url)
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 201);
    node.alarm(true);
    let on = Instant::now();
    let mut answers = Vec::new();
    let mut most_failures = 0;
    while on.elapsed() < Duration::from_secs(8) {
        let response = send().await.unwrap();
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        answers.push((status, body["code"].as_str().unwrap_or("").to_owned()));
        let detailed = gateway.detailed().await;
        let failures = detailed["queues"][&queue]["consecutive_failures"]
            .as_u64()
            .unwrap_or(u64::MAX);
        most_failures = most_failures.max(failures);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.alarm(false);
    let cleared = Instant::now();
    while send().await.unwrap().status() != 201 {
        assert!(
            cleared.elapsed() < Duration::from_secs(15),
            "no 201 after the alarm"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut counts = BTreeMap::<String, usize>::new();
    for (status, code) in &answers {
        *counts.entry(format!("{status} {code}")).or_insert(0) += 1;
    }
    eprintln!(
        "during the alarm: {counts:?}; the most failed depth reads in a row {most_failures}; \
         first 201 {:?} after the clearing command returned",
        cleared.elapsed()
    );
    // The first send publishes into the alarm and ends at its deadline (504): the broker
    // tells a connection it blocks only once it publishes. Every other is busy.
    let after_first = &answers[1..];
    assert!(
        after_first
            .iter()
            .all(|(status, code)| (*status, code.as_str()) == (503, "backend_busy")),
        "{counts:?}"
    );
    assert_eq!(most_failures, 0, "a depth read failed during the alarm");
    let _ = std::fs::remove_file(&log);
}
