//! Crash anywhere, kernel edition (issue 13, point 5): `eim watch --backend
//! kernel` killed with SIGKILL at seeded random moments (while it starts,
//! reconciles, loads, or idles), over a changing set of processes, and
//! started again each time.
//!
//! * After every restart the maps reach exactly what a fresh scan of the
//!   same processes writes (the fresh scan on a pin directory of its own),
//!   compared through a full dump with the slot numbers resolved to the
//!   rules they hold (a fresh run numbers its slots from 0, a restart
//!   keeps the old numbers);
//! * every restart over pinned entries says it reconciled them and none
//!   falls back to cleaning;
//! * all along, a reader polls the pinned page map for every page of the
//!   files a process that never exits maps: once they were loaded, not one
//!   lookup may miss (no unwinding gap, however the daemon died).
//!
//! `EIM_CRASH_SEED` picks another seed; `EIM_CRASH_KILLS` another count.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use eim::abi::{
    OffsetRange, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo, Wire, DELTA_COMMAND_FLAG,
};
use eim::bpf::Dump;
use eim::FileId;

use super::*;

const DEFAULT_SEED: u64 = 13;
const DEFAULT_KILLS: usize = 50;
/// How long a restarted watch may take to reach a fresh scan's maps.
const CONVERGE_WITHIN: Duration = Duration::from_secs(20);

