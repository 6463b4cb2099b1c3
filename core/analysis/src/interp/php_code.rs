//! What PHP's two loaders read from machine code, on x86-64 (iced-x86) and
//! arm64 (yaxpeax-arm):
//!
//! - [`vm_kind`]: the constant `zend_vm_kind()` returns, i.e. which VM the
//!   build dispatches opcodes with (`ZEND_VM_KIND_HYBRID` is 4, PHP 8's
//!   default);
//! - [`jit_return_address`]: in `execute_ex`, the address after its first
//!   unconditional jump. The hybrid VM enters an opcode handler, and so
//!   JIT-compiled code, with that jump ("labels as values"), so JIT code
//!   pushes no return address of its own: the unwinder uses this one;
//! - [`jit_buffer_pointers`]: in opcache's `zend_jit_unprotect`, the
//!   addresses of the two variables (`dasm_buf`, `dasm_size`) whose values
//!   it passes to `mprotect`: where the JIT buffer will be, read per
//!   process once the JIT has started.
//!
//! Each scan is a single pass over at most a few dozen instructions of a
//! caller-bounded slice. It follows only the value flow it needs and
//! forgets a register as soon as anything else writes it, so a changed
//! code shape gives an error rather than a wrong address.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use yaxpeax_arm::armv8::a64::{Opcode, Operand};

use super::LoaderError;
use crate::elf::entry::a64_decode;
use crate::elf::Arch;

/// `ZEND_VM_KIND_HYBRID` (`Zend/zend_vm_opcodes.h`).
pub(crate) const VM_KIND_HYBRID: u32 = 4;

/// Bytes of `zend_vm_kind` decoded: a `mov` and a `ret`, with room for an
/// `endbr64` and padding.
pub(crate) const VM_KIND_BYTES: u64 = 32;
/// Bytes of `execute_ex` decoded: the dispatching jump of the hybrid VM
/// comes after the prologue, 47 to 107 bytes in on the builds seen so far.
pub(crate) const EXECUTE_EX_BYTES: u64 = 128;
/// Bytes of `zend_jit_unprotect` decoded: the `mprotect` call is early.
pub(crate) const UNPROTECT_BYTES: u64 = 64;

fn invalid(what: &str, why: impl std::fmt::Display) -> LoaderError {
    LoaderError::Invalid(format!("{what}: {why}"))
}

/// The constant `zend_vm_kind` returns.
pub fn vm_kind(arch: Arch, code: &[u8]) -> Result<u32, LoaderError> {
    let found = match arch {
        Arch::X86_64 => x86::vm_kind(code),
        Arch::Aarch64 => arm64::vm_kind(code),
    };
    found.map_err(|why| invalid("zend_vm_kind", why))
}

/// The address after the first unconditional jump of `execute_ex`, whose
/// first bytes are `code`, at `address`.
pub fn jit_return_address(arch: Arch, code: &[u8], address: u64) -> Result<u64, LoaderError> {
    let found = match arch {
        Arch::X86_64 => x86::jump_return(code, address),
        Arch::Aarch64 => arm64::jump_return(code, address),
    };
    found.map_err(|why| invalid("execute_ex", why))
}

/// Where `zend_jit_unprotect` reads the JIT buffer's start and size from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JitBufferPointers {
    /// The address of `dasm_buf` (a pointer to the buffer).
    pub buffer: u64,
    /// The address of `dasm_size`.
    pub size: u64,
}

/// The variables whose values `zend_jit_unprotect` (first bytes `code`, at
/// `address`) passes as `mprotect`'s first two arguments.
pub fn jit_buffer_pointers(
    arch: Arch,
    code: &[u8],
    address: u64,
) -> Result<JitBufferPointers, LoaderError> {
    let found = match arch {
        Arch::X86_64 => x86::mprotect_arguments(code, address),
        Arch::Aarch64 => arm64::mprotect_arguments(code, address),
    };
    let pointers = found.map_err(|why| invalid("zend_jit_unprotect", why))?;
    // Both are pointer-sized variables: anything else was misread.
    for (name, at) in [("dasm_buf", pointers.buffer), ("dasm_size", pointers.size)] {
        if at == 0 || at % 8 != 0 {
            return Err(invalid(
                "zend_jit_unprotect",
                format!("{name} at {at:#x} is not an aligned variable"),
            ));
        }
    }
    Ok(pointers)
}

