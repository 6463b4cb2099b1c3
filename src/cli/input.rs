//! Reading unwind data from the files a user names on the command line.
//!
//! Every subcommand that takes unwind data goes through [`read_input`], so
//! each kind of input (ELF executables, deltas files) is recognised here
//! once and every subcommand accepts it.

use std::os::unix::fs::FileExt as _;
use std::path::Path;

use eim::deltas::IntervalData;
use eim::files::regular::open_regular;
use eim::provider::Provider;
use eim::text_input::{read_deltas, ELF_MAGIC};
use eim::{ElfFileRef, ElfProvider};

/// One input's unwind data.
#[derive(Clone, Debug)]
pub struct Input {
    /// The path the data describes: the `# file:` line of a deltas file
    /// (the executable upstream extracted from), else the input's own path.
    pub path: String,
    pub data: IntervalData,
}

/// Whether the file starts with the ELF magic (read at offset 0, so the
/// file's position stays where it is).
fn is_elf(file: &std::fs::File) -> std::io::Result<bool> {
    let mut magic = [0u8; ELF_MAGIC.len()];
    match file.read_exact_at(&mut magic, 0) {
        Ok(()) => Ok(magic == ELF_MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Extracts the stack deltas of an ELF file; the error is the provider's
/// message (the caller names the file).
pub fn read_elf(path: &Path, provider: &ElfProvider) -> anyhow::Result<Input> {
    extract(ElfFileRef::new(path), provider)
}

fn extract(file: ElfFileRef, provider: &ElfProvider) -> anyhow::Result<Input> {
    let file = file.with_max_size(provider.max_size());
    let extraction = provider
        .extract(&file)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    Ok(Input {
        path: file.path().display().to_string(),
        data: extraction.data,
    })
}

/// Reads an ELF executable (its deltas are extracted) or a file in the
/// oracle's deltas format, plain or xz-compressed. The kind is recognised
/// by content, not by name, so a renamed file still reads. Only regular
/// files are read, of at most `max_size` bytes (a deltas file's bytes are
/// counted after decompression too), and nothing is held but the deltas.
pub fn read_input(path: &Path, max_size: u64) -> anyhow::Result<Input> {
    let (file, meta) = open_regular(path)?;
    if meta.len() > max_size {
        anyhow::bail!(
            "{} bytes, larger than the limit of {max_size} bytes",
            meta.len()
        );
    }
    if is_elf(&file)? {
        let provider = ElfProvider::new().with_max_size(max_size);
        return extract(ElfFileRef::new(path).with_file(file), &provider);
    }
    let parsed = read_deltas(&file, max_size)?;
    let path = if parsed.path.is_empty() {
        path.display().to_string()
    } else {
        parsed.path
    };
    Ok(Input {
        path,
        data: parsed.data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim::files::elf_file::DEFAULT_MAX_SIZE;
    use eim::text_input::XZ_MAGIC;

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("eim-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write temp file");
        path
    }

    #[test]
    fn reads_plain_and_xz_text() {
        let text = "# file: /bin/x\n# deltas: 1\n850 1 2 16 0 0 0\n";
        let plain =
            read_input(&temp("plain.deltas", text.as_bytes()), DEFAULT_MAX_SIZE).expect("plain");
        assert_eq!(plain.path, "/bin/x");
        assert_eq!(plain.data.len(), 1);
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut text.as_bytes(), &mut xz).expect("compress");
        let packed = read_input(&temp("renamed.txt", &xz), DEFAULT_MAX_SIZE).expect("xz");
        assert_eq!(packed.data, plain.data);
    }

    #[test]
    fn refuses_what_is_not_a_deltas_file() {
        for (name, bytes, reason) in [
            (
                "elf",
                &b"\x7fELF\x02\x01"[..],
                "shorter than the 64-byte ELF header",
            ),
            ("elf32", &b"\x7fELF\x01\x01"[..], "32-bit ELF file"),
            ("bin", &[0xff, 0xfe, 0x00][..], "UTF-8"),
            ("readme", &b"hello\n"[..], "# file:"),
            ("bad", &b"# file: /x\nzz 1 2 3 4 5 6\n"[..], "line 2"),
            ("xz", XZ_MAGIC, "xz"),
        ] {
            let err = read_input(&temp(name, bytes), DEFAULT_MAX_SIZE).expect_err(name);
            assert!(format!("{err:#}").contains(reason), "{name}: {err:#}");
        }
        assert!(read_input(Path::new("/nonexistent/eim/input"), DEFAULT_MAX_SIZE).is_err());
        let mut packed_elf = Vec::new();
        lzma_rs::xz_compress(&mut &b"\x7fELF\x02\x01\x01"[..], &mut packed_elf).expect("compress");
        let err = read_input(&temp("elf.xz", &packed_elf), DEFAULT_MAX_SIZE).expect_err("xz ELF");
        assert!(format!("{err:#}").contains("xz-compressed ELF"), "{err:#}");
    }

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let e = read_input(Path::new("/dev/zero"), DEFAULT_MAX_SIZE).expect_err("a device");
        assert_eq!(format!("{e:#}"), "not a regular file: a character device");
        let text = "# file: /bin/x\n# deltas: 0\n";
        let path = temp("small.deltas", text.as_bytes());
        let e = read_input(&path, 10).expect_err("over the limit");
        assert_eq!(
            format!("{e:#}"),
            "27 bytes, larger than the limit of 10 bytes"
        );
        assert!(read_input(&path, text.len() as u64).is_ok());
    }
}
