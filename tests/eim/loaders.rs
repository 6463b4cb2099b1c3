//! The interpreter loaders on real Debian binaries: each is detected with
//! the version the interpreter itself reports and the ranges `nm` /
//! `objdump` give (independent of eim's symbol reader), files of other
//! interpreters and plain C programs are not, names that only look alike are
//! not, and hostile files give errors, never panics.
//!
//! A missing binary is skipped with a loud message, unless
//! `EIM_REQUIRE_INTERPRETERS` is set (`tests/run` sets it after installing
//! them): then it is a failure.

mod common;
use common::{
    assert_hotspot_vm_structs, data_of, find_in, loaded, loaders, matches_of, ruby_library,
};
use eim_test_support::skip::present;
use eim_test_support::skip::{tools_present, BINUTILS};
use eim_test_support::tools::{first_external_jump, nm_address, nm_range, run};

use std::path::{Path, PathBuf};

use eim::elf::Elf;
use eim::files::loaders::{inspect, ALL_TRACERS};
use eim::interp::python::PythonData;
use eim::interp::v8::V8Data;
use eim::interp::{self, LoaderError, LoaderInfo};
use eim::{FileId, Tracers};
use eim_test_support::data::oracle_bin;
use eim_test_support::rng::XorShift;

const PYTHON: &str = "/usr/bin/python3.11";
const PERL_LIB: &str = "/usr/lib/x86_64-linux-gnu/libperl.so.5.36";
const PERL: &str = "/usr/bin/perl";
const PHP: &str = "/usr/bin/php8.2";
const RUBY_LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const JVM: &str = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so";
const JAVA: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java";
const NODE: &str = "/usr/bin/node";

fn go_binary() -> PathBuf {
    oracle_bin().join("gocorpus-go1.23-amd64")
}

fn c_binary() -> PathBuf {
    oracle_bin().join("ccorpus-x86_64-O2")
}

#[test]
fn python_3_11() {
    if !tools_present(BINUTILS) {
        return;
    }
    if !present(Path::new(PYTHON)) {
        return;
    }
    let matches = matches_of(PYTHON);
    assert_eq!(loaders(&matches), ["python"]);
    let l = loaded(&matches, "python");
    let want = run(
        PYTHON,
        &[
            "-c",
            "import sys; print('%d.%d.%d' % sys.version_info[:3], end='')",
        ],
    );
    assert_eq!(l.data.version(), want);
    let o = l.offsets.as_ref().expect("ranges");
    assert_eq!(o.program, 4);
    let eval = nm_range(PYTHON, "_PyEval_EvalFrameDefault");
    assert_eq!(o.first, eval);
    // The cold part: objdump's first jump out of the loop lands in it.
    let cold = o.second.clone().expect("a .cold range on x86-64");
    let target = first_external_jump(PYTHON, &eval);
    assert!(
        cold.contains(&target),
        "{cold:x?} does not hold {target:#x}"
    );
    assert!(cold.end <= eval.start || cold.start >= eval.end, "disjoint");
}

/// objdump's disassembly of `symbol` in `file` (Intel syntax on x86-64).
fn disassemble(objdump: &str, file: &str, symbol: &str) -> String {
    let range = nm_range(file, symbol);
    run(
        objdump,
        &[
            "-d",
            "-Mintel",
            &format!("--start-address={:#x}", range.start),
            &format!("--stop-address={:#x}", range.end),
            file,
        ],
    )
}

/// The hexadecimal number that follows `prefix` in `text`.
fn hex_after(text: &str, prefix: &str) -> Option<u64> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let digits: String = rest
        .trim_start_matches("0x")
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&digits, 16).ok()
}

/// The TSS key's address in the loader's data (its `Debug` form).
fn tss_key_of(l: &interp::Loaded) -> u64 {
    let dbg = format!("{:?}", l.data);
    let digits: String = dbg
        .split("tss_key: ")
        .nth(1)
        .expect("a tss_key")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a number")
}

