//! Real interpreter files through the manager into real kernel maps: the
//! `interpreter_offsets` entry each loader asks for is written, read back
//! from the kernel's map (iterated with `BPF_MAP_GET_NEXT_KEY` and decoded
//! here per docs/MAP_ABI.md, not by the backend), equal to the symbol
//! ranges binutils' `nm` gives and the program indices of the spec (§0,
//! §3.8); the simulated backend ends with byte-identical maps after the
//! same calls; and releasing the files deletes every entry (upstream
//! weakness 7: upstream never deletes them), leaving the maps as they were
//! apart from cooling `unwind_info_array` slots (which keep their rules by
//! design, docs/ARCHITECTURE.md "Unwind slots").
//!
//! The kernel backend is built as `eim scan --backend kernel --no-pin`
//! builds it (default capacities, no pin directory, so tests running at
//! the same time cannot collide), with the real `ElfProvider` and every
//! tracer enabled.
//!
//! Without BPF privileges the test is a loud `SKIPPED` (a failure under
//! `EIM_REQUIRE_BPF=1`); a missing interpreter is a loud `SKIPPED` unless
//! `EIM_REQUIRE_INTERPRETERS` is set (`tests/run` sets it), then a failure.

mod common;
use common::ruby_library;
use eim_test_support::skip::present;
use eim_test_support::skip::{tools_present, BINUTILS};
use eim_test_support::tools::{first_external_jump, nm_range, run};

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use eim::bpf::{Dump, KernelConfig, KernelMaps};
use eim::files::loaders::{inspect, ALL_TRACERS};
use eim::manager::{Config, ManualClock};
use eim::ops::Backend;
use eim::sim::{SimConfig, SimMaps};
use eim::{ElfFileRef, ElfProvider, ExecutableInfoManager, FileId};

const PHP: &str = "/usr/bin/php8.2";
const PYTHON: &str = "/usr/bin/python3.11";
const PERL_LIB: &str = "/usr/lib/x86_64-linux-gnu/libperl.so.5.36";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const NODE: &str = "/usr/bin/node";
const TRUE: &str = "/bin/true";
const JVM: &str = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so";

