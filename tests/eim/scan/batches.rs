//! A file is opened once per step. A process that maps more new files
//! than a batch holds: each file is opened once (the batch is loaded
//! part-way through the process when it is full, instead of a file being
//! closed for want of room and opened again), no batch holds more files
//! than its limit, and every file ends up loaded for the process and in
//! its mapping table. A file a process maps three times is opened once.
//! The vDSO is not opened but read from the process's memory, once: it is
//! counted by `vdso_images`, not `mapped_file_opens`, and is one of the
//! batches' files.

use super::*;
use eim::host::scan::Progress;

/// Files per batch: small, so that the process spans several batches.
const BATCH: usize = 2;

/// The sizes of the batches a step loads.
#[derive(Default)]
struct Batches(Vec<usize>);

impl Progress for Batches {
    fn start(&mut self, _: u64) {}
    fn advance(&mut self) {}
    fn loading(&mut self, files: usize) {
        self.0.push(files);
    }
    fn finish(&mut self) {}
}

/// A python3 that imports modules with shared libraries of their own
/// (those this python has) and sleeps.
fn spawn_importer() -> Running {
    let script = "import importlib, time\n\
                  for name in ['ssl', 'ctypes', 'sqlite3', 'decimal', 'lzma', 'bz2', 'zlib',\n\
                  \x20            'readline', 'curses', 'json', 'math', 'select', 'socket']:\n\
                  \x20   try:\n\
                  \x20       importlib.import_module(name)\n\
                  \x20   except ImportError:\n\
                  \x20       pass\n\
                  print('ready', flush=True)\n\
                  time.sleep(300)\n";
    spawn_python_script(script, &[], "python3 did not start")
}

#[test]
fn a_process_with_more_files_than_a_batch_opens_each_file_once() {
    let py = spawn_importer();
    let pid = py.pid();
    let maps = procs::exec_mappings(pid).expect("maps");
    // The vDSO is a file of its own (device and inode 0), read from the
    // process's memory rather than opened: not one of the files opened.
    let distinct: BTreeSet<((u32, u32), u64)> = maps.loadable().map(|m| (m.dev, m.inode)).collect();
    let on_disk = distinct.len() - usize::from(maps.vdso.is_some());
    assert!(
        distinct.len() > 2 * BATCH,
        "python3 maps only {} files: not enough for three batches",
        distinct.len()
    );
    let expected = expected_ids(pid);

    let mut host = Host::new(
        SimMaps::new(SimConfig::default()).expect("maps"),
        HostConfig {
            only: Some(BTreeSet::from([pid])),
            batch_files: BATCH,
            ..HostConfig::default()
        },
    );
    let mut batches = Batches::default();
    host.step(&AtomicBool::new(false), &mut batches)
        .expect("step");

    assert_eq!(
        host.mapped_file_opens(),
        on_disk as u64,
        "each of the {on_disk} files on disk opened once (batches of {BATCH}: {:?})",
        batches.0
    );
    assert_eq!(host.vdso_images(), u64::from(maps.vdso.is_some()));
    assert!(
        batches.0.iter().all(|&n| n <= BATCH),
        "a batch held more than {BATCH} files: {:?}",
        batches.0
    );
    assert_eq!(batches.0.iter().sum::<usize>(), distinct.len());
    let held = host.held_by(pid).expect("python3 is followed").clone();
    let want: BTreeSet<FileId> = expected.keys().copied().collect();
    assert_eq!(held, want, "every file loaded for the process, once");
    assert!(host.problems().is_empty(), "{:?}", host.problems());
    // Written after its read, with every mapping (each file resolved).
    let entry = host
        .with_backend(|m| m.process(pid as u32))
        .expect("an eim_process_mappings entry");
    assert_eq!(entry.mappings.len(), maps.loadable().count());
    let named: BTreeSet<FileId> = entry.mappings.iter().map(|m| FileId(m.file_id)).collect();
    assert_eq!(named, want);
    for id in &want {
        assert!(
            in_maps(&host, *id),
            "{id} ({}) not in the maps",
            expected[id].display()
        );
    }

    // Nothing new: the next step opens nothing.
    step(&mut host);
    assert_eq!(host.mapped_file_opens(), on_disk as u64);
    assert_eq!(host.vdso_images(), u64::from(maps.vdso.is_some()));
    assert_eq!(host.last_step().taken, 0);
    py.stop();
}

/// A python3 that maps its own executable twice more, read and execute,
/// and sleeps: three executable mappings of one file.
fn spawn_mapping_itself_twice() -> Running {
    let script = "import mmap, sys, time\n\
                  keep = []\n\
                  for _ in range(2):\n\
                  \x20   with open(sys.executable, 'rb') as f:\n\
                  \x20       keep.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC))\n\
                  print('ready', flush=True)\n\
                  time.sleep(300)\n";
    spawn_python_script(script, &[], "python3 could not map itself")
}

#[test]
fn a_file_mapped_three_times_by_a_process_is_opened_once() {
    let py = spawn_mapping_itself_twice();
    let pid = py.pid();
    let maps = procs::exec_mappings(pid).expect("maps");
    // The vDSO is a file of its own (device and inode 0), read from the
    // process's memory rather than opened: not one of the files opened.
    let distinct: BTreeSet<((u32, u32), u64)> = maps.loadable().map(|m| (m.dev, m.inode)).collect();
    let on_disk = distinct.len() - usize::from(maps.vdso.is_some());
    let most = distinct
        .iter()
        .map(|f| maps.files.iter().filter(|m| (m.dev, m.inode) == *f).count())
        .max();
    assert!(
        most >= Some(3),
        "no file mapped three times: {:?}",
        maps.files
    );

    let mut host = host_of(&[pid], None);
    step(&mut host);
    assert_eq!(
        host.mapped_file_opens(),
        on_disk as u64,
        "each of {on_disk} files on disk opened once, for {} mappings",
        maps.files.len()
    );
    assert_eq!(host.vdso_images(), u64::from(maps.vdso.is_some()));
    let want: BTreeSet<FileId> = expected_ids(pid).keys().copied().collect();
    assert_eq!(host.held_by(pid), Some(&want));
    // Every mapping of it in the table, each with its own bias.
    let entry = host
        .with_backend(|m| m.process(pid as u32))
        .expect("an eim_process_mappings entry");
    assert_eq!(entry.mappings.len(), maps.loadable().count());
    assert!(entry.is_well_formed());
    py.stop();
}
