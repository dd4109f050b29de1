//! The embedded queue under the README's walk-through: producers sending through the
//! gateway while workers receive from the same database in other threads.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sendgate::backend::embedded::Store;

use sendgate_testkit::embedded::spawn_app_with;

const SENDERS: usize = 8;
const RECEIVERS: usize = 2;
const RUN_FOR: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn senders_are_never_refused_while_competing_workers_each_take_a_message_once() {
    let app = spawn_app_with(&[("SERVICEBUS_SEND_MAX_QUEUE_DEPTH", "1000000")]).await;
    let stop = Arc::new(AtomicBool::new(false));

    let receivers: Vec<_> = (0..RECEIVERS)
        .map(|_| {
            let (dir, stop) = (app.data_dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut store = Store::open(&dir).expect("the worker opens the queue");
                let mut got = Vec::new();
                loop {
                    // Read the flag before receiving: after the senders stopped, one more
                    // round empties the queue.
                    let last_round = stop.load(Ordering::SeqCst);
                    let n = store
                        .receive("requests", 16, |m| {
                            got.push(m.message_id.clone());
                            Ok(())
                        })
                        .expect("a receive never fails beside a busy writer");
                    if last_round && n == 0 {
                        return got;
                    }
                    if n == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            })
        })
        .collect();

    let started = Instant::now();
    let senders: Vec<_> = (0..SENDERS)
        .map(|s| {
            let (client, url) = (app.client.clone(), app.url("/v1/queues/requests/messages"));
            tokio::spawn(async move {
                let mut answers: HashMap<u16, Vec<String>> = HashMap::new();
                let mut i = 0;
                while started.elapsed() < RUN_FOR {
                    let key = format!("s{s}-m{i}");
                    i += 1;
                    let status = client
                        .post(&url)
                        .header("Content-Type", "application/json")
                        .header("Idempotency-Key", &key)
                        .body("{}")
                        .send()
                        .await
                        .expect("the gateway answers")
                        .status()
                        .as_u16();
                    answers.entry(status).or_default().push(key);
                }
                answers
            })
        })
        .collect();
    let mut accepted = BTreeSet::new();
    let mut refused: HashMap<u16, usize> = HashMap::new();
    for s in senders {
        for (status, keys) in s.await.unwrap() {
            if status == 201 {
                accepted.extend(keys);
            } else {
                *refused.entry(status).or_default() += keys.len();
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut received = Vec::new();
    for r in receivers {
        received.extend(r.join().expect("the worker ends"));
    }

    assert!(
        refused.is_empty(),
        "sends refused beside the workers: {refused:?}"
    );
    assert!(
        accepted.len() > 100,
        "only {} sends in {RUN_FOR:?}",
        accepted.len()
    );
    let unique: BTreeSet<String> = received.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        received.len(),
        "a message was handed out twice"
    );
    assert_eq!(
        unique, accepted,
        "every acknowledged message, received exactly once"
    );
}
