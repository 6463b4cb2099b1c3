//! Descriptors of `KernelMaps` (root or CAP_BPF + CAP_SYS_ADMIN; a loud
//! SKIPPED otherwise, a failure under `EIM_REQUIRE_BPF=1`):
//!
//! * a published table keeps no descriptor: the process's open fds do not
//!   grow with the files loaded (one by one or in a batch), read back
//!   (`dump`) or adopted from pins at a restart;
//! * a batch of 1,000 tables loads under a descriptor limit far below
//!   1,000 when `arrays_in_flight` fits it (one outer update per chunk),
//!   and the same batch with every array in flight at once meets EMFILE,
//!   is retried in halves (one element never sinks a batch) and loads all
//!   the same, with more outer updates;
//! * an op published in chunks fails where the simulator's single batch
//!   fails (a full outer map, a repeated file id), with the same count.
//!
//! A test binary of its own: the fd counts and the process's
//! `RLIMIT_NOFILE` are the whole process's, so its tests take one lock and
//! nothing else runs beside them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use eim_bpf::{KernelConfig, KernelMaps};
use eim_core::provider::MemoryProvider;
use eim_core::{ExecutableInfoManager, Tracers};
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::ops::{Backend, Errno, MapOp, OpFailure};
use eim_machine::FileId;
use eim_sim::{SimConfig, SimMaps};

type Manager = ExecutableInfoManager<Arc<MemoryProvider>, KernelMaps>;

/// One test at a time: fd counts and the descriptor limit are per process.
static ALONE: Mutex<()> = Mutex::new(());

fn require_bpf() -> bool {
    eim_bpf::probe::require_bpf("descriptors test")
}

/// Descriptors this process has open now.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// File `i`: `50 << (i % 3)` deltas (size classes 8 to 10) with a few
/// shared rules, so a batch spreads over several outer maps.
fn synthetic(i: u64) -> IntervalData {
    let n = 50u64 << (i % 3);
    let mut d = IntervalData::new();
    let mut addr = 0x10_0000;
    for j in 0..n {
        d.add(StackDelta::new(
            addr,
            hint::NONE,
            info::sp(8 * (1 + (j % 4) as i32)),
        ));
        addr += 16;
    }
    d.add(StackDelta::new(addr, hint::GAP, info::INVALID));
    d
}

/// `n` synthetic files from id `first` on, in a provider.
fn provider(first: u64, n: u64) -> (Arc<MemoryProvider>, Vec<FileId>) {
    let provider = Arc::new(MemoryProvider::new());
    let ids: Vec<FileId> = (first..first + n).map(FileId).collect();
    for id in &ids {
        provider.insert(*id, synthetic(id.0));
    }
    (provider, ids)
}

fn manager(provider: &Arc<MemoryProvider>, config: KernelConfig) -> Manager {
    ExecutableInfoManager::new(
        provider.clone(),
        KernelMaps::with_config(config).expect("maps"),
        Tracers::none(),
    )
}

fn load_all(m: &Manager, ids: &[FileId]) {
    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let results = m.load_many(&batch);
    let failed: Vec<_> = results.iter().filter(|r| r.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        failed[0]
    );
}

/// A pin directory of this test's own under `/sys/fs/bpf` (mounted there
/// if nothing is), removed with its pins and lock file when dropped.
struct PinDir(PathBuf);

