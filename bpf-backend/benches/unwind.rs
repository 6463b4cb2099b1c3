//! Cost of the native unwinder (issue 19): the user-space twin
//! (`eim_machine::unwind::unwind` over `eim_sim::SimMaps`) and the BPF
//! capture program (`KernelMaps::unwind_capture`, `BPF_PROG_TEST_RUN`),
//! over the same synthetic tables and captured stacks.
//!
//! Inputs (deterministic, built by [`synth`]): one x86-64 file of about
//! 5,600 deltas (CFA = SP + n with the saved-fp rule, CFA = FP + 16,
//! merged push pairs, a PLT section, a STOP `_start`) and one arm64 file
//! (LR leaf entries, CFA = SP + n and CFA = FP + n with the fp/lr pair),
//! loaded into both backends through the same `MapOp`s; stacks of 1, 8,
//! 32 and 127 frames into them, ending at the STOP delta. Before anything
//! is timed, each stack is walked once by both and must equal the chain
//! that was planted (a benchmark of a wrong walk is worthless).
//!
//! Groups:
//! * `twin/<arch>/<depth>`: one walk of the twin (throughput in frames);
//! * `kernel_call/<arch>/<depth>`: one `unwind_capture` call: the update
//!   of the 32 KiB capture entry, `BPF_PROG_TEST_RUN`, the read of the
//!   result entry and its decoding;
//! * `kernel_prog/<arch>/<depth>`: the capture program's own run time per
//!   run, from the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`,
//!   enabled only for this group: raw tracepoint test runs accept no
//!   `repeat` and report no duration);
//! * printed first: the verified instruction counts of the programs of
//!   the lookup object, each loaded once by itself.
//!
//! Without root (or when the kernel refuses) the kernel part prints
//! `SKIPPED: <why>` and only the twin is measured; with
//! `EIM_REQUIRE_BPF=1` that is a failure instead.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use eim_bpf::KernelMaps;
use eim_machine::ops::Backend;
use eim_machine::unwind::{unwind, Stack};
use eim_sim::{SimConfig, SimMaps, SimReader};

/// Stack depths measured, in frames.
const DEPTHS: [usize; 4] = [1, 8, 32, 127];

/// The synthetic files, processes and stacks.
mod synth {
    use std::ops::Range;

    use eim_machine::abi::{opcode, ProcessMapping, ProcessMappings, UnwindInfo};
    use eim_machine::deltas::{hint, info, IntervalData, StackDelta};
    use eim_machine::machine::{Capacities, KernelBook};
    use eim_machine::ops::MapOp;
    use eim_machine::unwind::{frame_flag, Arch, Capture, Frame, Regs, Stack, StopReason};
    use eim_machine::FileId;

    pub const PID: u32 = 31_337;
    pub const X86_FILE: FileId = FileId(0x8664_f11e);
    pub const ARM_FILE: FileId = FileId(0xa64_f11e);
    /// Load biases of the two files (process address = ELF address + bias).
    const X86_BIAS: u64 = 0x5555_5555_0000;
    const ARM_BIAS: u64 = 0x5555_6666_0000;
    const STACK_TOP: u64 = 0x7ffd_4000_0000;

    /// Functions per file: with the deltas per kind below, about 5,600
    /// x86-64 deltas (some 4,000 kernel entries once pairs are merged).
    const FUNCTIONS: u64 = 1200;
    const PLT_STUBS: u64 = 256;

    /// SplitMix64: the same stream on every run.
    pub struct Seeded(u64);

    impl Seeded {
        pub fn new(seed: u64) -> Self {
            Self(seed)
        }

        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// In `0..n`.
        pub fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// How a frame finds its caller, as the generator meant the table to
    /// say at the frame's lookup address. Kept apart from the encoded
    /// rules so that a table or walk bug shows as a mismatch.
    #[derive(Clone, Copy, Debug)]
    pub enum FrameRule {
        /// x86-64 `push rbp; push rbx; sub rsp`: CFA = SP + n, the
        /// caller's rbp saved at CFA - 16, rbp itself used as a scratch
        /// register.
        SpSavedFp(u64),
        /// x86-64 `push rbp; mov rbp, rsp; sub rsp, locals`: CFA = FP + 16.
        Fp { locals: u64 },
        /// x86-64 `push rbx`: CFA = SP + 16 (the merged pair's second half).
        Sp16,
        /// x86-64 PLT stub: CFA = SP + 8, or + 16 from byte 11 of the stub.
        Plt,
        /// arm64 `stp x29, x30, [sp, #-n]!`: CFA = SP + n, the pair at SP.
        ArmSp(u64),
        /// arm64 the same, then `mov x29, sp; sub sp, sp, #below`:
        /// CFA = FP + n, the pair at FP.
        ArmFp { n: u64, below: u64 },
        /// arm64 function entry: CFA = SP, the return address in LR.
        ArmLeaf,
    }

