//! The address of CPython's thread-state key: where the `pthread_key_t`
//! lives that `PyGILState_GetThisThreadState` hands to
//! `pthread_getspecific`.
//!
//! The function is a stub that tail-calls (or calls) one of:
//!
//! * `pthread_getspecific(key)` / `PyThread_get_key_value(key)` (3.6, or
//!   3.7+ with `PyThread_tss_get` inlined): its first argument is the key's
//!   *value*, a 32-bit load from the key's address (Debian's `python3.11`:
//!   `mov edi, [rip+X]`, `ldr w0, [x0, #612]`);
//! * `PyThread_tss_get(&key)` (3.7+): its first argument is the *address*
//!   of a `Py_tss_t { int _is_initialized; pthread_key_t _key; }`, so the
//!   key is 4 bytes further (Debian's `libpython3.11.so.1.0`:
//!   `lea rdi, [rax+0x250]`, `add x0, x0, #0x260`, where the base was read
//!   from a GOT slot relocated to `_PyRuntime`).
//!
//! So the key's address follows from how the argument register was formed,
//! which is what this module tracks: per register, "the address A" or "the
//! 32-bit integer stored at A", through address arithmetic, GOT loads
//! (resolved by [`Relocations`]) and register moves, up to the first call
//! or tail call out of the stub. Upstream instead adds 4 when the address
//! it finds is 8-aligned (from 3.7 on); that guesses the form from an
//! alignment the C types do not promise (`Py_tss_t` is 4-aligned, and a key
//! loaded by value may sit at an 8-aligned address). Both agree on Debian's
//! files.
//!
//! An instruction the tracker does not understand makes it forget every
//! register (an unknown key is an error the user sees; a wrong one would
//! make every Python stack silently unreadable), except the few that
//! provably write no register: compares, conditional branches, hints.

use std::cell::OnceCell;

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
use yaxpeax_arm::armv8::a64::{Opcode, Operand, SizeCode};

use crate::elf::entry::a64_decode;
use crate::elf::{Arch, Elf};
use crate::interp::access::{Relocations, Symbol};

/// Bytes of the stub decoded at most (Debian's are 0x20 and 0x23 bytes).
const MAX_STUB_BYTES: usize = 64;
/// Offset of `_key` in `Py_tss_t`: after one `int` (4 bytes on every
/// platform CPython runs on with pthreads).
const PY_TSS_KEY_OFFSET: u64 = 4;

/// What a register holds, as far as the stub formed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    /// A known address.
    Address(u64),
    /// The 32-bit integer stored at a known address.
    Int32At(u64),
}

/// The key's address, given the first argument of the call that leaves the
/// stub.
fn key_address(arg: Option<Value>) -> Option<u64> {
    match arg? {
        Value::Int32At(at) => Some(at),
        Value::Address(tss) => tss.checked_add(PY_TSS_KEY_OFFSET),
    }
}

/// The address of the TSS key `stub` (`PyGILState_GetThisThreadState`)
/// reads, or `None` when its code does not show it.
pub fn key_of(elf: &Elf<'_>, stub: Symbol) -> Option<u64> {
    let len = usize::try_from(stub.size).ok()?.clamp(1, MAX_STUB_BYTES);
    let code = elf.virtual_memory(stub.address, len)?;
    let relocations = OnceCell::new();
    // A GOT slot (or any pointer) read by the stub, as the dynamic loader
    // fills it; built only for stubs that read one.
    let pointer = |at: u64| {
        relocations
            .get_or_init(|| Relocations::of(elf))
            .pointer(elf, at, "a pointer read by PyGILState_GetThisThreadState")
            .ok()
    };
    let arg = match elf.arch {
        Arch::X86_64 => first_argument_x86(&code, stub.address, pointer),
        Arch::Aarch64 => first_argument_arm64(&code, stub.address, pointer),
    };
    key_address(arg)
}

/// Tracked registers, by number (x86-64: rax..r15; arm64: x0..x30).
#[derive(Default)]
struct Regs([Option<Value>; 32]);

impl Regs {
    fn get(&self, n: usize) -> Option<Value> {
        self.0.get(n).copied().flatten()
    }

    /// Sets register `n`; `None` (SP or ZR on arm64) is not tracked.
    fn set(&mut self, n: Option<usize>, v: Option<Value>) {
        if let Some(slot) = n.and_then(|n| self.0.get_mut(n)) {
            *slot = v;
        }
    }