/// The 64-bit host file id computed here from the spec (§9.1, §9.2):
/// SHA-256 of the first and last 4 KiB and the big-endian size, first 8
/// bytes big-endian. Independent of eim's `fileid`.
fn host_file_id(path: &Path) -> u64 {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let size = f.metadata().expect("metadata").len();
    let n = size.min(4096) as usize;
    let mut head = vec![0u8; n];
    f.read_exact(&mut head).expect("head");
    let mut tail = vec![0u8; n];
    f.seek(SeekFrom::End(-(n as i64))).expect("seek");
    f.read_exact(&mut tail).expect("tail");
    let mut h = Sha256::new();
    h.update(&head);
    h.update(&tail);
    h.update(size.to_be_bytes());
    let digest = h.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// What the test expects of one file.
struct Case {
    path: PathBuf,
    /// The loaders that recognise it (spec §8.2).
    loaders: Vec<&'static str>,
    /// Its `interpreter_offsets` value: the ranges and the program index.
    offsets: Option<(Vec<Range<u64>>, u16)>,
    /// The host file id, computed here.
    id: u64,
}

/// The 40-byte `OffsetRange` of docs/MAP_ABI.md, laid out here by hand.
fn encode(ranges: &[Range<u64>], program: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(40);
    for i in 0..2 {
        let r = ranges.get(i).cloned().unwrap_or(0..0);
        out.extend_from_slice(&r.start.to_le_bytes());
        out.extend_from_slice(&r.end.to_le_bytes());
    }
    out.extend_from_slice(&program.to_le_bytes());
    out.extend_from_slice(&[0; 6]);
    out
}

/// A raw `interpreter_offsets` value, decoded per docs/MAP_ABI.md.
struct Decoded {
    first: Range<u64>,
    second: Range<u64>,
    program: u16,
    pad: [u8; 6],
}

fn decode(value: &[u8]) -> Decoded {
    assert_eq!(value.len(), 40, "an OffsetRange is 40 bytes");
    let u64_at = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    Decoded {
        first: u64_at(0)..u64_at(8),
        second: u64_at(16)..u64_at(24),
        program: u16::from_le_bytes([value[32], value[33]]),
        pad: value[34..40].try_into().expect("6 bytes"),
    }
}

fn render(d: &Decoded) -> String {
    let mut s = format!("{:#x}..{:#x}", d.first.start, d.first.end);
    if d.second != (0..0) {
        s.push_str(&format!(" + {:#x}..{:#x}", d.second.start, d.second.end));
    }
    format!("{s} program {}", d.program)
}

/// The files and what each must give, or `None` if one is missing (and
/// not required).
fn cases() -> Option<Vec<Case>> {
    let ruby = ruby_library(LIB_DIR);
    let paths = [
        PathBuf::from(PHP),
        PYTHON.into(),
        PERL_LIB.into(),
        ruby.clone(),
        NODE.into(),
        TRUE.into(),
        JVM.into(),
    ];
    if !paths.iter().all(|p| present(p)) {
        return None;
    }
    // Debian's own node keeps V8 in libnode.so.N: load that library too
    // (a profiler sees both mapped); nodesource's node is one file.
    let libnode = run("readelf", &["-d", NODE])
        .split(['[', ']'])
        .find(|s| s.starts_with("libnode.so"))
        .map(|lib| Path::new(LIB_DIR).join(lib));

    // Spec §0 / §8.2: Perl 3, Python 4, PHP 5, Ruby 6, V8 7.
    let symbol = |path: &Path, name: &str| vec![nm_range(path, name)];
    let mut cases = vec![
        (
            PHP.into(),
            vec!["php"],
            Some((symbol(PHP.as_ref(), "execute_ex"), 5)),
        ),
        (PYTHON.into(), vec!["python"], Some((python_ranges(), 4))),
        (
            PERL_LIB.into(),
            vec!["perl"],
            Some((symbol(PERL_LIB.as_ref(), "Perl_runops_standard"), 3)),
        ),
        (
            ruby.clone(),
            vec!["ruby"],
            Some((symbol(&ruby, "rb_vm_exec"), 6)),
        ),
    ];
    match libnode {
        Some(lib) => {
            // The executable has V8's name but not its symbols: the loader
            // answers with an error, and the library has the ranges.
            cases.push((NODE.into(), vec!["v8"], None));
            let ranges = v8_ranges(&lib);
            cases.push((lib, vec!["v8"], ranges));
        }
        None => cases.push((NODE.into(), vec!["v8"], v8_ranges(NODE.as_ref()))),
    }
    cases.push((TRUE.into(), vec![], None));
    cases.push((JVM.into(), vec!["hotspot"], None));
    Some(
        cases
            .into_iter()
            .map(|(path, loaders, offsets)| Case {
                id: host_file_id(&path),
                path,
                loaders,
                offsets,
            })
            .collect(),
    )
}

/// What `eim::files::loaders::inspect` says a file's ranges are.
fn inspected_offsets(path: &Path) -> Option<(Vec<Range<u64>>, u16)> {
    let matches = inspect(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut with = matches.iter().filter_map(|m| m.offsets());
    let o = with.next()?;
    assert!(
        with.next().is_none(),
        "two loaders with ranges: {matches:?}"
    );
    let mut ranges = vec![o.first.clone()];
    ranges.extend(o.second.clone());
    Some((ranges, o.program))
}

/// Python 3.11: `_PyEval_EvalFrameDefault` from `nm`, then its `.cold`
/// part as the loader finds it (Debian strips the local `.cold` symbol),
/// checked to hold objdump's first jump out of the loop.
fn python_ranges() -> Vec<Range<u64>> {
    let eval = nm_range(PYTHON, "_PyEval_EvalFrameDefault");
    let (inspected, _) = inspected_offsets(PYTHON.as_ref()).expect("python has ranges");
    assert_eq!(inspected[0], eval, "inspect's first range is nm's");
    let cold = inspected.get(1).cloned().expect("a .cold range on x86-64");
    let target = first_external_jump(PYTHON, &eval);
    assert!(
        cold.contains(&target),
        "{cold:x?} does not hold {target:#x}"
    );
    assert!(cold.end <= eval.start || cold.start >= eval.end, "disjoint");
    vec![eval, cold]
}

/// V8: the snapshot area the loader finds in the gaps of the deltas
/// (`inspect`), if any, checked against `nm`: it starts within 1 KiB of
/// the blob accessor and is at least 512 KiB long.
fn v8_ranges(file: &Path) -> Option<(Vec<Range<u64>>, u16)> {
    let (ranges, program) = inspected_offsets(file)?;
    assert_eq!(program, 7);
    assert_eq!(ranges.len(), 1, "{ranges:x?}");
    let blob = nm_range(file, "_ZN2v88internal8Snapshot19DefaultSnapshotBlobEv");
    assert!(
        ranges[0].start.wrapping_sub(blob.start) < 1024,
        "{ranges:x?}"
    );
    assert!(ranges[0].end - ranges[0].start >= 512 * 1024, "{ranges:x?}");
    Some((ranges, program))
}

/// Raw `bpf()` calls of this test's own, so that the kernel's maps are read
/// independently of the backend (which reads them with batch lookups).
mod raw {
    use std::os::fd::{AsRawFd, BorrowedFd};

    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

    /// `union bpf_attr` as 16 words, zeroed where unused.
    fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> Result<(), i32> {
        // SAFETY: `attr` is a valid, writable bpf_attr-sized buffer, and
        // every pointer stored in it points at a live buffer of the size
        // the command implies (the callers below).
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr.as_mut_ptr(),
                std::mem::size_of_val(attr),
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        } else {
            Ok(())
        }
    }

    /// The head of `struct bpf_map_info`.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Info {
        pub map_type: u32,
        pub key_size: u32,
        pub value_size: u32,
        pub max_entries: u32,
        pub name: String,
    }

    pub fn info(fd: BorrowedFd<'_>) -> Info {
        let mut buf = [0u8; 40];
        let mut attr = [0u64; 16];
        attr[0] = fd.as_raw_fd() as u64 | ((buf.len() as u64) << 32);
        attr[1] = buf.as_mut_ptr() as u64;
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).expect("BPF_OBJ_GET_INFO_BY_FD");
        let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4"));
        let name = &buf[24..40];
        let len = name.iter().position(|&b| b == 0).unwrap_or(16);
        Info {
            map_type: u32_at(0),
            key_size: u32_at(8),
            value_size: u32_at(12),
            max_entries: u32_at(16),
            name: String::from_utf8_lossy(&name[..len]).into_owned(),
        }
    }

    /// Every key of the map (`BPF_MAP_GET_NEXT_KEY` from no key on), and
    /// with `value_size` its value, sorted by key bytes.
    pub fn entries(
        fd: BorrowedFd<'_>,
        key_size: usize,
        value_size: Option<usize>,
        max_entries: u32,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut key: Option<Vec<u8>> = None;
        loop {
            assert!(out.len() <= max_entries as usize, "more keys than entries");
            let mut next = vec![0u8; key_size];
            let mut attr = [0u64; 16];
            attr[0] = fd.as_raw_fd() as u64;
            attr[1] = key.as_ref().map_or(0, |k| k.as_ptr() as u64);
            attr[2] = next.as_mut_ptr() as u64;
            match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
                Ok(()) => {}
                Err(libc::ENOENT) => break,
                Err(e) => panic!("BPF_MAP_GET_NEXT_KEY: errno {e}"),
            }
            let mut value = Vec::new();
            if let Some(size) = value_size {
                value = vec![0u8; size];
                let mut attr = [0u64; 16];
                attr[0] = fd.as_raw_fd() as u64;
                attr[1] = next.as_ptr() as u64;
                attr[2] = value.as_mut_ptr() as u64;
                bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).expect("BPF_MAP_LOOKUP_ELEM");
            }
            out.push((next.clone(), value));
            key = Some(next);
        }
        out.sort();
        out
    }
}

