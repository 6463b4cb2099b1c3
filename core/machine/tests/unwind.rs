//! The user-space twin of the native unwinder (`eim_machine::unwind::unwind`)
//! on synthetic tables, mappings and memory: every rule of spec §4.5 on
//! x86-64 and arm64, the frame loop's stops, and properties over random
//! tables and stacks.

use std::cell::RefCell;
use std::collections::HashMap;

use eim_machine::abi::{command, opcode, ProcessMapping, ProcessMappings, UnwindInfo};
use eim_machine::unwind::{
    frame_flag, normalize_pac, unwind, Arch, Frame, Mappings, Memory, Regs, Rule, Rules, Stack,
    StopReason, MAX_FRAMES,
};
use proptest::prelude::*;

const PID: u32 = 4242;
const TID: u32 = 4243;
/// File A is mapped at 0x40_0000 with bias 0x40_0000 (ELF addresses from 0).
const FILE_A: u64 = 0xa;
const A_START: u64 = 0x40_0000;
const A_BIAS: u64 = 0x40_0000;
/// File B is mapped at 0x7f00_0000_0000 with bias 0x7f00_0000_0000 - 0x1000.
const FILE_B: u64 = 0xb;
const B_START: u64 = 0x7f00_0000_0000;
const B_BIAS: u64 = B_START - 0x1000;
const MAP_LEN: u64 = 0x10_0000;

/// Rules per (file, ELF address range); records every address asked.
#[derive(Default)]
struct Table {
    ranges: Vec<(u64, u64, u64, Result<Rule, u32>)>,
    asked: RefCell<Vec<(u64, u64)>>,
}

impl Table {
    fn with(mut self, file: u64, start: u64, end: u64, rule: Result<Rule, u32>) -> Self {
        self.ranges.push((file, start, end, rule));
        self
    }
}

impl Rules for Table {
    fn rule(&self, file_id: u64, address: u64) -> Result<Rule, u32> {
        self.asked.borrow_mut().push((file_id, address));
        self.ranges
            .iter()
            .find(|(f, s, e, _)| *f == file_id && (*s..*e).contains(&address))
            .map_or(Err(1), |(_, _, _, r)| *r)
    }
}

/// Words at exact addresses; every other read fails.
#[derive(Default)]
struct Words {
    words: HashMap<u64, u64>,
    reads: RefCell<Vec<u64>>,
}

impl Words {
    fn put(&mut self, address: u64, value: u64) -> &mut Self {
        self.words.insert(address, value);
        self
    }
    fn put_all(&mut self, address: u64, values: &[u64]) -> &mut Self {
        for (i, v) in values.iter().enumerate() {
            self.put(address + 8 * i as u64, *v);
        }
        self
    }
}

impl Memory for Words {
    fn read_u64(&self, address: u64) -> Option<u64> {
        self.reads.borrow_mut().push(address);
        self.words.get(&address).copied()
    }
}

struct Procs(HashMap<u32, ProcessMappings>);

impl Mappings for Procs {
    fn find(&self, pid: u32, pc: u64) -> Option<ProcessMapping> {
        self.0.get(&pid)?.find(pc).copied()
    }
}

fn procs() -> Procs {
    let mapping = |start: u64, bias: u64, file_id: u64| ProcessMapping {
        start,
        end: start + MAP_LEN,
        file_offset: 0,
        bias,
        file_id,
    };
    let mappings = ProcessMappings {
        mappings: vec![
            mapping(A_START, A_BIAS, FILE_A),
            mapping(B_START, B_BIAS, FILE_B),
        ],
    };
    Procs(HashMap::from([(PID, mappings)]))
}

fn x86(pc: u64, sp: u64, fp: u64) -> Regs {
    Regs {
        pc,
        sp,
        fp,
        ..Regs::zero(Arch::X86_64)
    }
}

fn arm64(pc: u64, sp: u64, fp: u64, lr: u64) -> Regs {
    Regs {
        pc,
        sp,
        fp,
        lr,
        ..Regs::zero(Arch::Arm64)
    }
}

fn run(regs: Regs, table: &Table, memory: &Words) -> Stack {
    unwind(PID, TID, regs, table, memory, &procs())
}

fn info(op: u8, param: i32, fp_op: u8, fp_param: i32) -> Result<Rule, u32> {
    Ok(Rule::Info(UnwindInfo::new(op, param, fp_op, fp_param)))
}

fn cmd(c: i32) -> Result<Rule, u32> {
    Ok(Rule::Command(c as u16))
}