#[test]
fn python_3_11_tss_key_in_the_executable_and_the_library() {
    if !tools_present(BINUTILS) {
        return;
    }
    const LIBPYTHON: &str = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";
    if !present(Path::new(PYTHON)) || !present(Path::new(LIBPYTHON)) {
        return;
    }
    const STUB: &str = "PyGILState_GetThisThreadState";
    // The executable loads the key by value: objdump resolves the
    // RIP-relative operand of `mov edi, [rip+X]` and prints it after `#`.
    let exe_code = disassemble("objdump", PYTHON, STUB);
    let line = exe_code
        .lines()
        .find(|l| l.contains("mov    edi,DWORD PTR [rip+"))
        .unwrap_or_else(|| panic!("no key load in {exe_code}"));
    let exe_key = hex_after(line, "# ").expect("objdump's address");
    let exe_runtime = nm_range(PYTHON, "_PyRuntime");
    // The library passes &Py_tss_t: `lea rdi, [rax+OFF]` where rax is read
    // from the GOT slot of _PyRuntime; the key follows the struct's `int`.
    let lib_code = disassemble("objdump", LIBPYTHON, STUB);
    let off = lib_code
        .lines()
        .find_map(|l| hex_after(l, "lea    rdi,[rax+"))
        .unwrap_or_else(|| panic!("no struct address in {lib_code}"));
    let lib_runtime = nm_range(LIBPYTHON, "_PyRuntime");
    let lib_key = lib_runtime.start + off + 4;
    // One build of 3.11: the key lies at the same place in _PyRuntime.
    assert!(exe_runtime.contains(&exe_key));
    assert_eq!(exe_key - exe_runtime.start, lib_key - lib_runtime.start);

    for (file, want) in [(PYTHON, exe_key), (LIBPYTHON, lib_key)] {
        let matches = matches_of(file);
        let l = loaded(&matches, "python");
        assert_eq!(tss_key_of(l), want, "{file}");
        let bytes = std::fs::read(file).expect("read");
        let elf = Elf::parse(&bytes).expect("ELF");
        let syms = interp::Symbols::of(&elf);
        assert_eq!(interp::python::tss_key(&elf, &syms), Ok(want), "{file}");
    }
}

/// pyenv's CPython 3 installations (`PYENV_ROOT`, else `~/.pyenv`) that
/// have a shared libpython: (installation directory, library).
fn pyenv_libpythons() -> Vec<(PathBuf, PathBuf)> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))
        .unwrap_or_default();
    std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|version| {
            let dir = version.path();
            let lib = find_in(dir.join("lib"), |n| {
                n.starts_with("libpython3.") && n.ends_with(".so.1.0")
            })?;
            Some((dir, lib))
        })
        .collect()
}

/// The TSS key on every CPython shared library pyenv built on this machine
/// (3.6 to 3.13 on the project's machines: the key by value in 3.6, a
/// `Py_tss_t` from 3.7, checked for existence first from 3.12). Not
/// installed by `tests/run`: skipped loudly when absent.
#[test]
fn python_tss_key_of_every_pyenv_libpython() {
    if !tools_present(BINUTILS) {
        return;
    }
    let libs: Vec<String> = pyenv_libpythons()
        .into_iter()
        .map(|(_, lib)| lib.to_string_lossy().into_owned())
        .collect();
    if libs.is_empty() {
        eprintln!("SKIPPED: no pyenv libpython (PYENV_ROOT or ~/.pyenv)");
        return;
    }
    for lib in libs {
        let code = disassemble("objdump", &lib, "PyGILState_GetThisThreadState");
        let by_value = code
            .lines()
            .find(|l| l.contains("mov    edi,DWORD PTR [rip+"));
        let want = match by_value {
            Some(line) => hex_after(line, "# ").expect("objdump's address"),
            None => {
                // mov rax, [rip+SLOT] (readelf: the slot of _PyRuntime), then
                // lea REG, [rax+OFF] makes &Py_tss_t.
                let slot_line = code
                    .lines()
                    .find(|l| l.contains("mov    rax,QWORD PTR [rip+"))
                    .unwrap_or_else(|| panic!("{lib}: no GOT load in {code}"));
                let slot = hex_after(slot_line, "# ").expect("objdump's address");
                let relocs = run("readelf", &["-rW", &lib]);
                let reloc = relocs
                    .lines()
                    .find(|l| l.starts_with(&format!("{slot:016x} ")))
                    .unwrap_or_else(|| panic!("{lib}: no relocation at {slot:#x}"));
                assert!(
                    reloc.contains("GLOB_DAT") && reloc.contains(" _PyRuntime"),
                    "{reloc}"
                );
                let off = code
                    .lines()
                    .find_map(|l| hex_after(l.split("lea    ").nth(1)?, ",[rax+"))
                    .unwrap_or_else(|| panic!("{lib}: no struct address in {code}"));
                nm_range(&lib, "_PyRuntime").start + off + 4
            }
        };
        let matches = matches_of(&lib);
        assert_eq!(tss_key_of(loaded(&matches, "python")), want, "{lib}");
    }
}

