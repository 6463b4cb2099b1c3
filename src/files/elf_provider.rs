//! The stack-delta provider for ELF files (upstream's
//! `elfunwindinfo` provider): opens the file through its [`ElfFileRef`],
//! runs the extraction with the debug-file lookup as its callback, and
//! counts successes and failures the way upstream does (a file that has
//! gone is not a failure). What is read of the file, and in what order,
//! is the analysis's ([`eim_analysis::analyse`]); this adapter opens the
//! file and its debug file and checks afterwards that what was read is
//! the file it was asked for (`check_read`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use eim_analysis::analyse::{self, DebugFiles};
use eim_analysis::elf::digest::SourceDigest;
use eim_analysis::elf::{DebugLink, Elf};
use eim_analysis::interp::LoaderInfo;
use eim_core::provider::{ExtractError, ExtractErrorKind, Extraction, Provider};
use eim_core::tracers::LoaderMatch;
use eim_machine::deltas::IntervalData;

use crate::files::elf_file::{DebugFile, ElfFileRef, OpenElf, Unreliable, DEFAULT_MAX_SIZE};
use eim_analysis::elf::extract::DebugBytes;
use eim_core::Tracers;
use eim_machine::FileId;

/// The debug-file callback the extraction calls (at most when it needs
/// one): the bytes of the separate debug file `link` names, or `None`.
pub type DebugLinkFn<'a> = dyn FnMut(&DebugLink) -> Option<SharedDebugFile> + 'a;

/// A debug file the extraction reads while the provider keeps a handle to
/// check afterwards that it did not change.
#[derive(Clone, Debug)]
pub struct SharedDebugFile(pub Arc<DebugFile>);

impl eim_analysis::elf::extract::DebugFileBytes for SharedDebugFile {
    fn view(&self) -> eim_analysis::elf::FileView<'_> {
        self.0.view()
    }

    fn crc(&self) -> u32 {
        self.0.crc()
    }
}

/// An extraction: a parsed ELF file and its debug-file callback in, its
/// stack deltas or a message out.
pub type ExtractFn =
    dyn Fn(&Elf<'_>, &mut DebugLinkFn<'_>) -> Result<IntervalData, String> + Send + Sync;

/// The edge's side of [`DebugFiles`]: the provider's callback.
struct Callback<'a, 'b>(&'a mut DebugLinkFn<'b>);

impl DebugFiles for Callback<'_, '_> {
    fn debug_file(&mut self, link: &DebugLink) -> Option<DebugBytes> {
        (self.0)(link).map(|file| Box::new(file) as DebugBytes)
    }
}

/// The extraction eim uses: the analysis's ([`analyse::deltas`]), in
/// upstream's stage order. The one place it is wired in.
pub fn extract(elf: &Elf<'_>, debuglink: &mut DebugLinkFn<'_>) -> Result<IntervalData, String> {
    // The debug file is found (and its CRC checked) by `ElfFileRef`; the
    // analysis checks the CRC again against the link it reads itself.
    analyse::deltas(elf, &mut Callback(debuglink)).map_err(|e| e.to_string())
}

/// The extraction the host loads with: [`extract`], and for a file it
/// finds no deltas in, the synthetic records of the arm64 vDSO
/// ([`eim_analysis::elf::vdso::synthesize`]; newer upstream makes them when
/// it loads a file with no deltas, spec 6.2). `eim deltas` prints
/// [`extract`]'s, as upstream's extraction gives them.
pub fn extract_or_synthesize(
    elf: &Elf<'_>,
    debuglink: &mut DebugLinkFn<'_>,
) -> Result<IntervalData, String> {
    let data = extract(elf, debuglink)?;
    if !data.is_empty() {
        return Ok(data);
    }
    Ok(eim_analysis::elf::vdso::synthesize(elf).unwrap_or(data))
}

/// Upstream's provider statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
    /// Files extracted.
    pub success: u64,
    /// Files that failed, except those that had gone (`NotFound`) and
    /// those that changed while read.
    pub extraction_errors: u64,
    /// Files that changed while they were read (`Changed`): not loaded,
    /// and not failures either.
    pub changed: u64,
}

