//! The summary of a host now ([`Summary::of`]): what the reports
//! ([`crate::report::summary`]) render, read from the [`Host`], its
//! manager and its backend's maps. It lives with the host so that the
//! reports know nothing of it.

use eim_machine::abi;

use crate::findings::{Problem, ProblemKind};
use crate::host::scan::Host;
use crate::map_view::{Inspect, InspectError};
use crate::report;
use crate::report::files as loaded;
use crate::report::problems;
use crate::report::summary::{
    found, secs, Bytes, ClassUsage, Extraction, Files, Kernel, Mappings, NamedProcess,
    PhaseSeconds, Pins, Processes, Seconds, Summary, DELTA_ELEMENT_BYTES, PAGE_ENTRY_BYTES,
    UNWIND_INFO_BYTES,
};

impl Summary {
    /// The summary of `host` now.
    pub fn of<B: Inspect>(host: &mut Host<B>) -> Result<Self, InspectError> {
        let usage = host.usage()?;
        let state = host.manager().state();
        let step = host.last_step().clone();
        let loaded: Vec<_> = state.files.iter().collect();
        let c_libraries = loaded
            .iter()
            .filter(|(_, e)| !e.info.libc.is_empty())
            .count();
        let interpreters = loaded
            .iter()
            .filter(|(_, e)| e.info.interpreters.iter().any(|m| m.outcome.is_ok()))
            .count();
        let stats = host.extraction();
        let deltas = state
            .book
            .loaded()
            .keys()
            .filter_map(|id| stats.of(*id).deltas)
            .map(|n| n as u64)
            .sum();
        let extraction = Extraction {
            extractions: stats.attempts(),
            files_extracted: stats.files(),
            most_of_one_file: stats.most_of_one_file(),
            deltas,
            seconds: secs(stats.time()),
        };
        let size_classes: Vec<ClassUsage> = usage
            .tables
            .iter()
            .map(|(&class, &tables)| {
                let entries = abi::class_entries(class).unwrap_or(0);
                ClassUsage {
                    class,
                    entries_per_table: entries,
                    tables,
                    bytes: tables as u64 * u64::from(entries) * DELTA_ELEMENT_BYTES,
                }
            })
            .collect();
        let delta_tables = size_classes.iter().map(|c| c.bytes).sum();
        let page_entries = usage.pages as u64 * PAGE_ENTRY_BYTES;
        let metrics = host.metrics();
        let slots_in_use = metrics
            .get(&eim_core::metrics::UNWIND_INFO_ARRAY_SIZE)
            .map_or(0, |&v| usize::try_from(v).unwrap_or(usize::MAX));
        let unwind_infos = slots_in_use as u64 * UNWIND_INFO_BYTES;
        let kernel_time = host.kernel_time();
        let (unsupported, problems): (Vec<Problem>, Vec<Problem>) = host
            .problems()
            .into_iter()
            .partition(|p| p.kind == ProblemKind::Unsupported);
        let found = found(host.files().values());
        let count = |kind| problems.iter().filter(|p| p.kind == kind).count();
        let extraction_seconds = extraction.seconds;
        Ok(Self {
            backend: B::NAME,
            interrupted: step.interrupted,
            processes: Processes {
                listed: step.processes,
                with_files: step.with_files,
                tracked: host.processes().len(),
                not_readable: host
                    .not_readable()
                    .iter()
                    .map(|(&pid, name)| NamedProcess {
                        pid,
                        name: name.clone(),
                    })
                    .collect(),
            },
            mappings: Mappings {
                file_mappings: step.file_mappings,
                anonymous: step.anonymous_mappings,
                references: host.processes().references(),
            },
            files: Files {
                distinct: host.files().len(),
                loaded: state.book.loaded().len(),
                c_libraries,
                interpreters,
                deferred: count(ProblemKind::Deferred),
                failed: count(ProblemKind::Failed),
                unopenable: count(ProblemKind::Unopenable),
                unsupported: unsupported.len(),
                collisions: count(ProblemKind::Collision),
            },
            extraction,
            kernel: Kernel {
                page_entries: usage.pages,
                unwind_infos: slots_in_use,
                unwind_slots_holding_rules: usage.unwind_infos,
                size_classes,
                bytes: Bytes {
                    delta_tables,
                    page_entries,
                    unwind_infos,
                    total: delta_tables + page_entries + unwind_infos,
                },
                ops: host.kernel_ops(),
                seconds: secs(kernel_time),
            },
            pins: host
                .with_backend(|b| b.pin_report().map(Pins::of))
                .map(|p| Pins {
                    reconciled: host.restarted().cloned(),
                    ..p
                }),
            problems,
            unsupported: problems::group(&unsupported),
            loaded_files: loaded::list(
                &state,
                host.files(),
                host.extraction(),
                &host.processes().pids_by_file(),
            ),
            found,
            metrics: report::metrics::list(&metrics),
            counters: host.counters().clone(),
            seconds: Seconds {
                last_step: secs(step.elapsed),
                extraction: extraction_seconds,
                kernel: secs(kernel_time),
                phases: PhaseSeconds::of(&step.phases),
            },
            events: None,
        })
    }
}
