//! The call-frame virtual machine: the three tracked register rules, the
//! CFA instructions with upstream's semantics, and the recognised DWARF
//! expressions (spec 5.3).
//!
//! A rule is a base "register" and an offset. Besides DWARF register
//! numbers, the base takes the marker values below, in the same number
//! space as the registers an instruction names (so a `DW_CFA_register`
//! naming register 128 makes the rule "undefined", as upstream's does).

use super::reader::Reader;
use super::EntryError;
use crate::elf::Arch;

/// The register's value is lost.
pub(super) const REG_UNDEFINED: u64 = 128;
/// Saved at CFA + off.
pub(super) const REG_CFA: u64 = 129;
/// The value is CFA + off.
pub(super) const REG_CFA_VAL: u64 = 130;
/// Unchanged from the caller.
pub(super) const REG_SAME: u64 = 131;
/// GCC's PLT CFA expression.
pub(super) const REG_EXPR_PLT: u64 = 256;
/// `*(reg + off) + k`, operands packed by [`make_off`].
pub(super) const REG_EXPR_REG_DEREF: u64 = 257;
/// `*(reg_a + 8 * reg_b + off) + k` (recognised, never unwound).
pub(super) const REG_EXPR_REG_REG_DEREF: u64 = 258;
/// `reg + off`.
pub(super) const REG_EXPR_REG: u64 = 259;

pub(super) mod x86 {
    pub(crate) const RAX: u64 = 0;
    pub(crate) const RBP: u64 = 6;
    pub(crate) const RSP: u64 = 7;
    pub(crate) const R9: u64 = 9;
    pub(crate) const R11: u64 = 11;
    pub(crate) const R15: u64 = 15;
    pub(crate) const RIP: u64 = 16;
}

pub(super) mod arm {
    pub(crate) const FP: u64 = 29;
    pub(crate) const LR: u64 = 30;
    pub(crate) const SP: u64 = 31;
}

/// One register's recovery rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rule {
    pub(crate) reg: u64,
    pub(crate) off: i64,
}

impl Rule {
    pub(super) const fn new(reg: u64, off: i64) -> Self {
        Self { reg, off }
    }
}

/// The tracked rules: the CFA, the frame pointer and the return address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Regs {
    pub(crate) cfa: Rule,
    pub(crate) fp: Rule,
    pub(crate) ra: Rule,
}

impl Regs {
    /// The state before any CIE instruction: on x86-64 everything is
    /// undefined; on arm64 FP and LR keep their values.
    pub(super) fn initial(arch: Arch) -> Self {
        let keep = match arch {
            Arch::X86_64 => REG_UNDEFINED,
            Arch::Aarch64 => REG_SAME,
        };
        Self {
            cfa: Rule::new(REG_UNDEFINED, 0),
            fp: Rule::new(keep, 0),
            ra: Rule::new(keep, 0),
        }
    }
}

/// The DWARF numbers of the frame pointer and the return address.
#[inline(always)]
fn tracked_registers(arch: Arch) -> (u64, u64) {
    match arch {
        Arch::X86_64 => (x86::RBP, x86::RIP),
        Arch::Aarch64 => (arm::FP, arm::LR),
    }
}

/// Packs four 16-bit expression operands into one offset.
pub(super) fn make_off(a: i16, b: i16, c: i16, d: i16) -> i64 {
    ((u64::from(a as u16) << 48)
        | (u64::from(b as u16) << 32)
        | (u64::from(c as u16) << 16)
        | u64::from(d as u16)) as i64
}

/// Undoes [`make_off`].
pub(super) fn split_off(off: i64) -> (i16, i16, i16, i16) {
    (
        (off >> 48) as i16,
        (off >> 32) as i16,
        (off >> 16) as i16,
        off as i16,
    )
}

