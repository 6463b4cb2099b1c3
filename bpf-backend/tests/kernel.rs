//! Kernel tests of `KernelMaps` (root or CAP_BPF; a loud SKIPPED otherwise,
//! a failure under `EIM_REQUIRE_BPF=1`):
//!
//! * ABI agreement: values written from Rust are read back by the BPF
//!   lookup program field by field;
//! * every ELF of the oracle and upstream test data, loaded through the
//!   manager into real maps, resolves in the kernel exactly as the sim
//!   reader and a direct search of its deltas say;
//! * the per-element write mode leaves the same maps as the batches;
//! * capacity: full maps fail cleanly and roll back, in both write modes;
//! * differential: the same calls with the same injected faults leave
//!   `KernelMaps` and `SimMaps` with identical contents;
//! * pinning: maps pinned in a bpffs directory have one owner (a second
//!   instance is refused with the owner's pid), are re-opened by a later
//!   one, and refused when their shape differs unless replacing them is
//!   asked for;
//! * crash recovery: a restart after a crash at any point of a load plan
//!   finds the pins, cleans them, and loads the file afresh; or, with
//!   `adopt_pins`, keeps them and reconciles, ending with the sim's maps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eim_bpf::lookup_record::{code, error_name, have, kind};
use eim_bpf::{sys, KernelConfig, KernelMaps, LookupResult, MapStats, PinState, WriteMode};
use eim_core::provider::MemoryProvider;
use eim_core::{ExecutableInfoManager, Tracers};
use eim_machine::abi::{
    OffsetRange, StackDelta, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo, Wire, PAGE_MASK,
};
use eim_machine::deltas::IntervalData;
use eim_machine::machine::{Capacities, KernelBook};
use eim_machine::ops::{Backend, Errno, MapOp, OpFailure};
use eim_machine::FileId;
use eim_sim::{expected, Answer, Resolved, SimConfig, SimMaps, SimReader};

mod common;
use common::{corpus, sim_dump};
use eim_test_support::rng::XorShift;

/// Whether BPF is usable here. Without privileges: a loud SKIPPED and
/// `false`, or a panic when `EIM_REQUIRE_BPF=1`.
fn require_bpf() -> bool {
    eim_bpf::probe::require_bpf("kernel test")
}

fn kernel_answer(r: &LookupResult) -> Option<Answer> {
    match r.resolved() {
        Ok(resolved) => Some(Answer::from(resolved)),
        Err(code::ERR_STACK_DELTA_INVALID) => Some(Answer::Invalid),
        Err(_) => None,
    }
}

/// A table too big for one mapped window (4 MiB: 512 Ki slots of 8 bytes)
/// is written a window at a time: every entry lands where a per-element
/// write puts it, across the windows' edges, and the sim holds the same.
#[test]
fn a_table_of_several_mapped_windows_is_written_whole() {
    if !require_bpf() {
        return;
    }
    // Three windows and part of a fourth; every entry non-zero and
    // different from its neighbours.
    let count = 3 * (1 << 19) + 12_345;
    let deltas: Arc<[StackDelta]> = (0..count as u32)
        .map(|i| StackDelta {
            addr_low: (i as u16) | 1,
            unwind_info: (i >> 16) as u16 + 1,
        })
        .collect();
    let map_id = eim_machine::abi::size_class(count as u32).expect("a size class");
    let op = MapOp::PutDeltaTable {
        file_id: FileId(0x77),
        map_id,
        deltas: deltas.clone(),
    };
    let mut dumps = Vec::new();
    for mode in [WriteMode::Batch, WriteMode::PerElement] {
        let mut k = KernelMaps::with_config(KernelConfig {
            write_mode: mode,
            ..KernelConfig::default()
        })
        .expect("maps");
        assert_eq!(k.apply(&op), Ok(()), "{mode:?}");
        let dump = k.dump().expect("dump");
        let (_, written) = &dump.delta_tables[&(map_id, FileId(0x77))];
        assert!(written[..] == deltas[..], "{mode:?}: the table differs");
        dumps.push(dump);
    }
    assert!(dumps[0] == dumps[1], "batch and per-element maps differ");
    let mut sim = SimMaps::new(SimConfig::default()).expect("sim");
    assert_eq!(sim.apply(&op), Ok(()));
    assert!(sim_dump(&sim) == dumps[0], "kernel and sim differ");
}

/// The kernel's result in the sim reader's shape: `Err(code name)`.
fn kernel_resolved(r: &LookupResult) -> Result<Resolved, &'static str> {
    r.resolved()
        .map_err(|c| error_name(c).unwrap_or("unknown code"))
}

fn apply_all(b: &mut impl Backend, ops: &[MapOp]) {
    for op in ops {
        assert_eq!(b.apply(op), Ok(()), "{op:?}");
    }
}

