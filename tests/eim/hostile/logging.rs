//! Issue 28, item 6: a file's failure is logged once per file, with how
//! many processes it failed for, not once per process: a user with many
//! processes mapping one broken file cannot flood eim's log.

use std::process::Command;

use crate::debuglink::Mapper;
use crate::files::with_broken_eh_frame;
use crate::support::eim_bin;

const PROCESSES: usize = 12;

#[test]
fn a_file_failing_for_many_processes_is_logged_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken");
    with_broken_eh_frame(&broken);
    let mappers: Vec<Mapper> = (0..PROCESSES)
        .map(|_| Mapper::spawn_as(&broken, None))
        .collect();
    let mut cmd = Command::new(eim_bin());
    cmd.args(["scan", "--no-map-files"]);
    for m in &mappers {
        cmd.args(["--pid", &m.0.to_string()]);
    }
    let out = cmd.output().expect("eim scan runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = broken.display().to_string();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(&name) && l.contains("WARN"))
        .collect();
    assert_eq!(lines.len(), 1, "one warning for the file:\n{stderr}");
    assert!(
        lines[0].contains(&format!("references={PROCESSES}")),
        "the count of processes: {}",
        lines[0]
    );
}
