//! The Azure Service Bus backend: a thin REST client of our own (see the README for why
//! not the legacy `azure_messaging_servicebus` crate).
//!
//! - the endpoint and one credential per plane come resolved from `config::servicebus`;
//! - `auth`: SAS tokens (HMAC-SHA256) and Entra ID tokens, cached;
//! - `rest`: the pooled HTTP client, the two calls, status → error mapping;
//! - `atom`: the management endpoint's XML, parsed defensively.
//!
//! Sends are `POST {endpoint}/{queue}/messages`; the backlog is read from
//! `GET {endpoint}/{queue}?api-version=2021-05` (`CountDetails`), with the management
//! credential when one is set apart from the send credential.

pub mod atom;
pub mod auth;
pub mod batch;
pub mod rest;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{
    Backend, Backlog, DepthError, DepthLag, LagSource, OutgoingMessage, SendError, SendReceipt,
};
use crate::config::{CredentialPlan, ServiceBusSettings};
use crate::domain::QueueName;
use atom::EntityStatus;
use auth::{Credential, CredentialChain, EntraCredential, SasCredential, TokenError};
use rest::RestClient;

/// The management API version whose `QueueDescription` carries `CountDetails`.
pub const API_VERSION: &str = "2021-05";

/// How far the management counts (`CountDetails`) are assumed to trail the data plane: a
/// documented assumption, not a measurement. Service Bus publishes no refresh period for
/// them and no live namespace is reachable here to measure one (the tests run against a
/// stub), so this is a hedge on the safe side: sends completed this long before a read are
/// counted again on top of it, so the ceiling is reached a little early rather than
/// overshot. `/health/detailed` shows it with the source `default`.
const DEPTH_LAG: Duration = Duration::from_secs(1);

/// The settings are resolved and fine, but the client could not be set up (exit 1).
#[derive(Debug, thiserror::Error)]
#[error("servicebus: {0}")]
pub struct ServiceBusError(pub String);

pub struct ServiceBus {
    endpoint: String,
    rest: RestClient,
    send_credential: Credential,
    manage_credential: Credential,
}

impl ServiceBus {
    /// Set up the client from the resolved plan; nothing here touches the network.
    pub fn new(plan: &ServiceBusSettings) -> Result<Self, ServiceBusError> {
        let rest = RestClient::new().map_err(|e| ServiceBusError(e.to_string()))?;
        let needs_entra = [&plan.send, &plan.manage].contains(&&CredentialPlan::EntraId);
        // One Entra credential (and one token cache) for both planes: the scope is the same.
        let entra = if needs_entra {
            let chain = CredentialChain::from_environment(
                auth::ENTRA_SCOPE,
                plan.managed_identity_client_id.as_deref(),
            )
            .map_err(ServiceBusError)?;
            Some(Arc::new(EntraCredential::new(chain)))
        } else {
            None
        };
        let credential = |plan: &CredentialPlan| match (plan, &entra) {
            (CredentialPlan::Sas(connection), _) => {
                Ok(Credential::Sas(SasCredential::new(connection)))
            }
            (CredentialPlan::EntraId, Some(entra)) => Ok(Credential::Entra(entra.clone())),
            (CredentialPlan::EntraId, None) => Err(ServiceBusError(
                "Entra ID was planned but not set up".into(),
            )),
        };
        let bus = Self {
            send_credential: credential(&plan.send)?,
            manage_credential: credential(&plan.manage)?,
            endpoint: plan.endpoint.clone(),
            rest,
        };
        tracing::info!(
            event = "servicebus_configured",
            endpoint = %bus.endpoint,
            send_credential = %bus.send_credential.describe(),
            manage_credential = %bus.manage_credential.describe(),
            "Service Bus backend ready"
        );
        Ok(bus)
    }

    fn messages_url(&self, queue: &QueueName) -> String {
        // Queue names are letters, digits, '.', '-' and '_' (QueueName): nothing to escape.
        format!("{}/{}/messages", self.endpoint, queue.as_str())
    }

    fn description_url(&self, queue: &QueueName) -> String {
        format!(
            "{}/{}?api-version={API_VERSION}",
            self.endpoint,
            queue.as_str()
        )
    }
}

#[async_trait]
impl Backend for ServiceBus {
    fn kind(&self) -> &'static str {
        "servicebus"
    }

    async fn send(
        &self,
        message: OutgoingMessage,
        deadline: Instant,
    ) -> Result<SendReceipt, SendError> {
        let authorization = self
            .send_credential
            .authorization(&message.queue, deadline)
            .await
            .map_err(|e| match e {
                // No token in time: the message never left, so this is not an unknown
                // outcome (504) but a broker that cannot be used now.
                TokenError::Timeout => SendError::Unavailable("no Entra ID token in time".into()),
                TokenError::Unavailable(why) => SendError::AuthFailed(why),
            })?;
        // Never issued past its deadline (docs/fleet.md, A2).
        if Instant::now() >= deadline {
            return Err(SendError::Timeout);
        }
        let result = self
            .rest
            .send(
                &self.messages_url(&message.queue),
                &authorization,
                &message,
                deadline,
            )
            .await;
        if let Err(error) = &result {
            tracing::warn!(
                event = "servicebus_send_failed",
                queue = %message.queue,
                message_id = message.message_id.as_str(),
                error = %error,
                "Service Bus did not take the message"
            );
        }
        result
    }

    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError> {
        let authorization = self
            .manage_credential
            .authorization(queue, deadline)
            .await
            .map_err(|e| match e {
                TokenError::Timeout => DepthError::Timeout,
                TokenError::Unavailable(why) => DepthError::Unauthorized(why),
            })?;
        let runtime = self
            .rest
            .queue_runtime(&self.description_url(queue), &authorization, deadline)
            .await?;
        Ok(Backlog {
            messages: runtime.backlog(),
            send_disabled: runtime.status == EntityStatus::SendDisabled,
        })
    }

    fn depth_lag_in_force(&self) -> Option<DepthLag> {
        Some(DepthLag {
            lag: DEPTH_LAG,
            source: LagSource::Default,
        })
    }
}
