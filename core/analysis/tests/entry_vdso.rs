//! Entry-stub matchers (spec 5.4) and the arm64 vDSO generator (spec 6.1).
//!
//! The entry vectors are `_start` stubs rebuilt from the C libraries'
//! sources (musl `arch/{x86_64,aarch64}/crt_arch.h` + `crt/crt1.c`, glibc
//! `sysdeps/{x86_64,aarch64}/start.S`), assembled with GNU as and linked at
//! 0x5c0 so that ADRP, MOVK and branch fields hold real values. Each
//! instruction's comment names the source line it comes from.
//!
//! The real-file checks run the matcher on the entry point of every file of
//! the oracle set and compare with what upstream extracted: a recognised
//! stub shows up there as STOP (keep) at the entry with the next delta at
//! entry + length.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use eim_analysis::elf::entry::{stub_len, WINDOW};
use eim_analysis::elf::vdso::synthesize;
use eim_analysis::elf::{Arch, Elf};
use eim_machine::abi::{opcode, UnwindInfo};
use eim_machine::deltas::{info, StackDelta};

use eim_test_support::data::sha256_hex;
use eim_test_support::{read_xz, testdata};
use object::read::elf::{ElfFile64, ProgramHeader};
use object::{LittleEndian, Object, ObjectSection};
use proptest::prelude::*;

// ------------------------------------------------------------ helpers

