//! The ground truth: gdb attached to the process, walking every thread's
//! frames with its own unwinders (CFI from `.eh_frame` and `.debug_frame`,
//! debug info where the host has it, its signal-frame sniffers), through a
//! Python script that prints one line per frame.

use std::fmt;
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// gdb is killed after this long.
const GDB_TIMEOUT: Duration = Duration::from_secs(60);

/// The walk, run inside gdb. `frame.pc()` of a caller is its return
/// address (gdb looks its symbol up at pc - 1 but reports the PC itself),
/// of a frame interrupted by a signal the interrupted PC: what eim
/// reports. Frames stop at 4096 so a looping walk still ends.
const WALK: &str = r#"
import gdb

KINDS = {
    gdb.NORMAL_FRAME: "normal",
    gdb.INLINE_FRAME: "inline",
    gdb.SIGTRAMP_FRAME: "sigtramp",
    gdb.DUMMY_FRAME: "dummy",
    gdb.TAILCALL_FRAME: "tailcall",
    gdb.ARCH_FRAME: "arch",
    gdb.SENTINEL_FRAME: "sentinel",
}

def walk(thread):
    thread.switch()
    print("THREAD %d" % thread.ptid[1])
    frame = gdb.newest_frame()
    count = 0
    while frame is not None and count < 4096:
        count += 1
        pc = frame.pc()
        kind = KINDS.get(frame.type(), "other")
        name = frame.name() or "?"
        lib = gdb.solib_name(pc) or "-"
        print("FRAME 0x%x %s %s %s" % (pc, kind, lib.replace(" ", "_"), name))
        try:
            older = frame.older()
        except gdb.error as e:
            print("STOP error: %s" % str(e).replace("\n", " "))
            return
        if older is None:
            print("STOP %s" % gdb.frame_stop_reason_string(frame.unwind_stop_reason()))
            return
        frame = older
    print("STOP limit")

for inferior in gdb.inferiors():
    for thread in sorted(inferior.threads(), key=lambda t: t.ptid[1]):
        walk(thread)
print("DONE")
"#;

/// What gdb calls a frame (`gdb.Frame.type()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Normal,
    /// `<signal handler called>`: the signal trampoline the handler
    /// returns to (`__restore_rt`).
    SigTramp,
    /// A function inlined into the next frame: same PC, no frame of its
    /// own on the stack.
    Inline,
    /// A frame gdb infers from call-site debug info for a tail call: not
    /// on the stack either.
    TailCall,
    Other,
}

impl Kind {
    fn parse(s: &str) -> Self {
        match s {
            "normal" => Self::Normal,
            "sigtramp" => Self::SigTramp,
            "inline" => Self::Inline,
            "tailcall" => Self::TailCall,
            _ => Self::Other,
        }
    }

    /// Whether the frame is one of the stack's (a return address or the
    /// interrupted PC read from memory), not one gdb made up from debug
    /// info.
    pub fn is_physical(self) -> bool {
        !matches!(self, Self::Inline | Self::TailCall)
    }
}

/// One frame of gdb's walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdbFrame {
    pub pc: u64,
    pub kind: Kind,
    /// The shared library gdb says holds the PC; `None` for the main
    /// executable (or no file).
    pub solib: Option<String>,
    /// gdb's name of the function, `None` where it has none.
    pub name: Option<String>,
}

impl fmt::Display for GdbFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Normal => "",
            Kind::SigTramp => " <signal handler called>",
            Kind::Inline => " [inline]",
            Kind::TailCall => " [tailcall]",
            Kind::Other => " [other]",
        };
        write!(
            f,
            "{:#x} {}{kind}",
            self.pc,
            self.name.as_deref().unwrap_or("??")
        )
    }
}

/// One thread as gdb sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTruth {
    pub tid: u32,
    /// Every frame gdb printed, innermost first, the made-up ones too.
    pub frames: Vec<GdbFrame>,
    /// Why gdb's walk ended (`outermost`, `no reason`, an error text).
    pub stop: String,
}

impl ThreadTruth {
    /// The frames on the stack: what an unwinder without debug info can
    /// find. Inline and tail-call frames are gdb's inventions from debug
    /// info; a final frame at PC 0 is gdb reading the zero a thread's
    /// start leaves as its outermost return address.
    pub fn physical(&self) -> Vec<GdbFrame> {
        let mut frames: Vec<GdbFrame> = self
            .frames
            .iter()
            .filter(|f| f.kind.is_physical())
            .cloned()
            .collect();
        while frames.last().is_some_and(|f| f.pc == 0) {
            frames.pop();
        }
        frames
    }

