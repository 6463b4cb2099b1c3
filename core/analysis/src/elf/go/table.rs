//! The `.gopclntab` header and the views into it (spec 5.6): the function
//! table, the `_func` records, and the name, compilation-unit, file and
//! pc-value tables. Everything borrows the table bytes; every read is
//! bounds-checked and a read outside the bytes is an error, never a panic.

use super::error::GoError;

/// Size of the part of the header every version shares.
pub(crate) const BASE_HEADER_SIZE: usize = 16;
/// Size of the Go 1.16 header.
const HEADER_116_SIZE: usize = BASE_HEADER_SIZE + 6 * 8;
/// Size of the Go 1.18 / 1.20 header.
const HEADER_118_SIZE: usize = BASE_HEADER_SIZE + 7 * 8;
/// The eight `int32` fields of a `_func` record after its entry pc.
const FUNC_FIELDS_SIZE: usize = 8 * 4;

/// The table layout, named after the Go release that introduced its magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Version {
    Go12,
    Go116,
    Go118,
    Go120,
}

impl Version {
    pub(crate) fn from_magic(magic: u32) -> Option<Self> {
        match magic {
            0xffff_fffb => Some(Self::Go12),
            0xffff_fffa => Some(Self::Go116),
            0xffff_fff0 => Some(Self::Go118),
            0xffff_fff1 => Some(Self::Go120),
            _ => None,
        }
    }

    /// Function-table entries and entry pcs are 32-bit offsets from the
    /// text start (instead of pointers).
    fn relative_pcs(self) -> bool {
        self >= Self::Go118
    }
}

pub(crate) fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

pub(crate) fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    let bytes = data.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

fn i32_at(data: &[u8], at: usize) -> Option<i32> {
    u32_at(data, at).map(|v| v as i32)
}

/// Upstream's tolerant `int32` read: −1 when `offset` is negative or the
/// four bytes are not all inside `data`.
fn int32_or_minus_one(data: &[u8], offset: i64) -> i64 {
    usize::try_from(offset)
        .ok()
        .and_then(|at| i32_at(data, at))
        .map_or(-1, i64::from)
}

/// Upstream's tolerant C-string read: the bytes from `offset` up to the next
/// NUL; empty when `offset` is negative, past the end, or no NUL follows.
pub(crate) fn c_string(data: &[u8], offset: i64) -> &[u8] {
    let Some(tail) = usize::try_from(offset).ok().and_then(|at| data.get(at..)) else {
        return &[];
    };
    match tail.iter().position(|&b| b == 0) {
        Some(end) => &tail[..end],
        None => &[],
    }
}

/// Whether the C string at `offset` is exactly `name` (without scanning
/// past `name`'s length: equivalent to `c_string(..) == name` for a
/// non-empty `name`).
pub(crate) fn c_string_is(data: &[u8], offset: i64, name: &[u8]) -> bool {
    let Some(tail) = usize::try_from(offset).ok().and_then(|at| data.get(at..)) else {
        return false;
    };
    tail.len() > name.len() && tail.starts_with(name) && tail[name.len()] == 0
}

fn corrupt(message: impl Into<String>) -> GoError {
    GoError::Corrupt(message.into())
}

/// The fields of a `_func` record eim uses (its int32 fields by position).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Func {
    /// Entry address.
    pub(crate) entry: u64,
    /// Offset of the name in the function-name table.
    pub(crate) name_off: i32,
    /// Offset of the pc → stack-pointer-delta table in the pc-value tables.
    pub(crate) pcsp_off: i32,
    /// Offset of the pc → file-number table.
    pub(crate) pcfile_off: i32,
    /// The record's eighth `int32`: the compilation-unit offset in Go 1.16+
    /// records (upstream calls it "npcData"), added to the file number.
    pub(crate) cu_off: i32,
}

