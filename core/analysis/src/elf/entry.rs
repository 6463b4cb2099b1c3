//! Entry-stub matchers (spec 5.4).
//!
//! Some `_start` stubs have no CFI at all (musl's, glibc's on arm64), so
//! extraction recognises them by their code and covers them with a STOP
//! delta: a trace that reaches the entry point ends there instead of
//! unwinding into garbage. [`stub_len`] says how long the recognised stub
//! is, or 0 when the code is not one.
//!
//! Both matchers insist on a fixed prologue, then decode instruction by
//! instruction and accept only a short list of harmless operations until the
//! branch that leaves the stub. Decoding is done by `iced-x86` (x86-64) and
//! `yaxpeax-arm` (arm64); neither panics on garbage, and the window is
//! bounded by [`WINDOW`].
//!
//! Upstream classifies arm64 instructions by the mnemonic Go's disassembler
//! prints, which applies the architecture's preferred aliases (`mov x5, x0`
//! is an ORR, `mov x0, #-1` a MOVN, and both print as MOV). `yaxpeax-arm`
//! reports the underlying operation, so `a64_class` re-applies the aliases
//! that turn an otherwise refused operation into an accepted MOV.

use super::Arch;

use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Mnemonic};
use yaxpeax_arch::{Decoder as _, U8Reader};
use yaxpeax_arm::armv8::a64::{self, InstDecoder, Opcode};

/// How many bytes at the entry point extraction reads; longer input is cut
/// to this many.
pub const WINDOW: usize = 128;

/// Both matchers refuse input shorter than this.
const MIN_INPUT: usize = 32;

/// The length of the entry stub at the start of `code`, or 0.
///
/// `code` is what the ELF file holds at its entry point (extraction passes
/// [`WINDOW`] bytes). A non-zero result `n` means `[entry, entry + n)` is a
/// stub that unwinds as STOP.
pub fn stub_len(arch: Arch, code: &[u8]) -> usize {
    let code = &code[..code.len().min(WINDOW)];
    if code.len() < MIN_INPUT {
        return 0;
    }
    match arch {
        Arch::X86_64 => x86_stub_len(code),
        Arch::Aarch64 => a64_stub_len(code),
    }
}

// ---------------------------------------------------------------- x86-64

/// musl's `_start` (`arch/x86_64/crt_arch.h`) up to the `lea` displacement:
/// `xor %rbp,%rbp; mov %rsp,%rdi; lea disp32(%rip),%rsi`.
const X86_HEAD: [u8; 9] = [0x48, 0x31, 0xed, 0x48, 0x89, 0xe7, 0x48, 0x8d, 0x35];
/// After the 4-byte displacement: `and $-16,%rsp; call <next byte>`, the
/// call landing on `_start_c` right behind it.
const X86_CALL: [u8; 9] = [0x48, 0x83, 0xe4, 0xf0, 0xe8, 0x00, 0x00, 0x00, 0x00];
/// Where [`X86_CALL`] starts, and where `_start_c` starts.
const X86_CALL_AT: usize = 13;
const X86_BODY_AT: usize = X86_CALL_AT + X86_CALL.len();

/// musl x86-64: the fixed prologue, then `_start_c` made only of MOV, LEA
/// and XOR up to the JMP into `__libc_start_main`; the stub ends with it.
fn x86_stub_len(code: &[u8]) -> usize {
    if code[..X86_HEAD.len()] != X86_HEAD || code[X86_CALL_AT..X86_BODY_AT] != X86_CALL {
        return 0;
    }
    let body = &code[X86_BODY_AT..];
    let mut decoder = Decoder::with_ip(64, body, X86_BODY_AT as u64, DecoderOptions::NONE);
    let mut inst = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut inst);
        if inst.is_invalid() {
            // Undecodable, or cut off by the end of the window.
            return 0;
        }
        match inst.mnemonic() {
            Mnemonic::Mov | Mnemonic::Lea | Mnemonic::Xor => {}
            // Go's decoder names far jumps LJMP, which the matcher refuses.
            Mnemonic::Jmp if !is_far_jmp(inst.code()) => {
                return inst.next_ip() as usize;
            }
            _ => return 0,
        }
    }
    0
}

/// `jmp ptr16:xx` and `jmp m16:xx`.
fn is_far_jmp(code: Code) -> bool {
    matches!(
        code,
        Code::Jmp_ptr1616 | Code::Jmp_ptr1632 | Code::Jmp_m1616 | Code::Jmp_m1632 | Code::Jmp_m1664
    )
}

// ----------------------------------------------------------------- arm64

/// `mov x29, #0; mov x30, #0`: both libcs' stubs clear FP and LR first.
const A64_HEAD: [u8; 8] = [0x1d, 0x00, 0x80, 0xd2, 0x1e, 0x00, 0x80, 0xd2];

