//! Hostile clients on raw sockets: what a browser or an HTTP library would never send.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{spawn_app_with, TestApp};

/// Write `request` as is on a fresh connection and read the answer until the server closes
/// or 5 s pass.
pub async fn exchange(app: &TestApp, request: &str) -> String {
    let mut stream = connect(app).await;
    stream.write_all(request.as_bytes()).await.unwrap();
    read_answer(&mut stream, Duration::from_secs(5)).await
}

/// RFC 9112 §3.2.2: with an absolute-form target the server uses the target's host and
/// ignores `Host`, so that is the name open mode must find loopback.
#[tokio::test]
async fn in_open_mode_the_host_of_an_absolute_form_target_is_the_one_checked() {
    let app = spawn_app_with(&[]).await;
    for target in [
        "http://evil.example/health/detailed",
        "http://evil.example:8080/health/detailed",
        "http://127.0.0.1@evil.example/health/detailed",
    ] {
        let answer = exchange(
            &app,
            &format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{target}: {answer}");
    }
    let answer = exchange(
        &app,
        "GET http://127.0.0.1/health/detailed HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the target names loopback, Host is ignored: {answer}"
    );
}

/// A body nested deeper than `SENDGATE_MAX_JSON_DEPTH` (128 by default, serde_json's own
/// limit) is a 400 naming the limit; at the limit it is queued.
#[tokio::test]
async fn a_body_nested_deeper_than_the_limit_is_refused_and_names_it() {
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let app = spawn_app_with(&[]).await;
    assert_eq!(app.send("requests", &nested(128)).await.status(), 201);
    let response = app.send("requests", &nested(129)).await;
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    let reason = body["errors"][0]["msg"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("deeper than 128"), "{body}");
    assert_eq!(app.stored("requests"), 1);

    let app = spawn_app_with(&[("SENDGATE_MAX_JSON_DEPTH", "3")]).await;
    assert_eq!(app.send("requests", r#"{"a":[{}]}"#).await.status(), 201);
    let response = app.send("requests", r#"{"a":[{"b":[]}]}"#).await;
    assert_eq!(response.status(), 400);
}

async fn connect(app: &TestApp) -> tokio::net::TcpStream {
    let addr = app.address.trim_start_matches("http://").to_owned();
    tokio::net::TcpStream::connect(addr).await.unwrap()
}

/// Reads until the head of an answer arrived, the server closed, or `within` passed.
async fn read_answer(stream: &mut tokio::net::TcpStream, within: Duration) -> String {
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

const LIVE: &[u8] = b"GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// A connection that served one request, then trickles the next head a byte every 100 ms:
/// each byte re-armed actix-http's keep-alive timer and no deadline applied; now the head
/// has `SENDGATE_HEADER_TIMEOUT_MS` from its first byte.
#[tokio::test]
async fn a_head_trickled_on_a_reused_connection_is_cut_with_408_at_the_header_deadline() {
    let app = spawn_app_with(&[("SENDGATE_HEADER_TIMEOUT_MS", "600")]).await;
    let mut stream = connect(&app).await;
    stream.write_all(LIVE).await.unwrap();
    assert!(read_answer(&mut stream, Duration::from_secs(2))
        .await
        .starts_with("HTTP/1.1 200"));
    let started = std::time::Instant::now();
    let mut cut = false;
    for b in b"GET /health/live HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if stream.write_all(&[*b]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut probe = [0u8; 1];
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(1), stream.peek(&mut probe)).await
        {
            cut = true;
            break;
        }
    }
    assert!(cut, "still open after {:?}", started.elapsed());
    let answer = read_answer(&mut stream, Duration::from_secs(1)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "cut after {took:?}");
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("sendgate_connections_closed_total{reason=\"header_timeout\"} 1"),
        "{metrics}"
    );
}

/// Every connection the limit allows held idle (each served a request, as a flood that
/// wants to stay would): a normal client's send is still answered, at once, by closing
/// the one idle longest.
#[tokio::test]
async fn with_every_connection_held_idle_a_new_client_is_served_at_once() {
    let app = spawn_app_with(&[("SENDGATE_MAX_CONNECTIONS", "50")]).await;
    let mut held = Vec::new();
    for _ in 0..50 {
        let mut stream = connect(&app).await;
        stream.write_all(LIVE).await.unwrap();
        assert!(read_answer(&mut stream, Duration::from_secs(2))
            .await
            .starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let started = std::time::Instant::now();
    let client = reqwest::Client::new();
    let response = client
        .post(app.url("/v1/queues/requests/messages"))
        .header("Content-Type", "application/json")
        .body("{}")
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // The first one held, idle longest, was closed to make room.
    let mut first = held.remove(0);
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), first.read(&mut buf))
        .await
        .expect("closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
}

/// A head past `SENDGATE_MAX_HEAD_BYTES` is 431 and closed at once, not held until the
/// head deadline.
#[tokio::test]
async fn a_head_past_its_limit_is_refused_at_once_with_431() {
    let app = spawn_app_with(&[("SENDGATE_MAX_HEAD_BYTES", "2048")]).await;
    let mut stream = connect(&app).await;
    let head = format!("GET /health/live HTTP/1.1\r\nX-Big: {}", "a".repeat(3000));
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let answer = read_answer(&mut stream, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// One peer address gets `SENDGATE_MAX_CONNECTIONS_PER_PEER` connections; the next is
/// closed at once.
#[tokio::test]
async fn one_peer_is_held_to_its_cap() {
    let app = spawn_app_with(&[("SENDGATE_MAX_CONNECTIONS_PER_PEER", "3")]).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = connect(&app).await;
        stream.write_all(LIVE).await.unwrap();
        assert!(read_answer(&mut stream, Duration::from_secs(2))
            .await
            .starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let mut fourth = connect(&app).await;
    let _ = fourth.write_all(LIVE).await;
    assert_eq!(
        read_answer(&mut fourth, Duration::from_secs(2)).await,
        "",
        "closed without an answer"
    );
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = connect(&app).await;
    again.write_all(LIVE).await.unwrap();
    assert!(read_answer(&mut again, Duration::from_secs(2))
        .await
        .starts_with("HTTP/1.1 200"));
}
