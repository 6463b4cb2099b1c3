//! `eim status` over real pinned maps (issue 17, point 3): after a scan it
//! lists exactly the files the scanned process maps, under the ids `eim
//! fileid` gives them, and finds the maps consistent; a page entry, a
//! table, a slot and a table's pages corrupted in turn behind the owner's
//! back are each reported, by kind and file, with exit status 1.

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::Path;

use serde_json::Value;

use super::*;

/// The 64-bit ids of the executable files `pid` maps, from `eim fileid`.
fn mapped_file_ids(pid: i32) -> BTreeSet<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let paths: BTreeSet<&str> = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .collect();
    let mut args = vec!["fileid"];
    args.extend(paths.iter().copied());
    let out = run(&args).ok().stdout;
    let mut ids: BTreeSet<String> = out
        .lines()
        .map(|l| l.split_whitespace().nth(1).expect("a host id").to_string())
        .collect();
    ids.extend(vdso_id(&maps, pid));
    ids
}

/// The 64-bit id of `pid`'s vDSO (loaded as a file, issue 31): the file
/// id of its image, read here from the process's memory.
pub(super) fn vdso_id(maps: &str, pid: i32) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).expect("start");
    let end = u64::from_str_radix(end, 16).expect("end");
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("mem");
    let mut image = vec![0; (end - start) as usize];
    mem.read_exact_at(&mut image, start)
        .expect("the vDSO image");
    Some(host_id(eim::elf::fileid::file_id_of(&image).host()))
}

fn status(dir: &Path) -> Finished {
    run(&[
        "status",
        "--json",
        "--pin-dir",
        dir.to_str().expect("UTF-8"),
    ])
}

