//! `eim profile` in the kernel (issue 19): a program spinning in a known
//! chain (chain.c's `spin`: main -> spin_outer -> spin_inner) sampled for
//! 5 s at 999 Hz; at least 99% of its samples unwind through `main` to
//! the C library's start, the folded output renders as a flame graph with
//! inferno, and the pprof profile holds the same samples. A process
//! started after the profiler is loaded as it appears.
//!
//! Issue 31: chain.c's `split` (hot_a 70%, hot_b 30% of the work) profiled
//! by eim and by `perf record --call-graph dwarf` over the same 5 s: each
//! hot function's share within 2 points of perf's, one folded line per
//! distinct stack; and `go tool pprof -raw` reads eim's pprof profile
//! whole (the main binary, every mapping with its file and build id,
//! every location in a mapping and named).
//!
//! `--kernel`: chain.c's `syscalls` (reading /dev/zero in a loop) shows its
//! kernel frames, named from /proc/kallsyms, above `read_zero_loop` in most
//! of its samples, in a `[kernel.kallsyms]` mapping of the pprof profile;
//! without `--kernel`, none.

use std::path::Path;
use std::process::Command;

use pprof::protos::Message as _;

use crate::programs::{Program, Running};

/// The folded lines of process `comm` in `text`: its frames (the process
/// name first) and the line's count.
fn samples_of<'t>(text: &'t str, comm: &str) -> Vec<(Vec<&'t str>, u64)> {
    text.lines()
        .map(|line| {
            let Some((stack, count)) = line.rsplit_once(' ') else {
                panic!("a folded line without a count: {line:?}");
            };
            let count: u64 = count.parse().expect("a count");
            (stack.split(';').collect::<Vec<_>>(), count)
        })
        .filter(|(frames, _)| frames.first() == Some(&comm))
        .collect()
}

/// Samples of process `comm` in folded `text`: (all, through main to the
/// C library's start with `spin_inner` innermost).
fn counts(text: &str, comm: &str) -> (u64, u64) {
    let mut all = 0;
    let mut complete = 0;
    for (frames, count) in samples_of(text, comm) {
        all += count;
        let from_start = frames
            .get(1)
            .is_some_and(|f| *f == "_start" || f.contains("__libc_start"));
        if from_start && frames.contains(&"main") && frames.last() == Some(&"spin_inner") {
            complete += count;
        }
    }
    (all, complete)
}

fn comm_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .expect("comm")
        .trim_end()
        .to_owned()
}

