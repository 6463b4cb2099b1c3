//! golabels' offset of `g` on x86-64, on Go executables of each link shape
//! built here with Debian's Go toolchain (`tests/run` installs
//! `golang-go`): plain (non-PIE), position-independent, and statically
//! linked with cgo, where the C library's TLS moves `g` away from -8. The
//! expected offsets come from objdump's reading of `runtime.stackcheck`,
//! not from eim's decoder; the stripped corpus binary (found through the
//! pc/line table) must give what its unstripped twin gives.
//!
//! Without `go` or a C compiler the test is a loud skip, or a failure when
//! `EIM_REQUIRE_INTERPRETERS` is set.

mod common;
use common::{data_of, matches_of};
use eim_test_support::skip::skip_or_fail;
use eim_test_support::skip::{tools_present, BINUTILS};
use eim_test_support::tools::{nm_address, objdump_lines};

use std::path::{Path, PathBuf};
use std::process::Command;

use eim::interp::go::GoLabelsData;

const PROGRAM: &str = r#"package main

/*
int add(int a, int b) { return a + b; }
*/
import "C"
import "fmt"

func main() { fmt.Println(C.add(1, 2)) }
"#;

fn tls_g_offset(path: &Path) -> i64 {
    data_of::<GoLabelsData>(&matches_of(path), "golabels").tls_g_offset
}

/// What objdump shows `runtime.stackcheck` loading `g` from: `mov
/// %fs:DISP,%rax`, or `mov $IMM,%rcx` then `mov %fs:(%rcx),%rax`.
fn objdump_offset(path: &Path) -> i64 {
    let start = nm_address(path, "runtime.stackcheck.abi0");
    let lines = objdump_lines("objdump", path, start..start + 16);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex") as i64;
    let mut rcx = None;
    for (_, mnemonic, operands) in &lines {
        if mnemonic != "mov" {
            continue;
        }
        if let Some(imm) = operands
            .strip_prefix('$')
            .and_then(|o| o.strip_suffix(",%rcx"))
        {
            rcx = Some(hex(imm));
        } else if let Some(rest) = operands.strip_prefix("%fs:") {
            if rest == "(%rcx),%rax" {
                return rcx.expect("rcx set before the load");
            }
            if let Some(disp) = rest.strip_suffix(",%rax") {
                return hex(disp);
            }
        }
    }
    panic!("no fs load in objdump's runtime.stackcheck: {lines:?}");
}

fn tool(name: &str) -> bool {
    let found = Command::new(name).arg("version").output().is_ok();
    if !found {
        skip_or_fail(&format!("{name} (tests/run installs golang-go)"));
    }
    found
}

/// Builds the cgo program with extra `go build` arguments.
fn build(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build-cache");
    let status = Command::new("go")
        .arg("build")
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(".")
        .current_dir(dir)
        .env("GOCACHE", &cache)
        .env("GOPATH", dir.join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "1")
        .status()
        .expect("go build");
    assert!(status.success(), "go build {args:?}");
    out
}

#[test]
fn g_offset_of_each_link_shape() {
    if !tool("go") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("main.go"), PROGRAM).expect("main.go");
    std::fs::write(dir.path().join("go.mod"), "module labels\n\ngo 1.19\n").expect("go.mod");
    let shapes: [(&str, &[&str]); 3] = [
        ("plain", &[]),
        ("pie", &["-buildmode=pie"]),
        (
            "static-cgo",
            &["-ldflags", "-linkmode external -extldflags -static"],
        ),
    ];
    let mut seen = Vec::new();
    for (name, args) in shapes {
        let exe = build(dir.path(), name, args);
        let (got, want) = (tls_g_offset(&exe), objdump_offset(&exe));
        eprintln!("GOLABELS {name}: tls_g_offset {got} (objdump {want})");
        assert_eq!(got, want, "{name}");
        seen.push(got);
    }
    // The shapes are not all the same answer: static cgo moves g.
    assert_ne!(
        seen[0], seen[2],
        "static cgo should not be at the usual slot"
    );
}

#[test]
fn a_stripped_binary_gives_what_its_twin_gives() {
    if !tools_present(BINUTILS) {
        return;
    }
    let bin = eim_test_support::data::oracle_bin();
    let (full, stripped) = (
        bin.join("gocorpus-go1.23-amd64"),
        bin.join("gocorpus-go1.23-amd64-stripped"),
    );
    let want = objdump_offset(&full);
    assert_eq!(tls_g_offset(&full), want);
    assert_eq!(tls_g_offset(&stripped), want);
}