/// A parsed CIE: what its FDEs need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cie {
    /// Size of the CIE record in bytes.
    pub(crate) size: u64,
    pub(crate) code_align: u64,
    pub(crate) data_align: i64,
    pub(crate) ra_reg: u64,
    /// Encoding of FDE pointers ('R').
    pub(crate) enc: u8,
    /// Encoding of the LSDA pointer ('L'); read, never used.
    pub(crate) lsda_enc: u8,
    /// The augmentation string starts with 'z': FDEs carry augmentation data.
    pub(crate) has_augmentation: bool,
    /// 'S': a signal frame.
    pub(crate) signal: bool,
    /// The rules after the CIE's initial instructions.
    pub(crate) initial: Regs,
}

/// DWARF expression opcodes the parser knows.
mod op {
    pub(super) const DEREF: u8 = 0x06;
    pub(super) const CONST_U: u8 = 0x10;
    pub(super) const CONST_S: u8 = 0x11;
    pub(super) const ROT: u8 = 0x17;
    pub(super) const AND: u8 = 0x1a;
    pub(super) const MUL: u8 = 0x1e;
    pub(super) const PLUS: u8 = 0x22;
    pub(super) const PLUS_UCONST: u8 = 0x23;
    pub(super) const SHL: u8 = 0x24;
    pub(super) const GE: u8 = 0x2a;
    pub(super) const NE: u8 = 0x2e;
    pub(super) const LIT0: u8 = 0x30;
    pub(super) const LIT31: u8 = 0x4f;
    pub(super) const BREG0: u8 = 0x70;
    pub(super) const BREG31: u8 = 0x8f;
}

/// One normalised expression operation: `lit`/`breg` carry their number
/// in `a` (and `breg` its offset in `b`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ExprOp {
    op: u8,
    a: u64,
    b: u64,
}

/// The longest pattern recognised.
const MAX_PATTERN: usize = 9;

/// A parsed expression: its operation count and its first operations
/// (longer ones match no pattern, but still have to parse).
struct Expr {
    ops: [ExprOp; MAX_PATTERN],
    len: usize,
}

impl Expr {
    /// Parses `data`; `None` if it holds an operation the parser does not
    /// support (upstream then keeps the previous rule).
    fn parse(data: &[u8]) -> Option<Self> {
        let mut r = Reader::new(data, 0, 0, false);
        let mut expr = Expr {
            ops: [ExprOp::default(); MAX_PATTERN],
            len: 0,
        };
        while r.has_data() {
            let code = r.u8();
            let item = match code {
                op::LIT0..=op::LIT31 => ExprOp {
                    op: op::LIT0,
                    a: u64::from(code - op::LIT0),
                    b: 0,
                },
                op::BREG0..=op::BREG31 => ExprOp {
                    op: op::BREG0,
                    a: u64::from(code - op::BREG0),
                    b: r.sleb() as u64,
                },
                op::CONST_U | op::PLUS_UCONST => ExprOp {
                    op: code,
                    a: r.uleb(),
                    b: 0,
                },
                op::CONST_S => ExprOp {
                    op: code,
                    a: r.sleb() as u64,
                    b: 0,
                },
                op::DEREF | op::ROT..=op::NE => ExprOp {
                    op: code,
                    a: 0,
                    b: 0,
                },
                _ => return None,
            };
            if let Some(slot) = expr.ops.get_mut(expr.len) {
                *slot = item;
            }
            expr.len += 1;
        }
        Some(expr)
    }

    fn is(&self, pattern: &[u8]) -> bool {
        self.len == pattern.len()
            && self
                .ops
                .iter()
                .zip(pattern)
                .all(|(have, &want)| have.op == want)
    }

    fn op(&self, i: usize) -> ExprOp {
        self.ops.get(i).copied().unwrap_or_default()
    }

