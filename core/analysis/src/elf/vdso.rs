//! Synthetic deltas for the arm64 vDSO (spec 6.1).
//!
//! The arm64 kernel's vDSO ships no `.eh_frame`, so upstream makes up its
//! unwind data from the code: LR-based unwinding everywhere, a frame-pointer
//! rule between a function's `stp x29, x30, [sp, #-n]!` and its matching
//! `ldp x29, x30, ...`, and SIGNAL over `__kernel_rt_sigreturn`.
//!
//! The result is the generator's list sorted by address, not folded by
//! `AddEx`; every delta has hints 0. The sort is stable (upstream's is not),
//! so equal addresses keep the order the generator produced them in.

use super::{Arch, Elf};
use eim_machine::abi::{opcode, UnwindInfo};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};

use object::read::elf::Dyn;
use object::{Object, ObjectSymbol};
use yaxpeax_arm::armv8::a64::{Opcode, Operand};

/// The vDSO's SONAME.
pub(crate) const VDSO_SONAME: &[u8] = b"linux-vdso.so.1";
/// The signal-return trampoline.
pub(crate) const SIGRETURN: &[u8] = b"__kernel_rt_sigreturn";

/// arm64 frame pointer and link register numbers.
const FP: u16 = 29;
const LR: u16 = 30;
/// A saved-frame size at or above this is not believed.
const MAX_FRAME: i64 = 1024;

/// The synthetic deltas of an arm64 vDSO image, or `None` for any other
/// file: not arm64, or neither named `linux-vdso.so.1` (DT_SONAME) nor
/// exporting `__kernel_rt_sigreturn`.
pub fn synthesize(elf: &Elf<'_>) -> Option<IntervalData> {
    if elf.arch != Arch::Aarch64 {
        return None;
    }
    let has_sigreturn = elf
        .file
        .dynamic_symbols()
        .any(|s| s.name_bytes().ok() == Some(SIGRETURN));
    if !has_sigreturn && soname(elf).as_deref() != Some(VDSO_SONAME) {
        return None;
    }

    let mut deltas = vec![StackDelta::new(0, hint::NONE, info::LR)];
    for sym in elf.file.dynamic_symbols() {
        let addr = sym.address();
        let size = sym.size();
        if sym.name_bytes().ok() == Some(SIGRETURN) {
            deltas.push(StackDelta::new(addr, hint::NONE, info::SIGNAL));
            deltas.push(StackDelta::new(
                addr.wrapping_add(size),
                hint::NONE,
                info::LR,
            ));
            continue;
        }
        // Upstream skips a symbol whose code cannot be read.
        if let Some(code) = read_virtual(elf, addr, size) {
            scan_function(addr, code, &mut deltas);
        }
    }
    deltas.sort_by_key(|d| d.address);
    Some(IntervalData::from_deltas(deltas))
}

/// CFA = FP + `frame`, return address saved at FP + 8.
fn frame_rule(frame: i32) -> UnwindInfo {
    UnwindInfo {
        opcode: opcode::BASE_FP,
        fp_opcode: opcode::BASE_FP,
        merge_opcode: 0,
        pad: 0,
        param: frame,
        fp_param: 8,
    }
}

/// Walks one function's instructions: RET ends it; `stp x29, x30, [..]`
/// with a believable frame opens a frame-pointer range after it; the next
/// `ldp x29, x30, [..]` closes it (LR again after the load), or ends the
/// function when no frame is open. Undecodable words are skipped.
fn scan_function(addr: u64, code: &[u8], out: &mut Vec<StackDelta>) {
    // Offset just after the frame-saving STP; 0 while no frame is open.
    let mut frame_start: u64 = 0;
    let mut frame_size: i32 = 0;
    for (i, word) in code.chunks_exact(4).enumerate() {
        let offset = i as u64 * 4;
        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        let Some(inst) = super::entry::a64_decode(word) else {
            continue;
        };
        match inst.opcode {
            Opcode::RET => return,
            Opcode::STP if saves_fp_lr(&inst.operands) => {
                let Some(imm) = stp_immediate(&inst.operands[2]) else {
                    continue;
                };
                let frame = -imm;
                if frame < MAX_FRAME {
                    frame_start = offset + 4;
                    frame_size = frame as i32;
                }
            }
            Opcode::LDP if saves_fp_lr(&inst.operands) => {
                if frame_start == 0 {
                    return;
                }
                out.push(StackDelta::new(
                    addr.wrapping_add(frame_start),
                    hint::NONE,
                    frame_rule(frame_size),
                ));
                out.push(StackDelta::new(
                    addr.wrapping_add(offset + 4),
                    hint::NONE,
                    info::LR,
                ));
                frame_start = 0;
            }
            _ => {}
        }
    }
}

/// Whether a pair load/store's registers are x29, x30 (or w29, w30, which
/// upstream's register helper also accepts).
fn saves_fp_lr(ops: &[Operand; 4]) -> bool {
    matches!(ops[0], Operand::Register(_, FP)) && matches!(ops[1], Operand::Register(_, LR))
}

