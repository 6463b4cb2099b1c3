//! Extraction against upstream's own output (`tests/data/oracle` and
//! `tests/data/upstream`), line for line, and upstream's extraction test
//! vectors (spec 5.8 and 10).
//!
//! Test data: the repository's `tests/data`, or `$EIM_TESTDATA`. Inputs
//! from the stock machine (absolute paths in the manifest) are checked
//! against their recorded sha256 first: another version is a loud skip.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use eim_analysis::elf::ehframe::{lookup_fde, FdeRange};
use eim_analysis::elf::{extract, DebugFileError, Elf};
use eim_machine::abi::{opcode, UnwindInfo};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::text::render_deltas;
use object::Object as _;

use eim_test_support::cfi;
use eim_test_support::oracle;
use eim_test_support::{read, testdata};

fn xz_text(path: &Path) -> String {
    let mut input = std::io::BufReader::new(
        std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    );
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut input, &mut out)
        .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
    let mut text = String::new();
    out.as_slice()
        .read_to_string(&mut text)
        .expect("deltas files are text");
    text
}

/// Upstream's debug-link search (`/usr/lib/debug/<dir of path>/<name>`)
/// plus Debian's build-id tree. The core checks the CRC.
fn debug_link_search(
    path: &str,
    build_id: Option<Vec<u8>>,
) -> impl FnMut(&str, u32) -> Result<Option<eim_analysis::elf::extract::DebugBytes>, DebugFileError>
{
    let dir = Path::new(path)
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_default();
    move |name, _crc| {
        let mut candidates = vec![Path::new("/usr/lib/debug")
            .join(dir.strip_prefix("/").unwrap_or(&dir))
            .join(name)];
        if let Some(id) = &build_id {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            if hex.len() > 2 {
                candidates.push(
                    Path::new("/usr/lib/debug/.build-id")
                        .join(&hex[..2])
                        .join(format!("{}.debug", &hex[2..])),
                );
            }
        }
        Ok(candidates
            .into_iter()
            .find_map(|c| std::fs::read(c).ok())
            .map(|bytes| Box::new(bytes) as eim_analysis::elf::extract::DebugBytes))
    }
}

/// Extracts `bytes` and renders the result under `path`.
fn extract_text(path: &str, bytes: &[u8]) -> String {
    let elf = Elf::parse(bytes).unwrap_or_else(|e| panic!("{path}: {e}"));
    let build_id = elf.file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let mut search = debug_link_search(path, build_id);
    match extract(&elf, Some(&mut search)) {
        Ok(data) => render_deltas(path, &data),
        Err(e) => eim_machine::text::render_deltas_error(path, &e.to_string()),
    }
}

/// The first differing line, or `None` if identical.
fn first_difference(ours: &str, theirs: &str) -> Option<String> {
    let (a, b): (Vec<_>, Vec<_>) = (ours.lines().collect(), theirs.lines().collect());
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i), b.get(i));
        if x != y {
            return Some(format!(
                "line {}: eim {:?}, upstream {:?}",
                i + 1,
                x.copied().unwrap_or("<end>"),
                y.copied().unwrap_or("<end>")
            ));
        }
    }
    None
}

#[test]
fn extraction_matches_upstream_for_every_oracle_file() {
    let root = testdata();
    let mut results = BTreeMap::new();
    let here = oracle::available(&root);
    let count = here.len();
    for input in here {
        let bytes = input.bytes();
        let expected = xz_text(&input.deltas);
        let path = expected
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# file: "))
            .expect("a deltas file starts with its path")
            .to_string();
        let ours = extract_text(&path, &bytes);
        results.insert(input.name, first_difference(&ours, &expected));
    }
    let mut different = Vec::new();
    for (name, diff) in &results {
        match diff {
            None => eprintln!("identical: {name}"),
            Some(d) => {
                eprintln!("DIFFERENT: {name}: {d}");
                different.push(format!("{name}: {d}"));
            }
        }
    }
    // Every input here was compared; the test data's own 16 always are.
    assert!(
        results.len() == count && count >= 16,
        "expected every oracle and upstream file here ({count}), found {}",
        results.len()
    );
    assert!(different.is_empty(), "{}", different.join("\n"));
}

