//! End-to-end tests of the `eim` binary: what a user types, what they see.

use std::path::PathBuf;

use assert_cmd::Command;
use eim_test_support::{oracle, read_xz, testdata};
use predicates::prelude::*;
use serde_json::Value;

fn eim() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eim"));
    // Logging settings of the caller must not leak into the output.
    cmd.env_remove("RUST_LOG");
    cmd
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
        out == expected.as_bytes(),
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
        .flat_map(|n| read_xz(&dir.join(format!("{n}.encoded.xz"))).into_bytes())
        .collect();
    assert!(out == expected);
}

#[test]
fn a_missing_file_is_named_and_fails_after_the_others() {
    let dir = testdata().join("upstream");
    let missing = dir.join("no-such-file.deltas.xz");
    let good = dir.join("volname.deltas.xz");
    let expected = read_xz(&dir.join("volname.encoded.xz"));
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
fn a_file_that_is_neither_elf_nor_deltas_is_refused() {
    let readme = testdata().join("upstream/README.md");
    eim()
        .arg("tables")
        .arg(&readme)
        .assert()
        .failure()
        .stdout("")
        .stderr(
            predicate::str::contains(readme.display().to_string())
                .and(predicate::str::contains("not a deltas file")),
        );
}

#[test]
fn a_malformed_deltas_file_is_refused_naming_its_line() {
    let dir = std::env::temp_dir().join(format!("eim-cli-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let head =
        "# file: /x\n# deltas: 2\n# ADDRESS HINTS OPCODE PARAM FPOPCODE FPPARAM MERGEOPCODE\n";
    for (name, text, message) in [
        (
            "short",
            format!("{head}850 1 2 16 0 0 0\n"),
            "line 2: declares 2 deltas but the file ends after 1 (at line 4)",
        ),
        (
            "long",
            format!("{head}850 1 2 16 0 0 0\n851 1 2 16 0 0 0\n852 1 2 16 0 0 0\n"),
            "line 6: delta row 3 is one more than the 2 that line 2 declares",
        ),
        (
            "extra",
            format!("{head}850 1 2 16 0 0 0\n851 1 2 16 0 0 0 7\n"),
            "line 5: extra field \"7\" after the merge opcode (a row has 7 fields)",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write the deltas file");
        eim()
            .arg("tables")
            .arg(&path)
            .assert()
            .failure()
            .stdout("")
            .stderr(format!("eim: {}: {message}\n", path.display()));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tables_needs_a_file() {
    eim().arg("tables").assert().failure();
}

#[test]
fn help_lists_the_subcommands() {
    eim().arg("--help").assert().success().stdout(
        predicate::str::contains("demo")
            .and(predicate::str::contains("tables"))
            .and(predicate::str::contains("deltas"))
            .and(predicate::str::contains("fileid")),
    );
}

#[test]
fn pin_options_where_nothing_is_pinned_are_refused_before_any_work() {
    // Each would be ignored: the user who typed it expects it to act.
    for (args, named) in [
        (vec!["scan", "--pin-dir", "/nonexistent/pins"], "--pin-dir"),
        (vec!["scan", "--mount-bpffs"], "--mount-bpffs"),
        (
            vec!["scan", "--backend", "kernel", "--no-pin", "--pin-dir", "/x"],
            "--pin-dir",
        ),
        (
            vec!["watch", "--recreate-mismatched", "--interval", "1s"],
            "--recreate-mismatched",
        ),
        (
            vec!["lookup", "--pin-dir", "/x", "/usr/bin/sleep", "0x1000"],
            "--pin-dir",
        ),
        (
            vec![
                "lookup",
                "--backend",
                "kernel",
                "--pin-dir",
                "/x",
                "/bin/sh",
                "0",
            ],
            "--pin-dir",
        ),
    ] {
        eim()
            .args(&args)
            .timeout(std::time::Duration::from_secs(20))
            .assert()
            .code(1)
            .stdout("")
            .stderr(predicate::str::contains(format!(
                "{named} would be ignored"
            )));
    }
    // `--pinned` reads the pins: a backend or a pin creation option with it
    // is a usage error.
    for extra in [
        ["--backend", "sim"],
        ["--backend", "kernel"],
        ["--no-pin", "--mount-bpffs"],
    ] {
        eim()
            .args(["lookup", "--pinned"])
            .args(extra)
            .args(["/bin/sh", "0"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("cannot be used with"));
    }
    // The pin directory is still the default for the kernel backend.
    eim()
        .args(["status", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("/sys/fs/bpf/eim"));
}

// ---------------------------------------------------------------------------
// ELF files: `eim fileid`, `eim deltas`, `eim tables FILE`.

/// Every input of `oracle/MANIFEST.tsv` and `upstream/SHA256SUMS`, each
/// checked against its recorded SHA-256 first: a file of the machine image
/// that differs (another package version) is a loud skip (a failure under
/// `EIM_REQUIRE_INTERPRETERS`) rather than compared against outputs of
/// another file.
fn oracle_inputs() -> Vec<oracle::Input> {
    let all = oracle::inputs(&testdata());
    assert_eq!(all.len(), 21, "17 oracle and 4 upstream inputs");
    let inputs: Vec<oracle::Input> = all.into_iter().filter(oracle::Input::available).collect();
    for input in &inputs {
        input.bytes(); // read and checked against its sha256
    }
    inputs
}

#[test]
fn fileid_equals_every_fileid_file() {
    for input in oracle_inputs() {
        let expected = std::fs::read_to_string(input.dir.join(format!("{}.fileid", input.name)))
            .unwrap_or_else(|e| panic!("{}.fileid: {e}", input.name));
        let out = stdout_of(eim().current_dir(&input.dir).arg("fileid").arg(&input.path));
        assert_eq!(out, expected, "{}", input.name);
        if let Some(id) = &input.fileid64 {
            assert_eq!(
                out.split(' ').nth(1),
                Some(id.as_str()),
                "MANIFEST.tsv: {}",
                input.name
            );
        }
    }
}

#[test]
fn fileid_of_several_files_prints_one_line_each_in_order() {
    let dir = testdata().join("upstream");
    let names = ["volname", "vdso.arch64.withframe", "volname"];
    let expected: String = names
        .iter()
        .map(|n| std::fs::read_to_string(dir.join(format!("{n}.fileid"))).expect("fileid"))
        .collect();
    let out = stdout_of(eim().current_dir(&dir).arg("fileid").args(names));
    assert_eq!(out, expected);
}

/// Broken inputs made from `volname`, in a temporary directory.
struct BrokenFiles {
    _dir: tempfile::TempDir,
    /// (path, what stderr must say)
    cases: Vec<(PathBuf, &'static str)>,
}

fn broken_files() -> BrokenFiles {
    let dir = tempfile::tempdir().expect("temp dir");
    let volname = std::fs::read(testdata().join("upstream/volname")).expect("volname");
    let mut cases = vec![(
        dir.path().join("missing"),
        "cannot open: No such file or directory",
    )];
    let mut add = |name: &str, bytes: &[u8], says: &'static str| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        cases.push((path, says));
    };
    add("text", b"#!/bin/sh\necho hello\n", "not an ELF file");
    // The section header table is at the end of the file: cut it off.
    add(
        "truncated",
        &volname[..volname.len() / 2],
        "truncated ELF file: the section header table",
    );
    add(
        "header-only",
        &volname[..40],
        "truncated ELF file: 40 bytes, shorter than the 64-byte ELF header",
    );
    let mut elf32 = volname.clone();
    elf32[4] = 1; // EI_CLASS: ELFCLASS32
    add("elf32", &elf32, "a 32-bit ELF file");
    BrokenFiles { _dir: dir, cases }
}

#[test]
fn fileid_refuses_what_it_cannot_read_naming_the_file() {
    let good = testdata().join("upstream/volname");
    let good_line = format!(
        "9bb76b8b80cc90a1afc778507ac1d64c 9bb76b8b80cc90a1 {}\n",
        good.display()
    );
    let broken = broken_files();
    for (path, says) in &broken.cases {
        // The bad file is reported, the good one after it still printed.
        eim()
            .arg("fileid")
            .arg(path)
            .arg(&good)
            .assert()
            .failure()
            .stdout(good_line.clone())
            .stderr(predicate::str::starts_with(format!(
                "eim: {}: {says}",
                path.display()
            )));
    }
}

#[test]
fn deltas_refuses_what_it_cannot_read_naming_the_file() {
    let broken = broken_files();
    for (path, says) in &broken.cases {
        let out = eim()
            .arg("deltas")
            .arg(path)
            .assert()
            .failure()
            .stderr(predicate::str::starts_with(format!(
                "eim: {}: {says}",
                path.display()
            )))
            .get_output()
            .stdout
            .clone();
        let out = String::from_utf8(out).expect("UTF-8");
        let expected_head = format!("# file: {}\n# error: {says}", path.display());
        assert!(out.starts_with(&expected_head), "{out}");
        assert_eq!(out.lines().count(), 2, "{out}");
    }
}

#[test]
fn tables_refuses_a_broken_elf_file_naming_it() {
    let broken = broken_files();
    let (path, says) = broken
        .cases
        .iter()
        .find(|(p, _)| p.ends_with("elf32"))
        .expect("elf32");
    eim()
        .arg("tables")
        .arg(path)
        .assert()
        .failure()
        .stdout("")
        .stderr(predicate::str::starts_with(format!(
            "eim: {}: {says}",
            path.display()
        )));
}

#[test]
fn the_size_limit_is_configurable() {
    let volname = testdata().join("upstream/volname");
    for cmd in ["fileid", "deltas"] {
        eim()
            .arg(cmd)
            .args(["--max-size", "6000"])
            .arg(&volname)
            .assert()
            .failure()
            .stderr(predicate::str::contains(
                "6136 bytes, larger than the limit of 6000 bytes",
            ));
    }
    eim()
        .arg("fileid")
        .args(["--max-size", "6136"])
        .arg(&volname)
        .assert()
        .success();
}

/// `eim COMMAND <input>`, run where the input's outputs are, prints exactly
/// upstream's `<name>.SUFFIX.xz` for every oracle input.
fn every_oracle_output_equals(command: &str, suffix: &str) {
    for input in oracle_inputs() {
        let expected = read_xz(&input.dir.join(format!("{}.{suffix}.xz", input.name)));
        let out = eim()
            .current_dir(&input.dir)
            .arg(command)
            .arg(&input.path)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        assert!(
            out == expected.as_bytes(),
            "{}: eim {command} differs from upstream (first lines):\n{}",
            input.name,
            String::from_utf8_lossy(&out[..out.len().min(2000)])
        );
    }
}

#[test]
fn deltas_equal_every_oracle_deltas_file() {
    every_oracle_output_equals("deltas", "deltas");
}

#[test]
fn plain_extraction_of_the_arm64_vdso_gives_no_deltas_as_upstream() {
    // No unwind sections: upstream's extraction yields 0 deltas (the
    // synthesized ones come only from the vDSO synthesis).
    let dir = testdata().join("upstream");
    let expected = read_xz(&dir.join("vdso.arch64.withframe.deltas.xz")).into_bytes();
    let out = eim()
        .current_dir(&dir)
        .args(["deltas", "vdso.arch64.withframe"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(out == expected, "{}", String::from_utf8_lossy(&out));
}

#[test]
fn tables_of_every_oracle_elf_file_equal_upstream_encoding() {
    every_oracle_output_equals("tables", "encoded");
}

#[test]
fn deltas_vdso_prints_the_seven_synthetic_deltas() {
    let vdso = testdata().join("upstream/vdso.arch64.withframe");
    let out = eim()
        .arg("deltas")
        .arg("--vdso")
        .arg(&vdso)
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        rows,
        [
            "0 0 2 0 4 0 0",
            "7d8 0 3 16 3 8 0",
            "7e4 0 2 0 4 0 0",
            "800 0 3 16 3 8 0",
            "80c 0 2 0 4 0 0",
            "8f8 0 0 3 0 0 0",
            "900 0 2 0 4 0 0"
        ]
    );
    eim()
        .arg("deltas")
        .arg("--vdso")
        .arg(testdata().join("upstream/volname"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("not an arm64 vDSO image"));
}

// ---------------------------------------------------------------------------
// `eim inspect`.

/// The oracle's TSD line of an input (the second line of its `.tsd`).
fn oracle_tsd_line(input: &oracle::Input) -> String {
    let text = std::fs::read_to_string(input.dir.join(format!("{}.tsd", input.name)))
        .unwrap_or_else(|e| panic!("{}.tsd: {e}", input.name));
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(format!("# file: {}", input.path).as_str()),
        "{}.tsd names its input",
        input.name
    );
    lines.next().expect("a result line").to_string()
}

/// The TSD line a `--json` report implies.
fn tsd_line_of_json(tsd: &serde_json::Value) -> String {
    match tsd["status"].as_str() {
        Some("found") => format!(
            "tsd offset={} multiplier={} indirect={}",
            tsd["offset"], tsd["multiplier"], tsd["indirect"]
        ),
        Some("not-a-tsd-dso") => "# not-a-tsd-dso".to_string(),
        Some("error") => format!("# error: {}", tsd["message"].as_str().expect("message")),
        other => panic!("unknown TSD status {other:?}"),
    }
}

#[test]
fn inspect_prints_the_oracles_tsd_line_for_every_input() {
    let mut compared = 0;
    let inputs = oracle_inputs();
    // Every oracle input here: 17, or 16 without musl's libc.so.
    let oracle_here = inputs.iter().filter(|i| i.fileid64.is_some()).count();
    for input in inputs {
        if input.fileid64.is_none() {
            continue; // upstream's test files have no .tsd
        }
        let expected = oracle_tsd_line(&input);
        let mut args = vec!["inspect"];
        // The files in bin/ lost their C-library names when they were
        // renamed: analyse those upstream analysed regardless of name.
        if !input.path.starts_with('/') && expected != "# not-a-tsd-dso" {
            args.push("--force-libc");
        }
        let text = stdout_of(eim().current_dir(&input.dir).args(&args).arg(&input.path));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.first().copied(),
            Some(format!("# file: {}", input.path).as_str())
        );
        assert_eq!(
            lines.get(3),
            Some(&expected.as_str()),
            "{}: {text}",
            input.name
        );
        let tsd_lines = lines
            .iter()
            .filter(|l| {
                l.starts_with("tsd ") || l.starts_with("# error") || l.starts_with("# not-a")
            })
            .count();
        assert_eq!(tsd_lines, 1, "{}: exactly one TSD line: {text}", input.name);

        let json = stdout_of(
            eim()
                .current_dir(&input.dir)
                .args(&args)
                .arg("--json")
                .arg(&input.path),
        );
        let report: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
        assert_eq!(tsd_line_of_json(&report["tsd"]), expected, "{}", input.name);
        assert_eq!(report["file"], input.path.as_str());
        assert_eq!(
            lines.get(1).copied(),
            Some(format!(
                "fileid: {} {}",
                report["fileid"].as_str().expect("fileid"),
                report["fileid64"].as_str().expect("fileid64")
            ))
            .as_deref()
        );
        assert_eq!(report["fileid64"].as_str(), input.fileid64.as_deref());
        assert_eq!(
            lines.get(2).copied(),
            Some(format!("deltas: {}", report["deltas"])).as_deref()
        );
        // The Go binaries are Go's (and Go labels'); no C file is an
        // interpreter's.
        let loaders: Vec<&str> = report["loaders"]
            .as_array()
            .expect("loaders")
            .iter()
            .filter_map(|m| m["loader"].as_str())
            .collect();
        let want: &[&str] = if input.path.contains("gocorpus") {
            &["go", "golabels"]
        } else {
            &[]
        };
        assert_eq!(loaders, want, "{}", input.path);
        for loader in loaders {
            assert!(text.contains(&format!("\n  {loader} ")), "{text}");
        }
        compared += 1;
    }
    assert_eq!(compared, oracle_here);
    assert!(
        compared >= 16,
        "the oracle inputs of the test data and glibc's"
    );
}

#[test]
fn inspect_checks_the_name_as_given() {
    let bin = testdata().join("oracle/bin");
    let dir = tempfile::tempdir().expect("temp dir");
    let link = |target: &str, name: &str| {
        let path = dir.path().join(name);
        std::os::unix::fs::symlink(bin.join(target), &path).expect("symlink");
        path
    };
    // Under a C library's name the renamed musl is analysed without
    // --force-libc, and its DTV too.
    let musl = link("aarch64-musl-libc.so", "ld-musl-aarch64.so.1");
    let text = stdout_of(eim().arg("inspect").arg(&musl));
    assert!(
        text.contains("\ntsd offset=-88 multiplier=8 indirect=1\n"),
        "{text}"
    );
    assert!(text.contains("\ndtv offset=-8 multiplier=8\n"), "{text}");
    // ld-linux is a C library only to HEAD's pattern: DTV, but no TSD.
    let ld = link("aarch64-ld-linux-aarch64.so.1", "ld-linux-aarch64.so.1");
    let text = stdout_of(eim().arg("inspect").arg(&ld));
    assert!(text.contains("\n# not-a-tsd-dso\n"), "{text}");
    assert!(text.contains("\ndtv offset=0 multiplier=16\n"), "{text}");
    // The renamed file itself is not a C library by name.
    let text = stdout_of(eim().arg("inspect").arg(bin.join("aarch64-musl-libc.so")));
    assert!(
        text.contains("\n# not-a-tsd-dso\n# dtv: not-a-libc-dso\nloaders:\n"),
        "{text}"
    );
}

#[test]
fn inspect_reports_a_file_it_cannot_read_and_goes_on() {
    let volname = testdata().join("upstream/volname");
    eim()
        .arg("inspect")
        .arg("/nonexistent/eim/libc.so.6")
        .arg(&volname)
        .assert()
        .failure()
        .stderr(predicate::str::contains("/nonexistent/eim/libc.so.6"))
        .stdout(predicate::str::contains("# file: ").and(predicate::str::contains("volname")));
}

/// One vocabulary (issue 29): an interpreter's `interpreter_offsets`
/// ranges read the same in `inspect`, `scan` and (over real pins, as root)
/// `status`; and `inspect` of a symbolic link with a name no loader knows
/// finds the interpreter under the name the link resolves to.
#[test]
fn one_range_vocabulary_and_interpreters_found_through_links() {
    let python = std::path::Path::new("/usr/bin/python3.11");
    if !eim_test_support::present(python) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let link = dir.path().join("some-tool");
    std::os::unix::fs::symlink(python, &link).expect("symlink");
    let report: Value =
        serde_json::from_str(&stdout_of(eim().arg("inspect").arg("--json").arg(&link)))
            .expect("inspect JSON");
    let found = report["loaders"]
        .as_array()
        .expect("loaders")
        .iter()
        .find(|m| m["loader"] == "python")
        .unwrap_or_else(|| panic!("no python loader through the link: {report}"))
        .clone();
    assert_eq!(found["name"], python.to_str().expect("UTF-8"), "{found}");
    assert!(
        found["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.11")),
        "{found}"
    );
    assert!(
        found["facts"].as_array().is_some_and(|f| !f.is_empty()),
        "{found}"
    );
    let ranges: Vec<String> = found["ranges"]
        .as_array()
        .expect("ranges")
        .iter()
        .map(|r| r.as_str().expect("range text").to_string())
        .collect();
    assert!(!ranges.is_empty(), "{found}");
    for r in &ranges {
        assert!(
            r.starts_with("0x") && r.contains("..=0x") && r.ends_with(" (python)"),
            "{r}"
        );
    }
    // The text says the same, never a Debug dump.
    let text = stdout_of(eim().arg("inspect").arg(&link));
    assert!(text.contains(&ranges.join(" ")), "{text}");
    assert!(
        !text.contains("PythonData") && !text.contains("Some("),
        "{text}"
    );

    // A scan of a process running it.
    let mut running = std::process::Command::new(python)
        .args([
            "-c",
            "import time; print('ready', flush=True); time.sleep(60)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(running.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("ready");
    let pid = running.id().to_string();
    let scan: Value =
        serde_json::from_str(&stdout_of(eim().args(["scan", "--json", "--pid", &pid])))
            .expect("scan JSON");
    let in_scan: Vec<String> = scan["found"]
        .as_array()
        .expect("found")
        .iter()
        .filter(|f| f["kind"] == "python")
        .flat_map(|f| f["ranges"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect();
    assert_eq!(in_scan, ranges, "{scan}");
    let scan_text = stdout_of(eim().args(["scan", "--pid", &pid]));
    assert!(scan_text.contains(&ranges.join(" ")), "{scan_text}");

    // And `status` over real pins.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && eim::bpf::probe::require_bpf("status ranges") {
        let pins = format!("/sys/fs/bpf/eim-cli-vocabulary-{}", std::process::id());
        stdout_of(eim().args([
            "scan",
            "--backend",
            "kernel",
            "--pin-dir",
            &pins,
            "--pid",
            &pid,
        ]));
        let status = eim().args(["status", "--pin-dir", &pins]).output();
        let _ = std::fs::remove_dir_all(&pins);
        let status = String::from_utf8(status.expect("status").stdout).expect("UTF-8");
        assert!(status.contains(&ranges.join(" ")), "{status}");
    }
    let _ = running.kill();
    let _ = running.wait();
}

/// A renamed copy of an interpreter (`mypy`, a copy of python3.11) is
/// found by what it defines, with the ranges the real file gets, and says
/// why; a renamed copy of a program that is no interpreter is claimed by
/// no loader.
#[test]
fn a_renamed_interpreter_is_found_by_its_symbols() {
    let python = std::path::Path::new("/usr/bin/python3.11");
    if !eim_test_support::present(python) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("mypy");
    std::fs::copy(python, &copy).expect("copy python3.11");
    let loaders_of = |path: &std::path::Path| -> Vec<Value> {
        let report: Value =
            serde_json::from_str(&stdout_of(eim().arg("inspect").arg("--json").arg(path)))
                .expect("inspect JSON");
        report["loaders"].as_array().expect("loaders").clone()
    };
    let real = loaders_of(python);
    let renamed = loaders_of(&copy);
    let python_of = |loaders: &[Value]| {
        loaders
            .iter()
            .find(|m| m["loader"] == "python")
            .cloned()
            .unwrap_or_else(|| panic!("no python loader: {loaders:?}"))
    };
    let (real, renamed) = (python_of(&real), python_of(&renamed));
    assert_eq!(renamed["ranges"], real["ranges"], "{renamed}");
    assert_eq!(renamed["version"], real["version"], "{renamed}");
    assert_eq!(renamed["name"], "python3.11", "{renamed}");
    assert!(
        renamed["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("Py_Version")),
        "{renamed}"
    );
    assert!(real["evidence"].is_null(), "{real}");
    let text = stdout_of(eim().arg("inspect").arg(&copy));
    assert!(
        text.contains("[as python3.11: it defines Py_Version"),
        "{text}"
    );

    let other = dir.path().join("python-tool");
    std::fs::copy("/usr/bin/ls", &other).expect("copy ls");
    assert!(loaders_of(&other).is_empty(), "ls is no interpreter");
}
