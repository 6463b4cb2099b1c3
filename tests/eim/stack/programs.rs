//! The programs under test (sources in tests/inputs/stack/): built once per
//! test binary, started, and held at their known points.

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use eim_test_support::skip::{present, skip_unless_required, tools_present};

pub const PYTHON: &str = "/usr/bin/python3.11";

/// How long a program may take to reach its known points.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// One way of running a test program.
#[derive(Clone, Copy, Debug)]
pub enum Program {
    /// chain.c with its scenario (`chain`, `recurse`, `signal`, `spin`,
    /// `split` or `syscalls`).
    C(&'static str),
    Rust,
    /// stack_cpp.cpp: templates, a lambda, std::for_each, with DWARF.
    Cpp,
    Go,
    Python,
}

impl Program {
    /// The words of the "ready <word>" lines the program prints when each
    /// of its stopped threads is about to block.
    pub fn ready_words(self) -> &'static [&'static str] {
        match self {
            Self::C("chain") => &["thread", "chain"],
            Self::C("recurse") => &["thread", "recurse"],
            Self::C("signal") => &["thread", "signal"],
            Self::C("spin") => &["thread", "spin"],
            Self::C("split") => &["thread", "split"],
            Self::C("syscalls") => &["thread", "syscalls"],
            Self::C("clock") => &["thread", "clock"],
            Self::C("tod") => &["thread", "tod"],
            Self::C(other) => panic!("chain.c has no scenario {other}"),
            Self::Rust => &["thread", "rust"],
            Self::Cpp => &["thread", "cpp"],
            Self::Go => &["go"],
            Self::Python => &["python"],
        }
    }

    /// Whether the tools that build and run it are here; otherwise a loud
    /// skip (a failure under `EIM_REQUIRE_INTERPRETERS`).
    pub fn available(self) -> bool {
        match self {
            Self::C(_) => tools_present(&["cc"]),
            Self::Rust => tools_present(&["rustc"]),
            Self::Cpp => tools_present(&["c++"]),
            Self::Go => tools_present(&["go"]),
            Self::Python => present(Path::new(PYTHON)),
        }
    }
}

/// gdb and root (attaching to a process that is not gdb's child): a loud
/// skip otherwise, a failure under `EIM_REQUIRE_INTERPRETERS` (gdb) or
/// `EIM_REQUIRE_BPF=1` (root).
pub fn gdb_and_root(test: &str) -> bool {
    if !tools_present(&["gdb"]) {
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip_unless_required(
            "EIM_REQUIRE_BPF",
            &format!("{test}: attaching to a running process needs root"),
        );
        return false;
    }
    true
}

fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inputs/stack")
}