/// The immediate of an STP's address: the offset (0 for `[sp]`) of the
/// signed-offset and pre-index forms. The post-index form is refused:
/// upstream's immediate parser cannot read it (it fails on the text
/// `[sp],#-16`), and real vDSOs save FP/LR with the pre-index form.
fn stp_immediate(op: &Operand) -> Option<i64> {
    match *op {
        Operand::RegPreIndex(_, imm, _) => Some(i64::from(imm)),
        _ => None,
    }
}

/// The `size` bytes at virtual address `addr`, when one PT_LOAD segment's
/// file contents hold all of them. Never longer than the file.
fn read_virtual<'d>(elf: &Elf<'d>, addr: u64, size: u64) -> Option<&'d [u8]> {
    for ph in elf.segments(object::elf::PT_LOAD) {
        let Some(rel) = addr.checked_sub(ph.vaddr) else {
            continue;
        };
        if rel.checked_add(size)? > ph.filesz {
            continue;
        }
        return elf.bytes_at(ph.offset.checked_add(rel)?, size);
    }
    None
}

/// DT_SONAME from the dynamic section, if any.
fn soname(elf: &Elf<'_>) -> Option<Vec<u8>> {
    let endian = elf.file.endian();
    let sections = elf.file.elf_section_table();
    let (dynamic, link) = sections.dynamic(endian, elf.data).ok()??;
    let strings = sections.strings(endian, elf.data, link).ok()?;
    dynamic
        .iter()
        .find(|d| d.tag32(endian) == Some(object::elf::DT_SONAME))
        .and_then(|d| strings.get(u32::try_from(d.d_val(endian)).ok()?).ok())
        .map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(words: &[u32]) -> Vec<StackDelta> {
        let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut out = Vec::new();
        scan_function(0x1000, &code, &mut out);
        out
    }

    const PACIASP: u32 = 0xd503_233f;
    const STP_PRE16: u32 = 0xa9bf_7bfd; // stp x29, x30, [sp, #-16]!
    const MOV_FP_SP: u32 = 0x9100_03fd; // mov x29, sp
    const BL: u32 = 0x97ff_ff3d;
    const LDP_POST16: u32 = 0xa8c1_7bfd; // ldp x29, x30, [sp], #16
    const RET: u32 = 0xd65f_03c0;

    #[test]
    fn frame_between_stp_and_ldp() {
        let got = scan(&[PACIASP, STP_PRE16, MOV_FP_SP, BL, LDP_POST16, RET]);
        assert_eq!(
            got,
            vec![
                StackDelta::new(0x1008, 0, frame_rule(16)),
                StackDelta::new(0x1014, 0, info::LR),
            ]
        );
    }

    #[test]
    fn ret_ends_the_scan_and_ldp_without_frame_too() {
        assert!(scan(&[RET, STP_PRE16, LDP_POST16]).is_empty());
        assert!(scan(&[LDP_POST16, STP_PRE16, LDP_POST16]).is_empty());
    }

    /// The frame rule of `scan(&[stp, LDP_POST16])`, or `None` when the STP
    /// opened no frame.
    fn frame_of(stp: u32) -> Option<i32> {
        match scan(&[stp, LDP_POST16]).as_slice() {
            [] => None,
            [frame, lr] => {
                assert_eq!((frame.address, lr.address), (0x1004, 0x1008));
                assert_eq!(lr.info, info::LR);
                Some(frame.info.param)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn which_stores_open_a_frame() {
        // stp x29, x30, [sp, #-512]!: the largest encodable frame.
        assert_eq!(frame_of(0xa9a0_7bfd), Some(512));
        // stp w29, w30, [sp, #-8]!: upstream's register helper takes W too.
        assert_eq!(frame_of(0x29bf_7bfd), Some(8));
        // stp x29, x30, [sp]: frame 0.
        assert_eq!(frame_of(0xa900_7bfd), Some(0));
        // stp x29, x30, [sp, #16]: taken literally, frame -16 (< 1024).
        assert_eq!(frame_of(0xa901_7bfd), Some(-16));
        // stp x29, x30, [sp], #-16: post-index, skipped.
        assert_eq!(frame_of(0xa8bf_7bfd), None);
        // stp x19, x20, [sp, #-16]!: other registers.
        assert_eq!(frame_of(0xa9bf_53f3), None);
        // stp d29, d30, [sp, #-16]!: SIMD registers.
        assert_eq!(frame_of(0x6dbf_7bfd), None);
    }

    #[test]
    fn garbage_and_partial_words_are_skipped() {
        let mut code: Vec<u8> = [0u32, 0xffff_ffff, STP_PRE16, LDP_POST16]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        code.extend_from_slice(&[0xc0, 0x03]);
        let mut out = Vec::new();
        scan_function(0, &code, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].address, 12);
        assert_eq!(out[1].address, 16);
    }
}
