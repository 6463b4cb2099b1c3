//! The host's ELF files, and the stable toolchain's (the largest real
//! inputs a machine has: `librustc_driver`, LLVM).

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Every regular 64-bit ELF file under `roots`, once per inode, largest
/// first (so that workers sharing them out finish together).
pub fn elf_files(roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    let mut files = Vec::new();
    let mut dirs = roots.to_vec();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue; // symlink_metadata: links are not followed
            };
            if meta.is_dir() {
                dirs.push(entry.path());
                continue;
            }
            if !meta.is_file() || !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            let mut head = [0u8; 5];
            let is_elf64 = File::open(entry.path())
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
                .is_ok()
                && head[..4] == *crate::elf::MAGIC
                && head[4] == crate::elf::CLASS64;
            if is_elf64 {
                files.push((meta.len(), entry.path()));
            }
        }
    }
    files.sort_by(|a, b| b.cmp(a));
    files.into_iter().map(|(_, p)| p).collect()
}

/// The stable toolchain's directory (`rustc +stable --print sysroot`), if
/// rustup has one.
pub fn stable_sysroot() -> Option<PathBuf> {
    let out = std::process::Command::new("rustc")
        .args(["+stable", "--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    sysroot.is_dir().then_some(sysroot)
}

/// The stable toolchain's `lib` directory, if rustup has one.
pub fn stable_toolchain_lib() -> Option<PathBuf> {
    let lib = stable_sysroot()?.join("lib");
    lib.is_dir().then_some(lib)
}

/// The file in `dir` whose name starts with `prefix` (and is not a linker
/// script: the largest such file).
pub fn file_named(dir: &Path, prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(prefix) && n.contains(".so"))
        })
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max()
        .map(|(_, p)| p)
}
