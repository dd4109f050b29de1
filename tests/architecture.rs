//! ARCHITECTURE.md stays the map of the code: every source folder is on it, every source
//! file has a `//!` header (where per-file detail lives), every function the send's steps
//! name exists, every log event the code emits is listed with the module that emits it, and
//! the server's imports keep
//! the shape the map declares: no circle among its files, no arrow up the layers, and none
//! of the absences its invariants name (`architecture/imports.rs` reads the imports).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

// The import graph's reader, in a file of its own (no test target of its own).
#[path = "architecture/imports.rs"]
mod imports;

use imports::{Graph, Written};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SOURCE_DIRS: &[&str] = &["src", "wire/src", "client/src", "entra/src", "backoff/src"];

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

fn source_files() -> Vec<String> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        rust_files(&Path::new(ROOT).join(dir), &mut files);
    }
    files
}

/// The text of a `## {title}` section of the map, up to the next `## ` heading.
fn section(map: &str, title: &str) -> String {
    let start = map
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has a {title} section"));
    let rest = &map[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_owned()
}

#[test]
fn every_source_folder_is_on_the_code_map_and_the_map_names_no_other() {
    let folders: BTreeSet<String> = source_files()
        .iter()
        .filter_map(|file| file.rsplit_once('/').map(|(dir, _)| format!("{dir}/")))
        .collect();
    let map = section(&architecture(), "Code map");
    let missing: Vec<_> = folders
        .iter()
        .filter(|f| !map.contains(&format!("`{f}`")))
        .collect();
    let stale: Vec<_> = map
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|p| p.ends_with('/') && SOURCE_DIRS.iter().any(|d| p.starts_with(d)))
        .filter(|p| !Path::new(ROOT).join(p).is_dir())
        .collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "folders not on the code map: {missing:?}; on the map but gone: {stale:?}"
    );
}

#[test]
fn every_source_file_opens_with_a_header_saying_what_it_holds() {
    let headless: Vec<_> = source_files()
        .into_iter()
        .filter(|file| {
            let text = std::fs::read_to_string(Path::new(ROOT).join(file)).expect("a source file");
            !text.trim_start().starts_with("//!")
        })
        .collect();
    assert!(
        headless.is_empty(),
        "files without a `//!` header: {headless:?}"
    );
}

#[test]
fn every_function_the_send_steps_name_is_in_the_file_they_name() {
    let rows = marked(&architecture(), "send");
    let mut named = 0;
    let mut missing = Vec::new();
    for row in rows
        .iter()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| step"))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (file, functions) = (cells[3].trim_matches('`'), cells[4]);
        let text = std::fs::read_to_string(Path::new(ROOT).join("src").join(file))
            .unwrap_or_else(|_| panic!("the send's steps name src/{file}, which does not exist"));
        for function in functions.split(',').map(|f| f.trim().trim_matches('`')) {
            named += 1;
            let defined = ["(", "<"]
                .iter()
                .any(|open| text.contains(&format!("fn {function}{open}")));
            if !defined {
                missing.push(format!("src/{file}: fn {function}"));
            }
        }
    }
    assert!(named >= 8, "the send's steps name {named} functions");
    assert!(
        missing.is_empty(),
        "named by the send's steps but not defined: {missing:?}"
    );
}

