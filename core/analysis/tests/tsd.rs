//! C-library introspection against upstream: every oracle `.tsd` file,
//! upstream's TSD test vectors (spec 7.1, the machine code written out as
//! bytes here), the DTV values of spec 7.2, and hostile function bodies.

use eim_analysis::elf::{Arch, Elf};
use eim_analysis::tsd::{
    analyse_dtv, analyse_tsd, extract_dtv, extract_tsd, is_potential_libc_dso,
    is_potential_tsd_dso, AnalysisError, TsdError,
};
use eim_analysis::tsd::{DtvInfo, TsdInfo};

use eim_test_support::oracle;
use eim_test_support::testdata;

/// The oracle's line for a TSD result.
fn tsd_line(result: &Result<TsdInfo, TsdError>) -> String {
    match result {
        Ok(t) => format!(
            "tsd offset={} multiplier={} indirect={}",
            t.offset, t.multiplier, t.indirect
        ),
        Err(e) => format!("# error: {e}"),
    }
}

#[test]
fn every_oracle_tsd_file() {
    let root = testdata();
    let mut checked = 0;
    let mut analysed = 0;
    let here = oracle::available(&root);
    let all_here = here.len() == oracle::inputs(&root).len();
    let with_tsd = here.iter().filter(|i| i.tsd.is_some()).count();
    for input in here {
        let Some(tsd) = &input.tsd else { continue };
        let text = std::fs::read_to_string(tsd).expect("tsd file");
        let mut lines = text.lines();
        let path = lines
            .next()
            .and_then(|l| l.strip_prefix("# file: "))
            .expect("a .tsd file starts with its path");
        let expected = lines.next().expect("a result line");
        // The files in bin/ were renamed, so the name check cannot see
        // their original names: a result other than `# not-a-tsd-dso`
        // says upstream analysed the file, and so do we. For the stock
        // files the name check itself is compared.
        let should_analyse = expected != "# not-a-tsd-dso";
        if path.starts_with('/') {
            assert_eq!(
                is_potential_tsd_dso(path.as_bytes()),
                should_analyse,
                "name check of {path}"
            );
        }
        if !should_analyse {
            checked += 1;
            continue;
        }
        let bytes = input.bytes();
        let elf = Elf::parse(&bytes).expect("an ELF file");
        assert_eq!(tsd_line(&extract_tsd(&elf)), expected, "{}", input.name);
        checked += 1;
        analysed += 1;
    }
    assert_eq!(checked, with_tsd, "every oracle input here is checked");
    assert!(checked >= 12, "the test data's own inputs have .tsd files");
    // Four C libraries and two libpthreads; musl's libc.so is the one a
    // stock machine may lack.
    assert_eq!(
        analysed,
        if all_here { 6 } else { 5 },
        "C libraries analysed"
    );
}

fn x86(code: &[u8]) -> Result<TsdInfo, TsdError> {
    analyse_tsd(Arch::X86_64, code)
}

fn a64(words: &[u32]) -> Result<TsdInfo, TsdError> {
    let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    analyse_tsd(Arch::Aarch64, &code)
}

fn tsd(offset: i16, multiplier: u8, indirect: u8) -> Result<TsdInfo, TsdError> {
    Ok(TsdInfo {
        offset,
        multiplier,
        indirect,
    })
}