#[test]
fn abi_agreement_values_written_from_rust_are_read_by_the_program() {
    if !require_bpf() {
        return;
    }
    let mut k = KernelMaps::new().expect("maps");
    let last = (eim_machine::abi::capacity::UNWIND_INFO - 1) as u16;
    // Every byte distinct and non-zero, the pad byte included, so that a
    // shifted field cannot go unnoticed.
    let slot0 = UnwindInfo {
        opcode: 0x81,
        fp_opcode: 0x03,
        merge_opcode: 0x04,
        pad: 0x5a,
        param: -0x1234_5678,
        fp_param: 0x0765_4321,
    };
    let slot_last = UnwindInfo {
        opcode: 0x02,
        fp_opcode: 0x85,
        merge_opcode: 0x82,
        pad: 0xa5,
        param: 0x7fff_fff0,
        fp_param: -8,
    };
    let file = FileId(0x0123_4567_89ab_cdef);
    let deltas = vec![
        StackDelta {
            addr_low: 0x10,
            unwind_info: 0,
        },
        StackDelta {
            addr_low: 0x20,
            unwind_info: last,
        },
        StackDelta {
            addr_low: 0xfff0,
            unwind_info: 0x8001,
        },
    ];
    let page = StackDeltaPageInfo {
        first_delta: 0,
        num_deltas: 3,
        map_id: 8,
    };
    let range = OffsetRange {
        lower_offset1: 0x1111_2222_3333_4444,
        upper_offset1: 0x5555_6666_7777_8888,
        lower_offset2: 0x9999_aaaa_bbbb_cccc,
        upper_offset2: 0xdddd_eeee_ffff_0001,
        program_index: 0x0203,
        pad: [0; 6],
    };
    apply_all(
        &mut k,
        &[
            MapOp::PutUnwindInfos(vec![(0, slot0), (last, slot_last)]),
            MapOp::PutDeltaTable {
                file_id: file,
                map_id: 8,
                deltas: deltas.clone().into(),
            },
            MapOp::PutPages(vec![(
                StackDeltaPageKey {
                    file_id: file.0,
                    page: 0xabcd_0000,
                },
                page,
            )]),
            MapOp::PutInterpreterOffsets {
                file_id: file,
                range,
            },
        ],
    );
    let r = k.lookup(file, 0xabcd_0013).expect("lookup");
    assert_eq!(r.return_value, code::OK);
    assert_eq!(
        r.have,
        have::PAGE | have::DELTA | have::SLOT | have::OFFSETS
    );
    assert_eq!(r.page, 0xabcd_0000);
    assert_eq!(r.page_info, page);
    assert_eq!(r.delta, deltas[0]);
    assert_eq!(r.raw_info, slot0);
    assert_eq!(r.offsets, range);
    assert_eq!(
        (r.index, r.addr_diff, r.slot, r.kind),
        (0, 3, 0, kind::RULE)
    );
    // Below the merge distance (4): no adjustment; at it: +8.
    assert_eq!(
        r.info,
        UnwindInfo {
            merge_opcode: 0,
            ..slot0
        }
    );
    let r = k.lookup(file, 0xabcd_0014).expect("lookup");
    assert_eq!(r.info.param, slot0.param + 8);
    // The last slot, with a negative merge from distance 2.
    let r = k.lookup(file, 0xabcd_0022).expect("lookup");
    assert_eq!((r.delta, r.slot, r.raw_info), (deltas[1], last, slot_last));
    assert_eq!(r.info.param, slot_last.param - 8);
    assert_eq!(r.info.merge_opcode, 0);
    // STOP, and the page of another file.
    let r = k.lookup(file, 0xabcd_ffff).expect("lookup");
    assert_eq!(
        (r.code, r.kind, r.command, r.index),
        (code::OK, kind::STOP, 1, 2)
    );
    let r = k.lookup(FileId(file.0 + 1), 0xabcd_0013).expect("lookup");
    assert_eq!((r.code, r.have), (code::ERR_TEXT_SECTION, 0));
    // The dump reads back what was written.
    let dump = k.dump().expect("dump");
    assert_eq!(dump.unwind_infos[0], slot0);
    assert_eq!(dump.unwind_infos[usize::from(last)], slot_last);
    assert_eq!(dump.delta_tables[&(8, file)], (256, deltas));
    assert_eq!(dump.interpreter_offsets[&file], range);
    assert_eq!(dump.live_inner_maps, 1);
}

/// Random addresses probed per corpus file, besides every delta address
/// and its two neighbours.
const RANDOM_PROBES: usize = 3000;

/// Addresses to probe in `data`: every delta address and its neighbours,
/// plus `random` addresses in and around the covered range.
fn probes(data: &IntervalData, random: usize, seed: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for d in data {
        out.extend([
            d.address.wrapping_sub(1),
            d.address,
            d.address.wrapping_add(1),
        ]);
    }
    if let (Some(first), Some(last)) = (data.first(), data.last()) {
        let lo = first.address.saturating_sub(0x2_0000) & !PAGE_MASK;
        let hi = (last.address | PAGE_MASK) + 0x2_0000;
        let mut rng = XorShift::new(seed | 1);
        out.extend((0..random).map(|_| lo + rng.next_u64() % (hi - lo)));
    }
    out
}

