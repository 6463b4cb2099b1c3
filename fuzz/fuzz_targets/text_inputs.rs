//! Fuzzes the text inputs `eim tables` reads, through the same entry point:
//! `eim_machine::text_input::read_deltas` on arbitrary bytes, which are a
//! `.deltas` file plain or xz-compressed (recognised by their first bytes),
//! under a size budget counted after decompression; then the `.encoded`
//! tables a fresh manager writes for what it accepts (what `eim tables`
//! prints).
//!
//! Properties (a panic is a bug in eim-core, never a bad input):
//! 1. `read_deltas` ends with a result or an error, never a panic, a hang
//!    or more memory than the budget allows (libFuzzer's `-rss_limit_mb`
//!    and `-timeout` catch the last two); an xz bomb is cut at the budget.
//! 2. Every error message is short: the input is quoted at most 80 bytes.
//! 3. What it accepts has no more rows than the budget has minimal rows,
//!    and round-trips: rendered and read again, the same path and deltas.
//! 4. A fresh `KernelBook` plans it or refuses it, and the plan renders.

#![no_main]

use libfuzzer_sys::fuzz_target;

use eim_machine::machine::{Capacities, KernelBook};
use eim_machine::text::{render_deltas, Tables};
use eim_machine::text_input::read_deltas;
use eim_machine::FileId;

/// The size budget: the bytes read, after decompression.
const BUDGET: u64 = 1 << 20;
/// The shortest delta row: `0 0 0 0 0 0 0` and a line feed (the last row
/// may lack the line feed).
const MIN_ROW: u64 = 14;
/// The longest error message: fixed text, a path-free quote of at most 80
/// bytes (escaped: up to 10 bytes each) and numbers.
const MAX_ERROR: usize = 1024;

fuzz_target!(|bytes: &[u8]| {
    let parsed = match read_deltas(bytes, BUDGET) {
        Ok(parsed) => parsed,
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.len() <= MAX_ERROR,
                "{} bytes: {message}",
                message.len()
            );
            return;
        }
    };
    assert!(parsed.data.len() as u64 <= BUDGET / MIN_ROW + 1);
    let rendered = render_deltas(&parsed.path, &parsed.data);
    let again = read_deltas(rendered.as_bytes(), u64::MAX).expect("rendered deltas read");
    assert_eq!(again.data, parsed.data, "deltas survive render + read");
    assert_eq!(again.path, parsed.path, "the path survives render + read");
    let mut book = KernelBook::new(Capacities::default());
    if let Ok(plan) = book.plan_load(FileId(0x1234), &parsed.data, None) {
        let encoded = Tables::of_plan(&plan).render(&parsed.path, parsed.data.len());
        assert!(encoded.starts_with("# file: "));
    }
});
