//! The tracer set and the interpreter loaders it enables: which loaders a
//! profiler's tracers turn on, asking them about a file, and what each one
//! that recognised it said. The loaders themselves ([`eim_analysis::interp`]) are
//! pure analysis and hand back plain data; this is where the facade wraps it
//! into the [`LoaderMatch`]es an [`crate::ExecutableInfo`] carries.

use std::fmt;
use std::sync::Arc;

use eim_analysis::interp::{
    apm, dotnet, go, hotspot, perl, php, python, ruby, v8, InterpreterOffsets, LoadFn, Loaded,
    LoaderError, LoaderInfo,
};
use eim_machine::abi::OffsetRange;

/// The interpreter tracers a profiler enables (upstream's `includeTracers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tracers(pub u32);

impl Tracers {
    pub(crate) const PERL: u32 = 1 << 0;
    pub const PYTHON: u32 = 1 << 1;
    pub(crate) const PHP: u32 = 1 << 2;
    pub(crate) const HOTSPOT: u32 = 1 << 3;
    pub(crate) const RUBY: u32 = 1 << 4;
    pub(crate) const V8: u32 = 1 << 5;
    pub(crate) const DOTNET: u32 = 1 << 6;
    pub(crate) const GO: u32 = 1 << 7;
    pub(crate) const LABELS: u32 = 1 << 8;

    pub fn none() -> Self {
        Self(0)
    }

    pub(crate) fn contains(self, tracer: u32) -> bool {
        self.0 & tracer != 0
    }
}

/// One loader's answer for a file it recognised (a loader that said "not
/// mine" leaves no match).
#[derive(Clone, Debug)]
pub struct LoaderMatch {
    pub loader: &'static str,
    pub outcome: Result<Loaded, LoaderError>,
}

impl LoaderMatch {
    /// The ranges this match puts in `interpreter_offsets`, if any.
    pub fn offsets(&self) -> Option<&InterpreterOffsets> {
        self.outcome.as_ref().ok()?.offsets.as_ref()
    }
}

impl PartialEq for LoaderMatch {
    fn eq(&self, other: &Self) -> bool {
        self.loader == other.loader
            && match (&self.outcome, &other.outcome) {
                (Ok(a), Ok(b)) => Arc::ptr_eq(&a.data, &b.data) && a.offsets == b.offsets,
                (Err(a), Err(b)) => a == b,
                _ => false,
            }
    }
}

impl Eq for LoaderMatch {}

impl fmt::Display for LoaderMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Ok(loaded) => {
                write!(f, "{} {}", self.loader, loaded.data.version())?;
                if let Some(o) = &loaded.offsets {
                    write!(
                        f,
                        " program {} {:#x}..{:#x}",
                        o.program, o.first.start, o.first.end
                    )?;
                    if let Some(s) = &o.second {
                        write!(f, " + {:#x}..{:#x}", s.start, s.end)?;
                    }
                }
                Ok(())
            }
            Err(e) => write!(f, "{}: error: {e}", self.loader),
        }
    }
}

/// A registered loader and the tracer that enables it (`None`: always on,
/// like upstream's APM integration).
pub struct Loader {
    pub name: &'static str,
    pub(crate) tracer: Option<u32>,
    pub load: LoadFn,
}

/// Every loader, in upstream's order (perl, python, php, opcache, hotspot,
/// ruby, v8, dotnet, go, apm, golabels).
pub const LOADERS: &[Loader] = &[
    Loader {
        name: perl::NAME,
        tracer: Some(Tracers::PERL),
        load: perl::load,
    },
    Loader {
        name: python::NAME,
        tracer: Some(Tracers::PYTHON),
        load: python::load,
    },
    Loader {
        name: php::NAME,
        tracer: Some(Tracers::PHP),
        load: php::load,
    },
    Loader {
        name: php::OPCACHE_NAME,
        tracer: Some(Tracers::PHP),
        load: php::load_opcache,
    },
    Loader {
        name: hotspot::NAME,
        tracer: Some(Tracers::HOTSPOT),
        load: hotspot::load,
    },
    Loader {
        name: ruby::NAME,
        tracer: Some(Tracers::RUBY),
        load: ruby::load,
    },
    Loader {
        name: v8::NAME,
        tracer: Some(Tracers::V8),
        load: v8::load,
    },
    Loader {
        name: dotnet::NAME,
        tracer: Some(Tracers::DOTNET),
        load: dotnet::load,
    },
    Loader {
        name: go::NAME,
        tracer: Some(Tracers::GO),
        load: go::load,
    },
    Loader {
        name: apm::NAME,
        tracer: None,
        load: apm::load,
    },
    Loader {
        name: go::LABELS_NAME,
        tracer: Some(Tracers::LABELS),
        load: go::load_labels,
    },
];

/// The loaders `tracers` enables, in order.
pub(crate) fn enabled(tracers: Tracers) -> impl Iterator<Item = &'static Loader> {
    LOADERS
        .iter()
        .filter(move |l| l.tracer.is_none_or(|t| tracers.contains(t)))
}

/// Asks every enabled loader about the file and keeps every answer other
/// than "not mine", in loader order. `interpreter_offsets` holds one entry
/// per file, so only the first match that needs ranges gets them; a later
/// one becomes an error naming the first (no two patterns of spec 8.2 match
/// the same file, so this is a guard, not a policy).
pub fn detect(info: &LoaderInfo<'_, '_>, tracers: Tracers) -> Vec<LoaderMatch> {
    let mut out = Vec::new();
    let mut offsets_owner: Option<&'static str> = None;
    for loader in enabled(tracers) {
        let outcome = match (loader.load)(info) {
            Ok(None) => continue,
            Ok(Some(loaded)) => match (&loaded.offsets, offsets_owner) {
                (Some(_), Some(owner)) => Err(LoaderError::OffsetsTaken(owner)),
                (Some(_), None) => {
                    offsets_owner = Some(loader.name);
                    Ok(loaded)
                }
                (None, _) => Ok(loaded),
            },
            Err(e) => Err(e),
        };
        out.push(LoaderMatch {
            loader: loader.name,
            outcome,
        });
    }
    out
}

/// The `interpreter_offsets` value the matches need, if any (the first
/// match with ranges; [`detect`] lets only one have them).
pub(crate) fn offsets_of(matches: &[LoaderMatch]) -> Option<OffsetRange> {
    matches.iter().find_map(|m| m.offsets()).map(|o| o.value())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tracer_enables_its_loaders_and_apm_is_always_on() {
        assert_eq!(enabled(Tracers::none()).count(), 1);
        assert_eq!(enabled(Tracers(u32::MAX)).count(), LOADERS.len());
        let php: Vec<_> = enabled(Tracers(Tracers::PHP)).map(|l| l.name).collect();
        assert_eq!(php, [php::NAME, php::OPCACHE_NAME, apm::NAME]);
    }
}
