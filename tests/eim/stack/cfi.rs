//! What a file's `.eh_frame` says at an address, as binutils' `readelf
//! --debug-dump=frames-interp` decodes it (independent of eim's parser).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// The CFI at one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cfi {
    /// No FDE of `.eh_frame` covers the address: no CFI there.
    None,
    /// The row in force: readelf's CFA column (`rsp+8`, `rbp+16`, `exp`).
    Row { fde: (u64, u64), cfa: String },
}

impl Cfi {
    /// Whether the CFA is register plus offset, the only form a
    /// table-driven unwinder expresses in general (an expression is
    /// handled only in the PLT and the signal trampoline, by command).
    pub fn cfa_is_register_offset(&self) -> bool {
        match self {
            Cfi::None => false,
            Cfi::Row { cfa, .. } => cfa
                .split_once('+')
                .is_some_and(|(reg, off)| reg.starts_with('r') && off.parse::<u64>().is_ok()),
        }
    }
}

/// The `.eh_frame` CFI of `file` at ELF address `address`.
pub fn at(file: &Path, address: u64) -> Cfi {
    let out = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("readelf {}: {e}", file.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    lookup(&text, address)
}

/// Finds the row in force at `address` in readelf's decoding of
/// `.eh_frame` (the sections after it are not read: eim uses only
/// `.eh_frame`).
fn lookup(text: &str, address: u64) -> Cfi {
    // A CIE's initial row applies to an FDE that prints no row of its own.
    let mut cie_rows: BTreeMap<String, String> = BTreeMap::new();
    let mut in_eh_frame = false;
    // The entry being read: a CIE's offset, or an FDE's range and CIE.
    let mut cie: Option<String> = None;
    let mut fde: Option<((u64, u64), String)> = None;
    let mut best: Option<(u64, String)> = None;
    let finish = |fde: &Option<((u64, u64), String)>,
                  best: &Option<(u64, String)>,
                  cie_rows: &BTreeMap<String, String>|
     -> Option<Cfi> {
        let ((lo, hi), of_cie) = fde.as_ref()?;
        if !(*lo <= address && address < *hi) {
            return None;
        }
        let cfa = match best {
            Some((_, cfa)) => cfa.clone(),
            None => cie_rows.get(of_cie).cloned().unwrap_or_default(),
        };
        Some(Cfi::Row {
            fde: (*lo, *hi),
            cfa,
        })
    };
    for line in text.lines() {
        if let Some(section) = line.strip_prefix("Contents of the ") {
            if let Some(found) = finish(&fde, &best, &cie_rows) {
                return found;
            }
            fde = None;
            in_eh_frame = section.starts_with(".eh_frame section");
            continue;
        }
        if !in_eh_frame {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 4 && (fields[3] == "CIE" || fields[3] == "FDE") {
            if let Some(found) = finish(&fde, &best, &cie_rows) {
                return found;
            }
            best = None;
            if fields[3] == "CIE" {
                cie = Some(fields[0].to_string());
                fde = None;
            } else {
                cie = None;
                let of_cie = fields
                    .iter()
                    .find_map(|f| f.strip_prefix("cie="))
                    .unwrap_or_default()
                    .to_string();
                let range = fields
                    .iter()
                    .find_map(|f| f.strip_prefix("pc="))
                    .and_then(|r| r.split_once(".."))
                    .and_then(|(lo, hi)| {
                        Some((
                            u64::from_str_radix(lo, 16).ok()?,
                            u64::from_str_radix(hi, 16).ok()?,
                        ))
                    });
                fde = range.map(|r| (r, of_cie));
            }
            continue;
        }
        // A row: LOC (an address, 16 digits on x86-64) CFA and the
        // registers' rules; not the section's "ZERO terminator".
        let (Some(loc), Some(cfa)) = (fields.first(), fields.get(1)) else {
            continue;
        };
        if loc.len() != 16 {
            continue;
        }
        let Ok(loc) = u64::from_str_radix(loc, 16) else {
            continue;
        };
        if let Some(cie) = &cie {
            cie_rows
                .entry(cie.clone())
                .or_insert_with(|| cfa.to_string());
        } else if loc <= address {
            best = Some((loc, cfa.to_string()));
        }
    }
    finish(&fde, &best, &cie_rows).unwrap_or(Cfi::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Contents of the .eh_frame section:

00000000 0000000000000014 00000000 CIE \"zR\" cf=1 df=-8 ra=16
   LOC           CFA      ra
0000000000000000 rsp+8    u

00000018 0000000000000014 0000001c FDE cie=00000000 pc=00000000000011b0..00000000000011d2

00000048 0000000000000024 0000001c FDE cie=00000000 pc=0000000000001020..00000000000010f0
   LOC           CFA      ra
0000000000001020 rsp+16   c-8
0000000000001026 rsp+24   c-8
0000000000001030 exp      c-8

000001e4 ZERO terminator

Contents of the .debug_frame section:

00000014 0000000000000024 00000000 FDE cie=00000000 pc=0000000000401000..0000000000401059
   LOC           CFA      ra
0000000000401000 rsp+8    c-8
";

    fn cfa(address: u64) -> Option<String> {
        match lookup(SAMPLE, address) {
            Cfi::None => None,
            Cfi::Row { cfa, .. } => Some(cfa),
        }
    }

    #[test]
    fn rows_are_found_in_eh_frame_only() {
        assert_eq!(cfa(0x11b0).as_deref(), Some("rsp+8"), "the CIE's row");
        assert_eq!(cfa(0x1025).as_deref(), Some("rsp+16"));
        assert_eq!(cfa(0x1026).as_deref(), Some("rsp+24"));
        assert_eq!(cfa(0x10ef).as_deref(), Some("exp"));
        assert_eq!(cfa(0x10f0), None, "past the FDE");
        assert_eq!(cfa(0x1000), None, "before every FDE");
        assert_eq!(cfa(0x401000), None, ".debug_frame is not read");
        assert!(lookup(SAMPLE, 0x1020).cfa_is_register_offset());
        assert!(!lookup(SAMPLE, 0x1030).cfa_is_register_offset());
    }
}
