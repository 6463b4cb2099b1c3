//! Entry-stub matchers (spec 5.4): the length of a recognised `_start`
//! stub, whose range then unwinds as STOP. Placeholder until implemented:
//! recognises nothing.

use super::Arch;

/// The length of the entry stub at the start of `code`, or 0.
pub fn stub_len(_arch: Arch, _code: &[u8]) -> usize {
    0
}
