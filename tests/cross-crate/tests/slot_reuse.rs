//! `unwind_info_array` slots are reclaimed, never under a reader (issue 5,
//! item 5; upstream weakness 6).
//!
//! Every test runs the manager on the simulator with an `Observed` backend
//! that checks reader safety after each op and, through a `SlotWatch` on the
//! manager's own clock, that no slot gets a different rule less than the
//! readers' grace after a published table last referenced it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use eim_core::manager::ManualClock;
use eim_core::{Config, Error, ExecutableInfoManager, Tracers};
use eim_machine::abi::UnwindInfo;
use eim_machine::deltas::info::sp;
use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
use eim_machine::machine::Capacities;
use eim_machine::ops::{Errno, MapKind};
use eim_machine::FileId;
use eim_sim_harness::world::{CheckedManager, CheckedWorld, WorldSpec};
use eim_sim_harness::{check_all, Sources, Violation};

const GRACE: Duration = Duration::from_secs(5);

/// Rules unique to each binary.
const UNIQUE: u32 = 5;

/// A binary over two pages: one shared rule on each page and `UNIQUE` rules
/// no other binary has.
fn binary(k: u32) -> IntervalData {
    let mut d = IntervalData::new();
    let base = 0x10_0000u64;
    d.add(StackDelta::new(base, hint::KEEP, sp(8)));
    for j in 0..UNIQUE {
        let param = 8 * (100 + k * UNIQUE + j) as i32;
        d.add(StackDelta::new(
            base + 0x40 + 0x40 * u64::from(j),
            hint::KEEP,
            sp(param),
        ));
    }
    d.add(StackDelta::new(base + 0x1_0020, hint::KEEP, sp(16)));
    d.add(StackDelta::new(base + 0x1_0080, hint::GAP, info::INVALID));
    d
}

fn id(k: u32) -> FileId {
    FileId(0x1_0000 + u64::from(k))
}

type Manager = CheckedManager;

struct World {
    m: Manager,
    clock: Arc<ManualClock>,
    sources: Arc<Sources>,
}

/// A manager over `binaries` with `slots` unwind slots; the book waits
/// `book_grace`, the readers' model `GRACE`.
fn world(binaries: u32, slots: u32, book_grace: Duration) -> World {
    let spec = WorldSpec {
        unwind_slots: slots,
        slot_grace: book_grace,
        spread: 2,
        watch_slots: Some(GRACE),
        ..WorldSpec::default()
    };
    let w = CheckedWorld::new((0..binaries).map(|k| (id(k), binary(k))), &spec);
    World {
        m: w.manager,
        clock: w.clock,
        sources: w.sources,
    }
}

impl World {
    fn violation(&self) -> Option<String> {
        self.m.with_backend(|b| {
            b.violation
                .as_ref()
                .map(|(op, v)| format!("during {}: {v}", op.name()))
        })
    }

    fn check(&self) {
        assert_eq!(self.violation(), None);
        let state = self.m.state();
        self.m
            .with_backend(|b| check_all(&state, &b.maps, &self.sources))
            .unwrap_or_else(|v| panic!("{v}"));
    }

    fn slot_contents(&self) -> BTreeMap<u16, UnwindInfo> {
        self.m.state().book.slots().occupied().collect()
    }

    fn ops(&self) -> u64 {
        self.m.with_backend(|b| b.maps.ops_applied())
    }
}