/// A frame of file A at ELF address `address`.
fn frame_a(address: u64, flags: u32) -> Frame {
    Frame {
        pc: A_BIAS + address,
        file_id: FILE_A,
        address,
        flags,
    }
}

fn frame_b(address: u64, flags: u32) -> Frame {
    Frame {
        pc: B_BIAS + address,
        file_id: FILE_B,
        address,
        flags,
    }
}

const RA: u32 = frame_flag::RETURN_ADDRESS;
const SIG: u32 = frame_flag::SIGNAL;

/// The outermost function of file B (at ELF 0x2000..0x2100) stops.
fn with_stop(table: Table) -> Table {
    table.with(FILE_B, 0x2000, 0x2100, Ok(Rule::Stop))
}

// ---- the frame loop ----

#[test]
fn sp_based_cfa_reaches_the_caller_and_looks_it_up_at_minus_one() {
    // f at A:0x100 has CFA = sp + 16; its caller in B returns to B:0x2010.
    let table =
        with_stop(Table::default().with(FILE_A, 0x100, 0x200, info(opcode::BASE_SP, 16, 0, 0)));
    let mut mem = Words::default();
    mem.put(0x1000 + 8, B_BIAS + 0x2010);
    let stack = run(x86(A_BIAS + 0x150, 0x1000, 0x5555), &table, &mem);
    assert_eq!(stack.stop, StopReason::End);
    assert_eq!(stack.pid, PID);
    assert_eq!(stack.tid, TID);
    assert_eq!(stack.frames, vec![frame_a(0x150, 0), frame_b(0x2010, RA)]);
    // The caller's address is recorded as is but looked up one byte earlier.
    assert_eq!(
        *table.asked.borrow(),
        vec![(FILE_A, 0x150), (FILE_B, 0x200f)]
    );
}

