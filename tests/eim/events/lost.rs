//! Lost events force a resync: a ring of one page, filled by a storm of
//! processes while nobody reads it, cannot take the event of a library
//! this process then maps; the next turn sees the loss, resyncs, and the
//! resync corrects exactly that.

use std::sync::atomic::AtomicBool;

use eim::bpf::events::HostEvents;
use eim::host::scan::{Host, HostConfig, Quiet};
use eim::sim::{SimConfig, SimMaps};

use super::*;

#[test]
fn lost_events_force_a_resync_that_corrects_what_they_missed() {
    let _one = serial();
    if !kernel_ready("lost_events_force_a_resync_that_corrects_what_they_missed") {
        return;
    }
    let mut source = HostEvents::attach_with(4096).expect("attach the events program");
    let me = std::process::id() as i32;
    let mut host = Host::new(
        SimMaps::new(SimConfig::default()).expect("sim maps"),
        HostConfig {
            only: Some([me].into()),
            ..HostConfig::default()
        },
    );
    let stop = AtomicBool::new(false);
    let scratch = tempfile::tempdir().expect("temporary directory");
    let lib = unique_copy(
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        scratch.path(),
        "lost-libz.so",
    );
    let id = u64::from_str_radix(&host_id_of(&lib), 16).expect("hex id");
    let mut lp = started_loop(&mut host, &mut source, &stop);
    // 4 KiB hold 85 records: a storm of 200 processes fills it.
    for _ in 0..200 {
        let status = Command::new("/bin/true").status().expect("run /bin/true");
        assert!(status.success());
    }
    let c = std::ffi::CString::new(lib.to_str().expect("UTF-8")).expect("no NUL");
    // SAFETY: a NUL-terminated path of a copy of libz, whose constructors
    // are libz's.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", lib.display());
    lp.turn(Duration::from_millis(100), &stop, &mut Quiet);
    let stats = lp.stats.clone();
    assert!(stats.lost > 0, "{stats:?}");
    assert_eq!(stats.resyncs_after_loss, 1, "{stats:?}");
    assert_eq!(stats.resyncs, 1, "{stats:?}");
    assert!(stats.corrections >= 1, "{stats:?}");
    assert!(
        host.held_by(me)
            .is_some_and(|held| held.contains(&eim::FileId(id))),
        "the library mapped while the ring was full is not held"
    );
    // SAFETY: the handle dlopen returned, closed once.
    unsafe { libc::dlclose(handle) };
}
