//! The server library's import graph, read from its source text (rustfmt-formatted Rust; no
//! parser crate: the few shapes this codebase uses are read directly).
//!
//! **A file is a module.** `src/lib.rs` is `crate`, `src/a.rs` and `src/a/mod.rs` are
//! `crate::a`, `src/a/b.rs` is `crate::a::b`. A module written inline (`mod tests { … }`,
//! `pub mod spelling { … }`) belongs to the file it is written in. (`src/main.rs` is another
//! crate, the binary: the caller leaves it out.)
//!
//! **What is a path.** Comments and string and character literals are blanked first. Then:
//! - every `use` declaration (module level or inside a function, `pub` or not, braces
//!   across lines), expanded into one path per leaf;
//! - every path written in code or attributes (`crate::a::b`, `super::send::is_json`,
//!   `actix_web::web::Data`): a run of identifiers joined by `::`, not preceded by `::`.
//!
//! A path is made absolute where the crate can be seen in it: `crate::` from the root,
//! `super::` and `self::` from the module it is written in (an inline `mod tests`' `super`
//! is its file), and a first segment that is a `mod` the file declares from that file.
//! Anything else (`std::`, `actix_web::`, a local enum's `Kind::A`) names another crate or
//! nothing this graph cares about.
//!
//! **Where an edge goes.** An absolute path names the file of the longest module prefix it
//! has (`crate::http::errors::Problem` → `src/http/errors.rs`). When the next segment is a
//! name that file only brings into scope with a module-level `use` (a `pub use` re-export,
//! or a private `use` a child module reaches through `super::`), the edge follows that `use`
//! to the file that defines the item; a re-export of another crate's item stays at the
//! re-exporting file. So:
//! - `mod child;` is no edge: declaring a module uses none of it;
//! - a parent naming a child's item (`send::send_message` in a routing table) is an edge
//!   parent → child;
//! - a child naming its parent's own item (`use super::Dispatcher`) is an edge child →
//!   parent; naming something the parent merely re-exports goes to where it is defined, and
//!   `use super::sibling::X` goes to the sibling;
//! - a glob (`use super::*`) is an edge to the module it globs;
//! - a file naming itself (an inline `mod tests`' `use super::*`) is no edge.
//!
//! Not read: `#[path]` attributes (`src/` has none) and paths a macro puts together.

use std::collections::{BTreeMap, BTreeSet};

/// A path as a file writes it, made absolute where possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Inside this crate: module segments from the root, then the item's (if any).
    Crate(Vec<String>),
    /// Another crate's, or not resolvable from the text (a local type's associated item).
    Other(Vec<String>),
}

impl Written {
    /// `crate::a::b` or `actix_web::web`, to be matched against a prefix.
    pub fn display(&self) -> String {
        match self {
            Written::Crate(segments) => std::iter::once("crate")
                .chain(segments.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join("::"),
            Written::Other(segments) => segments.join("::"),
        }
    }
}

/// One path and the line it was written on.
#[derive(Debug, Clone)]
pub struct Reference {
    pub line: usize,
    pub path: Written,
}

pub struct SourceFile {
    /// `src/http/errors.rs`
    pub path: String,
    /// `["http", "errors"]`
    pub module: Vec<String>,
    /// Every path the file writes.
    pub references: Vec<Reference>,
    /// The names its module-level `use`s bring into scope, and from where.
    scope: BTreeMap<String, Written>,
}

/// An edge of the file graph, with the line that makes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub line: usize,
}

pub struct Graph {
    pub files: Vec<SourceFile>,
    by_module: BTreeMap<Vec<String>, usize>,
}

impl Graph {
    /// `(path under the repository, text)` for every file of the crate.
    pub fn of_sources(sources: impl IntoIterator<Item = (String, String)>) -> Self {
        let files: Vec<SourceFile> = sources
            .into_iter()
            .map(|(path, text)| read(&path, &text))
            .collect();
        let by_module = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        Self { files, by_module }
    }

    /// The file an absolute path ends in, following module-level `use`s (see the module
    /// docs). `None` for another crate's path.
    pub fn target(&self, path: &Written) -> Option<usize> {
        match path {
            Written::Crate(segments) => Some(self.target_of(segments, 0)),
            Written::Other(_) => None,
        }
    }