#[test]
fn return_address_minus_one_can_select_the_previous_function() {
    // A noreturn call at the end of B:0x1f00..0x2000 returns to B:0x2000,
    // the first byte of the STOP function: the lookup at 0x1fff must see
    // the previous function's rule (here a failure code 4 to tell them apart).
    let table =
        with_stop(Table::default().with(FILE_A, 0x100, 0x200, info(opcode::BASE_SP, 8, 0, 0)))
            .with(FILE_B, 0x1f00, 0x2000, Err(4));
    let mut mem = Words::default();
    mem.put(0x1000, B_BIAS + 0x2000);
    let stack = run(x86(A_BIAS + 0x100, 0x1000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::NoDelta(4));
    assert_eq!(stack.frames[1], frame_b(0x2000, RA));
}

#[test]
fn a_first_frame_in_a_syscall_is_a_return_address() {
    let table = with_stop(Table::default());
    let mut regs = x86(B_BIAS + 0x2001, 0x1000, 0);
    regs.return_address = true;
    let stack = run(regs, &table, &Words::default());
    assert_eq!(stack.frames, vec![frame_b(0x2001, RA)]);
    assert_eq!(*table.asked.borrow(), vec![(FILE_B, 0x2000)]);
    // The same PC not in a syscall is looked up at itself.
    let table = with_stop(Table::default());
    let stack = run(x86(B_BIAS + 0x2000, 0x1000, 0), &table, &Words::default());
    assert_eq!(stack.stop, StopReason::End);
    assert_eq!(stack.frames, vec![frame_b(0x2000, 0)]);
}

#[test]
fn a_first_pc_of_zero_records_nothing() {
    let stack = run(x86(0, 0x1000, 0), &Table::default(), &Words::default());
    assert_eq!(stack.stop, StopReason::ZeroPc);
    assert!(stack.frames.is_empty());
}

#[test]
fn a_caller_pc_of_zero_stops_after_the_frame() {
    let table = Table::default().with(FILE_A, 0x100, 0x200, info(opcode::BASE_SP, 8, 0, 0));
    let mut mem = Words::default();
    mem.put(0x1000, 0);
    let stack = run(x86(A_BIAS + 0x100, 0x1000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::ZeroPc);
    assert_eq!(stack.frames, vec![frame_a(0x100, 0)]);
}

#[test]
fn a_pc_in_no_mapping_is_recorded_with_file_zero() {
    let table = Table::default().with(FILE_A, 0x100, 0x200, info(opcode::BASE_SP, 8, 0, 0));
    let mut mem = Words::default();
    mem.put(0x1000, 0x1234_5678);
    let stack = run(x86(A_BIAS + 0x100, 0x1000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::UnknownMapping);
    let unknown = Frame {
        pc: 0x1234_5678,
        file_id: 0,
        address: 0,
        flags: RA,
    };
    assert_eq!(stack.frames, vec![frame_a(0x100, 0), unknown]);
    // An unknown process: the first frame already.
    let stack = unwind(
        PID + 1,
        TID,
        x86(A_BIAS + 0x100, 0x1000, 0),
        &table,
        &mem,
        &procs(),
    );
    assert_eq!(stack.stop, StopReason::UnknownMapping);
    assert_eq!(stack.frames.len(), 1);
    assert_eq!(stack.frames[0].file_id, 0);
}

#[test]
fn lookup_failures_stop_with_their_code_and_invalid_is_its_own_reason() {
    for (result, stop) in [
        (Err(6), StopReason::Invalid),
        (Err(1), StopReason::NoDelta(1)),
        (Err(3), StopReason::NoDelta(3)),
        (Err(7), StopReason::NoDelta(7)),
        (Ok(Rule::Stop), StopReason::End),
        (cmd(command::STOP), StopReason::End),
    ] {
        let table = Table::default().with(FILE_A, 0, 0x1000, result);
        for regs in [
            x86(A_BIAS + 0x10, 0x1000, 0),
            arm64(A_BIAS + 0x10, 0x1000, 0, 0),
        ] {
            let stack = run(regs, &table, &Words::default());
            assert_eq!(stack.stop, stop, "{result:?} {:?}", regs.arch);
            assert_eq!(stack.frames, vec![frame_a(0x10, 0)]);
        }
    }
}

#[test]
fn a_self_loop_stops_at_the_frame_budget() {
    // FRAME_POINTER with fp pointing at itself: the same frame forever.
    let table = Table::default().with(FILE_A, 0, 0x1000, cmd(command::FRAME_POINTER));
    let mut mem = Words::default();
    mem.put_all(0x2000, &[0x2000, A_BIAS + 0x20]);
    for regs in [
        x86(A_BIAS + 0x10, 0x1000, 0x2000),
        arm64(A_BIAS + 0x10, 0x1000, 0x2000, 0),
    ] {
        let stack = run(regs, &table, &mem);
        assert_eq!(stack.stop, StopReason::Budget);
        assert_eq!(stack.frames.len(), MAX_FRAMES);
        assert_eq!(stack.frames[0], frame_a(0x10, 0));
        assert!(stack.frames[1..].iter().all(|f| *f == frame_a(0x20, RA)));
    }
}

// ---- x86-64 rules ----

#[test]
fn x86_fp_based_cfa_restores_fp_from_the_frame() {
    // push rbp; mov rbp, rsp: CFA = fp + 16, saved fp at CFA - 16.
    let table = with_stop(Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_FP, 16, opcode::BASE_CFA, -16),
    ));
    let mut mem = Words::default();
    mem.put_all(0x3000, &[0x3100, B_BIAS + 0x2050]);
    let stack = run(x86(A_BIAS + 0x120, 0x2f00, 0x3000), &table, &mem);
    assert_eq!(stack.stop, StopReason::End);
    assert_eq!(stack.frames, vec![frame_a(0x120, 0), frame_b(0x2050, RA)]);
    // Reads: the saved fp at CFA - 16, then the return address at CFA - 8.
    assert_eq!(*mem.reads.borrow(), vec![0x3000, 0x3008]);
}

#[test]
fn x86_fp_rule_results_are_visible_to_the_next_frame() {
    // Frame 1 restores fp, frame 2 uses fp: FRAME_POINTER reads at the restored fp.
    let table = Table::default()
        .with(
            FILE_A,
            0x100,
            0x200,
            info(opcode::BASE_SP, 16, opcode::BASE_CFA, -16),
        )
        .with(FILE_A, 0x200, 0x300, cmd(command::FRAME_POINTER));
    let mut mem = Words::default();
    mem.put_all(0x1000, &[0x5000, A_BIAS + 0x250]); // saved fp, return address
    mem.put_all(0x5000, &[0, 0]); // the outermost frame record: pc 0
    let stack = run(x86(A_BIAS + 0x100, 0x1000, 0x9999), &table, &mem);
    assert_eq!(stack.stop, StopReason::ZeroPc);
    assert_eq!(stack.frames, vec![frame_a(0x100, 0), frame_a(0x250, RA)]);
}

#[test]
fn x86_base_fp_cfa_without_fp_rule_clears_fp_but_not_with_deref() {
    // The caller's rule is FRAME_POINTER, so what it reads shows fp after
    // the step: the old fp (0x2ff0) holds a record that loops forever (the
    // budget), fp 0 cannot be read (a read error).
    let mut mem = Words::default();
    mem.put_all(0x2ff0, &[0x2ff0, A_BIAS + 0x250]);
    let regs = x86(A_BIAS + 0x100, 0x2000, 0x2ff0);
    // CFA = fp + 16, no fp rule: fp is cleared.
    let table = Table::default()
        .with(FILE_A, 0x100, 0x200, info(opcode::BASE_FP, 16, 0, 0))
        .with(FILE_A, 0x200, 0x300, cmd(command::FRAME_POINTER));
    let stack = run(regs, &table, &mem);
    assert_eq!(stack.stop, StopReason::ReadError);
    assert_eq!(stack.frames, vec![frame_a(0x100, 0), frame_a(0x250, RA)]);
    // CFA = *(fp) + 16 (BASE_FP|DEREF, post-deref 2 * 8): the whole opcode
    // byte is not BASE_FP, fp is kept.
    let table = Table::default()
        .with(
            FILE_A,
            0x100,
            0x200,
            info(opcode::BASE_FP | opcode::FLAG_DEREF, 2, 0, 0),
        )
        .with(FILE_A, 0x200, 0x300, cmd(command::FRAME_POINTER));
    let stack = run(regs, &table, &mem);
    assert_eq!(stack.stop, StopReason::Budget);
    assert_eq!(stack.frames[1], frame_a(0x250, RA));
}

#[test]
fn x86_deref_cfa_adds_the_post_deref_after_reading() {
    // CFA = *(sp + 8) + 24: param = 8 (pre) | 3 (post 3 * 8).
    let table = with_stop(Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_SP | opcode::FLAG_DEREF, 8 | 3, 0, 0),
    ));
    let mut mem = Words::default();
    mem.put(0x1008, 0x7000);
    mem.put(0x7000 + 24 - 8, B_BIAS + 0x2020);
    let stack = run(x86(A_BIAS + 0x100, 0x1000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::End);
    assert_eq!(stack.frames[1], frame_b(0x2020, RA));
    assert_eq!(*mem.reads.borrow(), vec![0x1008, 0x7010]);
}