/// Raw contents of eim's maps, comparable between the kernel and the
/// simulation: keys and values as bytes, sorted by key; for the outer
/// maps only the keys (their values are map ids, which differ); for the
/// unwind array the slots that are not all zero.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Raw {
    interpreter_offsets: Vec<(Vec<u8>, Vec<u8>)>,
    pages: Vec<(Vec<u8>, Vec<u8>)>,
    /// Outer maps with entries, by name: their keys.
    outer_keys: BTreeMap<String, Vec<Vec<u8>>>,
    /// Non-zero `unwind_info_array` slots, by index.
    unwind_slots: BTreeMap<u32, Vec<u8>>,
}

impl Raw {
    /// Every file id keyed in the page map (the first 8 bytes of a key).
    fn page_files(&self) -> BTreeSet<u64> {
        self.pages
            .iter()
            .map(|(k, _)| u64::from_le_bytes(k[..8].try_into().expect("8")))
            .collect()
    }

    /// Every file id with a published delta table.
    fn table_files(&self) -> BTreeSet<u64> {
        self.outer_keys
            .values()
            .flatten()
            .map(|k| u64::from_le_bytes(k[..].try_into().expect("8")))
            .collect()
    }

    fn offsets_by_file(&self) -> BTreeMap<u64, Vec<u8>> {
        self.interpreter_offsets
            .iter()
            .map(|(k, v)| {
                assert_eq!(k.len(), 8, "an interpreter_offsets key is a u64");
                (u64::from_le_bytes(k[..].try_into().expect("8")), v.clone())
            })
            .collect()
    }
}

