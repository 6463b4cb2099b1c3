//! Upstream's deltas, loaded into a fresh machine, give upstream's kernel
//! tables, line for line (`<name>.deltas.xz` -> `<name>.encoded.xz`).

use eim_machine::machine::{Capacities, KernelBook};
use eim_machine::text::{parse_deltas, Tables};
use eim_machine::FileId;
use eim_test_support::oracle::delta_files;
use eim_test_support::read_xz;

#[test]
fn every_oracle_file_encodes_exactly_as_upstream() {
    let files = delta_files();
    assert!(
        files.len() >= 21,
        "expected the whole oracle set, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for deltas_path in &files {
        let encoded_path = deltas_path.with_file_name(
            deltas_path
                .file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.replace(".deltas.xz", ".encoded.xz"))
                .expect("utf-8 name"),
        );
        let parsed = parse_deltas(&read_xz(deltas_path))
            .unwrap_or_else(|e| panic!("{}: {e}", deltas_path.display()));
        let mut book = KernelBook::new(Capacities::default());
        let plan = book
            .plan_load(FileId(0x1234), &parsed.data, None)
            .unwrap_or_else(|e| panic!("{}: {e}", deltas_path.display()));
        let ours = Tables::of_plan(&plan).render(&parsed.path, parsed.data.len());
        let theirs = read_xz(&encoded_path);
        let first_difference = ours
            .lines()
            .zip(theirs.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b);
        if let Some((line, (a, b))) = first_difference {
            failures.push(format!(
                "{}: line {}: ours {a:?}, upstream {b:?}",
                encoded_path.display(),
                line + 1
            ));
        } else if ours.lines().count() != theirs.lines().count() {
            failures.push(format!(
                "{}: {} lines, upstream {}",
                encoded_path.display(),
                ours.lines().count(),
                theirs.lines().count()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{} oracle tables identical to upstream's", files.len());
}
