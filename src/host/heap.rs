//! Giving freed heap back to the kernel after a step.
//!
//! A step that loads new files holds their extracted deltas (up to
//! `Config::batch_bytes` at a time, plus one file's extraction) and frees
//! them once their tables are published. glibc's malloc keeps what was
//! freed in its arenas for later reuse and returns only the top of the
//! main heap on its own, so a daemon's resident memory would stay at its
//! first step's peak for good: 369 MB on a host whose live heap after the
//! step was 5 MB (measured with heaptrack; see docs/BENCHMARKS.md). A
//! trim after each step that loaded something gives those pages back.

/// Big allocations (a file's deltas, a batch's tables) are mapped and
/// unmapped on their own from this size on. glibc's default raises its
/// threshold after each big free, up to 32 MiB, and then keeps up to
/// twice that at the top of a thread's arena, where `malloc_trim` does
/// not reach: a host loaded from a thread kept 55 MB resident with 3 MB
/// live.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
const MMAP_THRESHOLD: libc::c_int = 1 << 20;

/// Fixes malloc's thresholds (see `MMAP_THRESHOLD` in this module); once per process,
/// before the first step.
pub fn configure() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only sets malloc's tunables; it takes the arena
        // locks itself.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, MMAP_THRESHOLD);
        }
    });
}

/// Returns the free pages of every malloc arena to the kernel; whether any
/// were returned. A no-op on a C library without `malloc_trim`.
pub fn give_back() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks and releases free chunks; it takes
        // the arena locks itself and is safe to call from any thread.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// This process's resident anonymous memory in bytes (`RssAnon` of
/// `/proc/self/status`), or `None` if it cannot be read.
pub fn resident_anonymous() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line
        .trim_start_matches("RssAnon:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}