fn profile(args: &[&str], dir: &Path) -> (String, Vec<u8>) {
    let folded = dir.join("profile.folded");
    let pprof = dir.join("profile.pb");
    let out = Command::new(env!("CARGO_BIN_EXE_eim"))
        .arg("profile")
        .args(args)
        .arg("--output")
        .arg(&folded)
        .arg("--pprof")
        .arg(&pprof)
        .output()
        .expect("eim runs");
    assert!(
        out.status.success(),
        "eim profile failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stderr).trim_end());
    (
        std::fs::read_to_string(&folded).expect("folded stacks"),
        std::fs::read(&pprof).expect("pprof profile"),
    )
}

#[test]
fn a_spinning_chain_unwinds_to_main_in_99_percent_of_its_samples() {
    let test = "profile_spin";
    if !Program::C("spin").available() || !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = crate::serial();
    let running = Running::start(Program::C("spin"));
    let pid = running.pid();
    let comm = comm_of(pid);
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_arg = pid.to_string();
    let (text, pb) = profile(
        &["--pid", &pid_arg, "--duration", "5s", "--frequency", "999"],
        dir.path(),
    );
    let (all, complete) = counts(&text, &comm);
    // One CPU busy for 5 s at 999 Hz is about 5000 samples; a loaded
    // machine takes fewer, never this few.
    assert!(all >= 500, "{all} samples of {comm}:\n{text}");
    assert!(
        complete * 100 >= all * 99,
        "{complete} of {all} samples unwind to main and the C library's start:\n{text}"
    );

    // A standard flame-graph tool reads it.
    let mut svg = Vec::new();
    let mut options = inferno::flamegraph::Options::default();
    inferno::flamegraph::from_reader(&mut options, text.as_bytes(), &mut svg)
        .expect("inferno renders the folded stacks");
    let svg = String::from_utf8(svg).expect("svg text");
    assert!(svg.contains("<svg") && svg.contains("spin_inner"), "{svg}");

    // The pprof profile holds the same samples.
    let p = pprof::protos::Profile::decode(pb.as_slice()).expect("a pprof profile");
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    let folded_total: u64 = text
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert_eq!(total as u64, folded_total);
    assert!(p.string_table.iter().any(|s| s == "spin_inner"));
}

/// The shares (percent) of the samples of process `comm` in folded `text`
/// whose innermost frame is each of `leaves`.
fn leaf_shares(text: &str, comm: &str, leaves: &[&str]) -> (u64, Vec<f64>) {
    let mut all = 0u64;
    let mut by_leaf = vec![0u64; leaves.len()];
    for (frames, count) in samples_of(text, comm) {
        all += count;
        if let Some(i) = leaves.iter().position(|l| frames.last() == Some(l)) {
            by_leaf[i] += count;
        }
    }
    let shares = by_leaf
        .iter()
        .map(|n| *n as f64 * 100.0 / all.max(1) as f64)
        .collect();
    (all, shares)
}

/// Whether `perf` runs here.
fn perf_runs() -> bool {
    Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// perf's shares (percent of its samples of process `pid`, by the
/// innermost symbol) of each of `leaves`, from `perf record
/// --call-graph dwarf` at 999 Hz while `during` runs.
fn perf_shares<T>(
    pid: u32,
    seconds: u32,
    leaves: &[&str],
    during: impl FnOnce() -> T,
) -> (Vec<f64>, T) {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("perf.data");
    let mut record = Command::new("perf")
        .args(["record", "-q", "--call-graph", "dwarf", "-F", "999", "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&data)
        .args(["--", "sleep"])
        .arg(seconds.to_string())
        .spawn()
        .expect("perf record runs");
    let result = during();
    let status = record.wait().expect("perf record ends");
    assert!(status.success(), "perf record: {status}");
    let report = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            "symbol",
            "-g",
            "none",
            "-i",
        ])
        .arg(&data)
        .output()
        .expect("perf report runs");
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        report.status.success(),
        "perf report: {}",
        String::from_utf8_lossy(&report.stderr)
    );
    // Lines like `    69.95%  [.] hot_a`.
    let shares = leaves
        .iter()
        .map(|leaf| {
            text.lines()
                .filter(|l| l.split_whitespace().nth(2) == Some(leaf))
                .filter_map(|l| {
                    l.split_whitespace()
                        .next()?
                        .strip_suffix('%')?
                        .parse::<f64>()
                        .ok()
                })
                .sum()
        })
        .collect();
    (shares, result)
}

#[test]
fn a_70_30_split_has_perfs_shares_and_one_line_per_stack() {
    let test = "profile_split";
    if !Program::C("split").available() || !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = crate::serial();
    let running = Running::start(Program::C("split"));
    let pid = running.pid();
    let comm = comm_of(pid);
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_arg = pid.to_string();
    let leaves = ["hot_a", "hot_b"];
    let eim = || {
        profile(
            &["--pid", &pid_arg, "--duration", "5s", "--frequency", "999"],
            dir.path(),
        )
    };
    let (reference, (text, _)) = if perf_runs() {
        let (shares, out) = perf_shares(pid, 5, &leaves, eim);
        eprintln!(
            "perf record --call-graph dwarf: hot_a {:.1}%, hot_b {:.1}%",
            shares[0], shares[1]
        );
        (shares, out)
    } else {
        eprintln!("{test}: perf is not installed; comparing with the program's own 70/30 split");
        (vec![70.0, 30.0], eim())
    };
    let (all, shares) = leaf_shares(&text, &comm, &leaves);
    eprintln!(
        "eim profile: hot_a {:.1}%, hot_b {:.1}% of {all} samples",
        shares[0], shares[1]
    );
    assert!(all >= 500, "{all} samples of {comm}:\n{text}");
    for ((leaf, eim), reference) in leaves.iter().zip(&shares).zip(&reference) {
        assert!(
            (eim - reference).abs() <= 2.0,
            "{leaf}: {eim:.1}% in eim's profile, {reference:.1}% in the reference:\n{text}"
        );
    }
    let stacks: Vec<&str> = text
        .lines()
        .filter_map(|l| Some(l.rsplit_once(' ')?.0))
        .collect();
    let distinct: std::collections::BTreeSet<&str> = stacks.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        stacks.len(),
        "a stack on two lines:\n{text}"
    );
}