/// arm64 instruction words to bytes.
fn a64(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `code` followed by `int3` / `nop` filler up to the 128-byte window, as
/// extraction reads it.
fn window(code: &[u8], filler: &[u8]) -> Vec<u8> {
    let mut out = code.to_vec();
    while out.len() < WINDOW {
        out.extend_from_slice(filler);
    }
    out.truncate(WINDOW);
    out
}

const INT3: &[u8] = &[0xcc];
const A64_NOP: &[u8] = &[0x1f, 0x20, 0x03, 0xd5];

/// Up to `len` bytes at virtual address `addr`, from the PT_LOAD segment
/// whose file contents hold `addr`.
fn read_at(data: &[u8], addr: u64, len: usize) -> Option<Vec<u8>> {
    let file = ElfFile64::<LittleEndian>::parse(data).ok()?;
    let endian = LittleEndian;
    for ph in file.elf_program_headers() {
        if ph.p_type(endian) != object::elf::PT_LOAD {
            continue;
        }
        let (vaddr, filesz, offset) =
            (ph.p_vaddr(endian), ph.p_filesz(endian), ph.p_offset(endian));
        if addr < vaddr || addr >= vaddr + filesz {
            continue;
        }
        let start = (offset + (addr - vaddr)) as usize;
        let end = (offset + filesz) as usize;
        return Some(data[start..end.min(start + len)].to_vec());
    }
    None
}

// ------------------------------------------------- upstream's vectors

/// musl 1.2.5, x86-64: `_start` from `arch/x86_64/crt_arch.h`, then
/// `_start_c` of `crt/crt1.c` as GCC compiles it (byte for byte what
/// Debian's musl `crt1.o` holds, with the displacements of a linked file).
const MUSL_X86_64: &[u8] = &[
    0x48, 0x31, 0xed, //                   xor %rbp,%rbp
    0x48, 0x89, 0xe7, //                   mov %rsp,%rdi
    0x48, 0x8d, 0x35, 0xe3, 0x2d, 0x00, 0x00, // lea _DYNAMIC(%rip),%rsi
    0x48, 0x83, 0xe4, 0xf0, //             and $-16,%rsp
    0xe8, 0x00, 0x00, 0x00, 0x00, //       call _start_c (next byte)
    // _start_c(long *p):
    0x8b, 0x37, //                         mov (%rdi),%esi        argc = p[0]
    0x48, 0x8d, 0x57, 0x08, //             lea 8(%rdi),%rdx       argv = p+1
    0x4c, 0x8b, 0x05, 0xc1, 0x2f, 0x00, 0x00, // mov _fini@GOTPCREL(%rip),%r8
    0x45, 0x31, 0xc9, //                   xor %r9d,%r9d          0 (ldso_dummy)
    0x48, 0x8b, 0x0d, 0xa2, 0x2f, 0x00, 0x00, // mov _init@GOTPCREL(%rip),%rcx
    0x48, 0x8b, 0x3d, 0xb3, 0x2f, 0x00, 0x00, // mov main@GOTPCREL(%rip),%rdi
    0xe9, 0x1d, 0x0e, 0x00, 0x00, //       jmp __libc_start_main  (ends at 57)
];

/// musl 1.2.5, arm64: `_start` from `arch/aarch64/crt_arch.h`, then
/// `_start_c` of `crt/crt1.c` as GCC compiles it for PIE.
const MUSL_AARCH64: &[u32] = &[
    0xd280001d, // mov x29, #0
    0xd280001e, // mov x30, #0
    0x910003e0, // mov x0, sp
    0x90000081, // adrp x1, _DYNAMIC
    0x91364021, // add x1, x1, #:lo12:_DYNAMIC
    0x927cec1f, // and sp, x0, #-16
    0x14000001, // b _start_c                          (branch 1)
    // _start_c(long *p):
    0xb9400001, // ldr w1, [x0]                        argc = p[0]
    0x91002002, // add x2, x0, #8                      argv = p+1
    0xf0000060, // adrp x0, :got:main
    0xf947ec00, // ldr x0, [x0, #:got_lo12:main]
    0xf0000063, // adrp x3, :got:_init
    0xf947dc63, // ldr x3, [x3, #:got_lo12:_init]
    0xf0000064, // adrp x4, :got:_fini
    0xf947e084, // ldr x4, [x4, #:got_lo12:_fini]
    0xd2800005, // mov x5, #0
    0x14000070, // b __libc_start_main                 (branch 2, ends at 68)
];

/// The same `_start_c` as clang schedules it: the MOVs are ORR aliases
/// (`mov x2, x0`, `mov x5, xzr`) and argc is a post-index load.
const MUSL_AARCH64_CLANG: &[u32] = &[
    0xd280001d, // mov x29, #0
    0xd280001e, // mov x30, #0
    0x910003e0, // mov x0, sp
    0x90000081, // adrp x1, _DYNAMIC
    0x91364021, // add x1, x1, #:lo12:_DYNAMIC
    0x927cec1f, // and sp, x0, #-16
    0x14000001, // b _start_c
    0xaa0003e2, // mov x2, x0          (ORR x2, xzr, x0)
    0xf0000060, // adrp x0, :got:main
    0xf0000063, // adrp x3, :got:_init
    0xf0000064, // adrp x4, :got:_fini
    0xaa1f03e5, // mov x5, xzr         (ORR x5, xzr, xzr)
    0xf947ec00, // ldr x0, [x0, #:got_lo12:main]
    0xf947dc63, // ldr x3, [x3, #:got_lo12:_init]
    0xb8408441, // ldr w1, [x2], #8
    0xf947e084, // ldr x4, [x4, #:got_lo12:_fini]
    0x14000070, // b __libc_start_main
];

/// glibc 2.31, arm64, `start.S` built PIC + SHARED (`Scrt1.o`, what every
/// dynamically linked PIE starts with): main and the two csu functions come
/// from the GOT.
const GLIBC_2_31_AARCH64: &[u32] = &[
    0xd280001d, // mov x29, #0
    0xd280001e, // mov x30, #0
    0xaa0003e5, // mov x5, x0          rtld_fini
    0xf94003e1, // ldr x1, [sp, #0]    argc
    0x910023e2, // add x2, sp, #8      argv
    0x910003e6, // mov x6, sp          stack_end
    0x90000080, // adrp x0, :got:main
    0xf947f000, // ldr x0, [x0, #:got_lo12:main]
    0x90000083, // adrp x3, :got:__libc_csu_init
    0xf947e863, // ldr x3, [x3, #:got_lo12:__libc_csu_init]
    0x90000084, // adrp x4, :got:__libc_csu_fini
    0xf947e484, // ldr x4, [x4, #:got_lo12:__libc_csu_fini]
    0x97ffffdc, // bl __libc_start_main
    0x97ffffe3, // bl abort            (ends at 56)
];

/// glibc `start.S` of the csu era (up to 2.33) built without PIC (the
/// static `crt1.o`): each of main, `__libc_csu_init` and `__libc_csu_fini`
/// is loaded with `MOVL` (MOVZ + 3 MOVK). 20 instructions, 80 bytes: the
/// length upstream's fourth vector ("glibc 2.35") expects. glibc 2.35's own
/// `start.S` passes 0 for init/fini and cannot give 80 (see
/// `glibc_2_35_start_s` below).
const GLIBC_CSU_STATIC_AARCH64: &[u32] = &[
    0xd280001d, // mov x29, #0
    0xd280001e, // mov x30, #0
    0xaa0003e5, // mov x5, x0
    0xf94003e1, // ldr x1, [sp, #0]
    0x910023e2, // add x2, sp, #8
    0x910003e6, // mov x6, sp
    0xd2e00000, // movz x0, #:abs_g3:main
    0xf2c00000, // movk x0, #:abs_g2_nc:main
    0xf2a00820, // movk x0, #:abs_g1_nc:main
    0xf280e380, // movk x0, #:abs_g0_nc:main
    0xd2e00003, // movz x3, #:abs_g3:__libc_csu_init
    0xf2c00003, // movk x3, #:abs_g2_nc:__libc_csu_init
    0xf2a00823, // movk x3, #:abs_g1_nc:__libc_csu_init
    0xf280e403, // movk x3, #:abs_g0_nc:__libc_csu_init
    0xd2e00004, // movz x4, #:abs_g3:__libc_csu_fini
    0xf2c00004, // movk x4, #:abs_g2_nc:__libc_csu_fini
    0xf2a00824, // movk x4, #:abs_g1_nc:__libc_csu_fini
    0xf280f404, // movk x4, #:abs_g0_nc:__libc_csu_fini
    0x97ffffd6, // bl __libc_start_main
    0x97ffffdd, // bl abort            (ends at 80)
];

#[test]
fn upstream_vector_musl_1_2_5_x86_64() {
    assert_eq!(MUSL_X86_64.len(), 57);
    assert_eq!(stub_len(Arch::X86_64, &window(MUSL_X86_64, INT3)), 57);
    // Exactly the stub, nothing after it, is enough too.
    assert_eq!(stub_len(Arch::X86_64, MUSL_X86_64), 57);
}

#[test]
fn upstream_vector_musl_1_2_5_aarch64() {
    assert_eq!(
        stub_len(Arch::Aarch64, &window(&a64(MUSL_AARCH64), A64_NOP)),
        68
    );
    assert_eq!(
        stub_len(Arch::Aarch64, &window(&a64(MUSL_AARCH64_CLANG), A64_NOP)),
        68
    );
}

#[test]
fn upstream_vector_glibc_2_31_aarch64() {
    assert_eq!(
        stub_len(Arch::Aarch64, &window(&a64(GLIBC_2_31_AARCH64), A64_NOP)),
        56
    );
}

#[test]
fn upstream_vector_glibc_80_bytes_aarch64() {
    assert_eq!(
        stub_len(
            Arch::Aarch64,
            &window(&a64(GLIBC_CSU_STATIC_AARCH64), A64_NOP)
        ),
        80
    );
}

#[test]
fn glibc_2_35_start_s() {
    // 2.34+ `start.S`: `mov x3, #0; mov x4, #0` replace the csu pointers.
    let head = [
        0xd280001d, // mov x29, #0
        0xd280001e, // mov x30, #0
        0xaa0003e5, // mov x5, x0
        0xf94003e1, // ldr x1, [sp, #0]
        0x910023e2, // add x2, sp, #8
        0x910003e6, // mov x6, sp
    ];
    let tail = [
        0xd2800003, // mov x3, #0
        0xd2800004, // mov x4, #0
        0x97ffffde, // bl __libc_start_main
        0x97ffffe5, // bl abort
    ];
    // PIC (Scrt1.o / rcrt1.o): main from the GOT (or __wrap_main: adrp+add).
    let pic = [&head[..], &[0x90000080, 0xf947f000], &tail[..]].concat();
    assert_eq!(stub_len(Arch::Aarch64, &window(&a64(&pic), A64_NOP)), 48);
    // Non-PIC crt1.o: MOVL (0, main).
    let movl = [0xd2e00000, 0xf2c00000, 0xf2a00820, 0xf280e380];
    let static_ = [&head[..], &movl[..], &tail[..]].concat();
    assert_eq!(
        stub_len(Arch::Aarch64, &window(&a64(&static_), A64_NOP)),
        56
    );
    // Debian's 2.36 build puts a NOP (the BTI_C slot) first: not a stub.
    let debian = [&[0xd503201f][..], &pic[..]].concat();
    assert_eq!(stub_len(Arch::Aarch64, &window(&a64(&debian), A64_NOP)), 0);
}

// ---------------------------------------------------- negative cases

#[test]
fn x86_wrong_prefix() {
    for at in [0, 2, 5, 8, 13, 16, 17, 18, 21] {
        let mut code = window(MUSL_X86_64, INT3);
        code[at] ^= 0x01;
        assert_eq!(stub_len(Arch::X86_64, &code), 0, "byte {at} changed");
    }
    // The LEA displacement (bytes 9..13) is free.
    let mut code = window(MUSL_X86_64, INT3);
    code[9..13].copy_from_slice(&[0x12, 0x34, 0x56, 0x78]);
    assert_eq!(stub_len(Arch::X86_64, &code), 57);
    // Debian's musl, once linked: `_start_c` is aligned to 16 bytes, so
    // the call skips a 3-byte NOP (`e8 03 00 00 00; nopl (%rax)`) and the
    // fixed pattern no longer matches (upstream finds no stub there either).
    let mut linked = MUSL_X86_64[..18].to_vec();
    linked.extend_from_slice(&[0x03, 0x00, 0x00, 0x00, 0x0f, 0x1f, 0x00]);
    linked.extend_from_slice(&MUSL_X86_64[22..]);
    assert_eq!(stub_len(Arch::X86_64, &window(&linked, INT3)), 0);
    // musl's dynamic linker calls `_dlstart_c` further away: not a stub.
    let mut code = window(MUSL_X86_64, INT3);
    code[18..22].copy_from_slice(&[0xdc, 0xa3, 0xff, 0xff]);
    assert_eq!(stub_len(Arch::X86_64, &code), 0);
    // The arm64 matcher does not take x86 code, nor the other way round.
    assert_eq!(stub_len(Arch::Aarch64, &window(MUSL_X86_64, INT3)), 0);
    assert_eq!(
        stub_len(Arch::X86_64, &window(&a64(MUSL_AARCH64), A64_NOP)),
        0
    );
}

#[test]
fn x86_disallowed_instruction() {
    // `push %rbp` (0x55) inserted in `_start_c`.
    let mut code = MUSL_X86_64[..24].to_vec();
    code.push(0x55);
    code.extend_from_slice(&MUSL_X86_64[24..]);
    assert_eq!(stub_len(Arch::X86_64, &window(&code, INT3)), 0);
    // A CALL instead of the JMP.
    let mut code = MUSL_X86_64.to_vec();
    code[52] = 0xe8;
    assert_eq!(stub_len(Arch::X86_64, &window(&code, INT3)), 0);
    // MOVZX is not MOV.
    let mut code = MUSL_X86_64[..22].to_vec();
    code.extend_from_slice(&[0x0f, 0xb6, 0x37]); // movzbl (%rdi),%esi
    code.extend_from_slice(&MUSL_X86_64[24..]);
    assert_eq!(stub_len(Arch::X86_64, &window(&code, INT3)), 0);
}

#[test]
fn x86_jmp_forms() {
    let body = &MUSL_X86_64[..52];
    let with = |jmp: &[u8]| {
        let mut code = body.to_vec();
        code.extend_from_slice(jmp);
        stub_len(Arch::X86_64, &window(&code, INT3))
    };
    // jmp rel8
    assert_eq!(with(&[0xeb, 0x10]), 54);
    // jmp *0x2fc9(%rip): a near indirect JMP counts.
    assert_eq!(with(&[0xff, 0x25, 0xc9, 0x2f, 0x00, 0x00]), 58);
    // ljmp *0x2fc9(%rip): Go's decoder says LJMP, refused.
    assert_eq!(with(&[0xff, 0x2d, 0xc9, 0x2f, 0x00, 0x00]), 0);
    // The first instruction after the call may already be the JMP.
    let mut code = MUSL_X86_64[..22].to_vec();
    code.extend_from_slice(&[0xe9, 0, 0, 0, 0]);
    assert_eq!(stub_len(Arch::X86_64, &window(&code, INT3)), 27);
}

#[test]
fn x86_truncated_input() {
    // Shorter than 32 bytes: refused even though the prefix matches.
    assert_eq!(stub_len(Arch::X86_64, &MUSL_X86_64[..31]), 0);
    // The JMP cut off by the end of the input.
    for cut in [32, 40, 52, 53, 56] {
        assert_eq!(
            stub_len(Arch::X86_64, &MUSL_X86_64[..cut]),
            0,
            "cut at {cut}"
        );
    }
    // The JMP starts inside the 128-byte window but ends past it.
    let mut long = MUSL_X86_64[..22].to_vec();
    while long.len() + 3 <= WINDOW {
        long.extend_from_slice(&[0x48, 0x89, 0xc0]); // mov %rax,%rax
    }
    let n = long.len();
    long.extend_from_slice(&[0xeb, 0x00]);
    assert!(n + 2 > WINDOW);
    assert_eq!(
        stub_len(Arch::X86_64, &long),
        0,
        "the JMP lies past the window"
    );
}

#[test]
fn a64_wrong_prefix() {
    let base = a64(GLIBC_2_31_AARCH64);
    for at in 0..8 {
        let mut code = window(&base, A64_NOP);
        code[at] ^= 0x01;
        assert_eq!(stub_len(Arch::Aarch64, &code), 0, "byte {at} changed");
    }
    // mov x30, #0 first, then mov x29, #0: the order is fixed.
    let mut swapped = vec![0xd280001e, 0xd280001d];
    swapped.extend_from_slice(&GLIBC_2_31_AARCH64[2..]);
    assert_eq!(stub_len(Arch::Aarch64, &window(&a64(&swapped), A64_NOP)), 0);
}

#[test]
fn a64_disallowed_instruction() {
    let with = |at: usize, word: u32| {
        let mut words = GLIBC_2_31_AARCH64.to_vec();
        words.insert(at, word);
        stub_len(Arch::Aarch64, &window(&a64(&words), A64_NOP))
    };
    assert_eq!(with(2, 0xd503201f), 0); // nop
    assert_eq!(with(6, 0xd503245f), 0); // bti c
    assert_eq!(with(6, 0xf90003e1), 0); // str x1, [sp]
    assert_eq!(with(6, 0xd1002002), 0); // sub x2, x0, #8
    assert_eq!(with(6, 0xaa010025), 0); // orr x5, x1, x1 (not the MOV alias)
    assert_eq!(with(12, 0xd63f0200), 0); // blr x16: not B/BL
    assert_eq!(with(12, 0xd65f03c0), 0); // ret
    assert_eq!(with(6, 0x00000000), 0); // udf: does not decode
                                        // Allowed extras keep the stub and move its end.
    assert_eq!(with(6, 0x8b010000), 60); // add x0, x0, x1
    assert_eq!(with(6, 0x92993fe5), 60); // mov x5, #-51712 (MOVN alias)
    assert_eq!(with(6, 0xf8617801), 60); // ldr x1, [x0, x1, lsl #3]
                                         // A conditional branch counts as a B, as in Go's decoder: b.eq is
                                         // branch 1, `bl __libc_start_main` branch 2 (else it would be 60).
    assert_eq!(with(6, 0x54000040), 56);
}

#[test]
fn a64_truncated_input() {
    let code = a64(GLIBC_2_31_AARCH64);
    assert_eq!(stub_len(Arch::Aarch64, &code[..31]), 0, "under 32 bytes");
    for cut in [32, 48, 52, 55] {
        assert_eq!(stub_len(Arch::Aarch64, &code[..cut]), 0, "cut at {cut}");
    }
    assert_eq!(stub_len(Arch::Aarch64, &code[..56]), 56);
    // Only one branch before the window ends.
    let mut words = vec![0xd280001d, 0xd280001e, 0x14000001];
    words.resize(WINDOW / 4, 0x910003e6); // mov x6, sp
    words.push(0x14000001); // second branch, past the window
    assert_eq!(stub_len(Arch::Aarch64, &a64(&words)), 0);
}

#[test]
fn garbage_gives_zero() {
    let zeros = [0u8; WINDOW];
    let ones = [0xffu8; WINDOW];
    for arch in [Arch::X86_64, Arch::Aarch64] {
        assert_eq!(stub_len(arch, &[]), 0);
        assert_eq!(stub_len(arch, &zeros), 0);
        assert_eq!(stub_len(arch, &ones), 0);
    }
    // Right prefixes, garbage after them.
    let mut x86 = MUSL_X86_64[..22].to_vec();
    x86.extend_from_slice(&[0x0f, 0x0b, 0xff, 0xff, 0xff]); // ud2 ...
    assert_eq!(stub_len(Arch::X86_64, &window(&x86, &[0xff])), 0);
    let mut arm = a64(&[0xd280001d, 0xd280001e]);
    arm.extend_from_slice(&[0xff; 8]);
    assert_eq!(stub_len(Arch::Aarch64, &window(&arm, &[0])), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any bytes: no panic, and the length never exceeds the window.
    #[test]
    fn random_input_is_bounded(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let n = stub_len(arch, &bytes);
            prop_assert!(n <= bytes.len().min(WINDOW));
        }
    }

    /// The right prologue followed by random bytes exercises the decoders.
    #[test]
    fn random_body_after_the_prologue(tail in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut x86 = MUSL_X86_64[..22].to_vec();
        x86.extend_from_slice(&tail);
        let n = stub_len(Arch::X86_64, &x86);
        prop_assert!(n == 0 || (23..=WINDOW).contains(&n));
        let mut arm = a64(&[0xd280001d, 0xd280001e]);
        arm.extend_from_slice(&tail);
        let n = stub_len(Arch::Aarch64, &arm);
        prop_assert!(n == 0 || (n.is_multiple_of(4) && (16..=WINDOW).contains(&n)));
    }
}

// ----------------------------------------------------- real files

/// One delta line of an oracle file: (address, hints, opcode, param).
fn oracle_deltas(text: &str) -> Vec<(u64, u8, u8, i32)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                u64::from_str_radix(f[0], 16).unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect()
}

