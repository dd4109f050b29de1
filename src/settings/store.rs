//! Where the runtime overrides are kept: a file in the data directory (local mode) or a
//! Redis hash under the deployment's prefix (fleet mode). Both hold the same flat form
//! (`queues.{queue}.{field}` / `force_backend` → `{"value", "by", "at"}`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::coordination::redis_client::{RedisClient, RedisError};

use super::overrides::StoredValue;

/// The file's name in `SENDGATE_DATA_DIR`.
pub const FILE_NAME: &str = "settings.json";
/// The Redis hash's name under `SENDGATE_REDIS_PREFIX`.
pub const HASH_NAME: &str = "settings";

#[derive(Debug, thiserror::Error)]
pub enum SettingsStoreError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path}: not a settings file ({why}); fix or remove it to start with the variables' values"
    )]
    Corrupt { path: String, why: String },
    #[error("Redis: {0}")]
    Redis(#[from] RedisError),
    #[error("Redis hash {key}: field {field}: {why}")]
    BadField {
        key: String,
        field: String,
        why: String,
    },
}

pub type Flat = BTreeMap<String, StoredValue>;

/// The file's layout: a version, then the flat overrides.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBody {
    version: u32,
    overrides: Flat,
}

const FILE_VERSION: u32 = 1;

pub enum Store {
    File(PathBuf),
    Redis { client: RedisClient, key: String },
}

/// A write: the fields set to a value, the fields removed.
#[derive(Debug, Default)]
pub struct Write {
    pub set: Flat,
    pub removed: Vec<String>,
}

impl Store {
    pub fn file(data_dir: &Path) -> Self {
        Self::File(data_dir.join(FILE_NAME))
    }

    pub fn redis(client: RedisClient) -> Self {
        let key = client.deployment_key(HASH_NAME);
        Self::Redis { client, key }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
            Self::Redis { .. } => "redis",
        }
    }

    /// Where, for messages: the file's path or the hash's key.
    pub fn location(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Redis { key, .. } => key.clone(),
        }
    }

    /// Every stored override. A missing file is none.
    pub async fn load(&self) -> Result<Flat, SettingsStoreError> {
        match self {
            Self::File(path) => read_file(path),
            Self::Redis { client, key } => {
                let mut pipe = redis::pipe();
                pipe.hgetall(key);
                let (fields,): (BTreeMap<String, String>,) = client.query(&pipe).await?;
                fields
                    .into_iter()
                    .map(|(field, text)| {
                        serde_json::from_str::<StoredValue>(&text)
                            .map(|v| (field.clone(), v))
                            .map_err(|e| SettingsStoreError::BadField {
                                key: key.clone(),
                                field,
                                why: e.to_string(),
                            })
                    })
                    .collect()
            }
        }
    }

    /// Store a change. The file is rewritten whole (`all`, atomically: a temporary file in
    /// the same directory, synced, then renamed over it); the hash gets only the fields
    /// that changed, in one MULTI, so replicas changing different values never undo each
    /// other.
    pub async fn write(&self, all: &Flat, change: &Write) -> Result<(), SettingsStoreError> {
        match self {
            Self::File(path) => {
                let path = path.clone();
                let body = FileBody {
                    version: FILE_VERSION,
                    overrides: all.clone(),
                };
                tokio::task::spawn_blocking(move || write_file(&path, &body))
                    .await
                    .map_err(|e| SettingsStoreError::Io {
                        path: FILE_NAME.into(),
                        source: std::io::Error::other(e),
                    })?
            }
            Self::Redis { client, key } => {
                let mut pipe = redis::pipe();
                pipe.atomic();
                for (field, value) in &change.set {
                    let text =
                        serde_json::to_string(value).map_err(|e| SettingsStoreError::BadField {
                            key: key.clone(),
                            field: field.clone(),
                            why: e.to_string(),
                        })?;
                    pipe.hset(key, field, text).ignore();
                }
                for field in &change.removed {
                    pipe.hdel(key, field).ignore();
                }
                let () = client.query(&pipe).await?;
                Ok(())
            }
        }
    }
}

