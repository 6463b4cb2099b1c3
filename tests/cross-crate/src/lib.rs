//! Shared helpers of eim's cross-crate tests (the test data and the
//! oracle's files are `eim-test-support`'s, shared by every crate).

pub mod refcount;

pub mod gen {
    //! Strategies for realistic interval data: functions of push/pop steps
    //! (so merge opcodes occur), frame-pointer rules, commands, end markers,
    //! and gaps that leave whole 64 KiB pages empty.

    use eim_machine::abi::{opcode, UnwindInfo};
    use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
    use proptest::prelude::*;

    pub fn arb_info() -> impl Strategy<Value = UnwindInfo> {
        prop_oneof![
            6 => (1..7i32).prop_map(|k| UnwindInfo::new(opcode::BASE_SP, 8 * k, 0, 0)),
            3 => (2..7i32).prop_map(|k| UnwindInfo::new(opcode::BASE_SP, 8 * k, opcode::BASE_CFA, -16)),
            1 => Just(UnwindInfo::new(opcode::BASE_FP, 16, opcode::BASE_CFA, -16)),
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
