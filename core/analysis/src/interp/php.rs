//! PHP (the `php`, `php-cgi`, `php-fpm` executables and `libphp*.so`) and
//! its opcache extension (`opcache.so`).
//!
//! PHP: extracts the version from the read-only string after
//! `X-Powered-By: PHP/` (7.3.0 <= v < 8.4.0), the address of
//! `executor_globals`, and asks for `execute_ex` in `interpreter_offsets`
//! (program 5). From PHP 8 on it also reads which VM the build uses and,
//! for the hybrid VM, the return address JIT-compiled code unwinds to
//! ([`JitReturn`]). As upstream, a failure there does not refuse the file:
//! the interpreter still unwinds, only frames of JIT code do not, and the
//! reason is kept in the data.
//!
//! Opcache: extracts the extension's version from its
//! `zend_extension_entry` (the relocated `version` pointer); versions before
//! 8.0 are "not mine", as upstream. For 8.0 and later it also needs where
//! the JIT buffer's start and size are kept ([`JitBufferPointers`]), read
//! from `zend_jit_unprotect`; without them the file is refused.

use super::access::{read_cstr, Relocations, Symbol};
use super::names::{OPCACHE, PHP};
pub use super::php_code::JitBufferPointers;
use super::php_code::{
    jit_buffer_pointers, jit_return_address, vm_kind, EXECUTE_EX_BYTES, UNPROTECT_BYTES,
    VM_KIND_BYTES, VM_KIND_HYBRID,
};
use super::InterpreterData;
use super::{InterpreterOffsets, Loaded, LoaderError, LoaderInfo, Version};
use crate::elf::Elf;
use eim_machine::abi::program;

pub const NAME: &str = "php";
pub const OPCACHE_NAME: &str = "php-opcache";

const POWERED_BY: &[u8] = b"X-Powered-By: PHP/";
/// Read-only data searched for the version string.
const MAX_RODATA: u64 = 256 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhpData {
    pub version: Version,
    pub(crate) executor_globals: u64,
    pub execute_ex: Symbol,
    pub jit_return: JitReturn,
}

/// Where frames of JIT-compiled code return to (upstream's `rtAddr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JitReturn {
    /// PHP 7 has no JIT.
    NoJit,
    /// `zend_vm_kind` returns this, not the hybrid VM: JIT code is called
    /// like any function and leaves return addresses of its own.
    NotHybrid { vm_kind: u32 },
    /// The hybrid VM jumps into opcode handlers and JIT code from
    /// `execute_ex`; they return to this address.
    Address(u64),
    /// The VM or the address could not be read: JIT frames will not unwind.
    Unknown(String),
}

impl JitReturn {
    /// The address the BPF side gets (0 when there is none, as upstream).
    pub fn address(&self) -> u64 {
        match self {
            JitReturn::Address(a) => *a,
            _ => 0,
        }
    }
}

impl InterpreterData for PhpData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("executor globals", super::hex(self.executor_globals)),
            ("execute_ex", self.execute_ex.fact()),
        ]
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpcacheData {
    pub version: Version,
    /// The extension entry the version was read from.
    pub(crate) extension_entry: u64,
    /// The variables holding the JIT buffer's start and size.
    pub jit_buffer: JitBufferPointers,
}

impl InterpreterData for OpcacheData {
    fn loader(&self) -> &'static str {
        OPCACHE_NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("extension entry", super::hex(self.extension_entry)),
        ]
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
    let jit_return = if version < Version(8, 0, 0) {
        JitReturn::NoJit
    } else {
        jit_return(info, execute_ex).unwrap_or_else(|e| JitReturn::Unknown(e.to_string()))
    };
    Ok(Some(Loaded::new(
        PhpData {
            version,
            executor_globals,
            execute_ex,
            jit_return,
        },
        Some(InterpreterOffsets::one(program::PHP, execute_ex.range())),
    )))
}

/// The first `max` bytes of a function, or fewer when its symbol says it
/// is shorter.
fn code_of<'d>(
    info: &LoaderInfo<'_, 'd>,
    name: &str,
    max: u64,
) -> Result<(Symbol, std::borrow::Cow<'d, [u8]>), LoaderError> {
    let sym = info.symbols().require(name)?;
    let len = if sym.size == 0 {
        max
    } else {
        sym.size.min(max)
    };
    let code = info
        .elf
        .virtual_memory(sym.address, len as usize)
        .ok_or_else(|| LoaderError::Unreadable {
            what: format!("the code of {name}"),
            addr: sym.address,
        })?;
    Ok((sym, code))
}

fn jit_return(info: &LoaderInfo<'_, '_>, execute_ex: Symbol) -> Result<JitReturn, LoaderError> {
    let arch = info.elf.arch;
    let (_, code) = code_of(info, "zend_vm_kind", VM_KIND_BYTES)?;
    let kind = vm_kind(arch, &code)?;
    if kind != VM_KIND_HYBRID {
        return Ok(JitReturn::NotHybrid { vm_kind: kind });
    }
    let (_, code) = code_of(info, "execute_ex", EXECUTE_EX_BYTES)?;
    let address = jit_return_address(arch, &code, execute_ex.address)?;
    Ok(JitReturn::Address(address))
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
    let (unprotect, code) = code_of(info, "zend_jit_unprotect", UNPROTECT_BYTES)?;
    let jit_buffer = jit_buffer_pointers(info.elf.arch, &code, unprotect.address)?;
    Ok(Some(Loaded::new(
        OpcacheData {
            version,
            extension_entry: entry.address,
            jit_buffer,
        },
        None,
    )))
}