#[test]
fn x86_a_failed_deref_gives_cfa_zero_and_a_read_error() {
    let table = Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_SP | opcode::FLAG_DEREF, 8, 0, 0),
    );
    let mem = Words::default();
    let stack = run(x86(A_BIAS + 0x100, 0x1000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::ReadError);
    assert_eq!(stack.frames.len(), 1);
    // No read of CFA - 8 once the CFA is 0.
    assert_eq!(*mem.reads.borrow(), vec![0x1008]);
}

#[test]
fn x86_base_reg_reads_rax_r9_r11_r15_plus_the_shifted_param() {
    for (reg, set) in [
        (0, (|r: &mut Regs, v| r.rax = v) as fn(&mut Regs, u64)),
        (9, |r, v| r.r9 = v),
        (11, |r, v| r.r11 = v),
        (15, |r, v| r.r15 = v),
    ] {
        // CFA = reg + 40: param = (40 << 1) | reg.
        let table = with_stop(Table::default().with(
            FILE_A,
            0x100,
            0x200,
            info(opcode::BASE_REG, (40 << 1) | reg, 0, 0),
        ));
        let mut regs = x86(A_BIAS + 0x100, 0x1000, 0);
        set(&mut regs, 0x6000);
        let mut mem = Words::default();
        mem.put(0x6000 + 40 - 8, B_BIAS + 0x2030);
        let stack = run(regs, &table, &mem);
        assert_eq!(stack.stop, StopReason::End, "r{reg}");
        assert_eq!(stack.frames[1], frame_b(0x2030, RA), "r{reg}");
    }
    // A negative offset: CFA = rax - 16 (param's high bits shifted arithmetically).
    let table = with_stop(Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_REG, (-16 << 1) & !15, 0, 0),
    ));
    let mut regs = x86(A_BIAS + 0x100, 0x1000, 0);
    regs.rax = 0x6010;
    let mut mem = Words::default();
    mem.put(0x6000 - 8, B_BIAS + 0x2030);
    assert_eq!(run(regs, &table, &mem).stop, StopReason::End);
    // Any other register number: CFA 0. DEREF is not applied to BASE_REG.
    for (op, param) in [
        (opcode::BASE_REG, (40 << 1) | 3),
        (opcode::BASE_REG | opcode::FLAG_DEREF, 0),
    ] {
        let table = Table::default().with(FILE_A, 0x100, 0x200, info(op, param, 0, 0));
        let mut regs = x86(A_BIAS + 0x100, 0x1000, 0);
        regs.rax = 0x6008;
        let mut mem = Words::default();
        mem.put(0x6000, B_BIAS + 0x2030);
        mem.put(0x6008, 0x6008);
        let stack = run(regs, &table, &mem);
        let expected = if op == opcode::BASE_REG {
            StopReason::ReadError
        } else {
            StopReason::NoDelta(1)
        };
        assert_eq!(stack.stop, expected, "{op:#x} {param:#x}");
    }
}

