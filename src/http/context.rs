//! One request context: the middleware that gives every request its id once, and the
//! [`RequestContext`] handlers take as an extractor.
//!
//! [`RequestIdentity`] (wrapped around the whole app) validates or creates `X-Request-Id`
//! before any handler runs, sets it on every answer (successes, refusals, and the 404/405
//! of the routing table alike), and serves the request with its log fields as the task's
//! current request ([`RequestFields`]: `request_id`, then `key` and `queue` once the handler
//! knows them), so every event logged while serving it names it (see `telemetry.rs`).

use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::HeaderValue;
use actix_web::{Error, FromRequest, HttpMessage, HttpRequest};
use tokio::task::futures::TaskLocalFuture;

use super::errors::{ApiError, FieldError, Problem};
use super::headers::{spelling, REQUEST_ID};
use crate::domain::{IdError, RequestId};
use crate::telemetry::RequestFields;

/// What every handler knows about its request before it starts. Cheap to clone: the
/// fields are shared, the rest is two small values.
#[derive(Clone)]
pub struct RequestContext {
    /// The id, and the queue and key once known: what the request's log lines carry.
    fields: RequestFields,
    /// The client sent this id itself (a valid `X-Request-Id`).
    given: bool,
    /// The client's `X-Request-Id` was not a valid id: it was replaced, and the send path
    /// reports it with the other input problems.
    header_problem: Option<IdError>,
}

impl RequestContext {
    /// The client's `X-Request-Id` when it is valid, else a fresh one (and the header's
    /// problem).
    fn from_header(value: Option<&HeaderValue>) -> Self {
        let (id, given, header_problem) = match value.map(parse_id) {
            None => (RequestId::generate(), false, None),
            Some(Ok(id)) => (id, true, None),
            Some(Err(e)) => (RequestId::generate(), false, Some(e)),
        };
        Self {
            fields: RequestFields::new(id),
            given,
            header_problem,
        }
    }

    /// A context for a request the middleware did not see (a bare test request).
    pub fn detached() -> Self {
        Self::from_header(None)
    }

    pub fn id(&self) -> &RequestId {
        self.fields.id()
    }

    /// The client chose this id (so it may stand in for a missing correlation id).
    pub fn id_given(&self) -> bool {
        self.given
    }

    /// The invalid `X-Request-Id`, as a field error for the send path's 400.
    pub fn header_problem(&self) -> Option<FieldError> {
        self.header_problem
            .as_ref()
            .map(|e| FieldError::new(&["header", spelling::REQUEST_ID], e.to_string()))
    }

    /// A refusal of this request.
    pub fn error(&self, problem: Problem) -> ApiError {
        ApiError::new(problem, self.id())
    }

    /// The authenticated key's name, on the request's log lines.
    pub fn record_key(&self, name: &str) {
        self.fields.record_key(name);
    }

    /// The queue the request is for, once it is known to be served.
    pub fn record_queue(&self, queue: &str) {
        self.fields.record_queue(queue);
    }
}

fn parse_id(value: &HeaderValue) -> Result<RequestId, IdError> {
    value
        .to_str()
        .map_err(|_| IdError::NotPrintable)
        .and_then(RequestId::parse)
}

/// The handler's view of the context [`RequestIdentity`] stored. A route outside the
/// middleware (a unit test's bare request) gets a fresh one rather than failing.
impl FromRequest for RequestContext {
    type Error = Error;
    type Future = Ready<Result<Self, Error>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let context = req.extensions().get::<RequestContext>().cloned();
        ready(Ok(context.unwrap_or_else(|| {
            RequestContext::from_header(req.headers().get(REQUEST_ID))
        })))
    }
}

/// The middleware: `App::new().wrap(RequestIdentity)`.
pub struct RequestIdentity;

impl<S, B> Transform<S, ServiceRequest> for RequestIdentity
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Transform = RequestIdentityService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RequestIdentityService { service }))
    }
}

pub struct RequestIdentityService<S> {
    service: S,
}

