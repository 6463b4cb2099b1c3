//! Whether the test data is the data the oracle made: every file as
//! `FILES.sha256` lists it (inputs and expected outputs alike, and nothing
//! unlisted), every input of the test data as `oracle/MANIFEST.tsv`,
//! `oracle/BIN.sha256` and `upstream/SHA256SUMS` record it, and every
//! input with its outputs. A copy that rotted (a byte flipped, a file
//! lost or added, a line ending converted) is named here instead of
//! showing as a difference between eim and the oracle.
//!
//! The machine image's files (`/usr/...` rows of the manifest) are not
//! part of the data: [`crate::oracle::Input::available`] checks them where
//! they are used.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

use crate::data::sha256_hex;

/// The list of every file of the test data with its SHA-256, in
/// `sha256sum`'s format, paths relative to the data's root.
pub const TREE_SUMS: &str = "FILES.sha256";

/// How many files the walk of the data's tree looks at, at most (it holds
/// about a hundred): a tree that has grown past it is a problem in itself.
const MAX_FILES: usize = 10_000;

/// How deep the walk goes (the data is two levels deep).
const MAX_DEPTH: usize = 8;

/// A file's contents, as the check reads them: `std::fs::read`, or, in
/// the check's own tests, a reader that spoils one file.
pub type Reader<'a> = &'a dyn Fn(&Path) -> io::Result<Vec<u8>>;

/// Every problem with the test data under `root`, each naming its file;
/// empty when the data is intact.
pub fn problems(root: &Path, read: Reader<'_>) -> Vec<String> {
    let mut check = Check {
        root,
        read,
        sums: BTreeMap::new(),
        problems: Vec::new(),
    };
    check.tree();
    check.oracle_inputs();
    check.upstream_inputs();
    check.problems
}

struct Check<'a> {
    root: &'a Path,
    read: Reader<'a>,
    /// The SHA-256 of each file read so far (or why it could not be read),
    /// by path relative to the root: each file is read once.
    sums: BTreeMap<String, Result<String, String>>,
    problems: Vec<String>,
}

