//! `sendgate config`: print what is rendered from the variable descriptors, to refresh the
//! committed copies (`.env.example`, `docs/configuration.md`) after a variable changes.

use std::process::ExitCode;

use clap::Subcommand;

use crate::config::render;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print `.env.example`.
    EnvExample,
    /// Print `docs/configuration.md` (the variables' table and the words around it).
    Docs,
}

pub fn run(command: ConfigCommand) -> ExitCode {
    print!(
        "{}",
        match command {
            ConfigCommand::EnvExample => render::env_example(),
            ConfigCommand::Docs => render::configuration_page(),
        }
    );
    ExitCode::SUCCESS
}
