//! Arbitrary bytes through the whole ELF extraction (and the vDSO
//! synthesis): any panic, overflow or runaway allocation is a bug. The seed
//! corpus holds real files, so libFuzzer starts from valid ELF structure.
//! Each input is also read the way eim reads files, on demand, and must give
//! the same answer (`common/on_demand.rs`).
#![no_main]

use eim_analysis::elf::extract::extract;
use eim_analysis::elf::{fileid, vdso, Elf};
use libfuzzer_sys::fuzz_target;

#[path = "common/on_demand.rs"]
mod on_demand;

fuzz_target!(|data: &[u8]| {
    let _ = fileid::file_id_of(data);
    let Ok(elf) = Elf::parse(data) else {
        on_demand::check(data, None);
        return;
    };
    let extracted = extract(&elf, None);
    if let Ok(deltas) = &extracted {
        // Every delta comes from at least one input byte.
        assert!(
            deltas.len() <= data.len(),
            "{} deltas from {} bytes",
            deltas.len(),
            data.len()
        );
    }
    on_demand::check(data, Some(&extracted));
    let _ = vdso::synthesize(&elf);
});
