//! The README and the pages under docs/ stay usable: every relative link reaches a file
//! (and a heading, when it names one), and every command the README shows names scripts,
//! subcommands, flags and variables that exist. Nothing here runs a command for real: a
//! `sendgate` invocation is checked against `sendgate <subcommand> --help`, a script by its
//! file and its executable bit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The pages whose links are checked.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        PathBuf::from("README.md"),
        PathBuf::from("ARCHITECTURE.md"),
        PathBuf::from("infra/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| {
            p.strip_prefix(ROOT)
                .expect("inside the repository")
                .to_owned()
        })
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(page: &Path) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(page))
        .unwrap_or_else(|e| panic!("{}: {e}", page.display()))
}

/// A page split into its prose (fenced code blocks removed) and its fenced blocks with
/// their info strings.
struct Parsed {
    prose: String,
    blocks: Vec<(String, String)>,
}

fn parse(text: &str) -> Parsed {
    let mut prose = String::new();
    let mut blocks = Vec::new();
    let mut block: Option<(String, String)> = None;
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut block, fence) {
            (None, true) => {
                let info = line.trim_start().trim_start_matches('`').trim().to_owned();
                block = Some((info, String::new()));
            }
            (Some(_), true) => blocks.extend(block.take()),
            (Some((_, body)), false) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, false) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    Parsed { prose, blocks }
}

