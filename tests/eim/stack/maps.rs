//! Where a PC is: the process's mappings (`/proc/PID/maps`) and the ELF
//! address of a PC in a mapped file (from the file's program headers with
//! the `object` crate, not eim's code).

use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSegment as _};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    pub offset: u64,
    /// The path, for a file mapping (`[vdso]`, `[stack]` and anonymous
    /// memory have none).
    pub file: Option<PathBuf>,
    /// Whether this is the `[vdso]` mapping.
    pub vdso: bool,
}

/// The mappings of `pid` now.
pub fn mappings(pid: u32) -> Vec<Mapping> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/maps: {e}"));
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.collect::<Vec<_>>().join(" ");
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        executable: perms.contains('x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        vdso: path == "[vdso]",
        file: (path.starts_with('/') && !path.ends_with(" (deleted)")).then(|| PathBuf::from(path)),
    })
}

/// The mapping holding `pc`.
pub fn find(maps: &[Mapping], pc: u64) -> Option<&Mapping> {
    maps.iter().find(|m| m.start <= pc && pc < m.end)
}

/// The executable file mapping holding `pc`: where an unwinder with file
/// CFI can find a rule.
pub fn file_mapping(maps: &[Mapping], pc: u64) -> Option<&Mapping> {
    find(maps, pc).filter(|m| m.executable && m.file.is_some())
}

/// The ELF virtual address of `pc` in `mapping`'s file: its file offset
/// placed by the `PT_LOAD` segment holding that offset.
pub fn elf_address(mapping: &Mapping, pc: u64) -> Option<u64> {
    let file = mapping.file.as_ref()?;
    let file_offset = pc - mapping.start + mapping.offset;
    let bytes = std::fs::read(file).ok()?;
    let elf = object::File::parse(&*bytes).ok()?;
    elf.segments().find_map(|segment| {
        let (start, size) = segment.file_range();
        (start <= file_offset && file_offset < start + size)
            .then(|| file_offset - start + segment.address())
    })
}

/// The names of the sections holding ELF address `address` of `file`.
pub fn section_of(file: &Path, address: u64) -> Option<String> {
    use object::ObjectSection as _;
    let bytes = std::fs::read(file).ok()?;
    let elf = object::File::parse(&*bytes).ok()?;
    elf.sections()
        .find(|s| s.address() <= address && address < s.address() + s.size())
        .and_then(|s| s.name().ok().map(str::to_string))
}
