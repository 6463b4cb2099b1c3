//! The files a simulated host maps, and the provider that "extracts" them.
//!
//! A pool is built once per run from the seed: synthetic files of every
//! shape plus some real files of the corpus. The provider serves each
//! file's deltas, or fails the way a real provider does: the file is gone
//! (`NotFound`, never deferred), it is corrupt (`Invalid`, deferred for the
//! TTL), or it vanishes while being read (one `NotFound`, then back).

use std::sync::{Arc, Mutex};

use eim_analysis::LibcInfo;
use eim_core::provider::{ExtractError, ExtractErrorKind, Extraction, Provider};
use eim_machine::deltas::IntervalData;
use eim_machine::FileId;

use crate::checker::Sources;
use crate::corpus::RealFile;
use crate::rng::SimRng;
use crate::synth::{self, Shape};

/// Where a pool file's deltas came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Synthetic(Shape),
    Real(String),
}

/// One file of the pool.
#[derive(Clone, Debug)]
pub struct PoolFile {
    pub id: FileId,
    pub origin: Origin,
    pub data: Arc<IntervalData>,
    /// How often processes map it, relative to the other files.
    pub weight: u32,
}

/// The recipe of a pool (part of a profile).
#[derive(Clone, Debug)]
pub struct PoolSpec {
    pub synthetic: usize,
    /// Weight of each [`Shape::ALL`] entry when drawing a synthetic file.
    pub shapes: [u32; 9],
    /// Real files with at most this many deltas are in the pool...
    pub real_max_deltas: usize,
    /// ...and are mapped this often relative to a synthetic file (per
    /// thousand); files over 5000 deltas ten times less often.
    pub real_weight: u32,
}

/// File ids are small and dense, so a trace names files by index.
pub fn file_id(index: usize) -> FileId {
    FileId(0xf000 + index as u64)
}

/// The pool of a run: synthetic files first, then the real ones.
pub fn build(spec: &PoolSpec, corpus: &[RealFile], rng: &mut SimRng) -> Vec<PoolFile> {
    let mut files = Vec::new();
    for _ in 0..spec.synthetic {
        let shape = Shape::ALL[rng.weighted(&spec.shapes)];
        let data = synth::generate(shape, rng);
        // Loading costs time in proportion to the deltas: big tables are
        // mapped less often, so that a run spends its time on many steps.
        let weight = match data.len() {
            0..=600 => 1000,
            601..=2000 => 300,
            _ => 30,
        };
        files.push((Origin::Synthetic(shape), data, weight));
    }
    for real in corpus {
        if real.data.len() > spec.real_max_deltas || spec.real_weight == 0 {
            continue;
        }
        let weight = if real.data.len() > 5000 {
            (spec.real_weight / 10).max(1)
        } else {
            spec.real_weight
        };
        files.push((Origin::Real(real.name.clone()), real.data.clone(), weight));
    }
    files
        .into_iter()
        .enumerate()
        .map(|(i, (origin, data, weight))| PoolFile {
            id: file_id(i),
            origin,
            data: Arc::new(data),
            weight,
        })
        .collect()
}

/// The source deltas of every pool file, for the checkers.
pub fn sources(pool: &[PoolFile]) -> Sources {
    pool.iter()
        .map(|f| (f.id, IntervalData::clone(&f.data)))
        .collect()
}

/// What the provider does when asked for a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Present,
    /// Deleted: `NotFound` until restored.
    Gone,
    /// Unreadable unwind data: `Invalid` until restored.
    Corrupt,
    /// The next read finds the file gone (the process exited while it was
    /// read); later reads find it again.
    VanishesOnRead,
}

/// A provider over a pool, by pool index.
#[derive(Debug)]
pub struct SimProvider {
    files: Vec<Arc<IntervalData>>,
    modes: Mutex<Vec<Mode>>,
}

impl SimProvider {
    pub fn new(pool: &[PoolFile]) -> Self {
        Self {
            files: pool.iter().map(|f| f.data.clone()).collect(),
            modes: Mutex::new(vec![Mode::Present; pool.len()]),
        }
    }

    /// Sets a file's mode; an index outside the pool is ignored (a shrunk
    /// trace may name any index).
    pub fn set_mode(&self, index: usize, mode: Mode) {
        let mut modes = self.modes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modes.get_mut(index) {
            *m = mode;
        }
    }

    pub fn mode(&self, index: usize) -> Option<Mode> {
        let modes = self.modes.lock().unwrap_or_else(|e| e.into_inner());
        modes.get(index).copied()
    }
}

impl Provider for SimProvider {
    type Elf = usize;

    fn extract(&self, index: &usize) -> Result<Extraction, ExtractError> {
        let path = format!("/sim/file{index}");
        let mode = {
            let mut modes = self.modes.lock().unwrap_or_else(|e| e.into_inner());
            let Some(mode) = modes.get_mut(*index) else {
                return Err(ExtractError::new(
                    ExtractErrorKind::NotFound,
                    path,
                    "no such file in the pool",
                ));
            };
            let now = *mode;
            if now == Mode::VanishesOnRead {
                *mode = Mode::Present;
            }
            now
        };
        match mode {
            Mode::Present => Ok(Extraction {
                data: IntervalData::clone(&self.files[*index]),
                libc: LibcInfo::default(),
                interpreters: Vec::new(),
            }),
            Mode::Gone => Err(ExtractError::new(
                ExtractErrorKind::NotFound,
                path,
                "no such file or directory",
            )),
            Mode::VanishesOnRead => Err(ExtractError::new(
                ExtractErrorKind::NotFound,
                path,
                "the file vanished during extraction",
            )),
            Mode::Corrupt => Err(ExtractError::new(
                ExtractErrorKind::Invalid,
                path,
                "malformed .eh_frame",
            )),
        }
    }
}