const CLASSES: std::ops::RangeInclusive<u16> = 8..=23;

fn outer_name(class: u16) -> String {
    format!("exe_id_to_{class}_stack_deltas")
}

/// A backend whose maps the test can read raw and dump.
trait Maps: Backend {
    fn raw(&self) -> Raw;
    fn dump(&self) -> Dump;
}

impl Maps for KernelMaps {
    fn raw(&self) -> Raw {
        // The fds are the maps they claim to be, as the kernel describes them.
        let offsets = raw::info(self.interpreter_offsets_fd());
        assert_eq!(
            (
                offsets.map_type,
                offsets.key_size,
                offsets.value_size,
                offsets.max_entries
            ),
            (1, 8, 40, 32),
            "interpreter_offsets: HASH, u64 -> 40 bytes, 32 entries: {offsets:?}"
        );
        assert!(
            "interpreter_offsets".starts_with(&offsets.name) && !offsets.name.is_empty(),
            "{offsets:?}"
        );
        let pages = raw::info(self.page_map_fd());
        assert_eq!(
            (pages.map_type, pages.key_size, pages.value_size),
            (1, 16, 8)
        );
        let slots = raw::info(self.unwind_info_fd());
        assert_eq!(
            (slots.map_type, slots.key_size, slots.value_size),
            (2, 4, 12)
        );
        let mut outer_keys = BTreeMap::new();
        for class in CLASSES {
            let fd = self.outer_fd(class).expect("outer map");
            let info = raw::info(fd);
            assert_eq!((info.map_type, info.key_size), (13, 8), "class {class}");
            let keys: Vec<Vec<u8>> = raw::entries(fd, 8, None, info.max_entries)
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            if !keys.is_empty() {
                outer_keys.insert(outer_name(class), keys);
            }
        }
        Raw {
            interpreter_offsets: raw::entries(
                self.interpreter_offsets_fd(),
                8,
                Some(40),
                offsets.max_entries,
            ),
            pages: raw::entries(self.page_map_fd(), 16, Some(8), pages.max_entries),
            outer_keys,
            unwind_slots: raw::entries(self.unwind_info_fd(), 4, Some(12), slots.max_entries)
                .into_iter()
                .filter(|(_, v)| v.iter().any(|&b| b != 0))
                .map(|(k, v)| (u32::from_le_bytes(k[..].try_into().expect("4")), v))
                .collect(),
        }
    }

    fn dump(&self) -> Dump {
        KernelMaps::dump(self).expect("dump of the kernel maps")
    }
}

impl Maps for SimMaps {
    fn raw(&self) -> Raw {
        let map = |name: &str| self.map_named(name).unwrap_or_else(|| panic!("{name}"));
        let hash = |name: &str| -> Vec<(Vec<u8>, Vec<u8>)> {
            let mut all: Vec<_> = map(name)
                .entries()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect();
            all.sort();
            all
        };
        let slots = map("unwind_info_array");
        Raw {
            interpreter_offsets: hash("interpreter_offsets"),
            pages: hash("stack_delta_page_to_info"),
            outer_keys: CLASSES
                .map(outer_name)
                .map(|name| {
                    let keys: Vec<Vec<u8>> = hash(&name).into_iter().map(|(k, _)| k).collect();
                    (name, keys)
                })
                .filter(|(_, keys)| !keys.is_empty())
                .collect(),
            unwind_slots: (0..slots.spec().max_entries)
                .filter_map(|i| Some((i, slots.slot(i)?.to_vec())))
                .filter(|(_, v)| v.iter().any(|&b| b != 0))
                .collect(),
        }
    }

    fn dump(&self) -> Dump {
        Dump {
            pages: self.pages(),
            delta_tables: self
                .delta_tables()
                .into_iter()
                .map(|(key, table)| (key, (table.capacity(), table.entries())))
                .collect(),
            unwind_infos: self.unwind_infos(),
            interpreter_offsets: self.interpreter_offsets(),
            process_mappings: self.process_mappings(),
            live_inner_maps: self.live_inner_maps(),
        }
    }
}

