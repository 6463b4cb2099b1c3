//! Every fault schedule up to three faults deep, for a load, a load that
//! reclaims cooled slots, a batch and an unload.
//!
//! A fault is one op failing outright or a batch stopping after some of its
//! elements. The first fault lands on any op of the call; the second on any
//! later op, which is then an op of the rollback the first one started or of
//! the leftover retry of the next call; the third on any op after that. So
//! a rollback that fails part way, a leftover retry that fails again, and a
//! slot-zeroing write that stops in the middle are all reached, at every
//! position, in every combination. (The machine goes no deeper: a failed
//! rollback leaves leftovers, and a leftover retry that fails leaves the
//! same kind of leftovers again.)
//!
//! After every op the reader-safety check runs (a reader following any
//! page resolves the old or the new table, never a hole or a wrong rule);
//! after every call the projection check compares every page, every table,
//! every offsets entry and every `unwind_info_array` slot's bytes with what
//! the book believes. Once the faults stop, everything must converge: the
//! leftovers go, the files load, and unloading them all leaves no file data.

use std::sync::Arc;
use std::time::Duration;

use eim_analysis::LibcInfo;
use eim_core::manager::ManualClock;
use eim_core::provider::Extraction;
use eim_core::tracers::LoaderMatch;
use eim_core::Error;
use eim_machine::deltas::{hint, IntervalData};
use eim_machine::ops::Errno;
use eim_machine::FileId;
use eim_sim::SimConfig;
use eim_sim_harness::fixtures::{deltas, python, three_pages};
use eim_sim_harness::world::{CheckedManager, CheckedWorld, WorldSpec};
use eim_sim_harness::{check_all, check_rolled_back, Sources};

const FILE: FileId = FileId(0xf11e);
const OTHER: FileId = FileId(0x07e7);
const LONE: FileId = FileId(0x1011e);
const TWIN: FileId = FileId(0x7a1);
const PY: FileId = FileId(0x9e7);
const GONE: FileId = FileId(0x6011e);

/// Faults per schedule, at most.
const DEPTH: usize = 3;
/// Errno of the first, second and third fault. None says anything about
/// the maps' contents (see `eim_sim::faults`).
const ERRNOS: [Errno; DEPTH] = [Errno::ENOMEM, Errno::EBUSY, Errno::EFAULT];
/// Slots in the reclaiming scenario: OTHER's rule and three more.
const FEW_SLOTS: u32 = 4;
const GRACE: Duration = Duration::from_secs(5);

fn files() -> Vec<(FileId, IntervalData, Vec<LoaderMatch>)> {
    vec![
        (FILE, three_pages(), Vec::new()),
        (
            OTHER,
            deltas(&[(0x1000, hint::KEEP, 8), (0x1100, hint::GAP, 0)]),
            Vec::new(),
        ),
        // Rules no other file has.
        (
            LONE,
            deltas(&[
                (0x2_0100, hint::KEEP, 48),
                (0x2_0180, hint::KEEP, 56),
                (0x2_0200, hint::GAP, 0),
            ]),
            Vec::new(),
        ),
        // One rule new to FILE too (sp 16), one of its own: in a batch with
        // FILE the fresh slot is shared by two files of the batch.
        (
            TWIN,
            deltas(&[
                (0x5_0000, hint::KEEP, 16),
                (0x6_0010, hint::KEEP, 96),
                (0x6_0020, hint::GAP, 0),
            ]),
            Vec::new(),
        ),
        // An interpreter: a table and an interpreter_offsets entry.
        (
            PY,
            deltas(&[
                (0x40_0100, hint::KEEP, 8),
                (0x41_0200, hint::KEEP, 104),
                (0x41_0240, hint::GAP, 0),
            ]),
            python(),
        ),
        // Loaded and unloaded before the reclaiming load: its three rules
        // cool in the slots FILE then takes.
        (
            GONE,
            deltas(&[
                (0x3_0000, hint::KEEP, 64),
                (0x3_0010, hint::KEEP, 72),
                (0x3_0020, hint::KEEP, 80),
                (0x3_0030, hint::GAP, 0),
            ]),
            Vec::new(),
        ),
    ]
}

type Manager = CheckedManager;

struct World {
    m: Manager,
    clock: Arc<ManualClock>,
    sources: Arc<Sources>,
}

fn world(slots: u32) -> World {
    let files = files();
    let spec = WorldSpec {
        unwind_slots: slots,
        slot_grace: GRACE,
        watch_slots: Some(GRACE),
        ..WorldSpec::default()
    };
    let w = CheckedWorld::new(files.iter().map(|(id, d, _)| (*id, d.clone())), &spec);
    // The provider serves each file with its interpreter matches too.
    for (id, data, interpreters) in files {
        w.provider.set(
            id,
            Ok(Extraction {
                data,
                libc: LibcInfo::default(),
                interpreters,
            }),
        );
    }
    w.manager.add_or_inc_ref(OTHER, &OTHER).expect("load OTHER");
    World {
        m: w.manager,
        clock: w.clock,
        sources: w.sources,
    }
}

