//! The files a scan did not load, grouped: one line per kind and cause
//! with a count and a few example paths, however many files share it (a
//! host mapping 286 32-bit libraries gets one line, not 286). Unsupported
//! files (not ELF, 32-bit, big-endian, another machine) are their own
//! section: not loaded, but not failures.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;

use serde::Serialize;

use crate::findings::{Problem, ProblemKind};

/// Example paths a group shows unless every path is asked for.
pub const EXAMPLES: usize = 3;

/// Files that are not loaded for the same reason.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Group {
    #[serde(skip)]
    pub kind: ProblemKind,
    /// The reason, without what names one file.
    pub reason: String,
    pub count: usize,
    /// Every file's path, sorted.
    pub paths: Vec<PathBuf>,
}

/// How many paths a text report shows per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// [`EXAMPLES`] paths and how many more.
    Examples,
    /// Every path (`--files`).
    All,
}

/// `problems` grouped by kind and cause: kinds in their order, then the
/// largest groups first.
pub fn group<'a>(problems: impl IntoIterator<Item = &'a Problem>) -> Vec<Group> {
    let mut by: BTreeMap<(ProblemKind, &str), Vec<PathBuf>> = BTreeMap::new();
    for p in problems {
        by.entry((p.kind, p.cause.as_str()))
            .or_default()
            .push(p.path.clone());
    }
    let mut groups: Vec<Group> = by
        .into_iter()
        .map(|((kind, reason), mut paths)| {
            paths.sort();
            Group {
                kind,
                reason: reason.to_string(),
                count: paths.len(),
                paths,
            }
        })
        .collect();
    groups.sort_by(|a, b| {
        (a.kind, std::cmp::Reverse(a.count), &a.reason).cmp(&(
            b.kind,
            std::cmp::Reverse(b.count),
            &b.reason,
        ))
    });
    groups
}

/// The kind as the text report names it.
pub fn kind_name(kind: ProblemKind) -> &'static str {
    match kind {
        ProblemKind::Deferred => "deferred",
        ProblemKind::Failed => "failed",
        ProblemKind::Unopenable => "unopenable",
        ProblemKind::Unsupported => "unsupported",
        ProblemKind::Collision => "collision",
    }
}

/// The groups as text, one line each (`kind count reason`), then their
/// paths on the next lines. With [`Listing::Examples`] a group shows at
/// most [`EXAMPLES`] paths and says how many more there are.
pub fn render(groups: &[Group], listing: Listing) -> String {
    let mut out = String::new();
    for g in groups {
        let _ = writeln!(
            out,
            "  {:<11} {:>6}  {}",
            kind_name(g.kind),
            crate::report::table::grouped(g.count as u64),
            g.reason
        );
        let shown = match listing {
            Listing::Examples => g.paths.len().min(EXAMPLES),
            Listing::All => g.paths.len(),
        };
        for path in &g.paths[..shown] {
            let _ = writeln!(out, "{:22}{}", "", path.display());
        }
        if shown < g.paths.len() {
            let _ = writeln!(
                out,
                "{:22}... and {} more (--files lists them all)",
                "",
                crate::report::table::grouped((g.paths.len() - shown) as u64)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: ProblemKind, path: &str, cause: &str) -> Problem {
        Problem {
            path: PathBuf::from(path),
            file_id: None,
            kind,
            reason: format!("file 1234: {path}: {cause}"),
            cause: cause.to_string(),
        }
    }

    const ELF32: &str = "a 32-bit ELF file: only 64-bit little-endian ELF files are supported";

    #[test]
    fn many_files_failing_the_same_way_are_one_line_with_a_count() {
        let mut problems: Vec<Problem> = (0..286)
            .map(|i| {
                problem(
                    ProblemKind::Unsupported,
                    &format!("/lib32/l{i:03}.so"),
                    ELF32,
                )
            })
            .collect();
        problems.push(problem(
            ProblemKind::Unsupported,
            "/x/a.dll",
            "not an ELF file",
        ));
        problems.push(problem(ProblemKind::Failed, "/bin/b", "bad CIE"));
        problems.push(problem(ProblemKind::Failed, "/bin/a", "bad CIE"));
        problems.push(problem(ProblemKind::Deferred, "/bin/c", "bad FDE"));
        let groups = group(&problems);
        let summary: Vec<(ProblemKind, &str, usize)> = groups
            .iter()
            .map(|g| (g.kind, g.reason.as_str(), g.count))
            .collect();
        assert_eq!(
            summary,
            [
                (ProblemKind::Deferred, "bad FDE", 1),
                (ProblemKind::Failed, "bad CIE", 2),
                (ProblemKind::Unsupported, ELF32, 286),
                (ProblemKind::Unsupported, "not an ELF file", 1),
            ]
        );
        assert_eq!(groups[1].paths, [PathBuf::from("/bin/a"), "/bin/b".into()]);

        let text = render(&groups, Listing::Examples);
        let elf32_lines: Vec<&str> = text.lines().filter(|l| l.contains(ELF32)).collect();
        assert_eq!(elf32_lines.len(), 1, "{text}");
        assert!(elf32_lines[0].contains(" 286 "), "{text}");
        assert!(text.contains("/lib32/l000.so") && text.contains("/lib32/l002.so"));
        assert!(!text.contains("/lib32/l003.so"), "{text}");
        assert!(text.contains("... and 283 more"), "{text}");
        // Four reasons, their paths (1 + 2 + 3 + 1), one "and more".
        assert_eq!(text.lines().count(), 4 + 7 + 1, "{text}");

        let all = render(&groups, Listing::All);
        for i in 0..286 {
            assert!(all.contains(&format!("/lib32/l{i:03}.so\n")), "{i}");
        }
        assert!(!all.contains("more"), "{all}");
    }
}
