//! Go executables: the `go` loader (symbolization data) and `golabels`
//! (the goroutine labels of Go before 1.25).
//!
//! go: a file with a readable `.go.buildinfo` or `.gopclntab` section
//! (tested by name first, `super::evidence`); extracts the
//! toolchain version from the build information (may be absent), and the
//! size and function count of the pc/line table, which must parse.
//!
//! golabels: a file whose build information names a Go version, searched
//! for only in a file that is Go's by its evidence; go1.25 or
//! later is an error (upstream's gate: newer runtimes publish labels
//! differently); extracts the offset of the current goroutine pointer `g`
//! from the thread pointer: on x86-64 what `runtime.stackcheck` reads
//! ([`stackcheck`]; -8 for most executables, the linker's choice for
//! statically linked cgo ones), falling back to -8 as upstream when its code
//! has another shape, and on arm64 what `runtime.load_g` reads ([`load_g`]): the offset it loads
//! x28 from, or 0 when the binary has no cgo and `g` is only ever in x28
//! (upstream's convention too; offset 0 from `TPIDR_EL0` is the thread
//! control block's, never `g`). Neither needs `interpreter_offsets`.

pub mod load_g;
pub mod stackcheck;

use super::access::read_u8;
use super::evidence::{GO_BUILDINFO, GO_PCLNTAB};
use super::InterpreterData;
use super::{Loaded, LoaderError, LoaderInfo};
use crate::elf::gopclntab::{function_range, go_version, table_summary};
use crate::elf::Arch;

pub const NAME: &str = "go";
pub const LABELS_NAME: &str = "golabels";

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GoData {
    /// Empty when the file has no build information.
    pub(crate) go_version: String,
    pub(crate) pclntab_bytes: usize,
    pub(crate) functions: usize,
}

impl InterpreterData for GoData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.go_version.clone()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("functions", self.functions.to_string()),
            ("pclntab bytes", self.pclntab_bytes.to_string()),
        ]
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoLabelsData {
    pub(crate) go_version: String,
    /// Offset of `g` from the thread pointer; 0 on arm64 when `g` is only
    /// in x28 (no cgo).
    pub tls_g_offset: i64,
}

impl InterpreterData for GoLabelsData {
    fn loader(&self) -> &'static str {
        LABELS_NAME
    }

    fn version(&self) -> String {
        self.go_version.clone()
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("TLS g offset", self.tls_g_offset.to_string()),
        ]
    }
}

/// The Go version in the build information, empty when there is none.
/// Searched only in a file that is Go's by its evidence: without
/// `.go.buildinfo`, the search is through the whole first writable
/// segment, which upstream makes only for a file it takes for Go's.
fn version_string(info: &LoaderInfo<'_, '_>) -> String {
    if !info.evidence().is_go() {
        return String::new();
    }
    go_version(info.elf)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    let elf = info.elf;
    let evidence = info.evidence();
    // By name first; a section is then the one whose contents can be read.
    let has = |name: &str| evidence.has_section(name) && elf.section(name).is_some();
    if !has(GO_BUILDINFO) && !has(GO_PCLNTAB) {
        return Ok(None);
    }
    let (pclntab_bytes, functions) = table_summary(elf)
        .map_err(|e| LoaderError::Invalid(format!("Go pc/line table: {e}")))?
        .ok_or_else(|| LoaderError::Invalid("a Go section but no pc/line table".into()))?;
    Ok(Some(Loaded::new(
        GoData {
            go_version: version_string(info),
            pclntab_bytes,
            functions,
        },
        None,
    )))
}

/// `goX.Y[.Z]` -> (X, Y).
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let rest = version.strip_prefix("go")?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

pub fn load_labels(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    let go_version = version_string(info);
    if go_version.is_empty() {
        return Ok(None);
    }
    match major_minor(&go_version) {
        Some(v) if v < (1, 25) => {}
        Some(_) => {
            return Err(LoaderError::UnsupportedVersion {
                found: go_version,
                supported: "before go1.25".into(),
            })
        }
        // Development builds ("devel ...") carry no release number.
        None => {
            return Err(LoaderError::Invalid(format!(
                "Go version {go_version:?} has no release number"
            )))
        }
    }
    let tls_g_offset = match info.elf.arch {
        Arch::X86_64 => x86_tls_g_offset(info)?,
        Arch::Aarch64 => arm64_tls_g_offset(info)?,
    };
    Ok(Some(Loaded::new(
        GoLabelsData {
            go_version,
            tls_g_offset,
        },
        None,
    )))
}