/// Extracts stack deltas from ELF files.
pub struct ElfProvider {
    extractor: Arc<ExtractFn>,
    max_size: u64,
    success: AtomicU64,
    errors: AtomicU64,
    changed: AtomicU64,
    /// Nanoseconds spent in the interpreter loaders (shared with whoever
    /// reports a step's phases).
    loaders_nanos: Arc<AtomicU64>,
}

impl Default for ElfProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ElfProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfProvider")
            .field("max_size", &self.max_size)
            .field("statistics", &self.statistics())
            .finish_non_exhaustive()
    }
}

impl ElfProvider {
    /// The provider with eim's extraction and a 2 GiB size limit.
    pub fn new() -> Self {
        Self::with_extractor(extract)
    }

    /// A provider running `extractor` instead (the host's, tests,
    /// experiments).
    pub fn with_extractor(
        extractor: impl Fn(&Elf<'_>, &mut DebugLinkFn<'_>) -> Result<IntervalData, String>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self {
            extractor: Arc::new(extractor),
            max_size: DEFAULT_MAX_SIZE,
            success: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            changed: AtomicU64::new(0),
            loaders_nanos: Arc::default(),
        }
    }

    /// The running total of nanoseconds spent in the interpreter loaders.
    pub fn loaders_nanos(&self) -> Arc<AtomicU64> {
        self.loaders_nanos.clone()
    }

    /// Refuses (`TooLarge`) files larger than `bytes`, whatever the limit
    /// of the reference that opened them.
    pub fn with_max_size(mut self, bytes: u64) -> Self {
        self.max_size = bytes;
        self
    }

    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    /// The counters so far.
    pub fn statistics(&self) -> Statistics {
        Statistics {
            success: self.success.load(Ordering::Relaxed),
            extraction_errors: self.errors.load(Ordering::Relaxed),
            changed: self.changed.load(Ordering::Relaxed),
        }
    }

    /// The counters so far, set back to zero (upstream's
    /// `GetAndResetStatistics`).
    pub fn get_and_reset_statistics(&self) -> Statistics {
        Statistics {
            success: self.success.swap(0, Ordering::Relaxed),
            extraction_errors: self.errors.swap(0, Ordering::Relaxed),
            changed: self.changed.swap(0, Ordering::Relaxed),
        }
    }

