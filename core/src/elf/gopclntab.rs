//! Go's `.gopclntab` (spec 5.6). Placeholder until implemented: finds no
//! Go data.

use std::ops::Range;

use super::Elf;
use crate::deltas::IntervalData;

/// Why a Go table could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GoError {
    #[error("corrupt .gopclntab: {0}")]
    Corrupt(String),
}

/// Adds the deltas of the Go functions to `data`; returns the text range
/// the table covers (FDEs inside it are dropped), or `None` if the file has
/// no Go table.
pub fn extract(_elf: &Elf<'_>, _data: &mut IntervalData) -> Result<Option<Range<u64>>, GoError> {
    Ok(None)
}