fn status_ids(s: &Value) -> BTreeSet<String> {
    s["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["host_file_id"].as_str().expect("an id").to_string())
        .collect()
}

/// A scan of `pid` pinned in a fresh `name` under the scratch directory.
fn scanned(scratch: &mut Scratch, name: &str, pid: i32) -> PathBuf {
    let dir = scratch.mount_point(name);
    scan(&dir, pid, &["--mount-bpffs"]).ok();
    let s = status(&dir).ok().json();
    assert_eq!(s["violations"], serde_json::json!([]), "{s}");
    assert_eq!(s["owned"], false, "{s}");
    dir
}

/// Runs the status of corrupted maps: it must fail and name `kind` for
/// `file` (a host id; `None`: a violation of no one file).
fn reported(dir: &Path, kind: &str, file: Option<&str>) {
    let done = status(dir);
    assert_eq!(
        done.status.code(),
        Some(1),
        "{}\n{}",
        done.stdout,
        done.stderr
    );
    let s = done.json();
    let found = s["violations"].as_array().expect("violations");
    assert!(
        found
            .iter()
            .any(|v| v["kind"] == kind && v["host_file_id"].as_str() == file),
        "wanted {kind} of {file:?}, got {s:#}"
    );
    let text = run(&["status", "--pin-dir", dir.to_str().expect("UTF-8")]);
    assert_eq!(text.status.code(), Some(1));
    assert!(text.stdout.contains("INCONSISTENT"), "{}", text.stdout);
}

fn pin(dir: &Path, name: &str) -> std::os::fd::OwnedFd {
    sys::obj_get(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn host_id(id: eim::FileId) -> String {
    format!("{:016x}", id.0)
}

/// The largest table of the dump: its class, file and deltas.
fn a_table(dir: &Path) -> (u16, eim::FileId, Vec<eim::abi::StackDelta>) {
    let dump = pinned::dump_pinned(dir).expect("dump");
    let ((class, file), (_, deltas)) = dump
        .delta_tables
        .into_iter()
        .max_by_key(|(_, (_, d))| d.len())
        .expect("a table");
    (class, file, deltas)
}

#[test]
fn status_lists_the_scanned_files_and_reports_each_corruption_of_real_maps() {
    let Some((sleep, mut scratch, _)) = with_sleeper_and_pins("status_reports_each_corruption")
    else {
        return;
    };
    let pid = sleep.pid();
    let want = mapped_file_ids(pid);
    assert!(
        want.len() >= 4,
        "sleep, libc, the loader and the vDSO: {want:?}"
    );

    // A page entry: its class changed to one that holds no table of it.
    let dir = scanned(&mut scratch, "page", pid);
    let s = status(&dir).ok().json();
    assert_eq!(status_ids(&s), want, "{s:#}");
    let dump = pinned::dump_pinned(&dir).expect("dump");
    let (key, info) = dump.pages.iter().next().expect("a page");
    let mut key_bytes = key.file_id.to_le_bytes().to_vec();
    key_bytes.extend(key.page.to_le_bytes());
    let mut value = info.first_delta.to_le_bytes().to_vec();
    value.extend(info.num_deltas.to_le_bytes());
    value.extend(23u16.to_le_bytes());
    sys::update_elem(pin(&dir, PAGES).as_fd(), &key_bytes, &value, 0).expect("page write");
    reported(
        &dir,
        "page_without_table",
        Some(&host_id(eim::FileId(key.file_id))),
    );

    // A table: its first delta that names a slot names one past the array.
    let dir = scanned(&mut scratch, "table", pid);
    let (class, file, deltas) = a_table(&dir);
    let index = deltas
        .iter()
        .position(|d| d.unwind_info & eim::abi::DELTA_COMMAND_FLAG == 0)
        .expect("a delta naming a slot") as u32;
    let outer = pin(&dir, &eim::abi::map_name::outer(class));
    let id = sys::lookup_elem(outer.as_fd(), &file.0.to_le_bytes(), 4)
        .expect("outer lookup")
        .expect("the table is published");
    let inner = sys::map_get_fd_by_id(u32::from_le_bytes(id[..4].try_into().expect("4")), 0)
        .expect("the inner array");
    let mut bad = deltas[index as usize].addr_low.to_le_bytes().to_vec();
    bad.extend(0x7fffu16.to_le_bytes());
    sys::update_elem(inner.as_fd(), &index.to_le_bytes(), &bad, 0).expect("delta write");
    reported(&dir, "slot_out_of_range", Some(&host_id(file)));

    // A slot a table names, zeroed.
    let dir = scanned(&mut scratch, "slot", pid);
    let (_, file, deltas) = a_table(&dir);
    let slot = deltas
        .iter()
        .find(|d| d.unwind_info & eim::abi::DELTA_COMMAND_FLAG == 0)
        .expect("a delta naming a slot")
        .unwind_info;
    sys::update_elem(
        pin(&dir, "unwind_info_array").as_fd(),
        &u32::from(slot).to_le_bytes(),
        &[0; 12],
        0,
    )
    .expect("slot write");
    reported(&dir, "zero_slot", Some(&host_id(file)));

    // A table whose pages are gone: an orphan.
    let dir = scanned(&mut scratch, "orphan", pid);
    let (_, file, _) = a_table(&dir);
    let dump = pinned::dump_pinned(&dir).expect("dump");
    let pages = pin(&dir, PAGES);
    for key in dump.pages.keys().filter(|k| k.file_id == file.0) {
        let mut k = key.file_id.to_le_bytes().to_vec();
        k.extend(key.page.to_le_bytes());
        sys::delete_elem(pages.as_fd(), &k).expect("page delete");
    }
    reported(&dir, "orphan_table", Some(&host_id(file)));

    // The process's mappings, out of order: the unwinder's bisection could
    // miss them.
    let dir = scanned(&mut scratch, "processes", pid);
    let s = status(&dir).ok().json();
    assert_eq!(s["processes"], 1, "the scanned sleep: {s:#}");
    let dump = pinned::dump_pinned(&dir).expect("dump");
    let mut entry = dump
        .process_mappings
        .get(&(pid as u32))
        .expect("the sleep's mappings")
        .clone();
    assert!(entry.mappings.len() >= 3, "{entry:?}");
    assert_eq!(s["process_mappings"], entry.mappings.len());
    entry.mappings.reverse();
    sys::update_elem(
        pin(&dir, eim::abi::map_name::PROCESS_MAPPINGS).as_fd(),
        &(pid as u32).to_le_bytes(),
        &eim::abi::Wire::to_bytes(&entry),
        0,
    )
    .expect("process mappings write");
    reported(&dir, "malformed_process_mappings", None);
}

#[test]
fn status_and_lookup_pinned_refuse_a_directory_without_pins() {
    if !kernel_ready("status_and_lookup_pinned_refuse_a_directory_without_pins") {
        return;
    }
    let empty = tempfile::tempdir().expect("temporary directory");
    let d = empty.path().to_str().expect("UTF-8");
    for args in [
        vec!["status", "--pin-dir", d],
        vec![
            "lookup",
            "--pinned",
            "--pin-dir",
            d,
            "/usr/bin/sleep",
            "0x3000",
        ],
    ] {
        let done = run(&args).refused();
        assert!(
            done.stderr.contains(&format!("{d} holds no eim maps")),
            "{args:?}: {}",
            done.stderr
        );
    }
}

#[test]
fn an_owner_starting_under_a_reader_waits_for_it_then_owns_the_directory_even_a_stuck_one() {
    let Some((sleep, mut scratch, _)) = with_sleeper_and_pins("an_owner_starting_under_a_reader")
    else {
        return;
    };
    let dir = scanned(&mut scratch, "readers", sleep.pid());
    let resolved = lock::resolve(&dir).expect("resolve");
    // No owner runs: the reader gets the shared lock.
    let reader = lock::read_lock(&resolved).expect("read lock");
    assert!(!reader.is_owned(), "{reader:?}");
    let (d, pid) = (dir.to_str().expect("UTF-8"), sleep.pid().to_string());
    let args = ["scan", "--backend", "kernel", "--pin-dir", d, "--pid", &pid];
    let mut owner = Running::spawn(&mut eim(&args));
    let held = Duration::from_millis(600);
    std::thread::sleep(held);
    assert!(owner.running(), "the owner did not wait for the reader");
    drop(reader);
    let done = owner.wait().ok();
    assert!(done.ended - done.started >= held);

    // A reader that stays longer than an owner waits (a stuck one): the
    // owner says so and starts anyway; a reader is never why a start is
    // refused.
    let reader = lock::read_lock(&resolved).expect("read lock");
    let started = run(&args).ok();
    assert!(
        started.stderr.contains(&format!(
            "eim: waiting for reader pid {} of {}",
            std::process::id(),
            resolved.display()
        )),
        "{}",
        started.stderr
    );
    assert!(
        started
            .stderr
            .contains("still reading after 3s: starting anyway"),
        "{}",
        started.stderr
    );
    drop(reader);
}