/// `(event, file)` for every `event = "..."` in the sources.
fn emitted_events() -> BTreeSet<(String, String)> {
    let mut events = BTreeSet::new();
    for file in source_files() {
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
        let file = if module.starts_with("client/") || module.starts_with("entra/") {
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

/// The lines of ARCHITECTURE.md between `<!-- {name}:begin -->` and `<!-- {name}:end -->`.
fn marked(map: &str, name: &str) -> Vec<String> {
    map.split(&format!("<!-- {name}:begin -->"))
        .nth(1)
        .and_then(|rest| rest.split(&format!("<!-- {name}:end -->")).next())
        .unwrap_or_else(|| panic!("the {name} table between its markers"))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The server library's files (`src/main.rs` is the binary, another crate).
fn server_graph() -> Graph {
    let mut paths = Vec::new();
    rust_files(&Path::new(ROOT).join("src"), &mut paths);
    paths.retain(|p| p != "src/main.rs");
    paths.sort();
    Graph::of_sources(paths.into_iter().map(|path| {
        let text = std::fs::read_to_string(Path::new(ROOT).join(&path)).expect("a source file");
        (path, text)
    }))
}

/// `path:line → path` for an edge.
fn shown(graph: &Graph, edge: &imports::Edge) -> String {
    format!(
        "{}:{} → {}",
        graph.files[edge.from].path, edge.line, graph.files[edge.to].path
    )
}

/// A circle is a set of files that each reach the others through their imports; see
/// `architecture/imports.rs` for what counts as an import. One is reported with every
/// import that runs between its files.
#[test]
fn no_import_circle_among_the_servers_files() {
    let graph = server_graph();
    let edges = graph.edges();
    let mut report = Vec::new();
    for circle in graph.circles() {
        let files: Vec<&str> = circle
            .iter()
            .map(|&i| graph.files[i].path.as_str())
            .collect();
        let inside: Vec<String> = edges
            .iter()
            .filter(|e| circle.contains(&e.from) && circle.contains(&e.to))
            .map(|e| format!("    {}", shown(&graph, e)))
            .collect();
        report.push(format!("{}\n{}", files.join(" ↔ "), inside.join("\n")));
    }
    assert!(
        report.is_empty(),
        "{} import circle(s):\n{}",
        report.len(),
        report.join("\n")
    );
}

/// The top-level module a file belongs to (`src/http/errors.rs` → `http`); `None` for the
/// crate root.
fn top_module(graph: &Graph, file: usize) -> Option<&str> {
    graph.files[file].module.first().map(String::as_str)
}

/// ARCHITECTURE.md's layer table: module → layer (0 at the bottom).
fn layers() -> BTreeMap<String, u32> {
    let mut layers = BTreeMap::new();
    for row in marked(&architecture(), "layers") {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|c| c.parse::<u32>().ok()) else {
            continue;
        };
        for module in cells[2].split(',').map(|m| m.trim().trim_matches('`')) {
            let earlier = layers.insert(module.to_owned(), layer);
            assert!(earlier.is_none(), "{module} is in two layers");
        }
    }
    layers
}

#[test]
fn the_layer_table_names_every_top_level_module_once() {
    let graph = server_graph();
    let actual: BTreeSet<String> = (0..graph.files.len())
        .filter_map(|f| top_module(&graph, f).map(str::to_owned))
        .collect();
    let listed: BTreeSet<String> = layers().into_keys().collect();
    let missing: Vec<_> = actual.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "not in the layer table: {missing:?}; in it but gone: {stale:?}"
    );
}

/// A file imports from its own top-level module, or from a module of a lower layer: never
/// from a higher one, nor from another module of its own layer. The crate root (the module
/// list) imports nothing.
#[test]
fn no_import_runs_up_the_layers() {
    let graph = server_graph();
    let layers = layers();
    let layer = |f: usize| top_module(&graph, f).and_then(|m| layers.get(m).copied());
    let wrong: Vec<String> = graph
        .edges()
        .iter()
        .filter(|e| top_module(&graph, e.from) != top_module(&graph, e.to))
        .filter(|e| match (layer(e.from), layer(e.to)) {
            (Some(from), Some(to)) => to >= from,
            _ => true,
        })
        .map(|e| shown(&graph, e))
        .collect();
    assert!(
        wrong.is_empty(),
        "imports against the layers of ARCHITECTURE.md:\n{}",
        wrong.join("\n")
    );
}

/// One row of the invariants: a file or folder, and the path prefixes it never writes.
struct Absence {
    scope: String,
    forbidden: Vec<String>,
}

/// ARCHITECTURE.md's invariants: each row is a line `` - `src/x/` knows nothing of …:
/// `prefix`, `prefix`. ``, its first code span the file or folder, the others the prefixes.
fn absences() -> Vec<Absence> {
    marked(&architecture(), "invariants")
        .iter()
        .filter(|row| row.starts_with("- `"))
        .map(|row| {
            let mut spans = row.split('`').skip(1).step_by(2).map(str::to_owned);
            let scope = spans.next().expect("a file or folder");
            Absence {
                scope,
                forbidden: spans.collect(),
            }
        })
        .collect()
}

/// `crate::a::b` (or another crate's path) is `prefix` or starts with it, a segment at a time.
fn under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with("::"))
}

