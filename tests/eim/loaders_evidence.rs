//! The loaders ask a file they do not claim no more than its cheap
//! evidence (its name, its section names, its note segments): on files no
//! loader claims, asking every loader builds nothing costly (no symbol
//! index, no gaps) and reads nothing of the file but its note segments;
//! and a file that is Go's by its evidence alone (section headers
//! stripped, Go's note kept) is still claimed. The symbol indexes the
//! loaders look names up in (all names, or those of some prefixes) hold
//! what `object`'s symbol reader reads.
//!
//! What the loaders read is seen through a byte source that records every
//! read of the `LazyFile` the file is parsed from, as `eim` reads it; the
//! note segments are found here from the program headers by hand, not by
//! eim's ELF reader.
//!
//! A missing input (the C compiler, the Go corpus binary) is skipped with
//! a loud message, unless `EIM_REQUIRE_INTERPRETERS` is set.

mod common;
use common::{loaded, loaders, matches_of};
use eim_test_support::skip::{present, skip_or_fail};

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use eim::elf::ehframe::Parallelism;
use eim::elf::source::BLOCK;
use eim::elf::{extract_with, ByteSource, Elf, LazyFile, SourceError};
use eim::files::loaders::ALL_TRACERS;
use eim::interp::access::Symbol;
use eim::interp::{Built, LoaderError, LoaderInfo, Symbols};
use eim::tracers::{self, LoaderMatch};
use eim::FileId;
use eim_test_support::data::oracle_bin;

/// A file's bytes, and every range read from them.
struct Recording {
    bytes: Vec<u8>,
    reads: Arc<Mutex<Vec<Range<u64>>>>,
}

impl ByteSource for Recording {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        self.reads
            .lock()
            .expect("not poisoned")
            .push(offset..offset + buf.len() as u64);
        self.bytes.read_exact_at(offset, buf)
    }
}

fn u16_at(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes(
        b[at..at + 2].try_into().expect("2 bytes"),
    ))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The file ranges of the `PT_NOTE` segments of a 64-bit little-endian ELF
/// file, read from its program headers.
fn note_segments(b: &[u8]) -> Vec<Range<u64>> {
    const PT_NOTE: u32 = 4;
    let (phoff, phentsize, phnum) = (u64_at(b, 0x20), u16_at(b, 0x36), u16_at(b, 0x38));
    (0..phnum)
        .map(|i| (phoff + i * phentsize) as usize)
        .filter(|&ph| u32_at(b, ph) == PT_NOTE)
        .map(|ph| {
            let (offset, size) = (u64_at(b, ph + 8), u64_at(b, ph + 0x20));
            offset..offset + size
        })
        .collect()
}

/// Whether the block-aligned read `read` covers nothing but blocks of
/// `notes` (a `LazyFile` reads whole blocks).
fn within_notes(read: &Range<u64>, notes: &[Range<u64>]) -> bool {
    let blocks = |r: &Range<u64>| r.start / BLOCK..r.end.div_ceil(BLOCK);
    let read = blocks(read);
    read.clone().all(|block| {
        notes
            .iter()
            .any(|note| !note.is_empty() && blocks(note).contains(&block))
    })
}

/// Extracts `path` as eim does, then asks every loader about it, and
/// checks that none claims it, none built a costly part, and that nothing
/// was read after extraction but blocks of note segments. Returns the
/// bytes the loaders read.
fn assert_rejected_cheaply(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let notes = note_segments(&bytes);
    let reads = Arc::new(Mutex::new(Vec::new()));
    let len = bytes.len() as u64;
    let file = LazyFile::new(
        Box::new(Recording {
            bytes,
            reads: reads.clone(),
        }),
        len,
    );
    let elf = Elf::parse_lazy(&file).expect("parses");
    let data = extract_with(&elf, None, Parallelism::SEQUENTIAL).expect("extracts");
    let extracted = std::mem::take(&mut *reads.lock().expect("not poisoned"));
    let name = path.to_string_lossy();
    let info = LoaderInfo::new(FileId(1), &name, &elf, &data);
    let matches = tracers::detect(&info, ALL_TRACERS);
    assert!(matches.is_empty(), "{}: {matches:?}", path.display());
    assert_eq!(
        info.built(),
        Built {
            symbols: false,
            gaps: false
        },
        "{}: the loaders built a costly part of a file none claims",
        path.display()
    );
    let after = reads.lock().expect("not poisoned").clone();
    for read in &after {
        assert!(
            within_notes(read, &notes),
            "{}: a loader read {read:?}, outside the note segments {notes:?}",
            path.display()
        );
    }
    let read: u64 = after.iter().map(|r| r.end - r.start).sum();
    eprintln!(
        "{}: extraction read {} bytes in {} reads; the loaders {read} bytes in {} reads",
        path.display(),
        extracted.iter().map(|r| r.end - r.start).sum::<u64>(),
        extracted.len(),
        after.len()
    );
    read
}

