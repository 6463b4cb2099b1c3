//! What interpreter a file is by what it defines, whatever it is named: a
//! copy of `python3.11` named `mypy`, a renamed `libruby`. The loaders go
//! by the file's name, as upstream's do (the maps must hold what upstream
//! writes for the same host), so this is for a person asking about one
//! file (`eim inspect`): when no loader claims the name it was given nor
//! its resolved name, the name the file's own symbols say it is, under
//! which the loaders are asked again and which the answer then records.
//!
//! Each interpreter is recognised by symbols that only it defines (not
//! imports: an extension module importing `Py_Version` is not python) and,
//! where its loader reads the version from the name, by the version the
//! file itself carries.

use crate::elf::Elf;

use super::access::{read_cstr, read_u32, Symbols};

/// The symbols looked at, by prefix (only these are indexed).
const PREFIXES: &[&str] = &[
    "Py_Version",
    "_PyEval_EvalFrameDefault",
    "Perl_runops_standard",
    "PL_curcop",
    "ruby_version",
    "rb_vm_exec",
    "execute_ex",
    "executor_globals",
    "_ZN2v88internal7Version6major_E",
    "gHotSpotVM",
];

/// A name a loader claims, and the evidence it was chosen by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The name the loaders are asked under (`python3.11`, `perl`, ...).
    pub name: String,
    /// What in the file said so, for a person.
    pub evidence: String,
}

/// The interpreter `elf` is by its symbols, if one (see the module
/// documentation). A file with a SONAME is named as its loader names a
/// library (`libpython3.11.so`), any other as a program (`python3.11`).
pub fn by_evidence(elf: &Elf<'_>) -> Option<Identity> {
    let syms = Symbols::with_prefixes(elf, PREFIXES);
    let shared = elf.soname().is_some();
    let has = |name: &str| syms.get(name).is_some();
    let found = |name: String, evidence: &str| {
        Some(Identity {
            name,
            evidence: evidence.to_string(),
        })
    };
    if let (Some(version), true) = (syms.get("Py_Version"), has("_PyEval_EvalFrameDefault")) {
        // PY_VERSION_HEX: 0xMMmmppLS.
        let hex = read_u32(elf, version.address, "Py_Version").ok()?;
        let (major, minor) = (hex >> 24, (hex >> 16) & 0xff);
        let name = if shared {
            format!("libpython{major}.{minor}.so")
        } else {
            format!("python{major}.{minor}")
        };
        return found(name, "defines Py_Version and _PyEval_EvalFrameDefault");
    }
    if has("Perl_runops_standard") && has("PL_curcop") {
        let name = if shared { "libperl.so" } else { "perl" };
        return found(name.into(), "defines Perl_runops_standard and PL_curcop");
    }
    if let (Some(version), true) = (syms.get("ruby_version"), has("rb_vm_exec")) {
        let text = read_cstr(elf, version.address, 32, "ruby_version").ok()?;
        let text = std::str::from_utf8(&text).ok()?;
        let plain = text.split('.').count() == 3
            && text
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !plain {
            return None;
        }
        return found(
            format!("libruby.so.{text}"),
            "defines ruby_version and rb_vm_exec",
        );
    }
    if has("execute_ex") && has("executor_globals") {
        let name = if shared { "/libphp.so" } else { "php" };
        return found(name.into(), "defines execute_ex and executor_globals");
    }
    if has("_ZN2v88internal7Version6major_E") {
        let name = if shared { "/libnode.so" } else { "node" };
        return found(name.into(), "defines v8::internal::Version::major_");
    }
    if has("gHotSpotVMStructs") {
        return found("/libjvm.so".into(), "defines gHotSpotVMStructs");
    }
    None
}
