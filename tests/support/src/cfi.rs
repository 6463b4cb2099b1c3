//! gimli's decoding of `.eh_frame`: every row of every FDE, the floor a CFI
//! walk can reach (a benchmark's baseline, and a test's count to compare
//! eim's walk with).

use gimli::{BaseAddresses, CieOrFde, EhFrame, UnwindContext, UnwindSection};

/// The rows of every FDE of an `.eh_frame` section loaded at `address`;
/// FDEs gimli cannot parse are skipped.
pub fn gimli_rows(eh_frame: &[u8], address: u64) -> usize {
    let eh = EhFrame::new(eh_frame, gimli::LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(address);
    let mut ctx = UnwindContext::new();
    let mut entries = eh.entries(&bases);
    let mut rows = 0;
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            let Ok(fde) = partial.parse(|_, b, o| eh.cie_from_offset(b, o)) else {
                continue;
            };
            let Ok(mut table) = fde.rows(&eh, &bases, &mut ctx) else {
                continue;
            };
            while let Ok(Some(row)) = table.next_row() {
                std::hint::black_box(row.cfa());
                rows += 1;
            }
        }
    }
    rows
}
