//! eim embedded in a profiler, the way a Rust profiler on aya uses it.
//!
//! The profiler owns its process events (here: it starts `sleep`, sees its
//! executable mappings, then kills it) and hands the files to eim's
//! [`ExecutableInfoManager`], which keeps their unwind tables in BPF maps
//! pinned by name in a directory ([`KernelMaps`] with
//! [`KernelConfig::pin_dir`]). The profiler's own BPF program, loaded with
//! aya, opens those maps by path: this example does what its loader would,
//! `MapData::from_pin`, and reads the page entries of the files it loaded.
//!
//! ```text
//! sudo cargo run --example profiler                 # pins in /sys/fs/bpf/eim-example-PID, removed at the end
//! sudo cargo run --example profiler -- /sys/fs/bpf/my-profiler   # pins kept there
//! ```
//!
//! It needs CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (root has them), and a
//! pin directory under `/sys/fs/bpf` (eim creates it; it mounts a bpffs
//! elsewhere only when asked, [`KernelConfig::mount_bpffs`]).
//!
//! Without [`KernelConfig::adopt_pins`], pins an earlier run left are
//! cleaned at start: this profiler starts from empty maps. `eim watch`
//! instead reconciles them (a warm restart, `eim::host::scan::Host`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, Context as _};
use eim::abi::{map_name, StackDeltaPageInfo, StackDeltaPageKey, Wire as _};
use eim::bpf::aya::maps::{HashMap, Map, MapData};
use eim::bpf::{KernelConfig, KernelMaps};
use eim::host::open::{open_mapping, OpenStrategy};
use eim::host::procs::exec_mappings;
use eim::{ElfFileRef, ElfProvider, ExecutableInfoManager, FileId, Tracers};

/// The kernel's page map, as the profiler's BPF program declares it:
/// `StackDeltaPageKey` (16 bytes) to `StackDeltaPageInfo` (8 bytes), read as
/// bytes and decoded with eim's wire layout.
type PageMap = HashMap<MapData, [u8; 16], [u8; 8]>;

/// What the example did, for the caller to print or check.
#[derive(Debug, Default)]
pub struct Report {
    /// Each file the child mapped and eim loaded: its id, path and the
    /// page entries the pinned page map holds for it.
    pub loaded: Vec<(FileId, PathBuf, usize)>,
    /// The first page entry of the child's executable, read back by key.
    pub first_page: Option<(StackDeltaPageKey, StackDeltaPageInfo)>,
    /// Page entries of those files left once the child exited and the
    /// profiler released them (0: eim removed them all).
    pub pages_after_exit: usize,
}

/// The child is killed if the example stops early.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The executable files `pid` maps, opened as it maps them (its
/// `/proc/PID/map_files` entries, checked to be the mapped file), by file
/// id. A profiler with its own mapping events would open the same way.
fn files_of(pid: i32) -> anyhow::Result<BTreeMap<FileId, (PathBuf, ElfFileRef)>> {
    let mappings = exec_mappings(pid).with_context(|| format!("reading the mappings of {pid}"))?;
    let mut files = BTreeMap::new();
    for mapping in mappings.files {
        let opened = open_mapping(pid, &mapping, OpenStrategy::MapFilesThenRoot)
            .with_context(|| format!("opening {}", mapping.path.display()))?;
        let elf = ElfFileRef::new(&mapping.path).with_file(opened.file);
        let id = elf
            .file_id()
            .with_context(|| format!("the file id of {}", mapping.path.display()))?
            .host();
        files.entry(id).or_insert((mapping.path, elf));
    }
    Ok(files)
}

/// Waits until `pid`'s executable mappings stop changing (the dynamic
/// loader maps the C library after the exec `spawn` waited for, within a
/// millisecond or so): the same for 60 ms.
fn settle(pid: i32) -> anyhow::Result<()> {
    let paths = || -> anyhow::Result<Vec<PathBuf>> {
        let m = exec_mappings(pid).with_context(|| format!("reading the mappings of {pid}"))?;
        Ok(m.files.into_iter().map(|f| f.path).collect())
    };
    let mut last = paths()?;
    let mut unchanged = 0;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let now = paths()?;
        unchanged = if now == last { unchanged + 1 } else { 0 };
        if unchanged == 3 && !now.is_empty() {
            return Ok(());
        }
        last = now;
    }
    bail!("the mappings of {pid} did not settle in 2 s: {last:?}")
}

/// The pinned page map, opened by name as the profiler's BPF loader opens
/// it.
fn open_page_map(pin_dir: &Path) -> anyhow::Result<PageMap> {
    let path = pin_dir.join(map_name::PAGES);
    let data =
        MapData::from_pin(&path).with_context(|| format!("opening the pin {}", path.display()))?;
    PageMap::try_from(Map::HashMap(data))
        .with_context(|| format!("{} as a hash map of pages", path.display()))
}