#[test]
fn perl_5_36_library_and_executable() {
    if !tools_present(BINUTILS) {
        return;
    }
    let lib = std::fs::canonicalize(PERL_LIB).unwrap_or_else(|_| PERL_LIB.into());
    if !present(&lib) {
        return;
    }
    let lib = lib.to_string_lossy().into_owned();
    let matches = matches_of(&lib);
    assert_eq!(loaders(&matches), ["perl"]);
    let l = loaded(&matches, "perl");
    assert_eq!(l.data.version(), run(PERL, &["-e", "printf '%vd', $^V"]));
    let o = l.offsets.as_ref().expect("ranges");
    assert_eq!(o.program, 3);
    assert_eq!(o.first, nm_range(&lib, "Perl_runops_standard"));
    assert_eq!(o.second, None);
    // An executable that links libperl is skipped (the library is the file
    // to handle); Debian's /usr/bin/perl is static and handled itself.
    if !present(Path::new(PERL)) {
        return;
    }
    let links_libperl = run("readelf", &["-d", PERL]).contains("[libperl.so");
    let matches = matches_of(PERL);
    if links_libperl {
        assert!(matches.is_empty());
    } else {
        let l = loaded(&matches, "perl");
        assert_eq!(l.data.version(), run(PERL, &["-e", "printf '%vd', $^V"]));
        let o = l.offsets.as_ref().expect("ranges");
        assert_eq!(o.first, nm_range(PERL, "Perl_runops_standard"));
    }
}

#[test]
fn a_perl_executable_that_links_libperl_is_not_handled() {
    if !tools_present(BINUTILS) {
        return;
    }
    // A C program that links libperl (built here), named perl.
    let lib = std::fs::canonicalize(PERL_LIB).unwrap_or_else(|_| PERL_LIB.into());
    if !present(&lib) || !present(Path::new("/usr/bin/cc")) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("main.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").expect("write");
    let exe = dir.path().join("perl");
    run(
        "cc",
        &[
            "-o",
            &exe.to_string_lossy(),
            &src.to_string_lossy(),
            "-Wl,--no-as-needed",
            &lib.to_string_lossy(),
        ],
    );
    assert!(run("readelf", &["-d", &exe.to_string_lossy()]).contains("[libperl.so"));
    assert!(matches_of(&exe).is_empty());
    // The same program without libperl is recognised by its name and refused.
    run(
        "cc",
        &["-o", &exe.to_string_lossy(), &src.to_string_lossy()],
    );
    assert_eq!(loaders(&matches_of(&exe)), ["perl"]);
}

