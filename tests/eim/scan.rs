//! End-to-end tests of `eim scan`, `eim watch` and `eim lookup` against real
//! processes of this machine: `sleep`, `python3` and a Go binary of the
//! test data are started, scanned, found loaded with the file ids computed
//! here from their bytes, and released when they exit. The kernel tests
//! repeat the lookups on real BPF maps (as root; a loud SKIPPED otherwise,
//! a failure under `EIM_REQUIRE_BPF=1`).
//!
//! Robust on a busy machine: every wait polls for a condition with a
//! generous deadline, and no assertion depends on timing.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use eim::elf::fileid::file_id_of;
use eim::host::procs;
use eim::host::scan::{Host, HostConfig, Quiet};
use eim::report::summary::Summary;
use eim::sim::{SimConfig, SimMaps};
use eim::FileId;
use eim_test_support::testdata;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);

#[path = "scan/batches.rs"]
mod batches;
#[path = "scan/report.rs"]
mod report;

/// A child killed (and reaped) when dropped.
struct Running(Child);

impl Running {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(cmd: &mut Command) -> Running {
    Running(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}")),
    )
}

/// Starts `program` stopped right after its exec (it asks to be traced, so
/// the kernel stops it at the exec): a program that would finish at once
/// stays mapped for as long as the test needs.
fn spawn_stopped(program: &Path) -> Running {
    let mut cmd = Command::new(program);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    spawn(&mut cmd)
}