/// Page entries per file id in the pinned page map.
fn pages_by_file(pin_dir: &Path) -> anyhow::Result<BTreeMap<FileId, usize>> {
    let pages = open_page_map(pin_dir)?;
    let mut by_file = BTreeMap::new();
    // The map holds at most its capacity; the bound keeps a map that
    // changes under the walk from walking on.
    for key in pages.keys().take(KernelConfig::default().pages as usize) {
        let key = key.context("walking the page map")?;
        let key = StackDeltaPageKey::read(&key).context("a page key of 16 bytes")?;
        *by_file.entry(FileId(key.file_id)).or_default() += 1;
    }
    Ok(by_file)
}

/// The first page of `file` in the pinned page map, read back by its key.
fn first_page(
    pin_dir: &Path,
    file: FileId,
) -> anyhow::Result<Option<(StackDeltaPageKey, StackDeltaPageInfo)>> {
    let pages = open_page_map(pin_dir)?;
    let mut first: Option<StackDeltaPageKey> = None;
    for key in pages.keys().take(KernelConfig::default().pages as usize) {
        let key = key.context("walking the page map")?;
        let key = StackDeltaPageKey::read(&key).context("a page key of 16 bytes")?;
        if key.file_id == file.0 && first.is_none_or(|f| key.page < f.page) {
            first = Some(key);
        }
    }
    let Some(key) = first else { return Ok(None) };
    let value = pages
        .get(&bytes16(&key), 0)
        .with_context(|| format!("reading the page {:#x} of {file}", key.page))?;
    let info = StackDeltaPageInfo::read(&value).context("a page entry of 8 bytes")?;
    Ok(Some((key, info)))
}

fn bytes16(key: &StackDeltaPageKey) -> [u8; 16] {
    let mut out = [0; 16];
    key.write(&mut out);
    out
}

/// Runs the example over maps pinned in `pin_dir`, writing what happens to
/// `out`.
pub fn run(pin_dir: &Path, out: &mut impl std::io::Write) -> anyhow::Result<Report> {
    let maps = KernelMaps::with_config(KernelConfig {
        pin_dir: Some(pin_dir.to_path_buf()),
        ..KernelConfig::default()
    })
    .with_context(|| format!("creating the maps pinned in {}", pin_dir.display()))?;
    // Every interpreter tracer: a profiler enables the ones it has.
    let manager = ExecutableInfoManager::new(ElfProvider::new(), maps, Tracers(u32::MAX));
    writeln!(out, "maps pinned in {}", pin_dir.display())?;

    // A process starts: the profiler hands eim each file it maps, once
    // per process (eim counts the references).
    let child = Killed(
        Command::new("sleep")
            .arg("60")
            .spawn()
            .context("starting sleep")?,
    );
    let pid = i32::try_from(child.0.id()).context("a pid that fits an i32")?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).context("the child's executable")?;
    settle(pid)?;
    let files = files_of(pid)?;
    let mut held = Vec::new();
    for (&id, (path, elf)) in &files {
        match manager.add_or_inc_ref(id, elf) {
            Ok(info) => {
                // What the profiler's other tracers need from the file: the
                // C library's thread-specific data layouts, an
                // interpreter's version and offsets.
                let mut facts = Vec::new();
                if info.libc.tsd.is_some() {
                    facts.push("a TSD layout".to_owned());
                }
                if info.libc.dtv.is_some() {
                    facts.push("a DTV layout".to_owned());
                }
                facts.extend(
                    info.interpreters
                        .iter()
                        .map(|m| format!("{} loader", m.loader)),
                );
                writeln!(
                    out,
                    "process {pid}: loaded {id} {}{}",
                    path.display(),
                    if facts.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", facts.join(", "))
                    }
                )?;
                held.push(id);
            }
            // A profiler logs and goes on: the file is unwound without
            // tables, or retried at its next mapping.
            Err(e) => writeln!(out, "process {pid}: not loaded {}: {e}", path.display())?,
        }
    }

    // The profiler's BPF program sees them through the pins, by name.
    let pages = pages_by_file(pin_dir)?;
    let mut report = Report::default();
    for id in &held {
        let (path, _) = &files[id];
        let n = pages.get(id).copied().unwrap_or(0);
        writeln!(
            out,
            "pinned {}: {n} page entries for {id} {}",
            map_name::PAGES,
            path.display()
        )?;
        report.loaded.push((*id, path.clone(), n));
    }
    let exe_id = files
        .iter()
        .find(|(_, (path, _))| *path == exe)
        .map(|(id, _)| *id)
        .with_context(|| format!("{} among the child's files", exe.display()))?;
    report.first_page = first_page(pin_dir, exe_id)?;
    if let Some((key, info)) = &report.first_page {
        writeln!(
            out,
            "first page {:#x} of {}: deltas {}..{} of the class {} table",
            key.page,
            exe.display(),
            info.first_delta,
            u64::from(info.first_delta) + u64::from(info.num_deltas),
            info.map_id
        )?;
    }

    // The process exits: the profiler releases its files, and eim removes
    // what no other process holds.
    drop(child);
    for id in held {
        manager
            .remove_or_dec_ref(id)
            .with_context(|| format!("releasing {id}"))?;
    }
    let after = pages_by_file(pin_dir)?;
    report.pages_after_exit = report
        .loaded
        .iter()
        .map(|(id, _, _)| after.get(id).copied().unwrap_or(0))
        .sum();
    writeln!(
        out,
        "process {pid} exited: {} page entries of its files left",
        report.pages_after_exit
    )?;
    Ok(report)
}

