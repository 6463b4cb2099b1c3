//! Structured mutations of real files: the input picks a corpus file and a
//! list of edits aimed at its unwind sections (the parts a hostile
//! container would craft), then runs the whole extraction. Complements
//! `elf_bytes`, whose byte-level mutations rarely keep an ELF valid enough
//! to reach deep into the CFI and Go parsers.
#![no_main]

use arbitrary::Arbitrary;
use eim_analysis::elf::extract::extract;
use eim_analysis::elf::Elf;
use libfuzzer_sys::fuzz_target;

#[path = "common/on_demand.rs"]
mod on_demand;

const FILES: &[&[u8]] = &[
    include_bytes!("../../tests/data/upstream/volname"),
    include_bytes!("../../tests/data/oracle/bin/ccorpus-x86_64-O2"),
    include_bytes!("../../tests/data/oracle/bin/ccorpus-x86_64-O2-debugframe"),
    include_bytes!("../../tests/data/oracle/bin/ccorpus-aarch64-O2"),
    include_bytes!("../../tests/data/oracle/bin/aarch64-libpthread.so.0"),
    include_bytes!("../../tests/data/oracle/bin/gocorpus-go1.23-amd64"),
];

#[derive(Arbitrary, Debug)]
enum Edit {
    /// Overwrite 4 bytes at an offset (scaled into the file).
    Word { at: u32, value: u32 },
    /// Overwrite one byte.
    Byte { at: u32, value: u8 },
    /// Copy a run of bytes from one place to another.
    Copy { from: u32, to: u32, len: u8 },
    /// Cut the file.
    Truncate { at: u32 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    file: u8,
    /// Aim edits at the last third of the file (where unwind and Go tables
    /// usually sit) instead of anywhere.
    aim_high: bool,
    edits: Vec<Edit>,
}

fn place(at: u32, len: usize, aim_high: bool) -> usize {
    let len = len.max(1);
    if aim_high {
        let third = len / 3;
        len - third + (at as usize % third.max(1))
    } else {
        at as usize % len
    }
}

fuzz_target!(|input: Input| {
    let mut b = FILES[input.file as usize % FILES.len()].to_vec();
    for edit in input.edits.iter().take(16) {
        let n = b.len();
        match *edit {
            Edit::Word { at, value } => {
                let at = place(at, n, input.aim_high);
                for (i, x) in value.to_le_bytes().iter().enumerate() {
                    if let Some(slot) = b.get_mut(at + i) {
                        *slot = *x;
                    }
                }
            }
            Edit::Byte { at, value } => {
                let at = place(at, n, input.aim_high);
                if let Some(slot) = b.get_mut(at) {
                    *slot = value;
                }
            }
            Edit::Copy { from, to, len } => {
                let (from, to) = (place(from, n, false), place(to, n, input.aim_high));
                let end = (from + len as usize).min(n);
                let chunk = b[from..end].to_vec();
                for (i, x) in chunk.iter().enumerate() {
                    if let Some(slot) = b.get_mut(to + i) {
                        *slot = *x;
                    }
                }
            }
            Edit::Truncate { at } => b.truncate(place(at, n, input.aim_high)),
        }
    }
    let Ok(elf) = Elf::parse(&b) else {
        on_demand::check(&b, None);
        return;
    };
    let extracted = extract(&elf, None);
    if let Ok(deltas) = &extracted {
        assert!(
            deltas.len() <= b.len(),
            "{} deltas from {} bytes",
            deltas.len(),
            b.len()
        );
    }
    // Read the way eim reads files, the same answer.
    on_demand::check(&b, Some(&extracted));
});