/// A C program with 4 MiB of initialised data: its first writable segment
/// is large, as librustc_driver's is (2.4 MB).
fn big_data_program(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("big_data.c");
    std::fs::write(
        &source,
        "char big[4 << 20] = {1};\nint main(void) { return big[4095]; }\n",
    )
    .expect("write the source");
    let out = dir.join("big_data");
    match Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
    {
        Ok(status) if status.success() => Some(out),
        _ => {
            skip_or_fail("a C compiler (cc)");
            None
        }
    }
}

/// The stable toolchain's compiler driver, the file the issue measured,
/// when rustup has it.
fn librustc_driver() -> Option<PathBuf> {
    let out = Command::new("rustc")
        .args(["+stable", "--print", "sysroot"])
        .output()
        .ok()?;
    let lib = Path::new(String::from_utf8(out.stdout).ok()?.trim()).join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librustc_driver-") && n.ends_with(".so"))
        })
}

#[test]
fn files_no_loader_claims_are_rejected_by_their_evidence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = vec![oracle_bin().join("ccorpus-x86_64-O2")];
    files.extend(big_data_program(dir.path()));
    match librustc_driver() {
        Some(path) => files.push(path),
        None => eprintln!("no stable toolchain's librustc_driver: checked on the others"),
    }
    for path in files {
        if present(&path) {
            assert_rejected_cheaply(&path);
        }
    }
}

/// The Go corpus binary with its section header table cut off (as
/// `sstrip` leaves a file): no section is left, the note segment is.
fn without_section_headers(bytes: &mut [u8]) {
    bytes[0x28..0x30].fill(0); // e_shoff
    bytes[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
}

/// Changes the type of Go's build-id note (owner "Go", type 4) so that it
/// is no longer Go's; returns whether there was one.
fn spoil_go_note(bytes: &mut [u8]) -> bool {
    let mut spoiled = false;
    for note in note_segments(bytes) {
        let (mut at, end) = (note.start as usize, note.end as usize);
        while at + 12 <= end {
            let (namesz, descsz) = (u32_at(bytes, at) as usize, u32_at(bytes, at + 4) as usize);
            // The Go linker pads the name with NULs ("Go\0\0", namesz 4).
            let name = bytes.get(at + 12..at + 12 + namesz).unwrap_or_default();
            if name.starts_with(b"Go\0") && u32_at(bytes, at + 8) == 4 {
                bytes[at + 8..at + 12].copy_from_slice(&0x7777u32.to_le_bytes());
                spoiled = true;
            }
            at += 12 + namesz.next_multiple_of(4) + descsz.next_multiple_of(4);
        }
    }
    spoiled
}

/// Renames Go's sections in the section name table (a Go file whose
/// sections were renamed, or a tool that keys on other names, shows no Go
/// section but keeps `.symtab` and the note).
fn rename_go_sections(bytes: &mut [u8]) {
    let (shoff, shstrndx) = (u64_at(bytes, 0x28) as usize, u16_at(bytes, 0x3e) as usize);
    let header = shoff + shstrndx * 64;
    let (offset, size) = (
        u64_at(bytes, header + 0x18) as usize,
        u64_at(bytes, header + 0x20),
    );
    let names = &mut bytes[offset..offset + size as usize];
    for name in [&b".gopclntab\0"[..], b".go.buildinfo\0"] {
        let at = names
            .windows(name.len())
            .position(|w| w == name)
            .expect("a Go section name");
        names[at + 1] = b'x';
    }
}

/// The Go corpus binary changed by `change`, at `<dir>/<name>`, and what
/// the loaders say of it; then the same with Go's note spoiled.
fn go_changed(
    dir: &Path,
    name: &str,
    change: fn(&mut [u8]),
) -> Option<(Vec<LoaderMatch>, Vec<LoaderMatch>)> {
    let go = oracle_bin().join("gocorpus-go1.23-amd64");
    if !present(&go) {
        return None;
    }
    let mut bytes = std::fs::read(&go).expect("read");
    change(&mut bytes);
    let changed = dir.join(name);
    std::fs::write(&changed, &bytes).expect("write");
    let with_note = matches_of(&changed);
    assert!(spoil_go_note(&mut bytes), "the corpus binary has Go's note");
    std::fs::write(&changed, &bytes).expect("write");
    Some((with_note, matches_of(&changed)))
}

#[test]
fn a_go_binary_without_go_sections_is_claimed_by_its_note() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No section names Go's: the go loader (upstream's test) does not
    // claim the file; the labels loader does, by the note, with the
    // version it reads from the build information.
    let Some((renamed, unnoted)) = go_changed(dir.path(), "go-renamed", rename_go_sections) else {
        return;
    };
    assert_eq!(loaders(&renamed), ["golabels"]);
    let labels = loaded(&renamed, "golabels");
    assert!(labels.data.version().starts_with("go1.23"), "{labels:?}");
    assert!(format!("{:?}", labels.data).contains("tls_g_offset: -8"));
    // Without the note, nothing shows the file is Go's.
    assert!(unnoted.is_empty(), "{unnoted:?}");

    // Section headers cut off, as sstrip leaves a Go file: claimed by the
    // note too; with no symbol table left, the loader then cannot find
    // runtime.stackcheck, as before it tested the evidence.
    let Some((stripped, unnoted)) = go_changed(dir.path(), "go-sstripped", without_section_headers)
    else {
        return;
    };
    assert_eq!(loaders(&stripped), ["golabels"]);
    match &stripped[0].outcome {
        Err(LoaderError::MissingSymbol(name)) => assert!(name.starts_with("runtime.stackcheck")),
        other => panic!("golabels: {other:?}"),
    }
    assert!(unnoted.is_empty(), "{unnoted:?}");
}

