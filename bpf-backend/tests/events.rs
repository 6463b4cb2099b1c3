//! The events program on the real kernel (issue 18): a child's fork, exec,
//! executable file mappings and exit each arrive, for its pid, and none is
//! lost. Root only: a loud SKIPPED otherwise, a failure under
//! `EIM_REQUIRE_BPF=1`.

use std::time::{Duration, Instant};

use eim_bpf::events::{HostEvent, HostEvents, Stamped};

fn monotonic() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) },
        0
    );
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Reads events until `done` says the ones wanted have come, at most 10 s.
fn collect(events: &mut HostEvents, done: impl Fn(&[HostEvent]) -> bool) -> Vec<HostEvent> {
    let started = Instant::now();
    let mut seen = Vec::new();
    let mut stamped: Vec<Stamped> = Vec::new();
    while !done(&seen) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "events missing; seen: {seen:?}"
        );
        events.wait(Duration::from_millis(100)).expect("poll");
        stamped.clear();
        events.drain(4096, &mut stamped);
        // Stamped on CLOCK_MONOTONIC, within the test's time.
        let now = monotonic();
        for s in &stamped {
            assert!(
                s.at <= now && now - s.at < Duration::from_secs(10),
                "{s:?} at {now:?}"
            );
        }
        seen.extend(stamped.iter().map(|s| s.event));
    }
    seen
}

#[test]
fn a_childs_fork_exec_mappings_and_exit_are_reported() {
    if !eim_bpf::probe::require_bpf("a_childs_fork_exec_mappings_and_exit_are_reported") {
        return;
    }
    let mut events = HostEvents::attach().expect("attach the events program");
    let me = std::process::id() as i32;
    let mut child = std::process::Command::new("/bin/true")
        .spawn()
        .expect("spawn /bin/true");
    let pid = child.id() as i32;
    child.wait().expect("wait");
    let of_child = |seen: &[HostEvent]| -> Vec<HostEvent> {
        seen.iter().copied().filter(|e| e.pid() == pid).collect()
    };
    let seen = collect(&mut events, |seen| {
        of_child(seen).contains(&HostEvent::Exit { pid })
    });
    let mine = of_child(&seen);
    assert_eq!(
        mine.first(),
        Some(&HostEvent::Fork { pid, parent: me }),
        "{mine:?}"
    );
    let exec_at = mine
        .iter()
        .position(|e| *e == HostEvent::Exec { pid })
        .expect("an exec");
    // The loader maps libc executable after the exec.
    assert!(
        mine[exec_at..]
            .iter()
            .any(|e| matches!(e, HostEvent::Map { len, .. } if *len > 0)),
        "{mine:?}"
    );
    assert_eq!(mine.last(), Some(&HostEvent::Exit { pid }), "{mine:?}");
    // A thread is not a process.
    let thread = std::thread::spawn(|| unsafe { libc::gettid() });
    let tid = thread.join().expect("thread");
    // Whatever it would have caused has arrived once a marker process's
    // exit has.
    let mut marker = std::process::Command::new("/bin/true")
        .spawn()
        .expect("spawn /bin/true");
    let marker_pid = marker.id() as i32;
    marker.wait().expect("wait");
    let seen = collect(&mut events, |seen| {
        seen.contains(&HostEvent::Exit { pid: marker_pid })
    });
    assert!(
        !seen.iter().any(|e| e.pid() == tid),
        "thread {tid} reported: {seen:?}"
    );
    assert_eq!(events.lost().expect("lost"), 0);
}
