//! RabbitMQ's admin plane: the management HTTP API, with its own credentials.
//!
//! `GET /api/queues/{vhost}/{queue}?columns=messages` answers `messages` (ready +
//! unacknowledged). `columns` keeps the answer a few bytes however much statistics history
//! the queue has. A user without the `management`/`monitoring` tag gets 401: the same
//! situation as a Service Bus key without the Manage claim, and counted the same way.
//!
//! `GET /api/nodes?columns=name,uptime` measures how often those counts are refreshed
//! (`stats.rs`); it needs the `monitoring` tag, and without it the default refresh is kept.

use std::time::Duration;

use bytes::Bytes;
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::time::Instant;

use crate::backend::DepthError;
use crate::config::Secret;
use crate::domain::QueueName;

/// Why the refresh could not be measured now.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StatsError {
    #[error("the node list did not answer before its deadline")]
    Timeout,
    /// `/api/nodes` needs the `monitoring` (or `administrator`) tag.
    #[error("the management user may not list nodes (it needs the monitoring tag): {0}")]
    Unauthorized(String),
    #[error("the node list could not be read: {0}")]
    Failed(String),
    #[error("unexpected node list: {0}")]
    Malformed(String),
}

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

    /// `GET /api/nodes?columns=name,uptime`: each node's `uptime` as its statistics last
    /// reached the management API (see [`super::stats`]). Needs the `monitoring` tag.
    fn nodes_url(&self) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "nodes"]);
        }
        url.set_query(Some("columns=name,uptime"));
        url
    }

    /// One GET with the admin-plane credentials: the status and the whole body, by `deadline`.
    async fn get(&self, url: Url, deadline: Instant) -> Result<(StatusCode, Bytes), Unanswered> {
        let timeout = deadline.saturating_duration_since(Instant::now());
        let request = self
            .client
            .get(url)
            .basic_auth(&self.user, Some(self.password.expose()))
            .timeout(timeout)
            .send();
        let response = tokio::time::timeout_at(deadline, request)
            .await
            .map_err(|_| Unanswered::Timeout)?
            .map_err(|e| {
                if e.is_timeout() {
                    Unanswered::Timeout
                } else {
                    Unanswered::Failed(e.to_string())
                }
            })?;
        let status = response.status();
        let body = tokio::time::timeout_at(deadline, response.bytes())
            .await
            .map_err(|_| Unanswered::Timeout)?
            .map_err(|e| Unanswered::Failed(e.to_string()))?;
        Ok((status, body))
    }

    pub async fn count(
        &self,
        queue: &QueueName,
        deadline: Instant,
    ) -> Result<QueueCount, DepthError> {
        let (status, body) =
            self.get(self.queue_url(queue), deadline)
                .await
                .map_err(|e| match e {
                    Unanswered::Timeout => DepthError::Timeout,
                    Unanswered::Failed(why) => DepthError::Failed(why),
                })?;
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

    /// Each running node's last published `uptime`, in ms on that node's clock.
    pub async fn node_uptimes(&self, deadline: Instant) -> Result<Vec<NodeUptime>, StatsError> {
        let (status, body) = self
            .get(self.nodes_url(), deadline)
            .await
            .map_err(|e| match e {
                Unanswered::Timeout => StatsError::Timeout,
                Unanswered::Failed(why) => StatsError::Failed(why),
            })?;
        match status {
            StatusCode::OK => parse_uptimes(&body),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                Err(StatsError::Unauthorized(reason(&body)))
            }
            other => Err(StatsError::Failed(format!(
                "management API answered {other}: {}",
                reason(&body)
            ))),
        }
    }
}

/// Why a GET got no answer to look at.
enum Unanswered {
    Timeout,
    Failed(String),
}

/// One node of `GET /api/nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUptime {
    pub node: String,
    pub uptime_ms: u64,
}

/// `[{"name": "rabbit@h", "uptime": 639359}, …]`. A node without both (one that is down
/// answers `running: false` and no `uptime`; a malformed one) is left out, not a failure:
/// the others still measure. Anything but an array is a malformed answer.
fn parse_uptimes(body: &[u8]) -> Result<Vec<NodeUptime>, StatsError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| StatsError::Malformed(format!("not JSON: {e}")))?;
    let nodes = value
        .as_array()
        .ok_or_else(|| StatsError::Malformed("not a list of nodes".into()))?;
    Ok(nodes
        .iter()
        .filter_map(|n| {
            Some(NodeUptime {
                node: n.get("name")?.as_str()?.to_owned(),
                uptime_ms: n.get("uptime")?.as_u64()?,
            })
        })
        .collect())
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
    fn the_nodes_url_asks_for_names_and_uptimes_only() {
        let m = Management::new(
            Url::parse("http://h:1/rabbit/").unwrap(),
            "/",
            "u".into(),
            Secret::new("p"),
        )
        .unwrap();
        assert_eq!(
            m.nodes_url().as_str(),
            "http://h:1/rabbit/api/nodes?columns=name,uptime"
        );
    }

    #[test]
    fn uptimes_parse_and_odd_nodes_are_left_out_never_a_panic() {
        // What RabbitMQ 3.10.8 answers (one node; a down node has no uptime).
        assert_eq!(
            parse_uptimes(br#"[{"uptime":639359,"name":"rabbit@localhost"}]"#).unwrap(),
            [NodeUptime {
                node: "rabbit@localhost".into(),
                uptime_ms: 639359
            }]
        );
        let odd = br#"[{"name":"a","running":false},{"uptime":5},{"name":"b","uptime":"x"},
                      {"name":"c","uptime":-1},{"name":"d","uptime":1.5},7,null,
                      {"name":"e","uptime":10}]"#;
        assert_eq!(
            parse_uptimes(odd).unwrap(),
            [NodeUptime {
                node: "e".into(),
                uptime_ms: 10
            }]
        );
        assert_eq!(parse_uptimes(b"[]").unwrap(), []);
        for malformed in [
            &b"<html>"[..],
            b"",
            b"{}",
            br#"{"uptime":1}"#,
            b"null",
            b"[1",
        ] {
            assert!(
                matches!(parse_uptimes(malformed), Err(StatsError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(malformed)
            );
        }
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
