//! The embedded backend keeps a message's attributes and honours them, seen from outside:
//! sends through the real gateway with the `Message-*` headers, and `sendgate queue` run
//! as the real binary beside it.

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use sendgate_testkit::embedded::spawn_in;
use sendgate_testkit::gateway::{body_json, run_binary, stderr};

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// `sendgate queue <args> --queue requests` on `data_dir`, which must succeed.
fn queue(data_dir: &str, args: &[&str]) -> Output {
    let mut all = vec!["queue"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--queue", "requests"]);
    let out = run_binary(&all, &[("SENDGATE_DATA_DIR", data_dir)]);
    assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    out
}

fn received(data_dir: &str) -> Vec<Value> {
    String::from_utf8_lossy(&queue(data_dir, &["receive", "--max", "10"]).stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

fn depth(data_dir: &str) -> u64 {
    String::from_utf8_lossy(&queue(data_dir, &["depth"]).stdout)
        .trim()
        .parse()
        .expect("depth prints a number")
}

fn parse_time(v: &Value) -> OffsetDateTime {
    OffsetDateTime::parse(v.as_str().expect("a time is a string"), &Rfc3339)
        .expect("an RFC 3339 time")
}

#[tokio::test]
async fn queue_receive_prints_every_attribute_and_the_trace_properties() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let app = spawn_in(dir.path(), &[]).await;
    let sent = app
        .send_with(
            "requests",
            r#"{"order": 7}"#,
            &[
                ("X-Correlation-Id", "c-1"),
                ("traceparent", TRACEPARENT),
                ("tracestate", "vendor=1"),
                ("Message-Subject", "order.created"),
                ("Message-Session-Id", "customer-7"),
                ("Message-Partition-Key", "customer-7"),
                ("Message-Time-To-Live", "3600"),
                // In the past: enqueued at once, the time printed in UTC.
                (
                    "Message-Scheduled-Enqueue-Time",
                    "2020-01-01T01:00:00+01:00",
                ),
                ("Message-Reply-To", "replies"),
                ("Message-To", "billing"),
                (
                    "Message-Properties",
                    r#"{"priority":"high","attempt":3,"ratio":0.5,"whole":2.0,"urgent":true}"#,
                ),
            ],
        )
        .await;
    assert_eq!(sent.status(), 201);
    let answer = body_json(sent).await;
    let traceparent = answer["traceparent"].as_str().unwrap().to_owned();
    assert!(
        traceparent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
        "the request's trace: {traceparent}"
    );
    assert_eq!(depth(&data), 1);

    let lines = received(&data);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let mut line = lines[0].clone();
    let enqueued_at = parse_time(&line["enqueued_at"]);
    let expires_at = parse_time(&line["expires_at"]);
    assert_eq!(expires_at - enqueued_at, time::Duration::seconds(3600));
    let line = line.as_object_mut().unwrap();
    for generated in ["enqueued_at", "expires_at"] {
        line.remove(generated);
    }
    assert_eq!(
        Value::Object(line.clone()),
        json!({
            "queue": "requests",
            "message_id": answer["message_id"],
            "correlation_id": "c-1",
            "delivery_count": 1,
            "subject": "order.created",
            "session_id": "customer-7",
            "partition_key": "customer-7",
            "time_to_live_s": 3600,
            "scheduled_enqueue_time": "2020-01-01T00:00:00Z",
            "reply_to": "replies",
            "to": "billing",
            "properties": {
                "priority": "high",
                "attempt": 3,
                "ratio": 0.5,
                "whole": 2.0,
                "urgent": true,
                "traceparent": traceparent,
                "tracestate": "vendor=1",
                "Diagnostic-Id": traceparent,
            },
            "body": {"order": 7},
        })
    );
    assert!(
        line["properties"]["whole"].is_f64(),
        "a float stays a float: {}",
        line["properties"]["whole"]
    );
    assert_eq!(depth(&data), 0);
}

#[tokio::test]
async fn a_message_without_attributes_prints_only_the_trace_properties() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let app = spawn_in(dir.path(), &[]).await;
    let sent = app.send("requests", "1").await;
    assert_eq!(sent.status(), 201);
    let traceparent = body_json(sent).await["traceparent"].clone();
    let line = received(&data).remove(0);
    let mut keys: Vec<&str> = line
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "body",
            "correlation_id",
            "delivery_count",
            "enqueued_at",
            "message_id",
            "properties",
            "queue"
        ]
    );
    assert_eq!(
        line["properties"],
        json!({"traceparent": traceparent, "Diagnostic-Id": traceparent})
    );
}

#[tokio::test]
async fn a_scheduled_message_is_received_only_from_its_time_and_counted_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let app = spawn_in(dir.path(), &[]).await;
    // Whole seconds, 2 s ahead at least.
    let now = OffsetDateTime::now_utc();
    let at = (now + time::Duration::seconds(3))
        .replace_nanosecond(0)
        .unwrap();
    let at_text = at.format(&Rfc3339).unwrap();
    let sent = app
        .send_with(
            "requests",
            r#""later""#,
            &[("Message-Scheduled-Enqueue-Time", at_text.as_str())],
        )
        .await;
    assert_eq!(sent.status(), 201);
    assert_eq!(app.send("requests", r#""now""#).await.status(), 201);

    assert_eq!(depth(&data), 2, "a scheduled message counts in the backlog");
    let early = received(&data);
    assert!(
        OffsetDateTime::now_utc() < at,
        "the machine was too slow for the test to prove anything"
    );
    assert_eq!(early.len(), 1, "{early:?}");
    assert_eq!(early[0]["body"], "now");
    assert_eq!(depth(&data), 1, "still counted while scheduled");

    let give_up = Instant::now() + Duration::from_secs(15);
    let later = loop {
        let lines = received(&data);
        if !lines.is_empty() {
            break lines;
        }
        assert!(Instant::now() < give_up, "the scheduled message never came");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        OffsetDateTime::now_utc() >= at,
        "received before its scheduled time"
    );
    assert_eq!(later.len(), 1);
    assert_eq!(later[0]["body"], "later");
    assert_eq!(later[0]["scheduled_enqueue_time"], at_text.as_str());
    assert_eq!(depth(&data), 0);
}

#[tokio::test]
async fn an_expired_message_leaves_the_backlog_and_is_never_received() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let app = spawn_in(dir.path(), &[]).await;
    let sending = Instant::now();
    let sent = app
        .send_with("requests", "1", &[("Message-Time-To-Live", "2")])
        .await;
    assert_eq!(sent.status(), 201);
    // Stored between `sending` and now.
    let stored_by = Instant::now();
    assert_eq!(app.send("requests", "2").await.status(), 201);
    assert_eq!(depth(&data), 2, "counted until it expires");
    assert!(
        sending.elapsed() < Duration::from_secs(2),
        "the machine was too slow for the test to prove anything"
    );
    tokio::time::sleep_until((stored_by + Duration::from_millis(2_050)).into()).await;
    assert_eq!(depth(&data), 1, "the expired message left the backlog");
    let lines = received(&data);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["body"], 2);
}