/// 100,000 load/unload cycles over 2,000 binaries whose unique rules add up
/// to 10,000, in a 64-slot array. Six binaries are live at a time (at most
/// 6 * 5 + 2 = 32 slots), one is replaced per simulated second, so at most
/// four binaries' rules (20 slots) are inside their 5 s grace: 57 slots ever
/// needed at once. Without reclamation the 13th binary would fail.
///
/// The slot watch runs after every op of every cycle; reader safety after
/// every op of every other cycle (each cycle loads and unloads, so every
/// kind of op is covered; this halves the run time); all invariants every
/// 2,000 cycles and at the end.
#[test]
fn a_hundred_thousand_cycles_over_rotating_binaries_never_fill_the_array() {
    const CYCLES: u32 = 100_000;
    const POOL: u32 = 2_000;
    const LIVE: usize = 6;
    const SLOTS: u32 = 64;
    const FULL_CHECK_EVERY: u32 = 2_000;
    let w = world(POOL, SLOTS, GRACE);
    let mut live = std::collections::VecDeque::new();
    let mut next = 0u32;
    let mut last_unloaded = None;
    let (mut revived, mut reassigned) = (0u32, 0u64);
    let mut snapshot = w.slot_contents();
    for cycle in 0..CYCLES {
        w.clock.advance(Duration::from_secs(1));
        // Every tenth cycle brings back the binary unloaded a second ago
        // (its rules are cooling: revived without a slot write); otherwise
        // the next binary of the rotation that is not live.
        let k = match last_unloaded {
            Some(k) if cycle % 10 == 9 => k,
            _ => {
                while live.contains(&(next % POOL)) {
                    next += 1;
                }
                next += 1;
                (next - 1) % POOL
            }
        };
        let comes_back = Some(k) == last_unloaded;
        w.m.with_backend(|b| b.reader_checks = cycle % 2 == 1);
        let before = w.ops();
        if let Err(e) = w.m.add_or_inc_ref(id(k), &id(k)) {
            panic!("cycle {cycle}: loading binary {k}: {e}");
        }
        if comes_back {
            assert_eq!(
                w.ops() - before,
                2,
                "cycle {cycle}: no slot write to revive"
            );
            revived += 1;
        }
        live.push_back(k);
        if live.len() > LIVE {
            let old = live.pop_front().expect("more than LIVE are live");
            w.m.remove_or_dec_ref(id(old))
                .unwrap_or_else(|e| panic!("cycle {cycle}: unloading binary {old}: {e}"));
            last_unloaded = Some(old);
        }
        if let Some(v) = w.violation() {
            panic!("cycle {cycle}: {v}");
        }
        if cycle % FULL_CHECK_EVERY == 0 || cycle == CYCLES - 1 {
            w.check();
            let now = w.slot_contents();
            reassigned += now
                .iter()
                .filter(|(slot, rule)| snapshot.get(slot).is_some_and(|old| old != *rule))
                .count() as u64;
            snapshot = now;
        }
    }
    while let Some(k) = live.pop_front() {
        w.m.remove_or_dec_ref(id(k)).unwrap();
    }
    w.check();
    let state = w.m.state();
    assert_eq!(state.book.slots().live(), 0);
    assert!(state.book.slots().high_water() <= SLOTS as usize);
    assert!(revived >= CYCLES / 10 - 1, "{revived} revivals");
    // Not vacuous: slots really changed rules, far beyond the capacity.
    assert!(
        reassigned > u64::from(SLOTS) * 10,
        "only {reassigned} reassignments seen"
    );
    w.m.with_backend(|b| assert!(b.maps.holds_no_file_data()));
}

/// Two binaries with disjoint rules in an array that holds one of them.
fn two_in_one() -> World {
    world(2, UNIQUE + 2, GRACE)
}

/// Inside the grace period the slots of an unloaded binary are not given to
/// another rule: the new binary's load fails with "array full" and the file
/// is deferred, like upstream; once the grace has passed (and the deferral),
/// it loads into the reclaimed slots.
#[test]
fn a_slot_is_not_reassigned_before_the_grace_period() {
    let w = two_in_one();
    w.m.add_or_inc_ref(id(0), &id(0)).unwrap();
    w.m.remove_or_dec_ref(id(0)).unwrap();
    w.clock.advance(GRACE - Duration::from_millis(1));
    let err = w.m.add_or_inc_ref(id(1), &id(1)).unwrap_err();
    assert_eq!(
        err,
        Error::MapFull {
            file_id: id(1),
            map: MapKind::UnwindInfo,
            capacity: UNIQUE + 2
        }
    );
    assert!(w.m.is_deferred(id(1)));
    w.check();
    // The unloaded binary itself comes back at once: its rules are revived.
    w.m.add_or_inc_ref(id(0), &id(0)).unwrap();
    w.m.remove_or_dec_ref(id(0)).unwrap();
    w.clock.advance(Duration::from_secs(91));
    w.m.add_or_inc_ref(id(1), &id(1)).unwrap();
    w.check();
    let rules = w.slot_contents();
    assert!(
        rules.values().all(|r| *r != sp(8 * 100)),
        "binary 0's rules are gone"
    );
}

/// The slot watch is not vacuous: a book that does not wait (grace zero)
/// while readers need five seconds is caught on the first reassignment.
#[test]
fn a_manager_that_skips_the_grace_is_caught_by_the_slot_watch() {
    let w = world(2, UNIQUE + 2, Duration::ZERO);
    w.m.add_or_inc_ref(id(0), &id(0)).unwrap();
    w.m.remove_or_dec_ref(id(0)).unwrap();
    w.clock.advance(Duration::from_millis(10));
    w.m.add_or_inc_ref(id(1), &id(1))
        .expect("the book reuses the slots at once");
    let violation = w.m.with_backend(|b| b.violation.clone());
    match violation {
        Some((
            _,
            Violation::SlotReuse {
                since_reference, ..
            },
        )) => assert_eq!(since_reference, Duration::from_millis(10)),
        other => panic!("expected a slot reuse violation, got {other:?}"),
    }
    // The same sequence with the book's grace is clean.
    let w = world(2, UNIQUE + 2, GRACE);
    w.m.add_or_inc_ref(id(0), &id(0)).unwrap();
    w.m.remove_or_dec_ref(id(0)).unwrap();
    w.clock.advance(GRACE);
    w.m.add_or_inc_ref(id(1), &id(1)).unwrap();
    w.check();
}