/// The symbol index as `object`'s symbol iterator gives it, name by name
/// (what the index was built from before it read string tables whole):
/// defined symbols, the dynamic table first, the first of a name (without
/// its `@version`) wins.
fn reference_symbols(elf: &Elf<'_>) -> HashMap<Vec<u8>, Symbol> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let mut out = HashMap::new();
    for table in [elf.file.dynamic_symbols(), elf.file.symbols()] {
        for sym in table {
            let Ok(name) = sym.name_bytes() else {
                continue;
            };
            if sym.is_undefined() {
                continue;
            }
            let name = name.split(|&b| b == b'@').next().unwrap_or_default();
            out.entry(name.to_vec()).or_insert(Symbol {
                address: sym.address(),
                size: sym.size(),
                tls: sym.kind() == SymbolKind::Tls,
            });
        }
    }
    out
}

/// Every entry of `index`, by name.
fn entries(index: &Symbols<'_>) -> HashMap<Vec<u8>, Symbol> {
    index
        .with_prefix("")
        .map(|(name, sym)| (name.to_vec(), sym))
        .collect()
}

#[test]
fn symbol_indexes_hold_what_objects_symbol_reader_reads() {
    let mut files = vec![
        oracle_bin().join("ccorpus-x86_64-O2"),
        oracle_bin().join("gocorpus-go1.23-amd64"),
        PathBuf::from("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"),
        PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"),
    ];
    // Node (nodesource's, 185k symbols) when this host has it.
    files.extend(Some(PathBuf::from("/usr/bin/node")).filter(|p| p.exists()));
    let prefixes: &[&[&str]] = &[
        &["runtime."],
        &["_ZN2v88internal", "v8dbg_"],
        &["_ZN19Abstract_VM_Version", "gHotSpotVM"],
        &["Py", "_Py"],
    ];
    for path in files {
        if !present(&path) {
            continue;
        }
        let bytes = std::fs::read(&path).expect("read");
        let len = bytes.len() as u64;
        let file = LazyFile::new(Box::new(bytes), len);
        let elf = Elf::parse_lazy(&file).expect("parses");
        let reference = reference_symbols(&elf);
        assert!(!reference.is_empty(), "{}", path.display());
        assert_eq!(
            entries(&Symbols::of(&elf)),
            reference,
            "{}: every symbol",
            path.display()
        );
        for &wanted in prefixes {
            let expected: HashMap<_, _> = reference
                .iter()
                .filter(|(name, _)| wanted.iter().any(|p| name.starts_with(p.as_bytes())))
                .map(|(name, sym)| (name.clone(), *sym))
                .collect();
            assert_eq!(
                entries(&Symbols::with_prefixes(&elf, wanted)),
                expected,
                "{}: the symbols of {wanted:?}",
                path.display()
            );
        }
    }
}
