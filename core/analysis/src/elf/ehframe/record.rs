//! CIE and FDE records: the common header, CIE parsing, the FDE's
//! CIE-dependent header fields.

use super::reader::{pe, Reader};
use super::vm::{Cie, Regs, Vm};
use super::EntryError;
use crate::elf::Arch;

/// Why a record was not parsed as the kind asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum HeaderError {
    /// A zero length: a 4-byte terminator or padding record.
    Empty,
    /// A CIE where an FDE was expected or the other way round; `len` is the
    /// record's size, so a walk can skip it.
    UnexpectedType {
        len: u64,
        id: u64,
    },
    Fatal(EntryError),
}

impl From<EntryError> for HeaderError {
    fn from(e: EntryError) -> Self {
        Self::Fatal(e)
    }
}

/// Reads a record header at `r.pos` and limits `r` to the record. Returns
/// the record's size and, for an FDE, the section offset of its CIE.
#[inline]
pub(super) fn parse_header(
    r: &mut Reader<'_>,
    expect_cie: bool,
) -> Result<(u64, u64), HeaderError> {
    let start = r.pos;
    let len32 = r.u32();
    let (len, id_pos, id, marker) = match len32 {
        0 => return Err(HeaderError::Empty),
        1..0xffff_fff0 => {
            let id_pos = r.pos;
            (
                u64::from(len32) + 4,
                id_pos,
                u64::from(r.u32()),
                0xffff_ffff,
            )
        }
        0xffff_ffff => {
            let len = r.u64().wrapping_add(12);
            let id_pos = r.pos;
            (len, id_pos, r.u64(), u64::MAX)
        }
        other => return Err(EntryError::InitialLength(other).into()),
    };
    // Upstream lets a 64-bit length wrap around; eim rejects it, so that
    // every record lies inside the section and walks always move forward.
    if !start.checked_add(len).is_some_and(|end| r.set_end(end)) {
        return Err(EntryError::BeyondEnd(r.pos).into());
    }
    // In .eh_frame a CIE has id 0 and an FDE points back relative to the
    // id field; in .debug_frame the id is all ones and the pointer is a
    // section offset.
    let marker = if r.debug_frame { marker } else { 0 };
    let is_cie = id == marker;
    if is_cie != expect_cie {
        return Err(HeaderError::UnexpectedType { len, id });
    }
    let mut cie_pos = id;
    if !is_cie {
        if !r.debug_frame {
            cie_pos = id_pos.wrapping_sub(id);
        }
        if cie_pos >= r.data.len() as u64 {
            return Err(EntryError::CieBeyondEnd(cie_pos).into());
        }
    }
    Ok((len, cie_pos))
}

/// Parses the CIE at `r.pos` (a copy of the FDE's reader, so its initial
/// end is the FDE's) and runs its initial instructions.
pub(super) fn parse_cie(mut r: Reader<'_>, arch: Arch) -> Result<Cie, EntryError> {
    let at = r.pos;
    let wrap = |error: EntryError| EntryError::Cie {
        at,
        error: Box::new(error),
    };
    let size = match parse_header(&mut r, true) {
        Ok((size, _)) => size,
        Err(HeaderError::Fatal(e)) => return Err(wrap(e)),
        Err(HeaderError::Empty) => return Err(wrap(EntryError::Empty)),
        Err(HeaderError::UnexpectedType { id, .. }) => {
            return Err(wrap(EntryError::UnexpectedType(id)))
        }
    };
    let version = r.u8();
    if !matches!(version, 1 | 3 | 4) {
        return Err(wrap(EntryError::CieVersion(version)));
    }
    let augmentation = r
        .cstr()
        .ok_or_else(|| wrap(EntryError::UnterminatedAugmentation))?;
    if version == 4 {
        r.u8(); // address_size
        r.u8(); // segment_selector_size
    }
    let code_align = r.uleb();
    let data_align = r.sleb();
    let ra_reg = if version == 1 {
        u64::from(r.u8())
    } else {
        r.uleb()
    };
    let mut cie = Cie {
        size,
        code_align,
        data_align,
        ra_reg,
        enc: pe::ABSPTR,
        lsda_enc: pe::ABSPTR,
        has_augmentation: false,
        signal: false,
        initial: Regs::initial(arch),
    };
    if let Some((&first, rest)) = augmentation.split_first() {
        let text = || String::from_utf8_lossy(augmentation).into_owned();
        if first != b'z' {
            return Err(wrap(EntryError::OldAugmentation(text())));
        }
        r.uleb(); // augmentation data length
        cie.has_augmentation = true;
        for &ch in rest {
            match ch {
                b'L' => cie.lsda_enc = r.u8(),
                b'R' => cie.enc = r.u8(),
                b'P' => {
                    let enc = r.u8() & !pe::INDIRECT;
                    r.ptr(enc).map_err(wrap)?;
                }
                b'S' => cie.signal = true,
                _ => return Err(wrap(EntryError::Augmentation(text()))),
            }
        }
    }
    if !r.is_valid() {
        return Err(wrap(EntryError::CieTruncated));
    }
    // One step only: instructions after a location advance are ignored.
    let initial = {
        let mut vm = Vm::new(arch, &cie, 0, cie.initial);
        vm.step(&mut r)?;
        vm.cur
    };
    if !r.is_valid() {
        return Err(EntryError::CieInstructions(at));
    }
    cie.initial = initial;
    Ok(cie)
}

