//! Tidy: the dependency rules of `docs/ARCHITECTURE.md` ("Layers"),
//! checked on the sources so that they cannot rot.
//!
//! * No cycle between the files of any crate of the workspace: a file's
//!   dependencies are the other files its `crate::`, `super::` and `self::`
//!   paths name (comments and string literals do not count; a `mod` line
//!   is a declaration, not a dependency).
//! * Each crate depends only on the crates below it (`Cargo.toml`'s
//!   `[dependencies]`): the layers of the core are crates, the pure
//!   machine (`eim-machine`) at the bottom, the analysis (`eim-analysis`)
//!   on it, the threaded manager (`eim-core`) on both; the `eim` package
//!   does not depend on the simulator's harness.
//! * The machine crate is pure: its sources name no thread, clock, file,
//!   socket or process (`std::thread`, `std::time::Instant`, `std::fs`,
//!   `std::net`, `std::process`, `libc`, ...).
//! * No cycle between the child modules of any module of any crate
//!   (test modules left out), and `src/`'s layers ([`SRC_LAYERS`]) only
//!   point down.
//! * Docs name only paths that exist, and the code map of
//!   `docs/ARCHITECTURE.md` names every crate and each of its top-level
//!   modules.
//! * No file has more than [`MAX_FILE_LINES`] non-test lines
//!   (any over it fails), and no crate has a `mod.rs` ([`MOD_RS_ALLOWED`]).
//!
//! The checker runs on the real tree and, first, on small made-up trees
//! that break each rule, so a checker that finds nothing fails too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace crates that may depend on each other, with what each may
/// use (`[dependencies]`; tests may use more). A crate not listed here is
/// not checked. `eim-test-support` is a leaf, so that every crate's tests,
/// eim-core's included, can use it.
const CRATE_DEPENDENCIES: &[(&str, &[&str])] = &[
    ("core/machine/Cargo.toml", &[]),
    ("core/analysis/Cargo.toml", &["eim-machine"]),
    ("core/Cargo.toml", &["eim-machine", "eim-analysis"]),
    ("sim/Cargo.toml", &["eim-machine"]),
    (
        "sim/harness/Cargo.toml",
        &[
            "eim-machine",
            "eim-analysis",
            "eim-core",
            "eim-sim",
            "eim-test-support",
        ],
    ),
    ("bpf-backend/Cargo.toml", &["eim-machine", "eim-core"]),
    (
        "tests/cross-crate/Cargo.toml",
        &[
            "eim-machine",
            "eim-analysis",
            "eim-core",
            "eim-sim",
            "eim-sim-harness",
        ],
    ),
    ("tests/support/Cargo.toml", &[]),
    (
        "Cargo.toml",
        &[
            "eim-machine",
            "eim-analysis",
            "eim-core",
            "eim-sim",
            "eim-bpf",
        ],
    ),
];

/// The crate whose sources must name none of [`IMPURE`]: the pure machine.
const MACHINE: &str = "core/machine/src/lib.rs";

/// What the machine may not name, and what each is: the ways code reaches
/// the world (a thread, a clock, a file, a socket, a process, the OS). A
/// path counts if it starts with one of these (`use` groups expanded); a
/// single word counts wherever it stands as a word of the code.
const IMPURE: &[(&str, &str)] = &[
    ("std::thread", "a thread"),
    ("std::sync::Mutex", "a lock between threads"),
    ("std::sync::RwLock", "a lock between threads"),
    ("std::sync::Condvar", "a lock between threads"),
    ("std::sync::Barrier", "a lock between threads"),
    ("std::sync::mpsc", "a channel between threads"),
    ("std::sync::atomic", "memory shared between threads"),
    ("std::time::Instant", "a clock"),
    ("std::time::SystemTime", "a clock"),
    ("std::time::UNIX_EPOCH", "a clock"),
    ("Instant", "a clock"),
    ("SystemTime", "a clock"),
    ("std::fs", "a file"),
    ("std::io::stdin", "a file"),
    ("std::io::stdout", "a file"),
    ("std::io::stderr", "a file"),
    ("std::net", "a socket"),
    ("std::process", "a process"),
    ("std::env", "the process's environment"),
    ("std::os", "the operating system"),
    ("libc", "the operating system"),
    ("nix", "the operating system"),
    ("rustix", "the operating system"),
    ("tokio", "a runtime of threads and sockets"),
    ("rayon", "a thread pool"),
    ("loom", "a model of threads"),
];

/// The library and binary roots of the workspace. Every crate root is
/// checked for cycles: these, and each test, bench, fuzz target and binary
/// found in [`ROOT_DIRS`] ([`crate_roots`]).
const CRATES: &[&str] = &[
    "core/machine/src/lib.rs",
    "core/analysis/src/lib.rs",
    "core/src/lib.rs",
    "sim/src/lib.rs",
    "sim/harness/src/lib.rs",
    "bpf-backend/src/lib.rs",
    "src/lib.rs",
    "src/cli/main.rs",
    "tests/cross-crate/src/lib.rs",
    "tests/support/src/lib.rs",
];

/// Directories whose `.rs` files (and `*/main.rs`) are each a crate root.
const ROOT_DIRS: &[&str] = &[
    "core/machine/tests",
    "core/analysis/tests",
    "core/analysis/benches",
    "core/tests",
    "core/benches",
    "sim/harness/tests",
    "sim/harness/src/bin",
    "bpf-backend/tests",
    "bpf-backend/benches",
    "benches",
    "examples",
    "tests/eim",
    "tests/cross-crate/tests",
    "fuzz/fuzz_targets",
];

/// A crate's sources: file path (relative to the root file's directory)
/// to text.
type Sources = BTreeMap<PathBuf, String>;

/// A crate: its root, every file its `mod` declarations reach, and which
/// module each file is.
struct Crate {
    root: PathBuf,
    sources: Sources,
    modules: BTreeMap<Vec<String>, PathBuf>,
}

