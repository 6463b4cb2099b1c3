//! The oracle's text formats: extracted deltas (`<name>.deltas`) and the
//! kernel tables a fresh manager writes (`<name>.encoded`). `eim deltas`,
//! `eim tables` and the oracle tests all go through here, so eim's output can
//! be compared with upstream's line for line.

use std::io::{self, Write};

use crate::abi::{self, StackDeltaPageInfo, StackDeltaPageKey, UnwindInfo};
use crate::deltas::{IntervalData, StackDelta};
use crate::machine::LoadManyPlan;
use crate::ops::MapOp;

mod rows;
use rows::{line, Rows};

/// A malformed line in a deltas file. The message quotes at most
/// [`QUOTE_MAX`] bytes of the input (see [`quote`]): a bad line may be
/// gigabytes long, and an error that echoes it whole is itself an attack.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TextError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// The most bytes of the input an error message quotes.
pub const QUOTE_MAX: usize = 80;

/// `bytes` quoted for an error message: whole if short, else its first
/// [`QUOTE_MAX`] bytes (cut at a character boundary), `...` and its length.
pub fn quote(bytes: &[u8]) -> String {
    if bytes.len() <= QUOTE_MAX {
        return format!("{:?}", String::from_utf8_lossy(bytes));
    }
    let head = String::from_utf8_lossy(&bytes[..QUOTE_MAX]);
    // A character cut in two shows as U+FFFD at the end; drop it.
    let head = head.trim_end_matches('\u{fffd}');
    format!("{head:?}... ({} bytes)", bytes.len())
}

/// Writes extracted deltas in the oracle's format to `out`, a row at a
/// time through one buffer (nothing is allocated per row, and the text is
/// never held whole).
pub fn write_deltas(out: &mut dyn Write, path: &str, data: &IntervalData) -> io::Result<()> {
    write!(
        out,
        "# file: {path}\n# deltas: {}\n# ADDRESS HINTS OPCODE PARAM FPOPCODE FPPARAM MERGEOPCODE\n",
        data.len()
    )?;
    let mut rows = Rows::new(out);
    for d in data {
        let i = &d.info;
        line!(
            rows,
            hex(d.address),
            dec(d.hints.into()),
            dec(i.opcode.into()),
            signed(i.param.into()),
            dec(i.fp_opcode.into()),
            signed(i.fp_param.into()),
            dec(i.merge_opcode.into()),
        )?;
    }
    rows.finish()
}

/// What a writer into memory wrote, as text: it is ASCII and the path, a
/// `&str`, so the lossy path is never taken.
fn into_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Renders extracted deltas in the oracle's format ([`write_deltas`] into
/// a string).
pub fn render_deltas(path: &str, data: &IntervalData) -> String {
    let mut out = Vec::with_capacity(24 * data.len() + 128 + path.len());
    // Writing into a Vec cannot fail.
    let _ = write_deltas(&mut out, path, data);
    into_text(out)
}

/// Renders an extraction failure in the oracle's format.
pub fn render_deltas_error(path: &str, message: &str) -> String {
    format!("# file: {path}\n# error: {message}\n")
}

/// A parsed deltas file: the path it names and its deltas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltasFile {
    pub path: String,
    pub data: IntervalData,
}

fn field<T: std::str::FromStr>(
    it: &mut std::str::SplitAsciiWhitespace<'_>,
    line: usize,
    name: &str,
) -> Result<T, TextError> {
    let raw = it.next().ok_or_else(|| TextError {
        line,
        message: format!("missing {name}"),
    })?;
    raw.parse().map_err(|_| TextError {
        line,
        message: format!("bad {name} {}", quote(raw.as_bytes())),
    })
}

/// Parses a deltas file. The declared count must match the rows.
pub fn parse_deltas(text: &str) -> Result<DeltasFile, TextError> {
    let mut parser = DeltasParser::new();
    for line in text.lines() {
        parser.line(line)?;
    }
    parser.finish()
}

/// A deltas file parsed one line at a time, so that a reader never needs
/// the whole text in memory ([`parse_deltas`] feeds it the lines of a
/// string; `text_input` the lines of a stream).
#[derive(Debug, Default)]
pub struct DeltasParser {
    /// The path and the line that named it.
    path: Option<(String, usize)>,
    /// The declared count and the line that declared it.
    declared: Option<(usize, usize)>,
    /// Packed as read (8 bytes a delta, not a `StackDelta`'s 24).
    deltas: IntervalData,
    /// The number of the last line fed (1-based).
    line_no: usize,
}

impl DeltasParser {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The number of lines fed so far.
    pub(crate) fn lines(&self) -> usize {
        self.line_no
    }

