//! The repository's test data (`tests/data`) is the data the oracle made:
//! a copy that rotted fails here, by name, and not as a puzzling
//! difference between eim and the oracle. And the machine image's inputs
//! the oracle also read are either the oracle's or a loud skip.

use std::io;
use std::path::Path;

use eim_test_support::data::in_repo;
use eim_test_support::integrity::{problems, TREE_SUMS};
use eim_test_support::{oracle, testdata};

fn intact_read(path: &Path) -> io::Result<Vec<u8>> {
    std::fs::read(path)
}

#[test]
fn the_repositorys_test_data_is_intact() {
    let root = in_repo();
    let found = problems(&root, &intact_read);
    assert!(
        found.is_empty(),
        "the test data under {} is not the oracle's ({} problems; tests/README.md says how \
         to refresh it):\n{}",
        root.display(),
        found.len(),
        found.join("\n")
    );
    // The check saw the whole tree: every input of the repository's data
    // is listed (the oracle's 12 in bin/, upstream's 4) with its outputs.
    let listed = std::fs::read_to_string(root.join(TREE_SUMS)).expect("FILES.sha256");
    let inputs = listed
        .lines()
        .filter(|l| l.contains("  oracle/bin/") || l.ends_with(".deltas.xz"))
        .count();
    assert!(
        inputs >= 12 + 17 + 4,
        "{TREE_SUMS} lists {inputs} inputs and deltas files"
    );
}

/// `read`, except that `spoiled` reads with one byte flipped.
fn with_a_flipped_byte(spoiled: &'static str) -> impl Fn(&Path) -> io::Result<Vec<u8>> {
    move |path| {
        let mut bytes = std::fs::read(path)?;
        if path.ends_with(spoiled) {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x20;
        }
        Ok(bytes)
    }
}

#[test]
fn an_input_that_rotted_is_named_by_every_list_that_records_it() {
    let read = with_a_flipped_byte("oracle/bin/gocorpus-go1.23-amd64");
    let found = problems(&in_repo(), &read);
    let about: Vec<&String> = found
        .iter()
        .filter(|p| p.contains("gocorpus-go1.23-amd64"))
        .collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        about.iter().any(|p| p.contains(TREE_SUMS)) && about.iter().any(|p| p.contains("MANIFEST")),
        "{found:#?}"
    );
}

#[test]
fn an_expected_output_that_rotted_is_named() {
    let read = with_a_flipped_byte("upstream/volname.deltas.xz");
    let found = problems(&in_repo(), &read);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("upstream/volname.deltas.xz") && found[0].contains(TREE_SUMS),
        "{found:#?}"
    );
}

#[test]
fn a_file_that_vanished_is_named() {
    let read = |path: &Path| {
        if path.ends_with("upstream/vdso.arch64.withframe") {
            Err(io::Error::from(io::ErrorKind::NotFound))
        } else {
            std::fs::read(path)
        }
    };
    let found = problems(&in_repo(), &read);
    assert!(!found.is_empty(), "a lost input passed");
    assert!(
        found
            .iter()
            .all(|p| p.contains("vdso.arch64.withframe") && p.contains("cannot read")),
        "{found:#?}"
    );
}

#[test]
fn a_manifest_that_lost_its_sums_is_named() {
    // BIN.sha256 read as an empty list: every input of bin/ is unlisted
    // (and BIN.sha256 itself no longer matches FILES.sha256).
    let read = |path: &Path| {
        if path.ends_with("oracle/BIN.sha256") {
            Ok(Vec::new())
        } else {
            std::fs::read(path)
        }
    };
    let found = problems(&in_repo(), &read);
    let unlisted = found
        .iter()
        .filter(|p| p.starts_with("oracle/BIN.sha256 does not list"))
        .count();
    assert_eq!(unlisted, 12, "{found:#?}");
    assert!(
        found
            .iter()
            .any(|p| p.contains("oracle/BIN.sha256: sha256")),
        "{found:#?}"
    );
}

/// The manifest's rows of the machine image (`/usr/...`) are read where
/// they are: each is the oracle's file, or a loud skip (a failure under
/// `EIM_REQUIRE_INTERPRETERS`); never a comparison with another file's
/// outputs.
#[test]
fn the_machine_images_inputs_are_the_oracles_or_a_loud_skip() {
    let of_the_machine: Vec<oracle::Input> = oracle::inputs(&testdata())
        .into_iter()
        .filter(|i| i.path.starts_with('/'))
        .collect();
    assert_eq!(of_the_machine.len(), 5, "MANIFEST.tsv's /usr rows");
    for input in of_the_machine.iter().filter(|i| i.available()) {
        input.bytes(); // checks its sha256 again, as every oracle test does
    }
}

/// A file of the machine image in another version (another distribution,
/// a later package) is not compared with the oracle's outputs of the one
/// it was made from: a loud skip, or a failure when the inputs are
/// required.
#[test]
fn a_machine_file_of_another_version_is_a_loud_skip() {
    let path = std::env::temp_dir().join(format!(
        "eim-oracle-input-of-another-version-{}",
        std::process::id()
    ));
    std::fs::write(&path, b"not the oracle's libc").expect("a temporary file");
    let oracle_dir = in_repo().join("oracle");
    let input = oracle::Input {
        name: "x86_64-libc.so.6".into(),
        file: path.clone(),
        path: path.display().to_string(),
        deltas: oracle_dir.join("x86_64-libc.so.6.deltas.xz"),
        tsd: Some(oracle_dir.join("x86_64-libc.so.6.tsd")),
        dir: oracle_dir,
        sha256: "6b4a45352fd0c540a9c7c718f35ce8c8e46a4e482f9d3885a910c32d1a0e1421".into(),
        fileid64: None,
    };
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| input.available()));
    let _ = std::fs::remove_file(&path);
    if std::env::var_os("EIM_REQUIRE_INTERPRETERS").is_some() {
        assert!(
            answer.is_err(),
            "required, and of another version: a failure"
        );
    } else {
        assert_eq!(answer.ok(), Some(false), "another version: skipped");
    }
}
