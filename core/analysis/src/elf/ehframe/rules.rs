//! Register rules to unwind info (spec 5.4), per architecture.

use super::vm::{
    arm, split_off, x86, Regs, REG_CFA, REG_EXPR_PLT, REG_EXPR_REG, REG_EXPR_REG_DEREF, REG_SAME,
    REG_UNDEFINED,
};
use crate::elf::Arch;
use eim_machine::abi::{command, opcode, UnwindInfo};
use eim_machine::deltas::info;

/// The unwind info for a row. `BaseReg` CFAs (hand-written assembly with
/// a general register as CFA base) are only kept when `allow_generic_regs`.
#[inline(always)]
pub(super) fn unwind_info(arch: Arch, regs: &Regs, allow_generic_regs: bool) -> UnwindInfo {
    let info = match arch {
        Arch::X86_64 => x86_64(regs),
        Arch::Aarch64 => aarch64(regs),
    };
    if !allow_generic_regs && info.opcode == opcode::BASE_REG {
        return info::INVALID;
    }
    info
}

/// Upstream's `PackDerefParam`: `pre + post / 8` when `post` is one of
/// 0, 8, .., 32.
fn pack_deref_param(pre: i32, post: i32) -> Option<i32> {
    ((0..=0x20).contains(&post) && post % 8 == 0).then(|| pre.wrapping_add(post / 8))
}

