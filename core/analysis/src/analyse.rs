//! One file's whole analysis, in one place and one order: its stack
//! deltas (with its separate debug file, if the extraction wants one),
//! then what the interpreter loaders make of it, then its C-library
//! layouts. The edge opens the file and, when asked, the debug file; it
//! decides nothing about what is read.
//!
//! Whether what was read is the file as it was opened (a failed read, a
//! size or time that changed) is the edge's to say after the analysis: it
//! holds the file handle and its stamps (`eim`'s `files::elf_file`).

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use eim_machine::deltas::IntervalData;
use eim_machine::FileId;

use crate::elf::extract::{self, DebugBytes, DebugFileError, ExtractError};
use crate::elf::{DebugLink, Elf};
use crate::interp::LoaderInfo;
use crate::tsd::{self, DtvInfo, LibcInfo, TsdInfo};

/// What the analysis asks of the edge that opened the file: the separate
/// debug file a `.gnu_debuglink` names, opened by the edge's rules (the
/// places searched, the trust rule, the size limit).
pub trait DebugFiles {
    /// The debug file `link` names, or `None` (no such file is normal).
    /// The extraction checks its CRC-32 against the link again. A search
    /// that finds the file's own world gone is the edge's to remember and
    /// report: the analysis goes on without the debug file.
    fn debug_file(&mut self, link: &DebugLink) -> Option<DebugBytes>;
}

/// A file's analysis: its deltas, what the loaders said (`L`: the
/// caller's wrapping of their answers; the default when the loaders were
/// not asked), its C-library layouts.
#[derive(Clone, Debug)]
pub struct Analysis<L> {
    pub deltas: IntervalData,
    pub loaders: L,
    pub libc: LibcInfo,
}

/// The stack deltas of `elf` in upstream's stage order, the debug file
/// coming from `debug` when the extraction asks for it.
pub fn deltas(elf: &Elf<'_>, debug: &mut dyn DebugFiles) -> Result<IntervalData, ExtractError> {
    let mut open = |name: &str, crc: u32| -> Result<Option<DebugBytes>, DebugFileError> {
        let link = DebugLink {
            name: name.into(),
            crc,
        };
        Ok(debug.debug_file(&link))
    };
    extract::extract(elf, Some(&mut open))
}

/// Analyses `elf`, known by `path` (as given: the C-library layouts are
/// looked for by name, as upstream does), its deltas made by `deltas`
/// (eim's is [`deltas`]; tests give others). With a `file_id`, the
/// loaders are asked about the file with its deltas (`loaders` runs them:
/// which ones is the caller's tracer set). Errors are `deltas`'s: a file
/// without deltas is not analysed further.
pub fn analyse_with<L: Default, E>(
    elf: &Elf<'_>,
    path: &Path,
    file_id: Option<FileId>,
    deltas: impl FnOnce(&Elf<'_>) -> Result<IntervalData, E>,
    loaders: impl FnOnce(&LoaderInfo<'_, '_>) -> L,
) -> Result<Analysis<L>, E> {
    let data = deltas(elf)?;
    let loaders = match file_id {
        Some(file_id) => {
            let name = path.to_string_lossy();
            loaders(&LoaderInfo::new(file_id, &name, elf, &data))
        }
        None => L::default(),
    };
    Ok(Analysis {
        libc: libc_of(path, elf),
        deltas: data,
        loaders,
    })
}

/// [`analyse_with`] eim's deltas (what the edge's provider does, with its
/// own debug-file opener).
#[cfg(test)]
pub(crate) fn analyse<L: Default>(
    elf: &Elf<'_>,
    path: &Path,
    file_id: Option<FileId>,
    debug: &mut dyn DebugFiles,
    loaders: impl FnOnce(&LoaderInfo<'_, '_>) -> L,
) -> Result<Analysis<L>, ExtractError> {
    analyse_with(elf, path, file_id, |elf| deltas(elf, debug), loaders)
}

/// Upstream's TSD step of `AddOrIncRef`: for a file whose path (as
/// given, not resolved in a root) names a C library, the layout its
/// `pthread_getspecific` reads. A failed analysis is not an error
/// upstream: the file simply has no TSD layout.
pub(crate) fn tsd_of(path: &Path, elf: &Elf<'_>) -> Option<TsdInfo> {
    if !tsd::is_potential_tsd_dso(path.as_os_str().as_bytes()) {
        return None;
    }
    match tsd::extract_tsd(elf) {
        Ok(info) => Some(info),
        Err(e) => {
            tracing::debug!("{}: no TSD layout: {e}", path.display());
            None
        }
    }
}

/// Upstream HEAD's DTV step: for a file whose path (as given) matches
/// HEAD's C-library pattern, which adds the dynamic loader (glibc defines
/// `__tls_get_addr` there), the layout `__tls_get_addr` reads. A file
/// without that symbol has no DTV and no error; a failed analysis is
/// reported like the TSD's (logged, not an extraction failure).
pub(crate) fn dtv_of(path: &Path, elf: &Elf<'_>) -> Option<DtvInfo> {
    if !tsd::is_potential_libc_dso(path.as_os_str().as_bytes()) {
        return None;
    }
    match tsd::extract_dtv(elf) {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!("{}: no DTV layout: {e}", path.display());
            None
        }
    }
}

