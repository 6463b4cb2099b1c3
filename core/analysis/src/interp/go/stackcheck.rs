//! Where an x86-64 Go runtime keeps `g`, from the code of
//! `runtime.stackcheck`.
//!
//! Go on linux/amd64 keeps the goroutine pointer in thread-local storage at
//! a negative offset from `fs`. It is -8 for most executables, but not for
//! all: an executable linked statically with a C library puts the C
//! library's TLS after Go's, and there the offset is the linker's
//! (-0x58 with Debian's glibc and Go 1.19). `runtime.stackcheck`'s first
//! instructions load `g` into `rax`, so their operand says where it is:
//!
//! - `mov rax, fs:[disp]` (non-PIE): the displacement;
//! - `mov rcx, imm; mov rax, fs:[rcx]` (PIE): the immediate.
//!
//! [`decode`] follows just that: constants moved into registers, up to the
//! first `fs` load into `rax`. A jump, call or return before it, or any
//! other shape, gives `None`.

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};

/// Bytes of `runtime.stackcheck` decoded at most (upstream reads 128).
pub const MAX_BYTES: usize = 128;

/// The offset from `fs` that the first `fs`-relative load into `rax`
/// reads, if the code before it makes it a constant.
pub fn decode(code: &[u8]) -> Option<i64> {
    let mut known: Vec<(Register, u64)> = Vec::new();
    let mut decoder = Decoder::new(64, code, DecoderOptions::NONE);
    // Each instruction takes at least one byte of `code`.
    while decoder.can_decode() {
        let insn = decoder.decode();
        match insn.mnemonic() {
            Mnemonic::INVALID | Mnemonic::Ret | Mnemonic::Jmp | Mnemonic::Call => return None,
            _ => {}
        }
        let writes = (insn.op_count() > 0 && insn.op0_kind() == OpKind::Register)
            .then(|| insn.op0_register());
        let fs_load = insn.mnemonic() == Mnemonic::Mov
            && writes == Some(Register::RAX)
            && insn.op1_kind() == OpKind::Memory
            && insn.memory_segment() == Register::FS
            && insn.memory_index() == Register::None;
        if fs_load {
            let base = match insn.memory_base() {
                Register::None => 0,
                reg => known.iter().find(|(r, _)| *r == reg)?.1,
            };
            return Some(base.wrapping_add(insn.memory_displacement64()) as i64);
        }
        let Some(reg) = writes else {
            continue;
        };
        known.retain(|(r, _)| *r != reg);
        let immediate = matches!(
            insn.op1_kind(),
            OpKind::Immediate32to64 | OpKind::Immediate64
        );
        if insn.mnemonic() == Mnemonic::Mov && immediate && known.len() < 16 {
            known.push((reg, insn.immediate(1)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fs_displacement() {
        // mov rax, fs:[-8]; cmp [rax+8], rsp
        let code = [
            0x64, 0x48, 0x8b, 0x04, 0x25, 0xf8, 0xff, 0xff, 0xff, 0x48, 0x39, 0x60, 0x08,
        ];
        assert_eq!(decode(&code), Some(-8));
        // mov rax, fs:[-0x58]
        let code = [0x64, 0x48, 0x8b, 0x04, 0x25, 0xa8, 0xff, 0xff, 0xff];
        assert_eq!(decode(&code), Some(-0x58));
    }

    #[test]
    fn a_constant_in_a_register() {
        // mov rcx, -8; mov rax, fs:[rcx]
        let code = [
            0x48, 0xc7, 0xc1, 0xf8, 0xff, 0xff, 0xff, 0x64, 0x48, 0x8b, 0x01,
        ];
        assert_eq!(decode(&code), Some(-8));
        // mov rcx, -8; mov rcx, rdx; mov rax, fs:[rcx]: rcx is no constant.
        let code = [
            0x48, 0xc7, 0xc1, 0xf8, 0xff, 0xff, 0xff, 0x48, 0x89, 0xd1, 0x64, 0x48, 0x8b, 0x01,
        ];
        assert_eq!(decode(&code), None);
    }

    #[test]
    fn other_shapes_are_none() {
        // mov rax, [rip+0x10] (no fs); ret
        assert_eq!(decode(&[0x48, 0x8b, 0x05, 0x10, 0, 0, 0, 0xc3]), None);
        // ret before the load
        assert_eq!(
            decode(&[0xc3, 0x64, 0x48, 0x8b, 0x04, 0x25, 0xf8, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[0xff; 8]), None);
    }
}