/// The first bytes (at most `max`) of the Go runtime function `names[0]`
/// (its assembly body) or `names[1]` (its Go wrapper), and its address:
/// found by ELF symbol, else by the pc/line table's names, which a
/// stripped binary keeps.
fn runtime_code<'d>(
    info: &LoaderInfo<'_, 'd>,
    names: [&str; 2],
    max: usize,
) -> Result<(u64, std::borrow::Cow<'d, [u8]>), LoaderError> {
    let elf = info.elf;
    // Go binaries carry 100k symbols and more; only the runtime's are
    // looked up.
    let syms = info.symbols_with(&["runtime."]);
    let range = match names.iter().find_map(|n| syms.get(n)) {
        Some(sym) => sym.range(),
        None => names
            .iter()
            .find_map(|n| function_range(elf, n.as_bytes()).transpose())
            .transpose()
            .map_err(|e| LoaderError::Invalid(format!("Go pc/line table: {e}")))?
            .ok_or_else(|| LoaderError::MissingSymbol(names[0].into()))?,
    };
    let len = usize::try_from(range.end.saturating_sub(range.start))
        .unwrap_or(usize::MAX)
        .clamp(4, max);
    let code = elf
        .virtual_memory(range.start, len)
        .ok_or_else(|| LoaderError::Unreadable {
            what: names[1].into(),
            addr: range.start,
        })?;
    Ok((range.start, code))
}

/// The x86-64 offset of `g` from `fs`, from the code of
/// `runtime.stackcheck`; -8 (the usual slot) when that code has a shape
/// [`stackcheck::decode`] does not follow, as upstream falls back.
fn x86_tls_g_offset(info: &LoaderInfo<'_, '_>) -> Result<i64, LoaderError> {
    const NAMES: [&str; 2] = ["runtime.stackcheck.abi0", "runtime.stackcheck"];
    let (at, code) = runtime_code(info, NAMES, stackcheck::MAX_BYTES)?;
    // g sits below the thread pointer (TLS variant II), within its block.
    match stackcheck::decode(&code).filter(|o| (-0x1_0000..0).contains(o)) {
        Some(offset) => Ok(offset),
        None => {
            tracing::warn!(
                file = info.name,
                "runtime.stackcheck at {at:#x} has an unknown shape: Go labels assume g at fs-8"
            );
            Ok(-8)
        }
    }
}

/// The arm64 offset of `g` from the thread pointer, from the code of
/// `runtime.load_g`.
fn arm64_tls_g_offset(info: &LoaderInfo<'_, '_>) -> Result<i64, LoaderError> {
    let elf = info.elf;
    const NAMES: [&str; 2] = ["runtime.load_g.abi0", "runtime.load_g"];
    let (start, code) = runtime_code(info, NAMES, load_g::MAX_BYTES)?;
    let seen = load_g::decode(&code, start);
    if let Some(flag) = seen.cgo_flag {
        if read_u8(elf, flag, "runtime.iscgo")? == 0 {
            return Ok(0);
        }
    }
    let offset = seen.g_offset.ok_or_else(|| {
        LoaderError::Invalid(format!(
            "runtime.load_g at {start:#x} loads g from no thread-pointer offset this loader can follow"
        ))
    })?;
    i64::try_from(offset)
        .ok()
        .filter(|&o| o != 0)
        .ok_or_else(|| LoaderError::Invalid(format!("runtime.load_g's TLS offset {offset:#x}")))
}

#[cfg(test)]
mod tests {
    use super::major_minor;

    #[test]
    fn go_versions() {
        assert_eq!(major_minor("go1.23.5"), Some((1, 23)));
        assert_eq!(major_minor("go1.25rc1"), Some((1, 25)));
        assert_eq!(major_minor("go1"), Some((1, 0)));
        assert_eq!(major_minor("devel go1.24-abc"), None);
    }
}
