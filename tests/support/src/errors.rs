//! Each cause said once: an error as the CLI prints it (anyhow's `{:#}`:
//! the message, then every `source()`'s, joined by `": "`), and the check
//! that no cause's text appears twice in it. eim's convention
//! (`eim_core::error`) is that an error prints its cause and does not also
//! return it from `source()`; a type that does both reads
//! `File exists (os error 17): File exists (os error 17)`.

use std::error::Error;

/// The deepest chain rendered: a `source()` that cycles is cut here.
const MAX_DEPTH: usize = 32;

/// The texts of `e` and of each cause under it, outermost first.
pub fn chain_texts(e: &(dyn Error + 'static)) -> Vec<String> {
    let mut texts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(cause) = next {
        if texts.len() == MAX_DEPTH {
            break;
        }
        texts.push(cause.to_string());
        next = cause.source();
    }
    texts
}

/// `e` as the CLI prints it: `format!("{:#}", anyhow::Error::from(e))`.
pub fn cli_text(e: &(dyn Error + 'static)) -> String {
    chain_texts(e).join(": ")
}

/// Why `e` says a cause twice, if it does: a cause whose text the text
/// above it already holds, or a `": "`-separated segment of the printed
/// line that repeats an earlier one.
pub fn repeated_cause(e: &(dyn Error + 'static)) -> Option<String> {
    let texts = chain_texts(e);
    for (depth, text) in texts.iter().enumerate().skip(1) {
        let above = texts[..depth].join(": ");
        if !text.is_empty() && above.contains(text.as_str()) {
            return Some(format!(
                "cause {depth} ({text:?}) is already printed above it: {}",
                cli_text(e)
            ));
        }
    }
    repeated_segment(&cli_text(e))
}

/// Why a printed error line (a CLI's stderr) says something twice, if it
/// does: a `": "`-separated segment that repeats an earlier one.
pub fn repeated_segment(line: &str) -> Option<String> {
    let segments: Vec<&str> = line.split(": ").collect();
    for (i, segment) in segments.iter().enumerate() {
        if segments[..i].contains(segment) {
            return Some(format!("{segment:?} is printed twice: {line}"));
        }
    }
    None
}

/// Panics, naming the repeat and the whole line, if `e` says a cause twice.
#[track_caller]
pub fn assert_each_cause_once(e: &(dyn Error + 'static)) {
    if let Some(why) = repeated_cause(e) {
        panic!("{why}");
    }
}

/// eim's convention whole: `e` prints its cause and does not return it
/// from `source()` too, and says no cause twice.
#[track_caller]
pub fn assert_eims_convention(e: &(dyn Error + 'static)) {
    assert!(
        e.source().is_none(),
        "{e}: returns its cause from source() too"
    );
    assert_each_cause_once(e);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;
    use std::io;

    /// An error that prints its cause and also returns it as the source:
    /// what the check must catch.
    #[derive(Debug)]
    struct Both(io::Error);

    impl fmt::Display for Both {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "creating /x: {}", self.0)
        }
    }

    impl Error for Both {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    /// The same with the cause only printed.
    #[derive(Debug)]
    struct Printed(io::Error);

    impl fmt::Display for Printed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "creating /x: {}", self.0)
        }
    }

    impl Error for Printed {}

    /// A message that repeats its cause by itself (`{e}: {e}`).
    #[derive(Debug)]
    struct Twice;

    impl fmt::Display for Twice {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("creating /x: File exists (os error 17): File exists (os error 17)")
        }
    }

    impl Error for Twice {}

    #[test]
    fn a_cause_printed_and_returned_is_caught() {
        let e = Both(io::Error::from_raw_os_error(17));
        assert_eq!(
            cli_text(&e),
            "creating /x: File exists (os error 17): File exists (os error 17)"
        );
        let why = repeated_cause(&e).expect("a repeat");
        assert!(
            why.starts_with("cause 1 (\"File exists (os error 17)\")"),
            "{why}"
        );
        assert!(repeated_cause(&Twice).is_some());
    }

    #[test]
    fn a_cause_said_once_passes() {
        let e = Printed(io::Error::from_raw_os_error(17));
        assert_eq!(cli_text(&e), "creating /x: File exists (os error 17)");
        assert_eq!(repeated_cause(&e), None);
        assert_each_cause_once(&e);
    }
}