/// What a register is known to hold while scanning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Unknown,
    /// A constant, or an address computed from the PC.
    Constant(u64),
    /// The 8-byte value stored at this address.
    LoadedFrom(u64),
}

mod x86 {
    use super::*;

    fn decoder(code: &[u8], address: u64) -> Decoder<'_> {
        Decoder::with_ip(64, code, address, DecoderOptions::NONE)
    }

    /// The 64-bit register of the tracked ones (rax, rdi, rsi) that
    /// contains `reg`.
    fn tracked(reg: Register) -> Option<Register> {
        use Register as R;
        match reg {
            R::AL | R::AH | R::AX | R::EAX | R::RAX => Some(R::RAX),
            R::DIL | R::DI | R::EDI | R::RDI => Some(R::RDI),
            R::SIL | R::SI | R::ESI | R::RSI => Some(R::RSI),
            _ => None,
        }
    }

    /// The tracked register `insn` writes through its first operand, if
    /// it writes one (compares and tests only read).
    fn written(insn: &Instruction) -> Option<Register> {
        let reads_only = matches!(insn.mnemonic(), Mnemonic::Cmp | Mnemonic::Test);
        if insn.op_count() == 0 || insn.op0_kind() != OpKind::Register || reads_only {
            return None;
        }
        tracked(insn.op0_register())
    }

    fn immediate(insn: &Instruction) -> Option<u64> {
        match insn.op1_kind() {
            OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64 => Some(insn.immediate(1)),
            _ => None,
        }
    }

    pub(super) fn vm_kind(code: &[u8]) -> Result<u32, String> {
        let mut rax = Value::Unknown;
        let mut decoder = decoder(code, 0);
        // Each step consumes at least one byte of `code`.
        while decoder.can_decode() {
            let insn = decoder.decode();
            match insn.mnemonic() {
                Mnemonic::INVALID => return Err("undecodable instruction".into()),
                Mnemonic::Ret => {
                    return match rax {
                        Value::Constant(kind) => {
                            u32::try_from(kind).map_err(|_| format!("returns {kind:#x}"))
                        }
                        _ => Err("returns no constant".into()),
                    }
                }
                Mnemonic::Jmp | Mnemonic::Call => {
                    return Err("calls or jumps before returning".into())
                }
                _ => {}
            }
            if written(&insn) == Some(Register::RAX) {
                let zeroing = insn.mnemonic() == Mnemonic::Xor
                    && insn.op1_kind() == OpKind::Register
                    && insn.op1_register() == insn.op0_register();
                rax = match (insn.mnemonic(), immediate(&insn)) {
                    (Mnemonic::Mov, Some(value)) => Value::Constant(value),
                    _ if zeroing => Value::Constant(0),
                    _ => Value::Unknown,
                };
            }
        }
        Err("no return in the first bytes".into())
    }

    pub(super) fn jump_return(code: &[u8], address: u64) -> Result<u64, String> {
        let mut decoder = decoder(code, address);
        while decoder.can_decode() {
            let insn = decoder.decode();
            match insn.mnemonic() {
                Mnemonic::INVALID => return Err("undecodable instruction".into()),
                Mnemonic::Ret => return Err("returns before any jump".into()),
                Mnemonic::Jmp => {
                    // The return address must start a whole instruction
                    // inside the bytes read, or the code is not the shape
                    // this relies on.
                    let next = decoder.decode();
                    if next.mnemonic() == Mnemonic::INVALID {
                        return Err(format!("no instruction after the jump at {:#x}", insn.ip()));
                    }
                    return Ok(insn.next_ip());
                }
                _ => {}
            }
        }
        Err(format!("no jump in the first {} bytes", code.len()))
    }

    pub(super) fn mprotect_arguments(
        code: &[u8],
        address: u64,
    ) -> Result<JitBufferPointers, String> {
        let (mut rdi, mut rsi) = (Value::Unknown, Value::Unknown);
        let mut decoder = decoder(code, address);
        // The function returns early when the JIT is not protected: that
        // `ret` is skipped, the call to `mprotect` comes after it.
        while decoder.can_decode() {
            let insn = decoder.decode();
            match insn.mnemonic() {
                Mnemonic::INVALID => return Err("undecodable instruction".into()),
                Mnemonic::Call => {
                    return match (rdi, rsi) {
                        (Value::LoadedFrom(buffer), Value::LoadedFrom(size)) => {
                            Ok(JitBufferPointers { buffer, size })
                        }
                        _ => Err(format!(
                            "the call at {:#x} does not pass two loaded variables",
                            insn.ip()
                        )),
                    }
                }
                _ => {}
            }
            let Some(reg) = written(&insn) else {
                continue;
            };
            let value = if insn.mnemonic() == Mnemonic::Mov
                && matches!(insn.op0_register(), Register::RDI | Register::RSI)
                && insn.op1_kind() == OpKind::Memory
                && insn.is_ip_rel_memory_operand()
            {
                Value::LoadedFrom(insn.ip_rel_memory_address())
            } else {
                Value::Unknown
            };
            match reg {
                Register::RDI => rdi = value,
                Register::RSI => rsi = value,
                _ => {}
            }
        }
        Err(format!("no call in the first {} bytes", code.len()))
    }
}

