//! The one TLS crypto provider of the process: rustls with ring.
//!
//! reqwest 0.13 (ours and azure_core's) is built with `rustls-no-provider`, so that
//! aws-lc-rs, a second crypto library with a C/CMake build, stays out of the binary. Such a
//! reqwest takes the process-level rustls provider and panics when building a client if
//! there is none, so every place that builds one (our REST and management clients, the
//! Entra ID credentials, which build azure_core's) calls [`install_ring`] first; `cli::run`
//! calls it once at start-up as well. lapin's TLS (rustls--ring) uses the same default.

use std::sync::Once;

static INSTALL: Once = Once::new();

/// Installs ring as the process-level rustls provider, unless one already is (then that
/// one is kept: an embedding process may have chosen its own). Cheap after the first call.
pub fn install_ring() {
    INSTALL.call_once(|| {
        // Err only means a provider is installed already, which is what we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_provider_is_installed_and_http_clients_can_be_built() {
        super::install_ring();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        // The call the provider is for: reqwest panics here without one.
        assert!(reqwest::Client::builder().build().is_ok());
    }
}
