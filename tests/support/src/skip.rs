//! Loud skips: a test whose input, tool or privilege is missing prints
//! `SKIPPED: <why>` and passes, unless the `EIM_REQUIRE_*` variable that
//! says the inputs are there is set (`tests/run` and CI set them): then it
//! fails.

use std::path::Path;

/// A loud skip, or a failure when `require_var` is set.
pub fn skip_unless_required(require_var: &str, why: &str) {
    assert!(
        std::env::var_os(require_var).is_none(),
        "{why}, and {require_var} is set"
    );
    // Straight to fd 2: the test harness captures `eprintln!` (shown only
    // for a failure), and a skip must be seen.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// A loud skip of a test whose input `what` is missing, or a failure when
/// the inputs are required.
pub fn skip_or_fail(what: &str) {
    skip_unless_required(
        "EIM_REQUIRE_INTERPRETERS",
        &format!("{what} is missing (tests/run provides it)"),
    );
}

/// Whether `path` exists; otherwise [`skip_or_fail`].
pub fn present(path: &Path) -> bool {
    if path.exists() {
        return true;
    }
    skip_or_fail(&path.display().to_string());
    false
}

/// Binutils, as `tests/run` installs them (`nm`, `objdump`, `readelf`,
/// `strings`).
pub const BINUTILS: &[&str] = &["nm", "objdump", "readelf", "strings"];

/// The arm64 cross binutils `tests/run` installs.
pub const ARM64_BINUTILS: &[&str] = &[
    "aarch64-linux-gnu-nm",
    "aarch64-linux-gnu-objdump",
    "aarch64-linux-gnu-readelf",
    "aarch64-linux-gnu-strip",
];

/// Whether every program of `tools` is on `PATH`; otherwise [`skip_or_fail`]
/// naming the first one missing. A test that runs tools calls this first:
/// a missing tool is a loud skip on a stock machine, not a panic deep in a
/// helper.
pub fn tools_present(tools: &[&str]) -> bool {
    match tools.iter().find(|t| !on_path(t)) {
        None => true,
        Some(missing) => {
            skip_or_fail(&format!("the program {missing}"));
            false
        }
    }
}

/// Whether an executable file named `program` is in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(program))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_found_on_path_and_a_missing_one_is_not() {
        assert!(on_path("sh"), "every machine has sh");
        assert!(!on_path("eim-no-such-program"));
    }
}