#[test]
fn php_8_2_and_its_opcache() {
    if !tools_present(BINUTILS) {
        return;
    }
    if !present(Path::new(PHP)) {
        return;
    }
    let want = run(PHP, &["-n", "-r", "echo PHP_VERSION;"]);
    let matches = matches_of(PHP);
    assert_eq!(loaders(&matches), ["php"]);
    let l = loaded(&matches, "php");
    assert_eq!(l.data.version(), want);
    let o = l.offsets.as_ref().expect("ranges");
    assert_eq!(o.program, 5);
    assert_eq!(o.first, nm_range(PHP, "execute_ex"));

    let opcache = glob_one("/usr/lib/php", "opcache.so");
    if !present(&opcache) {
        return;
    }
    let opcache = opcache.to_string_lossy().into_owned();
    let matches = matches_of(&opcache);
    assert_eq!(loaders(&matches), ["php-opcache"]);
    let l = loaded(&matches, "php-opcache");
    assert_eq!(l.data.version(), want, "opcache is versioned with PHP");
    assert!(l.offsets.is_none());
}

/// `<dir>/*/<name>`, or a path that does not exist.
fn glob_one(dir: &str, name: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| Path::new(dir).join("*").join(name))
}

#[test]
fn ruby_3_1() {
    if !tools_present(BINUTILS) {
        return;
    }
    if !tools_present(&["ruby3.1"]) {
        return;
    }
    let lib = ruby_library(RUBY_LIB_DIR);
    if !present(&lib) {
        return;
    }
    let lib = lib.to_string_lossy().into_owned();
    let matches = matches_of(&lib);
    assert_eq!(loaders(&matches), ["ruby"]);
    let l = loaded(&matches, "ruby");
    assert_eq!(
        l.data.version(),
        run("ruby3.1", &["-e", "print RUBY_VERSION"])
    );
    let o = l.offsets.as_ref().expect("ranges");
    assert_eq!(o.program, 6);
    assert_eq!(o.first, nm_range(&lib, "rb_vm_exec"));
}

#[test]
fn hotspot_17() {
    if !present(Path::new(JVM)) {
        return;
    }
    let matches = matches_of(JVM);
    assert_eq!(loaders(&matches), ["hotspot"]);
    let l = loaded(&matches, "hotspot");
    // `java -version`: ... (build 17.0.15+6-Debian-1deb12u1) ...
    let text = run(JAVA, &["-version"]);
    let build = text
        .split("(build ")
        .nth(1)
        .and_then(|s| s.split(['-', ')']).next())
        .expect("a build in java -version");
    assert_eq!(l.data.version(), build);
    assert_hotspot_vm_structs(l);
}

#[test]
fn node_v8() {
    if !tools_present(BINUTILS) {
        return;
    }
    if !present(Path::new(NODE)) {
        return;
    }
    // Debian's own node keeps V8 in libnode.so.N; nodesource's is one file.
    let needed = run("readelf", &["-d", NODE]);
    let v8_file = needed
        .split(['[', ']'])
        .find(|s| s.starts_with("libnode.so"))
        .map_or(NODE.to_owned(), |lib| {
            format!("/usr/lib/x86_64-linux-gnu/{lib}")
        });
    let v8_file = v8_file.as_str();
    let matches = matches_of(v8_file);
    assert_eq!(loaders(&matches), ["v8"]);
    let l = loaded(&matches, "v8");
    // process.versions.v8 is like 11.3.244.8-node.33.
    let v8 = run(NODE, &["-p", "process.versions.v8"]);
    let want: Vec<&str> = v8.trim().split(['.', '-']).take(4).collect();
    assert_eq!(l.data.version(), want.join("."));
    // The snapshot area, when the gaps have one, starts within 1 KiB of the
    // blob accessor and is at least 512 KiB long.
    if let Some(o) = &l.offsets {
        assert_eq!(o.program, 7);
        let blob = nm_range(v8_file, "_ZN2v88internal8Snapshot19DefaultSnapshotBlobEv");
        assert!(o.first.start.wrapping_sub(blob.start) < 1024);
        assert!(o.first.end - o.first.start >= 512 * 1024);
    }
}

