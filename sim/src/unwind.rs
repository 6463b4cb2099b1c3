//! The simulated kernel as the native unwinder's world: [`SimReader`] as
//! its [`Rules`] (the same `get_stack_delta` the BPF side runs, answering
//! with `lookup.h`'s codes); `SimMaps` is its `Mappings` (its copy of
//! `eim_process_mappings`) and a core [`Capture`](eim_machine::unwind::Capture)
//! of a thread's registers and stack its memory.
//!
//! With these, `eim_machine::unwind::unwind` walks a stack over the simulated
//! maps exactly as the BPF unwinder walks it over the kernel's.

use eim_machine::unwind::{Rule, Rules};
use eim_machine::FileId;

use crate::reader::{LookupError, Resolved, SimReader};

/// `EIM_LOOKUP_ERR_*` (`bpf/lookup.h`), as the core defines them.
pub use eim_machine::unwind::lookup_code;

impl LookupError {
    /// The `EIM_LOOKUP_ERR_*` number of this error.
    pub fn lookup_code(&self) -> u32 {
        match self {
            Self::TextSection { .. } => lookup_code::ERR_TEXT_SECTION,
            Self::OuterMap { .. } => lookup_code::ERR_OUTER_MAP,
            Self::InnerMap { .. } => lookup_code::ERR_INNER_MAP,
            Self::Iterations { .. } => lookup_code::ERR_ITERATIONS,
            Self::Range { .. } => lookup_code::ERR_RANGE,
            Self::StackDeltaInvalid { .. } => lookup_code::ERR_STACK_DELTA_INVALID,
            Self::BadUnwindInfoIndex { .. } => lookup_code::ERR_BAD_UNWIND_INFO_INDEX,
        }
    }
}