#[test]
fn upstream_vectors_arm64() {
    // musl 1.2.3: mrs x1, tpidr_el0; ldur x1, [x1, #-88];
    // ldr x0, [x1, w0, uxtw #3]; ret
    assert_eq!(
        a64(&[0xd53bd041, 0xf85a8021, 0xf8605820, 0xd65f03c0]),
        tsd(-88, 8, 1)
    );
    // glibc 2.35: bti c; mov w1, w0; cmp w0, #0x1f; b.hi; ubfiz x0, x1,
    // #4, #32; mrs x2, tpidr_el0; sub x0, x0, #0x6b0; add x2, x2, x0;
    // ldr x0, [x2, #8]; cbz x0; ubfiz x1, x1, #4, #32; adrp x3; add x3,
    // x3, #0x290; ldr x4, [x2]; ldr x1, [x3, x1]; cmp x1, x4; b.ne; ret
    let glibc_235 = [
        0xd503245f, 0x2a0003e1, 0x71007c1f, 0x54000248, 0xd37c7c20, 0xd53bd042, 0xd11ac000,
        0x8b000042, 0xf9400440, 0xb4000140, 0xd37c7c21, 0xd00008e3, 0x910a4063, 0xf9400044,
        0xf8616861, 0xeb04003f, 0x54000041, 0xd65f03c0,
    ];
    assert_eq!(a64(&glibc_235), tsd(-0x6b0 + 8, 16, 0));
    // glibc 2.33: the index is biased (add w2, w1, #0x11) and added with
    // lsl #4 (add x2, x0, x2, lsl #4) after sub x0, x0, #0x790.
    let glibc_233 = [
        0xd503245f, 0x2a0003e1, 0x71007c1f, 0x54000248, 0xd53bd040, 0x11004422, 0xd11e4000,
        0x8b021002, 0xf9400440, 0xb4000100, 0xd37c7c21, 0xb0000103, 0x91018063, 0xf9400044,
        0xf8616861, 0xeb04003f, 0x54000041, 0xd65f03c0,
    ];
    assert_eq!(a64(&glibc_233), tsd(-0x790 + (0x11 << 4) + 8, 16, 0));
    // glibc 2.38 arm64 {-1576, 16, 0} (the same shape as 2.36 in the
    // oracle, whose libc.so.6 gives -1576 too): sub x0, x0, #0x630.
    let glibc_238 = [
        0x2a0003e1, 0x71007c1f, 0x54000248, 0xd37c7c20, 0xd53bd042, 0xd118c000, 0x8b000042,
        0xf9400440, 0xb4000140, 0xd65f03c0,
    ];
    assert_eq!(a64(&glibc_238), tsd(-1576, 16, 0));
}

#[test]
fn upstream_vectors_x86_64() {
    // musl 1.2.3: mov %fs:0,%rax; mov 0x80(%rax),%rax; mov %edi,%edi;
    // mov (%rax,%rdi,8),%rax; ret
    let musl_123 = [
        0x64, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x80, 0x80, 0x00, 0x00,
        0x00, 0x89, 0xff, 0x48, 0x8b, 0x04, 0xf8, 0xc3,
    ];
    assert_eq!(x86(&musl_123), tsd(0x80, 8, 1));
    // musl 1.1.24: the same with 0x88.
    let mut musl_1124 = musl_123;
    musl_1124[12] = 0x88;
    assert_eq!(x86(&musl_1124), tsd(0x88, 8, 1));
    // glibc 2.32: lea 0x31(%rdi),%eax; shl $4,%rax; mov %fs:0x10,%rdx;
    // add %rdx,%rax; mov 0x8(%rax),%r8; ...; mov %r8,%rax; ret
    let glibc_232 = [
        0xf3, 0x0f, 0x1e, 0xfa, 0x83, 0xff, 0x1f, 0x77, 0x37, 0x8d, 0x47, 0x31, 0x48, 0xc1, 0xe0,
        0x04, 0x64, 0x48, 0x8b, 0x14, 0x25, 0x10, 0x00, 0x00, 0x00, 0x48, 0x01, 0xd0, 0x4c, 0x8b,
        0x40, 0x08, 0x4d, 0x85, 0xc0, 0x74, 0x16, 0x89, 0xff, 0x48, 0x8d, 0x15, 0xc2, 0xc4, 0x00,
        0x00, 0x48, 0x8b, 0x30, 0x48, 0xc1, 0xe7, 0x04, 0x48, 0x39, 0x34, 0x3a, 0x75, 0x35, 0x4c,
        0x89, 0xc0, 0xc3,
    ];
    assert_eq!(x86(&glibc_232), tsd(0x318, 16, 0));
    // glibc 2.35: mov %edi,%eax; add $0x31,%rax; shl $4,%rax;
    // add %fs:0x10,%rax; mov 0x8(%rax),%rdx; ...; mov %rdx,%rax; ret
    let glibc_235 = [
        0xf3, 0x0f, 0x1e, 0xfa, 0x83, 0xff, 0x1f, 0x77, 0x37, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x31,
        0x48, 0xc1, 0xe0, 0x04, 0x64, 0x48, 0x03, 0x04, 0x25, 0x10, 0x00, 0x00, 0x00, 0x48, 0x8b,
        0x50, 0x08, 0x48, 0x85, 0xd2, 0x74, 0x53, 0x89, 0xff, 0x48, 0x8d, 0x0d, 0x92, 0x7b, 0x16,
        0x00, 0x48, 0x8b, 0x30, 0x48, 0xc1, 0xe7, 0x04, 0x48, 0x39, 0x34, 0x39, 0x75, 0x35, 0x48,
        0x89, 0xd0, 0xc3,
    ];
    assert_eq!(x86(&glibc_235), tsd(0x318, 16, 0));
    // "booking coredump glibc": lea 0x10(%rdx,%rax,1),%rdx and a `rep ret`.
    let booking = [
        0x83, 0xff, 0x1f, 0x77, 0x49, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x30, 0x48, 0xc1, 0xe0, 0x04,
        0x64, 0x48, 0x8b, 0x14, 0x25, 0x10, 0x00, 0x00, 0x00, 0x48, 0x8d, 0x54, 0x02, 0x10, 0x48,
        0x8b, 0x42, 0x08, 0x48, 0x85, 0xc0, 0x74, 0x1a, 0x89, 0xff, 0x48, 0x8d, 0x0d, 0x61, 0xaa,
        0x20, 0x00, 0x48, 0xc1, 0xe7, 0x04, 0x48, 0x8b, 0x34, 0x39, 0x48, 0x39, 0x32, 0x75, 0x07,
        0xf3, 0xc3,
    ];
    assert_eq!(x86(&booking), tsd(0x318, 16, 0));
}