#[test]
fn go_and_its_labels_both_match() {
    let go = go_binary();
    if !present(&go) {
        return;
    }
    let path = go.to_string_lossy().into_owned();
    let matches = matches_of(&path);
    // Weakness 11: both loaders are asked, both matches are kept.
    assert_eq!(loaders(&matches), ["go", "golabels"]);
    for name in ["go", "golabels"] {
        let l = loaded(&matches, name);
        assert!(
            l.data.version().starts_with("go1.23"),
            "{}",
            l.data.version()
        );
        assert!(l.offsets.is_none());
    }
    assert!(format!("{:?}", loaded(&matches, "golabels").data).contains("tls_g_offset: -8"));
}

#[test]
fn a_plain_c_program_is_no_interpreter() {
    let c = c_binary();
    if !present(&c) {
        return;
    }
    assert!(matches_of(&c).is_empty());
    assert!(matches_of("/bin/true").is_empty());
}

/// A copy of `from` at `<dir>/<name>` (directories created), replacing
/// an earlier copy there: copies keep the source's read-only mode, which
/// only root could open for writing again.
fn copy_as(dir: &Path, from: &Path, name: &str) -> String {
    let to = dir.join(name);
    std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
    match std::fs::remove_file(&to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("removing {}: {e}", to.display()),
    }
    std::fs::copy(from, &to).expect("copy");
    to.to_string_lossy().into_owned()
}

/// The outcome of `loader` on the file at `path`, which must be an error.
fn error_of(path: &str, loader: &str) -> LoaderError {
    let matches = matches_of(path);
    let m = matches
        .iter()
        .find(|m| m.loader == loader)
        .unwrap_or_else(|| panic!("{loader} does not recognise {path}: {matches:?}"));
    m.outcome.clone().expect_err("an error")
}

#[test]
fn files_of_other_kinds_under_interpreter_names_are_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = c_binary();
    if !present(&c) {
        return;
    }
    // A C program under each interpreter's name: recognised by the name,
    // refused by the contents, with the missing piece named.
    let cases = [
        ("bin/python3.11", "python", "_PyRuntime"),
        ("bin/perl", "perl", "PL_revision"),
        ("lib/libruby-3.1.so.3.1.2", "ruby", "ruby_version"),
        ("bin/node", "v8", "_ZN2v88internal7Version6major_E"),
        ("lib/server/libjvm.so", "hotspot", "_vm_major_version"),
        ("8.0.1/libcoreclr.so", "dotnet", "g_dacTable"),
    ];
    for (name, loader, missing) in cases {
        let path = copy_as(dir.path(), &c, name);
        let e = error_of(&path, loader);
        assert!(e.to_string().contains(missing), "{name}: {e}");
    }
    let php = copy_as(dir.path(), &c, "bin/php");
    assert!(error_of(&php, "php").to_string().contains("X-Powered-By"));
    // Unsupported versions are refused by name before the contents.
    let py27 = copy_as(dir.path(), &c, "bin/python2.7");
    assert!(matches!(
        error_of(&py27, "python"),
        LoaderError::UnsupportedVersion { .. }
    ));
    let dotnet5 = copy_as(dir.path(), &c, "5.0.17/libcoreclr.so");
    assert!(matches!(
        error_of(&dotnet5, "dotnet"),
        LoaderError::UnsupportedVersion { .. }
    ));
    // An APM library without its export is "not mine".
    let apm = copy_as(dir.path(), &c, "agent/elastic-jvmti-linux-x86_64.so");
    assert!(matches_of(&apm).is_empty());

    // Another interpreter's file: libperl named as libpython.
    let lib = std::fs::canonicalize(PERL_LIB).unwrap_or_else(|_| PERL_LIB.into());
    if present(&lib) {
        let as_python = copy_as(dir.path(), &lib, "lib/libpython3.11.so.1.0");
        let matches = matches_of(&as_python);
        assert_eq!(loaders(&matches), ["python"], "perl's name test fails too");
        assert!(matches[0].outcome.is_err());
    }
    // Weakness 11 on a real file: the python loader's error does not hide
    // the Go loaders' matches.
    let go = go_binary();
    if present(&go) {
        let go_as_python = copy_as(dir.path(), &go, "bin/python3.11");
        let matches = matches_of(&go_as_python);
        assert_eq!(loaders(&matches), ["python", "go", "golabels"]);
        assert!(matches[0].outcome.is_err());
        assert!(matches[1].outcome.is_ok() && matches[2].outcome.is_ok());
    }
}

