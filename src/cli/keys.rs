//! `sendgate keys new`: a fresh token, and its keys-file entry (holding only its SHA-256)
//! appended to the keys file. Stdout carries the token alone, so a script takes it as it
//! is (`TOKEN=$(sendgate keys new ...)`); what was done is said on stderr.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use crate::domain::QueueName;
use crate::http::auth::{new_token, token_digest, Authenticator, Role};

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Append a new key's [[keys]] entry to the keys file and print its token (only) on
    /// stdout: it is shown once and stored nowhere.
    New {
        /// The key's name, on the log lines of its requests; one key per name in a file
        /// (to rotate a key, make the new one under another name with the same --tenant,
        /// then remove the old entry).
        #[arg(long)]
        name: String,
        /// sender, observer or admin; repeat for several.
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// A queue name or *; repeat for several.
        #[arg(long = "queue", default_value = "*")]
        queues: Vec<String>,
        /// The tenant whose part of a queue's room the key's sends share (default: the
        /// key's name).
        #[arg(long)]
        tenant: Option<String>,
        /// The tenant's weight, 1 to 1000 (default 1): the same on every key of a tenant.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        weight: Option<u32>,
        /// The keys file (SENDGATE_API_KEYS_FILE's) the entry is appended to; made if
        /// there is none.
        #[arg(long, value_name = "FILE")]
        keys_file: PathBuf,
    },
}

/// Why no key was made (nothing was written).
#[derive(Debug, thiserror::Error)]
enum KeysError {
    #[error("--role: unknown role {0:?} (sender, observer, admin)")]
    Role(String),
    #[error("--queue {queue:?}: {why}")]
    Queue { queue: String, why: String },
    #[error("--keys-file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("--keys-file {path}: not a keys file: {why}")]
    NotKeys { path: String, why: String },
    #[error("--name {name:?}: {path} has a key of that name already (one key per name; to rotate, give the new key another name and the same --tenant, then remove the old entry)")]
    Duplicate { name: String, path: String },
    #[error("--keys-file {path}: with this key the file would be refused: {why}")]
    Refused { path: String, why: String },
}

pub fn run(command: KeysCommand) -> ExitCode {
    match new_key(command) {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sendgate: {e}");
            ExitCode::from(2)
        }
    }
}

/// Check the key and the file, append the entry; the token.
fn new_key(command: KeysCommand) -> Result<String, KeysError> {
    let KeysCommand::New {
        name,
        roles,
        queues,
        tenant,
        weight,
        keys_file,
    } = command;
    if let Some(r) = roles.iter().find(|r| Role::parse(r).is_none()) {
        return Err(KeysError::Role(r.clone()));
    }
    for q in queues.iter().filter(|q| *q != "*") {
        QueueName::parse(q).map_err(|e| KeysError::Queue {
            queue: q.clone(),
            why: e.to_string(),
        })?;
    }
    let path = keys_file.display().to_string();
    let existing = read_if_any(&keys_file, &path)?;
    let keys = key_names_and_entries(&existing, &path)?;
    if keys.0.contains(&name) {
        return Err(KeysError::Duplicate { name, path });
    }
    let token = new_token();
    let entry = entry(&name, &token, &roles, &queues, tenant.as_deref(), weight);
    // The file's keys with this one must be a keys file the gateway takes (a tenant's
    // weight the same on each of its keys, ...); its [[apps]] need Entra ID, left out.
    Authenticator::from_toml(&format!("{}\n{entry}", keys.1)).map_err(|why| {
        KeysError::Refused {
            path: path.clone(),
            why,
        }
    })?;
    append(&keys_file, &existing, &entry).map_err(|source| KeysError::Io {
        path: path.clone(),
        source,
    })?;
    let tenant = tenant.as_deref().unwrap_or(&name);
    eprintln!(
        "sendgate: key {name:?} (tenant {tenant:?}) appended to {path}; its token, on stdout, is shown once and stored nowhere"
    );
    Ok(token)
}

fn read_if_any(file: &Path, path: &str) -> Result<String, KeysError> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(KeysError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The names of the file's `[[keys]]`, and those entries alone as TOML.
fn key_names_and_entries(text: &str, path: &str) -> Result<(Vec<String>, String), KeysError> {
    let not_keys = |why: String| KeysError::NotKeys {
        path: path.to_owned(),
        why,
    };
    let mut file: toml::Table = toml::from_str(text).map_err(|e| not_keys(e.to_string()))?;
    let keys = match file.remove("keys") {
        None => Vec::new(),
        Some(toml::Value::Array(keys)) => keys,
        Some(_) => return Err(not_keys("keys is not a list of [[keys]] tables".into())),
    };
    let names = keys
        .iter()
        .filter_map(|k| k.get("name").and_then(toml::Value::as_str))
        .map(str::to_owned)
        .collect();
    let mut only_keys = toml::Table::new();
    if !keys.is_empty() {
        only_keys.insert("keys".into(), toml::Value::Array(keys));
    }
    let entries = toml::to_string(&only_keys).map_err(|e| not_keys(e.to_string()))?;
    Ok((names, entries))
}

/// The key's `[[keys]]` entry: its name, the token's SHA-256, its grants and tenant.
fn entry(
    name: &str,
    token: &str,
    roles: &[String],
    queues: &[String],
    tenant: Option<&str>,
    weight: Option<u32>,
) -> String {
    let list = |items: &[String]| {
        items
            .iter()
            .map(|i| format!("{i:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut entry = format!(
        "[[keys]]\nname = {name:?}\nsha256 = \"{}\"\nroles = [{}]\nqueues = [{}]\n",
        hex::encode(token_digest(token)),
        list(roles),
        list(queues)
    );
    if let Some(tenant) = tenant {
        entry.push_str(&format!("tenant = {tenant:?}\n"));
    }
    if let Some(weight) = weight {
        entry.push_str(&format!("weight = {weight}\n"));
    }
    entry
}

/// `entry` at the end of the file, a blank line before it when the file has text.
fn append(file: &Path, existing: &str, entry: &str) -> std::io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    let gap = match existing {
        "" => "",
        text if text.ends_with('\n') => "\n",
        _ => "\n\n",
    };
    write!(out, "{gap}{entry}")?;
    out.sync_all()
}
