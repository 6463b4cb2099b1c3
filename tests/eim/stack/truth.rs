//! The comparison of `eim stack` with gdb, thread by thread.
//!
//! The rule. For a thread, let T be gdb's physical frames (inline and
//! tail-call frames dropped: they come from debug info and are not on the
//! stack; a final frame at PC 0 dropped) and E eim's frames, innermost
//! first, with E's stop reason S.
//!
//! 1. Frame for frame: |E| <= |T| and E[i].pc == T[i].pc for every i <
//!    |E|. Where eim names the file of a frame it is the file mapped at
//!    that PC, and where it gives an address it is the PC's ELF address in
//!    that file (from the file's program headers).
//! 2. S explains where E ends (E's last frame is the frame the unwinder
//!    stopped at, bpf/unwind.h):
//!    * `end`: |E| == |T|: both walks reach the same outermost frame
//!      (`_start`, `clone3`, a thread's start); or |E| < |T| and gdb
//!      names T[|E|-1] one of the Go runtime functions that end a
//!      goroutine's or an M's stack (`runtime.mstart`, `runtime.goexit`,
//!      `runtime.mcall`, `runtime.systemstack`: spec 5.6, STOP by
//!      design), where gdb goes on into `runtime.clone`'s frame.
//!    * `zero-pc`: |E| == |T| and gdb, too, read a PC of 0 after it.
//!    * `budget`: |E| == MAX_FRAMES and |T| > |E|.
//!    * `unknown-mapping`: T[|E|-1].pc is in no executable file mapping
//!      (JIT code, anonymous memory).
//!    * `no-delta`, `invalid`: T[|E|-1].pc is in an executable file
//!      mapping, and at its lookup address (pc - 1 for a return address,
//!      both pc and pc - 1 for the innermost frame, pc for the frame a
//!      signal interrupted) the file's `.eh_frame` has no FDE, or its CFA
//!      is neither register plus offset nor in a PLT section nor the
//!      signal trampoline (which eim handles by command).
//!    * any other stop (`read-error`, `unsupported`, `lr-mid-trace`,
//!      `no-regs`) explains nothing on these x86-64 programs.
//!
//! 3. Names (issue 31): for every frame of E where gdb prints a function
//!    name, eim prints the same (gdb's demangled form), and gdb's inline
//!    frames above it are eim's inlined functions of that frame, in order
//!    ([`names_mismatch`]).
//!
//! Only threads gdb saw the same before and after eim ran are compared
//! (a thread that moved has no single truth); the thread the test is
//! about must be one of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use eim_machine::unwind::MAX_FRAMES;

use crate::cfi;
use crate::eim_stack::{EimStacks, EimThread};
use crate::gdb::{GdbFrame, Kind, ThreadTruth};
use crate::maps::{self, Mapping};

/// Why `eim`'s stack of one thread is not gdb's.
pub fn mismatch(gdb: &ThreadTruth, eim: &EimThread, maps: &[Mapping]) -> Option<String> {
    let t = gdb.physical();
    let e = &eim.frames;
    if e.len() > t.len() {
        return Some(format!(
            "eim has {} frames, gdb {}: eim went past gdb's outermost frame",
            e.len(),
            t.len()
        ));
    }
    for (i, (ef, tf)) in e.iter().zip(&t).enumerate() {
        if ef.pc != tf.pc {
            return Some(format!("frame {i}: eim {:#x}, gdb {:#x}", ef.pc, tf.pc));
        }
        if let Some(why) = attribution(i, ef, maps) {
            return Some(why);
        }
    }
    explained(&t, gdb, eim, maps).err()
}

/// gdb's frames grouped as eim reports them: each physical frame with the
/// inline frames above it (innermost first); tail-call frames dropped.
fn grouped(gdb: &ThreadTruth) -> Vec<(Vec<&GdbFrame>, &GdbFrame)> {
    let mut out = Vec::new();
    let mut inline = Vec::new();
    for f in &gdb.frames {
        match f.kind {
            Kind::Inline => inline.push(f),
            Kind::TailCall => {}
            _ => out.push((std::mem::take(&mut inline), f)),
        }
    }
    out
}

/// The rule's point 3: how many names gdb gave for eim's frames, and each
/// one eim does not print the same.
pub fn names_mismatch(gdb: &ThreadTruth, eim: &EimThread) -> (usize, Vec<String>) {
    let mut compared = 0;
    let mut differ = Vec::new();
    for (i, ((inline, physical), ours)) in grouped(gdb).iter().zip(&eim.frames).enumerate() {
        if let Some(want) = &physical.name {
            compared += 1;
            if ours.symbol.as_deref() != Some(want.as_str()) {
                differ.push(format!(
                    "frame {i}: gdb names it {want}, eim {}",
                    ours.symbol.as_deref().unwrap_or("??")
                ));
            }
        }
        let theirs: Vec<&str> = inline
            .iter()
            .map(|f| f.name.as_deref().unwrap_or("??"))
            .collect();
        let mine: Vec<&str> = ours.inlined.iter().map(|f| f.name.as_str()).collect();
        compared += theirs.len();
        if theirs != mine {
            differ.push(format!(
                "frame {i}: gdb's inline frames {theirs:?}, eim's {mine:?}"
            ));
        }
    }
    (compared, differ)
}

