//! One message on the single-send route: checked into its request, and what an answer
//! means for it.

use std::time::Duration;

use async_trait::async_trait;
use sendgate_wire::{CorrelationId, GatewayState, MessageId};

use crate::message::{key_of, traceparent_of};
use crate::retry::{is_retryable_status, RetryKind};
use crate::send_loop::{no_token, Load, Step, Tries};
use crate::transport::{self, Outgoing, Transport, TransportError};
use crate::{AttemptError, GaveUp, Inner, Message, SendOutcome};

/// What one answer means for the message.
enum Judged {
    Final(SendOutcome),
    Retry {
        retry_after: Option<Duration>,
        kind: RetryKind,
    },
}

impl Tries {
    /// What a single send's answer means for its message.
    fn judge(
        &mut self,
        answer: Result<transport::Answer, TransportError>,
        key: &MessageId,
    ) -> Judged {
        let a = match answer {
            Ok(a) => a,
            Err(e) => return self.judge_unanswered(e),
        };
        if (200..300).contains(&a.status) {
            self.queued = true;
            return Judged::Final(SendOutcome::Queued {
                message_id: a.message_id.unwrap_or_else(|| key.to_string()),
            });
        }
        if a.status == 401 || a.status == 403 {
            return Judged::Final(SendOutcome::AuthFailed {
                status: a.status,
                code: a.code,
            });
        }
        self.judge_failed(a)
    }

    /// No answer: the token source had none (nothing was sent), or the exchange failed
    /// (an attempt, retried).
    fn judge_unanswered(&mut self, error: TransportError) -> Judged {
        match error {
            TransportError::NoToken(e) => {
                Judged::Final(no_token(e, self.last_error.clone(), self.attempts))
            }
            e => {
                self.attempts += 1;
                self.refused = true;
                self.last_error = Some(AttemptError::Transport(e.to_string()));
                Judged::Retry {
                    retry_after: None,
                    kind: RetryKind::Transient,
                }
            }
        }
    }

    /// An answer neither queued nor an authentication failure: an attempt that failed,
    /// retried when its status (or an unknown outcome) allows, else final.
    fn judge_failed(&mut self, a: transport::Answer) -> Judged {
        self.attempts += 1;
        let error = AttemptError::Status {
            status: a.status,
            code: a.code.clone(),
        };
        // A `502` whose send may have reached the broker is retried like a `504` (the
        // same key), as a batch entry with `outcome: unknown` is.
        if is_retryable_status(a.status) || a.outcome_unknown {
            self.refused = true;
            self.last_error = Some(error);
            return Judged::Retry {
                retry_after: a.retry_after,
                kind: RetryKind::of(a.status, a.retry_after),
            };
        }
        Judged::Final(if a.status >= 500 {
            SendOutcome::Failed {
                last_error: error,
                attempts: self.attempts,
                gave_up: GaveUp::NotRetryable,
            }
        } else {
            SendOutcome::Refused {
                status: a.status,
                code: a.code,
            }
        })
    }
}

/// One message on the single-send route.
pub(crate) struct One {
    pub(crate) message: Outgoing,
    pub(crate) outcome: Option<SendOutcome>,
}

#[async_trait]
impl Load for One {
    type Answer = transport::Answer;

    async fn send(
        &mut self,
        transport: &dyn Transport,
        queue: &str,
    ) -> Result<transport::Answer, TransportError> {
        transport.post(queue, &self.message).await
    }

    fn deferral(answer: &transport::Answer) -> Option<(GatewayState, Option<Duration>)> {
        answer.deferral()
    }

    fn judge(
        &mut self,
        tries: &mut Tries,
        answer: Result<transport::Answer, TransportError>,
        _: &Inner,
    ) -> Step {
        match tries.judge(answer, &self.message.key) {
            Judged::Final(outcome) => {
                self.outcome = Some(outcome);
                Step::Done
            }
            Judged::Retry { retry_after, kind } => Step::Retry { retry_after, kind },
        }
    }

    fn give_up(&mut self, gave_up: GaveUp, attempts: u32, last_error: AttemptError) {
        self.outcome = Some(SendOutcome::Failed {
            last_error,
            attempts,
            gave_up,
        });
    }
}

/// A message checked for the single-send route: its key, ids, trace and headers.
pub(crate) fn single(message: Message) -> Result<Outgoing, String> {
    let key = key_of(message.idempotency_key.as_deref())?;
    let correlation_id = message
        .correlation_id
        .as_deref()
        .map(CorrelationId::parse)
        .transpose()
        .map_err(|e| format!("{}: {e}", sendgate_wire::headers::CORRELATION_ID))?;
    let traceparent = traceparent_of(message.traceparent.as_deref())?;
    let attributes =
        transport::attribute_headers(&message.attributes).map_err(|e| e.to_string())?;
    Ok(Outgoing {
        key,
        body: message.body,
        correlation_id,
        traceparent,
        attributes,
    })
}
