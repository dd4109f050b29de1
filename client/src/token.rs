//! Where the bearer token comes from when it is not a fixed one: a [`TokenSource`], asked
//! before every request (it caches and renews on its own). With the `entra` feature,
//! [`EntraTokenSource`]: Microsoft Entra ID tokens for the gateway's API from the process's
//! identity (workload identity, managed identity, the Azure CLI or Azure Developer CLI),
//! through the same chain
//! and cache the gateway uses for Service Bus (`sendgate-entra`).
//!
//! A source that cannot give a token fails the request before anything is sent; the client
//! never retries it: the source paces its own fetches (Entra's answers a failure from its
//! cache for 4–30 s), so a burst of sends never becomes a burst of token requests.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

/// Gives the bearer token for the next request.
#[async_trait]
pub trait TokenSource: Send + Sync + 'static {
    /// The token to send now (without `Bearer `). An error fails the request unsent.
    async fn token(&self) -> Result<Arc<str>, TokenSourceError>;
}

/// The source gave no token; the text says why, never a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no token for the gateway: {0}")]
pub struct TokenSourceError(pub String);

/// A fixed token or a source: what goes in `Authorization`.
#[derive(Clone)]
pub enum Credential {
    Token(String),
    Source(Arc<dyn TokenSource>),
}

impl fmt::Debug for Credential {
    // Never print the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::Source(_) => f.write_str("Source(..)"),
        }
    }
}

#[cfg(feature = "entra")]
pub use entra::EntraTokenSource;

#[cfg(feature = "entra")]
mod entra {
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use sendgate_entra::{CredentialChain, EntraCredential};
    use tokio::time::Instant;

    use super::{TokenSource, TokenSourceError};

    /// Longest a request waits for a token being fetched (a refresh still running goes on
    /// for the next request). A first fetch may try each source of the chain for up to its
    /// budget (off Azure, an absent managed identity endpoint takes all of its 10 s before
    /// the Azure CLI is asked), so a request waits for the whole chain and a margin.
    const TOKEN_WAIT: Duration = Duration::from_secs(40);

    /// Entra ID access tokens for one scope, the gateway API's (`api://<app>/.default`).
    pub struct EntraTokenSource {
        credential: EntraCredential,
    }

    impl std::fmt::Debug for EntraTokenSource {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("EntraTokenSource")
                .field("scope", &self.credential.scope())
                .finish_non_exhaustive()
        }
    }

    impl EntraTokenSource {
        /// Tokens for `scope` from the process's identity: workload identity (its
        /// environment set), managed identity (`user_assigned_client_id` picks a
        /// user-assigned one), then the developer tools (Azure CLI). Nothing is fetched
        /// before the first request.
        pub fn from_environment(
            scope: impl Into<Cow<'static, str>>,
            user_assigned_client_id: Option<&str>,
        ) -> Result<Self, TokenSourceError> {
            let chain = CredentialChain::from_environment(scope, user_assigned_client_id)
                .map_err(TokenSourceError)?;
            Ok(Self::new(EntraCredential::new(chain)))
        }

        /// Over a credential built elsewhere (tests give it fake sources).
        pub fn new(credential: EntraCredential) -> Self {
            Self { credential }
        }

        pub fn scope(&self) -> &str {
            self.credential.scope()
        }
    }

    #[async_trait]
    impl TokenSource for EntraTokenSource {
        async fn token(&self) -> Result<Arc<str>, TokenSourceError> {
            self.credential
                .token(Instant::now() + TOKEN_WAIT)
                .await
                .map(|token| token.shared_secret())
                .map_err(|e| TokenSourceError(e.to_string()))
        }
    }
}