/// The prose with inline code spans blanked out (a span may hold `](`).
fn without_code_spans(prose: &str) -> String {
    let mut out = String::new();
    let mut in_span = false;
    for c in prose.chars() {
        if c == '`' {
            in_span = !in_span;
            out.push(' ');
        } else if in_span && c != '\n' {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The inline code spans of the prose, a span broken over lines joined by a space.
fn code_spans(prose: &str) -> Vec<String> {
    prose
        .replace('\n', " ")
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every `[text](target)` and `![alt](target)` target in the prose.
fn link_targets(prose: &str) -> Vec<String> {
    let prose = without_code_spans(prose);
    let mut targets = Vec::new();
    for piece in prose.split("](").skip(1) {
        if let Some(end) = piece.find(')') {
            let target = piece[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_owned());
        }
    }
    targets
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces made hyphens,
/// a repeated heading numbered from 1.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in parse(text).prose.lines() {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let mut plain = heading.trim().to_owned();
        // A link in a heading counts by its text.
        while let (Some(open), Some(mid)) = (plain.find('['), plain.find("](")) {
            let Some(close) = plain[mid..].find(')').map(|c| mid + c) else {
                break;
            };
            if open > mid {
                break;
            }
            plain = format!(
                "{}{}{}",
                &plain[..open],
                &plain[open + 1..mid],
                &plain[close + 1..]
            );
        }
        let slug: String = plain
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_default();
        anchors.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    anchors
}

#[test]
fn every_relative_link_reaches_a_file_and_its_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        let dir = page.parent().unwrap_or(Path::new("")).to_owned();
        for target in link_targets(&parse(&text).prose) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let on_disk = Path::new(ROOT).join(&file);
            if !on_disk.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let is_markdown = file.extension().is_some_and(|e| e == "md");
                if is_markdown && !anchors(&read(&file)).contains(anchor) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Words of one shell line, split into simple commands at `|`, `;`, `&` and `&&`; quotes
/// kept inside their word, `$(...)` kept whole, redirections and their targets dropped.
fn simple_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut word = String::new();
    let mut chars = line.chars().peekable();
    let mut redirect = false;
    let end_word = |word: &mut String, commands: &mut Vec<Vec<String>>, redirect: &mut bool| {
        if !word.is_empty() {
            if *redirect {
                *redirect = false;
            } else {
                commands.last_mut().expect("a command").push(word.clone());
            }
            word.clear();
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                word.push(c);
                for q in chars.by_ref() {
                    word.push(q);
                    if q == c {
                        break;
                    }
                }
            }
            '$' if chars.peek() == Some(&'(') => {
                let mut depth = 0;
                word.push(c);
                for q in chars.by_ref() {
                    word.push(q);
                    match q {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            '#' if word.is_empty() => break,
            ' ' | '\t' => end_word(&mut word, &mut commands, &mut redirect),
            '|' | ';' | '&' => {
                end_word(&mut word, &mut commands, &mut redirect);
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                commands.push(Vec::new());
            }
            '>' | '<' => {
                // `2>file`, `>> file`: the descriptor and the target are not words.
                if word.chars().all(|d| d.is_ascii_digit()) {
                    word.clear();
                }
                end_word(&mut word, &mut commands, &mut redirect);
                if chars.peek() == Some(&'>') {
                    chars.next();
                }
                redirect = true;
            }
            _ => word.push(c),
        }
    }
    end_word(&mut word, &mut commands, &mut redirect);
    commands.retain(|c| !c.is_empty());
    commands
}

/// The command lines of a shell block: a line ending in `\` or inside an open quote is
/// joined with the next.
fn shell_lines(block: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    for line in block.lines() {
        for c in line.chars() {
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '\'' || c == '"' => quote = Some(c),
                None if c == '#' => break,
                None => {}
            }
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) if quote.is_none() => {
                current.push_str(head);
                current.push(' ');
            }
            _ if quote.is_some() => {
                current.push_str(line);
                current.push(' ');
            }
            _ => {
                current.push_str(line);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    lines
}

/// Tools the README may use beside its own: the shell's and a laptop's.
const TOOLS: &[&str] = &[
    "curl", "kill", "sleep", "date", "python3", "grep", "sort", "uniq", "seq", "echo", "export",
    "cat", "docker", "az",
];

/// Checks `sendgate` invocations against the binary's own help, once per subcommand.
struct Sendgate {
    help: BTreeMap<Vec<String>, Option<String>>,
}

impl Sendgate {
    fn help(&mut self, path: &[String]) -> Option<String> {
        self.help
            .entry(path.to_vec())
            .or_insert_with(|| {
                let out = Command::new(env!("CARGO_BIN_EXE_sendgate"))
                    .args(path)
                    .arg("--help")
                    .output()
                    .expect("the sendgate binary runs");
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            })
            .clone()
    }

    /// What is wrong with `sendgate <args>`, if anything.
    fn check(&mut self, args: &[String]) -> Option<String> {
        let mut path: Vec<String> = Vec::new();
        let mut help = self.help(&path).expect("sendgate --help");
        for arg in args.iter().take_while(|a| !a.starts_with('-')) {
            let mut longer = path.clone();
            longer.push(arg.clone());
            match self.help(&longer) {
                Some(more) => {
                    path = longer;
                    help = more;
                }
                None => break,
            }
        }
        if path.is_empty() && args.first().is_some_and(|a| !a.starts_with('-')) {
            return Some(format!("no subcommand `{}`", args[0]));
        }
        args.iter()
            .filter(|a| a.starts_with("--"))
            .map(|a| a.split('=').next().unwrap_or(a))
            .find(|flag| {
                !help.contains(&format!("{flag} ")) && !help.contains(&format!("{flag}\n"))
            })
            .map(|flag| format!("`sendgate {}` has no flag {flag}", path.join(" ")))
    }
}

/// What is wrong with one simple command, if anything. `strict`: an unknown program is
/// wrong too (the README); otherwise only sendgate, scripts and variables are checked.
fn check_command(words: &[String], strict: bool, sendgate: &mut Sendgate) -> Option<String> {
    let mut words: Vec<&String> = words.iter().collect();
    for keyword in ["do", "then", "time"] {
        if words.first().is_some_and(|w| *w == keyword) {
            words.remove(0);
        }
    }
    while let Some((name, _)) = words.first().and_then(|w| w.split_once('=')) {
        let ours = ["SENDGATE_", "SERVICEBUS_", "OTEL_"]
            .iter()
            .any(|p| name.starts_with(p));
        if ours && !sendgate::config::VARIABLES.iter().any(|v| v.name == name) {
            return Some(format!("no variable {name}"));
        }
        words.remove(0);
    }
    let program = words.first()?;
    let args: Vec<String> = words[1..].iter().map(|w| (*w).clone()).collect();
    match program.as_str() {
        "for" | "done" | "fi" | "while" | "if" => None,
        "cargo" if args.first().is_some_and(|a| a == "run") => {
            let after = args.iter().position(|a| a == "--");
            after.and_then(|i| sendgate.check(&args[i + 1..]))
        }
        "cargo" => None,
        "sendgate" => sendgate.check(&args),
        p if p.starts_with("./target/") && p.ends_with("/sendgate") => sendgate.check(&args),
        p if p.starts_with("./") => {
            let file = Path::new(ROOT).join(p);
            let executable = std::fs::metadata(&file).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            });
            (!executable).then(|| format!("{p} is not an executable file"))
        }
        p if strict && !TOOLS.contains(&p) => Some(format!("unknown program {p}")),
        _ => None,
    }
}

/// Whether an inline code span is a command worth checking.
fn is_command(span: &str) -> bool {
    span.starts_with("sendgate ")
        || span.starts_with("cargo run ")
        || span.starts_with("./scripts/")
        || span.starts_with("./bench/")
}

#[test]
fn every_command_the_readme_and_the_docs_show_names_what_exists() {
    let mut sendgate = Sendgate {
        help: BTreeMap::new(),
    };
    let mut wrong = Vec::new();
    for page in pages() {
        let strict = page == Path::new("README.md");
        let parsed = parse(&read(&page));
        let mut lines: Vec<String> = parsed
            .blocks
            .iter()
            .filter(|(info, _)| matches!(info.as_str(), "sh" | "bash" | "shell"))
            .flat_map(|(_, body)| shell_lines(body))
            .collect();
        lines.extend(
            code_spans(&parsed.prose)
                .into_iter()
                .filter(|s| is_command(s)),
        );
        for line in lines {
            for command in simple_commands(&line) {
                if let Some(problem) = check_command(&command, strict, &mut sendgate) {
                    wrong.push(format!("{}: `{}`: {problem}", page.display(), line.trim()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "commands that no longer work:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_are_for() {
    let mut sendgate = Sendgate {
        help: BTreeMap::new(),
    };
    let command = |line: &str| simple_commands(line).remove(0);
    let ok = |line: &str, sendgate: &mut Sendgate| check_command(&command(line), true, sendgate);
    assert_eq!(
        ok(
            "cargo run -q -- queue depth --queue requests",
            &mut sendgate
        ),
        None
    );
    assert!(ok(
        "cargo run -q -- queue depth --queues requests",
        &mut sendgate
    )
    .is_some());
    assert!(ok("cargo run -q -- queues depth", &mut sendgate).is_some());
    assert!(ok("SENDGATE_NO_SUCH=1 cargo run", &mut sendgate).is_some());
    assert!(ok("./scripts/no-such.sh", &mut sendgate).is_some());
    assert!(ok("curlx -s localhost", &mut sendgate).is_some());
    assert_eq!(ok("./scripts/test.sh", &mut sendgate), None);
    assert_eq!(
        simple_commands("a 'x | y' | b 2>log & c >> out"),
        vec![
            vec!["a".to_owned(), "'x | y'".to_owned()],
            vec!["b".to_owned()],
            vec!["c".to_owned()]
        ]
    );
    assert!(anchors("# A: b, c\n## A: b, c\n").contains("a-b-c-1"));
    assert_eq!(
        link_targets("[a](x.md#y) `[b](z)` ![c](p.png)"),
        ["x.md#y", "p.png"]
    );
}

/// The keys of a JSON object, and of each object in its arrays (`messages`), by path.
fn key_paths(value: &serde_json::Value, at: &str, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                let path = format!("{at}/{key}");
                key_paths(value, &path, out);
                out.insert(path);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

/// The README's sample `201 queued` bodies (a `# {"status":"queued",...}` comment, on one
/// line or several; one elided with `…` between members is not a sample of every field)
/// name the fields a real answer has: a single send's `Queued` and a batch's
/// `BatchQueued`, each with its `traceparent` (issue 40, item 10).
#[test]
fn the_readmes_sample_201_bodies_have_every_field_of_the_answer() {
    let readme = read(Path::new("README.md"));
    let mut samples = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(start) = line.trim_start().strip_prefix("# {\"status\":\"queued\"") else {
            continue;
        };
        let mut text = format!("{{\"status\":\"queued\"{start}");
        while serde_json::from_str::<serde_json::Value>(&text).is_err() {
            match lines.next().and_then(|l| l.trim_start().strip_prefix("#")) {
                Some(more) if !text.contains(",…") => text.push_str(more),
                _ => break,
            }
        }
        if let Ok(sample) = serde_json::from_str::<serde_json::Value>(&text) {
            samples.push(sample);
        }
    }
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut single = sendgate_wire::Queued::new("q", "id", "r", false);
    single.traceparent = Some(trace.into());
    let message = sendgate_wire::BatchMessage {
        message_id: "id".into(),
        traceparent: trace.into(),
        duplicate: false,
    };
    let batch = sendgate_wire::BatchQueued {
        status: "queued".into(),
        dry_run: false,
        queue: "q".into(),
        request_id: "r".into(),
        count: 1,
        messages: vec![message],
    };
    let keys = |value: serde_json::Value| {
        let mut out = BTreeSet::new();
        key_paths(&value, "", &mut out);
        out
    };
    let single = keys(serde_json::to_value(single).unwrap());
    let batch = keys(serde_json::to_value(batch).unwrap());
    assert_eq!(samples.len(), 2, "{samples:?}");
    for sample in samples {
        let shown = keys(sample.clone());
        let answer = if sample.get("messages").is_some() {
            &batch
        } else {
            &single
        };
        assert_eq!(&shown, answer, "README.md's sample {sample}");
    }
}