/// arm64 (glibc `_start`, musl `_start` + `_start_c`): the FP/LR clearing,
/// then only ADD, ADRP, AND, LDR, MOV, MOVK and MOVZ, up to the second B or
/// BL (glibc: `bl __libc_start_main; bl abort`; musl: `b _start_c` and the
/// tail call out of `_start_c`). The stub ends after that branch.
fn a64_stub_len(code: &[u8]) -> usize {
    if code[..A64_HEAD.len()] != A64_HEAD {
        return 0;
    }
    let mut branches = 0;
    let mut at = A64_HEAD.len();
    while at < code.len() {
        let Some(word) = code.get(at..at + 4) else {
            // A partial instruction does not decode.
            return 0;
        };
        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        match a64_class(word) {
            A64Class::Plain => {}
            A64Class::Branch => {
                branches += 1;
                if branches == 2 {
                    return at + 4;
                }
            }
            A64Class::Other | A64Class::Undecodable => return 0,
        }
        at += 4;
    }
    0
}

/// How the arm64 stub matcher sees one instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum A64Class {
    /// ADD, ADRP, AND, LDR, MOV (any alias), MOVK or MOVZ.
    Plain,
    /// B (also B.cond, which Go's decoder names B) or BL.
    Branch,
    /// Anything else that decodes.
    Other,
    /// Not an instruction.
    Undecodable,
}

/// Decodes one arm64 instruction word; `None` when it is not one.
pub(crate) fn a64_decode(word: u32) -> Option<a64::Instruction> {
    let bytes = word.to_le_bytes();
    let mut reader = U8Reader::new(&bytes);
    match InstDecoder::default().decode(&mut reader) {
        Ok(inst) if inst.opcode != Opcode::Invalid => Some(inst),
        _ => None,
    }
}

/// Classifies `word` the way upstream's mnemonic switch does.
pub(crate) fn a64_class(word: u32) -> A64Class {
    let Some(inst) = a64_decode(word) else {
        return A64Class::Undecodable;
    };
    if !bitmask_immediate_valid(word) {
        // Go's decoder refuses reserved bitmask immediates.
        return A64Class::Undecodable;
    }
    match inst.opcode {
        Opcode::ADD | Opcode::ADRP | Opcode::AND | Opcode::LDR | Opcode::MOVK | Opcode::MOVZ => {
            A64Class::Plain
        }
        Opcode::B | Opcode::BL | Opcode::Bcc(_) => A64Class::Branch,
        Opcode::ORR | Opcode::MOVN | Opcode::INS | Opcode::DUP | Opcode::UMOV
            if is_mov_alias(word) =>
        {
            A64Class::Plain
        }
        _ => A64Class::Other,
    }
}

/// Whether Go's decoder prints this MOVZ, MOVN or ORR as MOV (the TSD
/// analysis follows MOV only).
pub(crate) fn a64_mov_alias(opcode: Opcode, word: u32) -> bool {
    match opcode {
        // MOVZ: MOV unless it moves a zero chunk into an upper halfword.
        Opcode::MOVZ => !((word >> 5) & 0xffff == 0 && (word >> 21) & 3 != 0),
        Opcode::MOVN | Opcode::ORR => is_mov_alias(word),
        _ => false,
    }
}

/// Whether the architecture's preferred disassembly of `word` (an ORR,
/// MOVN, INS, DUP or UMOV) is MOV. Bit patterns from the Arm ARM alias
/// conditions.
fn is_mov_alias(word: u32) -> bool {
    let sf = word >> 31 == 1;
    let rn = (word >> 5) & 0x1f;
    let rm = (word >> 16) & 0x1f;
    // ORR (shifted register), Rn = ZR, LSL #0: `mov Rd, Rm`.
    if word & 0x7fe0_ffe0 == 0x2a00_03e0 {
        return true;
    }
    // ORR (immediate), Rn = ZR: `mov Rd, #bitmask` unless MOVZ/MOVN would
    // express the value (then the assembler never emits this form).
    if word & 0x7f80_03e0 == 0x3200_03e0 {
        let n = (word >> 22) & 1;
        let immr = (word >> 16) & 0x3f;
        let imms = (word >> 10) & 0x3f;
        return !move_wide_preferred(sf, n, imms, immr);
    }
    // MOVN: `mov Rd, #-imm` unless it is a zero shifted chunk (or, for
    // 32 bits, all ones).
    if word & 0x7f80_0000 == 0x1280_0000 {
        let imm16 = (word >> 5) & 0xffff;
        let hw = (word >> 21) & 3;
        return !(imm16 == 0 && hw != 0) && (sf || imm16 != 0xffff);
    }
    // ORR (vector, register) with Rn = Rm: `mov Vd.T, Vn.T`.
    if word & 0xbfe0_fc00 == 0x0ea0_1c00 {
        return rn == rm;
    }
    // INS (element) and INS (general) always print as MOV.
    if word & 0xffe0_8400 == 0x6e00_0400 || word & 0xffe0_fc00 == 0x4e00_1c00 {
        return true;
    }
    // DUP (element), scalar form: always MOV.
    if word & 0xffe0_fc00 == 0x5e00_0400 {
        return true;
    }
    // UMOV: MOV for a 32-bit lane into W, or a 64-bit lane into X.
    let imm5 = (word >> 16) & 0x1f;
    if word & 0xffe0_fc00 == 0x0e00_3c00 {
        return imm5 & 0x7 == 0x4;
    }
    if word & 0xffe0_fc00 == 0x4e00_3c00 {
        return imm5 & 0xf == 0x8;
    }
    false
}

