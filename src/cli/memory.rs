//! The process's memory set-up: malloc's arenas capped, and an allocation
//! that fails ends eim with one line instead of an abort.
//!
//! Under an address-space limit (`ulimit -v`, `RLIMIT_AS`) or a cgroup
//! memory limit, eim either works or exits 1 with one line naming what it
//! could not allocate (docs/THREAT_MODEL.md, "Memory"):
//!
//! * glibc gives each thread that allocates an arena of its own, each
//!   reserving 64 MiB of address space: with the walk's helpers, the
//!   extractor and the metrics thread that is hundreds of MB of an
//!   address-space limit gone before any work. One arena serves every
//!   thread ([`configure`]); eim's threads allocate little at a time, and
//!   big blocks are mapped on their own anyway (`eim::host::heap`).
//! * std's allocation-failure handler prints "memory allocation of N
//!   bytes failed" with a backtrace and aborts (SIGABRT, a core dump);
//!   replacing it (`std::alloc::set_alloc_error_hook`) is unstable. So the
//!   global allocator ([`ExitOnFailure`]) wraps the system's and, when an
//!   allocation fails outside [`eim_machine::fallible::fallibly`] (where the
//!   caller handles the failure), writes one line and exits 1 at once
//!   (`_exit`: nothing may allocate any more, not even to flush or run
//!   destructors). Pinned maps stay consistent: every map update is a
//!   whole element, and a restart reconciles.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Most malloc arenas: one, the main one (see the module documentation).
const ARENAS: libc::c_int = 1;

/// The cgroup's memory limit in bytes (`memory.max`), read at start-up;
/// `u64::MAX`: none or unknown.
static CGROUP_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Once, first thing in `main`, before any thread is started.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets malloc's tunables; no thread allocates yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
    if let Some(limit) = cgroup_memory_limit() {
        CGROUP_LIMIT.store(limit, Ordering::Relaxed);
    }
}

/// `memory.max` of this process's cgroup (v2), if it has a limit.
fn cgroup_memory_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let path = path.trim_start_matches('/');
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup/{path}/memory.max")).ok()?;
    max.trim().parse().ok()
}

/// The system allocator, ending the process with one line when it fails
/// outside a fallible section.
pub struct ExitOnFailure;

// SAFETY: every call is forwarded to `System` with the caller's arguments;
// on failure the process either ends or gets `System`'s null back.
unsafe impl GlobalAlloc for ExitOnFailure {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        checked(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        checked(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`; `ptr` came from this allocator, that is
        // from `System`.
        checked(unsafe { System.realloc(ptr, layout, new_size) }, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn checked(ptr: *mut u8, size: usize) -> *mut u8 {
    if ptr.is_null() && !eim_machine::fallible::active() {
        out_of_memory(size);
    }
    ptr
}

/// Writes the one line and exits 1. Allocates nothing: the line is built
/// on the stack.
fn out_of_memory(size: usize) -> ! {
    let mut line = Line::default();
    line.push(b"eim: out of memory: could not allocate ");
    line.number(size as u64);
    line.push(b" bytes (address-space limit ");
    line.limit(address_space_limit());
    line.push(b", cgroup memory limit ");
    line.limit(CGROUP_LIMIT.load(Ordering::Relaxed));
    line.push(b")\n");
    // SAFETY: write and _exit are async-signal-safe and take plain
    // arguments; the buffer outlives the call.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(1);
    }
}

/// `RLIMIT_AS`'s soft limit, `u64::MAX` if none.
fn address_space_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return u64::MAX;
    }
    limit.rlim_cur
}

/// A line of at most 200 bytes, built without allocating.
struct Line {
    buf: [u8; 200],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Self {
            buf: [0; 200],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if let Some(at) = self.buf.get_mut(self.len) {
                *at = b;
                self.len += 1;
            }
        }
    }

    fn number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[at..]);
    }

    fn limit(&mut self, limit: u64) {
        if limit == u64::MAX {
            self.push(b"none");
        } else {
            self.number(limit);
            self.push(b" bytes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_the_size_and_the_limits() {
        let mut line = Line::default();
        line.number(0);
        line.push(b" ");
        line.number(u64::MAX - 1);
        line.push(b" ");
        line.limit(u64::MAX);
        line.push(b" ");
        line.limit(256_000);
        assert_eq!(
            std::str::from_utf8(&line.buf[..line.len]).unwrap(),
            "0 18446744073709551614 none 256000 bytes"
        );
    }

    #[test]
    fn a_line_too_long_is_cut_not_overflowed() {
        let mut line = Line::default();
        for _ in 0..100 {
            line.push(b"0123456789");
        }
        assert_eq!(line.len, 200);
    }
}
