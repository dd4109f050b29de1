//! The producer client (the `sendgate-client` crate and `sendgate send`) against the real
//! gateway, spawned in-process on a random port with the embedded backend.

mod cli;
mod library;
mod proxy;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Write an API keys file: `(name, token, role(s) comma-separated, queue)` per key.
pub fn keys_file(dir: &Path, keys: &[(&str, &str, &str, &str)]) -> PathBuf {
    let text: String = keys
        .iter()
        .map(|(name, token, roles, queue)| {
            let roles = roles
                .split(',')
                .map(|r| format!("\"{r}\""))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "[[keys]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = [{roles}]\nqueues = [\"{queue}\"]\n",
                hex::encode(Sha256::digest(token.as_bytes()))
            )
        })
        .collect();
    let path = dir.join("keys.toml");
    std::fs::write(&path, text).unwrap();
    path
}
