//! Each error of the `eim` package says its cause once, printed as the CLI
//! prints a chain (`eim_test_support::errors`), and returns no `source()`
//! (the cause is in the message: `eim_core::error`'s convention); and the
//! CLI's own line for a pin directory it cannot use says its errno once
//! (it said `No such file or directory (os error 2)` twice).

use std::error::Error as StdError;
use std::io;
use std::path::PathBuf;
use std::process::Command;

use eim::address::LookupError;
use eim::daemon::WatchError;
use eim::host::descriptors::DescriptorError;
use eim::host::open::OpenError;
use eim::host::procs::{self, ProcessError};
use eim::map_view::InspectError;
use eim::metrics_http::ServeError;
use eim_test_support::errors::{assert_eims_convention, cli_text, repeated_segment};

/// eim's convention ([`assert_eims_convention`]).
#[track_caller]
fn check(e: &(dyn StdError + 'static)) {
    assert_eims_convention(e);
}

#[test]
fn every_host_error_says_its_cause_once() {
    let open = OpenError::Io {
        pid: 42,
        path: PathBuf::from("/usr/lib/libx.so"),
        cause: io::Error::from_raw_os_error(libc::EEXIST),
    };
    check(&open);
    assert_eq!(
        cli_text(&open),
        "process 42: cannot open /usr/lib/libx.so: File exists (os error 17)"
    );
    // A pid above pid_max never exists.
    let gone = procs::start_time(i32::MAX).expect_err("no such process");
    assert!(matches!(gone, ProcessError::Vanished { .. }), "{gone}");
    check(&gone);
    check(&LookupError::from(gone));
    check(&DescriptorError::Raise {
        soft: 256,
        hard: 4096,
        cause: io::Error::from_raw_os_error(libc::EPERM),
    });
    check(&DescriptorError::Read(io::Error::from_raw_os_error(
        libc::EINVAL,
    )));
    let inspect = InspectError {
        backend: "kernel",
        message: "bpf(MapLookupElem): Operation not permitted (os error 1)".into(),
    };
    check(&inspect);
    check(&WatchError::from(inspect));
    check(&ServeError {
        addr: "127.0.0.1:9400".parse().expect("an address"),
        cause: io::Error::from_raw_os_error(libc::EADDRINUSE),
    });
}

#[test]
fn a_pin_directory_eim_cannot_use_is_reported_with_its_errno_once() {
    // The lock (under /run/eim) and the pin checks need root, as the maps.
    if !eim::bpf::probe::require_bpf(
        "a_pin_directory_eim_cannot_use_is_reported_with_its_errno_once",
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("eim-errors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A dangling symlink: the pin directory "exists" for mkdir but not for
    // statvfs, whose ENOENT was printed twice.
    let pins = dir.join("pins");
    std::os::unix::fs::symlink(dir.join("nowhere"), &pins).expect("symlink");
    let out = Command::new(env!("CARGO_BIN_EXE_eim"))
        .env_remove("RUST_LOG")
        .args(["scan", "--backend", "kernel", "--mount-bpffs", "--pin-dir"])
        .arg(&pins)
        .output()
        .expect("run eim");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !out.status.success(),
        "eim accepted a dangling pin directory"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.trim_end();
    assert!(line.starts_with("eim: scan: "), "{line}");
    assert_eq!(line.matches("(os error 2)").count(), 1, "{line}");
    assert_eq!(repeated_segment(line), None, "{line}");
}

#[test]
fn every_stack_error_says_its_cause_once() {
    use eim::stack::freeze::FreezeError;
    use eim::stack::memory::ProcMemory;
    use eim::stack::StackError;

    // A pid above pid_max never exists.
    let memory = ProcMemory::open(i32::MAX).expect_err("no such process");
    check(&memory);
    check(&StackError::from(memory));
    let list = FreezeError::ListTasks {
        pid: 42,
        cause: io::Error::from_raw_os_error(libc::EACCES),
    };
    check(&list);
    assert_eq!(
        cli_text(&list),
        "process 42: cannot list /proc/42/task: Permission denied (os error 13)"
    );
    check(&StackError::from(list));
}
