//! `eim stack` checked against gdb (issue 19): real programs held at known
//! points (tests/inputs/stack/), every thread's native stack as eim
//! unwinds it with its maps, and gdb's walk of the same threads as the
//! ground truth (the rule in truth.rs).
//!
//! * `gdb_sees_*`: the harness alone. gdb's walk of each program holds the
//!   expected chain of functions by name, so the programs really stop where
//!   the comparison assumes and the parsing reads gdb right.
//! * `*_sim`, `*_kernel`: gdb, then `eim stack --backend sim|kernel`, then
//!   gdb again; eim's stacks must match gdb's frame for frame.
//!   `EIM_STACK_BIN` names another `eim` binary to check instead of this
//!   build's.
//! * `vdso::*`: a thread caught inside the vDSO (the process stopped,
//!   walked by gdb, eim, gdb), frame for frame to its outermost frame.
//! * `rule::*`: the rule itself, on real gdb walks with stand-ins for
//!   eim's output: it refuses what it must.
//!
//! gdb attaches to a process that is not its child: root. Without gdb, a
//! compiler or an interpreter: a loud `SKIPPED`, a failure under
//! `EIM_REQUIRE_INTERPRETERS=1`; without root (or BPF, for the kernel
//! backend): a loud `SKIPPED`, a failure under `EIM_REQUIRE_BPF=1`.

mod cfi;
mod differential;
mod eim_stack;
mod gdb;
mod maps;
mod plt;
mod profile;
mod programs;
mod rule;
mod truth;
mod vdso;

use eim_stack::Backend;
use gdb::{GdbFrame, Kind, ThreadTruth};
use programs::{gdb_and_root, Program, Running};

/// chain.c's recursion depth (its DEPTH): recurse(DEPTH) down to
/// recurse(0) is DEPTH + 1 frames.
const DEPTH: usize = 200;

