//! Small hand-written inputs for the tests that drive the manager over sim
//! maps (`sim/harness/tests`, `tests/cross-crate/tests`): delta tables written as rows, and an
//! interpreter match with offsets, so each test does not grow its own.

use eim_analysis::interp::{InterpreterOffsets, Loaded};
use eim_analysis::InterpreterData;
use eim_core::tracers::LoaderMatch;
use eim_machine::abi::program;
use eim_machine::deltas::info::{sp, INVALID};
use eim_machine::deltas::{IntervalData, StackDelta};

/// Deltas from `(address, hints, cfa)` rows: the rule is "CFA = SP + cfa",
/// or the INVALID marker for a cfa of 0.
pub fn deltas(rows: &[(u64, u8, i32)]) -> IntervalData {
    let mut d = IntervalData::new();
    for &(addr, hints, cfa) in rows {
        let rule = if cfa == 0 { INVALID } else { sp(cfa) };
        d.add(StackDelta::new(addr, hints, rule));
    }
    d
}

/// The interpreter data of [`python`]'s match.
#[derive(Debug)]
pub struct FakePython;

impl InterpreterData for FakePython {
    fn loader(&self) -> &'static str {
        "python"
    }
}

/// What the python loader says of a file it recognised: one range of
/// interpreter offsets, so the file owns an `interpreter_offsets` entry.
pub fn python() -> Vec<LoaderMatch> {
    vec![LoaderMatch {
        loader: "python",
        outcome: Ok(Loaded::new(
            FakePython,
            Some(InterpreterOffsets {
                program: program::PYTHON,
                first: 0x1000..0x2000,
                second: None,
            }),
        )),
    }]
}

/// Three pages, four rules (the first, sp 8, the one most other fixtures
/// share), ending in an INVALID marker.
pub fn three_pages() -> IntervalData {
    use eim_machine::deltas::hint;
    deltas(&[
        (0x7_0100, hint::KEEP, 8),
        (0x7_0104, hint::NONE, 16),
        (0x8_0200, hint::KEEP, 24),
        (0x9_0300, hint::KEEP, 40),
        (0x9_0340, hint::GAP, 0),
    ])
}