    fn target_of(&self, segments: &[String], depth: usize) -> usize {
        let (file, prefix) = (0..=segments.len())
            .rev()
            .find_map(|n| self.by_module.get(&segments[..n]).map(|&i| (i, n)))
            .expect("src/lib.rs is the root");
        let rest = &segments[prefix..];
        let Some(name) = rest.first() else {
            return file;
        };
        // A chain of re-exports is short; a cycle of them would not compile.
        match self.files[file].scope.get(name) {
            Some(Written::Crate(source)) if depth < 16 => {
                let mut next = source.clone();
                next.extend_from_slice(&rest[1..]);
                self.target_of(&next, depth + 1)
            }
            _ => file,
        }
    }

    /// Every edge between two different files, once per line that makes it.
    pub fn edges(&self) -> BTreeSet<Edge> {
        let mut edges = BTreeSet::new();
        for (from, file) in self.files.iter().enumerate() {
            for reference in &file.references {
                if let Some(to) = self.target(&reference.path) {
                    if to != from {
                        edges.insert(Edge {
                            from,
                            to,
                            line: reference.line,
                        });
                    }
                }
            }
        }
        edges
    }

    /// The circles: every strongly connected set of more than one file (Tarjan), each
    /// sorted by path, in the order of their first file.
    pub fn circles(&self) -> Vec<Vec<usize>> {
        let mut next: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); self.files.len()];
        for edge in self.edges() {
            next[edge.from].insert(edge.to);
        }
        let mut tarjan = Tarjan {
            next: &next,
            index: vec![None; self.files.len()],
            low: vec![0; self.files.len()],
            on_stack: vec![false; self.files.len()],
            stack: Vec::new(),
            counter: 0,
            components: Vec::new(),
        };
        for node in 0..self.files.len() {
            if tarjan.index[node].is_none() {
                tarjan.visit(node);
            }
        }
        let mut circles: Vec<Vec<usize>> = tarjan
            .components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|mut c| {
                c.sort_by(|a, b| self.files[*a].path.cmp(&self.files[*b].path));
                c
            })
            .collect();
        circles.sort_by(|a, b| self.files[a[0]].path.cmp(&self.files[b[0]].path));
        circles
    }
}

