//! `sendgate serve` (and `sendgate` alone): settings → telemetry → runtime → the
//! application, run until it stops. Exit 2 for a bad setting, 1 for an environment that
//! failed us.

use std::process::ExitCode;

use crate::config::Settings;
use crate::startup::Application;
use crate::telemetry;

pub fn run() -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sendgate: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(settings.log_format);
    // Names only, and only those that are text: `std::env::vars` panics on the others.
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for (name, known) in crate::config::servicebus_near_misses(names) {
        tracing::warn!(
            event = "unknown_variable",
            name,
            did_you_mean = known,
            "an unknown SERVICEBUS_* variable is ignored"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sendgate: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let app = match Application::build(settings).await {
            Ok(app) => app,
            Err(e) => {
                eprintln!("sendgate: {e}");
                return ExitCode::from(e.exit_code());
            }
        };
        match app.run_until_stopped(true).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sendgate: server error: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