#[test]
fn x86_shapes_that_are_not_a_tsd_read() {
    // mov %fs:0,%rax; mov (%rax,%rdi,1),%rax; ret: a multiplier of one is
    // folded away, so no shape matches.
    let scale_one = [
        0x64, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x04, 0x38, 0xc3,
    ];
    assert_eq!(
        x86(&scale_one),
        Err(TsdError::Analysis(AnalysisError::NoTsdPattern))
    );
    // The musl code through %gs instead of %fs.
    let gs = [
        0x65, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x80, 0x80, 0x00, 0x00,
        0x00, 0x89, 0xff, 0x48, 0x8b, 0x04, 0xf8, 0xc3,
    ];
    assert_eq!(
        x86(&gs),
        Err(TsdError::Analysis(AnalysisError::NoTsdPattern))
    );
}

#[test]
fn dtv_of_spec_7_2() {
    // glibc x86_64 (ld.so's __tls_get_addr): mov %fs:0x8,%rdx; mov
    // x(%rip),%rax; cmp %rax,(%rdx); jne; mov (%rdi),%rax; shl $4,%rax;
    // mov (%rdx,%rax,1),%rax; cmp $-1,%rax; je; add 0x8(%rdi),%rax; ret
    let glibc = [
        0x64, 0x48, 0x8b, 0x14, 0x25, 0x08, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x05, 0xf8, 0xfb, 0x01,
        0x00, 0x48, 0x39, 0x02, 0x75, 0x16, 0x48, 0x8b, 0x07, 0x48, 0xc1, 0xe0, 0x04, 0x48, 0x8b,
        0x04, 0x02, 0x48, 0x83, 0xf8, 0xff, 0x74, 0x05, 0x48, 0x03, 0x47, 0x08, 0xc3,
    ];
    let want = |offset, multiplier| Ok(DtvInfo { offset, multiplier });
    assert_eq!(analyse_dtv(Arch::X86_64, &glibc), want(8, 16));
    // musl x86_64: mov %fs:0,%rax; mov (%rdi),%rcx; mov 0x8(%rax),%rdx;
    // mov 0x8(%rdi),%rax; add (%rdx,%rcx,8),%rax; ret
    let musl = [
        0x64, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x0f, 0x48, 0x8b, 0x50,
        0x08, 0x48, 0x8b, 0x47, 0x08, 0x48, 0x03, 0x04, 0xca, 0xc3,
    ];
    assert_eq!(analyse_dtv(Arch::X86_64, &musl), want(8, 8));
    let words = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|w| w.to_le_bytes()).collect() };
    // glibc aarch64 (ld.so): mrs x1, tpidr_el0; adrp x3; add x3, x3,
    // #368; ldr x1, [x1]; ldr x3, [x3]; ldr x4, [x1]; cmp x4, x3; b.ne;
    // ldr x3, [x0]; lsl x3, x3, #4; ldr x3, [x1, x3]; cmn x3, #1; b.eq;
    // ldr x0, [x0, #8]; add x0, x3, x0; ret; b; mov x2, #0; b
    let glibc_a64 = words(&[
        0xd53bd041, 0xb0000183, 0x9105c063, 0xf9400021, 0xf9400063, 0xf9400024, 0xeb03009f,
        0x54000121, 0xf9400003, 0xd37cec63, 0xf8636823, 0xb100047f, 0x540000a0, 0xf9400400,
        0x8b000060, 0xd65f03c0, 0x17ffffd9, 0xd2800002, 0x17fffcaf,
    ]);
    assert_eq!(analyse_dtv(Arch::Aarch64, &glibc_a64), want(0, 16));
    // musl aarch64: ldp x2, x0, [x0]; mrs x1, tpidr_el0; ldur x1, [x1,
    // #-8]; ldr x1, [x1, x2, lsl #3]; add x0, x1, x0; ret
    let musl_a64 = words(&[
        0xa9400002, 0xd53bd041, 0xf85f8021, 0xf8627821, 0x8b000020, 0xd65f03c0,
    ]);
    assert_eq!(analyse_dtv(Arch::Aarch64, &musl_a64), want(-8, 8));
    // Every word of __tls_get_addr must decode on arm64.
    assert_eq!(
        analyse_dtv(Arch::Aarch64, &words(&[0xd53bd041, 0x0000_0000])),
        Err(eim_analysis::tsd::DtvError::Analysis(
            AnalysisError::Undecodable { at: 4 }
        ))
    );
}

