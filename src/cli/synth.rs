//! Synthetic executables for `eim demo`: interval data shaped like what
//! extraction yields for real x86-64 binaries, deterministic from a seed.
//!
//! Every delta goes through [`IntervalData::add`], so upstream's folding
//! rules (repeats, same-address replacement, end-of-function padding) shape
//! the lists exactly as they would shape extracted ones. The shapes are
//! chosen to exercise the encoder: push/pop sequences one or two bytes apart
//! (merged kernel entries), frame-pointer rules, STOP at the entry point,
//! PLT stubs, end-of-function markers that survive or fold away, files
//! spanning several 64 KiB pages with empty pages between them, one file
//! without deltas, and sizes from a few dozen to ~60,000 deltas (size
//! classes 8 to 16).

use eim::abi::{opcode, UnwindInfo, PAGE_SIZE};
use eim::deltas::{hint, info, IntervalData, StackDelta};
use eim::FileId;

/// xorshift64*: tiny, fast and stable across releases, which is the point:
/// the same seed must give the same demo on every machine and every version
/// of eim's dependencies.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Any seed works, zero included (splitmix64 spreads it first).
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Self(z | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift (no modulo bias worth
    /// caring about at these sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// One generated executable.
#[derive(Clone, Debug)]
pub struct SynthFile {
    pub name: String,
    pub id: FileId,
    pub data: IntervalData,
    /// Chance (percent) that a simulated process maps this file.
    pub popularity: u64,
}

/// Names that make the demo read like a real host; later files get numbered
/// names.
const NAMES: &[&str] = &[
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libz.so.1",
    "libssl.so.3",
    "libcrypto.so.3",
    "bash",
    "python3.11",
    "postgres",
    "nginx",
];

/// How big a file's unwind table is, roughly (in deltas).
fn target_deltas(rng: &mut Rng, index: usize) -> usize {
    // File 3 is always a big one so every demo reaches the larger classes.
    if index == 3 {
        return rng.range(40_000, 60_000) as usize;
    }
    let n = match rng.below(100) {
        0..=44 => rng.range(20, 600),
        45..=79 => rng.range(600, 6_000),
        80..=94 => rng.range(6_000, 25_000),
        _ => rng.range(25_000, 60_000),
    };
    n as usize
}

/// An SP-based rule (CFA = SP + `param`) with the given frame-pointer rule.
fn sp(param: i64, fp: (u8, i32)) -> UnwindInfo {
    UnwindInfo {
        opcode: opcode::BASE_SP,
        fp_opcode: fp.0,
        param: param as i32,
        fp_param: fp.1,
        ..UnwindInfo::default()
    }
}

/// An FP-based rule (CFA = RBP + 16), with RBP saved at CFA - 16.
fn fp_based() -> UnwindInfo {
    UnwindInfo {
        opcode: opcode::BASE_FP,
        fp_opcode: opcode::BASE_CFA,
        param: 16,
        fp_param: -16,
        ..UnwindInfo::default()
    }
}

/// RBP saved at CFA - 16, as after `push %rbp`.
const FP_SAVED: (u8, i32) = (opcode::BASE_CFA, -16);
const FP_NONE: (u8, i32) = (0, 0);

struct Builder<'a> {
    rng: &'a mut Rng,
    data: IntervalData,
}

impl Builder<'_> {
    fn add(&mut self, address: u64, hints: u8, info: UnwindInfo) {
        self.data.add(StackDelta::new(address, hints, info));
    }

    /// `.plt`: one PLT command over all stubs, closed by an end marker.
    fn plt(&mut self, start: u64) -> u64 {
        let stubs = self.rng.range(4, 200);
        self.add(start, hint::KEEP, info::PLT);
        let end = start + 16 * (stubs + 1);
        self.add(end, hint::GAP, info::INVALID);
        end
    }

    /// `_start`: the unwinder must stop here.
    fn entry(&mut self, start: u64) -> u64 {
        self.add(start, hint::KEEP, info::STOP);
        let end = start + self.rng.range(0x20, 0x40);
        self.add(end, hint::GAP, info::INVALID);
        end
    }

    /// One function: prologue pushes, a body with calls (some pushing
    /// arguments), one or two epilogues, and the end marker. Returns the
    /// address just past its last byte.
    fn function(&mut self, start: u64) -> u64 {
        let mut at = start;
        self.add(at, hint::KEEP, sp(8, FP_NONE));
        if self.rng.percent(30) {
            // Frame-pointer function: push %rbp; mov %rsp,%rbp; ...; leave; ret.
            at += 1;
            self.add(at, hint::NONE, sp(16, FP_SAVED));
            at += 3;
            self.add(at, hint::NONE, fp_based());
            at += self.rng.range(8, 600);
            if self.rng.percent(40) {
                // An early return: leave; ret; then the frame again.
                self.add(at, hint::NONE, sp(8, FP_SAVED));
                at += 1;
                self.add(at, hint::NONE, fp_based());
                at += self.rng.range(8, 300);
            }
            self.add(at, hint::NONE, sp(8, FP_SAVED));
            return at + 1;
        }
        // Leaf or callee-saved pushes, CFA tracked through SP. Pushing %rbp
        // first (as gcc -O2 often does) gives the frame-pointer rule.
        let pushes = self.rng.below(6);
        let fp = if pushes > 0 && self.rng.percent(50) {
            FP_SAVED
        } else {
            FP_NONE
        };
        let mut depth = 8i64;
        let mut widths = Vec::with_capacity(pushes as usize);
        for i in 0..pushes {
            // push %rbx / %rbp is one byte, push %r12..%r15 two.
            let width = if i == 0 || self.rng.percent(30) { 1 } else { 2 };
            widths.push(width);
            at += width;
            depth += 8;
            self.add(at, hint::NONE, sp(depth, fp));
        }
        let frame = if self.rng.percent(50) {
            16 * self.rng.range(1, 40) as i64
        } else {
            0
        };
        if frame != 0 {
            at += 4;
            self.add(at, hint::NONE, sp(depth + frame, fp));
        }
        let body_depth = depth + frame;
        for _ in 0..self.rng.below(8) {
            at += self.rng.range(5, 120);
            if self.rng.percent(25) {
                // Stack-passed arguments: push, push, call, add $16,%rsp.
                self.add(at, hint::NONE, sp(body_depth + 8, fp));
                at += 2;
                self.add(at, hint::NONE, sp(body_depth + 16, fp));
                at += self.rng.range(5, 12);
                self.add(at, hint::NONE, sp(body_depth, fp));
            }
        }
        let epilogues = if pushes > 0 && self.rng.percent(30) {
            2
        } else {
            1
        };
        for e in 0..epilogues {
            at += self.rng.range(3, 80);
            let mut d = body_depth;
            if frame != 0 {
                at += 4;
                d -= frame;
                self.add(at, hint::NONE, sp(d, fp));
            }
            for &width in widths.iter().rev() {
                at += width;
                d -= 8;
                self.add(at, hint::NONE, sp(d, fp));
            }
            // ret
            at += 1;
            if e + 1 < epilogues {
                // The code after an early return runs with the full frame.
                self.add(at, hint::NONE, sp(body_depth, fp));
            }
        }
        at
    }

    fn end_function(&mut self, end: u64) {
        self.add(end, hint::GAP, info::INVALID);
    }
}