struct Tarjan<'a> {
    next: &'a [BTreeSet<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    // Recursive: the graph has a few hundred nodes at most.
    fn visit(&mut self, node: usize) {
        self.index[node] = Some(self.counter);
        self.low[node] = self.counter;
        self.counter += 1;
        self.stack.push(node);
        self.on_stack[node] = true;
        for &to in &self.next[node] {
            match self.index[to] {
                None => {
                    self.visit(to);
                    self.low[node] = self.low[node].min(self.low[to]);
                }
                Some(index) if self.on_stack[to] => self.low[node] = self.low[node].min(index),
                Some(_) => {}
            }
        }
        if Some(self.low[node]) == self.index[node] {
            let mut component = Vec::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack[top] = false;
                component.push(top);
                if top == node {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// `src/http/errors.rs` → `["http", "errors"]`; `src/http/mod.rs` → `["http"]`.
fn module_of(path: &str) -> Vec<String> {
    let inner = path
        .strip_prefix("src/")
        .and_then(|p| p.strip_suffix(".rs"))
        .expect("a file under src/");
    let mut segments: Vec<String> = inner.split('/').map(str::to_owned).collect();
    if matches!(segments.last().map(String::as_str), Some("mod" | "lib")) {
        segments.pop();
    }
    segments
}

fn read(path: &str, text: &str) -> SourceFile {
    let module = module_of(path);
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let inline = inline_modules(&lines);
    // The modules this file declares as files of their own (`mod name;`).
    let children: BTreeSet<String> = lines
        .iter()
        .filter_map(|line| {
            let rest = strip_visibility(line.trim_start());
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_owned())
        })
        .collect();
    let context = Context {
        module: &module,
        children: &children,
    };

    let mut references = Vec::new();
    let mut scope = BTreeMap::new();
    // `use` declarations, blanked out of the text searched for paths afterwards.
    let mut rest: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    let mut n = 0;
    while n < lines.len() {
        let trimmed = lines[n].trim_start();
        let Some(tree) = strip_visibility(trimmed).strip_prefix("use ") else {
            n += 1;
            continue;
        };
        let start = n;
        let mut declaration = tree.to_owned();
        rest[n].clear();
        while !declaration.contains(';') && n + 1 < lines.len() {
            n += 1;
            declaration.push(' ');
            declaration.push_str(lines[n]);
            rest[n].clear();
        }
        let declaration = declaration.split(';').next().unwrap_or_default();
        // Unindented and outside inline modules: the file's own scope, not a function's.
        let file_level = trimmed.len() == lines[start].len() && inline[start].is_empty();
        for (segments, name) in use_tree(declaration) {
            if segments.is_empty() {
                continue;
            }
            let path = context.absolute(&inline[start], &segments);
            if file_level {
                if let Some(name) = name {
                    scope.insert(name, path.clone());
                }
            }
            references.push(Reference {
                line: start + 1,
                path,
            });
        }
        n += 1;
    }
    for (n, line) in rest.iter().enumerate() {
        for segments in paths_in(line) {
            references.push(Reference {
                line: n + 1,
                path: context.absolute(&inline[n], &segments),
            });
        }
    }
    SourceFile {
        path: path.to_owned(),
        module,
        references,
        scope,
    }
}

struct Context<'a> {
    module: &'a [String],
    children: &'a BTreeSet<String>,
}

impl Context<'_> {
    /// `segments` as written inside the inline modules `inline` of this file.
    fn absolute(&self, inline: &[String], segments: &[String]) -> Written {
        let mut here: Vec<String> = self.module.iter().chain(inline).cloned().collect();
        match segments[0].as_str() {
            "crate" => Written::Crate(segments[1..].to_vec()),
            "self" | "super" => {
                let mut rest = segments;
                if rest[0] == "self" {
                    rest = &rest[1..];
                }
                while rest.first().is_some_and(|s| s == "super") {
                    here.pop();
                    rest = &rest[1..];
                }
                here.extend_from_slice(rest);
                Written::Crate(here)
            }
            first if self.children.contains(first) => {
                let mut path = self.module.to_vec();
                path.extend_from_slice(segments);
                Written::Crate(path)
            }
            _ => Written::Other(segments.to_vec()),
        }
    }
}

/// `pub use x` → `use x`; `pub(crate) mod y;` → `mod y;`.
fn strip_visibility(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("pub") else {
        return line;
    };
    let rest = match rest.strip_prefix('(') {
        Some(inner) => match inner.split_once(')') {
            Some((_, after)) => after,
            None => return line,
        },
        None => rest,
    };
    rest.strip_prefix(' ').unwrap_or(line)
}

/// For each line, the inline modules it is inside, outermost first. rustfmt writes
/// `mod name {` on a line of its own and its closing `}` alone at the same indentation.
fn inline_modules(lines: &[&str]) -> Vec<Vec<String>> {
    let mut open: Vec<(String, String)> = Vec::new();
    let mut out = Vec::with_capacity(lines.len());
    for line in lines {
        let line = line.trim_end();
        if open.last().is_some_and(|(_, close)| line == close) {
            open.pop();
        }
        out.push(open.iter().map(|(name, _)| name.clone()).collect());
        let trimmed = line.trim_start();
        let opened = strip_visibility(trimmed)
            .strip_prefix("mod ")
            .and_then(|r| r.strip_suffix(" {"));
        if let Some(name) = opened {
            let indent = &line[..line.len() - trimmed.len()];
            open.push((name.to_owned(), format!("{indent}}}")));
        }
    }
    out
}

/// A `use` tree (`a::{b, c::{d as e, self}, f::*}`) → one path per leaf with the name it
/// brings into scope (none for a glob).
fn use_tree(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let tokens = tokens(tree);
    let mut out = Vec::new();
    let mut at = 0;
    expand(&tokens, &mut at, &[], &mut out);
    out
}

fn tokens(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if is_ident(c) {
            let mut word = c.to_string();
            while let Some(&d) = chars.peek().filter(|d| is_ident(**d)) {
                word.push(d);
                chars.next();
            }
            tokens.push(word);
        } else if c == ':' {
            if chars.peek() == Some(&':') {
                chars.next();
            }
            tokens.push("::".into());
        } else if !c.is_whitespace() {
            tokens.push(c.to_string());
        }
    }
    tokens
}

