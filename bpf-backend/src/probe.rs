//! Whether this process may use BPF at all, and if not, what it lacks: the
//! answer a user needs when `--backend kernel` is refused, and the check
//! that makes kernel tests skip loudly (or fail under `EIM_REQUIRE_BPF=1`).

use crate::sys::{self, SysError};

/// Capabilities eim's kernel backend uses, with what each is needed for.
pub const NEEDED: [(u32, &str, &str); 3] = [
    (
        39,
        "CAP_BPF",
        "creating BPF maps and loading the lookup program",
    ),
    (
        38,
        "CAP_PERFMON",
        "running the lookup program (a tracing program)",
    ),
    (
        21,
        "CAP_SYS_ADMIN",
        "mounting a bpffs on the pin directory (or instead of CAP_BPF on older kernels)",
    ),
];

/// Tries to create a one-element array map. `Ok(false)` when the kernel
/// says EPERM (no privilege), an error for anything else.
pub fn can_create_maps() -> Result<bool, SysError> {
    let probe = sys::map_create(&sys::MapSpec {
        map_type: sys::map_type::ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
        inner_map: None,
        name: "eim_probe",
    });
    match probe {
        Ok(_) => Ok(true),
        Err(e) if e.errno == libc::EPERM => Ok(false),
        Err(e) => Err(e),
    }
}

/// The effective capabilities of this process (`CapEff` of
/// `/proc/self/status`), or `None` if they cannot be read.
pub fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

/// The capabilities of [`NEEDED`] this process lacks, with their purpose.
pub fn missing_capabilities() -> Vec<(&'static str, &'static str)> {
    let Some(caps) = effective_capabilities() else {
        return NEEDED.iter().map(|(_, n, why)| (*n, *why)).collect();
    };
    NEEDED
        .iter()
        .filter(|(bit, _, _)| caps & (1 << bit) == 0)
        .map(|(_, n, why)| (*n, *why))
        .collect()
}

/// For tests that need BPF: true if maps can be created. Otherwise prints a
/// loud `SKIPPED` naming `test` and returns false, or panics when
/// `EIM_REQUIRE_BPF=1` (CI), where a skip would hide a failure.
pub fn require_bpf(test: &str) -> bool {
    match can_create_maps() {
        Ok(true) => true,
        Ok(false) => {
            let required = std::env::var("EIM_REQUIRE_BPF").as_deref() == Ok("1");
            assert!(
                !required,
                "EIM_REQUIRE_BPF=1 but creating a BPF map failed with EPERM ({test})"
            );
            // Straight to fd 2: the test harness captures eprintln!, and a
            // skip must be seen.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "\n***** SKIPPED: {test} (bpf() returned EPERM; needs root/CAP_BPF) *****"
            );
            false
        }
        Err(e) => panic!("probing BPF: {e}"),
    }
}
