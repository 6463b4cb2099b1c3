//! Kernel tests of the BPF native unwinder (`bpf/unwinder.h`): root or
//! CAP_BPF, a loud SKIPPED otherwise, a failure under `EIM_REQUIRE_BPF=1`.
//!
//! * captures: a hand-made delta table for one file, one process mapping
//!   it, and stack memory built by hand, walked by the capture program
//!   (`BPF_PROG_TEST_RUN`); every rule kind, command and stop reason of
//!   x86-64 and arm64 is reached and its frames checked against addresses
//!   the test planted in the memory;
//! * the task iterator over this test's own threads parked in a syscall
//!   (one stack per thread, the first PC the thread's own as /proc says,
//!   its mapping found) and over a kernel thread;
//! * the profiler on a busy child, and its kernel stacks (of dd in read and write).

use eim_bpf::sampler::{Sample, Sampling};
use eim_bpf::KernelMaps;
use eim_machine::abi::{
    encoded_command, opcode, ProcessMapping, ProcessMappings, StackDelta, StackDeltaPageInfo,
    StackDeltaPageKey, UnwindInfo,
};
use eim_machine::ops::{Backend, MapOp};
use eim_machine::unwind::{frame_flag, Arch, Capture, Regs, Stack, StopReason, MAX_FRAMES};
use eim_machine::FileId;

fn require_bpf(test: &str) -> bool {
    eim_bpf::probe::require_bpf(test)
}

const FILE: FileId = FileId(0x5eed_f11e);
const PID: u32 = 4242;
/// The file is mapped at [MAP_START, MAP_END), ELF address = pc - BIAS.
const BIAS: u64 = 0x40_0000;
const MAP_START: u64 = 0x40_1000;
const MAP_END: u64 = 0x40_2000;

// Each region of the file's text, and the rule its delta gives.
const A_SP16: u64 = 0x1000; // CFA = SP + 16
const B_FP: u64 = 0x1100; // CFA = FP + 16, FP restored from CFA - 16
const M_MERGED: u64 = 0x1200; // CFA = SP + 8, + 8 from 4 bytes in
const D_DEREF: u64 = 0x1300; // CFA = *(SP + 8) + 8
const PLT: u64 = 0x1400;
const SIGNAL: u64 = 0x1500;
const FRAME_POINTER: u64 = 0x1600;
const STOP: u64 = 0x1700;
const INVALID: u64 = 0x1800;
const R_SP8: u64 = 0x1900; // CFA = SP + 8
const L_LEAF: u64 = 0x1a00; // arm64: CFA = SP, return address in LR
const C_ARM: u64 = 0x1b00; // arm64: CFA = SP + 16, return address at CFA - 8

/// The process address of ELF address `addr`.
fn pc(addr: u64) -> u64 {
    addr + BIAS
}

fn merged(mut info: UnwindInfo, merge: u8) -> UnwindInfo {
    info.merge_opcode = merge;
    info
}

/// KernelMaps holding the table above for FILE, and PID mapping it.
fn kernel() -> KernelMaps {
    let mut k = KernelMaps::new().expect("KernelMaps");
    load_table(&mut k);
    k
}