// ---- upstream's vectors (spec 5.8 and 10) ----

/// "SP c/r": CFA = SP + c, saved FP at CFA - r (r = 0: no FP rule).
fn sp(c: i32, r: i32) -> UnwindInfo {
    if r == 0 {
        UnwindInfo::new(opcode::BASE_SP, c, 0, 0)
    } else {
        UnwindInfo::new(opcode::BASE_SP, c, opcode::BASE_CFA, -r)
    }
}

/// "FP c/r": CFA = FP + c, saved FP at CFA - r.
fn fp(c: i32, r: i32) -> UnwindInfo {
    UnwindInfo::new(opcode::BASE_FP, c, opcode::BASE_CFA, -r)
}

fn extract_file(path: &Path) -> IntervalData {
    let bytes = read(path);
    let elf = Elf::parse(&bytes).expect("ELF");
    extract(&elf, None).expect("extraction")
}

#[test]
fn volname_gives_upstreams_27_deltas() {
    use hint::{GAP, KEEP, NONE};
    let d = StackDelta::new;
    let data = extract_file(&testdata().join("upstream/volname"));
    let want = vec![
        d(0x850, KEEP, sp(16, 0)),
        d(0x856, NONE, sp(24, 0)),
        d(0x860, KEEP, sp(8, 0)),
        d(0x8d1, NONE, sp(16, 16)),
        d(0x8d2, NONE, sp(24, 16)),
        d(0x8e7, NONE, sp(80, 16)),
        d(0x9ec, NONE, sp(24, 16)),
        d(0x9ed, NONE, sp(16, 16)),
        d(0x9ee, NONE, sp(8, 0)),
        d(0x9f0, KEEP, info::STOP),
        d(0xa1b, GAP, info::INVALID),
        d(0xb20, KEEP, sp(8, 0)),
        d(0xb22, NONE, sp(16, 0)),
        d(0xb24, NONE, sp(24, 0)),
        d(0xb29, NONE, sp(32, 0)),
        d(0xb2b, NONE, sp(40, 0)),
        d(0xb33, NONE, sp(48, 48)),
        d(0xb3b, NONE, sp(56, 48)),
        d(0xb48, NONE, sp(64, 48)),
        d(0xb7a, NONE, sp(56, 48)),
        d(0xb7b, NONE, sp(48, 48)),
        d(0xb7c, NONE, sp(40, 0)),
        d(0xb7e, NONE, sp(32, 0)),
        d(0xb80, NONE, sp(24, 0)),
        d(0xb82, NONE, sp(16, 0)),
        d(0xb84, KEEP, sp(8, 0)),
        d(0xb92, GAP, info::INVALID),
    ];
    // The first six are upstream's own assertion.
    assert_eq!(data.to_vec()[..6], want[..6]);
    assert_eq!(data.to_vec(), want);
}

#[test]
fn volname_fde_lookup_through_eh_frame_hdr() {
    let bytes = read(&testdata().join("upstream/volname"));
    let elf = Elf::parse(&bytes).unwrap();
    let found = [
        (0x850..=0x850, 0x850, 0x10),
        (0x860..=0x8c7, 0x860, 0x68),
        (0x8d0..=0x9ee, 0x8d0, 0x11f),
        (0x9f0..=0xa1a, 0x9f0, 0x2b),
        (0xb20..=0xb84, 0xb20, 0x65),
        (0xb90..=0xb91, 0xb90, 0x2),
    ];
    for (addrs, start, len) in found {
        for addr in addrs {
            assert_eq!(
                lookup_fde(&elf, addr).unwrap(),
                Some(FdeRange { start, len }),
                "{addr:#x}"
            );
        }
    }
    for addr in [
        0, 0x840, 0x8c8, 0x8c9, 0x8cf, 0x9ef, 0xa1b, 0xa1c, 0xb1f, 0xb85, 0xb92, 0xb93, 0x1000,
        0xcafe000,
    ] {
        assert_eq!(lookup_fde(&elf, addr).unwrap(), None, "{addr:#x}");
    }
}

