//! Perl (`libperl.so*`, or a `perl` executable that does not link one).
//!
//! Extracts the interpreter version from the one-byte `PL_revision`,
//! `PL_version` and `PL_subversion`, checks 5.28.0 <= v < 5.41.0, the
//! address of the thread key (`PL_thr_key`) or, for an unthreaded perl, of
//! `PL_curcop` and `PL_curstackinfo`, and asks for `Perl_runops_standard`
//! in `interpreter_offsets` (program 3).

use super::access::{read_u8, Symbol};
use super::names::{PERL_EXE, PERL_LIB};
use super::InterpreterData;
use super::{InterpreterOffsets, Loaded, LoaderError, LoaderInfo, Version};
use eim_machine::abi::program;

pub const NAME: &str = "perl";

/// Where the interpreter state is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// A threaded perl: the interpreter is thread-specific data under this key.
    ThreadKey(u64),
    /// An unthreaded perl: the globals themselves.
    Globals { curcop: u64, curstackinfo: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PerlData {
    pub(crate) version: Version,
    pub(crate) state: State,
    pub(crate) runops: Symbol,
}

impl InterpreterData for PerlData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.version.to_string()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![("version", self.version()), ("runops", self.runops.fact())]
    }
}

/// Whether the name is a perl file: the library, or the executable unless
/// it links the library (which is then the file to look at).
fn is_perl(info: &LoaderInfo<'_, '_>) -> bool {
    if PERL_LIB.is_match(info.name) {
        return true;
    }
    PERL_EXE.is_match(info.name)
        && !info
            .elf
            .needed()
            .iter()
            .any(|lib| PERL_LIB.is_match(&String::from_utf8_lossy(lib)))
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    if !is_perl(info) {
        return Ok(None);
    }
    let syms = info.symbols();
    let elf = info.elf;
    let byte = |name: &str| -> Result<u32, LoaderError> {
        let sym = syms.require(name)?;
        read_u8(elf, sym.address, name).map(u32::from)
    };
    let version = Version(
        byte("PL_revision")?,
        byte("PL_version")?,
        byte("PL_subversion")?,
    )
    .check(Version(5, 28, 0), Version(5, 41, 0), "5.28.0 to 5.40.x")?;
    let state = match syms.get("PL_thr_key") {
        Some(key) => State::ThreadKey(key.address),
        None => State::Globals {
            curcop: syms.require("PL_curcop")?.address,
            curstackinfo: syms.require("PL_curstackinfo")?.address,
        },
    };
    let runops = syms.require("Perl_runops_standard")?;
    let offsets = InterpreterOffsets::one(program::PERL, runops.range());
    Ok(Some(Loaded::new(
        PerlData {
            version,
            state,
            runops,
        },
        Some(offsets),
    )))
}
