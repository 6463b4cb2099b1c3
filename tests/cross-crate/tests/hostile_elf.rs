//! Hostile input: thousands of deterministic mutations of real ELF files
//! (truncations, bit flips, huge lengths, CIEs that point at themselves,
//! deep remember-state runs, overlong LEB128s, Go tables with wild counts)
//! go through the whole extraction. None may panic, none may allocate more
//! than a budget proportional to the input, and none may run away in time
//! (a hang guard, not a speed claim: speed is in docs/BENCHMARKS.md).
//!
//! One test function on purpose: the allocation counter is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eim_analysis::elf::extract::extract;
use eim_analysis::elf::Elf;
use eim_test_support::rng::XorShift;
use eim_test_support::testdata;
use object::{Object, ObjectSection};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged to the system allocator.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE
                .fetch_add(layout.size(), Ordering::Relaxed)
                .wrapping_add(layout.size());
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Where the unwind data of a file lies, to aim mutations at it.
fn unwind_ranges(bytes: &[u8]) -> Vec<(usize, usize)> {
    let Ok(file) = object::File::parse(bytes) else {
        return Vec::new();
    };
    [
        ".eh_frame",
        ".eh_frame_hdr",
        ".debug_frame",
        ".gopclntab",
        ".go.buildinfo",
    ]
    .iter()
    .filter_map(|name| file.section_by_name(name))
    .filter_map(|s| s.file_range())
    .map(|(start, len)| (start as usize, len as usize))
    .filter(|(_, len)| *len > 0)
    .collect()
}

const DW_CFA_REMEMBER_STATE: u8 = 0x0a;

/// One mutation of `base`, aimed at the unwind sections most of the time.
fn mutate(base: &[u8], ranges: &[(usize, usize)], rng: &mut XorShift) -> (Vec<u8>, &'static str) {
    let mut b = base.to_vec();
    let (start, len) = if ranges.is_empty() || rng.index(5) == 0 {
        (0, b.len())
    } else {
        ranges[rng.index(ranges.len())]
    };
    let at = start + rng.index(len.max(1));
    let kind = rng.index(8);
    let put = |b: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        for (i, x) in bytes.iter().enumerate() {
            if let Some(slot) = b.get_mut(at + i) {
                *slot = *x;
            }
        }
    };
    match kind {
        0 => {
            b.truncate(at);
            (b, "truncation")
        }
        1 => {
            for _ in 0..1 + rng.index(8) {
                let i = start + rng.index(len.max(1));
                if let Some(x) = b.get_mut(i) {
                    *x ^= 1 << rng.index(8);
                }
            }
            (b, "bit flips")
        }
        2 => {
            let huge = [0xffff_fff0u32, 0xffff_ffff, 0x7fff_ffff, 0x8000_0000][rng.index(4)];
            put(&mut b, at, &huge.to_le_bytes());
            (b, "huge length")
        }
        3 => {
            // A CIE pointer of 4 points an FDE at its own length field.
            put(&mut b, at, &4u32.to_le_bytes());
            (b, "self-referencing CIE pointer")
        }
        4 => {
            let n = 1 + rng.index(64);
            put(&mut b, at, &vec![DW_CFA_REMEMBER_STATE; n]);
            (b, "deep remember_state")
        }
        5 => {
            // A LEB128 that never ends within its record.
            put(&mut b, at, &[0x80; 24]);
            (b, "overlong LEB128")
        }
        6 => {
            let v = rng.next_u64();
            put(&mut b, at, &v.to_le_bytes());
            (b, "random word")
        }
        _ => {
            let n = rng.index(256);
            let from = rng.index(b.len().max(1));
            let chunk: Vec<u8> = b.get(from..(from + n).min(b.len())).unwrap_or(&[]).to_vec();
            put(&mut b, at, &chunk);
            (b, "copied chunk")
        }
    }
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = testdata();
    let mut out = Vec::new();
    for name in [
        "oracle/bin/ccorpus-x86_64-O2",
        "oracle/bin/ccorpus-x86_64-O2-debugframe",
        "oracle/bin/ccorpus-aarch64-O2",
        "oracle/bin/aarch64-libpthread.so.0",
        "oracle/bin/aarch64-ld-linux-aarch64.so.1",
        "oracle/bin/gocorpus-go1.23-amd64",
        "oracle/bin/gocorpus-go1.19-arm64",
        "upstream/volname",
        "upstream/vdso.arch64.withframe",
    ] {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out.push((name.to_string(), bytes));
    }
    out
}

#[test]
fn thousands_of_mutations_never_panic_nor_run_away() {
    let files = corpus();
    let per_file = std::env::var("EIM_HOSTILE_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400usize);
    let mut runs = 0usize;
    let (mut extracted, mut refused, mut unparsed) = (0usize, 0usize, 0usize);
    let mut failures = Vec::new();
    for (index, (name, base)) in files.iter().enumerate() {
        let ranges = unwind_ranges(base);
        // Go binaries are larger: fewer mutations keep the run short.
        let count = if base.len() > 1 << 20 {
            per_file / 8
        } else {
            per_file
        };
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15 ^ (index as u64 + 1));
        for i in 0..count {
            let (bytes, kind) = mutate(base, &ranges, &mut rng);
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            let started = Instant::now();
            let outcome = std::panic::catch_unwind(|| {
                Elf::parse(&bytes)
                    .ok()
                    .map(|elf| extract(&elf, None).map(|d| d.len()))
            });
            let took = started.elapsed();
            let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
            runs += 1;
            let what = format!("{name} mutation {i} ({kind})");
            match outcome {
                Err(_) => failures.push(format!("{what}: panicked")),
                Ok(Some(Ok(n))) if n > bytes.len() => {
                    failures.push(format!("{what}: {n} deltas from {} bytes", bytes.len()))
                }
                Ok(Some(Ok(_))) => extracted += 1,
                Ok(Some(Err(_))) => refused += 1,
                Ok(None) => unparsed += 1,
            }
            // Output and parsing state stay within a few words per input byte.
            let budget = 64 * bytes.len() + (1 << 20);
            if peak > budget {
                failures.push(format!("{what}: peak {peak} bytes over budget {budget}"));
            }
            if took > Duration::from_secs(5) {
                failures.push(format!("{what}: ran {took:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} runs:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(runs >= 2000, "only {runs} mutations ran");
    // Most mutations must reach the unwind parsers, or this tests little.
    assert!(
        unparsed < runs / 4,
        "{unparsed} of {runs} mutations did not parse as ELF"
    );
    eprintln!(
        "{runs} mutated files: {extracted} extracted, {refused} refused by extraction, \
         {unparsed} not ELF any more; no panic, within memory and time"
    );
}
