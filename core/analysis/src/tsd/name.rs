//! Upstream's file-name checks for C libraries. SEED's pattern is
//! `.*/(ld-musl|libc|libpthread)([-.].*)?\.so`, HEAD's adds `ld-linux`;
//! both are unanchored Go regular expressions, whose `.` matches any
//! character but a newline. They are matched here by hand, on bytes (a
//! path need not be UTF-8; Go's `.` takes an invalid byte as one
//! character, so byte matching agrees).

const SEED_PREFIXES: &[&[u8]] = &[b"ld-musl", b"libc", b"libpthread"];
const HEAD_PREFIXES: &[&[u8]] = &[b"ld-musl", b"ld-linux", b"libc", b"libpthread"];

/// SEED's `IsPotentialTSDDSO`: whether TSD analysis applies to `path`.
pub fn is_potential_tsd_dso(path: &[u8]) -> bool {
    matches_libc_pattern(path, SEED_PREFIXES)
}

/// HEAD's `IsPotentialLibcDSO` (also `ld-linux`): whether the DTV
/// analysis applies to `path`.
pub fn is_potential_libc_dso(path: &[u8]) -> bool {
    matches_libc_pattern(path, HEAD_PREFIXES)
}

/// Some `/` is followed by a prefix and then either `.so` directly, or
/// by `-` or `.` and, later on the same line, `.so`.
fn matches_libc_pattern(path: &[u8], prefixes: &[&[u8]]) -> bool {
    // Where a `.so` starts, and where the first newline after each
    // position is, answer every candidate in linear time overall.
    let mut next_so = vec![usize::MAX; path.len() + 1];
    let mut next_newline = vec![usize::MAX; path.len() + 1];
    for i in (0..path.len()).rev() {
        next_so[i] = if path[i..].starts_with(b".so") {
            i
        } else {
            next_so[i + 1]
        };
        next_newline[i] = if path[i] == b'\n' {
            i
        } else {
            next_newline[i + 1]
        };
    }
    path.iter().enumerate().any(|(slash, &b)| {
        b == b'/'
            && prefixes.iter().any(|prefix| {
                let rest = &path[slash + 1..];
                if !rest.starts_with(prefix) {
                    return false;
                }
                let after = slash + 1 + prefix.len();
                if path[after..].starts_with(b".so") {
                    return true;
                }
                match path.get(after) {
                    Some(b'-' | b'.') => {
                        let so = next_so[after + 1];
                        so != usize::MAX && next_newline[after + 1] >= so
                    }
                    _ => false,
                }
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_libraries_match() {
        for path in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-musl/libc.so",
            "/lib/ld-musl-x86_64.so.1",
            "/usr/lib/libc.musl-x86_64.so.1",
            "/lib64/libpthread.so.0",
            "/lib/libc-2.31.so",
            "/opt/x/libpthread-2.17.so",
            "./libc.so",
        ] {
            assert!(is_potential_tsd_dso(path.as_bytes()), "{path}");
            assert!(is_potential_libc_dso(path.as_bytes()), "{path}");
        }
    }

    #[test]
    fn other_files_do_not() {
        for path in [
            "libc.so.6", // no slash before the name
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/usr/lib/libcrypto.so.3", // `libc` not followed by - or .
            "/usr/bin/bash",
            "/tmp/libc",
            "/tmp/libc.a",
            "/tmp/aarch64-libc.so.6", // the renamed oracle inputs
            "/tmp/libc-\n.so",        // `.` does not match a newline
            "/usr/lib/x86_64-linux-gnu/libcsomething.so",
        ] {
            assert!(!is_potential_tsd_dso(path.as_bytes()), "{path:?}");
        }
    }

    #[test]
    fn the_dynamic_loader_matches_only_heads_pattern() {
        let ld = b"/lib/ld-linux-aarch64.so.1";
        assert!(!is_potential_tsd_dso(ld));
        assert!(is_potential_libc_dso(ld));
        let ld = b"/lib64/ld-linux-x86-64.so.2";
        assert!(!is_potential_tsd_dso(ld));
        assert!(is_potential_libc_dso(ld));
    }

    #[test]
    fn unanchored_both_ways() {
        // Anything may precede the slash and follow the `.so`.
        assert!(is_potential_tsd_dso(b"x\n/libc.so"));
        assert!(is_potential_tsd_dso(b"/a/libc.x/y.sox"));
        assert!(is_potential_tsd_dso(b"/libc-/libc.so"));
        // The newline only matters between the separator and `.so`.
        assert!(!is_potential_tsd_dso(b"/libc-x\ny.so"));
        assert!(is_potential_tsd_dso(b"/libc.so\n"));
        // A later slash can still start a match.
        assert!(is_potential_tsd_dso(b"/libcx/libpthread.so.0"));
    }

    #[test]
    fn not_utf8_is_fine() {
        assert!(is_potential_tsd_dso(b"/\xff\xfe/libc-\xff.so"));
        assert!(!is_potential_tsd_dso(b"\xff\xfe"));
        assert!(!is_potential_tsd_dso(b""));
    }
}
