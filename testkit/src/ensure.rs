//! The services the suites need on this machine, started by the repository's
//! `scripts/ensure-*.sh` when they are not up, once per test binary. A test that needs one
//! fails loudly when it cannot be had; it never skips.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// The local RabbitMQ and its management plugin (`scripts/ensure-rabbitmq.sh`).
pub fn rabbitmq() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    ensure(&READY, "ensure-rabbitmq.sh", "RabbitMQ", || Ok(()));
}

/// The local Redis, with `redis-server` and `redis-cli` (`scripts/ensure-redis.sh`).
pub fn redis() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    ensure(&READY, "ensure-redis.sh", "Redis", || Ok(()));
}

/// Headless Chromium and chromedriver, Debian's packages (`scripts/ensure-chromium.sh`).
pub fn chromium() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    ensure(
        &READY,
        "ensure-chromium.sh",
        "Chromium and chromedriver",
        || {
            for binary in [crate::browser::CHROMIUM, crate::browser::CHROMEDRIVER] {
                if !Path::new(binary).exists() {
                    return Err(format!("{binary} is missing"));
                }
            }
            Ok(())
        },
    );
}

/// Run `script` the first time a test of this binary asks, then `check` what it should
/// have left; every later call answers what the first one found.
fn ensure(
    ready: &'static OnceLock<Result<(), String>>,
    script: &str,
    what: &str,
    check: impl FnOnce() -> Result<(), String>,
) {
    let ready = ready.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scripts")
            .join(script);
        let out = Command::new("bash")
            .arg(&path)
            .output()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        check()
    });
    if let Err(e) = ready {
        panic!("{what} is required for this test and could not be had ({script}): {e}");
    }
}
