//! The address of CPython's thread-state key: where the `pthread_key_t`
//! lives that `PyGILState_GetThisThreadState` hands to
//! `pthread_getspecific`.
//!
//! The function is a stub that calls (usually tail-calls) one of:
//!
//! * `pthread_getspecific(key)` / `PyThread_get_key_value(key)` (3.6, or
//!   3.7+ with `PyThread_tss_get` inlined): its first argument is the key's
//!   *value*, a 32-bit load from the key's address (Debian's `python3.11`:
//!   `mov edi, [rip+X]`, `ldr w0, [x0, #612]`);
//! * `PyThread_tss_get(&key)` (3.7+; 3.12+ first asks
//!   `PyThread_tss_is_created(&key)`): its first argument is the *address*
//!   of a `Py_tss_t { int _is_initialized; pthread_key_t _key; }`, so the
//!   key is 4 bytes further (Debian's `libpython3.11.so.1.0`:
//!   `lea rdi, [rax+0x250]`, `add x0, x0, #0x260`, where the base was read
//!   from a GOT slot relocated to `_PyRuntime`).
//!
//! So the key's address follows from how the argument register was formed,
//! which is what this module tracks: per register, "the address A" or "the
//! 32-bit integer stored at A", through address arithmetic, GOT loads
//! (resolved by [`Relocations`]), register moves and calls (which keep the
//! callee-saved registers), along every forward branch of the stub (the
//! state where two paths meet keeps what both agree on). The answer is the
//! argument of the tail calls out of the stub, or of its calls when it has
//! none; all of them must agree on one known value.
//!
//! Upstream instead adds 4 when the address it finds is 8-aligned (from
//! 3.7 on); that guesses the form from an alignment the C types do not
//! promise (`Py_tss_t` is 4-aligned, and a key loaded by value may sit at
//! an 8-aligned address). Both agree on Debian's files and on CPython
//! 3.6 to 3.13 built by pyenv (`tests/eim/loaders.rs`).
//!
//! An instruction the tracker does not understand makes it forget every
//! register (an unknown key is an error the user sees; a wrong one would
//! make every Python stack silently unreadable), except the few that
//! provably write no tracked register: compares, branches, hints, `push`.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::ops::Range;

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
use yaxpeax_arm::armv8::a64::{Opcode, Operand, SizeCode};

use crate::elf::entry::a64_decode;
use crate::elf::{Arch, Elf};
use crate::interp::access::{Relocations, Symbol};

/// Bytes of the stub decoded at most (CPython's are 0x1b to 0x2c bytes).
const MAX_STUB_BYTES: usize = 128;
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

/// The key's address, given the first argument of the call that reads it.
fn key_address(arg: Option<Value>) -> Option<u64> {
    match arg? {
        Value::Int32At(at) => Some(at),
        Value::Address(tss) => tss.checked_add(PY_TSS_KEY_OFFSET),
    }
}

/// The address of the TSS key `stub` (`PyGILState_GetThisThreadState`)
/// reads, or `None` when its code does not show it.
pub(super) fn key_of(elf: &Elf<'_>, stub: Symbol) -> Option<u64> {
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
#[derive(Clone, Default, PartialEq, Eq)]
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

    /// Forgets the registers a call may change (`keep`: the callee-saved).
    fn forget_except(&mut self, keep: &[usize]) {
        for (n, slot) in self.0.iter_mut().enumerate() {
            if !keep.contains(&n) {
                *slot = None;
            }
        }
    }

    fn address(&self, n: usize) -> Option<u64> {
        match self.get(n)? {
            Value::Address(a) => Some(a),
            Value::Int32At(_) => None,
        }
    }

    /// What two paths that meet both hold.
    fn meet(mut self, other: &Regs) -> Regs {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            if mine != theirs {
                *mine = None;
            }
        }
        self
    }
}

/// Where control goes after one instruction.
enum Flow {
    /// To the next instruction.
    Next,
    /// To the next instruction, or to this address.
    Branch(u64),
    /// Only to this address.
    Jump(u64),
    /// Out of the stub, for good (a tail call or an indirect jump), with
    /// the first argument it passes.
    TailCall(Option<Value>),
    /// Out and back (a call) with the first argument; then to the next
    /// instruction with the callee-saved registers kept.
    Call(Option<Value>),
    /// Nowhere (a return).
    Return,
}