    /// ELF addresses `[range)` where `rule` is in force.
    #[derive(Clone, Debug)]
    pub struct Site {
        pub range: Range<u64>,
        pub rule: FrameRule,
    }

    /// A file's deltas and where its rules are.
    pub struct File {
        pub id: FileId,
        pub arch: Arch,
        pub bias: u64,
        pub deltas: IntervalData,
        /// The STOP region (`_start`).
        pub stop: Range<u64>,
        /// Where a first frame may be (not a return address).
        pub first: Vec<Site>,
        /// Function bodies that call: where return addresses point.
        pub bodies: Vec<Site>,
        pub end: u64,
    }

    /// CFA = `base` + `n`, and the saved fp at CFA - 16 (x86-64).
    fn with_fp(base: u8, n: i32) -> UnwindInfo {
        UnwindInfo::new(base, n, opcode::BASE_CFA, -16)
    }

    /// CFA = `base` + `n`, the return address at `base` + 8 and the caller's
    /// fp just below it (arm64, as extraction encodes an fp/lr pair).
    fn pair(base: u8, n: i32) -> UnwindInfo {
        UnwindInfo::new(base, n, base, 8)
    }

    fn delta(address: u64, info: UnwindInfo) -> StackDelta {
        StackDelta::new(address, hint::NONE, info)
    }

    fn entry(address: u64, info: UnwindInfo) -> StackDelta {
        StackDelta::new(address, hint::KEEP, info)
    }

    pub fn x86_file() -> File {
        let mut rng = Seeded::new(0x86);
        let plt = 0x1000..0x1000 + 16 * PLT_STUBS;
        let stop = plt.end..plt.end + 0x40;
        let mut deltas = vec![entry(plt.start, info::PLT), entry(stop.start, info::STOP)];
        let mut bodies = Vec::new();
        let mut f = stop.end;
        for i in 0..FUNCTIONS {
            let e = f + 48 + 16 * rng.below(12);
            let site = match i % 3 {
                0 => {
                    let n = 24 + 8 * (1 + rng.below(16));
                    deltas.extend([
                        entry(f, info::sp(8)),
                        delta(f + 1, with_fp(opcode::BASE_SP, 16)),
                        delta(f + 2, with_fp(opcode::BASE_SP, 24)),
                        delta(f + 6, with_fp(opcode::BASE_SP, n as i32)),
                        delta(e - 4, with_fp(opcode::BASE_SP, 24)),
                        delta(e - 3, with_fp(opcode::BASE_SP, 16)),
                        delta(e - 2, info::sp(8)),
                    ]);
                    Site {
                        range: f + 6..e - 4,
                        rule: FrameRule::SpSavedFp(n),
                    }
                }
                1 => {
                    deltas.extend([
                        entry(f, info::sp(8)),
                        delta(f + 1, with_fp(opcode::BASE_SP, 16)),
                        delta(f + 4, with_fp(opcode::BASE_FP, 16)),
                        delta(e - 2, info::sp(8)),
                    ]);
                    Site {
                        range: f + 4..e - 2,
                        rule: FrameRule::Fp {
                            locals: 8 * (1 + rng.below(16)),
                        },
                    }
                }
                _ => {
                    deltas.extend([
                        entry(f, info::sp(8)),
                        delta(f + 1, info::sp(16)),
                        delta(e - 2, info::sp(8)),
                    ]);
                    Site {
                        range: f + 1..e - 2,
                        rule: FrameRule::Sp16,
                    }
                }
            };
            bodies.push(site);
            f = e;
        }
        deltas.push(StackDelta::new(f, hint::GAP, info::INVALID));
        File {
            id: X86_FILE,
            arch: Arch::X86_64,
            bias: X86_BIAS,
            deltas: IntervalData::from_deltas(deltas),
            stop,
            first: vec![Site {
                range: plt,
                rule: FrameRule::Plt,
            }],
            bodies,
            end: f,
        }
    }

