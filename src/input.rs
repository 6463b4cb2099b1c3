//! Reading unwind data from the files a user names on the command line.
//!
//! Every subcommand that takes unwind data goes through [`read_input`], so
//! each kind of input (ELF executables, deltas files) is recognised here
//! once and every subcommand accepts it.

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context as _};

use eim::deltas::IntervalData;
use eim::provider::Provider;
use eim::text::parse_deltas;
use eim::{ElfFileRef, ElfProvider};

/// The first bytes of an xz stream.
const XZ_MAGIC: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0];
const ELF_MAGIC: &[u8] = b"\x7fELF";

/// One input's unwind data.
#[derive(Clone, Debug)]
pub struct Input {
    /// The path the data describes: the `# file:` line of a deltas file
    /// (the executable upstream extracted from), else the input's own path.
    pub path: String,
    pub data: IntervalData,
}

/// Whether the file starts with the ELF magic.
fn is_elf(path: &Path) -> std::io::Result<bool> {
    let mut magic = Vec::with_capacity(ELF_MAGIC.len());
    std::fs::File::open(path)?
        .take(ELF_MAGIC.len() as u64)
        .read_to_end(&mut magic)?;
    Ok(magic == ELF_MAGIC)
}

/// Extracts the stack deltas of an ELF file; the error is the provider's
/// message (the caller names the file).
pub fn read_elf(path: &Path, provider: &ElfProvider) -> anyhow::Result<Input> {
    let file = ElfFileRef::new(path).with_max_size(provider.max_size());
    let extraction = provider
        .extract(&file)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    Ok(Input {
        path: path.display().to_string(),
        data: extraction.data,
    })
}

/// Reads an ELF executable (its deltas are extracted) or a file in the
/// oracle's deltas format, plain or xz-compressed. The kind is recognised
/// by content, not by name, so a renamed file still reads.
pub fn read_input(path: &Path) -> anyhow::Result<Input> {
    if is_elf(path)? {
        return read_elf(path, &ElfProvider::new());
    }
    let raw = std::fs::read(path)?;
    let bytes = if raw.starts_with(XZ_MAGIC) {
        let mut out = Vec::new();
        lzma_rs::xz_decompress(&mut raw.as_slice(), &mut out)
            .map_err(|e| anyhow::anyhow!("not a valid xz stream: {e}"))?;
        out
    } else {
        raw
    };
    if bytes.starts_with(ELF_MAGIC) {
        bail!("an xz-compressed ELF file: decompress it first");
    }
    let text = std::str::from_utf8(&bytes).context("not a deltas file (not UTF-8 text)")?;
    if !text.starts_with("# file: ") {
        bail!("not a deltas file (it does not start with a '# file:' line)");
    }
    let parsed = parse_deltas(text)?;
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
        let plain = read_input(&temp("plain.deltas", text.as_bytes())).expect("plain");
        assert_eq!(plain.path, "/bin/x");
        assert_eq!(plain.data.len(), 1);
        let mut xz = Vec::new();
        lzma_rs::xz_compress(&mut text.as_bytes(), &mut xz).expect("compress");
        let packed = read_input(&temp("renamed.txt", &xz)).expect("xz");
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
            let err = read_input(&temp(name, bytes)).expect_err(name);
            assert!(format!("{err:#}").contains(reason), "{name}: {err:#}");
        }
        assert!(read_input(Path::new("/nonexistent/eim/input")).is_err());
        let mut packed_elf = Vec::new();
        lzma_rs::xz_compress(&mut &b"\x7fELF\x02\x01\x01"[..], &mut packed_elf).expect("compress");
        let err = read_input(&temp("elf.xz", &packed_elf)).expect_err("xz ELF");
        assert!(format!("{err:#}").contains("xz-compressed ELF"), "{err:#}");
    }
}