    fn forget_all(&mut self) {
        self.0 = [None; 32];
    }

    fn address(&self, n: usize) -> Option<u64> {
        match self.get(n)? {
            Value::Address(a) => Some(a),
            Value::Int32At(_) => None,
        }
    }
}

/// x86-64: the general-purpose register number of `r` (any width), and
/// whether `r` is its 64-bit or 32-bit form (8- and 16-bit forms are not
/// followed).
fn x86_gpr(r: Register) -> Option<(usize, u32)> {
    // iced numbers each width's sixteen registers consecutively, rax..r15
    // and eax..r15d, in encoding order.
    let (r, rax, eax) = (r as usize, Register::RAX as usize, Register::EAX as usize);
    if (rax..rax + 16).contains(&r) {
        Some((r - rax, 64))
    } else if (eax..eax + 16).contains(&r) {
        Some((r - eax, 32))
    } else {
        None
    }
}

/// The conditional jumps (they write no register).
fn x86_jcc(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Ja | Jae | Jb | Jbe | Je | Jne | Jg | Jge | Jl | Jle | Jo | Jno | Jp | Jnp | Js | Jns
    )
}

/// The first argument (`rdi`) at the first call or jump out of the stub.
fn first_argument_x86(code: &[u8], ip: u64, pointer: impl Fn(u64) -> Option<u64>) -> Option<Value> {
    const RDI: usize = 7;
    let stub = ip..ip.saturating_add(code.len() as u64);
    let mut regs = Regs::default();
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    // One instruction per step, each at least one byte: bounded by the code.
    while decoder.can_decode() {
        let insn = decoder.decode();
        // The memory operand's address, when its base is known (no index).
        let memory = |regs: &Regs| -> Option<u64> {
            if insn.is_ip_rel_memory_operand() {
                return Some(insn.ip_rel_memory_address());
            }
            if insn.memory_index() != Register::None {
                return None;
            }
            let (base, 64) = x86_gpr(insn.memory_base())? else {
                return None;
            };
            Some(
                regs.address(base)?
                    .wrapping_add(insn.memory_displacement64()),
            )
        };
        let dest = (insn.op_count() > 0 && insn.op0_kind() == OpKind::Register)
            .then(|| x86_gpr(insn.op0_register()))
            .flatten();
        match insn.mnemonic() {
            Mnemonic::Call | Mnemonic::Jmp => {
                let inside = insn.op0_kind() == OpKind::NearBranch64
                    && stub.contains(&insn.near_branch_target());
                if !inside {
                    return regs.get(RDI);
                }
                // A jump within the stub: the straight line goes on
                // (a merge point would need both paths; Debian's stubs
                // have none).
                regs.forget_all();
            }
            Mnemonic::Ret => return None,
            Mnemonic::Mov | Mnemonic::Lea if dest.is_some() && insn.op_count() == 2 => {
                let Some((d, width)) = dest else { continue };
                let d = Some(d);
                let value = match (insn.mnemonic(), insn.op1_kind(), width) {
                    (Mnemonic::Lea, OpKind::Memory, 64) => memory(&regs).map(Value::Address),
                    (Mnemonic::Mov, OpKind::Memory, 32) => memory(&regs).map(Value::Int32At),
                    (Mnemonic::Mov, OpKind::Memory, 64) => {
                        memory(&regs).and_then(&pointer).map(Value::Address)
                    }
                    // A 64-bit copy keeps the value; a 32-bit one keeps an
                    // integer (zero-extended) but truncates an address.
                    (Mnemonic::Mov, OpKind::Register, _) => {
                        match (x86_gpr(insn.op1_register()), width) {
                            (Some((s, 64)), 64) => regs.get(s),
                            (Some((s, 32)), 32) => {
                                regs.get(s).filter(|v| matches!(v, Value::Int32At(_)))
                            }
                            _ => None,
                        }
                    }
                    _ => None,
                };
                regs.set(d, value);
            }
            Mnemonic::Add if insn.op_count() == 2 => {
                let Some((d, 64)) = dest else {
                    regs.forget_all();
                    continue;
                };
                let imm = match insn.op1_kind() {
                    OpKind::Immediate8to64 | OpKind::Immediate32to64 => Some(insn.immediate64()),
                    _ => None,
                };
                let value = regs
                    .address(d)
                    .zip(imm)
                    .map(|(a, i)| Value::Address(a.wrapping_add(i)));
                regs.set(Some(d), value);
            }
            // Write no general-purpose register.
            Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Nop | Mnemonic::Endbr64 => {}
            m if x86_jcc(m) => {}
            _ => regs.forget_all(),
        }
    }
    None
}

