//! Synthetic interval data of every shape the kernel tables must handle.
//!
//! Real files give realistic tables but few shapes; these give the edges:
//! no deltas at all, one delta, tables just below and above a size-class
//! boundary, pages left empty by long gaps, a dense page, a push/pop pair
//! split by a page boundary, many distinct rules (slot pressure) and a page
//! with more deltas than a page entry can count (an encoding error). All
//! are built with upstream's append rules, as extraction builds them.

use eim_machine::abi::{opcode, UnwindInfo, PAGE_SIZE};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};

use crate::rng::SimRng;

/// The shapes, in the order of [`Shape::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Empty,
    Tiny,
    Functions,
    Sparse,
    ClassEdge,
    DensePage,
    SplitPair,
    ManyRules,
    Overfull,
}

impl Shape {
    pub const ALL: [Shape; 9] = [
        Shape::Empty,
        Shape::Tiny,
        Shape::Functions,
        Shape::Sparse,
        Shape::ClassEdge,
        Shape::DensePage,
        Shape::SplitPair,
        Shape::ManyRules,
        Shape::Overfull,
    ];
}

fn rule(op: u8, param: i32, fp_op: u8, fp_param: i32) -> UnwindInfo {
    UnwindInfo::new(op, param, fp_op, fp_param)
}

/// A rule from a small palette, so that files share slots.
fn common_rule(rng: &mut SimRng) -> UnwindInfo {
    match rng.weighted(&[6, 3, 1, 1, 1, 1, 1]) {
        0 => info::sp(8 * rng.range(1, 6) as i32),
        1 => rule(
            opcode::BASE_SP,
            8 * rng.range(2, 6) as i32,
            opcode::BASE_CFA,
            -16,
        ),
        2 => rule(opcode::BASE_FP, 16, opcode::BASE_CFA, -16),
        3 => info::STOP,
        4 => info::PLT,
        5 => info::FRAME_POINTER,
        _ => info::SIGNAL,
    }
}

/// Functions of push/pop steps (so merge opcodes occur), each closed by an
/// end marker; `gap` gives the space before each function.
fn functions(
    rng: &mut SimRng,
    data: &mut IntervalData,
    mut addr: u64,
    count: u64,
    gap: &mut dyn FnMut(&mut SimRng) -> u64,
    rule_of: &mut dyn FnMut(&mut SimRng) -> UnwindInfo,
) -> u64 {
    for _ in 0..count {
        addr += gap(rng);
        let rows = rng.range(1, 9);
        for i in 0..rows {
            let hints = if i == 0 { hint::KEEP } else { hint::NONE };
            data.add(StackDelta::new(addr, hints, rule_of(rng)));
            addr += if rng.chance(0.5) {
                rng.range(1, 3)
            } else {
                rng.range(1, 40)
            };
        }
        data.add(StackDelta::new(addr, hint::GAP, info::INVALID));
    }
    addr
}

/// `count` deltas one `step` apart with alternating rules, so none folds,
/// and 32 bytes of stack apart, so no pair merges: the table has exactly
/// `count` entries.
fn run_of(data: &mut IntervalData, start: u64, count: u64, step: u64) {
    let (a, b) = (info::sp(8), info::sp(40));
    for i in 0..count {
        let r = if i % 2 == 0 { a } else { b };
        data.add(StackDelta::new(start + i * step, hint::NONE, r));
    }
}

