//! `sendgate keys new`: a fresh token, and its keys-file entry (holding only its SHA-256)
//! appended to the keys file. Stdout carries the token alone, so a script takes it as it
//! is (`TOKEN=$(sendgate keys new ...)`); what was done is said on stderr.
//!
//! Several `keys new` may run at once on one file (a script making a team's keys in
//! parallel): each holds an exclusive lock on the file's directory from its read to its
//! rename, so none writes over an entry another added, nor makes a name another just made.
//! The file is replaced whole (a temporary file beside it, synced, renamed over it), so a
//! reader (the gateway at start-up) never sees half an entry; it keeps its owner, group and
//! mode, and a symbolic link's target is the file replaced (the link stays).

use std::fs::File;
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
        Ok(token) => print_token(&token),
        Err(e) => {
            say(&format!("sendgate: {e}"));
            ExitCode::from(2)
        }
    }
}

/// The token on stdout. A stdout that cannot take it (closed: `| head -0`) is said on
/// stderr and exits 1 (the environment failed us), never a panic: the entry is in the
/// file, but nobody has its token.
fn print_token(token: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{token}").and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let why = if e.kind() == std::io::ErrorKind::BrokenPipe {
                "stdout was closed".to_owned()
            } else {
                e.to_string()
            };
            say(&format!(
                "sendgate: the token could not be written to stdout ({why}); its entry is in the keys file but nobody has the token: remove the entry and make the key again"
            ));
            ExitCode::from(1)
        }
    }
}

/// A line on stderr; a stderr that cannot take it is no reason to panic either.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
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
    let io = |source| KeysError::Io {
        path: path.clone(),
        source,
    };
    // A link's target is the file changed (the link stays a link).
    let keys_file = through_links(&keys_file).map_err(io)?;
    // Held until the file is replaced: the read below is of the file this process changes.
    let _lock = lock_directory(&keys_file).map_err(io)?;
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
    replace(&keys_file, &appended(&existing, &entry)).map_err(io)?;
    let tenant = tenant.as_deref().unwrap_or(&name);
    say(&format!(
        "sendgate: key {name:?} (tenant {tenant:?}) appended to {path}; its token, on stdout, is shown once and stored nowhere"
    ));
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

/// The directory holding `file`, locked exclusively (waiting for another `keys new`). The
/// directory, not the file: the file is replaced by a rename, so a lock on it would be on
/// the old file, which a waiting process would then read, stale; and a file that does not
/// exist yet is not made for a key that may be refused.
fn lock_directory(file: &Path) -> std::io::Result<File> {
    let dir = directory_of(file);
    let handle = File::open(dir)?;
    handle.lock()?;
    Ok(handle)
}

/// The file `file` names: a symbolic link's target, followed all the way, so the entry goes
/// where the link points (a mounted secret, a configuration manager's file) and the rename
/// does not put a regular file in the link's place; `file` as given when there is none yet.
fn through_links(file: &Path) -> std::io::Result<PathBuf> {
    match std::fs::canonicalize(file) {
        Ok(real) => Ok(real),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(file.to_owned()),
        Err(e) => Err(e),
    }
}

/// Where `file` is: its parent, or the working directory for a bare name.
fn directory_of(file: &Path) -> &Path {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// `existing` with `entry` at its end, a blank line before it when there is text.
fn appended(existing: &str, entry: &str) -> String {
    let gap = match existing {
        "" => "",
        text if text.ends_with('\n') => "\n",
        _ => "\n\n",
    };
    format!("{existing}{gap}{entry}")
}

/// `file` replaced by `text`: a temporary file in the same directory (the existing file's
/// owner, group and permissions, so a key file kept private stays so and the gateway's
/// group can still read it), synced, renamed over it, and the rename synced with the
/// directory. An owner or group that cannot be kept (no right to give a file away) is said
/// on stderr.
fn replace(file: &Path, text: &str) -> std::io::Result<()> {
    let dir = directory_of(file);
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = (|| {
        let mut out = File::create_new(&temp)?;
        if let Ok(existing) = std::fs::metadata(file) {
            keep_owner(&out, &existing, file);
            out.set_permissions(existing.permissions())?;
        }
        out.write_all(text.as_bytes())?;
        out.sync_all()?;
        std::fs::rename(&temp, file)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

/// `out` given `existing`'s owner and group, or said on stderr when it cannot be.
fn keep_owner(out: &File, existing: &std::fs::Metadata, file: &Path) {
    use std::os::unix::fs::MetadataExt as _;
    let (uid, gid) = (existing.uid(), existing.gid());
    if let Err(e) = std::os::unix::fs::fchown(out, Some(uid), Some(gid)) {
        let now = out
            .metadata()
            .map(|m| format!("{}:{}", m.uid(), m.gid()))
            .unwrap_or_else(|_| "this user's".to_owned());
        say(&format!(
            "sendgate: warning: {} was owned by {uid}:{gid} and is now {now} ({e}); give it back its owner if the gateway reads it as another user",
            file.display()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_follows_the_text_after_one_blank_line() {
        assert_eq!(appended("", "[[keys]]\n"), "[[keys]]\n");
        assert_eq!(appended("a = 1\n", "[[keys]]\n"), "a = 1\n\n[[keys]]\n");
        assert_eq!(appended("a = 1", "[[keys]]\n"), "a = 1\n\n[[keys]]\n");
    }

    #[test]
    fn a_bare_file_name_is_in_the_working_directory() {
        assert_eq!(directory_of(Path::new("keys.toml")), Path::new("."));
        assert_eq!(directory_of(Path::new("a/keys.toml")), Path::new("a"));
        assert_eq!(directory_of(Path::new("/keys.toml")), Path::new("/"));
    }

    /// The file keeps its permissions, and nothing else is left in its directory.
    #[test]
    fn the_file_is_replaced_whole_keeping_its_permissions() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.toml");
        std::fs::write(&file, "old\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        replace(&file, "new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new\n");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["keys.toml"]);
    }

    fn command(name: &str, keys_file: &Path) -> KeysCommand {
        KeysCommand::New {
            name: name.to_owned(),
            roles: vec!["sender".to_owned()],
            queues: vec!["*".to_owned()],
            tenant: None,
            weight: None,
            keys_file: keys_file.to_owned(),
        }
    }

    /// A keys file kept behind a symbolic link (a mounted secret, a configuration
    /// manager's file) gets the entry where the link points; the link stays a link.
    #[test]
    fn a_keys_file_behind_a_symlink_gets_the_entry_and_the_link_stays() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        let target = dir.path().join("real").join("keys.toml");
        std::fs::write(&target, "").unwrap();
        let link = dir.path().join("keys.toml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        new_key(command("web", &link)).expect("a key");
        let meta = std::fs::symlink_metadata(&link).unwrap();
        assert!(
            meta.file_type().is_symlink(),
            "the link was replaced by a file"
        );
        assert!(std::fs::read_to_string(&target)
            .unwrap()
            .contains("name = \"web\""));
    }

    /// The file keeps its owner and group, not only its mode: a file `root:sendgate`
    /// 0640 made `root:root` 0640 by `sudo sendgate keys new` is one the gateway can no
    /// longer read. (Needs the right to give a file away: skipped without it.)
    #[test]
    fn the_file_keeps_its_owner_and_group() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.toml");
        std::fs::write(&file, "").unwrap();
        if std::os::unix::fs::chown(&file, Some(4242), Some(4343)).is_err() {
            eprintln!("skipped: files cannot be given away here");
            return;
        }
        new_key(command("web", &file)).expect("a key");
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (4242, 4343));
    }
}