/// A parsed `.gopclntab`, borrowing its bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pclntab<'d> {
    pub(crate) version: Version,
    pub(crate) quantum: u8,
    /// Number of functions; the function table has one more entry (the end
    /// of the last function), which [`Pclntab::parse`] checks is readable.
    pub(crate) num_funcs: usize,
    text_start: u64,
    functab: &'d [u8],
    funcdata: &'d [u8],
    funcnametab: &'d [u8],
    cutab: &'d [u8],
    filetab: &'d [u8],
    pctab: &'d [u8],
}

impl<'d> Pclntab<'d> {
    /// Checks the header and slices the tables out of `data`.
    pub(crate) fn parse(data: &'d [u8]) -> Result<Self, GoError> {
        let len = data.len();
        let too_short = || corrupt(format!(".gopclntab is too short ({len})"));
        if len < BASE_HEADER_SIZE {
            return Err(too_short());
        }
        let magic = u32_at(data, 0).ok_or_else(too_short)?;
        let pad = u16::from_le_bytes([data[4], data[5]]);
        let quantum = data[6];
        let ptr_size = data[7];
        let num_funcs_raw = u64_at(data, 8).ok_or_else(too_short)?;
        let version = match Version::from_magic(magic) {
            Some(v) if pad == 0 && ptr_size == 8 => v,
            _ => {
                return Err(corrupt(format!(
                    ".gopclntab header: {magic:x}, {pad:x}, {ptr_size:x}"
                )))
            }
        };
        let entry_size: usize = if version.relative_pcs() { 8 } else { 16 };
        // More functions than the bytes could describe is corrupt in any
        // layout (upstream would index past its slice).
        let num_funcs = usize::try_from(num_funcs_raw)
            .ok()
            .filter(|&n| n <= len / entry_size)
            .ok_or_else(|| {
                corrupt(format!(
                    ".gopclntab function count {num_funcs_raw} is invalid"
                ))
            })?;

        let mut text_start = 0;
        let (functab, funcdata, funcnametab, cutab, filetab, pctab);
        match version {
            Version::Go12 => {
                // The file table's offset follows the function table and its
                // final end-pc entry.
                let functab_end = num_funcs
                    .checked_mul(entry_size)
                    .and_then(|n| n.checked_add(BASE_HEADER_SIZE + 8))
                    .ok_or_else(too_short)?;
                let filetab_off = int32_or_minus_one(data, functab_end as i64);
                let num_files = int32_or_minus_one(data, filetab_off);
                let slice = usize::try_from(filetab_off)
                    .ok()
                    .filter(|&off| off >= BASE_HEADER_SIZE && off <= len);
                let (Some(off), false) = (slice, filetab_off == 0 || num_files == 0) else {
                    return Err(corrupt(format!(
                        ".gopclntab corrupt (filetab {filetab_off:#x}, nfiles {num_files})"
                    )));
                };
                functab = &data[BASE_HEADER_SIZE..off];
                cutab = &data[off..];
                funcdata = data;
                funcnametab = data;
                filetab = data;
                pctab = data;
            }
            Version::Go116 | Version::Go118 | Version::Go120 => {
                let (size, first_offset) = if version == Version::Go116 {
                    (HEADER_116_SIZE, 24)
                } else {
                    (HEADER_118_SIZE, 32)
                };
                if len < size {
                    return Err(too_short());
                }
                if version != Version::Go116 {
                    text_start = u64_at(data, 24).ok_or_else(too_short)?;
                }
                // funcname, cu, filetab, pctab and pcln offsets, in order.
                let mut offsets = [0usize; 5];
                let mut raw = [0u64; 5];
                for (i, slot) in offsets.iter_mut().enumerate() {
                    raw[i] = u64_at(data, first_offset + 8 * i).ok_or_else(too_short)?;
                    *slot = usize::try_from(raw[i]).unwrap_or(usize::MAX);
                }
                if offsets.iter().any(|&off| off > len) {
                    return Err(corrupt(format!(
                        ".gopclntab is corrupt ({:x}, {:x}, {:x}, {:x}, {:x})",
                        raw[0], raw[1], raw[2], raw[3], raw[4]
                    )));
                }
                funcnametab = &data[offsets[0]..];
                cutab = &data[offsets[1]..];
                filetab = &data[offsets[2]..];
                pctab = &data[offsets[3]..];
                functab = &data[offsets[4]..];
                funcdata = functab;
            }
        }
        let needed = (num_funcs + 1).checked_mul(entry_size);
        if needed.is_none_or(|n| n > functab.len()) {
            return Err(corrupt(format!(
                ".gopclntab function table too short for {num_funcs} functions"
            )));
        }
        Ok(Self {
            version,
            quantum,
            num_funcs,
            text_start,
            functab,
            funcdata,
            funcnametab,
            cutab,
            filetab,
            pctab,
        })
    }