/// Interval data of `shape`, drawn from `rng`.
pub fn generate(shape: Shape, rng: &mut SimRng) -> IntervalData {
    let mut data = IntervalData::new();
    let start = rng.range(1, 0x40) * 0x1000 + rng.below(0x800);
    let small_gap = &mut |r: &mut SimRng| {
        if r.chance(0.8) {
            r.below(32)
        } else {
            r.range(0x8000, 0x3_0000)
        }
    };
    match shape {
        Shape::Empty => {}
        Shape::Tiny => {
            for i in 0..rng.range(1, 3) {
                data.add(StackDelta::new(start + i * 4, hint::KEEP, common_rule(rng)));
            }
        }
        Shape::Functions => {
            let n = rng.range(1, 40);
            functions(rng, &mut data, start, n, small_gap, &mut common_rule);
        }
        Shape::Sparse => {
            // Gaps of up to 1.5 MiB: many empty pages, and gaps past the
            // 512 KiB an interpreter loader may use.
            let n = rng.range(2, 8);
            let gap = &mut |r: &mut SimRng| r.range(0x1_0000, 0x18_0000);
            functions(rng, &mut data, start, n, gap, &mut common_rule);
        }
        Shape::ClassEdge => {
            // Just below, at and above a size-class boundary (2^k entries).
            let k = rng.range(8, 10);
            let count = (1u64 << k) - 2 + rng.below(4);
            let step = rng.range(2, 64);
            run_of(&mut data, start, count, step);
        }
        Shape::DensePage => {
            let page = start & !(PAGE_SIZE - 1);
            let count = rng.range(300, 1500);
            let step = (PAGE_SIZE / count).max(1);
            run_of(&mut data, page, count, step);
        }
        Shape::SplitPair => {
            // A push at the end of a page, the pop on the next page: a
            // merge candidate the encoder must not merge.
            let page = (start & !(PAGE_SIZE - 1)) + PAGE_SIZE;
            let before = rng.range(1, 8);
            data.add(StackDelta::new(page - 0x40, hint::KEEP, info::sp(8)));
            data.add(StackDelta::new(page - before, hint::NONE, info::sp(16)));
            data.add(StackDelta::new(
                page + rng.below(4),
                hint::NONE,
                info::sp(8),
            ));
            if rng.chance(0.5) {
                // And empty pages after it.
                let far = page + rng.range(2, 5) * PAGE_SIZE + 0x100;
                data.add(StackDelta::new(far, hint::GAP, info::INVALID));
            } else {
                data.add(StackDelta::new(page + 0x20, hint::GAP, info::INVALID));
            }
        }
        Shape::ManyRules => {
            // Distinct rules that no other file uses: slot pressure.
            let base = rng.range(1, 1 << 20) as i32;
            let n = rng.range(20, 120);
            let mut next = 0i32;
            let distinct = &mut |r: &mut SimRng| {
                next += 1;
                if r.chance(0.1) {
                    common_rule(r)
                } else {
                    rule(opcode::BASE_SP, 8 * (base + next), opcode::BASE_CFA, -16)
                }
            };
            functions(rng, &mut data, start, n, small_gap, distinct);
        }
        Shape::Overfull => {
            // One page with 65536 deltas: a page entry counts 65535 at most.
            let page = start & !(PAGE_SIZE - 1);
            run_of(&mut data, page, PAGE_SIZE, 1);
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;

    fn pages(d: &IntervalData) -> u64 {
        match (d.first(), d.last()) {
            (Some(a), Some(b)) => (b.address >> 16) - (a.address >> 16) + 1,
            _ => 0,
        }
    }

    #[test]
    fn shapes_have_their_defining_property() {
        let mut rng = SimRng::new(3, Stream::Pool);
        for _ in 0..20 {
            assert!(generate(Shape::Empty, &mut rng).is_empty());
            assert!((1..=3).contains(&generate(Shape::Tiny, &mut rng).len()));
            let edge = generate(Shape::ClassEdge, &mut rng).len() as u64;
            let k = 63 - edge.leading_zeros() as u64;
            assert!(
                edge + 2 >= 1 << (k + 1) || edge <= (1 << k) + 1,
                "{edge} is not near a power of two"
            );
            assert!(pages(&generate(Shape::Sparse, &mut rng)) >= 3);
            let dense = generate(Shape::DensePage, &mut rng);
            assert_eq!(pages(&dense), 1);
            assert!(dense.len() >= 300);
            let split = generate(Shape::SplitPair, &mut rng);
            assert!(pages(&split) >= 2);
            let many = generate(Shape::ManyRules, &mut rng);
            let rules: std::collections::BTreeSet<_> = many.iter().map(|d| d.info).collect();
            assert!(rules.len() >= 10, "{}", rules.len());
        }
        let over = generate(Shape::Overfull, &mut rng);
        assert_eq!(over.len(), 65536);
        assert_eq!(pages(&over), 1);
    }

    #[test]
    fn every_shape_is_sorted_and_the_encoder_takes_all_but_overfull() {
        let mut rng = SimRng::new(4, Stream::Pool);
        for shape in Shape::ALL {
            for _ in 0..5 {
                let d = generate(shape, &mut rng);
                assert!(d.to_vec().windows(2).all(|w| w[0].address < w[1].address));
                let drafted = eim_machine::encode::draft(&d, 1 << 20);
                assert_eq!(drafted.is_err(), shape == Shape::Overfull, "{shape:?}");
            }
        }
    }
}
