//! `eim demo`: the manager's whole life cycle on synthetic files and a
//! simulated kernel, with a report of what ended up in the maps.
//!
//! Until `eim scan` reads real executables, this is how a user sees the
//! manager work: files loaded once however many processes map them, tables
//! in size classes, shared unwind-info slots, and memory given back as
//! processes exit. The kernel side of the report is read from the simulated
//! maps themselves (what a BPF program would find), and checked against the
//! manager's own book.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;

use eim::abi::{self, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo, Wire};
use eim::manager::StateView;
use eim::metrics::Summary;
use eim::provider::MemoryProvider;
use eim::report;
use eim::report::metrics::Metric;
use eim::sim::{SimConfig, SimMaps};
use eim::{ExecutableInfoManager, FileId, Tracers};

use crate::synth::{self, Rng, SynthFile};
use crate::table::{grouped, Align, Table};

/// Options of `eim demo`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Synthetic executables to generate.
    #[arg(long, default_value_t = 32)]
    pub files: usize,
    /// Simulated processes; each maps a random subset of the files.
    #[arg(long, default_value_t = 64)]
    pub processes: usize,
    /// Seed of everything random: the same seed gives the same report.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as one JSON document.
    #[arg(long)]
    pub json: bool,
}

/// The whole report. Everything but `timing` is a function of the
/// arguments, so two runs with the same seed can be compared by dropping it.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub files_generated: usize,
    pub deltas_generated: u64,
    pub processes: Processes,
    pub after_load: Snapshot,
    pub after_exit: Snapshot,
    /// Upstream's five metrics, read once at the end.
    pub metrics: Vec<Metric>,
    /// Whether the manager's book and the simulated maps agree on files,
    /// pages, tables per class and unwind slots (and no inner map leaked).
    pub book_matches_kernel: bool,
    pub timing: Timing,
}

#[derive(Clone, Debug, Serialize)]
pub struct Processes {
    pub started: usize,
    pub exited: usize,
    pub running: usize,
    /// `add_or_inc_ref` calls that succeeded.
    pub mappings: u64,
    pub load_errors: u64,
    /// `remove_or_dec_ref` calls of exiting processes.
    pub releases: u64,
    pub release_errors: u64,
}

/// The state at one point: the manager's view and what the maps hold.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// References held (sum of the files' reference counts).
    pub references: u64,
    /// Files known to the manager, with or without a table.
    pub files_known: usize,
    /// Deltas extracted for the files known.
    pub extracted_deltas: u64,
    /// Files with a published delta table (outer map entries).
    pub files_with_table: usize,
    /// Inner delta arrays alive in the kernel.
    pub live_inner_maps: usize,
    /// Kernel deltas (sum of the page entries' counts; merged pairs share one).
    pub kernel_deltas: u64,
    pub page_entries: usize,
    /// `unwind_info_array` slots holding a rule.
    pub unwind_infos: usize,
    /// Size classes with at least one inner map.
    pub size_classes: Vec<ClassUsage>,
    pub memory: Memory,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClassUsage {
    pub class: u16,
    pub entries_per_map: u32,
    pub inner_maps: usize,
    pub bytes: u64,
}

/// Bytes of kernel memory holding file data (map overhead not counted).
#[derive(Clone, Debug, Serialize)]
pub struct Memory {
    /// Inner delta arrays: 2^class entries of 4 bytes each.
    pub delta_tables: u64,
    /// `stack_delta_page_to_info`: a 16-byte key and an 8-byte value per entry.
    pub page_map: u64,
    /// `unwind_info_array` slots in use, 12 bytes each.
    pub unwind_infos: u64,
    pub total: u64,
}

/// Wall-clock times; kept apart because they differ from run to run.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    pub generate_ms: f64,
    pub load_ms: f64,
    pub exit_ms: f64,
}

type Manager = ExecutableInfoManager<MemoryProvider, SimMaps>;

