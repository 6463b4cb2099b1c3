//! arm64: upstream's register-state machine over `pthread_getspecific`,
//! and its scan of `__tls_get_addr`.
//!
//! Upstream classifies instructions by what Go's disassembler prints,
//! which applies the architecture's preferred aliases (`mov`, `cmp`,
//! `ubfiz`, `lsl`) and reports immediates unshifted. `classify` turns a
//! `yaxpeax-arm` decoding plus the instruction word into that view; the
//! encodings it reads are the Arm ARM's.
//!
//! The state machine (spec 7.1 and its erratum I8): `x0` starts as the
//! index; `mrs tpidr_el0` gives the thread pointer; loads, additions and
//! shifts carry offsets and multipliers along. An instruction that writes
//! a register in a way the machine does not follow clears that register,
//! but only when the next instruction starts; undecodable words are
//! skipped, `cmp` and `cbz` change nothing, and the first `ret` ends the
//! scan.

use yaxpeax_arm::armv8::a64::{Opcode, Operand};

use super::error::AnalysisError;
use super::layout::{DtvInfo, TsdInfo};
use crate::elf::entry::{a64_decode, a64_mov_alias, bitmask_immediate_valid};

/// A memory operand as upstream sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Address {
    /// `[Xn, #imm]` or `[Xn, #imm]!`; `base` is `None` for SP.
    Immediate { base: Option<u8>, offset: i64 },
    /// `[Xn], #imm`: upstream cannot read its offset.
    PostIndex { base: Option<u8> },
    /// `[Xn, Rm{, extend/shift #amount}]`.
    Register {
        base: Option<u8>,
        index: Option<u8>,
        amount: u8,
    },
    /// A literal or anything else.
    Other,
}

/// The third operand of an ADD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Addend {
    /// `#imm12` (upstream ignores `lsl #12`).
    Immediate(i64),
    /// A register, shifted left by `shift` when upstream can read it.
    Register { reg: Option<u8>, shift: Option<u8> },
}

/// One instruction as upstream's switch sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Ret,
    /// `mov Rd, #value`.
    MovImmediate(i64),
    /// `mov Rd, Rm` (`None` for ZR/SP).
    MovRegister(Option<u8>),
    /// `mrs Rd, <sysreg>`; `true` for `tpidr_el0`.
    Mrs(bool),
    Ldur(Address),
    Ldr(Address),
    /// `ubfiz Rd, Rn, #lsb, #width`.
    Ubfiz {
        src: Option<u8>,
        lsb: u8,
    },
    /// `lsl Rd, Rn, #shift` (an UBFM alias).
    Lsl {
        shift: u8,
    },
    Add {
        src: Option<u8>,
        addend: Addend,
    },
    /// `sub Rd, Rn, #imm12` (`None` for the register forms).
    Sub {
        src: Option<u8>,
        imm: Option<i64>,
    },
    /// `cmp` and `cbz`: nothing changes.
    Compare,
    Other,
}

/// A decoded instruction: Go's first operand as an X/W register number
/// (0..=30), and the operation.
#[derive(Clone, Copy, Debug)]
struct Insn {
    dest: Option<u8>,
    op: Op,
}

fn gpr(n: u16) -> Option<u8> {
    u8::try_from(n).ok().filter(|&n| n < 31)
}

fn operand_reg(op: &Operand) -> Option<u8> {
    match *op {
        Operand::Register(_, n) | Operand::RegisterOrSP(_, n) => gpr(n),
        _ => None,
    }
}

fn field(word: u32, at: u32, bits: u32) -> u32 {
    (word >> at) & ((1 << bits) - 1)
}