    /// The rule the expression stands for; "undefined" if no pattern
    /// matches.
    fn rule(&self) -> Rule {
        use op::*;
        let (o0, o1, o2) = (self.op(0), self.op(1), self.op(2));
        if self.is(&[BREG0, BREG0, LIT0, AND, LIT0, GE, LIT0, SHL, PLUS]) {
            Rule::new(REG_EXPR_PLT, 0)
        } else if self.is(&[BREG0]) {
            Rule::new(REG_EXPR_REG, make_off(o0.a as i16, 0, o0.b as i16, 0))
        } else if self.is(&[BREG0, DEREF]) {
            Rule::new(REG_EXPR_REG_DEREF, make_off(o0.a as i16, 0, o0.b as i16, 0))
        } else if self.is(&[BREG0, DEREF, PLUS_UCONST]) {
            Rule::new(
                REG_EXPR_REG_DEREF,
                make_off(o0.a as i16, 0, o0.b as i16, o2.a as i16),
            )
        } else if self.is(&[BREG0, BREG0, LIT0, MUL, PLUS, DEREF, PLUS_UCONST])
            && o1.b == 0
            && o2.a == 8
        {
            Rule::new(
                REG_EXPR_REG_REG_DEREF,
                make_off(o0.a as i16, o1.a as i16, o0.b as i16, self.op(6).a as i16),
            )
        } else {
            Rule::new(REG_UNDEFINED, 0)
        }
    }
}

/// Reads an expression operand (length and bytes). `None` if it is cut
/// off or holds an unsupported operation: the rule is then kept.
#[inline(never)]
fn read_expression(r: &mut Reader<'_>) -> Option<Rule> {
    let len = r.uleb();
    let data = r.bytes(len)?;
    Expr::parse(data).map(|e| e.rule())
}

/// CFA instruction opcodes.
mod cfa {
    pub(super) const NOP: u8 = 0x00;
    pub(super) const SET_LOC: u8 = 0x01;
    pub(super) const ADVANCE_LOC1: u8 = 0x02;
    pub(super) const ADVANCE_LOC2: u8 = 0x03;
    pub(super) const ADVANCE_LOC4: u8 = 0x04;
    pub(super) const OFFSET_EXTENDED: u8 = 0x05;
    pub(super) const RESTORE_EXTENDED: u8 = 0x06;
    pub(super) const UNDEFINED: u8 = 0x07;
    pub(super) const SAME_VALUE: u8 = 0x08;
    pub(super) const REGISTER: u8 = 0x09;
    pub(super) const REMEMBER_STATE: u8 = 0x0a;
    pub(super) const RESTORE_STATE: u8 = 0x0b;
    pub(super) const DEF_CFA: u8 = 0x0c;
    pub(super) const DEF_CFA_REGISTER: u8 = 0x0d;
    pub(super) const DEF_CFA_OFFSET: u8 = 0x0e;
    pub(super) const DEF_CFA_EXPRESSION: u8 = 0x0f;
    pub(super) const EXPRESSION: u8 = 0x10;
    pub(super) const OFFSET_EXTENDED_SF: u8 = 0x11;
    pub(super) const DEF_CFA_SF: u8 = 0x12;
    pub(super) const DEF_CFA_OFFSET_SF: u8 = 0x13;
    pub(super) const VAL_OFFSET: u8 = 0x14;
    pub(super) const VAL_OFFSET_SF: u8 = 0x15;
    pub(super) const VAL_EXPRESSION: u8 = 0x16;
    pub(super) const GNU_WINDOW_SAVE: u8 = 0x2d;
    pub(super) const GNU_ARGS_SIZE: u8 = 0x2e;
    pub(super) const GNU_NEGATIVE_OFFSET_EXTENDED: u8 = 0x2f;
    pub(super) const ADVANCE_LOC: u8 = 0x40;
    pub(super) const OFFSET: u8 = 0x80;
    pub(super) const RESTORE: u8 = 0xc0;
    pub(super) const HIGH_MASK: u8 = 0xc0;
}

/// Depth of the remember/restore stack.
const STACK_DEPTH: usize = 2;

