//! Numbers written as text into one reused buffer, for the oracle's
//! formats: `eim deltas` prints 810,326 rows for libLLVM, and through
//! `core::fmt` (`write!` per field, the text collected in a `String`)
//! that took six times as long as extracting them (`docs/BENCHMARKS.md`,
//! "Printing deltas and tables"). Here a row is a few table lookups and
//! stores into a fixed buffer, handed to the writer 64 KiB at a time:
//! nothing is allocated per row, and the whole text is never held.
//!
//! The digits are those of `{:x}`, `{:04x}` and `{}` (lowercase hex, no
//! prefix, `-` for a negative number); a property test holds them to
//! `format!`.

use std::io::{self, Write};

/// The bytes handed to the writer at once.
const CHUNK: usize = 64 * 1024;
/// Room every row is given before it starts: the longest row of either
/// format is under 80 bytes (16 hex digits and six fields of at most 11).
pub(crate) const MAX_ROW: usize = 128;

/// `"00" "01" ... "99"`: two decimal digits per lookup.
const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// The text of every number below 1000: its digits, then their count in
/// the last byte. Every field of a delta row but the address and (rarely)
/// a parameter is one of these: one load and one 4-byte store each.
static SMALL: [[u8; 4]; 1000] = small_table();

const fn small_table() -> [[u8; 4]; 1000] {
    let mut table = [[0u8; 4]; 1000];
    let mut v = 0;
    while v < 1000 {
        let (h, t, o) = ((v / 100) as u8, (v / 10 % 10) as u8, (v % 10) as u8);
        table[v] = if v >= 100 {
            [b'0' + h, b'0' + t, b'0' + o, 3]
        } else if v >= 10 {
            [b'0' + t, b'0' + o, 0, 2]
        } else {
            [b'0' + o, 0, 0, 1]
        };
        v += 1;
    }
    table
}

/// A writer of rows: each row is built in place in a fixed buffer, which
/// goes to `out` when a row might not fit. `out` is a trait object, not a
/// type parameter: generic code is compiled in the crate that names the
/// type, and the CLI's debug build (opt-level 0, unlike eim-core's 2) then
/// formatted a row ten times slower.
pub(crate) struct Rows<'w> {
    out: &'w mut dyn Write,
    buf: Box<[u8]>,
    /// Bytes of `buf` written and not yet handed to `out`.
    len: usize,
}

impl<'w> Rows<'w> {
    pub(crate) fn new(out: &'w mut dyn Write) -> Self {
        Self {
            out,
            buf: vec![0; CHUNK].into_boxed_slice(),
            len: 0,
        }
    }