    pub fn arm_file() -> File {
        let mut rng = Seeded::new(0xa64);
        let stop = 0x1000..0x1040;
        let mut deltas = vec![entry(stop.start, info::STOP)];
        let (mut first, mut bodies) = (Vec::new(), Vec::new());
        let mut f = stop.end;
        for i in 0..FUNCTIONS {
            let e = f + 48 + 16 * rng.below(12);
            let n = 16 * (1 + rng.below(8));
            first.push(Site {
                range: f..f + 4,
                rule: FrameRule::ArmLeaf,
            });
            deltas.extend([
                entry(f, info::LR),
                delta(f + 4, pair(opcode::BASE_SP, n as i32)),
            ]);
            let site = if i % 2 == 0 {
                deltas.push(delta(f + 8, pair(opcode::BASE_FP, n as i32)));
                Site {
                    range: f + 8..e - 8,
                    rule: FrameRule::ArmFp {
                        n,
                        below: 16 * rng.below(5),
                    },
                }
            } else {
                Site {
                    range: f + 4..e - 8,
                    rule: FrameRule::ArmSp(n),
                }
            };
            deltas.push(delta(e - 8, info::LR));
            bodies.push(site);
            f = e;
        }
        deltas.push(StackDelta::new(f, hint::GAP, info::INVALID));
        File {
            id: ARM_FILE,
            arch: Arch::Arm64,
            bias: ARM_BIAS,
            deltas: IntervalData::from_deltas(deltas),
            stop,
            first,
            bodies,
            end: f,
        }
    }

    /// The ops that load both files (one book, so their slots do not
    /// collide) and PID's mappings of them among unrelated neighbours.
    pub fn ops(files: &[&File]) -> Vec<MapOp> {
        let mut book = KernelBook::new(Capacities::default());
        let mut ops = Vec::new();
        for file in files {
            let plan = book.plan_load(file.id, &file.deltas, None).expect("plan");
            ops.extend(plan.ops.iter().cloned());
            book.commit_load(plan);
        }
        let mut mappings: Vec<ProcessMapping> = files
            .iter()
            .map(|f| ProcessMapping {
                start: f.bias + 0x1000,
                end: f.bias + ((f.end + 0xfff) & !0xfff),
                file_offset: 0x1000,
                bias: f.bias,
                file_id: f.id.0,
            })
            .collect();
        // Libraries without tables, so that the mapping search has a
        // realistic number of entries to bisect.
        for i in 0..30u64 {
            let start = 0x7f00_0000_0000 + i * 0x40_0000;
            mappings.push(ProcessMapping {
                start,
                end: start + 0x20_0000,
                file_offset: 0,
                bias: start,
                file_id: 0x1_0000 + i,
            });
        }
        mappings.sort_by_key(|m| m.start);
        ops.push(MapOp::PutProcessMappings {
            pid: PID,
            mappings: ProcessMappings { mappings }.into(),
        });
        ops
    }

    /// A captured stack and the walk it must give.
    pub struct Input {
        pub capture: Capture,
        pub expected: Stack,
    }

    /// Where one frame is: its ELF pc and the rule at its lookup address
    /// (`None`: the STOP region).
    struct Planned {
        pc: u64,
        rule: Option<FrameRule>,
    }

    /// A pc in `range` (4-aligned on arm64); a return address points one
    /// past the call, so it is looked up at pc - 1 inside `range`.
    fn pick(range: &Range<u64>, arch: Arch, return_address: bool, rng: &mut Seeded) -> u64 {
        let step = match arch {
            Arch::X86_64 => 1,
            Arch::Arm64 => 4,
        };
        let (lo, hi) = if return_address {
            (range.start + 1, range.end)
        } else {
            (range.start, range.end - 1)
        };
        let lo = lo.div_ceil(step) * step;
        lo + step * rng.below((hi - lo) / step + 1)
    }

