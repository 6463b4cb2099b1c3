//! Upstream's vectors (spec 5.8 and 6.1): the full `volname` delta list and
//! the arm64 vDSO list, loaded into a fresh machine, give exactly the kernel
//! deltas and unwind infos upstream's `loadDeltas` writes.

use eim_machine::abi::{self, opcode, UnwindInfo};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::machine::{Capacities, KernelBook};
use eim_machine::text::Tables;
use eim_machine::FileId;

/// "SP n": CFA = SP + n, no frame-pointer rule.
fn sp(n: i32) -> UnwindInfo {
    UnwindInfo::new(opcode::BASE_SP, n, 0, 0)
}

/// "SP n/F k": CFA = SP + n, saved FP at CFA - k.
fn spf(n: i32, k: i32) -> UnwindInfo {
    UnwindInfo::new(opcode::BASE_SP, n, opcode::BASE_CFA, -k)
}

fn d(address: u64, hints: u8, info: UnwindInfo) -> StackDelta {
    StackDelta::new(address, hints, info)
}

fn volname() -> IntervalData {
    use hint::{GAP, KEEP, NONE};
    IntervalData::from_deltas(vec![
        d(0x850, KEEP, sp(16)),
        d(0x856, NONE, sp(24)),
        d(0x860, KEEP, sp(8)),
        d(0x8d1, NONE, spf(16, 16)),
        d(0x8d2, NONE, spf(24, 16)),
        d(0x8e7, NONE, spf(80, 16)),
        d(0x9ec, NONE, spf(24, 16)),
        d(0x9ed, NONE, spf(16, 16)),
        d(0x9ee, NONE, sp(8)),
        d(0x9f0, KEEP, info::STOP),
        d(0xa1b, GAP, info::INVALID),
        d(0xb20, KEEP, sp(8)),
        d(0xb22, NONE, sp(16)),
        d(0xb24, NONE, sp(24)),
        d(0xb29, NONE, sp(32)),
        d(0xb2b, NONE, sp(40)),
        d(0xb33, NONE, spf(48, 48)),
        d(0xb3b, NONE, spf(56, 48)),
        d(0xb48, NONE, spf(64, 48)),
        d(0xb7a, NONE, spf(56, 48)),
        d(0xb7b, NONE, spf(48, 48)),
        d(0xb7c, NONE, sp(40)),
        d(0xb7e, NONE, sp(32)),
        d(0xb80, NONE, sp(24)),
        d(0xb82, NONE, sp(16)),
        d(0xb84, KEEP, sp(8)),
        d(0xb92, GAP, info::INVALID),
    ])
}

fn load_fresh(deltas: &IntervalData) -> Tables {
    let mut book = KernelBook::new(Capacities::default());
    let plan = book.plan_load(FileId(1), deltas, None).expect("plan");
    Tables::of_plan(&plan)
}

fn pairs(t: &Tables) -> Vec<(u16, u16)> {
    t.kernel_deltas
        .iter()
        .map(|d| (d.addr_low, d.unwind_info))
        .collect()
}

fn infos(t: &Tables) -> Vec<(u8, u8, u8, i32, i32)> {
    t.unwind_infos
        .iter()
        .enumerate()
        .map(|(i, (slot, u))| {
            assert_eq!(
                usize::from(*slot),
                i,
                "a fresh machine hands out slots in order"
            );
            (u.opcode, u.fp_opcode, u.merge_opcode, u.param, u.fp_param)
        })
        .collect()
}

#[test]
fn volname_encodes_to_upstreams_twenty_kernel_deltas() {
    let input = volname();
    assert_eq!(input.len(), 27);
    let t = load_fresh(&input);
    assert_eq!(t.map_id, 8);
    assert_eq!(
        pairs(&t),
        vec![
            (0x850, 0),
            (0x856, 1),
            (0x860, 2),
            (0x8d1, 3),
            (0x8e7, 4),
            (0x9ec, 5),
            (0x9ee, 2),
            (0x9f0, 0x8001),
            (0xa1b, 0x8000),
            (0xb20, 6),
            (0xb24, 1),
            (0xb29, 7),
            (0xb33, 8),
            (0xb3b, 9),
            (0xb48, 10),
            (0xb7a, 11),
            (0xb7c, 12),
            (0xb80, 13),
            (0xb84, 2),
            (0xb92, 0x8000),
        ]
    );
    assert_eq!(
        infos(&t),
        vec![
            (2, 0, 0, 16, 0),
            (2, 0, 0, 24, 0),
            (2, 0, 0, 8, 0),
            (2, 1, 1, 16, -16),
            (2, 1, 0, 80, -16),
            (2, 1, 0x81, 24, -16),
            (2, 0, 2, 8, 0),
            (2, 0, 2, 32, 0),
            (2, 1, 0, 48, -48),
            (2, 1, 0, 56, -48),
            (2, 1, 0, 64, -48),
            (2, 1, 0x81, 56, -48),
            (2, 0, 0x82, 40, 0),
            (2, 0, 0x82, 24, 0),
        ]
    );
    let pages: Vec<_> = t
        .pages
        .iter()
        .map(|(k, v)| (k.page, v.first_delta, v.num_deltas, v.map_id))
        .collect();
    assert_eq!(pages, vec![(0, 0, 20, 8)]);
    assert!(t.gaps.is_empty(), "0xa1b..0xb20 is far below 512 KiB");
}

#[test]
fn arm64_vdso_encodes_to_seven_kernel_deltas() {
    let lr = info::LR;
    let f16 = UnwindInfo::new(opcode::BASE_FP, 16, opcode::BASE_FP, 8);
    let input = IntervalData::from_deltas(vec![
        d(0, 0, lr),
        d(0x7d8, 0, f16),
        d(0x7e4, 0, lr),
        d(0x800, 0, f16),
        d(0x80c, 0, lr),
        d(0x8f8, 0, info::SIGNAL),
        d(0x900, 0, lr),
    ]);
    let t = load_fresh(&input);
    let (a, b) = (0, 1);
    assert_eq!(
        pairs(&t),
        vec![
            (0, a),
            (0x7d8, b),
            (0x7e4, a),
            (0x800, b),
            (0x80c, a),
            (0x8f8, abi::encoded_command::SIGNAL),
            (0x900, a),
        ]
    );
    assert_eq!(infos(&t), vec![(2, 4, 0, 0, 0), (3, 3, 0, 16, 8)]);
}

#[test]
fn a_second_file_reuses_the_slots_of_the_first() {
    let mut book = KernelBook::new(Capacities::default());
    let first = book.plan_load(FileId(1), &volname(), None).unwrap();
    book.commit_load(first);
    let second = book.plan_load(FileId(2), &volname(), None).unwrap();
    let t = Tables::of_plan(&second);
    assert!(t.unwind_infos.is_empty(), "every rule already has a slot");
    assert_eq!(t.kernel_deltas.len(), 20);
}
