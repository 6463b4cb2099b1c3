//! The pin directory as a store with one owner, through the built `eim`
//! (issue 13, points 1-3), on the real kernel: root, a loud SKIPPED
//! otherwise, a failure under `EIM_REQUIRE_BPF=1`.
//!
//! * one owner: 20 concurrent starts on one directory (each either
//!   completes or is refused at once naming a real owner's pid; one mount;
//!   the final maps are a solo run's); a watch holds its directory until it
//!   exits, and a kernel lookup, a pinned lookup and a status meanwhile
//!   neither wait nor break it;
//! * the mount rules: an empty directory only with `--mount-bpffs`, a
//!   non-empty one never, a read-only file system never, a bpffs as it is,
//!   `/sys/fs/bpf` on its own (in a mount namespace of the test's, where
//!   nothing is mounted there);
//! * a pin of another shape refused, untouched, and replaced only with
//!   `--recreate-mismatched`.
//!
//! Every mount a test makes, or lets eim make, is unmounted by a guard
//! (`MNT_DETACH`), and every directory and lock file removed, even when
//! the test fails; every eim run is bounded in time.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eim::bpf::{bpffs, lock, pinned, sys, KernelConfig};
use serde_json::Value;

mod crash;
mod readers;
mod status;
mod vdso;

/// How long any one eim run may take.
const LIMIT: Duration = Duration::from_secs(30);
/// How long a refused start may take: it does not wait for the owner.
const REFUSED_WITHIN: Duration = Duration::from_secs(5);
const PAGES: &str = "stack_delta_page_to_info";

/// The maps eim pins: the ones it owns, and the generation counter.
fn pinned_maps() -> usize {
    KernelConfig::default().owned_maps().len() + 1
}
/// Between two of the concurrent starts.
const STAGGER: Duration = Duration::from_millis(40);

fn kernel_ready(test: &str) -> bool {
    eim::bpf::probe::require_bpf(test)
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("a path without NUL")
}

/// A scratch directory for one test. Dropped, it unmounts everything
/// mounted on the directories registered with [`Scratch::mount_point`]
/// (however many times), removes their lock files, then the directory.
struct Scratch {
    // Dropped after `Drop::drop` below has unmounted what is in it.
    dir: tempfile::TempDir,
    mount_points: Vec<PathBuf>,
}

impl Scratch {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
            mount_points: Vec::new(),
        }
    }

    /// `name` under the scratch directory, to be unmounted and have its
    /// lock file removed at the end.
    fn mount_point(&mut self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        self.mount_points.push(path.clone());
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for path in self.mount_points.iter().rev() {
            let c = c_path(path);
            // Until nothing is left: a broken start could stack mounts.
            for _ in 0..32 {
                // SAFETY: a NUL-terminated path.
                if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                    break;
                }
            }
            if let Ok(lock) = lock::lock_file_of(path) {
                let _ = std::fs::remove_file(lock);
            }
        }
    }
}

/// Mounts a file system of `fstype` on `target` (`data` its options).
fn mount(fstype: &str, target: &Path, flags: libc::c_ulong, data: &str) {
    let (fs, target_c, data) = (
        CString::new(fstype).expect("name"),
        c_path(target),
        CString::new(data).expect("options"),
    );
    // SAFETY: NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            fs.as_ptr(),
            target_c.as_ptr(),
            fs.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(
        rc,
        0,
        "mount -t {fstype} on {}: {}",
        target.display(),
        std::io::Error::last_os_error()
    );
}

/// How many file systems are mounted on `path` (in this mount namespace).
fn mounts_on(path: &Path) -> usize {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let want = path.to_str().expect("a UTF-8 path");
    info.lines()
        .filter(|l| l.split_whitespace().nth(4) == Some(want))
        .count()
}

fn is_bpffs(path: &Path) -> bool {
    bpffs::is_bpffs(path).unwrap_or(false)
}

