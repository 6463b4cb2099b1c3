//! Folded stacks: one line per distinct stack, `root;caller;callee N`, the
//! input of flame-graph tools (Brendan Gregg's flamegraph.pl, inferno).

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

/// Every stack of `aggregate`, one line each, sorted.
pub fn render(aggregate: &Aggregate) -> String {
    let mut lines: Vec<String> = aggregate
        .stacks
        .iter()
        .map(|(key, count)| format!("{} {count}", line(key)))
        .collect();
    lines.sort();
    let mut out = lines.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::NamedFrame;

    fn frame(name: &str) -> NamedFrame {
        NamedFrame {
            name: name.into(),
            file: None,
            address: 0,
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
}