#[test]
fn x86_lr_base_and_unknown_bases_give_zero() {
    for op in [opcode::BASE_LR, 6, 0x7f, opcode::COMMAND] {
        let table = Table::default().with(FILE_A, 0x100, 0x200, info(op, 8, 0, 0));
        let mut regs = x86(A_BIAS + 0x100, 0x1000, 0);
        regs.lr = 0x1000;
        let mut mem = Words::default();
        mem.put(0x1000, B_BIAS + 0x2000);
        let stack = run(regs, &table, &mem);
        assert_eq!(stack.stop, StopReason::ReadError, "opcode {op}");
        assert!(mem.reads.borrow().is_empty(), "opcode {op}");
    }
}

#[test]
fn x86_a_failed_saved_fp_read_is_a_read_error() {
    let table = Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_SP, 16, opcode::BASE_CFA, -16),
    );
    let mut mem = Words::default();
    mem.put(0x1008, B_BIAS + 0x2000); // the return address is readable, the saved fp is not
    let stack = run(x86(A_BIAS + 0x100, 0x1000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::ReadError);
    assert_eq!(*mem.reads.borrow(), vec![0x1000]);
}

#[test]
fn x86_plt_cfa_depends_on_the_pc_in_its_16_byte_entry() {
    for (low, cfa_extra) in [(0u64, 0u64), (10, 0), (11, 8), (15, 8)] {
        let table = with_stop(Table::default().with(FILE_A, 0x1000, 0x1100, cmd(command::PLT)));
        let mut mem = Words::default();
        mem.put(0x2000 + 8 + cfa_extra - 8, B_BIAS + 0x2000 + 1);
        let pc = A_BIAS + 0x1020 + low;
        let stack = run(x86(pc, 0x2000, 0x77), &table, &mem);
        assert_eq!(stack.stop, StopReason::End, "pc & 15 = {low}");
        assert_eq!(stack.frames[1], frame_b(0x2001, RA));
    }
}

#[test]
fn x86_signal_frame_restores_registers_and_the_next_pc_is_not_a_return_address() {
    // The trampoline in B:0x2100..0x2110 has SIGNAL; the interrupted frame
    // at A:0x180 has CFA = r15 + 8 (only reachable through the restored r15).
    let table = Table::default()
        .with(FILE_B, 0x2100, 0x2110, cmd(command::SIGNAL))
        .with(
            FILE_A,
            0x180,
            0x181,
            info(opcode::BASE_REG, (8 << 1) | 15, 0, 0),
        )
        .with(FILE_A, 0x17f, 0x180, Err(6));
    let sp = 0x8000u64;
    let mut words = [0u64; 18];
    words[1] = 0x91; // r9
    words[3] = 0xb1; // r11
    words[5] = 0xd1; // r13
    words[7] = 0x9000; // r15
    words[10] = 0x1f0; // rbp
    words[13] = 0xa1; // rax
    words[15] = 0x8800; // rsp
    words[16] = A_BIAS + 0x180; // rip
    let mut mem = Words::default();
    mem.put_all(sp + 40, &words);
    mem.put(0x9000, 0);
    let stack = run(x86(B_BIAS + 0x2100, sp, 0), &table, &mem);
    assert_eq!(stack.frames, vec![frame_b(0x2100, 0), frame_a(0x180, SIG)]);
    // Looked up at 0x180 (not 0x17f, which would be INVALID); then CFA =
    // r15 + 8 = 0x9008 and the next pc is 0.
    assert_eq!(stack.stop, StopReason::ZeroPc);
    assert_eq!(table.asked.borrow()[1], (FILE_A, 0x180));
    // One word missing: a read error.
    let mut mem = Words::default();
    mem.put_all(sp + 40, &words[..17]);
    assert_eq!(
        run(x86(B_BIAS + 0x2100, sp, 0), &table, &mem).stop,
        StopReason::ReadError
    );
}