#[test]
fn go_tool_pprof_reads_the_profile_whole() {
    let test = "profile_pprof_go";
    if !Program::C("spin").available()
        || !eim_test_support::skip::tools_present(&["go"])
        || !eim::bpf::probe::require_bpf(test)
    {
        return;
    }
    let _one = crate::serial();
    let running = Running::start(Program::C("spin"));
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_arg = running.pid().to_string();
    let (_, pb) = profile(
        &["--pid", &pid_arg, "--duration", "2s", "--frequency", "499"],
        dir.path(),
    );
    let decoded = pprof::protos::Profile::decode(pb.as_slice()).expect("a pprof profile");
    let path = dir.path().join("profile.pb");
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&path)
        .env("HOME", dir.path())
        .output()
        .expect("go tool pprof runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "go tool pprof -raw: {stderr}");
    let all = format!("{stdout}\n{stderr}");
    assert!(!all.contains("Main binary filename not available"), "{all}");
    // `N: 0xSTART/0xLIMIT/0xOFFSET FILE BUILDID [FN]` after `Mappings`.
    let mappings: Vec<&str> = stdout
        .lines()
        .skip_while(|l| l.trim() != "Mappings")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(mappings.len(), decoded.mapping.len(), "{stdout}");
    assert!(
        mappings.len() >= 2,
        "the program and libc at least:\n{stdout}"
    );
    assert!(
        mappings[0].contains("/chain "),
        "the executable first:\n{stdout}"
    );
    for m in &mappings {
        let fields: Vec<&str> = m.split_whitespace().collect();
        let file = fields.get(2).copied().unwrap_or("");
        let build_id = fields.get(3).copied().unwrap_or("");
        assert!(file.starts_with('/'), "a mapping without its file: {m}");
        assert!(
            build_id.len() >= 16 && build_id.chars().all(|c| c.is_ascii_hexdigit()),
            "a mapping without its build id: {m}"
        );
    }
    // `N: 0xADDRESS M=K function file:line s=0` after `Locations`.
    let locations: Vec<&str> = stdout
        .lines()
        .skip_while(|l| l.trim() != "Locations")
        .skip(1)
        .take_while(|l| l.trim() != "Mappings")
        .collect();
    assert_eq!(locations.len(), decoded.location.len(), "{stdout}");
    for l in &locations {
        let fields: Vec<&str> = l.split_whitespace().collect();
        let mapping = fields
            .get(2)
            .and_then(|f| f.strip_prefix("M="))
            .unwrap_or("0");
        assert_ne!(mapping, "0", "a location without a mapping: {l}");
        assert!(fields.len() >= 4, "a location without a function: {l}");
    }
    assert!(stdout.contains(" spin_inner "), "{stdout}");
}

#[test]
fn a_process_started_while_profiling_is_loaded_and_unwound() {
    let test = "profile_new_process";
    if !Program::C("spin").available() || !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = crate::serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_path_buf();
    let profiler = std::thread::spawn(move || {
        profile(&["--all", "--duration", "10s", "--frequency", "499"], &path)
    });
    // After the profiler's first step: this process is new to it.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let running = Running::start(Program::C("spin"));
    let comm = comm_of(running.pid());
    let (text, _) = profiler.join().expect("the profiler thread");
    drop(running);
    let (all, complete) = counts(&text, &comm);
    let seen: std::collections::BTreeSet<&str> =
        text.lines().filter_map(|l| l.split(';').next()).collect();
    assert!(
        all >= 100,
        "{all} samples of {comm}; processes sampled: {seen:?}"
    );
    // Samples taken before its files were loaded do not unwind (none
    // would without the loading); once the event loop has loaded them,
    // all do. The new process runs about 8 s; a debug build sampling
    // every process (--all) took 1.2-1.9 s to load it here, so at least
    // 60% unwind.
    assert!(
        complete * 100 >= all * 60,
        "{complete} of {all} samples of the new process unwind to main:\n{text}"
    );
}

/// Of the samples of process `comm` in folded `text`: (all, those with a
/// kernel frame (a syscall's entry or handler) after `read_zero_loop`).
fn kernel_counts(text: &str, comm: &str) -> (u64, u64) {
    let mut all = 0;
    let mut in_kernel = 0;
    for (frames, count) in samples_of(text, comm) {
        all += count;
        let Some(caller) = frames.iter().position(|f| *f == "read_zero_loop") else {
            continue;
        };
        let kernel = frames[caller + 1..]
            .iter()
            .any(|f| f.contains("sys_") || f.contains("entry_SYSCALL"));
        if kernel {
            in_kernel += count;
        }
    }
    (all, in_kernel)
}

