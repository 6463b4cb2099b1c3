//! The cheap evidence a loader that does not go by the file's name tests
//! before it reads anything else of the file: which sections the file has,
//! by name, and whether it carries Go's build-id note. Built once per file,
//! on first use, and shared by every loader; a loader that goes by the
//! file's name tests the name first and never needs it.
//!
//! What it saves: on a file no loader claims, the Go labels loader used to
//! read and search the whole first writable segment for Go's build
//! information (2.4 MB of librustc_driver), on every file of the host.
//! Upstream searches it only in a file with one of Go's sections
//! (`pfelf.File.IsGolang` before `GoVersion`). [`Evidence::is_go`] also
//! takes Go's note, which the Go linker writes into every file `go build`
//! links: a Go file whose section headers are stripped has none of Go's
//! sections but keeps the note in its note segment, and the labels loader
//! claimed such a file before it tested the evidence, so it still does.

use std::cell::OnceCell;
use std::collections::HashSet;

use object::LittleEndian;

use crate::elf::gopclntab::has_go_build_id_note;
use crate::elf::Elf;

/// Go's sections: its build information and its pc/line table.
pub(crate) const GO_BUILDINFO: &str = ".go.buildinfo";
pub(crate) const GO_PCLNTAB: &str = ".gopclntab";

/// What a file shows of itself cheaply (see the module documentation).
pub(crate) struct Evidence<'a, 'd> {
    elf: &'a Elf<'d>,
    sections: OnceCell<HashSet<&'d [u8]>>,
    go_note: OnceCell<bool>,
}

impl<'a, 'd> Evidence<'a, 'd> {
    pub(crate) fn new(elf: &'a Elf<'d>) -> Self {
        Self {
            elf,
            sections: OnceCell::new(),
            go_note: OnceCell::new(),
        }
    }

    /// Whether a section header names a section `name` (whatever its
    /// contents; [`Elf::section`] then says whether they can be read).
    pub(crate) fn has_section(&self, name: &str) -> bool {
        self.sections
            .get_or_init(|| section_names(self.elf))
            .contains(name.as_bytes())
    }

    /// Whether the file has Go's build-id note.
    pub(crate) fn has_go_note(&self) -> bool {
        *self.go_note.get_or_init(|| has_go_build_id_note(self.elf))
    }

    /// Whether the file is Go's by what it shows of itself: one of Go's
    /// sections, or Go's note (a Go file whose section headers are
    /// stripped keeps it in its note segment).
    pub(crate) fn is_go(&self) -> bool {
        self.has_section(GO_BUILDINFO) || self.has_section(GO_PCLNTAB) || self.has_go_note()
    }
}

/// The names in the section header table, which `object` has bounded by the
/// file when it parsed it. A name that cannot be read is left out, as
/// `object`'s lookup by name skips it.
fn section_names<'d>(elf: &Elf<'d>) -> HashSet<&'d [u8]> {
    let table = elf.file.elf_section_table();
    table
        .iter()
        .filter_map(|header| table.section_name(LittleEndian, header).ok())
        .collect()
}
