//! Unit tests of the per-function walk on synthetic Go 1.20 tables, the
//! strategy rules (upstream's `TestGoStrategy`), and hostile input.

use super::*;
use eim_machine::abi::opcode;

/// One function of a synthetic table.
struct Fun {
    name: &'static str,
    file: &'static str,
    /// Length in bytes.
    size: u32,
    /// `(sp delta, end offset)` steps of the pc → SP table; empty: no table.
    pcsp: Vec<(i32, u32)>,
}

fn zigzag(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

fn uvarint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Encodes `(value, end offset)` steps as a pc-value table.
fn pcvalue(steps: &[(i32, u32)], quantum: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut value, mut pc) = (-1i32, 0u32);
    for &(v, end) in steps {
        uvarint(&mut out, zigzag(v - value));
        uvarint(&mut out, (end - pc) / quantum);
        value = v;
        pc = end;
    }
    out.push(0);
    out
}

const TEXT: u64 = 0x40_1000;

/// A Go 1.20 table for `funs`, laid out back to back from [`TEXT`].
fn build(funs: &[Fun], quantum: u8) -> Vec<u8> {
    build_as(Version::Go120, funs, quantum)
}

/// A table of the given layout for `funs`, laid out back to back from
/// [`TEXT`]. Go 1.16+ tables put a dummy first compilation-unit entry and
/// give every function compilation-unit offset 1, so the file lookup only
/// works if the offset is added; Go 1.2 file numbers start at 1 (entry 0 of
/// the file table is the count).
fn build_as(version: Version, funs: &[Fun], quantum: u8) -> Vec<u8> {
    let q = u32::from(quantum);
    let go12 = version == Version::Go12;
    let relative = version >= Version::Go118;
    let mut names = Vec::new();
    let mut files: Vec<&str> = Vec::new();
    let mut file_names = Vec::new();
    let mut pctab = vec![0u8]; // offset 0 means "no table"
    let mut recs = Vec::new(); // (entry off, name off, pcsp off, pcfile off)
    let mut pc = 0u32;
    for f in funs {
        let name_off = names.len() as u32;
        names.extend_from_slice(f.name.as_bytes());
        names.push(0);
        let file_index = match files.iter().position(|&x| x == f.file) {
            Some(i) => i,
            None => {
                files.push(f.file);
                file_names.push(f.file);
                files.len() - 1
            }
        };
        let file_value = if go12 { file_index + 1 } else { file_index };
        let pcfile_off = pctab.len() as u32;
        pctab.extend(pcvalue(&[(file_value as i32, f.size)], q));
        let pcsp_off = if f.pcsp.is_empty() {
            0
        } else {
            let off = pctab.len() as u32;
            pctab.extend(pcvalue(&f.pcsp, q));
            off
        };
        recs.push((pc, name_off, pcsp_off, pcfile_off));
        pc += f.size;
    }
    let magic = match version {
        Version::Go12 => 0xffff_fffb,
        Version::Go116 => 0xffff_fffa,
        Version::Go118 => 0xffff_fff0,
        Version::Go120 => 0xffff_fff1,
    };
    let mut out = table::tests::header(magic, quantum, funs.len() as u64);
    let entry_size = if relative { 8 } else { 16 };
    let functab_size = entry_size * (funs.len() + 1) as u32;
    let rec_size = if relative { 36 } else { 40 };

    if go12 {
        // header | functab | end pc | filetab offset | pctab | names |
        // file names | filetab | funcs. Offsets are from the table start.
        let pctab_off = functab_size + 12; // 16 + 16 n + end pc 8 + offset 4
        let names_off = pctab_off + pctab.len() as u32;
        let fnames_off = names_off + names.len() as u32;
        let mut fnames = Vec::new();
        let mut filetab = (files.len() as u32 + 1).to_le_bytes().to_vec();
        for f in &file_names {
            filetab.extend_from_slice(&(fnames_off + fnames.len() as u32).to_le_bytes());
            fnames.extend_from_slice(f.as_bytes());
            fnames.push(0);
        }
        let filetab_off = fnames_off + fnames.len() as u32;
        let funcs_off = filetab_off + filetab.len() as u32;
        for (i, &(entry, ..)) in recs.iter().enumerate() {
            out.extend_from_slice(&(TEXT + u64::from(entry)).to_le_bytes());
            out.extend_from_slice(&u64::from(funcs_off + rec_size * i as u32).to_le_bytes());
        }
        out.extend_from_slice(&(TEXT + u64::from(pc)).to_le_bytes());
        out.extend_from_slice(&filetab_off.to_le_bytes());
        out.extend(pctab.iter().map(|_| 0u8));
        let pctab_at = pctab_off as usize;
        out[pctab_at..pctab_at + pctab.len()].copy_from_slice(&pctab);
        out.extend(names);
        out.extend(fnames);
        out.extend(filetab);
        for &(entry, name_off, pcsp_off, pcfile_off) in &recs {
            // Offset 0 still means "no table".
            let pcsp_off = if pcsp_off == 0 {
                0
            } else {
                pcsp_off + pctab_off
            };
            out.extend_from_slice(&(TEXT + u64::from(entry)).to_le_bytes());
            for v in [
                name_off + names_off,
                0,
                0,
                pcsp_off,
                pcfile_off + pctab_off,
                0,
                0,
                0,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        return out;
    }

    let mut filetab = Vec::new();
    let mut cutab = u32::MAX.to_le_bytes().to_vec(); // the dummy unit entry
    for f in &file_names {
        cutab.extend_from_slice(&(filetab.len() as u32).to_le_bytes());
        filetab.extend_from_slice(f.as_bytes());
        filetab.push(0);
    }
    let header_size = if relative { 72u64 } else { 64 };
    let funcname_off = header_size;
    let cu_off = funcname_off + names.len() as u64;
    let filetab_off = cu_off + cutab.len() as u64;
    let pctab_off = filetab_off + filetab.len() as u64;
    let pcln_off = pctab_off + pctab.len() as u64;
    out.extend_from_slice(&(files.len() as u64).to_le_bytes());
    if relative {
        out.extend_from_slice(&TEXT.to_le_bytes());
    }
    for v in [funcname_off, cu_off, filetab_off, pctab_off, pcln_off] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend(names);
    out.extend(cutab);
    out.extend(filetab);
    out.extend(pctab);
    let mut functab = Vec::new();
    let mut funcdata = Vec::new();
    let put_pc = |buf: &mut Vec<u8>, off: u32| {
        if relative {
            buf.extend_from_slice(&off.to_le_bytes());
        } else {
            buf.extend_from_slice(&(TEXT + u64::from(off)).to_le_bytes());
        }
    };
    for &(entry, name_off, pcsp_off, pcfile_off) in &recs {
        put_pc(&mut functab, entry);
        let func_off = functab_size + funcdata.len() as u32;
        if relative {
            functab.extend_from_slice(&func_off.to_le_bytes());
        } else {
            functab.extend_from_slice(&u64::from(func_off).to_le_bytes());
        }
        put_pc(&mut funcdata, entry);
        for v in [name_off, 0, 0, pcsp_off, pcfile_off, 0, 0, 1] {
            funcdata.extend_from_slice(&v.to_le_bytes());
        }
    }
    put_pc(&mut functab, pc);
    if relative {
        functab.extend_from_slice(&0u32.to_le_bytes());
    } else {
        functab.extend_from_slice(&0u64.to_le_bytes());
    }
    out.extend(functab);
    out.extend(funcdata);
    out
}

fn run(arch: Arch, default: Strategy, bytes: &[u8]) -> Result<(Range<u64>, IntervalData), GoError> {
    let table = Pclntab::parse(bytes)?;
    let mut data = IntervalData::new();
    let range = extract_from(arch, default, &table, &mut data)?;
    Ok((range, data))
}

fn sp(param: i32) -> UnwindInfo {
    UnwindInfo {
        opcode: opcode::BASE_SP,
        param,
        ..UnwindInfo::default()
    }
}

fn sp_fp(param: i32, fp_opcode: u8, fp_param: i32) -> UnwindInfo {
    UnwindInfo {
        fp_opcode,
        fp_param,
        ..sp(param)
    }
}

fn d(address: u64, hints: u8, info: UnwindInfo) -> StackDelta {
    StackDelta::new(address, hints, info)
}

/// Upstream's `TestGoStrategy`.
#[test]
fn go_strategy() {
    let fp = Strategy::FramePointer;
    for (file, want) in [
        ("foo.go", Strategy::FramePointer),
        ("foo.s", Strategy::DeltasWithoutFrame),
        (
            "go/src/crypto/elliptic/p256_asm.go",
            Strategy::DeltasWithFrame,
        ),
    ] {
        assert_eq!(
            source_file_strategy(Arch::X86_64, file.as_bytes(), fp),
            want,
            "{file}"
        );
    }
    for suffix in X86_FRAME_CLOBBERING_FILES {
        let mut path = b"/usr/lib/go".to_vec();
        path.extend_from_slice(suffix);
        assert_eq!(
            source_file_strategy(Arch::X86_64, &path, fp),
            Strategy::DeltasWithFrame
        );
    }
    // arm64 ignores the file name.
    for file in ["foo.go", "foo.s", "go/src/crypto/elliptic/p256_asm.go"] {
        for default in [Strategy::FramePointer, Strategy::DeltasWithFrame] {
            assert_eq!(
                source_file_strategy(Arch::Aarch64, file.as_bytes(), default),
                default
            );
        }
    }
}

fn sample() -> Vec<Fun> {
    vec![
        Fun {
            name: "main.a",
            file: "/x/a.go",
            size: 0x20,
            pcsp: vec![(0, 4), (16, 0x1c), (0, 0x20)],
        },
        Fun {
            name: "main.b",
            file: "/x/a.go",
            size: 0x10,
            pcsp: vec![(0, 0x10)],
        },
        Fun {
            name: "runtime.asm",
            file: "/x/asm_amd64.s",
            size: 0x10,
            pcsp: vec![(0, 2), (8, 0x10)],
        },
        Fun {
            name: "runtime.goexit",
            file: "/x/asm_amd64.s",
            size: 0x10,
            pcsp: vec![(0, 0x10)],
        },
        Fun {
            name: "runtime.nopcsp",
            file: "/x/asm_amd64.s",
            size: 0x10,
            pcsp: vec![],
        },
        Fun {
            name: "sha256.block",
            file: "/go/src/crypto/sha256/sha256.go",
            size: 0x20,
            pcsp: vec![(0, 4), (24, 0x20)],
        },
        Fun {
            name: "runtime.sigreturn__sigaction",
            file: "/x/sys.s",
            size: 0x10,
            pcsp: vec![(0, 0x10)],
        },
        Fun {
            name: "main.c",
            file: "/x/a.go",
            size: 0x10,
            pcsp: vec![(0, 0x10)],
        },
    ]
}

#[test]
fn x86_walk() {
    let bytes = build(&sample(), 1);
    let (range, data) = run(Arch::X86_64, Strategy::FramePointer, &bytes).unwrap();
    let t = TEXT;
    assert_eq!(range, t..t + 0xa0);
    assert_eq!(
        data.to_vec(),
        vec![
            // main.a and main.b: frame pointer, folded into one.
            d(t, hint::NONE, info::FRAME_POINTER),
            // runtime.asm (.s): SP deltas, the first kept.
            d(t + 0x30, hint::KEEP, sp(8)),
            d(t + 0x32, hint::NONE, sp(16)),
            d(t + 0x40, hint::NONE, info::STOP),
            // runtime.nopcsp: no SP table, nothing.
            // sha256 (frame-clobbering Go file): the FP rule from 16 on.
            d(t + 0x60, hint::KEEP, sp(8)),
            d(t + 0x64, hint::NONE, sp_fp(32, opcode::BASE_CFA, -16)),
            d(t + 0x80, hint::NONE, info::SIGNAL),
            d(t + 0x90, hint::NONE, info::FRAME_POINTER),
            d(t + 0xa0, hint::NONE, info::INVALID),
        ]
    );
}

/// The four layouts give the same deltas for the same functions.
#[test]
fn every_layout_gives_the_same_walk() {
    let want = run(Arch::X86_64, Strategy::FramePointer, &build(&sample(), 1)).unwrap();
    for version in [
        Version::Go12,
        Version::Go116,
        Version::Go118,
        Version::Go120,
    ] {
        let bytes = build_as(version, &sample(), 1);
        let table = Pclntab::parse(&bytes).unwrap();
        assert_eq!(table.version, version);
        let got = run(Arch::X86_64, Strategy::FramePointer, &bytes).unwrap();
        assert_eq!(got, want, "{version:?}");
        for len in 0..bytes.len() {
            let _ = run(Arch::X86_64, Strategy::DeltasWithFrame, &bytes[..len]);
        }
    }
}

#[test]
fn arm64_walk_with_frame() {
    let funs = vec![
        Fun {
            name: "main.a",
            file: "/x/a.go",
            size: 0x20,
            pcsp: vec![(0, 4), (32, 0x1c), (0, 0x20)],
        },
        Fun {
            name: "runtime.mstart",
            file: "/x/proc.go",
            size: 0x10,
            pcsp: vec![(0, 0x10)],
        },
        Fun {
            name: "main.b",
            file: "/x/a.s",
            size: 0x10,
            pcsp: vec![(0, 0x10)],
        },
    ];
    let bytes = build(&funs, 4);
    let (range, data) = run(Arch::Aarch64, Strategy::DeltasWithFrame, &bytes).unwrap();
    let t = TEXT;
    assert_eq!(range, t..t + 0x40);
    assert_eq!(
        data.to_vec(),
        vec![
            d(t, hint::KEEP, info::LR),
            d(t + 4, hint::NONE, sp_fp(32, opcode::BASE_SP, 0)),
            d(t + 0x1c, hint::NONE, info::LR),
            d(t + 0x20, hint::NONE, info::STOP),
            d(t + 0x30, hint::KEEP, info::LR),
            d(t + 0x40, hint::NONE, info::INVALID),
        ]
    );
    // With trusted frame pointers every plain function is one delta.
    let (_, data) = run(Arch::Aarch64, Strategy::FramePointer, &bytes).unwrap();
    assert_eq!(
        data.to_vec(),
        vec![
            d(t, hint::NONE, info::FRAME_POINTER),
            d(t + 0x20, hint::NONE, info::STOP),
            d(t + 0x30, hint::NONE, info::FRAME_POINTER),
            d(t + 0x40, hint::NONE, info::INVALID),
        ]
    );
}

#[test]
fn x86_without_frame_never_sets_the_fp_rule() {
    let funs = vec![Fun {
        name: "x.y",
        file: "/x/y.s",
        size: 0x10,
        pcsp: vec![(0, 1), (40, 0x10)],
    }];
    let (_, data) = run(Arch::X86_64, Strategy::FramePointer, &build(&funs, 1)).unwrap();
    assert_eq!(data.get(1).unwrap().info, sp(48));
}

/// An SP table that ends before its first step starts its only delta at
/// address 0 with the initial value −1 (upstream's behaviour, kept).
#[test]
fn an_empty_sp_table_gives_upstreams_address_zero_delta() {
    let funs = vec![Fun {
        name: "x.y",
        file: "/x/y.s",
        size: 0x10,
        pcsp: vec![(0, 0x10)],
    }];
    let mut bytes = build(&funs, 1);
    // Point the pcsp offset at the leading zero byte... which is offset 0,
    // meaning "no table"; use the pcfile table's terminator instead.
    let table = Pclntab::parse(&bytes).unwrap();
    let (_, func_off) = table.func_map_entry(0).unwrap();
    let func = table.func(func_off).unwrap();
    let terminator = func.pcfile_off + 2; // file 0: 2 bytes, then the 0
    let pcln = u64::from_le_bytes(bytes[64..72].try_into().unwrap()) as usize;
    let pcsp_field = pcln + func_off as usize + 4 + 12;
    bytes[pcsp_field..pcsp_field + 4].copy_from_slice(&terminator.to_le_bytes());
    let (_, data) = run(Arch::X86_64, Strategy::FramePointer, &bytes).unwrap();
    assert_eq!(data.get(0).unwrap(), d(0, hint::KEEP, sp(7)));
}

#[test]
fn a_mismatched_descriptor_is_an_error() {
    let mut bytes = build(&sample(), 1);
    let pcln = u64::from_le_bytes(bytes[64..72].try_into().unwrap()) as usize;
    // Function 1's table pc.
    bytes[pcln + 8] ^= 1;
    let err = run(Arch::X86_64, Strategy::FramePointer, &bytes).unwrap_err();
    assert!(err.to_string().contains("descriptor is invalid"), "{err}");
}

#[test]
fn no_functions_gives_only_the_end_marker() {
    let bytes = build(&[], 1);
    let (range, data) = run(Arch::X86_64, Strategy::FramePointer, &bytes).unwrap();
    assert_eq!(range, TEXT..TEXT);
    assert_eq!(data.to_vec(), vec![d(TEXT, hint::NONE, info::INVALID)]);
}

#[test]
fn truncations_never_panic() {
    let bytes = build(&sample(), 1);
    for len in 0..bytes.len() {
        let _ = run(Arch::X86_64, Strategy::FramePointer, &bytes[..len]);
        let _ = run(Arch::Aarch64, Strategy::DeltasWithFrame, &bytes[..len]);
    }
}

mod hostile {
    use super::*;
    use proptest::prelude::{any, proptest, ProptestConfig};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_edits_never_panic(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            arm in any::<bool>(),
        ) {
            let versions = [Version::Go12, Version::Go116, Version::Go118, Version::Go120];
            let mut bytes = build_as(versions[edits[0].0 % 4], &sample(), 1);
            for (at, v) in edits {
                let at = at % bytes.len();
                bytes[at] = v;
            }
            let arch = if arm { Arch::Aarch64 } else { Arch::X86_64 };
            let _ = run(arch, Strategy::FramePointer, &bytes);
            let _ = run(arch, Strategy::DeltasWithFrame, &bytes);
        }

        #[test]
        fn random_bytes_never_panic(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..512),
            magic in 0usize..4,
        ) {
            let magics = [0xffff_fffbu32, 0xffff_fffa, 0xffff_fff0, 0xffff_fff1];
            if bytes.len() >= 16 {
                bytes[..4].copy_from_slice(&magics[magic].to_le_bytes());
                bytes[4] = 0;
                bytes[5] = 0;
                bytes[7] = 8;
            }
            let _ = run(Arch::X86_64, Strategy::DeltasWithFrame, &bytes);
        }
    }
}

/// Deliberately unlike upstream: the walks of one file share a step budget,
/// so functions that all point at one long table cannot cost
/// functions × table length.
#[test]
fn shared_tables_cannot_make_the_walks_quadratic() {
    let steps: Vec<(i32, u32)> = (1..=1000u32).map(|i| ((i % 2) as i32 * 8, i)).collect();
    let table = pcvalue(&steps, 1);
    let mut data = IntervalData::new();
    let mut budget = 1500;
    let walk = |data: &mut IntervalData, budget: &mut usize| {
        add_sp_deltas(
            data,
            Arch::X86_64,
            PcValue::new(&table, TEXT, 1),
            Strategy::DeltasWithoutFrame,
            budget,
        )
    };
    walk(&mut data, &mut budget).expect("one walk of 1000 steps fits");
    assert_eq!(budget, 500);
    assert!(matches!(
        walk(&mut data, &mut budget),
        Err(GoError::Corrupt(_))
    ));
}
