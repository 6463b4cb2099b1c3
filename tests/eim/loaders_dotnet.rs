//! The .NET loader on a real `libcoreclr.so`: .NET Core 3.1.23's, from
//! PyPI's `dotnetcore2` wheel (`tests/inputs/fetch-dotnet`, which `tests/run`
//! calls and exports as `EIM_DOTNET_ROOT`). No registry reachable here
//! ships a supported runtime (6.0.0 <= v < 9.0.0), so this one is checked
//! twice: at its real versioned path it is recognised and refused by its
//! version (upstream checks the version before it looks at the file,
//! spec 11 O8), and the same bytes under a path claiming 8.0.1 give the
//! DAC table's address, compared with binutils' `nm`.
//!
//! Without `EIM_DOTNET_ROOT` the tests print a loud `SKIPPED`, unless
//! `EIM_REQUIRE_INTERPRETERS` is set: then they fail.

mod common;
use common::matches_of;
use eim_test_support::skip::skip_unless_required;
use eim_test_support::tools::nm_address;

use std::path::{Path, PathBuf};

use eim::interp::LoaderError;

const VERSION: &str = "3.1.23";

/// The fetched library at its real versioned path, or `None` (skipped).
fn real_coreclr() -> Option<PathBuf> {
    let Some(root) = std::env::var_os("EIM_DOTNET_ROOT") else {
        skip_unless_required(
            "EIM_REQUIRE_INTERPRETERS",
            "EIM_DOTNET_ROOT is unset, no real libcoreclr.so to test \
             (tests/run sets it; by hand: export EIM_DOTNET_ROOT=$(tests/inputs/fetch-dotnet))",
        );
        return None;
    };
    let lib = Path::new(&root)
        .join("shared/Microsoft.NETCore.App")
        .join(VERSION)
        .join("libcoreclr.so");
    // Once the root is given, a missing library is a broken setup, not a skip.
    assert!(lib.is_file(), "{} is missing", lib.display());
    Some(lib)
}

#[test]
fn the_real_3_1_runtime_is_recognised_and_refused_by_its_version() {
    let Some(lib) = real_coreclr() else { return };
    let matches = matches_of(&lib);
    assert_eq!(matches.len(), 1, "{matches:?}");
    assert_eq!(matches[0].loader, "dotnet");
    match &matches[0].outcome {
        Err(e @ LoaderError::UnsupportedVersion { found, supported }) => {
            assert_eq!(found, VERSION);
            assert_eq!(supported, "6.0.0 to 8.x");
            assert_eq!(
                e.to_string(),
                "version 3.1.23 is not supported (supported: 6.0.0 to 8.x)"
            );
        }
        other => panic!("expected the version refusal, got {other:?}"),
    }
    // The refusal is the version's alone: the file has what the loader
    // would read next.
    nm_address(&lib, "g_dacTable");
}

#[test]
fn the_same_bytes_under_a_supported_version_give_the_dac_table() {
    let Some(real) = real_coreclr() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    // A copy, not a link: the loader reads only the path it is given, and
    // a copy makes sure nothing resolves it back to the real directory.
    let lib = dir
        .path()
        .join("shared/Microsoft.NETCore.App/8.0.1/libcoreclr.so");
    std::fs::create_dir_all(lib.parent().expect("parent")).expect("mkdir");
    std::fs::copy(&real, &lib).expect("copy");

    let matches = matches_of(&lib);
    assert_eq!(matches.len(), 1, "{matches:?}");
    assert_eq!(matches[0].loader, "dotnet");
    let loaded = matches[0]
        .outcome
        .as_ref()
        .unwrap_or_else(|e| panic!("dotnet: {e}"));
    assert_eq!(loaded.data.version(), "8.0.1");
    // .NET is unwound through its DAC table, not interpreter_offsets.
    assert!(loaded.offsets.is_none(), "{loaded:?}");
    let dac = nm_address(&lib, "g_dacTable");
    let data = format!("{:?}", loaded.data);
    assert!(
        data.contains(&format!("dac_table: {dac}")),
        "{data} vs {dac:#x}"
    );
}