/// Writes the table above for FILE, and PID mapping it, into `k`.
fn load_table(k: &mut KernelMaps) {
    let rules: [(u64, Result<UnwindInfo, u16>); 13] = [
        (A_SP16, Ok(UnwindInfo::new(opcode::BASE_SP, 16, 0, 0))),
        (
            B_FP,
            Ok(UnwindInfo::new(opcode::BASE_FP, 16, opcode::BASE_CFA, -16)),
        ),
        (
            M_MERGED,
            Ok(merged(UnwindInfo::new(opcode::BASE_SP, 8, 0, 0), 4)),
        ),
        (
            D_DEREF,
            // pre-deref 8, post-deref 1 * 8
            Ok(UnwindInfo::new(
                opcode::BASE_SP | opcode::FLAG_DEREF,
                8 | 1,
                0,
                0,
            )),
        ),
        (PLT, Err(encoded_command::PLT)),
        (SIGNAL, Err(encoded_command::SIGNAL)),
        (FRAME_POINTER, Err(encoded_command::FRAME_POINTER)),
        (STOP, Err(encoded_command::STOP)),
        (INVALID, Err(encoded_command::INVALID)),
        (R_SP8, Ok(UnwindInfo::new(opcode::BASE_SP, 8, 0, 0))),
        (
            L_LEAF,
            Ok(UnwindInfo::new(opcode::BASE_SP, 0, opcode::BASE_LR, 0)),
        ),
        (
            C_ARM,
            Ok(UnwindInfo::new(opcode::BASE_SP, 16, opcode::BASE_CFA, -8)),
        ),
        (0x1c00, Err(encoded_command::INVALID)),
    ];
    let mut infos = Vec::new();
    let mut deltas = Vec::new();
    for (slot, (addr, rule)) in (1u16..).zip(rules) {
        let unwind_info = match rule {
            Ok(info) => {
                infos.push((slot, info));
                slot
            }
            Err(command) => command,
        };
        deltas.push(StackDelta {
            addr_low: addr as u16,
            unwind_info,
        });
    }
    let ops = [
        MapOp::PutUnwindInfos(infos),
        MapOp::PutDeltaTable {
            file_id: FILE,
            map_id: 8,
            deltas: deltas.clone().into(),
        },
        MapOp::PutPages(vec![(
            StackDeltaPageKey {
                file_id: FILE.0,
                page: 0,
            },
            StackDeltaPageInfo {
                first_delta: 0,
                num_deltas: deltas.len() as u16,
                map_id: 8,
            },
        )]),
    ];
    let mappings = ProcessMappings {
        mappings: vec![
            // A neighbour below, so the bisection has more than one to search.
            ProcessMapping {
                start: 0x1000,
                end: 0x2000,
                file_offset: 0,
                bias: 0,
                file_id: 77,
            },
            ProcessMapping {
                start: MAP_START,
                end: MAP_END,
                file_offset: 0x1000,
                bias: BIAS,
                file_id: FILE.0,
            },
        ],
    };
    let put = MapOp::PutProcessMappings {
        pid: PID,
        mappings: mappings.into(),
    };
    for op in ops.iter().chain([&put]) {
        assert_eq!(k.apply(op), Ok(()), "{op:?}");
    }
}

/// Stack memory under construction: u64s planted at addresses.
struct Memory {
    base: u64,
    bytes: Vec<u8>,
}

const STACK_BASE: u64 = 0x7ff0_0000;

impl Memory {
    fn new(len: usize) -> Self {
        Self {
            base: STACK_BASE,
            bytes: vec![0; len],
        }
    }

    fn put(&mut self, addr: u64, value: u64) -> &mut Self {
        let at = (addr - self.base) as usize;
        self.bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        self
    }

    fn capture(&self, regs: Regs) -> Capture {
        Capture {
            regs,
            pid: PID,
            tid: PID + 1,
            stack_base: self.base,
            stack: self.bytes.clone(),
        }
    }
}

fn regs(arch: Arch, pc: u64, sp: u64, fp: u64) -> Regs {
    Regs {
        pc,
        sp,
        fp,
        ..Regs::zero(arch)
    }
}

fn unwind(k: &mut KernelMaps, capture: &Capture) -> Stack {
    let stack = k.unwind_capture(capture).expect("unwind_capture");
    assert_eq!((stack.pid, stack.tid), (capture.pid, capture.tid));
    stack
}

fn pcs(stack: &Stack) -> Vec<u64> {
    stack.frames.iter().map(|f| f.pc).collect()
}

