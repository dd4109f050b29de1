//! bare429: the floor for sendgate's rejection path. A bare actix-web server (the same
//! actix-web version, default worker count and keep-alive as sendgate) whose one handler
//! on sendgate's send route reads the body, parses it as JSON (into `IgnoredAny`, as
//! sendgate does) and answers `429` with `Retry-After` and a JSON error body of the same
//! shape as sendgate's `queue_full`. No auth, no lifecycle, no capacity gate.
//!
//! ```text
//! bare429 127.0.0.1:PORT [max-secs]
//! ```
//! Exits by itself after `max-secs` (default 1800).

use std::time::Duration;

use actix_web::http::header::RETRY_AFTER;
use actix_web::{web, App, HttpResponse, HttpServer};
use serde::Serialize;

#[derive(Serialize)]
struct QueueFull<'a> {
    code: &'static str,
    message: &'static str,
    request_id: &'a str,
    backlog: u64,
    limit: u64,
}

async fn send(_queue: web::Path<String>, body: web::Bytes) -> HttpResponse {
    match serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
        Ok(_) => HttpResponse::TooManyRequests()
            .insert_header((RETRY_AFTER, 1))
            .json(QueueFull {
                code: "queue_full",
                message: "The queue holds 10 messages against its ceiling of 1; sends resume once consumers take it down.",
                request_id: "00000000-0000-4000-8000-000000000000",
                backlog: 10,
                limit: 1,
            }),
        Err(e) => HttpResponse::BadRequest().body(e.to_string()),
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:18429".into());
    let max_secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1800);
    actix_web::rt::System::new().block_on(async move {
        let server = HttpServer::new(|| {
            App::new().route("/v1/queues/{queue}/messages", web::post().to(send))
        })
        .keep_alive(Duration::from_secs(75))
        .bind(&addr)?
        .run();
        let handle = server.handle();
        actix_web::rt::spawn(async move {
            actix_web::rt::time::sleep(Duration::from_secs(max_secs)).await;
            handle.stop(false).await;
        });
        server.await
    })
}
