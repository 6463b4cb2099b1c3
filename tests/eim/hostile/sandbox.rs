//! Less power once started (issue 28): a running `eim watch` has no new
//! privileges, a seccomp filter and only its steady-state capabilities on
//! every thread, and still loads what an unconfined scan loads.

use std::os::unix::process::CommandExt;

use crate::signals::{eim, reference_summary, sleeper, Running};
use crate::support::root_or_skip;

/// Capability bits a step may keep: CAP_DAC_READ_SEARCH (2),
/// CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21) and, with kernel maps, CAP_BPF
/// (39).
const STEADY: u64 = 1 << 2 | 1 << 19 | 1 << 21 | 1 << 39;
const CAP_BPF: u64 = 1 << 39;
/// The user and group `nobody`.
const NOBODY: u32 = 65534;

/// `name:\tvalue` of a `/proc/.../status` text.
fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map_or("", str::trim)
}

fn hex(status: &str, name: &str) -> u64 {
    u64::from_str_radix(field(status, name), 16)
        .unwrap_or_else(|e| panic!("{name} of {status}: {e}"))
}

/// Every thread of `pid`: its name and status text.
fn threads(pid: i32) -> Vec<(String, String)> {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|t| {
            let path = t.ok()?.path();
            let status = std::fs::read_to_string(path.join("status")).ok()?;
            Some((field(&status, "Name").to_string(), status))
        })
        .collect()
}

fn a_watch_is_confined(backend: &[&str]) {
    let sleeper = sleeper();
    let want = reference_summary(sleeper.pid());
    let pid = sleeper.pid().to_string();
    let mut args = vec![
        "-v",
        "watch",
        "--interval",
        "200ms",
        "--json",
        "--metrics-addr",
        "127.0.0.1:0",
        "--pid",
        &pid,
    ];
    args.extend_from_slice(backend);
    let mut watch = Running::spawn(&mut eim(&args));
    let out = watch.take_stdout();
    let mut err = watch.take_stderr_lines();
    err.wait_for("confined:");
    err.wait_for(" step=1 ");
    let seen = threads(watch.pid());
    let names: Vec<_> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"eim-signals") && names.contains(&"eim-metrics"),
        "the threads started before the confinement are there: {names:?}"
    );
    for (name, status) in &seen {
        assert_eq!(field(status, "NoNewPrivs"), "1", "thread {name}");
        assert_eq!(field(status, "Seccomp"), "2", "thread {name}: filter mode");
        for set in ["CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"] {
            let caps = hex(status, set);
            assert_eq!(
                caps & !STEADY,
                0,
                "thread {name} keeps {set} {caps:#x} beyond the steady set {STEADY:#x}"
            );
        }
    }
    let main = &seen
        .iter()
        .find(|(n, _)| n == "eim")
        .expect("main thread")
        .1;
    let wants_bpf = backend.contains(&"kernel");
    assert_eq!(hex(main, "CapEff") & CAP_BPF != 0, wants_bpf, "{main}");
    watch.signal(libc::SIGTERM);
    let status = watch.wait();
    let err = err.rest();
    assert_eq!(status.code(), Some(0), "{status}:\n{err}");
    assert!(!err.contains("unconfined"), "{err}");
    let got: serde_json::Value = serde_json::from_str(&out.text()).expect("JSON summary");
    // Confined, the watch loaded what an unconfined scan loads.
    crate::signals::assert_same_maps(&got, &want);
}

#[test]
fn a_watch_on_simulated_maps_gives_up_what_its_steps_do_not_need() {
    if !root_or_skip("a_watch_on_simulated_maps_gives_up_what_its_steps_do_not_need") {
        return;
    }
    a_watch_is_confined(&[]);
}

#[test]
fn a_watch_on_kernel_maps_gives_up_what_its_steps_do_not_need() {
    if !root_or_skip("a_watch_on_kernel_maps_gives_up_what_its_steps_do_not_need") {
        return;
    }
    a_watch_is_confined(&["--backend", "kernel", "--no-pin"]);
}

#[test]
fn an_unprivileged_watch_is_confined_too() {
    // Without privileges there are no capabilities to cut, but the filter
    // and no_new_privs still hold (any user can set both).
    let sleeper = sleeper();
    let pid = sleeper.pid().to_string();
    let mut cmd = eim(&["-v", "watch", "--interval", "200ms", "--pid", &pid]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    let mut watch = Running::spawn(&mut cmd);
    let mut err = watch.take_stderr_lines();
    err.wait_for("confined:");
    for (name, status) in threads(watch.pid()) {
        assert_eq!(field(&status, "NoNewPrivs"), "1", "thread {name}");
        assert_eq!(field(&status, "Seccomp"), "2", "thread {name}");
        assert_eq!(hex(&status, "CapEff"), 0, "thread {name}");
    }
    watch.signal(libc::SIGTERM);
    assert_eq!(watch.wait().code(), Some(0), "{}", err.rest());
}
