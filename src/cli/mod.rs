//! The command line: `serve` (the default), `queue`, `keys`, `send`, `openapi` (printed
//! by `http::openapi`), and the hidden `config`. One file per subcommand that has options.

mod config;
mod keys;
mod queue;
mod send;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sendgate",
    version,
    about = "An HTTP gateway that refuses work the queue cannot take."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (what `sendgate` with no subcommand does).
    Serve,
    /// Work with the embedded queue on local disk.
    Queue {
        #[command(subcommand)]
        action: queue::QueueCommand,
    },
    /// Make API keys.
    Keys {
        #[command(subcommand)]
        action: keys::KeysCommand,
    },
    /// Send one message per JSON line to a gateway (the producer client).
    Send(send::SendArgs),
    /// Print the OpenAPI 3.1 document that GET /openapi.json serves with API keys
    /// (docs/openapi.json).
    Openapi {
        /// The document an open gateway (no keys file) serves instead: no security
        /// requirement on any route.
        #[arg(long)]
        open: bool,
    },
    /// Print what the variable descriptors render (`.env.example`, docs/configuration.md).
    #[command(hide = true)]
    Config {
        #[command(subcommand)]
        action: config::ConfigCommand,
    },
}

pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    // Before any subcommand builds an HTTP client (see tls.rs).
    crate::tls::install_ring();
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => serve::run(),
        Command::Queue { action } => queue::run(action),
        Command::Keys { action } => keys::run(action),
        Command::Send(args) => send::run(args),
        Command::Config { action } => config::run(action),
        Command::Openapi { open } => {
            use crate::http::openapi::{json_for, Mode};
            print!("{}", json_for(if open { Mode::Open } else { Mode::Keys }));
            ExitCode::SUCCESS
        }
    }
}