/// Where the built programs go: this test binary's own directory, so that
/// two test runs at the same time do not replace each other's files.
/// The directories of test binaries that have ended are removed first.
fn build_dir() -> PathBuf {
    static SWEPT: OnceLock<()> = OnceLock::new();
    let all = Path::new(env!("CARGO_TARGET_TMPDIR")).join("stack");
    SWEPT.get_or_init(|| {
        for entry in std::fs::read_dir(&all).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let ended = name
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
            if ended {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
    let dir = all.join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

fn checked(what: &str, mut command: Command) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn build_c() -> PathBuf {
    let out = build_dir().join("chain");
    let mut cc = Command::new("cc");
    // No -g: the CFI alone (.eh_frame, -fasynchronous-unwind-tables is
    // the default) describes the frames, as on a production host.
    cc.args([
        "-O2",
        "-fomit-frame-pointer",
        "-fasynchronous-unwind-tables",
    ])
    .args(["-pthread", "-o"])
    .arg(&out)
    .arg(sources().join("chain.c"));
    checked("cc chain.c", cc);
    out
}

fn build_rust() -> PathBuf {
    let out = build_dir().join("stack_rust");
    let mut rustc = Command::new("rustc");
    rustc
        .args(["-C", "opt-level=2", "-C", "force-frame-pointers=no"])
        .args(["--edition", "2021", "-o"])
        .arg(&out)
        .arg(sources().join("stack_rust.rs"));
    checked("rustc stack_rust.rs", rustc);
    out
}

fn build_cpp() -> PathBuf {
    let out = build_dir().join("stack_cpp");
    let mut cc = Command::new("c++");
    // With -g: gdb names the frames from the DWARF (no parameters), and
    // the lambda and std::for_each are inline frames.
    cc.args(["-O2", "-g", "-fomit-frame-pointer"])
        .args(["-pthread", "-o"])
        .arg(&out)
        .arg(sources().join("stack_cpp.cpp"));
    checked("c++ stack_cpp.cpp", cc);
    out
}

fn build_go() -> PathBuf {
    let dir = build_dir().join("go");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    std::fs::copy(sources().join("stack_go.go"), dir.join("main.go")).expect("copy stack_go.go");
    std::fs::write(dir.join("go.mod"), "module stackgo\n\ngo 1.19\n").expect("go.mod");
    let out = build_dir().join("stack_go");
    let mut go = Command::new("go");
    go.args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&dir)
        .env(
            "GOCACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build-cache"),
        )
        .env("GOPATH", dir.join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0");
    checked("go build stack_go.go", go);
    out
}

/// The executable of `program` (and its arguments), built on first use.
pub fn command_of(program: Program) -> Command {
    static C: OnceLock<PathBuf> = OnceLock::new();
    static RUST: OnceLock<PathBuf> = OnceLock::new();
    static CPP: OnceLock<PathBuf> = OnceLock::new();
    static GO: OnceLock<PathBuf> = OnceLock::new();
    match program {
        Program::C(scenario) => {
            let mut c = Command::new(C.get_or_init(build_c));
            c.arg(scenario);
            c
        }
        Program::Rust => Command::new(RUST.get_or_init(build_rust)),
        Program::Cpp => Command::new(CPP.get_or_init(build_cpp)),
        Program::Go => Command::new(GO.get_or_init(build_go)),
        Program::Python => {
            let mut c = Command::new(PYTHON);
            c.arg(sources().join("stack_python.py"));
            c
        }
    }
}

/// A started program at its known points; killed when dropped.
pub struct Running {
    child: Child,
    /// Held open and never written: the Rust program's reader blocks on it.
    _stdin: Option<ChildStdin>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `program` and waits until it has said every "ready" line and
    /// every thread sleeps in the kernel (a thread prints its line just
    /// before the blocking call, so a sleeping thread after the line is
    /// in it).
    pub fn start(program: Program) -> Self {
        let mut child = command_of(program)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut running = Self {
            child,
            _stdin: stdin,
        };
        let (lines, seen) = mpsc::channel();
        // The reader keeps draining stdout for the program's whole life, so
        // a later write of the program never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut missing: BTreeSet<&str> = program.ready_words().iter().copied().collect();
        let started = Instant::now();
        while !missing.is_empty() {
            let left = READY_WITHIN.saturating_sub(started.elapsed());
            match seen.recv_timeout(left) {
                Ok(line) => {
                    if let Some(word) = line.strip_prefix("ready ") {
                        missing.remove(word);
                    }
                }
                Err(_) => {
                    let status = running.child.try_wait();
                    panic!("{program:?} never said ready {missing:?} (status {status:?})");
                }
            }
        }
        // A spinning program never sleeps: its "ready" line is enough.
        if !matches!(
            program,
            Program::C("spin" | "split" | "syscalls" | "clock" | "tod")
        ) {
            let asleep = wait_for(READY_WITHIN, || all_asleep(running.pid()));
            assert!(asleep, "{program:?}: its threads never all slept");
        }
        running
    }

    /// The thread ids of the process now.
    pub fn tids(&self) -> BTreeSet<u32> {
        tids_of(self.pid())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn tids_of(pid: u32) -> BTreeSet<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether every thread of `pid` is in an interruptible sleep (`S`).
fn all_asleep(pid: u32) -> bool {
    let tids = tids_of(pid);
    !tids.is_empty()
        && tids.iter().all(|tid| {
            let stat =
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
            // The state follows the parenthesised comm, which may hold spaces.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("S")
        })
}

pub use eim_test_support::wait_for;