/// For every file of the oracle set: the matcher's verdict on its entry
/// point agrees with upstream's extracted deltas. Files of the stock image
/// that are missing are skipped; present ones must have the recorded hash.
#[test]
fn oracle_files_agree_on_the_entry_stub() {
    let dir = testdata();
    let manifest = std::fs::read_to_string(dir.join("oracle/MANIFEST.tsv")).unwrap();
    let mut checked = 0;
    let mut summary = Vec::new();
    for row in manifest.lines().skip(1) {
        let f: Vec<&str> = row.split('\t').collect();
        let (name, path, sha) = (f[0], f[1], f[3]);
        let file = if path.starts_with('/') {
            PathBuf::from(path)
        } else {
            dir.join("oracle").join(path)
        };
        let Ok(data) = std::fs::read(&file) else {
            eprintln!("skip {name}: {} not present", file.display());
            continue;
        };
        assert_eq!(
            sha256_hex(&data),
            sha,
            "{}: not the file the oracle saw",
            file.display()
        );
        let elf = Elf::parse(&data).unwrap();
        let entry = elf.entry();
        let deltas = oracle_deltas(&read_xz(&dir.join(format!("oracle/{name}.deltas.xz"))));
        let at_entry = deltas.iter().position(|d| d.0 == entry);
        let stop_keep =
            at_entry.filter(|&i| deltas[i].1 & 1 == 1 && deltas[i].2 == 0 && deltas[i].3 == 1);
        if entry == 0 {
            summary.push(format!("{name}: no entry point"));
            continue;
        }
        let code = read_at(&data, entry, WINDOW).expect("entry in a PT_LOAD segment");
        let n = stub_len(elf.arch, &code);
        if n > 0 {
            let i = stop_keep
                .unwrap_or_else(|| panic!("{name}: stub of {n} bytes but no STOP at {entry:#x}"));
            assert_eq!(
                deltas.get(i + 1).map(|d| d.0),
                Some(entry + n as u64),
                "{name}: stub end"
            );
        } else if let Some(i) = stop_keep {
            // A STOP from CFI (glibc x86-64 `_start` has an FDE with an
            // undefined return address) ends with a gap marker, never with
            // the stub's plain INVALID.
            let next = deltas.get(i + 1).copied();
            assert!(
                !matches!(next, Some((_, 0, 0, 0))),
                "{name}: upstream saw a stub at {entry:#x} (next {next:?}), eim did not"
            );
        }
        summary.push(format!("{name}: entry {entry:#x} stub {n}"));
        checked += 1;
    }
    eprintln!("{}", summary.join("\n"));
    assert!(checked >= 10, "only {checked} files checked");
}

