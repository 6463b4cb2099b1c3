//! HotSpot (`libjvm.so`).
//!
//! Extracts the VM version from `Abstract_VM_Version::_vm_{major,minor,
//! security,patch}_version` and `_vm_build_number` (4-byte ints; those the
//! build leaves zero live in `.bss`), and parses the VM structs the
//! serviceability agent reads: `gHotSpotVMStructs` and `gHotSpotVMTypes`
//! point (through relocations) to NULL-terminated arrays of entries whose
//! names are relocated string pointers. The field offsets / static
//! addresses and the type sizes are kept by name. HotSpot needs no
//! `interpreter_offsets`.

use std::collections::BTreeMap;

use super::access::{named_entries, read_u32, read_u64, string_at, Relocations, Symbols};
use super::names::HOTSPOT;
use super::InterpreterData;
use super::{Loaded, LoaderError, LoaderInfo};
use crate::elf::Elf;

pub const NAME: &str = "hotspot";

/// Entries read from either table at most.
const MAX_ENTRIES: u64 = 1 << 16;
const MAX_NAME: usize = 256;
/// `VMStructEntry`: typeName, fieldName, typeString, isStatic (int32, padded),
/// offset, address.
const STRUCT_ENTRY: u64 = 48;
/// `VMTypeEntry`: typeName, superclassName, isOopType, isIntegerType,
/// isUnsigned (int32 each, padded), size.
const TYPE_ENTRY: u64 = 40;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HotspotData {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) security: u32,
    pub(crate) patch: u32,
    pub(crate) build: u32,
    /// `Type::field` -> its offset (instance fields) or address (statics).
    pub(crate) fields: BTreeMap<String, u64>,
    /// Type name -> size.
    pub(crate) types: BTreeMap<String, u64>,
}

impl InterpreterData for HotspotData {
    fn loader(&self) -> &'static str {
        NAME
    }

    fn version(&self) -> String {
        let mut v = format!("{}.{}.{}", self.major, self.minor, self.security);
        if self.patch != 0 {
            v.push_str(&format!(".{}", self.patch));
        }
        format!("{v}+{}", self.build)
    }

    fn facts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("version", self.version()),
            ("vmStructs fields", self.fields.len().to_string()),
            ("vmStructs types", self.types.len().to_string()),
        ]
    }
}

/// What every name this loader looks up starts with (libjvm has 58k
/// symbols; only these are indexed).
const PREFIXES: &[&str] = &[VERSION_PREFIX, "gHotSpotVM"];
const VERSION_PREFIX: &str = "_ZN19Abstract_VM_Version";

fn version_int(
    info: &LoaderInfo<'_, '_>,
    syms: &Symbols<'_>,
    name: &str,
) -> Result<u32, LoaderError> {
    let symbol = format!("{VERSION_PREFIX}{}{name}E", name.len());
    let sym = syms.require(&symbol)?;
    read_u32(info.elf, sym.address, &symbol)
}

pub fn load(info: &LoaderInfo<'_, '_>) -> Result<Option<Loaded>, LoaderError> {
    if !HOTSPOT.is_match(info.name) {
        return Ok(None);
    }
    let syms = &info.symbols_with(PREFIXES);
    let major = version_int(info, syms, "_vm_major_version")?;
    if major == 0 {
        return Err(LoaderError::Invalid("the VM major version is 0".into()));
    }
    let relocations = Relocations::of(info.elf);
    let table = |name: &str| -> Result<u64, LoaderError> {
        let sym = syms.require(name)?;
        relocations.pointer(info.elf, sym.address, name)
    };
    let fields = read_structs(info.elf, &relocations, table("gHotSpotVMStructs")?)?;
    let types = read_types(info.elf, &relocations, table("gHotSpotVMTypes")?)?;
    Ok(Some(Loaded::new(
        HotspotData {
            major,
            minor: version_int(info, syms, "_vm_minor_version")?,
            security: version_int(info, syms, "_vm_security_version")?,
            patch: version_int(info, syms, "_vm_patch_version").unwrap_or(0),
            build: version_int(info, syms, "_vm_build_number")?,
            fields,
            types,
        },
        None,
    )))
}

fn read_structs(
    elf: &Elf<'_>,
    relocations: &Relocations,
    base: u64,
) -> Result<BTreeMap<String, u64>, LoaderError> {
    let mut out = BTreeMap::new();
    let table = "gHotSpotVMStructs";
    named_entries(
        elf,
        relocations,
        table,
        base,
        STRUCT_ENTRY,
        MAX_ENTRIES,
        MAX_NAME,
        |entry, type_name| {
            let field = string_at(
                elf,
                relocations,
                entry + 8,
                MAX_NAME,
                "VMStructEntry.fieldName",
            )?
            .unwrap_or_default();
            let is_static = read_u32(elf, entry + 24, "VMStructEntry.isStatic")? != 0;
            let value = if is_static {
                relocations.pointer(elf, entry + 40, "VMStructEntry.address")?
            } else {
                read_u64(elf, entry + 32, "VMStructEntry.offset")?
            };
            out.insert(format!("{type_name}::{field}"), value);
            Ok(())
        },
    )?;
    Ok(out)
}

fn read_types(
    elf: &Elf<'_>,
    relocations: &Relocations,
    base: u64,
) -> Result<BTreeMap<String, u64>, LoaderError> {
    let mut out = BTreeMap::new();
    let table = "gHotSpotVMTypes";
    named_entries(
        elf,
        relocations,
        table,
        base,
        TYPE_ENTRY,
        MAX_ENTRIES,
        MAX_NAME,
        |entry, type_name| {
            out.insert(type_name, read_u64(elf, entry + 32, "VMTypeEntry.size")?);
            Ok(())
        },
    )?;
    Ok(out)
}