/// Removes a hash's field only while it still holds the override written at `ARGV[2]`.
const DROP_IF_UNCHANGED: &str = r#"
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and cjson.decode(current)['at'] == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"#;

impl Store {
    /// Drop the overrides `dropped` (flat name, the `at` they were read with). The file is
    /// rewritten whole as `kept`; each hash field is removed only while it still holds what
    /// was read, so a change made since (on another replica) is not lost.
    pub async fn drop_if_unchanged(
        &self,
        kept: &Flat,
        dropped: &[(String, String)],
    ) -> Result<(), SettingsStoreError> {
        match self {
            Self::File(_) => {
                let write = Write {
                    set: Flat::new(),
                    removed: dropped.iter().map(|(name, _)| name.clone()).collect(),
                };
                self.write(kept, &write).await
            }
            Self::Redis { client, key } => {
                let mut pipe = redis::pipe();
                for (field, at) in dropped {
                    pipe.cmd("EVAL")
                        .arg(DROP_IF_UNCHANGED)
                        .arg(1)
                        .arg(key)
                        .arg(field)
                        .arg(at)
                        .ignore();
                }
                let () = client.query(&pipe).await?;
                Ok(())
            }
        }
    }
}

/// The file's overrides (none when there is no file).
pub fn read_file(path: &Path) -> Result<Flat, SettingsStoreError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Flat::new()),
        Err(source) => {
            return Err(SettingsStoreError::Io {
                path: path.display().to_string(),
                source,
            })
        }
    };
    let body: FileBody = serde_json::from_str(&text).map_err(|e| SettingsStoreError::Corrupt {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    if body.version != FILE_VERSION {
        return Err(SettingsStoreError::Corrupt {
            path: path.display().to_string(),
            why: format!("version {} (this build reads {FILE_VERSION})", body.version),
        });
    }
    Ok(body.overrides)
}

fn write_file(path: &Path, body: &FileBody) -> Result<(), SettingsStoreError> {
    let io = |source| SettingsStoreError::Io {
        path: path.display().to_string(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let text = serde_json::to_vec_pretty(body).map_err(|e| io(std::io::Error::other(e)))?;
    // Writes are serialised by the caller (one PATCH at a time per process); the random
    // part keeps two processes sharing a data volume (both PID 1 in their containers) off
    // each other's temporary file, so neither renames a file the other is writing.
    let temp = dir.join(format!(
        ".{FILE_NAME}.{}.{}.tmp",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(&text)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(io(e));
    }
    // The rename itself is durable once the directory is synced.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(n: u64) -> StoredValue {
        StoredValue {
            value: n.into(),
            by: "ops".into(),
            at: "2026-12-01T08:00:00Z".into(),
            configured: None,
        }
    }

    #[tokio::test]
    async fn the_file_round_trips_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::file(&dir.path().join("nested"));
        assert!(store.load().await.unwrap().is_empty());
        let all = Flat::from([("queues.requests.max_queue_depth".to_owned(), value(5))]);
        store.write(&all, &Write::default()).await.unwrap();
        assert_eq!(store.load().await.unwrap(), all);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("nested"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [FILE_NAME], "no temporary file left behind");
    }

    #[tokio::test]
    async fn a_corrupt_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE_NAME),
            "{\"version\": 1, \"overrides\": ",
        )
        .unwrap();
        let error = Store::file(dir.path()).load().await.unwrap_err();
        assert!(
            matches!(error, SettingsStoreError::Corrupt { .. }),
            "{error}"
        );
        assert!(error.to_string().contains(FILE_NAME), "{error}");
        std::fs::write(
            dir.path().join(FILE_NAME),
            "{\"version\": 2, \"overrides\": {}}",
        )
        .unwrap();
        let error = Store::file(dir.path()).load().await.unwrap_err();
        assert!(error.to_string().contains("version 2"), "{error}");
    }
}
