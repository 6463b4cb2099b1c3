//! The user-space twin and the BPF unwinder are one algorithm (issue 19,
//! item 5): fed the same registers and the same stack memory, over the
//! same tables, they give the same frames and the same stop.
//!
//! The inputs are real: every thread of each test program, stopped, its
//! registers and [`CAPTURE_STACK`] bytes of its stack from SP, over the
//! tables a host step loaded into the simulated kernel (the twin's) and
//! into real kernel maps (the capture program's, `BPF_PROG_TEST_RUN`).
//! Then the same captures damaged by a seeded generator (words of the
//! stack replaced by addresses of code, of the stack, or garbage; the
//! stack cut short), which drive both through their error paths, and the
//! same captures walked with the arm64 rules.

use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicBool;

use eim::bpf::KernelMaps;
use eim::host::scan::{Host, HostConfig, Quiet};
use eim::sim::{SimConfig, SimMaps, SimReader};
use eim::stack::freeze::Frozen;
use eim::stack::regs::thread_regs;
use eim::unwind::{unwind, Arch, Capture, Stack, CAPTURE_STACK};
use eim_test_support::rng::XorShift;

use crate::programs::{Program, Running};

/// Damaged copies of each capture.
const VARIANTS: u64 = 48;

fn host_config(pid: u32) -> HostConfig {
    HostConfig {
        only: Some([pid as i32].into_iter().collect()),
        ..HostConfig::default()
    }
}

/// Each thread's registers and stack, read while the process is stopped.
fn captures(pid: u32) -> Vec<Capture> {
    let frozen = Frozen::process(pid as i32).expect("stopped");
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("its memory");
    let captures = frozen
        .tids()
        .filter_map(|tid| {
            let regs = thread_regs(tid).ok()?;
            let mut stack = vec![0u8; CAPTURE_STACK];
            // Up to the end of the stack mapping: a short read is the rest.
            let got = read_some(&mem, &mut stack, regs.sp);
            stack.truncate(got);
            Some(Capture {
                regs,
                pid,
                tid: tid as u32,
                stack_base: regs.sp,
                stack,
            })
        })
        .collect();
    drop(frozen);
    captures
}

fn read_some(file: &std::fs::File, buf: &mut [u8], at: u64) -> usize {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => done += n,
        }
    }
    done
}

/// A copy of `c` with some stack words replaced and maybe cut short.
fn damaged(c: &Capture, code: &[u64], rng: &mut XorShift) -> Capture {
    let mut out = c.clone();
    let words = out.stack.len() / 8;
    if words == 0 {
        return out;
    }
    // Mostly in the first frames, where the walk reads.
    let span = words.min(512) as u64;
    for _ in 0..1 + rng.next_u64() % 6 {
        let at = (rng.next_u64() % span) as usize * 8;
        let value = match rng.next_u64() % 4 {
            0 => code[(rng.next_u64() % code.len() as u64) as usize] + rng.next_u64() % 64,
            1 => c.stack_base + (rng.next_u64() % (span * 8)),
            2 => 0,
            _ => rng.next_u64(),
        };
        out.stack[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    if rng.next_u64().is_multiple_of(4) {
        let keep = (rng.next_u64() % (words as u64 + 1)) as usize * 8;
        out.stack.truncate(keep);
    }
    out
}

fn walk_twin(sim: &SimMaps, c: &Capture) -> Stack {
    unwind(c.pid, c.tid, c.regs, &SimReader::new(sim), c, sim)
}

fn check(program: Program, test: &str) {
    if !program.available() || !eim::bpf::probe::require_bpf(test) {
        return;
    }
    let _one = crate::serial();
    let running = Running::start(program);
    let pid = running.pid();
    let mut sim = Host::new(
        SimMaps::new(SimConfig::default()).expect("sim maps"),
        host_config(pid),
    );
    let mut kernel = Host::new(KernelMaps::new().expect("kernel maps"), host_config(pid));
    let stop = AtomicBool::new(false);
    sim.step(&stop, &mut Quiet).expect("sim step");
    kernel.step(&stop, &mut Quiet).expect("kernel step");
    let sim_maps = sim.with_backend(|m| m.clone());
    let entry = sim_maps.process(pid).expect("the process's mappings");
    assert_eq!(
        kernel.with_backend(|k| k.dump().expect("dump").process_mappings.get(&pid).cloned()),
        Some(entry.clone()),
        "both backends hold the same mappings"
    );
    let code: Vec<u64> = entry.mappings.iter().map(|m| m.start).collect();
    let captures = captures(pid);
    assert!(!captures.is_empty(), "threads of {pid}");
    // A fixed seed: the same damage every run (a pid-derived one made the
    // error paths reached vary from run to run).
    let mut rng = XorShift::new(0x5eed_0fd1_ffe4_e701);
    let mut compared = 0;
    let mut stops = std::collections::BTreeSet::new();
    for c in &captures {
        let mut inputs = vec![c.clone()];
        inputs.extend((0..VARIANTS).map(|_| damaged(c, &code, &mut rng)));
        let mut arm = c.clone();
        arm.regs.arch = Arch::Arm64;
        arm.regs.lr = code.first().copied().unwrap_or(0) + 0x10;
        inputs.push(arm);
        for input in &inputs {
            let twin = walk_twin(&sim_maps, input);
            let bpf = kernel
                .manager()
                .with_backend(|timed| timed.inner.unwind_capture(input))
                .expect("capture program");
            assert_eq!(
                twin,
                bpf,
                "twin and BPF disagree on thread {} (arch {:?}, {} stack bytes)",
                input.tid,
                input.regs.arch,
                input.stack.len()
            );
            stops.insert(twin.stop.name());
            compared += 1;
        }
    }
    // The undamaged captures of a stopped program walk to the end (what
    // the gdb comparison checks in detail); the damage reaches other stops.
    assert!(stops.contains("end"), "{stops:?}");
    // At least one error path on every program (which ones depends on the
    // layout of its memory; the six programs together reach six stops).
    assert!(
        stops.len() >= 2,
        "the damage reaches an error path: {stops:?}"
    );
    eprintln!("{test}: {compared} captures agree; stops {stops:?}");
}

#[test]
fn twin_and_bpf_agree_on_the_c_chain() {
    check(Program::C("chain"), "differential_chain");
}

#[test]
fn twin_and_bpf_agree_on_a_signal_frame() {
    check(Program::C("signal"), "differential_signal");
}

#[test]
fn twin_and_bpf_agree_on_the_recursion() {
    check(Program::C("recurse"), "differential_recurse");
}

#[test]
fn twin_and_bpf_agree_on_rust() {
    check(Program::Rust, "differential_rust");
}

#[test]
fn twin_and_bpf_agree_on_go() {
    check(Program::Go, "differential_go");
}

#[test]
fn twin_and_bpf_agree_on_python() {
    check(Program::Python, "differential_python");
}
