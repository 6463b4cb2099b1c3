//! PHP 8's JIT facts on real Debian builds, x86-64 and arm64: the VM kind
//! and the return address of JIT code in `php8.2`, and where opcache keeps
//! its JIT buffer. The expected addresses come from binutils' disassembly
//! (`objdump`, `aarch64-linux-gnu-objdump`), not from eim's decoders.
//!
//! The x86-64 files are the machine's (`tests/run` installs them); the
//! arm64 ones are Debian's arm64 packages unpacked under `EIM_ARM64_ROOT`
//! (`tests/inputs/fetch-arm64`). A missing file is a loud skip, or a failure when
//! `EIM_REQUIRE_INTERPRETERS` is set.

mod common;
use common::data_of;
use eim_test_support::skip::skip_or_fail;
use eim_test_support::skip::{tools_present, BINUTILS};
use eim_test_support::tools::{nm_address, objdump_lines};

use std::path::{Path, PathBuf};
use std::process::Command;

use eim::files::loaders::inspect;
use eim::interp::php::{JitBufferPointers, JitReturn, OpcacheData, PhpData};
use eim::tracers::LoaderMatch;

const PHP_DIR: &str = "usr/lib/php";

/// The x86-64 root (`/`) or the arm64 one, with its objdump.
struct Root {
    dir: PathBuf,
    objdump: &'static str,
}

fn x86_root() -> Root {
    Root {
        dir: PathBuf::from("/"),
        objdump: "objdump",
    }
}

fn arm64_root() -> Option<Root> {
    match std::env::var_os("EIM_ARM64_ROOT") {
        Some(dir) => Some(Root {
            dir: PathBuf::from(dir),
            objdump: "aarch64-linux-gnu-objdump",
        }),
        None => {
            skip_or_fail("EIM_ARM64_ROOT (Debian's arm64 packages)");
            None
        }
    }
}

impl Root {
    fn php(&self) -> Option<PathBuf> {
        let path = self.dir.join("usr/bin/php8.2");
        if path.exists() {
            return Some(path);
        }
        skip_or_fail(&path.display().to_string());
        None
    }

    fn opcache(&self) -> Option<PathBuf> {
        let found = std::fs::read_dir(self.dir.join(PHP_DIR))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("opcache.so"))
            .find(|p| p.exists());
        if found.is_none() {
            skip_or_fail(&format!("opcache.so under {}", self.dir.display()));
        }
        found
    }

    /// objdump's lines for `[start, start + len)` of `file`: (address,
    /// mnemonic, operands and comment).
    fn disassemble(&self, file: &Path, start: u64, len: u64) -> Vec<(u64, String, String)> {
        objdump_lines(self.objdump, file, start..start + len)
    }
}

/// The hex number objdump prints after `#` (x86: the RIP-relative target).
fn commented_address(operands: &str) -> Option<u64> {
    let after = operands.split_once('#')?.1.trim();
    let hex = after.split_whitespace().next()?;
    u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok()
}

/// `#imm` or `#0ximm` as objdump prints arm64 immediates.
fn arm_immediate(text: &str) -> u64 {
    let t = text.trim().trim_start_matches('#').trim_end_matches(']');
    match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    }
    .unwrap_or_else(|_| panic!("immediate {text}"))
}

/// What objdump shows `zend_vm_kind` returning, and the address after the
/// first unconditional jump (x86 `jmp`, arm64 `br`) of `execute_ex`.
fn expected_php(root: &Root, php: &Path) -> (u64, u64) {
    let kind_at = nm_address(php, "zend_vm_kind");
    let lines = root.disassemble(php, kind_at, 16);
    let kind = lines
        .iter()
        .find_map(|(_, m, ops)| match m.as_str() {
            // x86: mov $0x4,%eax
            "mov" if ops.ends_with("%eax") => {
                let imm = ops.strip_prefix("$0x")?.split(',').next()?;
                u64::from_str_radix(imm, 16).ok()
            }
            // arm64: mov w0, #0x4
            "mov" if ops.starts_with("w0,") => Some(arm_immediate(ops.split(',').nth(1)?)),
            _ => None,
        })
        .expect("zend_vm_kind moves a constant");
    let execute_ex = nm_address(php, "execute_ex");
    let lines = root.disassemble(php, execute_ex, 128);
    let jump = lines
        .iter()
        .position(|(_, m, _)| m == "jmp" || m == "br")
        .expect("a jump in execute_ex");
    (kind, lines[jump + 1].0)
}

/// The variables whose values objdump shows passed as `mprotect`'s first
/// two arguments in `zend_jit_unprotect`.
fn expected_opcache(root: &Root, opcache: &Path) -> JitBufferPointers {
    let start = nm_address(opcache, "zend_jit_unprotect");
    let lines = root.disassemble(opcache, start, 64);
    let (mut buffer, mut size) = (None, None);
    let mut regs = std::collections::HashMap::new();
    for (_, m, ops) in &lines {
        if m == "call" || m == "bl" {
            break;
        }
        let parts: Vec<&str> = ops.split(", ").collect();
        match m.as_str() {
            // x86: mov 0x3b490(%rip),%rsi  # 103e58 <...>
            "mov" if ops.contains("(%rip),%rdi") => buffer = commented_address(ops),
            "mov" if ops.contains("(%rip),%rsi") => size = commented_address(ops),
            // arm64: adrp x1, 0x209000 <...>
            "adrp" => {
                let page = parts[1].split_whitespace().next().expect("page");
                let page = u64::from_str_radix(page.trim_start_matches("0x"), 16).expect("page");
                regs.insert(parts[0].to_string(), page);
            }
            // add x1, x1, #0x720
            "add" if parts.len() == 3 && parts[2].starts_with('#') => {
                if let Some(base) = regs.get(parts[1]).copied() {
                    regs.insert(parts[0].to_string(), base + arm_immediate(parts[2]));
                }
            }
            // ldr x0, [x1, #840]
            "ldr" if parts.len() == 3 => {
                let base = parts[1].trim_start_matches('[');
                let at = regs.get(base).copied().map(|b| b + arm_immediate(parts[2]));
                match parts[0] {
                    "x0" => buffer = at,
                    "x1" => size = at,
                    _ => {}
                }
                regs.remove(parts[0]);
            }
            _ => {}
        }
    }
    JitBufferPointers {
        buffer: buffer.expect("dasm_buf's address"),
        size: size.expect("dasm_size's address"),
    }
}

