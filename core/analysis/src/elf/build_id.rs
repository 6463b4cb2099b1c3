//! A file's GNU build id (the `NT_GNU_BUILD_ID` note the linker writes,
//! `.note.gnu.build-id`): what pprof's mappings and debuggers name a
//! binary by. Read from the file's `PT_NOTE` segments through a reader the
//! caller supplies (the edge's `pread`), so only the ELF header, the
//! program headers and the note segments are read, never the whole file.

use object::elf::{FileHeader64, NT_GNU_BUILD_ID, PT_NOTE};
use object::read::elf::NoteIterator;
use object::LittleEndian;

use super::segments::{read_segments, MAX_SEGMENTS};

const GNU_OWNER: &[u8] = b"GNU";
/// Note segments larger than this are not read: the build id's is a few
/// dozen bytes, and a hostile header must not make a lookup a big read.
const MAX_NOTE_SEGMENT: u64 = 64 * 1024;
/// Longest build id kept (linkers write 16 or 20 bytes; `--build-id=0x..`
/// allows more, but not without bound).
const MAX_BUILD_ID: usize = 64;

/// The GNU build id of the file `read` reads (see
/// [`read_segments`] for `read`'s contract): the first `NT_GNU_BUILD_ID`
/// note of owner `GNU` in the file's note segments. `None` when the file
/// has none (or is no 64-bit little-endian ELF file). Errors are `read`'s.
pub fn gnu_build_id<E>(
    mut read: impl FnMut(u64, &mut [u8]) -> Result<usize, E>,
) -> Result<Option<Vec<u8>>, E> {
    let segments = read_segments(&mut read, MAX_SEGMENTS)?;
    for segment in segments
        .iter()
        .filter(|s| s.kind == PT_NOTE && s.filesz <= MAX_NOTE_SEGMENT)
    {
        // usize: bounded by MAX_NOTE_SEGMENT above.
        let mut data = vec![0u8; segment.filesz as usize];
        let got = read(segment.offset, &mut data)?.min(data.len());
        data.truncate(got);
        if let Some(id) = in_notes(&data, segment.align) {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// The build id among the notes of one segment aligned to `align`.
fn in_notes(data: &[u8], align: u64) -> Option<Vec<u8>> {
    // Notes are 4- or 8-aligned; a segment claiming another alignment is
    // read as the linker's usual 4.
    let align = if align == 8 { 8 } else { 4 };
    let mut notes =
        NoteIterator::<FileHeader64<LittleEndian>>::new(LittleEndian, align, data).ok()?;
    // Each note takes at least its header: bounded by the segment.
    while let Ok(Some(note)) = notes.next() {
        if note.name() == GNU_OWNER
            && note.n_type(LittleEndian) == NT_GNU_BUILD_ID
            && !note.desc().is_empty()
            && note.desc().len() <= MAX_BUILD_ID
        {
            return Some(note.desc().to_vec());
        }
    }
    None
}

/// `id` as lowercase hex, the way `file`, `readelf -n` and pprof print it.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_test_support::elf::{with_segments, ProgramHeader};

    fn note(owner: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let pad = |v: &mut Vec<u8>| v.resize(v.len().next_multiple_of(4), 0);
        let mut n = Vec::new();
        n.extend_from_slice(&(owner.len() as u32 + 1).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(owner);
        n.push(0);
        pad(&mut n);
        n.extend_from_slice(desc);
        pad(&mut n);
        n
    }

    /// A file of one note segment holding `notes`, 4-aligned.
    fn file(notes: &[u8]) -> Vec<u8> {
        let offset = 64 + 56;
        let mut data = with_segments(&[ProgramHeader {
            kind: PT_NOTE,
            offset,
            vaddr: offset,
            filesz: notes.len() as u64,
            memsz: notes.len() as u64,
        }]);
        // p_align of the one program header.
        data[64 + 48..64 + 56].copy_from_slice(&4u64.to_le_bytes());
        data.extend_from_slice(notes);
        data
    }

    fn of(data: &[u8]) -> Option<Vec<u8>> {
        let read = |at: u64, buf: &mut [u8]| -> Result<usize, ()> {
            let at = (at as usize).min(data.len());
            let n = buf.len().min(data.len() - at);
            buf[..n].copy_from_slice(&data[at..at + n]);
            Ok(n)
        };
        gnu_build_id(read).expect("slices do not fail")
    }

    #[test]
    fn the_gnu_note_is_found_after_other_notes() {
        let id = [
            0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ];
        let mut notes = note(b"GNU", 5, &[0; 16]); // a property note first
        notes.extend(note(b"Go", NT_GNU_BUILD_ID, b"not gnu's"));
        notes.extend(note(b"GNU", NT_GNU_BUILD_ID, &id));
        assert_eq!(of(&file(&notes)), Some(id.to_vec()));
        assert_eq!(hex(&id), "deadbeef0102030405060708090a0b0c");
    }

    #[test]
    fn no_note_no_file_and_a_cut_note_give_none() {
        assert_eq!(of(&file(&note(b"GNU", 5, &[0; 8]))), None);
        assert_eq!(of(b"not an elf file at all"), None);
        let whole = file(&note(b"GNU", NT_GNU_BUILD_ID, &[7; 20]));
        assert_eq!(of(&whole[..whole.len() - 4]), None);
    }
}