/// The machine running one CIE's or FDE's instructions.
pub(super) struct Vm<'c> {
    /// The DWARF numbers of the frame pointer and the return address.
    fp_reg: u64,
    ra_reg: u64,
    cie: &'c Cie,
    /// The current location (code address).
    pub(crate) loc: u64,
    pub(crate) cur: Regs,
    /// Set whenever `cur` may have changed (the caller clears it when it
    /// has derived the row's rule from `cur`).
    pub(crate) changed: bool,
    stack: [Regs; STACK_DEPTH],
    depth: usize,
}

impl<'c> Vm<'c> {
    pub(super) fn new(arch: Arch, cie: &'c Cie, loc: u64, cur: Regs) -> Self {
        let (fp_reg, ra_reg) = tracked_registers(arch);
        Self {
            fp_reg,
            ra_reg,
            cie,
            loc,
            cur,
            changed: true,
            stack: [cur; STACK_DEPTH],
            depth: 0,
        }
    }

    #[inline]
    fn advance(&mut self, delta: u64) {
        let by = (delta as i64).wrapping_mul(self.cie.code_align as i64);
        self.loc = self.loc.wrapping_add(by as u64);
    }

    /// The current rule of `reg`, if it is tracked.
    #[inline(always)]
    fn tracked(&mut self, reg: u64) -> Option<&mut Rule> {
        if reg == self.fp_reg {
            Some(&mut self.cur.fp)
        } else if reg == self.ra_reg {
            Some(&mut self.cur.ra)
        } else {
            None
        }
    }

    /// Sets tracked register `reg` to `base + off * data_align`.
    #[inline(always)]
    fn rule(&mut self, reg: u64, base: u64, off: i64) {
        let data_align = self.cie.data_align;
        if let Some(rule) = self.tracked(reg) {
            *rule = Rule::new(base, off.wrapping_mul(data_align));
        }
    }

    #[inline]
    fn restore(&mut self, reg: u64) {
        let initial = &self.cie.initial;
        if reg == self.fp_reg {
            self.cur.fp = initial.fp;
            self.changed = true;
        } else if reg == self.ra_reg {
            self.cur.ra = initial.ra;
            self.changed = true;
        }
    }

