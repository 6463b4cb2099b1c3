use std::collections::VecDeque;

use super::*;
use eim_machine::abi::{StackDelta, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo};
use eim_machine::FileId;

/// One file: a page over a class-8 table whose one delta names slot 1.
fn loaded() -> Observed {
    let mut o = Observed {
        unwind_infos: vec![UnwindInfo::default(), UnwindInfo::new(1, 8, 0, 0)],
        ..Observed::default()
    };
    o.delta_tables.insert(
        (8, FileId(9)),
        vec![StackDelta {
            addr_low: 0,
            unwind_info: 1,
        }],
    );
    o.pages.insert(
        StackDeltaPageKey {
            file_id: 9,
            page: 0x40_0000,
        },
        StackDeltaPageInfo {
            first_delta: 0,
            num_deltas: 1,
            map_id: 8,
        },
    );
    o
}

/// `loaded` with an orphan table, as a load caught between its table
/// publish and its page writes looks.
fn mid_load() -> Observed {
    let mut o = loaded();
    o.delta_tables.insert((9, FileId(10)), Vec::new());
    o
}

fn run(owner: Option<Option<i32>>, reads: Vec<Observed>) -> (Status, usize) {
    let reads = reads
        .into_iter()
        .map(|observed| MapsRead {
            observed,
            snapshot: Snapshot::Unsynchronized,
            attempts: 1,
        })
        .collect();
    run_reads(owner, reads)
}

fn run_reads(owner: Option<Option<i32>>, reads: Vec<MapsRead>) -> (Status, usize) {
    let mut reads: VecDeque<MapsRead> = reads.into();
    let mut made = 0;
    let status = status(
        "/pins".into(),
        owner,
        16,
        || {
            made += 1;
            reads.pop_front().ok_or("read past the script")
        },
        Duration::ZERO,
    )
    .expect("status");
    (status, made)
}

#[test]
fn consistent_maps_are_read_once_and_described() {
    let (s, reads) = run(Some(Some(42)), vec![loaded()]);
    assert_eq!(reads, 1);
    assert!(s.is_consistent(), "{:?}", s.violations);
    assert_eq!(s.owner_pid, Some(42));
    let [f] = s.files.as_slice() else {
        panic!("{:?}", s.files)
    };
    assert_eq!(f.host_file_id, "0000000000000009");
    assert_eq!((f.pages, f.deltas, f.unwind_slots), (1, 1, 1));
    // 256 deltas in 8-byte slots, and a 24-byte page entry.
    assert_eq!(f.bytes, 256 * 8 + 24);
    assert_eq!(s.memory.total, 256 * 8 + 24 + 16);
    let text = render_text(&s);
    assert!(text.contains("owned by pid 42"), "{text}");
    assert!(text.contains("consistent"), "{text}");
}

#[test]
fn a_violation_of_a_moment_under_a_running_owner_is_not_reported() {
    let (s, reads) = run(Some(None), vec![mid_load(), loaded()]);
    assert_eq!(reads, 2);
    assert_eq!(s.reads, 2);
    assert!(s.is_consistent(), "{:?}", s.violations);
}

#[test]
fn a_violation_in_every_read_is_reported_and_without_an_owner_at_once() {
    let (s, reads) = run(Some(Some(7)), vec![mid_load(), mid_load(), mid_load()]);
    assert_eq!(reads, READS_WHILE_OWNED);
    assert_eq!(s.violations.len(), 1);
    assert_eq!(s.violations[0].kind, "orphan_table");
    assert!(render_text(&s).contains("INCONSISTENT: 1 violations (found in each of 3 reads)"));
    // Nobody writes: the first read is the answer.
    let (s, reads) = run(None, vec![mid_load()]);
    assert_eq!((reads, s.violations.len()), (1, 1));
    assert_eq!(
        s.violations[0].host_file_id.as_deref(),
        Some("000000000000000a")
    );
}

#[test]
fn a_snapshot_is_the_answer_even_under_a_running_owner() {
    // Taken within one generation, the orphan is real: reported at once.
    let snapshot = |observed| MapsRead {
        observed,
        snapshot: Snapshot::Consistent,
        attempts: 3,
    };
    let (s, reads) = run_reads(Some(Some(7)), vec![snapshot(mid_load())]);
    assert_eq!((reads, s.violations.len()), (1, 1));
    assert_eq!((s.snapshot, s.attempts), (Snapshot::Consistent, 3));
    // A torn read with a violation is read again, and a snapshot then
    // decides.
    let torn = MapsRead {
        observed: mid_load(),
        snapshot: Snapshot::Torn,
        attempts: 60,
    };
    let (s, reads) = run_reads(Some(Some(7)), vec![torn, snapshot(loaded())]);
    assert_eq!(reads, 2);
    assert!(s.is_consistent(), "{:?}", s.violations);
    assert_eq!(s.snapshot, Snapshot::Consistent);
    let text = render_text(&s);
    assert!(
        text.contains("a snapshot: read between two of the owner's writes (attempt 3)"),
        "{text}"
    );
}