/// Generates one file's interval data with about `target` deltas.
fn interval_data(rng: &mut Rng, target: usize, with_plt: bool) -> IntervalData {
    let spans_pages = rng.percent(35);
    let base = if rng.percent(20) { 0x40_0000 } else { 0x1000 };
    let mut b = Builder {
        rng,
        data: IntervalData::new(),
    };
    let mut at = base;
    if with_plt {
        at = b.plt(at);
        at = (at + 0xff) & !0xff;
    }
    // About eight deltas per function: aim for a few holes per file.
    let expected_functions = target as u64 / 8 + 1;
    let hole_odds = expected_functions / 3 + 1;
    let entry_after = b.rng.below(expected_functions / 2 + 1);
    let mut functions = 0u64;
    while b.data.len() < target {
        if functions == entry_after {
            at = b.entry(at);
        } else {
            let end = b.function(at);
            b.end_function(end);
            at = end;
        }
        functions += 1;
        // Functions start 16-byte aligned; a start within 15 bytes of the
        // end marker folds it away, a longer pad keeps it.
        at = (at + 15) & !15;
        if b.rng.percent(10) {
            at += 16 * b.rng.range(1, 8);
        }
        if spans_pages && b.rng.below(hole_odds) == 0 {
            // A hole of whole pages: their page entries stay empty.
            at += PAGE_SIZE * b.rng.range(1, 4);
        }
    }
    b.data
}

