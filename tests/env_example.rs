//! `.env.example` and `docs/configuration.md` are rendered from the variable descriptors
//! (`src/config/vars.rs`); the committed copies must be exactly that. To refresh them:
//! `cargo run -q -- config env-example > .env.example` and
//! `cargo run -q -- config docs > docs/configuration.md`.

use std::collections::BTreeSet;

use sendgate::config::render;

fn committed(file: &str) -> String {
    std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn env_example_is_what_the_descriptors_render() {
    assert_eq!(
        committed(".env.example"),
        render::env_example(),
        "stale .env.example: run `cargo run -q -- config env-example > .env.example`"
    );
}

#[test]
fn the_configuration_page_is_what_the_descriptors_render() {
    assert_eq!(
        committed("docs/configuration.md"),
        render::configuration_page(),
        "stale docs/configuration.md: run `cargo run -q -- config docs > docs/configuration.md`"
    );
}

#[test]
fn env_example_lists_every_variable_the_code_reads_and_no_other() {
    let text = committed(".env.example");
    let documented: BTreeSet<String> = text
        .lines()
        .map(|l| l.trim_start_matches('#').trim())
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()))
        .filter(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    let read: BTreeSet<String> = sendgate::config::VARIABLES
        .iter()
        .map(|v| v.name.to_owned())
        .collect();
    assert_eq!(documented, read);
}

#[test]
fn env_example_defaults_match_the_code() {
    let text = committed(".env.example");
    for line in text.lines().map(|l| l.trim_start_matches('#').trim()) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let Some(var) = sendgate::config::VARIABLES.iter().find(|v| v.name == key) else {
            continue;
        };
        if let Some(default) = var.default {
            assert_eq!(value, default, "{key}");
        }
    }
}