#[test]
fn x86_rules_chain_through_every_kind_of_cfa_to_the_stop() {
    if !require_bpf("unwind: x86 rule chain") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE + 0x100;
    let f = STACK_BASE + 0x200; // B's frame: fp points here
    let f2 = STACK_BASE + 0x400; // the frame-pointer command's pair
    let p = STACK_BASE + 0x300; // where D's dereference points
    let mut m = Memory::new(0x1000);
    m.put(s + 8, pc(B_FP) + 0x10) // A: CFA = s + 16
        .put(f, f2) // B: fp restored from CFA - 16 = f
        .put(f + 8, pc(M_MERGED) + 6) // B: CFA = f + 16; looked up at +5: merged, SP + 16
        .put(f + 16 + 8, pc(D_DEREF) + 0x10) // M: CFA = (f + 16) + 16
        .put(f + 32 + 8, p) // D: CFA = *(sp + 8) + 8 = p + 8
        .put(p, pc(FRAME_POINTER) + 0x10)
        .put(f2, 0x1234) // FRAME_POINTER: fp = [fp], pc = [fp + 8]
        .put(f2 + 8, pc(STOP) + 0x10);
    let stack = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(A_SP16) + 0x10, s, f)),
    );
    assert_eq!(stack.stop, StopReason::End, "{stack:#x?}");
    assert_eq!(
        pcs(&stack),
        [
            pc(A_SP16) + 0x10,
            pc(B_FP) + 0x10,
            pc(M_MERGED) + 6,
            pc(D_DEREF) + 0x10,
            pc(FRAME_POINTER) + 0x10,
            pc(STOP) + 0x10,
        ]
    );
    for (i, frame) in stack.frames.iter().enumerate() {
        assert_eq!(frame.file_id, FILE.0);
        assert_eq!(frame.address, frame.pc - BIAS);
        let want = if i == 0 {
            0
        } else {
            frame_flag::RETURN_ADDRESS
        };
        assert_eq!(frame.flags, want, "frame {i}");
    }
}

#[test]
fn merge_adjustment_applies_from_its_distance_on() {
    if !require_bpf("unwind: merge opcode") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE + 0x100;
    let mut m = Memory::new(0x200);
    // Below the distance the CFA is SP + 8 (return address at s), from it
    // on SP + 16 (at s + 8); the other slot holds 0, a ZERO_PC stop.
    m.put(s, pc(STOP) + 1);
    let near = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(M_MERGED) + 3, s, 0)),
    );
    assert_eq!(near.stop, StopReason::End, "{near:#x?}");
    assert_eq!(pcs(&near), [pc(M_MERGED) + 3, pc(STOP) + 1]);
    let far = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(M_MERGED) + 4, s, 0)),
    );
    assert_eq!(far.stop, StopReason::ZeroPc, "{far:#x?}");
    assert_eq!(pcs(&far), [pc(M_MERGED) + 4]);
}

#[test]
fn plt_cfa_depends_on_where_in_the_stub() {
    if !require_bpf("unwind: PLT") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE + 0x100;
    let mut m = Memory::new(0x200);
    m.put(s, pc(STOP) + 1).put(s + 8, pc(STOP) + 2);
    for (offset, next) in [(4, pc(STOP) + 1), (10, pc(STOP) + 1), (11, pc(STOP) + 2)] {
        let stack = unwind(
            &mut k,
            &m.capture(regs(Arch::X86_64, pc(PLT) + offset, s, 0)),
        );
        assert_eq!(stack.stop, StopReason::End, "{stack:#x?}");
        assert_eq!(pcs(&stack), [pc(PLT) + offset, next], "pc & 15 = {offset}");
    }
    // arm64 has no PLT rule.
    let arm = unwind(&mut k, &m.capture(regs(Arch::Arm64, pc(PLT) + 4, s, 0)));
    assert_eq!(arm.stop, StopReason::Unsupported);
    assert_eq!(pcs(&arm), [pc(PLT) + 4]);
}

