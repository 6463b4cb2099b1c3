//! PHP (the `php`, `php-cgi`, `php-fpm` executables and `libphp*.so`) and
//! its opcache extension (`opcache.so`).
//!
//! PHP: extracts the version from the read-only string after
//! `X-Powered-By: PHP/` (7.3.0 <= v < 8.4.0), the address of
//! `executor_globals`, and asks for `execute_ex` in `interpreter_offsets`
//! (program 5).
//!
//! Opcache: extracts the extension's version from its
//! `zend_extension_entry` (the relocated `version` pointer); versions before
//! 8.0 are "not mine", as upstream.

use super::access::{read_cstr, Relocations, Symbol};
use super::names::{OPCACHE, PHP};
use super::{InterpreterOffsets, Loaded, LoaderError, LoaderInfo, Version};
use crate::abi::program;
use crate::elf::Elf;
use crate::info::InterpreterData;

pub const NAME: &str = "php";
pub const OPCACHE_NAME: &str = "php-opcache";

const POWERED_BY: &[u8] = b"X-Powered-By: PHP/";
/// Read-only data searched for the version string.
const MAX_RODATA: u64 = 256 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhpData {
    pub version: Version,
    pub executor_globals: u64,
    pub execute_ex: Symbol,
}

impl InterpreterData for PhpData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpcacheData {
    pub version: Version,
    /// The extension entry the version was read from.
    pub extension_entry: u64,
}

impl InterpreterData for OpcacheData {
    fn loader(&self) -> &'static str {
        OPCACHE_NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }
}

/// The version after the first `X-Powered-By: PHP/` in `.rodata`.
fn powered_by_version(elf: &Elf<'_>) -> Result<Version, LoaderError> {
    let rodata = elf
        .section_region(".rodata", MAX_RODATA)
        .ok_or_else(|| LoaderError::Invalid("no readable .rodata section".into()))?;
    let at = rodata
        .data
        .windows(POWERED_BY.len())
        .position(|w| w == POWERED_BY)
        .ok_or_else(|| LoaderError::Invalid("no X-Powered-By: PHP/ string".into()))?;
    let rest = &rodata.data[at + POWERED_BY.len()..];
    Version::parse_prefix(rest).ok_or_else(|| {
        LoaderError::Invalid(format!(
            "no version after X-Powered-By: PHP/ (found {:?})",
            String::from_utf8_lossy(&rest[..rest.len().min(16)])
        ))
    })
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    if !PHP.is_match(info.name) {
        return Ok(None);
    }
    let version = powered_by_version(info.elf)?.check(
        Version(7, 3, 0),
        Version(8, 4, 0),
        "7.3.0 to 8.3.x",
    )?;
    let syms = info.symbols();
    let executor_globals = syms.require("executor_globals")?.address;
    let execute_ex = syms.require("execute_ex")?;
    Ok(Some(Loaded::new(
        PhpData {
            version,
            executor_globals,
            execute_ex,
        },
        Some(InterpreterOffsets::one(program::PHP, execute_ex.range())),
    )))
}

pub fn load_opcache(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    if !OPCACHE.is_match(info.name) {
        return Ok(None);
    }
    let entry = info.symbols().require("zend_extension_entry")?;
    // zend_extension { char *name; char *version; ... }
    let relocations = Relocations::of(info.elf);
    let ptr = relocations.pointer(info.elf, entry.address + 8, "zend_extension_entry.version")?;
    let text = read_cstr(info.elf, ptr, 64, "the opcache version string")?;
    let version = Version::parse_prefix(&text).ok_or_else(|| {
        LoaderError::Invalid(format!(
            "opcache version {:?} is not a version",
            String::from_utf8_lossy(&text)
        ))
    })?;
    if version < Version(8, 0, 0) {
        return Ok(None);
    }
    Ok(Some(Loaded::new(
        OpcacheData {
            version,
            extension_entry: entry.address,
        },
        None,
    )))
}
