//! Each error of eim-core says its cause once, printed as the CLI prints a
//! chain (`eim_test_support::errors`): one value of every error type, made
//! by the code that makes it in use where a bad input is enough, and
//! returning no `source()` (the cause is in the message:
//! `eim_core::error`'s convention).

use std::error::Error as StdError;
use std::io::{self, Read};

use eim_analysis::elf::extract::Cause;
use eim_analysis::elf::fileid::FileId128;
use eim_analysis::elf::{DebugFileError, Elf, ExtractError as StageError, SourceError, Stage};
use eim_analysis::tsd::error::{AnalysisError, DtvError, SymbolError, TsdError};
use eim_core::error::{Causes, Error};
use eim_core::provider::ExtractError;
use eim_machine::abi::UnwindInfo;
use eim_machine::deltas::StackDelta;
use eim_machine::machine::{Capacities, KernelBook, ReconcileError};
use eim_machine::ops::{Errno, MapKind};
use eim_machine::text::parse_deltas;
use eim_machine::text_input::read_deltas;
use eim_machine::FileId;
use eim_test_support::errors::{assert_eims_convention, chain_texts, cli_text};

/// The convention, and the line a user reads.
/// eim's convention ([`assert_eims_convention`]).
#[track_caller]
fn check(e: &(dyn StdError + 'static)) {
    assert_eims_convention(e);
}

/// `EIO` (core does not depend on libc).
const EIO: i32 = 5;

/// A reader that fails as a disk does.
struct Failing;

impl Read for Failing {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(EIO))
    }
}

#[test]
fn every_core_error_says_its_cause_once() {
    let file_id = FileId(0x1234);
    let stage_error = StageError {
        stage: Stage::Debug,
        cause: Cause::DebugFile(DebugFileError::new(
            eim_analysis::elf::extract::ExtractErrorKind::NotFound,
            "open /usr/lib/debug/x.debug: No such file or directory (os error 2)",
        )),
    };
    check(&stage_error);
    let extract = ExtractError::new(
        stage_error.kind(),
        "/usr/bin/x",
        Causes(&stage_error).to_string(),
    );
    check(&extract);
    check(&Error::Extraction {
        file_id,
        cause: extract,
    });
    // An encoding refusal as the book makes it: deltas out of order.
    let mut book = KernelBook::new(Capacities::default());
    let unsorted = eim_machine::deltas::IntervalData::from_deltas(vec![
        StackDelta::new(0x2000, 0, UnwindInfo::default()),
        StackDelta::new(0x1000, 0, UnwindInfo::default()),
    ]);
    let plan_error = book
        .plan_load(file_id, &unsorted, None)
        .expect_err("unsorted deltas");
    check(&plan_error);
    let eim_machine::machine::PlanError::Encode(cause) = plan_error else {
        panic!("not an encoding error: {plan_error}");
    };
    check(&Error::Encode { file_id, cause });
    check(&Error::Kernel {
        file_id,
        map: MapKind::Pages,
        op: "update batch",
        errno: Errno::EEXIST,
        done: 1,
        len: 2,
        rolled_back: true,
    });
    check(&ReconcileError::TwoTables(file_id));
    check(&parse_deltas("# file: /x\n# deltas: 2\n850 1 2 16 0 0 0\n").expect_err("short"));
    for input in [
        read_deltas(Failing, 100).expect_err("a failing read"),
        read_deltas(&b"\xfd7zXZ\0garbage"[..], 100).expect_err("a broken xz stream"),
        read_deltas(&b"# file: /x\nzz 1 2 3 4 5 6\n"[..], 100).expect_err("a bad row"),
    ] {
        check(&input);
    }
    check(&Elf::parse(b"not an ELF file").err().expect("not ELF"));
    check(&SourceError::Io {
        offset: 0,
        len: 4096,
        message: io::Error::from_raw_os_error(EIO).to_string(),
    });
    check(&"zz".parse::<FileId128>().expect_err("not a file id"));
    check(&TsdError::Symbol(SymbolError::NotFound));
    check(&DtvError::Analysis(AnalysisError::NoDtvPattern));
}

/// Another crate's error that prints its cause and returns it too, over
/// one that only returns its own (aya's `EbpfError::MapError` over a
/// `MapError::PinError` over a syscall error).
#[derive(Debug)]
struct Outer(Middle);
#[derive(Debug)]
struct Middle(io::Error);

impl std::fmt::Display for Outer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "map error: {}", self.0)
    }
}
impl StdError for Outer {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}
impl std::fmt::Display for Middle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("pinning failed")
    }
}
impl StdError for Middle {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn causes_prints_a_foreign_chain_with_each_text_once() {
    let foreign = Outer(Middle(io::Error::from_raw_os_error(17)));
    // Printed as a chain, the foreign error repeats itself...
    assert_eq!(
        cli_text(&foreign),
        "map error: pinning failed: pinning failed: File exists (os error 17)"
    );
    assert_eq!(chain_texts(&foreign).len(), 3);
    // ...and through Causes each text comes once, the errno included.
    assert_eq!(
        Causes(&foreign).to_string(),
        "map error: pinning failed: File exists (os error 17)"
    );
}