fn check(root: Root) {
    if let Some(php) = root.php() {
        let matches = inspect(&php).expect("php8.2");
        let data: PhpData = data_of(&matches, "php");
        let (kind, jump_return) = expected_php(&root, &php);
        eprintln!(
            "PHP {}: {} vm kind {kind}, JIT return {:?} (objdump: {jump_return:#x})",
            php.display(),
            data.version,
            data.jit_return
        );
        assert_eq!(kind, 4, "Debian builds the hybrid VM");
        assert_eq!(data.jit_return, JitReturn::Address(jump_return));
        assert_eq!(data.execute_ex.address, nm_address(&php, "execute_ex"));
    }
    if let Some(opcache) = root.opcache() {
        let matches = inspect(&opcache).expect("opcache.so");
        let data: OpcacheData = data_of(&matches, "php-opcache");
        let want = expected_opcache(&root, &opcache);
        eprintln!(
            "opcache {}: {} JIT buffer {:x?} (objdump: {want:x?})",
            opcache.display(),
            data.version,
            data.jit_buffer
        );
        assert_eq!(data.jit_buffer, want);
    }
}

#[test]
fn php_jit_facts_on_x86_64() {
    if !tools_present(BINUTILS) {
        return;
    }
    check(x86_root());
}

#[test]
fn php_jit_facts_on_arm64() {
    if let Some(root) = arm64_root() {
        check(root);
    }
}

/// `file`'s bytes with `patch` written over the code of `symbol` (its file
/// offset as `objdump -F` prints it), copied to `dir/name`.
fn patched(file: &Path, symbol: &str, patch: &[u8], dir: &Path, name: &str) -> PathBuf {
    let at = nm_address(file, symbol);
    let out = Command::new("objdump")
        .args([
            "-d",
            "-F",
            &format!("--start-address={at:#x}"),
            &format!("--stop-address={:#x}", at + 1),
        ])
        .arg(file)
        .output()
        .expect("objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let offset = text
        .split("(File Offset: 0x")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|hex| usize::from_str_radix(hex, 16).ok())
        .unwrap_or_else(|| panic!("objdump -F gives no file offset for {symbol}: {text}"));
    let mut bytes = std::fs::read(file).expect("read");
    bytes[offset..offset + patch.len()].copy_from_slice(patch);
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

#[test]
fn a_php_whose_vm_is_not_hybrid_or_unreadable_still_unwinds_but_an_opcache_without_jit_facts_is_refused(
) {
    if !tools_present(BINUTILS) {
        return;
    }
    let root = x86_root();
    let (Some(php), Some(opcache)) = (root.php(), root.opcache()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ranges = |matches: &[LoaderMatch]| {
        let m = matches
            .iter()
            .find(|m| m.loader == "php")
            .expect("php match");
        m.outcome.as_ref().expect("php loads").offsets.clone()
    };
    let want_ranges = ranges(&inspect(&php).expect("php8.2"));

    // mov eax, 1 (ZEND_VM_KIND_CALL); ret
    let call_vm = patched(
        &php,
        "zend_vm_kind",
        &[0xb8, 1, 0, 0, 0, 0xc3],
        dir.path(),
        "php8.2",
    );
    let matches = inspect(&call_vm).expect("patched php");
    let data: PhpData = data_of(&matches, "php");
    assert_eq!(data.jit_return, JitReturn::NotHybrid { vm_kind: 1 });
    assert_eq!(ranges(&matches), want_ranges);

    // ud2; ud2; ud2; ud2
    let garbage = [0x0f, 0x0b, 0x0f, 0x0b, 0x0f, 0x0b, 0x0f, 0x0b];
    let broken = patched(&php, "zend_vm_kind", &garbage, dir.path(), "php8.2");
    let matches = inspect(&broken).expect("patched php");
    let data: PhpData = data_of(&matches, "php");
    match &data.jit_return {
        JitReturn::Unknown(why) => assert!(why.contains("zend_vm_kind"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(data.jit_return.address(), 0);
    assert_eq!(ranges(&matches), want_ranges);

    // ret; int3 x 63: no mprotect call.
    let mut no_call = vec![0xcc; 64];
    no_call[0] = 0xc3;
    let broken = patched(
        &opcache,
        "zend_jit_unprotect",
        &no_call,
        dir.path(),
        "opcache.so",
    );
    let matches = inspect(&broken).expect("patched opcache");
    let m = matches
        .iter()
        .find(|m| m.loader == "php-opcache")
        .expect("opcache match");
    let err = m.outcome.as_ref().expect_err("refused");
    eprintln!("{m}");
    assert!(err.to_string().contains("zend_jit_unprotect"), "{err}");
}