#[inline(always)]
fn x86_64(regs: &Regs) -> UnwindInfo {
    let (cfa, fp, ra) = (regs.cfa, regs.fp, regs.ra);
    if cfa.reg == REG_UNDEFINED || ra.reg == REG_UNDEFINED {
        return info::STOP;
    }
    // The return address was already popped (musl's __clone).
    if ra.reg == REG_CFA && cfa.reg == x86::RSP && cfa.off.wrapping_add(ra.off) < 0 {
        return info::STOP;
    }
    if ra.reg != REG_CFA || ra.off != -8 {
        return info::INVALID;
    }
    let mut out = UnwindInfo::default();
    match fp.reg {
        // With an rsp-based CFA the saved rbp must lie between the CFA and
        // the stack top.
        REG_CFA if cfa.reg != x86::RSP || (fp.off < 0 && fp.off >= cfa.off.wrapping_neg()) => {
            out.fp_opcode = opcode::BASE_CFA;
            out.fp_param = fp.off as i32;
        }
        REG_EXPR_REG => {
            let (reg, _, off, _) = split_off(fp.off);
            if i64::from(reg) as u64 == x86::RBP {
                out.fp_opcode = opcode::BASE_FP;
                out.fp_param = i32::from(off);
            }
        }
        _ => {}
    }
    match cfa.reg {
        x86::RBP => {
            out.opcode = opcode::BASE_FP;
            out.param = cfa.off as i32;
        }
        // rsp + 0 leaves no opcode: INVALID.
        x86::RSP if cfa.off != 0 => {
            out.opcode = opcode::BASE_SP;
            out.param = cfa.off as i32;
        }
        // OpenSSL's assembly uses these as CFA base (see `unwind_info`).
        x86::RAX | x86::R9 | x86::R11 | x86::R15 if cfa.off % 8 == 0 => {
            out.opcode = opcode::BASE_REG;
            out.param = (cfa.reg as i32).wrapping_add((cfa.off as i32).wrapping_shl(1));
        }
        REG_EXPR_PLT => {
            out.opcode = opcode::COMMAND;
            out.param = command::PLT;
        }
        REG_EXPR_REG_DEREF => {
            let (reg, _, off, post) = split_off(cfa.off);
            if let Some(param) = pack_deref_param(i32::from(off), i32::from(post)) {
                match i64::from(reg) as u64 {
                    x86::RBP => {
                        out.opcode = opcode::BASE_FP | opcode::FLAG_DEREF;
                        out.param = param;
                    }
                    x86::RSP => {
                        out.opcode = opcode::BASE_SP | opcode::FLAG_DEREF;
                        out.param = param;
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    out
}

#[inline(always)]
fn aarch64(regs: &Regs) -> UnwindInfo {
    let (cfa, ra) = (regs.cfa, regs.ra);
    if cfa.reg == REG_UNDEFINED || ra.reg == REG_UNDEFINED {
        return info::STOP;
    }
    let mut out = UnwindInfo::default();
    match cfa.reg {
        arm::FP => {
            out.opcode = opcode::BASE_FP;
            out.param = cfa.off as i32;
        }
        arm::SP => {
            out.opcode = opcode::BASE_SP;
            out.param = cfa.off as i32;
        }
        _ => {}
    }
    match ra.reg {
        REG_SAME => {
            out.fp_opcode = opcode::BASE_LR;
            out.fp_param = 0;
        }
        // The return address slot, relative to the CFA's base register.
        REG_CFA if cfa.off != 0 => {
            out.fp_opcode = out.opcode;
            out.fp_param = cfa.off.wrapping_add(ra.off) as i32;
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::vm::{make_off, Rule};
    use super::*;

    fn x86(cfa: Rule, fp: Rule, ra: Rule) -> UnwindInfo {
        unwind_info(Arch::X86_64, &Regs { cfa, fp, ra }, false)
    }

    fn ui(op: u8, param: i32, fp_op: u8, fp_param: i32) -> UnwindInfo {
        UnwindInfo {
            opcode: op,
            param,
            fp_opcode: fp_op,
            fp_param,
            ..UnwindInfo::default()
        }
    }

    const RA8: Rule = Rule::new(REG_CFA, -8);
    const NO_FP: Rule = Rule::new(REG_UNDEFINED, 0);

    #[test]
    fn x86_basic_rules() {
        let rsp = |o| Rule::new(x86::RSP, o);
        assert_eq!(x86(rsp(8), NO_FP, RA8), ui(opcode::BASE_SP, 8, 0, 0));
        assert_eq!(x86(NO_FP, NO_FP, RA8), info::STOP);
        // rsp + 0 with the return address at CFA-8: already popped
        assert_eq!(x86(rsp(0), NO_FP, RA8), info::STOP);
        // ra already popped
        assert_eq!(x86(rsp(0), NO_FP, Rule::new(REG_CFA, -16)), info::STOP);
        assert_eq!(x86(rsp(24), NO_FP, Rule::new(REG_CFA, -16)), info::INVALID);
        // rbp saved at CFA-16: only between the CFA and the stack top
        let fp16 = Rule::new(REG_CFA, -16);
        assert_eq!(
            x86(rsp(16), fp16, RA8),
            ui(opcode::BASE_SP, 16, opcode::BASE_CFA, -16)
        );
        assert_eq!(x86(rsp(8), fp16, RA8), ui(opcode::BASE_SP, 8, 0, 0));
        assert_eq!(
            x86(Rule::new(x86::RBP, 16), fp16, RA8),
            ui(opcode::BASE_FP, 16, opcode::BASE_CFA, -16)
        );
    }

    #[test]
    fn x86_generic_registers_only_for_libcrypto() {
        let regs = Regs {
            cfa: Rule::new(x86::R9, 16),
            fp: NO_FP,
            ra: RA8,
        };
        assert_eq!(unwind_info(Arch::X86_64, &regs, false), info::INVALID);
        assert_eq!(
            unwind_info(Arch::X86_64, &regs, true),
            ui(opcode::BASE_REG, 9 + 32, 0, 0)
        );
    }

    #[test]
    fn x86_deref_and_plt() {
        let deref = Rule::new(REG_EXPR_REG_DEREF, make_off(7, 0, 16, 8));
        assert_eq!(
            x86(deref, NO_FP, RA8),
            ui(opcode::BASE_SP | opcode::FLAG_DEREF, 17, 0, 0)
        );
        let unpackable = Rule::new(REG_EXPR_REG_DEREF, make_off(7, 0, 16, 4));
        assert_eq!(x86(unpackable, NO_FP, RA8), info::INVALID);
        assert_eq!(x86(Rule::new(REG_EXPR_PLT, 0), NO_FP, RA8), info::PLT);
    }

    #[test]
    fn arm64_rules() {
        let arm = |cfa, ra| {
            unwind_info(
                Arch::Aarch64,
                &Regs {
                    cfa,
                    fp: Rule::new(REG_SAME, 0),
                    ra,
                },
                false,
            )
        };
        let same = Rule::new(REG_SAME, 0);
        assert_eq!(arm(Rule::new(arm::SP, 0), same), info::LR);
        assert_eq!(
            arm(Rule::new(arm::SP, 256), Rule::new(REG_CFA, -248)),
            ui(opcode::BASE_SP, 256, opcode::BASE_SP, 8)
        );
        assert_eq!(
            arm(Rule::new(arm::FP, 16), Rule::new(REG_CFA, -8)),
            ui(opcode::BASE_FP, 16, opcode::BASE_FP, 8)
        );
        assert_eq!(
            arm(Rule::new(arm::SP, 0), Rule::new(REG_UNDEFINED, 0)),
            info::STOP
        );
    }
}