impl Crate {
    /// Follows the `mod` declarations from `root`, reading files with
    /// `read` (the disk, or a made-up tree): `mod x;` is `x.rs` or
    /// `x/mod.rs` beside a root or `mod.rs` file and under `a/` for a file
    /// `a.rs`; `#[path = "p"]` is relative to the declaring file.
    fn collect(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Self {
        let mut sources = Sources::new();
        let mut modules = BTreeMap::new();
        let mut queue = Vec::new();
        if let Some(text) = read(root) {
            queue.push((root.to_path_buf(), Vec::<String>::new(), true, text));
        }
        while let Some((file, module, owns_dir, text)) = queue.pop() {
            if sources.contains_key(&file) {
                continue;
            }
            let here = file.parent().map(Path::to_path_buf).unwrap_or_default();
            let children_dir = if owns_dir {
                here.clone()
            } else {
                here.join(file.file_stem().unwrap_or_default())
            };
            for (name, path) in declared_modules(&text) {
                let mut child_module = module.clone();
                child_module.push(name.clone());
                let candidates = match path {
                    Some(p) => vec![normal(&here.join(p))],
                    None => vec![
                        children_dir.join(format!("{name}.rs")),
                        children_dir.join(&name).join("mod.rs"),
                    ],
                };
                let found = candidates
                    .into_iter()
                    .find_map(|c| read(&c).map(|text| (c, text)));
                if let Some((child, child_text)) = found {
                    let owns = child.file_name().is_some_and(|n| n == "mod.rs");
                    queue.push((child, child_module, owns, child_text));
                }
            }
            modules.insert(module, file.clone());
            sources.insert(file, text);
        }
        Self {
            root: root.to_path_buf(),
            sources,
            modules,
        }
    }
}

/// `path` with its `..` and `.` components folded.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The modules a file declares in files of their own, with a `#[path]`
/// if it has one (`mod x;`, `pub(crate) mod x;`, `#[path = "p"] mod x;`).
fn declared_modules(text: &str) -> Vec<(String, Option<String>)> {
    let code = code_of(text);
    let names = child_modules(&code);
    // The path attribute's string is blanked in `code`; find it in the
    // text, on the declaration's own lines.
    names
        .into_iter()
        .map(|name| {
            let decl = format!("mod {name};");
            let path = text.find(&decl).and_then(|at| {
                let before = &text[..at];
                let attr = before.rfind("#[path")?;
                // Only an attribute directly above this declaration.
                let between = &before[attr..];
                if between.matches(';').count() > 0 || between.matches('\n').count() > 2 {
                    return None;
                }
                let open = attr + text[attr..].find('"')? + 1;
                let close = open + text[open..].find('"')?;
                Some(text[open..close].to_string())
            });
            (name, path)
        })
        .collect()
}

/// Removes comments, string and character literals (their text is not
/// code), keeping the line structure.
fn code_of(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(b.len(), |n| i + n);
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(b.len(), |n| i + n + 2);
            out.extend(text[i..end].chars().filter(|c| *c == '\n'));
            i = end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|c| *c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = i + 2 + hashes;
            let end = text[body..]
                .find(&close)
                .map_or(b.len(), |n| body + n + close.len());
            out.push_str("\"\"");
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = (j + 1).min(b.len());
        } else if b[i] == b'\'' && char_literal_len(&b[i..]).is_some() {
            i += char_literal_len(&b[i..]).unwrap_or(1);
            out.push_str("' '");
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of a character literal at the start of `b` (`'a'`, `'\n'`,
/// `'\u{..}'`), or `None` for a lifetime.
fn char_literal_len(b: &[u8]) -> Option<usize> {
    if b.get(1) == Some(&b'\\') {
        let close = b.iter().skip(2).position(|c| *c == b'\'')?;
        return Some(close + 3);
    }
    let s = std::str::from_utf8(&b[1..b.len().min(6)])
        .ok()
        .or_else(|| {
            // A multi-byte character cut by the window: any valid prefix.
            (2..6)
                .rev()
                .find_map(|n| std::str::from_utf8(b.get(1..n)?).ok())
        })?;
    let c = s.chars().next()?;
    (b.get(1 + c.len_utf8()) == Some(&b'\'')).then_some(c.len_utf8() + 2)
}

/// The module path of a file of the crate (`machine/book.rs` ->
/// `["machine", "book"]`, the crate root -> `[]`).
fn module_of(krate: &Crate, file: &Path) -> Vec<String> {
    krate
        .modules
        .iter()
        .find(|(_, f)| f.as_path() == file)
        .map(|(m, _)| m.clone())
        .unwrap_or_default()
}

/// The file of a module path, if the crate has one.
fn file_of(krate: &Crate, module: &[String]) -> Option<PathBuf> {
    krate.modules.get(module).cloned()
}

/// Every path a file's code names that starts at `crate`, `super` or
/// `self`, with `use` groups expanded (`crate::{a, b::c}` gives
/// `crate::a` and `crate::b::c`).
fn paths_in(code: &str, children: &[String]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let child_heads: Vec<String> = children.iter().map(|c| format!("{c}::")).collect();
    let mut i = 0;
    while i < b.len() {
        let at_word =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| at_word && code[i..].starts_with(h));
        // A bare path through a child module this file declares
        // (`mod x;` ... `x::f()`, `pub use x::Y`) is `self::x::...`.
        let child = child_heads
            .iter()
            .find(|h| at_word && code[i..].starts_with(h.as_str()));
        match (head, child) {
            (Some(h), _) => {
                let (paths, used) = expand(&code[i..]);
                out.extend(paths.into_iter().map(|p| (i, p)));
                i += used.max(h.len());
            }
            (None, Some(h)) => {
                let (paths, used) = expand(&code[i..]);
                out.extend(paths.into_iter().map(|mut p| {
                    p.insert(0, "self".to_string());
                    (i, p)
                }));
                i += used.max(h.len());
            }
            (None, None) => i += 1,
        }
    }
    out
}

/// `code` with its re-exports (`pub use ...;`, `pub(crate) use ...;`)
/// blanked: like the crate root, a module that re-exports an item is a
/// table of contents for its callers, not a user of the item. A cycle
/// through a re-export alone is not one (what the parent uses itself, it
/// imports with a plain `use`, which counts).
fn without_reexports(code: &str) -> String {
    let mut out = code.to_string();
    for head in ["pub use ", "pub(crate) use ", "pub(super) use "] {
        let mut from = 0;
        while let Some(n) = out[from..].find(head) {
            let at = from + n;
            let end = out[at..].find(';').map_or(out.len(), |e| at + e + 1);
            let blank: String = out[at..end]
                .chars()
                .map(|c| if c == '\n' { c } else { ' ' })
                .collect();
            out.replace_range(at..end, &blank);
            from = at + blank.len();
        }
    }
    out
}

/// The child modules a file declares in files of their own (`mod x;`,
/// `pub(crate) mod x;`).
fn child_modules(code: &str) -> Vec<String> {
    code.split(';')
        .filter_map(|stmt| {
            let stmt = stmt.trim();
            let rest = stmt.rsplit_once("mod ")?;
            let before = rest.0.trim_end();
            let visibility_only = before.is_empty()
                || before.ends_with("pub")
                || before.ends_with(')')
                || before.ends_with(']');
            let name = rest.1.trim();
            (visibility_only
                && !name.is_empty()
                && name.chars().all(|c| c.is_alphanumeric() || c == '_'))
            .then(|| name.to_string())
        })
        .collect()
}

/// Expands the path at the start of `text` (which may end in a `{...}`
/// group); returns the paths and the bytes consumed.
fn expand(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    loop {
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i > start {
            prefix.push(text[start..i].to_string());
        }
        if text[i..].starts_with("::{") {
            let open = i + 2;
            let mut depth = 0;
            let mut close = open;
            for (n, c) in text[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    close = open + n;
                    break;
                }
            }
            let mut out = Vec::new();
            for item in split_top(&text[open + 1..close]) {
                let item = item.trim();
                if item.is_empty() {
                    continue;
                }
                let (inner, _) = expand(item);
                for p in inner {
                    let mut full = prefix.clone();
                    full.extend(p.into_iter().filter(|s| s != "self"));
                    out.push(full);
                }
            }
            return (out, close + 1);
        }
        if text[i..].starts_with("::") {
            i += 2;
            continue;
        }
        return (vec![prefix], i);
    }
}

/// The inline modules of a file (`mod tests { .. }`): name and byte range,
/// so that `super::` inside one names the file itself.
fn inline_modules(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut from = 0;
    while let Some(n) = code[from..].find("mod ") {
        let at = from + n;
        from = at + 4;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let rest = &code[at + 4..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0;
        let mut end = code.len();
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = open + k;
                break;
            }
        }
        out.push((name, open..end));
    }
    out
}

