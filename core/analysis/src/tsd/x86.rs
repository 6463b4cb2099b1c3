//! x86-64: a symbolic interpreter over the function's straight-line path
//! (conditional jumps are not followed, the first `ret` ends it), then the
//! return value `rax` compared with the shapes C libraries produce.
//!
//! Only the instructions that build addresses are interpreted (MOV and its
//! extending forms, ADD, SHL by a constant, LEA, XOR of a register with
//! itself, AND with 3); any other instruction leaves every register as it
//! was, as upstream's interpreter does. Decoding is `iced-x86`'s.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

use super::error::AnalysisError;
use super::expr::{Expr, Name, Pat, Segment};
use super::layout::{DtvInfo, TsdInfo};

/// Register slots: 0 for registers the interpreter does not track (the
/// high byte registers), then RAX..R15 in encoding order, then RIP.
const SLOTS: usize = 18;
const RAX: usize = 1;
const RDI: usize = 8;
const RIP: usize = 17;

/// The machine state: one symbolic value per register.
struct Machine {
    regs: Vec<Expr>,
}

use Register as R;

/// The general-purpose registers by width, in encoding order (RAX, RCX,
/// RDX, RBX, RSP, RBP, RSI, RDI, R8..R15).
const GPR64: [Register; 16] = [
    R::RAX,
    R::RCX,
    R::RDX,
    R::RBX,
    R::RSP,
    R::RBP,
    R::RSI,
    R::RDI,
    R::R8,
    R::R9,
    R::R10,
    R::R11,
    R::R12,
    R::R13,
    R::R14,
    R::R15,
];
const GPR32: [Register; 16] = [
    R::EAX,
    R::ECX,
    R::EDX,
    R::EBX,
    R::ESP,
    R::EBP,
    R::ESI,
    R::EDI,
    R::R8D,
    R::R9D,
    R::R10D,
    R::R11D,
    R::R12D,
    R::R13D,
    R::R14D,
    R::R15D,
];
const GPR16: [Register; 16] = [
    R::AX,
    R::CX,
    R::DX,
    R::BX,
    R::SP,
    R::BP,
    R::SI,
    R::DI,
    R::R8W,
    R::R9W,
    R::R10W,
    R::R11W,
    R::R12W,
    R::R13W,
    R::R14W,
    R::R15W,
];
const GPR8: [Register; 16] = [
    R::AL,
    R::CL,
    R::DL,
    R::BL,
    R::SPL,
    R::BPL,
    R::SIL,
    R::DIL,
    R::R8L,
    R::R9L,
    R::R10L,
    R::R11L,
    R::R12L,
    R::R13L,
    R::R14L,
    R::R15L,
];

/// A register operand: its slot and width in bits. Registers upstream
/// does not track (high bytes, segment and vector registers) share slot
/// 0 at 64 bits, as upstream's mapping does.
fn slot(reg: Register) -> (usize, u8) {
    if reg == Register::RIP {
        return (RIP, 64);
    }
    for (table, bits) in [(&GPR64, 64), (&GPR32, 32), (&GPR16, 16), (&GPR8, 8)] {
        if let Some(i) = table.iter().position(|&r| r == reg) {
            return (i + 1, bits);
        }
    }
    (0, 64)
}

impl Machine {
    fn new() -> Self {
        let regs = (0..SLOTS)
            .map(|i| Expr::named(Name::Input(i as u8)))
            .collect();
        Self { regs }
    }

    fn get(&self, reg: Register) -> Expr {
        let (slot, bits) = slot(reg);
        let value = self.regs[slot].clone();
        if bits < 64 {
            Expr::zero_extend(value, bits)
        } else {
            value
        }
    }

    fn set(&mut self, reg: Register, value: Expr) {
        let (slot, bits) = slot(reg);
        self.regs[slot] = if bits < 64 {
            Expr::zero_extend(value, bits)
        } else {
            value
        };
    }