/// The C libraries' own start files, where installed: musl's `crt1.o`
/// (x86-64, 1.2.3, whose `crt1.c` is 1.2.5's; `_start` and `_start_c`
/// concatenated as the linker lays them out) and glibc's arm64 `crt1.o`,
/// `Scrt1.o` and `rcrt1.o` (Debian 2.36).
#[test]
fn installed_start_files() {
    let musl = Path::new("/usr/lib/x86_64-linux-musl");
    // rcrt1.o (static PIE) relocates itself in `_start_c`: a loop with
    // calls, so no stub (upstream's matcher refuses it as well).
    for (name, want) in [("crt1.o", 57), ("Scrt1.o", 57), ("rcrt1.o", 0)] {
        let Ok(data) = std::fs::read(musl.join(name)) else {
            eprintln!("skip musl {name}: not installed");
            continue;
        };
        let obj = ElfFile64::<LittleEndian>::parse(&*data).unwrap();
        let text = obj.section_by_name(".text").unwrap().data().unwrap();
        let start_c = obj
            .section_by_name(".text._start_c")
            .unwrap()
            .data()
            .unwrap();
        let code = [text, start_c].concat();
        assert_eq!(
            stub_len(Arch::X86_64, &window(&code, INT3)),
            want,
            "musl {name}"
        );
    }
    let glibc = Path::new("/usr/aarch64-linux-gnu/lib");
    for name in ["crt1.o", "Scrt1.o", "rcrt1.o"] {
        let Ok(data) = std::fs::read(glibc.join(name)) else {
            eprintln!("skip glibc arm64 {name}: not installed");
            continue;
        };
        let obj = ElfFile64::<LittleEndian>::parse(&*data).unwrap();
        let text = obj.section_by_name(".text").unwrap().data().unwrap();
        // Debian's build starts `_start` with a NOP: no stub, as upstream
        // finds on the corpus binary linked with it.
        assert_eq!(
            stub_len(Arch::Aarch64, &window(text, A64_NOP)),
            0,
            "glibc {name}"
        );
        // Without it, the 2.34+ code is the 48-byte stub.
        assert_eq!(&text[..4], &[0x1f, 0x20, 0x03, 0xd5]);
        assert_eq!(
            stub_len(Arch::Aarch64, &window(&text[4..], A64_NOP)),
            48,
            "glibc {name}"
        );
    }
}

