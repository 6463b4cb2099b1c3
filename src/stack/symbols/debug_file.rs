//! A file's separate debug file, for its local symbols and DWARF: found by
//! its `.gnu_debuglink` (core's one parser), or else by its build id under
//! `/usr/lib/debug/.build-id/`, with the search extraction uses
//! ([`ElfFileRef::find_debug_file_by`]): inside the process's root,
//! through root's links only, trusted only if root's or the served file's
//! owner's and writable by no one else, read (never mapped) up to a limit.

use std::path::Path;

use eim_analysis::elf::Elf;
use object::Object as _;

use crate::files::elf_file::ElfFileRef;

/// The debug file of the file at `path` inside `root` (owned by `owner`,
/// its bytes `data`), read whole; `None` if there is none to use (the
/// reason is logged: no debug package is normal).
pub fn find(root: &Path, path: &Path, owner: u32, data: &[u8], max_bytes: u64) -> Option<Vec<u8>> {
    let elf = Elf::parse(data).ok()?;
    let link = elf.debug_link();
    let build_id = elf.file.build_id().ok().flatten();
    if link.is_none() && build_id.is_none() {
        return None;
    }
    let reference = ElfFileRef::new(path)
        .with_root(root)
        .with_max_size(max_bytes);
    let found = match reference.find_debug_file_by(owner, link.as_ref(), build_id) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!("{e}");
            return None;
        }
    };
    let bytes = found.bytes_at(0, found.len())?.to_vec();
    if let Err(why) = found.check_unchanged() {
        tracing::debug!(debug = %found.path.display(), "changed while read: {}", why.message);
        return None;
    }
    // Found by build id alone: it must be that build's.
    if link.is_none() {
        let theirs = Elf::parse(&bytes).ok()?.file.build_id().ok().flatten();
        if theirs != build_id {
            tracing::debug!(debug = %found.path.display(), "another build id: not used");
            return None;
        }
    }
    Some(bytes)
}
