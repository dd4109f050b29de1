//! `.env.example` documents exactly the variables the configuration code reads.

use std::collections::BTreeSet;

#[test]
fn env_example_lists_every_variable_the_code_reads_and_no_other() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.env.example")).unwrap();
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
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.env.example")).unwrap();
    for line in text.lines().map(|l| l.trim_start_matches('#').trim()) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let Some(var) = sendgate::config::VARIABLES.iter().find(|v| v.name == key) else {
            continue;
        };
        if let Some(default) = var.default {
            if !value.is_empty() && !value.contains(".servicebus.windows.net") {
                assert_eq!(value, default, "{key}");
            }
        }
    }
}