// ------------------------------------------------------------ vDSO

fn vdso_bytes() -> Vec<u8> {
    std::fs::read(testdata().join("upstream/vdso.arch64.withframe")).unwrap()
}

/// {BaseFP 16, FP: BaseFP 8}.
const F16: UnwindInfo = UnwindInfo {
    opcode: opcode::BASE_FP,
    fp_opcode: opcode::BASE_FP,
    merge_opcode: 0,
    pad: 0,
    param: 16,
    fp_param: 8,
};

#[test]
fn vdso_exact_list() {
    let data = vdso_bytes();
    assert_eq!(
        sha256_hex(&data),
        "901a6155c92da6896b3f15ff35adda7f1e30964a2e9e867d887a5d9cd59148c6"
    );
    let elf = Elf::parse(&data).unwrap();
    let got = synthesize(&elf).expect("the vDSO gets synthetic deltas");
    let want: Vec<StackDelta> = [
        (0x0, info::LR),
        (0x7d8, F16),
        (0x7e4, info::LR),
        (0x800, F16),
        (0x80c, info::LR),
        (0x8f8, info::SIGNAL),
        (0x900, info::LR),
    ]
    .into_iter()
    .map(|(a, i)| StackDelta::new(a, 0, i))
    .collect();
    assert_eq!(got.to_vec(), want);
}

