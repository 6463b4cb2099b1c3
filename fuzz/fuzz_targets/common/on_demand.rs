//! The differential check of reading on demand: the bytes parsed and
//! extracted through a `LazyFile` (page chunks, string windows, a budget)
//! must give exactly what they give as a slice. The lazy reader may change
//! how bytes are fetched, never an answer.

use eim_analysis::elf::extract::{extract, ExtractError};
use eim_analysis::elf::{Elf, LazyFile, SourceError};
use eim_machine::deltas::IntervalData;

/// Checks `bytes` read on demand against `sliced`, the slice's outcome
/// (`None` when the slice did not parse).
pub fn check(bytes: &[u8], sliced: Option<&Result<IntervalData, ExtractError>>) {
    let lazy = LazyFile::new(Box::new(bytes.to_vec()), bytes.len() as u64);
    let parsed = Elf::parse_lazy(&lazy);
    let Some(sliced) = sliced else {
        assert!(parsed.is_err(), "parsed only when read on demand");
        return;
    };
    let on_demand = parsed.expect("parsed as a slice, so on demand too");
    let again = extract(&on_demand, None);
    if matches!(lazy.failure(), Some(SourceError::OverBudget { .. })) {
        // A refusal by the memory budget is an answer of its own.
        return;
    }
    assert_eq!(
        sliced.as_ref().map_err(|e| e.to_string()),
        again.as_ref().map_err(|e| e.to_string()),
        "read on demand: {:?}",
        lazy.failure()
    );
    assert_eq!(lazy.failure(), None, "a read inside the bytes failed");
}