fn expand(
    tokens: &[String],
    at: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix.to_vec();
    if tokens.get(*at).is_some_and(|t| t == "::") {
        *at += 1;
    }
    while let Some(token) = tokens.get(*at) {
        match token.as_str() {
            "{" => {
                *at += 1;
                while tokens.get(*at).is_some_and(|t| t != "}") {
                    expand(tokens, at, &path, out);
                    if tokens.get(*at).is_some_and(|t| t == ",") {
                        *at += 1;
                    }
                }
                *at += 1;
                return;
            }
            "*" => {
                *at += 1;
                path.push("*".into());
                out.push((path, None));
                return;
            }
            "::" => *at += 1,
            "self" if path.len() == prefix.len() && !prefix.is_empty() => {
                *at += 1;
                // `a::{self}`: `a` itself.
                let name = alias(tokens, at).or_else(|| path.last().cloned());
                out.push((path, name));
                return;
            }
            word if is_ident(word.chars().next().unwrap_or(' ')) => {
                path.push(word.to_owned());
                *at += 1;
                if tokens.get(*at).is_some_and(|t| t == "::") {
                    continue;
                }
                let name = alias(tokens, at).or_else(|| path.last().cloned());
                out.push((path, name));
                return;
            }
            _ => return,
        }
    }
}

/// `as name` after a leaf, if there.
fn alias(tokens: &[String], at: &mut usize) -> Option<String> {
    if tokens.get(*at).is_some_and(|t| t == "as") {
        let name = tokens.get(*at + 1).cloned();
        *at += 2;
        return name;
    }
    None
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths of two or more segments a line of code writes.
fn paths_in(line: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = is_ident(chars[i])
            && !chars[i].is_ascii_digit()
            && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':' || chars[i - 1] == '$'));
        if !starts {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        loop {
            let begin = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            segments.push(chars[begin..i].iter().collect::<String>());
            let more = chars.get(i) == Some(&':')
                && chars.get(i + 1) == Some(&':')
                && chars.get(i + 2).is_some_and(|c| is_ident(*c));
            if !more {
                break;
            }
            i += 2;
        }
        if segments.len() > 1 {
            out.push(segments);
        }
    }
    out
}