/// arm64: `n` when it names x0..x30 (not SP or ZR).
fn a64_reg(n: u32) -> Option<usize> {
    (n < 31).then_some(n as usize)
}

/// The first argument (`x0`) at the first call or branch out of the stub.
fn first_argument_arm64(
    code: &[u8],
    pc0: u64,
    pointer: impl Fn(u64) -> Option<u64>,
) -> Option<Value> {
    const X0: usize = 0;
    let stub = pc0..pc0.saturating_add(code.len() as u64);
    let mut regs = Regs::default();
    // Fixed 4-byte instructions: bounded by the code.
    for (i, bytes) in code.chunks_exact(4).enumerate() {
        let pc = pc0.wrapping_add(4 * i as u64);
        let word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let Some(inst) = a64_decode(word) else {
            regs.forget_all();
            continue;
        };
        let field = |at: u32, bits: u32| (word >> at) & ((1 << bits) - 1);
        let rd = a64_reg(field(0, 5));
        let rn = a64_reg(field(5, 5));
        match inst.opcode {
            Opcode::ADRP => {
                // imm = SignExtend(immhi:immlo) << 12, from the PC's page.
                let imm = ((field(5, 19) << 2 | field(29, 2)) as i64) << 43 >> 31;
                let page = (pc & !0xfff).wrapping_add(imm as u64);
                regs.set(rd, Some(Value::Address(page)));
            }
            // ADD (immediate), 64-bit: Rd = Rn + imm12 (<< 12 when sh).
            Opcode::ADD if word & 0xff80_0000 == 0x9100_0000 => {
                let imm = u64::from(field(10, 12)) << (12 * field(22, 1));
                let value = rn
                    .and_then(|n| regs.address(n))
                    .map(|a| Value::Address(a.wrapping_add(imm)));
                // Into SP: not tracked, and nothing tracked changes.
                regs.set(rd, value);
            }
            Opcode::LDR | Opcode::LDUR => {
                let (Operand::Register(size, t), Operand::RegPreIndex(base, offset, false)) =
                    (inst.operands[0], inst.operands[1])
                else {
                    // Literal, register-offset or write-back forms.
                    regs.forget_all();
                    continue;
                };
                let at = a64_reg(u32::from(base))
                    .and_then(|b| regs.address(b))
                    .map(|a| a.wrapping_add(i64::from(offset) as u64));
                let value = match size {
                    SizeCode::W => at.map(Value::Int32At),
                    SizeCode::X => at.and_then(&pointer).map(Value::Address),
                };
                regs.set(a64_reg(u32::from(t)), value);
            }
            // MOV (register): ORR Xd, XZR, Xm with no shift.
            Opcode::ORR if word & 0xffe0_ffe0 == 0xaa00_03e0 => {
                let m = a64_reg(field(16, 5));
                let value = m.and_then(|m| regs.get(m));
                regs.set(rd, value);
            }
            Opcode::B | Opcode::BL => {
                let offset = (((word & 0x03ff_ffff) as i64) << 38 >> 36) as u64;
                if !stub.contains(&pc.wrapping_add(offset)) {
                    return regs.get(X0);
                }
                // A branch within the stub: see the x86-64 case.
                regs.forget_all();
            }
            Opcode::BR | Opcode::BLR | Opcode::BRAA | Opcode::BRAAZ => return regs.get(X0),
            Opcode::RET | Opcode::RETAA => return None,
            // Write no general-purpose register.
            Opcode::CBZ
            | Opcode::CBNZ
            | Opcode::TBZ
            | Opcode::TBNZ
            | Opcode::Bcc(_)
            | Opcode::HINT
            | Opcode::PACIASP => {}
            // CMP, CMN, TST: the flag-setting forms into ZR.
            Opcode::SUBS | Opcode::ADDS | Opcode::ANDS if field(0, 5) == 31 => {}
            _ => regs.forget_all(),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The GOT of the tests: one slot at 0x61fcc0 holding 0x726f80.
    fn got(at: u64) -> Option<u64> {
        (at == 0x61_fcc0).then_some(0x72_6f80)
    }

    #[test]
    fn arm64_executable_passes_the_key_by_value() {
        // Debian's python3.11 (arm64): adrp x0; add x0, #0xff8;
        // ldr x1, [x0, #600]; cbz x1; ldr w0, [x0, #612]; b pthread_getspecific.
        let code = words(&[
            0x9000_2e20,
            0x913f_e000,
            0xf941_2c01,
            0xb400_0061,
            0xb942_6400,
            0x17fe_b9aa,
            0xd280_0000,
            0xd65f_03c0,
        ]);
        let arg = first_argument_arm64(&code, 0x47_14a4, |_| None);
        assert_eq!(arg, Some(Value::Int32At(0xa3_5ff8 + 612)));
        assert_eq!(key_address(arg), Some(0xa3_5ff8 + 0x264));
    }

    #[test]
    fn arm64_library_passes_the_struct_through_the_got() {
        // Debian's libpython3.11.so.1.0 (arm64): adrp x0; ldr x0, [x0, #3264]
        // (GOT: _PyRuntime); ldr x1, [x0, #600]; cbz x1;
        // add x0, x0, #0x260; b PyThread_tss_get.
        let code = words(&[
            0xb000_1bc0,
            0xf946_6000,
            0xf941_2c01,
            0xb400_0061,
            0x9109_8000,
            0x1400_39c6,
            0xd280_0000,
            0xd65f_03c0,
        ]);
        let arg = first_argument_arm64(&code, 0x2a_6a54, got);
        assert_eq!(arg, Some(Value::Address(0x72_6f80 + 0x260)));
        assert_eq!(key_address(arg), Some(0x72_6f80 + 0x264));
        // An unresolvable GOT slot gives no key.
        assert_eq!(first_argument_arm64(&code, 0x2a_6a54, |_| None), None);
    }

    #[test]
    fn x86_executable_and_library() {
        // python3.11: cmp qword [rip+..], 0; je out; mov edi, [rip+..];
        // jmp pthread_getspecific@plt.
        let exe = [
            0x48, 0x83, 0x3d, 0x50, 0x3d, 0x56, 0x00, 0x00, 0x0f, 0x84, 0x1f, 0xc8, 0xf2, 0xff,
            0x8b, 0x3d, 0x50, 0x3d, 0x56, 0x00, 0xe9, 0xa7, 0x8a, 0xf2, 0xff,
        ];
        let arg = first_argument_x86(&exe, 0x4f_7c30, |_| None);
        assert_eq!(arg, Some(Value::Int32At(0xa5_b994)));
        // libpython3.11.so.1.0: mov rax, [rip+GOT]; cmp qword [rax+0x248], 0;
        // je; lea rdi, [rax+0x250]; jmp PyThread_tss_get.
        let lib = [
            0x48, 0x8b, 0x05, 0x01, 0xe6, 0x36, 0x00, 0x48, 0x83, 0xb8, 0x48, 0x02, 0x00, 0x00,
            0x00, 0x74, 0x0f, 0x48, 0x8d, 0xb8, 0x50, 0x02, 0x00, 0x00, 0xe9, 0x23, 0xee, 0x00,
            0x00, 0x0f, 0x1f, 0x00, 0x31, 0xc0, 0xc3,
        ];
        let got = |at| (at == 0x62_1d28).then_some(0x73_7660);
        let arg = first_argument_x86(&lib, 0x2b_3720, got);
        assert_eq!(arg, Some(Value::Address(0x73_7660 + 0x250)));
        assert_eq!(key_address(arg), Some(0x73_7660 + 0x254));
    }

    #[test]
    fn what_is_not_understood_is_forgotten() {
        // mov edi, [rip+..]; shl edi, 1 (not followed); jmp out.
        let code = [
            0x8b, 0x3d, 0x50, 0x3d, 0x56, 0x00, 0xd1, 0xe7, 0xe9, 0x00, 0x10, 0x00, 0x00,
        ];
        assert_eq!(first_argument_x86(&code, 0x1000, |_| None), None);
        // ret before any call: nothing.
        assert_eq!(first_argument_x86(&[0xc3], 0x1000, |_| None), None);
        // arm64: ldr w0, [x0, #612] from an unknown x0; b out.
        let code = words(&[0xb942_6400, 0x1400_0100]);
        assert_eq!(first_argument_arm64(&code, 0x1000, |_| None), None);
        // An undecodable word forgets too.
        let code = words(&[0x9000_2e20, 0x0000_0000, 0x1400_0100]);
        assert_eq!(first_argument_arm64(&code, 0x1000, |_| None), None);
    }
}
