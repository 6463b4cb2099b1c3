//! The `.gopclntab` stage against upstream's output for the Go corpus
//! (`tests/data/oracle`, rows `gocorpus-*`).
//!
//! The oracle lists are whole-file results: Go deltas plus whatever the
//! later stages add outside the Go range, sorted and de-duplicated. So the
//! check is: the rows inside the returned range `[start, end]` (the end for
//! the final INVALID) are exactly the Go stage's deltas, and the rows
//! outside it are counted (none for this corpus: these binaries are
//! pure Go, without cgo or `.eh_frame`).

use eim_analysis::elf::{gopclntab, Elf};
use eim_machine::deltas::IntervalData;
use eim_machine::text::{parse_deltas, render_deltas};
use eim_test_support::data::sha256_hex;
use eim_test_support::rng::XorShift;
use eim_test_support::{read_xz, testdata};
use object::{Object, ObjectSection};

/// A Go corpus file, checked against its manifest hash.
struct Corpus {
    name: String,
    bytes: Vec<u8>,
    total: usize,
    oracle: IntervalData,
}

fn corpus() -> Vec<Corpus> {
    let oracle_dir = testdata().join("oracle");
    let manifest = std::fs::read_to_string(oracle_dir.join("MANIFEST.tsv")).unwrap();
    let mut out = Vec::new();
    for row in manifest.lines().filter(|l| l.starts_with("gocorpus")) {
        let cols: Vec<&str> = row.split('\t').collect();
        let (name, path, sha, total) = (cols[0], cols[1], cols[3], cols[5]);
        let bytes = std::fs::read(oracle_dir.join(path)).unwrap();
        let got = sha256_hex(&bytes);
        assert_eq!(got, sha, "{name}: input differs from the oracle's");
        let oracle = parse_deltas(&read_xz(&oracle_dir.join(format!("{name}.deltas.xz"))))
            .unwrap()
            .data;
        out.push(Corpus {
            name: name.to_string(),
            bytes,
            total: total.parse().unwrap(),
            oracle,
        });
    }
    assert_eq!(out.len(), 5, "expected five Go corpus files");
    out
}

fn extract(bytes: &[u8]) -> (std::ops::Range<u64>, IntervalData) {
    let elf = Elf::parse(bytes).unwrap();
    let mut data = IntervalData::new();
    let range = gopclntab::extract(&elf, &mut data)
        .unwrap()
        .expect("a Go table");
    (range, data)
}

/// The oracle rows inside `[start, end]`, and the number outside.
fn oracle_part(oracle: &IntervalData, range: &std::ops::Range<u64>) -> (IntervalData, usize) {
    let (inside, outside): (Vec<_>, Vec<_>) = oracle
        .to_vec()
        .iter()
        .partition(|d| d.address >= range.start && d.address <= range.end);
    (IntervalData::from_deltas(inside), outside.len())
}