#[test]
fn x86_signal_frame_restores_registers_and_the_next_lookup_is_exact() {
    if !require_bpf("unwind: x86 signal frame") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE + 0x100;
    let s2 = STACK_BASE + 0x400;
    let mctx = s + 40;
    let mut m = Memory::new(0x800);
    // The interrupted PC is A's first byte: looked up at pc - 1 it would be
    // before the file's first delta (no delta), exactly it is SP + 16.
    m.put(mctx + 16 * 8, pc(A_SP16))
        .put(mctx + 15 * 8, s2)
        .put(s2 + 8, pc(STOP) + 8);
    let stack = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(SIGNAL) + 0x10, s, 0)),
    );
    assert_eq!(stack.stop, StopReason::End, "{stack:#x?}");
    assert_eq!(pcs(&stack), [pc(SIGNAL) + 0x10, pc(A_SP16), pc(STOP) + 8]);
    let flags: Vec<u32> = stack.frames.iter().map(|f| f.flags).collect();
    assert_eq!(flags, [0, frame_flag::SIGNAL, frame_flag::RETURN_ADDRESS]);
}

#[test]
fn arm64_signal_frame_then_leaf_lr_rule_with_pac_bits_cleared() {
    if !require_bpf("unwind: arm64 signal frame") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE + 0x100;
    let sigctx = s + 312;
    let mut m = Memory::new(0x800);
    m.put(sigctx + 32 * 8, pc(L_LEAF) + 0x10)
        .put(sigctx + 31 * 8, STACK_BASE + 0x700)
        .put(sigctx + 30 * 8, 0x007f_0000_0000_0000 | (pc(STOP) + 4));
    let stack = unwind(
        &mut k,
        &m.capture(regs(Arch::Arm64, pc(SIGNAL) + 0x10, s, 0)),
    );
    assert_eq!(stack.stop, StopReason::End, "{stack:#x?}");
    assert_eq!(
        pcs(&stack),
        [pc(SIGNAL) + 0x10, pc(L_LEAF) + 0x10, pc(STOP) + 4]
    );
    assert_eq!(stack.frames[1].flags, frame_flag::SIGNAL);
}

#[test]
fn arm64_lr_rule_past_the_first_frame_stops() {
    if !require_bpf("unwind: arm64 LR mid-trace") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE + 0x100;
    let mut m = Memory::new(0x200);
    // C: CFA = s + 16, return address at CFA - 8, into the LR-rule region.
    m.put(s + 8, pc(L_LEAF) + 0x20);
    let mut r = regs(Arch::Arm64, pc(C_ARM) + 0x10, s, 0);
    // (A return address is looked up one byte before: STOP's first byte
    // would be in the frame-pointer region.)
    r.lr = pc(STOP) + 1;
    let stack = unwind(&mut k, &m.capture(r));
    assert_eq!(stack.stop, StopReason::LrMidTrace, "{stack:#x?}");
    assert_eq!(pcs(&stack), [pc(C_ARM) + 0x10, pc(L_LEAF) + 0x20]);
    // In the first frame the same rule takes LR (an LR of 0 names no
    // return address: a read error, as upstream's ERR_NATIVE_PC_READ).
    let leaf = unwind(&mut k, &m.capture(regs(Arch::Arm64, pc(L_LEAF), s, 0)));
    assert_eq!(leaf.stop, StopReason::ReadError, "{leaf:#x?}");
    let leaf = unwind(&mut k, &m.capture(r_with_pc(r, pc(L_LEAF))));
    assert_eq!(pcs(&leaf), [pc(L_LEAF), pc(STOP) + 1]);
    assert_eq!(leaf.stop, StopReason::End);
}

fn r_with_pc(r: Regs, pc: u64) -> Regs {
    Regs { pc, ..r }
}