impl Check<'_> {
    fn sha256(&mut self, rel: &str) -> Result<String, String> {
        let (root, read) = (self.root, self.read);
        self.sums
            .entry(rel.to_string())
            .or_insert_with(|| {
                read(&root.join(rel))
                    .map(|bytes| sha256_hex(&bytes))
                    .map_err(|e| format!("{}: cannot read: {e}", root.join(rel).display()))
            })
            .clone()
    }

    /// `rel`'s contents must have the SHA-256 `expected`, as `listed_in`
    /// says.
    fn expect_sha256(&mut self, rel: &str, expected: &str, listed_in: &str) {
        match self.sha256(rel) {
            Ok(found) if found == expected => {}
            Ok(found) => self.problems.push(format!(
                "{}: sha256 {found}, {listed_in} says {expected}",
                self.root.join(rel).display()
            )),
            Err(e) => self.problems.push(format!("{e} (listed in {listed_in})")),
        }
    }

    /// A text file of the data, or a problem.
    fn text(&mut self, rel: &str) -> Option<String> {
        let path = self.root.join(rel);
        match (self.read)(&path).map(String::from_utf8) {
            Ok(Ok(text)) => Some(text),
            Ok(Err(_)) => {
                self.problems
                    .push(format!("{}: not UTF-8 text", path.display()));
                None
            }
            Err(e) => {
                self.problems
                    .push(format!("{}: cannot read: {e}", path.display()));
                None
            }
        }
    }

    /// `FILES.sha256` against the tree: each listed file is there with its
    /// sum, and each file there is listed.
    fn tree(&mut self) {
        let Some(text) = self.text(TREE_SUMS) else {
            return;
        };
        let listed = self.sum_lines(&text, TREE_SUMS);
        for (rel, sha) in &listed {
            self.expect_sha256(rel, sha, TREE_SUMS);
        }
        let mut found = BTreeSet::new();
        if let Err(e) = walk(self.root, "", 0, &mut found) {
            self.problems.push(e);
        }
        for rel in found {
            if rel != TREE_SUMS && !listed.contains_key(&rel) {
                self.problems.push(format!(
                    "{}: not listed in {TREE_SUMS}",
                    self.root.join(&rel).display()
                ));
            }
        }
    }

    /// The lines `<sha256>  <path>` of a `sha256sum` listing, by path
    /// (`./` dropped); a malformed line is a problem.
    fn sum_lines(&mut self, text: &str, what: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let parsed = line
                .split_once("  ")
                .filter(|(sha, path)| is_sha256(sha) && !path.is_empty());
            match parsed {
                Some((sha, path)) => {
                    let path = path.strip_prefix("./").unwrap_or(path);
                    out.insert(path.to_string(), sha.to_string());
                }
                None => self
                    .problems
                    .push(format!("{what} line {}: not `<sha256>  <path>`", n + 1)),
            }
        }
        out
    }

    /// The manifest's inputs that are part of the data (`bin/...`): their
    /// size and sum as the manifest and `BIN.sha256` record them, the two
    /// lists agreeing; and every row's outputs.
    fn oracle_inputs(&mut self) {
        let (Some(manifest), Some(bin_sums)) = (
            self.text("oracle/MANIFEST.tsv"),
            self.text("oracle/BIN.sha256"),
        ) else {
            return;
        };
        let mut bin = self.sum_lines(&bin_sums, "oracle/BIN.sha256");
        let mut lines = manifest.lines();
        if !lines
            .next()
            .is_some_and(|h| h.starts_with("name\tpath\tsize\tsha256\t"))
        {
            self.problems
                .push("oracle/MANIFEST.tsv: not its header (name path size sha256 ...)".into());
            return;
        }
        for (n, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let cols: Vec<&str> = line.split('\t').collect();
            let [name, path, size, sha, ..] = cols[..] else {
                self.problems
                    .push(format!("oracle/MANIFEST.tsv line {}: short row", n + 2));
                continue;
            };
            for ext in ["deltas.xz", "encoded.xz", "fileid", "tsd"] {
                self.exists(&format!("oracle/{name}.{ext}"), "oracle/MANIFEST.tsv");
            }
            if Path::new(path).is_absolute() {
                continue; // the machine image's: checked where it is used
            }
            let rel = format!("oracle/{path}");
            self.expect_sha256(&rel, sha, "oracle/MANIFEST.tsv");
            self.expect_size(&rel, size);
            let file_name = Path::new(path)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            match bin.remove(&file_name) {
                Some(listed) if listed == sha => {}
                Some(listed) => self.problems.push(format!(
                    "oracle/BIN.sha256 says {listed} for {file_name}, MANIFEST.tsv {sha}"
                )),
                None => self
                    .problems
                    .push(format!("oracle/BIN.sha256 does not list {file_name}")),
            }
        }
        for name in bin.keys() {
            self.problems.push(format!(
                "oracle/BIN.sha256 lists {name}, which MANIFEST.tsv does not"
            ));
        }
    }

    /// Upstream's test files with their sums and outputs.
    fn upstream_inputs(&mut self) {
        let Some(text) = self.text("upstream/SHA256SUMS") else {
            return;
        };
        let listed = self.sum_lines(&text, "upstream/SHA256SUMS");
        if listed.is_empty() {
            self.problems
                .push("upstream/SHA256SUMS lists no file".into());
        }
        for (name, sha) in &listed {
            self.expect_sha256(&format!("upstream/{name}"), sha, "upstream/SHA256SUMS");
            for ext in ["deltas.xz", "encoded.xz", "fileid"] {
                self.exists(&format!("upstream/{name}.{ext}"), "upstream/SHA256SUMS");
            }
        }
    }

    fn exists(&mut self, rel: &str, because: &str) {
        if !self.root.join(rel).is_file() {
            self.problems.push(format!(
                "{}: missing (an output of an input of {because})",
                self.root.join(rel).display()
            ));
        }
    }

    fn expect_size(&mut self, rel: &str, size: &str) {
        let path = self.root.join(rel);
        match std::fs::metadata(&path) {
            Ok(m) if m.len().to_string() == size => {}
            Ok(m) => self.problems.push(format!(
                "{}: {} bytes, MANIFEST.tsv says {size}",
                path.display(),
                m.len()
            )),
            Err(e) => self
                .problems
                .push(format!("{}: cannot stat: {e}", path.display())),
        }
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Every regular file under `root/rel`, by path relative to `root`; at
/// most [`MAX_FILES`], at most [`MAX_DEPTH`] levels down.
fn walk(root: &Path, rel: &str, depth: usize, found: &mut BTreeSet<String>) -> Result<(), String> {
    let dir = root.join(rel);
    if depth > MAX_DEPTH {
        return Err(format!("{}: deeper than {MAX_DEPTH} levels", dir.display()));
    }
    let entries =
        std::fs::read_dir(&dir).map_err(|e| format!("{}: cannot list: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: cannot list: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let child = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", root.join(&child).display()))?;
        if kind.is_dir() {
            walk(root, &child, depth + 1, found)?;
        } else {
            found.insert(child);
        }
        if found.len() > MAX_FILES {
            return Err(format!("{}: more than {MAX_FILES} files", root.display()));
        }
    }
    Ok(())
}
