//! `sendgate config`: print what is rendered from the variable descriptors, to refresh the
//! committed copies (`.env.example`, the README's table) after a variable changes.

use std::process::ExitCode;

use clap::Subcommand;

use crate::config::render;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print `.env.example`.
    EnvExample,
    /// Print the README's variable table.
    MarkdownTable,
}

pub fn run(command: ConfigCommand) -> ExitCode {
    print!(
        "{}",
        match command {
            ConfigCommand::EnvExample => render::env_example(),
            ConfigCommand::MarkdownTable => render::markdown_table(),
        }
    );
    ExitCode::SUCCESS
}
