//! C-library introspection (spec 7.1, 7.2): where `pthread_getspecific`
//! finds thread-specific data (TSD) and where `__tls_get_addr` finds the
//! dynamic thread vector (DTV), recovered from their machine code.
//!
//! * [`is_potential_tsd_dso`] / [`is_potential_libc_dso`]: upstream's
//!   file-name checks (SEED's for TSD, HEAD's, which adds `ld-linux`, for
//!   the DTV).
//! * [`extract_tsd`]: the code of `__pthread_getspecific` (or
//!   `pthread_getspecific`), analysed per architecture: a symbolic
//!   interpreter on x86-64 (`x86`, over `expr`), a register-state
//!   machine on arm64 (`arm64`).
//! * [`extract_dtv`]: the same machinery over `__tls_get_addr`.
//!
//! Error messages are upstream's where the oracle records them (its
//! `.tsd` files show them after `# error: `).

pub(crate) mod arm64;
pub mod error;
pub(crate) mod expr;
pub(crate) mod layout;
pub(crate) mod name;
pub(crate) mod x86;

use std::borrow::Cow;

use object::{Object as _, ObjectSymbol as _};

use crate::elf::{Arch, Elf};

pub use error::{AnalysisError, DtvError, SymbolError, TsdError};
pub use layout::{DtvInfo, LibcInfo, TsdInfo};
pub use name::{is_potential_libc_dso, is_potential_tsd_dso};

/// The most code read for one function. Upstream reads a symbol's whole
/// size through its memory map (spec 11, O13); this only bounds hostile
/// sizes, far above any real `pthread_getspecific`.
pub(crate) const MAX_CODE: u64 = 64 * 1024;

/// The most code read for `__tls_get_addr` (HEAD reads at most this much).
pub(crate) const MAX_DTV_CODE: u64 = 2048;

/// The code of the defined dynamic symbol `name`: `min(size, max)` bytes
/// at its address.
pub(crate) fn symbol_code<'d>(
    elf: &Elf<'d>,
    name: &str,
    max: u64,
) -> Result<Cow<'d, [u8]>, SymbolError> {
    // Upstream looks names up through DT_GNU_HASH / DT_HASH, which hold
    // only defined symbols (an undefined `__tls_get_addr` in libc.so.6
    // must stay "not found").
    let symbol = elf
        .file
        .dynamic_symbols()
        .find(|s| !s.is_undefined() && s.name_bytes().ok() == Some(name.as_bytes()))
        .ok_or(SymbolError::NotFound)?;
    let len = symbol.size().min(max);
    let len = usize::try_from(len).map_err(|_| SymbolError::NotMapped(symbol.address()))?;
    if len == 0 {
        return Ok(Cow::Borrowed(&[]));
    }
    elf.virtual_memory(symbol.address(), len)
        .ok_or(SymbolError::NotMapped(symbol.address()))
}

/// Upstream's `ExtractTSDInfo`: the layout `pthread_getspecific` uses.
pub fn extract_tsd(elf: &Elf<'_>) -> Result<TsdInfo, TsdError> {
    let code = match symbol_code(elf, "__pthread_getspecific", MAX_CODE) {
        Ok(code) => code,
        Err(_) => symbol_code(elf, "pthread_getspecific", MAX_CODE).map_err(TsdError::Symbol)?,
    };
    analyse_tsd(elf.arch, &code)
}

/// The TSD analysis of a function body (the bytes of
/// `pthread_getspecific`) for `arch`.
pub fn analyse_tsd(arch: Arch, code: &[u8]) -> Result<TsdInfo, TsdError> {
    if code.len() < 8 {
        return Err(TsdError::TooShort(code.len()));
    }
    match arch {
        Arch::X86_64 => x86::tsd(code),
        Arch::Aarch64 => arm64::tsd(code),
    }
    .map_err(TsdError::Analysis)
}

/// HEAD's DTV extraction: `Ok(None)` when the file defines no
/// `__tls_get_addr` (not an error upstream).
pub fn extract_dtv(elf: &Elf<'_>) -> Result<Option<DtvInfo>, DtvError> {
    let code = match symbol_code(elf, "__tls_get_addr", MAX_DTV_CODE) {
        Ok(code) => code,
        Err(SymbolError::NotFound) => return Ok(None),
        Err(e) => return Err(DtvError::Symbol(e)),
    };
    analyse_dtv(elf.arch, &code).map(Some)
}

/// The DTV analysis of a function body (the bytes of `__tls_get_addr`).
pub fn analyse_dtv(arch: Arch, code: &[u8]) -> Result<DtvInfo, DtvError> {
    match arch {
        Arch::X86_64 => x86::dtv(code),
        Arch::Aarch64 => arm64::dtv(code),
    }
    .map_err(DtvError::Analysis)
}