/// Every path a file of the row's scope writes (its `use`s, its code, its tests) is checked
/// against the row's prefixes, as written and, inside the crate, as the file it resolves to
/// (so a re-export cannot hide what is named). A path into the scope itself is allowed.
#[test]
fn every_invariant_of_absence_holds() {
    let graph = server_graph();
    let rows = absences();
    assert!(!rows.is_empty(), "the invariants table has no rows");
    let mut broken = Vec::new();
    for row in &rows {
        assert!(
            Path::new(ROOT).join(&row.scope).exists(),
            "an invariant names {}, which does not exist",
            row.scope
        );
        assert!(!row.forbidden.is_empty(), "{} forbids nothing", row.scope);
        let in_scope = |path: &str| {
            path == row.scope || (row.scope.ends_with('/') && path.starts_with(&row.scope))
        };
        for file in graph.files.iter().filter(|f| in_scope(&f.path)) {
            for reference in &file.references {
                let target = graph.target(&reference.path).map(|t| &graph.files[t]);
                if target.is_some_and(|t| in_scope(&t.path)) {
                    continue;
                }
                let written = reference.path.display();
                let resolved = target.map(|t| Written::Crate(t.module.clone()).display());
                for prefix in &row.forbidden {
                    let hit = under(&written, prefix)
                        || resolved.as_deref().is_some_and(|r| under(r, prefix));
                    if hit {
                        broken.push(format!(
                            "{}:{} names {written} ({} knows nothing of {prefix})",
                            file.path, reference.line, row.scope
                        ));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The image's dependency layer loads the workspace from the manifests alone: a member
/// whose Cargo.toml the Dockerfile does not copy breaks `cargo build` in the image (no
/// Docker engine here to build it, so the file is read).
#[test]
fn the_dockerfile_copies_every_workspace_members_manifest() {
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("Cargo.toml");
    let dockerfile =
        std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("Dockerfile");
    let members = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members list");
    let names: Vec<&str> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|m| *m != ".")
        .collect();
    assert!(names.len() >= 4, "members read: {names:?}");
    let missing: Vec<&&str> = names
        .iter()
        .filter(|m| !dockerfile.contains(&format!("COPY {m}/Cargo.toml ./{m}/")))
        .collect();
    assert!(
        missing.is_empty(),
        "the Dockerfile copies no manifest of {missing:?}"
    );
}

/// The functions (outside tests) longer than `limit` lines, as `file` `name`: from a
/// line opening `fn` to the line closing its body, braces counted outside strings,
/// characters and comments (as rustfmt lays them out; a file's tests start at its first
/// `#[cfg(test)]`).
fn long_functions(limit: usize) -> BTreeSet<String> {
    let mut long = BTreeSet::new();
    for file in source_files() {
        if file.ends_with("/tests.rs") || file.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(Path::new(ROOT).join(&file)).expect("a source file");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let lines: Vec<&str> = code.lines().collect();
        let mut at = 0;
        while at < lines.len() {
            let Some(name) = fn_name(lines[at]) else {
                at += 1;
                continue;
            };
            match body_end(&lines, at) {
                Some(end) => {
                    if end - at + 1 > limit {
                        long.insert(format!("`{file}` `{name}`"));
                    }
                    at = end + 1;
                }
                None => at += 1,
            }
        }
    }
    long
}

/// The name a line declares a function by, if it does (`pub(crate) async fn name`, …).
fn fn_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace();
    loop {
        let word = words.next()?;
        if word == "fn" {
            let name = words.next()?;
            return name.split(['(', '<']).next();
        }
        let qualifier = word.starts_with("pub")
            || matches!(word, "const" | "async" | "unsafe" | "extern" | "\"C\"");
        if !qualifier {
            return None;
        }
    }
}

/// The line closing the body of the function declared at `start` (none for a declaration
/// without a body, such as a trait's).
fn body_end(lines: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0i32;
    let mut opened = false;
    for (at, line) in lines.iter().enumerate().skip(start) {
        let code = line.split("//").next().unwrap_or_default();
        let mut in_string = false;
        let mut chars = code.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if in_string => {
                    chars.next();
                }
                '"' => in_string = !in_string,
                '\'' if !in_string => {
                    // A char literal ('{', '\'') is skipped whole; a lifetime is not.
                    let rest: String = chars.clone().take(3).collect();
                    if rest.starts_with('\\') || rest.chars().nth(1) == Some('\'') {
                        chars.find(|&c| c == '\'');
                    }
                }
                '{' if !in_string => {
                    depth += 1;
                    opened = true;
                }
                '}' if !in_string => depth -= 1,
                ';' if !in_string && !opened && depth == 0 => return None,
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return Some(at);
        }
    }
    None
}

#[test]
fn no_function_is_longer_than_sixty_lines_but_the_flat_tables_the_map_names() {
    let allowed: BTreeSet<String> = marked(&architecture(), "long")
        .iter()
        .filter_map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            cells
                .get(1)
                .filter(|c| c.starts_with('`') && c.contains("` `"))
                .map(|c| (*c).to_owned())
        })
        .collect();
    let long = long_functions(60);
    let unlisted: Vec<_> = long.difference(&allowed).collect();
    let short: Vec<_> = allowed.difference(&long).collect();
    assert!(
        unlisted.is_empty() && short.is_empty(),
        "functions over 60 lines the map does not name as flat tables: {unlisted:?}; named but no longer long: {short:?}"
    );
}

#[test]
fn the_length_check_counts_a_body_from_its_fn_line_to_its_closing_brace() {
    let lines = [
        "    pub(crate) async fn name<T>(x: T) -> u8 {",
        "        let brace = '{';",
        "        let text = \"}}\"; // }",
        "        0",
        "    }",
        "    fn declared(&self);",
    ];
    assert_eq!(fn_name(lines[0]), Some("name"));
    assert_eq!(body_end(&lines, 0), Some(4));
    assert_eq!(fn_name(lines[5]), Some("declared"));
    assert_eq!(body_end(&lines, 5), None);
    assert_eq!(fn_name("let f = fn_name(x);"), None);
}

#[test]
fn the_map_stays_at_most_twenty_thousand_characters() {
    let characters = architecture().chars().count();
    assert!(
        characters <= 20_000,
        "ARCHITECTURE.md is {characters} characters: a map, not a file-by-file listing"
    );
}

/// Build output is never committed: the workspaces' `target/` folders (the server's, and
/// bench/'s and fuzz/'s, workspaces of their own) are made by cargo, not written by anyone.
#[test]
fn no_build_output_is_tracked() {
    let listed = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(ROOT)
        .output()
        .expect("git runs");
    if !listed.status.success() {
        // Not a checkout (a source archive): nothing is tracked.
        return;
    }
    let tracked: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .split('\0')
        .filter(|path| path.split('/').any(|part| part == "target"))
        .take(5)
        .map(str::to_string)
        .collect();
    assert!(tracked.is_empty(), "build output tracked: {tracked:?}");
}