    /// Runs instructions up to and including the next one that moves the
    /// location, or to the end of the instructions.
    #[inline(always)]
    pub(super) fn step(&mut self, r: &mut Reader<'_>) -> Result<(), EntryError> {
        while let Some(opcode) = r.next_if_any() {
            // The three "high" opcodes carry their operand in the low bits.
            // Compared in turn rather than through a jump table: these
            // branches predict far better than one indirect jump.
            let operand = u64::from(opcode & !cfa::HIGH_MASK);
            if opcode >= cfa::ADVANCE_LOC {
                if opcode < cfa::OFFSET {
                    self.advance(operand);
                    return Ok(());
                }
                if opcode < cfa::RESTORE {
                    // Mostly callee-saved registers that are not tracked.
                    if self.tracked(operand).is_some() {
                        let off = r.uleb() as i64;
                        self.rule(operand, REG_CFA, off);
                        self.changed = true;
                    } else {
                        r.skip_uleb();
                    }
                } else {
                    self.restore(operand);
                }
                continue;
            }
            // Whatever else comes may change a rule.
            self.changed = true;
            if opcode == cfa::DEF_CFA_OFFSET {
                self.cur.cfa.off = r.uleb() as i64;
                continue;
            }
            match opcode {
                cfa::NOP | cfa::GNU_WINDOW_SAVE => {}
                cfa::SET_LOC => {
                    return match r.ptr(self.cie.enc) {
                        Ok(loc) => {
                            self.loc = loc;
                            Ok(())
                        }
                        Err(e) => {
                            self.loc = 0;
                            Err(e)
                        }
                    };
                }
                cfa::ADVANCE_LOC1 => {
                    let d = r.u8();
                    self.advance(u64::from(d));
                    return Ok(());
                }
                cfa::ADVANCE_LOC2 => {
                    let d = r.u16();
                    self.advance(u64::from(d));
                    return Ok(());
                }
                cfa::ADVANCE_LOC4 => {
                    let d = r.u32();
                    self.advance(u64::from(d));
                    return Ok(());
                }
                cfa::OFFSET_EXTENDED => {
                    let reg = r.uleb();
                    let off = r.uleb() as i64;
                    self.rule(reg, REG_CFA, off);
                }
                cfa::RESTORE_EXTENDED => {
                    let reg = r.uleb();
                    self.restore(reg);
                }
                cfa::UNDEFINED => {
                    let reg = r.uleb();
                    self.rule(reg, REG_UNDEFINED, 0);
                }
                cfa::SAME_VALUE => {
                    let reg = r.uleb();
                    self.rule(reg, REG_SAME, 0);
                }
                cfa::REGISTER => {
                    let reg = r.uleb();
                    let base = r.uleb();
                    self.rule(reg, base, 0);
                }
                cfa::REMEMBER_STATE => {
                    // (No `ok_or`: an eagerly built error is dropped on
                    // the hot path.)
                    let Some(slot) = self.stack.get_mut(self.depth) else {
                        return Err(EntryError::StackOverflow(self.loc));
                    };
                    *slot = self.cur;
                    self.depth += 1;
                }
                cfa::RESTORE_STATE => {
                    let Some(depth) = self.depth.checked_sub(1) else {
                        return Err(EntryError::StackUnderflow(self.loc));
                    };
                    self.depth = depth;
                    if let Some(saved) = self.stack.get(depth) {
                        self.cur = *saved;
                    }
                }
                cfa::DEF_CFA => {
                    self.cur.cfa.reg = r.uleb();
                    self.cur.cfa.off = r.uleb() as i64;
                }
                cfa::DEF_CFA_REGISTER => self.cur.cfa.reg = r.uleb(),
                cfa::DEF_CFA_OFFSET => self.cur.cfa.off = r.uleb() as i64,
                cfa::DEF_CFA_SF => {
                    self.cur.cfa.reg = r.uleb();
                    self.cur.cfa.off = r.sleb().wrapping_mul(self.cie.data_align);
                }
                cfa::DEF_CFA_OFFSET_SF => {
                    self.cur.cfa.off = r.sleb().wrapping_mul(self.cie.data_align);
                }
                cfa::DEF_CFA_EXPRESSION => {
                    if let Some(rule) = r.detached(read_expression) {
                        self.cur.cfa = rule;
                    }
                }
                cfa::EXPRESSION => {
                    let reg = r.uleb();
                    if let Some(rule) = r.detached(read_expression) {
                        if let Some(to) = self.tracked(reg) {
                            *to = rule;
                        }
                    }
                }
                cfa::OFFSET_EXTENDED_SF => {
                    let reg = r.uleb();
                    let off = r.sleb();
                    self.rule(reg, REG_CFA, off);
                }
                cfa::VAL_OFFSET => {
                    let reg = r.uleb();
                    let off = r.uleb() as i64;
                    self.rule(reg, REG_CFA_VAL, off);
                }
                cfa::VAL_OFFSET_SF => {
                    let reg = r.uleb();
                    let off = r.sleb();
                    self.rule(reg, REG_CFA_VAL, off);
                }
                cfa::VAL_EXPRESSION => {
                    let reg = r.uleb();
                    self.rule(reg, REG_UNDEFINED, 0);
                    let len = r.uleb();
                    r.skip(len);
                }
                cfa::GNU_ARGS_SIZE => r.skip_uleb(),
                cfa::GNU_NEGATIVE_OFFSET_EXTENDED => {
                    let reg = r.uleb();
                    let off = r.sleb().wrapping_neg();
                    self.rule(reg, REG_CFA, off);
                }
                other => return Err(EntryError::Opcode(other)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cie(arch: Arch) -> Cie {
        Cie {
            size: 0,
            code_align: 1,
            data_align: -8,
            ra_reg: 16,
            enc: 0x1b,
            lsda_enc: 0,
            has_augmentation: true,
            signal: false,
            initial: Regs::initial(arch),
        }
    }

    fn run(arch: Arch, code: &[u8]) -> (Result<(), EntryError>, Regs, u64) {
        let c = cie(arch);
        let mut vm = Vm::new(arch, &c, 0x100, c.initial);
        let mut r = Reader::new(code, 0, 0, false);
        let mut res = Ok(());
        while r.has_data() && res.is_ok() {
            res = vm.step(&mut r);
        }
        (res, vm.cur, vm.loc)
    }

    #[test]
    fn offsets_are_factored_and_advances_end_a_step() {
        // def_cfa rsp+8; offset r16 at cfa-8; advance 4; def_cfa_offset 16
        let (res, regs, loc) = run(
            Arch::X86_64,
            &[0x0c, 7, 8, 0x90, 1, 0x44, 0x0e, 16, 0x86, 2],
        );
        assert_eq!(res, Ok(()));
        assert_eq!(loc, 0x104);
        assert_eq!(regs.cfa, Rule::new(x86::RSP, 16));
        assert_eq!(regs.ra, Rule::new(REG_CFA, -8));
        assert_eq!(regs.fp, Rule::new(REG_CFA, -16));
    }

    #[test]
    fn remember_state_is_two_deep() {
        let (res, ..) = run(Arch::X86_64, &[0x0a, 0x0a, 0x0b, 0x0b]);
        assert_eq!(res, Ok(()));
        let (res, ..) = run(Arch::X86_64, &[0x0a, 0x0a, 0x0a]);
        assert_eq!(res, Err(EntryError::StackOverflow(0x100)));
        let (res, ..) = run(Arch::X86_64, &[0x0a, 0x0b, 0x0b]);
        assert_eq!(res, Err(EntryError::StackUnderflow(0x100)));
    }

    #[test]
    fn unknown_opcodes_fail() {
        let (res, ..) = run(Arch::X86_64, &[0x17]);
        assert_eq!(res, Err(EntryError::Opcode(0x17)));
    }

    #[test]
    fn expressions() {
        // def_cfa_expression: breg7 +8; deref; plus_uconst 16
        let (_, regs, _) = run(Arch::X86_64, &[0x0f, 5, 0x77, 8, 0x06, 0x23, 16]);
        assert_eq!(
            regs.cfa,
            Rule::new(REG_EXPR_REG_DEREF, make_off(7, 0, 8, 16))
        );
        // an unrecognised but parseable expression makes the CFA undefined
        let (_, regs, _) = run(Arch::X86_64, &[0x0c, 7, 8, 0x0f, 1, 0x30]);
        assert_eq!(regs.cfa.reg, REG_UNDEFINED);
        // an unsupported operation keeps the previous rule
        let (_, regs, _) = run(Arch::X86_64, &[0x0c, 7, 8, 0x0f, 1, 0x96]);
        assert_eq!(regs.cfa, Rule::new(x86::RSP, 8));
        // GCC's PLT expression, any operands
        let plt = [
            0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        let (_, regs, _) = run(Arch::X86_64, &plt);
        assert_eq!(regs.cfa.reg, REG_EXPR_PLT);
        // expression on rbp: breg6 -16
        let (_, regs, _) = run(Arch::X86_64, &[0x10, 6, 2, 0x76, 0x70]);
        assert_eq!(regs.fp, Rule::new(REG_EXPR_REG, make_off(6, 0, -16, 0)));
        assert_eq!(split_off(regs.fp.off), (6, 0, -16, 0));
    }

    #[test]
    fn arm64_starts_with_fp_and_lr_unchanged() {
        let (_, regs, _) = run(Arch::Aarch64, &[0x0c, 31, 0]);
        assert_eq!(regs.cfa, Rule::new(arm::SP, 0));
        assert_eq!(regs.ra.reg, REG_SAME);
        assert_eq!(regs.fp.reg, REG_SAME);
    }
}
