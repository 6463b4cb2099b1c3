//! The event path of host tracking under the simulator (issue 18): the
//! table converges to the host's truth at every resync whatever the path
//! does to the events, and a path that loses nothing needs no correction.

use eim_sim_harness::host_events::{run, EventPath, HostEventsConfig};

fn config(seed: u64, path: EventPath) -> HostEventsConfig {
    HostEventsConfig {
        seed,
        steps: 400,
        files: 12,
        pids: 24,
        path,
        resync_every: 50,
    }
}

#[test]
fn a_path_that_loses_nothing_needs_no_correction() {
    for seed in 0..20 {
        for path in [
            EventPath::PERFECT,
            EventPath {
                duplicate: 0.3,
                delay: 0.3,
                ..EventPath::PERFECT
            },
        ] {
            let report = run(config(seed, path)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(report.corrections, 0, "seed {seed} {path:?}: {report:?}");
            assert_eq!(report.dropped, 0);
            assert!(report.events > 400 && report.resyncs >= 8, "{report:?}");
        }
    }
}

#[test]
fn lost_events_are_corrected_by_a_resync_and_the_table_converges() {
    let mut corrections = 0;
    for seed in 0..20 {
        let path = EventPath {
            drop: 0.2,
            drop_detected: 0.5,
            duplicate: 0.2,
            delay: 0.2,
        };
        let report = run(config(seed, path)).unwrap_or_else(|e| panic!("{e}"));
        assert!(report.dropped > 0, "{report:?}");
        corrections += report.corrections;
    }
    // Losses cost corrections (else this test would not show a resync at
    // work), and every run converged (run checks it at each resync).
    assert!(corrections > 0);
}

#[test]
fn short_lived_processes_leak_nothing() {
    // Batches far apart from the changes: most processes come and go
    // between two deliveries, gone before they can be read.
    for seed in 0..10 {
        let report = run(HostEventsConfig {
            pids: 4,
            ..config(seed, EventPath::PERFECT)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(report.vanished > 0, "{report:?}");
        assert_eq!(report.corrections, 0, "{report:?}");
    }
}

#[test]
fn the_vdso_loads_with_the_first_process_and_unloads_with_the_last() {
    // Few pids: the host empties now and then, so some resync finds the
    // vDSO unloaded; run checks at each resync that its reference count is
    // the number of processes, and that the maps hold it exactly then.
    let (mut loaded, mut unloaded) = (0, 0);
    for seed in 0..20 {
        let report = run(HostEventsConfig {
            pids: 3,
            resync_every: 2,
            ..config(seed, EventPath::PERFECT)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        loaded += report.vdso_loaded;
        unloaded += report.vdso_unloaded;
    }
    assert!(
        loaded > 0 && unloaded > 0,
        "{loaded} loaded, {unloaded} unloaded"
    );
}
