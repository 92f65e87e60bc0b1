//! The crate's layering, held against docs/architecture.md ("Floors and rooms"): every room
//! (a folder or a file directly under `agent/src/`) imports only rooms on floors below its own,
//! except the arrows that run up which that section names, each with its reason, and no room
//! imports what a never of that section forbids. The rooms' imports are read from their code
//! (`crate::` paths; the binary's `qoslet::`), without comments, strings and test code: a
//! test may build its fixtures from any floor.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

/// The section's rules as docs/architecture.md writes them.
#[derive(Debug, Default)]
struct Rules {
    /// Room -> floor (1 is the ground).
    floors: BTreeMap<String, u32>,
    /// (from, to) -> why: the arrows allowed to run up (or along a floor).
    up: BTreeMap<(String, String), String>,
    /// (from, to): the nevers, each pair spelled out.
    nevers: BTreeSet<(String, String)>,
}

/// The rooms whose imports are not read: the crate's root (it declares every room) and the
/// test log (test code).
const NOT_ROOMS: [&str; 2] = ["lib.rs", "test_log.rs"];

/// `text` with comments removed and the insides of string and character literals blanked, so
/// that neither a comment nor a string can name a room.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'#' | b'"'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                // A raw string: r"..." or r#"..."#.
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                i += 2 + hashes;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                // A character literal ('{', '\n', '\u{7b}'); a lifetime has no closing quote.
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            }
            c => {
                let len = text[i..].chars().next().map_or(1, char::len_utf8);
                if c.is_ascii() {
                    out.push(c as char);
                } else {
                    out.push_str(&text[i..i + len]);
                }
                i += len;
            }
        }
    }
    out
}

/// `text`'s code alone: no comments, no strings' insides, no items marked `#[cfg(test)]`.
pub(crate) fn code_without_tests(text: &str) -> String {
    without_tests(&code_only(text)).0
}

/// `code` (see [`code_only`]) without the items marked `#[cfg(test)]`, and the names of the
/// modules declared so (`#[cfg(test)] mod tests;`), whose files are test code.
fn without_tests(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let (mut out, mut test_mods, mut rest) = (String::new(), Vec::new(), code);
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let end = item.find([';', '{']).unwrap_or(item.len());
        let head = item[..end].split_whitespace().collect::<Vec<_>>();
        if item[end..].starts_with(';') {
            if let [.., "mod", name] = head.as_slice() {
                test_mods.push((*name).to_owned());
            }
            rest = &item[(end + 1).min(item.len())..];
            continue;
        }
        let mut depth = 0;
        let mut close = item.len();
        for (i, c) in item[end..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = end + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &item[close..];
    }
    out.push_str(rest);
    (out, test_mods)
}

