//! PLT stubs: every stub of chain.c's PLT (its calls into libc), named by
//! eim's symbolizer and by gdb's `info symbol` on the same file; gdb says
//! `name@plt`, eim must too.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use eim::stack::symbols::FileSymbols;
use object::{Object as _, ObjectSection as _};

use crate::gdb::run_with_timeout;
use crate::programs::{command_of, Program};

/// gdb's `info symbol` of each address in `file`: its name, if it has one.
fn gdb_names(file: &Path, addresses: &[u64]) -> Vec<Option<String>> {
    let mut gdb = Command::new("gdb");
    gdb.args(["-batch", "-nx", "-iex", "set debuginfod enabled off"]);
    for a in addresses {
        gdb.arg("-ex").arg(format!("info symbol {a:#x}"));
    }
    gdb.arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (_, stdout, _) = run_with_timeout(gdb, Duration::from_secs(60), "gdb info symbol");
    // One line per address: "NAME in section S" or "No symbol matches ...".
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), addresses.len(), "gdb said:\n{stdout}");
    lines
        .iter()
        .map(|l| {
            l.split_once(" in section ")
                .map(|(name, _)| name.trim().to_string())
        })
        .collect()
}

#[test]
fn plt_stubs_are_named_as_gdb_names_them() {
    if !Program::C("chain").available() || !eim_test_support::skip::tools_present(&["gdb"]) {
        return;
    }
    let exe = command_of(Program::C("chain")).get_program().to_owned();
    let exe = Path::new(&exe);
    let data = std::fs::read(exe).expect("read chain");
    let elf = object::File::parse(&*data).expect("ELF");
    // Every 16-byte stub of the sections calls go through.
    let mut addresses = Vec::new();
    for name in [".plt", ".plt.sec"] {
        if let Some(s) = elf.section_by_name(name) {
            addresses.extend((0..s.size() / 16).map(|i| s.address() + 16 * i));
        }
    }
    let symbols = FileSymbols::parse(&exe.to_string_lossy(), &data).expect("symbols");
    let theirs = gdb_names(exe, &addresses);
    let mut named = Vec::new();
    for (a, want) in addresses.iter().zip(&theirs) {
        let Some(want) = want.as_deref() else {
            continue;
        };
        // gdb adds " + OFFSET" inside a symbol; a stub's start has none.
        let want = want.split(" + ").next().unwrap_or(want);
        if !want.ends_with("@plt") {
            continue;
        }
        let ours = symbols.symbolize(*a).map(|s| s.function);
        assert_eq!(
            ours.as_ref().map(|f| f.name.as_str()),
            Some(want),
            "{a:#x}: gdb names it {want}"
        );
        assert_eq!(ours.map(|f| f.system_name), Some(want.to_string()));
        named.push(want.to_string());
    }
    eprintln!("PLT stubs named as gdb names them: {named:?}");
    for called in ["qsort@plt", "pause@plt", "read@plt"] {
        assert!(named.iter().any(|n| n == called), "{called} in {named:?}");
    }
}
