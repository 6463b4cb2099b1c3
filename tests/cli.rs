//! End-to-end tests of the `eim` binary: what a user types, what they see.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn eim() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eim"));
    // Logging settings of the caller must not leak into the output.
    cmd.env_remove("RUST_LOG");
    cmd
}

/// `../shared/testdata` next to the repository, or `$EIM_TESTDATA`. Missing
/// data is a failure: these tests must never pass by comparing nothing.
fn testdata() -> PathBuf {
    let dir = std::env::var_os("EIM_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata"));
    assert!(
        dir.join("upstream").is_dir(),
        "test data not found at {} (set EIM_TESTDATA)",
        dir.display()
    );
    dir
}

fn read_xz(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut raw.as_slice(), &mut out)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    out
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.assert().success().get_output().stdout.clone();
    String::from_utf8(out).expect("UTF-8 output")
}

fn demo_json(args: &[&str]) -> Value {
    let text = stdout_of(eim().arg("demo").arg("--json").args(args));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

fn demo_text(args: &[&str]) -> String {
    stdout_of(eim().arg("demo").args(args))
}

/// The numbers on the text line that starts with `label` (followed by at
/// least two spaces), thousands separators removed.
fn numbers(text: &str, label: &str) -> Vec<u64> {
    let line = text
        .lines()
        .find(|l| {
            l.strip_prefix(label)
                .is_some_and(|rest| rest.starts_with("  "))
        })
        .unwrap_or_else(|| panic!("no line {label:?} in:\n{text}"));
    line[label.len()..]
        .split_whitespace()
        .map(|n| {
            n.replace(',', "")
                .parse()
                .unwrap_or_else(|_| panic!("{label}: {n:?}"))
        })
        .collect()
}

fn u(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at {pointer}"))
}

#[test]
fn demo_json_and_text_report_the_same_numbers() {
    let args = ["--seed", "7", "--files", "20", "--processes", "30"];
    let json = demo_json(&args);
    let text = demo_text(&args);
    for (label, field) in [
        ("started", "/processes/started"),
        ("exited", "/processes/exited"),
        ("running", "/processes/running"),
        ("mappings", "/processes/mappings"),
        ("releases", "/processes/releases"),
    ] {
        assert_eq!(numbers(&text, label), vec![u(&json, field)], "{label}");
    }
    for (label, field) in [
        ("references", "references"),
        ("files known", "files_known"),
        ("extracted deltas", "extracted_deltas"),
        ("files with a table", "files_with_table"),
        ("kernel deltas", "kernel_deltas"),
        ("page entries", "page_entries"),
        ("unwind infos in use", "unwind_infos"),
    ] {
        let both = vec![
            u(&json, &format!("/after_load/{field}")),
            u(&json, &format!("/after_exit/{field}")),
        ];
        assert_eq!(numbers(&text, label), both, "{label}");
    }
    for (label, field) in [
        ("delta tables", "delta_tables"),
        ("page map", "page_map"),
        ("total", "total"),
    ] {
        let both = vec![
            u(&json, &format!("/after_load/memory/{field}")),
            u(&json, &format!("/after_exit/memory/{field}")),
        ];
        assert_eq!(numbers(&text, label), both, "{label}");
    }
    for m in json["metrics"].as_array().expect("metrics") {
        let name = m["name"].as_str().expect("metric name");
        assert_eq!(
            numbers(&text, name),
            vec![u(m, "/id"), u(m, "/value")],
            "{name}"
        );
    }
    assert!(text.contains("book matches kernel: yes"));
}

#[test]
fn demo_json_is_self_consistent() {
    let json = demo_json(&["--seed", "11"]);
    assert_eq!(json["book_matches_kernel"], Value::Bool(true));
    assert_eq!(u(&json, "/processes/load_errors"), 0);
    assert_eq!(u(&json, "/processes/release_errors"), 0);
    let started = u(&json, "/processes/started");
    assert_eq!(u(&json, "/processes/exited"), started / 2);
    for phase in ["after_load", "after_exit"] {
        let s = &json[phase];
        let classes = s["size_classes"].as_array().expect("size classes");
        let maps: u64 = classes.iter().map(|c| u(c, "/inner_maps")).sum();
        let bytes: u64 = classes.iter().map(|c| u(c, "/bytes")).sum();
        for c in classes {
            let class = u(c, "/class");
            assert!((8..=23).contains(&class), "class {class}");
            assert!(u(c, "/inner_maps") > 0, "only classes in use are listed");
            assert_eq!(u(c, "/entries_per_map"), 1 << class);
            assert_eq!(u(c, "/bytes"), u(c, "/inner_maps") * (1 << class) * 4);
        }
        assert_eq!(maps, u(s, "/files_with_table"), "{phase}");
        assert_eq!(maps, u(s, "/live_inner_maps"), "{phase}: leaked inner maps");
        assert_eq!(bytes, u(s, "/memory/delta_tables"), "{phase}");
        assert_eq!(u(s, "/memory/page_map"), u(s, "/page_entries") * 24);
        assert_eq!(u(s, "/memory/unwind_infos"), u(s, "/unwind_infos") * 12);
        assert_eq!(
            u(s, "/memory/total"),
            bytes + u(s, "/memory/page_map") + u(s, "/memory/unwind_infos")
        );
        // Merging makes kernel deltas fewer, never more.
        assert!(u(s, "/kernel_deltas") <= u(s, "/extracted_deltas"));
        assert!(u(s, "/files_with_table") <= u(s, "/files_known"));
    }
    assert_eq!(
        u(&json, "/after_load/references"),
        u(&json, "/processes/mappings")
    );
    assert_eq!(
        u(&json, "/after_exit/references"),
        u(&json, "/processes/mappings") - u(&json, "/processes/releases")
    );
    let metric = |id: u64| {
        json["metrics"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["id"].as_u64() == Some(id)))
            .map(|m| u(m, "/value"))
            .unwrap_or_else(|| panic!("no metric {id}"))
    };
    assert_eq!(metric(43), u(&json, "/after_exit/files_with_table"));
    assert_eq!(metric(133), u(&json, "/after_exit/unwind_infos"));
    assert_eq!(metric(134), u(&json, "/after_exit/page_entries"));
    // Every file is extracted once, however many processes map it.
    assert_eq!(metric(271), u(&json, "/after_load/files_known"));
    assert_eq!(metric(204), 0);
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let strip = |mut v: Value| {
        v.as_object_mut()
            .expect("an object")
            .remove("timing")
            .expect("a timing field");
        v
    };
    let args = ["--seed", "42", "--files", "16", "--processes", "24"];
    let a = strip(demo_json(&args));
    let b = strip(demo_json(&args));
    assert_eq!(a, b);
    let other = strip(demo_json(&[
        "--seed",
        "43",
        "--files",
        "16",
        "--processes",
        "24",
    ]));
    assert_ne!(a, other);
}