/// Replaces the one occurrence of `from` in `data` by `to` (same length).
fn patched(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at: Vec<usize> = (0..=data.len() - from.len())
        .filter(|&i| &data[i..i + from.len()] == from)
        .collect();
    assert_eq!(
        at.len(),
        1,
        "{:?} occurs {} times",
        String::from_utf8_lossy(from),
        at.len()
    );
    let mut out = data.to_vec();
    out[at[0]..at[0] + to.len()].copy_from_slice(to);
    out
}

#[test]
fn vdso_is_recognised_by_soname_or_sigreturn() {
    let data = vdso_bytes();
    // SONAME alone: still the vDSO, without a signal trampoline.
    let no_sigreturn = patched(&data, b"__kernel_rt_sigreturn", b"__kernel_rt_sigretur_");
    let got = synthesize(&Elf::parse(&no_sigreturn).unwrap()).expect("SONAME linux-vdso.so.1");
    assert!(got.iter().all(|d| d.info != info::SIGNAL));
    assert_eq!(got.len(), 5);
    // The trampoline alone (another SONAME).
    let other_name = patched(&data, b"linux-vdso.so.1", b"linux-gate.so.1");
    assert_eq!(
        synthesize(&Elf::parse(&other_name).unwrap()).unwrap().len(),
        7
    );
    // Neither: refused.
    let neither = patched(&no_sigreturn, b"linux-vdso.so.1", b"linux-gate.so.1");
    assert_eq!(synthesize(&Elf::parse(&neither).unwrap()), None);
}

