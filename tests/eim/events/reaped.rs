//! A process whose exit event comes before its parent reaps it: eim reads
//! it in the pass that follows the exit, and /proc still shows it (exiting,
//! or a zombie) with nothing mapped. It must leave the table then, not at
//! the next resync: in a storm of short processes the benchmark
//! (`tools/bench-events`) counted most of them as resync corrections.

use std::sync::atomic::AtomicBool;

use eim::bpf::events::HostEvents;
use eim::host::scan::{Host, HostConfig, Quiet};
use eim::sim::{SimConfig, SimMaps};

use super::*;

#[test]
fn processes_that_exited_leave_the_table_without_a_resync() {
    let _one = serial();
    if !kernel_ready("processes_that_exited_leave_the_table_without_a_resync") {
        return;
    }
    let mut source = HostEvents::attach().expect("attach the events program");
    let mut host = Host::new(
        SimMaps::new(SimConfig::default()).expect("sim maps"),
        HostConfig::default(),
    );
    let stop = AtomicBool::new(false);
    let mut lp = started_loop(&mut host, &mut source, &stop);
    // Each read by eim while a zombie: its exit event followed before it
    // is reaped (what a storm's parent, reaping in batches, leaves to
    // chance, made certain here).
    let mut children = Vec::new();
    for _ in 0..20 {
        let mut child = Command::new("/bin/true").spawn().expect("run /bin/true");
        let pid = child.id() as i32;
        let zombie = wait_for(Duration::from_secs(2), || is_zombie(pid));
        assert!(zombie, "/bin/true {pid} did not exit");
        for _ in 0..4 {
            lp.turn(Duration::from_millis(20), &stop, &mut Quiet);
        }
        assert!(child.wait().expect("reap /bin/true").success());
        children.push(pid);
    }
    let stats = lp.stats.clone();
    assert!(
        stats.events.get("exit").copied().unwrap_or(0) >= 20,
        "{stats:?}"
    );
    // A pid some other process took since is not stale.
    let stale: Vec<i32> = children
        .iter()
        .copied()
        .filter(|&pid| host.processes().get(pid).is_some())
        .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    assert!(
        stale.is_empty(),
        "{} of 20 processes that exited are still in the table: {stale:?}",
        stale.len()
    );
}

/// Whether `/proc/PID/stat` says zombie (`Z`, after the command's `)`).
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
