//! The vDSO on real maps (issue 31): every process maps the kernel's one
//! image, so `eim scan` of two processes loads one table for it under the
//! file id of its bytes, held by both, and names it in each process's
//! `eim_process_mappings` entry at that process's `[vdso]` range. When one
//! process has exited, a restart over the pins adopts the vDSO's table
//! untouched, held by the process left, and the exited process's entry is
//! gone (the vDSO itself is unloaded only with the last process, and every
//! process maps it: the simulator's host workload checks that unload).

use std::collections::BTreeSet;

use super::*;

/// `pid`'s `[vdso]` range and the host id of its image.
fn vdso_of(pid: i32) -> ((u64, u64), u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let line = maps
        .lines()
        .find(|l| l.ends_with("[vdso]"))
        .expect("a [vdso] mapping");
    let (a, b) = line
        .split_whitespace()
        .next()
        .and_then(|r| r.split_once('-'))
        .expect("a range");
    let range = (
        u64::from_str_radix(a, 16).expect("start"),
        u64::from_str_radix(b, 16).expect("end"),
    );
    let id = status::vdso_id(&maps, pid).expect("the vDSO's id");
    (range, u64::from_str_radix(&id, 16).expect("hex"))
}

/// The summary's entry for host file id `id`.
fn loaded(summary: &Value, id: u64) -> Value {
    let host = format!("{id:016x}");
    summary["loaded_files"]
        .as_array()
        .expect("loaded_files")
        .iter()
        .find(|f| f["host_file_id"] == host.as_str())
        .unwrap_or_else(|| panic!("{host} not loaded: {summary:#}"))
        .clone()
}

/// Whether `pid`'s pinned mappings name `id` at exactly `range`.
fn names_vdso(dump: &eim::bpf::Dump, pid: i32, id: u64, range: (u64, u64)) -> bool {
    dump.process_mappings.get(&(pid as u32)).is_some_and(|e| {
        e.mappings
            .iter()
            .any(|m| m.file_id == id && (m.start, m.end) == range)
    })
}

fn vdso_table(dump: &eim::bpf::Dump, id: u64) -> Vec<eim::abi::StackDelta> {
    let tables: Vec<_> = dump
        .delta_tables
        .iter()
        .filter(|((_, file), _)| file.0 == id)
        .map(|(_, (_, deltas))| deltas.clone())
        .collect();
    assert_eq!(tables.len(), 1, "one table of the vDSO");
    tables.into_iter().next().expect("one")
}

#[test]
fn the_vdso_is_loaded_once_for_every_process_and_reconciled_with_them() {
    let Some((a, _scratch, dir)) =
        with_sleeper_and_pins("the_vdso_is_loaded_once_for_every_process_and_reconciled_with_them")
    else {
        return;
    };
    let b = sleeper();
    let (range_a, id) = vdso_of(a.pid());
    let (range_b, id_b) = vdso_of(b.pid());
    assert_eq!(id_b, id, "one image for every process of the kernel");
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let d = dir.to_str().expect("UTF-8");
    let first = run(&[
        "scan",
        "--json",
        "--backend",
        "kernel",
        "--pin-dir",
        d,
        "--pid",
        &pa,
        "--pid",
        &pb,
        "--mount-bpffs",
    ])
    .ok()
    .json();
    let vdso = loaded(&first, id);
    assert_eq!(vdso["references"], 2, "{vdso:#}");
    let both: BTreeSet<i64> = [a.pid(), b.pid()].map(i64::from).into();
    let holders: BTreeSet<i64> = vdso["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    assert_eq!(holders, both, "{vdso:#}");
    assert!(u(&vdso, "/deltas") > 0, "{vdso:#}");
    let before = pinned::dump_pinned(&dir).expect("dump");
    let table = vdso_table(&before, id);
    assert!(!table.is_empty());
    assert!(names_vdso(&before, a.pid(), id, range_a), "{before:?}");
    assert!(names_vdso(&before, b.pid(), id, range_b), "{before:?}");

    // b exits: a restart over the pins adopts the vDSO for a alone.
    let gone = b.pid();
    drop(b);
    let again = scan(&dir, a.pid(), &[]).ok();
    assert!(
        again.stderr.contains("eim: maps reconciled"),
        "{}",
        again.stderr
    );
    let summary = again.json();
    let vdso = loaded(&summary, id);
    assert_eq!(vdso["references"], 1, "{vdso:#}");
    assert_eq!(vdso["processes"], serde_json::json!([a.pid()]), "{vdso:#}");
    let after = pinned::dump_pinned(&dir).expect("dump");
    assert_eq!(
        vdso_table(&after, id),
        table,
        "the vDSO's table adopted as it was"
    );
    assert!(names_vdso(&after, a.pid(), id, range_a), "{after:?}");
    assert!(
        !after.process_mappings.contains_key(&(gone as u32)),
        "the exited process's entry is gone: {after:?}"
    );
}
