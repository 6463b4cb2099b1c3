//! File-id poisoning (issue 28, item 2) against the built `eim`, as root.
//!
//! A file id hashes only the first and last 4 KiB and the size. User
//! `nobody` copies a root library and changes bytes of its `.eh_frame`
//! between those ends: FDE instructions changed (the copy extracts to
//! another table), or its CIE's version broken (the copy does not extract at
//! all); the id stays the library's. One process of `nobody` maps the
//! copy, one of root the real library, in either order, and `eim scan`
//! or `eim watch` (kernel maps, host events and polling) loads them.
//!
//! Whatever the order, root's process must hold exactly the table `eim
//! tables` and `eim deltas` give for the real library, the copy's process
//! must hold nothing of the id, the copy must be listed as a collision and
//! counted, and the copy must never keep root's library from loading.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use object::{Object, ObjectSection};
use serde_json::Value;

const NOBODY: u32 = 65534;

/// The bytes the file id hashes at each end.
const ID_CHUNK: u64 = 4096;

/// The `eim` cargo built, or `$EIM_COLLIDE_BIN` (an older build, to see
/// these tests fail where it is open to the attack).
fn eim() -> Command {
    let bin = std::env::var_os("EIM_COLLIDE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_eim")), PathBuf::from);
    let mut c = Command::new(bin);
    c.env_remove("RUST_LOG");
    c
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run eim");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eim_test_support::skip::skip_unless_required(
        "EIM_REQUIRE_BPF",
        &format!("{test}: needs root (a process of nobody, map_files)"),
    );
    false
}

/// A root library with an `.eh_frame` well inside the file (libaom, the
/// issue's, when installed), resolved to its real path.
fn library() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    [
        "libaom.so.3",
        "libgmp.so.10",
        "libcurl.so.4",
        "libbz2.so.1.0",
    ]
    .iter()
    .map(|name| Path::new("/usr/lib/x86_64-linux-gnu").join(name))
    .filter_map(|p| std::fs::canonicalize(p).ok())
    .find(|p| std::fs::metadata(p).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0))
}

/// How the copy is changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Poison {
    /// The FDEs of the middle third lose their first advance: their
    /// rules start earlier, and the table has other rows.
    Instructions,
    /// The first CIE says version 127: extraction fails.
    BrokenCie,
    /// No change: a copy in another inode, which shares the tables.
    Identical,
}

/// The `.eh_frame` records: (offset in the section, is a CIE).
fn records(section: &[u8]) -> Vec<(usize, bool)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 8 <= section.len() {
        let len = u32::from_le_bytes(section[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 || len == 0xffff_ffff {
            break;
        }
        let id = u32::from_le_bytes(section[at + 4..at + 8].try_into().expect("4 bytes"));
        out.push((at, id == 0));
        at += 4 + len;
    }
    out
}

/// `real`'s bytes with `how` applied to its `.eh_frame`; every changed
/// byte lies between the file id's two hashed ends.
fn poisoned(real: &[u8], how: Poison) -> Vec<u8> {
    let file = object::File::parse(real).expect("ELF");
    let section = file.section_by_name(".eh_frame").expect(".eh_frame");
    let (start, size) = section.file_range().expect("in the file");
    let (start, size) = (start as usize, size as usize);
    let recs = records(&real[start..start + size]);
    let mut out = real.to_vec();
    let mut changed = Vec::new();
    match how {
        Poison::Instructions => {
            let section = &real[start..start + size];
            let fdes: Vec<usize> = recs.iter().filter(|r| !r.1).map(|r| r.0).collect();
            for &at in &fdes[fdes.len() / 3..2 * fdes.len() / 3] {
                // Length, CIE pointer, pcrel sdata4 begin, udata4 range,
                // then the augmentation data's length (zR: one byte).
                let len =
                    u32::from_le_bytes(section[at..at + 4].try_into().expect("4 bytes")) as usize;
                let aug = usize::from(section[at + 16]);
                let first = at + 17 + aug;
                // A first DW_CFA_advance_loc becomes DW_CFA_nop: the rule
                // after it starts at the function's start, one row less.
                if aug < 0x80 && first < at + 4 + len && (0x41..=0x7f).contains(&section[first]) {
                    out[start + first] = 0;
                    changed.push(start + first);
                }
            }
        }
        Poison::BrokenCie => {
            let cie = recs.iter().find(|r| r.1).expect("a CIE").0;
            let p = start + cie + 8;
            out[p] = 0x7f;
            changed.push(p);
        }
        Poison::Identical => return out,
    }
    assert!(!changed.is_empty());
    let len = real.len() as u64;
    assert!(
        changed
            .iter()
            .all(|&p| p as u64 >= ID_CHUNK && (p as u64) < len - ID_CHUNK),
        "the change must lie between the hashed ends"
    );
    out
}

/// A directory `nobody` can read, holding `nobody`'s poisoned copy.
fn attacker_copy(real: &Path, how: Poison) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let copy = dir.path().join(real.file_name().expect("a name"));
    let bytes = std::fs::read(real).expect("read the library");
    std::fs::write(&copy, poisoned(&bytes, how)).expect("write the copy");
    std::os::unix::fs::chown(&copy, Some(NOBODY), Some(NOBODY)).expect("chown");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    (dir, copy)
}