    /// Function-table entry `index` (`0..=num_funcs`): its pc and the
    /// offset of its `_func` record.
    pub(crate) fn func_map_entry(&self, index: usize) -> Option<(u64, u64)> {
        if self.version.relative_pcs() {
            let at = index.checked_mul(8)?;
            let pc = u32_at(self.functab, at)?;
            let func_off = u32_at(self.functab, at.checked_add(4)?)?;
            Some((
                self.text_start.wrapping_add(u64::from(pc)),
                u64::from(func_off),
            ))
        } else {
            let at = index.checked_mul(16)?;
            Some((
                u64_at(self.functab, at)?,
                u64_at(self.functab, at.checked_add(8)?)?,
            ))
        }
    }

    /// The `_func` record at `func_off`, if it lies wholly inside the data.
    pub(crate) fn func(&self, func_off: u64) -> Option<Func> {
        let start = usize::try_from(func_off).ok()?;
        let (entry, fields) = if self.version.relative_pcs() {
            let pc = u32_at(self.funcdata, start)?;
            (self.text_start.wrapping_add(u64::from(pc)), start + 4)
        } else {
            (u64_at(self.funcdata, start)?, start + 8)
        };
        let rec = self
            .funcdata
            .get(fields..fields.checked_add(FUNC_FIELDS_SIZE)?)?;
        let field = |i: usize| i32_at(rec, 4 * i);
        Some(Func {
            entry,
            name_off: field(0)?,
            pcsp_off: field(3)?,
            pcfile_off: field(4)?,
            cu_off: field(7)?,
        })
    }

    /// The function-name table (for [`c_string`] / [`c_string_is`]).
    /// Bytes of the pc-value tables (what the walks read).
    pub(crate) fn pctab_len(&self) -> usize {
        self.pctab.len()
    }

