//! `eim stack` and its parts (src/stack) on a child process this test
//! builds with `cc`: a main thread blocked in `read` under a known call
//! chain (`outer` -> `middle` -> `inner`) and a second thread sleeping.
//! Needs root (ptrace, /proc/PID/map_files); without it a loud SKIPPED,
//! a failure under `EIM_REQUIRE_BPF=1`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use eim::host::procs;
use eim::stack::freeze::Frozen;
use eim::stack::memory::ProcMemory;
use eim::stack::regs::thread_regs;
use eim::stack::symbols::Symbolizer;
use eim::unwind::Memory;

const PROGRAM: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

volatile unsigned long magic = 0x1122334455667788UL;

static void *worker(void *arg) {
    (void)arg;
    for (;;) sleep(100);
    return 0;
}

__attribute__((noinline)) void inner(void) {
    char c;
    printf("ready %p %p\n", (void *)&magic, (void *)inner);
    fflush(stdout);
    /* Blocks until the test closes our stdin. */
    while (read(0, &c, 1) > 0) {}
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void middle(void) { inner(); __asm__ volatile(""); }
__attribute__((noinline)) void outer(void) { middle(); __asm__ volatile(""); }

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    outer();
    return 0;
}
"#;

fn root_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eim_test_support::skip::skip_unless_required(
        "EIM_REQUIRE_BPF",
        "stack tests need root (ptrace, /proc/PID/map_files)",
    );
    false
}