#[test]
fn gopclntab_matches_the_oracle() {
    let mut report = Vec::new();
    for c in corpus() {
        assert_eq!(c.oracle.len(), c.total, "{}", c.name);
        let (range, ours) = extract(&c.bytes);
        let (theirs, outside) = oracle_part(&c.oracle, &range);
        assert_eq!(
            render_deltas(&c.name, &ours),
            render_deltas(&c.name, &theirs),
            "{}: Go deltas differ from the oracle",
            c.name
        );
        assert_eq!(outside, 0, "{}: oracle rows outside {range:x?}", c.name);
        report.push(format!(
            "{}: [{:#x}, {:#x}) {} deltas, {} oracle rows outside",
            c.name,
            range.start,
            range.end,
            ours.len(),
            outside
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// Overwrites the first occurrence of `from` inside the file range of the
/// section called `section` with `to` (same length).
fn patch_in_section(bytes: &mut [u8], section: &str, from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let (start, size) = {
        let file = object::File::parse(&*bytes).unwrap();
        let s = file
            .section_by_name(section)
            .unwrap_or_else(|| panic!("no {section}"));
        s.file_range().unwrap()
    };
    let (start, size) = (start as usize, size as usize);
    let area = &mut bytes[start..start + size];
    let at = area
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{from:?} not in {section}"));
    area[at..at + to.len()].copy_from_slice(to);
}

fn hide_gopclntab_section(bytes: &mut [u8]) {
    let shstrndx = u16::from_le_bytes([bytes[0x3e], bytes[0x3f]]) as usize;
    let shoff = u64::from_le_bytes(bytes[0x28..0x30].try_into().unwrap()) as usize;
    let hdr = shoff + 64 * shstrndx;
    let off = u64::from_le_bytes(bytes[hdr + 0x18..hdr + 0x20].try_into().unwrap()) as usize;
    let size = u64::from_le_bytes(bytes[hdr + 0x20..hdr + 0x28].try_into().unwrap()) as usize;
    let area = &mut bytes[off..off + size];
    let at = area
        .windows(11)
        .position(|w| w == b".gopclntab\0")
        .expect("section name");
    area[at + 1] = b'X';
}

fn by_name(name: &str) -> Corpus {
    corpus().into_iter().find(|c| c.name == name).unwrap()
}

/// Without the section, a file with `.go.buildinfo` is read through the
/// `runtime.pclntab` / `runtime.epclntab` symbols: same result.
#[test]
fn the_symbol_path_gives_the_same_deltas() {
    for name in ["gocorpus-go1.23-amd64", "gocorpus-go1.19-arm64"] {
        let c = by_name(name);
        let want = extract(&c.bytes);
        let mut bytes = c.bytes.clone();
        hide_gopclntab_section(&mut bytes);
        assert!(Elf::parse(&bytes).unwrap().section(".gopclntab").is_none());
        assert_eq!(extract(&bytes), want, "{name}");
    }
}

/// Without the section and the symbols, the header is found by the
/// read-only segment scan: same result.
#[test]
fn the_heuristic_path_gives_the_same_deltas() {
    for name in [
        "gocorpus-go1.23-amd64-stripped",
        "gocorpus-go1.19-amd64",
        "gocorpus-go1.23-arm64",
    ] {
        let c = by_name(name);
        let want = extract(&c.bytes);
        let mut bytes = c.bytes.clone();
        hide_gopclntab_section(&mut bytes);
        if name != "gocorpus-go1.23-amd64-stripped" {
            patch_in_section(
                &mut bytes,
                ".strtab",
                b"\0runtime.pclntab\0",
                b"\0runtime.pclnta_\0",
            );
        }
        assert_eq!(extract(&bytes), want, "{name}");
    }
}

/// A file without `.gopclntab` and `.go.buildinfo` is not Go: no deltas, no
/// error.
#[test]
fn a_file_without_go_sections_is_skipped() {
    let oracle_dir = testdata().join("oracle");
    let bytes = std::fs::read(oracle_dir.join("bin/ccorpus-x86_64-O2")).unwrap();
    let elf = Elf::parse(&bytes).unwrap();
    let mut data = IntervalData::new();
    assert_eq!(gopclntab::extract(&elf, &mut data), Ok(None));
    assert!(data.is_empty());
}

#[test]
fn build_info_versions() {
    for (name, want) in [
        ("gocorpus-go1.19-amd64", "go1.19.8"),
        ("gocorpus-go1.19-arm64", "go1.19.8"),
        ("gocorpus-go1.23-amd64", "go1.23.5"),
        ("gocorpus-go1.23-amd64-stripped", "go1.23.5"),
        ("gocorpus-go1.23-arm64", "go1.23.5"),
    ] {
        let c = by_name(name);
        let elf = Elf::parse(&c.bytes).unwrap();
        let got = gopclntab::go_version(&elf).map(|v| String::from_utf8_lossy(v).into_owned());
        assert_eq!(got.as_deref(), Some(want), "{name}");
    }
}

/// The pre-1.18 build-info layout (two pointers to Go string headers),
/// written over a corpus file's inline one.
#[test]
fn build_info_with_string_pointers() {
    let c = by_name("gocorpus-go1.23-arm64");
    let mut bytes = c.bytes.clone();
    let (off, vaddr) = {
        let file = object::File::parse(&*bytes).unwrap();
        let s = file.section_by_name(".go.buildinfo").unwrap();
        (s.file_range().unwrap().0 as usize, s.address())
    };
    let put = |bytes: &mut Vec<u8>, at: usize, v: u64| {
        bytes[off + at..off + at + 8].copy_from_slice(&v.to_le_bytes())
    };
    bytes[off + 15] = 0; // flags: pointers, little-endian
    put(&mut bytes, 16, vaddr + 0x80); // version string header
    put(&mut bytes, 24, 0); // module string header (unused)
    put(&mut bytes, 0x80, vaddr + 0xa0);
    put(&mut bytes, 0x88, 8);
    bytes[off + 0xa0..off + 0xa8].copy_from_slice(b"go1.20.7");
    let elf = Elf::parse(&bytes).unwrap();
    assert_eq!(gopclntab::go_version(&elf), Some(&b"go1.20.7"[..]));

    // An arm64 1.20-magic table of a pre-1.21 toolchain does not trust
    // frame pointers: SP deltas instead of one rule per function.
    let mut data = IntervalData::new();
    gopclntab::extract(&elf, &mut data).unwrap();
    assert!(data.len() > 10 * c.total, "{} deltas", data.len());

    // Big-endian flag: unreadable, which also means "older".
    bytes[off + 15] = 1;
    assert_eq!(gopclntab::go_version(&Elf::parse(&bytes).unwrap()), None);
}

/// Random byte edits inside a real table (all five files) give an error or
/// some deltas, never a panic.
#[test]
fn edited_real_tables_never_panic() {
    let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.next_u64();
    for c in corpus() {
        let (start, size) = {
            let file = object::File::parse(&*c.bytes).unwrap();
            let s = file.section_by_name(".gopclntab").unwrap();
            let (start, size) = s.file_range().unwrap();
            (start as usize, size as usize)
        };
        let mut outcomes = [0usize; 2];
        for round in 0..60 {
            let mut bytes = c.bytes.clone();
            let edits = 1 + next() % 4;
            for _ in 0..edits {
                // Half of the rounds hit the header and tables' first bytes.
                let span = if round % 2 == 0 { 128.min(size) } else { size };
                let at = start + (next() as usize) % span;
                bytes[at] = next() as u8;
            }
            let elf = Elf::parse(&bytes).unwrap();
            let mut data = IntervalData::new();
            let ok = gopclntab::extract(&elf, &mut data).is_ok();
            outcomes[usize::from(ok)] += 1;
        }
        eprintln!("{}: {} errors, {} parsed", c.name, outcomes[0], outcomes[1]);
    }
}
