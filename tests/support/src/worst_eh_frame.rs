//! The worst input eim's caps allow a CFI walk: an x86-64 ELF file whose
//! `.eh_frame` is as big as eim reads (just under 64 MiB, its
//! `MAX_SECTION_BYTES`), made of the smallest FDEs a toolchain emits
//! (3,355,442 of them), in one of the [`Shape`]s: with an `.eh_frame_hdr`
//! search table (the table walk) or without (the linear walk, whose deltas
//! are sorted at the end), functions back to back (their deltas fold
//! away) or apart (two deltas each: the function's rule and its end
//! marker, 6.7 million).
//!
//! For the memory tests (tests/eim/memory_limits.rs), the bench figure in
//! docs/BENCHMARKS.md (`cargo run --example worst_eh_frame -- FILE`), and
//! eim-core's test that the walk of such a file gives exactly the
//! sequential walk's deltas.

use crate::elf::{Header, EHDR_SIZE, PHDR_SIZE, SHDR_SIZE};

/// eim's cap on a CFI section (`eim_analysis::elf::ehframe::MAX_SECTION_BYTES`,
/// restated: this crate depends on no eim crate).
pub const MAX_SECTION_BYTES: usize = 64 << 20;

/// A 4-byte aligned FDE with no instructions: length, CIE pointer,
/// `pc_begin` and `pc_range` (pcrel sdata4), augmentation length, and
/// three `DW_CFA_nop`s of padding.
pub const FDE_BYTES: usize = 20;

/// Where the first function starts; each is [`FUNCTION_BYTES`] long.
pub const FIRST_FUNCTION: u64 = 0x1000_0000;
pub const FUNCTION_BYTES: u32 = 16;

/// How the FDEs are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// With an `.eh_frame_hdr` search table naming every FDE.
    pub search_table: bool,
    /// Functions 16 bytes apart (after each one's end), more than the 15
    /// bytes of padding eim folds an end marker into: two deltas each.
    /// Otherwise back to back: the deltas fold into a few.
    pub apart: bool,
}

impl Shape {
    /// The most deltas: a search table, functions apart.
    pub const WORST: Self = Self {
        search_table: true,
        apart: true,
    };

    fn stride(self) -> u64 {
        if self.apart {
            2 * u64::from(FUNCTION_BYTES)
        } else {
            u64::from(FUNCTION_BYTES)
        }
    }
}

/// The CIE: "zR", code align 1, data align -8, return address r16,
/// pcrel sdata4 pointers; `def_cfa rsp+8; offset r16 at cfa-8`.
const CIE: [u8; 24] = [
    20, 0, 0, 0, // length
    0, 0, 0, 0, // CIE id
    1, b'z', b'R', 0, // version, augmentation
    1, 0x78, 16, 1, 0x1b, // code align, data align, RA, aug length, enc
    0x0c, 7, 8, 0x90, 1, // initial instructions
    0, 0, // nops
];

const EHDR: usize = EHDR_SIZE;
const PHDR: usize = PHDR_SIZE;
const SHDR: usize = SHDR_SIZE;

/// How many FDEs fit a section of at most `section_bytes` after the CIE.
pub fn fdes_in(section_bytes: usize) -> usize {
    section_bytes.saturating_sub(CIE.len()) / FDE_BYTES
}

