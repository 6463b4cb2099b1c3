//! A thread inside the vDSO (issue 31): chain.c's `clock` and `tod` read
//! the clock forever, so their main thread is mostly inside the vDSO's
//! `clock_gettime` or `gettimeofday`. The process is stopped (SIGSTOP)
//! until gdb's walk has its frame 0 in the `[vdso]` mapping (a bounded
//! number of tries), then walked by gdb, `eim stack` and gdb again, as
//! every other program is (truth.rs); and eim's stack of that thread must
//! go through the vDSO to gdb's outermost frame, not stop in it, with its
//! frame 0 named `[vdso]` and by gdb's function name.

use std::time::{Duration, Instant};

use crate::eim_stack::{self, Backend};
use crate::gdb::{self, ThreadTruth};
use crate::programs::{gdb_and_root, Program, Running};
use crate::{maps, serial, truth};

/// Stops before one catches the thread inside the vDSO (it is there most
/// of the time: a few tries suffice).
const ATTEMPTS: usize = 30;

/// The `[vdso]` mapping of `pid`.
fn vdso_of(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let line = text
        .lines()
        .find(|l| l.ends_with("[vdso]"))
        .expect("a [vdso] mapping");
    let (a, b) = line
        .split_whitespace()
        .next()
        .and_then(|r| r.split_once('-'))
        .expect("a range");
    (
        u64::from_str_radix(a, 16).expect("start"),
        u64::from_str_radix(b, 16).expect("end"),
    )
}

/// Sends `signal` to `pid`.
fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory preconditions.
    let r = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(r, 0, "kill({pid}, {signal})");
}

/// Stops `pid` and waits until every one of its threads is stopped.
fn stop(pid: u32) {
    signal(pid, libc::SIGSTOP);
    let started = Instant::now();
    loop {
        let all = crate::programs::tids_of(pid).into_iter().all(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
                .unwrap_or(false)
        });
        if all {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{pid} never stopped"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// gdb's walk of `pid`, stopped with the thread running `focus` inside
/// the vDSO at `[start, end)`; the process stays stopped.
fn caught_in_vdso(pid: u32, focus: &str, (start, end): (u64, u64)) -> Vec<ThreadTruth> {
    for attempt in 0..ATTEMPTS {
        stop(pid);
        let threads = gdb::truth(pid);
        let inside = threads.iter().any(|t| {
            t.has(focus)
                && t.physical()
                    .first()
                    .is_some_and(|f| (start..end).contains(&f.pc))
        });
        if inside {
            eprintln!("caught inside the vDSO at try {}", attempt + 1);
            return threads;
        }
        signal(pid, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(1 + attempt as u64 % 7));
    }
    panic!("the thread running {focus} was never inside the vDSO in {ATTEMPTS} tries");
}

/// gdb, `eim stack`, gdb on `scenario` stopped inside the vDSO.
fn inside_the_vdso(test: &str, scenario: &'static str, backend: Backend) {
    let program = Program::C(scenario);
    if !program.available() || !gdb_and_root(test) {
        return;
    }
    if backend == Backend::Kernel && !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = serial();
    let running = Running::start(program);
    let pid = running.pid();
    let vdso = vdso_of(pid);
    let focus = "clock_inner";
    let before = caught_in_vdso(pid, focus, vdso);
    let stacks = eim_stack::stacks(pid, backend);
    let after = gdb::truth(pid);
    let maps = maps::mappings(pid);
    signal(pid, libc::SIGCONT);
    // Names: the vDSO exports each function under two names at one
    // address (below); chain.c's other frames are named in main.rs's
    // comparisons.
    truth::assert_matches(&before, &after, &stacks, &maps, focus, false);
    // The rule lets a walk stop at a PC outside every file mapping (the
    // vDSO was one); a loaded vDSO must not stop it.
    let gdb_thread = before.iter().find(|t| t.has(focus)).expect("focus");
    let eim_thread = stacks
        .threads
        .iter()
        .find(|t| t.tid == gdb_thread.tid)
        .expect("eim's stack of the thread");
    let (start, end) = vdso;
    assert!(
        eim_thread
            .frames
            .first()
            .is_some_and(|f| (start..end).contains(&f.pc)),
        "eim's frame 0 is in the vDSO: {eim_thread:#?}"
    );
    // Named as gdb names it: the file `[vdso]`, the function by the
    // vDSO's own symbols (it exports each under two names, `f` and
    // `__vdso_f`, at one address: either is the function).
    let frame0 = &eim_thread.frames[0];
    assert_eq!(frame0.file.as_deref(), Some("[vdso]"), "{frame0:#?}");
    let plain = |n: &str| n.trim_start_matches("__vdso_").to_string();
    let gdb_name = gdb_thread.physical()[0].name.clone();
    assert!(
        gdb_name.is_some(),
        "gdb names the vDSO's function: {gdb_thread:#?}"
    );
    assert_eq!(
        frame0.symbol.as_deref().map(plain),
        gdb_name.as_deref().map(plain),
        "{frame0:#?}"
    );
    assert_eq!(
        (eim_thread.stop.as_str(), eim_thread.frames.len()),
        ("end", gdb_thread.physical().len()),
        "eim walks out of the vDSO to gdb's outermost frame: {eim_thread:#?}"
    );
}

#[test]
fn clock_gettime_sim() {
    inside_the_vdso("vdso_clock_gettime_sim", "clock", Backend::Sim);
}

#[test]
fn clock_gettime_kernel() {
    inside_the_vdso("vdso_clock_gettime_kernel", "clock", Backend::Kernel);
}

#[test]
fn gettimeofday_sim() {
    inside_the_vdso("vdso_gettimeofday_sim", "tod", Backend::Sim);
}

#[test]
fn gettimeofday_kernel() {
    inside_the_vdso("vdso_gettimeofday_kernel", "tod", Backend::Kernel);
}
