//! The API keys file (`SENDGATE_API_KEYS_FILE`), built entry by entry:
//! the one way every suite writes one. A key is stored as the SHA-256 of its token, so a
//! test names the token it sends and the builder writes its hash.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use toml::{Table, Value};

/// A keys file: `[[keys]]` entries, then `[[apps]]` entries (Entra ID applications).
#[derive(Debug, Default, Clone)]
pub struct KeysFile {
    keys: Vec<Key>,
    apps: Vec<App>,
}

impl KeysFile {
    pub fn new() -> Self {
        Self::default()
    }

    /// One key for each role on every queue: `deployer` (admin, token `admin-token`),
    /// `grafana` (observer, `observer-token`) and `app` (sender, `sender-token`).
    pub fn one_per_role() -> Self {
        Self::new()
            .key(Key::new("deployer", &["admin"]).token("admin-token"))
            .key(Key::new("grafana", &["observer"]).token("observer-token"))
            .key(Key::new("app", &["sender"]).token("sender-token"))
    }

    pub fn key(mut self, key: Key) -> Self {
        self.keys.push(key);
        self
    }

    pub fn app(mut self, app: App) -> Self {
        self.apps.push(app);
        self
    }

    /// The file's TOML.
    pub fn to_toml(&self) -> String {
        let mut file = Table::new();
        let tables =
            |entries: Vec<Table>| Value::Array(entries.into_iter().map(Value::Table).collect());
        if !self.keys.is_empty() {
            file.insert(
                "keys".into(),
                tables(self.keys.iter().map(Key::table).collect()),
            );
        }
        if !self.apps.is_empty() {
            file.insert(
                "apps".into(),
                tables(self.apps.iter().map(App::table).collect()),
            );
        }
        toml::to_string(&file).expect("a keys file is TOML")
    }

    /// Write the file as `keys.toml` in `dir`; its path.
    pub fn write_in(&self, dir: &Path) -> PathBuf {
        let path = dir.join("keys.toml");
        std::fs::write(&path, self.to_toml()).expect("the keys file is written");
        path
    }
}

/// What a key and an app may both carry: the tenant's rules (docs/fairness.md).
#[derive(Debug, Default, Clone)]
struct Grant {
    tenant: Option<String>,
    criticality: Option<String>,
    max_share: Option<f64>,
    rate_per_s: Option<f64>,
    burst: Option<u32>,
}

impl Grant {
    fn write(&self, table: &mut Table) {
        let mut put = |name: &str, value: Option<Value>| {
            if let Some(value) = value {
                table.insert(name.into(), value);
            }
        };
        put("tenant", self.tenant.clone().map(Value::String));
        put("criticality", self.criticality.clone().map(Value::String));
        put("max_share", self.max_share.map(Value::Float));
        put("rate_per_s", self.rate_per_s.map(Value::Float));
        put("burst", self.burst.map(|b| Value::Integer(b.into())));
    }
}

/// One `[[keys]]` entry.
#[derive(Debug, Clone)]
pub struct Key {
    name: String,
    token: String,
    roles: Vec<String>,
    queues: Vec<String>,
    grant: Grant,
}

impl Key {
    /// `name`'s key with these roles on every queue (`*`); its token is `<name>-secret`.
    pub fn new(name: &str, roles: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            token: format!("{name}-secret"),
            roles: strings(roles),
            queues: strings(&["*"]),
            grant: Grant::default(),
        }
    }

    /// The token callers send (`Authorization: Bearer <token>`).
    pub fn token(mut self, token: &str) -> Self {
        self.token = token.to_owned();
        self
    }

    /// The queues the key may use, instead of every queue.
    pub fn queues(mut self, queues: &[&str]) -> Self {
        self.queues = strings(queues);
        self
    }

    pub fn tenant(mut self, tenant: &str) -> Self {
        self.grant.tenant = Some(tenant.to_owned());
        self
    }

    /// `critical`, `default` or `sheddable`.
    pub fn criticality(mut self, level: &str) -> Self {
        self.grant.criticality = Some(level.to_owned());
        self
    }

    pub fn max_share(mut self, share: f64) -> Self {
        self.grant.max_share = Some(share);
        self
    }

    /// A rate quota: `per_s` units a second, `burst` at once.
    pub fn rate(mut self, per_s: f64, burst: u32) -> Self {
        self.grant.rate_per_s = Some(per_s);
        self.grant.burst = Some(burst);
        self
    }

    fn table(&self) -> Table {
        let mut table = Table::new();
        table.insert("name".into(), Value::String(self.name.clone()));
        let sha256 = hex::encode(Sha256::digest(self.token.as_bytes()));
        table.insert("sha256".into(), Value::String(sha256));
        table.insert("roles".into(), array(&self.roles));
        table.insert("queues".into(), array(&self.queues));
        self.grant.write(&mut table);
        table
    }
}

/// One `[[apps]]` entry: an Entra ID application by its client id; its roles come from its
/// token.
#[derive(Debug, Clone)]
pub struct App {
    name: String,
    app_id: String,
    queues: Vec<String>,
    grant: Grant,
}

impl App {
    pub fn new(name: &str, app_id: &str, queues: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            app_id: app_id.to_owned(),
            queues: strings(queues),
            grant: Grant::default(),
        }
    }

    pub fn tenant(mut self, tenant: &str) -> Self {
        self.grant.tenant = Some(tenant.to_owned());
        self
    }

    fn table(&self) -> Table {
        let mut table = Table::new();
        table.insert("name".into(), Value::String(self.name.clone()));
        table.insert("app_id".into(), Value::String(self.app_id.clone()));
        table.insert("queues".into(), array(&self.queues));
        self.grant.write(&mut table);
        table
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn array(items: &[String]) -> Value {
    Value::Array(items.iter().cloned().map(Value::String).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's TOML is the entries written out by hand: the same keys with the same
    /// fields and values.
    #[test]
    fn a_file_is_the_entries_written_out() {
        let built = KeysFile::new()
            .key(Key::new("metered", &["sender"]).rate(0.2, 3).tenant("a"))
            .key(
                Key::new("app", &["sender", "observer"])
                    .token("right-token")
                    .queues(&["other"]),
            )
            .app(App::new("playground", "app-id-1", &["requests"]).tenant("web"))
            .to_toml();
        let by_hand = format!(
            "[[keys]]\nname = \"metered\"\nsha256 = \"{}\"\nroles = [\"sender\"]\nqueues = [\"*\"]\n\
             tenant = \"a\"\nrate_per_s = 0.2\nburst = 3\n\
             [[keys]]\nname = \"app\"\nsha256 = \"{}\"\nroles = [\"sender\", \"observer\"]\nqueues = [\"other\"]\n\
             [[apps]]\nname = \"playground\"\napp_id = \"app-id-1\"\nqueues = [\"requests\"]\ntenant = \"web\"\n",
            hex::encode(Sha256::digest(b"metered-secret")),
            hex::encode(Sha256::digest(b"right-token")),
        );
        let parse = |text: &str| text.parse::<Table>().expect("TOML");
        assert_eq!(parse(&built), parse(&by_hand), "{built}");
    }
}
