//! Until the host fills the simulated kernel's process-mapping table
//! (`eim_process_mappings`'s copy in `SimMaps`), the twin's mappings are
//! built here from what a host step loaded: each executable mapping of the
//! process whose file the host holds, with the bias its file's `PT_LOAD`
//! segments give. Replace with the simulated table once it exists.

use eim_core::abi::ProcessMapping;
use eim_sim::unwind::ProcessTable;

use crate::backends::inspect::Inspect;
use crate::host::procs::{self, ProcessError};
use crate::host::scan::Host;

use super::symbols::Symbolizer;

/// Process `pid`'s mappings of the files `host` loaded for it. A file that
/// cannot be read for its segments is left out (its frames then stop as
/// unknown mappings).
pub fn process_table<B: Inspect>(
    host: &Host<B>,
    pid: i32,
    symbolizer: &mut Symbolizer,
) -> Result<ProcessTable, ProcessError> {
    let mut mappings = Vec::new();
    for m in procs::exec_mappings(pid)?.files {
        let Some((_, Some(file_id))) = host.mapping_at(pid, m.start)? else {
            continue;
        };
        let symbols = match symbolizer.file(pid, &m) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("{e}");
                continue;
            }
        };
        let Some(vaddr) = symbols.elf_address(m.offset) else {
            continue;
        };
        mappings.push(ProcessMapping {
            start: m.start,
            end: m.end,
            file_offset: m.offset,
            bias: m.start.wrapping_sub(vaddr),
            file_id: file_id.0,
        });
    }
    let mut table = ProcessTable::new();
    table.insert(pid as u32, mappings);
    Ok(table)
}