/// Waits until `pid` maps an executable file whose path ends with `suffix`.
fn wait_for_mapping(pid: i32, suffix: &str) {
    let started = Instant::now();
    loop {
        if let Ok(m) = procs::exec_mappings(pid) {
            if m.files
                .iter()
                .any(|f| f.path.to_string_lossy().ends_with(suffix))
            {
                return;
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "process {pid} never mapped a file ending in {suffix}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The image of `pid`'s vDSO, read here from its memory.
fn vdso_image(pid: i32) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let m = procs::exec_mappings(pid).expect("maps").vdso?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("mem");
    let mut image = vec![0; (m.end - m.start) as usize];
    mem.read_exact_at(&mut image, m.start)
        .expect("the vDSO image");
    Some(image)
}

/// The host file ids of every executable file `pid` maps, computed here
/// from the whole file's bytes (read through the process's root), and of
/// its vDSO, from the image in its memory (loaded as a file, issue 31).
fn expected_ids(pid: i32) -> BTreeMap<FileId, PathBuf> {
    let maps = procs::exec_mappings(pid).expect("maps");
    let vdso = maps
        .vdso
        .clone()
        .zip(vdso_image(pid))
        .map(|(m, image)| (file_id_of(&image).host(), m.path));
    maps.files
        .into_iter()
        .map(|m| {
            let at = PathBuf::from(format!("/proc/{pid}/root"))
                .join(m.path.strip_prefix("/").unwrap_or(&m.path));
            let bytes = std::fs::read(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display()));
            (file_id_of(&bytes).host(), m.path)
        })
        .chain(vdso)
        .collect()
}

fn host_of(pids: &[i32], delay: Option<Duration>) -> Host<SimMaps> {
    Host::new(
        SimMaps::new(SimConfig::default()).expect("maps"),
        HostConfig {
            only: Some(pids.iter().copied().collect()),
            unload_delay: delay,
            ..HostConfig::default()
        },
    )
}

fn step<B: eim::map_view::Inspect>(host: &mut Host<B>) {
    host.step(&AtomicBool::new(false), &mut Quiet)
        .expect("step");
}

fn in_maps(host: &Host<SimMaps>, id: FileId) -> bool {
    host.with_backend(|m| m.delta_tables().keys().any(|(_, f)| *f == id))
}

/// A python3 that has done its imports and sleeps (it says so on stdout).
fn spawn_python() -> Running {
    spawn_python_script(
        "import time, sys; print('ready', flush=True); time.sleep(300)",
        &[],
        "python3 did not start",
    )
}

/// A python3 running `script` with `args`, once the script says `ready`
/// on stdout (`fails`: what it means when it does not).
fn spawn_python_script(script: &str, args: &[PathBuf], fails: &str) -> Running {
    let mut child = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("python3 says it is ready");
    assert_eq!(line.trim(), "ready", "{fails}");
    Running(child)
}

fn python() -> PathBuf {
    // The interpreter itself, not a version manager's shim script.
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn a_scan_loads_every_file_of_sleep_python_and_go_with_the_right_ids() {
    let go = testdata().join("oracle/bin/gocorpus-go1.23-amd64");
    let sleep = spawn(Command::new("sleep").arg("300"));
    let py = spawn_python();
    let gop = spawn_stopped(&go);
    wait_for_mapping(sleep.pid(), "libc.so.6");
    wait_for_mapping(py.pid(), "libc.so.6");
    wait_for_mapping(gop.pid(), "gocorpus-go1.23-amd64");

    let pids = [sleep.pid(), py.pid(), gop.pid()];
    let mut host = host_of(&pids, None);
    step(&mut host);
    // Where the step's time went: every phase of a first step took some,
    // the wall-clock ones add up to the step, the maps are part of the
    // loading, and extraction with the loaders is all the extraction time.
    let report = host.last_step().clone();
    let p = &report.phases;
    let wall = [p.walk, p.open, p.file_ids, p.loading];
    assert!(
        wall.iter()
            .chain([&p.maps, &p.extraction, &p.loaders])
            .all(|d| !d.is_zero()),
        "{p:?}"
    );
    let sum: Duration = wall.iter().sum();
    let off = sum.abs_diff(report.elapsed);
    assert!(
        off <= report.elapsed / 100,
        "{p:?} add up to {sum:?}, not {:?}",
        report.elapsed
    );
    assert!(p.maps <= p.loading, "{p:?}");
    assert_eq!(
        p.extraction + p.loaders,
        host.extraction().time(),
        "the only extractions were this step's"
    );
    for pid in pids {
        let expected = expected_ids(pid);
        assert!(!expected.is_empty());
        let held = host.held_by(pid).expect("process tracked");
        let want: BTreeSet<FileId> = expected.keys().copied().collect();
        assert_eq!(held, &want, "process {pid}: {expected:?}");
        for (id, path) in &expected {
            assert!(
                in_maps(&host, *id),
                "{} ({id}) has no table",
                path.display()
            );
            assert_eq!(host.files()[id].id.host(), *id);
        }
    }
    // libc is shared by sleep and python (the Go binary is static):
    // extracted once, one reference each.
    let named = |pid: i32, name: &str| -> Vec<FileId> {
        expected_ids(pid)
            .into_iter()
            .filter(|(_, p)| p.to_string_lossy().contains(name))
            .map(|(id, _)| id)
            .collect()
    };
    let libc = named(sleep.pid(), "libc.so");
    assert_eq!(libc.len(), 1);
    assert_eq!(host.extraction().of(libc[0]).attempts, 1);
    assert_eq!(host.manager().state().files[&libc[0]].rc, 2);
    // The vDSO is shared by all three (one image per kernel): one file,
    // read into memory once, extracted once, one reference each.
    let vdso = named(sleep.pid(), "[vdso]");
    assert_eq!(vdso.len(), 1);
    for pid in pids {
        assert_eq!(named(pid, "[vdso]"), vdso, "process {pid}'s vDSO");
    }
    assert_eq!(host.vdso_images(), 1);
    assert_eq!(host.extraction().of(vdso[0]).attempts, 1);
    assert_eq!(host.manager().state().files[&vdso[0]].rc, 3);
    // Static: the Go binary and the vDSO the kernel maps into every process.
    let go_id = file_id_of(&std::fs::read(&go).expect("go binary")).host();
    assert_eq!(
        host.held_by(gop.pid()),
        Some(&BTreeSet::from([go_id, vdso[0]])),
        "static"
    );
    // A second step changes nothing and extracts nothing.
    let before = host.extraction().attempts();
    step(&mut host);
    assert_eq!(host.extraction().attempts(), before);
    assert_eq!(host.last_step().taken, 0);
}

/// The summary names the interpreters and C libraries it found: python
/// with the version python itself reports, Go (and Go labels) for the Go
/// binary, libc with a TSD layout and the dynamic loader with the DTV
/// layout (glibc defines `__tls_get_addr` there; spec 7.2's {8, 16}).
#[test]
fn a_scan_reports_python_go_and_libc_with_their_versions() {
    let go = testdata().join("oracle/bin/gocorpus-go1.23-amd64");
    let py = spawn_python();
    let gop = spawn_stopped(&go);
    wait_for_mapping(py.pid(), "libc.so.6");
    wait_for_mapping(gop.pid(), "gocorpus-go1.23-amd64");
    let out = Command::new(python())
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .expect("python3 runs");
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let mut host = host_of(&[py.pid(), gop.pid()], None);
    step(&mut host);
    let summary = Summary::of(&mut host).expect("summary");
    let kinds = |kind: &str| -> Vec<&eim::report::summary::Found> {
        summary.found.iter().filter(|f| f.kind == kind).collect()
    };
    let python = kinds("python");
    assert_eq!(python.len(), 1, "{:?}", summary.found);
    assert_eq!(python[0].detail, format!("version {version}"));
    assert!(!python[0].ranges.is_empty(), "{:?}", python[0]);
    for loader in ["go", "golabels"] {
        let found = kinds(loader);
        assert_eq!(found.len(), 1, "{loader}: {:?}", summary.found);
        assert!(found[0].path.ends_with("gocorpus-go1.23-amd64"));
        assert!(found[0].detail.contains("go1.23"), "{:?}", found[0]);
    }
    let libc = kinds("c-library");
    assert!(
        libc.iter()
            .any(|f| f.path.to_string_lossy().contains("libc.so.6")
                && f.detail.starts_with("tsd offset=")),
        "{:?}",
        summary.found
    );
    assert!(
        libc.iter().any(
            |f| f.path.to_string_lossy().contains("ld-linux-x86-64.so.2")
                && f.detail == "dtv offset=8 multiplier=16"
        ),
        "{:?}",
        summary.found
    );
    assert_eq!(summary.files.interpreters, 2, "python and the Go binary");
    assert!(summary
        .render_text()
        .contains("C libraries and interpreters:"));
}

#[test]
fn watch_releases_the_files_of_exited_processes() {
    let go = testdata().join("oracle/bin/gocorpus-go1.19-amd64");
    let go_id = file_id_of(&std::fs::read(&go).expect("go binary")).host();
    let gop = spawn_stopped(&go);
    let sleep = spawn(Command::new("sleep").arg("300"));
    wait_for_mapping(gop.pid(), "gocorpus-go1.19-amd64");
    wait_for_mapping(sleep.pid(), "libc.so.6");
    let mut host = host_of(&[gop.pid(), sleep.pid()], None);
    step(&mut host);
    assert!(in_maps(&host, go_id));
    let sleep_files = host.held_by(sleep.pid()).expect("sleep").clone();

    let gone = gop.pid();
    gop.stop();
    step(&mut host);
    assert!(host.held_by(gone).is_none());
    assert!(!in_maps(&host, go_id), "unloaded with its last process");
    assert!(!host.manager().state().files.contains_key(&go_id));
    assert_eq!(
        host.held_by(sleep.pid()),
        Some(&sleep_files),
        "others keep theirs"
    );
    for id in &sleep_files {
        assert!(in_maps(&host, *id));
    }
    sleep.stop();
    step(&mut host);
    assert!(host.manager().state().files.is_empty());
    assert!(host.with_backend(|m| m.holds_no_file_data()));
    assert_eq!(host.counters().release_errors, 0);
}

#[test]
fn with_an_unload_delay_files_stay_until_the_delay_has_passed() {
    let go = testdata().join("oracle/bin/gocorpus-go1.23-amd64-stripped");
    let go_id = file_id_of(&std::fs::read(&go).expect("go binary")).host();
    let first = spawn_stopped(&go);
    wait_for_mapping(first.pid(), "stripped");
    let delay = Duration::from_secs(2);
    // Every process may matter here: the second one's pid is not known yet.
    let mut host = Host::new(
        SimMaps::new(SimConfig::default()).expect("maps"),
        HostConfig {
            unload_delay: Some(delay),
            ..HostConfig::default()
        },
    );
    step(&mut host);
    assert_eq!(host.extraction().of(go_id).attempts, 1);
    first.stop();
    step(&mut host);
    assert!(in_maps(&host, go_id), "kept for the delay");
    // A new process of the same file within the delay: no new extraction.
    let second = spawn_stopped(&go);
    wait_for_mapping(second.pid(), "stripped");
    step(&mut host);
    assert!(host
        .held_by(second.pid())
        .expect("tracked")
        .contains(&go_id));
    assert_eq!(host.extraction().of(go_id).attempts, 1);
    second.stop();
    // Gone only after the delay, whatever the machine's speed.
    let started = Instant::now();
    loop {
        step(&mut host);
        if !in_maps(&host, go_id) {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "never unloaded");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(started.elapsed() >= delay);
    assert_eq!(host.extraction().of(go_id).attempts, 1);
}

#[test]
fn a_storm_of_short_lived_processes_extracts_each_file_at_most_once() {
    let truth = PathBuf::from("/usr/bin/true");
    let true_id = file_id_of(&std::fs::read(&truth).expect("true")).host();
    let mut host = Host::new(
        SimMaps::new(SimConfig::default()).expect("maps"),
        HostConfig {
            unload_delay: Some(Duration::from_secs(600)),
            ..HostConfig::default()
        },
    );
    let stop = AtomicBool::new(false);
    let storm = std::thread::spawn(move || {
        let mut n = 0;
        while n < 400 {
            // Several alive at once, so the steps catch some of them.
            let batch: Vec<Child> = (0..20)
                .filter_map(|_| Command::new(&truth).spawn().ok())
                .collect();
            n += batch.len();
            for mut c in batch {
                let _ = c.wait();
            }
        }
    });
    let started = Instant::now();
    while !storm.is_finished() {
        host.step(&stop, &mut Quiet).expect("step");
        assert!(started.elapsed() < 4 * DEADLINE, "storm never ended");
    }
    storm.join().expect("storm");
    // Whether or not a step caught a `true` alive, none was extracted twice.
    assert!(host.extraction().of(true_id).attempts <= 1);
    assert_eq!(host.counters().release_errors, 0);
    for (id, record) in host.files() {
        assert!(
            host.extraction().of(*id).attempts <= 1,
            "{} extracted {} times",
            record.path.display(),
            host.extraction().of(*id).attempts
        );
    }
}

fn eim() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eim"));
    cmd.env_remove("RUST_LOG");
    cmd
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("eim runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The number on the text summary's line starting with `label`.
fn text_number(text: &str, label: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no line {label:?} in\n{text}"));
    let word = line.split_whitespace().last().expect("a value");
    word.replace(',', "")
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// A `sleep` and a Python process, both with libc mapped, and the `eim`
/// arguments naming them (`--pid A --pid B`). They stop when dropped.
fn sleep_and_python() -> (Running, Running, [String; 4]) {
    let sleep = spawn(Command::new("sleep").arg("300"));
    let py = spawn_python();
    wait_for_mapping(sleep.pid(), "libc.so.6");
    wait_for_mapping(py.pid(), "libc.so.6");
    let pids = [
        "--pid".to_string(),
        sleep.pid().to_string(),
        "--pid".to_string(),
        py.pid().to_string(),
    ];
    (sleep, py, pids)
}

#[test]
fn the_json_summary_parses_and_agrees_with_the_text_one() {
    let (sleep, py, pids) = sleep_and_python();
    let json: Value =
        serde_json::from_str(&run_ok(eim().arg("scan").arg("--json").args(&pids))).expect("JSON");
    let text = run_ok(eim().arg("scan").args(&pids));
    let expected: BTreeSet<FileId> = expected_ids(sleep.pid())
        .into_keys()
        .chain(expected_ids(py.pid()).into_keys())
        .collect();
    assert_eq!(json["backend"], "simulated");
    assert_eq!(json["processes"]["listed"], 2);
    assert_eq!(json["files"]["distinct"], expected.len());
    assert_eq!(json["files"]["loaded"], expected.len());
    for (label, path) in [
        ("processes", "/processes/listed"),
        ("executable file mappings", "/mappings/file_mappings"),
        ("references", "/mappings/references"),
        ("distinct files", "/files/distinct"),
        ("loaded", "/files/loaded"),
        ("failed", "/files/failed"),
        ("extractions", "/extraction/extractions"),
        ("page entries", "/kernel/bytes/page_entries"),
        ("unwind slots in use", "/kernel/bytes/unwind_infos"),
        ("UnwindInfoArraySize", "/kernel/unwind_infos"),
        ("total", "/kernel/bytes/total"),
        ("NumExeIDLoadedToEBPF", "/metrics/0/value"),
        ("HashmapNumStackDeltaPages", "/metrics/2/value"),
    ] {
        assert_eq!(
            Some(text_number(&text, label)),
            json.pointer(path).and_then(Value::as_u64),
            "{label} vs {path}"
        );
    }
    for class in json["kernel"]["size_classes"].as_array().expect("classes") {
        let label = format!("size class {}", class["class"]);
        assert_eq!(Some(text_number(&text, &label)), class["bytes"].as_u64());
    }
}

/// The first executable mapping of libc in `pid`: addresses inside it.
fn libc_addresses(pid: i32) -> Vec<String> {
    let m = procs::exec_mappings(pid)
        .expect("maps")
        .files
        .into_iter()
        .find(|m| m.path.to_string_lossy().contains("libc.so"))
        .expect("libc mapped");
    let len = m.end - m.start;
    [0, 0x40, len / 3, len / 2 + 7, len - 1]
        .iter()
        .map(|off| format!("{:#x}", m.start + off))
        .collect()
}

#[test]
fn lookup_answers_for_addresses_in_a_running_process() {
    let sleep = spawn(Command::new("sleep").arg("300"));
    wait_for_mapping(sleep.pid(), "libc.so.6");
    let addresses = libc_addresses(sleep.pid());
    let out = run_ok(
        eim()
            .args(["lookup", "--json", "--pid", &sleep.pid().to_string()])
            .args(&addresses),
    );
    let answers: Vec<Value> = serde_json::from_str(&out).expect("JSON");
    assert_eq!(answers.len(), addresses.len());
    let libc_id = expected_ids(sleep.pid())
        .into_iter()
        .find(|(_, p)| p.to_string_lossy().contains("libc.so"))
        .map(|(id, _)| format!("{:016x}", id.0))
        .expect("libc");
    let mut ruled = 0;
    for a in &answers {
        assert_eq!(a["host_file_id"], libc_id.as_str(), "{a}");
        assert!(a["elf_address"].is_u64(), "{a}");
        if a["answer"]["outcome"]["kind"] == "rule" {
            ruled += 1;
        }
    }
    assert!(ruled > 0, "no address of libc's text had a rule: {out}");
}

fn kernel_ready(test: &str) -> bool {
    eim::bpf::probe::require_bpf(test)
}

#[test]
fn kernel_lookup_in_a_running_libc_answers_like_the_simulated_reader() {
    if !kernel_ready("kernel lookup test") {
        return;
    }
    let sleep = spawn(Command::new("sleep").arg("300"));
    wait_for_mapping(sleep.pid(), "libc.so.6");
    let addresses = libc_addresses(sleep.pid());
    let pid = sleep.pid().to_string();
    let answers = |backend: &str| -> Value {
        serde_json::from_str(&run_ok(
            eim()
                .args(["lookup", "--json", "--backend", backend, "--pid", &pid])
                .args(&addresses),
        ))
        .expect("JSON")
    };
    let sim = answers("sim");
    let kernel = answers("kernel");
    assert_eq!(kernel, sim);
    assert!(sim.as_array().is_some_and(|a| a.len() == addresses.len()));
}

#[test]
fn kernel_scan_loads_what_the_simulated_scan_loads() {
    if !kernel_ready("kernel scan test") {
        return;
    }
    let (_sleep, _py, pids) = sleep_and_python();
    let scan = |backend: &str| -> Value {
        serde_json::from_str(&run_ok(
            eim()
                .args(["scan", "--json", "--no-pin", "--backend", backend])
                .args(&pids),
        ))
        .expect("JSON")
    };
    let sim = scan("sim");
    let kernel = scan("kernel");
    assert_eq!(kernel["backend"], "kernel");
    for part in ["files", "mappings"] {
        assert_eq!(kernel[part], sim[part], "{part}");
    }
    for field in [
        "page_entries",
        "unwind_infos",
        "unwind_slots_holding_rules",
        "size_classes",
        "bytes",
    ] {
        assert_eq!(kernel["kernel"][field], sim["kernel"][field], "{field}");
    }
}

/// `GET /metrics` on `addr`.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    out
}

#[test]
fn watch_serves_metrics_and_stops_cleanly_on_ctrl_c() {
    let sleep = spawn(Command::new("sleep").arg("300"));
    wait_for_mapping(sleep.pid(), "libc.so.6");
    let mut watch = eim()
        .args([
            "watch",
            "--json",
            "--interval",
            "200ms",
            "--metrics-addr",
            "127.0.0.1:0",
            "--pid",
            &sleep.pid().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("watch starts");
    let mut stderr = BufReader::new(watch.stderr.take().expect("stderr"));
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).expect("stderr") > 0,
            "no address"
        );
        if let Some(rest) = line.trim().strip_prefix("eim: metrics at http://") {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    // Until the first step is done the gauges are zero.
    let started = Instant::now();
    let body = loop {
        let body = scrape(&addr);
        if body.contains("eim_num_exe_id_loaded_to_ebpf ")
            && !body.contains("eim_num_exe_id_loaded_to_ebpf 0\n")
        {
            break body;
        }
        assert!(started.elapsed() < DEADLINE, "never loaded: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in [
        "eim_unwind_info_array_size",
        "eim_hashmap_num_stack_delta_pages",
        "eim_stack_delta_provider_success_total",
        "eim_stack_delta_provider_extraction_error_total",
        "eim_extraction_seconds_total",
        "eim_kernel_seconds_total",
        "eim_files_deferred",
        "eim_files_failed",
        "eim_files_unsupported",
    ] {
        assert!(body.contains(name), "{name} missing:\n{body}");
    }
    let expected = expected_ids(sleep.pid()).len();
    assert!(
        body.contains(&format!("eim_num_exe_id_loaded_to_ebpf {expected}\n")),
        "{body}"
    );
    // SIGINT, as Ctrl-C sends it: the watch ends normally with its summary.
    // SAFETY: a plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(watch.id() as i32, libc::SIGINT) }, 0);
    let mut out = String::new();
    watch
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("stdout");
    let status = watch.wait().expect("watch exits");
    assert!(status.success(), "{status}");
    let json: Value = serde_json::from_str(&out).expect("JSON summary");
    assert_eq!(json["files"]["loaded"], expected);
}

#[test]
fn kernel_backend_without_privileges_says_what_is_missing() {
    let mut cmd = eim();
    cmd.args(["lookup", "--backend", "kernel", "/usr/bin/true", "0x1000"]);
    // SAFETY: getuid is always safe.
    if unsafe { libc::getuid() } == 0 {
        // As root, drop to nobody (no capabilities) for this run.
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = match cmd.output() {
        Ok(out) => out,
        // The build directory may not be readable by nobody.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let _ = writeln!(
                std::io::stderr(),
                "\n***** SKIPPED: privilege message test (nobody cannot run {}: {e}) *****",
                env!("CARGO_BIN_EXE_eim")
            );
            return;
        }
        Err(e) => panic!("eim does not run: {e}"),
    };
    assert!(
        !out.status.success(),
        "a process without capabilities used BPF"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing CAP_BPF"), "{err}");
    assert!(err.contains("Run as root"), "{err}");
}

/// The PC of a thread asleep in a syscall (`/proc/PID/syscall`'s last
/// field), waiting until it is.
fn pc_in_syscall(pid: i32) -> u64 {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        let fields: Vec<&str> = text.split_whitespace().collect();
        if fields.len() == 9 {
            if let Some(pc) = fields[8]
                .strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                return pc;
            }
        }
        assert!(started.elapsed() < DEADLINE, "{pid} never slept: {text:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_process_mapping_table_follows_each_process_and_gives_the_right_bias() {
    use object::{Object, ObjectSymbol};
    let sleep = spawn(Command::new("sleep").arg("300"));
    wait_for_mapping(sleep.pid(), "libc.so.6");
    let pc = pc_in_syscall(sleep.pid());
    let mut host = host_of(&[sleep.pid()], None);
    step(&mut host);
    let pid = sleep.pid() as u32;
    let entry = host
        .with_backend(|m| m.process(pid))
        .expect("an eim_process_mappings entry for sleep");
    let held = host
        .held_by(sleep.pid())
        .expect("sleep is followed")
        .clone();
    let named: BTreeSet<FileId> = entry.mappings.iter().map(|m| FileId(m.file_id)).collect();
    assert_eq!(named, held, "every file it holds, and only those");
    assert!(entry.is_well_formed());

    // The PC's ELF address, by the entry's bias, is inside a function of
    // the file the maps name, by that file's own symbol table.
    let mapping = entry.find(pc).expect("the PC's mapping");
    let maps = procs::exec_mappings(sleep.pid()).expect("maps");
    let path = &maps
        .files
        .iter()
        .find(|m| m.start == mapping.start)
        .expect("the same mapping in /proc")
        .path;
    assert!(path.to_string_lossy().contains("libc.so"), "{path:?}");
    let bytes = std::fs::read(path).expect("libc");
    assert_eq!(file_id_of(&bytes).host(), FileId(mapping.file_id));
    let file = object::File::parse(&*bytes).expect("libc parses");
    let address = pc - mapping.bias;
    let inside = file
        .dynamic_symbols()
        .chain(file.symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .find(|s| s.address() <= address && address < s.address() + s.size());
    // sleep(1) sleeps in clock_nanosleep: an address off by a page or a
    // segment would land in another function.
    let name = inside.and_then(|s| s.name().ok().map(str::to_string));
    assert!(
        name.as_deref().is_some_and(|n| n.contains("nanosleep")),
        "{address:#x} (pc {pc:#x} - bias {:#x}) is in {name:?} of {path:?}, not the sleep call",
        mapping.bias
    );

    sleep.stop();
    step(&mut host);
    assert_eq!(
        host.with_backend(|m| m.process(pid)),
        None,
        "deleted at exit"
    );
    assert!(host.with_backend(|m| m.process_mappings().is_empty()));
    assert_eq!(host.counters().process_mapping_errors, 0);
}
