//! The interpreter loaders on Debian's arm64 binaries, and golabels on the
//! arm64 Go corpus. The interpreters cannot run here, so their versions
//! are checked against the packages they come from (`VERSIONS`, written by
//! `tests/inputs/fetch-arm64` from the `.deb` files), and every address against
//! what binutils' arm64 tools (`aarch64-linux-gnu-nm`, `-objdump`,
//! `-readelf`) read, independently of eim's symbol and code readers.
//!
//! The packages are extracted under `$EIM_ARM64_ROOT` (`tests/run` runs
//! `tests/inputs/fetch-arm64` and sets it to `target/arm64-root`). When it is
//! unset the tests that need it print a loud `SKIPPED`, unless
//! `EIM_REQUIRE_INTERPRETERS` is set: then they fail. The PHP files are
//! there too (`usr/bin/php8.2`, `usr/lib/php/20220829/opcache.so`); their
//! assertions belong with the PHP loader's owner.

mod common;
use common::{assert_hotspot_vm_structs, loaded, loaders, matches_of};
use eim_test_support::skip::{skip_or_fail, skip_unless_required};
use eim_test_support::skip::{tools_present, ARM64_BINUTILS};
use eim_test_support::tools::{nm_range_with, objdump_lines, run};

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use eim::elf::Elf;
use eim::interp::{self};

const NM: &str = "aarch64-linux-gnu-nm";
const OBJDUMP: &str = "aarch64-linux-gnu-objdump";
const READELF: &str = "aarch64-linux-gnu-readelf";
const LIB: &str = "usr/lib/aarch64-linux-gnu";

/// The extracted arm64 root, or `None` (a loud skip) when the tests are not
/// required to have it.
fn arm64_root() -> Option<PathBuf> {
    let Some(root) = std::env::var_os("EIM_ARM64_ROOT") else {
        skip_unless_required(
            "EIM_REQUIRE_INTERPRETERS",
            "EIM_ARM64_ROOT is unset (tests/run fetches the arm64 interpreters and sets it)",
        );
        return None;
    };
    let root = PathBuf::from(root);
    assert!(
        root.join("VERSIONS").is_file(),
        "{} has no VERSIONS: run tests/inputs/fetch-arm64",
        root.display()
    );
    Some(root)
}

/// The file at `rel` under the root, which must exist.
fn file(root: &Path, rel: &str) -> String {
    let path = root.join(rel);
    assert!(
        path.exists(),
        "{} is missing from the arm64 root",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// Package -> Debian version, as `tests/inputs/fetch-arm64` recorded them.
fn versions(root: &Path) -> HashMap<String, String> {
    let text = std::fs::read_to_string(root.join("VERSIONS")).expect("VERSIONS");
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(p, v)| (p.to_owned(), v.to_owned()))
        .collect()
}

/// The upstream version in a Debian version: without the epoch and the
/// Debian revision, and for a `+really` version (a re-upload of an older
/// release under a higher number) the release it really is.
fn upstream_version(debian: &str) -> &str {
    let v = debian.split_once(':').map_or(debian, |(_, v)| v);
    let v = v.rsplit_once('-').map_or(v, |(v, _)| v);
    v.split_once("+really").map_or(v, |(_, real)| real)
}

fn package_version(root: &Path, package: &str) -> String {
    let all = versions(root);
    let v = all
        .get(package)
        .unwrap_or_else(|| panic!("{package} not in VERSIONS: {all:?}"));
    upstream_version(v).to_owned()
}

/// `[address, address + size)` of a defined symbol as the arm64 `nm` reads
/// it (dynamic table first, then `.symtab`).
fn nm_range(file: &str, symbol: &str) -> Range<u64> {
    nm_range_with(NM, file, symbol)
}

/// The arm64 objdump's instructions of `symbol`: (address, mnemonic,
/// operands) per line.
fn disassemble(file: &str, symbol: &str) -> Vec<(u64, String, String)> {
    objdump_lines(OBJDUMP, file, nm_range(file, symbol))
}

/// The first instruction `mnemonic` whose operands start with `prefix`.
fn find<'a>(code: &'a [(u64, String, String)], mnemonic: &str, prefix: &str) -> &'a str {
    code.iter()
        .find(|(_, m, o)| m == mnemonic && o.starts_with(prefix))
        .map(|(_, _, o)| o.as_str())
        .unwrap_or_else(|| panic!("no `{mnemonic} {prefix}...` in {code:#?}"))
}