    /// Takes the next line, without its line feed.
    pub(crate) fn line(&mut self, line: &str) -> Result<(), TextError> {
        self.line_no += 1;
        let line_no = self.line_no;
        let error = |message: String| TextError {
            line: line_no,
            message,
        };
        // Carriage returns are line-ending noise, never part of a field.
        let line = line.trim_end_matches('\r');
        if let Some(rest) = line.strip_prefix("# file: ") {
            // Two files' texts run together (`eim deltas a b`) are not one
            // file: the second path would silently win.
            if let Some((_, first)) = self.path {
                return Err(error(format!(
                    "a second '# file:' line (the first is line {first})"
                )));
            }
            self.path = Some((rest.to_string(), line_no));
            return Ok(());
        }
        if let Some(rest) = line.strip_prefix("# deltas: ") {
            if let Some((_, first)) = self.declared {
                return Err(error(format!(
                    "a second '# deltas:' line (the first is line {first})"
                )));
            }
            if !self.deltas.is_empty() {
                return Err(error(format!(
                    "'# deltas:' after {} delta rows: the count comes before the rows",
                    self.deltas.len()
                )));
            }
            let count = rest
                .trim()
                .parse::<usize>()
                .map_err(|_| error(format!("bad delta count {}", quote(rest.as_bytes()))))?;
            self.declared = Some((count, line_no));
            return Ok(());
        }
        if let Some(rest) = line.strip_prefix("# error: ") {
            return Err(error(format!(
                "the file records an extraction error: {}",
                quote(rest.as_bytes())
            )));
        }
        if line.starts_with('#') || line.trim().is_empty() {
            return Ok(());
        }
        // The row that runs past the declared count is where the file and
        // its header part ways: name it, not the end of the file.
        if let Some((declared, at)) = self.declared {
            if self.deltas.len() == declared {
                return Err(error(format!(
                    "delta row {} is one more than the {declared} that line {at} declares",
                    declared + 1
                )));
            }
        }
        let mut it = line.split_ascii_whitespace();
        let addr: &str = it
            .next()
            .ok_or_else(|| error("missing address".to_string()))?;
        let address = u64::from_str_radix(addr, 16)
            .map_err(|_| error(format!("bad address {}", quote(addr.as_bytes()))))?;
        let hints = field(&mut it, line_no, "hints")?;
        let opcode = field(&mut it, line_no, "opcode")?;
        let param = field(&mut it, line_no, "param")?;
        let fp_opcode = field(&mut it, line_no, "fp opcode")?;
        let fp_param = field(&mut it, line_no, "fp param")?;
        let merge_opcode = field(&mut it, line_no, "merge opcode")?;
        // A row of upstream's seven fields and something after it is not a
        // row eim understands: dropping the rest would hide a format change
        // or a corrupt file.
        if let Some(extra) = it.next() {
            return Err(error(format!(
                "extra field {} after the merge opcode (a row has 7 fields)",
                quote(extra.as_bytes())
            )));
        }
        self.deltas.push(StackDelta {
            address,
            hints,
            info: UnwindInfo {
                opcode,
                fp_opcode,
                merge_opcode,
                pad: 0,
                param,
                fp_param,
            },
        });
        Ok(())
    }

    /// The file, once every line was fed: its declared count must match.
    pub(crate) fn finish(self) -> Result<DeltasFile, TextError> {
        if let Some((declared, at)) = self.declared {
            // Too many rows failed at the first extra one; too few can only
            // be seen here, and the line that promised them is the one to
            // name (the end of the file is not wrong, the count is).
            if declared != self.deltas.len() {
                return Err(TextError {
                    line: at,
                    message: format!(
                        "declares {declared} deltas but the file ends after {} (at line {})",
                        self.deltas.len(),
                        self.line_no
                    ),
                });
            }
        }
        Ok(DeltasFile {
            path: self.path.map(|(path, _)| path).unwrap_or_default(),
            data: self.deltas,
        })
    }
}

/// What a fresh manager writes for one file, in the oracle's `encoded` form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub map_id: u16,
    /// Slots the load wrote, in slot order.
    pub unwind_infos: Vec<(u16, UnwindInfo)>,
    pub kernel_deltas: Vec<abi::StackDelta>,
    pub pages: Vec<(StackDeltaPageKey, StackDeltaPageInfo)>,
    pub gaps: Vec<std::ops::Range<u64>>,
}

