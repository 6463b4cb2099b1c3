//! Shared helpers of eim's cross-crate tests.

use std::path::{Path, PathBuf};

/// `../shared/testdata` next to the repository, or `$EIM_TESTDATA`.
/// Panics loudly when it is missing: an oracle test must never pass by
/// finding nothing to compare.
pub fn testdata_dir() -> PathBuf {
    let dir = std::env::var_os("EIM_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata"));
    assert!(
        dir.join("oracle").is_dir() && dir.join("upstream").is_dir(),
        "oracle test data not found at {} (set EIM_TESTDATA)",
        dir.display()
    );
    dir
}

/// Decompresses an `.xz` file to text.
pub fn read_xz(path: &Path) -> String {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut raw.as_slice(), &mut out)
        .unwrap_or_else(|e| panic!("{}: not a valid xz file: {e:?}", path.display()));
    String::from_utf8(out).unwrap_or_else(|e| panic!("{}: not UTF-8: {e}", path.display()))
}

/// Every `<name>.deltas.xz` of the oracle and upstream sets, sorted.
pub fn oracle_delta_files() -> Vec<PathBuf> {
    let dir = testdata_dir();
    let mut files: Vec<PathBuf> = ["oracle", "upstream"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(dir.join(sub)).expect("readable test data"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".deltas.xz"))
        .collect();
    files.sort();
    files
}

pub mod gen {
    //! Strategies for realistic interval data: functions of push/pop steps
    //! (so merge opcodes occur), frame-pointer rules, commands, end markers,
    //! and gaps that leave whole 64 KiB pages empty.

    use eim_core::abi::{opcode, UnwindInfo};
    use eim_core::deltas::{hint, info, IntervalData, StackDelta};
    use proptest::prelude::*;

    fn rule(op: u8, param: i32, fp_op: u8, fp_param: i32) -> UnwindInfo {
        UnwindInfo {
            opcode: op,
            fp_opcode: fp_op,
            merge_opcode: 0,
            pad: 0,
            param,
            fp_param,
        }
    }

    pub fn arb_info() -> impl Strategy<Value = UnwindInfo> {
        prop_oneof![
            6 => (1..7i32).prop_map(|k| rule(opcode::BASE_SP, 8 * k, 0, 0)),
            3 => (2..7i32).prop_map(|k| rule(opcode::BASE_SP, 8 * k, opcode::BASE_CFA, -16)),
            1 => Just(rule(opcode::BASE_FP, 16, opcode::BASE_CFA, -16)),
            1 => Just(info::STOP),
            1 => Just(info::PLT),
            1 => Just(info::FRAME_POINTER),
            1 => Just(info::SIGNAL),
        ]
    }

    /// (gap before the function, [(bytes to the next row, rule)]).
    fn arb_function() -> impl Strategy<Value = (u64, Vec<(u64, UnwindInfo)>)> {
        (
            prop_oneof![4 => 0..32u64, 1 => 0x8000..0x3_0000u64],
            prop::collection::vec((prop_oneof![1..3u64, 1..40u64], arb_info()), 1..10),
        )
    }

    /// Interval data built with upstream's append rules.
    pub fn arb_interval_data(max_functions: usize) -> impl Strategy<Value = IntervalData> {
        (
            0x1000..0x4_0000u64,
            prop::collection::vec(arb_function(), 0..max_functions),
        )
            .prop_map(|(start, functions)| {
                let mut data = IntervalData::new();
                let mut addr = start;
                for (gap, rows) in functions {
                    addr += gap;
                    for (i, (step, info)) in rows.into_iter().enumerate() {
                        let hints = if i == 0 { hint::KEEP } else { hint::NONE };
                        data.add(StackDelta::new(addr, hints, info));
                        addr += step;
                    }
                    data.add(StackDelta::new(addr, hint::GAP, info::INVALID));
                }
                data
            })
    }
}
