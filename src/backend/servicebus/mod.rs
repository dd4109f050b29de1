//! The Azure Service Bus backend: a thin REST client of our own (see docs/backends.md for why
//! not the legacy `azure_messaging_servicebus` crate).
//!
//! - the endpoint and one credential per plane come resolved from `config::servicebus`;
//! - `auth`: SAS tokens (HMAC-SHA256) and Entra ID tokens, cached;
//! - `rest`: the pooled HTTP client, the two calls, status → error mapping;
//! - `single`: the Send Message form, for a single send without application properties
//!   (the one form that carries a content type);
//! - `batch`: the Send Message Batch form every other send takes, and how a batch is split;
//! - `atom`: the management endpoint's XML, parsed defensively;
//! - `arm`: the ARM depth source's queue resource (Reader suffices), parsed defensively.
//!
//! Sends are `POST {endpoint}/{queue}/messages`, in the single form when the message fits
//! it, else in the batch form (a single send then a batch of one); the backlog is read from
//! `GET {endpoint}/{queue}?api-version=2021-05` (`CountDetails`), with the management
//! credential when one is set apart from the send credential, or with the ARM depth source
//! from `GET {arm}{namespace id}/queues/{queue}` (`countDetails`) with a token for ARM.

pub mod arm;
pub mod atom;
pub mod auth;
pub mod batch;
pub mod rest;
pub mod single;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{
    Backend, Backlog, DepthError, DepthLag, LagSource, OutgoingMessage, SendError, SendReceipt,
};
use crate::config::{CredentialPlan, ServiceBusDepthSource, ServiceBusSettings};
use crate::domain::{Attributes, Field, QueueName};
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

/// The most REST calls of one batch in flight at once: enough that a batch of many
/// sessions does not wait on each call in turn, few enough that one batch does not take
/// the connection pool (and the namespace's throttling credits) from the sends beside it.
pub const MAX_CALLS_AT_ONCE: usize = 4;

/// The settings are resolved and fine, but the client could not be set up (exit 1).
#[derive(Debug, thiserror::Error)]
#[error("servicebus: {0}")]
pub struct ServiceBusError(pub String);

pub struct ServiceBus {
    endpoint: String,
    rest: RestClient,
    send_credential: Credential,
    depth: DepthReader,
    /// One call's JSON body at most (the tier's batch limit).
    max_batch_bytes: usize,
}

/// Where and with what a queue's backlog is read.
enum DepthReader {
    /// The namespace's management endpoint, with the management plane's credential.
    Management(Credential),
    /// Azure Resource Manager: `{queues_url}/{queue}`, a bearer for ARM's scope.
    Arm {
        queues_url: String,
        credential: Arc<EntraCredential>,
    },
}

impl DepthReader {
    fn describe(&self) -> String {
        match self {
            Self::Management(credential) => format!("management ({})", credential.describe()),
            Self::Arm { queues_url, .. } => format!("arm ({queues_url})"),
        }
    }
}

impl ServiceBus {
    /// Set up the client from the resolved plan; nothing here touches the network. Entra ID
    /// tokens come from the environment's chain (workload identity, managed identity, the
    /// Azure CLI).
    pub fn new(plan: &ServiceBusSettings) -> Result<Self, ServiceBusError> {
        let client_id = plan.managed_identity_client_id.clone();
        Self::with_entra(plan, move |scope| {
            CredentialChain::from_environment(scope, client_id.as_deref())
        })
    }

    /// As [`Self::new`], with `entra` making the Entra ID credential chain for a token
    /// scope (Service Bus's, and ARM's for the ARM depth source).
    pub fn with_entra(
        plan: &ServiceBusSettings,
        entra: impl Fn(String) -> Result<CredentialChain, String>,
    ) -> Result<Self, ServiceBusError> {
        let rest = RestClient::new().map_err(|e| ServiceBusError(e.to_string()))?;
        let (send_credential, manage_credential) = plane_credentials(plan, &entra)?;
        let depth = match &plan.depth_source {
            ServiceBusDepthSource::Management => DepthReader::Management(manage_credential),
            ServiceBusDepthSource::Arm {
                endpoint,
                namespace_id,
            } => DepthReader::Arm {
                queues_url: format!("{endpoint}{namespace_id}/queues"),
                credential: Arc::new(EntraCredential::new(
                    entra(format!("{endpoint}/.default")).map_err(ServiceBusError)?,
                )),
            },
        };
        let bus = Self {
            send_credential,
            depth,
            endpoint: plan.endpoint.clone(),
            max_batch_bytes: plan.max_batch_bytes,
            rest,
        };
        tracing::info!(
            event = "servicebus_configured",
            endpoint = %bus.endpoint,
            send_credential = %bus.send_credential.describe(),
            depth_source = %bus.depth.describe(),
            max_batch_bytes = bus.max_batch_bytes,
            "Service Bus backend ready"
        );
        Ok(bus)
    }