impl PinDir {
    fn new() -> Self {
        let root = Path::new("/sys/fs/bpf");
        if !eim_bpf::bpffs::is_bpffs(root).unwrap_or(false) {
            eim_bpf::bpffs::mount_bpffs(root, true)
                .expect("mounting a bpffs on /sys/fs/bpf")
                .keep();
        }
        let path = root.join(format!("eim-test-{}-descriptors", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Ok(lock) = eim_bpf::lock::lock_file_of(&self.0) {
            let _ = std::fs::remove_file(lock);
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_published_table_keeps_no_descriptor() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    if !require_bpf() {
        return;
    }
    let pins = PinDir::new();
    let config = KernelConfig {
        pin_dir: Some(pins.0.clone()),
        ..KernelConfig::default()
    };
    let (provider, ids) = provider(1, 600);
    let (singles, batch) = ids.split_at(300);

    let before_maps = open_fds();
    let m = manager(&provider, config.clone());
    let with_maps = open_fds();
    // What the maps themselves hold (the 19 maps, the program, the lock):
    // the yardstick for "a constant".
    let own = with_maps - before_maps;
    for id in singles {
        m.add_or_inc_ref(*id, id).expect("load");
    }
    assert_eq!(
        open_fds(),
        with_maps,
        "300 files loaded one by one hold no descriptor"
    );
    load_all(&m, batch);
    assert_eq!(
        open_fds(),
        with_maps,
        "300 more in one batch hold none either"
    );
    let dump = m.with_backend(|k| k.dump().expect("dump"));
    assert_eq!(dump.delta_tables.len(), 600);
    assert_eq!(dump.live_inner_maps, 600, "every array read by its id");
    assert_eq!(m.with_backend(|k| k.published_tables()), 600);
    assert_eq!(open_fds(), with_maps, "reading them back keeps none");
    // A table opened on demand is the caller's fd, closed when dropped.
    let id = batch[0];
    let class = dump
        .delta_tables
        .keys()
        .find(|(_, file)| *file == id)
        .map(|(class, _)| *class)
        .expect("a table of the file");
    let inner = m
        .with_backend(|k| k.open_inner(class, id))
        .expect("open")
        .expect("published");
    assert_eq!(open_fds(), with_maps + 1);
    drop(inner);
    assert_eq!(open_fds(), with_maps);
    // Deleting one needs no descriptor of it either.
    m.remove_or_dec_ref(id).expect("unload");
    assert!(m
        .with_backend(|k| k.open_inner(class, id))
        .expect("open")
        .is_none());
    drop(m);
    assert_eq!(open_fds(), before_maps, "dropping the maps closes theirs");

    // A restart adopts the 599 pinned tables by their keys alone.
    let adopting = KernelMaps::with_config(KernelConfig {
        adopt_pins: true,
        ..config
    })
    .expect("adopting maps");
    let adopted = open_fds() - before_maps;
    assert!(
        adopted <= own + 1,
        "adopting 599 tables opened {adopted} descriptors, a fresh start {own}"
    );
    assert_eq!(adopting.published_tables(), 599);
    let observed = adopting.observed().expect("observed");
    assert_eq!(observed.delta_tables.len(), 599);
    assert_eq!(open_fds() - before_maps, adopted, "observing keeps none");
}

/// Sets the soft `RLIMIT_NOFILE` for as long as it lives, then puts the
/// old one back.
struct SoftLimit(libc::rlimit);

impl SoftLimit {
    fn set(soft: u64) -> Self {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `old` is a valid rlimit to write.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
        let new = libc::rlimit {
            rlim_cur: soft.min(old.rlim_max),
            rlim_max: old.rlim_max,
        };
        // SAFETY: a valid rlimit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) }, 0);
        Self(old)
    }
}

impl Drop for SoftLimit {
    fn drop(&mut self) {
        // SAFETY: a valid rlimit, the one read at the start.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
    }
}

#[test]
fn a_batch_of_1000_tables_loads_under_a_descriptor_limit_far_below_it() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    if !require_bpf() {
        return;
    }
    let (provider, ids) = provider(1, 1000);
    let per_class = |ids: &[FileId]| {
        let mut n = std::collections::BTreeMap::new();
        for id in ids {
            *n.entry(id.0 % 3).or_insert(0u64) += 1;
        }
        n
    };
    // Every array of the batch in flight at once: 1,000 descriptors.
    let all_at_once = manager(
        &provider,
        KernelConfig {
            arrays_in_flight: 1000,
            ..KernelConfig::default()
        },
    );
    let chunked = manager(
        &provider,
        KernelConfig {
            arrays_in_flight: 16,
            ..KernelConfig::default()
        },
    );
    let limit = SoftLimit::set(open_fds() as u64 + 48);

    let batch: Vec<(FileId, &FileId)> = ids.iter().map(|id| (*id, id)).collect();
    let results = all_at_once.load_many(&batch);
    assert!(
        results.iter().all(Result::is_ok),
        "the halves that fit the limit load: {:?}",
        results.iter().find(|r| r.is_err())
    );
    let split = all_at_once.with_backend(|k| (k.outer_updates(), k.dump().expect("dump")));
    let classes = per_class(&ids).len() as u64;
    assert!(
        split.0 > classes,
        "EMFILE split the batch: {} outer updates",
        split.0
    );
    assert_eq!(split.1.delta_tables.len(), 1000);

    load_all(&chunked, &ids);
    let dump = chunked.with_backend(|k| k.dump().expect("dump"));
    drop(limit);
    assert_eq!(dump.delta_tables.len(), 1000);
    assert_eq!(dump.live_inner_maps, 1000);
    assert_eq!(dump.delta_tables, split.1.delta_tables, "the same tables");
    // One outer update per chunk of 16 of each size class.
    let chunks: u64 = per_class(&ids).values().map(|n| n.div_ceil(16)).sum();
    assert_eq!(chunked.with_backend(|k| k.outer_updates()), chunks);
}

/// An op of `n` tables of class 8 for file ids `ids`, all with the same
/// deltas.
fn tables_op(ids: impl Iterator<Item = u64>) -> MapOp {
    let deltas: Arc<[eim_machine::abi::StackDelta]> = (0..100u32)
        .map(|i| eim_machine::abi::StackDelta {
            addr_low: i as u16 * 8,
            unwind_info: 1,
        })
        .collect();
    MapOp::PutDeltaTables {
        map_id: 8,
        tables: ids.map(|id| (FileId(id), deltas.clone())).collect(),
    }
}

/// The published tables' (class, file id) keys of each backend.
fn kernel_tables(k: &KernelMaps) -> Vec<(u16, FileId)> {
    k.dump().expect("dump").delta_tables.into_keys().collect()
}

fn sim_tables(s: &SimMaps) -> Vec<(u16, FileId)> {
    s.delta_tables().into_keys().collect()
}

#[test]
fn a_chunked_publish_fails_where_one_batch_would_and_says_how_far_it_got() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    if !require_bpf() {
        return;
    }
    let small = |chunk| {
        KernelMaps::with_config(KernelConfig {
            outer: 40,
            arrays_in_flight: chunk,
            ..KernelConfig::default()
        })
        .expect("maps")
    };
    let sim = || {
        SimMaps::new(SimConfig {
            outer: 40,
            ..SimConfig::default()
        })
        .expect("sim")
    };
    // The outer map fills in the third chunk of 16: the kernel's
    // processed count is added to the two chunks before it.
    let full = tables_op(1..=60);
    let mut k = small(16);
    let mut s = sim();
    let got = k.apply(&full);
    assert_eq!(got, Err(OpFailure::new(Errno::E2BIG, 40)));
    assert_eq!(got, s.apply(&full), "as the sim's single batch");
    assert_eq!(kernel_tables(&k), sim_tables(&s));
    assert_eq!(k.published_tables(), 40);
    assert_eq!(k.outer_updates(), 3);
    // A repeated file id in the fourth chunk: published up to it, EEXIST
    // there, as one batch would.
    let repeated = tables_op((101..=150).chain([103]).chain(151..=159));
    let mut k = KernelMaps::with_config(KernelConfig {
        arrays_in_flight: 16,
        ..KernelConfig::default()
    })
    .expect("maps");
    let mut s = SimMaps::new(SimConfig::default()).expect("sim");
    let got = k.apply(&repeated);
    assert_eq!(got, Err(OpFailure::new(Errno::EEXIST, 50)));
    assert_eq!(got, s.apply(&repeated));
    assert_eq!(kernel_tables(&k), sim_tables(&s));
    assert_eq!(k.outer_updates(), 4);
}
