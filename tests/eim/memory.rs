//! Memory that follows files, not deltas (issue 14), on real kernel maps
//! (root; a loud SKIPPED otherwise, a failure under `EIM_REQUIRE_BPF=1`):
//! this test process maps at least 1,000 distinct libraries of `/usr`, and
//! a `Host` over `KernelMaps` loads them, unloads them when they are
//! unmapped, and loads them again, three times. After each load step the
//! process's resident anonymous memory stays within 10% (or 2 MiB, if
//! more) of the first round's and under 64 MB: nothing of the deltas stays
//! once their tables are published, and what the step freed goes back to
//! the kernel.
//!
//! Alone in its test binary: the measure is the whole process's.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;

use eim::bpf::{KernelConfig, KernelMaps};
use eim::host::heap::resident_anonymous;
use eim::host::scan::{Host, HostConfig, Quiet};

use eim_test_support::host::Libraries;

const LIBRARIES: usize = 1000;
const TARGET: u64 = 64 << 20;
const SLACK: u64 = 2 << 20;

#[test]
fn resident_memory_after_loading_stays_flat_and_small_over_three_rounds() {
    if !eim::bpf::probe::require_bpf("memory test") {
        return;
    }
    let maps = KernelMaps::with_config(KernelConfig::default()).expect("kernel maps");
    let mut host = Host::new(
        maps,
        HostConfig {
            only: Some(BTreeSet::from([std::process::id() as i32])),
            ..HostConfig::default()
        },
    );
    let stop = AtomicBool::new(false);
    let mut after_load = Vec::new();
    let mut loaded = Vec::new();
    let mut remaining = Vec::new();
    for round in 0..3 {
        let libraries = Libraries::map(LIBRARIES);
        assert!(
            libraries.len() >= LIBRARIES,
            "only {} libraries under /usr",
            libraries.len()
        );
        host.step(&stop, &mut Quiet).expect("load step");
        let tables = host.manager().state().book.loaded().len();
        let rss = resident_anonymous().expect("RssAnon");
        eprintln!(
            "round {round}: {} libraries, {tables} tables loaded, RssAnon {:.1} MB",
            libraries.len(),
            rss as f64 / (1 << 20) as f64
        );
        after_load.push(rss);
        loaded.push(tables);
        drop(libraries);
        host.step(&stop, &mut Quiet).expect("unload step");
        // What stays is this test's own executable and libraries.
        remaining.push(host.manager().state().book.loaded().len());
    }
    assert!(remaining[0] < 20, "{remaining:?}");
    assert!(
        remaining.iter().all(|n| *n == remaining[0]),
        "{remaining:?}"
    );
    assert!(loaded[0] >= LIBRARIES / 2, "{loaded:?}");
    assert!(loaded.iter().all(|n| *n == loaded[0]), "{loaded:?}");
    // 10% of the first round's, or 2 MiB when that is less: a few MB
    // resident move by more than 10% with the allocator's own pages.
    let slack = (after_load[0] / 10).max(SLACK);
    for (round, rss) in after_load.iter().enumerate() {
        assert!(
            *rss <= after_load[0] + slack,
            "round {round}: {rss} bytes, more than {slack} over the first round's {}",
            after_load[0]
        );
        assert!(*rss < TARGET, "round {round}: {rss} bytes, over {TARGET}");
    }
}
