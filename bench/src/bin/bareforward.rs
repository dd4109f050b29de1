//! bareforward: the floor for any HTTP-to-AMQP gateway on this machine. A bare actix-web
//! server (the same actix-web version, default worker count and keep-alive as sendgate)
//! whose one handler on sendgate's send route reads the body, parses it as JSON
//! (`IgnoredAny`), publishes it with lapin exactly as sendgate's RabbitMQ backend does
//! (one connection, 4 publisher channels with confirms, round robin; persistent,
//! `mandatory`, `content_type`, a generated `message_id`, default exchange, the path's
//! queue as routing key), awaits the confirm and answers `201` with a small JSON body.
//! No auth, no lifecycle, no capacity gate, no in-flight limit, no breaker, no deadline,
//! no metrics.
//!
//! ```text
//! bareforward 127.0.0.1:PORT [amqp-url] [max-secs]
//! ```
//! Exits by itself after `max-secs` (default 1800).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde::Serialize;

struct Link {
    publishers: Vec<Channel>,
    next: AtomicUsize,
    seq: AtomicU64,
}

#[derive(Serialize)]
struct Queued<'a> {
    status: &'static str,
    queue: &'a str,
    message_id: &'a str,
}

async fn send(queue: web::Path<String>, body: web::Bytes, link: web::Data<Link>) -> HttpResponse {
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
        return HttpResponse::BadRequest().body(e.to_string());
    }
    let n = link.seq.fetch_add(1, Ordering::Relaxed);
    let id = format!("00000000-0000-4000-8000-{n:012x}");
    let channel =
        &link.publishers[link.next.fetch_add(1, Ordering::Relaxed) % link.publishers.len()];
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_message_id(id.as_str().into());
    let outcome = async {
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
    .await;
    match outcome {
        Ok(Confirmation::Ack(None)) => HttpResponse::Created().json(Queued {
            status: "queued",
            queue: queue.as_str(),
            message_id: &id,
        }),
        Ok(other) => HttpResponse::BadGateway().body(format!("{other:?}")),
        Err(e) => HttpResponse::BadGateway().body(e.to_string()),
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:18730".into());
    let url = args
        .next()
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let max_secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1800);
    actix_web::rt::System::new().block_on(async move {
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .map_err(std::io::Error::other)?;
        let mut publishers = Vec::new();
        for _ in 0..4 {
            let channel = connection
                .create_channel()
                .await
                .map_err(std::io::Error::other)?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(std::io::Error::other)?;
            publishers.push(channel);
        }
        let link = web::Data::new(Link {
            publishers,
            next: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(link.clone())
                .route("/v1/queues/{queue}/messages", web::post().to(send))
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
