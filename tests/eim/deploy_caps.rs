//! The systemd unit's capability set (`deploy/eim.service`,
//! `CapabilityBoundingSet=`), tried for real: a kernel `eim watch` run as
//! root with only those capabilities (`setpriv --bounding-set`, as systemd
//! bounds root's) loads the files of another user's process, among them an
//! executable only its owner may read; and without CAP_SYS_PTRACE or
//! CAP_DAC_READ_SEARCH it does not, nor does a restart over its pins
//! without CAP_SYS_ADMIN. Root and BPF, or a loud SKIPPED (a failure under
//! `EIM_REQUIRE_BPF=1`).
//!
//! (CAP_BPF and CAP_PERFMON are in the set because they are what the maps
//! and the lookup program ask for, and what eim's privilege check names;
//! the kernel accepts CAP_SYS_ADMIN for both, so with it present a run
//! without them succeeds, and they are not tried here.)

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use eim::bpf::{lock, pinned};
use eim::{ElfFileRef, FileId};
use eim_test_support::skip;

/// `nobody`: a user other than the one eim runs as.
const OTHER_USER: &str = "65534";
/// How long one eim run may take.
const LIMIT: Duration = Duration::from_secs(30);

/// The capabilities of the unit's bounding set, as `setpriv` names them
/// (`CAP_SYS_ADMIN` -> `sys_admin`).
fn unit_capabilities() -> Vec<String> {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/eim.service");
    let text = std::fs::read_to_string(&unit).expect("deploy/eim.service");
    let caps: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .flat_map(str::split_whitespace)
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect();
    assert!(!caps.is_empty(), "no CapabilityBoundingSet= in the unit");
    caps
}

/// A process of another user running an executable only that user may
/// read (a copy of `sleep` in a directory of mode 0700), killed and its
/// directory removed on drop.
struct OtherUsersProcess {
    child: Child,
    dir: PathBuf,
    exe: PathBuf,
}

impl OtherUsersProcess {
    fn start() -> Self {
        // In the system's temporary directory, which the other user can
        // traverse (a fresh `tempfile` directory is root's 0700).
        let dir = std::env::temp_dir().join(format!("eim-deploy-caps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("create the directory");
        let exe = dir.join("private-sleep");
        std::fs::copy("/bin/sleep", &exe).expect("copy sleep");
        let chown = Command::new("chown")
            .args(["-R", &format!("{OTHER_USER}:{OTHER_USER}")])
            .arg(&dir)
            .status()
            .expect("chown");
        assert!(chown.success());
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let child = Command::new("setpriv")
            .args([
                &format!("--reuid={OTHER_USER}"),
                &format!("--regid={OTHER_USER}"),
                "--clear-groups",
            ])
            .arg(&exe)
            .arg("60")
            .spawn()
            .expect("start the other user's process");
        let process = Self { child, dir, exe };
        process.wait_for_libc();
        process
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("a pid")
    }

    fn wait_for_libc(&self) {
        let maps = format!("/proc/{}/maps", self.pid());
        let started = Instant::now();
        while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("libc.so")) {
            assert!(started.elapsed() < LIMIT, "the process never mapped libc");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for OtherUsersProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pin directory under /sys/fs/bpf, its pins and lock file removed on
/// drop.
struct Pins(PathBuf);

impl Pins {
    fn remove(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.0) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        self.remove();
        let _ = std::fs::remove_file(Path::new(lock::LOCK_DIR).join(lock::lock_name(&self.0)));
    }
}

/// `eim watch --backend kernel` for one step over `pid` only, as root
/// bounded to `caps`.
fn watch_with(caps: &[String], pins: &Path, pid: i32) -> Output {
    let bounding = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut child = Command::new("setpriv")
        .arg(format!("--bounding-set={bounding}"))
        .arg("--inh-caps=-all")
        .arg(env!("CARGO_BIN_EXE_eim"))
        .args(["watch", "--backend", "kernel", "--steps", "1", "--json"])
        .arg("--pin-dir")
        .arg(pins)
        .args(["--pid", &pid.to_string()])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run eim under setpriv");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("eim watch ran over {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("eim's output")
}

/// Whether the pins hold pages of `file`.
fn pinned_pages_of(pins: &Path, file: FileId) -> bool {
    match pinned::dump_pinned(pins) {
        Ok(dump) => dump.pages.keys().any(|k| k.file_id == file.0),
        // A run that failed before pinning anything.
        Err(_) => false,
    }
}

fn say(output: &Output) -> String {
    format!(
        "exit {:?}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_units_capabilities_are_enough_and_each_named_one_is_needed() {
    if !eim::bpf::probe::require_bpf("deploy_caps") || !skip::tools_present(&["setpriv", "chown"]) {
        return;
    }
    let caps = unit_capabilities();
    let without = |cap: &str| -> Vec<String> {
        assert!(caps.iter().any(|c| c == cap), "the unit lacks {cap}");
        caps.iter().filter(|c| *c != cap).cloned().collect()
    };
    let process = OtherUsersProcess::start();
    let exe = ElfFileRef::new(&process.exe)
        .file_id()
        .expect("the executable's id (read as root)")
        .host();
    let pins = Pins(PathBuf::from(format!(
        "/sys/fs/bpf/eim-deploy-caps-{}",
        std::process::id()
    )));

    // Each run starts from no pins, but the one that needs them.
    for missing in ["sys_ptrace", "dac_read_search"] {
        pins.remove();
        let run = watch_with(&without(missing), &pins.0, process.pid());
        assert!(
            !pinned_pages_of(&pins.0, exe),
            "without {missing} the private executable was loaded all the same:\n{}",
            say(&run)
        );
    }
    pins.remove();
    let run = watch_with(&caps, &pins.0, process.pid());
    assert!(run.status.success(), "{}", say(&run));
    assert!(
        pinned_pages_of(&pins.0, exe),
        "with the unit's capabilities {caps:?}, {} was not loaded:\n{}",
        process.exe.display(),
        say(&run)
    );

    // A restart over those pins (what a service does on every start)
    // reads the outer maps' inner arrays by id: CAP_SYS_ADMIN.
    let run = watch_with(&without("sys_admin"), &pins.0, process.pid());
    assert!(
        !run.status.success(),
        "a restart without sys_admin succeeded:\n{}",
        say(&run)
    );
    let run = watch_with(&caps, &pins.0, process.pid());
    assert!(run.status.success(), "{}", say(&run));
    assert!(pinned_pages_of(&pins.0, exe));
}
