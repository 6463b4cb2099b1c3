//! Invariants 2 and 3 on chosen pages with a bounded number of lookups.
//!
//! The full checks of [`crate::checker`] look up every delta of every page,
//! which costs milliseconds once a few real libraries are loaded. The
//! simulator checks after every op and every step, so it checks what changed
//! with a bounded sample instead: the page bounds, up to `deltas` delta
//! addresses of the page (each with its neighbours on either side; all of
//! them when the page has no more), and `spread` evenly spaced addresses.
//! `offset` rotates which deltas a capped page contributes, so that repeated
//! checks of the same page cover all of it over time. The expected answers
//! still come from the source deltas, as in the full checks.

use eim_core::manager::StateView;
use eim_machine::abi::{StackDeltaPageKey, PAGE_BITS, PAGE_SIZE};
use eim_machine::deltas::IntervalData;
use eim_machine::FileId;

use crate::checker::{check_addresses_safe, Sources, Violation};
use eim_sim::kernel::SimMaps;
use eim_sim::reader::{expected, SimReader};

/// How much of a page to look up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Delta addresses per page (each with its two neighbours).
    pub deltas: usize,
    /// Evenly spaced addresses per page.
    pub spread: u64,
    /// Rotates the choice of deltas and spread points.
    pub offset: u64,
}

impl Sampling {
    /// Every delta of the page, as the full checks do.
    pub const ALL: Sampling = Sampling {
        deltas: usize::MAX,
        spread: 16,
        offset: 0,
    };

    pub fn rotated(self, offset: u64) -> Sampling {
        Sampling { offset, ..self }
    }
}

/// The addresses to look up in `page` of a file with deltas `data`.
pub fn page_addresses(data: &IntervalData, page: u64, s: Sampling) -> Vec<u64> {
    let end = page + PAGE_SIZE;
    let from = data.partition_point(|d| d.address < page);
    let to = data.partition_point(|d| d.address < end);
    let count = to - from;
    let mut out = vec![page, end - 1];
    let mut push = |a: u64| out.extend([a.saturating_sub(1), a, a + 1]);
    if count <= s.deltas {
        data.iter_from(from)
            .take(to - from)
            .for_each(|d| push(d.address));
    } else {
        let take = s.deltas.max(1) as u64;
        let n = count as u64;
        for k in 0..take {
            let i = (k * n / take + s.offset) % n;
            if let Some(d) = data.get(from + i as usize) {
                push(d.address);
            }
        }
    }
    let step = (PAGE_SIZE / s.spread.max(1)).max(1);
    let shift = s.offset.wrapping_mul(0x9e37) % step;
    out.extend((0..s.spread).map(|i| page + (i * step + 7 + shift) % PAGE_SIZE));
    out.retain(|a| a >> PAGE_BITS == page >> PAGE_BITS);
    out.sort_unstable();
    out.dedup();
    out
}

/// The page keys a file's table can have: every page from its first
/// delta's to its last delta's (the encoder writes empty pages too).
pub fn candidate_pages(
    file_id: FileId,
    data: &IntervalData,
) -> impl Iterator<Item = StackDeltaPageKey> {
    let range = match (data.first(), data.last()) {
        (Some(a), Some(b)) => (a.address >> PAGE_BITS)..(b.address >> PAGE_BITS) + 1,
        _ => 0..0,
    };
    range.map(move |p| StackDeltaPageKey {
        file_id: file_id.0,
        page: p << PAGE_BITS,
    })
}

/// The page entries the maps hold for `file_id`.
pub fn present_pages(maps: &SimMaps, sources: &Sources, file_id: FileId) -> Vec<StackDeltaPageKey> {
    match sources.get(&file_id) {
        Some(data) => candidate_pages(file_id, data)
            .filter(|k| maps.page(k).is_some())
            .collect(),
        None => Vec::new(),
    }
}

