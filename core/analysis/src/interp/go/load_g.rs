//! Where an arm64 Go runtime keeps `g`, from the code of `runtime.load_g`.
//!
//! On linux/arm64 the goroutine pointer lives in x28. The runtime also
//! stores it in thread-local storage, at `TPIDR_EL0 + offset`, but only in
//! a binary with cgo: `load_g` first loads the byte `runtime.iscgo` and
//! returns when it is zero, then reads `TPIDR_EL0` and loads x28 from the
//! thread pointer plus the offset the linker resolved for `runtime.tls_g`
//! (`mov x27, #off`, or `movz`/`movk` in a position-independent binary;
//! `ldr x28, [x0, x27]`). A binary without cgo has no `runtime.tls_g` symbol
//! at all, and its `iscgo` is zero in the file (`.bss`); `runtime/cgo` sets
//! it to one statically.
//!
//! So the file's code says both whether `g` is in TLS and where, which is
//! what [`decode`] reads: a straight-line walk that follows `adrp`, `add`,
//! the `mov` family and the thread-pointer read, up to the first `ret`.
//! Anything else that writes a register makes it forget every register (a
//! wrong offset would read a wrong `g` on every sample; none is an error).

use yaxpeax_arm::armv8::a64::{Opcode, Operand, SizeCode};

use crate::elf::entry::a64_decode;

/// Bytes of `load_g` decoded at most (Go's is 0x1c to 0x20 bytes).
pub const MAX_BYTES: usize = 64;
/// The register Go keeps `g` in.
const G: usize = 28;

/// What a register holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    /// A constant or an address.
    Known(u64),
    /// `TPIDR_EL0`.
    ThreadPointer,
}

/// What `load_g` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadG {
    /// The address of the byte it tests before touching TLS
    /// (`runtime.iscgo`).
    pub cgo_flag: Option<u64>,
    /// The offset from the thread pointer it loads `g` from.
    pub g_offset: Option<u64>,
}

fn reg(n: u32) -> Option<usize> {
    (n < 31).then_some(n as usize)
}