/// A child killed (and reaped) when dropped.
struct Running {
    child: Option<Child>,
    started: Instant,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

/// What a finished eim run gave.
struct Finished {
    pid: i32,
    status: ExitStatus,
    stdout: String,
    stderr: String,
    started: Instant,
    ended: Instant,
}

impl Finished {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("no JSON summary ({e}):\n{}\n{}", self.stdout, self.stderr))
    }

    fn ok(self) -> Self {
        assert!(self.status.success(), "{}: {}", self.status, self.stderr);
        self
    }

    fn refused(self) -> Self {
        assert!(
            !self.status.success() && self.status.code().is_some(),
            "not refused ({}):\n{}\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

fn read_all(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

impl Running {
    fn spawn(cmd: &mut Command) -> Self {
        let started = Instant::now();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let out = child.stdout.take().map(read_all);
        let err = child.stderr.take().map(read_all);
        Self {
            child: Some(child),
            started,
            out,
            err,
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// The run, if it has ended.
    fn try_finish(&mut self) -> Option<Finished> {
        let child = self.child.as_mut()?;
        let status = child.try_wait().expect("try_wait")?;
        let ended = Instant::now();
        let pid = child.id() as i32;
        self.child = None;
        let text = |h: Option<JoinHandle<String>>| {
            h.map(|h| h.join().expect("reader")).unwrap_or_default()
        };
        Some(Finished {
            pid,
            status,
            stdout: text(self.out.take()),
            stderr: text(self.err.take()),
            started: self.started,
            ended,
        })
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits for the end, at most [`LIMIT`].
    fn wait(mut self) -> Finished {
        loop {
            if let Some(done) = self.try_finish() {
                return done;
            }
            assert!(
                self.started.elapsed() < LIMIT,
                "eim still running after {LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn eim(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eim"));
    cmd.env_remove("RUST_LOG").args(args);
    cmd
}

fn run(args: &[&str]) -> Finished {
    Running::spawn(&mut eim(args)).wait()
}

/// `sleep 60` once it maps libc: a process whose files never change.
fn sleeper() -> Running {
    let mut sleep = Running::spawn(Command::new("sleep").arg("60"));
    let started = Instant::now();
    let maps = format!("/proc/{}/maps", sleep.pid());
    while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("libc.so.6")) {
        assert!(
            sleep.running() && started.elapsed() < LIMIT,
            "sleep never mapped libc"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    sleep
}

/// What most tests start from, once the kernel is known to be usable: a
/// `sleep` mapping libc, a scratch directory, and `pins` in it.
fn with_sleeper_and_pins(test: &str) -> Option<(Running, Scratch, PathBuf)> {
    if !kernel_ready(test) {
        return None;
    }
    let sleep = sleeper();
    let mut scratch = Scratch::new();
    let dir = scratch.mount_point("pins");
    Some((sleep, scratch, dir))
}

/// `eim scan --json --backend kernel --pin-dir DIR --pid PID` and `extra`.
fn scan(dir: &Path, pid: i32, extra: &[&str]) -> Finished {
    let (dir, pid) = (dir.to_str().expect("UTF-8"), pid.to_string());
    let mut args = vec![
        "scan",
        "--json",
        "--backend",
        "kernel",
        "--pin-dir",
        dir,
        "--pid",
        &pid,
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn in_use(dir: &Path, pid: i32) -> String {
    format!("pin directory {} is in use by pid {pid}", dir.display())
}

/// The pid in a refusal's `pin directory DIR is in use by pid N`.
fn holder_named(stderr: &str, dir: &Path) -> i32 {
    let prefix = format!("pin directory {} is in use by pid ", dir.display());
    let at = stderr
        .find(&prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{stderr}"));
    stderr[at + prefix.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid after {prefix:?} in:\n{stderr}"))
}

fn u(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {v}"))
}

/// A run's tables per size class, from its summary's kernel section.
fn tables_of(summary: &Value) -> Value {
    let mut tables = serde_json::Map::new();
    for c in summary["kernel"]["size_classes"]
        .as_array()
        .expect("classes")
    {
        tables.insert(u(c, "/class").to_string(), c["tables"].clone());
    }
    Value::Object(tables)
}

/// Lookup answers without the slot numbers, which depend on what else
/// the maps hold.
fn without_slots(mut answers: Value) -> Value {
    for a in answers.as_array_mut().expect("answers") {
        if let Some(outcome) = a
            .pointer_mut("/answer/outcome")
            .and_then(Value::as_object_mut)
        {
            outcome.remove("slot");
        }
    }
    answers
}

fn map_info(path: &Path) -> sys::MapInfo {
    let fd = sys::obj_get(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sys::map_info(fd.as_fd()).expect("map info")
}

#[test]
fn twenty_concurrent_starts_on_one_directory_have_one_owner_at_a_time() {
    if !kernel_ready("twenty_concurrent_starts_on_one_directory_have_one_owner_at_a_time") {
        return;
    }
    let sleep = sleeper();
    let mut scratch = Scratch::new();
    let solo_dir = scratch.mount_point("solo");
    let dir = scratch.mount_point("pins");
    let solo = scan(&solo_dir, sleep.pid(), &["--mount-bpffs"]).ok().json();
    let solo_dump = pinned::dump_pinned(&solo_dir).expect("read the solo pins");
    assert!(!solo_dump.pages.is_empty(), "the solo run loaded nothing");

    let (d, pid) = (dir.to_str().expect("UTF-8"), sleep.pid().to_string());
    let args = [
        "scan",
        "--json",
        "--backend",
        "kernel",
        "--pin-dir",
        d,
        "--mount-bpffs",
        "--pid",
        &pid,
    ];
    // Started 40 ms apart: they overlap (one run takes hundreds of ms), and
    // later ones also meet an owner that has just finished.
    let mut runs: Vec<Running> = (0..20)
        .map(|_| {
            let run = Running::spawn(&mut eim(&args));
            std::thread::sleep(STAGGER);
            run
        })
        .collect();
    let pids: Vec<i32> = runs.iter().map(Running::pid).collect();
    let mut done: Vec<Finished> = Vec::new();
    let started = Instant::now();
    while done.len() < runs.len() {
        done.extend(runs.iter_mut().filter_map(Running::try_finish));
        assert!(started.elapsed() < 2 * LIMIT, "the starts did not end");
        std::thread::sleep(Duration::from_millis(2));
    }
    let owners: BTreeMap<i32, &Finished> = done
        .iter()
        .filter(|f| f.status.success())
        .map(|f| (f.pid, f))
        .collect();
    let mut first_owners = 0;
    for f in owners.values() {
        let pins = &f.json()["pins"];
        if pins["created"] == pinned_maps() {
            // The first owner made the maps and the mount.
            first_owners += 1;
            assert_eq!(pins["cleaned"], Value::Null, "{pins}");
            assert_eq!(pins["mounted"], d, "{pins}");
        } else {
            // Every later owner found a whole solo load, left by an owner
            // that had finished (no two owners at once), and kept it as it
            // was: adopted every file, wrote and removed nothing.
            assert_eq!(pins["reopened"], pinned_maps(), "{pins}");
            assert_eq!(pins["mounted"], Value::Null, "{pins}");
            assert_eq!(pins["cleaned"], Value::Null, "{pins}");
            let reconciled = &pins["reconciled"];
            assert_eq!(reconciled["adopted"], solo["files"]["loaded"], "{pins}");
            assert_eq!(reconciled["loaded"], 0, "{pins}");
            assert_eq!(reconciled["removals"], 0, "{pins}");
            let kernel = &f.json()["kernel"];
            assert_eq!(kernel["page_entries"], solo["kernel"]["page_entries"]);
            assert_eq!(kernel["unwind_infos"], solo["kernel"]["unwind_infos"]);
            assert_eq!(tables_of(&f.json()), tables_of(&solo), "{pins}");
        }
    }
    assert_eq!(first_owners, 1, "{} owners", owners.len());
    let mut refused = 0;
    let mut slowest = Duration::ZERO;
    for f in done.iter().filter(|f| !f.status.success()) {
        let f_ok = f.status.code() == Some(1);
        assert!(f_ok, "{}: {}", f.status, f.stderr);
        let holder = holder_named(&f.stderr, &dir);
        assert!(
            pids.contains(&holder) && holder != f.pid,
            "pid {holder} is not another eim: {}",
            f.stderr
        );
        let owner = owners
            .get(&holder)
            .unwrap_or_else(|| panic!("pid {holder} never owned {d}: {}", f.stderr));
        // The named owner was running during the refused start.
        assert!(owner.ended >= f.started, "pid {holder} had exited already");
        slowest = slowest.max(f.ended - f.started);
        refused += 1;
    }
    assert!(refused > 0, "20 concurrent starts and none refused");
    assert!(slowest < REFUSED_WITHIN, "a refused start took {slowest:?}");
    eprintln!(
        "20 starts: {} owners one after another, {refused} refused (slowest refusal {slowest:?})",
        owners.len()
    );
    assert_eq!(mounts_on(&dir), 1, "one bpffs on {d}");
    let dump = pinned::dump_pinned(&dir).expect("read the pins");
    assert_eq!(dump, solo_dump, "the maps are not a solo run's");
}

#[test]
fn a_watch_owns_its_pin_directory_until_it_exits_and_lookups_and_status_neither_wait_nor_break_it()
{
    let Some((sleep, _scratch, dir)) =
        with_sleeper_and_pins("a_watch_owns_its_pin_directory_until_it_exits")
    else {
        return;
    };
    let (d, pid) = (dir.to_str().expect("UTF-8"), sleep.pid().to_string());
    let mut watch = Running::spawn(&mut eim(&[
        "watch",
        "--backend",
        "kernel",
        "--pin-dir",
        d,
        "--mount-bpffs",
        "--pid",
        &pid,
        "--interval",
        "100ms",
    ]));
    // Pinned maps mean the watch owns the directory.
    let started = Instant::now();
    while !dir.join(PAGES).exists() {
        assert!(watch.running(), "the watch ended");
        assert!(started.elapsed() < LIMIT, "the watch never pinned its maps");
        std::thread::sleep(Duration::from_millis(5));
    }
    let pages_id = map_info(&dir.join(PAGES)).id;
    // Pinned is not loaded: the readers below compare answers, so they
    // wait for the first step to have loaded every file of the sleep
    // (its mappings entry names them, and each has pages).
    let loaded = eim_test_support::wait_for(LIMIT, || {
        let Ok(dump) = pinned::dump_pinned(&dir) else {
            return false;
        };
        dump.process_mappings
            .get(&(sleep.pid() as u32))
            .is_some_and(|entry| {
                !entry.mappings.is_empty()
                    && entry
                        .mappings
                        .iter()
                        .all(|m| dump.pages.keys().any(|k| k.file_id == m.file_id))
            })
    });
    assert!(loaded, "the watch never loaded the sleep's files");

    let second = scan(&dir, sleep.pid(), &["--mount-bpffs"]).refused();
    assert!(
        second.stderr.contains(&in_use(&dir, watch.pid())),
        "{}",
        second.stderr
    );
    assert_eq!(holder_named(&second.stderr, &dir), watch.pid());
    assert!(second.ended - second.started < REFUSED_WITHIN);
    assert!(watch.running(), "the refused start stopped the watch");

    // A kernel lookup uses maps of its own: it neither waits for the owner
    // nor touches its pins. A pin directory given to it is refused (it
    // would be ignored).
    let lookup = [
        "lookup",
        "--json",
        "/usr/bin/sleep",
        "0x3000",
        "0x4100",
        "0x5200",
    ];
    let look = run(&[&lookup[..], &["--backend", "kernel"]].concat()).ok();
    assert!(look.stdout.contains("/usr/bin/sleep"), "{}", look.stdout);
    let refused = run(&[
        "lookup",
        "--backend",
        "kernel",
        "--pin-dir",
        d,
        "/usr/bin/sleep",
        "0x3000",
    ]);
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("--pin-dir would be ignored"),
        "{}",
        refused.stderr
    );
    // The readers of the live maps neither wait for the owner nor stop it:
    // the lookup through the pins gives the private lookup's answer, and
    // the status names the owner and finds the maps consistent.
    let pinned = run(&[&lookup[..], &["--pinned", "--pin-dir", d]].concat()).ok();
    // The slots differ (the watch's maps hold libc's rules too): the rules
    // in them are the same.
    assert_eq!(without_slots(pinned.json()), without_slots(look.json()));
    assert!(pinned.ended - pinned.started < REFUSED_WITHIN);
    // The same for addresses of the process, through its mappings.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let libc_text = maps
        .lines()
        .find(|l| l.contains("libc.so.6") && l.split_whitespace().nth(1) == Some("r-xp"))
        .and_then(|l| l.split('-').next())
        .and_then(|start| u64::from_str_radix(start, 16).ok())
        .expect("libc's text mapping");
    let addresses: Vec<String> = [0x1000u64, 0x2_3456, 0x8_0000]
        .iter()
        .map(|off| format!("{:#x}", libc_text + off))
        .collect();
    let mut by_pid = vec!["lookup", "--json", "--pid", &pid];
    by_pid.extend(addresses.iter().map(String::as_str));
    let look = run(&[&by_pid[..], &["--backend", "kernel"]].concat()).ok();
    let pinned = run(&[&by_pid[..], &["--pinned", "--pin-dir", d]].concat()).ok();
    let answers = without_slots(pinned.json());
    assert_eq!(answers, without_slots(look.json()));
    assert!(
        answers
            .as_array()
            .expect("answers")
            .iter()
            .all(|a| a["answer"]["page"].is_object()),
        "every address has a page entry: {answers:#}"
    );
    let status = run(&["status", "--json", "--pin-dir", d]).ok().json();
    assert_eq!(status["owned"], true, "{status}");
    assert_eq!(status["owner_pid"], watch.pid(), "{status}");
    assert_eq!(status["violations"], serde_json::json!([]), "{status}");
    assert!(watch.running(), "a lookup or the status stopped the watch");
    assert_eq!(map_info(&dir.join(PAGES)).id, pages_id);

    watch.signal(libc::SIGTERM);
    let watch = watch.wait().ok();
    assert!(watch.stdout.contains("eim scan:"), "{}", watch.stdout);
    // The owner gone, the next start owns the directory: a bpffs now, used
    // as it is.
    let next = scan(&dir, sleep.pid(), &[]).ok().json();
    assert_eq!(next["pins"]["reopened"], pinned_maps(), "{}", next["pins"]);
    assert_eq!(next["pins"]["mounted"], Value::Null);
}

#[test]
fn a_bpffs_is_mounted_only_on_an_empty_directory_and_only_when_asked() {
    if !kernel_ready("a_bpffs_is_mounted_only_on_an_empty_directory_and_only_when_asked") {
        return;
    }
    let sleep = sleeper();
    let pid = sleep.pid();
    let mut scratch = Scratch::new();

    // An empty directory elsewhere: refused without the flag, with the
    // commands to run.
    let empty = scratch.mount_point("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let no = scan(&empty, pid, &[]).refused();
    let mount_cmd = format!("mount -t bpf bpf {}", empty.display());
    assert!(
        no.stderr.contains(&mount_cmd) && no.stderr.contains("--mount-bpffs"),
        "{}",
        no.stderr
    );
    assert!(!is_bpffs(&empty) && mounts_on(&empty) == 0);
    // With it: mounted, and said so.
    let yes = scan(&empty, pid, &["--mount-bpffs"]).ok();
    let said = format!(
        "eim: mounted a bpffs on {} for the pinned maps",
        empty.display()
    );
    assert!(yes.stderr.contains(&said), "{}", yes.stderr);
    assert_eq!(
        yes.json()["pins"]["mounted"],
        empty.to_str().expect("UTF-8")
    );
    assert!(is_bpffs(&empty) && mounts_on(&empty) == 1);
    // Now a bpffs: used as it is, with or without the flag, no new mount.
    for extra in [&[][..], &["--mount-bpffs"]] {
        let again = scan(&empty, pid, extra).ok();
        assert!(
            !again.stderr.contains("mounted a bpffs"),
            "{}",
            again.stderr
        );
        assert_eq!(again.json()["pins"]["reopened"], pinned_maps());
        assert_eq!(mounts_on(&empty), 1);
    }

    // A directory that does not exist: not created when refused.
    let missing = scratch.mount_point("missing");
    let no = scan(&missing, pid, &[]).refused();
    let cmd = format!("mkdir -p {0} && mount -t bpf bpf {0}", missing.display());
    assert!(no.stderr.contains(&cmd), "{}", no.stderr);
    assert!(!missing.exists());

    // A directory that holds a file: refused with and without the flag,
    // and the file stays readable.
    let full = scratch.mount_point("full");
    std::fs::create_dir(&full).expect("mkdir");
    std::fs::write(full.join("keep"), "still here\n").expect("write");
    for extra in [&[][..], &["--mount-bpffs"]] {
        let no = scan(&full, pid, extra).refused();
        let why = format!(
            "refusing to mount a bpffs on {}: it is not empty",
            full.display()
        );
        assert!(
            no.stderr.contains(&why) && no.stderr.contains("\"keep\""),
            "{}",
            no.stderr
        );
        assert_eq!(
            std::fs::read_to_string(full.join("keep")).expect("read"),
            "still here\n"
        );
        assert!(!is_bpffs(&full) && mounts_on(&full) == 0);
    }

    // A read-only file system: refused, the directory itself or one to
    // make in it.
    let ro = scratch.mount_point("ro");
    std::fs::create_dir(&ro).expect("mkdir");
    mount("tmpfs", &ro, libc::MS_RDONLY, "size=64k");
    for target in [ro.clone(), scratch.mount_point("ro/pins")] {
        let no = scan(&target, pid, &["--mount-bpffs"]).refused();
        let why = format!(
            "refusing to use {} as the pin directory: it is on a read-only file system",
            target.display()
        );
        assert!(no.stderr.contains(&why), "{}", no.stderr);
        assert_eq!(mounts_on(&ro), 1, "only the test's tmpfs");
        assert!(!is_bpffs(&target));
    }

    // A bpffs mounted by someone else: used as it is, nothing mounted.
    let theirs = scratch.mount_point("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    mount("bpf", &theirs, 0, "");
    let used = scan(&theirs, pid, &[]).ok();
    assert!(!used.stderr.contains("mounted a bpffs"), "{}", used.stderr);
    assert_eq!(used.json()["pins"]["created"], pinned_maps());
    assert_eq!(mounts_on(&theirs), 1);
}

/// Runs `cmd` in a mount namespace of its own where nothing is mounted on
/// `/sys/fs/bpf` (whatever this host has there stays).
fn without_sys_fs_bpf(cmd: &mut Command) -> &mut Command {
    let root = c_path(Path::new("/"));
    let sys_fs_bpf = c_path(Path::new(bpffs::SYS_FS_BPF));
    // SAFETY: only async-signal-safe calls (syscalls) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing done here may reach the host's mounts.
            let flags = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            for _ in 0..32 {
                if libc::umount2(sys_fs_bpf.as_ptr(), libc::MNT_DETACH) != 0 {
                    break;
                }
            }
            Ok(())
        })
    }
}

#[test]
fn under_sys_fs_bpf_eim_mounts_the_kernels_bpffs_on_its_own() {
    if !kernel_ready("under_sys_fs_bpf_eim_mounts_the_kernels_bpffs_on_its_own") {
        return;
    }
    let sleep = sleeper();
    let host_had = is_bpffs(Path::new(bpffs::SYS_FS_BPF));
    let host_mounts = mounts_on(Path::new(bpffs::SYS_FS_BPF));
    let dir = PathBuf::from(format!("/sys/fs/bpf/eim-pins-test-{}", std::process::id()));
    let (d, pid) = (dir.to_str().expect("UTF-8"), sleep.pid().to_string());
    let mut cmd = eim(&[
        "scan",
        "--json",
        "--backend",
        "kernel",
        "--pin-dir",
        d,
        "--pid",
        &pid,
    ]);
    let done = Running::spawn(without_sys_fs_bpf(&mut cmd)).wait().ok();
    assert!(
        done.stderr
            .contains("eim: mounted a bpffs on /sys/fs/bpf for the pinned maps"),
        "{}",
        done.stderr
    );
    let pins = &done.json()["pins"];
    assert_eq!(pins["mounted"], "/sys/fs/bpf", "{pins}");
    assert_eq!(pins["created"], pinned_maps(), "{pins}");
    // The mount, and the pins in it, went with the namespace.
    assert_eq!(is_bpffs(Path::new(bpffs::SYS_FS_BPF)), host_had);
    assert_eq!(mounts_on(Path::new(bpffs::SYS_FS_BPF)), host_mounts);
    assert!(!dir.exists());
    if let Ok(lock) = lock::lock_file_of(&dir) {
        let _ = std::fs::remove_file(lock);
    }
}

#[test]
fn a_pin_of_another_shape_is_refused_untouched_and_replaced_only_when_asked() {
    let Some((sleep, _scratch, dir)) = with_sleeper_and_pins(
        "a_pin_of_another_shape_is_refused_untouched_and_replaced_only_when_asked",
    ) else {
        return;
    };
    std::fs::create_dir(&dir).expect("mkdir");
    mount("bpf", &dir, 0, "");
    // Upstream's page map: 40,000 entries (eim's default differs).
    let upstream = sys::map_create(&sys::MapSpec {
        map_type: sys::map_type::HASH,
        key_size: 16,
        value_size: 8,
        max_entries: eim::abi::capacity::PAGES_COMPILED,
        map_flags: 0,
        inner_map: None,
        name: PAGES,
    })
    .expect("a page map");
    let pin = dir.join(PAGES);
    eim::bpf::aya::maps::MapData::from_fd(upstream)
        .expect("map data")
        .pin(&pin)
        .expect("pin");
    let before = map_info(&pin);
    // A fresh bpffs may hold the kernel's own files (`maps.debug`, ...).
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .expect("ls")
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        names
    };
    let listed = listing();
    let want = KernelConfig::default().pages;
    assert_ne!(before.max_entries, want);
    let why = format!(
        "{PAGES}: max_entries is {}, expected {want}",
        before.max_entries
    );

    let no = scan(&dir, sleep.pid(), &[]).refused();
    assert!(
        no.stderr.contains(&why) && no.stderr.contains("--recreate-mismatched"),
        "{}",
        no.stderr
    );
    assert_eq!(map_info(&pin), before, "the pin was touched");
    assert_eq!(listing(), listed, "a refused start pinned something");

    let yes = scan(&dir, sleep.pid(), &["--recreate-mismatched"]).ok();
    let said = format!(
        "eim: replaced the pinned map {PAGES} in {}: max_entries is {}, expected {want}",
        dir.display(),
        before.max_entries
    );
    assert!(yes.stderr.contains(&said), "{}", yes.stderr);
    let pins = &yes.json()["pins"];
    assert_eq!(pins["replaced"][0]["map"], PAGES, "{pins}");
    assert_eq!(pins["created"], pinned_maps() - 1, "{pins}");
    let after = map_info(&pin);
    assert_eq!(after.max_entries, want);
    assert_ne!(after.id, before.id);
}

/// A start over the pins of a run whose processes are all still there
/// keeps everything as it was: every file adopted, not one map op, the
/// maps byte for byte the same.
#[test]
fn a_restart_over_an_unchanged_host_adopts_everything_and_writes_nothing() {
    let Some((sleep, _scratch, dir)) = with_sleeper_and_pins(
        "a_restart_over_an_unchanged_host_adopts_everything_and_writes_nothing",
    ) else {
        return;
    };
    let first = scan(&dir, sleep.pid(), &["--mount-bpffs"]).ok().json();
    let before = pinned::dump_pinned(&dir).expect("dump");
    assert!(u(&first, "/files/loaded") > 0, "nothing loaded");
    assert!(u(&first, "/kernel/ops") > 0, "a first load writes");

    let again = scan(&dir, sleep.pid(), &[]).ok();
    assert!(
        again.stderr.contains("eim: maps reconciled"),
        "{}",
        again.stderr
    );
    let summary = again.json();
    let reconciled = &summary["pins"]["reconciled"];
    assert_eq!(
        reconciled["adopted"], first["files"]["loaded"],
        "{reconciled}"
    );
    assert_eq!(reconciled["loaded"], 0, "{reconciled}");
    assert_eq!(reconciled["removals"], 0, "{reconciled}");
    assert_eq!(summary["pins"]["cleaned"], Value::Null);
    assert_eq!(u(&summary, "/kernel/ops"), 0, "an unchanged host wrote");
    assert_eq!(summary["files"]["loaded"], first["files"]["loaded"]);
    assert_eq!(pinned::dump_pinned(&dir).expect("dump"), before);
}

/// Pins eim never writes that way (here: one rule in two slots) are not
/// trusted: the start says so, cleans them and loads afresh, and ends
/// with exactly a fresh run's maps.
#[test]
fn pins_the_reconcile_does_not_trust_are_cleaned_and_loaded_afresh() {
    let Some((sleep, _scratch, dir)) =
        with_sleeper_and_pins("pins_the_reconcile_does_not_trust_are_cleaned_and_loaded_afresh")
    else {
        return;
    };
    scan(&dir, sleep.pid(), &["--mount-bpffs"]).ok();
    let fresh = pinned::dump_pinned(&dir).expect("dump");
    let (slot, rule) = fresh
        .unwind_infos
        .iter()
        .enumerate()
        .find(|(_, info)| **info != eim::abi::UnwindInfo::default())
        .map(|(slot, info)| (slot, *info))
        .expect("a slot with a rule");
    let last = fresh.unwind_infos.len() - 1;
    assert_ne!(slot, last);
    let array = sys::obj_get(&dir.join("unwind_info_array")).expect("the pinned array");
    sys::update_elem(
        array.as_fd(),
        &(last as u32).to_le_bytes(),
        &eim::abi::Wire::to_bytes(&rule),
        sys::BPF_ANY,
    )
    .expect("plant a second copy of a rule");

    let again = scan(&dir, sleep.pid(), &[]).ok();
    let said = format!(
        "eim: the maps pinned in {} were not reconciled",
        dir.display()
    );
    assert!(again.stderr.contains(&said), "{}", again.stderr);
    assert!(again.stderr.contains("cleaned them"), "{}", again.stderr);
    let summary = again.json();
    assert_ne!(summary["pins"]["cleaned"], Value::Null, "{summary}");
    assert_eq!(summary["pins"]["reconciled"], Value::Null, "{summary}");
    assert_eq!(pinned::dump_pinned(&dir).expect("dump"), fresh);
}
