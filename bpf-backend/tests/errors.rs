//! Each error of eim-bpf says its cause once, printed as the CLI prints a
//! chain (`eim_test_support::errors`), without a kernel: aya's pin error
//! (which printed three times: aya's `EbpfError` prints its `MapError` and
//! returns it too), a pin and a lock directory's `EEXIST` (which printed
//! twice), a failed `bpf()` call under a map.

use std::error::Error as StdError;
use std::io;
use std::path::PathBuf;

use eim_bpf::aya;
use eim_bpf::bpffs::MountError;
use eim_bpf::lock::LockError;
use eim_bpf::path_io::PathIoError;
use eim_bpf::sys::{Cmd, SysError};
use eim_bpf::{KernelError, ShapeMismatch};
use eim_machine::FileId;
use eim_test_support::errors::{assert_eims_convention, cli_text};

/// eim's convention ([`assert_eims_convention`]).
#[track_caller]
fn check(e: &(dyn StdError + 'static)) {
    assert_eims_convention(e);
}

fn eexist() -> io::Error {
    io::Error::from_raw_os_error(libc::EEXIST)
}

/// What aya returns when it cannot pin a map while loading the object.
fn aya_pin_error() -> aya::EbpfError {
    aya::EbpfError::MapError(aya::maps::MapError::PinError {
        name: Some("stack_delta_page_to_info".into()),
        error: aya::pin::PinError::SyscallError(aya::sys::SyscallError {
            call: "BPF_OBJ_PIN",
            io_error: eexist(),
        }),
    })
}

#[test]
fn an_aya_pin_error_says_each_cause_once_errno_included() {
    // aya's own chain repeats itself; eim's message must not.
    assert!(
        eim_test_support::errors::repeated_cause(&aya_pin_error()).is_some(),
        "aya's chain no longer repeats: {}",
        cli_text(&aya_pin_error())
    );
    let e = KernelError::from(aya_pin_error());
    check(&e);
    assert_eq!(
        e.to_string(),
        "loading the lookup object: map error: map `Some(\"stack_delta_page_to_info\")` \
         requested pinning. pinning failed: `BPF_OBJ_PIN` failed: File exists (os error 17)"
    );
}

#[test]
fn every_backend_error_says_its_cause_once() {
    let dir = PathBuf::from("/sys/fs/bpf/eim");
    let sys = SysError {
        cmd: Cmd::MapGetFdById,
        errno: libc::ENOENT,
        processed: 0,
    };
    check(&sys);
    check(&KernelError::from(sys));
    check(&KernelError::InnerArray {
        class: 3,
        file_id: FileId(0x1234),
        id: 77,
        cause: sys,
    });
    let pin = KernelError::Pin {
        path: dir.join("stack_delta_page_to_info"),
        what: "pinning",
        cause: eexist(),
    };
    check(&pin);
    assert_eq!(
        cli_text(&pin),
        "pinning /sys/fs/bpf/eim/stack_delta_page_to_info: File exists (os error 17)"
    );
    let lock = LockError::Io(PathIoError {
        what: "creating the lock directory",
        path: PathBuf::from("/run/eim"),
        cause: eexist(),
    });
    check(&lock);
    assert_eq!(
        cli_text(&lock),
        "creating the lock directory /run/eim: File exists (os error 17)"
    );
    check(&KernelError::from(lock));
    let mount = MountError::Io(PathIoError {
        what: "creating the pin directory",
        path: dir.clone(),
        cause: eexist(),
    });
    check(&mount);
    check(&KernelError::from(mount));
    check(&KernelError::from(ShapeMismatch {
        dir,
        maps: vec![(
            "unwind_info_array".into(),
            "max_entries 16 (want 16384)".into(),
        )],
    }));
}

#[test]
fn the_events_programs_errors_say_each_cause_once() {
    use eim_bpf::events::EventsError;
    use eim_bpf::tracefs::TracefsError;
    let mount = TracefsError::Mount {
        path: PathBuf::from("/sys/kernel/tracing"),
        error: io::Error::from_raw_os_error(libc::EPERM),
    };
    check(&mount);
    let e = EventsError::from(mount);
    check(&e);
    assert!(e.to_string().contains("(os error 1)"), "{e}");
    check(&EventsError::Program {
        program: "eim_on_exec",
        why: "missing from the events object".into(),
    });
}