    fn messages_url(&self, queue: &QueueName) -> String {
        // Queue names are letters, digits, '.', '-' and '_' (QueueName): nothing to escape.
        format!("{}/{}/messages", self.endpoint, queue.as_str())
    }

    /// Every call of the plan, with its answer: a group's calls one after another,
    /// different groups at once (as many as `calls.permits` lets through).
    async fn call_groups<'p>(
        &self,
        calls: &Calls<'_>,
        groups: &'p [Vec<Vec<usize>>],
    ) -> Vec<(&'p [usize], Result<SendReceipt, SendError>)> {
        futures_util::future::join_all(groups.iter().map(|group| async move {
            let mut out = Vec::with_capacity(group.len());
            for call in group {
                out.push((call.as_slice(), self.call(calls, call).await));
            }
            out
        }))
        .await
        .into_iter()
        .flatten()
        .collect()
    }

    /// One Send Message Batch call: `call`'s entries (indices into `calls.candidates`),
    /// with a slot among [`MAX_CALLS_AT_ONCE`], never issued past the deadline.
    async fn call(&self, calls: &Calls<'_>, call: &[usize]) -> Result<SendReceipt, SendError> {
        let Some(first) = call
            .first()
            .map(|&at| &calls.messages[calls.candidates[at]])
        else {
            return Err(SendError::Failed("an empty call".into()));
        };
        let authorization = self
            .send_credential
            .authorization(&first.queue, calls.deadline)
            .await
            .map_err(|e| match e {
                // No token in time: the messages never left, so this is not an unknown
                // outcome (504) but a broker that cannot be used now.
                TokenError::Timeout => SendError::Unavailable("no Entra ID token in time".into()),
                TokenError::Unavailable(why) => SendError::AuthFailed(why),
            })?;
        let Ok(Ok(_slot)) = tokio::time::timeout_at(calls.deadline, calls.permits.acquire()).await
        else {
            return Err(SendError::Timeout);
        };
        // Never issued past its deadline (docs/fleet.md, A2).
        if Instant::now() >= calls.deadline {
            return Err(SendError::Timeout);
        }
        let url = self.messages_url(&first.queue);
        let result = match call {
            [_] if calls.single_form && single::fits(first) => match single::request(first) {
                Ok(request) => {
                    self.rest
                        .send_single(&url, &authorization, request, calls.deadline)
                        .await
                }
                Err(e) => Err(SendError::Failed(format!("broker properties: {e}"))),
            },
            _ => {
                let body = batch::body(call.iter().map(|&at| calls.entries[at].as_slice()));
                self.rest
                    .send_batch(&url, &authorization, body, calls.deadline)
                    .await
            }
        };
        if let Err(error) = &result {
            tracing::warn!(
                event = "servicebus_send_failed",
                queue = %first.queue,
                messages = call.len(),
                message_id = first.message_id.as_str(),
                error = %error,
                "Service Bus did not take the call's messages"
            );
        }
        result
    }

    /// As few calls as Service Bus allows: one per queue and ordering key (session id,
    /// else partition key), each within `max_batch_bytes`; the calls of one key one after
    /// another (their messages enqueued in the caller's order), those of different keys up
    /// to [`MAX_CALLS_AT_ONCE`] at once, all under the one deadline. A call is atomic, so
    /// its answer is each of its messages' result. `single_form`: a single send, which may
    /// take the single form.
    async fn send_messages(
        &self,
        messages: Vec<OutgoingMessage>,
        deadline: Instant,
        single_form: bool,
    ) -> Vec<Result<SendReceipt, SendError>> {
        let mut results: Vec<Option<Result<SendReceipt, SendError>>> = vec![None; messages.len()];
        let (candidates, entries) = written_entries(&messages, &mut results);
        let plan = plan_calls(&messages, &candidates, &entries, self.max_batch_bytes);
        for &at in &plan.too_large {
            results[candidates[at]] = Some(Err(SendError::TooLarge));
        }
        let calls = Calls {
            messages: &messages,
            candidates: &candidates,
            entries: &entries,
            permits: Semaphore::new(MAX_CALLS_AT_ONCE),
            deadline,
            single_form,
        };
        for (call, result) in self.call_groups(&calls, &plan.groups).await {
            for &at in call {
                results[candidates[at]] = Some(result.clone());
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(SendError::Failed("the message was not planned".into())))
            })
            .collect()
    }

    fn description_url(&self, queue: &QueueName) -> String {
        format!(
            "{}/{}?api-version={API_VERSION}",
            self.endpoint,
            queue.as_str()
        )
    }
}