/// An FDE's code range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdeRange {
    pub start: u64,
    pub len: u64,
}

/// Reads the FDE fields after the header: the code range and the
/// augmentation data. `table_ip`, when not 0, is the start the search
/// table gave, which the FDE must repeat.
#[inline]
pub(super) fn parse_fde_range(
    r: &mut Reader<'_>,
    cie: &Cie,
    table_ip: u64,
    fde_at: u64,
) -> Result<FdeRange, EntryError> {
    let start = r.ptr(cie.enc)?;
    if table_ip != 0 && start != table_ip {
        return Err(EntryError::TableMismatch {
            fde: start,
            table: table_ip,
        });
    }
    let len = if cie.enc & pe::INDIRECT != 0 {
        r.ptr(cie.enc)?
    } else {
        r.ptr(cie.enc & pe::FORMAT_MASK)?
    };
    if cie.has_augmentation {
        let skip = r.uleb();
        r.skip(skip);
    }
    if !r.is_valid() {
        return Err(EntryError::FdeTruncated(fde_at));
    }
    Ok(FdeRange { start, len })
}

#[cfg(test)]
mod tests {
    use super::super::vm::{Rule, REG_SAME, REG_UNDEFINED};
    use super::*;

    /// The CIE of DWARF 5, appendix D.5 (Table D.5, "call frame
    /// information example"): a 32-bit `.debug_frame` CIE, version 4, for a
    /// machine with 4-byte instructions and R8 as the return address.
    fn dwarf5_table_d5_cie() -> Vec<u8> {
        let mut cie = vec![];
        cie.extend_from_slice(&36u32.to_le_bytes()); // length
        cie.extend_from_slice(&0xffff_ffffu32.to_le_bytes()); // CIE_id
        cie.push(4); // version
        cie.push(0); // augmentation ""
        cie.push(4); // address_size
        cie.push(0); // segment_selector_size
        cie.push(4); // code_alignment_factor
        cie.push(0x7c); // data_alignment_factor -4 (SLEB128)
        cie.push(8); // return_address_register R8
        cie.extend_from_slice(&[0x0c, 7, 0]); // def_cfa (7, 0)
        cie.extend_from_slice(&[0x08, 0]); // same_value (0)
        cie.extend_from_slice(&[0x07, 1]); // undefined (1)
        cie.extend_from_slice(&[0x07, 2]); // undefined (2)
        cie.extend_from_slice(&[0x07, 3]); // undefined (3)
        cie.extend_from_slice(&[0x08, 4]); // same_value (4)
        cie.extend_from_slice(&[0x08, 5]); // same_value (5)
        cie.extend_from_slice(&[0x08, 6]); // same_value (6)
        cie.extend_from_slice(&[0x08, 7]); // same_value (7)
        cie.extend_from_slice(&[0x09, 8, 1]); // register (8, 1)
        cie.extend_from_slice(&[0, 0, 0]); // nop padding
        assert_eq!(cie.len(), 40);
        cie
    }

    #[test]
    fn parses_the_dwarf5_appendix_d5_cie() {
        let data = dwarf5_table_d5_cie();
        let cie = parse_cie(Reader::new(&data, 0, 0, true), Arch::X86_64).unwrap();
        assert_eq!(cie.data_align, -4);
        assert_eq!(cie.code_align, 4);
        assert_eq!(cie.ra_reg, 8);
        assert_eq!(cie.enc, 0);
        assert_eq!(cie.lsda_enc, 0);
        assert!(!cie.has_augmentation);
        assert!(!cie.signal);
        // x86-64 tracks rbp (6) and rip (16): only "same_value (6)" applies.
        assert_eq!(cie.initial.cfa, Rule::new(7, 0));
        assert_eq!(cie.initial.fp, Rule::new(REG_SAME, 0));
        assert_eq!(cie.initial.ra, Rule::new(REG_UNDEFINED, 0));
    }

    #[test]
    fn a_cie_is_not_an_fde_in_eh_frame() {
        let mut data = dwarf5_table_d5_cie();
        // as .eh_frame the all-ones id is an FDE pointer: out of range
        let mut r = Reader::new(&data, 0, 0, false);
        assert!(matches!(
            parse_header(&mut r, true),
            Err(HeaderError::UnexpectedType { len: 40, .. })
        ));
        data[4..8].copy_from_slice(&0u32.to_le_bytes());
        let mut r = Reader::new(&data, 0, 0, false);
        assert_eq!(parse_header(&mut r, true), Ok((40, 0)));
    }

    #[test]
    fn headers_must_fit_the_section() {
        let mut data = dwarf5_table_d5_cie();
        data[0..4].copy_from_slice(&37u32.to_le_bytes());
        let mut r = Reader::new(&data, 0, 0, true);
        assert!(matches!(
            parse_header(&mut r, true),
            Err(HeaderError::Fatal(EntryError::BeyondEnd(_)))
        ));
        data[0..4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        let mut r = Reader::new(&data, 0, 0, true);
        assert_eq!(
            parse_header(&mut r, true),
            Err(HeaderError::Fatal(EntryError::InitialLength(0xffff_fff0)))
        );
        let mut r = Reader::new(&[0, 0, 0, 0], 0, 0, true);
        assert_eq!(parse_header(&mut r, true), Err(HeaderError::Empty));
    }
}
