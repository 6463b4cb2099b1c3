//! What every test, bench and fuzz target of eim shares, in one place:
//!
//! * [`data`]: where the test data is (the repository's `tests/data`,
//!   or `$EIM_TESTDATA`), reading it (xz included);
//! * [`integrity`]: whether the test data is intact (`FILES.sha256`, the
//!   oracle's manifests);
//! * [`oracle`]: the oracle's inputs as its manifest names them, with the
//!   check that a file of the machine image is the one it was made from,
//!   and their delta files;
//! * [`errors`]: an error as the CLI prints it, and the check that it
//!   says each cause once;
//! * [`skip`]: loud skips that become failures under an `EIM_REQUIRE_*`
//!   variable (`tests/run` and CI set them);
//! * [`tools`]: binutils' view of a file (`nm`, `objdump`), independent of
//!   eim's own symbol and code readers;
//! * [`elf`]: small ELF files made by tests (a header, a file of named
//!   sections);
//! * [`files`]: the host's ELF files and the stable toolchain's;
//! * [`host`]: a big host in one process (distinct libraries mapped);
//! * [`cfi`]: gimli's decoding of `.eh_frame`, the floor a CFI walk can
//!   reach;
//! * [`rng`]: a small deterministic generator;
//! * [`worst_eh_frame`]: the biggest `.eh_frame` of minimal FDEs eim's caps
//!   allow, as an ELF file.
//!
//! It depends on no eim crate, so that eim-core's own tests can use it.

pub mod cfi;
pub mod data;
pub mod elf;
pub mod errors;
pub mod files;
pub mod host;
pub mod integrity;
pub mod oracle;
pub mod rng;
pub mod skip;
pub mod tools;
pub mod worst_eh_frame;

pub use data::{read, read_xz, testdata};
pub use skip::{present, skip_or_fail};

/// Polls `ok` every 20 ms for at most `limit`; whether it held.
pub fn wait_for(limit: std::time::Duration, mut ok: impl FnMut() -> bool) -> bool {
    let started = std::time::Instant::now();
    loop {
        if ok() {
            return true;
        }
        if started.elapsed() > limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
