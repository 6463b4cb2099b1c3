//! A view of the maps a backend holds, the same way for the simulated
//! kernel and the real one: what eim needs to see of a backend beyond
//! applying ops ([`Inspect`]): how much its maps hold, and what the
//! unwinder's lookup answers for an address. Both are read from the maps
//! themselves (the simulated ones, or the kernel's through its own lookup
//! program), never from the manager's book. [`status`] audits pinned maps
//! (`eim status`).

pub mod status;

use std::collections::BTreeMap;

use serde::Serialize;

use eim_machine::abi::{self, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo};
use eim_machine::ops::Backend;
use eim_machine::FileId;
use eim_sim::{LookupError, Resolved, SimMaps, SimReader};

use eim_bpf::lookup_record as klookup;
use eim_bpf::{KernelError, KernelMaps, PinReport, PinnedReader};

/// How many entries the maps hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// `stack_delta_page_to_info` entries.
    pub pages: usize,
    /// Published delta tables (inner arrays) per size class.
    pub tables: BTreeMap<u16, usize>,
    /// `unwind_info_array` slots holding a rule.
    pub unwind_infos: usize,
}

/// The page entry a lookup used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PageUsed {
    /// The page's ELF address (64 KiB aligned).
    pub page: u64,
    /// The size class of the file's table.
    pub map_id: u16,
    pub first_delta: u32,
    pub num_deltas: u16,
}

/// What the unwinder does at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The trace ends here (the entry point, the outermost frame).
    Stop,
    /// A command (PLT, signal frame, frame pointer, ...).
    Command { command: u16 },
    /// A rule from `unwind_info_array`, merge adjustment applied.
    Rule {
        slot: u16,
        opcode: u8,
        param: i32,
        fp_opcode: u8,
        fp_param: i32,
    },
    /// The lookup failed with the unwinder's error.
    Error { code: &'static str },
}

/// A lookup's answer: the page, the delta and the outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LookupAnswer {
    pub page: Option<PageUsed>,
    /// Index of the delta in force in the file's table.
    pub delta_index: Option<u32>,
    pub outcome: Outcome,
}

fn rule(slot: u16, info: UnwindInfo) -> Outcome {
    Outcome::Rule {
        slot,
        opcode: info.opcode,
        param: info.param,
        fp_opcode: info.fp_opcode,
        fp_param: info.fp_param,
    }
}

fn page_used(page: u64, info: StackDeltaPageInfo) -> PageUsed {
    PageUsed {
        page,
        map_id: info.map_id,
        first_delta: info.first_delta,
        num_deltas: info.num_deltas,
    }
}

/// Why a backend could not be inspected.
#[derive(Debug, thiserror::Error)]
#[error("reading the {backend} maps: {message}")]
pub struct InspectError {
    pub backend: &'static str,
    pub message: String,
}

/// A backend eim can report on.
pub trait Inspect: Backend {
    /// "simulated" or "kernel".
    const NAME: &'static str;

    fn usage(&self) -> Result<Usage, InspectError>;

    /// The unwinder's lookup of `address` (an ELF virtual address) of
    /// `file_id`, as its reader performs it.
    fn lookup(&self, file_id: FileId, address: u64) -> Result<LookupAnswer, InspectError>;

    /// What the start found in the pin directory, for pinned maps.
    fn pin_report(&self) -> Option<&PinReport> {
        None
    }

    /// Tells the readers of pinned maps the file-id collisions the host
    /// has seen, `total` and the first of `listed` (`eim status` prints
    /// them: the maps cannot say what was not loaded). Nothing for maps no
    /// one else reads.
    fn record_collisions(&mut self, _total: u64, _listed: &[String]) {}
}

impl Inspect for SimMaps {
    const NAME: &'static str = "simulated";