    /// The address a memory operand names: displacement, base and scaled
    /// index, summed.
    fn address(&self, inst: &Instruction) -> Expr {
        let mut parts = Vec::with_capacity(3);
        let displacement = if inst.is_ip_rel_memory_operand() {
            // Decoded at address 0, iced reports the target; upstream
            // keeps the displacement from the next instruction.
            inst.memory_displacement64().wrapping_sub(inst.next_ip())
        } else {
            inst.memory_displacement64()
        };
        if displacement != 0 {
            parts.push(Expr::imm(displacement));
        }
        let base = inst.memory_base();
        if base != Register::None {
            parts.push(self.get(base));
        }
        let index = inst.memory_index();
        if index != Register::None {
            let scale = u64::from(inst.memory_index_scale());
            parts.push(Expr::mul(&[self.get(index), Expr::imm(scale)]));
        }
        Expr::add(&parts)
    }

    /// The value a memory operand reads.
    fn load(&self, inst: &Instruction) -> Expr {
        let segment = match inst.segment_prefix() {
            Register::None => Segment::None,
            Register::FS => Segment::Fs,
            Register::GS => Segment::Gs,
            _ => Segment::Other,
        };
        Expr::mem(segment, self.address(inst))
    }

    /// Source operand 1 as a value, if it is a register, an immediate or
    /// memory.
    fn source(&self, inst: &Instruction) -> Option<Expr> {
        match inst.op1_kind() {
            OpKind::Register => Some(self.get(inst.op1_register())),
            OpKind::Memory => Some(self.load(inst)),
            _ => inst.try_immediate(1).ok().map(Expr::imm),
        }
    }

    fn step(&mut self, inst: &Instruction) {
        self.regs[RIP] = Expr::add(&[Expr::named(Name::Code), Expr::imm(inst.next_ip())]);
        if inst.op_count() < 2 || inst.op0_kind() != OpKind::Register {
            return;
        }
        let dst = inst.op0_register();
        match inst.mnemonic() {
            Mnemonic::Add => {
                if let Some(right) = self.source(inst) {
                    let sum = Expr::add(&[self.get(dst), right]);
                    self.set(dst, sum);
                }
            }
            Mnemonic::Shl => {
                if let Ok(count) = inst.try_immediate(1) {
                    // Upstream multiplies by 2^count computed in floating
                    // point; counts past 63 saturate to the top bit.
                    let factor = 1u64.checked_shl(count as u32).unwrap_or(1 << 63);
                    let product = Expr::mul(&[self.get(dst), Expr::imm(factor)]);
                    self.set(dst, product);
                }
            }
            Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd => {
                let value = match inst.op1_kind() {
                    OpKind::Memory => {
                        let (_, bits) = slot(dst);
                        let loaded = self.load(inst);
                        if matches!(inst.mnemonic(), Mnemonic::Movsx | Mnemonic::Movsxd) {
                            Expr::sign_extend(loaded, bits)
                        } else {
                            Expr::zero_extend(loaded, bits)
                        }
                    }
                    _ => match self.source(inst) {
                        Some(v) => v,
                        None => return,
                    },
                };
                self.set(dst, value);
            }
            Mnemonic::Xor if inst.op1_kind() == OpKind::Register && inst.op1_register() == dst => {
                self.set(dst, Expr::imm(0));
            }
            // Upstream follows only `and` with 3 (two low bits).
            Mnemonic::And if inst.try_immediate(1).ok() == Some(3) => {
                let low = Expr::zero_extend(self.get(dst), 2);
                self.set(dst, low);
            }
            Mnemonic::Lea if inst.op1_kind() == OpKind::Memory => {
                let address = self.address(inst);
                self.set(dst, address);
            }
            _ => {}
        }
    }
}

/// Interprets `code` up to its first `ret` and gives `rax` then. Every
/// instruction is at least one byte, so this takes at most `code.len()`
/// steps.
fn run_to_return(code: &[u8]) -> Result<Expr, AnalysisError> {
    let mut machine = Machine::new();
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut inst = Instruction::default();
    while decoder.can_decode() {
        let at = decoder.position();
        decoder.decode_out(&mut inst);
        if inst.is_invalid() {
            return Err(AnalysisError::Undecodable { at });
        }
        machine.step(&inst);
        if inst.mnemonic() == Mnemonic::Ret {
            return Ok(machine.regs[RAX].clone());
        }
    }
    Err(AnalysisError::NoReturn)
}

fn key() -> Pat {
    Pat::Named(Name::Input(RDI as u8))
}

fn fs(at: Pat) -> Pat {
    Pat::mem(Segment::Fs, at)
}

fn load(at: Pat) -> Pat {
    Pat::mem(Segment::None, at)
}