impl<S, B> Service<ServiceRequest> for RequestIdentityService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error>,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Future = WithRequestId<S::Future>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let client_value = req.headers().get(REQUEST_ID).cloned();
        let context = RequestContext::from_header(client_value.as_ref());
        // A valid client id goes back as the client sent it (no copy); a fresh one is
        // encoded once. A generated UUID is always a valid header value.
        let header = match client_value {
            Some(value) if context.id_given() => Some(value),
            _ => HeaderValue::from_str(context.id().as_str()).ok(),
        };
        let fields = context.fields.clone();
        req.extensions_mut().insert(context);
        // Routing runs inside `call`, the handler in the future: both as this request.
        let inner = fields.clone().sync_scope(|| self.service.call(req));
        WithRequestId {
            inner: fields.scope(inner),
            header,
        }
    }
}

pin_project_lite::pin_project! {
    /// The rest of the request, served as the current request; its answer gets
    /// `X-Request-Id`.
    pub struct WithRequestId<F> {
        #[pin]
        inner: TaskLocalFuture<RequestFields, F>,
        header: Option<HeaderValue>,
    }
}

impl<F, B> Future for WithRequestId<F>
where
    F: Future<Output = Result<ServiceResponse<B>, Error>>,
{
    type Output = Result<ServiceResponse<B>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Routing turns every handler's (and extractor's) error into a response before it
        // gets here, so each answer of the app passes through this point.
        let mut response = std::task::ready!(this.inner.poll(cx))?;
        if let Some(value) = this.header.take() {
            response.headers_mut().insert(REQUEST_ID, value);
        }
        Poll::Ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::current_fields;
    use actix_web::test::{call_service, init_service, read_body, TestRequest};
    use actix_web::{web, App};

    async fn answer(id: Option<&str>) -> (Option<String>, String) {
        let app = init_service(App::new().wrap(RequestIdentity).route(
            "/",
            web::get().to(|context: RequestContext| async move {
                let problem = context.header_problem().map(|e| e.msg);
                format!("{} {problem:?}", context.id())
            }),
        ))
        .await;
        let mut request = TestRequest::get().uri("/");
        if let Some(id) = id {
            request = request.insert_header((REQUEST_ID, id));
        }
        let response = call_service(&app, request.to_request()).await;
        let header = response
            .headers()
            .get(REQUEST_ID)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = String::from_utf8(read_body(response).await.to_vec()).unwrap();
        (header, body)
    }

    #[actix_web::test]
    async fn the_handler_sees_the_id_the_answer_carries() {
        assert_eq!(
            answer(Some("given-1")).await,
            (Some("given-1".into()), "given-1 None".into())
        );
        let (header, body) = answer(None).await;
        let header = header.expect("a fresh id");
        assert_eq!(body, format!("{header} None"));

        // An invalid id is replaced, and its problem kept for the send path.
        let (header, body) = answer(Some("")).await;
        let header = header.expect("a fresh id");
        assert!(!header.is_empty());
        assert_eq!(body, format!("{header} Some(\"must not be empty\")"));
    }

    #[actix_web::test]
    async fn the_handler_runs_as_the_current_request_and_nothing_else_does() {
        let app = init_service(App::new().wrap(RequestIdentity).route(
            "/",
            web::get().to(|context: RequestContext| async move {
                context.record_queue("requests");
                // A later poll of the same request still sees it.
                tokio::task::yield_now().await;
                context.record_key("batch");
                let mut seen = Vec::new();
                current_fields(|name, value| seen.push(format!("{name}={value}")));
                // Another task serves many requests: it logs without one.
                let elsewhere = tokio::task::spawn_local(async {
                    let mut n = 0;
                    current_fields(|_, _| n += 1);
                    n
                })
                .await
                .unwrap();
                format!("{} | {elsewhere}", seen.join(" "))
            }),
        ))
        .await;
        let request = TestRequest::get()
            .uri("/")
            .insert_header((REQUEST_ID, "r-1"))
            .to_request();
        let body = read_body(call_service(&app, request).await).await;
        assert_eq!(body, "request_id=r-1 queue=requests key=batch | 0");
        let mut outside = 0;
        current_fields(|_, _| outside += 1);
        assert_eq!(outside, 0, "after the request");
    }

    #[actix_web::test]
    async fn an_unrouted_request_gets_an_id_too() {
        let app = init_service(App::new().wrap(RequestIdentity)).await;
        let response = call_service(&app, TestRequest::get().uri("/nowhere").to_request()).await;
        assert_eq!(response.status(), 404);
        assert!(response.headers().contains_key(REQUEST_ID));
    }
}
