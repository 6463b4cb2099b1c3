//! Arbitrary bytes through the whole ELF extraction (and the vDSO
//! synthesis): any panic, overflow or runaway allocation is a bug. The seed
//! corpus holds real files, so libFuzzer starts from valid ELF structure.
//!
//! Each input is also read the way eim reads files, on demand through a
//! `LazyFile` (page chunks, string windows, a budget), and must give
//! exactly what the same bytes give as a slice: the lazy reader may never
//! change an answer, only how the bytes are fetched.
#![no_main]

use eim_core::elf::extract::extract;
use eim_core::elf::{fileid, vdso, Elf, LazyFile, SourceError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fileid::file_id_of(data);
    let Ok(elf) = Elf::parse(data) else {
        let lazy = LazyFile::new(Box::new(data.to_vec()), data.len() as u64);
        assert!(Elf::parse_lazy(&lazy).is_err(), "parsed only when read on demand");
        return;
    };
    let extracted = extract(&elf, None);
    if let Ok(deltas) = &extracted {
        // Every delta comes from at least one input byte.
        assert!(deltas.len() <= data.len(), "{} deltas from {} bytes", deltas.len(), data.len());
    }
    let lazy = LazyFile::new(Box::new(data.to_vec()), data.len() as u64);
    let on_demand = Elf::parse_lazy(&lazy).expect("parsed as a slice, so on demand too");
    let again = extract(&on_demand, None);
    if matches!(lazy.failure(), Some(SourceError::OverBudget { .. })) {
        // A refusal by the memory budget is an answer of its own.
        return;
    }
    assert_eq!(
        extracted.as_ref().map_err(|e| e.to_string()),
        again.as_ref().map_err(|e| e.to_string()),
        "read on demand: {:?}",
        lazy.failure()
    );
    assert_eq!(lazy.failure(), None, "a read inside the bytes failed");
    let _ = vdso::synthesize(&elf);
});
