//! Upstream's five manager metrics, by their upstream ids.

use std::collections::BTreeMap;

/// A metric id, as upstream numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MetricId(pub u32);

/// Files whose tables are in the kernel (gauge).
pub const NUM_EXE_ID_LOADED_TO_EBPF: MetricId = MetricId(43);
/// `unwind_info_array` slots holding a rule (gauge).
pub const UNWIND_INFO_ARRAY_SIZE: MetricId = MetricId(133);
/// Page entries of loaded files (gauge).
pub const HASHMAP_NUM_STACK_DELTA_PAGES: MetricId = MetricId(134);
/// Successful extractions since the last read (counter, reset by reading).
pub const STACK_DELTA_PROVIDER_SUCCESS: MetricId = MetricId(271);
/// Failed extractions since the last read, files that vanished excluded.
pub const STACK_DELTA_PROVIDER_EXTRACTION_ERROR: MetricId = MetricId(204);

/// Each metric's name in upstream, for reports.
pub const UPSTREAM_NAMES: [(MetricId, &str); 5] = [
    (NUM_EXE_ID_LOADED_TO_EBPF, "NumExeIDLoadedToEBPF"),
    (UNWIND_INFO_ARRAY_SIZE, "UnwindInfoArraySize"),
    (HASHMAP_NUM_STACK_DELTA_PAGES, "HashmapNumStackDeltaPages"),
    (STACK_DELTA_PROVIDER_SUCCESS, "StackDeltaProviderSuccess"),
    (
        STACK_DELTA_PROVIDER_EXTRACTION_ERROR,
        "StackDeltaProviderExtractionError",
    ),
];

/// Metric values by id.
pub type Summary = BTreeMap<MetricId, u64>;