/// The maps after one step of the sequence.
struct Stage {
    name: &'static str,
    raw: Raw,
    dump: Dump,
    /// The manager's cooling `unwind_info_array` slots and live slot count.
    cooling: BTreeSet<u32>,
    live_slots: usize,
}

/// What one backend went through.
struct Outcome {
    stages: Vec<Stage>,
    /// Per file, the loaders the manager reported.
    loaders: Vec<Vec<&'static str>>,
}

/// The sequence, on one backend: load every file in one batch (as a scan
/// does), take a second reference on each, release one reference each
/// (even files with `remove_or_dec_ref`, odd ones with `dec_ref`), release
/// the last (the even files unload at once, the odd ones stay until
/// `cleanup_unused`), then clean up.
fn sequence<B: Maps>(backend: B, cases: &[Case]) -> Outcome {
    let clock = Arc::new(ManualClock::new());
    let m = ExecutableInfoManager::with_config(
        ElfProvider::new(),
        backend,
        ALL_TRACERS,
        Config::default(),
        Box::new(clock.clone()),
    );
    let mut stages = Vec::new();
    let mut snapshot = |name: &'static str, m: &ExecutableInfoManager<ElfProvider, B>| {
        let state = m.state();
        let slots = state.book.slots();
        let (raw, dump) = m.with_backend(|b| (b.raw(), b.dump()));
        stages.push(Stage {
            name,
            raw,
            dump,
            cooling: slots.cooling().map(|(slot, _)| u32::from(slot)).collect(),
            live_slots: slots.live(),
        });
    };
    snapshot("fresh", &m);

    let files: Vec<ElfFileRef> = cases.iter().map(|c| ElfFileRef::new(&c.path)).collect();
    let ids: Vec<FileId> = files
        .iter()
        .map(|f| f.file_id().expect("file id").host())
        .collect();
    let batch: Vec<(FileId, &ElfFileRef)> = ids.iter().copied().zip(&files).collect();
    let loaders = m
        .load_many(&batch)
        .into_iter()
        .zip(cases)
        .map(|(r, c)| {
            let info = r.unwrap_or_else(|e| panic!("{}: {e}", c.path.display()));
            info.interpreters.iter().map(|i| i.loader).collect()
        })
        .collect();
    snapshot("loaded", &m);

    for (id, file) in ids.iter().zip(&files) {
        m.add_or_inc_ref(*id, file).expect("a second reference");
    }
    let release = |m: &ExecutableInfoManager<ElfProvider, B>| {
        for (i, id) in ids.iter().enumerate() {
            let released = if i % 2 == 0 {
                m.remove_or_dec_ref(*id)
            } else {
                m.dec_ref(*id)
            };
            released.unwrap_or_else(|e| panic!("{}: {e}", cases[i].path.display()));
        }
    };
    release(&m);
    snapshot("one reference released", &m);
    release(&m);
    snapshot("last references released", &m);
    clock.advance(Duration::from_secs(1));
    let report = m.cleanup_unused(Duration::from_secs(1));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.unloaded, cases.len() / 2, "the odd files");
    snapshot("cleaned up", &m);

    let state = m.state();
    assert!(state.files.is_empty(), "no file is known any more");
    assert!(state.book.loaded().is_empty(), "no file is loaded");
    assert_eq!(state.book.leftover_ops(), 0, "nothing is left to remove");
    Outcome { stages, loaders }
}

/// The entries the kernel's map must hold for the files `which` selects.
fn expected(cases: &[Case], which: impl Fn(usize) -> bool) -> BTreeMap<u64, Vec<u8>> {
    cases
        .iter()
        .enumerate()
        .filter(|(i, _)| which(*i))
        .filter_map(|(_, c)| {
            let (ranges, program) = c.offsets.as_ref()?;
            Some((c.id, encode(ranges, *program)))
        })
        .collect()
}

fn ids_of(cases: &[Case], which: impl Fn(usize) -> bool) -> BTreeSet<u64> {
    cases
        .iter()
        .enumerate()
        .filter(|(i, _)| which(*i))
        .map(|(_, c)| c.id)
        .collect()
}