/// Runs `step` over the instructions of a stub in address order, along
/// every forward path, and returns the argument its tail calls (or, when
/// it has none, its calls) agree on. `insns` are (address, instruction);
/// `callee_saved` the registers a call keeps.
fn follow<I>(
    insns: impl Iterator<Item = (u64, I)>,
    stub: Range<u64>,
    callee_saved: &[usize],
    mut step: impl FnMut(u64, &I, &mut Regs) -> Flow,
) -> Option<Value> {
    // States arriving at a later address by a jump, met when it is reached.
    let mut arriving: BTreeMap<u64, Regs> = BTreeMap::new();
    let arrive = |at: u64, from: u64, regs: &Regs, arriving: &mut BTreeMap<u64, Regs>| {
        // Backward jumps (loops) and jumps out are not followed.
        if at > from && stub.contains(&at) {
            let met = match arriving.remove(&at) {
                Some(known) => known.meet(regs),
                None => regs.clone(),
            };
            arriving.insert(at, met);
        }
    };
    let (mut tail_calls, mut calls) = (Vec::new(), Vec::new());
    let mut current = Some(Regs::default());
    // One step per instruction of the (bounded) stub.
    for (at, insn) in insns {
        let mut regs = match (current.take(), arriving.remove(&at)) {
            (Some(a), Some(b)) => a.meet(&b),
            (Some(a), None) | (None, Some(a)) => a,
            // Reached by no path we know (padding, or a backward jump).
            (None, None) => continue,
        };
        match step(at, &insn, &mut regs) {
            Flow::Next => current = Some(regs),
            Flow::Branch(to) => {
                arrive(to, at, &regs, &mut arriving);
                current = Some(regs);
            }
            Flow::Jump(to) => arrive(to, at, &regs, &mut arriving),
            Flow::TailCall(arg) => tail_calls.push(arg),
            Flow::Call(arg) => {
                calls.push(arg);
                regs.forget_except(callee_saved);
                current = Some(regs);
            }
            Flow::Return => {}
        }
    }
    let exits = if tail_calls.is_empty() {
        calls
    } else {
        tail_calls
    };
    let first = (*exits.first()?)?;
    exits.iter().all(|&a| a == Some(first)).then_some(first)
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

/// The conditional jumps.
fn x86_jcc(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Ja | Jae | Jb | Jbe | Je | Jne | Jg | Jge | Jl | Jle | Jo | Jno | Jp | Jnp | Js | Jns
    )
}

