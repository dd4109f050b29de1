//! Hostile clients on raw sockets: what a browser or an HTTP library would never send.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{spawn_app_with, TestApp};

/// Write `request` as is on a fresh connection and read the answer until the server closes
/// or 5 s pass.
pub async fn exchange(app: &TestApp, request: &str) -> String {
    let addr = app.address.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
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