#[test]
fn x86_frame_pointer_command_follows_the_frame_record() {
    let table = with_stop(Table::default().with(FILE_A, 0, 0x1000, cmd(command::FRAME_POINTER)));
    let mut mem = Words::default();
    mem.put_all(0x4000, &[0x4100, B_BIAS + 0x2008]);
    let stack = run(x86(A_BIAS + 0x10, 0x3000, 0x4000), &table, &mem);
    assert_eq!(stack.stop, StopReason::End);
    assert_eq!(stack.frames, vec![frame_a(0x10, 0), frame_b(0x2008, RA)]);
    // Half a record: a read error.
    let mut mem = Words::default();
    mem.put(0x4000, 0x4100);
    assert_eq!(
        run(x86(A_BIAS + 0x10, 0x3000, 0x4000), &table, &mem).stop,
        StopReason::ReadError
    );
}

#[test]
fn x86_commands_without_a_rule_are_unsupported() {
    for c in [command::INVALID, 5, 0x7fff] {
        let table = Table::default().with(FILE_A, 0, 0x1000, cmd(c));
        let stack = run(
            x86(A_BIAS + 0x10, 0x3000, 0x4000),
            &table,
            &Words::default(),
        );
        assert_eq!(stack.stop, StopReason::Unsupported, "command {c}");
        assert_eq!(stack.frames.len(), 1);
    }
}

// ---- arm64 rules ----

#[test]
fn arm64_leaf_lr_rule_then_lr_mid_trace() {
    // A leaf at A:0x100 (CFA = sp, return address in LR) called from A:0x300,
    // whose rule is LR again: LR no longer holds its return address.
    let leaf = info(opcode::BASE_SP, 0, opcode::BASE_LR, 0);
    let table = Table::default()
        .with(FILE_A, 0x100, 0x200, leaf)
        .with(FILE_A, 0x200, 0x400, leaf);
    let stack = run(
        arm64(A_BIAS + 0x100, 0x1000, 0, A_BIAS + 0x304),
        &table,
        &Words::default(),
    );
    assert_eq!(stack.frames, vec![frame_a(0x100, 0), frame_a(0x304, RA)]);
    assert_eq!(stack.stop, StopReason::LrMidTrace);
}

#[test]
fn arm64_lr_zero_is_a_read_error() {
    let table = Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_SP, 0, opcode::BASE_LR, 0),
    );
    let stack = run(
        arm64(A_BIAS + 0x100, 0x1000, 0, 0),
        &table,
        &Words::default(),
    );
    assert_eq!(stack.stop, StopReason::ReadError);
}

#[test]
fn arm64_non_leaf_reads_the_return_address_and_strips_pac_bits() {
    // CFA = sp + 32, ra at CFA - 8 (fp_param -8: no fp restore).
    let table = with_stop(Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_SP, 32, opcode::BASE_CFA, -8),
    ));
    let mut mem = Words::default();
    mem.put(0x1000 + 24, 0x002a_0000_0000_0000 | (B_BIAS + 0x2040));
    let stack = run(arm64(A_BIAS + 0x100, 0x1000, 0x55, 0x66), &table, &mem);
    assert_eq!(stack.stop, StopReason::End);
    assert_eq!(stack.frames, vec![frame_a(0x100, 0), frame_b(0x2040, RA)]);
    assert_eq!(*mem.reads.borrow(), vec![0x1018]);
    // Unreadable: a read error.
    let stack = run(
        arm64(A_BIAS + 0x100, 0x1000, 0x55, 0x66),
        &table,
        &Words::default(),
    );
    assert_eq!(stack.stop, StopReason::ReadError);
}