/// The number after `#` in an operand list (`#612`, `#0x260`).
fn immediate(operands: &str) -> u64 {
    let text = operands.split('#').nth(1).expect("an immediate");
    let text: String = text
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .unwrap_or_else(|e| panic!("{operands}: {e}"))
}

/// The first hexadecimal address in an operand list (`a35000 <...>`).
fn address(operands: &str) -> u64 {
    let word = operands
        .split([' ', ','])
        .find(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_hexdigit()) && w.len() > 2)
        .unwrap_or_else(|| panic!("no address in {operands}"));
    u64::from_str_radix(word, 16).expect("hex")
}

/// The decimal number after `field: ` in the loader data's `Debug` form.
fn debug_field(l: &interp::Loaded, field: &str) -> i64 {
    let dbg = format!("{:?}", l.data);
    let rest = dbg
        .split(&format!("{field}: "))
        .nth(1)
        .unwrap_or_else(|| panic!("no {field} in {dbg}"));
    let text: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    text.parse().expect("a number")
}

#[test]
fn debian_versions_are_read_as_their_upstream_release() {
    assert_eq!(upstream_version("3.11.2-6+deb12u9"), "3.11.2");
    assert_eq!(upstream_version("3.1.7+really3.1.2-0+deb12u1"), "3.1.2");
    assert_eq!(upstream_version("17.0.21.1+2-1~deb12u1"), "17.0.21.1+2");
    assert_eq!(upstream_version("1:2.3-4"), "2.3");
}

#[test]
fn python_3_11_executable_and_library() {
    let Some(root) = arm64_root() else { return };
    let want = package_version(&root, "python3.11-minimal");
    assert_eq!(want, package_version(&root, "libpython3.11"));
    let exe = file(&root, "usr/bin/python3.11");
    let lib = file(&root, &format!("{LIB}/libpython3.11.so.1.0"));
    let mut key_offsets = Vec::new();
    for path in [&exe, &lib] {
        let matches = matches_of(path);
        assert_eq!(loaders(&matches), ["python"], "{path}");
        let l = loaded(&matches, "python");
        assert_eq!(l.data.version(), want, "{path}");
        let o = l.offsets.as_ref().expect("ranges");
        assert_eq!(o.program, 4);
        assert_eq!(o.first, nm_range(path, "_PyEval_EvalFrameDefault"));
        // Upstream looks for the loop's cold part on x86-64 only.
        assert_eq!(o.second, None);

        // The TSS key, from objdump's disassembly of the stub.
        let runtime = nm_range(path, "_PyRuntime");
        let code = disassemble(path, "PyGILState_GetThisThreadState");
        let page = address(find(&code, "adrp", "x0, "));
        let key = if path == &exe {
            // adrp x0, P; add x0, x0, #lo: x0 = &_PyRuntime; then the key's
            // value is loaded: ldr w0, [x0, #off].
            assert_eq!(
                page + immediate(find(&code, "add", "x0, x0, #")),
                runtime.start
            );
            runtime.start + immediate(find(&code, "ldr", "w0, [x0, #"))
        } else {
            // adrp x0, P; ldr x0, [x0, #slot]: x0 = the GOT slot's pointer,
            // which readelf says the loader points at _PyRuntime; then
            // add x0, x0, #off makes &Py_tss_t, whose key follows an int.
            let slot = page + immediate(find(&code, "ldr", "x0, [x0, #"));
            let relocs = run(READELF, &["-rW", path]);
            let slot_reloc = relocs
                .lines()
                .find(|l| l.starts_with(&format!("{slot:016x} ")))
                .unwrap_or_else(|| panic!("no relocation at {slot:#x}"));
            assert!(
                slot_reloc.contains("R_AARCH64_GLOB_DAT") && slot_reloc.contains(" _PyRuntime"),
                "{slot_reloc}"
            );
            runtime.start + immediate(find(&code, "add", "x0, x0, #")) + 4
        };
        assert!(runtime.contains(&key), "{path}: {key:#x}");
        assert_eq!(debug_field(l, "tss_key"), key as i64, "{path}");
        let bytes = std::fs::read(path).expect("read");
        let elf = Elf::parse(&bytes).expect("ELF");
        let syms = interp::Symbols::of(&elf);
        assert_eq!(interp::python::tss_key(&elf, &syms), Ok(key), "{path}");
        key_offsets.push(key - runtime.start);
    }
    // One build: the key is at the same place in _PyRuntime in both files.
    assert_eq!(key_offsets[0], key_offsets[1]);
}

