//! The debug-file trust rule: which separate debug file may give its
//! tables to a file.
//!
//! A debug file's `.debug_frame` becomes the unwind tables of the file that
//! links to it, and the search for it runs as root in directories the
//! file's owner (or anyone) may control. A debug file is used only if its
//! owner could have written the file it serves, and no one else could have
//! written the debug file:
//!
//! * it is owned by root, or by the owner of the file it serves (that user
//!   could have put the tables in the file itself: they gain nothing);
//! * it is writable by neither its group nor others (else anyone in them
//!   could have written it);
//! * if root owns it, everyone may read it: a root-only file (a hard link
//!   to `/etc/shadow` where `protected_hardlinks` is off) is never read on
//!   another user's behalf, not even to compute its CRC.
//!
//! The check runs on the candidate's `O_PATH` descriptor, before it is
//! opened ([`crate::files::opener`]).

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

/// Why the debug file `debug` may not serve a file owned by `served_owner`,
/// or `None` if it may.
pub fn debug_file_refusal(debug: &Metadata, served_owner: u32) -> Option<String> {
    refusal(debug.uid(), debug.mode(), served_owner)
}

fn refusal(owner: u32, mode: u32, served_owner: u32) -> Option<String> {
    if owner != 0 && owner != served_owner {
        return Some(format!(
            "owned by uid {owner}, the file it serves by uid {served_owner}: only root's or the \
             same owner's debug files are used"
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "writable by its group or others (mode {:o}): not used",
            mode & 0o7777
        ));
    }
    if owner == 0 && mode & 0o004 == 0 {
        return Some(format!(
            "root's and not readable by everyone (mode {:o}): not read on a process's behalf",
            mode & 0o7777
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn root_or_the_same_owner_writable_by_no_one_else() {
        // (debug owner, mode, served owner, used)
        let cases = [
            (0, 0o644, 1000, true),
            (0, 0o444, 0, true),
            (1000, 0o644, 1000, true),
            (1000, 0o600, 1000, true),
            (1000, 0o644, 0, false),
            (1000, 0o644, 1001, false),
            (65534, 0o644, 1000, false),
            (0, 0o664, 1000, false),
            (0, 0o646, 1000, false),
            (1000, 0o666, 1000, false),
            (1000, 0o620, 1000, false),
            (0, 0o600, 1000, false),
            (0, 0o640, 0, false),
        ];
        for (owner, mode, served, used) in cases {
            let why = refusal(owner, 0o100_000 | mode, served);
            assert_eq!(why.is_none(), used, "{owner} {mode:o} {served}: {why:?}");
        }
        let why = refusal(65534, 0o100_644, 1000).expect("refused");
        assert!(
            why.contains("owned by uid 65534, the file it serves by uid 1000"),
            "{why}"
        );
    }
}