#[test]
fn stops_invalid_unknown_mapping_no_delta_and_zero_pc() {
    if !require_bpf("unwind: stop reasons") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE + 0x100;
    let m = Memory::new(0x200);
    let x86 = |pc| m.capture(regs(Arch::X86_64, pc, s, 0));

    let invalid = unwind(&mut k, &x86(pc(INVALID) + 1));
    assert_eq!(
        (invalid.stop, pcs(&invalid)),
        (StopReason::Invalid, vec![pc(INVALID) + 1])
    );

    let unknown = unwind(&mut k, &x86(0x90_0000));
    assert_eq!(unknown.stop, StopReason::UnknownMapping);
    assert_eq!(
        (
            unknown.frames[0].pc,
            unknown.frames[0].file_id,
            unknown.frames[0].address
        ),
        (0x90_0000, 0, 0)
    );
    let mut other_pid = x86(pc(STOP));
    other_pid.pid = PID + 100;
    assert_eq!(unwind(&mut k, &other_pid).stop, StopReason::UnknownMapping);

    // The neighbour mapping's file has no deltas at all.
    let no_page = unwind(&mut k, &x86(0x1800));
    assert_eq!(no_page.stop, StopReason::NoDelta(1), "{no_page:#x?}");
    assert_eq!(
        (no_page.frames[0].file_id, no_page.frames[0].address),
        (77, 0x1800)
    );

    // A return address at the first byte of the file's first delta is
    // looked up one byte before it, where no delta is in force.
    let mut before = x86(pc(A_SP16));
    before.regs.return_address = true;
    let stack = unwind(&mut k, &before);
    assert_eq!(stack.stop, StopReason::NoDelta(4), "{stack:#x?}");
    assert_eq!(stack.frames[0].flags, frame_flag::RETURN_ADDRESS);

    let zero = unwind(&mut k, &x86(0));
    assert_eq!((zero.stop, zero.frames.len()), (StopReason::ZeroPc, 0));
}

#[test]
fn reads_outside_the_capture_fail() {
    if !require_bpf("unwind: read error") {
        return;
    }
    let mut k = kernel();
    let m = Memory::new(0x100);
    // A's CFA is sp + 16: the return address at sp + 8 is past the copy.
    let past = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(A_SP16) + 1, STACK_BASE + 0xf8, 0)),
    );
    assert_eq!(past.stop, StopReason::ReadError, "{past:#x?}");
    assert_eq!(pcs(&past), [pc(A_SP16) + 1]);
    // The same read inside the copy succeeds.
    let inside = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(A_SP16) + 1, STACK_BASE + 0xf0, 0)),
    );
    assert_eq!(inside.stop, StopReason::ZeroPc, "{inside:#x?}");
    // Below the copy too.
    let below = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(A_SP16) + 1, STACK_BASE - 0x10, 0)),
    );
    assert_eq!(below.stop, StopReason::ReadError);
    // The frame-pointer command reading at fp outside.
    let fp = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(FRAME_POINTER), STACK_BASE, 0x10)),
    );
    assert_eq!(fp.stop, StopReason::ReadError);
}

#[test]
fn a_self_loop_ends_at_the_frame_budget() {
    if !require_bpf("unwind: budget") {
        return;
    }
    let mut k = kernel();
    let s = STACK_BASE;
    let mut m = Memory::new(0x1000);
    for i in 0..0x200 {
        m.put(s + 8 * i, pc(R_SP8) + 0x10);
    }
    let stack = unwind(
        &mut k,
        &m.capture(regs(Arch::X86_64, pc(R_SP8) + 0x10, s, 0)),
    );
    assert_eq!(stack.stop, StopReason::Budget);
    assert_eq!(stack.frames.len(), MAX_FRAMES);
    assert!(stack.frames.iter().all(|f| f.pc == pc(R_SP8) + 0x10));
    // One frame fewer of memory: the 128th frame's read fails instead.
    let mut short = Memory::new(8 * (MAX_FRAMES - 1));
    for i in 0..(MAX_FRAMES as u64 - 1) {
        short.put(s + 8 * i, pc(R_SP8) + 0x10);
    }
    let stack = unwind(
        &mut k,
        &short.capture(regs(Arch::X86_64, pc(R_SP8) + 0x10, s, 0)),
    );
    assert_eq!(stack.stop, StopReason::ReadError);
    assert_eq!(stack.frames.len(), MAX_FRAMES);
}