/// Splits a `use` group's items at its top-level commas.
fn split_top(group: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&group[start..]);
    out
}

/// The names the crate root re-exports (`pub use a::b::{C, D};`), to the
/// module path they come from: `crate::C` depends on `a/b.rs`, not on the
/// root.
fn root_reexports(root_code: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for stmt in root_code.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (paths, _) = expand(rest.trim());
        for mut p in paths {
            if p.first().is_some_and(|h| h == "crate" || h == "self") {
                p.remove(0);
            }
            if let Some(name) = p.pop() {
                out.insert(name, p);
            }
        }
    }
    out
}

/// The file dependency graph of one crate.
fn graph(krate: &Crate) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let root = &krate.root;
    let root_code = code_of(&krate.sources[root]);
    let reexports = root_reexports(&root_code);
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (file, text) in &krate.sources {
        let here = module_of(krate, file);
        let deps = edges.entry(file.clone()).or_default();
        if file == root {
            continue; // The root only declares and re-exports: its table of contents.
        }
        let code = without_reexports(&code_of(text));
        let inline = inline_modules(&code);
        let children = child_modules(&code);
        for (at, path) in paths_in(&code, &children) {
            let mut here = here.clone();
            here.extend(
                inline
                    .iter()
                    .filter(|(_, r)| r.contains(&at))
                    .map(|(n, _)| n.clone()),
            );
            let (base, rest) = match path.first().map(String::as_str) {
                Some("crate") => (Vec::new(), &path[1..]),
                Some("self") => (here.clone(), &path[1..]),
                Some("super") => {
                    let mut base = here.clone();
                    let mut rest = &path[..];
                    while rest.first().is_some_and(|s| s == "super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    (base, rest)
                }
                _ => continue,
            };
            let mut target: Vec<String> = base.into_iter().chain(rest.iter().cloned()).collect();
            // `crate::Name` of a name the root re-exports is the module it
            // comes from.
            if target.len() == 1 {
                if let Some(from) = reexports.get(&target[0]) {
                    target = from.clone();
                }
            }
            let found = (0..=target.len())
                .rev()
                .find_map(|n| file_of(krate, &target[..n]));
            if let Some(f) = found.filter(|f| f != file) {
                deps.insert(f);
            }
        }
    }
    edges
}