    /// Opens `file`, analyses it ([`analyse::analyse_with`]: the deltas
    /// by this provider's extraction, the debug file through
    /// [`ElfFileRef::find_debug_file_for`], the loaders `loaders` names),
    /// then checks that what was read is the file it was asked for.
    fn analyse(
        &self,
        file: &ElfFileRef,
        loaders: Option<(FileId, Tracers)>,
    ) -> Result<Digested, ExtractError> {
        let open = file.get()?;
        let name = file.path().display().to_string();
        if open.len() > self.max_size {
            return Err(ExtractError::new(
                ExtractErrorKind::TooLarge,
                name,
                format!(
                    "{} bytes, larger than the limit of {} bytes",
                    open.len(),
                    self.max_size
                ),
            ));
        }
        // A debug-file lookup that finds the file gone ends the extraction
        // with its NotFound, whatever the extraction makes of the `None`.
        let mut gone = None;
        let mut debug_file = None;
        let analysis = {
            let mut debuglink = |link: &DebugLink| match file.find_debug_file_for(&open, link) {
                Ok(found) => {
                    let shared = found.map(Arc::new);
                    debug_file.clone_from(&shared);
                    shared.map(SharedDebugFile)
                }
                Err(e) => {
                    gone = Some(e);
                    None
                }
            };
            analyse::analyse_with(
                open.elf(),
                file.path(),
                loaders.map(|(id, _)| id),
                |elf| (self.extractor)(elf, &mut debuglink),
                |info| {
                    let tracers = loaders.map_or(Tracers::none(), |(_, t)| t);
                    let started = std::time::Instant::now();
                    let found = eim_core::tracers::detect(info, tracers);
                    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.loaders_nanos.fetch_add(nanos, Ordering::Relaxed);
                    found
                },
            )
        };
        if let Some(e) = gone {
            return Err(e);
        }
        // The debug file is checked here, while its handle is at hand; the
        // file itself once everything is read from it (`check_read`).
        if let Some(debug) = &debug_file {
            if let Err(u) = debug.check_unchanged() {
                let why = format!("debug file {}: {u}", debug.path.display());
                return Err(ExtractError::new(u.kind, name, why));
            }
        }
        let analysis = analysis.map_err(|message| {
            // An extraction that failed on a file that changed under it
            // failed because it changed.
            if let Err(u) = open.check_unchanged() {
                return ExtractError::new(u.kind, name.clone(), u.message);
            }
            ExtractError::new(
                ExtractErrorKind::Invalid,
                name,
                format!("failed to extract stack deltas: {message}"),
            )
        })?;
        tracing::debug!(
            path = %file.path().display(),
            len = open.len(),
            read = open.bytes_read(),
            reads = open.reads(),
            "analysed"
        );
        // After everything the analysis read (deltas, loaders, C
        // library): what another file must match to share the tables.
        // A debug file's bytes are not in it, so such a file has none.
        let source = (debug_file.is_none() && loaders.is_some())
            .then(|| open.source_digest())
            .flatten()
            .map(Arc::new);
        if let Some(d) = &source {
            tracing::debug!(path = %file.path().display(), ranges = d.ranges.len(), bytes = d.bytes_covered(), "source digest");
        }
        // After the digest, so that a change under its reads voids it too.
        check_read(file, &open, loaders.map(|(id, _)| id))?;
        Ok(Digested {
            extraction: Extraction {
                data: analysis.deltas,
                libc: analysis.libc,
                interpreters: analysis.loaders,
            },
            source,
        })
    }

    fn extract_counted(
        &self,
        file: &ElfFileRef,
        loaders: Option<(FileId, Tracers)>,
    ) -> Result<Digested, ExtractError> {
        match self.analyse(file, loaders) {
            Ok(extraction) => {
                self.success.fetch_add(1, Ordering::Relaxed);
                Ok(extraction)
            }
            Err(e) => {
                if e.is_changed() {
                    self.changed.fetch_add(1, Ordering::Relaxed);
                } else if !e.is_not_found() {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                }
                Err(e)
            }
        }
    }
}

/// Whatever the analysis of `open` concluded, it is void if the file changed
/// under the reads, or if it is not the file `wanted` names: never tables
/// from a mix of two versions of a file, nor under another file's id. The
/// id is computed again from the bytes the analysis read.
fn check_read(
    file: &ElfFileRef,
    open: &OpenElf,
    wanted: Option<FileId>,
) -> Result<(), ExtractError> {
    let error =
        |u: Unreliable| ExtractError::new(u.kind, file.path().display().to_string(), u.message);
    let id = open.file_id().map_err(error)?;
    open.check_unchanged().map_err(error)?;
    match wanted {
        Some(wanted) if id.host() != wanted => Err(error(Unreliable::changed(format!(
            "its file id is now {} ({id}), not {wanted}",
            id.host()
        )))),
        _ => Ok(()),
    }
}

/// An extraction and the digest of what it read ([`SourceDigest`]), `None`
/// when its tables depend on more than the file (a debug file) or the
/// digest could not be read.
#[derive(Clone, Debug)]
pub struct Digested {
    pub extraction: Extraction,
    pub source: Option<Arc<SourceDigest>>,
}

impl ElfProvider {
    /// [`Provider::extract_for`], with the digest of the bytes it read
    /// (only this one computes it: the host's extractions).
    pub fn extract_digested(
        &self,
        file_id: FileId,
        file: &ElfFileRef,
        tracers: Tracers,
    ) -> Result<Digested, ExtractError> {
        self.extract_counted(file, Some((file_id, tracers)))
    }
}

impl Provider for ElfProvider {
    type Elf = ElfFileRef;