    pub(crate) fn funcnametab(&self) -> &'d [u8] {
        self.funcnametab
    }

    /// The pc-value table at `offset`: the pc-value bytes from there to
    /// their end, or `None` if `offset` is negative or past the end.
    pub(crate) fn pcvalue_table(&self, offset: i32) -> Option<&'d [u8]> {
        self.pctab.get(usize::try_from(offset).ok()?..)
    }

    /// The source file name for a file index (the compilation-unit offset
    /// already added); empty when the index leads nowhere.
    pub(crate) fn file_name(&self, file_index: i64) -> &'d [u8] {
        let name_off = file_index
            .checked_mul(4)
            .map_or(-1, |at| int32_or_minus_one(self.cutab, at));
        c_string(self.filetab, name_off)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn magics() {
        assert_eq!(Version::from_magic(0xffff_fffb), Some(Version::Go12));
        assert_eq!(Version::from_magic(0xffff_fffa), Some(Version::Go116));
        assert_eq!(Version::from_magic(0xffff_fff0), Some(Version::Go118));
        assert_eq!(Version::from_magic(0xffff_fff1), Some(Version::Go120));
        assert_eq!(Version::from_magic(0xffff_fff2), None);
    }

    #[test]
    fn strings_are_tolerant() {
        let data = b"abc\0de";
        assert_eq!(c_string(data, 0), b"abc");
        assert_eq!(c_string(data, 3), b"");
        assert_eq!(c_string(data, 4), b"", "no NUL after");
        assert_eq!(c_string(data, 6), b"");
        assert_eq!(c_string(data, 7), b"");
        assert_eq!(c_string(data, -1), b"");
        assert!(c_string_is(data, 0, b"abc"));
        assert!(c_string_is(data, 1, b"bc"));
        assert!(!c_string_is(data, 0, b"ab"));
        assert!(!c_string_is(data, 4, b"de"));
        assert!(!c_string_is(data, -4, b"abc"));
        assert_eq!(int32_or_minus_one(&[1, 0, 0, 0, 2], 0), 1);
        assert_eq!(int32_or_minus_one(&[1, 0, 0, 0, 2], 2), -1);
        assert_eq!(int32_or_minus_one(&[1, 0, 0, 0, 2], -1), -1);
    }

    /// Header bytes: magic, pad, quantum, pointer size, function count.
    pub(crate) fn header(magic: u32, quantum: u8, num_funcs: u64) -> Vec<u8> {
        let mut h = magic.to_le_bytes().to_vec();
        h.extend_from_slice(&[0, 0, quantum, 8]);
        h.extend_from_slice(&num_funcs.to_le_bytes());
        h
    }

    #[test]
    fn bad_headers_are_errors() {
        assert!(Pclntab::parse(&[]).is_err());
        assert!(Pclntab::parse(&header(0xffff_fff1, 1, 0)[..15]).is_err());
        // Unknown magic, non-zero pad, 4-byte pointers.
        assert!(Pclntab::parse(&header(0x1234, 1, 0)).is_err());
        let mut h = header(0xffff_fff1, 1, 0);
        h[4] = 1;
        assert!(Pclntab::parse(&h).is_err());
        let mut h = header(0xffff_fff1, 1, 0);
        h[7] = 4;
        assert!(Pclntab::parse(&h).is_err());
        // A 1.20 magic with the short header only.
        assert!(Pclntab::parse(&header(0xffff_fff1, 1, 0)).is_err());
    }

    #[test]
    fn offsets_past_the_end_are_errors() {
        let mut h = header(0xffff_fff1, 1, 0);
        h.resize(HEADER_118_SIZE, 0);
        h[32..40].copy_from_slice(&1000u64.to_le_bytes());
        assert!(Pclntab::parse(&h).is_err());
        // A huge function count.
        let mut h = header(0xffff_fff1, 1, u64::MAX);
        h.resize(HEADER_118_SIZE + 64, 0);
        assert!(Pclntab::parse(&h).is_err());
        // Go 1.2 with the file-table offset pointing nowhere.
        let mut h = header(0xffff_fffb, 1, 0);
        h.extend_from_slice(&0u64.to_le_bytes());
        h.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
        assert!(Pclntab::parse(&h).is_err());
    }

    #[test]
    fn a_minimal_120_table_parses() {
        // No functions: only the end entry (pc 0x10, func 0).
        let mut h = header(0xffff_fff1, 1, 0);
        h.resize(HEADER_118_SIZE, 0);
        h[24..32].copy_from_slice(&0x40_0000u64.to_le_bytes());
        for i in 0..5 {
            let at = 32 + 8 * i;
            h[at..at + 8].copy_from_slice(&(HEADER_118_SIZE as u64).to_le_bytes());
        }
        h.extend_from_slice(&0x10u32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        let t = Pclntab::parse(&h).unwrap();
        assert_eq!(t.num_funcs, 0);
        assert_eq!(t.func_map_entry(0), Some((0x40_0010, 0)));
        assert_eq!(t.func_map_entry(1), None);
        assert_eq!(t.func(0), None, "a record needs 36 bytes");
    }
}