    fn plan(file: &File, depth: usize, rng: &mut Seeded) -> Vec<Planned> {
        let arch = file.arch;
        if depth == 1 {
            return vec![Planned {
                pc: pick(&file.stop, arch, false, rng),
                rule: None,
            }];
        }
        let site = &file.first[rng.below(file.first.len() as u64) as usize];
        let mut frames = vec![Planned {
            pc: pick(&site.range, arch, false, rng),
            rule: Some(site.rule),
        }];
        for _ in 1..depth - 1 {
            let site = &file.bodies[rng.below(file.bodies.len() as u64) as usize];
            frames.push(Planned {
                pc: pick(&site.range, arch, true, rng),
                rule: Some(site.rule),
            });
        }
        frames.push(Planned {
            pc: pick(&file.stop, arch, true, rng),
            rule: None,
        });
        frames
    }

    /// A stack of `depth` frames into `file`, the innermost first.
    pub fn input(file: &File, depth: usize) -> Input {
        let mut rng = Seeded::new(file.id.0 ^ depth as u64);
        let frames = plan(file, depth, &mut rng);
        let pc = |i: usize| frames[i].pc + file.bias;
        // sp of each frame (one more: the STOP frame's caller side), and
        // the frame pointer a frame sets for itself, if it does.
        let base = STACK_TOP - 0x8000;
        let mut sp = vec![base];
        let mut own_fp = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let s = sp[i];
            let (cfa, fp) = match f.rule {
                None => (s + 32, None),
                Some(FrameRule::SpSavedFp(n)) => (s + n, None),
                Some(FrameRule::Fp { locals }) => (s + locals + 16, Some(s + locals)),
                Some(FrameRule::Sp16) => (s + 16, None),
                Some(FrameRule::Plt) => (s + if pc(i) & 15 >= 11 { 16 } else { 8 }, None),
                Some(FrameRule::ArmSp(n)) => (s + n, None),
                Some(FrameRule::ArmFp { n, below }) => (s + below + n, Some(s + below)),
                Some(FrameRule::ArmLeaf) => (s, None),
            };
            sp.push(cfa);
            own_fp.push(fp);
        }
        // Register fp in each frame, from the outermost in: a frame that
        // does not touch it sees its caller's; one that saves it and uses
        // it as a scratch register holds junk the walk must not keep.
        let mut fp = vec![0u64; depth + 1];
        for i in (0..depth).rev() {
            fp[i] = match (own_fp[i], frames[i].rule) {
                (Some(v), _) => v,
                (None, Some(FrameRule::SpSavedFp(_) | FrameRule::ArmSp(_))) => {
                    0x0bad_0000_0000 | rng.below(1 << 32)
                }
                _ => fp[i + 1],
            };
        }
        let len = (sp[depth] - base) as usize + 64;
        assert!(len <= eim_machine::unwind::CAPTURE_STACK, "{len} bytes");
        // Junk everywhere the frames do not say otherwise.
        let mut stack: Vec<u8> = (0..len / 8)
            .flat_map(|_| (0x0dd0_0000_0000 | rng.below(1 << 32)).to_le_bytes())
            .collect();
        let mut put = |addr: u64, value: u64| {
            let at = (addr - base) as usize;
            stack[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        let mut lr = 0;
        for i in 0..depth - 1 {
            let (caller_pc, caller_fp, cfa) = (pc(i + 1), fp[i + 1], sp[i + 1]);
            match frames[i].rule {
                Some(FrameRule::SpSavedFp(_) | FrameRule::Fp { .. }) => {
                    put(cfa - 8, caller_pc);
                    put(cfa - 16, caller_fp);
                }
                Some(FrameRule::Sp16 | FrameRule::Plt) => put(cfa - 8, caller_pc),
                Some(FrameRule::ArmSp(_)) => {
                    put(sp[i], caller_fp);
                    put(sp[i] + 8, caller_pc);
                }
                Some(FrameRule::ArmFp { .. }) => {
                    put(fp[i], caller_fp);
                    put(fp[i] + 8, caller_pc);
                }
                Some(FrameRule::ArmLeaf) => lr = caller_pc,
                None => unreachable!("only the last frame is in the STOP region"),
            }
        }
        let regs = Regs {
            pc: pc(0),
            sp: base,
            fp: fp[0],
            lr,
            ..Regs::zero(file.arch)
        };
        let expected = Stack {
            pid: PID,
            tid: PID + 1,
            frames: (0..depth)
                .map(|i| Frame {
                    pc: pc(i),
                    file_id: file.id.0,
                    address: frames[i].pc,
                    flags: if i == 0 {
                        0
                    } else {
                        frame_flag::RETURN_ADDRESS
                    },
                })
                .collect(),
            stop: StopReason::End,
        };
        Input {
            capture: Capture {
                regs,
                pid: PID,
                tid: PID + 1,
                stack_base: base,
                stack,
            },
            expected,
        }
    }
}

/// The BPF side: maps, the capture program's statistics, the verifier.
mod kernel {
    use std::time::Duration;

