//! Open mode's defence against web pages (DNS rebinding).
//!
//! Without API keys on a loopback listener (what `cargo run` does), anything that can reach
//! 127.0.0.1 may use every route. A browser on the same machine can, for a page of any
//! origin: a cross-site form cannot send `Content-Type: application/json` (so sends and
//! admin routes need it), and DNS rebinding points a foreign name at 127.0.0.1 so the
//! page's requests look same-origin — but they still carry the foreign name in `Host`.
//! So in that mode only loopback `Host` names are served: `localhost` (and `*.localhost`,
//! which resolve to loopback only), and loopback addresses. With keys, a page cannot add
//! the `Authorization` header cross-site, so nothing is checked here; with
//! `SENDGATE_AUTH=none` the operator opened a network listener on purpose and the names it
//! is reached by are not known, so nothing is checked either (see docs/api.md, "Open mode").

use std::net::IpAddr;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::HOST;
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage, ResponseError};

use super::context::RequestContext;
use super::errors::Problem;

/// Whether requests must name a loopback host; chosen once at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCheck {
    Off,
    LoopbackOnly,
}

/// The middleware (`middleware::from_fn(loopback_hosts_only(check))`'s body): refuse a
/// foreign `Host` with `403 forbidden_host` before routing, so no route is reachable.
pub async fn refuse_foreign_hosts(
    check: HostCheck,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    if check == HostCheck::LoopbackOnly && !names_loopback(&req) {
        let context = req.extensions().get::<RequestContext>().cloned();
        let refusal = match context {
            Some(c) => c.error(Problem::ForbiddenHost),
            None => RequestContext::detached().error(Problem::ForbiddenHost),
        };
        return Ok(req.into_response(refusal.error_response()));
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_boxed_body)
}

/// The host the request names is a loopback name: its target's (an absolute-form target
/// names the host, and `Host` is then ignored: RFC 9112 §3.2.2), else its `Host`. A request
/// naming no host at all (HTTP/1.0) is not a browser's, and passes.
fn names_loopback(req: &ServiceRequest) -> bool {
    if let Some(authority) = req.uri().authority() {
        // The host alone: a userinfo (`127.0.0.1@evil.example`) names nothing.
        return is_loopback_host(authority.host());
    }
    match req.headers().get(HOST) {
        Some(value) => value.to_str().is_ok_and(is_loopback_host),
        None => true,
    }
}

/// `localhost`, `*.localhost`, `127.x.y.z` or `[::1]`, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = strip_port(host.trim());
    if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return v6.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// `name:port` → `name`; a bracketed IPv6 literal keeps its brackets.
fn strip_port(host: &str) -> &str {
    match host.rfind(':') {
        Some(i) if host[i + 1..].bytes().all(|b| b.is_ascii_digit()) && !host[..i].is_empty() => {
            let name = &host[..i];
            // An unbracketed IPv6 address has colons of its own: no port to strip.
            if name.contains(':') && !name.starts_with('[') {
                host
            } else {
                name
            }
        }
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test as http_test;
    use actix_web::{web, App, HttpResponse};

    /// The status a request naming `host` gets through the guard in front of a route
    /// that answers 200 (no `host`: a request with no Host header at all).
    async fn status_through(check: HostCheck, host: Option<&str>) -> u16 {
        let app = http_test::init_service(
            App::new()
                .wrap(actix_web::middleware::from_fn(move |req, next| {
                    refuse_foreign_hosts(check, req, next)
                }))
                .route("/", web::get().to(HttpResponse::Ok)),
        )
        .await;
        let mut req = http_test::TestRequest::get().uri("/");
        if let Some(host) = host {
            req = req.insert_header((HOST, host));
        }
        http_test::call_service(&app, req.to_request())
            .await
            .status()
            .as_u16()
    }

    #[actix_web::test]
    async fn loopback_only_refuses_a_foreign_host_before_the_route_and_passes_loopback() {
        let only = HostCheck::LoopbackOnly;
        assert_eq!(status_through(only, Some("evil.example")).await, 403);
        assert_eq!(status_through(only, Some("localhost:8080")).await, 200);
        assert_eq!(
            status_through(only, None).await,
            200,
            "no Host: not a browser"
        );
        assert_eq!(
            status_through(HostCheck::Off, Some("evil.example")).await,
            200
        );
    }

    #[actix_web::test]
    async fn without_a_host_header_the_uris_authority_is_checked() {
        let app = http_test::init_service(
            App::new()
                .wrap(actix_web::middleware::from_fn(move |req, next| {
                    refuse_foreign_hosts(HostCheck::LoopbackOnly, req, next)
                }))
                .default_service(web::to(HttpResponse::Ok)),
        )
        .await;
        for (uri, status) in [
            ("http://evil.example/", 403),
            ("http://evil.example:8080/x", 403),
            ("http://localhost:8080/", 200),
            ("http://[::1]/", 200),
        ] {
            let req = http_test::TestRequest::get().uri(uri).to_request();
            assert!(req.headers().get(HOST).is_none());
            let got = http_test::call_service(&app, req).await.status().as_u16();
            assert_eq!(got, status, "{uri}");
        }
    }

    #[actix_web::test]
    async fn a_host_header_that_is_not_text_is_refused() {
        let app = http_test::init_service(
            App::new()
                .wrap(actix_web::middleware::from_fn(move |req, next| {
                    refuse_foreign_hosts(HostCheck::LoopbackOnly, req, next)
                }))
                .route("/", web::get().to(HttpResponse::Ok)),
        )
        .await;
        let value = actix_web::http::header::HeaderValue::from_bytes(b"local\xffhost").unwrap();
        let req = http_test::TestRequest::get()
            .uri("/")
            .insert_header((HOST, value))
            .to_request();
        assert_eq!(
            http_test::call_service(&app, req).await.status().as_u16(),
            403
        );
    }

    #[test]
    fn loopback_names_and_addresses_pass() {
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "localhost.",
            "app.localhost:80",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:9",
            "[::1]",
            "[::1]:8080",
            "::1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn foreign_names_and_addresses_are_refused() {
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "10.0.0.1:8080",
            "0.0.0.0:8080",
            "[::]:8080",
            "[2001:db8::1]:80",
            "",
            ":8080",
            "[::1",
            "notlocalhost",
        ] {
            assert!(!is_loopback_host(host), "{host:?}");
        }
    }
}
