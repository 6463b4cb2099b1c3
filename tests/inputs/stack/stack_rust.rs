//! A Rust program that stops at a known point for tests/eim/stack: main ->
//! `visit_all` -> an iterator's `for_each` with a closure -> `visit` ->
//! `park` -> `std::thread::sleep` (blocked in clock_nanosleep in libc).
//! A second thread blocks in `read` on stdin (the test gives it a pipe
//! nobody writes).
//!
//! Built by the test with `rustc -C opt-level=2 -C force-frame-pointers=no`
//! and no debug info: the CFI alone describes the frames. Each stopped
//! thread prints "ready <what>" right before it blocks.

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Never set: the loops could end, so no function is `!` and every caller
/// keeps its frame.
static RELEASED: AtomicBool = AtomicBool::new(false);

fn announce(what: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "ready {what}").and_then(|()| out.flush()).is_err() {
        std::process::exit(3);
    }
}

#[inline(never)]
fn park(what: &str) -> u64 {
    announce(what);
    while !RELEASED.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_secs(3600));
    }
    1
}

#[inline(never)]
fn visit(value: u64) -> u64 {
    let r = if value == 2 { park("rust") } else { 0 };
    black_box(r + value)
}

#[inline(never)]
fn visit_all(values: &[u64]) -> u64 {
    let mut total = 0;
    values.iter().for_each(|v| total += visit(black_box(*v)));
    black_box(total)
}

#[inline(never)]
fn blocked_in_read() -> usize {
    let mut byte = [0u8; 1];
    announce("thread");
    std::io::stdin().read(&mut byte).unwrap_or(0)
}

fn main() {
    let reader = std::thread::spawn(|| {
        while !RELEASED.load(Ordering::Relaxed) {
            black_box(blocked_in_read());
        }
    });
    let total = visit_all(&[1, 2, 3]);
    black_box(total);
    let _ = reader.join();
}