// Capture slots.
const OFFSET: usize = 0;
const MULTIPLIER: usize = 1;
const BIAS: usize = 2;

/// The TSD layout `pthread_getspecific`'s code reads.
pub(crate) fn tsd(code: &[u8]) -> Result<TsdInfo, AnalysisError> {
    let result = run_to_return(code)?;
    let mut c = [0u64; 3];
    // musl: load(load(load(fs:[0]) + offset) + zext32(key) * multiplier).
    let musl = load(Pat::Add(vec![
        load(Pat::Add(vec![fs(Pat::Imm(0)), Pat::Capture(OFFSET)])),
        Pat::Mul(vec![Pat::zext32(key()), Pat::Capture(MULTIPLIER)]),
    ]));
    if result.matches(&musl, &mut c) {
        return Ok(tsd_info(c[OFFSET], c[MULTIPLIER], 1));
    }
    // glibc: load(load(fs:[0x10]) + zext32(key) * multiplier + offset).
    let glibc = load(Pat::Add(vec![
        fs(Pat::Imm(0x10)),
        Pat::Mul(vec![Pat::zext32(key()), Pat::Capture(MULTIPLIER)]),
        Pat::Capture(OFFSET),
    ]));
    if result.matches(&glibc, &mut c) {
        return Ok(tsd_info(c[OFFSET], c[MULTIPLIER], 0));
    }
    // glibc, the index biased before scaling:
    // load(load(fs:[0x10]) + zext32(key + bias) * multiplier + offset).
    let biased = load(Pat::Add(vec![
        fs(Pat::Imm(0x10)),
        Pat::Mul(vec![
            Pat::zext32(Pat::Add(vec![key(), Pat::Capture(BIAS)])),
            Pat::Capture(MULTIPLIER),
        ]),
        Pat::Capture(OFFSET),
    ]));
    if result.matches(&biased, &mut c) {
        let offset = c[MULTIPLIER].wrapping_mul(c[BIAS]).wrapping_add(c[OFFSET]);
        return Ok(tsd_info(offset, c[MULTIPLIER], 0));
    }
    Err(AnalysisError::NoTsdPattern)
}

/// Upstream truncates the captured values without range checks.
fn tsd_info(offset: u64, multiplier: u64, indirect: u8) -> TsdInfo {
    TsdInfo {
        offset: offset as i16,
        multiplier: multiplier as u8,
        indirect,
    }
}

/// The DTV layout `__tls_get_addr`'s code reads. Its argument points to
/// `{module id, offset}`; the result is `dtv[module].pointer + offset`.
pub(crate) fn dtv(code: &[u8]) -> Result<DtvInfo, AnalysisError> {
    let result = run_to_return(code)?;
    let module = || load(key());
    let tls_offset = || load(Pat::Add(vec![key(), Pat::Imm(8)]));
    let mut c = [0u64; 2];
    let (dtv_offset, width) = (0, 1);
    // glibc: load(fs:[dtv_offset] + module * width) + offset.
    let glibc = Pat::Add(vec![
        load(Pat::Add(vec![
            fs(Pat::Capture(dtv_offset)),
            Pat::Mul(vec![module(), Pat::Capture(width)]),
        ])),
        tls_offset(),
    ]);
    // musl: the DTV pointer is loaded from the thread pointer fs:[0].
    let dtv_pointer = || load(Pat::Add(vec![fs(Pat::Imm(0)), Pat::Capture(dtv_offset)]));
    let musl = |entry: Pat, offset_first: bool| {
        let element = load(Pat::Add(vec![dtv_pointer(), entry]));
        if offset_first {
            Pat::Add(vec![tls_offset(), element])
        } else {
            Pat::Add(vec![element, tls_offset()])
        }
    };
    let patterns = [
        glibc,
        musl(Pat::Mul(vec![module(), Pat::Capture(width)]), true),
        musl(Pat::Mul(vec![module(), Pat::Capture(width)]), false),
        musl(
            Pat::Mul(vec![Pat::zext32(module()), Pat::Capture(width)]),
            true,
        ),
    ];
    for pattern in &patterns {
        if result.matches(pattern, &mut c) {
            return Ok(DtvInfo {
                offset: c[dtv_offset] as i16,
                multiplier: c[width] as u8,
            });
        }
    }
    Err(AnalysisError::NoDtvPattern)
}
