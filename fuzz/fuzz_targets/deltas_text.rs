//! Fuzzes the oracle's deltas text format (`eim_machine::text`).
//!
//! Property 1: `parse_deltas` never panics on any UTF-8 text.
//! Property 2: what it accepts round-trips: rendering the parsed file and
//! parsing the result gives back the same path and the same deltas. The
//! oracle tests compare eim with upstream through this format, so a lossy
//! round trip would hide differences.
//!
//! The `expect`/`assert`s below are the properties: a panic here is a bug in
//! eim-core, never a bad input. Bad inputs return early.

#![no_main]

use libfuzzer_sys::fuzz_target;

use eim_machine::text::{parse_deltas, render_deltas};

fuzz_target!(|bytes: &[u8]| {
    // The format is text; invalid UTF-8 never reaches the parser (callers
    // read files with `read_to_string`).
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(parsed) = parse_deltas(text) else {
        return;
    };
    let rendered = render_deltas(&parsed.path, &parsed.data);
    let again = parse_deltas(&rendered).expect("rendered deltas parse");
    assert_eq!(again.data, parsed.data, "deltas survive render + parse");
    assert_eq!(again.path, parsed.path, "the path survives render + parse");
});