impl Rules for SimReader<'_> {
    fn rule(&self, file_id: u64, address: u64) -> Result<Rule, u32> {
        match self.lookup(FileId(file_id), address) {
            Ok(Resolved::Stop) => Ok(Rule::Stop),
            Ok(Resolved::Command(command)) => Ok(Rule::Command(command)),
            Ok(Resolved::Rule { info, .. }) => Ok(Rule::Info(info)),
            Err(e) => Err(e.lookup_code()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use eim_core::provider::MemoryProvider;
    use eim_core::{ExecutableInfoManager, Tracers};
    use eim_machine::abi::{opcode, ProcessMapping, ProcessMappings, UnwindInfo};
    use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
    use eim_machine::ops::{Backend, MapOp};
    use eim_machine::unwind::Mappings;
    use eim_machine::unwind::{frame_flag, unwind, Arch, Capture, Frame, Memory, Regs, StopReason};

    use super::*;
    use crate::kernel::{SimConfig, SimMaps};

    const FILE: u64 = 0x77;
    const BIAS: u64 = 0x5555_0000_0000;
    const PID: u32 = 100;

    /// A file with `main` (0x1000: STOP), `f` (0x1100: CFA = sp + 16, with
    /// a merged `ret` tail) and its INVALID end, loaded into simulated maps
    /// by the manager, as the host side loads files, and process `PID`
    /// mapping it at `BIAS`.
    fn maps() -> SimMaps {
        let mut deltas = IntervalData::new();
        deltas.add(StackDelta::new(0x1000, hint::KEEP, info::STOP));
        deltas.add(StackDelta::new(0x1100, hint::KEEP, info::sp(16)));
        deltas.add(StackDelta::new(0x1120, hint::KEEP, info::sp(8)));
        deltas.add(StackDelta::new(0x1121, hint::KEEP, info::sp(16)));
        deltas.add(StackDelta::new(0x1140, hint::GAP, info::INVALID));
        let provider = MemoryProvider::new();
        provider.insert(FileId(FILE), deltas);
        let sim = SimMaps::new(SimConfig::default()).expect("default config");
        let manager = ExecutableInfoManager::new(provider, sim, Tracers::none());
        manager
            .add_or_inc_ref(FileId(FILE), &FileId(FILE))
            .expect("loads");
        let mut sim = manager.with_backend(|sim| sim.clone());
        sim.apply(&MapOp::PutProcessMappings {
            pid: PID,
            mappings: Arc::new(ProcessMappings {
                mappings: vec![ProcessMapping {
                    start: BIAS + 0x1000,
                    end: BIAS + 0x2000,
                    file_offset: 0x1000,
                    bias: BIAS,
                    file_id: FILE,
                }],
            }),
        })
        .expect("the process's mappings");
        sim
    }

    fn capture(pc: u64, words: &[u64]) -> Capture {
        Capture {
            pid: PID,
            tid: PID + 1,
            regs: Regs {
                pc,
                sp: 0x7ff0_0000,
                ..Regs::zero(Arch::X86_64)
            },
            stack_base: 0x7ff0_0000,
            stack: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn the_twin_walks_a_captured_stack_over_simulated_maps() {
        let sim = maps();
        let reader = SimReader::new(&sim);
        // f at 0x1110 (CFA = sp + 16), called from main at 0x1010.
        let c = capture(BIAS + 0x1110, &[0xdead, BIAS + 0x1010]);
        let stack = unwind(c.pid, c.tid, c.regs, &reader, &c, &sim);
        assert_eq!(stack.stop, StopReason::End);
        let frame = |address, flags| Frame {
            pc: BIAS + address,
            file_id: FILE,
            address,
            flags,
        };
        assert_eq!(
            stack.frames,
            vec![frame(0x1110, 0), frame(0x1010, frame_flag::RETURN_ADDRESS)]
        );
        // At the `ret` (0x1120, sp + 8) the return address is the first word.
        let c = capture(BIAS + 0x1120, &[BIAS + 0x1010]);
        let stack = unwind(c.pid, c.tid, c.regs, &reader, &c, &sim);
        assert_eq!(stack.stop, StopReason::End);
        assert_eq!(stack.frames.len(), 2);
    }

    #[test]
    fn lookup_errors_arrive_with_their_codes() {
        let sim = maps();
        let reader = SimReader::new(&sim);
        assert_eq!(
            reader.rule(FILE, 0x1150),
            Err(lookup_code::ERR_STACK_DELTA_INVALID)
        );
        assert_eq!(
            reader.rule(FILE + 1, 0x1150),
            Err(lookup_code::ERR_TEXT_SECTION)
        );
        assert_eq!(reader.rule(FILE, 0x1000), Ok(Rule::Stop));
        assert_eq!(
            reader.rule(FILE, 0x1130),
            Ok(Rule::Info(UnwindInfo::new(opcode::BASE_SP, 16, 0, 0)))
        );
        // The walk reports an INVALID delta as its own reason.
        let c = capture(BIAS + 0x1150, &[]);
        let stack = unwind(c.pid, c.tid, c.regs, &reader, &c, &sim);
        assert_eq!(stack.stop, StopReason::Invalid);
        // A read past the capture fails: CFA = sp + 16 needs 16 bytes.
        let c = capture(BIAS + 0x1110, &[0]);
        let stack = unwind(c.pid, c.tid, c.regs, &reader, &c, &sim);
        assert_eq!(stack.stop, StopReason::ReadError);
    }

    #[test]
    fn code_names_agree_with_the_errors() {
        let file_id = FileId(1);
        let errors = [
            LookupError::TextSection { file_id, page: 0 },
            LookupError::OuterMap {
                file_id,
                page: 0,
                map_id: 0,
            },
            LookupError::InnerMap {
                file_id,
                page: 0,
                map_id: 0,
            },
            LookupError::Iterations {
                file_id,
                page: 0,
                first_delta: 0,
                num_deltas: 0,
            },
            LookupError::Range {
                file_id,
                page: 0,
                index: 0,
            },
            LookupError::StackDeltaInvalid {
                file_id,
                address: 0,
                index: 0,
            },
            LookupError::BadUnwindInfoIndex {
                file_id,
                index: 0,
                slot: 0,
            },
        ];
        let mut codes: Vec<u32> = errors.iter().map(|e| e.lookup_code()).collect();
        for e in &errors {
            assert_eq!(lookup_code::name(e.lookup_code()), Some(e.code()));
        }
        codes.dedup();
        assert_eq!(codes, (1..=7).collect::<Vec<_>>());
        assert_eq!(lookup_code::name(0), None);
        assert_eq!(lookup_code::name(8), None);
    }

    #[test]
    fn capture_reads_only_inside_its_copy() {
        let c = capture(0, &[1, 2]);
        assert_eq!(c.read_u64(c.stack_base), Some(1));
        assert_eq!(c.read_u64(c.stack_base + 8), Some(2));
        assert_eq!(c.read_u64(c.stack_base + 9), None);
        assert_eq!(c.read_u64(c.stack_base - 1), None);
        assert_eq!(c.read_u64(u64::MAX), None);
    }

    #[test]
    fn the_simulated_mappings_are_found_by_pid_and_range() {
        let t = maps();
        assert_eq!(t.find(PID, BIAS + 0x1000).map(|m| m.file_id), Some(FILE));
        assert_eq!(t.find(PID, BIAS + 0x2000), None);
        assert_eq!(t.find(PID + 1, BIAS + 0x1000), None);
    }
}