    /// One row of at most [`MAX_ROW`] bytes, built by `build`.
    #[inline]
    pub(crate) fn row(&mut self, build: impl FnOnce(&mut Row<'_>)) -> io::Result<()> {
        if self.len + MAX_ROW > self.buf.len() {
            self.flush_buf()?;
        }
        let Some(room) = self.buf.get_mut(self.len..self.len + MAX_ROW) else {
            // CHUNK > MAX_ROW: a flushed buffer always has room.
            return Err(io::Error::other("row buffer smaller than a row"));
        };
        let Ok(out) = <&mut [u8; MAX_ROW]>::try_from(room) else {
            return Err(io::Error::other("row buffer smaller than a row"));
        };
        let mut row = Row { out, len: 0 };
        build(&mut row);
        self.len += row.len;
        Ok(())
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        self.out.write_all(&self.buf[..self.len])?;
        self.len = 0;
        Ok(())
    }

    /// Any bytes, however long (a header with a path): through the buffer
    /// if they fit, else straight to `out` after it.
    pub(crate) fn text(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.len + bytes.len() > self.buf.len() {
            self.flush_buf()?;
            if bytes.len() > self.buf.len() {
                return self.out.write_all(bytes);
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        Ok(())
    }

    /// Hands what is buffered to `out` (not flushing `out` itself: the
    /// caller's `BufWriter` and its flush stay the caller's).
    pub(crate) fn finish(mut self) -> io::Result<()> {
        self.flush_buf()
    }
}

/// One line of fields, separated by a space and ended by a line feed:
/// every row of both formats, `line!(rows, hex(a), dec(b), signed(c))`
/// with a [`Row`] method per field. A macro, not a loop over an array of
/// fields: that loop (an enum of the four kinds matched per field) printed
/// deltas three times and tables six times slower in the print bench;
/// this expands to the stores of a row written by hand.
macro_rules! line {
    ($rows:expr, $first:ident($v:expr) $(, $field:ident($w:expr))* $(,)?) => {
        $rows.row(|r| {
            r.$first($v);
            $(
                r.byte(b' ');
                r.$field($w);
            )*
            r.byte(b'\n');
        })
    };
}
pub(crate) use line;

/// One row being built, in a window of the buffer of fixed size (so that
/// the compiler keeps the position in a register and proves most stores
/// in bounds). A field may store past its text, never past the window: a
/// row is far shorter than [`MAX_ROW`], and the next field overwrites the
/// rest.
pub(crate) struct Row<'a> {
    out: &'a mut [u8; MAX_ROW],
    len: usize,
}

impl Row<'_> {
    /// One byte (a separator, the line feed).
    #[inline]
    pub(crate) fn byte(&mut self, b: u8) {
        self.out[self.len] = b;
        self.len += 1;
    }

    /// `{:x}`: all sixteen digits computed at once (each nibble spread to
    /// a byte, then made ASCII), shifted so the first significant one
    /// leads, stored as 16 bytes; the row goes on after the significant
    /// ones.
    #[inline]
    pub(crate) fn hex(&mut self, v: u64) {
        let digits = (64 - v.leading_zeros() as usize).div_ceil(4).max(1);
        let text =
            (u128::from(hex_ascii((v >> 32) as u32)) << 64) | u128::from(hex_ascii(v as u32));
        let text = text << (8 * (16 - digits));
        self.out[self.len..self.len + 16].copy_from_slice(&text.to_be_bytes());
        self.len += digits;
    }

    /// `{:04x}` of a 16-bit value: always four digits.
    #[inline]
    pub(crate) fn hex4(&mut self, v: u16) {
        let text = (hex_ascii(u32::from(v)) as u32).to_be_bytes();
        self.out[self.len..self.len + 4].copy_from_slice(&text);
        self.len += 4;
    }

    /// `{}` of an unsigned number.
    #[inline]
    pub(crate) fn dec(&mut self, v: u64) {
        match usize::try_from(v) {
            Ok(small) if small < SMALL.len() => self.small(small),
            _ => self.dec_long(v),
        }
    }

    /// `{}` of a number below 1000 (all four bytes of its entry are
    /// stored).
    #[inline]
    fn small(&mut self, v: usize) {
        let text = SMALL[v];
        self.out[self.len..self.len + 4].copy_from_slice(&text);
        self.len += usize::from(text[3]);
    }

    #[inline(never)]
    fn dec_long(&mut self, v: u64) {
        let mut tmp = [0u8; 20];
        let mut at = tmp.len();
        let mut v = v;
        while v >= 100 {
            let i = 2 * (v % 100) as usize;
            v /= 100;
            at -= 2;
            tmp[at..at + 2].copy_from_slice(&PAIRS[i..i + 2]);
        }
        if v >= 10 {
            let i = 2 * v as usize;
            at -= 2;
            tmp[at..at + 2].copy_from_slice(&PAIRS[i..i + 2]);
        } else {
            at -= 1;
            tmp[at] = b'0' + v as u8;
        }
        let digits = &tmp[at..];
        self.out[self.len..self.len + digits.len()].copy_from_slice(digits);
        self.len += digits.len();
    }

    /// `{}` of a signed number.
    #[inline]
    pub(crate) fn signed(&mut self, v: i64) {
        if v < 0 {
            self.byte(b'-');
        }
        self.dec(v.unsigned_abs());
    }
}

/// The eight hex digits of `v` as ASCII, the first in the top byte.
#[inline]
fn hex_ascii(v: u32) -> u64 {
    // Nibble i (from the low end) to byte i.
    let mut x = u64::from(v);
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // 0x01 in the bytes of the nibbles above 9: their letters start 39
    // after '0' + 10. No byte carries into the next (at most 15 + 6).
    let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    x + 0x3030_3030_3030_3030 + letters * 39
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The text of one row built by `f`.
    pub(crate) fn row(f: impl FnOnce(&mut Row<'_>)) -> String {
        let mut out = Vec::new();
        let mut rows = Rows::new(&mut out);
        rows.row(f).expect("room");
        rows.finish().expect("a Vec takes every byte");
        String::from_utf8(out).expect("ASCII")
    }

    const EDGES: [u64; 12] = [
        0,
        1,
        9,
        10,
        99,
        100,
        0xf,
        0x10,
        u16::MAX as u64,
        u32::MAX as u64,
        u64::MAX - 1,
        u64::MAX,
    ];

    #[test]
    fn the_edges_print_as_format_does() {
        for v in EDGES {
            assert_eq!(row(|r| r.hex(v)), format!("{v:x}"));
            assert_eq!(row(|r| r.dec(v)), format!("{v}"));
            assert_eq!(row(|r| r.hex4(v as u16)), format!("{:04x}", v as u16));
        }
        for v in [
            0,
            -1,
            -9,
            -10,
            -99,
            -100,
            i64::MIN,
            i64::MAX,
            i32::MIN as i64,
        ] {
            assert_eq!(row(|r| r.signed(v)), format!("{v}"));
        }
    }

    #[test]
    fn a_line_is_its_fields_between_spaces_then_a_line_feed() {
        let mut out = Vec::new();
        let mut rows = Rows::new(&mut out);
        line!(rows, hex(255), hex4(1), dec(7), signed(-3)).expect("room");
        line!(rows, dec(1000)).expect("room");
        rows.finish().expect("a Vec takes every byte");
        assert_eq!(
            String::from_utf8(out).expect("ASCII"),
            "ff 0001 7 -3\n1000\n"
        );
    }

    #[test]
    fn text_longer_than_the_buffer_goes_through_in_order() {
        let long = "p".repeat(3 * CHUNK + 7);
        let mut out = Vec::new();
        let mut rows = Rows::new(&mut out);
        rows.text(b"# file: ").expect("text");
        rows.text(long.as_bytes()).expect("text");
        for i in 0..CHUNK {
            rows.row(|r| {
                r.dec(i as u64);
                r.byte(b'\n');
            })
            .expect("room");
        }
        rows.finish().expect("finish");
        let mut want = format!("# file: {long}");
        for i in 0..CHUNK {
            want.push_str(&format!("{i}\n"));
        }
        assert!(out == want.as_bytes());
    }

    proptest! {
        #[test]
        fn numbers_print_as_format_does(u in any::<u64>(), s in any::<i64>(), h in any::<u16>(), small in 0u64..1000) {
            prop_assert_eq!(row(|r| r.hex(u)), format!("{u:x}"));
            prop_assert_eq!(row(|r| r.dec(u)), format!("{u}"));
            prop_assert_eq!(row(|r| r.dec(small)), format!("{small}"));
            prop_assert_eq!(row(|r| r.signed(s)), format!("{s}"));
            prop_assert_eq!(row(|r| r.signed(-(small as i64))), format!("{}", -(small as i64)));
            prop_assert_eq!(row(|r| r.hex4(h)), format!("{h:04x}"));
        }
    }
}