#[test]
fn real_interpreters_write_their_offsets_to_kernel_maps_and_unloading_deletes_them() {
    if !tools_present(BINUTILS) {
        return;
    }
    if !eim::bpf::probe::require_bpf("interpreter offsets in kernel maps") {
        return;
    }
    let Some(cases) = cases() else {
        return;
    };
    // `eim scan --backend kernel --no-pin`: fresh maps, unpinned.
    let kernel = KernelMaps::with_config(KernelConfig {
        pin_dir: None,
        ..KernelConfig::default()
    })
    .expect("kernel maps");
    let k = sequence(kernel, &cases);
    let s = sequence(
        SimMaps::new(SimConfig::default()).expect("sim maps"),
        &cases,
    );

    // The loaders the manager reports are the spec's.
    for (c, got) in cases.iter().zip(&k.loaders) {
        assert_eq!(got, &c.loaders, "{}", c.path.display());
    }

    let all = |_: usize| true;
    let odd = |i: usize| i % 2 == 1;
    let stage = |name: &str| {
        k.stages
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("stage {name}"))
    };

    // Fresh maps hold nothing.
    assert_eq!(stage("fresh").raw, Raw::default());

    // Loaded: one entry per file whose loader asks for ranges, none for the
    // others, each the ranges nm gives with the spec's program index.
    let loaded = &stage("loaded").raw;
    let held = loaded.offsets_by_file();
    for c in &cases {
        let line = match held.get(&c.id) {
            Some(value) => render(&decode(value)),
            None => "none".to_string(),
        };
        eprintln!("KERNEL interpreter_offsets {}: {line}", c.path.display());
    }
    for (id, value) in &held {
        let d = decode(value);
        assert_eq!(d.pad, [0; 6], "padding of {id:#x}");
        assert!(d.first.start < d.first.end, "{id:#x}: {:x?}", d.first);
    }
    assert_eq!(
        held,
        expected(&cases, all),
        "interpreter_offsets after the load"
    );
    assert!(
        held.len() >= 4,
        "PHP, Python, Perl and Ruby have ranges: {held:x?}"
    );
    // Every file is in the kernel: its pages and its published table.
    assert_eq!(loaded.page_files(), ids_of(&cases, all));
    assert_eq!(loaded.table_files(), ids_of(&cases, all));

    // A reference released leaves everything in place.
    assert_eq!(&stage("one reference released").raw, loaded);

    // The even files unloaded at once: their entries are gone, the odd
    // files' (released with a delay) stay until the cleanup.
    let partial = &stage("last references released").raw;
    assert_eq!(partial.offsets_by_file(), expected(&cases, odd));
    assert_eq!(partial.page_files(), ids_of(&cases, odd));
    assert_eq!(partial.table_files(), ids_of(&cases, odd));

    // All released: no entry left (weakness 7), no page, no table; the
    // unwind slots that remain set are exactly the manager's cooling ones.
    let end = stage("cleaned up");
    assert!(end.raw.interpreter_offsets.is_empty(), "weakness 7");
    assert!(end.raw.pages.is_empty());
    assert!(end.raw.outer_keys.is_empty());
    assert_eq!(end.dump.live_inner_maps, 0);
    assert_eq!(end.live_slots, 0);
    let set: BTreeSet<u32> = end.raw.unwind_slots.keys().copied().collect();
    assert_eq!(set, end.cooling, "non-zero slots are the cooling ones");
    assert_eq!(
        Raw {
            unwind_slots: BTreeMap::new(),
            ..end.raw.clone()
        },
        Raw::default(),
        "the maps are as fresh apart from cooling slots"
    );

    // The simulation went through byte-identical maps.
    assert_eq!(k.loaders, s.loaders);
    assert_eq!(k.stages.len(), s.stages.len());
    for (a, b) in k.stages.iter().zip(&s.stages) {
        assert_eq!(a.name, b.name);
        for (map, same) in [
            (
                "interpreter_offsets",
                a.raw.interpreter_offsets == b.raw.interpreter_offsets,
            ),
            ("pages", a.raw.pages == b.raw.pages),
            ("outer maps", a.raw.outer_keys == b.raw.outer_keys),
            (
                "unwind_info_array",
                a.raw.unwind_slots == b.raw.unwind_slots,
            ),
        ] {
            assert!(same, "{}: {map} differs between kernel and sim", a.name);
        }
        assert!(a.raw == b.raw, "{}: raw maps differ", a.name);
        assert!(a.dump == b.dump, "{}: decoded maps differ", a.name);
        assert_eq!(a.cooling, b.cooling, "{}", a.name);
    }
}
