//! V8 (Node.js: `node`, `nsolid`, `libnode.so`).
//!
//! Extracts the V8 version from `v8::internal::Version::{major,minor,build,
//! patch}_` (native-endian u32 each) with upstream's gate reproduced exactly
//! (spec erratum W1: it rejects major > 255, minor > 255, build > 65535 and
//! packed values below 0x080100, i.e. only 0.x), the address of
//! `Bytecodes::kBytecodeSizes`, V8's post-mortem constants (every 4-byte
//! `v8dbg_` symbol: the type ids and field offsets the unwinder reads
//! objects with), and the snapshot code area: the first gap of at least 512 KiB
//! starting less than 1 KiB after `Snapshot::DefaultSnapshotBlob()`. Only
//! when that area is found it is asked for in `interpreter_offsets`
//! (program 7).

use std::collections::BTreeMap;
use std::ops::Range;

use super::access::{read_u32, Symbols};
use super::names::V8;
use super::InterpreterData;
use super::{InterpreterOffsets, Loaded, LoaderError, LoaderInfo};
use crate::elf::Elf;
use eim_machine::abi::program;

pub const NAME: &str = "v8";

const MAJOR: &str = "_ZN2v88internal7Version6major_E";
const MINOR: &str = "_ZN2v88internal7Version6minor_E";
const BUILD: &str = "_ZN2v88internal7Version6build_E";
const PATCH: &str = "_ZN2v88internal7Version6patch_E";
const SNAPSHOT_BLOB: &str = "_ZN2v88internal8Snapshot19DefaultSnapshotBlobEv";
const BYTECODE_SIZES: &str = "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE";
/// How far after the blob accessor the snapshot gap may start.
const SNAPSHOT_GAP_DISTANCE: u64 = 1024;
const INTROSPECTION_PREFIX: &str = "v8dbg_";
/// What every name this loader looks up starts with (node has 185k
/// symbols; only these are indexed).
const PREFIXES: &[&str] = &["_ZN2v88internal", INTROSPECTION_PREFIX];
/// Bound on a hostile symbol table (V8 has about 500 constants).
const MAX_INTROSPECTION: usize = 16_384;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V8Data {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) build: u32,
    pub(crate) patch: Option<u32>,
    pub(crate) bytecode_sizes: Option<u64>,
    /// V8's post-mortem constants (`v8dbg_*`, 4-byte ints: type ids,
    /// class field offsets, frame offsets) by name without the prefix.
    pub introspection: BTreeMap<String, i32>,
    pub(crate) snapshot: Option<Range<u64>>,
}

impl InterpreterData for V8Data {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        match self.patch {
            Some(p) => format!("{}.{}.{}.{}", self.major, self.minor, self.build, p),
            None => format!("{}.{}.{}", self.major, self.minor, self.build),
        }
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("version", self.version()),
            ("introspection values", self.introspection.len().to_string()),
        ];
        if let Some(s) = &self.snapshot {
            out.push((
                "snapshot",
                eim_machine::abi::inclusive_range(s.start, s.end),
            ));
        }
        out
    }
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    if !V8.is_match(info.name) {
        return Ok(None);
    }
    let syms = &info.symbols_with(PREFIXES);
    let elf = info.elf;
    let word = |name: &str| -> Result<u32, LoaderError> {
        read_u32(elf, syms.require(name)?.address, name)
    };
    let (major, minor, build) = (word(MAJOR)?, word(MINOR)?, word(BUILD)?);
    let patch = syms
        .get(PATCH)
        .and_then(|s| read_u32(elf, s.address, PATCH).ok());
    let packed = u64::from(major) * 0x100_0000 + u64::from(minor) * 0x1_0000 + u64::from(build);
    if major > 0xff || minor > 0xff || build > 0xffff || packed < 0x08_0100 {
        return Err(LoaderError::UnsupportedVersion {
            found: format!("{major}.{minor}.{build}"),
            supported: "8.1.0 or later (as upstream's gate checks it)".into(),
        });
    }
    let snapshot = syms.get(SNAPSHOT_BLOB).and_then(|blob| {
        info.gaps()
            .iter()
            .find(|gap| gap.start.wrapping_sub(blob.address) < SNAPSHOT_GAP_DISTANCE)
            .cloned()
    });
    let offsets = snapshot
        .clone()
        .map(|area| InterpreterOffsets::one(program::V8, area));
    Ok(Some(Loaded::new(
        V8Data {
            major,
            minor,
            build,
            patch,
            bytecode_sizes: syms.get(BYTECODE_SIZES).map(|s| s.address),
            introspection: introspection(info.elf, syms)?,
            snapshot,
        },
        offsets,
    )))
}

/// Every `v8dbg_` constant of the file. Each is a 4-byte int (zero ones
/// live in `.bss`, which reads as zeros); there are about 500.
fn introspection(elf: &Elf<'_>, syms: &Symbols<'_>) -> Result<BTreeMap<String, i32>, LoaderError> {
    let mut constants = BTreeMap::new();
    for (name, sym) in syms.with_prefix(INTROSPECTION_PREFIX) {
        if constants.len() >= MAX_INTROSPECTION {
            return Err(LoaderError::Invalid(format!(
                "more than {MAX_INTROSPECTION} {INTROSPECTION_PREFIX} symbols"
            )));
        }
        let name = String::from_utf8_lossy(&name[INTROSPECTION_PREFIX.len()..]).into_owned();
        // A constant of another size is not one this loader knows to read.
        if sym.size != 4 {
            continue;
        }
        let value = read_u32(elf, sym.address, &format!("{INTROSPECTION_PREFIX}{name}"))?;
        constants.insert(name, value as i32);
    }
    Ok(constants)
}
