//! Applies ops to a backend in order and says exactly where it stopped.
//! This is the only code that hands the machine's ops to a backend.

use std::borrow::Cow;

use crate::machine::Stopped;
use crate::ops::{Backend, Errno, MapOp, OpFailure};

/// Applies `ops` in order, stopping at the first failure. A delete that
/// finds an entry already gone is not a failure: the state it wants holds,
/// so the rest of that batch is applied.
pub fn execute<B: Backend + ?Sized>(backend: &mut B, ops: &[MapOp]) -> Result<(), Stopped> {
    for (at, op) in ops.iter().enumerate() {
        apply_one(backend, op).map_err(|failure| Stopped { at, failure })?;
    }
    Ok(())
}

/// Applies one op; see [`execute`] for missing entries of deletes.
pub fn apply_one<B: Backend + ?Sized>(backend: &mut B, op: &MapOp) -> Result<(), OpFailure> {
    let mut current = Cow::Borrowed(op);
    let mut base = 0;
    // Each round consumes at least one element, so this ends.
    for _ in 0..=op.len() {
        match backend.apply(&current) {
            Ok(()) => return Ok(()),
            Err(f) if f.errno == Errno::ENOENT && current.is_delete() => {
                base += f.done + 1;
                match current.tail(f.done + 1) {
                    Some(rest) => current = Cow::Owned(rest),
                    None => return Ok(()),
                }
            }
            Err(f) => return Err(OpFailure::new(f.errno, base + f.done)),
        }
    }
    Ok(())
}
