//! Function names as gdb prints them: Rust names by `rustc-demangle`
//! (legacy and v0, without the hash), C++ names by `cpp_demangle` (the
//! Itanium ABI, libiberty's spelling), anything else as it is.
//!
//! gdb prints a name from the symbol table in full (`park(char const*)`,
//! `int run_all<int>(std::vector<int> const&)`), but the function of a
//! frame its debug information describes without parameters or return
//! type (`shapes::Holder<int>::visit`), and an inlined function with its
//! parameters and without a return type: [`Form`] says which.

use cpp_demangle::{DemangleOptions, Symbol};

/// Longest name demangled; a longer one is shown raw (a hostile symbol
/// table must not make a name the size of the file).
const MAX_NAME: usize = 64 << 10;

/// How much of a C++ name to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Everything (a name from the symbol table).
    Full,
    /// Parameters, no return type (an inlined function).
    Inlined,
    /// Neither parameters nor return type (a function from debug info).
    Function,
}

/// `raw` as gdb shows it in `form`; `raw` itself if it is no mangled name
/// (a C name) or does not demangle.
pub fn demangle(raw: &str, form: Form) -> String {
    if raw.len() > MAX_NAME {
        return raw.to_owned();
    }
    // A `.cold`, `.isra.0` suffix: C++'s demangler prints it as a clone;
    // Rust's keeps it after the path.
    if let Some(rust) = rust(raw, form) {
        return rust;
    }
    if raw.starts_with("_Z") {
        if let Some(cpp) = cpp(raw, form) {
            return cpp;
        }
    }
    raw.to_owned()
}

/// A Rust name: a v0 name (`_R`), or a legacy one (`_ZN...17h<hash>E`)
/// whose hash the demangler can drop (a C++ name `_ZN3foo3barE` demangles
/// the same either way, so only the hash tells a legacy Rust name). gdb
/// keeps a legacy name's hash in a symbol table's name
/// (`stack_rust::park::h0123456789abcdef`), so [`Form::Full`] does too.
fn rust(raw: &str, form: Form) -> Option<String> {
    let d = rustc_demangle::try_demangle(raw).ok()?;
    let short = format!("{d:#}");
    let full = d.to_string();
    if !raw.starts_with("_R") && short == full {
        return None;
    }
    Some(if form == Form::Full { full } else { short })
}

fn cpp(raw: &str, form: Form) -> Option<String> {
    let symbol = Symbol::new(raw).ok()?;
    let options = match form {
        Form::Full => DemangleOptions::new(),
        Form::Inlined => DemangleOptions::new().no_return_type(),
        Form::Function => DemangleOptions::new().no_params().no_return_type(),
    };
    symbol.demangle(&options).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_gdb_prints_them() {
        let cases = [
            ("main", Form::Full, "main"),
            (
                "__libc_start_call_main",
                Form::Function,
                "__libc_start_call_main",
            ),
            ("_ZL4parkPKc", Form::Full, "park(char const*)"),
            ("_ZL4parkPKc", Form::Function, "park"),
            (
                "_ZL4parkPKc.constprop.0",
                Form::Full,
                "park(char const*) [clone .constprop.0]",
            ),
            (
                "_ZN6shapes6HolderIiE5visitEi",
                Form::Full,
                "shapes::Holder<int>::visit(int)",
            ),
            (
                "_ZN6shapes6HolderIiE5visitEi",
                Form::Function,
                "shapes::Holder<int>::visit",
            ),
            (
                "_Z7run_allIiET_RKSt6vectorIS0_SaIS0_EE",
                Form::Full,
                "int run_all<int>(std::vector<int, std::allocator<int> > const&)",
            ),
            (
                "_Z7run_allIiET_RKSt6vectorIS0_SaIS0_EE",
                Form::Function,
                "run_all<int>",
            ),
            (
                "_ZN10stack_rust4park17h0123456789abcdefE",
                Form::Full,
                "stack_rust::park::h0123456789abcdef",
            ),
            (
                "_ZN10stack_rust4park17h0123456789abcdefE",
                Form::Function,
                "stack_rust::park",
            ),
            (
                "_ZN10stack_rust9visit_all28_$u7b$$u7b$closure$u7d$$u7d$17h0123456789abcdefE",
                Form::Inlined,
                "stack_rust::visit_all::{{closure}}",
            ),
            ("_ZN3foo3barE", Form::Full, "foo::bar"),
            ("_Znot a name", Form::Full, "_Znot a name"),
        ];
        for (raw, form, want) in cases {
            assert_eq!(demangle(raw, form), want, "{raw} {form:?}");
        }
    }

    #[test]
    fn hostile_names_come_back_raw() {
        let deep = format!("_Z{}", "PP".repeat(40_000));
        assert_eq!(demangle(&deep, Form::Full), deep);
        let nested = format!("_ZN{}E", "1a".repeat(10_000));
        let _ = demangle(&nested, Form::Full);
    }
}