/// The PC and SP of thread `tid` of this process, blocked in a syscall
/// (`/proc/self/task/TID/syscall`: number, six arguments, sp, pc).
fn syscall_pc_sp(tid: u32) -> (u64, u64) {
    let path = format!("/proc/self/task/{tid}/syscall");
    let text = std::fs::read_to_string(&path).unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words.len(), 9, "{path}: {text}");
    let hex = |w: &str| u64::from_str_radix(w.trim_start_matches("0x"), 16).unwrap();
    (hex(words[8]), hex(words[7]))
}

/// The mapping of this process containing `pc` (from /proc/self/maps).
fn own_mapping(pc: u64) -> (u64, u64) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find_map(|line| {
            let (range, _) = line.split_once(' ')?;
            let (start, end) = range.split_once('-')?;
            let (start, end) = (
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            );
            (start <= pc && pc < end).then_some((start, end))
        })
        .unwrap_or_else(|| panic!("{pc:#x} is in no mapping of /proc/self/maps"))
}

#[test]
fn the_task_iterator_walks_each_thread_from_its_own_registers() {
    if !require_bpf("unwind: task iterator") {
        return;
    }
    let mut k = kernel();
    let me = std::process::id();
    // Three threads parked in a syscall (futex) until told to go.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let rx = rx.clone();
            let tid_tx = tid_tx.clone();
            std::thread::spawn(move || {
                tid_tx.send(gettid()).unwrap();
                // Blocks in futex until the test drops its sender.
                let _ = rx.lock().map(|r| r.recv());
            })
        })
        .collect();
    let tids: Vec<u32> = (0..3).map(|_| tid_rx.recv().unwrap()).collect();
    // Until each thread waits in futex (a fixed pause could end first on a
    // loaded machine).
    let in_futex = |tid: u32| {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
            .is_ok_and(|s| s.split_whitespace().next() == Some(&libc::SYS_futex.to_string()))
    };
    assert!(
        eim_test_support::wait_for(std::time::Duration::from_secs(30), || tids
            .iter()
            .all(|&t| in_futex(t))),
        "the threads never all waited in futex"
    );

    // The first thread's PC is in some mapping: name it a followed file
    // with no deltas, to see the mapping found in the kernel.
    let (pc0, _) = syscall_pc_sp(tids[0]);
    let (start, end) = own_mapping(pc0);
    let own = ProcessMappings {
        mappings: vec![ProcessMapping {
            start,
            end,
            file_offset: 0,
            bias: start,
            file_id: 99,
        }],
    };
    k.apply(&MapOp::PutProcessMappings {
        pid: me,
        mappings: own.into(),
    })
    .unwrap();

    let stacks = k.task_stacks(me).expect("task_stacks");
    let mut seen = std::collections::BTreeSet::new();
    for stack in &stacks {
        assert_eq!(stack.pid, me);
        assert!(
            seen.insert(stack.tid),
            "two stacks for thread {}",
            stack.tid
        );
    }
    for tid in &tids {
        let stack = stacks
            .iter()
            .find(|s| s.tid == *tid)
            .unwrap_or_else(|| panic!("no stack for thread {tid}: {stacks:#x?}"));
        let (pc, _) = syscall_pc_sp(*tid);
        let first = stack.frames[0];
        assert_eq!(first.pc, pc, "thread {tid}: {stack:#x?}");
        // In a syscall: the PC is a return address.
        assert_eq!(first.flags, frame_flag::RETURN_ADDRESS);
        if (start..end).contains(&pc) {
            assert_eq!((first.file_id, first.address), (99, pc - start));
            // The file has no deltas: the page lookup fails.
            assert_eq!(stack.stop, StopReason::NoDelta(1), "{stack:#x?}");
            assert_eq!(stack.frames.len(), 1);
        }
    }
    drop(tx);
    for t in threads {
        t.join().unwrap();
    }

    // kthreadd: a kernel thread, no user registers.
    let kernel_threads = k.task_stacks(2).expect("task_stacks(2)");
    assert_eq!(kernel_threads.len(), 1, "{kernel_threads:?}");
    assert_eq!(kernel_threads[0].stop, StopReason::NoRegs);
    assert!(kernel_threads[0].frames.is_empty());
    // No such process: nothing.
    assert!(k.task_stacks(u32::MAX - 1).unwrap().is_empty());
}

