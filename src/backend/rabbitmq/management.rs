//! RabbitMQ's admin plane: the management HTTP API, with its own credentials.
//!
//! `GET /api/queues/{vhost}/{queue}?columns=messages` answers `messages` (ready +
//! unacknowledged). `columns` keeps the answer a few bytes however much statistics history
//! the queue has. A user without the `management`/`monitoring` tag gets 401: the same
//! situation as a Service Bus key without the Manage claim, and counted the same way.

use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::time::Instant;

use crate::backend::DepthError;
use crate::config::Secret;
use crate::domain::QueueName;

/// What one read said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueCount {
    Messages(u64),
    /// No statistics for the queue yet (a queue declared a few seconds ago has no count
    /// fields, or is not listed at all): not a failure of the admin plane.
    NotReported,
}

pub struct Management {
    client: reqwest::Client,
    base: Url,
    vhost: String,
    user: String,
    password: Secret,
}

impl Management {
    /// `base` is checked by the configuration (an http(s) base URL).
    pub fn new(
        base: Url,
        vhost: &str,
        user: String,
        password: Secret,
    ) -> Result<Self, reqwest::Error> {
        crate::tls::install_ring();
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            client,
            base,
            vhost: vhost.to_owned(),
            user,
            password,
        })
    }

    fn queue_url(&self, queue: &QueueName) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // Each part is one segment: a vhost "/" becomes %2F.
            path.pop_if_empty()
                .extend(["api", "queues", self.vhost.as_str(), queue.as_str()]);
        }
        url.set_query(Some("columns=messages"));
        url
    }

    pub async fn count(
        &self,
        queue: &QueueName,
        deadline: Instant,
    ) -> Result<QueueCount, DepthError> {
        let timeout = deadline.saturating_duration_since(Instant::now());
        let request = self
            .client
            .get(self.queue_url(queue))
            .basic_auth(&self.user, Some(self.password.expose()))
            .timeout(timeout)
            .send();
        let response = tokio::time::timeout_at(deadline, request)
            .await
            .map_err(|_| DepthError::Timeout)?
            .map_err(|e| {
                if e.is_timeout() {
                    DepthError::Timeout
                } else {
                    DepthError::Failed(e.to_string())
                }
            })?;
        let status = response.status();
        let body = tokio::time::timeout_at(deadline, response.bytes())
            .await
            .map_err(|_| DepthError::Timeout)?
            .map_err(|e| DepthError::Failed(e.to_string()))?;
        match status {
            StatusCode::OK => parse_count(&body),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                Err(DepthError::Unauthorized(reason(&body)))
            }
            // The statistics database learns of a queue a moment after it is declared: a
            // 404 may mean "not yet", so the caller asks the data plane, which knows.
            StatusCode::NOT_FOUND => Ok(QueueCount::NotReported),
            other => Err(DepthError::Failed(format!(
                "management API answered {other}: {}",
                reason(&body)
            ))),
        }
    }
}

/// `{"messages": N}`; a queue without statistics yet answers `{}` (or `[]`: an empty
/// Erlang property list) and is "not reported", not a failure.
fn parse_count(body: &[u8]) -> Result<QueueCount, DepthError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| DepthError::Failed(format!("unexpected management answer: {e}")))?;
    match value.get("messages") {
        Some(n) => n
            .as_u64()
            .map(QueueCount::Messages)
            .ok_or_else(|| DepthError::Failed(format!("unexpected messages field: {n}"))),
        None if value.is_object() || value.as_array().is_some_and(|a| a.is_empty()) => {
            Ok(QueueCount::NotReported)
        }
        None => Err(DepthError::Failed("unexpected management answer".into())),
    }
}

/// The `reason` of a management API error body, or the start of the body.
fn reason(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        reason: Option<String>,
    }
    serde_json::from_slice::<ErrorBody>(body)
        .ok()
        .and_then(|b| b.reason)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_vhost_is_one_encoded_segment() {
        let m = Management::new(
            Url::parse("http://127.0.0.1:15672").unwrap(),
            "/",
            "u".into(),
            Secret::new("p"),
        )
        .unwrap();
        let url = m.queue_url(&QueueName::parse("requests").unwrap());
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:15672/api/queues/%2F/requests?columns=messages"
        );
        let m = Management::new(
            Url::parse("http://h:1/rabbit/").unwrap(),
            "prod",
            "u".into(),
            Secret::new("p"),
        )
        .unwrap();
        let url = m.queue_url(&QueueName::parse("q").unwrap());
        assert_eq!(
            url.as_str(),
            "http://h:1/rabbit/api/queues/prod/q?columns=messages"
        );
    }

    #[test]
    fn counts_parse_and_missing_statistics_are_not_failures() {
        assert_eq!(
            parse_count(br#"{"messages":12}"#),
            Ok(QueueCount::Messages(12))
        );
        assert_eq!(parse_count(b"{}"), Ok(QueueCount::NotReported));
        assert_eq!(parse_count(b"[]"), Ok(QueueCount::NotReported));
        assert!(parse_count(b"<html>").is_err());
        assert!(parse_count(br#"{"messages":"many"}"#).is_err());
        assert!(parse_count(b"[1]").is_err());
    }

    #[test]
    fn error_reasons_are_extracted() {
        assert_eq!(
            reason(br#"{"error":"not_authorised","reason":"Not management user"}"#),
            "Not management user"
        );
        assert_eq!(reason(b"plain"), "plain");
    }
}