/// Both C-library layouts of the file at `path` (upstream HEAD's
/// `ExtractLibcInfo`, which fails only when both analyses fail: here that
/// is the empty [`LibcInfo`]). The TSD keeps SEED's name check, which the
/// oracle's `.tsd` files record; only the dynamic loader tells the two
/// apart, and it defines no `pthread_getspecific`.
pub(crate) fn libc_of(path: &Path, elf: &Elf<'_>) -> LibcInfo {
    LibcInfo {
        tsd: tsd_of(path, elf),
        dtv: dtv_of(path, elf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_machine::deltas::{hint, info, StackDelta};

    struct NoDebugFiles(u32);

    impl DebugFiles for NoDebugFiles {
        fn debug_file(&mut self, _: &DebugLink) -> Option<DebugBytes> {
            self.0 += 1;
            None
        }
    }

    #[test]
    fn loaders_are_asked_only_with_a_file_id_and_after_the_deltas() {
        let volname =
            std::fs::read(eim_test_support::testdata().join("upstream/volname")).expect("volname");
        let elf = Elf::parse(&volname).expect("volname parses");
        let path = Path::new("/usr/bin/volname");
        let mut debug = NoDebugFiles(0);
        let plain: Analysis<Vec<u64>> =
            analyse(&elf, path, None, &mut debug, |_| vec![1]).expect("extracts");
        assert_eq!(plain.deltas.len(), 27);
        assert!(plain.loaders.is_empty(), "no file id: no loaders");
        assert_eq!(plain.libc, LibcInfo::default(), "not a C library by name");
        let asked = analyse(&elf, path, Some(FileId(7)), &mut debug, |info| {
            vec![info.file_id.0, info.name.len() as u64]
        })
        .expect("extracts");
        assert_eq!(asked.loaders, vec![7, path.as_os_str().len() as u64]);
        assert_eq!(asked.deltas, plain.deltas);
        // A failed extraction: its error, and no loader runs.
        let failed = analyse_with(
            &elf,
            path,
            Some(FileId(7)),
            |_| Err("bad CIE"),
            |_| -> Vec<u64> { panic!("a loader ran on a failed file") },
        );
        assert_eq!(failed.map(|a| a.deltas.len()), Err("bad CIE"));
        let one = analyse_with(
            &elf,
            path,
            None,
            |elf| {
                Ok::<_, ()>(IntervalData::from_deltas(vec![StackDelta::new(
                    elf.entry(),
                    hint::KEEP,
                    info::STOP,
                )]))
            },
            |_| (),
        )
        .expect("given deltas");
        assert_eq!(one.deltas.len(), 1);
    }
}