fn assert_rows(data: &IntervalData, rows: &[(u64, UnwindInfo)]) {
    for &(addr, want) in rows {
        let have = data.find(addr).map(|d| d.info);
        assert_eq!(have, Some(want), "the delta covering {addr:#x}");
    }
}

#[test]
fn libcrypto_rows_of_upstreams_eh_frame_test() {
    let data = extract_file(&testdata().join("upstream/libcrypto-alpine-test.so"));
    assert_rows(
        &data,
        &[
            (0x7631f, sp(8, 0)),
            (0x7a0d4, sp(160, 24)),
            (0x7b1ec, sp(8, 0)),
            (0x88e72, sp(64, 48)),
            (0xa89d9, fp(16, 16)),
            (0xb2ad4, fp(8, 24)),
            (0x1c561f, sp(2160, 48)),
        ],
    );
}

#[test]
fn libpython_rows_of_upstreams_eh_frame_test() {
    let data = extract_file(&testdata().join("upstream/schrodinger-libpython3.8.so.1.0"));
    assert_rows(
        &data,
        &[
            (0x6f805, sp(80, 48)),
            (0x7077c, sp(24, 0)),
            (0x83194, sp(64, 16)),
            (0x954b4, sp(48, 48)),
            (0xc8b9e, sp(112, 48)),
            (0xd2f5e, sp(56, 48)),
            (0xf01cf, sp(24, 24)),
            (0x1a87b2, sp(40, 40)),
            (0x23f555, sp(56, 48)),
        ],
    );
}

// ---- timing (not an assertion; run with --release) ----

/// (Minimum, median) wall time of `f` over `runs` runs, after one warm-up
/// run. The minimum is the figure least disturbed by other load.
fn time_ms(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[0], times[runs / 2])
}

/// Every row of every FDE of `.eh_frame`, decoded by gimli.
fn gimli_rows(elf: &Elf<'_>) -> usize {
    elf.section(".eh_frame")
        .map_or(0, |s| cfi::gimli_rows(s.data, s.address))
}

#[test]
#[ignore = "timing; run with: cargo test --release -p eim-analysis --test elf_oracle -- --ignored --nocapture"]
fn extraction_timing() {
    let mut files = vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6")];
    if let Some(home) = std::env::var_os("HOME") {
        let lib = Path::new(&home).join(".rustup/toolchains/stable-x86_64-unknown-linux-gnu/lib");
        if let Ok(dir) = std::fs::read_dir(lib) {
            files.extend(dir.flatten().map(|e| e.path()).filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"))
            }));
        }
    }
    // Every non-Go oracle input, against upstream's recorded median.
    let root = testdata();
    let timings = std::fs::read_to_string(root.join("oracle/TIMINGS.tsv")).expect("timings");
    for line in timings.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let (name, path, upstream_ms) = (cols[0], cols[1], cols[4]);
        if name.starts_with("gocorpus") {
            continue;
        }
        let file = if path.starts_with('/') {
            PathBuf::from(path)
        } else {
            root.join("oracle").join(path)
        };
        let bytes = read(&file);
        let elf = Elf::parse(&bytes).unwrap();
        let (min, median) = time_ms(21, || {
            std::hint::black_box(extract(&elf, None).unwrap());
        });
        let upstream: f64 = upstream_ms.parse().unwrap();
        eprintln!(
            "{name}: {min:.3} ms (median {median:.3}); upstream median {upstream:.3} ms: {:.1}x",
            upstream / median
        );
    }
    for path in files {
        let bytes = read(&path);
        let elf = Elf::parse(&bytes).unwrap();
        let deltas = extract(&elf, None).unwrap().len();
        let ours = time_ms(21, || {
            std::hint::black_box(extract(&elf, None).unwrap());
        });
        let rows = gimli_rows(&elf);
        let gimli = time_ms(21, || {
            std::hint::black_box(gimli_rows(&elf));
        });
        eprintln!(
            "{}: {deltas} deltas in {:.2} ms (median {:.2}); gimli row walk ({rows} rows) {:.2} ms (median {:.2}); ratio of minima {:.2}",
            path.display(),
            ours.0,
            ours.1,
            gimli.0,
            gimli.1,
            ours.0 / gimli.0
        );
    }
}