/// The source with comments blanked and string and character literals emptied, line
/// breaks kept (so line numbers stay true).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    // Skips to the end of a literal or comment, keeping only its line breaks.
    let skip = |from: usize, to: usize, out: &mut String| {
        out.extend(
            chars[from..to.min(chars.len())]
                .iter()
                .filter(|c| **c == '\n'),
        );
    };
    while i < chars.len() {
        let c = chars[i];
        let before = if i == 0 { ' ' } else { chars[i - 1] };
        if c == '/' && at(i + 1) == '/' {
            let end = (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len());
            i = end;
        } else if c == '/' && at(i + 1) == '*' {
            let (mut j, mut depth) = (i + 2, 1);
            while j < chars.len() && depth > 0 {
                if chars[j] == '/' && at(j + 1) == '*' {
                    depth += 1;
                    j += 1;
                } else if chars[j] == '*' && at(j + 1) == '/' {
                    depth -= 1;
                    j += 1;
                }
                j += 1;
            }
            skip(i, j, &mut out);
            i = j;
        } else if (c == 'r' || (c == 'b' && at(i + 1) == 'r')) && !is_ident(before) {
            // A raw string `r#"…"#` (or `br"…"`), else an identifier starting with r or b.
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let hashes = (j..chars.len()).take_while(|&k| chars[k] == '#').count();
            j += hashes;
            if at(j) != '"' {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body: String = chars[j + 1..].iter().collect();
            let len = body
                .find(&close)
                .map_or(body.len(), |n| body[..n].chars().count());
            let end = j + 1 + len + 1 + hashes;
            out.push_str("\"\"");
            skip(i, end, &mut out);
            i = end;
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            skip(i, j + 1, &mut out);
            i = j + 1;
        } else if c == '\'' {
            // `'a'`, `'\n'`, `'\u{1F600}'` are characters; `'a` is a lifetime or a label.
            if at(i + 1) == '\\' {
                // The escaped character is at i + 2 (perhaps a quote): the end comes after.
                let end = (i + 3..chars.len())
                    .find(|&j| chars[j] == '\'')
                    .unwrap_or(chars.len());
                out.push_str("' '");
                i = end + 1;
            } else if at(i + 2) == '\'' {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

mod tests {
    use super::*;

    #[test]
    fn a_use_tree_across_lines_expands_to_one_path_a_leaf() {
        let leaves = use_tree("crate::http::{errors::{A, B as C}, self, context::*,\n    d}");
        let shown: Vec<String> = leaves
            .iter()
            .map(|(p, n)| format!("{}={}", p.join("::"), n.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(
            shown,
            [
                "crate::http::errors::A=A",
                "crate::http::errors::B=C",
                "crate::http=http",
                "crate::http::context::*=",
                "crate::http::d=d",
            ]
        );
    }

    #[test]
    fn comments_and_literals_name_no_path() {
        let code = code_only(
            "let a = \"crate::x::y\"; // crate::z::w\n/* crate::q::r */ let b = r#\"crate::s\"#;\n\
             let c = '\"'; fn f<'a>(x: &'a str) -> crate::real::Path {}\n",
        );
        let paths: Vec<Vec<String>> = code.lines().flat_map(paths_in).collect();
        assert_eq!(paths, [["crate", "real", "Path"]]);
        assert_eq!(code.lines().count(), 3);
    }

    #[test]
    fn a_child_naming_its_parents_own_item_points_up_and_a_re_export_points_through() {
        let parent = read(
            "src/a/mod.rs",
            "mod b;\nmod c;\npub use c::Thing;\npub struct Own;\nfn f() { b::g(); }\n",
        );
        assert_eq!(
            parent.scope["Thing"],
            Written::Crate(vec!["a".into(), "c".into(), "Thing".into()])
        );
        let child = read(
            "src/a/b.rs",
            "use super::{Own, Thing};\n\nmod tests {\n    use super::*;\n}\n",
        );
        let shown: Vec<String> = child.references.iter().map(|r| r.path.display()).collect();
        assert_eq!(
            shown,
            ["crate::a::Own", "crate::a::Thing", "crate::a::b::*"]
        );
        let b_in_parent: Vec<String> = parent.references.iter().map(|r| r.path.display()).collect();
        assert_eq!(b_in_parent, ["crate::a::c::Thing", "crate::a::b::g"]);
    }

    fn graph(child: &str) -> Graph {
        Graph::of_sources(
            [
                ("src/lib.rs", "mod a;\n"),
                (
                    "src/a/mod.rs",
                    "mod b;\nmod c;\npub use c::Thing;\npub struct Own;\nfn f() { b::g(); }\n",
                ),
                ("src/a/b.rs", child),
                ("src/a/c.rs", "pub struct Thing;\n"),
            ]
            .map(|(p, t)| (p.to_owned(), t.to_owned())),
        )
    }

    #[test]
    fn a_parent_and_a_child_naming_each_others_items_are_a_circle() {
        let g = graph("use super::{Own, Thing};\npub fn g() {}\n");
        let circles: Vec<Vec<&str>> = g
            .circles()
            .iter()
            .map(|c| c.iter().map(|&i| g.files[i].path.as_str()).collect())
            .collect();
        assert_eq!(circles, [["src/a/b.rs", "src/a/mod.rs"]]);
    }

    #[test]
    fn a_child_naming_what_its_parent_re_exports_reaches_the_defining_file_and_no_circle() {
        let g = graph("use super::Thing;\npub fn g() {}\n\nmod tests {\n    use super::*;\n}\n");
        assert!(g.circles().is_empty());
        let shown: BTreeSet<(&str, &str)> = g
            .edges()
            .iter()
            .map(|e| (g.files[e.from].path.as_str(), g.files[e.to].path.as_str()))
            .collect();
        let shown: Vec<_> = shown.into_iter().collect();
        assert_eq!(
            shown,
            [
                ("src/a/b.rs", "src/a/c.rs"),
                ("src/a/mod.rs", "src/a/b.rs"),
                ("src/a/mod.rs", "src/a/c.rs"),
            ]
        );
    }
}