    use aya::programs::loaded_programs;
    use aya::programs::Program;
    use aya::{Btf, Ebpf};
    use eim_bpf::{sys, KernelMaps, LOOKUP_OBJECT};

    /// `bpf/lookup.bpf.c`'s capture program.
    const CAPTURE_PROGRAM: &str = "eim_unwind_capture";

    /// Why the kernel part cannot run, printed as `SKIPPED: <why>`.
    pub fn unavailable() -> Option<String> {
        match eim_bpf::probe::can_create_maps() {
            Ok(true) => None,
            Ok(false) => Some("bpf() returned EPERM; needs root/CAP_BPF".into()),
            Err(e) => Some(format!("probing BPF: {e}")),
        }
    }

    /// Prints `SKIPPED` loudly, or fails under `EIM_REQUIRE_BPF=1`.
    pub fn skip(why: &str) {
        assert!(
            std::env::var("EIM_REQUIRE_BPF").as_deref() != Ok("1"),
            "EIM_REQUIRE_BPF=1 but the kernel part cannot run: {why}"
        );
        eprintln!("\n***** SKIPPED: unwind bench, kernel part ({why}) *****\n");
    }

    /// The id of the capture program of `k`: the program of that name
    /// whose maps include k's page map (other eim processes may have one).
    pub fn capture_program_id(k: &KernelMaps) -> Result<u32, String> {
        let page_map = sys::map_info(k.page_map_fd())
            .map_err(|e| format!("the page map's info: {e}"))?
            .id;
        // Program names are cut to 15 bytes.
        let name = &CAPTURE_PROGRAM[..15];
        loaded_programs()
            .filter_map(Result::ok)
            .filter(|p| p.name_as_str() == Some(name))
            .find(|p| {
                p.map_ids()
                    .ok()
                    .flatten()
                    .is_some_and(|ids| ids.contains(&page_map))
            })
            .map(|p| p.id())
            .ok_or_else(|| format!("no loaded program {name} uses map {page_map}"))
    }

    /// Run time and run count of program `id` so far.
    pub fn run_stats(id: u32) -> Result<(Duration, u64), String> {
        loaded_programs()
            .filter_map(Result::ok)
            .find(|p| p.id() == id)
            .map(|p| (p.run_time(), p.run_count()))
            .ok_or_else(|| format!("program {id} is gone"))
    }

    /// The verified instruction count of every program of the lookup
    /// object, each loaded by itself into a fresh copy of the object.
    pub fn verified_instructions() -> Vec<(String, Result<u32, String>)> {
        let mut out = Vec::new();
        let mut ebpf = match Ebpf::load(LOOKUP_OBJECT) {
            Ok(e) => e,
            Err(e) => return vec![("lookup.bpf.o".into(), Err(e.to_string()))],
        };
        let names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
        for name in names {
            let count = load_one(&mut ebpf, &name);
            out.push((name, count));
        }
        out.sort();
        out
    }