/// Decodes and classifies one instruction word; `None` when Go's decoder
/// would not decode it.
fn classify(word: u32) -> Option<Insn> {
    let inst = a64_decode(word)?;
    // Go's decoder knows neither `udf` nor reserved bitmask immediates.
    if inst.opcode == Opcode::UDF || !bitmask_immediate_valid(word) {
        return None;
    }
    let rd = gpr(field(word, 0, 5) as u16);
    let rn = gpr(field(word, 5, 5) as u16);
    let rm = gpr(field(word, 16, 5) as u16);
    let sf = word >> 31 == 1;
    let width: u32 = if sf { 64 } else { 32 };
    let dest = operand_reg(&inst.operands[0]);
    let other = Insn {
        dest,
        op: Op::Other,
    };
    let insn = |op| Some(Insn { dest, op });
    match inst.opcode {
        Opcode::RET => insn(Op::Ret),
        Opcode::MRS => insn(Op::Mrs(word & 0xffff_ffe0 == 0xd53b_d040)),
        Opcode::LDUR => insn(Op::Ldur(address(&inst.operands[1]))),
        Opcode::LDR => insn(Op::Ldr(address(&inst.operands[1]))),
        Opcode::MOVZ | Opcode::MOVN | Opcode::ORR => {
            if !a64_mov_alias(inst.opcode, word) {
                return Some(other);
            }
            if inst.opcode == Opcode::ORR && word & 0x1f00_0000 == 0x0a00_0000 {
                // ORR (shifted register) with Rn = ZR: a register move.
                return insn(Op::MovRegister(rm));
            }
            let value = match inst.opcode {
                Opcode::MOVZ | Opcode::MOVN => {
                    let imm = u64::from(field(word, 5, 16)) << (16 * field(word, 21, 2));
                    let v = if inst.opcode == Opcode::MOVN {
                        !imm
                    } else {
                        imm
                    };
                    if sf {
                        v
                    } else {
                        v & 0xffff_ffff
                    }
                }
                _ => match inst.operands[2] {
                    Operand::Imm64(v) => v,
                    Operand::Immediate(v) => u64::from(v),
                    _ => return Some(other),
                },
            };
            insn(Op::MovImmediate(value as i64))
        }
        Opcode::UBFM => {
            let immr = field(word, 16, 6);
            let imms = field(word, 10, 6);
            if imms != width - 1 && imms + 1 == immr {
                insn(Op::Lsl {
                    shift: (width - 1 - imms) as u8,
                })
            } else if imms != width - 1 && imms < immr {
                insn(Op::Ubfiz {
                    src: rn,
                    lsb: ((width - immr) % width) as u8,
                })
            } else {
                Some(other)
            }
        }
        Opcode::ADD => {
            let addend = match word & 0x1f20_0000 {
                // ADD (shifted register).
                0x0b00_0000 => {
                    let amount = field(word, 10, 6) as u8;
                    let shift = match (field(word, 22, 2), amount) {
                        (_, 0) => Some(0),
                        (0, n) => Some(n),
                        _ => None,
                    };
                    Addend::Register { reg: rm, shift }
                }
                // ADD (extended register): upstream reads only
                // `uxtw #n` with n > 0.
                0x0b20_0000 => {
                    let amount = field(word, 10, 3) as u8;
                    let shift = (field(word, 13, 3) == 0b010 && amount > 0).then_some(amount);
                    Addend::Register { reg: rm, shift }
                }
                // ADD (immediate).
                _ => Addend::Immediate(i64::from(field(word, 10, 12))),
            };
            insn(Op::Add { src: rn, addend })
        }
        Opcode::SUB => {
            let imm = (word & 0x1f00_0000 == 0x1100_0000).then(|| i64::from(field(word, 10, 12)));
            insn(Op::Sub { src: rn, imm })
        }
        // `cmp` is SUBS into ZR; Go names its first operand Rn.
        Opcode::SUBS if rd.is_none() => Some(Insn {
            dest: rn,
            op: Op::Compare,
        }),
        // `cmn` and `tst` likewise name Rn first, and are not followed.
        Opcode::ADDS | Opcode::ANDS if rd.is_none() => Some(Insn {
            dest: rn,
            op: Op::Other,
        }),
        Opcode::CBZ => insn(Op::Compare),
        _ => Some(other),
    }
}