/// The demo's files: `count` of them, deterministic from `seed`. The last
/// file (when there are at least two) has no deltas at all, like a stripped
/// data-only library: it is known to the manager but writes nothing.
pub fn files(count: usize, seed: u64) -> Vec<SynthFile> {
    let mut rng = Rng::new(seed);
    let mut ids = std::collections::HashSet::new();
    (0..count)
        .map(|index| {
            let name = NAMES
                .get(index)
                .map_or_else(|| format!("libdemo-{index:04}.so"), |n| n.to_string());
            let id = loop {
                let id = FileId(rng.next_u64());
                if id.0 != 0 && ids.insert(id) {
                    break id;
                }
            };
            let empty = count >= 2 && index == count - 1;
            let data = if empty {
                IntervalData::new()
            } else {
                let target = target_deltas(&mut rng, index);
                let with_plt = index != 0 && rng.percent(80);
                interval_data(&mut rng, target, with_plt)
            };
            // The dynamic loader and libc are in nearly every process.
            let popularity = match index {
                0 | 1 => 95,
                _ => rng.range(2, 25),
            };
            SynthFile {
                name,
                id,
                data,
                popularity,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim::machine::{Capacities, KernelBook};

    #[test]
    fn the_same_seed_gives_the_same_files() {
        let a = files(8, 7);
        let b = files(8, 7);
        assert_eq!(a.len(), 8);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.id, &x.data, x.popularity), (y.id, &y.data, y.popularity));
        }
        assert_ne!(files(8, 8)[0].data, a[0].data);
    }

    #[test]
    fn files_are_sorted_varied_and_encodable() {
        let all = files(12, 1);
        assert!(all.last().is_some_and(|f| f.data.is_empty()));
        let mut book = KernelBook::new(Capacities::default());
        let mut classes = std::collections::BTreeSet::new();
        let mut merged = 0;
        for f in &all {
            assert!(f
                .data
                .to_vec()
                .windows(2)
                .all(|w| w[0].address < w[1].address));
            assert!(f.data.len() <= 61_000, "{} has {}", f.name, f.data.len());
            let plan = book.plan_load(f.id, &f.data, None).expect("encodable");
            let tables = eim::text::Tables::of_plan(&plan);
            classes.insert(tables.map_id);
            merged += f.data.len().saturating_sub(tables.kernel_deltas.len());
            book.commit_load(plan);
        }
        assert!(classes.len() >= 3, "size classes {classes:?}");
        assert!(merged > 0, "no merged pairs");
        assert!(all
            .iter()
            .any(|f| f.data.iter().any(|d| d.info == info::STOP)));
    }

    #[test]
    fn some_file_has_empty_pages() {
        let all = files(16, 3);
        let with_hole = all.iter().any(|f| {
            let pages: std::collections::BTreeSet<u64> =
                f.data.iter().map(|d| d.address / PAGE_SIZE).collect();
            match (pages.first(), pages.last()) {
                (Some(a), Some(b)) => (b - a + 1) as usize > pages.len(),
                _ => false,
            }
        });
        assert!(with_hole);
    }
}