mod arm64 {
    use super::*;

    /// The instructions of `code` with their addresses, stopping at the
    /// first word that is not an instruction (reported as an error).
    fn words(
        code: &[u8],
        address: u64,
    ) -> impl Iterator<Item = Result<(u64, yaxpeax_arm::armv8::a64::Instruction), String>> + '_
    {
        code.chunks_exact(4).zip(0u64..).map(move |(bytes, i)| {
            let pc = address.wrapping_add(i * 4);
            let word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            a64_decode(word)
                .map(|insn| (pc, insn))
                .ok_or_else(|| format!("undecodable word {word:#010x} at {pc:#x}"))
        })
    }

    /// X0..X30 by number; 31 (SP or ZR) is never tracked.
    fn reg(op: &Operand) -> Option<usize> {
        match *op {
            Operand::Register(_, n) | Operand::RegisterOrSP(_, n) if n < 31 => Some(usize::from(n)),
            _ => None,
        }
    }

    fn is_zero_register(op: &Operand) -> bool {
        matches!(*op, Operand::Register(_, 31))
    }

    fn immediate(op: &Operand) -> Option<u64> {
        match *op {
            Operand::Immediate(v) => Some(u64::from(v)),
            Operand::Imm64(v) => Some(v),
            Operand::ImmShift(v, shift) => u64::from(v).checked_shl(u32::from(shift)),
            _ => None,
        }
    }

    /// Stores name their source register first: they write no register.
    fn is_store(opcode: Opcode) -> bool {
        matches!(
            opcode,
            Opcode::STR
                | Opcode::STRB
                | Opcode::STRH
                | Opcode::STUR
                | Opcode::STURB
                | Opcode::STURH
                | Opcode::STP
                | Opcode::STNP
        )
    }

    /// The register the instruction writes, if any is tracked.
    fn written(insn: &yaxpeax_arm::armv8::a64::Instruction) -> Option<usize> {
        if is_store(insn.opcode) {
            return None;
        }
        reg(&insn.operands[0])
    }

    pub(super) fn vm_kind(code: &[u8]) -> Result<u32, String> {
        let mut x0 = Value::Unknown;
        for step in words(code, 0) {
            let (_, insn) = step?;
            match insn.opcode {
                Opcode::RET => {
                    return match x0 {
                        Value::Constant(kind) => {
                            u32::try_from(kind).map_err(|_| format!("returns {kind:#x}"))
                        }
                        _ => Err("returns no constant".into()),
                    }
                }
                Opcode::B | Opcode::BL | Opcode::BR | Opcode::BLR => {
                    return Err("calls or jumps before returning".into())
                }
                _ => {}
            }
            if written(&insn) != Some(0) {
                continue;
            }
            let ops = &insn.operands;
            x0 = match insn.opcode {
                Opcode::MOVZ => immediate(&ops[1]).map_or(Value::Unknown, Value::Constant),
                // `mov w0, #bitmask` is ORR with the zero register.
                Opcode::ORR if is_zero_register(&ops[1]) => {
                    immediate(&ops[2]).map_or(Value::Unknown, Value::Constant)
                }
                _ => Value::Unknown,
            };
        }
        Err("no return in the first bytes".into())
    }