    fn load_one(ebpf: &mut Ebpf, name: &str) -> Result<u32, String> {
        let program = ebpf
            .program_mut(name)
            .ok_or_else(|| format!("no program {name}"))?;
        let err = |e: &dyn std::fmt::Display| format!("{name}: {e}");
        let info = match program {
            Program::RawTracePoint(p) => {
                p.load().map_err(|e| err(&e))?;
                p.info()
            }
            Program::Iter(p) => {
                let btf = Btf::from_sys_fs().map_err(|e| err(&e))?;
                p.load("task", &btf).map_err(|e| err(&e))?;
                p.info()
            }
            Program::PerfEvent(p) => {
                p.load().map_err(|e| err(&e))?;
                p.info()
            }
            _ => return Err(format!("{name}: a program type this bench does not load")),
        };
        info.map_err(|e| err(&e))?
            .verified_instruction_count()
            .ok_or_else(|| format!("{name}: the kernel reports no verified_insns"))
    }
}

struct Prepared {
    name: &'static str,
    depth: usize,
    capture: eim_machine::unwind::Capture,
}

fn twin(sim: &SimMaps, c: &eim_machine::unwind::Capture) -> Stack {
    unwind(c.pid, c.tid, c.regs, &SimReader::new(sim), c, sim)
}

fn bench(c: &mut Criterion) {
    let x86 = synth::x86_file();
    let arm = synth::arm_file();
    eprintln!(
        "unwind bench: x86-64 file {} deltas over {:#x} bytes, arm64 file {} deltas over {:#x} bytes",
        x86.deltas.len(),
        x86.end,
        arm.deltas.len(),
        arm.end
    );
    let ops = synth::ops(&[&x86, &arm]);
    let mut sim = SimMaps::new(SimConfig::default()).expect("sim maps");
    for op in &ops {
        sim.apply(op).expect("sim op");
    }

    let mut inputs = Vec::new();
    for (name, file) in [("x86_64", &x86), ("arm64", &arm)] {
        for depth in DEPTHS {
            let input = synth::input(file, depth);
            eprintln!(
                "unwind bench: {name}, {depth} frames, {} bytes of stack",
                input.capture.stack.len()
            );
            let walked = twin(&sim, &input.capture);
            assert_eq!(walked, input.expected, "twin, {name}, {depth} frames");
            inputs.push((
                Prepared {
                    name,
                    depth,
                    capture: input.capture,
                },
                input.expected,
            ));
        }
    }

    let mut g = c.benchmark_group("twin");
    for (p, _) in &inputs {
        g.throughput(Throughput::Elements(p.depth as u64));
        g.bench_with_input(BenchmarkId::new(p.name, p.depth), &p.capture, |b, cap| {
            b.iter(|| twin(&sim, cap))
        });
    }
    g.finish();

    if let Some(why) = kernel::unavailable() {
        kernel::skip(&why);
        return;
    }
    match kernel_part(c, &ops, &inputs) {
        Ok(()) => {}
        Err(why) => kernel::skip(&why),
    }
}

/// Everything that needs the kernel; `Err` is why it could not run
/// (a disagreement with the twin is a panic, not a skip).
fn kernel_part(
    c: &mut Criterion,
    ops: &[eim_machine::ops::MapOp],
    inputs: &[(Prepared, Stack)],
) -> Result<(), String> {
    for (name, count) in kernel::verified_instructions() {
        match count {
            Ok(n) => eprintln!("verified instructions: {name} {n}"),
            Err(e) => eprintln!("verified instructions: {name} not loaded: {e}"),
        }
    }
    let mut k = KernelMaps::new().map_err(|e| format!("creating the kernel maps: {e}"))?;
    for op in ops {
        k.apply(op).map_err(|e| format!("{op:?}: {e:?}"))?;
    }
    for (p, expected) in inputs {
        let walked = k
            .unwind_capture(&p.capture)
            .map_err(|e| format!("running the capture program: {e}"))?;
        assert_eq!(&walked, expected, "kernel, {}, {} frames", p.name, p.depth);
    }
    let program = kernel::capture_program_id(&k)?;

    let mut g = c.benchmark_group("kernel_call");
    for (p, _) in inputs {
        g.throughput(Throughput::Elements(p.depth as u64));
        g.bench_with_input(BenchmarkId::new(p.name, p.depth), &p.capture, |b, cap| {
            b.iter(|| k.unwind_capture(cap).expect("unwind_capture"))
        });
    }
    g.finish();

    // Statistics cost every BPF program on the machine two clock reads
    // per run: on for this group only (the fd turns them off when dropped).
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| format!("BPF_ENABLE_STATS: {e}"))?;
    let mut g = c.benchmark_group("kernel_prog");
    for (p, _) in inputs {
        g.throughput(Throughput::Elements(p.depth as u64));
        g.bench_with_input(BenchmarkId::new(p.name, p.depth), &p.capture, |b, cap| {
            b.iter_custom(|iters| {
                let (t0, n0) = kernel::run_stats(program).expect("run stats");
                for _ in 0..iters {
                    k.unwind_capture(cap).expect("unwind_capture");
                }
                let (t1, n1) = kernel::run_stats(program).expect("run stats");
                assert_eq!(n1 - n0, iters, "runs counted");
                t1.saturating_sub(t0)
            })
        });
    }
    g.finish();
    drop(stats);
    Ok(())
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