/// Invariant 2 on the given page keys (absent keys are skipped: a reader
/// finds no page there, which is safe).
pub fn check_pages_safe(
    maps: &SimMaps,
    sources: &Sources,
    keys: &[StackDeltaPageKey],
    s: Sampling,
) -> Result<(), Violation> {
    let reader = SimReader::new(maps);
    for key in keys {
        if maps.page(key).is_none() {
            continue;
        }
        let file_id = FileId(key.file_id);
        let Some(data) = sources.get(&file_id) else {
            return Err(Violation::Projection(format!(
                "page entry for file {file_id}, which no source ever produced"
            )));
        };
        check_addresses_safe(&reader, file_id, data, page_addresses(data, key.page, s))?;
    }
    Ok(())
}

/// Invariant 3 on the pages of the given loaded files (files that are not
/// loaded are skipped), and for every known file: loaded iff it has deltas.
pub fn check_files_equivalent(
    state: &StateView,
    maps: &SimMaps,
    sources: &Sources,
    files: impl IntoIterator<Item = FileId>,
    s: Sampling,
) -> Result<(), Violation> {
    let reader = SimReader::new(maps);
    for file_id in files {
        if !state.book.loaded().contains_key(&file_id) {
            continue;
        }
        let Some(data) = sources.get(&file_id) else {
            return Err(Violation::Projection(format!(
                "loaded file {file_id} has no source"
            )));
        };
        // The span from the source deltas: dead pages (no entry) included.
        for page in crate::checker::span_pages(data) {
            check_page_equivalent(&reader, file_id, data, page, s)?;
        }
    }
    for file_id in state.files.keys() {
        let has_deltas = sources.get(file_id).is_some_and(|d| !d.is_empty());
        let loaded = state.book.loaded().contains_key(file_id);
        if has_deltas != loaded {
            return Err(Violation::Projection(format!(
                "file {file_id} is known, has deltas: {has_deltas}, has a table: {loaded}"
            )));
        }
    }
    Ok(())
}

/// Invariant 3 on one page of a loaded file.
pub fn check_page_equivalent(
    reader: &SimReader<'_>,
    file_id: FileId,
    data: &IntervalData,
    page: u64,
    s: Sampling,
) -> Result<(), Violation> {
    for address in page_addresses(data, page, s) {
        let result = reader.lookup(file_id, address);
        let want = expected(data, address);
        if !crate::checker::equivalent(&result, data, address) {
            return Err(Violation::LookupEquivalence {
                file_id,
                address,
                got: format!("{result:?}"),
                want,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_machine::deltas::{hint, info, StackDelta};

    fn dense(count: u64) -> IntervalData {
        let mut d = IntervalData::new();
        for i in 0..count {
            let r = if i % 2 == 0 {
                info::sp(8)
            } else {
                info::sp(16)
            };
            d.add(StackDelta::new(0x1_0000 + i * 4, hint::NONE, r));
        }
        d
    }

    #[test]
    fn a_small_page_is_checked_whole_and_a_large_one_in_rotating_parts() {
        let d = dense(10);
        let all = page_addresses(&d, 0x1_0000, Sampling::ALL);
        for x in &d {
            assert!(all.contains(&x.address) && all.contains(&(x.address + 1)));
        }
        let d = dense(1000);
        let s = Sampling {
            deltas: 8,
            spread: 2,
            offset: 0,
        };
        let mut covered = std::collections::BTreeSet::new();
        for offset in 0..1000 / 8 + 1 {
            let a = page_addresses(&d, 0x1_0000, s.rotated(offset));
            assert!(a.len() <= 2 + 8 * 3 + 2, "{}", a.len());
            covered.extend(a);
        }
        assert!(
            d.iter().all(|x| covered.contains(&x.address)),
            "rotation covers every delta"
        );
    }

    #[test]
    fn candidate_pages_span_first_to_last_delta() {
        let mut d = IntervalData::new();
        d.add(StackDelta::new(0x1_fff0, hint::NONE, info::sp(8)));
        d.add(StackDelta::new(0x4_0010, hint::GAP, info::INVALID));
        let pages: Vec<u64> = candidate_pages(FileId(1), &d).map(|k| k.page).collect();
        assert_eq!(pages, vec![0x1_0000, 0x2_0000, 0x3_0000, 0x4_0000]);
        assert_eq!(candidate_pages(FileId(1), &IntervalData::new()).count(), 0);
    }
}