/// False for a logical-immediate instruction (AND, ORR, EOR, ANDS) whose
/// bitmask immediate is a reserved encoding (`DecodeBitMasks` undefined).
/// Other instructions are always valid here.
pub(crate) fn bitmask_immediate_valid(word: u32) -> bool {
    if word & 0x1f80_0000 != 0x1200_0000 {
        return true;
    }
    let sf = word >> 31 == 1;
    let n = (word >> 22) & 1;
    let imms = (word >> 10) & 0x3f;
    if !sf && n == 1 {
        return false;
    }
    // The element size is 2^len, len = HighestSetBit(N:NOT(imms)).
    let combined = (n << 6) | (!imms & 0x3f);
    if combined < 2 {
        return false;
    }
    let len = 31 - combined.leading_zeros();
    let levels = (1u32 << len) - 1;
    imms & levels != levels
}

/// The Arm ARM's `MoveWidePreferred(sf, N, imms, immr)`: whether a bitmask
/// immediate is better written with MOVZ or MOVN.
fn move_wide_preferred(sf: bool, n: u32, imms: u32, immr: u32) -> bool {
    let width: u32 = if sf { 64 } else { 32 };
    // The element size must be the register size.
    if sf && n != 1 {
        return false;
    }
    if !sf && (n != 0 || imms & 0x20 != 0) {
        return false;
    }
    if imms < 16 {
        // At most 16 ones, not crossing a halfword boundary once rotated.
        return (16 - (immr % 16)) % 16 <= 15 - imms;
    }
    if imms >= width - 15 {
        // At most 16 zeros, likewise.
        return immr % 16 <= imms - (width - 15);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_that_print_as_mov() {
        // mov x5, x0 (ORR x5, xzr, x0)
        assert_eq!(a64_class(0xaa00_03e5), A64Class::Plain);
        // orr x5, x1, x0: a real ORR
        assert_eq!(a64_class(0xaa00_0025), A64Class::Other);
        // orr x5, xzr, x0, lsl #1: not the alias
        assert_eq!(a64_class(0xaa00_07e5), A64Class::Other);
        // mov w3, w4 (32-bit ORR alias)
        assert_eq!(a64_class(0x2a04_03e3), A64Class::Plain);
        // mov x5, #-51712 (MOVN alias)
        assert_eq!(a64_class(0x9299_3fe5), A64Class::Plain);
        // movn x0, #0, lsl #16: no alias
        assert_eq!(a64_class(0x92a0_0000), A64Class::Other);
        // mov w2, #0x7fffffff (MOVN w2, #0x8000, lsl #16)
        assert_eq!(a64_class(0x12b0_0002), A64Class::Plain);
        // mov x0, #0x5555555555555555 (ORR immediate, no MOVZ/MOVN form)
        assert_eq!(a64_class(0xb200_f3e0), A64Class::Plain);
        // mov x6, sp (ADD immediate)
        assert_eq!(a64_class(0x9100_03e6), A64Class::Plain);
    }

    #[test]
    fn branches_and_others() {
        assert_eq!(a64_class(0x9400_0000), A64Class::Branch); // bl .
        assert_eq!(a64_class(0x1400_0001), A64Class::Branch); // b .+4
        assert_eq!(a64_class(0x5400_0040), A64Class::Branch); // b.eq .+8
        assert_eq!(a64_class(0xd503_201f), A64Class::Other); // nop
        assert_eq!(a64_class(0xd65f_03c0), A64Class::Other); // ret
        assert_eq!(a64_class(0xd63f_0200), A64Class::Other); // blr x16
                                                             // udf #0: yaxpeax decodes it, Go's decoder does not; refused either way.
        assert_eq!(a64_class(0x0000_0000), A64Class::Other);
        // orr w0, wzr, #<reserved>: not an instruction.
        assert_eq!(a64_class(0x3200_7fe0), A64Class::Undecodable);
    }

    #[test]
    fn move_wide_preferred_matches_the_arm_arm() {
        // #0xffff (16 ones at bit 0): MOVZ can do it.
        assert!(move_wide_preferred(true, 1, 15, 0));
        // #0x1ffff (17 ones): it cannot.
        assert!(!move_wide_preferred(true, 1, 16, 0));
        // 0x5555.. repeats with 2-bit elements: not a 64-bit element.
        assert!(!move_wide_preferred(true, 0, 0x3c, 0));
        // #0x7fffffffffffffff (63 ones): MOVN can do it.
        assert!(move_wide_preferred(true, 1, 62, 0));
        // #0xfffffffffffffff0 (60 ones): MOVN could, but the rule (and Go's
        // decoder, which follows it) only looks for at most 14 zeros here.
        assert!(!move_wide_preferred(true, 1, 59, 60));
    }
}