/// The calling thread's id, without a libc dependency in this test.
fn gettid() -> u32 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .expect("/proc/thread-self")
}

/// The executable mappings of process `pid` (/proc/PID/maps, `r-xp`).
fn executable_ranges(pid: u32) -> Vec<(u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter(|line| line.split_whitespace().nth(1) == Some("r-xp"))
        .filter_map(|line| {
            let (start, end) = line.split_once(' ')?.0.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            ))
        })
        .collect()
}

/// Samples taken for `for_ms` milliseconds.
fn samples(profiler: &mut eim_bpf::sampler::Profiler, for_ms: u64) -> Vec<Sample> {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(for_ms);
    let mut samples = Vec::new();
    while std::time::Instant::now() < until {
        samples.extend(
            profiler
                .poll(std::time::Duration::from_millis(50), 100_000)
                .unwrap(),
        );
    }
    samples
}

/// The user stacks sampled for `for_ms` milliseconds.
fn sample(profiler: &mut eim_bpf::sampler::Profiler, for_ms: u64) -> Vec<Stack> {
    let taken = samples(profiler, for_ms);
    assert!(
        taken.iter().all(|s| s.kernel.is_empty()),
        "kernel stacks were not asked for"
    );
    taken.into_iter().map(|s| s.stack).collect()
}

/// 999 Hz, user stacks only.
const USER: Sampling = Sampling {
    hz: 999,
    kernel: false,
};