/// The file: `fdes` FDEs (use [`fdes_in`]`(`[`MAX_SECTION_BYTES`]`)` for
/// the worst case) laid out as `shape` says.
pub fn minimal_fde_elf(fdes: usize, shape: Shape) -> Vec<u8> {
    let phdrs = 2;
    let hdr_at = EHDR + phdrs * PHDR;
    // Without a search table: a header naming no table (eim then finds no
    // usable one and walks the section), as a file without one reads.
    let entries = if shape.search_table { fdes } else { 0 };
    let hdr_len = 12 + 8 * entries;
    let function = |i: usize| FIRST_FUNCTION + i as u64 * shape.stride();
    let eh_at = (hdr_at + hdr_len).next_multiple_of(8);
    let eh_len = CIE.len() + FDE_BYTES * fdes;
    let strtab_at = eh_at + eh_len;
    let strtab: &[u8] = b"\0.eh_frame_hdr\0.eh_frame\0.shstrtab\0";
    let sh_at = (strtab_at + strtab.len()).next_multiple_of(8);
    let total = sh_at + 4 * SHDR;
    let mut f = Vec::with_capacity(total);

    // ELF header: 64-bit, little-endian, ET_DYN, x86-64.
    let header = Header {
        phoff: EHDR as u64,
        shoff: sh_at as u64,
        phnum: phdrs as u16,
        shnum: 4,
        shstrndx: 3,
        ..Header::default()
    };
    f.extend_from_slice(&header.bytes());

    // PT_LOAD of the whole file at vaddr 0 (r-x), PT_GNU_EH_FRAME.
    phdr(&mut f, 1, 5, 0, total as u64, 0x1000);
    phdr(&mut f, 0x6474_e550, 4, hdr_at as u64, hdr_len as u64, 4);

    // .eh_frame_hdr: version 1, eh_frame_ptr pcrel sdata4, count udata4,
    // table datarel sdata4; entries (function start, FDE) by address.
    let table_enc = if shape.search_table { 0x3b } else { 0xff };
    f.extend_from_slice(&[1, 0x1b, 0x03, table_enc]);
    put32(&mut f, (eh_at as u32).wrapping_sub(hdr_at as u32 + 4));
    put32(&mut f, entries as u32);
    for i in 0..entries {
        let fde = (eh_at + CIE.len() + i * FDE_BYTES) as u64;
        put32(&mut f, function(i).wrapping_sub(hdr_at as u64) as u32);
        put32(&mut f, fde.wrapping_sub(hdr_at as u64) as u32);
    }
    f.resize(eh_at, 0);

    // .eh_frame: the CIE, then the FDEs, each naming the CIE at eh_at.
    f.extend_from_slice(&CIE);
    for i in 0..fdes {
        let at = eh_at + CIE.len() + i * FDE_BYTES;
        let id_pos = at + 4;
        let pc_field = id_pos + 4;
        put32(&mut f, (FDE_BYTES - 4) as u32);
        put32(&mut f, (id_pos - eh_at) as u32);
        put32(&mut f, function(i).wrapping_sub(pc_field as u64) as u32);
        put32(&mut f, FUNCTION_BYTES);
        f.extend_from_slice(&[0, 0, 0, 0]); // augmentation length, nops
    }
    f.extend_from_slice(strtab);
    f.resize(sh_at, 0);

    // Section headers: null, .eh_frame_hdr, .eh_frame, .shstrtab.
    f.extend_from_slice(&[0; SHDR]);
    shdr(&mut f, 1, 1, 2, hdr_at, hdr_len, 4);
    shdr(&mut f, 15, 1, 2, eh_at, eh_len, 8);
    shdr(&mut f, 25, 3, 0, strtab_at, strtab.len(), 1);
    debug_assert_eq!(f.len(), total);
    f
}

fn put32(f: &mut Vec<u8>, v: u32) {
    f.extend_from_slice(&v.to_le_bytes());
}

fn put64(f: &mut Vec<u8>, v: u64) {
    f.extend_from_slice(&v.to_le_bytes());
}

fn phdr(f: &mut Vec<u8>, kind: u32, flags: u32, offset: u64, size: u64, align: u64) {
    put32(f, kind);
    put32(f, flags);
    put64(f, offset);
    put64(f, offset); // vaddr
    put64(f, offset); // paddr
    put64(f, size);
    put64(f, size);
    put64(f, align);
}

fn shdr(f: &mut Vec<u8>, name: u32, kind: u32, flags: u64, at: usize, len: usize, align: u64) {
    put32(f, name);
    put32(f, kind);
    put64(f, flags);
    put64(f, at as u64); // addr
    put64(f, at as u64); // offset
    put64(f, len as u64);
    put32(f, 0);
    put32(f, 0);
    put64(f, align);
    put64(f, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_case_fills_the_cap_and_gimli_reads_every_fde() {
        let fdes = fdes_in(MAX_SECTION_BYTES);
        assert!(CIE.len() + fdes * FDE_BYTES <= MAX_SECTION_BYTES);
        assert!(CIE.len() + (fdes + 1) * FDE_BYTES > MAX_SECTION_BYTES);
        let small = minimal_fde_elf(100, Shape::WORST);
        // The .eh_frame section: from its header.
        let sh_at = u64::from_le_bytes(small[40..48].try_into().unwrap()) as usize;
        let eh = &small[sh_at + 2 * SHDR..sh_at + 3 * SHDR];
        let at = u64::from_le_bytes(eh[24..32].try_into().unwrap()) as usize;
        let len = u64::from_le_bytes(eh[32..40].try_into().unwrap()) as usize;
        // One row per FDE (no instructions).
        assert_eq!(crate::cfi::gimli_rows(&small[at..at + len], at as u64), 100);
    }
}
