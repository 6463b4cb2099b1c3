//! PLT stubs named `symbol@plt`, as gdb names them: each stub's jump slot
//! is the offset of a dynamic relocation (`.rela.plt`'s jump slots,
//! `.rela.dyn`'s GOT entries for `.plt.got`), and that relocation's symbol
//! is the function the stub calls.
//!
//! x86-64: a stub of `.plt`, `.plt.sec` or `.plt.got` jumps through its
//! slot with `jmp *disp32(%rip)` (`ff 25`), possibly after `endbr64` and
//! a `bnd` prefix: the slot is decoded from the stub itself, so the stubs'
//! order does not matter. AArch64: `.plt` is a 32-byte header, then one
//! 16-byte stub per `.rela.plt` entry, in its order.

use std::collections::HashMap;

use object::elf::{Rela64, EM_AARCH64, EM_X86_64};
use object::read::elf::{ElfFile64, FileHeader as _, SectionHeader as _};
use object::{
    LittleEndian, Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _,
    RelocationTarget, SymbolIndex,
};

/// A stub: `[start, start + size)` calls `name` (raw, without `@plt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stub {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

/// The stubs of `elf`, at most `limit`.
pub fn stubs(elf: &ElfFile64<'_, LittleEndian>, limit: usize) -> Vec<Stub> {
    match elf.elf_header().e_machine(LittleEndian) {
        EM_X86_64 => x86_64(elf, &slots(elf, limit), limit),
        EM_AARCH64 => aarch64(elf, limit),
        _ => Vec::new(),
    }
}

/// Jump slot (or GOT entry) address to the name of its symbol.
fn slots(elf: &ElfFile64<'_, LittleEndian>, limit: usize) -> HashMap<u64, String> {
    let (Some(relocations), Some(table)) = (elf.dynamic_relocations(), elf.dynamic_symbol_table())
    else {
        return HashMap::new();
    };
    relocations
        .take(limit)
        .filter_map(|(offset, r)| {
            let RelocationTarget::Symbol(index) = r.target() else {
                return None;
            };
            let name = table.symbol_by_index(index).ok()?.name().ok()?;
            (!name.is_empty()).then(|| (offset, name.to_owned()))
        })
        .collect()
}

fn x86_64(
    elf: &ElfFile64<'_, LittleEndian>,
    slots: &HashMap<u64, String>,
    limit: usize,
) -> Vec<Stub> {
    let mut out = Vec::new();
    for section in elf.sections() {
        if !matches!(section.name(), Ok(".plt" | ".plt.sec" | ".plt.got")) {
            continue;
        }
        let Ok(data) = section.data() else { continue };
        let entry = section.elf_section_header().sh_entsize(LittleEndian);
        let entry = if (8..=32).contains(&entry) { entry } else { 16 } as usize;
        for (i, stub) in data.chunks_exact(entry).enumerate() {
            if out.len() >= limit {
                return out;
            }
            let start = section.address() + (i * entry) as u64;
            let Some(slot) = jump_slot(stub, start) else {
                continue;
            };
            if let Some(name) = slots.get(&slot) {
                out.push(Stub {
                    start,
                    size: entry as u64,
                    name: name.clone(),
                });
            }
        }
    }
    out
}

/// The slot an x86-64 stub at `start` jumps through: `ff 25 disp32` at
/// its start, after `endbr64` (4 bytes), or after `endbr64; bnd` (5).
fn jump_slot(stub: &[u8], start: u64) -> Option<u64> {
    [0usize, 4, 5].into_iter().find_map(|at| {
        let code = stub.get(at..at + 6)?;
        if code[..2] != [0xff, 0x25] {
            return None;
        }
        let disp = i32::from_le_bytes(code[2..6].try_into().ok()?);
        let next = start.checked_add(at as u64 + 6)?;
        Some(next.wrapping_add_signed(i64::from(disp)))
    })
}

fn aarch64(elf: &ElfFile64<'_, LittleEndian>, limit: usize) -> Vec<Stub> {
    const HEADER: u64 = 32;
    const STUB: u64 = 16;
    let (Some(plt), Some(rela), Some(table)) = (
        elf.section_by_name(".plt"),
        elf.section_by_name(".rela.plt"),
        elf.dynamic_symbol_table(),
    ) else {
        return Vec::new();
    };
    let Ok(relas) = rela
        .elf_section_header()
        .data_as_array::<Rela64<LittleEndian>, _>(LittleEndian, elf.data())
    else {
        return Vec::new();
    };
    relas
        .iter()
        .take(limit)
        .enumerate()
        .filter_map(|(i, r)| {
            let index = SymbolIndex(r.r_sym(LittleEndian, false) as usize);
            let name = table.symbol_by_index(index).ok()?.name().ok()?;
            let start = plt.address().checked_add(HEADER + STUB * i as u64)?;
            (!name.is_empty()).then(|| Stub {
                start,
                size: STUB,
                name: name.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::jump_slot;

    #[test]
    fn the_slot_is_decoded_from_each_stub_form() {
        // jmp *0x2fe2(%rip); push $0; jmp .plt
        let lazy = [
            0xff, 0x25, 0xe2, 0x2f, 0, 0, 0x68, 0, 0, 0, 0, 0xe9, 0, 0, 0, 0,
        ];
        assert_eq!(jump_slot(&lazy, 0x1030), Some(0x1030 + 6 + 0x2fe2));
        // endbr64; bnd jmp *0x2f75(%rip); nop
        let ibt = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x75, 0x2f, 0, 0, 0x0f, 0x1f, 0x44, 0, 0,
        ];
        assert_eq!(jump_slot(&ibt, 0x1060), Some(0x1060 + 11 + 0x2f75));
        // endbr64; jmp *-0x10(%rip)
        let no_bnd = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xff, 0x25, 0xf0, 0xff, 0xff, 0xff, 0, 0,
        ];
        assert_eq!(jump_slot(&no_bnd, 0x2000), Some(0x2000 + 10 - 0x10));
        // endbr64; push; bnd jmp rel32 (a lazy stub of an IBT .plt): none.
        let ibt_lazy = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0, 0, 0, 0, 0xf2, 0xe9, 0, 0, 0, 0, 0x90,
        ];
        assert_eq!(jump_slot(&ibt_lazy, 0x1020), None);
        assert_eq!(jump_slot(&[0xff], 0), None);
    }
}
