//! Reading the C headers of `bpf/` in tests, so that each Rust mirror of a
//! header's numbers is checked against the header itself.

/// The text after `#define NAME ` in `header` (the file `file`), trimmed.
pub fn define_text<'a>(header: &'a str, file: &str, name: &str) -> &'a str {
    header
        .lines()
        .find_map(|line| {
            let rest = line.trim_start().strip_prefix("#define")?;
            let rest = rest.trim_start().strip_prefix(name)?;
            rest.starts_with(char::is_whitespace).then(|| rest.trim())
        })
        .unwrap_or_else(|| panic!("{name} is not defined in {file}"))
}

/// The number `#define NAME` gives in `header` (its first word: a trailing
/// comment is not part of it).
pub fn define(header: &str, file: &str, name: &str) -> u64 {
    let text = define_text(header, file, name);
    text.split_whitespace()
        .next()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|e| panic!("{name} in {file}: {text:?}: {e}"))
}

#[test]
fn defines_are_found_by_their_whole_name() {
    let h = "#define A_B 7 /* seven */\n#define A 3\n  #define C (1 << 4)\n";
    assert_eq!(define(h, "h", "A"), 3);
    assert_eq!(define(h, "h", "A_B"), 7);
    assert_eq!(define_text(h, "h", "C"), "(1 << 4)");
}