/// What a scenario does under faults, and what it must end with.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// Load FILE (its new slots are unused ones).
    Load,
    /// Load FILE into slots that held GONE's rules, cooled past the grace:
    /// a rollback must give those slots back what they held, or zeros.
    LoadReclaiming,
    /// Load FILE, LONE, TWIN and PY in one batch.
    Batch,
    /// Unload FILE and PY, loaded before.
    Unload,
}

impl Action {
    fn wanted(self) -> &'static [FileId] {
        match self {
            Action::Load | Action::LoadReclaiming => &[FILE],
            Action::Batch => &[FILE, LONE, TWIN, PY],
            Action::Unload => &[FILE, PY],
        }
    }

    fn prepare(self) -> World {
        match self {
            Action::Load | Action::Batch => world(SimConfig::default().unwind_info),
            Action::LoadReclaiming => {
                let w = world(FEW_SLOTS);
                w.m.add_or_inc_ref(GONE, &GONE).expect("load GONE");
                w.m.remove_or_dec_ref(GONE).expect("unload GONE");
                w.clock.advance(GRACE + Duration::from_secs(1));
                w
            }
            Action::Unload => {
                let w = world(SimConfig::default().unwind_info);
                for id in self.wanted() {
                    w.m.add_or_inc_ref(*id, id).expect("load before the unload");
                }
                w
            }
        }
    }

    /// The call under faults; what each wanted file's call returned.
    fn act(self, m: &Manager) -> Vec<Result<(), Error>> {
        let wanted = self.wanted();
        match self {
            Action::Load | Action::LoadReclaiming => {
                vec![m.add_or_inc_ref(FILE, &FILE).map(drop)]
            }
            Action::Batch => {
                let batch: Vec<(FileId, &FileId)> = wanted.iter().map(|id| (*id, id)).collect();
                m.load_many(&batch)
                    .into_iter()
                    .map(|r| r.map(drop))
                    .collect()
            }
            Action::Unload => wanted.iter().map(|id| m.remove_or_dec_ref(*id)).collect(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Cut {
    Fail,
    StopAfter(usize),
}

/// The ways op of `len` elements can fail: outright, or after 1, 2 and all
/// but one of its elements.
fn cuts(len: usize) -> Vec<Cut> {
    let mut out = vec![Cut::Fail];
    let mut afters: Vec<usize> = [1, 2, len.saturating_sub(1)]
        .into_iter()
        .filter(|&a| a >= 1 && a < len)
        .collect();
    afters.dedup();
    out.extend(afters.into_iter().map(Cut::StopAfter));
    out
}

/// Fault k of a schedule: (op number from the start of the call, how).
type Schedule = Vec<(usize, Cut)>;

/// What one run saw.
struct Seen {
    /// Name and length of each op applied while faults were armed.
    ops: Vec<(&'static str, usize)>,
    /// Leftover ops after the call under faults.
    leftovers_after_call: usize,
    /// Leftover ops after the first retry under faults.
    leftovers_after_retry: usize,
}

fn checked(w: &World, what: &str) {
    let state = w.m.state();
    w.m.with_backend(|b| {
        if let Some((op, v)) = &b.violation {
            panic!("{what}: after {}: {v}", op.name());
        }
        check_all(&state, &b.maps, &w.sources).unwrap_or_else(|v| panic!("{what}: {v}"));
    });
}

fn run(action: Action, schedule: &Schedule) -> Seen {
    let what = format!("{action:?} under {schedule:?}");
    let w = action.prepare();
    checked(&w, &format!("{what}: before"));
    let maps_before = w.m.with_backend(|b| {
        for (depth, &(k, cut)) in schedule.iter().enumerate() {
            let errno = ERRNOS[depth];
            match cut {
                Cut::Fail => b.maps.fail_op(k as u64, errno),
                Cut::StopAfter(after) => b.maps.stop_batch(k as u64, after, errno),
            }
        }
        b.applied.clear();
        b.maps.clone()
    });

    // The call, then two retries of the leftovers, all under faults.
    let results = action.act(&w.m);
    checked(&w, &format!("{what}: the call"));
    let leftovers_after_call = w.m.state().book.leftover_ops();
    if schedule.is_empty() {
        assert!(results.iter().all(Result::is_ok), "{what}: {results:?}");
    }
    for (id, r) in action.wanted().iter().zip(&results) {
        match r {
            Err(Error::Kernel { rolled_back, .. }) if results.len() == 1 => {
                // "Rolled back" is a promise: nothing is owed, no page,
                // table or offsets entry of the load is left, and a slot it
                // wrote holds zeros or a rule nothing references.
                let book = w.m.state().book;
                let owed = book.leftovers().contains_key(id);
                assert_eq!(*rolled_back, !owed, "{what}: {r:?}");
                if *rolled_back {
                    w.m.with_backend(|b| check_rolled_back(&maps_before, &b.maps, &book))
                        .unwrap_or_else(|v| panic!("{what}: {v}"));
                }
            }
            Ok(()) | Err(Error::Kernel { .. }) | Err(Error::UnloadIncomplete { .. }) => {}
            Err(e) => panic!("{what}: unexpected {e}"),
        }
    }
    let leftovers_after_retry = w.m.retry_leftovers();
    checked(&w, &format!("{what}: first retry"));
    w.m.retry_leftovers();
    checked(&w, &format!("{what}: second retry"));
    let ops = w.m.with_backend(|b| {
        b.maps.clear_faults();
        std::mem::take(&mut b.applied)
    });

    // The faults are over: everything converges.
    w.clock.advance(Duration::from_secs(91));
    assert_eq!(w.m.retry_leftovers(), 0, "{what}: leftovers stay");
    for (id, r) in action.wanted().iter().zip(&results) {
        if matches!(action, Action::Unload) {
            assert!(
                !w.m.state().files.contains_key(id),
                "{what}: {id} still referenced"
            );
        } else if r.is_err() {
            w.m.add_or_inc_ref(*id, id)
                .unwrap_or_else(|e| panic!("{what}: {id} again: {e}"));
        }
    }
    checked(&w, &format!("{what}: converged"));
    let loaded: Vec<FileId> = w.m.state().files.keys().copied().collect();
    for id in &loaded {
        w.m.remove_or_dec_ref(*id)
            .unwrap_or_else(|e| panic!("{what}: unload {id}: {e}"));
    }
    checked(&w, &format!("{what}: all unloaded"));
    w.m.with_backend(|b| {
        assert!(b.maps.holds_no_file_data(), "{what}: file data left");
    });
    Seen {
        ops,
        leftovers_after_call,
        leftovers_after_retry,
    }
}

/// Tally of an exploration.
#[derive(Debug, Default)]
struct Tally {
    /// Schedules run, by number of faults.
    runs: [usize; DEPTH + 1],
    /// Runs whose call left leftovers (a rollback or an unload stopped).
    failed_rollbacks: usize,
    /// Runs whose leftovers survived the first retry (it failed too).
    failed_retries: usize,
}

fn explore(action: Action, schedule: &mut Schedule, tally: &mut Tally) {
    let seen = run(action, schedule);
    tally.runs[schedule.len()] += 1;
    tally.failed_rollbacks += usize::from(seen.leftovers_after_call > 0);
    tally.failed_retries += usize::from(seen.leftovers_after_retry > 0);
    if schedule.len() == DEPTH {
        return;
    }
    let from = schedule.last().map_or(0, |&(k, _)| k + 1);
    for (k, &(_, len)) in seen.ops.iter().enumerate().skip(from) {
        for cut in cuts(len) {
            schedule.push((k, cut));
            explore(action, schedule, tally);
            schedule.pop();
        }
    }
}

fn explored(action: Action) -> Tally {
    let mut tally = Tally::default();
    explore(action, &mut Vec::new(), &mut tally);
    eprintln!("{action:?}: {tally:?}");
    // Not vacuous: faults reached the rollbacks and the retries.
    assert!(
        tally.runs[DEPTH] > 0,
        "{action:?}: no schedule {DEPTH} deep"
    );
    assert!(tally.failed_rollbacks > 0, "{action:?}: no rollback failed");
    assert!(tally.failed_retries > 0, "{action:?}: no retry failed");
    tally
}

#[test]
fn every_double_and_triple_fault_of_a_load() {
    explored(Action::Load);
}

#[test]
fn every_double_and_triple_fault_of_a_load_that_reclaims_cooled_slots() {
    explored(Action::LoadReclaiming);
}

#[test]
fn every_double_and_triple_fault_of_a_batch() {
    explored(Action::Batch);
}

#[test]
fn every_double_and_triple_fault_of_an_unload() {
    explored(Action::Unload);
}

/// The reclaiming scenario really reclaims: FILE's load writes the slots
/// GONE's rules cooled in (so its rollback has old contents to deal with).
#[test]
fn the_reclaiming_load_writes_over_cooled_rules() {
    let w = Action::LoadReclaiming.prepare();
    let before = w.m.with_backend(|b| b.maps.unwind_infos());
    let gone_rules = before.iter().filter(|i| **i != Default::default()).count();
    assert_eq!(
        gone_rules, FEW_SLOTS as usize,
        "OTHER's rule and GONE's three"
    );
    w.m.add_or_inc_ref(FILE, &FILE).expect("load FILE");
    let after = w.m.with_backend(|b| b.maps.unwind_infos());
    let rewritten = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    assert_eq!(rewritten, 3, "FILE's three new rules replace GONE's");
}