#[test]
fn perl_5_36_library_and_executable() {
    let Some(root) = arm64_root() else { return };
    let want = package_version(&root, "libperl5.36");
    assert_eq!(want, package_version(&root, "perl-base"));
    let lib = file(&root, &format!("{LIB}/libperl.so.{want}"));
    let exe = file(&root, "usr/bin/perl");
    // Debian's perl is linked statically with its interpreter, so the
    // executable is handled itself (a perl linking libperl is not).
    assert!(!run(READELF, &["-d", &exe]).contains("[libperl.so"));
    for path in [&lib, &exe] {
        let matches = matches_of(path);
        assert_eq!(loaders(&matches), ["perl"], "{path}");
        let l = loaded(&matches, "perl");
        assert_eq!(l.data.version(), want, "{path}");
        let o = l.offsets.as_ref().expect("ranges");
        assert_eq!(o.program, 3);
        assert_eq!(o.first, nm_range(path, "Perl_runops_standard"));
        assert_eq!(o.second, None);
    }
}

#[test]
fn ruby_3_1() {
    let Some(root) = arm64_root() else { return };
    let want = package_version(&root, "libruby3.1");
    let lib = file(&root, &format!("{LIB}/libruby-3.1.so.{want}"));
    let matches = matches_of(&lib);
    assert_eq!(loaders(&matches), ["ruby"]);
    let l = loaded(&matches, "ruby");
    assert_eq!(l.data.version(), want);
    let o = l.offsets.as_ref().expect("ranges");
    assert_eq!(o.program, 6);
    assert_eq!(o.first, nm_range(&lib, "rb_vm_exec"));
    assert_eq!(o.second, None);
}

#[test]
fn hotspot_17() {
    let Some(root) = arm64_root() else { return };
    let jdk = "usr/lib/jvm/java-17-openjdk-arm64";
    let jvm = file(&root, &format!("{jdk}/lib/server/libjvm.so"));
    let matches = matches_of(&jvm);
    assert_eq!(loaders(&matches), ["hotspot"]);
    let l = loaded(&matches, "hotspot");
    let want = package_version(&root, "openjdk-17-jre-headless");
    assert_eq!(l.data.version(), want);
    // The JDK's own release file says the same: JAVA_RUNTIME_VERSION is
    // the version, then "-" and the vendor's suffix.
    let release = std::fs::read_to_string(root.join(jdk).join("release")).expect("release");
    let runtime = release
        .lines()
        .find_map(|l| l.strip_prefix("JAVA_RUNTIME_VERSION=\""))
        .and_then(|v| v.split(['-', '"']).next())
        .expect("JAVA_RUNTIME_VERSION");
    assert_eq!(l.data.version(), runtime);
    assert_hotspot_vm_structs(l);
}

#[test]
fn node_v8() {
    let Some(root) = arm64_root() else { return };
    // Debian's node keeps V8 in libnode.so.108 (package libnode108).
    let node = file(&root, "usr/bin/node");
    assert!(run(READELF, &["-d", &node]).contains("[libnode.so.108]"));
    let lib = file(&root, &format!("{LIB}/libnode.so.108"));
    let matches = matches_of(&lib);
    assert_eq!(loaders(&matches), ["v8"]);
    let l = loaded(&matches, "v8");
    // V8's version string (process.versions.v8, like 10.2.154.26-node.37)
    // is in the library's read-only data.
    let strings = run("strings", &["-a", &lib]);
    let v8 = strings
        .lines()
        .find(|s| {
            let (version, node) = s.split_once("-node.").unwrap_or(("", ""));
            version.split('.').count() == 4
                && version.split('.').all(|p| p.parse::<u32>().is_ok())
                && node.parse::<u32>().is_ok()
        })
        .expect("a V8 version string");
    assert_eq!(
        l.data.version(),
        v8.split("-node.").next().unwrap_or_default()
    );
    // The node release is the package's.
    let release = package_version(&root, "libnode108");
    let release = release.split('+').next().unwrap_or_default();
    assert!(strings.lines().any(|s| s == release), "{release}");
    // The snapshot area: from the end of the blob accessor to the next
    // symbol nm knows (the embedded builtins between them have none).
    let o = l
        .offsets
        .as_ref()
        .expect("a snapshot area on Debian's libnode");
    assert_eq!(o.program, 7);
    let blob = nm_range(&lib, "_ZN2v88internal8Snapshot19DefaultSnapshotBlobEv");
    assert_eq!(o.first.start, blob.end);
    let next = run(NM, &["-D", "-n", "--defined-only", &lib])
        .lines()
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
        .find(|&a| a > blob.start)
        .expect("a symbol after the blob");
    assert_eq!(o.first.end, next);
    assert_eq!(o.second, None);
    // The executable is named like V8's but does not hold it: the loader
    // says which symbol it lacks (an error, as upstream's).
    let matches = matches_of(&node);
    assert_eq!(loaders(&matches), ["v8"]);
    let e = matches[0].outcome.as_ref().expect_err("no V8 in node");
    assert!(e.to_string().contains("Version6major_E"), "{e}");
}