#[test]
fn dtv_of_the_oracle_c_libraries() {
    let root = testdata();
    let mut seen = Vec::new();
    let here = oracle::available(&root);
    let all_here = here.len() == oracle::inputs(&root).len();
    for input in here {
        let expected = match input.name.as_str() {
            // libc.so.6 only imports __tls_get_addr: no DTV, no error.
            "x86_64-libc.so.6" | "aarch64-libc.so.6" => None,
            "x86_64-musl-libc.so" => Some(DtvInfo {
                offset: 8,
                multiplier: 8,
            }),
            "aarch64-musl-libc.so" => Some(DtvInfo {
                offset: -8,
                multiplier: 8,
            }),
            "aarch64-ld-linux-aarch64.so.1" => Some(DtvInfo {
                offset: 0,
                multiplier: 16,
            }),
            _ => continue,
        };
        let bytes = input.bytes();
        let elf = Elf::parse(&bytes).expect("an ELF file");
        assert_eq!(extract_dtv(&elf), Ok(expected), "{}", input.name);
        seen.push(input.name);
    }
    // musl's libc.so is the one a stock machine may lack.
    assert_eq!(seen.len(), if all_here { 5 } else { 4 }, "{seen:?}");
}

#[test]
fn names_of_c_libraries() {
    assert!(is_potential_tsd_dso(b"/usr/lib/x86_64-linux-gnu/libc.so.6"));
    assert!(is_potential_tsd_dso(b"/lib/ld-musl-aarch64.so.1"));
    assert!(!is_potential_tsd_dso(b"/lib/ld-linux-aarch64.so.1"));
    assert!(is_potential_libc_dso(b"/lib/ld-linux-aarch64.so.1"));
    // Like upstream's negative cases for interpreter names: a prefix that
    // runs on, a missing separator, no directory.
    for name in [
        "/usr/lib/libcfoo.so",
        "/usr/lib/libc_so",
        "libc.so.6",
        "/libc",
    ] {
        assert!(!is_potential_tsd_dso(name.as_bytes()), "{name}");
    }
}

/// A generator of garbage, deterministic (xorshift).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn hostile_function_bodies_give_errors_not_panics() {
    // Too short for upstream.
    assert_eq!(x86(&[0xc3; 7]), Err(TsdError::TooShort(7)));
    assert_eq!(a64(&[0xd65f03c0]), Err(TsdError::TooShort(4)));
    // Cut off before the ret.
    let musl = [
        0x64, 0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x80, 0x80, 0x00, 0x00,
        0x00, 0x89, 0xff, 0x48, 0x8b, 0x04, 0xf8, 0xc3,
    ];
    assert_eq!(
        x86(&musl[..musl.len() - 1]),
        Err(TsdError::Analysis(AnalysisError::NoReturn))
    );
    // Cut inside an instruction.
    assert_eq!(
        x86(&musl[..13]),
        Err(TsdError::Analysis(AnalysisError::Undecodable { at: 9 }))
    );
    // Garbage: any answer but a panic; and the work is bounded even for
    // code that doubles a value again and again (add %rax,%rax x 20000).
    for seed in 1..200u64 {
        let code = noise(seed, 4096);
        let _ = x86(&code);
        let _ = a64(&code
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<_>>());
        let _ = analyse_dtv(Arch::X86_64, &code);
        let _ = analyse_dtv(Arch::Aarch64, &code);
    }
    let mut doubling: Vec<u8> = [0x48, 0x01, 0xc0].repeat(20_000);
    doubling.push(0xc3);
    assert_eq!(
        x86(&doubling),
        Err(TsdError::Analysis(AnalysisError::NoTsdPattern))
    );
}
