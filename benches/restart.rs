//! What a warm restart costs (issue 13): from the start over pinned maps
//! (open them, read them, walk the host, extract, reconcile) to the end of
//! the first step, on real kernel maps (root only; prints SKIPPED and does
//! nothing otherwise):
//!
//! * `restart/host`: every process of this host, over the pins of a run
//!   that loaded them (an unchanged host);
//! * `restart/libs1000`: this process, mapping up to 1,000 distinct shared
//!   libraries from `/usr` executable, over the pins of a run that loaded
//!   them.
//!
//! Each prints, for its last restart, what was adopted, loaded and
//! removed, the map ops written (an unchanged host writes none), and the
//! longest time a reader polling one page of every loaded file found one
//! missing. For contrast, `cold start` lines give the same figures for a
//! start that cleans the pins and loads everything again (what every start
//! did before the reconcile).

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use eim::abi::{StackDeltaPageInfo, StackDeltaPageKey, Wire};
use eim::bpf::{sys, KernelConfig, KernelMaps};
use eim::host::scan::{Host, HostConfig, Quiet};

use eim_test_support::host::Libraries;

const LIBS: usize = 1000;

fn have_bpf() -> bool {
    eim::bpf::probe::can_create_maps().unwrap_or(false)
}

fn pin_dir(name: &str) -> PathBuf {
    let dir = Path::new("/sys/fs/bpf").join(format!("eim-bench-restart-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(dir: &Path, adopt: bool) -> KernelConfig {
    KernelConfig {
        pin_dir: Some(dir.to_path_buf()),
        adopt_pins: adopt,
        ..KernelConfig::default()
    }
}

/// One page key of every file the pins hold (its first page).
fn one_page_per_file(dir: &Path) -> Vec<StackDeltaPageKey> {
    let dump = eim::bpf::pinned::dump_pinned(dir).expect("dump the pins");
    let mut first: BTreeMap<u64, StackDeltaPageKey> = BTreeMap::new();
    for key in dump.pages.keys() {
        first.entry(key.file_id).or_insert(*key);
    }
    first.into_values().collect()
}

/// Polls `keys` in the pinned page map until stopped; the longest time
/// any one of them was missing.
struct Reader {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl Reader {
    fn start(dir: &Path, keys: Vec<StackDeltaPageKey>) -> Self {
        let map = sys::obj_get(&dir.join("stack_delta_page_to_info")).expect("the page map");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut missing_since: Vec<Option<Instant>> = vec![None; keys.len()];
            let mut longest = Duration::ZERO;
            while !flag.load(Ordering::Relaxed) {
                for (key, since) in keys.iter().zip(&mut missing_since) {
                    let found =
                        sys::lookup_elem(map.as_fd(), &key.to_bytes(), StackDeltaPageInfo::SIZE)
                            .ok()
                            .flatten()
                            .is_some();
                    match (found, *since) {
                        (false, None) => *since = Some(Instant::now()),
                        (true, Some(at)) => {
                            longest = longest.max(at.elapsed());
                            *since = None;
                        }
                        _ => {}
                    }
                }
            }
            for at in missing_since.into_iter().flatten() {
                longest = longest.max(at.elapsed());
            }
            longest
        });
        Self { stop, thread }
    }

    fn finish(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the reader")
    }
}

/// A start over the pins: the maps, the warm restart (or a cold start
/// that cleans), and the first step. Its time, and a line saying what it
/// did.
fn start(dir: &Path, host_config: &HostConfig, warm: bool) -> (Duration, String) {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let maps = KernelMaps::with_config(config(dir, warm)).expect("the pinned maps");
    let opened = started.elapsed();
    let mut read = Duration::ZERO;
    let mut host = if warm {
        let observed = maps.observed().expect("read the pins");
        read = started.elapsed() - opened;
        match Host::restart(maps, host_config.clone(), &observed, &stop) {
            Ok(host) => host,
            Err(e) => panic!("the restart failed: {}", e.why),
        }
    } else {
        Host::new(maps, host_config.clone())
    };
    let before_step = started.elapsed();
    host.step(&stop, &mut Quiet).expect("the first step");
    let elapsed = started.elapsed();
    let phases = format!(
        "opening the maps {:.1} ms, reading them {:.1} ms, first step {:.1} ms",
        ms(opened),
        ms(read),
        ms(elapsed - before_step)
    );
    let ops = host.kernel_ops();
    let line = match host.restarted() {
        Some(r) => format!(
            "{} files: {} adopted, {} loaded, {} failed, {} waiting for slots, {} removals; \
             reconciled in {:.1} ms (walk {:.1} ms); {phases}; {ops} map ops",
            r.files,
            r.adopted,
            r.loaded,
            r.failed,
            r.waiting_for_slots,
            r.removals,
            r.seconds * 1e3,
            r.walk_seconds * 1e3
        ),
        None => format!(
            "{} files loaded; {phases}; {ops} map ops",
            host.manager().state().files.len()
        ),
    };
    (elapsed, line)
}

fn bench_case(c: &mut Criterion, name: &str, host_config: HostConfig) {
    let dir = pin_dir(name);
    let (cold, line) = start(&dir, &host_config, false);
    eprintln!("restart/{name}: first load {:.1} ms: {line}", ms(cold));
    let keys = one_page_per_file(&dir);

    // The same start again, cleaning: the window the reconcile closes.
    let reader = Reader::start(&dir, keys.clone());
    let (cold, line) = start(&dir, &host_config, false);
    let gap = reader.finish();
    eprintln!(
        "restart/{name}: cold start (clean, load all) {:.1} ms: {line}; \
         longest a loaded file was unresolvable: {:.1} ms",
        ms(cold),
        ms(gap)
    );

    let mut last = String::new();
    let mut group = c.benchmark_group("restart");
    group.sample_size(10);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (took, line) = start(&dir, &host_config, true);
                total += took;
                last = line;
            }
            total
        })
    });
    group.finish();
    let reader = Reader::start(&dir, keys.clone());
    let (warm, line) = start(&dir, &host_config, true);
    let gap = reader.finish();
    eprintln!(
        "restart/{name}: warm restart {:.1} ms: {line}; longest a loaded file was \
         unresolvable: {:.1} ms ({} files polled); last benchmarked: {last}",
        ms(warm),
        ms(gap),
        keys.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Ok(lock) = eim::bpf::lock::lock_file_of(&dir) {
        let _ = std::fs::remove_file(lock);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn restart(c: &mut Criterion) {
    if !have_bpf() {
        eprintln!("SKIPPED: restart benchmarks need BPF maps (root)");
        return;
    }
    bench_case(c, "host", HostConfig::default());
    let libraries = Libraries::map(LIBS);
    eprintln!(
        "restart/libs{LIBS}: this process maps {} distinct libraries",
        libraries.len()
    );
    bench_case(
        c,
        &format!("libs{LIBS}"),
        HostConfig {
            only: Some([std::process::id() as i32].into()),
            ..HostConfig::default()
        },
    );
    drop(libraries);
}

criterion_group!(benches, restart);
criterion_main!(benches);