#[test]
fn names_that_only_look_alike_are_not_matched() {
    if !present(Path::new(PHP)) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    for name in [
        "foophp",
        "php-bar",
        "libphp-so",
        "lib/libphp.soap",
        "phpize",
    ] {
        let path = copy_as(dir.path(), Path::new(PHP), name);
        assert!(matches_of(&path).is_empty(), "{name}");
    }
    for name in ["php", "php-fpm", "php-cgi7", "lib/libphp8.2.so"] {
        let path = copy_as(dir.path(), Path::new(PHP), name);
        assert_eq!(loaders(&matches_of(&path)), ["php"], "{name}");
    }
    // Only the tracer enables its loader (APM is always on).
    let file = eim::ElfFileRef::new(PHP);
    let id = file.file_id().expect("id").host();
    use eim::provider::Provider;
    let none = eim::ElfProvider::new()
        .extract_for(id, &file, Tracers(Tracers::PYTHON))
        .expect("extracts");
    assert!(none.interpreters.is_empty());
}

#[test]
fn garbage_and_truncated_files_under_interpreter_names_are_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let garbage = dir.path().join("php8.2");
    std::fs::write(
        &garbage,
        [
            &eim_test_support::elf::MAGIC[..],
            b" but not really an ELF file",
        ]
        .concat(),
    )
    .expect("write");
    let e = inspect(&garbage).expect_err("not an ELF file");
    assert!(e.to_string().contains("php8.2"), "{e}");
    if !present(Path::new(PYTHON)) {
        return;
    }
    let bytes = std::fs::read(PYTHON).expect("read");
    for len in [
        64,
        4096,
        1 << 16,
        bytes.len() / 3,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let path = dir.path().join("python3.11");
        std::fs::write(&path, &bytes[..len]).expect("write");
        // Either the file is refused, or a loader error says what is missing.
        match inspect(&path) {
            Err(e) => assert!(e.to_string().contains("python3.11"), "{e}"),
            Ok(matches) => {
                for m in &matches {
                    eprintln!("truncated to {len}: {m}");
                }
            }
        }
    }
}

/// Mutated copies of real interpreter files: every loader runs on each,
/// directly (no extraction), and none panics.
#[test]
fn mutated_interpreter_files_never_panic() {
    let mut files: Vec<(String, &str)> = vec![(PYTHON.into(), PYTHON), (PHP.into(), PHP)];
    for (path, name) in [(PERL_LIB, "libperl.so.5.36"), (JVM, JVM)] {
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.into());
        files.push((real.to_string_lossy().into_owned(), name));
    }
    let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.next_u64();
    for (path, name) in files {
        if !present(Path::new(&path)) {
            continue;
        }
        let original = std::fs::read(&path).expect("read");
        let mut bytes = original.clone();
        for round in 0..40 {
            // Mutate a handful of bytes, some near the start (headers).
            for _ in 0..8 {
                let span = if round % 2 == 0 { 4096 } else { bytes.len() };
                let at = (next() as usize) % span.min(bytes.len());
                bytes[at] = next() as u8;
            }
            let len = if round % 5 == 4 {
                (next() as usize) % bytes.len()
            } else {
                bytes.len()
            };
            if let Ok(elf) = Elf::parse(&bytes[..len]) {
                let gaps = vec![std::ops::Range {
                    start: 0x1000,
                    end: 0x90_0000,
                }];
                let info = LoaderInfo::with_gaps(FileId(1), name, &elf, gaps);
                let _ = eim::tracers::detect(&info, ALL_TRACERS);
            }
            bytes.copy_from_slice(&original);
        }
    }
}