/// The first segments of every path that starts with `root::` in `code`: `root::a::X` gives
/// `a`, `root::{a::X, b}` gives `a` and `b`.
pub(crate) fn first_segments(code: &str, root: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let prefix = format!("{root}::");
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices(&prefix) {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = code[i + prefix.len()..].trim_start();
        let Some(group) = rest.strip_prefix('{') else {
            out.insert(ident(rest));
            continue;
        };
        let (mut depth, mut item) = (0, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.insert(ident(&item));
                    item.clear();
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        out.insert(ident(&item));
    }
    out.retain(|s| !s.is_empty() && s != "self");
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The room of `name` (a file or a folder directly under `src`), as the section names it.
fn room_name(src: &Path, name: &str) -> Option<String> {
    if src.join(name).is_dir() {
        Some(format!("{name}/"))
    } else if src.join(format!("{name}.rs")).is_file() {
        Some(format!("{name}.rs"))
    } else {
        None
    }
}

/// Room -> room -> the files of the first that import the second (test code left out).
type Imports = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn read_imports(src: &Path) -> (BTreeSet<String>, Imports) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let rel = |p: &Path| p.strip_prefix(src).expect("under src").to_path_buf();
    // A file's module path: a/b.rs and a/b/mod.rs are both a/b.
    let module = |p: &Path| -> String {
        let r = rel(p).with_extension("");
        let s = r.to_string_lossy().into_owned();
        s.strip_suffix("/mod").map_or(s.clone(), str::to_owned)
    };
    let mut parsed = Vec::new();
    let mut test_modules = BTreeSet::new();
    for p in &files {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let (code, test_mods) = without_tests(&code_only(&text));
        let m = module(p);
        let parent = if m == "lib" {
            String::new()
        } else {
            format!("{m}/")
        };
        test_modules.extend(test_mods.into_iter().map(|t| format!("{parent}{t}")));
        parsed.push((p, m, code));
    }
    let is_test = |m: &str| {
        m.split('/').any(|seg| seg == "tests")
            || test_modules
                .iter()
                .any(|t| m == t || m.starts_with(&format!("{t}/")))
    };
    let mut rooms = BTreeSet::new();
    let mut imports = Imports::new();
    for (p, m, code) in parsed {
        let top = rel(p)
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        if NOT_ROOMS.contains(&top.as_str()) || is_test(&m) {
            continue;
        }
        let room = room_name(src, top.trim_end_matches(".rs")).expect("a room");
        rooms.insert(room.clone());
        let mut used = first_segments(&code, "crate");
        if top == "main.rs" {
            used.extend(first_segments(&code, "qoslet"));
        }
        for to in used.iter().filter_map(|n| room_name(src, n)) {
            if to != room {
                imports
                    .entry(room.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(rel(p).to_string_lossy().into_owned());
            }
        }
    }
    (rooms, imports)
}

/// The backquoted names of a table cell.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// A cell of rooms: its backquoted rooms, or, where it begins with "every", every room but
/// those it names.
fn rooms_of(cell: &str, all: &BTreeSet<String>) -> BTreeSet<String> {
    let named: BTreeSet<String> = quoted(cell).into_iter().collect();
    if cell.trim_start().starts_with("every") {
        all.difference(&named).cloned().collect()
    } else {
        named
    }
}

/// The tables of the section "Floors and rooms": the floors (`| floor | rooms | ... |`), the
/// arrows that run up (`| from | to | why |`) and the nevers (`| room | never imports | why |`).
fn read_rules(doc: &str) -> Rules {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Floors and rooms"))
        .expect("docs/architecture.md has a section \"Floors and rooms\"");
    let mut rules = Rules::default();
    let mut table = "";
    let mut nevers = Vec::new();
    for line in section.lines() {
        let cells: Vec<&str> = line
            .trim()
            .strip_prefix('|')
            .and_then(|l| l.strip_suffix('|'))
            .map(|l| l.split('|').map(str::trim).collect())
            .unwrap_or_default();
        match cells.as_slice() {
            [] => table = "",
            [first, ..] if first.starts_with("---") => {}
            ["floor", ..] => table = "floors",
            ["from", "to", ..] => table = "up",
            ["room", "never imports", ..] => table = "nevers",
            [floor, rooms, ..] if table == "floors" => {
                let floor: u32 = floor.parse().unwrap_or_else(|_| panic!("floor {floor:?}"));
                for room in quoted(rooms) {
                    assert!(
                        rules.floors.insert(room.clone(), floor).is_none(),
                        "{room} stands on two floors"
                    );
                }
            }
            [from, to, why, ..] if table == "up" => {
                for (f, t) in quoted(from).into_iter().zip(quoted(to)) {
                    rules.up.insert((f, t), (*why).to_owned());
                }
            }
            [from, never, ..] if table == "nevers" => {
                nevers.push(((*from).to_owned(), (*never).to_owned()));
            }
            _ => {}
        }
    }
    let all: BTreeSet<String> = rules.floors.keys().cloned().collect();
    for (from, never) in nevers {
        for f in rooms_of(&from, &all) {
            for t in rooms_of(&never, &all) {
                if f != t {
                    rules.nevers.insert((f.clone(), t));
                }
            }
        }
    }
    rules
}

/// What breaks `rules` in `imports`, a line each.
fn breaches(rules: &Rules, rooms: &BTreeSet<String>, imports: &Imports) -> Vec<String> {
    let mut out = Vec::new();
    for room in rooms {
        if !rules.floors.contains_key(room) {
            out.push(format!("{room} stands on no floor of the section"));
        }
    }
    for room in rules.floors.keys() {
        if !rooms.contains(room) {
            out.push(format!("{room} is on a floor but is no room of agent/src"));
        }
    }
    for (from, tos) in imports {
        for (to, files) in tos {
            let files = files.iter().cloned().collect::<Vec<_>>().join(", ");
            let (Some(f), Some(t)) = (rules.floors.get(from), rules.floors.get(to)) else {
                continue;
            };
            let pair = (from.clone(), to.clone());
            if rules.nevers.contains(&pair) {
                out.push(format!(
                    "{from} imports {to}, which a never forbids ({files})"
                ));
            } else if t >= f && !rules.up.contains_key(&pair) {
                out.push(format!(
                    "{from} (floor {f}) imports {to} (floor {t}), not below it and not an arrow the section names ({files})"
                ));
            }
        }
    }
    for (from, to) in rules.up.keys() {
        let used = imports.get(from).is_some_and(|t| t.contains_key(to));
        let up = matches!(
            (rules.floors.get(from), rules.floors.get(to)),
            (Some(f), Some(t)) if t >= f
        );
        if !used || !up {
            out.push(format!(
                "the arrow {from} -> {to} the section justifies is no upward import of the code"
            ));
        }
    }
    out
}

#[test]
fn every_room_imports_only_below_it_but_the_named_arrows_and_no_never() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(manifest.join("../docs/architecture.md"))
        .expect("docs/architecture.md");
    let rules = read_rules(&doc);
    assert!(rules.floors.len() > 10, "{rules:?}");
    assert!(!rules.nevers.is_empty(), "{rules:?}");
    let (rooms, imports) = read_imports(&manifest.join("src"));
    let found = breaches(&rules, &rooms, &imports);
    let mut msg = String::new();
    for line in &found {
        let _ = writeln!(msg, "{line}");
    }
    assert!(
        found.is_empty(),
        "docs/architecture.md \"Floors and rooms\" and the code disagree:\n{msg}"
    );
}

#[test]
fn imports_are_read_from_code_alone() {
    let text = r##"
//! [`crate::doc`] in a comment
use crate::{a::X, b, c::{d, e::F}};
use crate::g::H;
fn f() { let s = "crate::string"; let r = r#"crate::raw"#; let c = '{'; crate::i::call(); }
/* crate::block */
#[cfg(test)]
mod tests { use crate::tested; fn t() { let _ = '}'; } }
#[cfg(test)]
mod helpers;
fn after<'a>(x: &'a str) -> &'a str { crate::j::k(x) }
"##;
    let (code, test_mods) = without_tests(&code_only(text));
    assert_eq!(test_mods, ["helpers"]);
    let got: Vec<String> = first_segments(&code, "crate").into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "g", "i", "j"]);
}
