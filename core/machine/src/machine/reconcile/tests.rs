//! The reconcile against a small map model: restarts over what a fresh run
//! writes, over damaged tables, pages and slots, over files no longer
//! wanted, and at every op of a load and of its rollback. After the
//! removals and the loads the model must hold exactly what the book says,
//! the book's accounting must equal a recount, and at every op a reader of
//! an adopted (or reloaded) file finds the right rule or no page.

use super::*;
use crate::deltas::info::{sp, INVALID};
use crate::deltas::{hint, IntervalData, StackDelta};
use crate::machine::book::Stopped;
use crate::machine::slots::SlotState;
use crate::ops::{Errno, OpFailure};

const GRACE: Duration = Duration::from_secs(5);

fn caps() -> Capacities {
    Capacities {
        unwind_slots: 64,
        pages: 4096,
        outer_entries: 16,
        interpreter_offsets: 8,
    }
}

fn t(secs: u64) -> Timestamp {
    Timestamp(Duration::from_secs(secs))
}

/// A file of `pages` pages; `rule` picks the rule of its k-th delta.
fn file(base: u64, pages: u64, rule: impl Fn(u64) -> i32) -> IntervalData {
    let mut deltas: IntervalData = (0..pages)
        .flat_map(|p| {
            let at = base + (p << 16);
            [
                StackDelta::new(at + 0x10, hint::NONE, sp(rule(2 * p))),
                StackDelta::new(at + 0x80, hint::NONE, sp(rule(2 * p + 1))),
            ]
        })
        .collect();
    let end = base + (pages << 16) - 0x10;
    deltas.push(StackDelta::new(end, hint::GAP, INVALID));
    deltas
}

fn offsets(n: u64) -> OffsetRange {
    OffsetRange {
        lower_offset1: n,
        upper_offset1: n + 0x100,
        program_index: 1,
        ..OffsetRange::default()
    }
}

/// The maps, as the kernel would hold them.
#[derive(Clone, Debug)]
struct Model(Observed);

impl Model {
    fn new() -> Self {
        Model(Observed {
            unwind_infos: vec![UnwindInfo::default(); caps().unwind_slots as usize],
            ..Observed::default()
        })
    }

    fn trimmed(deltas: &[abi::StackDelta]) -> Vec<abi::StackDelta> {
        let zero = abi::StackDelta::default();
        let end = deltas.iter().rposition(|d| *d != zero).map_or(0, |i| i + 1);
        deltas[..end].to_vec()
    }

    /// Applies the first `n` elements of `op`.
    fn apply_head(&mut self, op: &MapOp, n: usize) {
        let m = &mut self.0;
        match op {
            MapOp::PutUnwindInfos(v) => {
                for (slot, info) in v.iter().take(n) {
                    m.unwind_infos[usize::from(*slot)] = *info;
                }
            }
            MapOp::PutDeltaTable {
                file_id,
                map_id,
                deltas,
            } if n > 0 => {
                m.delta_tables
                    .insert((*map_id, *file_id), Self::trimmed(deltas));
            }
            MapOp::PutDeltaTables { map_id, tables } => {
                for (file_id, deltas) in tables.iter().take(n) {
                    m.delta_tables
                        .insert((*map_id, *file_id), Self::trimmed(deltas));
                }
            }
            MapOp::PutPages(v) => m.pages.extend(v.iter().take(n).copied()),
            MapOp::DeletePages(keys) => {
                for key in keys.iter().take(n) {
                    m.pages.remove(key);
                }
            }
            MapOp::DeleteDeltaTable { file_id, map_id } if n > 0 => {
                m.delta_tables.remove(&(*map_id, *file_id));
            }
            MapOp::PutInterpreterOffsets { file_id, range } if n > 0 => {
                m.interpreter_offsets.insert(*file_id, *range);
            }
            MapOp::DeleteInterpreterOffsets { file_id } if n > 0 => {
                m.interpreter_offsets.remove(file_id);
            }
            _ => {}
        }
    }

    fn apply(&mut self, op: &MapOp) {
        self.apply_head(op, op.len());
    }