/// A shared library built here from `source` at `<dir>/<name>`.
fn shared_library(dir: &Path, name: &str, source: &str) -> String {
    let src = dir.join("lib.c");
    std::fs::write(&src, source).expect("write");
    let out = dir.join(name);
    std::fs::create_dir_all(out.parent().expect("parent")).expect("mkdir");
    let out = out.to_string_lossy().into_owned();
    run(
        "cc",
        &["-shared", "-fPIC", "-o", &out, &src.to_string_lossy()],
    );
    out
}

#[test]
fn dotnet_and_apm_on_libraries_built_here() {
    if !tools_present(BINUTILS) {
        return;
    }
    // No .NET runtime or APM agent is packaged by Debian: minimal libraries
    // with the exports the loaders key on stand in for them.
    if !present(Path::new("/usr/bin/cc")) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let coreclr = shared_library(
        dir.path(),
        "shared/Microsoft.NETCore.App/8.0.11/libcoreclr.so",
        "unsigned long g_dacTable[8] = {1};\n",
    );
    let matches = matches_of(&coreclr);
    assert_eq!(loaders(&matches), ["dotnet"]);
    assert_eq!(loaded(&matches, "dotnet").data.version(), "8.0.11");
    let dac = nm_range(&coreclr, "g_dacTable").start;
    assert!(format!("{:?}", loaded(&matches, "dotnet").data).contains(&format!("dac_table: {dac}")));

    let apm = shared_library(
        dir.path(),
        "agent/elastic-jvmti-linux-x86_64.so",
        "void *elastic_apm_profiling_correlation_process_storage_v1 = 0;\n\
         __thread char elastic_apm_profiling_correlation_tls_v1[64];\n",
    );
    let matches = matches_of(&apm);
    assert_eq!(loaders(&matches), ["apm"]);
    let storage = nm_range(&apm, "elastic_apm_profiling_correlation_process_storage_v1").start;
    let dbg = format!("{:?}", loaded(&matches, "apm").data);
    assert!(
        dbg.contains(&format!("process_storage: {storage}")),
        "{dbg}"
    );
    assert!(dbg.contains("flavour: \"x86_64\""), "{dbg}");
    // The wrong size of the storage export is an error, not "not mine".
    let wrong = shared_library(
        dir.path(),
        "bad/elastic-jvmti-linux-x86_64.so",
        "int elastic_apm_profiling_correlation_process_storage_v1 = 0;\n\
         __thread char elastic_apm_profiling_correlation_tls_v1[64];\n",
    );
    assert!(error_of(&wrong, "apm").to_string().contains("not 8"));
}

/// What a running interpreter says of its code, frame and bytes objects:
/// `__basicsize__`, and each member descriptor's offset, read with ctypes
/// from its `PyMemberDef` (`PyMemberDescrObject.d_member`, the sixth word;
/// the offset is the third field). Independent of eim's ELF reading.
const LAYOUT_SCRIPT: &str = r#"
import ctypes, types
for t in (types.CodeType, types.FrameType, bytes):
    members = []
    for name, v in vars(t).items():
        if type(v).__name__ == "member_descriptor":
            d = ctypes.cast(id(v), ctypes.POINTER(ctypes.c_void_p))[5]
            off = ctypes.cast(d + 16, ctypes.POINTER(ctypes.c_ssize_t))[0]
            members.append("%s=%d" % (name, off))
    print(t.__basicsize__, " ".join(sorted(members)))
"#;

/// The same lines from the python loader's data for `path`.
fn layouts_of(path: &Path) -> Vec<String> {
    let data: PythonData = data_of(&matches_of(path), "python");
    ["PyCode_Type", "PyFrame_Type", "PyBytes_Type"]
        .iter()
        .map(|name| {
            let t = &data.types[name];
            let members: Vec<String> = t.members.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{} {}", t.basic_size, members.join(" "))
                .trim_end()
                .to_owned()
        })
        .collect()
}