    fn extract(&self, file: &ElfFileRef) -> Result<Extraction, ExtractError> {
        self.extract_counted(file, None).map(|d| d.extraction)
    }

    /// Extracts, then asks the loaders `tracers` enables about the file
    /// (with the gaps of its deltas), outside every lock of the manager.
    fn extract_for(
        &self,
        file_id: FileId,
        file: &ElfFileRef,
        tracers: Tracers,
    ) -> Result<Extraction, ExtractError> {
        self.extract_digested(file_id, file, tracers)
            .map(|d| d.extraction)
    }
}

/// Asks the loaders `tracers` enables about a file whose deltas are `data`
/// (the gaps of at least 512 KiB come from them, as the encoder finds
/// them, if a loader needs them).
pub fn detect(
    file_id: FileId,
    name: &str,
    elf: &Elf<'_>,
    data: &IntervalData,
    tracers: Tracers,
) -> Vec<LoaderMatch> {
    let info = LoaderInfo::new(file_id, name, elf, data);
    eim_core::tracers::detect(&info, tracers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::elf_file::tests::{tempdir, testdata};
    use eim_analysis::tsd::{DtvInfo, LibcInfo, TsdInfo};
    use eim_machine::deltas::{hint, info, StackDelta};
    use eim_test_support::elf::{with_sections, EM_X86_64, SHT_PROGBITS};
    use std::path::Path;

    fn one_delta(elf: &Elf<'_>) -> IntervalData {
        let mut data = IntervalData::new();
        data.add(StackDelta::new(elf.entry(), hint::KEEP, info::STOP));
        data
    }

    #[test]
    fn the_arm64_vdso_is_loaded_with_its_synthetic_records() {
        let vdso = ElfFileRef::new(testdata().join("upstream/vdso.arch64.withframe"));
        let plain = ElfProvider::new().extract(&vdso).expect("extracts");
        assert!(plain.data.is_empty(), "upstream's extraction finds none");
        let loaded = ElfProvider::with_extractor(extract_or_synthesize)
            .extract(&vdso)
            .expect("extracts");
        let open = vdso.get().expect("opens");
        let synthetic = eim_analysis::elf::vdso::synthesize(open.elf()).expect("an arm64 vDSO");
        assert_eq!(loaded.data, synthetic);
        assert_eq!(loaded.data.len(), 7, "spec 6.1's seven records");
        // A file with deltas keeps them.
        let volname = ElfFileRef::new(testdata().join("upstream/volname"));
        let both = |p: ElfProvider| p.extract(&volname).expect("extracts").data;
        assert_eq!(
            both(ElfProvider::with_extractor(extract_or_synthesize)),
            both(ElfProvider::new())
        );
    }

    #[test]
    fn a_file_that_changed_is_counted_as_changed_not_as_a_failure() {
        // The file asked for under one id is another by the time it is
        // read (rewritten in place): its tables are refused as changed.
        let p = ElfProvider::with_extractor(|elf, _| Ok(one_delta(elf)));
        let volname = ElfFileRef::new(testdata().join("upstream/volname"));
        let e = p
            .extract_for(FileId(1), &volname, Tracers::none())
            .expect_err("another id");
        assert_eq!(e.kind, ExtractErrorKind::Changed, "{e}");
        assert!(
            e.is_changed() && e.message.contains("changed while being read"),
            "{e}"
        );
        assert_eq!(
            p.statistics(),
            Statistics {
                success: 0,
                extraction_errors: 0,
                changed: 1,
            }
        );
    }

    #[test]
    fn the_manager_counts_a_changed_file_apart_from_failed_extractions() {
        use eim_core::metrics::{Summary, STACK_DELTA_PROVIDER_EXTRACTION_ERROR};
        use eim_core::ExecutableInfoManager;
        use eim_sim::{SimConfig, SimMaps};
        let maps = SimMaps::new(SimConfig::default()).expect("maps");
        let manager = ExecutableInfoManager::new(ElfProvider::new(), maps, Tracers::none());
        let errors = |manager: &ExecutableInfoManager<ElfProvider, SimMaps>| {
            let mut summary = Summary::new();
            manager.update_metric_summary(&mut summary);
            summary.get(&STACK_DELTA_PROVIDER_EXTRACTION_ERROR).copied()
        };
        // Asked for under an id it no longer has: it changed.
        let volname = ElfFileRef::new(testdata().join("upstream/volname"));
        let e = manager
            .add_or_inc_ref(FileId(1), &volname)
            .expect_err("changed");
        assert!(e.to_string().contains("changed while being read"), "{e}");
        assert_eq!(
            errors(&manager),
            Some(0),
            "a changed file is no failed extraction"
        );
        // A broken file still counts.
        let dir = tempdir();
        let broken = dir.path().join("broken");
        std::fs::write(
            &broken,
            with_sections(
                EM_X86_64,
                &[(".eh_frame", SHT_PROGBITS, &[0xf0, 0xff, 0xff, 0x7f])],
            ),
        )
        .expect("write");
        let file = ElfFileRef::new(&broken);
        let id = file.file_id().expect("id").host();
        manager.add_or_inc_ref(id, &file).expect_err("broken");
        assert_eq!(errors(&manager), Some(1), "a broken file is");
    }

    #[test]
    fn counts_like_upstream() {
        use ExtractErrorKind::*;
        let p = ElfProvider::with_extractor(|elf, _| Ok(one_delta(elf)));
        let volname = ElfFileRef::new(testdata().join("upstream/volname"));
        let ex = p.extract(&volname).expect("extracted");
        assert_eq!(ex.data.len(), 1);
        assert_eq!(ex.data.get(0).unwrap().address, 0x9f0);

        let missing = ElfFileRef::new("/nonexistent/eim/file");
        assert_eq!(p.extract(&missing).map_err(|e| e.kind), Err(NotFound));
        let dir = tempdir();
        let text = dir.path().join("text");
        std::fs::write(&text, "not elf").expect("write");
        let e = p.extract(&ElfFileRef::new(&text)).expect_err("not ELF");
        assert_eq!(e.kind, Unsupported);
        assert_eq!(
            p.get_and_reset_statistics(),
            Statistics {
                success: 1,
                extraction_errors: 1,
                changed: 0,
            },
            "NotFound is not counted; an unsupported file is, as upstream counts it"
        );
        assert_eq!(p.statistics(), Statistics::default());

        let failing = ElfProvider::with_extractor(|_, _| Err("bad CIE".into()));
        let e = failing.extract(&volname).expect_err("fails");
        assert_eq!(e.kind, Invalid);
        assert_eq!(e.message, "failed to extract stack deltas: bad CIE");
        assert!(e
            .to_string()
            .ends_with("volname: failed to extract stack deltas: bad CIE"));
        assert_eq!(failing.statistics().extraction_errors, 1);

        let small = ElfProvider::with_extractor(|elf, _| Ok(one_delta(elf))).with_max_size(6000);
        let e = small.extract(&volname).expect_err("too large");
        assert_eq!(e.kind, TooLarge);
        assert_eq!(small.statistics().extraction_errors, 1);
    }

    #[test]
    fn a_debug_file_gone_with_its_process_stays_not_found() {
        // A file with a debug link, in a root that vanishes after the file
        // is opened; the extraction asks for the debug file and, seeing
        // None, would carry on: the provider still reports NotFound and
        // counts nothing (upstream weakness 13).
        let debug = with_sections(EM_X86_64, &[]);
        let mut link = b"exe.debug\0\0\0".to_vec();
        link.extend_from_slice(&crc32fast::hash(&debug).to_le_bytes());
        let exe = with_sections(EM_X86_64, &[(".gnu_debuglink", SHT_PROGBITS, &link)]);
        let root = tempdir();
        std::fs::create_dir_all(root.path().join("bin")).expect("mkdir");
        std::fs::write(root.path().join("bin/exe"), &exe).expect("write");
        let file = ElfFileRef::new("/bin/exe").with_root(root.path());

        let asked = Arc::new(AtomicU64::new(0));
        let counter = asked.clone();
        let p = ElfProvider::with_extractor(move |elf, debuglink| {
            counter.fetch_add(1, Ordering::Relaxed);
            match elf.debug_link().and_then(|link| debuglink(&link)) {
                Some(d) => Ok(IntervalData::from_deltas(vec![StackDelta::new(
                    d.0.len(),
                    0,
                    info::STOP,
                )])),
                None => Ok(one_delta(elf)),
            }
        });
        // With the root there (and no debug file) the extraction goes on.
        assert!(p.extract(&file).is_ok());
        // With the debug file there, its bytes reach the extraction.
        std::fs::write(root.path().join("bin/exe.debug"), &debug).expect("write");
        let ex = p.extract(&file).expect("with debug file");
        assert_eq!(ex.data.get(0).unwrap().address, debug.len() as u64);
        std::fs::remove_file(root.path().join("bin/exe.debug")).expect("rm");

        file.get().expect("opened before the process exits");
        root.close().expect("the process exits");
        let e = p.extract(&file).expect_err("gone");
        assert_eq!(e.kind, ExtractErrorKind::NotFound, "{e}");
        assert_eq!(asked.load(Ordering::Relaxed), 3);
        assert_eq!(
            p.statistics(),
            Statistics {
                success: 2,
                extraction_errors: 0,
                changed: 0,
            }
        );
    }

    #[test]
    fn the_manager_loads_files_through_references() {
        use eim_core::{ExecutableInfoManager, Tracers};
        use eim_sim::{SimConfig, SimMaps};
        let provider = ElfProvider::with_extractor(|elf, _| {
            let mut data = one_delta(elf);
            data.add(StackDelta::new(
                elf.entry() + 0x40,
                hint::GAP,
                info::INVALID,
            ));
            Ok(data)
        });
        let maps = SimMaps::new(SimConfig::default()).expect("maps");
        let manager = ExecutableInfoManager::new(provider, maps, Tracers::none());
        let file = ElfFileRef::new(testdata().join("upstream/volname"));
        let id = file.file_id().expect("file id").host();
        manager.add_or_inc_ref(id, &file).expect("loaded");
        manager.add_or_inc_ref(id, &file).expect("second reference");
        assert_eq!(manager.with_backend(|maps| maps.table_count()), 1);
        file.close();
        manager.remove_or_dec_ref(id).expect("released");
        manager.remove_or_dec_ref(id).expect("unloaded");
        assert!(manager.with_backend(|maps| maps.holds_no_file_data()));
        // A file that has gone: an error, neither counted nor deferred.
        let gone = ElfFileRef::new("/nonexistent/eim/exe");
        let e = manager
            .add_or_inc_ref(eim_machine::FileId(1), &gone)
            .expect_err("gone");
        assert!(e.to_string().contains("/nonexistent/eim/exe"), "{e}");
        let e = manager
            .add_or_inc_ref(eim_machine::FileId(1), &gone)
            .expect_err("retried");
        assert!(!matches!(e, eim_core::Error::Deferred { .. }), "{e}");
    }

    #[test]
    fn the_built_in_extraction_gives_upstreams_volname_deltas() {
        let volname = ElfFileRef::new(testdata().join("upstream/volname"));
        let r = ElfProvider::new().extract(&volname).expect("extracts");
        assert_eq!(r.data.len(), 27);
        assert_eq!(r.data.get(0).unwrap().address, 0x850);
    }

    /// Spec 7.2's four C libraries (DTV values from upstream's tests, TSD
    /// values from the oracle's `.tsd` files) come out of the manager with
    /// both layouts, each file by the name it has when installed.
    #[test]
    fn c_libraries_carry_their_layouts_through_the_manager() {
        use eim_core::{ExecutableInfoManager, Tracers};
        use eim_sim::{SimConfig, SimMaps};
        let tsd = |offset, multiplier, indirect| {
            Some(TsdInfo {
                offset,
                multiplier,
                indirect,
            })
        };
        let dtv = |offset, multiplier| Some(DtvInfo { offset, multiplier });
        let bin = testdata().join("oracle/bin");
        let dir = tempdir();
        // The arm64 inputs are stored renamed (`aarch64-...`); installed
        // names put them under the C-library pattern again.
        let installed = |source: &str, name: &str| -> std::path::PathBuf {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::os::unix::fs::symlink(bin.join(source), &path).expect("symlink");
            path
        };
        let cases = [
            // glibc splits them: libc.so.6 only imports `__tls_get_addr`,
            // which the dynamic loader defines.
            (
                "/lib/x86_64-linux-gnu/libc.so.6".into(),
                tsd(792, 16, 0),
                None,
            ),
            ("/lib64/ld-linux-x86-64.so.2".into(), None, dtv(8, 16)),
            (
                installed("aarch64-libc.so.6", "lib/aarch64-linux-gnu/libc.so.6"),
                tsd(-1576, 16, 0),
                None,
            ),
            (
                installed("aarch64-ld-linux-aarch64.so.1", "lib/ld-linux-aarch64.so.1"),
                None,
                dtv(0, 16),
            ),
            // musl has both in one file.
            (
                "/usr/lib/x86_64-linux-musl/libc.so".into(),
                tsd(128, 8, 1),
                dtv(8, 8),
            ),
            (
                installed("aarch64-musl-libc.so", "lib/ld-musl-aarch64.so.1"),
                tsd(-88, 8, 1),
                dtv(-8, 8),
            ),
        ];
        let info_of = |manager: &ExecutableInfoManager<ElfProvider, SimMaps>, path: &Path| {
            let file = ElfFileRef::new(path);
            let id = file.file_id().unwrap_or_else(|e| panic!("{e}")).host();
            manager
                .add_or_inc_ref(id, &file)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let maps = SimMaps::new(SimConfig::default()).expect("maps");
        let manager = ExecutableInfoManager::new(ElfProvider::new(), maps, Tracers::none());
        for (path, tsd, dtv) in &cases {
            // musl's libc.so is installed by tests/run, not on a stock machine.
            if !eim_test_support::present(path) {
                continue;
            }
            let info = info_of(&manager, path);
            assert_eq!(
                info.libc,
                LibcInfo {
                    tsd: *tsd,
                    dtv: *dtv
                },
                "{}",
                path.display()
            );
        }
        // Files that are no C library by name have neither layout, even
        // those defining `__tls_get_addr` (a fresh manager: one already
        // holding these bytes would answer with what it knows).
        let maps = SimMaps::new(SimConfig::default()).expect("maps");
        let manager = ExecutableInfoManager::new(ElfProvider::new(), maps, Tracers::none());
        for name in [
            "ccorpus-x86_64-O2",
            "aarch64-ld-linux-aarch64.so.1",
            "aarch64-musl-libc.so",
        ] {
            let info = info_of(&manager, &bin.join(name));
            assert_eq!(info.libc, LibcInfo::default(), "{name}");
        }
    }

    #[test]
    fn a_c_library_by_name_gets_its_tsd_layout() {
        let musl = testdata().join("oracle/bin/aarch64-musl-libc.so");
        let dir = tempdir();
        let as_libc = dir.path().join("libc.so");
        std::os::unix::fs::symlink(&musl, &as_libc).expect("symlink");
        let p = ElfProvider::new();
        let named = p.extract(&ElfFileRef::new(&as_libc)).expect("extracted");
        assert_eq!(
            named.libc.tsd,
            Some(TsdInfo {
                offset: -88,
                multiplier: 8,
                indirect: 1
            })
        );
        // The same bytes under their renamed name: not a C library by name.
        let renamed = p.extract(&ElfFileRef::new(&musl)).expect("extracted");
        assert_eq!(renamed.libc, LibcInfo::default());
        assert_eq!(renamed.data, named.data);
        // A C library name whose analysis fails has no layout, and that is
        // not an extraction failure.
        let volname = dir.path().join("libpthread.so.0");
        std::os::unix::fs::symlink(testdata().join("upstream/volname"), &volname).expect("symlink");
        assert_eq!(
            p.extract(&ElfFileRef::new(&volname)).map(|e| e.libc),
            Ok(LibcInfo::default())
        );
    }
}