/// SplitMix64: a seed means the same kills everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A process that maps `needle` once it is up.
fn process(cmd: &mut Command, needle: &str) -> Running {
    let mut p = Running::spawn(cmd);
    let started = Instant::now();
    let maps = format!("/proc/{}/maps", p.pid());
    while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains(needle)) {
        assert!(
            p.running() && started.elapsed() < LIMIT,
            "{cmd:?} never mapped {needle}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    p
}

/// The processes the watches follow: `sleep` (always followed: its files
/// must never become unresolvable) and others mapping other libraries,
/// those this machine has.
fn processes() -> Vec<Running> {
    let mut all = vec![process(Command::new("sleep").arg("600"), "libc.so.6")];
    // `; :` keeps bash from exec'ing sleep: bash itself stays.
    all.push(process(
        Command::new("bash").args(["-c", "sleep 600; :"]),
        "libc.so.6",
    ));
    if Path::new("/usr/bin/python3").exists() {
        all.push(process(
            Command::new("/usr/bin/python3")
                .args(["-c", "import ctypes, decimal, json, time; time.sleep(600)"]),
            "libc.so.6",
        ));
    }
    if Path::new("/usr/bin/perl").exists() {
        all.push(process(
            Command::new("/usr/bin/perl").args(["-MPOSIX", "-e", "sleep 600"]),
            "libc.so.6",
        ));
    }
    all
}

/// A delta's low address bits and its rule (`Err`: a command, or a slot
/// past the array).
type ResolvedDelta = (u16, Result<UnwindInfo, u16>);

/// What the unwinder can reach, with slot numbers resolved: pages as they
/// are, each published table with every slot index replaced by the rule
/// the slot holds (commands as they are), the interpreter offsets. Slots
/// no table references are a cache, not state.
#[derive(Debug, PartialEq, Eq)]
struct Reachable {
    pages: BTreeMap<StackDeltaPageKey, StackDeltaPageInfo>,
    tables: BTreeMap<(u16, FileId), Vec<ResolvedDelta>>,
    offsets: BTreeMap<FileId, OffsetRange>,
}

impl Reachable {
    fn of(dump: &Dump) -> Self {
        let tables = dump
            .delta_tables
            .iter()
            .map(|(key, (_, deltas))| {
                let resolved = deltas
                    .iter()
                    .map(|d| {
                        let target = if d.unwind_info & DELTA_COMMAND_FLAG != 0 {
                            Err(d.unwind_info)
                        } else {
                            // A slot past the array reads as a missing rule.
                            dump.unwind_infos
                                .get(usize::from(d.unwind_info))
                                .copied()
                                .ok_or(d.unwind_info)
                        };
                        (d.addr_low, target)
                    })
                    .collect();
                (*key, resolved)
            })
            .collect();
        Self {
            pages: dump.pages.clone(),
            tables,
            offsets: dump.interpreter_offsets.clone(),
        }
    }

    /// Every page key of these files.
    fn pages_of(&self, files: &BTreeSet<u64>) -> Vec<StackDeltaPageKey> {
        self.pages
            .keys()
            .filter(|k| files.contains(&k.file_id))
            .copied()
            .collect()
    }

    fn files(&self) -> BTreeSet<u64> {
        self.pages.keys().map(|k| k.file_id).collect()
    }

    /// What differs, in a few lines.
    fn diff(&self, other: &Self) -> String {
        let count = |r: &Self| (r.pages.len(), r.tables.len(), r.offsets.len());
        let mut out = format!(
            "pages/tables/offsets {:?} vs {:?}",
            count(self),
            count(other)
        );
        let (mine, theirs) = (self.files(), other.files());
        for f in mine.symmetric_difference(&theirs).take(8) {
            out.push_str(&format!(
                "\n  file {f:016x} only in the {}",
                if mine.contains(f) { "watch" } else { "scan" }
            ));
        }
        for (key, table) in &self.tables {
            if other.tables.get(key).is_some_and(|t| t != table) {
                out.push_str(&format!("\n  table {key:?} differs"));
            }
        }
        out
    }
}

/// The reader: polls every given page key of the pinned page map until
/// stopped, counting lookups and misses (with the first few missed keys).
struct Reader {
    stop: Arc<AtomicBool>,
    lookups: Arc<AtomicU64>,
    misses: Arc<Mutex<Vec<(usize, StackDeltaPageKey)>>>,
    iteration: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    fn start(dir: &Path, keys: Vec<StackDeltaPageKey>) -> Self {
        let map = sys::obj_get(&dir.join(PAGES)).expect("the pinned page map");
        let stop = Arc::new(AtomicBool::new(false));
        let lookups = Arc::new(AtomicU64::new(0));
        let misses = Arc::new(Mutex::new(Vec::new()));
        let iteration = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, lookups, misses, iteration) = (
                stop.clone(),
                lookups.clone(),
                misses.clone(),
                iteration.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for key in &keys {
                        let found = sys::lookup_elem(
                            map.as_fd(),
                            &key.to_bytes(),
                            StackDeltaPageInfo::SIZE,
                        )
                        .expect("lookup in the pinned page map");
                        lookups.fetch_add(1, Ordering::Relaxed);
                        if found.is_none() {
                            let mut m = misses.lock().expect("misses");
                            if m.len() < 16 {
                                m.push((iteration.load(Ordering::Relaxed) as usize, *key));
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        };
        Self {
            stop,
            lookups,
            misses,
            iteration,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (u64, Vec<(usize, StackDeltaPageKey)>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("the reader");
        }
        let misses = self.misses.lock().expect("misses").clone();
        (self.lookups.load(Ordering::Relaxed), misses)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch_args(dir: &Path, pids: &[i32]) -> Vec<String> {
    let mut args: Vec<String> = [
        "watch",
        "--backend",
        "kernel",
        "--pin-dir",
        dir.to_str().expect("UTF-8"),
        "--interval",
        "50ms",
    ]
    .map(String::from)
    .to_vec();
    for pid in pids {
        args.extend(["--pid".to_string(), pid.to_string()]);
    }
    args
}

/// A watch whose stderr goes to a file, readable while it runs.
struct Watch {
    child: Child,
    log: PathBuf,
}

/// What a killed watch left.
struct Killed {
    status: ExitStatus,
    stderr: String,
}

impl Watch {
    fn spawn(dir: &Path, pids: &[i32], log: PathBuf) -> Self {
        let args = watch_args(dir, pids);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let file = std::fs::File::create(&log).expect("the watch's log");
        let child = eim(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("starting eim watch");
        Self { child, log }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, and what the run had said by then.
    fn kill(mut self) -> Killed {
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait for the watch");
        Killed {
            status,
            stderr: self.stderr(),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a fresh scan of `pids` writes: on a pin directory of its own,
/// emptied first, so that nothing is adopted.
fn fresh_scan(dir: &Path, pids: &[i32]) -> Reachable {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            // The kernel's own `maps.debug` and `progs.debug` stay.
            if path.extension().is_some_and(|e| e == "debug") {
                continue;
            }
            std::fs::remove_file(&path).unwrap_or_else(|e| panic!("unpin {}: {e}", path.display()));
        }
    }
    let mut args = vec![
        "scan".to_string(),
        "--backend".into(),
        "kernel".into(),
        "--pin-dir".into(),
        dir.to_str().expect("UTF-8").into(),
    ];
    for pid in pids {
        args.extend(["--pid".to_string(), pid.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = run(&args).ok();
    assert!(
        !done.stderr.contains("reconciled"),
        "the fresh scan adopted something: {}",
        done.stderr
    );
    Reachable::of(&pinned::dump_pinned(dir).expect("dump the fresh scan's pins"))
}

/// Waits for the restarted watch to say it reconciled the maps, then
/// polls the pins until they are `want`; what differs if they never are.
fn converge(dir: &Path, want: &Reachable, run: &mut Watch) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let reconciled = run.stderr().contains("maps reconciled");
        if reconciled {
            let now = Reachable::of(&pinned::dump_pinned(dir).map_err(|e| e.to_string())?);
            if now == *want {
                return Ok(());
            }
            if started.elapsed() > CONVERGE_WITHIN {
                return Err(now.diff(want));
            }
        }
        if !run.running() {
            return Err("the watch exited".into());
        }
        if started.elapsed() > CONVERGE_WITHIN {
            return Err("it never said it reconciled the maps".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_watch_killed_anywhere_restarts_to_a_fresh_scans_maps_and_never_loses_a_mapped_file() {
    if !kernel_ready(
        "a_watch_killed_anywhere_restarts_to_a_fresh_scans_maps_and_never_loses_a_mapped_file",
    ) {
        return;
    }
    let seed = env_or("EIM_CRASH_SEED", DEFAULT_SEED);
    let kills = env_or("EIM_CRASH_KILLS", DEFAULT_KILLS);
    let mut rng = Rng(seed);
    let procs = processes();
    let pids: Vec<i32> = procs.iter().map(Running::pid).collect();
    let mut scratch = Scratch::new();
    let dir = scratch.mount_point("pins");
    let fresh_dir = scratch.mount_point("fresh");
    // Both directories get a bpffs, mounted by a first scan of sleep.
    for d in [&dir, &fresh_dir] {
        scan(d, pids[0], &["--mount-bpffs"]).ok();
    }
    let mut fresh: BTreeMap<Vec<i32>, Reachable> = BTreeMap::new();
    // The files of the process every watch follows: after the first
    // convergence, a reader must find each of their pages at every moment.
    let anchor = fresh_scan(&fresh_dir, &pids[..1]);
    let anchor_files = anchor.files();
    assert!(!anchor_files.is_empty(), "sleep's files loaded nothing");
    let mut reader: Option<Reader> = None;
    let (mut before_reconciled, mut after_reconciled, mut restarts_reconciled) = (0, 0, 0);
    let started = Instant::now();
    for i in 0..kills {
        // The processes this round follows: sleep and a seeded subset.
        let mut followed = vec![pids[0]];
        followed.extend(pids[1..].iter().copied().filter(|_| rng.below(2) == 0));
        // Half the kills early (loading the program, the walk, the
        // reconcile, the first step), a quarter later, and a quarter
        // after the maps were reconciled (steps, idling): counted from
        // the moment the watch says so, since how long a start takes
        // depends on the machine's load, not on the seed.
        let (delay, after_reconcile) = match rng.below(4) {
            0 => (rng.below(40), false),
            1 => (40 + rng.below(160), false),
            2 => (200 + rng.below(300), false),
            _ => (rng.below(700), true),
        };
        let mut victim = Watch::spawn(&dir, &followed, scratch.dir.path().join("victim.log"));
        if after_reconcile {
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline
                && victim.running()
                && !victim.stderr().contains("maps reconciled")
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(Duration::from_millis(delay));
        let killed = victim.kill();
        assert_eq!(
            killed.status.signal(),
            Some(libc::SIGKILL),
            "round {i}: the watch ended before the kill: {}",
            killed.stderr
        );
        if killed.stderr.contains("maps reconciled") {
            after_reconciled += 1;
        } else {
            before_reconciled += 1;
        }
        assert!(
            !killed.stderr.contains("not reconciled"),
            "round {i}: cleaned instead of reconciling: {}",
            killed.stderr
        );
        // The restart over what the kill left, checked against a fresh
        // scan of the same processes.
        let want = fresh
            .entry(followed.clone())
            .or_insert_with(|| fresh_scan(&fresh_dir, &followed));
        let mut restarted = Watch::spawn(&dir, &followed, scratch.dir.path().join("restart.log"));
        if let Err(diff) = converge(&dir, want, &mut restarted) {
            let done = restarted.kill();
            panic!(
                "round {i} (seed {seed}, killed after {delay} ms, following {followed:?}): \
                 the restarted watch never reached a fresh scan's maps: {diff}\n{}",
                done.stderr
            );
        }
        let done = restarted.kill();
        assert!(
            !done.stderr.contains("not reconciled"),
            "round {i}: the restart cleaned instead of reconciling: {}",
            done.stderr
        );
        if done.stderr.contains("maps reconciled") {
            restarts_reconciled += 1;
        }
        match &reader {
            Some(r) => r.iteration.store(i as u64, Ordering::Relaxed),
            None => reader = Some(Reader::start(&dir, anchor.pages_of(&anchor_files))),
        }
    }
    let (lookups, misses) = reader.take().expect("a reader").finish();
    eprintln!(
        "seed {seed}: {kills} kills ({before_reconciled} before the maps were reconciled, \
         {after_reconciled} after), {restarts_reconciled} restarts reconciled, \
         {lookups} page lookups of sleep's files, {} missed, {:.1} s",
        misses.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        misses.is_empty(),
        "a file that stayed mapped was unresolvable (round, key): {misses:?}"
    );
    assert!(lookups > 0, "the reader never looked anything up");
    assert!(
        before_reconciled > 0 && after_reconciled > 0,
        "the kills missed a phase: {before_reconciled} before, {after_reconciled} after"
    );
    assert_eq!(restarts_reconciled, kills, "every restart reconciled");
    drop(procs);
}
