//! Unknown paths and wrong methods: answered from the routing table alone (`404 not_found`;
//! `405 method_not_allowed` with `Allow`).

use actix_web::HttpResponse;

use super::context::RequestContext;
use super::errors::{ApiError, Problem};

pub async fn not_found(context: RequestContext) -> Result<HttpResponse, ApiError> {
    Err(context.error(Problem::NotFound))
}

pub async fn only_post(context: RequestContext) -> Result<HttpResponse, ApiError> {
    Err(context.error(Problem::MethodNotAllowed { allow: "POST" }))
}

pub async fn only_get(context: RequestContext) -> Result<HttpResponse, ApiError> {
    Err(context.error(Problem::MethodNotAllowed { allow: "GET" }))
}

pub async fn get_or_patch(context: RequestContext) -> Result<HttpResponse, ApiError> {
    Err(context.error(Problem::MethodNotAllowed {
        allow: "GET, PATCH",
    }))
}