    /// A reader of any file of `files` finds, at every page entry of it,
    /// the page a fresh load writes, and in it the right rule for every
    /// delta (through the slots); every page of any file names a table.
    fn check_reader(&self, files: &BTreeMap<FileId, IntervalData>) -> Result<(), String> {
        let m = &self.0;
        for (key, info) in &m.pages {
            let file_id = FileId(key.file_id);
            let Some(deltas) = files.get(&file_id) else {
                continue;
            };
            let Some(table) = m.delta_tables.get(&(info.map_id, file_id)) else {
                return Err(format!("{file_id} page {:#x}: no table", key.page));
            };
            let draft = encode::draft(deltas, u64::from(caps().pages))
                .map_err(|e| e.to_string())?
                .ok_or("a page of a file without deltas")?;
            let fresh = draft
                .resolve(file_id.0, |_| Some(0))
                .ok_or("unresolvable")?;
            let entries: Vec<(u16, Rule)> = draft.entries().collect();
            let want = fresh.pages.iter().find(|(k, _)| k == key).map(|(_, i)| *i);
            if want != Some(*info) {
                return Err(format!(
                    "{file_id} page {:#x}: {info:?}, a fresh load writes {want:?}",
                    key.page
                ));
            }
            let first = info.first_delta as usize;
            for i in first..first + usize::from(info.num_deltas) {
                let stored = table.get(i).copied().unwrap_or_default();
                let Some(&(addr_low, rule)) = entries.get(i) else {
                    return Err(format!("{file_id} delta {i}: past the draft's entries"));
                };
                let ok = stored.addr_low == addr_low
                    && match rule {
                        Rule::Command(v) => stored.unwind_info == v,
                        Rule::Slot(info) => {
                            m.unwind_infos.get(usize::from(stored.unwind_info)) == Some(&info)
                        }
                    };
                if !ok {
                    return Err(format!("{file_id} delta {i}: {stored:?}, wanted {rule:?}"));
                }
            }
        }
        Ok(())
    }

    /// Page entries naming a table that is not there (a reader following
    /// them fails the lookup of a missing table).
    fn dangling(&self) -> BTreeSet<StackDeltaPageKey> {
        let m = &self.0;
        m.pages
            .iter()
            .filter(|(k, i)| !m.delta_tables.contains_key(&(i.map_id, FileId(k.file_id))))
            .map(|(k, _)| *k)
            .collect()
    }

    /// The model holds exactly what `book` says: loaded files and leftovers.
    fn check_projection(&self, book: &KernelBook) -> Result<(), String> {
        let m = &self.0;
        let mut pages = BTreeSet::new();
        let mut tables = BTreeSet::new();
        let mut offsets: BTreeSet<FileId> = book.interpreter_offsets().keys().copied().collect();
        for (id, table) in book.loaded() {
            pages.extend(table.page_keys(*id));
            tables.insert((table.map_ref.map_id, *id));
        }
        for (id, ops) in book.leftovers() {
            for op in ops {
                match op {
                    MapOp::DeletePages(keys) => pages.extend(keys.iter().copied()),
                    MapOp::DeleteDeltaTable { map_id, .. } => {
                        tables.insert((*map_id, *id));
                    }
                    MapOp::DeleteInterpreterOffsets { .. } => {
                        offsets.insert(*id);
                    }
                    other => return Err(format!("leftover {other:?}")),
                }
            }
        }
        if m.pages.keys().copied().collect::<BTreeSet<_>>() != pages {
            return Err("page entries differ from the book's".into());
        }
        if m.delta_tables.keys().copied().collect::<BTreeSet<_>>() != tables {
            return Err("tables differ from the book's".into());
        }
        if m.interpreter_offsets
            .keys()
            .copied()
            .collect::<BTreeSet<_>>()
            != offsets
        {
            return Err("interpreter offsets differ from the book's".into());
        }
        for (id, range) in book.interpreter_offsets() {
            if m.interpreter_offsets.get(id) != Some(range) {
                return Err(format!("{id}: other offsets"));
            }
        }
        for (slot, info) in m.unwind_infos.iter().enumerate() {
            let held = (*info != UnwindInfo::default()).then_some(*info);
            if book.slots().content(slot as u16) != held {
                return Err(format!("slot {slot}: {held:?}, the book mirrors another"));
            }
        }
        Ok(())
    }
}

/// Invariant 4 on the book alone, as `sim`'s checker recounts it.
fn check_accounting(book: &KernelBook) -> Result<(), String> {
    let pages: u64 = book
        .loaded()
        .iter()
        .map(|(id, t)| t.page_keys(*id).count() as u64)
        .sum();
    if pages != book.pages_in_use() {
        return Err(format!("gauge {} for {pages} pages", book.pages_in_use()));
    }
    for class in abi::SIZE_CLASS_MIN..=abi::SIZE_CLASS_MAX {
        let n = book
            .loaded()
            .values()
            .filter(|t| t.map_ref.map_id == class)
            .count() as u32;
        if n != book.tables_in_class(class) {
            return Err(format!("class {class}: {n} tables"));
        }
    }
    let mut users: BTreeMap<u16, u32> = BTreeMap::new();
    for slots in book
        .loaded()
        .values()
        .map(|t| &t.slots)
        .chain(book.leftover_slots().values())
    {
        for s in slots.iter() {
            *users.entry(*s).or_default() += 1;
        }
    }
    let slots = book.slots();
    for s in 0..slots.high_water() as u16 {
        let want = users.get(&s).copied().unwrap_or(0);
        let ok = match slots.state(s) {
            SlotState::Free => want == 0 && slots.content(s).is_none(),
            SlotState::Live { users } => users == want && slots.content(s).is_some(),
            SlotState::Cooling { .. } => want == 0,
            SlotState::Reserved => false,
        };
        if !ok {
            return Err(format!("slot {s}: {:?}, {want} users", slots.state(s)));
        }
        if let Some(info) = slots.content(s) {
            if slots.slot_of(&info) != Some(s) {
                return Err(format!("slot {s} not indexed"));
            }
        }
    }
    for (id, ops) in book.leftovers() {
        let table = ops
            .iter()
            .any(|op| matches!(op, MapOp::DeleteDeltaTable { .. }));
        if table != book.leftover_slots().contains_key(id) {
            return Err(format!("{id}: leftover table and its slots disagree"));
        }
    }
    Ok(())
}