/// Removes the pins in `dir` and the directory (a bpffs directory holds
/// pins only; unlinking a pin drops the map once nothing else holds it),
/// then the directory's lock file, which eim leaves for the next owner.
pub fn remove_pins(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        std::fs::remove_file(entry?.path())?;
    }
    std::fs::remove_dir(dir)?;
    let lock_file = Path::new(eim::bpf::lock::LOCK_DIR).join(eim::bpf::lock::lock_name(dir));
    match std::fs::remove_file(lock_file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn main() -> anyhow::Result<()> {
    let given = std::env::args_os().nth(1).map(PathBuf::from);
    let pin_dir = given.clone().unwrap_or_else(|| {
        PathBuf::from(format!("/sys/fs/bpf/eim-example-{}", std::process::id()))
    });
    let mut out = std::io::stdout().lock();
    let result = run(&pin_dir, &mut out);
    if given.is_none() {
        remove_pins(&pin_dir).with_context(|| format!("removing {}", pin_dir.display()))?;
    }
    let report = result?;
    if report.pages_after_exit != 0 {
        bail!(
            "{} page entries outlived their files",
            report.pages_after_exit
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim::sim::{SimConfig, SimMaps};

    /// Removes the test's pins however it ends.
    struct Pins(PathBuf);

    impl Drop for Pins {
        fn drop(&mut self) {
            if self.0.exists() {
                let _ = remove_pins(&self.0);
            }
        }
    }

    #[test]
    fn a_readers_view_of_the_pins_follows_the_profilers_process_events() {
        if !eim::bpf::probe::require_bpf("examples/profiler") {
            return;
        }
        let pins = Pins(PathBuf::from(format!(
            "/sys/fs/bpf/eim-example-test-{}",
            std::process::id()
        )));
        let mut said = Vec::new();
        let report = run(&pins.0, &mut said).expect("the example runs");
        let said = String::from_utf8_lossy(&said);

        // The child's executable and C library, at least.
        let names: Vec<String> = report
            .loaded
            .iter()
            .filter_map(|(_, p, _)| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect();
        assert!(names.iter().any(|n| n == "sleep"), "{said}");
        assert!(names.iter().any(|n| n.starts_with("libc.so")), "{said}");

        // What the reader saw through the pins is what the simulated kernel
        // holds for the same files (another backend, the same book).
        let sim = ExecutableInfoManager::new(
            ElfProvider::new(),
            SimMaps::new(SimConfig::default()).expect("sim maps"),
            Tracers(u32::MAX),
        );
        for (id, path, pages) in &report.loaded {
            sim.add_or_inc_ref(*id, &ElfFileRef::new(path))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let expected = sim.with_backend(|m| {
                m.pages()
                    .keys()
                    .filter(|k| FileId(k.file_id) == *id)
                    .count()
            });
            assert!(expected > 0, "{}", path.display());
            assert_eq!(*pages, expected, "{}: {said}", path.display());
        }
        let (key, info) = report.first_page.expect("a first page of sleep");
        let sim_info = sim.with_backend(|m| m.page(&key));
        assert_eq!(
            sim_info.map(|i| (i.num_deltas, i.map_id)),
            Some((info.num_deltas, info.map_id))
        );

        // Released, nothing of the files is left, as an owner-less reader
        // of the pins (eim's own) sees them too.
        assert_eq!(report.pages_after_exit, 0, "{said}");
        let dump = eim::bpf::pinned::dump_pinned(&pins.0).expect("the pins, read");
        assert!(dump.pages.is_empty(), "{:?}", dump.pages);
        assert!(dump.delta_tables.is_empty());
    }
}
