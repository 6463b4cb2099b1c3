//! Binutils' view of a file (`nm`, `objdump`, or cross ones such as
//! `aarch64-linux-gnu-nm`): independent of eim's own symbol and code
//! readers, so that tests compare with something eim did not compute.

use std::ops::Range;
use std::path::Path;
use std::process::Command;

/// `program`'s standard output then its standard error (`java -version`
/// writes to the latter); it must succeed.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// A defined symbol's address and size as `nm` (binutils' `nm`, or a
/// cross one such as `aarch64-linux-gnu-nm`) reads it: the dynamic table
/// first, then `.symtab`; a version suffix (`@@...`) is ignored.
pub fn nm_symbol(nm: &str, file: &Path, symbol: &str) -> Option<(u64, Option<u64>)> {
    for dynamic in [true, false] {
        let mut cmd = Command::new(nm);
        if dynamic {
            cmd.arg("-D");
        }
        let Ok(out) = cmd.args(["-S", "--defined-only"]).arg(file).output() else {
            continue;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (addr, size, name) = match f[..] {
                [addr, size, _, name] => (addr, Some(size), name),
                [addr, _, name] => (addr, None, name),
                _ => continue,
            };
            if name.split('@').next() == Some(symbol) {
                let hex = |s: &str| u64::from_str_radix(s, 16).expect("nm's hex");
                return Some((hex(addr), size.map(hex)));
            }
        }
    }
    None
}

/// `[address, address + size)` of a defined symbol, by `nm`.
pub fn nm_range_with(nm: &str, file: impl AsRef<Path>, symbol: &str) -> Range<u64> {
    let file = file.as_ref();
    match nm_symbol(nm, file, symbol) {
        Some((addr, Some(size))) => addr..addr + size,
        _ => panic!("{nm} finds no {symbol} with a size in {}", file.display()),
    }
}

/// `[address, address + size)` of a defined symbol, by the host's `nm`.
pub fn nm_range(file: impl AsRef<Path>, symbol: &str) -> Range<u64> {
    nm_range_with("nm", file, symbol)
}

/// The address of a defined symbol, by the host's `nm`.
pub fn nm_address(file: impl AsRef<Path>, symbol: &str) -> u64 {
    let file = file.as_ref();
    nm_symbol("nm", file, symbol)
        .unwrap_or_else(|| panic!("nm finds no {symbol} in {}", file.display()))
        .0
}

/// `objdump`'s instructions in `range` of `file`: (address, mnemonic,
/// operands) per line, AT&T syntax on x86-64, comments after `//`
/// (arm64) dropped and those after `#` (x86-64: RIP-relative targets)
/// kept.
pub fn objdump_lines(
    objdump: &str,
    file: impl AsRef<Path>,
    range: Range<u64>,
) -> Vec<(u64, String, String)> {
    let text = run(
        objdump,
        &[
            "-d",
            "--no-show-raw-insn",
            &format!("--start-address={:#x}", range.start),
            &format!("--stop-address={:#x}", range.end),
            &file.as_ref().to_string_lossy(),
        ],
    );
    text.lines()
        .filter_map(|line| {
            let (addr, rest) = line.split_once(":\t")?;
            let addr = u64::from_str_radix(addr.trim(), 16).ok()?;
            let rest = rest.split("//").next().unwrap_or("").trim();
            let (mnemonic, operands) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            Some((addr, mnemonic.to_owned(), operands.trim().to_owned()))
        })
        .collect()
}

/// The first jump (x86-64 `j*`) in `range` of `file` whose target lies
/// outside it: for Python's eval loop, a jump into its `.cold` part.
pub fn first_external_jump(file: impl AsRef<Path>, range: &Range<u64>) -> u64 {
    let file = file.as_ref();
    objdump_lines("objdump", file, range.clone())
        .into_iter()
        .filter(|(_, mnemonic, _)| mnemonic.starts_with('j'))
        .filter_map(|(_, _, operands)| {
            let target = operands.split_whitespace().next()?;
            u64::from_str_radix(target, 16).ok()
        })
        .find(|target| !range.contains(target))
        .unwrap_or_else(|| panic!("no jump out of {range:x?} in {}", file.display()))
}
