//! What the root package's interpreter tests share: the loaders' answers
//! for a file (skips and binutils' view of a file are
//! `eim_test_support`'s).
// Each test file uses a part of this module.
#![allow(dead_code)]

use std::any::Any;
use std::path::Path;

use eim::files::loaders::inspect;
use eim::interp::Loaded;
use eim::tracers::LoaderMatch;

/// Every loader's answer for `path` (which must be readable), each printed
/// as a `LOADER` line for the log.
pub fn matches_of(path: impl AsRef<Path>) -> Vec<LoaderMatch> {
    let path = path.as_ref();
    let matches = inspect(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for m in &matches {
        eprintln!("LOADER {}: {m}", path.display());
    }
    matches
}

/// The loaders that answered, in order.
pub fn loaders(matches: &[LoaderMatch]) -> Vec<&'static str> {
    matches.iter().map(|m| m.loader).collect()
}

/// The one match of `loader`, which must have succeeded.
pub fn loaded<'a>(matches: &'a [LoaderMatch], loader: &str) -> &'a Loaded {
    let found: Vec<_> = matches.iter().filter(|m| m.loader == loader).collect();
    assert_eq!(found.len(), 1, "{loader} in {matches:?}");
    found[0]
        .outcome
        .as_ref()
        .unwrap_or_else(|e| panic!("{loader}: {e}"))
}

/// The concrete data of `loader`'s successful match.
pub fn data_of<T: Any + Clone>(matches: &[LoaderMatch], loader: &str) -> T {
    let data: &dyn Any = loaded(matches, loader).data.as_ref();
    data.downcast_ref::<T>()
        .unwrap_or_else(|| panic!("{loader}'s data is not a {}", std::any::type_name::<T>()))
        .clone()
}

/// The first entry of `dir` whose file name satisfies `wanted`.
pub fn find_in(dir: impl AsRef<Path>, wanted: impl Fn(&str) -> bool) -> Option<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| wanted(&p.file_name().unwrap_or_default().to_string_lossy()))
}

/// `libruby-3.1.so.A.B.C` in `dir` (the full name: the loader wants three
/// numbers), or a path that does not exist.
pub fn ruby_library(dir: impl AsRef<Path>) -> std::path::PathBuf {
    let dir = dir.as_ref();
    find_in(dir, |n| {
        n.starts_with("libruby-3.1.so.") && n.matches('.').count() == 5
    })
    .unwrap_or_else(|| dir.join("libruby-3.1.so.3.1.x"))
}

/// HotSpot's data holds the VM structs its unwinder reads first.
pub fn assert_hotspot_vm_structs(l: &Loaded) {
    assert!(l.offsets.is_none(), "HotSpot needs no interpreter_offsets");
    let dbg = format!("{:?}", l.data);
    for needle in [
        "Method::_constMethod",
        "CodeCache::_heaps",
        "\"ConstMethod\"",
    ] {
        assert!(dbg.contains(needle), "VM structs lack {needle}");
    }
}