/// The cycles of a graph: its strongly connected components of more than
/// one file (Tarjan's algorithm, iterative over a small graph).
fn cycles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Reachability by repeated search: files that reach each other.
    let reach = |from: &PathBuf| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(f) = stack.pop() {
            for d in edges.get(&f).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    stack.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
        edges.keys().map(|f| (f, reach(f))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for f in edges.keys() {
        if done.contains(f) || !reaches[f].contains(f) {
            continue;
        }
        let scc: Vec<PathBuf> = reaches[f]
            .iter()
            .filter(|g| reaches.get(g).is_some_and(|r| r.contains(f)))
            .cloned()
            .collect();
        done.extend(scc.iter().cloned());
        out.push(scc);
    }
    out
}

/// A crate of the workspace, read from the disk; its file names are
/// relative to the root file's directory.
fn read_crate(repo: &Path, root: &str) -> Crate {
    let root_path = repo.join(root);
    let dir = root_path
        .parent()
        .expect("a crate root has a directory")
        .to_path_buf();
    let read = |rel: &Path| std::fs::read_to_string(dir.join(rel)).ok();
    let root_rel = PathBuf::from(root_path.file_name().expect("a file name"));
    Crate::collect(&root_rel, &read)
}

/// Every crate root of the workspace: [`CRATES`], and each `.rs` file
/// and `*/main.rs` of [`ROOT_DIRS`].
fn crate_roots(repo: &Path) -> Vec<String> {
    let mut roots: Vec<String> = CRATES.iter().map(|r| r.to_string()).collect();
    for dir in ROOT_DIRS {
        let entries = std::fs::read_dir(repo.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let Some(name) = name else { continue };
            if name.ends_with(".rs") {
                roots.push(format!("{dir}/{name}"));
            } else if path.join("main.rs").is_file() {
                roots.push(format!("{dir}/{name}/main.rs"));
            }
        }
    }
    roots.sort();
    roots
}

/// The workspace crates a `Cargo.toml` depends on (names starting `eim`).
fn eim_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("");
            if name.starts_with("eim") {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The eim crates a manifest depends on that its entry of
/// [`CRATE_DEPENDENCIES`] does not allow.
fn dependency_violations(manifest: &str, text: &str, allowed: &[&str]) -> Vec<String> {
    eim_dependencies(text)
        .into_iter()
        .filter(|d| !allowed.contains(&d.as_str()))
        .map(|d| format!("{manifest} depends on {d}; allowed: {allowed:?}"))
        .collect()
}

/// The workspace members (the root manifest's `members`) whose manifest
/// [`CRATE_DEPENDENCIES`] does not list: a new crate must be placed in
/// the graph by whoever adds it.
fn unlisted_members(root_manifest: &str) -> Vec<String> {
    if !root_manifest.contains("members") {
        return vec!["the root Cargo.toml lists no workspace members".to_string()];
    }
    workspace_members(root_manifest)
        .into_iter()
        .map(|m| format!("{m}/Cargo.toml"))
        .filter(|m| !CRATE_DEPENDENCIES.iter().any(|(n, _)| n == m))
        .map(|m| format!("{m} is a workspace member that CRATE_DEPENDENCIES does not list"))
        .collect()
}

/// Every entry of [`IMPURE`] a file of `krate` names, as
/// "file names `path` (what it is)". Comments and string literals do not
/// count; `use` groups are expanded (`std::{fs, thread}` names both).
fn impurities(krate: &Crate) -> Vec<String> {
    let mut out = Vec::new();
    for (file, text) in &krate.sources {
        let code = code_of(text);
        let b = code.as_bytes();
        let is_word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        let mut named = BTreeSet::new();
        let mut i = 0;
        while i < b.len() {
            // `::std::fs` too: a word after `::` starts a path when the
            // `::` does (the rest of a path is consumed with its head).
            let starts_word = is_word(b[i]) && (i == 0 || !is_word(b[i - 1]));
            if !starts_word {
                i += 1;
                continue;
            }
            let (paths, used) = expand(&code[i..]);
            for path in paths {
                let joined = path.join("::");
                // The first entry that matches: a whole path before a word.
                let hit = IMPURE.iter().find(|(bad, _)| {
                    if bad.contains("::") {
                        joined == *bad || joined.starts_with(&format!("{bad}::"))
                    } else {
                        path.iter().any(|part| part == bad)
                    }
                });
                if let Some((bad, what)) = hit {
                    named.insert(format!("{} names `{bad}` ({what})", file.display()));
                }
            }
            i += used.max(1);
        }
        out.extend(named);
    }
    out
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn describe(cycles: &[Vec<PathBuf>], edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> String {
    let mut out = String::new();
    for scc in cycles {
        out.push_str("cycle:\n");
        for f in scc {
            let inside: Vec<String> = edges[f]
                .iter()
                .filter(|d| scc.contains(d))
                .map(|d| d.display().to_string())
                .collect();
            out.push_str(&format!("  {} -> {}\n", f.display(), inside.join(", ")));
        }
    }
    out
}

#[test]
fn no_file_of_any_crate_is_in_a_cycle() {
    let mut report = String::new();
    let roots = crate_roots(&repo());
    assert!(roots.len() > 50, "crate roots: {roots:?}");
    for root in &roots {
        let krate = read_crate(&repo(), root);
        assert!(!krate.sources.is_empty(), "{root}: no sources found");
        let edges = graph(&krate);
        let found = cycles(&edges);
        if !found.is_empty() {
            report.push_str(&format!("{root}:\n{}", describe(&found, &edges)));
        }
    }
    assert!(
        report.is_empty(),
        "files depend on each other in a circle:\n{report}"
    );
}

#[test]
fn each_crate_depends_only_on_the_crates_below_it() {
    let root = std::fs::read_to_string(repo().join("Cargo.toml")).expect("the root Cargo.toml");
    let mut bad = unlisted_members(&root);
    for (manifest, allowed) in CRATE_DEPENDENCIES {
        let path = repo().join(manifest);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        bad.extend(dependency_violations(manifest, &text, allowed));
    }
    assert!(
        bad.is_empty(),
        "crate graph broken (docs/ARCHITECTURE.md, Layers):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_machine_crate_is_pure() {
    let krate = read_crate(&repo(), MACHINE);
    assert!(
        krate.sources.len() > 20,
        "the machine's modules were followed"
    );
    let bad = impurities(&krate);
    assert!(
        bad.is_empty(),
        "the machine crate reaches the world (docs/ARCHITECTURE.md, Layers):\n{}",
        bad.join("\n")
    );
}

// --- the checker itself, on made-up trees --------------------------------

fn tree(files: &[(&str, &str)]) -> Crate {
    let files: Sources = files
        .iter()
        .map(|(f, t)| (PathBuf::from(f), t.to_string()))
        .collect();
    Crate::collect(Path::new("lib.rs"), &|p: &Path| files.get(p).cloned())
}

#[test]
fn a_dependency_up_the_graph_is_found() {
    let allowed_of = |m: &str| {
        CRATE_DEPENDENCIES
            .iter()
            .find(|(n, _)| *n == m)
            .map(|(_, a)| *a)
            .expect("listed")
    };
    // The machine on the manager; the analysis on the manager; the `eim`
    // package on the simulator's harness.
    for (manifest, text, culprit) in [
        (
            "core/machine/Cargo.toml",
            "[dependencies]\nthiserror = \"2\"\neim-core.workspace = true\n",
            "eim-core",
        ),
        (
            "core/analysis/Cargo.toml",
            "[dependencies]\neim-machine.workspace = true\neim-core = { path = \"..\" }\n",
            "eim-core",
        ),
        (
            "Cargo.toml",
            "[workspace.dependencies]\neim-sim-harness = { path = \"sim/harness\" }\n[dependencies]\neim-core.workspace = true\neim-sim-harness.workspace = true\n",
            "eim-sim-harness",
        ),
    ] {
        let bad = dependency_violations(manifest, text, allowed_of(manifest));
        assert_eq!(bad.len(), 1, "{manifest}: {bad:?}");
        assert!(bad[0].contains(culprit), "{bad:?}");
    }
    // What is allowed, and a dev-dependency, pass.
    let text = "[dependencies]\neim-machine.workspace = true\n[dev-dependencies]\neim-core.workspace = true\n";
    assert!(dependency_violations(
        "core/analysis/Cargo.toml",
        text,
        allowed_of("core/analysis/Cargo.toml")
    )
    .is_empty());
}

#[test]
fn a_workspace_member_the_graph_does_not_list_is_found() {
    let root = "[workspace]\nmembers = [\"core/machine\", \"core/gadget\",\n  \"sim\"]\n";
    assert_eq!(
        unlisted_members(root),
        ["core/gadget/Cargo.toml is a workspace member that CRATE_DEPENDENCIES does not list"]
    );
}

#[test]
fn the_world_in_the_machine_is_found() {
    // One made-up machine per way out, each with something allowed too.
    for (code, named, what) in [
        (
            "use std::time::{Duration, Instant};\nfn f(d: Duration) {}\n",
            "std::time::Instant",
            "a clock",
        ),
        (
            "fn now() -> u64 { std::time::SystemTime::now(); 0 }\n",
            "std::time::SystemTime",
            "a clock",
        ),
        (
            "use std::{collections::BTreeMap, thread};\n",
            "std::thread",
            "a thread",
        ),
        (
            "fn f() { let _ = std::fs::read(\"x\"); }\n",
            "std::fs",
            "a file",
        ),
        ("use std::net::TcpStream;\n", "std::net", "a socket"),
        (
            "fn f() { std::process::Command::new(\"ls\"); }\n",
            "std::process",
            "a process",
        ),
        (
            "fn pid() -> i32 { unsafe { libc::getpid() } }\n",
            "libc",
            "the operating system",
        ),
        (
            "use std::sync::{Arc, Mutex};\n",
            "std::sync::Mutex",
            "a lock between threads",
        ),
    ] {
        let krate = tree(&[("lib.rs", "pub mod book;"), ("book.rs", code)]);
        let bad = impurities(&krate);
        assert_eq!(bad.len(), 1, "{code}: {bad:?}");
        assert!(
            bad[0].contains(&format!("`{named}` ({what})")) && bad[0].starts_with("book.rs"),
            "{code}: {bad:?}"
        );
    }
    // Time passed in, shared ownership, I/O traits over a caller's buffer,
    // and words in comments, strings or longer names are not the world.
    let krate = tree(&[
        ("lib.rs", "pub mod book;"),
        (
            "book.rs",
            "use std::io::Write;\nuse std::sync::Arc;\nuse std::time::Duration;\n// an Instant from std::time, std::fs\nconst S: &str = \"libc::getpid\";\nfn libc_of(at: Duration, instants: u8) {}\n",
        ),
    ]);
    assert!(impurities(&krate).is_empty(), "{:?}", impurities(&krate));
}

#[test]
fn cycles_are_found_through_super_and_root_reexports() {
    let krate = tree(&[
        (
            "lib.rs",
            "pub mod a; pub mod b; mod c;\npub use b::Thing;\n",
        ),
        (
            "a/mod.rs",
            "mod child;\npub fn f() { child::g() }\nuse self::child::g;\n",
        ),
        ("a/child.rs", "use super::f;\n"),
        ("b.rs", "fn h() { crate::a::f() }\n"),
        ("c.rs", "use crate::Thing;\n"),
    ]);
    let edges = graph(&krate);
    let found = cycles(&edges);
    assert_eq!(found.len(), 1, "{}", describe(&found, &edges));
    assert_eq!(
        found[0],
        [PathBuf::from("a/child.rs"), PathBuf::from("a/mod.rs")]
    );
    assert!(
        edges[Path::new("c.rs")].contains(Path::new("b.rs")),
        "a root re-export resolves to its module"
    );
    // A bare path through a declared child module is a dependency too.
    let krate = tree(&[
        ("lib.rs", "pub mod a;"),
        (
            "a/mod.rs",
            "pub mod child;\n#[cfg(test)]\nmod other;\nfn g() { child::h() }\n",
        ),
        ("a/child.rs", "use super::f;\n"),
        ("a/other.rs", ""),
    ]);
    assert_eq!(cycles(&graph(&krate)).len(), 1);
    // A re-export alone is a table of contents, not a use.
    let krate = tree(&[
        ("lib.rs", "pub mod a;"),
        (
            "a/mod.rs",
            "pub mod child;\npub use child::{Thing, Other};\npub(crate) use self::child::X;\n",
        ),
        ("a/child.rs", "use super::f;\n"),
    ]);
    assert!(cycles(&graph(&krate)).is_empty());
    // Modules are found by following `mod` declarations, `#[path]` too; a
    // file no declaration reaches is not part of the crate.
    let krate = tree(&[
        ("lib.rs", "#[path = \"x/y.rs\"]\nmod a;\nmod b;\n"),
        ("x/y.rs", "use crate::b::B;\n"),
        ("b.rs", "use crate::a::A;\n"),
        ("stray.rs", "use crate::b::B;\n"),
    ]);
    let found = cycles(&graph(&krate));
    assert_eq!(
        found,
        [vec![PathBuf::from("b.rs"), PathBuf::from("x/y.rs")]]
    );
    assert!(!krate.sources.contains_key(Path::new("stray.rs")));
}

#[test]
fn comments_and_strings_are_not_dependencies() {
    let krate = tree(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "// use crate::b;\n/* crate::b::x */ const S: &str = \"crate::b\"; const C: char = '\"';\nfn f<'a>(x: &'a u8) {}\n"),
        ("b.rs", "use crate::a;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    mod deeper { use super::super::X; }\n}\n"),
    ]);
    assert!(cycles(&graph(&krate)).is_empty());
    // The inline module's `super` is the file itself, not the crate root.
    let krate = tree(&[
        ("lib.rs", "pub mod a;"),
        ("a/mod.rs", "pub mod b;\nuse self::b::X;\n"),
        ("a/b.rs", "mod tests { use super::*; }\n"),
    ]);
    assert!(cycles(&graph(&krate)).is_empty());
    let krate = tree(&[
        ("lib.rs", "pub mod a;"),
        ("a/mod.rs", "pub mod b;\nuse self::b::X;\n"),
        ("a/b.rs", "mod tests { use super::super::Y; }\n"),
    ]);
    assert_eq!(cycles(&graph(&krate)).len(), 1);
}

#[test]
fn crate_dependencies_are_read_from_the_manifest() {
    let deps = eim_dependencies("[dependencies]\neim-core.workspace = true\neim-sim = { path = \"x\" }\nobject = \"1\"\n[dev-dependencies]\neim-bpf = \"1\"\n");
    assert_eq!(
        deps,
        BTreeSet::from(["eim-core".to_string(), "eim-sim".to_string()])
    );
}

// --- modules: no cycle between the modules of a module ---------------------
//
// A file cycle is the smallest knot; a module cycle is the one a reader
// meets: `host` using `report` while `report` uses `host` makes neither
// readable without the other, even when no two files point at each other.
// At every module, the dependencies between its child modules (a file
// inside `host/` on a file inside `report/` is the edge `host -> report`
// at the level where the two are siblings) must not form a cycle.

/// The dependency graph between the child modules of each module of a
/// crate: parent module -> (child -> children of the same parent it
/// uses). Nodes are module paths written as `a/b` (the crate's own
/// children are bare names). The files of `#[cfg(test)]` modules are left
/// out ([`test_files`]).
fn module_graphs(
    krate: &Crate,
    edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
) -> BTreeMap<Vec<String>, BTreeMap<PathBuf, BTreeSet<PathBuf>>> {
    let node = |module: &[String]| PathBuf::from(module.join("/"));
    let tests = test_files(krate);
    let mut out: BTreeMap<Vec<String>, BTreeMap<PathBuf, BTreeSet<PathBuf>>> = BTreeMap::new();
    for (file, deps) in edges {
        // A test module may drive its parent through a module above it
        // (`sim/src/faults/tests.rs`): it is no part of the layering.
        if tests.contains(file) {
            continue;
        }
        let from = module_of(krate, file);
        for dep in deps {
            let to = module_of(krate, dep);
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // A module using its parent or one of its own children is not
            // an edge between siblings.
            if common < from.len() && common < to.len() {
                out.entry(from[..common].to_vec())
                    .or_default()
                    .entry(node(&from[..=common]))
                    .or_default()
                    .insert(node(&to[..=common]));
            }
        }
    }
    for graph in out.values_mut() {
        let nodes: Vec<PathBuf> = graph.values().flatten().cloned().collect();
        for n in nodes {
            graph.entry(n).or_default();
        }
    }
    out
}

/// Every module cycle of a crate, described with the file dependencies
/// that make each of its edges.
fn module_cycles(krate: &Crate) -> Vec<String> {
    let edges = graph(krate);
    let mut out = Vec::new();
    for graph in module_graphs(krate, &edges).values() {
        for scc in cycles(graph) {
            let mut text = String::from("module cycle:\n");
            for m in &scc {
                for d in graph[m].iter().filter(|d| scc.contains(d)) {
                    text.push_str(&format!("  {} -> {}", m.display(), d.display()));
                    let why = file_edges_between(krate, &edges, m, d);
                    text.push_str(&format!(" ({})\n", why.join(", ")));
                }
            }
            out.push(text);
        }
    }
    out
}

/// The file dependencies that make the module edge `from -> to`
/// (at most three, for the report).
fn file_edges_between(
    krate: &Crate,
    edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    from: &Path,
    to: &Path,
) -> Vec<String> {
    let inside = |file: &Path, module: &Path| {
        let m = module_of(krate, file).join("/");
        let module = module.to_string_lossy();
        m == module || m.starts_with(&format!("{module}/"))
    };
    edges
        .iter()
        .filter(|(f, _)| inside(f, from))
        .flat_map(|(f, ds)| {
            ds.iter()
                .filter(|d| inside(d, to))
                .map(move |d| format!("{} -> {}", f.display(), d.display()))
        })
        .take(3)
        .collect()
}

#[test]
fn no_module_of_any_crate_is_in_a_cycle() {
    let mut report = String::new();
    for root in &crate_roots(&repo()) {
        let krate = read_crate(&repo(), root);
        for cycle in module_cycles(&krate) {
            report.push_str(&format!("{root}: {cycle}"));
        }
    }
    assert!(
        report.is_empty(),
        "modules depend on each other in a circle:\n{report}"
    );
}

#[test]
fn module_cycles_are_found_between_siblings_at_any_depth() {
    // No two files in a circle, but `host` and `report` are: `host/watch`
    // uses `report/summary`, which uses `host/scan`.
    let krate = tree(&[
        ("lib.rs", "pub mod host; pub mod report;"),
        ("host.rs", "pub mod scan; pub mod watch;"),
        ("host/scan.rs", ""),
        ("host/watch.rs", "use crate::report::summary::S;\n"),
        ("report.rs", "pub mod summary;"),
        ("report/summary.rs", "use crate::host::scan::Host;\n"),
    ]);
    assert!(cycles(&graph(&krate)).is_empty(), "no file cycle");
    let found = module_cycles(&krate);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("host -> report"), "{found:?}");
    assert!(found[0].contains("report -> host"), "{found:?}");
    assert!(
        found[0].contains("host/watch.rs -> report/summary.rs"),
        "the file edge is named: {found:?}"
    );
    // The same one level down, between the children of `a`.
    let krate = tree(&[
        ("lib.rs", "pub mod a;"),
        ("a.rs", "pub mod x; pub mod y;"),
        ("a/x.rs", "pub mod deep;"),
        ("a/x/deep.rs", "use super::super::y::Y;\n"),
        ("a/y.rs", "use crate::a::x::X;\n"),
    ]);
    let found = module_cycles(&krate);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a/x -> a/y"), "{found:?}");
    // A child using its parent, and the parent its child, is no cycle
    // between siblings (a file cycle, if any, is the other rule's).
    let krate = tree(&[
        ("lib.rs", "pub mod a; pub mod b;"),
        ("a.rs", "pub mod x;\nuse self::x::X;\n"),
        ("a/x.rs", "use crate::b::B;\n"),
        ("b.rs", ""),
    ]);
    assert!(module_cycles(&krate).is_empty());
}

/// The files of a crate that are compiled for its tests only: a module
/// declared `#[cfg(test)] mod x;`, and every file under it.
fn test_files(krate: &Crate) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for (module, file) in &krate.modules {
        let is_test = (1..=module.len()).any(|n| {
            let (parent, name) = (&module[..n - 1], &module[n - 1]);
            file_of(krate, parent)
                .and_then(|p| krate.sources.get(&p))
                .is_some_and(|text| declared_for_tests(text, name))
        });
        if is_test {
            out.insert(file.clone());
        }
    }
    out
}

/// Whether `text` declares `mod name;` under `#[cfg(test)]` (the
/// attribute on the declaration itself, other attributes between).
fn declared_for_tests(text: &str, name: &str) -> bool {
    let code = code_of(text);
    let mut from = 0;
    while let Some(n) = code[from..].find(&format!("mod {name};")) {
        let at = from + n;
        from = at + 1;
        let before = code[..at].trim_end();
        let before = before
            .strip_suffix("pub(crate)")
            .or_else(|| before.strip_suffix("pub"))
            .unwrap_or(before)
            .trim_end();
        // Walk back over the attributes of this declaration.
        let mut attrs = before;
        while attrs.ends_with(']') {
            let Some(open) = attrs.rfind("#[") else { break };
            if attrs[open..].starts_with("#[cfg(test)]") {
                return true;
            }
            attrs = attrs[..open].trim_end();
        }
    }
    false
}

#[test]
fn test_modules_are_no_part_of_the_module_layering() {
    // `faults/tests.rs` drives `faults` through `kernel`, which uses
    // `faults`: allowed for a test module, not for any other.
    let files = |decl: &str| {
        tree(&[
            ("lib.rs", "pub mod faults; pub mod kernel;"),
            ("faults.rs", decl),
            ("faults/tests.rs", "use crate::kernel::SimMaps;\n"),
            ("kernel.rs", "use crate::faults::Plan;\n"),
        ])
    };
    let krate = files("#[cfg(test)]\n#[allow(dead_code)]\nmod tests;\n");
    assert_eq!(
        test_files(&krate),
        BTreeSet::from([PathBuf::from("faults/tests.rs")])
    );
    assert!(module_cycles(&krate).is_empty());
    let krate = files("mod tests;\n");
    assert!(test_files(&krate).is_empty());
    assert_eq!(module_cycles(&krate).len(), 1);
}

// --- the layers of `src/` ---------------------------------------------------

/// The layers of the `eim` library (`src/lib.rs`), lowest first: a file
/// may depend on files of its own layer or of a lower one (and the module
/// cycle rule keeps a layer's modules acyclic). Every top-level module must
/// be listed. The binary (`src/cli/`) is a crate of its own above them all.
const SRC_LAYERS: &[(&str, &[&str])] = &[
    // Reading files safely, and dropping privileges.
    ("files", &["lib", "files", "sandbox"]),
    // What a host walk finds, as data.
    ("findings", &["findings"]),
    // Rendering findings: the summary, metrics, tables.
    ("reports", &["report"]),
    // What a backend's maps hold and what its reader answers.
    ("map view", &["map_view"]),
    // The host model, its walks and its summary.
    ("host", &["host"]),
    // Over the host: the daemon and its metrics endpoint, the lookup of an
    // address, stacks and profiles.
    (
        "daemon and commands",
        &["daemon", "metrics_http", "address", "stack", "profile"],
    ),
];

/// The top-level module a file of a crate belongs to (`host` for
/// `host/scan.rs`, `lib` for `lib.rs`).
fn top_module(file: &Path) -> String {
    let first = file
        .iter()
        .next()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_string()
}

/// Every dependency of a file on a file of a higher layer of `layers`, and
/// every top-level module no layer lists.
fn layer_violations_in(
    layers: &[(&'static str, &[&'static str])],
    edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
) -> Vec<String> {
    let layer_of = |module: &str| {
        layers
            .iter()
            .enumerate()
            .find(|(_, (_, mods))| mods.contains(&module))
            .map(|(n, (name, _))| (n, *name))
    };
    let mut out = Vec::new();
    for (file, deps) in edges {
        let module = top_module(file);
        let Some((layer, name)) = layer_of(&module) else {
            out.push(format!(
                "{}: module `{module}` is in no layer",
                file.display()
            ));
            continue;
        };
        for dep in deps {
            if let Some((dep_layer, dep_name)) = layer_of(&top_module(dep)) {
                if dep_layer > layer {
                    out.push(format!(
                        "{} ({name}) depends on {} ({dep_name}), a higher layer",
                        file.display(),
                        dep.display()
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn the_layers_of_src_only_point_down() {
    let krate = read_crate(&repo(), "src/lib.rs");
    assert!(krate.sources.len() > 40, "src's modules were followed");
    let bad = layer_violations_in(SRC_LAYERS, &graph(&krate));
    assert!(
        bad.is_empty(),
        "src's layers (SRC_LAYERS, docs/ARCHITECTURE.md) broken:\n{}",
        bad.join("\n")
    );
}

#[test]
fn a_report_reaching_into_the_host_breaks_src_layers() {
    let krate = tree(&[
        ("lib.rs", "pub mod host; pub mod report; pub mod gadget;"),
        ("host.rs", "pub mod scan;"),
        ("host/scan.rs", "use crate::report::Summary;\n"),
        ("report.rs", "use crate::host::scan::Host;\n"),
        ("gadget.rs", ""),
    ]);
    let bad = layer_violations_in(SRC_LAYERS, &graph(&krate));
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(
        bad[0].contains("`gadget` is in no layer"),
        "an unplaced module is reported: {bad:?}"
    );
    assert!(
        bad[1].contains("report.rs (reports) depends on host/scan.rs (host)"),
        "{bad:?}"
    );
}

// --- file size --------------------------------------------------------------

/// The most non-test lines a `.rs` file may have (lines outside
/// `#[cfg(test)] mod x { .. }` blocks; files of tests and benches are not
/// counted): a file longer than this holds more than one concern.
const MAX_FILE_LINES: usize = 1000;

/// The directories whose crate roots are tests or benches ([`ROOT_DIRS`]
/// minus binaries, examples and fuzz targets).
const TEST_ROOT_DIRS: &[&str] = &[
    "core/machine/tests",
    "core/analysis/tests",
    "core/analysis/benches",
    "core/tests",
    "core/benches",
    "sim/harness/tests",
    "bpf-backend/tests",
    "bpf-backend/benches",
    "benches",
    "tests/eim",
    "tests/cross-crate/tests",
];

/// `text`'s lines outside its `#[cfg(test)] mod x { .. }` blocks.
fn non_test_lines(text: &str) -> usize {
    let code = code_of(text);
    let mut test_lines = 0;
    for (_, body) in inline_modules(&code) {
        let head = &code[..body.start];
        let Some(decl) = head.rfind("mod ") else {
            continue;
        };
        let attrs = code[..decl].trim_end();
        let attrs = attrs.strip_suffix("pub(crate)").unwrap_or(attrs).trim_end();
        if attrs.ends_with("#[cfg(test)]") {
            let start = code[..decl].rfind("#[cfg(test)]").unwrap_or(decl);
            test_lines += code[start..=body.end.min(code.len() - 1)]
                .matches('\n')
                .count()
                + 1;
        }
    }
    text.lines().count().saturating_sub(test_lines)
}

/// Every non-test file of the workspace over [`MAX_FILE_LINES`], as
/// (repository path, non-test lines).
fn oversize_files(repo: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for root in crate_roots(repo) {
        if TEST_ROOT_DIRS
            .iter()
            .any(|d| root.starts_with(&format!("{d}/")))
        {
            continue;
        }
        let krate = read_crate(repo, &root);
        let tests = test_files(&krate);
        let dir = Path::new(&root).parent().unwrap_or(Path::new(""));
        for (file, text) in &krate.sources {
            let lines = non_test_lines(text);
            if lines > MAX_FILE_LINES && !tests.contains(file) {
                out.insert(dir.join(file).display().to_string(), lines);
            }
        }
    }
    out
}

#[test]
fn no_file_is_over_the_size_cap() {
    let over = oversize_files(&repo());
    let bad: Vec<String> = over
        .iter()
        .map(|(file, lines)| format!("{file}: {lines} non-test lines"))
        .collect();
    assert!(
        bad.is_empty(),
        "files over {MAX_FILE_LINES} non-test lines (split them by concern):\n{}",
        bad.join("\n")
    );
}

#[test]
fn test_blocks_do_not_count_towards_the_size_cap() {
    let body = "fn f() {}\n".repeat(10);
    let text =
        format!("{body}#[cfg(test)]\nmod tests {{\n    fn g() {{ let s = \"}}\"; }}\n}}\n{body}");
    assert_eq!(non_test_lines(&text), 20);
    // A module that is not for tests counts.
    let text = format!("{body}mod inner {{\n    fn g() {{}}\n}}\n");
    assert_eq!(non_test_lines(&text), 13);
    // A made-up crate with one long file, and one long only in its tests.
    let long = "fn f() {}\n".repeat(MAX_FILE_LINES + 1);
    let tested = format!("fn f() {{}}\n#[cfg(test)]\nmod tests {{\n{long}}}\n");
    let krate = tree(&[
        (
            "lib.rs",
            "mod long; mod tested;\n#[cfg(test)]\nmod checks;\n",
        ),
        ("long.rs", &long),
        ("tested.rs", &tested),
        ("checks.rs", &long),
    ]);
    let over: Vec<&PathBuf> = krate
        .sources
        .iter()
        .filter(|(f, t)| non_test_lines(t) > MAX_FILE_LINES && !test_files(&krate).contains(*f))
        .map(|(f, _)| f)
        .collect();
    assert_eq!(over, [Path::new("long.rs")]);
}

// --- module files -----------------------------------------------------------

/// Where a module is `foo.rs` beside its folder `foo/`, never `foo/mod.rs`.
const ONE_MODULE_STYLE: &[&str] = &[
    "core",
    "sim",
    "src",
    "bpf-backend",
    "tests",
    "fuzz/fuzz_targets",
];

/// The `mod.rs` files allowed there: an integration tests' helper module,
/// which as `tests/common.rs` cargo would build as a test of its own
/// (`bpf-backend` finds its tests automatically; the root package declares
/// its tests, so `tests/eim/common.rs` is none).
const MOD_RS_ALLOWED: &[&str] = &["bpf-backend/tests/common/mod.rs"];

/// Every `mod.rs` under `dirs` of `repo` (skipping `target`).
fn mod_rs_files(repo: &Path, dirs: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = dirs.iter().map(|d| repo.join(d)).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "target") {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "mod.rs") {
                let rel = path.strip_prefix(repo).unwrap_or(&path);
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn modules_are_files_beside_their_folders() {
    let found = mod_rs_files(&repo(), ONE_MODULE_STYLE);
    assert!(
        found.iter().any(|f| MOD_RS_ALLOWED.contains(&f.as_str())),
        "the search finds the allowed helper module: {found:?}"
    );
    let bad: Vec<_> = found
        .iter()
        .filter(|f| !MOD_RS_ALLOWED.contains(&f.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "mod.rs where a module is foo.rs beside foo/: {bad:?}"
    );
}

// --- docs: the paths they name exist, the code map covers the tree ----------

// A doc that names a file that moved sends its reader nowhere. Two checks:
// every repository path a doc names exists, and ARCHITECTURE's code map
// names every crate and every top-level module of each.

/// The documents whose paths are checked, besides every `docs/*.md`.
const DOCS: &[&str] = &["README.md", "tests/README.md", "bpf/README.md"];

/// What the docs write like a relative path that is no path of the
/// repository: examples (`foo/mod.rs`) and places outside it (the build
/// directory, a debug-file folder, system headers).
const NOT_REPOSITORY_PATHS: &[&str] = &[
    "foo/",
    "foo/mod.rs",
    "target/",
    ".debug/",
    "asm/types.h",
    "linux/types.h",
];

/// The endings of what the path check reads as a path.
const PATH_ENDINGS: &[&str] = &[".rs", ".md", ".c", ".h", ".sh", "/"];

/// The repository's paths, relative to its root: files as `a/b.rs`,
/// folders as `a/b/` (`.git` and `target` left out).
type Tree = BTreeSet<String>;

fn repository_tree(repo: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![repo.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let rel = path
                .strip_prefix(repo)
                .unwrap_or(&path)
                .display()
                .to_string();
            if path.is_dir() {
                if name != ".git" && name != "target" {
                    out.insert(format!("{rel}/"));
                    stack.push(path);
                }
            } else {
                out.insert(rel);
            }
        }
    }
    out
}

/// The code spans of a markdown text (`` `x` ``, which may wrap a line),
/// outside fenced blocks, with the line each starts on.
fn code_spans(text: &str) -> Vec<(usize, String)> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
            continue;
        }
        if !fenced {
            prose.push_str(line);
        }
        prose.push('\n');
    }
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    let mut line = 1;
    while let Some(open) = rest.find('`') {
        line += rest[..open].matches('\n').count();
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else {
            break;
        };
        let span = &after[..close];
        out.push((line, span.replace('\n', " ")));
        line += span.matches('\n').count();
        rest = &after[close + 1..];
    }
    out
}

/// The repository path a code span names, if it names one: no space, a
/// `/` in it, one of [`PATH_ENDINGS`] (after a `:LINE` or `:FROM-TO`
/// suffix is dropped), neither absolute (`/`, `~`), a URL, nor a glob or
/// placeholder (`*`, `{`, `<`, `?`, `$`).
fn doc_path(span: &str) -> Option<&str> {
    let mut path = span.trim();
    if let Some((head, tail)) = path.rsplit_once(':') {
        if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '-') {
            path = head;
        }
    }
    let looks_like_path = !path.contains(char::is_whitespace)
        && path.contains('/')
        && PATH_ENDINGS.iter().any(|e| path.ends_with(e))
        && !path.starts_with('/')
        && !path.starts_with('~')
        && !path.contains("://")
        && !path.contains(['*', '{', '<', '?', '$']);
    looks_like_path.then_some(path)
}

/// Every path `doc` names that `tree` does not have, as "doc:line: path".
/// A path whose first component is an entry of the repository's root must
/// exist from there; any other is relative to a folder the text names, and
/// some path of the repository must end with it (`host/scan.rs`), unless
/// [`NOT_REPOSITORY_PATHS`] lists it.
fn stale_doc_paths(tree: &Tree, doc: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (line, span) in code_spans(text) {
        let Some(path) = doc_path(&span) else {
            continue;
        };
        let first = path.split('/').next().unwrap_or("");
        let at_root = tree.contains(first) || tree.contains(&format!("{first}/"));
        let found = if at_root {
            tree.contains(path)
        } else {
            NOT_REPOSITORY_PATHS.contains(&path)
                || tree.iter().any(|p| p.ends_with(&format!("/{path}")))
        };
        if !found {
            out.push(format!("{doc}:{line}: `{path}`"));
        }
    }
    out
}

/// The documents [`stale_doc_paths`] reads: every `docs/*.md` and [`DOCS`].
fn checked_docs(tree: &Tree) -> Vec<String> {
    let mut docs: Vec<String> = tree
        .iter()
        .filter(|p| p.starts_with("docs/") && p.ends_with(".md") && p[5..].find('/').is_none())
        .cloned()
        .collect();
    docs.extend(DOCS.iter().map(|d| d.to_string()));
    docs
}

/// The workspace members of the root manifest (`members = [..]`).
fn workspace_members(root_manifest: &str) -> Vec<String> {
    let Some(at) = root_manifest.find("members") else {
        return Vec::new();
    };
    let rest = &root_manifest[at..];
    let list = rest
        .find('[')
        .and_then(|open| Some(&rest[open + 1..open + rest[open..].find(']')?]))
        .unwrap_or("");
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The section "Code map" of `docs/ARCHITECTURE.md`: up to the next
/// `## ` heading.
fn code_map(architecture: &str) -> &str {
    let Some(start) = architecture.find("\n## Code map\n") else {
        return "";
    };
    let body = &architecture[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    &body[..end]
}

/// What the code map must name: each crate's folder (`core/machine/`;
/// the root package's is `src/`) and each file or folder directly under
/// the crate's `src/`, by full path. A named folder covers what is in it,
/// except a crate's folder and its `src/`, which would cover everything.
fn code_map_gaps(tree: &Tree, members: &[String], map: &str) -> Vec<String> {
    let named: BTreeSet<String> = code_spans(map).into_iter().map(|(_, s)| s).collect();
    let mut crates: Vec<String> = members.iter().map(|m| format!("{m}/")).collect();
    crates.push(String::new());
    let too_wide: BTreeSet<String> = crates
        .iter()
        .flat_map(|c| [c.clone(), format!("{c}src/")])
        .collect();
    let covered = |path: &str| {
        named.contains(path)
            || named
                .iter()
                .any(|n| n.ends_with('/') && !too_wide.contains(n) && path.starts_with(n.as_str()))
    };
    let mut out = Vec::new();
    for krate in &crates {
        let folder = if krate.is_empty() { "src/" } else { krate };
        if !named.contains(folder) {
            out.push(format!("crate folder `{folder}`"));
        }
        let src = format!("{krate}src/");
        for path in tree {
            let Some(entry) = path.strip_prefix(&src) else {
                continue;
            };
            let direct = entry.trim_end_matches('/');
            if direct.is_empty() || direct.contains('/') {
                continue;
            }
            if !covered(path) {
                out.push(format!("module `{path}`"));
            }
        }
    }
    out
}

#[test]
fn the_paths_docs_name_exist() {
    let repo = repo();
    let tree = repository_tree(&repo);
    assert!(
        tree.contains("core/machine/src/lib.rs"),
        "the tree was read"
    );
    let docs = checked_docs(&tree);
    assert!(docs.len() > 10, "the docs were found: {docs:?}");
    let mut bad = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(repo.join(doc)).unwrap_or_default();
        assert!(!text.is_empty(), "{doc} was read");
        bad.extend(stale_doc_paths(&tree, doc, &text));
    }
    assert!(
        bad.is_empty(),
        "paths the docs name that the repository does not have:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_code_map_covers_the_tree() {
    let repo = repo();
    let tree = repository_tree(&repo);
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap_or_default();
    let members = workspace_members(&manifest);
    assert!(members.len() > 5, "the workspace members were read");
    let architecture =
        std::fs::read_to_string(repo.join("docs/ARCHITECTURE.md")).unwrap_or_default();
    let map = code_map(&architecture);
    assert!(map.len() > 1000, "the code map was found");
    let gaps = code_map_gaps(&tree, &members, map);
    assert!(
        gaps.is_empty(),
        "docs/ARCHITECTURE.md's code map does not name:\n{}",
        gaps.join("\n")
    );
}

fn made_up_tree(paths: &[&str]) -> Tree {
    let mut tree = Tree::new();
    for path in paths {
        let mut at = 0;
        while let Some(slash) = path[at..].find('/') {
            at += slash + 1;
            tree.insert(path[..at].to_string());
        }
        tree.insert(path.to_string());
    }
    tree
}

#[test]
fn a_doc_naming_a_moved_file_is_found() {
    let tree = made_up_tree(&[
        "core/machine/src/book.rs",
        "src/files/segments.rs",
        "docs/A.md",
    ]);
    let doc = "\
Plans are `core/machine/src/book.rs`'s, load biases in `src/host/segments.rs:12`,
and the bias is `files/segments.rs`'s, which `host/segments.rs` no longer is.
A wrapped span `scan
-v`, a glob `core/*/src/`, `/usr/lib/debug/`, `foo/mod.rs` and `docs/A.md`.
```
`core/src/gone.rs` in a fenced block is an example
```
But `core/src/gone.rs` is not.
";
    let bad = stale_doc_paths(&tree, "docs/A.md", doc);
    assert_eq!(
        bad,
        [
            "docs/A.md:1: `src/host/segments.rs`",
            "docs/A.md:2: `host/segments.rs`",
            "docs/A.md:8: `core/src/gone.rs`",
        ]
    );
    assert_eq!(checked_docs(&tree)[0], "docs/A.md");
}

#[test]
fn a_code_map_missing_a_crate_or_module_is_found() {
    let tree = made_up_tree(&[
        "core/machine/src/lib.rs",
        "core/machine/src/deltas.rs",
        "core/machine/src/deltas/packed.rs",
        "core/machine/src/new.rs",
        "sim/src/lib.rs",
        "src/lib.rs",
        "src/host/scan.rs",
        "src/cli/main.rs",
    ]);
    let members = workspace_members(r#"members = ["core/machine", "sim"]"#);
    let architecture = "\
# eim
## Code map
* `core/machine/`: the machine; `core/machine/src/lib.rs`,
  `core/machine/src/deltas.rs`, `core/machine/src/deltas/`.
* `sim/src/`: which does not cover its modules.
* `src/`, `src/lib.rs`, `src/cli/`.
## Invariants
* `sim/src/lib.rs` is not in the code map.
";
    let gaps = code_map_gaps(&tree, &members, code_map(architecture));
    assert_eq!(
        gaps,
        [
            "module `core/machine/src/new.rs`",
            "crate folder `sim/`",
            "module `sim/src/lib.rs`",
            "module `src/host/`",
        ]
    );
}
