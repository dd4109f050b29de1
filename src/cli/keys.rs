//! `sendgate keys new`: a fresh token, shown once on stderr, and on stdout the keys-file
//! entry that holds only its SHA-256.

use std::process::ExitCode;

use clap::Subcommand;

use crate::domain::QueueName;
use crate::http::auth::{new_token, token_digest, Role};

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Print a new random token and the [[keys]] entry to paste into SENDGATE_API_KEYS_FILE.
    New {
        #[arg(long)]
        name: String,
        /// sender, observer or admin; repeat for several.
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// A queue name or *; repeat for several.
        #[arg(long = "queue", default_value = "*")]
        queues: Vec<String>,
    },
}

pub fn run(command: KeysCommand) -> ExitCode {
    let KeysCommand::New {
        name,
        roles,
        queues,
    } = command;
    for r in &roles {
        if Role::parse(r).is_none() {
            eprintln!("sendgate: --role: unknown role {r:?} (sender, observer, admin)");
            return ExitCode::from(2);
        }
    }
    for q in queues.iter().filter(|q| *q != "*") {
        if let Err(e) = QueueName::parse(q) {
            eprintln!("sendgate: --queue {q:?}: {e}");
            return ExitCode::from(2);
        }
    }
    let token = new_token();
    let list = |items: &[String]| {
        items
            .iter()
            .map(|i| format!("{i:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // The token goes to stderr and the entry to stdout, so `keys new ... >> keys.toml`
    // appends the entry while the token is shown once and written nowhere.
    eprintln!("token for {name:?} (shown once, not stored anywhere; give it to the client):");
    eprintln!("{token}");
    println!("[[keys]]");
    println!("name = {name:?}");
    println!("sha256 = \"{}\"", hex::encode(token_digest(&token)));
    println!("roles = [{}]", list(&roles));
    println!("queues = [{}]", list(&queues));
    ExitCode::SUCCESS
}