#[test]
fn the_profiler_samples_a_busy_process() {
    use eim_bpf::sampler::{ProfileTarget, Profiler};
    if !require_bpf("unwind: profiler") {
        return;
    }
    let mut k = kernel();
    let child = Child(
        std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let code = executable_ranges(pid);

    let mut all = Profiler::start(&mut k, &ProfileTarget::All, USER).expect("profiler");
    let stacks = sample(&mut all, 1000);
    assert_eq!(all.lost().unwrap(), 0);
    assert_eq!(all.undecoded(), 0);
    all.stop();
    let busy: Vec<&Stack> = stacks.iter().filter(|s| s.pid == pid).collect();
    // A CPU-bound process at 999 Hz for a second: hundreds of samples.
    assert!(
        busy.len() >= 100,
        "{} samples of {pid} among {}",
        busy.len(),
        stacks.len()
    );
    for stack in &busy {
        assert_eq!(stack.tid, pid);
        // No mappings are followed for it: the first PC, its own, stops it.
        assert_eq!(stack.stop, StopReason::UnknownMapping);
        assert_eq!(stack.frames.len(), 1);
        let pc = stack.frames[0].pc;
        assert!(
            code.iter().any(|(s, e)| (*s..*e).contains(&pc)),
            "{pc:#x} is not in an executable mapping of {pid}"
        );
    }

    // Only the named process.
    let mut one = Profiler::start(&mut k, &ProfileTarget::Pids(vec![pid]), USER).unwrap();
    let stacks = sample(&mut one, 500);
    drop(one);
    assert!(stacks.len() >= 50, "{} samples", stacks.len());
    assert!(stacks.iter().all(|s| s.pid == pid));

    // Detached: nothing more arrives.
    let mut again =
        Profiler::start(&mut k, &ProfileTarget::Pids(vec![u32::MAX - 1]), USER).unwrap();
    assert!(sample(&mut again, 300).is_empty());
}

#[test]
fn kernel_stacks_come_with_the_samples_that_interrupted_the_kernel_when_asked() {
    use eim_bpf::sampler::{ProfileTarget, Profiler};
    if !require_bpf("unwind: profiler, kernel stacks") {
        return;
    }
    let mut k = kernel();
    // dd copying /dev/zero to /dev/null lives in read() and write().
    let child = Child(
        std::process::Command::new("dd")
            .args(["if=/dev/zero", "of=/dev/null", "bs=1M"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let target = ProfileTarget::Pids(vec![pid]);
    let with_kernel = Sampling {
        hz: 999,
        kernel: true,
    };
    let mut profiler = Profiler::start(&mut k, &target, with_kernel).unwrap();
    let taken = samples(&mut profiler, 1000);
    assert_eq!(profiler.undecoded(), 0);
    assert_eq!(
        profiler.kernel_failed().0,
        0,
        "{:?}",
        profiler.kernel_failed()
    );
    drop(profiler);
    assert!(taken.len() >= 100, "{} samples of dd", taken.len());
    let in_kernel = taken.iter().filter(|s| !s.kernel.is_empty()).count();
    // x86-64's kernel half: every kernel address is at or above it.
    let kernel_half = 0xffff_8000_0000_0000u64;
    for s in &taken {
        assert!(
            s.kernel.iter().all(|ip| *ip >= kernel_half),
            "a kernel stack outside the kernel: {:x?}",
            s.kernel
        );
    }
    assert!(
        in_kernel * 2 >= taken.len(),
        "{in_kernel} of {} samples of dd carry a kernel stack",
        taken.len()
    );

    // Not asked: the same process, no kernel stacks (`sample` checks).
    let mut profiler = Profiler::start(&mut k, &target, USER).unwrap();
    let stacks = sample(&mut profiler, 500);
    assert_eq!(profiler.undecoded(), 0);
    assert!(stacks.len() >= 50, "{} samples of dd", stacks.len());
}

/// A child process killed when the test ends, passed or failed (a busy
/// loop left behind would take a CPU from everything else).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_pinned_reader_runs_the_unwinder_over_the_pins() {
    use eim_bpf::{KernelConfig, PinnedReader};
    if !require_bpf("unwind: pinned reader") {
        return;
    }
    let root = std::path::Path::new("/sys/fs/bpf");
    if !eim_bpf::bpffs::is_bpffs(root).unwrap_or(false) {
        eim_bpf::bpffs::mount_bpffs(root, true)
            .expect("mounting a bpffs on /sys/fs/bpf")
            .keep();
    }
    let dir = root.join(format!("eim-test-{}-unwind", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut owner = KernelMaps::with_config(KernelConfig {
        pin_dir: Some(dir.clone()),
        ..KernelConfig::default()
    })
    .expect("pinned maps");
    load_table(&mut owner);
    let mut reader = PinnedReader::open(&dir).expect("reader");
    // The owner's table and process mappings, read through the pins.
    let s = STACK_BASE + 0x100;
    let mut m = Memory::new(0x200);
    m.put(s + 8, pc(STOP) + 1);
    let capture = m.capture(regs(Arch::X86_64, pc(A_SP16) + 4, s, 0));
    let stack = reader.unwind_capture(&capture).expect("unwind_capture");
    assert_eq!(stack.stop, StopReason::End, "{stack:#x?}");
    assert_eq!(pcs(&stack), [pc(A_SP16) + 4, pc(STOP) + 1]);
    assert_eq!(stack, owner.unwind_capture(&capture).unwrap());
    let kthreadd = reader.task_stacks(2).expect("task_stacks");
    assert_eq!(kthreadd.len(), 1);
    assert_eq!(kthreadd[0].stop, StopReason::NoRegs);
    drop(reader);
    drop(owner);
    if let Ok(lock) = eim_bpf::lock::lock_file_of(&dir) {
        let _ = std::fs::remove_file(lock);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