#[test]
fn tables_print_upstream_encoding_byte_for_byte() {
    let dir = testdata().join("upstream");
    let out = eim()
        .arg("tables")
        .arg(dir.join("volname.deltas.xz"))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let expected = read_xz(&dir.join("volname.encoded.xz"));
    assert!(
        out == expected,
        "eim tables differs from upstream:\n{}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn tables_of_several_files_are_concatenated_in_order() {
    let dir = testdata().join("upstream");
    let names = ["vdso.arch64.withframe", "volname"];
    let out = eim()
        .arg("tables")
        .args(names.map(|n| dir.join(format!("{n}.deltas.xz"))))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let expected: Vec<u8> = names
        .iter()
        .flat_map(|n| read_xz(&dir.join(format!("{n}.encoded.xz"))))
        .collect();
    assert!(out == expected);
}

#[test]
fn a_missing_file_is_named_and_fails_after_the_others() {
    let dir = testdata().join("upstream");
    let missing = dir.join("no-such-file.deltas.xz");
    let good = dir.join("volname.deltas.xz");
    let expected = String::from_utf8(read_xz(&dir.join("volname.encoded.xz"))).expect("UTF-8");
    eim()
        .arg("tables")
        .arg(&missing)
        .arg(&good)
        .assert()
        .failure()
        .stdout(expected)
        .stderr(predicate::str::starts_with(format!(
            "eim: {}: ",
            missing.display()
        )));
}

#[test]
fn a_file_that_is_not_deltas_is_refused() {
    // An executable in the test data: not yet readable, and said so.
    let elf = testdata().join("upstream/volname");
    eim()
        .arg("tables")
        .arg(&elf)
        .assert()
        .failure()
        .stdout("")
        .stderr(
            predicate::str::contains(elf.display().to_string())
                .and(predicate::str::contains("ELF")),
        );
}

#[test]
fn tables_needs_a_file() {
    eim().arg("tables").assert().failure();
}

#[test]
fn help_lists_the_subcommands() {
    eim()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("demo").and(predicate::str::contains("tables")));
}
