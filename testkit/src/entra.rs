//! A fake Microsoft Entra ID credential source for the integration tests: it hands out
//! whatever secret the test sets, valid for a lifetime the test chooses, or fails.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::time::OffsetDateTime;

#[derive(Debug)]
pub struct FakeToken {
    scope: &'static str,
    secret: Mutex<String>,
    lifetime: Duration,
    fail: AtomicBool,
    calls: AtomicU32,
}

impl FakeToken {
    pub fn new(scope: &'static str, secret: &str, lifetime: Duration) -> Arc<Self> {
        Arc::new(Self {
            scope,
            secret: Mutex::new(secret.to_owned()),
            lifetime,
            fail: AtomicBool::new(false),
            calls: AtomicU32::new(0),
        })
    }

    /// Every token from now on is `secret` (a rotation).
    pub fn set_secret(&self, secret: &str) {
        *self.secret.lock().unwrap() = secret.to_owned();
    }

    pub fn set_failing(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl TokenCredential for FakeToken {
    async fn get_token(
        &self,
        scopes: &[&str],
        _: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if scopes != [self.scope] || self.fail.load(Ordering::SeqCst) {
            return Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::Credential,
                format!("no token here (asked for {scopes:?})"),
            ));
        }
        let secret = self.secret.lock().unwrap().clone();
        Ok(AccessToken::new(
            secret,
            OffsetDateTime::now_utc() + self.lifetime,
        ))
    }
}
