//! The Rust side of `bpf/lookup.h`: the lookup program's return codes and
//! its result record, decoded.
//!
//! The numbers are repeated here (Rust cannot include the C header); a unit
//! test parses `bpf/lookup.h` and fails if any of them disagree.

use eim_machine::abi::{OffsetRange, StackDelta, StackDeltaPageInfo, UnwindInfo, Wire};
use eim_machine::unwind::Resolved;

/// `EIM_LOOKUP_*` return codes (defined once, in `eim_machine::unwind`).
pub use eim_machine::unwind::lookup_code as code;

/// `EIM_LOOKUP_KIND_*`.
pub mod kind {
    pub const NONE: u32 = 0;
    pub const STOP: u32 = 1;
    pub const COMMAND: u32 = 2;
    pub const RULE: u32 = 3;
}

/// `EIM_LOOKUP_HAVE_*`.
pub mod have {
    pub const PAGE: u32 = 1;
    pub const DELTA: u32 = 2;
    pub const SLOT: u32 = 4;
    pub const OFFSETS: u32 = 8;
}

/// `sizeof(EimLookupResult)`.
pub const RESULT_SIZE: usize = 112;

/// The upstream name of a return code (as `eim_sim::LookupError::code`
/// spells it); `None` for OK and unknown codes.
pub use eim_machine::unwind::lookup_code::name as error_name;

/// `EimLookupResult`, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupResult {
    /// The program's return value.
    pub return_value: u32,
    pub code: u32,
    pub kind: u32,
    pub have: u32,
    pub index: u32,
    pub addr_diff: i32,
    pub steps: u32,
    pub page: u64,
    pub page_info: StackDeltaPageInfo,
    pub delta: StackDelta,
    pub command: u16,
    pub slot: u16,
    pub raw_info: UnwindInfo,
    pub info: UnwindInfo,
    pub offsets: OffsetRange,
}

impl LookupResult {
    /// Decodes the result map's value.
    pub fn decode(return_value: u32, b: &[u8]) -> Option<Self> {
        if b.len() != RESULT_SIZE {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        Some(Self {
            return_value,
            code: u32_at(0),
            kind: u32_at(4),
            have: u32_at(8),
            index: u32_at(12),
            addr_diff: u32_at(16) as i32,
            steps: u32_at(20),
            page: u64::from_le_bytes(b[24..32].try_into().unwrap()),
            page_info: StackDeltaPageInfo::read(&b[32..40])?,
            delta: StackDelta::read(&b[40..44])?,
            command: u16::from_le_bytes([b[44], b[45]]),
            slot: u16::from_le_bytes([b[46], b[47]]),
            raw_info: UnwindInfo::read(&b[48..60])?,
            info: UnwindInfo::read(&b[60..72])?,
            offsets: OffsetRange::read(&b[72..112])?,
        })
    }

    /// The answer in the sim reader's type: `Err(code)` for a failure.
    pub fn resolved(&self) -> Result<Resolved, u32> {
        match (self.code, self.kind) {
            (code::OK, kind::STOP) => Ok(Resolved::Stop),
            (code::OK, kind::COMMAND) => Ok(Resolved::Command(self.command)),
            (code::OK, kind::RULE) => Ok(Resolved::Rule {
                info: self.info,
                slot: self.slot,
                addr_diff: self.addr_diff,
            }),
            (code, _) => Err(code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = include_str!("../../bpf/lookup.h");

    fn define(name: &str) -> u32 {
        let n = crate::c_header::define(HEADER, "bpf/lookup.h", name);
        u32::try_from(n).unwrap_or_else(|_| panic!("{name} = {n} is not a u32"))
    }

    #[test]
    fn the_numbers_agree_with_lookup_h() {
        let pairs = [
            ("EIM_LOOKUP_OK", code::OK),
            ("EIM_LOOKUP_ERR_TEXT_SECTION", code::ERR_TEXT_SECTION),
            ("EIM_LOOKUP_ERR_OUTER_MAP", code::ERR_OUTER_MAP),
            ("EIM_LOOKUP_ERR_INNER_MAP", code::ERR_INNER_MAP),
            ("EIM_LOOKUP_ERR_ITERATIONS", code::ERR_ITERATIONS),
            ("EIM_LOOKUP_ERR_RANGE", code::ERR_RANGE),
            (
                "EIM_LOOKUP_ERR_STACK_DELTA_INVALID",
                code::ERR_STACK_DELTA_INVALID,
            ),
            (
                "EIM_LOOKUP_ERR_BAD_UNWIND_INFO_INDEX",
                code::ERR_BAD_UNWIND_INFO_INDEX,
            ),
            ("EIM_LOOKUP_KIND_NONE", kind::NONE),
            ("EIM_LOOKUP_KIND_STOP", kind::STOP),
            ("EIM_LOOKUP_KIND_COMMAND", kind::COMMAND),
            ("EIM_LOOKUP_KIND_RULE", kind::RULE),
            ("EIM_LOOKUP_HAVE_PAGE", have::PAGE),
            ("EIM_LOOKUP_HAVE_DELTA", have::DELTA),
            ("EIM_LOOKUP_HAVE_SLOT", have::SLOT),
            ("EIM_LOOKUP_HAVE_OFFSETS", have::OFFSETS),
        ];
        for (name, value) in pairs {
            assert_eq!(define(name), value, "{name}");
        }
        assert!(HEADER.contains(&format!("EIM_ASSERT_SIZE(EimLookupResult, {RESULT_SIZE});")));
        for (field, at) in [
            ("page", 24),
            ("page_info", 32),
            ("delta", 40),
            ("command", 44),
            ("slot", 46),
            ("raw_info", 48),
            ("info", 60),
            ("offsets", 72),
        ] {
            assert!(
                HEADER.contains(&format!(
                    "EIM_ASSERT_OFFSET(EimLookupResult, {field}, {at});"
                )),
                "{field} at {at}"
            );
        }
    }
}