fn address(op: &Operand) -> Address {
    match *op {
        Operand::RegPreIndex(base, offset, _) => Address::Immediate {
            base: gpr(base),
            offset: i64::from(offset),
        },
        Operand::RegPostIndex(base, _) => Address::PostIndex { base: gpr(base) },
        Operand::RegRegOffset(base, index, _, _, amount) => Address::Register {
            base: gpr(base),
            index: gpr(index),
            amount,
        },
        _ => Address::Other,
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Status {
    #[default]
    Unknown,
    /// The thread pointer, or a pointer loaded relative to it.
    Base,
    /// Base plus a scaled index: the address of a TSD element.
    ElementBase,
    /// The index, possibly scaled and offset.
    Index,
    /// The TSD value itself.
    Value,
    Constant,
}

#[derive(Clone, Copy, Debug, Default)]
struct State {
    status: Status,
    offset: i64,
    multiplier: i64,
    indirect: bool,
}

fn shl(v: i64, n: u8) -> i64 {
    v.checked_shl(u32::from(n)).unwrap_or(0)
}

/// The TSD layout `pthread_getspecific`'s code reads. At most one step
/// per 4 bytes of code.
pub(crate) fn tsd(code: &[u8]) -> Result<TsdInfo, AnalysisError> {
    let mut regs = [State::default(); 31];
    regs[0] = State {
        status: Status::Index,
        multiplier: 1,
        ..State::default()
    };
    let mut pending_reset: Option<u8> = None;
    for chunk in code.chunks(4) {
        if let Some(r) = pending_reset {
            regs[usize::from(r)] = State::default();
        }
        let Ok(bytes) = <[u8; 4]>::try_from(chunk) else {
            continue;
        };
        let Some(insn) = classify(u32::from_le_bytes(bytes)) else {
            continue;
        };
        if insn.op == Op::Ret {
            break;
        }
        let Some(dest) = insn.dest else {
            continue;
        };
        pending_reset = Some(dest);
        if let Some(state) = follow(&regs, insn.op) {
            if let Some(new) = state {
                regs[usize::from(dest)] = new;
            }
            pending_reset = None;
        }
    }
    let x0 = regs[0];
    if x0.status != Status::Value {
        return Err(AnalysisError::NoTsdValue);
    }
    Ok(TsdInfo {
        offset: x0.offset as i16,
        multiplier: x0.multiplier as u8,
        indirect: u8::from(x0.indirect),
    })
}

/// What `op` makes of its destination: `None` when the machine does not
/// follow it (the destination is cleared), `Some(None)` when it leaves
/// the destination as it was, `Some(Some(state))` for a new state.
fn follow(regs: &[State; 31], op: Op) -> Option<Option<State>> {
    let at = |r: Option<u8>| r.map(|r| regs[usize::from(r)]);
    Some(match op {
        Op::MovImmediate(value) => Some(State {
            status: Status::Constant,
            offset: value,
            multiplier: 1,
            indirect: false,
        }),
        Op::MovRegister(src) => Some(at(src)?),
        Op::Mrs(true) => Some(State {
            status: Status::Base,
            multiplier: 1,
            ..State::default()
        }),
        Op::Mrs(false) | Op::Compare => None,
        Op::Ldur(Address::Immediate { base, offset }) => {
            let base = at(base)?;
            if base.status != Status::Base {
                return None;
            }
            Some(State {
                status: Status::Base,
                offset: base.offset.wrapping_add(offset),
                multiplier: base.multiplier,
                indirect: true,
            })
        }
        Op::Ldur(_) => return None,
        Op::Ldr(Address::Register {
            base,
            index,
            amount,
        }) => {
            let (base, index) = (at(base)?, at(index)?);
            if base.status != Status::Base || index.status != Status::Index {
                return None;
            }
            Some(State {
                status: Status::Value,
                offset: base.offset.wrapping_add(shl(index.offset, amount)),
                multiplier: shl(base.multiplier, amount),
                indirect: base.indirect,
            })
        }
        Op::Ldr(Address::Immediate { base, offset }) => {
            let base = at(base)?;
            if base.status != Status::ElementBase {
                return None;
            }
            Some(State {
                status: Status::Value,
                offset: base.offset.wrapping_add(offset),
                ..base
            })
        }
        // Upstream cannot read a post-index offset.
        Op::Ldr(Address::PostIndex { .. }) => return None,
        // A literal load: upstream's switch matches no case and leaves
        // the register alone.
        Op::Ldr(Address::Other) => None,
        Op::Ubfiz { src, lsb } => {
            let src = at(src)?;
            if src.status == Status::Index {
                Some(State {
                    status: Status::Index,
                    offset: shl(src.offset, lsb),
                    multiplier: shl(src.multiplier, lsb),
                    indirect: false,
                })
            } else {
                None
            }
        }
        Op::Add {
            src,
            addend: Addend::Immediate(imm),
        } => {
            let src = at(src)?;
            Some(State {
                offset: src.offset.wrapping_add(imm),
                ..src
            })
        }
        Op::Add {
            src,
            addend: Addend::Register { reg, shift },
        } => {
            let (src, other, shift) = (at(src)?, at(reg)?, shift?);
            let offset = src.offset.wrapping_add(shl(other.offset, shift));
            let multiplier = shl(other.multiplier, shift);
            match (src.status, other.status) {
                (Status::Base, Status::Index) => Some(State {
                    status: Status::ElementBase,
                    offset,
                    multiplier,
                    indirect: src.indirect,
                }),
                (Status::Constant, Status::Index) => Some(State {
                    status: Status::Index,
                    offset,
                    multiplier,
                    indirect: false,
                }),
                _ => return None,
            }
        }
        Op::Sub { src, imm } => {
            let src = at(src)?;
            if src.status == Status::Unknown {
                return None;
            }
            Some(State {
                offset: src.offset.wrapping_sub(imm?),
                ..src
            })
        }
        Op::Ret | Op::Lsl { .. } | Op::Other => return None,
    })
}

/// HEAD's scan of `__tls_get_addr` for the DTV layout: the offset of the
/// first load after `mrs` (or of any `ldur`), the entry size from the
/// last scaled index or `lsl`. Every word must decode.
pub(crate) fn dtv(code: &[u8]) -> Result<DtvInfo, AnalysisError> {
    let (mut offset, mut width) = (0i64, 0u32);
    let (mut thread_pointer, mut dtv_load) = (false, false);
    for (i, chunk) in code.chunks_exact(4).enumerate() {
        let word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let insn = classify(word).ok_or(AnalysisError::Undecodable { at: i * 4 })?;
        match insn.op {
            Op::Mrs(_) => thread_pointer = true,
            Op::Ldur(Address::Immediate { offset: o, .. }) => {
                offset = o;
                dtv_load = true;
            }
            Op::Ldr(Address::Immediate { offset: o, .. }) if thread_pointer && !dtv_load => {
                offset = o;
                dtv_load = true;
            }
            Op::Ldr(Address::Register { amount, .. }) if amount > 0 => {
                width = 1u32.checked_shl(u32::from(amount)).unwrap_or(0);
            }
            Op::Lsl { shift } => width = 1u32.checked_shl(u32::from(shift)).unwrap_or(0),
            _ => {}
        }
    }
    Ok(DtvInfo {
        offset: offset as i16,
        multiplier: width as u8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(word: u32) -> Op {
        classify(word).map(|i| i.op).unwrap_or(Op::Other)
    }

    #[test]
    fn go_views_of_instructions() {
        assert_eq!(op(0xd65f_03c0), Op::Ret);
        assert_eq!(op(0xd53b_d041), Op::Mrs(true)); // mrs x1, tpidr_el0
        assert_eq!(op(0xd53b_d061), Op::Mrs(false)); // mrs x1, tpidrro_el0
        assert_eq!(op(0x2a00_03e1), Op::MovRegister(Some(0))); // mov w1, w0
        assert_eq!(op(0xd280_0000), Op::MovImmediate(0)); // mov x0, #0
        assert_eq!(op(0xd2a0_0000), Op::Other); // movz x0, #0, lsl #16
        assert_eq!(op(0x9280_0000), Op::MovImmediate(-1)); // mov x0, #-1
        assert_eq!(
            op(0xd37c_7c20),
            Op::Ubfiz {
                src: Some(1),
                lsb: 4
            }
        );
        assert_eq!(op(0xd37c_ec63), Op::Lsl { shift: 4 });
        assert_eq!(op(0x5305_7c00), Op::Other); // lsr w0, w0, #5
        assert_eq!(
            op(0x9140_4000), // add x0, x0, #0x10, lsl #12: read unshifted
            Op::Add {
                src: Some(0),
                addend: Addend::Immediate(0x10)
            }
        );
        assert_eq!(
            op(0x8b02_1002), // add x2, x0, x2, lsl #4
            Op::Add {
                src: Some(0),
                addend: Addend::Register {
                    reg: Some(2),
                    shift: Some(4)
                }
            }
        );
        assert_eq!(
            op(0xd118_c000),
            Op::Sub {
                src: Some(0),
                imm: Some(0x630)
            }
        );
        let cmp = classify(0x7100_7c1f).map(|i| (i.dest, i.op));
        assert_eq!(cmp, Some((Some(0), Op::Compare)));
        let cmn = classify(0xb100_047f).map(|i| (i.dest, i.op));
        assert_eq!(cmn, Some((Some(3), Op::Other)));
        assert_eq!(
            op(0xf860_5820),
            Op::Ldr(Address::Register {
                base: Some(1),
                index: Some(0),
                amount: 3
            })
        );
        assert_eq!(
            op(0xf85a_8021),
            Op::Ldur(Address::Immediate {
                base: Some(1),
                offset: -88
            })
        );
    }

    #[test]
    fn a_reset_waits_for_the_next_instruction() {
        // mrs x1, tpidr_el0; ldur x1, [x1, #-88]; ldr x0, [x1, w0, uxtw #3];
        // then `adr x0, .` (not followed) as the last word, without a ret:
        // upstream never clears x0, because the reset is pending.
        let mut code = Vec::new();
        for w in [0xd53b_d041u32, 0xf85a_8021, 0xf860_5820, 0x1000_0000] {
            code.extend_from_slice(&w.to_le_bytes());
        }
        let info = tsd(&code).expect("x0 keeps its value");
        assert_eq!((info.offset, info.multiplier, info.indirect), (-88, 8, 1));
        // With a ret after it, the reset happens first.
        code.extend_from_slice(&0xd65f_03c0u32.to_le_bytes());
        assert_eq!(tsd(&code), Err(AnalysisError::NoTsdValue));
    }
}
