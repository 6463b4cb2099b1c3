//! The kernel's function symbols, from `/proc/kallsyms`, to name the kernel
//! frames of `eim profile --kernel` as perf does: the function holding an
//! address, with no offset.
//!
//! The file is read once, bounded (bytes, line length, symbols): a line
//! that does not parse is skipped, not trusted. With `kptr_restrict` (or
//! without CAP_SYSLOG) the kernel prints every address as zero: the table
//! is then [`Kallsyms::restricted`] and names nothing.

use std::io::BufRead;
use std::path::Path;

/// Where the kernel lists its symbols.
pub const PATH: &str = "/proc/kallsyms";

/// The most bytes read (a kernel with many modules lists a few hundred
/// thousand symbols in about 15 MB).
const MAX_BYTES: u64 = 128 << 20;
/// The longest line kept: an address, a type, a name of at most 512 bytes
/// (`KSYM_NAME_LEN`) and a module's name. Longer ones are skipped.
const MAX_LINE: usize = 1024;
/// The most function symbols kept.
const MAX_SYMBOLS: usize = 2_000_000;

/// Why the symbols could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the kernel's symbols from {path}: {cause}")]
pub struct KallsymsError {
    pub path: String,
    pub cause: std::io::Error,
}

/// The kernel's function symbols, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    /// (address, start and end of the name in `names`), by address; one
    /// name per address (the first listed).
    symbols: Vec<(u64, u32, u32)>,
    names: String,
    restricted: bool,
    /// Lines skipped: malformed, too long, or past a bound.
    skipped: u64,
}

impl Kallsyms {
    /// The symbols of the running kernel.
    pub fn read() -> Result<Self, KallsymsError> {
        Self::read_from(Path::new(PATH))
    }

    /// The symbols listed in `path` (the format of `/proc/kallsyms`).
    pub fn read_from(path: &Path) -> Result<Self, KallsymsError> {
        let error = |cause| KallsymsError {
            path: path.display().to_string(),
            cause,
        };
        let file = std::fs::File::open(path).map_err(error)?;
        Self::parse(std::io::BufReader::new(file)).map_err(error)
    }

    /// The symbols listed by `input`: `ADDRESS TYPE NAME [\t[MODULE]]` a
    /// line, the function ones (types `t`, `T`, `w`, `W`) kept.
    pub fn parse(input: impl BufRead) -> std::io::Result<Self> {
        let mut input = std::io::Read::take(input, MAX_BYTES);
        let mut table = Kallsyms::default();
        let mut any_address = false;
        let mut line = Vec::with_capacity(MAX_LINE + 1);
        loop {
            line.clear();
            let ended = read_line(&mut input, &mut line)?;
            if line.is_empty() && !ended {
                break;
            }
            let parsed = (line.len() <= MAX_LINE)
                .then(|| parse_line(&line))
                .flatten();
            let Some((address, kind, name)) = parsed else {
                table.skipped += 1;
                continue;
            };
            any_address |= address != 0;
            if !matches!(kind, b't' | b'T' | b'w' | b'W') {
                continue;
            }
            if table.symbols.len() >= MAX_SYMBOLS
                || table.names.len() + name.len() > u32::MAX as usize
            {
                table.skipped += 1;
                continue;
            }
            let start = table.names.len() as u32;
            table.names.push_str(name);
            table
                .symbols
                .push((address, start, table.names.len() as u32));
        }
        if !any_address && !table.symbols.is_empty() {
            // Every address hidden: the names say nothing about where.
            table.restricted = true;
            table.symbols.clear();
            table.names.clear();
        }
        // Stable: of the names of one address, the first listed stays.
        table.symbols.sort_by_key(|s| s.0);
        table.symbols.dedup_by_key(|s| s.0);
        Ok(table)
    }

    /// Whether the kernel hid every address (`kptr_restrict`).
    pub fn restricted(&self) -> bool {
        self.restricted
    }

    /// Function symbols kept.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// Lines that were skipped (malformed, too long, past a bound).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The lowest and one past the highest function address, if any.
    pub fn range(&self) -> Option<(u64, u64)> {
        let first = self.symbols.first()?.0;
        let last = self.symbols.last()?.0;
        Some((first, last.saturating_add(1)))
    }

    /// The function holding `address`: the nearest symbol at or below it.
    pub fn name(&self, address: u64) -> Option<&str> {
        let after = self.symbols.partition_point(|s| s.0 <= address);
        let (_, start, end) = *self.symbols.get(after.checked_sub(1)?)?;
        self.names.get(start as usize..end as usize)
    }
}

/// Reads one line into `line` (without its newline), keeping at most
/// `MAX_LINE + 1` bytes of it and skipping the rest. Says whether a line
/// was there (false at the end of the input).
fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut any = false;
    // Each turn consumes at least one byte or ends: bounded by the input.
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(any);
        }
        any = true;
        let (chunk, used, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (&buf[..at], at + 1, true),
            None => (buf, buf.len(), false),
        };
        let room = (MAX_LINE + 1).saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        input.consume(used);
        if done {
            return Ok(true);
        }
    }
}

