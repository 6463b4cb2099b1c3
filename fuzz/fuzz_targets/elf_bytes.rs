//! Arbitrary bytes through the whole ELF extraction (and the vDSO
//! synthesis): any panic, overflow or runaway allocation is a bug. The seed
//! corpus holds real files, so libFuzzer starts from valid ELF structure.
#![no_main]

use eim_core::elf::extract::extract;
use eim_core::elf::{fileid, vdso, Elf};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fileid::file_id_of(data);
    let Ok(elf) = Elf::parse(data) else {
        return;
    };
    if let Ok(deltas) = extract(&elf, None) {
        // Every delta comes from at least one input byte.
        assert!(deltas.len() <= data.len(), "{} deltas from {} bytes", deltas.len(), data.len());
    }
    let _ = vdso::synthesize(&elf);
});