#[test]
fn every_corpus_file_resolves_in_the_kernel_as_the_sim_and_its_deltas_say() {
    if !require_bpf() {
        return;
    }
    let files = corpus();
    let provider = Arc::new(MemoryProvider::new());
    let kernel = ExecutableInfoManager::new(
        provider.clone(),
        KernelMaps::new().expect("maps"),
        Tracers::none(),
    );
    let sim = ExecutableInfoManager::new(
        provider.clone(),
        SimMaps::new(SimConfig::default()).expect("sim"),
        Tracers::none(),
    );
    let mut ids = Vec::new();
    for (i, (name, data)) in files.iter().enumerate() {
        let id = FileId(0x1000 + i as u64);
        provider.insert(id, data.clone());
        let calls = sys::thread_syscalls();
        let started = Instant::now();
        let got = kernel.add_or_inc_ref(id, &id).map(|_| ());
        let elapsed = started.elapsed();
        let calls = sys::thread_syscalls() - calls;
        let want = sim.add_or_inc_ref(id, &id).map(|_| ());
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{name}");
        eprintln!(
            "load {name}: {} deltas, {calls} bpf() calls, {:.2} ms",
            data.len(),
            elapsed.as_secs_f64() * 1e3
        );
        // Unwind slots, create + fill + publish the table, pages: a
        // constant, whatever the delta count.
        if got.is_ok() && !data.is_empty() {
            assert!(
                (1..=5).contains(&calls),
                "{name}: {calls} syscalls for one file"
            );
        }
        ids.push((id, name, data));
    }
    let mut checked = 0usize;
    let started = Instant::now();
    kernel.with_backend(|k| {
        sim.with_backend(|s| {
            let reader = SimReader::new(s);
            for &(id, name, data) in &ids {
                for addr in probes(data, RANDOM_PROBES, id.0) {
                    let r = k.lookup(id, addr).expect("lookup");
                    assert_eq!(
                        kernel_answer(&r),
                        expected(data, addr),
                        "{name} at {addr:#x}: kernel {r:?}"
                    );
                    assert_eq!(
                        kernel_resolved(&r),
                        reader.lookup(id, addr).map_err(|e| e.code()),
                        "{name} at {addr:#x}: kernel {r:?}"
                    );
                    checked += 1;
                }
            }
        })
    });
    eprintln!(
        "{checked} addresses checked in the kernel in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    // Unloading leaves nothing behind in the kernel either.
    for &(id, ..) in &ids {
        kernel.remove_or_dec_ref(id).expect("remove");
    }
    kernel.with_backend(|k| {
        let dump = k.dump().expect("dump");
        assert!(dump.pages.is_empty() && dump.delta_tables.is_empty());
        assert_eq!(dump.live_inner_maps, 0);
    });
}

/// Fails chosen ops: op number `n` (counted over the backend's life) fails
/// with `errno` after applying the first `keep` elements of a batch op.
struct Faulty<B> {
    inner: B,
    count: usize,
    faults: Arc<BTreeMap<usize, (i32, usize)>>,
}

impl<B: Backend> Backend for Faulty<B> {
    fn apply(&mut self, op: &MapOp) -> Result<(), OpFailure> {
        let n = self.count;
        self.count += 1;
        let Some(&(errno, keep)) = self.faults.get(&n) else {
            return self.inner.apply(op);
        };
        let done = match op {
            MapOp::PutUnwindInfos(v) => {
                let done = keep.min(v.len());
                self.inner
                    .apply(&MapOp::PutUnwindInfos(v[..done].to_vec()))?;
                done
            }
            MapOp::PutPages(v) => {
                let done = keep.min(v.len());
                self.inner.apply(&MapOp::PutPages(v[..done].to_vec()))?;
                done
            }
            MapOp::DeletePages(v) => {
                let done = keep.min(v.len());
                self.inner.apply(&MapOp::DeletePages(v[..done].to_vec()))?;
                done
            }
            _ => 0,
        };
        Err(OpFailure::new(Errno(errno), done))
    }
}

#[test]
fn the_same_calls_with_the_same_faults_leave_kernel_and_sim_identical() {
    if !require_bpf() {
        return;
    }
    // The smaller corpus files (the differential run issues many calls).
    let mut files: Vec<IntervalData> = corpus()
        .into_iter()
        .map(|(_, data)| data)
        .filter(|d| !d.is_empty() && d.len() < 40_000)
        .collect();
    files.truncate(6);
    let mut failed_calls = 0;
    for seed in 1..=6u64 {
        let mut rng = XorShift::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let faults: Arc<BTreeMap<usize, (i32, usize)>> = Arc::new(
            (0..12)
                .map(|_| {
                    let at = (rng.next_u64() % 120) as usize;
                    let errno =
                        [libc::ENOMEM, libc::E2BIG, libc::EBUSY][(rng.next_u64() % 3) as usize];
                    (at, (errno, (rng.next_u64() % 4) as usize))
                })
                .collect(),
        );
        let provider = Arc::new(MemoryProvider::new());
        for (i, data) in files.iter().enumerate() {
            provider.insert(FileId(i as u64 + 1), data.clone());
        }
        let kernel = ExecutableInfoManager::new(
            provider.clone(),
            Faulty {
                inner: KernelMaps::new().expect("maps"),
                count: 0,
                faults: faults.clone(),
            },
            Tracers::none(),
        );
        let sim = ExecutableInfoManager::new(
            provider.clone(),
            Faulty {
                inner: SimMaps::new(SimConfig::default()).expect("sim"),
                count: 0,
                faults: faults.clone(),
            },
            Tracers::none(),
        );
        for step in 0..40 {
            let id = FileId(rng.next_u64() % files.len() as u64 + 1);
            let (got, want) = if rng.next_u64().is_multiple_of(3) {
                (
                    format!("{:?}", kernel.remove_or_dec_ref(id)),
                    format!("{:?}", sim.remove_or_dec_ref(id)),
                )
            } else if rng.next_u64().is_multiple_of(5) {
                (
                    format!("{:?}", kernel.retry_leftovers()),
                    format!("{:?}", sim.retry_leftovers()),
                )
            } else {
                (
                    format!("{:?}", kernel.add_or_inc_ref(id, &id).map(|_| ())),
                    format!("{:?}", sim.add_or_inc_ref(id, &id).map(|_| ())),
                )
            };
            assert_eq!(got, want, "seed {seed} step {step}");
            failed_calls += usize::from(got.starts_with("Err"));
            let k = kernel.with_backend(|b| b.inner.dump().expect("dump"));
            let s = sim.with_backend(|b| sim_dump(&b.inner));
            assert!(
                k == s,
                "seed {seed} step {step}: kernel and sim maps differ"
            );
        }
    }
    eprintln!("{failed_calls} calls failed under injected faults");
    assert!(
        failed_calls >= 6,
        "the faults must bite: {failed_calls} failed calls"
    );
}

/// Capacity: with a small page map and small outer maps, the kernel's own
/// E2BIG (partial batch, full outer map) gives the same results, rollbacks
/// and map contents as the sim with the same capacities.
#[test]
fn full_maps_fail_cleanly_and_roll_back_as_in_the_sim() {
    if !require_bpf() {
        return;
    }
    // Both write modes: the kernel stops a batch part way and says how
    // far it got; the per-element writes must report the same.
    for mode in [WriteMode::Batch, WriteMode::PerElement] {
        full_maps_in(mode);
    }
}

fn full_maps_in(mode: WriteMode) {
    let files = corpus();
    let provider = Arc::new(MemoryProvider::new());
    for (i, (_, data)) in files.iter().enumerate() {
        provider.insert(FileId(i as u64 + 1), data.clone());
    }
    let kernel = ExecutableInfoManager::new(
        provider.clone(),
        KernelMaps::with_config(eim_bpf::KernelConfig {
            pages: 96,
            outer: 2,
            write_mode: mode,
            ..eim_bpf::KernelConfig::default()
        })
        .expect("maps"),
        Tracers::none(),
    );
    let sim = ExecutableInfoManager::new(
        provider.clone(),
        SimMaps::new(SimConfig {
            pages: 96,
            outer: 2,
            ..SimConfig::default()
        })
        .expect("sim"),
        Tracers::none(),
    );
    let mut failures = 0;
    for (i, (name, _)) in files.iter().enumerate() {
        let id = FileId(i as u64 + 1);
        let got = format!("{:?}", kernel.add_or_inc_ref(id, &id).map(|_| ()));
        let want = format!("{:?}", sim.add_or_inc_ref(id, &id).map(|_| ()));
        assert_eq!(got, want, "{mode:?} {name}");
        if got.starts_with("Err") {
            eprintln!("{mode:?} {name}: {got}");
            assert!(got.contains("E2BIG"), "a kernel limit: {got}");
            failures += 1;
        }
        let k = kernel.with_backend(|b| b.dump().expect("dump"));
        let s = sim.with_backend(|b| sim_dump(b));
        assert!(k == s, "{mode:?} {name}: kernel and sim maps differ");
    }
    assert!(
        failures >= 2,
        "{mode:?}: the limits must be reached: {failures} failures"
    );
}

/// The per-element baseline writes exactly what the batches write, for
/// the whole corpus loaded one file at a time and unloaded again, with a
/// syscall count that grows with the deltas (where the batches' does not).
#[test]
fn per_element_writes_leave_the_same_maps_as_batches() {
    if !require_bpf() {
        return;
    }
    let files = corpus();
    let provider = Arc::new(MemoryProvider::new());
    for (i, (_, data)) in files.iter().enumerate() {
        provider.insert(FileId(i as u64 + 1), data.clone());
    }
    let manager = |mode| {
        ExecutableInfoManager::new(
            provider.clone(),
            KernelMaps::with_config(KernelConfig {
                write_mode: mode,
                ..KernelConfig::default()
            })
            .expect("maps"),
            Tracers::none(),
        )
    };
    let batch = manager(WriteMode::Batch);
    let single = manager(WriteMode::PerElement);
    for (i, (name, data)) in files.iter().enumerate() {
        let id = FileId(i as u64 + 1);
        let before = sys::thread_syscalls();
        let got = format!("{:?}", single.add_or_inc_ref(id, &id).map(|_| ()));
        let calls = sys::thread_syscalls() - before;
        let want = format!("{:?}", batch.add_or_inc_ref(id, &id).map(|_| ()));
        assert_eq!(got, want, "{name}");
        let s = single.with_backend(|b| b.dump().expect("dump"));
        let b = batch.with_backend(|b| b.dump().expect("dump"));
        // One call per kernel delta and per page at least (merged deltas
        // make the kernel table shorter than the source list).
        let elements: usize = s
            .delta_tables
            .iter()
            .filter(|((_, file), _)| *file == id)
            .map(|(_, (_, deltas))| deltas.len())
            .sum::<usize>()
            + s.pages.keys().filter(|k| k.file_id == id.0).count();
        if got.starts_with("Ok") && !data.is_empty() {
            assert!(
                calls as usize >= elements && elements > 0,
                "{name}: {calls} calls for {elements} elements"
            );
        }
        assert!(s == b, "{name}: per-element and batch maps differ");
    }
    for (i, (name, _)) in files.iter().enumerate() {
        let id = FileId(i as u64 + 1);
        single.remove_or_dec_ref(id).expect("remove");
        batch.remove_or_dec_ref(id).expect("remove");
        let s = single.with_backend(|b| b.dump().expect("dump"));
        let b = batch.with_backend(|b| b.dump().expect("dump"));
        assert!(
            s == b,
            "unloading {name}: per-element and batch maps differ"
        );
    }
    let left = single.with_backend(|b| b.stats().expect("stats"));
    assert!(left.pages == 0 && left.tables.is_empty(), "{left:?}");
}

/// A pin directory of its own for one test, removed with its pins when
/// dropped (and unmounted first if the test had a bpffs mounted on it).
struct PinDir {
    path: PathBuf,
    unmount: bool,
}

impl PinDir {
    /// `/sys/fs/bpf/eim-test-<pid>-<test>`, on the bpffs at `/sys/fs/bpf`
    /// (mounted here if nothing is).
    fn under_sys_fs_bpf(test: &str) -> Self {
        let root = Path::new("/sys/fs/bpf");
        if !eim_bpf::bpffs::is_bpffs(root).unwrap_or(false) {
            eim_bpf::bpffs::mount_bpffs(root, true)
                .expect("mounting a bpffs on /sys/fs/bpf")
                .keep();
        }
        let path = root.join(format!("eim-test-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Self {
            path,
            unmount: false,
        }
    }

    fn config(&self) -> KernelConfig {
        KernelConfig {
            pin_dir: Some(self.path.clone()),
            ..KernelConfig::default()
        }
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        // No one else uses this test's path: its lock file can go.
        if let Ok(lock) = eim_bpf::lock::lock_file_of(&self.path) {
            let _ = std::fs::remove_file(lock);
        }
        if self.unmount {
            use std::os::unix::ffi::OsStrExt;
            let c = std::ffi::CString::new(self.path.as_os_str().as_bytes()).expect("path");
            // SAFETY: a NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            let _ = std::fs::remove_dir(&self.path);
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn states(k: &KernelMaps) -> BTreeMap<String, PinState> {
    k.pin_report()
        .expect("a pin report")
        .maps
        .iter()
        .cloned()
        .collect()
}

fn pinned_max_entries(dir: &Path, name: &str) -> u32 {
    let fd = sys::obj_get(&dir.join(name)).expect("pinned");
    sys::map_info(std::os::fd::AsFd::as_fd(&fd))
        .expect("info")
        .max_entries
}

/// The smallest corpus files that have deltas.
fn small_files(n: usize) -> Vec<(String, IntervalData)> {
    let mut files: Vec<_> = corpus()
        .into_iter()
        .filter(|(_, d)| !d.is_empty())
        .collect();
    files.sort_by_key(|(_, d)| d.len());
    files.truncate(n);
    files
}

fn map_id(dir: &Path, name: &str) -> u32 {
    let fd = sys::obj_get(&dir.join(name)).expect("pinned");
    sys::map_info(std::os::fd::AsFd::as_fd(&fd))
        .expect("info")
        .id
}

#[test]
fn pinned_maps_have_one_owner_are_reopened_and_refused_when_their_shape_differs() {
    if !require_bpf() {
        return;
    }
    let dir = PinDir::under_sys_fs_bpf("shape");
    let first = KernelMaps::with_config(dir.config()).expect("maps");
    let report = first.pin_report().expect("pinned").clone();
    assert_eq!(report.mounted, None);
    // 19 maps, the process mappings and the generation counter.
    assert_eq!(report.maps.len(), 21, "{report:?}");
    for (name, state) in &report.maps {
        assert_eq!(*state, PinState::Created, "{name}");
        assert!(dir.path.join(name).exists(), "{name} is pinned");
    }
    // A second instance, even in this process, is refused: it names this
    // process as the owner and leaves the pins alone.
    let pages_id = map_id(&dir.path, eim_machine::abi::map_name::PAGES);
    match KernelMaps::with_config(dir.config()) {
        Err(e) => assert_eq!(
            e.to_string(),
            format!(
                "pin directory {} is in use by pid {} (lock file {})",
                dir.path.display(),
                std::process::id(),
                report.lock_file.display()
            )
        ),
        Ok(_) => panic!("a second owner of {}", dir.path.display()),
    }
    assert_eq!(
        map_id(&dir.path, eim_machine::abi::map_name::PAGES),
        pages_id
    );
    // What is loaded through the owner is in the pins (read without
    // owning them), so the lookup program, relocated to the pinned maps,
    // reads it.
    let (name, data) = small_files(1).pop().expect("a file");
    let provider = Arc::new(MemoryProvider::new());
    let id = FileId(0x77);
    provider.insert(id, data.clone());
    let manager = ExecutableInfoManager::new(provider, first, Tracers::none());
    manager.add_or_inc_ref(id, &id).expect("load");
    let loaded = manager.with_backend(|k| {
        for addr in probes(&data, 200, 7) {
            let r = k.lookup(id, addr).expect("lookup");
            assert_eq!(
                kernel_answer(&r),
                expected(&data, addr),
                "{name} at {addr:#x}"
            );
        }
        k.dump().expect("dump")
    });
    let pinned = eim_bpf::pinned::dump_pinned(&dir.path).expect("read the pins");
    assert!(!pinned.pages.is_empty());
    assert_eq!(pinned, loaded);
    let stats = manager.with_backend(|k| k.stats().expect("stats"));
    drop(manager);

    // The owner gone, the next start owns the directory, re-opens every pin
    // and cleans what the last owner left.
    let second = KernelMaps::with_config(dir.config()).expect("maps");
    assert!(
        states(&second).values().all(|s| *s == PinState::Reopened),
        "{:?}",
        second.pin_report()
    );
    assert_eq!(
        second.pin_report().and_then(|r| r.cleaned.clone()),
        Some(stats)
    );
    drop(second);

    // Wrong shapes: a page map of another size (the config asks for 96
    // entries) and an ARRAY pinned where the interpreter offsets belong.
    let offsets = dir
        .path
        .join(eim_machine::abi::map_name::INTERPRETER_OFFSETS);
    std::fs::remove_file(&offsets).expect("unpin");
    let array = sys::map_create(&sys::MapSpec {
        map_type: sys::map_type::ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
        inner_map: None,
        name: "eim_wrong",
    })
    .expect("array");
    eim_bpf::aya::maps::MapData::from_fd(array)
        .expect("map data")
        .pin(&offsets)
        .expect("pin");
    let offsets_id = map_id(&dir.path, eim_machine::abi::map_name::INTERPRETER_OFFSETS);
    let page_why = format!(
        "max_entries is {}, expected 96",
        eim_machine::abi::capacity::PAGES
    );
    let offsets_why = format!(
        "map_type is 2, expected 1, key_size is 4, expected 8, value_size is 4, expected {}, max_entries is 1, expected {}",
        OffsetRange::SIZE,
        eim_machine::abi::capacity::INTERPRETER_OFFSETS
    );
    // Refused, naming both, and neither pin touched.
    let small = KernelConfig {
        pages: 96,
        ..dir.config()
    };
    match KernelMaps::with_config(small.clone()) {
        Err(eim_bpf::KernelError::Shape(e)) => {
            assert_eq!(
                e.maps,
                vec![
                    (
                        eim_machine::abi::map_name::PAGES.to_string(),
                        page_why.clone()
                    ),
                    (
                        eim_machine::abi::map_name::INTERPRETER_OFFSETS.to_string(),
                        offsets_why.clone()
                    ),
                ]
            );
            let text = e.to_string();
            assert!(
                text.contains(&page_why) && text.contains("--recreate-mismatched"),
                "{text}"
            );
        }
        Err(e) => panic!("not a shape mismatch: {e}"),
        Ok(_) => panic!("pins of another shape were used"),
    }
    assert_eq!(
        map_id(&dir.path, eim_machine::abi::map_name::PAGES),
        pages_id
    );
    assert_eq!(
        map_id(&dir.path, eim_machine::abi::map_name::INTERPRETER_OFFSETS),
        offsets_id
    );
    // Replaced when asked, with the reasons.
    let small = KernelMaps::with_config(KernelConfig {
        recreate_mismatched: true,
        ..small
    })
    .expect("maps");
    let got = states(&small);
    let why = |name: &str| match &got[name] {
        PinState::Recreated { why } => why.clone(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(why(eim_machine::abi::map_name::PAGES), page_why);
    assert_eq!(
        why(eim_machine::abi::map_name::INTERPRETER_OFFSETS),
        offsets_why
    );
    assert_eq!(
        got.values().filter(|s| **s == PinState::Reopened).count(),
        got.len() - 2,
        "every other map is reopened"
    );
    assert_eq!(
        pinned_max_entries(&dir.path, eim_machine::abi::map_name::PAGES),
        96
    );
    assert_ne!(
        map_id(&dir.path, eim_machine::abi::map_name::PAGES),
        pages_id
    );
    drop(small);
    // Back to the default size: refused, then replaced when asked.
    assert!(KernelMaps::with_config(dir.config()).is_err());
    let again = KernelMaps::with_config(KernelConfig {
        recreate_mismatched: true,
        ..dir.config()
    })
    .expect("maps");
    assert!(matches!(
        states(&again)[eim_machine::abi::map_name::PAGES],
        PinState::Recreated { .. }
    ));
    assert_eq!(
        pinned_max_entries(&dir.path, eim_machine::abi::map_name::PAGES),
        eim_machine::abi::capacity::PAGES
    );
}

/// Pins `outer` (an outer map of class `class` whose inner template is a
/// plain, unmappable ARRAY, as an eim before mappable arrays made it) in
/// place of the pin of that class under `dir`, holding one inner array if
/// `holding`.
fn pin_unmappable_outer(dir: &Path, class: u16, holding: bool) {
    let name = eim_machine::abi::map_name::outer(class);
    let entries = eim_machine::abi::class_entries(class).expect("a class");
    let array = || {
        sys::map_create(&sys::MapSpec {
            map_type: sys::map_type::ARRAY,
            key_size: 4,
            value_size: 4,
            max_entries: entries,
            map_flags: 0,
            inner_map: None,
            name: "eim_old_inner",
        })
        .expect("array")
    };
    let template = array();
    let outer = sys::map_create(&sys::MapSpec {
        map_type: sys::map_type::HASH_OF_MAPS,
        key_size: 8,
        value_size: 4,
        max_entries: eim_machine::abi::capacity::OUTER,
        map_flags: 0,
        inner_map: Some(std::os::fd::AsFd::as_fd(&template)),
        name: "eim_old_outer",
    })
    .expect("outer");
    if holding {
        let inner = array();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&inner) as u32;
        sys::update_elem(
            std::os::fd::AsFd::as_fd(&outer),
            &7u64.to_le_bytes(),
            &fd.to_le_bytes(),
            sys::BPF_NOEXIST,
        )
        .expect("insert");
    }
    let path = dir.join(&name);
    std::fs::remove_file(&path).expect("unpin");
    eim_bpf::aya::maps::MapData::from_fd(outer)
        .expect("map data")
        .pin(&path)
        .expect("pin");
}

#[test]
fn outer_pins_whose_inner_arrays_are_not_mappable_are_refused_and_replaced_when_asked() {
    if !require_bpf() {
        return;
    }
    let dir = PinDir::under_sys_fs_bpf("unmappable");
    drop(KernelMaps::with_config(dir.config()).expect("maps"));
    // Class 8 empty (its template is tried), class 9 holding an array
    // (read off it); the other classes are eim's own and pass.
    pin_unmappable_outer(&dir.path, 8, false);
    pin_unmappable_outer(&dir.path, 9, true);
    let names = [8u16, 9].map(eim_machine::abi::map_name::outer);
    let ids = names.clone().map(|n| map_id(&dir.path, &n));
    match KernelMaps::with_config(dir.config()) {
        Err(eim_bpf::KernelError::Shape(e)) => {
            let named: Vec<&str> = e.maps.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(named, names.iter().map(String::as_str).collect::<Vec<_>>());
            assert!(
                e.maps.iter().all(|(_, why)| why.contains("BPF_F_MMAPABLE")),
                "{e}"
            );
        }
        Err(e) => panic!("not a shape mismatch: {e}"),
        Ok(_) => panic!("unmappable outer pins were used"),
    }
    assert_eq!(
        names.clone().map(|n| map_id(&dir.path, &n)),
        ids,
        "untouched"
    );
    // The empty one was tried and left empty.
    let empty = sys::obj_get(&dir.path.join(&names[0])).expect("pinned");
    assert_eq!(
        sys::first_key(std::os::fd::AsFd::as_fd(&empty), 8).expect("read"),
        None
    );
    let maps = KernelMaps::with_config(KernelConfig {
        recreate_mismatched: true,
        ..dir.config()
    })
    .expect("maps");
    let got = states(&maps);
    for name in &names {
        assert!(
            matches!(&got[name], PinState::Recreated { why } if why.contains("BPF_F_MMAPABLE")),
            "{name}: {:?}",
            got[name]
        );
    }
    assert_eq!(
        got.values().filter(|s| **s == PinState::Reopened).count(),
        got.len() - names.len(),
        "every other map is reopened"
    );
    // Tables load into the replaced maps, and read back right.
    let (_, data) = small_files(1).pop().expect("a file");
    let provider = Arc::new(MemoryProvider::new());
    let id = FileId(0x78);
    provider.insert(id, data.clone());
    let manager = ExecutableInfoManager::new(provider, maps, Tracers::none());
    manager.add_or_inc_ref(id, &id).expect("load");
    manager.with_backend(|k| {
        for addr in probes(&data, 50, 3) {
            let r = k.lookup(id, addr).expect("lookup");
            assert_eq!(kernel_answer(&r), expected(&data, addr), "{addr:#x}");
        }
    });
}

#[test]
fn a_pin_directory_off_bpffs_gets_a_bpffs_mounted_on_it_only_when_asked() {
    if !require_bpf() {
        return;
    }
    let dir = PinDir {
        path: std::env::temp_dir().join(format!("eim-pin-mount-{}", std::process::id())),
        unmount: true,
    };
    match KernelMaps::with_config(dir.config()) {
        Err(eim_bpf::KernelError::Mount(eim_bpf::bpffs::MountError::NotAsked { .. })) => {}
        Err(e) => panic!("not refused for want of --mount-bpffs: {e}"),
        Ok(_) => panic!("pinned off a bpffs without being asked to mount one"),
    }
    assert!(!dir.path.exists(), "a refused start creates nothing");
    let asked = KernelConfig {
        mount_bpffs: true,
        ..dir.config()
    };
    let k = KernelMaps::with_config(asked.clone()).expect("maps");
    let report = k.pin_report().expect("pinned");
    assert_eq!(report.mounted.as_deref(), Some(dir.path.as_path()));
    assert!(eim_bpf::bpffs::is_bpffs(&dir.path).expect("statfs"));
    assert!(dir.path.join(eim_machine::abi::map_name::PAGES).exists());
    drop(k);
    let k = KernelMaps::with_config(asked).expect("maps");
    let report = k.pin_report().expect("pinned");
    assert_eq!(report.mounted, None, "already a bpffs");
    assert!(states(&k).values().all(|s| *s == PinState::Reopened));
}

/// What applying `ops` to empty maps leaves in them.
fn stats_of(ops: &[MapOp]) -> MapStats {
    let mut stats = MapStats::default();
    for op in ops {
        match op {
            MapOp::PutUnwindInfos(infos) => {
                stats.unwind_slots += infos
                    .iter()
                    .filter(|(_, info)| *info != UnwindInfo::default())
                    .count();
            }
            MapOp::PutDeltaTable { map_id, .. } => *stats.tables.entry(*map_id).or_default() += 1,
            MapOp::PutPages(pages) => stats.pages += pages.len(),
            MapOp::PutInterpreterOffsets { .. } => stats.interpreter_offsets += 1,
            other => panic!("not a load op: {other:?}"),
        }
    }
    stats
}

/// A crash at every point of a load plan (after each of its three ops, and
/// in the middle of the page batch): the process dies with the maps pinned
/// and nothing unloaded; the next start re-opens the pins, removes every
/// entry (the kernel confirms no page, table, non-zero slot or offsets
/// entry is left), and a fresh manager on it loads the same file and
/// answers every delta address as `expected` says.
#[test]
fn a_restart_after_a_crash_at_any_op_of_a_load_cleans_the_pins_and_loads_afresh() {
    if !require_bpf() {
        return;
    }
    let mut files = small_files(usize::MAX);
    files.retain(|(_, d)| d.len() < 40_000);
    // The smallest, a middle one and the largest of those.
    let picked = [0, files.len() / 2, files.len() - 1].map(|i| files[i].clone());
    let id = FileId(0x4242);
    for (name, data) in &picked {
        let mut book = KernelBook::new(Capacities::default());
        let plan = book.plan_load(id, data, None).expect("plan");
        assert_eq!(plan.ops.len(), 3, "{name}: slots, table, pages");
        let mut crashes: Vec<Vec<MapOp>> = (0..=3).map(|k| plan.ops[..k].to_vec()).collect();
        if let MapOp::PutPages(pages) = &plan.ops[2] {
            let mut half = plan.ops[..2].to_vec();
            half.push(MapOp::PutPages(pages[..pages.len() / 2].to_vec()));
            crashes.push(half);
        }
        for (k, applied) in crashes.iter().enumerate() {
            let what = format!("{name}, crash {k}");
            let dir = PinDir::under_sys_fs_bpf(&format!("crash-{k}"));
            let mut dying = KernelMaps::with_config(dir.config()).expect("maps");
            apply_all(&mut dying, applied);
            let written = dying.stats().expect("stats");
            assert_eq!(written, stats_of(applied), "{what}");
            drop(dying);

            let restarted = KernelMaps::with_config(dir.config()).expect("restart");
            let report = restarted.pin_report().expect("pinned");
            assert!(
                report.maps.iter().all(|(_, s)| *s == PinState::Reopened),
                "{what}: {report:?}"
            );
            assert_eq!(report.cleaned.as_ref(), Some(&written), "{what}");
            assert!(restarted.stats().expect("stats").is_empty(), "{what}");
            let dump = restarted.dump().expect("dump");
            assert!(
                dump.pages.is_empty()
                    && dump.delta_tables.is_empty()
                    && dump.interpreter_offsets.is_empty()
                    && dump
                        .unwind_infos
                        .iter()
                        .all(|u| *u == UnwindInfo::default()),
                "{what}: left behind"
            );

            let provider = Arc::new(MemoryProvider::new());
            provider.insert(id, data.clone());
            let manager = ExecutableInfoManager::new(provider, restarted, Tracers::none());
            manager.add_or_inc_ref(id, &id).expect("reload");
            manager.with_backend(|k| {
                assert_eq!(k.stats().expect("stats"), stats_of(&plan.ops), "{what}");
                for addr in probes(data, 200, id.0) {
                    let r = k.lookup(id, addr).expect("lookup");
                    assert_eq!(
                        kernel_answer(&r),
                        expected(data, addr),
                        "{what} at {addr:#x}: {r:?}"
                    );
                }
            });
        }
    }
}

/// A warm restart over real pins, differentially against the sim: a run
/// loads A, B and C and dies in the middle of D's load (its table
/// published, no page); the next start keeps the pins (`adopt_pins`), and
/// a manager restarted over their dump with A, B and D mapped now adopts A
/// and B untouched, removes C and D's half-published table, and loads D.
/// The kernel then holds exactly what the sim holds after the same calls,
/// and resolves every probed address of A, B and D as their deltas say.
#[test]
fn a_restart_over_pins_adopts_what_is_right_and_ends_as_the_sim_does() {
    use eim_core::manager::ManualClock;
    use eim_core::Config;
    if !require_bpf() {
        return;
    }
    let files = small_files(4);
    assert_eq!(files.len(), 4);
    let ids = [0xa1, 0xb2, 0xc3, 0xd4].map(FileId);
    let provider = Arc::new(MemoryProvider::new());
    for (id, (_, data)) in ids.iter().zip(&files) {
        provider.insert(*id, data.clone());
    }
    let d = ids[3];
    // The first run, the same on both backends: A, B, C loaded, then D's
    // load dies after its table is published.
    fn first_run<B: Backend>(provider: &Arc<MemoryProvider>, backend: B, ids: &[FileId; 4]) -> B {
        let manager = ExecutableInfoManager::with_config(
            provider.clone(),
            backend,
            Tracers::none(),
            Config::default(),
            Box::new(Arc::new(ManualClock::new())),
        );
        for id in &ids[..3] {
            manager.add_or_inc_ref(*id, id).expect("load");
        }
        let mut book = manager.state().book;
        let mut backend = manager.into_backend();
        let data = eim_core::provider::Provider::extract(&**provider, &ids[3]).expect("deltas");
        let plan = book.plan_load(ids[3], &data.data, None).expect("plan");
        let published = plan
            .ops
            .iter()
            .position(|op| matches!(op, MapOp::PutDeltaTable { .. }))
            .expect("a table");
        apply_all(&mut backend, &plan.ops[..=published]);
        backend
    }
    // The restart: A, B and D are mapped now, C is not.
    fn restart<B: Backend>(
        provider: &Arc<MemoryProvider>,
        backend: B,
        observed: &eim_machine::machine::Observed,
        ids: &[FileId; 4],
    ) -> (
        ExecutableInfoManager<Arc<MemoryProvider>, B>,
        eim_core::manager::RestartReport,
    ) {
        let held: Vec<(FileId, &FileId, u64)> =
            [0, 1, 3].iter().map(|&i| (ids[i], &ids[i], 1)).collect();
        ExecutableInfoManager::restart(
            provider.clone(),
            backend,
            Tracers::none(),
            Config::default(),
            Box::new(Arc::new(ManualClock::new())),
            observed,
            held,
        )
        .expect("trusted")
    }

    let dir = PinDir::under_sys_fs_bpf("reconcile");
    let dying = first_run(
        &provider,
        KernelMaps::with_config(dir.config()).expect("maps"),
        &ids,
    );
    drop(dying);
    let sim = first_run(
        &provider,
        SimMaps::new(SimConfig::default()).expect("sim"),
        &ids,
    );

    let kept = KernelMaps::with_config(KernelConfig {
        adopt_pins: true,
        ..dir.config()
    })
    .expect("restart");
    let report = kept.pin_report().expect("pinned");
    assert!(report.cleaned.is_none(), "{report:?}");
    let before = kept.dump().expect("dump");
    assert_eq!(before, sim_dump(&sim), "the pins hold what the sim holds");
    let observed = before.observed();
    assert_eq!(observed, sim.observed());
    // What a restart reads of the kernel: each table only as far as its
    // pages reach (D's half-published table, with no page, not at all),
    // and the lock file's record (this run never zeroed a slot).
    let reached = kept.observed().expect("observed");
    assert_eq!(reached.pages, observed.pages);
    assert_eq!(reached.unwind_infos, observed.unwind_infos);
    assert_eq!(reached.zeroed_ago, Some(std::time::Duration::MAX));
    for (key, deltas) in &observed.delta_tables {
        let want: &[StackDelta] = if key.1 == d { &[] } else { deltas };
        assert_eq!(reached.delta_tables[key], want, "{key:?}");
    }

    let (kernel, k_report) = restart(&provider, kept, &reached, &ids);
    let (simulated, s_report) = restart(&provider, sim, &observed, &ids);
    assert_eq!(k_report.adopted, vec![ids[0], ids[1]]);
    assert_eq!(k_report.loaded, vec![d]);
    assert!(k_report.failed.is_empty(), "{:?}", k_report.failed);
    assert_eq!(k_report.removals_pending, 0);
    assert_eq!(s_report.adopted, k_report.adopted);
    assert_eq!(s_report.loaded, k_report.loaded);
    assert_eq!(s_report.removals, k_report.removals);
    let k_dump = kernel.with_backend(|k| k.dump().expect("dump"));
    let s_dump = simulated.with_backend(|s| sim_dump(s));
    assert_eq!(k_dump, s_dump, "kernel and sim after the restart");
    // A and B were not touched: their pages and tables are as before.
    for id in &ids[..2] {
        let pages = |dump: &eim_bpf::Dump| -> Vec<_> {
            dump.pages
                .iter()
                .filter(|(k, _)| k.file_id == id.0)
                .map(|(k, v)| (*k, *v))
                .collect()
        };
        assert_eq!(pages(&k_dump), pages(&before), "{id}");
        let table = |dump: &eim_bpf::Dump| -> Vec<_> {
            dump.delta_tables
                .iter()
                .filter(|((_, f), _)| f == id)
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        };
        assert_eq!(table(&k_dump), table(&before), "{id}");
    }
    assert!(
        k_dump.pages.keys().all(|k| k.file_id != ids[2].0),
        "C's pages removed"
    );
    assert!(
        k_dump.delta_tables.keys().all(|(_, f)| *f != ids[2]),
        "C's table removed"
    );
    kernel.with_backend(|k| {
        for (id, (name, data)) in [0, 1, 3].map(|i| (ids[i], &files[i])) {
            for addr in probes(data, 100, id.0) {
                let r = k.lookup(id, addr).expect("lookup");
                assert_eq!(
                    kernel_answer(&r),
                    expected(data, addr),
                    "{name} at {addr:#x}: {r:?}"
                );
            }
        }
    });
}

/// The record a warm restart trusts to hand out zero slots at once: the
/// pin directory's lock file says "never" until a rollback zeroes a slot,
/// then the time of that write; the next owner reads how long ago it was.
#[test]
fn the_lock_file_records_when_a_rollback_last_zeroed_a_slot() {
    if !require_bpf() {
        return;
    }
    let dir = PinDir::under_sys_fs_bpf("zeroed-record");
    let lock_file = eim_bpf::lock::lock_file_of(&dir.path).expect("lock file");
    let _ = std::fs::remove_file(&lock_file);
    let record = || {
        std::fs::read_to_string(&lock_file)
            .expect("the lock file")
            .lines()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    let files = corpus();
    let provider = Arc::new(MemoryProvider::new());
    for (i, (_, data)) in files.iter().enumerate() {
        provider.insert(FileId(i as u64 + 1), data.clone());
    }
    // A page map too small for the corpus: some load fails at its pages
    // (E2BIG) and its rollback zeroes the slots it had written.
    let config = KernelConfig {
        pages: 96,
        ..dir.config()
    };
    let maps = KernelMaps::with_config(config.clone()).expect("maps");
    assert_eq!(record(), "slots-zeroed never", "a fresh lock file");
    let manager = ExecutableInfoManager::new(provider.clone(), maps, Tracers::none());
    let before = eim_bpf::lock::boottime();
    let mut rolled_back = false;
    for (i, _) in files.iter().enumerate() {
        let id = FileId(i as u64 + 1);
        if let Err(e) = manager.add_or_inc_ref(id, &id) {
            assert!(format!("{e:?}").contains("E2BIG"), "{e}");
            rolled_back = true;
            break;
        }
    }
    assert!(rolled_back, "no load reached the page map's limit");
    let after = eim_bpf::lock::boottime();
    let written = record();
    let ns: u128 = written
        .strip_prefix("slots-zeroed ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no time in {written:?}"));
    assert!(
        (before.as_nanos()..=after.as_nanos()).contains(&ns),
        "{written:?} not between {before:?} and {after:?}"
    );
    drop(manager);

    let next = KernelMaps::with_config(KernelConfig {
        adopt_pins: true,
        ..config
    })
    .expect("the next owner");
    let ago = next
        .observed()
        .expect("observed")
        .zeroed_ago
        .expect("a known record");
    assert!(
        ago <= eim_bpf::lock::boottime() - Duration::from_nanos(ns as u64),
        "{ago:?}"
    );
    assert!(ago < Duration::from_secs(60), "{ago:?}");
}
