//! The manager's metrics under upstream's names: as a list for the JSON
//! reports and as a table for the text ones (`eim scan`/`watch`'s summary
//! and `eim demo`'s report show the same).

use eim_core::metrics::{self, Summary};
use serde::Serialize;

use crate::report::table::{grouped, Align, Table};

/// One metric's value.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Metric {
    pub id: u32,
    pub name: &'static str,
    pub value: u64,
}

/// Every metric upstream names, with its value in `summary` (0 when the
/// manager set none).
pub fn list(summary: &Summary) -> Vec<Metric> {
    metrics::UPSTREAM_NAMES
        .iter()
        .map(|&(id, name)| Metric {
            id: id.0,
            name,
            value: summary.get(&id).copied().unwrap_or(0),
        })
        .collect()
}

/// The metrics as a text table: name, id, value.
pub fn table(metrics: &[Metric]) -> String {
    let mut t = Table::new(&[
        ("metric", Align::Left),
        ("id", Align::Right),
        ("value", Align::Right),
    ]);
    for m in metrics {
        t.row([m.name.to_string(), m.id.to_string(), grouped(m.value)]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_upstream_metric_is_listed_with_its_value_or_zero() {
        let mut summary = Summary::new();
        summary.insert(metrics::UNWIND_INFO_ARRAY_SIZE, 1400);
        let list = list(&summary);
        assert_eq!(list.len(), metrics::UPSTREAM_NAMES.len());
        let slots = list.iter().find(|m| m.id == 133).expect("id 133");
        assert_eq!((slots.name, slots.value), ("UnwindInfoArraySize", 1400));
        assert!(list.iter().filter(|m| m.id != 133).all(|m| m.value == 0));
        let text = table(&list);
        assert!(
            text.contains("UnwindInfoArraySize") && text.contains("1,400"),
            "{text}"
        );
    }
}
