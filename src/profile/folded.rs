//! Folded stacks: one line per distinct stack as printed,
//! `root;caller;callee N`, the input of flame-graph tools (Brendan Gregg's
//! flamegraph.pl, inferno).

use std::collections::BTreeMap;

use super::{Aggregate, StackKey};

/// A name as one field of a folded line: `;` separates frames and the
/// last space the count, so neither may appear inside a name.
fn field(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_whitespace() || c.is_control() => '_',
            c => c,
        })
        .collect()
}

/// One stack's line without its count: the process name, a marker for a
/// walk that stopped early (so such stacks group apart instead of posing
/// as complete ones), then the frames from the outermost.
pub fn line(key: &StackKey) -> String {
    let mut out = field(&key.comm);
    if let Some(why) = key.incomplete {
        out.push_str(";[incomplete:");
        out.push_str(why);
        out.push(']');
    }
    for f in &key.frames {
        out.push(';');
        out.push_str(&field(&f.name));
    }
    out
}

/// Every stack of `aggregate`, one line per distinct printed stack with
/// the counts of its samples summed, sorted. The aggregate keeps stacks
/// apart by address (pprof's locations need them); two stacks that differ
/// only there (two call sites of one function, one library at different
/// addresses in two processes) print the same and are one line here, as a
/// flame-graph tool expects.
pub fn render(aggregate: &Aggregate) -> String {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for (key, count) in &aggregate.stacks {
        let n = lines.entry(line(key)).or_default();
        *n = n.saturating_add(*count);
    }
    let mut out = String::new();
    for (stack, count) in &lines {
        out.push_str(stack);
        out.push(' ');
        out.push_str(&count.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::NamedFrame;

    fn frame(name: &str) -> NamedFrame {
        at(name, 0)
    }

    fn at(name: &str, address: u64) -> NamedFrame {
        NamedFrame {
            name: name.into(),
            system_name: None,
            source: None,
            mapping: None,
            pc: address,
            address,
        }
    }

    #[test]
    fn lines_run_from_the_root_and_names_cannot_break_the_format() {
        let mut a = Aggregate::default();
        a.stacks.insert(
            StackKey {
                comm: "my prog".into(),
                frames: vec![
                    frame("main"),
                    frame("a;b"),
                    frame("operator new(unsigned long)"),
                ],
                incomplete: None,
            },
            3,
        );
        a.stacks.insert(
            StackKey {
                comm: "x".into(),
                frames: vec![frame("f")],
                incomplete: Some("no-delta"),
            },
            1,
        );
        assert_eq!(
            render(&a),
            "my_prog;main;a:b;operator_new(unsigned_long) 3\nx;[incomplete:no-delta];f 1\n"
        );
    }

    #[test]
    fn stacks_that_print_the_same_are_one_line_with_their_counts_summed() {
        let mut a = Aggregate::default();
        // `hot` sampled at three addresses under `work`, called from two
        // call sites of `main`: different keys, one printed stack.
        for (main_at, hot_at, count) in [(0x10, 0x40, 2), (0x10, 0x44, 218), (0x18, 0x48, 28)] {
            a.stacks.insert(
                StackKey {
                    comm: "p".into(),
                    frames: vec![at("main", main_at), at("work", 0x30), at("hot", hot_at)],
                    incomplete: None,
                },
                count,
            );
        }
        a.stacks.insert(
            StackKey {
                comm: "p".into(),
                frames: vec![at("main", 0x10), at("work", 0x30)],
                incomplete: None,
            },
            5,
        );
        assert_eq!(render(&a), "p;main;work 5\np;main;work;hot 248\n");
    }
}