    pub(super) fn jump_return(code: &[u8], address: u64) -> Result<u64, String> {
        let end = address.wrapping_add(code.len() as u64);
        for step in words(code, address) {
            let (pc, insn) = step?;
            match insn.opcode {
                Opcode::RET => return Err("returns before any jump".into()),
                Opcode::BR => {
                    let next = pc.wrapping_add(4);
                    if next >= end {
                        return Err(format!("the jump at {pc:#x} ends the bytes read"));
                    }
                    return Ok(next);
                }
                _ => {}
            }
        }
        Err(format!(
            "no register jump in the first {} bytes",
            code.len()
        ))
    }

    pub(super) fn mprotect_arguments(
        code: &[u8],
        address: u64,
    ) -> Result<JitBufferPointers, String> {
        let mut regs = [Value::Unknown; 31];
        for step in words(code, address) {
            let (pc, insn) = step?;
            if insn.opcode == Opcode::BL {
                return match (regs[0], regs[1]) {
                    (Value::LoadedFrom(buffer), Value::LoadedFrom(size)) => {
                        Ok(JitBufferPointers { buffer, size })
                    }
                    _ => Err(format!(
                        "the call at {pc:#x} does not pass two loaded variables"
                    )),
                };
            }
            let Some(dest) = written(&insn) else {
                continue;
            };
            let ops = &insn.operands;
            let value = match (insn.opcode, ops[1]) {
                (Opcode::ADRP, Operand::PCOffset(offset)) => {
                    Value::Constant((pc & !0xfff).wrapping_add_signed(offset))
                }
                (Opcode::ADD, _) => match (reg(&ops[1]).map(|n| regs[n]), immediate(&ops[2])) {
                    (Some(Value::Constant(base)), Some(add)) => {
                        Value::Constant(base.wrapping_add(add))
                    }
                    _ => Value::Unknown,
                },
                // `ldr Xt, [Xn, #imm]`: an 8-byte load from a known address.
                (Opcode::LDR, Operand::RegPreIndex(base, offset, false))
                    if matches!(
                        ops[0],
                        Operand::Register(yaxpeax_arm::armv8::a64::SizeCode::X, _)
                    ) =>
                {
                    match regs.get(usize::from(base)) {
                        Some(Value::Constant(at)) => {
                            Value::LoadedFrom(at.wrapping_add_signed(i64::from(offset)))
                        }
                        _ => Value::Unknown,
                    }
                }
                _ => Value::Unknown,
            };
            regs[dest] = value;
        }
        Err(format!("no call in the first {} bytes", code.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    // Instruction words as `aarch64-linux-gnu-as` assembles the sources in
    // the comments (adrp's page offset, left to a relocation by the
    // assembler, is set to one page by hand).

    #[test]
    fn arm64_vm_kind_is_the_constant_moved_into_w0() {
        // mov w0, #4; ret
        assert_eq!(
            vm_kind(Arch::Aarch64, &words(&[0x5280_0080, 0xd65f_03c0])),
            Ok(4)
        );
        // mov w0, #1; mov w0, w1; ret: the constant is overwritten.
        let overwritten = words(&[0x5280_0020, 0x2a01_03e0, 0xd65f_03c0]);
        assert!(vm_kind(Arch::Aarch64, &overwritten).is_err());
        // b .+8; ret
        assert!(vm_kind(Arch::Aarch64, &words(&[0x1400_0002, 0xd65f_03c0])).is_err());
    }

    #[test]
    fn x86_vm_kind_is_the_constant_moved_into_eax() {
        // endbr64; mov eax, 4; ret
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 4, 0, 0, 0, 0xc3];
        assert_eq!(vm_kind(Arch::X86_64, &code), Ok(4));
        // mov eax, 4; mov eax, edi; ret
        let code = [0xb8, 4, 0, 0, 0, 0x89, 0xf8, 0xc3];
        assert!(vm_kind(Arch::X86_64, &code).is_err());
        // mov ecx, 4; ret
        assert!(vm_kind(Arch::X86_64, &[0xb9, 4, 0, 0, 0, 0xc3]).is_err());
    }

    #[test]
    fn x86_jump_return_is_the_address_after_the_first_unconditional_jump() {
        // test rdi, rdi; je +3; jmp [r15]; nop; nop; nop
        let code = [
            0x48, 0x85, 0xff, 0x74, 0x03, 0x41, 0xff, 0x27, 0x90, 0x90, 0x90,
        ];
        assert_eq!(jit_return_address(Arch::X86_64, &code, 0x1000), Ok(0x1008));
        // ret before the jump
        assert!(jit_return_address(Arch::X86_64, &[0xc3, 0x41, 0xff, 0x27, 0x90], 0).is_err());
        // the jump is the last thing read
        assert!(jit_return_address(Arch::X86_64, &[0x41, 0xff, 0x27], 0).is_err());
    }

    #[test]
    fn arm64_jump_return_is_the_address_after_the_first_br() {
        // cbz x0, .+8; ldr x0, [x28]; br x0; nop
        let code = words(&[0xb400_0040, 0xf940_0380, 0xd61f_0000, 0xd503_201f]);
        assert_eq!(jit_return_address(Arch::Aarch64, &code, 0x4000), Ok(0x400c));
        // br x0 as the last word read
        assert!(jit_return_address(Arch::Aarch64, &words(&[0xd61f_0000]), 0).is_err());
        // ret; br x0; nop
        let code = words(&[0xd65f_03c0, 0xd61f_0000, 0xd503_201f]);
        assert!(jit_return_address(Arch::Aarch64, &code, 0).is_err());
    }

    #[test]
    fn x86_mprotect_arguments_are_rip_relative_loads() {
        // mov rsi, [rip+0x101]; mov edx, 3; mov rdi, [rip+0x1fd]; call .
        let code = |size_disp: u8| {
            let mut code = vec![0x48, 0x8b, 0x35, size_disp, 0x01, 0, 0];
            code.extend([0xba, 3, 0, 0, 0]);
            code.extend([0x48, 0x8b, 0x3d, 0xfd, 0x01, 0, 0]);
            code.extend([0xe8, 0, 0, 0, 0]);
            code
        };
        let got = jit_buffer_pointers(Arch::X86_64, &code(0x01), 0x1000);
        assert_eq!(
            got,
            Ok(JitBufferPointers {
                buffer: 0x1000 + 19 + 0x1fd,
                size: 0x1000 + 7 + 0x101,
            })
        );
        // A variable that is not 8-aligned was misread.
        assert!(jit_buffer_pointers(Arch::X86_64, &code(0x02), 0x1000).is_err());
        // rdi overwritten before the call: mov rdi, rbx.
        let mut clobbered = code(0x01)[..19].to_vec();
        clobbered.extend([0x48, 0x89, 0xdf, 0xe8, 0, 0, 0, 0]);
        assert!(jit_buffer_pointers(Arch::X86_64, &clobbered, 0x1000).is_err());
    }

    #[test]
    fn arm64_mprotect_arguments_follow_adrp_add_ldr() {
        // adrp x1, <next page>; add x1, x1, #0x720; ldr x0, [x1, #0x348];
        // ldr x1, [x1, #0x740]; bl .
        let code = words(&[
            0xb000_0001,
            0x911c_8021,
            0xf941_a420,
            0xf943_a021,
            0x9400_0000,
        ]);
        let got = jit_buffer_pointers(Arch::Aarch64, &code, 0x2_0010);
        assert_eq!(
            got,
            Ok(JitBufferPointers {
                buffer: 0x2_1000 + 0x720 + 0x348,
                size: 0x2_1000 + 0x720 + 0x740,
            })
        );
        // x0 overwritten before the call: mov x0, x19.
        let code = words(&[
            0xb000_0001,
            0x911c_8021,
            0xf941_a420,
            0xf943_a021,
            0xaa13_03e0,
            0x9400_0000,
        ]);
        assert!(jit_buffer_pointers(Arch::Aarch64, &code, 0x2_0010).is_err());
    }

    #[test]
    fn truncated_and_garbage_code_are_errors() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            for code in [&[][..], &[0xff; 3][..], &[0u8; 64][..], &[0xff; 64][..]] {
                assert!(vm_kind(arch, code).is_err());
                assert!(jit_return_address(arch, code, 0).is_err());
                assert!(jit_buffer_pointers(arch, code, 0).is_err());
            }
        }
    }
}