/// The earlier run: a book and the maps it wrote.
struct Run {
    book: KernelBook,
    model: Model,
}

impl Run {
    fn new() -> Self {
        Run {
            book: KernelBook::with_slot_grace(caps(), GRACE),
            model: Model::new(),
        }
    }

    fn load(&mut self, id: u64, deltas: &IntervalData, offsets: Option<OffsetRange>) {
        let plan = self
            .book
            .plan_load(FileId(id), deltas, offsets)
            .expect("plan");
        for op in &plan.ops {
            self.model.apply(op);
        }
        self.book.commit_load(plan);
    }

    fn unload(&mut self, id: u64) {
        let plan = self.book.plan_unload(FileId(id)).expect("loaded");
        for op in &plan.ops {
            self.model.apply(op);
        }
        self.book.finish_unload(plan, Ok(()));
    }
}

struct Files(BTreeMap<FileId, (IntervalData, Option<OffsetRange>)>);

impl Files {
    /// A, B and C, B with a rule no other file has and C with offsets.
    fn abc() -> Self {
        let mut m = BTreeMap::new();
        m.insert(
            FileId(0xa),
            (file(0x40_0000, 3, |k| 8 + 8 * (k % 3) as i32), None),
        );
        m.insert(
            FileId(0xb),
            (file(0x80_0000, 2, |k| if k == 1 { 200 } else { 16 }), None),
        );
        m.insert(
            FileId(0xc),
            (
                file(0x10_0000, 4, |k| 24 + 8 * (k % 2) as i32),
                Some(offsets(7)),
            ),
        );
        Files(m)
    }

    fn only(&self, ids: &[u64]) -> Files {
        Files(
            self.0
                .iter()
                .filter(|(id, _)| ids.contains(&id.0))
                .map(|(id, f)| (*id, f.clone()))
                .collect(),
        )
    }

    fn wanted(&self) -> Vec<Wanted<'_>> {
        self.0
            .iter()
            .map(|(id, (deltas, offsets))| Wanted {
                file_id: *id,
                deltas,
                offsets: *offsets,
            })
            .collect()
    }

    fn deltas(&self, ids: impl IntoIterator<Item = FileId>) -> BTreeMap<FileId, IntervalData> {
        ids.into_iter()
            .filter_map(|id| self.0.get(&id).map(|(d, _)| (id, d.clone())))
            .collect()
    }

    /// An earlier run that loaded a file and dropped it (so slots do not
    /// start at 0), then loaded every file of `self`.
    fn earlier_run(&self) -> Run {
        let mut run = Run::new();
        run.load(0x99, &file(0x900_0000, 1, |k| 400 + 8 * k as i32), None);
        run.book.advance_to(t(1));
        run.unload(0x99);
        run.book.advance_to(t(2));
        for (id, (deltas, offsets)) in &self.0 {
            run.load(id.0, deltas, *offsets);
        }
        run
    }
}