impl Tables {
    /// The tables a plan of one file writes (what the oracle records for
    /// a file loaded alone; [`crate::machine::KernelBook::plan_load`]).
    pub fn of_plan(plan: &LoadManyPlan) -> Self {
        let mut t = Tables::default();
        if let Some(file) = plan.files.first() {
            t.map_id = file.map_ref.map_id;
            t.gaps = file.gaps.clone();
        }
        for op in &plan.ops {
            match op {
                MapOp::PutUnwindInfos(v) => t.unwind_infos.extend(v.iter().copied()),
                MapOp::PutDeltaTable { deltas, .. } => {
                    t.kernel_deltas.extend(deltas.iter().copied())
                }
                MapOp::PutPages(v) => t.pages.extend(v.iter().copied()),
                _ => {}
            }
        }
        t.unwind_infos.sort_by_key(|(slot, _)| *slot);
        t
    }

    /// Writes the tables in the oracle's format to `out`, a row at a time
    /// through one buffer, as [`write_deltas`].
    pub fn write(&self, out: &mut dyn Write, path: &str, deltas_in: usize) -> io::Result<()> {
        write!(
            out,
            "# file: {path}\n# deltas_in: {deltas_in}\n# mapid: {}\n# unwind_infos: {}\n",
            self.map_id,
            self.unwind_infos.len()
        )?;
        let mut rows = Rows::new(out);
        for (slot, i) in &self.unwind_infos {
            line!(
                rows,
                dec((*slot).into()),
                dec(i.opcode.into()),
                dec(i.fp_opcode.into()),
                dec(i.merge_opcode.into()),
                signed(i.param.into()),
                signed(i.fp_param.into()),
            )?;
        }
        rows.text(format!("# kernel_deltas: {}\n", self.kernel_deltas.len()).as_bytes())?;
        for d in &self.kernel_deltas {
            line!(rows, hex4(d.addr_low), hex4(d.unwind_info))?;
        }
        rows.text(format!("# pages: {}\n", self.pages.len()).as_bytes())?;
        for (k, v) in &self.pages {
            line!(
                rows,
                hex(k.page),
                dec(v.first_delta.into()),
                dec(v.num_deltas.into()),
                dec(v.map_id.into()),
            )?;
        }
        rows.text(format!("# gaps: {}\n", self.gaps.len()).as_bytes())?;
        for g in &self.gaps {
            line!(rows, hex(g.start), hex(g.end))?;
        }
        rows.finish()
    }