    /// The physical PCs, innermost first.
    pub fn pcs(&self) -> Vec<u64> {
        self.physical().iter().map(|f| f.pc).collect()
    }

    /// Whether gdb's walk went on to a frame at PC 0 after its last
    /// physical frame.
    pub fn ends_at_zero(&self) -> bool {
        self.frames
            .iter()
            .rev()
            .find(|f| f.kind.is_physical())
            .is_some_and(|f| f.pc == 0)
    }

    /// Whether any frame's name contains `part`.
    pub fn has(&self, part: &str) -> bool {
        self.frames
            .iter()
            .any(|f| f.name.as_deref().is_some_and(|n| n.contains(part)))
    }
}

/// A line of gdb's output that is not the script's, or one that is but
/// does not parse.
#[derive(Debug)]
pub struct Unparsed(pub String);

/// Parses the script's output (other lines, gdb's own, are skipped).
pub fn parse(output: &str) -> Result<Vec<ThreadTruth>, Unparsed> {
    let mut threads: Vec<ThreadTruth> = Vec::new();
    let mut done = false;
    for line in output.lines() {
        let bad = || Unparsed(line.to_string());
        if let Some(tid) = line.strip_prefix("THREAD ") {
            threads.push(ThreadTruth {
                tid: tid.trim().parse().map_err(|_| bad())?,
                frames: Vec::new(),
                stop: String::new(),
            });
        } else if let Some(rest) = line.strip_prefix("FRAME ") {
            let mut fields = rest.splitn(4, ' ');
            let pc = fields
                .next()
                .and_then(|pc| pc.strip_prefix("0x"))
                .and_then(|pc| u64::from_str_radix(pc, 16).ok())
                .ok_or_else(bad)?;
            let kind = Kind::parse(fields.next().ok_or_else(bad)?);
            let solib = fields.next().ok_or_else(bad)?;
            let name = fields.next().ok_or_else(bad)?;
            threads.last_mut().ok_or_else(bad)?.frames.push(GdbFrame {
                pc,
                kind,
                solib: (solib != "-").then(|| solib.to_string()),
                name: (name != "?").then(|| name.to_string()),
            });
        } else if let Some(stop) = line.strip_prefix("STOP ") {
            threads.last_mut().ok_or_else(bad)?.stop = stop.to_string();
        } else if line == "DONE" {
            done = true;
        }
    }
    if !done {
        return Err(Unparsed("the script never said DONE".into()));
    }
    Ok(threads)
}

/// gdb's walk of every thread of `pid`. gdb stops the process while it
/// attaches and detaches when the script ends.
pub fn truth(pid: u32) -> Vec<ThreadTruth> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let script = dir.path().join("walk.py");
    std::fs::write(&script, WALK).expect("write walk.py");
    let mut gdb = Command::new("gdb");
    // -nx: no .gdbinit; the -iex settings apply before the attach, so no
    // debuginfod download and no auto-loaded helper script (Go's
    // runtime-gdb.py) runs. Past main and past the entry point: the walk
    // goes to the outermost frame, like eim's.
    gdb.args(["-batch", "-nx"])
        .args(["-iex", "set debuginfod enabled off"])
        .args(["-iex", "set auto-load python-scripts off"])
        .args(["-iex", "set auto-load gdb-scripts off"])
        .args(["-iex", "set pagination off"])
        .args(["-iex", "set confirm off"])
        .args(["-ex", "set backtrace past-main on"])
        .args(["-ex", "set backtrace past-entry on"])
        .arg("-p")
        .arg(pid.to_string())
        .arg("-x")
        .arg(&script)
        .env_remove("DEBUGINFOD_URLS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (status, stdout, stderr) = run_with_timeout(gdb, GDB_TIMEOUT, "gdb");
    let threads = parse(&stdout).unwrap_or_else(|Unparsed(line)| {
        panic!(
            "gdb -p {pid} ({status}): cannot parse {line:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        )
    });
    assert!(
        !threads.is_empty(),
        "gdb -p {pid} saw no thread\n{stdout}\n{stderr}"
    );
    threads
}

/// Runs `command` to its end, killing it after `limit`; its status, stdout
/// and stderr.
pub fn run_with_timeout(
    mut command: Command,
    limit: Duration,
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    // Drained on threads while it runs: a full pipe would block it.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    (status, stdout, stderr)
}
