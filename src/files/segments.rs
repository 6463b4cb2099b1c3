//! The load segments of an opened file, read with `pread` (never a
//! mapping: see `docs/THREAT_MODEL.md`). What the headers mean, and the
//! load bias they give a mapping, is the analysis's
//! ([`eim_analysis::elf::segments`]): this module only reads.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub use eim_analysis::elf::segments::{bias, Segment};

/// The `PT_LOAD` segments of `file`; empty if it is not a 64-bit
/// little-endian ELF file. Errors are the reads'.
pub fn load_segments(file: &File) -> io::Result<Vec<Segment>> {
    eim_analysis::elf::segments::read_load_segments(|at, buf| read_full(file, buf, at))
}

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_segments_of_a_real_file_give_its_own_addresses() {
        let exe = std::env::current_exe().expect("this test's executable");
        let file = File::open(&exe).expect("opened");
        let segments = load_segments(&file).expect("read");
        assert!(!segments.is_empty(), "{} has PT_LOADs", exe.display());
        // /proc/self/maps: this executable's text mapping, and the address
        // of a function in it.
        let here = the_segments_of_a_real_file_give_its_own_addresses as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let line = maps
            .lines()
            .find(|l| {
                let range = l.split_whitespace().next().unwrap_or("");
                let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
                let a = u64::from_str_radix(a, 16).unwrap_or(0);
                let b = u64::from_str_radix(b, 16).unwrap_or(0);
                a <= here && here < b
            })
            .expect("the mapping of this function");
        let fields: Vec<&str> = line.split_whitespace().collect();
        let start = u64::from_str_radix(fields[0].split('-').next().unwrap(), 16).unwrap();
        let offset = u64::from_str_radix(fields[2], 16).unwrap();
        let b = bias(&segments, start, offset).expect("a segment holds it");
        // The function's ELF address lies in an executable segment.
        let address = here - b;
        assert!(
            segments
                .iter()
                .any(|s| s.vaddr <= address && address < s.vaddr + s.filesz),
            "{address:#x} in {segments:x?}"
        );
    }

    #[test]
    fn files_that_are_not_64_bit_elf_have_no_segments() {
        let dir = std::env::temp_dir().join(format!("eim-segments-{}", std::process::id()));
        let elf32 = eim_test_support::elf::Header {
            class: eim_test_support::elf::CLASS32,
            ..Default::default()
        };
        std::fs::write(&dir, elf32.bytes()).expect("written");
        let file = File::open(&dir).expect("opened");
        assert_eq!(load_segments(&file).expect("read"), Vec::new());
        let _ = std::fs::remove_file(&dir);
    }
}