fn millis(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Runs the demo and returns its report.
pub fn run(args: &DemoArgs) -> anyhow::Result<Report> {
    let started = Instant::now();
    let files = synth::files(args.files, args.seed);
    let generate_ms = millis(started);
    let deltas_generated = files.iter().map(|f| f.data.len() as u64).sum();
    tracing::info!(
        files = files.len(),
        deltas = deltas_generated,
        ms = generate_ms,
        "generated"
    );

    let provider = MemoryProvider::new();
    for f in &files {
        tracing::debug!(name = %f.name, id = %f.id, deltas = f.data.len(), popularity = f.popularity, "file");
        provider.insert(f.id, f.data.clone());
    }
    let maps = SimMaps::new(SimConfig::default()).context("creating the simulated maps")?;
    let manager: Manager = ExecutableInfoManager::new(provider, maps, Tracers::none());

    // A separate stream, so the file shapes do not depend on the process count.
    let mut rng = Rng::new(args.seed ^ 0x0070_7263_7373_6573);
    let mapped_by: Vec<Vec<usize>> = (0..args.processes)
        .map(|_| choose_files(&mut rng, &files))
        .collect();

    let mut processes = Processes {
        started: args.processes,
        exited: 0,
        running: args.processes,
        mappings: 0,
        load_errors: 0,
        releases: 0,
        release_errors: 0,
    };
    let started = Instant::now();
    let mut held: Vec<Vec<FileId>> = Vec::with_capacity(mapped_by.len());
    for (pid, wanted) in mapped_by.iter().enumerate() {
        let mut ok = Vec::with_capacity(wanted.len());
        for &i in wanted {
            let f = &files[i];
            match manager.add_or_inc_ref(f.id, &f.id) {
                Ok(_) => {
                    processes.mappings += 1;
                    ok.push(f.id);
                }
                Err(e) => {
                    processes.load_errors += 1;
                    tracing::warn!(pid, file = %f.name, "load failed: {e}");
                }
            }
        }
        held.push(ok);
    }
    let load_ms = millis(started);
    tracing::info!(mappings = processes.mappings, ms = load_ms, "loaded");
    let after_load = snapshot(&manager, &files);

    let exiting = pick_half(&mut rng, args.processes);
    let started = Instant::now();
    for &pid in &exiting {
        for &id in &held[pid] {
            processes.releases += 1;
            if let Err(e) = manager.remove_or_dec_ref(id) {
                processes.release_errors += 1;
                tracing::warn!(pid, %id, "release failed: {e}");
            }
        }
    }
    let exit_ms = millis(started);
    processes.exited = exiting.len();
    processes.running = args.processes - exiting.len();
    tracing::info!(exited = processes.exited, ms = exit_ms, "exited");
    let after_exit = snapshot(&manager, &files);

    let mut summary = Summary::new();
    manager.update_metric_summary(&mut summary);
    let metrics = report::metrics::list(&summary);
    let book_matches_kernel = book_matches_kernel(&manager.state(), &after_exit);
    if !book_matches_kernel {
        tracing::error!("the manager's book and the simulated maps disagree");
    }
    Ok(Report {
        seed: args.seed,
        files_generated: files.len(),
        deltas_generated,
        processes,
        after_load,
        after_exit,
        metrics,
        book_matches_kernel,
        timing: Timing {
            generate_ms,
            load_ms,
            exit_ms,
        },
    })
}

/// The files one process maps: each by its popularity, at least one.
fn choose_files(rng: &mut Rng, files: &[SynthFile]) -> Vec<usize> {
    let mut chosen: Vec<usize> = (0..files.len())
        .filter(|&i| rng.percent(files[i].popularity))
        .collect();
    if chosen.is_empty() && !files.is_empty() {
        chosen.push(rng.below(files.len() as u64) as usize);
    }
    chosen
}

/// `n / 2` distinct process numbers below `n`, in exit order.
fn pick_half(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    let half = n / 2;
    for i in 0..half {
        let j = i + rng.below((n - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(half);
    all
}

/// What the kernel maps hold, read from the simulated maps.
struct KernelView {
    files_with_table: usize,
    live_inner_maps: usize,
    kernel_deltas: u64,
    page_entries: usize,
    unwind_infos: usize,
    classes: BTreeMap<u16, usize>,
}

fn read_kernel(maps: &SimMaps) -> KernelView {
    let mut classes = BTreeMap::new();
    for (class, _file) in maps.delta_tables().keys() {
        *classes.entry(*class).or_insert(0) += 1;
    }
    let pages = maps.pages();
    KernelView {
        files_with_table: maps.table_count(),
        live_inner_maps: maps.live_inner_maps(),
        kernel_deltas: pages.values().map(|p| u64::from(p.num_deltas)).sum(),
        page_entries: pages.len(),
        // A slot holding a rule is never all zeros: commands are not stored
        // in slots, and zero is the command INVALID.
        unwind_infos: maps
            .unwind_infos()
            .iter()
            .filter(|u| **u != UnwindInfo::default())
            .count(),
        classes,
    }
}

fn snapshot(manager: &Manager, files: &[SynthFile]) -> Snapshot {
    let state = manager.state();
    let deltas_of: BTreeMap<FileId, u64> =
        files.iter().map(|f| (f.id, f.data.len() as u64)).collect();
    let kernel = manager.with_backend(|maps| read_kernel(maps));
    let size_classes: Vec<ClassUsage> = kernel
        .classes
        .iter()
        .map(|(&class, &inner_maps)| {
            let entries_per_map = abi::class_entries(class).unwrap_or(0);
            ClassUsage {
                class,
                entries_per_map,
                inner_maps,
                bytes: inner_maps as u64
                    * u64::from(entries_per_map)
                    * abi::StackDelta::SIZE as u64,
            }
        })
        .collect();
    let delta_tables = size_classes.iter().map(|c| c.bytes).sum();
    let page_map =
        kernel.page_entries as u64 * (StackDeltaPageKey::SIZE + StackDeltaPageInfo::SIZE) as u64;
    let unwind_infos = kernel.unwind_infos as u64 * UnwindInfo::SIZE as u64;
    Snapshot {
        references: state.files.values().map(|e| e.rc).sum(),
        files_known: state.files.len(),
        extracted_deltas: state
            .files
            .keys()
            .map(|id| deltas_of.get(id).copied().unwrap_or(0))
            .sum(),
        files_with_table: kernel.files_with_table,
        live_inner_maps: kernel.live_inner_maps,
        kernel_deltas: kernel.kernel_deltas,
        page_entries: kernel.page_entries,
        unwind_infos: kernel.unwind_infos,
        size_classes,
        memory: Memory {
            delta_tables,
            page_map,
            unwind_infos,
            total: delta_tables + page_map + unwind_infos,
        },
    }
}

/// The book (what the manager believes it wrote) against the maps.
fn book_matches_kernel(state: &StateView, kernel: &Snapshot) -> bool {
    let book = &state.book;
    let classes_match = (abi::SIZE_CLASS_MIN..=abi::SIZE_CLASS_MAX).all(|class| {
        let in_kernel = kernel
            .size_classes
            .iter()
            .find(|c| c.class == class)
            .map_or(0, |c| c.inner_maps);
        book.tables_in_class(class) as usize == in_kernel
    });
    book.loaded().len() == kernel.files_with_table
        && kernel.live_inner_maps == kernel.files_with_table
        && book.pages_in_use() == kernel.page_entries as u64
        && book.slots().in_use() == kernel.unwind_infos
        && book.leftover_ops() == 0
        && classes_match
}

/// `n` with its noun: "1 process", "2,000 processes".
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", grouped(n), if n == 1 { one } else { many })
}

/// The report as aligned text tables.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "eim demo: {} ({} deltas), {}, seed {}, simulated kernel\n\n",
        counted(
            r.files_generated as u64,
            "synthetic file",
            "synthetic files"
        ),
        grouped(r.deltas_generated),
        counted(r.processes.started as u64, "process", "processes"),
        r.seed
    ));

    let p = &r.processes;
    let mut t = Table::new(&[("processes", Align::Left), ("count", Align::Right)]);
    t.row(["started".into(), grouped(p.started as u64)]);
    t.row(["exited".into(), grouped(p.exited as u64)]);
    t.row(["running".into(), grouped(p.running as u64)]);
    t.row(["mappings".into(), grouped(p.mappings)]);
    t.row(["load errors".into(), grouped(p.load_errors)]);
    t.row(["releases".into(), grouped(p.releases)]);
    t.row(["release errors".into(), grouped(p.release_errors)]);
    out.push_str(&t.render());
    out.push('\n');

    let (a, b) = (&r.after_load, &r.after_exit);
    let mut t = Table::new(&[
        ("state", Align::Left),
        ("after load", Align::Right),
        ("after exits", Align::Right),
    ]);
    let mut both = |label: &str, f: &dyn Fn(&Snapshot) -> String| {
        t.row([label.to_string(), f(a), f(b)]);
    };
    both("references", &|s| grouped(s.references));
    both("files known", &|s| grouped(s.files_known as u64));
    both("extracted deltas", &|s| grouped(s.extracted_deltas));
    both("files with a table", &|s| {
        grouped(s.files_with_table as u64)
    });
    both("inner maps alive", &|s| grouped(s.live_inner_maps as u64));
    both("kernel deltas", &|s| grouped(s.kernel_deltas));
    both("page entries", &|s| grouped(s.page_entries as u64));
    both("unwind infos in use", &|s| grouped(s.unwind_infos as u64));
    out.push_str(&t.render());
    out.push('\n');

    let mut t = Table::new(&[
        ("kernel memory", Align::Left),
        ("entries/map", Align::Right),
        ("maps (load)", Align::Right),
        ("bytes (load)", Align::Right),
        ("maps (exits)", Align::Right),
        ("bytes (exits)", Align::Right),
    ]);
    let classes: std::collections::BTreeSet<u16> = a
        .size_classes
        .iter()
        .chain(&b.size_classes)
        .map(|c| c.class)
        .collect();
    let usage = |s: &Snapshot, class: u16| {
        s.size_classes
            .iter()
            .find(|c| c.class == class)
            .map_or((0, 0), |c| (c.inner_maps, c.bytes))
    };
    for class in classes {
        let (ma, ba) = usage(a, class);
        let (mb, bb) = usage(b, class);
        t.row([
            format!("class {class}"),
            grouped(u64::from(abi::class_entries(class).unwrap_or(0))),
            grouped(ma as u64),
            grouped(ba),
            grouped(mb as u64),
            grouped(bb),
        ]);
    }
    let mut sum = |label: &str, f: &dyn Fn(&Memory) -> u64| {
        t.row([
            label.to_string(),
            String::new(),
            String::new(),
            grouped(f(&a.memory)),
            String::new(),
            grouped(f(&b.memory)),
        ]);
    };
    sum("delta tables", &|m| m.delta_tables);
    sum("page map", &|m| m.page_map);
    sum("unwind infos", &|m| m.unwind_infos);
    sum("total", &|m| m.total);
    out.push_str(&t.render());
    out.push('\n');

    out.push_str(&report::metrics::table(&r.metrics));
    out.push('\n');

    out.push_str(&format!(
        "book matches kernel: {}\n",
        if r.book_matches_kernel { "yes" } else { "NO" }
    ));
    out.push_str(&format!(
        "time: generate {:.3} ms, load {:.3} ms ({} mappings), exits {:.3} ms\n",
        r.timing.generate_ms,
        r.timing.load_ms,
        grouped(p.mappings),
        r.timing.exit_ms
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(files: usize, processes: usize, seed: u64) -> DemoArgs {
        DemoArgs {
            files,
            processes,
            seed,
            json: false,
        }
    }

    #[test]
    fn a_small_demo_is_consistent_and_gives_memory_back() {
        let r = run(&args(6, 10, 5)).expect("demo runs");
        assert!(r.book_matches_kernel);
        assert_eq!(r.processes.load_errors + r.processes.release_errors, 0);
        assert_eq!(r.processes.exited, 5);
        assert!(r.after_load.files_with_table >= r.after_exit.files_with_table);
        assert!(r.after_load.memory.total >= r.after_exit.memory.total);
        assert_eq!(r.after_load.references, r.processes.mappings);
        assert_eq!(
            r.after_exit.references,
            r.processes.mappings - r.processes.releases
        );
    }

    #[test]
    fn all_processes_exiting_but_one_of_two() {
        let r = run(&args(3, 2, 9)).expect("demo runs");
        assert_eq!((r.processes.exited, r.processes.running), (1, 1));
    }

    #[test]
    fn no_files_and_no_processes_is_fine() {
        let r = run(&args(0, 0, 1)).expect("demo runs");
        assert_eq!(r.after_exit.memory.total, 0);
        assert!(r.book_matches_kernel);
        assert!(render_text(&r).contains("started"));
    }

    #[test]
    fn pick_half_is_distinct() {
        let mut rng = Rng::new(1);
        let mut picked = pick_half(&mut rng, 11);
        assert_eq!(picked.len(), 5);
        picked.sort();
        picked.dedup();
        assert_eq!(picked.len(), 5);
        assert!(picked.iter().all(|&p| p < 11));
    }
}