/// `ADDRESS TYPE NAME[\t[MODULE]]`: the address, the type letter, the name.
fn parse_line(line: &[u8]) -> Option<(u64, u8, &str)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split_ascii_whitespace();
    let address = fields.next()?;
    if address.is_empty() || address.len() > 16 {
        return None;
    }
    let address = u64::from_str_radix(address, 16).ok()?;
    let kind = fields.next()?.as_bytes();
    let [kind] = kind else { return None };
    if !kind.is_ascii_alphabetic() {
        return None;
    }
    let name = fields.next()?;
    if name.starts_with('[') {
        return None;
    }
    // What may follow is the module, in brackets, and nothing else.
    match fields.next() {
        None => {}
        Some(module) if module.starts_with('[') && module.ends_with(']') => {}
        Some(_) => return None,
    }
    fields.next().is_none().then_some((address, *kind, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Kallsyms {
        Kallsyms::parse(text.as_bytes()).expect("reading a slice cannot fail")
    }

    #[test]
    fn functions_are_named_by_the_nearest_symbol_at_or_below() {
        let k = parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81000100 t do_syscall_64\n\
             ffffffff81000100 T do_syscall_64_alias\n\
             ffffffff81000200 D some_data\n\
             ffffffff81000300 W weak_fn\n\
             ffffffffc0001000 t ext4_read\t[ext4]\n",
        );
        assert!(!k.restricted());
        assert_eq!(k.len(), 4, "data left out, one name per address");
        assert_eq!(k.name(0xffff_ffff_8000_0000), None, "below every symbol");
        assert_eq!(k.name(0xffff_ffff_8100_0000), Some("_stext"));
        assert_eq!(k.name(0xffff_ffff_8100_0150), Some("do_syscall_64"));
        assert_eq!(
            k.name(0xffff_ffff_8100_0250),
            Some("do_syscall_64"),
            "data does not end a function"
        );
        assert_eq!(k.name(0xffff_ffff_8100_0301), Some("weak_fn"));
        assert_eq!(k.name(0xffff_ffff_c000_1010), Some("ext4_read"));
        assert_eq!(
            k.range(),
            Some((0xffff_ffff_8100_0000, 0xffff_ffff_c000_1001))
        );
    }

    #[test]
    fn hidden_addresses_leave_a_restricted_table_that_names_nothing() {
        let k = parse(
            "0000000000000000 T _stext\n\
             0000000000000000 t do_syscall_64\n\
             0000000000000000 t ext4_read\t[ext4]\n",
        );
        assert!(k.restricted());
        assert!(k.is_empty());
        assert_eq!(k.name(0), None);
        assert_eq!(k.name(u64::MAX), None);
        assert_eq!(k.range(), None);
        // An empty input is not a restricted one.
        assert!(!parse("").restricted());
    }

    #[test]
    fn hostile_lines_are_skipped_and_the_rest_kept() {
        let long_name = "x".repeat(MAX_LINE * 4);
        let text = format!(
            "ffffffff81000000 T good_one\n\
             zzzz T not_hex\n\
             1ffffffff81000000 T seventeen_digits\n\
             ffffffff81000010 TT two_letters\n\
             ffffffff81000020 T\n\
             ffffffff81000030 T a b c\n\
             ffffffff81000040 T {long_name}\n\
             \n\
             ffffffff81000050 T bad_module\tmodule\n\
             ffffffff81000060 \u{0} nul\n\
             ffffffff81000070 T \u{fffd}\u{fffd}\n\
             ffffffff81000080 T good_two\t[mod]"
        );
        let mut bytes = text.into_bytes();
        bytes.extend_from_slice(b"\nffffffff81000090 T \xff\xfe\n");
        let k = Kallsyms::parse(bytes.as_slice()).expect("a slice");
        assert_eq!(k.name(0xffff_ffff_8100_0045), Some("good_one"));
        assert_eq!(k.name(0xffff_ffff_8100_0075), Some("\u{fffd}\u{fffd}"));
        assert_eq!(k.name(0xffff_ffff_8100_0095), Some("good_two"));
        assert_eq!(k.len(), 3, "{k:?}");
        assert_eq!(k.skipped(), 10);
    }

    #[test]
    fn a_line_without_end_is_read_to_the_bound_only() {
        // One endless line: read through, kept to MAX_LINE + 1 bytes, then
        // skipped; the input ends, so does the read.
        let endless = std::io::Read::take(std::io::repeat(b'f'), 8 << 20);
        let k = Kallsyms::parse(std::io::BufReader::new(endless)).expect("reads");
        assert!(k.is_empty());
        assert_eq!(k.skipped(), 1);
    }

    #[test]
    fn this_kernels_symbols_name_its_syscall_entry() {
        let k = match Kallsyms::read() {
            Ok(k) => k,
            Err(e) => {
                eprintln!("SKIPPED: {e}");
                return;
            }
        };
        if k.restricted() {
            eprintln!("SKIPPED: {PATH} hides its addresses here (kptr_restrict)");
            return;
        }
        assert!(k.len() > 1000, "{} function symbols", k.len());
        assert_eq!(k.skipped(), 0, "every line of the kernel's own list parses");
        let (start, limit) = k.range().expect("a range");
        assert!(start < limit);
        assert!(
            k.names.contains("do_syscall_64") || k.names.contains("el0_svc"),
            "a syscall entry among {} symbols",
            k.len()
        );
    }
}
