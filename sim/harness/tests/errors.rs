//! Each error of eim-sim says its cause once, printed as the CLI prints a
//! chain (`eim_test_support::errors`), and returns no `source()` (the cause
//! is in the message: `eim_core::error`'s convention).

use std::error::Error as StdError;
use std::path::Path;

use eim_machine::ops::Errno;
use eim_sim::{BatchError, SimError};
use eim_sim_harness::corpus::extract_file;
use eim_sim_harness::run::SetupError;
use eim_sim_harness::trace::Trace;
use eim_sim_harness::workload::Step;
use eim_test_support::errors::assert_eims_convention;

/// eim's convention ([`assert_eims_convention`]).
#[track_caller]
fn check(e: &(dyn StdError + 'static)) {
    assert_eims_convention(e);
}

#[test]
fn every_sim_error_says_its_cause_once() {
    let missing = extract_file(Path::new("/nonexistent/eim/corpus-file")).err();
    let missing = missing.expect("a missing corpus file");
    check(&missing);
    assert!(missing.to_string().ends_with("(os error 2)"), "{missing}");
    let maps = SimError::CreateMap {
        name: "unwind_info_array".into(),
        errno: Errno::EINVAL,
    };
    check(&maps);
    check(&SetupError::from(maps));
    check(&BatchError {
        errno: Errno::ENOSPC,
        processed: 3,
    });
    check(&"nonsense".parse::<Step>().expect_err("not a step"));
    check(&"profile churn\n".parse::<Trace>().expect_err("no seed"));
}
