//! The `.eh_frame` walk cut into parts on threads gives exactly what the
//! sequential walk gives: deltas, errors and all, on every oracle input,
//! the stable toolchain's `librustc_driver` when present, and mutated
//! copies of real files (broken tables, records and instructions), for
//! several thread counts and part sizes.

use std::path::Path;
use std::sync::atomic::Ordering;

use object::{Object, ObjectSection};

use super::ehframe::{Parallelism, PARTS_TAKEN_OVER};
use super::{extract_with, Elf};
use eim_test_support::rng::XorShift;
use eim_test_support::{oracle, testdata};

/// The oracle inputs that exist here.
fn oracle_files() -> Vec<(String, Vec<u8>)> {
    oracle::inputs(&testdata())
        .into_iter()
        .filter_map(|i| Some((i.file.display().to_string(), std::fs::read(&i.file).ok()?)))
        .collect()
}

const CONFIGS: [Parallelism; 5] = [
    Parallelism {
        threads: 2,
        min_fdes_per_part: 1,
    },
    Parallelism {
        threads: 3,
        min_fdes_per_part: 7,
    },
    Parallelism {
        threads: 4,
        min_fdes_per_part: 1,
    },
    Parallelism {
        threads: 2,
        min_fdes_per_part: 100,
    },
    Parallelism {
        threads: 2,
        min_fdes_per_part: Parallelism::DEFAULT_MIN_FDES_PER_PART,
    },
];

/// Sequential and parallel extraction of `bytes` agree.
fn assert_same(name: &str, bytes: &[u8], configs: &[Parallelism]) {
    let Ok(elf) = Elf::parse(bytes) else {
        return;
    };
    let want = extract_with(&elf, None, Parallelism::SEQUENTIAL);
    for &config in configs {
        let got = extract_with(&elf, None, config);
        assert!(
            got == want,
            "{name}: {config:?} differs from the sequential walk"
        );
    }
}

#[test]
fn parallel_equals_sequential_on_every_oracle_file() {
    let before = PARTS_TAKEN_OVER[1].load(Ordering::Relaxed);
    for (name, bytes) in oracle_files() {
        assert_same(&name, &bytes, &CONFIGS);
    }
    assert!(
        PARTS_TAKEN_OVER[1].load(Ordering::Relaxed) > before,
        "no part was taken over: the parallel walk was never used"
    );
}

#[test]
fn parallel_equals_sequential_on_librustc_driver() {
    let Some(home) = std::env::var_os("HOME") else {
        return;
    };
    let lib = Path::new(&home).join(".rustup/toolchains/stable-x86_64-unknown-linux-gnu/lib");
    let Some(path) = std::fs::read_dir(lib).ok().and_then(|dir| {
        dir.flatten().map(|e| e.path()).find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"))
        })
    }) else {
        return;
    };
    let bytes = std::fs::read(&path).expect("librustc_driver");
    assert_same(&path.display().to_string(), &bytes, &CONFIGS[..2]);
}

/// File ranges of the sections the walk reads (the search table twice as
/// likely: its entries decide the parts).
fn cfi_ranges(bytes: &[u8]) -> Vec<(usize, usize)> {
    let Ok(file) = object::read::elf::ElfFile64::<object::LittleEndian>::parse(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for section in file.sections() {
        let (Ok(name), Some((offset, size))) = (section.name(), section.file_range()) else {
            continue;
        };
        let weight = match name {
            ".eh_frame_hdr" => 2,
            ".eh_frame" | ".debug_frame" => 1,
            _ => 0,
        };
        for _ in 0..weight {
            if size > 0 {
                out.push((offset as usize, size as usize));
            }
        }
    }
    out
}

/// A copy of `bytes` with a few CFI bytes changed: random bytes, flipped
/// bits, lengths and table words set to edge values, table entries copied
/// over others (duplicated and unsorted FDEs).
fn mutate(bytes: &[u8], ranges: &[(usize, usize)], rng: &mut XorShift) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for _ in 0..1 + rng.below(3) {
        let (offset, size) = ranges[rng.below(ranges.len() as u64) as usize];
        let at = offset + rng.below(size as u64) as usize;
        let end = b.len();
        match rng.below(5) {
            0 => b[at] = rng.below(256) as u8,
            1 => b[at] ^= 1 << rng.below(8),
            2 => {
                let v: u32 = [0, 1, 8, 0xffff_fff0, 0xffff_ffff][rng.below(5) as usize];
                let n = 4.min(end - at);
                b[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            _ => {
                let from = offset + rng.below(size as u64) as usize;
                let n = 8.min(end - at).min(end - from);
                let chunk = b[from..from + n].to_vec();
                b[at..at + n].copy_from_slice(&chunk);
            }
        }
    }
    b
}

#[test]
fn parallel_equals_sequential_on_mutated_files() {
    let before = [
        PARTS_TAKEN_OVER[0].load(Ordering::Relaxed),
        PARTS_TAKEN_OVER[1].load(Ordering::Relaxed),
    ];
    let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
    for (name, bytes) in oracle_files() {
        let ranges = cfi_ranges(&bytes);
        if ranges.is_empty() {
            continue;
        }
        // Fewer copies of the large files.
        let copies = (4_000_000 / bytes.len().max(1)).clamp(15, 120);
        for i in 0..copies {
            let mutated = mutate(&bytes, &ranges, &mut rng);
            assert_same(&format!("{name} copy {i}"), &mutated, &CONFIGS[..3]);
        }
    }
    let after = [
        PARTS_TAKEN_OVER[0].load(Ordering::Relaxed) - before[0],
        PARTS_TAKEN_OVER[1].load(Ordering::Relaxed) - before[1],
    ];
    // Both ways are exercised: parts taken over, and parts walked again
    // (errors, wrong guesses, runs that do not attach).
    assert!(after[0] > 0 && after[1] > 0, "{after:?}");
}
