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
    eprintln!("SKIPPED: {why}");
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