/// The first argument (`rdi`) the stub passes on.
fn first_argument_x86(code: &[u8], ip: u64, pointer: impl Fn(u64) -> Option<u64>) -> Option<Value> {
    const RDI: usize = 7;
    // rbx, rbp, r12..r15 (the SysV callee-saved registers).
    const CALLEE_SAVED: [usize; 6] = [3, 5, 12, 13, 14, 15];
    let stub = ip..ip.saturating_add(code.len() as u64);
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    // One instruction per step, each at least one byte: bounded by the code.
    let insns = std::iter::from_fn(|| decoder.can_decode().then(|| decoder.decode()));
    let insns = insns.map(|insn| (insn.ip(), insn));
    follow(insns, stub.clone(), &CALLEE_SAVED, |_, insn, regs| {
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
        let target = (insn.op0_kind() == OpKind::NearBranch64).then(|| insn.near_branch_target());
        let inside = target.is_some_and(|t| stub.contains(&t));
        match insn.mnemonic() {
            Mnemonic::Jmp if inside => Flow::Jump(target.unwrap_or_default()),
            Mnemonic::Jmp => Flow::TailCall(regs.get(RDI)),
            // A call into the stub itself is no call of another function.
            Mnemonic::Call if inside => {
                regs.forget_all();
                Flow::Next
            }
            Mnemonic::Call => Flow::Call(regs.get(RDI)),
            m if x86_jcc(m) => target.map_or(Flow::Next, Flow::Branch),
            Mnemonic::Ret => Flow::Return,
            Mnemonic::Mov | Mnemonic::Lea if insn.op_count() == 2 && dest.is_some() => {
                let (d, width) = dest.unwrap_or_default();
                let value = match (insn.mnemonic(), insn.op1_kind(), width) {
                    (Mnemonic::Lea, OpKind::Memory, 64) => memory(regs).map(Value::Address),
                    (Mnemonic::Mov, OpKind::Memory, 32) => memory(regs).map(Value::Int32At),
                    (Mnemonic::Mov, OpKind::Memory, 64) => {
                        memory(regs).and_then(&pointer).map(Value::Address)
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
                regs.set(Some(d), value);
                Flow::Next
            }
            Mnemonic::Add if insn.op_count() == 2 && dest.is_some_and(|(_, w)| w == 64) => {
                let (d, _) = dest.unwrap_or_default();
                let imm = match insn.op1_kind() {
                    OpKind::Immediate8to64 | OpKind::Immediate32to64 => Some(insn.immediate64()),
                    _ => None,
                };
                let value = regs
                    .address(d)
                    .zip(imm)
                    .map(|(a, i)| Value::Address(a.wrapping_add(i)));
                regs.set(Some(d), value);
                Flow::Next
            }
            Mnemonic::Pop if dest.is_some() => {
                regs.set(dest.map(|(d, _)| d), None);
                Flow::Next
            }
            // Write no tracked register (push writes only rsp).
            Mnemonic::Cmp | Mnemonic::Test | Mnemonic::Nop | Mnemonic::Endbr64 | Mnemonic::Push => {
                Flow::Next
            }
            _ => {
                regs.forget_all();
                Flow::Next
            }
        }
    })
}

/// arm64: `n` when it names x0..x30 (not SP or ZR).
fn a64_reg(n: u32) -> Option<usize> {
    (n < 31).then_some(n as usize)
}

/// The first argument (`x0`) the stub passes on.
fn first_argument_arm64(
    code: &[u8],
    pc0: u64,
    pointer: impl Fn(u64) -> Option<u64>,
) -> Option<Value> {
    const X0: usize = 0;
    // x19..x28 and the frame pointer (AAPCS64 callee-saved).
    const CALLEE_SAVED: [usize; 11] = [19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29];
    let stub = pc0..pc0.saturating_add(code.len() as u64);
    // Fixed 4-byte instructions: bounded by the code.
    let insns = code.chunks_exact(4).enumerate().map(|(i, b)| {
        let word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        (pc0.wrapping_add(4 * i as u64), word)
    });
    follow(insns, stub.clone(), &CALLEE_SAVED, |at, &word, regs| {
        let Some(inst) = a64_decode(word) else {
            regs.forget_all();
            return Flow::Next;
        };
        let field = |at: u32, bits: u32| (word >> at) & ((1 << bits) - 1);
        // A PC-relative branch target: SignExtend(imm) * 4.
        let relative = |lsb: u32, bits: u32| {
            let imm = (i64::from(field(lsb, bits)) << (64 - bits)) >> (64 - bits - 2);
            at.wrapping_add(imm as u64)
        };
        let rd = a64_reg(field(0, 5));
        let rn = a64_reg(field(5, 5));
        match inst.opcode {
            Opcode::ADRP => {
                // SignExtend(immhi:immlo) << 12, from the PC's page.
                let imm = ((field(5, 19) << 2 | field(29, 2)) as i64) << 43 >> 31;
                let page = (at & !0xfff).wrapping_add(imm as u64);
                regs.set(rd, Some(Value::Address(page)));
            }
            // ADD (immediate), 64-bit: Rd = Rn + imm12 (<< 12 when sh); into
            // SP it changes nothing tracked.
            Opcode::ADD if word & 0xff80_0000 == 0x9100_0000 => {
                let imm = u64::from(field(10, 12)) << (12 * field(22, 1));
                let value = rn
                    .and_then(|n| regs.address(n))
                    .map(|a| Value::Address(a.wrapping_add(imm)));
                regs.set(rd, value);
            }
            Opcode::LDR | Opcode::LDUR => {
                let (Operand::Register(size, t), Operand::RegPreIndex(base, offset, false)) =
                    (inst.operands[0], inst.operands[1])
                else {
                    // Literal, register-offset or write-back forms.
                    regs.forget_all();
                    return Flow::Next;
                };
                let from = a64_reg(u32::from(base))
                    .and_then(|b| regs.address(b))
                    .map(|a| a.wrapping_add(i64::from(offset) as u64));
                let value = match size {
                    SizeCode::W => from.map(Value::Int32At),
                    SizeCode::X => from.and_then(&pointer).map(Value::Address),
                };
                regs.set(a64_reg(u32::from(t)), value);
            }
            // MOV (register): ORR Xd, XZR, Xm with no shift.
            Opcode::ORR if word & 0xffe0_ffe0 == 0xaa00_03e0 => {
                let value = a64_reg(field(16, 5)).and_then(|m| regs.get(m));
                regs.set(rd, value);
            }
            Opcode::B => {
                let to = relative(0, 26);
                return if stub.contains(&to) {
                    Flow::Jump(to)
                } else {
                    Flow::TailCall(regs.get(X0))
                };
            }
            Opcode::BL | Opcode::BLR => return Flow::Call(regs.get(X0)),
            Opcode::BR | Opcode::BRAA | Opcode::BRAAZ => return Flow::TailCall(regs.get(X0)),
            Opcode::RET | Opcode::RETAA => return Flow::Return,
            Opcode::Bcc(_) | Opcode::CBZ | Opcode::CBNZ => return Flow::Branch(relative(5, 19)),
            Opcode::TBZ | Opcode::TBNZ => return Flow::Branch(relative(5, 14)),
            // Write no tracked register: hints, and the compares (the
            // flag-setting forms into ZR).
            Opcode::HINT | Opcode::PACIASP => {}
            Opcode::SUBS | Opcode::ADDS | Opcode::ANDS if field(0, 5) == 31 => {}
            _ => regs.forget_all(),
        }
        Flow::Next
    })
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
    fn x86_3_12_asks_whether_the_key_exists_first() {
        // pyenv's libpython3.12.so.1.0: mov rax, [rip+GOT]; push rbx;
        // lea rbx, [rax+0x608]; mov rdi, rbx; call PyThread_tss_is_created;
        // test eax, eax; je L; mov rdi, rbx; pop rbx; jmp PyThread_tss_get;
        // nop; L: xor eax, eax; pop rbx; ret.
        let code = [
            0x48, 0x8b, 0x05, 0xc9, 0xc0, 0x26, 0x00, 0x53, 0x48, 0x8d, 0x98, 0x08, 0x06, 0x00,
            0x00, 0x48, 0x89, 0xdf, 0xe8, 0xd9, 0x21, 0xe3, 0xff, 0x85, 0xc0, 0x74, 0x0d, 0x48,
            0x89, 0xdf, 0x5b, 0xe9, 0xec, 0x36, 0xe3, 0xff, 0x0f, 0x1f, 0x40, 0x00, 0x31, 0xc0,
            0x5b, 0xc3,
        ];
        let got = |at| (at == 0x54_3d00).then_some(0x64_3340);
        let arg = first_argument_x86(&code, 0x2d_7c30, got);
        assert_eq!(arg, Some(Value::Address(0x64_3340 + 0x608)));
    }

    #[test]
    fn paths_are_followed_and_must_agree() {
        // mov rax, [rip+GOT]; test rax, rax; jne L; xor eax, eax; ret;
        // L: lea rdi, [rax+0x250]; jmp out. The early return comes first.
        let code = [
            0x48, 0x8b, 0x05, 0xf9, 0x0f, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x75, 0x03, 0x31, 0xc0,
            0xc3, 0x48, 0x8d, 0xb8, 0x50, 0x02, 0x00, 0x00, 0xe9, 0x00, 0x10, 0x00, 0x00,
        ];
        let got = |at| (at == 0x2000).then_some(0x9000);
        assert_eq!(
            first_argument_x86(&code, 0x1000, got),
            Some(Value::Address(0x9250))
        );
        // Two tail calls with different arguments: no answer.
        // mov edi, [rip+A]; test eax, eax; je L; jmp out; L: mov edi, [rip+B];
        // jmp out.
        let code = [
            0x8b, 0x3d, 0x00, 0x01, 0x00, 0x00, 0x85, 0xc0, 0x74, 0x05, 0xe9, 0x00, 0x10, 0x00,
            0x00, 0x8b, 0x3d, 0x00, 0x02, 0x00, 0x00, 0xe9, 0x00, 0x10, 0x00, 0x00,
        ];
        assert_eq!(first_argument_x86(&code, 0x1000, |_| None), None);
        // arm64: cbz x1, L (skips the GOT load on one path); adrp x0;
        // ldr x0, [x0, #3264]; L: add x0, x0, #0x260; b out. The paths
        // disagree on x0 at L: no answer.
        let code = words(&[
            0xb400_0061,
            0xb000_1bc0,
            0xf946_6000,
            0x9109_8000,
            0x1400_0100,
        ]);
        assert_eq!(first_argument_arm64(&code, 0x2a_6a54, got_arm64), None);
    }

    fn got_arm64(at: u64) -> Option<u64> {
        got(at)
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