/// The child, killed when dropped.
struct Target {
    child: Child,
    magic_address: u64,
    inner_address: u64,
    _dir: tempfile::TempDir,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Target {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

fn compile() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("target.c");
    std::fs::write(&source, PROGRAM).unwrap();
    let binary = dir.path().join("target");
    let status = Command::new("cc")
        .args(["-O1", "-fasynchronous-unwind-tables", "-pthread", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success(), "cc failed");
    (dir, binary)
}

fn start() -> Target {
    let (dir, binary) = compile();
    let mut child = Command::new(&binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"ready"), "{line:?}");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    // Both threads settle in their syscalls.
    let pid = child.id();
    for _ in 0..200 {
        let n = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count();
        if n == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Until both sleep in their syscalls (read, and the worker's sleep): a
    // fixed pause could end first on a loaded machine.
    let asleep = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                let tids: Vec<i32> = tasks
                    .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
                    .collect();
                tids.len() == 2 && tids.iter().all(|&t| state(pid as i32, t) == 'S')
            })
            .unwrap_or(false)
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !asleep() {
        assert!(
            std::time::Instant::now() < until,
            "the threads never settled"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Target {
        child,
        magic_address: hex(words[1]),
        inner_address: hex(words[2]),
        _dir: dir,
    }
}

fn state(pid: i32, tid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    // The state follows the parenthesised comm.
    stat.rsplit_once(") ").unwrap().1.chars().next().unwrap()
}

#[test]
fn freeze_stops_every_thread_and_lets_them_go() {
    if !root_or_skip() {
        return;
    }
    let target = start();
    let pid = target.pid();
    let frozen = Frozen::process(pid).unwrap();
    let tids: Vec<i32> = frozen.tids().collect();
    assert_eq!(tids.len(), 2, "{tids:?}");
    assert_eq!(tids[0], pid);
    for &tid in &tids {
        assert_eq!(state(pid, tid), 't', "thread {tid} in a tracing stop");
    }
    drop(frozen);
    // Detached threads run (R) on their way back into their syscalls.
    for &tid in &tids {
        let settled = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            state(pid, tid) == 'S'
        });
        assert!(settled, "thread {tid} sleeping again: {}", state(pid, tid));
    }
    // Stopping it again works: the first freeze detached cleanly.
    assert_eq!(Frozen::process(pid).unwrap().tids().count(), 2);
}

#[test]
fn registers_memory_and_symbols_of_a_stopped_thread() {
    if !root_or_skip() {
        return;
    }
    let target = start();
    let pid = target.pid();
    let frozen = Frozen::process(pid).unwrap();
    let regs = thread_regs(pid).unwrap();
    // Blocked in read(2): in a syscall, pc in the C library.
    assert!(regs.return_address);
    let mappings = procs::exec_mappings(pid).unwrap().files;
    let at_pc = mappings.iter().find(|m| m.contains(regs.pc)).unwrap();
    assert!(at_pc.path.to_string_lossy().contains("libc"), "{at_pc:?}");
    assert!(regs.sp != 0 && regs.sp.is_multiple_of(8));

    let memory = ProcMemory::open(pid).unwrap();
    assert_eq!(
        memory.read_u64(target.magic_address),
        Some(0x1122_3344_5566_7788)
    );
    assert_eq!(memory.read_u64(0), None);
    assert!(memory.read_u64(regs.sp).is_some());
    drop(frozen);

    let program = mappings
        .iter()
        .find(|m| m.contains(target.inner_address))
        .unwrap();
    let mut symbolizer = Symbolizer::new();
    let symbols = symbolizer.file(pid, program).unwrap();
    let elf = symbols.elf_address(program, target.inner_address).unwrap();
    let named = |s: &eim::stack::symbols::FileSymbols, a| {
        s.symbolize(a).map(|f| (f.function.name, f.offset))
    };
    assert_eq!(named(&symbols, elf), Some(("inner".into(), Some(0))));
    assert_eq!(named(&symbols, elf + 1), Some(("inner".into(), Some(1))));
    // The C library's read is in its dynamic symbols.
    let libc = symbolizer.file(pid, at_pc).unwrap();
    let libc_elf = libc.elf_address(at_pc, regs.pc).unwrap();
    assert!(libc.symbolize(libc_elf - 1).is_some());
}

#[test]
fn eim_stack_shows_the_call_chain_of_each_thread() {
    if !root_or_skip() {
        return;
    }
    let target = start();
    let pid = target.pid();
    let out = Command::new(env!("CARGO_BIN_EXE_eim"))
        .args(["stack", "--json", "--pid", &pid.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["pid"], pid);
    assert_eq!(doc["backend"], "sim");
    let threads = doc["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 2);
    let symbols = |t: &serde_json::Value| -> Vec<String> {
        t["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["symbol"].as_str().map(str::to_owned))
            .collect()
    };
    let main = threads.iter().find(|t| t["tid"] == pid).unwrap();
    let names = symbols(main);
    let position = |n: &str| names.iter().position(|s| s == n);
    let chain: Vec<Option<usize>> = ["inner", "middle", "outer", "main"]
        .iter()
        .map(|n| position(n))
        .collect();
    assert!(chain.iter().all(Option::is_some), "{names:?}");
    assert!(chain.windows(2).all(|w| w[0] < w[1]), "{names:?}");
    assert_eq!(main["stop"], "end", "{main}");
    let worker = threads.iter().find(|t| t["tid"] != pid).unwrap();
    assert!(symbols(worker).iter().any(|s| s == "worker"), "{worker}");
    // Text: a header per thread and the stop line.
    let out = Command::new(env!("CARGO_BIN_EXE_eim"))
        .args(["stack", "--pid", &pid.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!("Thread {pid} (target):\n")),
        "{text}"
    );
    assert!(text.contains(" inner+0x"), "{text}");
    assert_eq!(text.matches("stopped: ").count(), 2, "{text}");
}

/// `eim stack` of what has no user stack, as root: the real reason, never
/// a capability root has (issue 28: a zombie, pid 2, said "it needs
/// CAP_SYS_PTRACE").
#[test]
fn eim_stack_names_why_a_process_cannot_be_stopped() {
    if !root_or_skip() {
        return;
    }
    let stack_of = |pid: u32| {
        let out = Command::new(env!("CARGO_BIN_EXE_eim"))
            .args(["stack", "--pid", &pid.to_string()])
            .output()
            .expect("run eim stack");
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // kthreadd, where the kernel's threads are visible.
    if std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
        let err = stack_of(2);
        assert!(err.contains("kernel thread"), "{err}");
        assert!(!err.contains("needs CAP_SYS_PTRACE"), "{err}");
    }
    let mut child = Command::new("true").spawn().expect("true");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(format!("/proc/{}/stat", child.id())).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    }) {
        assert!(std::time::Instant::now() < until, "true never exited");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let err = stack_of(child.id());
    child.wait().expect("reaped");
    assert!(err.contains("it is a zombie"), "{err}");
    assert!(!err.contains("needs CAP_SYS_PTRACE"), "{err}");
}