/// Walks `code` (at address `pc0`) up to its first `ret`.
pub fn decode(code: &[u8], pc0: u64) -> LoadG {
    let mut regs: [Option<Value>; 31] = [None; 31];
    let mut seen = LoadG::default();
    // Fixed 4-byte instructions: bounded by the code.
    for (i, bytes) in code.chunks_exact(4).enumerate() {
        let pc = pc0.wrapping_add(4 * i as u64);
        let word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let field = |at: u32, bits: u32| (word >> at) & ((1 << bits) - 1);
        let (rd, rn) = (reg(field(0, 5)), reg(field(5, 5)));
        let known = |r: Option<usize>, regs: &[Option<Value>; 31]| match r.and_then(|r| regs[r]) {
            Some(Value::Known(v)) => Some(v),
            _ => None,
        };
        let Some(inst) = a64_decode(word) else {
            regs = [None; 31];
            continue;
        };
        let sf = word >> 31 == 1;
        let width_mask = if sf { u64::MAX } else { 0xffff_ffff };
        let imm16 = u64::from(field(5, 16)) << (16 * field(21, 2));
        let value = match inst.opcode {
            Opcode::RET => return seen,
            Opcode::ADRP => {
                // SignExtend(immhi:immlo) << 12, from the PC's page.
                let imm = ((field(5, 19) << 2 | field(29, 2)) as i64) << 43 >> 31;
                Some(Value::Known((pc & !0xfff).wrapping_add(imm as u64)))
            }
            // ADD (immediate), 64-bit.
            Opcode::ADD if word & 0xff80_0000 == 0x9100_0000 => {
                let imm = u64::from(field(10, 12)) << (12 * field(22, 1));
                known(rn, &regs).map(|v| Value::Known(v.wrapping_add(imm)))
            }
            Opcode::MOVZ => Some(Value::Known(imm16 & width_mask)),
            Opcode::MOVN => Some(Value::Known(!imm16 & width_mask)),
            Opcode::MOVK => {
                let keep = !(0xffff_u64 << (16 * field(21, 2)));
                known(rd, &regs).map(|v| Value::Known((v & keep | imm16) & width_mask))
            }
            Opcode::MRS => (word & 0xffff_ffe0 == 0xd53b_d040).then_some(Value::ThreadPointer),
            Opcode::LDRB | Opcode::LDRSB => {
                if let Operand::RegPreIndex(base, offset, false) = inst.operands[1] {
                    let at = known(reg(u32::from(base)), &regs)
                        .map(|b| b.wrapping_add(i64::from(offset) as u64));
                    seen.cgo_flag = seen.cgo_flag.or(at);
                }
                None
            }
            Opcode::LDR if rd == Some(G) => {
                let base = reg(field(5, 5)).and_then(|b| regs[b]);
                let offset = match inst.operands[1] {
                    Operand::RegRegOffset(_, index, SizeCode::X, _, 0) => {
                        known(reg(u32::from(index)), &regs)
                    }
                    Operand::RegPreIndex(_, offset, false) => Some(i64::from(offset) as u64),
                    _ => None,
                };
                if base == Some(Value::ThreadPointer) {
                    seen.g_offset = seen.g_offset.or(offset);
                }
                None
            }
            // Write no register.
            Opcode::CBZ | Opcode::CBNZ | Opcode::TBZ | Opcode::TBNZ | Opcode::Bcc(_) => {
                continue;
            }
            Opcode::HINT => continue,
            _ => {
                regs = [None; 31];
                continue;
            }
        };
        if let Some(r) = rd {
            regs[r] = value;
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    // Encodings checked with aarch64-linux-gnu-as.
    const MRS_X0_TPIDR: u32 = 0xd53b_d040;
    const LDR_X28_X0_X27: u32 = 0xf87b_681c;
    const CBZ_X0_4: u32 = 0xb400_0080; // cbz x0, .+16
    const RET: u32 = 0xd65f_03c0;

    #[test]
    fn go_1_19_without_cgo() {
        // gocorpus-go1.19-arm64: adrp x27; add x27, x27, #0x2cb;
        // ldrsb x0, [x27]; cbz x0; mrs; mov x27, #16; ldr x28, [x0, x27]; ret.
        let code = words(&[
            0xd000_065b,
            0x910b_2f7b,
            0x3980_0360,
            CBZ_X0_4,
            MRS_X0_TPIDR,
            0xd280_021b,
            LDR_X28_X0_X27,
            RET,
        ]);
        let seen = decode(&code, 0x6_ac10);
        assert_eq!(seen.cgo_flag, Some(0x13_42cb));
        assert_eq!(seen.g_offset, Some(16));
    }

    #[test]
    fn go_1_23_and_a_position_independent_one() {
        // gocorpus-go1.23-arm64: adrp x27; ldrsb x0, [x27, #2652]; ...
        let code = words(&[
            0x9000_071b,
            0x39a9_7360,
            CBZ_X0_4,
            MRS_X0_TPIDR,
            0xd280_021b,
            LDR_X28_X0_X27,
            RET,
        ]);
        let seen = decode(&code, 0x7_cf70);
        assert_eq!(seen.cgo_flag, Some(0x15_ca5c));
        assert_eq!(seen.g_offset, Some(16));
        // movz x27, #0, lsl #16; movk x27, #0x30 instead of the mov.
        let pie = words(&[
            0x9000_071b,
            0x39a9_7360,
            CBZ_X0_4,
            MRS_X0_TPIDR,
            0xd2a0_001b,
            0xf280_061b,
            LDR_X28_X0_X27,
            RET,
        ]);
        assert_eq!(decode(&pie, 0x7_cf70).g_offset, Some(0x30));
    }

    #[test]
    fn what_is_not_followed_gives_nothing() {
        // The index comes from memory (ldr x27, [x1]): not followed.
        let code = words(&[MRS_X0_TPIDR, 0xf940_003b, LDR_X28_X0_X27, RET]);
        assert_eq!(decode(&code, 0x1000), LoadG::default());
        // Not the thread pointer (mrs x0, tpidrro_el0).
        let code = words(&[0xd53b_d060, 0xd280_021b, LDR_X28_X0_X27, RET]);
        assert_eq!(decode(&code, 0x1000).g_offset, None);
        // Nothing after ret counts.
        let code = words(&[RET, MRS_X0_TPIDR, 0xd280_021b, LDR_X28_X0_X27]);
        assert_eq!(decode(&code, 0x1000), LoadG::default());
    }
}