/// Runs the removals, then loads what is missing, checking the reader of
/// the adopted files after every op (and of every wanted file once its
/// removals are done), then projection and accounting.
fn settle(mut model: Model, reconciled: Reconciled, files: &Files) -> (Model, KernelBook) {
    let Reconciled {
        mut book,
        adopted,
        to_load,
    } = reconciled;
    let adopted_deltas = files.deltas(adopted.iter().copied());
    let before: Vec<_> = adopted
        .iter()
        .map(|id| {
            let m = &model.0;
            (
                m.pages
                    .iter()
                    .filter(|(k, _)| k.file_id == id.0)
                    .map(|(k, v)| (*k, *v))
                    .collect::<Vec<_>>(),
                m.delta_tables
                    .iter()
                    .filter(|((_, f), _)| f == id)
                    .map(|(k, v)| (*k, v.clone()))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    model
        .check_reader(&adopted_deltas)
        .expect("before the removals");
    // Removals go top-down: no page is left naming a table they removed.
    let dangling = model.dangling();
    let bound = book.leftover_ops() + 1;
    for _ in 0..bound {
        let fronts = book.leftover_fronts();
        if fronts.is_empty() {
            break;
        }
        for (id, op) in fronts {
            assert!(op.is_delete(), "a removal writes nothing: {op:?}");
            model.apply(&op);
            assert!(book.leftover_result(id, Ok(())));
            model
                .check_reader(&adopted_deltas)
                .expect("during the removals");
            assert!(
                model.dangling().is_subset(&dangling),
                "a page names a removed table after {op:?}"
            );
        }
    }
    assert_eq!(book.leftover_ops(), 0, "every removal ran");
    let all = files.deltas(files.0.keys().copied());
    model.check_reader(&all).expect("after the removals");
    assert!(model.dangling().is_empty());
    let load: Vec<_> = to_load
        .iter()
        .map(|id| {
            let (d, o) = &files.0[id];
            (*id, d, *o)
        })
        .collect();
    // Slots no kept table uses cool for a grace from the restart: new
    // rules are written after it.
    book.advance_to(book.now().after(GRACE));
    let (plan, refused) = book.plan_load_many_with(&load);
    assert!(refused.is_empty(), "refused: {refused:?}");
    for op in &plan.ops {
        for n in 0..=op.len() {
            let mut partial = model.clone();
            partial.apply_head(op, n);
            partial.check_reader(&all).expect("during the loads");
        }
        model.apply(op);
    }
    book.commit_load(plan);
    model.check_projection(&book).expect("projection");
    check_accounting(&book).expect("accounting");
    for (id, (pages, tables)) in adopted.iter().zip(before) {
        let m = &model.0;
        let now_pages: Vec<_> = m
            .pages
            .iter()
            .filter(|(k, _)| k.file_id == id.0)
            .map(|(k, v)| (*k, *v))
            .collect();
        let now_tables: Vec<_> = m
            .delta_tables
            .iter()
            .filter(|((_, f), _)| f == id)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_eq!(now_pages, pages, "{id}: an adopted file's pages changed");
        assert_eq!(now_tables, tables, "{id}: an adopted file's table changed");
    }
    for id in files.0.keys() {
        assert!(book.is_loaded(*id), "{id} is loaded at the end");
    }
    (model, book)
}

fn reconcile_now(model: &Model, files: &Files) -> Reconciled {
    reconcile(&model.0, &files.wanted(), caps(), GRACE, t(3)).expect("trusted")
}

fn slot_of_rule(book: &KernelBook, param: i32) -> u16 {
    book.slots().slot_of(&sp(param)).expect("a slot holds it")
}

#[test]
fn a_restart_over_a_fresh_runs_maps_adopts_everything_and_removes_nothing() {
    let files = Files::abc();
    let run = files.earlier_run();
    let r = reconcile_now(&run.model, &files);
    assert_eq!(r.adopted, vec![FileId(0xa), FileId(0xb), FileId(0xc)]);
    assert!(r.to_load.is_empty());
    assert_eq!(r.removals().count(), 0);
    assert_eq!(
        r.book.loaded(),
        run.book.loaded(),
        "the old slot indices kept"
    );
    assert_eq!(r.book.interpreter_offsets(), run.book.interpreter_offsets());
    assert_eq!(r.book.pages_in_use(), run.book.pages_in_use());
    for slot in 0..run.book.slots().high_water() as u16 {
        assert_eq!(r.book.slots().users(slot), run.book.slots().users(slot));
    }
    // The dropped file's rules were in the lowest slots: a fresh book would
    // have numbered A's rules from 0, the adopted book keeps the old ones.
    let mut fresh = KernelBook::new(caps());
    let (deltas, _) = &files.0[&FileId(0xa)];
    let plan = fresh.plan_load(FileId(0xa), deltas, None).unwrap();
    fresh.commit_load(plan);
    assert_ne!(
        fresh.loaded()[&FileId(0xa)].slots,
        r.book.loaded()[&FileId(0xa)].slots
    );
    // The dropped file's slot keeps its rule and cools from the restart on.
    let old = slot_of_rule(&r.book, 400);
    assert_eq!(
        r.book.slots().state(old),
        SlotState::Cooling {
            reusable_at: t(3).after(GRACE)
        }
    );
    let (model, book) = settle(run.model, r, &files);
    assert_eq!(model.0.delta_tables.len(), 3);
    assert_eq!(book.leftover_ops(), 0);
}

#[test]
fn a_table_with_one_wrong_delta_is_removed_and_loaded_again() {
    let files = Files::abc();
    let mut run = files.earlier_run();
    let class = run.book.loaded()[&FileId(0xb)].map_ref.map_id;
    run.model
        .0
        .delta_tables
        .get_mut(&(class, FileId(0xb)))
        .unwrap()[1]
        .addr_low ^= 1;
    let r = reconcile_now(&run.model, &files);
    assert_eq!(r.adopted, vec![FileId(0xa), FileId(0xc)]);
    assert_eq!(r.to_load, vec![FileId(0xb)]);
    let keys: Vec<_> = run.book.loaded()[&FileId(0xb)]
        .page_keys(FileId(0xb))
        .collect();
    assert_eq!(
        r.book.leftovers()[&FileId(0xb)],
        VecDeque::from([
            MapOp::DeletePages(keys),
            MapOp::DeleteDeltaTable {
                file_id: FileId(0xb),
                map_id: class
            }
        ])
    );
    settle(run.model, r, &files);
}

#[test]
fn pages_pointing_to_a_missing_table_are_removed() {
    // Also a half-published file: pages present, outer entry missing.
    let files = Files::abc();
    let mut run = files.earlier_run();
    let class = run.book.loaded()[&FileId(0xb)].map_ref.map_id;
    run.model.0.delta_tables.remove(&(class, FileId(0xb)));
    let r = reconcile_now(&run.model, &files);
    assert_eq!(r.to_load, vec![FileId(0xb)]);
    assert!(matches!(
        r.book.leftovers()[&FileId(0xb)].iter().collect::<Vec<_>>()[..],
        [MapOp::DeletePages(_)]
    ));
    assert!(!r.book.leftover_slots().contains_key(&FileId(0xb)));
    settle(run.model, r, &files);
}

#[test]
fn a_slot_whose_rule_differs_takes_its_table_away_and_is_not_reused_at_once() {
    let files = Files::abc();
    let mut run = files.earlier_run();
    let slot = slot_of_rule(&run.book, 200);
    run.model.0.unwind_infos[usize::from(slot)] = sp(208);
    let r = reconcile_now(&run.model, &files);
    assert_eq!(r.adopted, vec![FileId(0xa), FileId(0xc)]);
    assert_eq!(r.to_load, vec![FileId(0xb)]);
    // The stale table may still be read: its slots stay live until it is gone.
    assert!(r.book.leftover_slots()[&FileId(0xb)].contains(&slot));
    assert_eq!(r.book.slots().users(slot), 1);
    let (model, book) = settle(run.model, r, &files);
    let new = slot_of_rule(&book, 200);
    assert_ne!(new, slot, "the slot a stale table led to cools first");
    assert_eq!(model.0.unwind_infos[usize::from(slot)], sp(208));
    assert!(matches!(
        book.slots().state(slot),
        SlotState::Cooling { .. }
    ));
}

#[test]
fn files_no_longer_wanted_are_removed_top_down_and_their_slots_cool() {
    let all = Files::abc();
    let run = all.earlier_run();
    let files = all.only(&[0xa]);
    let r = reconcile_now(&run.model, &files);
    assert_eq!(r.adopted, vec![FileId(0xa)]);
    assert!(r.to_load.is_empty());
    let c = &r.book.leftovers()[&FileId(0xc)];
    assert_eq!(c.len(), 3);
    assert!(matches!(c[0], MapOp::DeletePages(_)));
    assert!(matches!(c[1], MapOp::DeleteInterpreterOffsets { .. }));
    assert!(matches!(c[2], MapOp::DeleteDeltaTable { .. }));
    let only_b = slot_of_rule(&run.book, 200);
    let (model, book) = settle(run.model, r, &files);
    assert!(model.0.pages.keys().all(|k| k.file_id == 0xa));
    assert_eq!(model.0.delta_tables.len(), 1);
    assert!(model.0.interpreter_offsets.is_empty());
    assert!(matches!(
        book.slots().state(only_b),
        SlotState::Cooling { .. }
    ));
    assert_eq!(book.slots().content(only_b), Some(sp(200)), "revivable");
}

#[test]
fn other_offsets_make_the_file_load_again() {
    let files = Files::abc();
    let mut run = files.earlier_run();
    run.model
        .0
        .interpreter_offsets
        .insert(FileId(0xc), offsets(9));
    let r = reconcile_now(&run.model, &files);
    assert_eq!(r.to_load, vec![FileId(0xc)]);
    settle(run.model, r, &files);
}

/// A restart after every op (and every element of a batch op) of B's load,
/// and after every op of the rollback of a load stopped at each point:
/// the reconcile converges to A, B and C loaded, safely.
#[test]
fn a_restart_at_any_op_of_a_load_or_of_its_rollback_converges() {
    let files = Files::abc();
    let ac = files.only(&[0xa, 0xc]);
    let (b, _) = &files.0[&FileId(0xb)];
    let mut restarts = 0;
    let base = ac.earlier_run();
    let mut book = base.book.clone();
    let plan = book.plan_load(FileId(0xb), b, None).unwrap();
    for (at, op) in plan.ops.iter().enumerate() {
        for done in 0..=op.len() {
            // The crash: the load got this far.
            let mut model = base.model.clone();
            for earlier in &plan.ops[..at] {
                model.apply(earlier);
            }
            model.apply_head(op, done);
            let r = reconcile_now(&model, &files);
            settle(model.clone(), r, &files);
            restarts += 1;
            // The load stopped here instead, and its rollback crashed at
            // every op.
            let mut book = base.book.clone();
            let plan = book.plan_load(FileId(0xb), b, None).unwrap();
            let rollback = book.abort_load(
                &plan,
                Stopped {
                    at,
                    failure: OpFailure::new(Errno::ENOMEM, done),
                },
            );
            for (undo_at, undo) in rollback.ops.iter().enumerate() {
                for undone in 0..=undo.len() {
                    let mut model = model.clone();
                    for earlier in &rollback.ops[..undo_at] {
                        model.apply(earlier);
                    }
                    model.apply_head(undo, undone);
                    let r = reconcile_now(&model, &files);
                    settle(model, r, &files);
                    restarts += 1;
                }
            }
        }
    }
    assert!(restarts > 20, "{restarts} restarts");
}

/// A and C loaded, then B's load failed at its last op and was rolled
/// back (its table unpublished, the slots it wrote zeroed) right before
/// the crash: the files, the earlier run, the maps, and B's highest fresh
/// slot.
fn rolled_back_before_the_crash() -> (Files, Run, Model, u16) {
    let files = Files::abc();
    let ac = files.only(&[0xa, 0xc]);
    let base = ac.earlier_run();
    let mut book = base.book.clone();
    let (b, _) = &files.0[&FileId(0xb)];
    let plan = book.plan_load(FileId(0xb), b, None).unwrap();
    let last = plan.ops.len() - 1;
    let rollback = book.abort_load(
        &plan,
        Stopped {
            at: last,
            failure: OpFailure::new(Errno::ENOMEM, 0),
        },
    );
    let mut model = base.model.clone();
    for op in plan.ops[..last].iter().chain(&rollback.ops) {
        model.apply(op);
    }
    let fresh = match &plan.ops[0] {
        MapOp::PutUnwindInfos(v) => v.iter().map(|(s, _)| *s).max().unwrap(),
        other => panic!("{other:?}"),
    };
    (files, base, model, fresh)
}

/// A rollback unpublished a table and zeroed the slots it had written,
/// above every other used slot, and the daemon died: the restart must not
/// write another rule there within the grace, as a reader may still hold
/// the table (found by the simulator, `sim/known-failures`).
#[test]
fn zero_slots_past_every_used_one_cool_for_a_grace_after_a_restart() {
    let (files, _, model, fresh) = rolled_back_before_the_crash();
    assert_eq!(
        model.0.unwind_infos[usize::from(fresh)],
        UnwindInfo::default()
    );
    let r = reconcile_now(&model, &files);
    let mut book = r.book;
    assert_eq!(
        book.slots().state(fresh),
        SlotState::Cooling {
            reusable_at: t(3).after(GRACE)
        }
    );
    let (b, _) = &files.0[&FileId(0xb)];
    assert_eq!(
        book.plan_load(FileId(0xb), b, None).err(),
        Some(crate::machine::PlanError::MapFull {
            map: MapKind::UnwindInfo,
            capacity: caps().unwind_slots
        }),
        "no slot for B's new rule within the grace"
    );
    book.advance_to(t(3).after(GRACE));
    assert!(book.plan_load(FileId(0xb), b, None).is_ok());
}

/// The same rollback right before the crash, with the backend's record of
/// when it zeroed the slot: the zero slots cool only for what is left of
/// the grace since then, and are free once it is over. Slots that hold a
/// rule no kept table uses cool a whole grace whatever the record says
/// (their last table may have been unpublished just now).
#[test]
fn a_recorded_zeroing_bounds_how_long_zero_slots_cool() {
    let (files, base, model, fresh) = rolled_back_before_the_crash();
    // C was unloaded before the crash: its unique rule's slot keeps the
    // rule and lost its last table.
    let a_only = files.only(&[0xa, 0xb]);
    let c_slot = slot_of_rule(&base.book, 32);
    let restart = |zeroed_ago: Option<Duration>| {
        let mut observed = model.0.clone();
        let c = FileId(0xc);
        observed.pages.retain(|k, _| k.file_id != c.0);
        observed.delta_tables.retain(|(_, f), _| *f != c);
        observed.interpreter_offsets.remove(&c);
        observed.zeroed_ago = zeroed_ago;
        reconcile(&observed, &a_only.wanted(), caps(), GRACE, t(3)).expect("trusted")
    };

    let two_ago = restart(Some(Duration::from_secs(2))).book;
    assert_eq!(
        two_ago.slots().state(fresh),
        SlotState::Cooling {
            reusable_at: t(3).after(GRACE - Duration::from_secs(2))
        },
        "zeroed 2 s ago: cools for the rest of the grace"
    );
    assert_eq!(
        two_ago.slots().state(c_slot),
        SlotState::Cooling {
            reusable_at: t(3).after(GRACE)
        }
    );

    let mut long_ago = restart(Some(GRACE)).book;
    assert_eq!(long_ago.slots().state(fresh), SlotState::Free);
    let never = restart(Some(Duration::MAX)).book;
    assert_eq!(never.slots().state(fresh), SlotState::Free);
    assert_eq!(
        never.slots().state(c_slot),
        SlotState::Cooling {
            reusable_at: t(3).after(GRACE)
        },
        "a slot with a rule cools however long ago a slot was zeroed"
    );
    check_accounting(&long_ago).expect("accounting");
    check_accounting(&never).expect("accounting");
    // B's new rule goes into a free zero slot at once.
    let (b, _) = &files.0[&FileId(0xb)];
    assert!(long_ago.plan_load(FileId(0xb), b, None).is_ok());
}

#[test]
fn shapes_the_reconcile_cannot_trust_are_errors() {
    let files = Files::abc();
    let run = files.earlier_run();
    let wanted = files.wanted();
    let try_with = |edit: &dyn Fn(&mut Observed)| {
        let mut o = run.model.0.clone();
        edit(&mut o);
        reconcile(&o, &wanted, caps(), GRACE, t(3)).err()
    };
    let a = slot_of_rule(&run.book, 8);
    let b = slot_of_rule(&run.book, 200);
    assert_eq!(
        try_with(&|o| o.unwind_infos[usize::from(b)] = sp(8)),
        Some(ReconcileError::DuplicateRule {
            first: a.min(b),
            second: a.max(b)
        })
    );
    assert!(matches!(
        try_with(&|o| o.unwind_infos.push(sp(1000))),
        Some(ReconcileError::SlotOutOfRange { .. })
    ));
    assert_eq!(
        try_with(&|o| {
            let (k, v) = o
                .delta_tables
                .iter()
                .next()
                .map(|(k, v)| (*k, v.clone()))
                .unwrap();
            o.delta_tables.insert((k.0 + 1, k.1), v);
        }),
        Some(ReconcileError::TwoTables(FileId(0xa)))
    );
    assert!(matches!(
        try_with(&|o| {
            o.delta_tables.insert(
                (abi::SIZE_CLASS_MIN, FileId(0x77)),
                vec![abi::StackDelta::default(); 257],
            );
        }),
        Some(ReconcileError::TableTooLong { .. })
    ));
    let twice = [wanted[0], wanted[0]];
    assert_eq!(
        reconcile(&run.model.0, &twice, caps(), GRACE, t(3)).err(),
        Some(ReconcileError::RepeatedFile(FileId(0xa)))
    );
    // And the dump as it is is trusted.
    assert_eq!(try_with(&|_| {}), None);
}

#[test]
fn observed_maps_are_empty_only_with_nothing_in_any_map() {
    // A warm start skips the reconcile of empty maps: anything in any map
    // (a zero slot is nothing) must make them non-empty.
    let zero_slots = Observed {
        unwind_infos: vec![UnwindInfo::default(); 4],
        ..Observed::default()
    };
    assert!(Observed::default().is_empty());
    assert!(zero_slots.is_empty());
    let mut with_page = zero_slots.clone();
    with_page
        .pages
        .insert(StackDeltaPageKey::default(), StackDeltaPageInfo::default());
    let mut with_table = zero_slots.clone();
    with_table.delta_tables.insert((8, FileId(1)), Vec::new());
    let mut with_offsets = zero_slots.clone();
    with_offsets
        .interpreter_offsets
        .insert(FileId(1), OffsetRange::default());
    let mut with_rule = zero_slots.clone();
    with_rule.unwind_infos[3] = sp(8);
    for (what, observed) in [
        ("a page", with_page),
        ("a table", with_table),
        ("an offsets entry", with_offsets),
        ("a rule", with_rule),
    ] {
        assert!(!observed.is_empty(), "{what}");
    }
}

#[test]
fn the_removals_are_every_leftover_op_per_file_in_order() {
    let all = Files::abc();
    let run = all.earlier_run();
    let r = reconcile_now(&run.model, &all.only(&[0xa]));
    let removals: Vec<(u64, &str)> = r.removals().map(|(id, op)| (id.0, op.name())).collect();
    assert_eq!(
        removals,
        [
            (0xb, "delete pages"),
            (0xb, "delete delta table"),
            (0xc, "delete pages"),
            (0xc, "delete interpreter offsets"),
            (0xc, "delete delta table"),
        ]
    );
}

#[test]
fn a_file_without_deltas_is_adopted_only_without_a_table_or_pages() {
    let mut files = Files::abc();
    files
        .0
        .insert(FileId(0xd), (IntervalData::new(), Some(offsets(3))));
    let run = files.earlier_run();
    let d = FileId(0xd);
    assert!(reconcile_now(&run.model, &files).adopted.contains(&d));
    // A table of its id (a copy of A's), no pages.
    let mut model = run.model.clone();
    let (&(class, _), a_table) = model.0.delta_tables.iter().next().expect("a table");
    let a_table = a_table.clone();
    model.0.delta_tables.insert((class, d), a_table);
    assert!(
        !reconcile_now(&model, &files).adopted.contains(&d),
        "a table"
    );
    // Pages of its id, no table.
    let mut model = run.model.clone();
    let (&key, &info) = model.0.pages.iter().next().expect("a page");
    model.0.pages.insert(
        StackDeltaPageKey {
            file_id: d.0,
            page: key.page,
        },
        info,
    );
    assert!(
        !reconcile_now(&model, &files).adopted.contains(&d),
        "a page"
    );
}

#[test]
fn a_table_in_another_size_class_is_not_adopted() {
    // A's table and pages moved, consistently, one class up: everything
    // else is a fresh load's, but a fresh load would use the smaller class.
    let files = Files::abc();
    let run = files.earlier_run();
    let a = FileId(0xa);
    let mut model = run.model.clone();
    let (&(class, _), _) = model
        .0
        .delta_tables
        .iter()
        .find(|((_, id), _)| *id == a)
        .expect("A's table");
    let table = model.0.delta_tables.remove(&(class, a)).expect("A's table");
    model.0.delta_tables.insert((class + 1, a), table);
    for (key, info) in model.0.pages.iter_mut() {
        if key.file_id == a.0 {
            info.map_id = class + 1;
        }
    }
    let r = reconcile_now(&model, &files);
    assert!(!r.adopted.contains(&a), "{:?}", r.adopted);
    assert!(r.to_load.contains(&a));
}

#[test]
fn a_page_map_fuller_than_its_capacity_is_refused_and_a_full_one_is_not() {
    let small = Capacities { pages: 4, ..caps() };
    fn stray(observed: &mut Observed, p: u64) {
        let key = StackDeltaPageKey {
            file_id: 0x77,
            page: p << 16,
        };
        let info = StackDeltaPageInfo {
            first_delta: 0,
            num_deltas: 1,
            map_id: 8,
        };
        observed.pages.insert(key, info);
    }
    let mut observed = Model::new().0;
    (0..4).for_each(|p| stray(&mut observed, p));
    let full = observed.clone();
    assert!(
        reconcile(&full, &[], small, GRACE, t(3)).is_ok(),
        "exactly full"
    );
    stray(&mut observed, 4);
    assert!(matches!(
        reconcile(&observed, &[], small, GRACE, t(3)),
        Err(ReconcileError::OverCapacity {
            map: MapKind::Pages,
            len: 5,
            capacity: 4
        })
    ));
}

#[test]
fn a_table_whose_last_delta_reads_as_zero_is_adopted() {
    // The last delta sits at a page's first byte and uses slot 0: its
    // array entry is all zero, so the dump (which cannot see trailing
    // zero entries) is shorter than the table a fresh load writes.
    let deltas = IntervalData::from_deltas(vec![
        StackDelta::new(0x50_0010, hint::NONE, sp(8)),
        StackDelta::new(0x51_0000, hint::NONE, sp(8)),
    ]);
    let mut files = Files(BTreeMap::new());
    files.0.insert(FileId(0xe), (deltas.clone(), None));
    let mut run = Run::new();
    run.load(0xe, &deltas, None);
    let (_, seen) = run.model.0.delta_tables.iter().next().expect("the table");
    let written = run.book.loaded()[&FileId(0xe)].map_ref.page_entries;
    assert!(
        seen.len() < 2 && written == 2,
        "the dump lost the zero entry"
    );
    let r = reconcile_now(&run.model, &files);
    assert_eq!(r.adopted, [FileId(0xe)]);
}

#[test]
fn more_tables_in_a_class_than_its_outer_map_holds_are_refused() {
    let small = Capacities {
        outer_entries: 2,
        ..caps()
    };
    let mut observed = Model::new().0;
    for id in 1..=3 {
        observed
            .delta_tables
            .insert((8, FileId(id)), vec![abi::StackDelta::default(); 1]);
    }
    assert!(matches!(
        reconcile(&observed, &[], small, GRACE, t(3)),
        Err(ReconcileError::OverCapacity {
            map: MapKind::DeltaTables(8),
            len: 3,
            capacity: 2
        })
    ));
}