    fn usage(&self) -> Result<Usage, InspectError> {
        let mut tables = BTreeMap::new();
        for (class, _file) in self.delta_tables().keys() {
            *tables.entry(*class).or_insert(0) += 1;
        }
        Ok(Usage {
            pages: self.pages().len(),
            tables,
            // A slot holding a rule is never all zeros (zero is the command
            // INVALID, and commands are not stored in slots).
            unwind_infos: self
                .unwind_infos()
                .iter()
                .filter(|u| **u != UnwindInfo::default())
                .count(),
        })
    }

    fn lookup(&self, file_id: FileId, address: u64) -> Result<LookupAnswer, InspectError> {
        let page_address = address & !abi::PAGE_MASK;
        let page = self
            .page(&StackDeltaPageKey {
                file_id: file_id.0,
                page: page_address,
            })
            .map(|info| page_used(page_address, info));
        let reader = SimReader::new(self);
        let delta_index = match reader.get_stack_delta(file_id, address) {
            Ok(hit) => Some(hit.index),
            Err(
                LookupError::StackDeltaInvalid { index, .. }
                | LookupError::BadUnwindInfoIndex { index, .. },
            ) => Some(index),
            Err(_) => None,
        };
        let outcome = match reader.lookup(file_id, address) {
            Ok(Resolved::Stop) => Outcome::Stop,
            Ok(Resolved::Command(command)) => Outcome::Command { command },
            Ok(Resolved::Rule { info, slot, .. }) => rule(slot, info),
            Err(e) => Outcome::Error { code: e.code() },
        };
        Ok(LookupAnswer {
            page,
            delta_index,
            outcome,
        })
    }
}

fn kernel_error(e: KernelError) -> InspectError {
    InspectError {
        backend: KernelMaps::NAME,
        message: e.to_string(),
    }
}

impl Inspect for KernelMaps {
    const NAME: &'static str = "kernel";

    fn pin_report(&self) -> Option<&PinReport> {
        KernelMaps::pin_report(self)
    }

    fn record_collisions(&mut self, total: u64, listed: &[String]) {
        if let Err(e) = KernelMaps::record_collisions(self, total, listed) {
            tracing::warn!("cannot record {total} file id collisions in the lock file: {e}");
        }
    }

    fn usage(&self) -> Result<Usage, InspectError> {
        let stats = self.stats().map_err(kernel_error)?;
        Ok(Usage {
            pages: stats.pages,
            tables: stats.tables,
            unwind_infos: stats.unwind_slots,
        })
    }

    fn lookup(&self, file_id: FileId, address: u64) -> Result<LookupAnswer, InspectError> {
        KernelMaps::lookup(self, file_id, address)
            .map(kernel_answer)
            .map_err(kernel_error)
    }
}

/// The lookup program's record as an answer.
fn kernel_answer(r: klookup::LookupResult) -> LookupAnswer {
    let page = (r.have & klookup::have::PAGE != 0).then(|| page_used(r.page, r.page_info));
    // The program records the index before it reads the delta; it is
    // the delta in force only if the read succeeded.
    let delta_index = (r.have & klookup::have::DELTA != 0).then_some(r.index);
    let outcome = match r.resolved() {
        Ok(Resolved::Stop) => Outcome::Stop,
        Ok(Resolved::Command(command)) => Outcome::Command { command },
        Ok(Resolved::Rule { info, slot, .. }) => rule(slot, info),
        Err(code) => Outcome::Error {
            code: klookup::error_name(code).unwrap_or("unknown lookup error"),
        },
    };
    LookupAnswer {
        page,
        delta_index,
        outcome,
    }
}

/// The lookup program's answer over live pinned maps.
pub fn pinned_lookup(
    reader: &PinnedReader,
    file_id: FileId,
    address: u64,
) -> Result<LookupAnswer, InspectError> {
    // Within one generation of the owner's writes, so that the answer is
    // not one of a plan caught half-way (a page whose table is not yet
    // published); after every attempt overlapped a write, the last one.
    reader
        .lookup_consistent(file_id, address)
        .map(|snapshot| kernel_answer(snapshot.into_value()))
        .map_err(|e| InspectError {
            backend: "pinned",
            message: e.to_string(),
        })
}