#[test]
fn kernel_frames_go_above_the_user_stack_with_kernel_only() {
    let test = "profile_kernel";
    if !Program::C("syscalls").available() || !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = crate::serial();
    let running = Running::start(Program::C("syscalls"));
    let pid = running.pid();
    let comm = comm_of(pid);
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_arg = pid.to_string();
    let args = ["--pid", &pid_arg, "--duration", "3s", "--frequency", "499"];

    let (text, pb) = profile(&[&args[..], &["--kernel"]].concat(), dir.path());
    let (all, in_kernel) = kernel_counts(&text, &comm);
    eprintln!("--kernel: {in_kernel} of {all} samples with kernel frames");
    // One CPU busy for 3 s at 499 Hz is about 1500 samples.
    assert!(all >= 150, "{all} samples of {comm}:\n{text}");
    // Reading /dev/zero 64 KiB at a time is mostly the kernel's work.
    assert!(
        in_kernel * 2 >= all,
        "{in_kernel} of {all} samples show a syscall's kernel frames above read_zero_loop:\n{text}"
    );
    let p = pprof::protos::Profile::decode(pb.as_slice()).expect("a pprof profile");
    let s = |i: i64| p.string_table[i as usize].as_str();
    let kernel = p
        .mapping
        .iter()
        .find(|m| s(m.filename) == "[kernel.kallsyms]")
        .unwrap_or_else(|| panic!("no kernel mapping: {:?}", p.mapping));
    let kernel_locations = p
        .location
        .iter()
        .filter(|l| l.mapping_id == kernel.id)
        .count();
    assert!(kernel_locations > 0, "no location in the kernel mapping");
    for l in p.location.iter().filter(|l| l.mapping_id == kernel.id) {
        let f = &p.function[l.line[0].function_id as usize - 1];
        assert!(
            !s(f.name).is_empty(),
            "a kernel location without a name: {l:?}"
        );
    }

    let (text, pb) = profile(&args, dir.path());
    let (all, in_kernel) = kernel_counts(&text, &comm);
    assert!(all >= 150, "{all} samples of {comm}:\n{text}");
    assert_eq!(in_kernel, 0, "kernel frames without --kernel:\n{text}");
    let p = pprof::protos::Profile::decode(pb.as_slice()).expect("a pprof profile");
    assert!(
        p.string_table.iter().all(|s| s != "[kernel.kallsyms]"),
        "a kernel mapping without --kernel"
    );
}

/// Samples of process `comm` in folded `text` for chain.c's `clock` and
/// `tod`: (all, complete: from the C library's start through
/// `clock_inner` with no incomplete marker, inside: complete with a frame
/// under `clock_inner`, the vDSO's, named as the vDSO names it, with the C
/// library's clock_gettime between them; gettimeofday is the vDSO's own,
/// through an IFUNC).
fn clock_counts(text: &str, comm: &str) -> (u64, u64, u64) {
    let (mut all, mut complete, mut inside) = (0, 0, 0);
    for (frames, count) in samples_of(text, comm) {
        all += count;
        let from_start = frames
            .get(1)
            .is_some_and(|f| *f == "_start" || f.contains("__libc_start"));
        let whole = !frames.iter().any(|f| f.starts_with("[incomplete"));
        let Some(at) = frames.iter().position(|f| *f == "clock_inner") else {
            continue;
        };
        // The vDSO's frame is named by its own symbols (either of the two
        // names it exports each function under), not a file id.
        let vdso_named = frames.last().is_some_and(|f| {
            ["clock_gettime", "gettimeofday"].contains(&f.trim_start_matches("__vdso_"))
        });
        if from_start && whole && frames.contains(&"main") {
            complete += count;
            if frames.len() >= at + 2 && vdso_named {
                inside += count;
            }
        }
    }
    (all, complete, inside)
}

/// `eim profile` of a program reading the clock in a loop: its thread is
/// mostly inside the vDSO, which is loaded like a file, so at least 99%
/// of its samples unwind to the C library's start.
fn reading_the_clock(test: &str, scenario: &'static str) {
    let program = Program::C(scenario);
    if !program.available() || !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = crate::serial();
    let running = Running::start(program);
    let pid = running.pid();
    let comm = comm_of(pid);
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_arg = pid.to_string();
    let (text, _) = profile(
        &["--pid", &pid_arg, "--duration", "5s", "--frequency", "999"],
        dir.path(),
    );
    let (all, complete, inside) = clock_counts(&text, &comm);
    eprintln!("{scenario}: {complete} of {all} samples complete, {inside} inside the vDSO");
    assert!(all >= 500, "{all} samples of {comm}:\n{text}");
    assert!(
        complete * 100 >= all * 99,
        "{complete} of {all} samples unwind to the C library's start:\n{text}"
    );
    // What was tested is the vDSO: most samples are inside it.
    assert!(
        inside * 2 >= all,
        "{inside} of {all} samples inside the clock's call:\n{text}"
    );
}

#[test]
fn clock_gettime_unwinds_through_the_vdso_in_99_percent_of_its_samples() {
    reading_the_clock("profile_clock_gettime", "clock");
}

#[test]
fn gettimeofday_unwinds_through_the_vdso_in_99_percent_of_its_samples() {
    reading_the_clock("profile_gettimeofday", "tod");
}