#[test]
fn arm64_fp_param_8_restores_fp_from_below_the_return_address() {
    // ra = CFA + 8 (fp_param 8): pc = *(CFA + 8), fp = *(CFA). The next frame
    // is FRAME_POINTER, which reads at the restored fp.
    let table = Table::default()
        .with(
            FILE_A,
            0x100,
            0x200,
            info(opcode::BASE_FP, 0, opcode::BASE_CFA, 8),
        )
        .with(FILE_A, 0x300, 0x400, cmd(command::FRAME_POINTER));
    let mut mem = Words::default();
    mem.put_all(0x2000, &[0x2100, A_BIAS + 0x310]);
    mem.put_all(0x2100, &[0, 0]);
    let stack = run(arm64(A_BIAS + 0x100, 0x1000, 0x2000, 0), &table, &mem);
    assert_eq!(stack.frames, vec![frame_a(0x100, 0), frame_a(0x310, RA)]);
    assert_eq!(stack.stop, StopReason::ZeroPc);
    assert_eq!(*mem.reads.borrow(), vec![0x2008, 0x2000, 0x2100, 0x2108]);

    // The saved fp unreadable: fp becomes 0 (unchecked, spec §11 O3), so
    // FRAME_POINTER then fails.
    let mut mem = Words::default();
    mem.put(0x2008, A_BIAS + 0x310);
    mem.put_all(0, &[0, 0]);
    let stack = run(arm64(A_BIAS + 0x100, 0x1000, 0x2000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::ZeroPc);
    assert_eq!(mem.reads.borrow()[2], 0);
}

#[test]
fn arm64_signal_frame_restores_registers_and_lr_is_valid_again() {
    // After the trampoline, the interrupted leaf's LR rule applies.
    let table = Table::default()
        .with(FILE_B, 0x2100, 0x2110, cmd(command::SIGNAL))
        .with(
            FILE_A,
            0x100,
            0x200,
            info(opcode::BASE_SP, 0, opcode::BASE_LR, 0),
        )
        .with(FILE_A, 0x300, 0x400, Err(3));
    let sp = 0x8000u64;
    let mut words = [0u64; 34];
    words[22] = 0x22;
    words[28] = 0x28;
    words[29] = 0x2900; // fp
    words[30] = 0x0055_0000_0000_0000 | (A_BIAS + 0x310); // lr, signed
    words[31] = 0x8800; // sp
    words[32] = 0x0033_0000_0000_0000 | (A_BIAS + 0x140); // pc
    let mut mem = Words::default();
    mem.put_all(sp + 312, &words);
    let stack = run(arm64(B_BIAS + 0x2100, sp, 0, 0), &table, &mem);
    assert_eq!(
        stack.frames,
        vec![frame_b(0x2100, 0), frame_a(0x140, SIG), frame_a(0x310, RA)]
    );
    assert_eq!(stack.stop, StopReason::NoDelta(3));
    // The first step on ELF 0x2100 itself; the interrupted PC at itself.
    assert_eq!(
        *table.asked.borrow(),
        vec![(FILE_B, 0x2100), (FILE_A, 0x140), (FILE_A, 0x30f)]
    );
}

#[test]
fn arm64_frame_pointer_command_keeps_pac_bits_and_plt_is_unsupported() {
    let table = Table::default().with(FILE_A, 0, 0x1000, cmd(command::FRAME_POINTER));
    let mut mem = Words::default();
    mem.put_all(0x4000, &[0x4100, 0x0001_0000_0000_0000 | (B_BIAS + 0x2008)]);
    let stack = run(arm64(A_BIAS + 0x10, 0x3000, 0x4000, 0), &table, &mem);
    assert_eq!(stack.stop, StopReason::UnknownMapping);
    assert_eq!(
        stack.frames[1].pc,
        0x0001_0000_0000_0000 | (B_BIAS + 0x2008)
    );

    for c in [command::PLT, command::INVALID, 5] {
        let table = Table::default().with(FILE_A, 0, 0x1000, cmd(c));
        let stack = run(
            arm64(A_BIAS + 0x10, 0x3000, 0x4000, 0),
            &table,
            &Words::default(),
        );
        assert_eq!(stack.stop, StopReason::Unsupported, "command {c}");
    }
}

#[test]
fn arm64_base_reg_gives_zero() {
    let table = Table::default().with(
        FILE_A,
        0x100,
        0x200,
        info(opcode::BASE_REG, 8 << 1, opcode::BASE_CFA, -8),
    );
    let mut regs = arm64(A_BIAS + 0x100, 0x1000, 0, 0);
    regs.rax = 0x1000;
    let mut mem = Words::default();
    mem.put(0, B_BIAS + 0x2000);
    mem.put(0x1000, B_BIAS + 0x2000);
    // CFA 0, ra = 0 - 8: unreadable.
    let stack = run(regs, &table, &mem);
    assert_eq!(stack.stop, StopReason::ReadError);
    assert_eq!(*mem.reads.borrow(), vec![u64::MAX - 7]);
}

#[test]
fn normalize_pac_keeps_48_bits() {
    assert_eq!(normalize_pac(0xffff_8000_1234_5678), 0x8000_1234_5678);
    assert_eq!(normalize_pac(0x0000_7fff_ffff_ffff), 0x7fff_ffff_ffff);
}

// ---- properties ----

/// A frame-pointer chain built independently of the walk: each record at
/// `fp` holds the next fp and a return address into file A.
fn fp_chain(pcs: &[u64]) -> (Words, u64) {
    let mut mem = Words::default();
    let base = 0x10_0000u64;
    for i in 0..pcs.len() {
        let at = base + 0x100 * i as u64;
        let next = if i + 1 < pcs.len() { at + 0x100 } else { 0 };
        // The last record's return address is 0: the walk stops there.
        mem.put_all(
            at,
            &[
                next,
                if i + 1 < pcs.len() {
                    A_BIAS + pcs[i + 1]
                } else {
                    0
                },
            ],
        );
    }
    (mem, base)
}

fn any_rule() -> impl Strategy<Value = Result<Rule, u32>> {
    prop_oneof![
        Just(Ok(Rule::Stop)),
        (0u16..6).prop_map(|c| Ok(Rule::Command(c))),
        (0u32..8).prop_map(Err),
        (any::<u8>(), -64i32..64, any::<u8>(), -64i32..64).prop_map(|(op, p, fop, fp)| {
            let pick = |o: u8| [1, 2, 3, 4, 5, 0x81, 0x82, 0x83, 0, 0x7f][usize::from(o % 10)];
            Ok(Rule::Info(UnwindInfo::new(pick(op), p, pick(fop), fp)))
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random tables over file A, random words on a small stack: the walk
    /// ends within the budget, the flags follow the loop's rules, and a
    /// second walk gives the same stack.
    #[test]
    fn random_tables_and_stacks_stay_within_the_rules(
        rules in proptest::collection::vec(any_rule(), 1..12),
        words in proptest::collection::vec(0u64..0x200, 0..64),
        pc in 0u64..0x300,
        sp_slot in 0u64..64,
        arm in any::<bool>(),
        first_return in any::<bool>(),
    ) {
        let mut table = Table::default();
        for (i, rule) in rules.iter().enumerate() {
            let start = i as u64 * 0x20;
            table = table.with(FILE_A, start, start + 0x20, *rule);
        }
        let mut mem = Words::default();
        let stack_base = 0x1000u64;
        for (i, w) in words.iter().enumerate() {
            // Small words are stack addresses or PCs in file A (or 0).
            let value = if w % 3 == 0 { stack_base + (w % 64) * 8 } else if w % 3 == 1 { A_BIAS + w } else { *w };
            mem.put(stack_base + 8 * i as u64, value);
        }
        let mut regs = if arm {
            arm64(A_BIAS + pc, stack_base + 8 * sp_slot, stack_base, A_BIAS + 0x40)
        } else {
            x86(A_BIAS + pc, stack_base + 8 * sp_slot, stack_base)
        };
        regs.return_address = first_return;
        let stack = run(regs, &table, &mem);
        prop_assert!(stack.frames.len() <= MAX_FRAMES);
        if stack.stop == StopReason::Budget {
            prop_assert_eq!(stack.frames.len(), MAX_FRAMES);
        }
        if stack.stop == StopReason::ZeroPc && pc == 0 {
            prop_assert!(stack.frames.is_empty());
        } else {
            prop_assert!(!stack.frames.is_empty());
        }
        let first = &stack.frames.first().copied();
        if let Some(first) = first {
            prop_assert_eq!(first.flags, if first_return { RA } else { 0 });
        }
        for (i, f) in stack.frames.iter().enumerate() {
            prop_assert!(f.pc != 0);
            if i > 0 {
                // Every caller is a return address unless reached through a signal frame.
                prop_assert_eq!(f.flags & RA == 0, f.flags & SIG != 0);
            }
            let last = i + 1 == stack.frames.len();
            if f.file_id == 0 {
                prop_assert!(last && stack.stop == StopReason::UnknownMapping);
            } else {
                prop_assert_eq!(f.address, f.pc - A_BIAS);
            }
        }
        prop_assert_eq!(run(regs, &table, &mem), stack);
    }

    /// Frame-pointer chains of any length: the walk returns exactly the
    /// chain's PCs, and stops at the budget for chains longer than it.
    #[test]
    fn frame_pointer_chains_are_followed_exactly(
        pcs in proptest::collection::vec(0x10u64..0x1000, 1..(MAX_FRAMES + 20)),
        arm in any::<bool>(),
    ) {
        let table = Table::default().with(FILE_A, 0, 0x2000, cmd(command::FRAME_POINTER));
        let (mem, base) = fp_chain(&pcs);
        let regs = if arm { arm64(A_BIAS + pcs[0], 0x100, base, 0) } else { x86(A_BIAS + pcs[0], 0x100, base) };
        let stack = run(regs, &table, &mem);
        let got: Vec<u64> = stack.frames.iter().map(|f| f.address).collect();
        let want: Vec<u64> = pcs.iter().copied().take(MAX_FRAMES).collect();
        prop_assert_eq!(got, want);
        // The budget is checked before the next PC: a chain of exactly
        // MAX_FRAMES ends at the budget, not at its zero PC.
        let stop = if pcs.len() >= MAX_FRAMES { StopReason::Budget } else { StopReason::ZeroPc };
        prop_assert_eq!(stack.stop, stop);
    }
}