fn gocorpus(name: &str) -> String {
    eim_test_support::data::oracle_bin()
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// golabels on arm64: `g` is in TLS only with cgo; `runtime.load_g` tests
/// `runtime.iscgo` first. objdump shows which byte it tests and nm where
/// that byte is: in `.bss` (zero in the file: no cgo), so the loader's
/// offset must be 0 (g only in x28). The offset the code would load from
/// with cgo is what objdump shows in `mov x27, #off`, and eim's decoder of
/// `load_g` must read both the same way.
#[test]
fn golabels_on_arm64_go() {
    if !tools_present(ARM64_BINUTILS) {
        return;
    }
    for (name, go) in [
        ("gocorpus-go1.19-arm64", "go1.19"),
        ("gocorpus-go1.23-arm64", "go1.23"),
    ] {
        let path = gocorpus(name);
        if !Path::new(&path).exists() {
            skip_or_fail(&path);
            continue;
        }
        let matches = matches_of(&path);
        assert_eq!(loaders(&matches), ["go", "golabels"]);
        let l = loaded(&matches, "golabels");
        assert!(l.data.version().starts_with(go), "{}", l.data.version());

        let code = disassemble(&path, "runtime.load_g.abi0");
        // The flag: adrp x27, P; then either ldrsb x0, [x27, #off] or
        // add x27, x27, #off; ldrsb x0, [x27].
        let page = address(find(&code, "adrp", "x27, "));
        let ldrsb = find(&code, "ldrsb", "x0, [x27");
        let flag = if ldrsb.contains('#') {
            page + immediate(ldrsb)
        } else {
            page + immediate(find(&code, "add", "x27, x27, #"))
        };
        let nm = run(NM, &[&path]);
        let iscgo = nm
            .lines()
            .find(|l| l.ends_with(" runtime.iscgo"))
            .expect("runtime.iscgo");
        assert_eq!(u64::from_str_radix(&iscgo[..16], 16).ok(), Some(flag));
        assert!(
            iscgo.contains(" B "),
            "iscgo is not in .bss: a cgo binary? {iscgo}"
        );
        assert_eq!(debug_field(l, "tls_g_offset"), 0, "{name}");
        assert!(
            !nm.contains(" runtime.tls_g\n"),
            "no TLS g symbol without cgo"
        );

        // eim's decoder reads the flag and the offset as objdump shows them.
        let offset = immediate(find(&code, "mov", "x27, #"));
        assert!(code
            .iter()
            .any(|(_, m, o)| m == "mrs" && o == "x0, tpidr_el0"));
        assert!(code
            .iter()
            .any(|(_, m, o)| m == "ldr" && o == "x28, [x0, x27]"));
        let bytes = std::fs::read(&path).expect("read");
        let elf = Elf::parse(&bytes).expect("ELF");
        let start = code[0].0;
        let text = elf.virtual_memory(start, 32).expect("load_g's code");
        let seen = interp::go::load_g::decode(&text, start);
        assert_eq!(seen.cgo_flag, Some(flag));
        assert_eq!(seen.g_offset, Some(offset));

        // Stripped of its symbols, the pc/line table still names load_g.
        let dir = tempfile::tempdir().expect("temp dir");
        let stripped = dir.path().join(name).to_string_lossy().into_owned();
        run("aarch64-linux-gnu-strip", &["-o", &stripped, &path]);
        assert!(!run(READELF, &["-SW", &stripped]).contains(".symtab"));
        let matches = matches_of(&stripped);
        let l = loaded(&matches, "golabels");
        assert_eq!(debug_field(l, "tls_g_offset"), 0, "{name} stripped");
    }
}