#[test]
fn non_vdso_files_yield_none() {
    let dir = testdata();
    for rel in [
        "upstream/volname",              // x86-64
        "oracle/bin/ccorpus-aarch64-O2", // arm64 executable
        "oracle/bin/aarch64-libc.so.6",  // arm64 library
        "oracle/bin/aarch64-ld-linux-aarch64.so.1",
        "oracle/bin/gocorpus-go1.23-arm64",
    ] {
        let data = std::fs::read(dir.join(rel)).unwrap();
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(synthesize(&elf), None, "{rel}");
    }
}

#[test]
fn vdso_with_garbage_code_does_not_panic() {
    let data = vdso_bytes();
    let text = 0x2c0..0x900;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..64 {
        let mut copy = data.clone();
        for b in &mut copy[text.clone()] {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        let got = synthesize(&Elf::parse(&copy).unwrap()).expect("still the vDSO");
        // Sorted, first LR at 0, the trampoline still found by name.
        assert!(
            got.to_vec()
                .windows(2)
                .all(|w| w[0].address <= w[1].address),
            "round {round}"
        );
        assert_eq!(got.get(0).unwrap(), StackDelta::new(0, 0, info::LR));
        let by_addr: BTreeMap<u64, UnwindInfo> =
            got.to_vec().iter().map(|d| (d.address, d.info)).collect();
        assert_eq!(by_addr.get(&0x8f8), Some(&info::SIGNAL));
    }
}