    /// Renders in the oracle's format ([`Tables::write`] into a string).
    pub fn render(&self, path: &str, deltas_in: usize) -> String {
        let mut out = Vec::with_capacity(
            10 * (self.kernel_deltas.len() + self.pages.len()) + 256 + path.len(),
        );
        // Writing into a Vec cannot fail.
        let _ = self.write(&mut out, path, deltas_in);
        into_text(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_round_trip_through_text() {
        let text =
            "# file: /x\n# deltas: 2\n# ADDRESS HINTS OPCODE PARAM FPOPCODE FPPARAM MERGEOPCODE\n\
                    850 1 2 16 0 0 0\n8d1 0 2 16 1 -16 0\n";
        let parsed = parse_deltas(text).unwrap();
        assert_eq!(parsed.path, "/x");
        assert_eq!(
            parsed.data.get(1).map(|d| d.address).unwrap_or_default(),
            0x8d1
        );
        assert_eq!(
            parsed
                .data
                .get(1)
                .map(|d| d.info.fp_param)
                .unwrap_or_default(),
            -16
        );
        assert_eq!(render_deltas("/x", &parsed.data), text);
    }

    #[test]
    fn carriage_returns_never_reach_the_path() {
        // Found by the deltas_text fuzzer: a path parsed with a trailing CR
        // did not survive render + parse.
        let parsed = parse_deltas("# file: a.so\r\r\n# deltas: 0\n").unwrap();
        assert_eq!(parsed.path, "a.so");
        let again = parse_deltas(&render_deltas(&parsed.path, &parsed.data)).unwrap();
        assert_eq!(again, parsed);
    }

    #[test]
    fn rejects_a_count_mismatch_and_garbage() {
        assert!(parse_deltas("# deltas: 2\n850 1 2 16 0 0 0\n").is_err());
        assert!(parse_deltas("zz 1 2 16 0 0 0\n").is_err());
        assert!(parse_deltas("850 1 2\n").is_err());
        assert!(
            parse_deltas("850 1 999 16 0 0 0\n").is_err(),
            "opcode is a u8"
        );
    }

    /// The error of `text`, as `(line, message)`.
    fn error_of(text: &str) -> (usize, String) {
        let e = parse_deltas(text).expect_err(text);
        (e.line, e.message)
    }

    const HEAD: &str =
        "# file: /x\n# deltas: 2\n# ADDRESS HINTS OPCODE PARAM FPOPCODE FPPARAM MERGEOPCODE\n";

    #[test]
    fn too_few_rows_name_the_line_that_declared_more() {
        let (line, message) = error_of(&format!("{HEAD}850 1 2 16 0 0 0\n\n"));
        assert_eq!(line, 2, "{message}");
        assert_eq!(
            message,
            "declares 2 deltas but the file ends after 1 (at line 5)"
        );
        let (line, message) = error_of("# file: /x\n\n# deltas: 1\n");
        assert_eq!(
            (line, message.as_str()),
            (3, "declares 1 deltas but the file ends after 0 (at line 3)")
        );
    }

    #[test]
    fn too_many_rows_name_the_first_row_past_the_count() {
        let rows = "850 1 2 16 0 0 0\n8d1 0 2 16 1 -16 0\n900 0 2 16 1 -16 0\n901 0 2 16 1 -16 0\n";
        let (line, message) = error_of(&format!("{HEAD}{rows}"));
        assert_eq!(line, 6, "{message}");
        assert_eq!(
            message,
            "delta row 3 is one more than the 2 that line 2 declares"
        );
        let (line, message) = error_of("# deltas: 0\n#\n850 1 2 16 0 0 0\n");
        assert_eq!(
            (line, message.as_str()),
            (3, "delta row 1 is one more than the 0 that line 1 declares")
        );
    }

    #[test]
    fn a_row_with_extra_fields_is_refused() {
        // The fuzz-found shape: a valid row with trailing garbage.
        let (line, message) = error_of(&format!(
            "{HEAD}850 1 2 16 0 0 0\n8d1 0 2 16 1 -16 0 \u{1}zz\n"
        ));
        assert_eq!(line, 5, "{message}");
        assert_eq!(
            message,
            "extra field \"\\u{1}zz\" after the merge opcode (a row has 7 fields)"
        );
        let (line, message) = error_of("# file: /x\n850 1 2 16 0 0 0 0\n");
        assert_eq!(
            (line, message.as_str()),
            (
                2,
                "extra field \"0\" after the merge opcode (a row has 7 fields)"
            )
        );
        // Trailing blanks are not a field.
        assert!(parse_deltas("# file: /x\n850 1 2 16 0 0 0 \t \r\n").is_ok());
    }

    #[test]
    fn a_missing_or_bad_field_names_its_line() {
        for (row, want) in [
            ("850 1 2 16 0 0", "missing merge opcode"),
            ("850", "missing hints"),
            ("850 1 2 16 0 x 0", "bad fp param \"x\""),
            ("850 1 256 16 0 0 0", "bad opcode \"256\""),
            ("-850 1 2 16 0 0 0", "bad address \"-850\""),
            (
                "10000000000000000 1 2 16 0 0 0",
                "bad address \"10000000000000000\"",
            ),
        ] {
            let (line, message) = error_of(&format!("# file: /x\n\n# c\n{row}\n"));
            assert_eq!((line, message.as_str()), (4, want), "{row}");
        }
        let (line, message) = error_of("# file: /x\n# deltas: two\n");
        assert_eq!((line, message.as_str()), (2, "bad delta count \"two\""));
    }

    #[test]
    fn a_second_header_line_is_refused() {
        let two = format!("{HEAD}850 1 2 16 0 0 0\n8d1 0 2 16 1 -16 0\n{HEAD}");
        let (line, message) = error_of(&two);
        assert_eq!(
            (line, message.as_str()),
            (6, "a second '# file:' line (the first is line 1)")
        );
        let (line, message) = error_of("# file: /x\n# deltas: 0\n# deltas: 0\n");
        assert_eq!(
            (line, message.as_str()),
            (3, "a second '# deltas:' line (the first is line 2)")
        );
        let (line, message) = error_of("# file: /x\n850 1 2 16 0 0 0\n# deltas: 1\n");
        assert_eq!(line, 3, "{message}");
    }

    #[test]
    fn errors_quote_at_most_80_bytes_of_the_input() {
        assert_eq!(quote(b"zz"), "\"zz\"");
        let long = "é".repeat(1000);
        let q = quote(long.as_bytes());
        // 40 two-byte characters, then the length: never a cut character.
        assert_eq!(q, format!("{:?}... (2000 bytes)", "é".repeat(40)));
        let bad = format!("# file: /x\n{} 1 2 3 4 5 6\n", "z".repeat(10 << 20));
        let e = parse_deltas(&bad).expect_err("bad address");
        assert!(e.to_string().len() < 200, "{e}");
        assert!(e.to_string().ends_with("... (10485760 bytes)"), "{e}");
        let e = parse_deltas(&format!("# error: {}\n", "x".repeat(1 << 20))).expect_err("error");
        assert!(e.to_string().len() < 200, "{e}");
    }
}