/// A process that maps `lib` (preloaded into `sleep`) once told to: a shell
/// waiting for a line, then exec'ing the sleep (same pid).
struct Mapper {
    child: Child,
    stdin: Option<ChildStdin>,
    lib: PathBuf,
}

impl Mapper {
    fn spawn(lib: &Path, as_nobody: bool) -> Self {
        // The shell must not map the library itself: only the sleep does.
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "read go; LD_PRELOAD=\"$LIB\" exec sleep 600"])
            .env("LIB", lib)
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if as_nobody {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(NOBODY) != 0
                        || libc::setuid(NOBODY) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn the mapper");
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lib: lib.to_path_buf(),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Maps the library now and waits until it is mapped.
    fn map(&mut self) {
        let mut stdin = self.stdin.take().expect("told once");
        writeln!(stdin, "go").expect("tell the mapper");
        drop(stdin);
        let name = self.lib.display().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid()));
            if maps.is_ok_and(|m| m.contains(&name)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("process {} never mapped {name}", self.pid());
    }
}

impl Drop for Mapper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /metrics` on `addr`.
fn scrape(addr: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The `# key: value` header of a command's output over one file.
fn header(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# ")?.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What `eim` itself says of one file: its host id, and its table's
/// counts (`eim deltas`, `eim tables`), or `None` if it does not extract.
struct Expected {
    host_id: String,
    deltas: Option<u64>,
    table: Option<[(String, u64); 4]>,
}

fn expected(path: &Path) -> Expected {
    let ids = run_ok(eim().arg("fileid").arg(path));
    let host_id = ids.split_whitespace().nth(1).expect("host id").to_string();
    let deltas = eim().arg("deltas").arg(path).output().expect("eim deltas");
    let deltas = deltas.status.success().then(|| {
        header(&String::from_utf8_lossy(&deltas.stdout))["deltas"]
            .parse()
            .expect("count")
    });
    let tables = eim().arg("tables").arg(path).output().expect("eim tables");
    let table = tables.status.success().then(|| {
        let h = header(&String::from_utf8_lossy(&tables.stdout));
        let n = |k: &str| -> u64 { h[k].parse().unwrap_or_else(|e| panic!("{k}: {e}")) };
        [
            ("size_class".to_string(), n("mapid")),
            ("kernel_deltas".to_string(), n("kernel_deltas")),
            ("page_entries".to_string(), n("pages")),
            ("unwind_slots".to_string(), n("unwind_infos")),
        ]
    });
    Expected {
        host_id,
        deltas,
        table,
    }
}

/// The attack's preconditions, checked with eim itself: one id, and a copy
/// that extracts to another table (or not at all).
fn check_the_copy(real: &Expected, copy: &Expected, how: Poison) {
    assert_eq!(
        copy.host_id, real.host_id,
        "the copy must present root's id"
    );
    assert!(real.deltas.is_some() && real.table.is_some());
    match how {
        Poison::Instructions => assert!(
            copy.deltas.is_some() && copy.deltas != real.deltas,
            "the copy must extract to another table: {:?} vs {:?}",
            copy.deltas,
            real.deltas
        ),
        Poison::BrokenCie => assert!(copy.deltas.is_none(), "the copy must not extract"),
        Poison::Identical => assert_eq!(copy.deltas, real.deltas),
    }
}

/// What the summary must say: root's process holds exactly the real
/// library's table, the copy's process holds nothing of the id, and the
/// copy is a collision. `Err` says what is wrong.
fn check_summary(
    summary: &Value,
    real: &Expected,
    copy: &Path,
    root: i32,
    attacker: i32,
    what: &str,
) -> Result<(), String> {
    let loaded = summary["loaded_files"]
        .as_array()
        .ok_or("no loaded_files")?;
    let Some(entry) = loaded
        .iter()
        .find(|f| f["host_file_id"].as_str() == Some(&real.host_id))
    else {
        return Err(format!(
            "{what}: root's library is not loaded; problems: {}",
            summary["problems"]
        ));
    };
    let holders: Vec<i64> = entry["processes"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let mut wrong = Vec::new();
    if !holders.contains(&i64::from(root)) {
        wrong.push("root's process does not hold it".to_string());
    }
    if holders.contains(&i64::from(attacker)) {
        wrong.push("the copy's process holds root's id".to_string());
    }
    if entry["deltas"].as_u64() != real.deltas {
        wrong.push(format!("{} deltas, not {:?}", entry["deltas"], real.deltas));
    }
    for (field, want) in real.table.as_ref().ok_or("no table")? {
        if entry["table"][field].as_u64() != Some(*want) {
            wrong.push(format!("{field} {} not {want}", entry["table"][field]));
        }
    }
    let copy_name = copy.display().to_string();
    let listed = summary["problems"].as_array().is_some_and(|p| {
        p.iter()
            .any(|p| p["kind"] == "collision" && p["path"].as_str() == Some(&copy_name))
    });
    if !listed {
        wrong.push("the copy is not listed as a collision".into());
    }
    if summary["counters"]["collisions"].as_u64() < Some(1) {
        wrong.push("no collision counted".into());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {}", wrong.join("; ")))
    }
}

/// Panics with every failed case.
fn all_ok(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn scan_never_serves_a_poisoned_copy_to_root_nor_lets_it_block_root() {
    if !root_or_skip("file id collisions in eim scan") {
        return;
    }
    let Some(lib) = library() else {
        eim_test_support::skip::skip_or_fail(
            "a root library with .eh_frame (libaom, libgmp, libcurl, libbz2)",
        );
        return;
    };
    let real = expected(&lib);
    let mut failures = Vec::new();
    for how in [Poison::Instructions, Poison::BrokenCie] {
        let (_dir, copy) = attacker_copy(&lib, how);
        check_the_copy(&real, &expected(&copy), how);
        for attacker_first in [true, false] {
            let what = format!("scan, {how:?}, attacker first: {attacker_first}");
            // The pass reads processes by pid: the first spawned is first.
            let (mut a, mut r) = if attacker_first {
                let a = Mapper::spawn(&copy, true);
                (a, Mapper::spawn(&lib, false))
            } else {
                let r = Mapper::spawn(&lib, false);
                (Mapper::spawn(&copy, true), r)
            };
            assert_eq!(
                a.pid() < r.pid(),
                attacker_first,
                "{what}: pids in spawn order"
            );
            a.map();
            r.map();
            let json = run_ok(eim().args(["scan", "--json"]).args([
                "--pid",
                &a.pid().to_string(),
                "--pid",
                &r.pid().to_string(),
            ]));
            let summary: Value = serde_json::from_str(&json).expect("JSON");
            failures.extend(check_summary(&summary, &real, &copy, r.pid(), a.pid(), &what).err());
        }
    }
    all_ok(failures);
}

#[test]
fn an_identical_copy_in_another_inode_is_checked_and_shares() {
    if !root_or_skip("identical copies in eim scan") {
        return;
    }
    let Some(lib) = library() else {
        eim_test_support::skip::skip_or_fail(
            "a root library with .eh_frame (libaom, libgmp, libcurl, libbz2)",
        );
        return;
    };
    let real = expected(&lib);
    let (_dir, copy) = attacker_copy(&lib, Poison::Identical);
    check_the_copy(&real, &expected(&copy), Poison::Identical);
    for attacker_first in [true, false] {
        let (mut a, mut r) = if attacker_first {
            let a = Mapper::spawn(&copy, true);
            (a, Mapper::spawn(&lib, false))
        } else {
            let r = Mapper::spawn(&lib, false);
            (Mapper::spawn(&copy, true), r)
        };
        a.map();
        r.map();
        let json = run_ok(eim().args(["scan", "--json"]).args([
            "--pid",
            &a.pid().to_string(),
            "--pid",
            &r.pid().to_string(),
        ]));
        let summary: Value = serde_json::from_str(&json).expect("JSON");
        let entry = summary["loaded_files"]
            .as_array()
            .and_then(|l| {
                l.iter()
                    .find(|f| f["host_file_id"].as_str() == Some(&real.host_id))
            })
            .unwrap_or_else(|| panic!("not loaded: {summary}"));
        let mut holders: Vec<i64> = entry["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter_map(Value::as_i64)
            .collect();
        holders.sort_unstable();
        let mut both = vec![i64::from(a.pid()), i64::from(r.pid())];
        both.sort_unstable();
        assert_eq!(holders, both, "attacker first: {attacker_first}: {entry}");
        assert_eq!(entry["deltas"].as_u64(), real.deltas);
        assert_eq!(
            summary["counters"]["collisions"], 0,
            "{}",
            summary["counters"]
        );
        assert_eq!(summary["files"]["collisions"], 0);
    }
}

/// `eim watch --backend kernel` (events, or polling) while the two
/// processes map their files one after the other, a few steps apart.
fn watch_case(
    lib: &Path,
    real: &Expected,
    how: Poison,
    attacker_first: bool,
    events: bool,
) -> Result<(), String> {
    let (_dir, copy) = attacker_copy(lib, how);
    let what = format!("watch (events: {events}), {how:?}, attacker first: {attacker_first}");
    let mut a = Mapper::spawn(&copy, true);
    let mut r = Mapper::spawn(lib, false);
    let mut cmd = eim();
    cmd.args([
        "watch",
        "--backend",
        "kernel",
        "--no-pin",
        "--interval",
        "200ms",
        "--steps",
        "35",
        "--json",
        "--pid",
        &a.pid().to_string(),
        "--pid",
        &r.pid().to_string(),
    ]);
    if !events {
        cmd.arg("--no-events");
    }
    // One case also serves its metrics, to see the collision counted there.
    let scraped = attacker_first && how == Poison::Instructions;
    if scraped {
        cmd.args(["--metrics-addr", "127.0.0.1:0"]);
    }
    let mut watch = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start eim watch");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let stderr = watch.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.trim().strip_prefix("eim: metrics at http://") {
                let _ = addr_tx.send(rest.trim_end_matches("/metrics").to_string());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // The first mapping well after the first step, the second a few
    // steps after the first was loaded.
    std::thread::sleep(Duration::from_millis(1500));
    if attacker_first {
        a.map();
    } else {
        r.map();
    }
    std::thread::sleep(Duration::from_millis(2000));
    if attacker_first {
        r.map();
    } else {
        a.map();
    }
    let metrics = scraped.then(|| {
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the metrics address");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let body = scrape(&addr);
            if body.contains("eim_file_id_collisions_total 1\n") || Instant::now() > deadline {
                return body;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut stdout = Vec::new();
    watch
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut stdout)
        .expect("read the summary");
    let status = watch.wait().expect("eim watch ends");
    let log = log.join().expect("stderr reader");
    assert!(status.success(), "{what}: {status}\n{log}");
    if let Some(body) = metrics {
        if !body.contains("eim_file_id_collisions_total 1\n") {
            return Err(format!(
                "{what}: the metric does not count the collision:\n{body}"
            ));
        }
    }
    // Logged once, however often it is seen.
    let logged = log.matches("file id collision").count();
    if logged != 1 {
        return Err(format!("{what}: logged {logged} times, not once:\n{log}"));
    }
    let out_stdout = stdout;
    let summary: Value = serde_json::from_slice(&out_stdout).expect("JSON");
    check_summary(&summary, real, &copy, r.pid(), a.pid(), &what)
}

#[test]
fn watch_never_serves_a_poisoned_copy_to_root_nor_lets_it_block_root() {
    if !eim::bpf::probe::require_bpf("file id collisions in eim watch") {
        return;
    }
    let Some(lib) = library() else {
        eim_test_support::skip::skip_or_fail(
            "a root library with .eh_frame (libaom, libgmp, libcurl, libbz2)",
        );
        return;
    };
    let real = expected(&lib);
    let mut failures = Vec::new();
    for events in [true, false] {
        for how in [Poison::Instructions, Poison::BrokenCie] {
            for attacker_first in [true, false] {
                failures.extend(watch_case(&lib, &real, how, attacker_first, events).err());
            }
        }
    }
    all_ok(failures);
}

/// A pin directory of its own on the bpffs, removed at the end.
struct PinDir(PathBuf);

impl PinDir {
    fn new(name: &str) -> Self {
        let dir = PathBuf::from(format!(
            "/sys/fs/bpf/eim-collide-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }

    fn arg(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A warm restart over pins that hold a poisoned copy's table (loaded when
/// only `nobody`'s process mapped it) while root's process now maps the
/// real library: the restart must serve root the real table (it extracted
/// the copy, the first file of the id it found, and kept the poisoned
/// table), the copy is a collision, and `eim status` lists it while the
/// owner runs (the maps cannot show a file that was kept out).
#[test]
fn a_restart_over_a_poisoned_table_serves_root_and_status_lists_the_collision() {
    if !eim::bpf::probe::require_bpf("file id collisions across a warm restart") {
        return;
    }
    let Some(lib) = library() else {
        eim_test_support::skip::skip_or_fail(
            "a root library with .eh_frame (libaom, libgmp, libcurl, libbz2)",
        );
        return;
    };
    let real = expected(&lib);
    let (_dir, copy) = attacker_copy(&lib, Poison::Instructions);
    check_the_copy(&real, &expected(&copy), Poison::Instructions);
    let pins = PinDir::new("restart");
    // The attacker's process first, so that a walk by pid finds it first.
    let mut a = Mapper::spawn(&copy, true);
    let mut r = Mapper::spawn(&lib, false);
    a.map();
    run_ok(
        eim()
            .args(["scan", "--backend", "kernel", "--pin-dir", &pins.arg()])
            .args(["--pid", &a.pid().to_string()]),
    );
    r.map();
    let watch = eim()
        .args([
            "watch",
            "--backend",
            "kernel",
            "--pin-dir",
            &pins.arg(),
            "--interval",
            "200ms",
            "--steps",
            "25",
            "--json",
            "--pid",
            &a.pid().to_string(),
            "--pid",
            &r.pid().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start eim watch");
    // While it runs: a status of its pins lists the collision.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = Value::Null;
    while Instant::now() < deadline {
        let out = eim()
            .args(["status", "--json", "--pin-dir", &pins.arg()])
            .output()
            .expect("eim status");
        if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
            status = v;
            if status["collisions"].as_u64() >= Some(1) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = watch.wait_with_output().expect("eim watch ends");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{log}", out.status);
    let summary: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut failures = Vec::new();
    failures.extend(
        check_summary(
            &summary,
            &real,
            &copy,
            r.pid(),
            a.pid(),
            "watch after a restart",
        )
        .err(),
    );
    let copy_name = copy.display().to_string();
    let listed = status["collisions_listed"].as_array().is_some_and(|l| {
        l.iter()
            .any(|c| c.as_str().is_some_and(|c| c.contains(&copy_name)))
    });
    if status["collisions"].as_u64() < Some(1) || !listed {
        failures.push(format!(
            "eim status does not list the copy's collision: collisions {}, listed {}",
            status["collisions"], status["collisions_listed"]
        ));
    }
    all_ok(failures);
}