// ---- hostile input ----

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

    /// A real file with a few bytes changed (anywhere, or in its CFI):
    /// extraction returns, without panicking, whatever it finds.
    #[test]
    fn mutated_files_never_panic(
        anywhere in proptest::collection::vec((0usize..6136, proptest::prelude::any::<u8>()), 0..4),
        cfi in proptest::collection::vec((0xbf8usize..0xd68, proptest::prelude::any::<u8>()), 1..6),
    ) {
        static VOLNAME: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let mut bytes = VOLNAME
            .get_or_init(|| read(&testdata().join("upstream/volname")))
            .clone();
        for (at, b) in anywhere.into_iter().chain(cfi) {
            if let Some(x) = bytes.get_mut(at) {
                *x = b;
            }
        }
        if let Ok(elf) = Elf::parse(&bytes) {
            // The debug-link stage runs (few deltas) and gets the file itself.
            let copy = bytes.clone();
            let mut open = move |_: &str, _: u32| {
                Ok(Some(Box::new(copy.clone()) as eim_analysis::elf::extract::DebugBytes))
            };
            let _ = extract(&elf, Some(&mut open));
        }
    }
}

// ---- the debug-link stage ----

/// libpthread (6 deltas, a `.gnu_debuglink`) whose link CRC is rewritten to
/// name the corpus file with a `.debug_frame` as its debug file.
fn linked_pair() -> (Vec<u8>, Vec<u8>) {
    use object::ObjectSection as _;
    let root = testdata();
    let debug = read(&root.join("oracle/bin/ccorpus-x86_64-O2-debugframe"));
    let mut main = read(Path::new("/usr/lib/x86_64-linux-gnu/libpthread.so.0"));
    let elf = Elf::parse(&main).unwrap();
    let (offset, size) = elf
        .file
        .section_by_name(".gnu_debuglink")
        .and_then(|s| s.file_range())
        .expect("libpthread has a .gnu_debuglink");
    let link = elf.debug_link().unwrap();
    let crc_at = (offset + size - 4) as usize;
    assert_eq!(
        main[crc_at..crc_at + 4],
        link.crc.to_le_bytes(),
        "the CRC ends the section"
    );
    let crc = eim_analysis::elf::extract::debuglink_crc(&debug);
    main[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    (main, debug)
}

#[test]
fn the_debug_link_file_adds_its_debug_frame() {
    use eim_analysis::elf::extract::ExtractErrorKind;
    let (main, debug) = linked_pair();
    let elf = Elf::parse(&main).unwrap();
    let alone = extract(&elf, None).unwrap();
    assert_eq!(alone.len(), 6);

    let mut names = Vec::new();
    let mut open = |name: &str, _crc: u32| {
        names.push(name.to_string());
        Ok(Some(
            Box::new(debug.clone()) as eim_analysis::elf::extract::DebugBytes
        ))
    };
    let linked = extract(&elf, Some(&mut open)).unwrap();
    assert_eq!(names, vec![elf.debug_link().unwrap().name]);
    assert!(
        linked.len() > alone.len() + 10,
        "the corpus' .debug_frame FDEs are added: {} deltas",
        linked.len()
    );
    assert!(linked
        .to_vec()
        .windows(2)
        .all(|w| w[0].address < w[1].address));

    // A file with another CRC is no debug file: as if there were none.
    let mut wrong = |_: &str, _: u32| {
        Ok(Some(
            Box::new(main.clone()) as eim_analysis::elf::extract::DebugBytes
        ))
    };
    assert_eq!(extract(&elf, Some(&mut wrong)).unwrap(), alone);
    let mut none = |_: &str, _: u32| Ok(None);
    assert_eq!(extract(&elf, Some(&mut none)).unwrap(), alone);

    // The opener's NotFound stays NotFound.
    let mut gone = |_: &str, _: u32| {
        Err(DebugFileError::new(
            ExtractErrorKind::NotFound,
            "the process is gone",
        ))
    };
    let err = extract(&elf, Some(&mut gone)).unwrap_err();
    assert_eq!(err.kind(), ExtractErrorKind::NotFound);
    assert_eq!(
        err.to_string(),
        "failure to parse debug stack deltas: the process is gone"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// The debug-link path with a damaged debug file (its CRC still
    /// matching) and a damaged main file: no panic.
    #[test]
    fn mutated_debug_files_never_panic(
        debug_frame in proptest::collection::vec((0x4038usize..0x41a0, proptest::prelude::any::<u8>()), 1..6),
        main_cfi in proptest::collection::vec((0x2000usize..0x2098, proptest::prelude::any::<u8>()), 0..3),
    ) {
        static PAIR: std::sync::OnceLock<(Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
        let (main, debug) = PAIR.get_or_init(linked_pair);
        let (mut main, mut debug) = (main.clone(), debug.clone());
        for (at, b) in debug_frame {
            debug[at] = b;
        }
        let crc = eim_analysis::elf::extract::debuglink_crc(&debug);
        let crc_at = 0x3008 + 0x34 - 4;
        main[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        for (at, b) in main_cfi {
            main[at] = b;
        }
        let elf = Elf::parse(&main).unwrap();
        let mut open = move |_: &str, _: u32| {
            Ok(Some(Box::new(debug.clone()) as eim_analysis::elf::extract::DebugBytes))
        };
        let _ = extract(&elf, Some(&mut open));
    }
}

// ---- the ELF view the stages use ----

#[test]
fn without_section_headers_the_eh_frame_is_found_through_pt_gnu_eh_frame() {
    let mut bytes = read(&testdata().join("upstream/volname"));
    let with_sections = extract(&Elf::parse(&bytes).unwrap(), None).unwrap();
    // e_shoff, e_shnum, e_shstrndx = 0
    bytes[0x28..0x30].fill(0);
    bytes[0x3c..0x40].fill(0);
    let elf = Elf::parse(&bytes).unwrap();
    assert!(elf.section_region(".eh_frame", u64::MAX).is_none());
    assert_eq!(extract(&elf, None).unwrap(), with_sections);
}

#[test]
fn entry_code_soname_and_debug_link() {
    let bytes = read(&testdata().join("upstream/volname"));
    let elf = Elf::parse(&bytes).unwrap();
    assert_eq!(elf.entry(), 0x9f0);
    let code = elf.virtual_memory(elf.entry(), 128).expect("entry code");
    assert_eq!(code.len(), 128);
    assert_eq!(code[..2], [0x31, 0xed], "xor %ebp,%ebp");
    // past the end of every segment
    assert!(elf.virtual_memory(0x10_0000, 1).is_none());
    assert!(elf.debug_link().is_some_and(|l| !l.name.is_empty()));

    let libc = read(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    let elf = Elf::parse(&libc).unwrap();
    assert_eq!(elf.soname().as_deref(), Some(&b"libc.so.6"[..]));
    let crypto = read(&testdata().join("upstream/libcrypto-alpine-test.so"));
    let elf = Elf::parse(&crypto).unwrap();
    assert_eq!(elf.soname(), None, "reduced to its unwind sections");
}