/// Whether eim's file and address of frame `i` are where the PC is.
fn attribution(i: usize, frame: &crate::eim_stack::EimFrame, maps: &[Mapping]) -> Option<String> {
    let file = frame.file.as_ref()?;
    // The vDSO has no file: eim names it `[vdso]`, where /proc does.
    if file == "[vdso]" {
        return match maps::find(maps, frame.pc) {
            Some(m) if m.vdso => None,
            _ => Some(format!(
                "frame {i}: eim says [vdso], but {:#x} is not in the [vdso] mapping",
                frame.pc
            )),
        };
    }
    let Some(mapping) = maps::file_mapping(maps, frame.pc) else {
        return Some(format!(
            "frame {i}: eim says {file}, but {:#x} is in no executable file mapping",
            frame.pc
        ));
    };
    let mapped = mapping.file.as_deref().unwrap_or(Path::new(""));
    if !same_file(Path::new(file), mapped) {
        return Some(format!(
            "frame {i}: eim says {file}, /proc maps {:#x} from {}",
            frame.pc,
            mapped.display()
        ));
    }
    let want = maps::elf_address(mapping, frame.pc);
    match (frame.address, want) {
        (Some(got), Some(want)) if got != want => Some(format!(
            "frame {i}: eim's address {got:#x}, the program headers say {want:#x}"
        )),
        _ => None,
    }
}

/// The Go runtime functions eim's `.gopclntab` extraction ends a stack at
/// (STOP), by gdb's name of them (ABI wrappers carry a suffix).
fn go_stack_top(name: &str) -> bool {
    let base = name.split('.').take(2).collect::<Vec<_>>().join(".");
    [
        "runtime.mstart",
        "runtime.goexit",
        "runtime.mcall",
        "runtime.systemstack",
    ]
    .contains(&base.as_str())
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// Whether eim's stop reason explains where its stack ends (the rule's
/// point 2).
fn explained(
    t: &[GdbFrame],
    gdb: &ThreadTruth,
    eim: &EimThread,
    maps: &[Mapping],
) -> Result<(), String> {
    let n = eim.frames.len();
    let m = t.len();
    let fail = |why: String| {
        Err(format!(
            "eim stopped with {} after {n} of gdb's {m} frames: {why}",
            eim.stop
        ))
    };
    match eim.stop.as_str() {
        "end" if n == m => Ok(()),
        "end" if n > 0 && t[n - 1].name.as_deref().is_some_and(go_stack_top) => Ok(()),
        "end" => fail("a STOP rule before gdb's outermost frame".into()),
        "zero-pc" if n == m && gdb.ends_at_zero() => Ok(()),
        "zero-pc" => fail("gdb did not read a PC of 0 there".into()),
        "budget" if n == MAX_FRAMES && m > n => Ok(()),
        "budget" => fail(format!(
            "the budget is {MAX_FRAMES} frames and gdb has no more"
        )),
        "unknown-mapping" | "no-delta" | "invalid" if n == 0 => {
            fail("the frame it stopped at is not recorded".into())
        }
        "unknown-mapping" => match maps::file_mapping(maps, t[n - 1].pc) {
            None => Ok(()),
            Some(m) => fail(format!(
                "{:#x} is in {}",
                t[n - 1].pc,
                m.file.as_deref().unwrap_or(Path::new("?")).display()
            )),
        },
        "no-delta" | "invalid" => no_cfi_there(t, n - 1, maps).map_err(|why| {
            format!(
                "eim stopped with {} at frame {} (of gdb's {m}): {why}",
                eim.stop,
                n - 1
            )
        }),
        other => fail(format!("{other} is no reason on these programs")),
    }
}

/// Ok when frame `k`'s file has no CFI eim can use at its lookup address.
fn no_cfi_there(t: &[GdbFrame], k: usize, maps: &[Mapping]) -> Result<(), String> {
    let frame = &t[k];
    let pc = frame.pc;
    let Some(mapping) = maps::file_mapping(maps, pc) else {
        return Err(format!(
            "{pc:#x} is in no executable file mapping (unknown-mapping, then)"
        ));
    };
    let file = mapping.file.as_deref().unwrap_or(Path::new("?"));
    if frame.kind == Kind::SigTramp {
        return Err(format!(
            "{pc:#x} is the signal trampoline, handled by command"
        ));
    }
    let lookups: Vec<u64> = if k == 0 {
        vec![pc, pc.saturating_sub(1)]
    } else if t[k - 1].kind == Kind::SigTramp {
        vec![pc]
    } else {
        vec![pc.saturating_sub(1)]
    };
    for lookup in lookups {
        let Some(address) = maps::elf_address(mapping, lookup) else {
            return Err(format!(
                "{lookup:#x} is in no segment of {}",
                file.display()
            ));
        };
        let cfi = cfi::at(file, address);
        if cfi == cfi::Cfi::None {
            continue;
        }
        let in_plt = maps::section_of(file, address).is_some_and(|s| s.contains("plt"));
        if cfi.cfa_is_register_offset() || in_plt {
            return Err(format!(
                "{} has CFI at {address:#x}: {cfi:?}{}",
                file.display(),
                if in_plt { " (PLT)" } else { "" }
            ));
        }
    }
    Ok(())
}

/// The two stacks next to each other, one frame a line.
pub fn side_by_side(gdb: &ThreadTruth, eim: Option<&EimThread>) -> String {
    let t = gdb.physical();
    let empty = Vec::new();
    let e = eim.map_or(&empty, |e| &e.frames);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "thread {} {}: gdb stopped: {} | eim stopped: {}",
        gdb.tid,
        eim.map_or("", |e| e.comm.as_str()),
        gdb.stop,
        eim.map_or("(no such thread)".to_string(), |e| match &e.stop_detail {
            Some(d) => format!("{} ({d})", e.stop),
            None => e.stop.clone(),
        })
    );
    for i in 0..t.len().max(e.len()) {
        let g = t.get(i).map_or(String::new(), |f| f.to_string());
        let (mark, ours) = match (t.get(i), e.get(i)) {
            (Some(tf), Some(ef)) => (if tf.pc == ef.pc { '=' } else { '!' }, describe(ef)),
            (None, Some(ef)) => ('!', describe(ef)),
            _ => (' ', String::new()),
        };
        let _ = writeln!(out, "{i:>4} {mark} {g:<60} | {ours}");
    }
    out
}