/// The lines `LAYOUT_SCRIPT` prints, run by `python`.
fn running_layouts(python: &Path) -> Vec<String> {
    run(&python.to_string_lossy(), &["-c", LAYOUT_SCRIPT])
        .lines()
        .map(|l| l.trim_end().to_owned())
        .collect()
}

#[test]
fn python_type_layouts_are_what_the_running_interpreter_reports() {
    if !tools_present(BINUTILS) {
        return;
    }
    if !present(Path::new(PYTHON)) {
        return;
    }
    let want = running_layouts(Path::new(PYTHON));
    eprintln!("PYTHON layouts {PYTHON}: {want:?}");
    assert_eq!(layouts_of(Path::new(PYTHON)), want, "{PYTHON}");
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0");
    if present(lib) {
        // Position-independent: the member table and names are relocated.
        assert_eq!(layouts_of(lib), want, "{}", lib.display());
    }
    // Every pyenv CPython 3.6+ (shared builds): its library against itself.
    for (dir, lib) in pyenv_libpythons() {
        let want = running_layouts(&dir.join("bin/python3"));
        eprintln!("PYTHON layouts {}: {want:?}", lib.display());
        assert_eq!(layouts_of(&lib), want, "{}", lib.display());
        // From 3.13 the loader also needs `None`'s address.
        let data: PythonData = data_of(&matches_of(&lib), "python");
        let none = (data.version >= eim::interp::Version(3, 13, 0))
            .then(|| nm_address(&lib, "_Py_NoneStruct"));
        assert_eq!(data.none_struct, none, "{}", lib.display());
    }
}

/// The 4-byte little-endian value binutils shows at `addr` of `file`
/// (`objdump -s`), or 0 where the file has no contents (`.bss`).
fn objdump_word(file: &str, addr: u64) -> i32 {
    let text = run(
        "objdump",
        &[
            "-s",
            &format!("--start-address={addr:#x}"),
            &format!("--stop-address={:#x}", addr + 4),
            file,
        ],
    );
    // " 5651178 22040000                             \"..."
    let word = text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (u64::from_str_radix(f.next()?, 16).ok()? == addr).then(|| f.next().map(str::to_owned))?
    });
    match word {
        Some(hex) => {
            let bytes: Vec<u8> = (0..4)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
        }
        None => 0,
    }
}

#[test]
fn v8_post_mortem_constants_are_the_files() {
    if !tools_present(BINUTILS) {
        return;
    }
    if !present(Path::new(NODE)) {
        return;
    }
    let data: V8Data = data_of(&matches_of(NODE), "v8");
    // Every 4-byte v8dbg_ symbol nm lists, with the value objdump shows.
    let nm = run("nm", &["-D", "-S", "--defined-only", NODE]);
    let mut checked = 0;
    for line in nm.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [addr, size, _, name] = f[..] else {
            continue;
        };
        let Some(name) = name.strip_prefix("v8dbg_") else {
            continue;
        };
        if size != "0000000000000004" {
            continue;
        }
        let addr = u64::from_str_radix(addr, 16).expect("nm address");
        // objdump is slow per call: compare every eighth value, and all names.
        if checked % 8 == 0 {
            assert_eq!(
                data.introspection.get(name),
                Some(&objdump_word(NODE, addr)),
                "{name}"
            );
        } else {
            assert!(data.introspection.contains_key(name), "{name}");
        }
        checked += 1;
    }
    assert_eq!(checked, data.introspection.len());
    eprintln!("V8 {NODE}: {checked} post-mortem constants");
    // V8's pointer tagging, the same in every version.
    assert_eq!(data.introspection.get("HeapObjectTag"), Some(&1));
    assert_eq!(data.introspection.get("HeapObjectTagMask"), Some(&3));
    assert_eq!(data.introspection.get("SmiTag"), Some(&0));
}
