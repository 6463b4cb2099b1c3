//! Go executables: the `go` loader (symbolization data) and `golabels`
//! (the goroutine labels of Go before 1.25).
//!
//! go: a file with a `.go.buildinfo` or `.gopclntab` section; extracts the
//! toolchain version from the build information (may be absent), and the
//! size and function count of the pc/line table, which must parse.
//!
//! golabels: a file whose build information names a Go version; go1.25 or
//! later is an error (upstream's gate: newer runtimes publish labels
//! differently); extracts the offset of the current goroutine pointer `g`
//! from the thread pointer: -8 on x86-64 (the Go ABI's fixed TLS slot), and
//! on arm64 the TLS offset of `runtime.tls_g` past the 16-byte thread
//! control block. Neither needs `interpreter_offsets`.

use super::{Loaded, LoaderError, LoaderInfo};
use crate::elf::gopclntab::{go_version, table_summary};
use crate::elf::Arch;
use crate::info::InterpreterData;

pub const NAME: &str = "go";
pub const LABELS_NAME: &str = "golabels";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoData {
    /// Empty when the file has no build information.
    pub go_version: String,
    pub pclntab_bytes: usize,
    pub functions: usize,
}

impl InterpreterData for GoData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        self.go_version.clone()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoLabelsData {
    pub go_version: String,
    /// Offset of `g` from the thread pointer.
    pub tls_g_offset: i64,
}

impl InterpreterData for GoLabelsData {
    fn loader(&self) -> &'static str {
        LABELS_NAME
    }

    fn version(&self) -> String {
        self.go_version.clone()
    }
}

fn version_string(info: &LoaderInfo<'_, '_>) -> String {
    go_version(info.elf)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    let elf = info.elf;
    if elf.section(".go.buildinfo").is_none() && elf.section(".gopclntab").is_none() {
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
        Arch::X86_64 => -8,
        Arch::Aarch64 => {
            let sym = info.symbols().require("runtime.tls_g")?;
            if !sym.tls {
                return Err(LoaderError::Invalid(
                    "runtime.tls_g is not thread-local".into(),
                ));
            }
            i64::try_from(sym.address)
                .ok()
                .and_then(|a| a.checked_add(16))
                .ok_or_else(|| LoaderError::Invalid("runtime.tls_g is out of range".into()))?
        }
    };
    Ok(Some(Loaded::new(
        GoLabelsData {
            go_version,
            tls_g_offset,
        },
        None,
    )))
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