/// The send plane's and the management plane's credentials. One Entra credential (and one
/// token cache) for both planes: the scope is the same. The send plane's SAS signer is
/// shared with the management plane when it signs with the same key: two caches would sign
/// two tokens for the same calls (a depth read and a send a second apart got tokens of
/// different expiries).
fn plane_credentials(
    plan: &ServiceBusSettings,
    entra: &impl Fn(String) -> Result<CredentialChain, String>,
) -> Result<(Credential, Credential), ServiceBusError> {
    let needs_entra = [&plan.send, &plan.manage].contains(&&CredentialPlan::EntraId);
    let entra = if needs_entra {
        let chain = entra(auth::ENTRA_SCOPE.to_owned()).map_err(ServiceBusError)?;
        Some(Arc::new(EntraCredential::new(chain)))
    } else {
        None
    };
    let send_sas = match &plan.send {
        CredentialPlan::Sas(connection) => {
            Some((connection, Arc::new(SasCredential::new(connection))))
        }
        CredentialPlan::EntraId => None,
    };
    let credential = |plan: &CredentialPlan| match (plan, &entra) {
        (CredentialPlan::Sas(connection), _) => Ok(Credential::Sas(match &send_sas {
            Some((shared, sas)) if *shared == connection => Arc::clone(sas),
            _ => Arc::new(SasCredential::new(connection)),
        })),
        (CredentialPlan::EntraId, Some(entra)) => Ok(Credential::Entra(entra.clone())),
        (CredentialPlan::EntraId, None) => Err(ServiceBusError(
            "Entra ID was planned but not set up".into(),
        )),
    };
    Ok((credential(&plan.send)?, credential(&plan.manage)?))
}

/// The messages that could be written as entries (all of them: serializing these types
/// cannot fail, but a failure would be that message's alone): each one's index in
/// `messages`, and its entry.
fn written_entries(
    messages: &[OutgoingMessage],
    results: &mut [Option<Result<SendReceipt, SendError>>],
) -> (Vec<usize>, Vec<Vec<u8>>) {
    let mut candidates = Vec::with_capacity(messages.len());
    let mut entries = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        match batch::entry(message) {
            Ok(entry) => {
                candidates.push(index);
                entries.push(entry);
            }
            Err(e) => results[index] = Some(Err(SendError::Failed(format!("entry: {e}")))),
        }
    }
    (candidates, entries)
}

/// The entries in calls: by queue and ordering key, each call within `max_batch_bytes`.
fn plan_calls(
    messages: &[OutgoingMessage],
    candidates: &[usize],
    entries: &[Vec<u8>],
    max_batch_bytes: usize,
) -> batch::Plan {
    let keys: Vec<(&str, Option<&str>)> = candidates
        .iter()
        .map(|&i| {
            let m = &messages[i];
            (m.queue.as_str(), m.attributes.ordering_key())
        })
        .collect();
    let lens: Vec<usize> = entries
        .iter()
        .zip(candidates)
        .map(|(entry, &i)| batch::counted_len(entry, messages[i].body.len()))
        .collect();
    batch::plan(&keys, &lens, max_batch_bytes)
}

/// What every call of one `send_batch` shares.
struct Calls<'a> {
    messages: &'a [OutgoingMessage],
    /// The index in `messages` of each entry.
    candidates: &'a [usize],
    entries: &'a [Vec<u8>],
    permits: Semaphore,
    deadline: Instant,
    /// A single send: its call may take the single form (`single::fits`).
    single_form: bool,
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
        // Planned as a batch of one (its size counted as the batch form counts it), then
        // sent in the single form when the message fits it (see `single`).
        self.send_messages(vec![message], deadline, true)
            .await
            .pop()
            .unwrap_or_else(|| Err(SendError::Failed("no result for the message".into())))
    }

    /// Send Message Batch calls, never the single form (see `send_messages`).
    async fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
        deadline: Instant,
    ) -> Vec<Result<SendReceipt, SendError>> {
        self.send_messages(messages, deadline, false).await
    }

    /// Service Bus carries every attribute (contract section 1.2): a message with
    /// application properties through the batch form.
    fn unsupported(&self, _attributes: &Attributes) -> Option<Field> {
        None
    }

    async fn backlog(&self, queue: &QueueName, deadline: Instant) -> Result<Backlog, DepthError> {
        let token_error = |e| match e {
            TokenError::Timeout => DepthError::Timeout,
            TokenError::Unavailable(why) => DepthError::Unauthorized(why),
        };
        let runtime = match &self.depth {
            DepthReader::Management(credential) => {
                let authorization = credential
                    .authorization(queue, deadline)
                    .await
                    .map_err(token_error)?;
                self.rest
                    .queue_runtime(&self.description_url(queue), &authorization, deadline)
                    .await?
            }
            DepthReader::Arm {
                queues_url,
                credential,
            } => {
                let token = credential.token(deadline).await.map_err(token_error)?;
                // Queue names need no escaping (QueueName's characters).
                let url = format!(
                    "{queues_url}/{}?api-version={}",
                    queue.as_str(),
                    arm::API_VERSION
                );
                let authorization = format!("Bearer {}", token.secret());
                self.rest.arm_queue(&url, &authorization, deadline).await?
            }
        };
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