fn describe(f: &crate::eim_stack::EimFrame) -> String {
    let file = f
        .file
        .as_deref()
        .and_then(|p| Path::new(p).file_name())
        .map_or("?".into(), |n| n.to_string_lossy().into_owned());
    match (&f.symbol, f.symbol_offset) {
        (Some(s), Some(o)) => format!("{:#x} {file} {s}+{o:#x}", f.pc),
        (Some(s), None) => format!("{:#x} {file} {s}", f.pc),
        _ => format!("{:#x} {file}", f.pc),
    }
}

/// Checks every thread gdb saw the same before and after eim ran against
/// eim's stack of it; the thread holding a frame named `focus` must be
/// one of them. Panics with both stacks of every failing thread.
pub fn assert_matches(
    before: &[ThreadTruth],
    after: &[ThreadTruth],
    eim: &EimStacks,
    maps: &[Mapping],
    focus: &str,
    names_checked: bool,
) {
    let after: BTreeMap<u32, &ThreadTruth> = after.iter().map(|t| (t.tid, t)).collect();
    let ours: BTreeMap<u32, &EimThread> = eim.threads.iter().map(|t| (t.tid, t)).collect();
    let focused: Vec<u32> = before
        .iter()
        .filter(|t| t.has(focus))
        .map(|t| t.tid)
        .collect();
    assert_eq!(
        focused.len(),
        1,
        "one thread of gdb's runs {focus}: {before:#?}"
    );
    let mut failures = Vec::new();
    let mut compared = 0;
    let (mut names, mut names_differ) = (0, 0);
    for truth in before {
        let stable = after
            .get(&truth.tid)
            .is_some_and(|a| a.pcs() == truth.pcs());
        if !stable {
            assert_ne!(
                truth.tid, focused[0],
                "the thread running {focus} moved while eim ran"
            );
            eprintln!(
                "thread {} moved between gdb's two walks: not compared",
                truth.tid
            );
            continue;
        }
        compared += 1;
        let eim_thread = ours.get(&truth.tid).copied();
        let table = side_by_side(truth, eim_thread);
        eprintln!("{table}");
        let why = match eim_thread {
            None => Some("eim has no such thread".to_string()),
            Some(e) => mismatch(truth, e, maps),
        };
        if let Some(why) = why {
            failures.push(format!("thread {}: {why}\n{table}", truth.tid));
        }
        if let Some(e) = eim_thread {
            let (n, differ) = names_mismatch(truth, e);
            names += n;
            names_differ += differ.len();
            for why in differ {
                if names_checked {
                    failures.push(format!("thread {}: {why}", truth.tid));
                } else {
                    eprintln!("thread {}: names not checked: {why}", truth.tid);
                }
            }
        }
    }
    eprintln!(
        "names: eim prints gdb's name for {} of the {names} frames gdb names",
        names - names_differ
    );
    assert!(compared > 0, "no thread was compared");
    assert!(
        failures.is_empty(),
        "eim's stacks are not gdb's:\n{}",
        failures.join("\n")
    );
}
