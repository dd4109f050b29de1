//! ARCHITECTURE.md stays the map of the code: every source file is on it, and every log
//! event the code emits is listed with the module that emits it.

use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SOURCE_DIRS: &[&str] = &["src", "wire/src", "client/src"];

fn architecture() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

fn rust_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(ROOT).expect("inside the repository");
            out.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The files the map's code blocks name: a line starting with a path names it (a path
/// ending in `/` opens a folder); a line indented by two spaces names a file in the
/// folder opened last. Other lines are descriptions.
fn mapped_files(map: &str) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    let mut folder = String::new();
    let mut in_code = false;
    for line in map.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code {
            continue;
        }
        let indented = line.starts_with("  ") && !line.starts_with("   ");
        let Some(token) = line.split_whitespace().next() else {
            continue;
        };
        if !line.starts_with(' ') {
            if token.ends_with('/') {
                folder = token.to_owned();
            } else if token.ends_with(".rs") {
                files.insert(token.to_owned());
            }
        } else if indented && token.ends_with(".rs") {
            files.insert(format!("{folder}{token}"));
        }
    }
    files
}

#[test]
fn every_source_file_is_on_the_map_and_the_map_names_no_other() {
    let mut actual = Vec::new();
    for dir in SOURCE_DIRS {
        rust_files(&Path::new(ROOT).join(dir), &mut actual);
    }
    let actual: BTreeSet<String> = actual.into_iter().collect();
    let mapped = mapped_files(&architecture());
    let missing: Vec<_> = actual.difference(&mapped).collect();
    let stale: Vec<_> = mapped.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "not on the map: {missing:?}; on the map but gone: {stale:?}"
    );
}

/// `(event, file)` for every `event = "..."` in the sources.
fn emitted_events() -> BTreeSet<(String, String)> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        rust_files(&Path::new(ROOT).join(dir), &mut files);
    }
    let mut events = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(Path::new(ROOT).join(&file)).expect("a source file");
        for piece in text.split("event = \"").skip(1) {
            if let Some((name, _)) = piece.split_once('"') {
                events.insert((name.to_owned(), file.clone()));
            }
        }
    }
    events
}

#[test]
fn every_log_event_is_listed_with_the_module_that_emits_it() {
    let map = architecture();
    let table = map
        .split("<!-- events:begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- events:end -->").next())
        .expect("the events table between its markers");
    let mut listed = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let module = cells[2].trim_matches('`');
        let file = if module.starts_with("client/") {
            module.to_owned()
        } else {
            format!("src/{module}")
        };
        for event in cells[1].split(',').map(|e| e.trim().trim_matches('`')) {
            listed.insert((event.to_owned(), file.clone()));
        }
    }
    let emitted = emitted_events();
    let unlisted: Vec<_> = emitted
        .iter()
        .filter(|(event, _)| !listed.iter().any(|(e, _)| e == event))
        .collect();
    assert!(
        unlisted.is_empty(),
        "events missing from ARCHITECTURE.md: {unlisted:?}"
    );
    let wrong: Vec<_> = listed.difference(&emitted).collect();
    assert!(
        wrong.is_empty(),
        "listed but not emitted by that module: {wrong:?}"
    );
}
