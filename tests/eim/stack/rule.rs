//! The comparison rule (truth.rs) on real gdb walks and real mappings,
//! with stand-ins for eim's output made from gdb's frames and then
//! changed: the rule accepts what it must and refuses the rest, so the
//! comparison tests can fail, before `eim stack` exists.

use crate::eim_stack::{EimFrame, EimThread};
use crate::gdb::{self, GdbFrame, Kind, ThreadTruth};
use crate::maps;
use crate::programs::{gdb_and_root, Program, Running};
use crate::truth::mismatch;

/// eim's output for gdb's first `n` physical frames, ending with `stop`.
fn stand_in(truth: &ThreadTruth, n: usize, stop: &str) -> EimThread {
    EimThread {
        tid: truth.tid,
        comm: "stand-in".into(),
        stop: stop.into(),
        stop_detail: None,
        frames: truth
            .physical()
            .iter()
            .take(n)
            .map(|f| EimFrame {
                pc: f.pc,
                file: None,
                file_id: None,
                address: None,
                symbol: None,
                system_name: None,
                symbol_offset: None,
                source_file: None,
                source_line: None,
                inlined: Vec::new(),
            })
            .collect(),
    }
}

/// gdb's walk of `program` and its mappings, while it is held.
fn walked(test: &str, program: Program) -> Option<(Vec<ThreadTruth>, Vec<maps::Mapping>)> {
    if !program.available() || !gdb_and_root(test) {
        return None;
    }
    let _one = crate::serial();
    let running = Running::start(program);
    let threads = gdb::truth(running.pid());
    let maps = maps::mappings(running.pid());
    Some((threads, maps))
}

fn thread<'a>(threads: &'a [ThreadTruth], focus: &str) -> &'a ThreadTruth {
    threads
        .iter()
        .find(|t| t.has(focus))
        .unwrap_or_else(|| panic!("no thread runs {focus}: {threads:#?}"))
}

fn accepts(truth: &ThreadTruth, eim: &EimThread, maps: &[maps::Mapping]) {
    if let Some(why) = mismatch(truth, eim, maps) {
        panic!(
            "refused: {why}\n{}",
            crate::truth::side_by_side(truth, Some(eim))
        );
    }
}

fn refuses(truth: &ThreadTruth, eim: &EimThread, maps: &[maps::Mapping], case: &str) {
    let why = mismatch(truth, eim, maps);
    eprintln!("{case}: {why:?}");
    assert!(
        why.is_some(),
        "{case}: accepted\n{}",
        crate::truth::side_by_side(truth, Some(eim))
    );
}

#[test]
fn the_rule_on_the_c_chain() {
    let Some((threads, maps)) = walked("the_rule_on_the_c_chain", Program::C("chain")) else {
        return;
    };
    let t = thread(&threads, "cmp");
    let m = t.physical().len();
    assert!(m > 8, "{t:#?}");

    accepts(t, &stand_in(t, m, "end"), &maps);

    let mut changed = stand_in(t, m, "end");
    changed.frames[3].pc += 1;
    refuses(t, &changed, &maps, "a PC off by one");
    refuses(
        t,
        &stand_in(t, m - 1, "end"),
        &maps,
        "end before gdb's outermost frame",
    );
    let mut longer = stand_in(t, m, "end");
    longer.frames.push(longer.frames[m - 1].clone());
    refuses(t, &longer, &maps, "a frame past gdb's outermost");
    refuses(
        t,
        &stand_in(t, m, "zero-pc"),
        &maps,
        "zero-pc where gdb read none",
    );
    refuses(t, &stand_in(t, 4, "budget"), &maps, "budget at 4 frames");
    refuses(t, &stand_in(t, 4, "read-error"), &maps, "read-error");
    // Every frame of the chain is in a file with CFI there, and in a file.
    for n in 1..m {
        refuses(
            t,
            &stand_in(t, n, "no-delta"),
            &maps,
            &format!("no-delta at frame {}", n - 1),
        );
        refuses(
            t,
            &stand_in(t, n, "invalid"),
            &maps,
            &format!("invalid at frame {}", n - 1),
        );
        refuses(
            t,
            &stand_in(t, n, "unknown-mapping"),
            &maps,
            &format!("unknown-mapping at frame {}", n - 1),
        );
    }

    // eim's file and address of a frame must be where the PC is.
    let frame = 1; // park, in the program itself
    let mapping = maps::file_mapping(&maps, t.physical()[frame].pc).expect("park is in a file");
    let program = mapping.file.clone().expect("a file");
    let mut named = stand_in(t, m, "end");
    named.frames[frame].file = Some(program.display().to_string());
    accepts(t, &named, &maps);
    named.frames[frame].file = Some("/usr/bin/true".into());
    refuses(t, &named, &maps, "the wrong file");
    named.frames[frame].file = Some(program.display().to_string());
    // A position-independent program's ELF address is not its PC.
    named.frames[frame].address = Some(t.physical()[frame].pc);
    refuses(t, &named, &maps, "the PC as the ELF address");
}

#[test]
fn the_rule_on_the_recursion_budget() {
    let Some((threads, maps)) = walked("the_rule_on_the_recursion_budget", Program::C("recurse"))
    else {
        return;
    };
    let t = thread(&threads, "recurse");
    let budget = eim_machine::unwind::MAX_FRAMES;
    assert!(t.physical().len() > budget, "deeper than the budget");
    accepts(t, &stand_in(t, budget, "budget"), &maps);
    refuses(
        t,
        &stand_in(t, budget - 1, "budget"),
        &maps,
        "budget a frame early",
    );
}

#[test]
fn the_rule_on_go_without_eh_frame() {
    let Some((threads, maps)) = walked("the_rule_on_go_without_eh_frame", Program::Go) else {
        return;
    };
    let t = thread(&threads, "main.inner");
    let m = t.physical().len();
    // gdb reads Go's .debug_frame; a Go executable has no .eh_frame, so
    // eim finding no delta in it is explained, wherever it happens.
    accepts(t, &stand_in(t, 3, "no-delta"), &maps);
    // The goroutine's outermost return address is 0.
    assert!(t.ends_at_zero(), "{t:#?}");
    accepts(t, &stand_in(t, m, "zero-pc"), &maps);
    accepts(t, &stand_in(t, m, "end"), &maps);
    refuses(
        t,
        &stand_in(t, 3, "unknown-mapping"),
        &maps,
        "unknown-mapping in the executable",
    );
}

#[test]
fn the_rule_on_a_pc_in_no_file() {
    let Some((threads, maps)) = walked("the_rule_on_a_pc_in_no_file", Program::C("chain")) else {
        return;
    };
    let real = thread(&threads, "cmp");
    // A frame in anonymous memory, as JIT code would be: the stack's own.
    let stack = maps
        .iter()
        .find(|m| m.file.is_none() && !m.executable)
        .expect("an anonymous mapping");
    let mut t = real.clone();
    t.frames.truncate(1);
    t.frames.push(GdbFrame {
        pc: stack.start + 16,
        kind: Kind::Normal,
        solib: None,
        name: None,
    });
    t.frames.push(real.frames[1].clone());
    accepts(&t, &stand_in(&t, 2, "unknown-mapping"), &maps);
    refuses(
        &t,
        &stand_in(&t, 2, "no-delta"),
        &maps,
        "no-delta in no file",
    );
    refuses(
        &t,
        &stand_in(&t, 1, "unknown-mapping"),
        &maps,
        "unknown-mapping in libc",
    );
}
