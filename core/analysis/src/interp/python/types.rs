//! The layouts CPython publishes about its own objects: a type object's
//! `tp_basicsize` and its `tp_members` table (`PyMemberDef`: a member's
//! name and its offset in the object). Upstream's loader reads them for
//! `PyCode_Type`, `PyFrame_Type` and `PyBytes_Type` and overrides its
//! per-version offsets with them, so a distribution's patched or
//! differently configured build still unwinds.
//!
//! Everything is read from the file as the dynamic loader would see it:
//! the member table and the names are pointers, relocated in a
//! position-independent build (upstream reads the stored bytes there,
//! which are zero, and so finds no members in a shared libpython).

use std::collections::BTreeMap;

use super::super::access::{named_entries, read_u64, Relocations, Symbols};
use super::super::LoaderError;
use crate::elf::Elf;

/// The type objects read, in upstream's order.
pub(crate) const TYPES: [&str; 3] = ["PyCode_Type", "PyFrame_Type", "PyBytes_Type"];

/// `PyTypeObject.tp_basicsize` and `.tp_members` (64-bit builds, the same
/// from 3.6 to 3.13).
const TP_BASICSIZE: u64 = 32;
const TP_MEMBERS: u64 = 240;
/// `PyMemberDef`: `name` at 0, `offset` (a `Py_ssize_t`) at 16; 40 bytes.
const MEMBER_OFFSET: u64 = 16;
const MEMBER_SIZE: u64 = 40;
/// Bounds on a hostile table: CPython's largest has about 20 members.
const MAX_MEMBERS: u64 = 256;
const MAX_NAME: usize = 64;

/// What one type object says of its instances.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeLayout {
    pub basic_size: u64,
    /// Member name -> offset in the object.
    pub members: BTreeMap<String, u64>,
}

/// The layout of type object `name`, which must exist.
pub(crate) fn layout(
    elf: &Elf<'_>,
    syms: &Symbols<'_>,
    relocations: &Relocations,
    name: &str,
) -> Result<TypeLayout, LoaderError> {
    let at = syms.require(name)?.address;
    let basic_size = read_u64(elf, at + TP_BASICSIZE, &format!("{name}.tp_basicsize"))?;
    let mut members = BTreeMap::new();
    let table = relocations.pointer(elf, at + TP_MEMBERS, &format!("{name}.tp_members"))?;
    if table != 0 {
        let what = format!("{name}.tp_members");
        named_entries(
            elf,
            relocations,
            &what,
            table,
            MEMBER_SIZE,
            MAX_MEMBERS,
            MAX_NAME,
            |entry, member| {
                let offset = read_u64(
                    elf,
                    entry + MEMBER_OFFSET,
                    &format!("{what}.{member}.offset"),
                )?;
                members.insert(member, offset);
                Ok(())
            },
        )?;
    }
    Ok(TypeLayout {
        basic_size,
        members,
    })
}