/// Every way the load that reassigns slots can fail part way leaves the
/// book's mirror equal to the kernel array, no slot changed under a reader,
/// and the next attempt succeeding.
#[test]
fn a_failed_load_into_reclaimed_slots_is_undone_safely() {
    // Plan of binary 1: its 5 unique rules into reclaimed slots, the
    // table, two pages.
    let mut injections: Vec<(u64, Option<usize>)> = (0..3).map(|k| (k, None)).collect();
    for after in 1..UNIQUE as usize {
        injections.push((0, Some(after)));
    }
    injections.push((2, Some(1)));
    for (k, stop_after) in injections {
        for rollback_fails in [false, true] {
            let what =
                format!("op {k} stopped after {stop_after:?}, rollback fails {rollback_fails}");
            let w = two_in_one();
            w.m.add_or_inc_ref(id(0), &id(0)).unwrap();
            w.m.remove_or_dec_ref(id(0)).unwrap();
            w.clock.advance(GRACE);
            w.m.with_backend(|b| {
                match stop_after {
                    None => b.maps.fail_op(k, Errno::ENOMEM),
                    Some(after) => b.maps.stop_batch(k, after, Errno::E2BIG),
                }
                if rollback_fails {
                    b.maps.fail_op(k + 1, Errno::EBUSY);
                }
            });
            let err = w.m.add_or_inc_ref(id(1), &id(1)).unwrap_err();
            assert!(matches!(err, Error::Kernel { .. }), "{what}: {err}");
            w.m.with_backend(|b| b.maps.clear_faults());
            w.check();
            // Whatever is left is removed, and once the grace and the
            // deferral have passed, both binaries load in turn.
            assert_eq!(w.m.retry_leftovers(), 0, "{what}");
            w.clock.advance(Duration::from_secs(91));
            w.m.add_or_inc_ref(id(1), &id(1))
                .unwrap_or_else(|e| panic!("{what}: retry: {e}"));
            w.check();
            w.m.remove_or_dec_ref(id(1)).unwrap();
            w.clock.advance(GRACE);
            w.m.add_or_inc_ref(id(0), &id(0)).unwrap();
            w.check();
        }
    }
}

/// After a warm restart every slot no kept table uses cools for one grace
/// (a reader may still hold a table the dead daemon unpublished). A file
/// that needs a rule no slot holds is refused meanwhile; it must be tried
/// again once the slots may be reused, not only after the 90 s deferral.
#[test]
fn a_file_refused_while_slots_cool_after_a_restart_is_retried_when_they_may_be_reused() {
    let w = world(4, 64, GRACE);
    let provider = Arc::new(eim_core::provider::MemoryProvider::new());
    for (file_id, data) in w.sources.iter() {
        provider.insert(*file_id, data.clone());
    }
    for k in 0..2 {
        w.m.add_or_inc_ref(id(k), &id(k)).expect("load");
    }
    w.check();
    let World { m, clock, sources } = w;
    let backend = m.into_backend();
    let observed = backend.maps.observed();
    let config = Config {
        capacities: Capacities {
            unwind_slots: 64,
            ..Capacities::default()
        },
        slot_grace: GRACE,
        ..Config::default()
    };
    let kept = id(0);
    let (m, report) = ExecutableInfoManager::restart(
        provider,
        backend,
        Tracers::none(),
        config,
        Box::new(clock.clone()),
        &observed,
        [(kept, &kept, 1)],
    )
    .expect("the reconcile trusts a whole run's maps");
    assert_eq!(report.adopted, vec![kept]);
    let w = World { m, clock, sources };
    w.check();

    // Binary 3's unique rules are in no slot, and every slot cools.
    match w.m.add_or_inc_ref(id(3), &id(3)) {
        Err(Error::MapFull {
            map: MapKind::UnwindInfo,
            ..
        }) => {}
        other => panic!("expected a full unwind_info_array, got {other:?}"),
    }
    assert!(w.m.is_deferred(id(3)));
    w.clock.advance(GRACE - Duration::from_millis(1));
    assert!(
        w.m.is_deferred(id(3)),
        "retried before the slots may be reused"
    );
    w.clock.advance(Duration::from_millis(1));
    assert!(
        !w.m.is_deferred(id(3)),
        "still deferred once the slots may be reused"
    );
    w.m.add_or_inc_ref(id(3), &id(3))
        .expect("loaded once the grace is over");
    w.check();
}
