//! Unknown paths and wrong methods: answered from the routing table alone.

use actix_web::{HttpRequest, HttpResponse};

use super::errors::{ApiError, Problem};
use super::request_id;

pub async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(Problem::NotFound, &request_id(&req).0))
}

pub async fn only_post(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(
        Problem::MethodNotAllowed { allow: "POST" },
        &request_id(&req).0,
    ))
}

pub async fn only_get(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(
        Problem::MethodNotAllowed { allow: "GET" },
        &request_id(&req).0,
    ))
}
