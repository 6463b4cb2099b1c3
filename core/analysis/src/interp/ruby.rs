//! Ruby (`libruby[-X.Y].so.A.B.C`).
//!
//! Extracts the version from the string at `ruby_version` (2.5.0 <= v <
//! 3.3.0), the address of `ruby_single_main_ractor` (3.0+) or
//! `ruby_current_execution_context_ptr` (before), and asks for `rb_vm_exec`
//! (`ruby_exec_node` before 2.6) in `interpreter_offsets` (program 6).

use super::access::{read_cstr, Symbol};
use super::names::RUBY;
use super::InterpreterData;
use super::{InterpreterOffsets, Loaded, LoaderError, LoaderInfo, Version};
use eim_machine::abi::program;

pub const NAME: &str = "ruby";

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RubyData {
    pub(crate) version: Version,
    /// `ruby_single_main_ractor` (3.0+) or `ruby_current_execution_context_ptr`.
    pub(crate) context: u64,
    pub(crate) vm_exec: Symbol,
}

impl InterpreterData for RubyData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("context", super::hex(self.context)),
            ("vm_exec", self.vm_exec.fact()),
        ]
    }
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    if !RUBY.is_match(info.name) {
        return Ok(None);
    }
    let syms = info.symbols();
    let sym = syms.require("ruby_version")?;
    let text = read_cstr(info.elf, sym.address, 32, "ruby_version")?;
    let version = Version::parse_prefix(&text)
        .ok_or_else(|| {
            LoaderError::Invalid(format!(
                "ruby_version {:?} is not a version",
                String::from_utf8_lossy(&text)
            ))
        })?
        .check(Version(2, 5, 0), Version(3, 3, 0), "2.5.0 to 3.2.x")?;
    let context = if version >= Version(3, 0, 0) {
        syms.require("ruby_single_main_ractor")?.address
    } else {
        syms.require("ruby_current_execution_context_ptr")?.address
    };
    let vm_exec = if version >= Version(2, 6, 0) {
        syms.require("rb_vm_exec")?
    } else {
        syms.require("ruby_exec_node")?
    };
    Ok(Some(Loaded::new(
        RubyData {
            version,
            context,
            vm_exec,
        },
        Some(InterpreterOffsets::one(program::RUBY, vm_exec.range())),
    )))
}