/// One test at a time: gdb on libc with its debug info and eim both want
/// the two cores, and a walk that stalls is killed at 60 s.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a frame of an expected chain must be called.
#[derive(Clone, Copy, Debug)]
enum Name {
    /// Exactly this (or a compiler's clone of it, `name.part.0`).
    Is(&'static str),
    /// Containing this.
    Has(&'static str),
    /// In libc, containing this.
    LibcHas(&'static str),
    /// gdb's `<signal handler called>`.
    SignalFrame,
}

impl Name {
    fn matches(self, f: &GdbFrame) -> bool {
        let name = f.name.as_deref().unwrap_or("");
        match self {
            Self::Is(want) => {
                name == want || name.strip_prefix(want).is_some_and(|r| r.starts_with('.'))
            }
            Self::Has(part) => name.contains(part),
            Self::LibcHas(part) => {
                name.contains(part) && f.solib.as_deref().is_some_and(|s| s.contains("libc.so"))
            }
            Self::SignalFrame => f.kind == Kind::SigTramp,
        }
    }
}

/// Whether `chain` appears in the thread's frames in order, innermost
/// first (other frames may come between).
fn in_order(thread: &ThreadTruth, chain: &[Name]) -> bool {
    let mut frames = thread.frames.iter();
    chain.iter().all(|want| frames.any(|f| want.matches(f)))
}

fn listing(thread: &ThreadTruth) -> String {
    let mut out = format!("thread {} (gdb stopped: {})\n", thread.tid, thread.stop);
    for (i, f) in thread.frames.iter().enumerate() {
        out.push_str(&format!("  #{i} {f}\n"));
    }
    out
}

/// Starts `program`, has gdb walk it and returns the thread holding a
/// frame named `focus`, after checking it holds `chain` in order.
fn gdb_sees(test: &str, program: Program, focus: &str, chain: &[Name]) -> Option<ThreadTruth> {
    if !program.available() || !gdb_and_root(test) {
        return None;
    }
    let _one = serial();
    let running = Running::start(program);
    let threads = gdb::truth(running.pid());
    let all: String = threads.iter().map(listing).collect();
    eprintln!("{all}");
    let tids: Vec<u32> = threads.iter().map(|t| t.tid).collect();
    assert_eq!(
        tids.iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        running.tids(),
        "gdb walked every thread of the process"
    );
    let focused: Vec<&ThreadTruth> = threads.iter().filter(|t| t.has(focus)).collect();
    assert_eq!(focused.len(), 1, "one thread runs {focus}:\n{all}");
    let thread = focused[0].clone();
    assert!(
        in_order(&thread, chain),
        "{test}: {chain:?} not in order in\n{}",
        listing(&thread)
    );
    Some(thread)
}

#[test]
fn gdb_sees_the_c_chain_through_qsort() {
    use Name::*;
    let chain = [
        Has("pause"),
        Is("park"),
        Is("c"),
        Is("cmp"),
        LibcHas("sort"),
        Is("b"),
        Is("a"),
        Is("main"),
        Is("_start"),
    ];
    let Some(t) = gdb_sees("gdb_sees_the_c_chain", Program::C("chain"), "cmp", &chain) else {
        return;
    };
    assert_eq!(t.stop, "outermost", "gdb's walk ends at _start");
    assert_eq!(
        t.physical().last().and_then(|f| f.name.as_deref()),
        Some("_start")
    );
}

#[test]
fn gdb_sees_the_recursion() {
    use Name::*;
    let mut chain = vec![Has("pause"), Is("park")];
    chain.extend(std::iter::repeat_n(Is("recurse"), DEPTH + 1));
    chain.extend([Is("main"), Is("_start")]);
    let Some(t) = gdb_sees(
        "gdb_sees_the_recursion",
        Program::C("recurse"),
        "recurse",
        &chain,
    ) else {
        return;
    };
    let depth = t.frames.iter().filter(|f| Is("recurse").matches(f)).count();
    assert_eq!(depth, DEPTH + 1, "one frame per level, none merged");
    assert_eq!(t.stop, "outermost");
}

#[test]
fn gdb_sees_the_signal_handler_above_the_signal_frame() {
    use Name::*;
    let chain = [
        Has("pause"),
        Is("park"),
        Is("on_usr1"),
        SignalFrame,
        Has("raise"),
        Is("raise_usr1"),
        Is("main"),
        Is("_start"),
    ];
    let Some(t) = gdb_sees(
        "gdb_sees_the_signal_handler",
        Program::C("signal"),
        "on_usr1",
        &chain,
    ) else {
        return;
    };
    // The handler is directly above the trampoline it returns to.
    let p = t.physical();
    let tramp = p
        .iter()
        .position(|f| f.kind == Kind::SigTramp)
        .expect("a signal frame");
    assert!(
        tramp > 0 && Is("on_usr1").matches(&p[tramp - 1]),
        "{}",
        listing(&t)
    );
    assert_eq!(t.stop, "outermost");
}

#[test]
fn gdb_sees_the_thread_blocked_in_read() {
    use Name::*;
    let chain = [
        Has("read"),
        Is("blocked_in_read"),
        Is("reader"),
        Has("start_thread"),
        Has("clone"),
    ];
    let Some(t) = gdb_sees(
        "gdb_sees_the_blocked_thread",
        Program::C("chain"),
        "blocked_in_read",
        &chain,
    ) else {
        return;
    };
    assert_eq!(t.stop, "outermost");
}

#[test]
fn gdb_sees_the_rust_chain_into_std() {
    use Name::*;
    let chain = [
        Has("sleep"),
        Has("stack_rust::park"),
        Has("stack_rust::visit::"),
        Has("stack_rust::visit_all"),
        Has("stack_rust::main"),
        Is("main"),
        Is("_start"),
    ];
    gdb_sees(
        "gdb_sees_rust",
        Program::Rust,
        "stack_rust::visit_all",
        &chain,
    );
}

#[test]
fn gdb_sees_the_cpp_chain_through_a_lambda() {
    use Name::*;
    let chain = [
        Has("pause"),
        Is("park"),
        Is("shapes::Holder<int>::visit"),
        Has("{lambda(int)#1}::operator()"),
        Has("std::for_each<"),
        Is("run_all<int>"),
        Is("main"),
        Is("_start"),
    ];
    gdb_sees(
        "gdb_sees_cpp",
        Program::Cpp,
        "shapes::Holder<int>::visit",
        &chain,
    );
}

#[test]
fn gdb_sees_the_go_chain() {
    use Name::*;
    let chain = [
        Has("Syscall"),
        Is("main.inner"),
        Is("main.outer"),
        Is("main.main"),
        Is("runtime.main"),
        Is("runtime.goexit"),
    ];
    gdb_sees("gdb_sees_go", Program::Go, "main.inner", &chain);
}

#[test]
fn gdb_sees_python_in_its_c_code() {
    use Name::*;
    let chain = [
        Has("read"),
        Is("_Py_read"),
        Is("_PyEval_EvalFrameDefault"),
        Is("Py_BytesMain"),
        Has("__libc_start"),
        Is("_start"),
    ];
    gdb_sees("gdb_sees_python", Program::Python, "_Py_read", &chain);
}

/// gdb, `eim stack`, gdb again on `program`; eim's stacks must match
/// gdb's (truth.rs) for every thread that held still, the one running
/// `focus` among them.
fn compare(test: &str, program: Program, focus: &str, backend: Backend) {
    // gdb names a Rust function its DWARF describes (std's, in every Rust
    // program) from the DIE tree (`std::io::stdio::{impl#5}::read`, generic
    // arguments from template parameters); eim names it from its linkage
    // name (`<std::io::stdio::Stdin as std::io::Read>::read`). Not yet
    // checked for Rust (issue 31).
    let names_checked = !matches!(program, Program::Rust);
    if !program.available() || !gdb_and_root(test) {
        return;
    }
    if backend == Backend::Kernel && !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = serial();
    let running = Running::start(program);
    let pid = running.pid();
    let before = gdb::truth(pid);
    let stacks = eim_stack::stacks(pid, backend);
    let after = gdb::truth(pid);
    let maps = maps::mappings(pid);
    truth::assert_matches(&before, &after, &stacks, &maps, focus, names_checked);
}

macro_rules! compared {
    ($($name:ident: $program:expr, $focus:literal;)*) => {
        mod sim {
            use super::*;
            $(#[test]
            fn $name() {
                compare(concat!(stringify!($name), "_sim"), $program, $focus, Backend::Sim);
            })*
        }
        mod kernel {
            use super::*;
            $(#[test]
            fn $name() {
                compare(concat!(stringify!($name), "_kernel"), $program, $focus, Backend::Kernel);
            })*
        }
    };
}

compared! {
    chain: Program::C("chain"), "cmp";
    recurse: Program::C("recurse"), "recurse";
    signal: Program::C("signal"), "on_usr1";
    blocked_thread: Program::C("chain"), "blocked_in_read";
    rust: Program::Rust, "stack_rust::visit_all";
    cpp: Program::Cpp, "shapes::Holder<int>::visit";
    go: Program::Go, "main.inner";
    python: Program::Python, "_Py_read";
}
