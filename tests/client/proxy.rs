//! A counting HTTP proxy in front of the real gateway. Every request that reaches it is
//! logged (method, path, `Idempotency-Key`, a batch's entries, the status handed back), so
//! the tests count requests on the wire instead of trusting the client's own counters.
//!
//! It can also lose one answer on purpose: the send reaches the gateway (and is stored),
//! but the client gets a `504` page, as from a load balancer whose timer ran out first.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix_web::dev::ServerHandle;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use parking_lot::Mutex;

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    /// A batch request's entries' idempotency keys, in order (`None`: not a batch).
    pub batch: Option<Vec<Option<String>>>,
    pub authorization: bool,
    /// What the gateway answered the proxy (0: no answer).
    pub upstream: u16,
    /// What the proxy answered the client.
    pub status: u16,
}

struct State {
    upstream: String,
    http: reqwest::Client,
    log: Arc<Mutex<Vec<Seen>>>,
    lose_next_post_answer: Arc<AtomicBool>,
}

pub struct Proxy {
    pub address: String,
    log: Arc<Mutex<Vec<Seen>>>,
    lose_next_post_answer: Arc<AtomicBool>,
    handle: ServerHandle,
}

/// Headers that belong to one connection, not to the request or the answer.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "host" | "connection" | "keep-alive" | "content-length" | "transfer-encoding"
    )
}

async fn forward(req: HttpRequest, body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes()).unwrap();
    let mut out = state
        .http
        .request(method.clone(), format!("{}{}", state.upstream, path));
    for (name, value) in req.headers() {
        if !hop_by_hop(name.as_str()) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    let key = req
        .headers()
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let authorization = req.headers().contains_key("Authorization");
    let batch = req.uri().path().ends_with("/messages/batch").then(|| {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["messages"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|e| e["idempotency_key"].as_str().map(str::to_owned))
            .collect()
    });

    let mut upstream = 0;
    let mut response = match out.body(body.to_vec()).send().await {
        Ok(r) => {
            upstream = r.status().as_u16();
            let mut builder =
                HttpResponse::build(StatusCode::from_u16(r.status().as_u16()).unwrap());
            for (name, value) in r.headers() {
                if !hop_by_hop(name.as_str()) {
                    builder.insert_header((
                        HeaderName::from_bytes(name.as_str().as_bytes()).unwrap(),
                        HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                    ));
                }
            }
            builder.body(r.bytes().await.unwrap_or_default())
        }
        Err(e) => HttpResponse::BadGateway().body(format!("proxy: {e}")),
    };
    if method == reqwest::Method::POST && state.lose_next_post_answer.swap(false, Ordering::SeqCst)
    {
        // The gateway has answered (and stored the message); the client never learns it.
        response = HttpResponse::GatewayTimeout()
            .content_type("text/html")
            .body("<html><body>504 Gateway Time-out</body></html>");
    }
    state.log.lock().push(Seen {
        method: method.to_string(),
        path: req.uri().path().to_owned(),
        key,
        batch,
        authorization,
        upstream,
        status: response.status().as_u16(),
    });
    response
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        let log = Arc::new(Mutex::new(Vec::new()));
        let lose = Arc::new(AtomicBool::new(false));
        sendgate::tls::install_ring();
        let state = web::Data::new(State {
            upstream: upstream.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            log: log.clone(),
            lose_next_post_answer: lose.clone(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(web::PayloadConfig::new(4 << 20))
                .default_service(web::to(forward))
        })
        .workers(2)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Proxy {
            address: format!("http://127.0.0.1:{port}"),
            log,
            lose_next_post_answer: lose,
            handle,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().clone()
    }

    pub fn posts(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "POST")
            .collect()
    }

    /// Batch requests, each as its entries' keys.
    pub fn batches(&self) -> Vec<Vec<Option<String>>> {
        self.seen().into_iter().filter_map(|s| s.batch).collect()
    }

    /// `GET /health/detailed` requests: the client's lifecycle probes.
    pub fn probes(&self) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path == "/health/detailed")
            .count()
    }

    /// The next send reaches the gateway, but its answer is replaced by a 504 page.
    pub fn lose_next_post_answer(&self) {
        self.lose_next_post_answer.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The stop command is sent at once; nothing needs to wait for it to complete.
        drop(self.handle.stop(false));
    }
}
