//! The native unwinder's programs in the kernel (`bpf/unwinder.h`, interface
//! `bpf/unwind.h`): their records decoded into [`eim_machine::unwind`] types,
//! and the unwinder run over captured memory ([`KernelMaps::unwind_capture`]).
//!
//! The numbers are repeated here (Rust cannot include the C header); a unit
//! test parses `bpf/unwind.h` and fails if any of them disagree with this
//! module or with `eim_machine::unwind`.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::Map;
use aya::programs::{Iter, RawTracePoint, RawTracePointRunOptions, TestRun};
use aya::{Btf, Ebpf};
use eim_core::error::Causes;
use eim_machine::unwind::{Capture, Frame, Regs, Stack, StopReason, CAPTURE_STACK, MAX_FRAMES};

use crate::error::{KernelError, RecordError};
use crate::maps::KernelMaps;
use crate::sys;

/// `sizeof(EimRegs)`.
pub const REGS_SIZE: usize = 96;
/// `sizeof(EimFrame)`.
pub const FRAME_SIZE: usize = 32;
/// `offsetof(EimStack, frames)`: the header before the frames.
pub const STACK_HEADER: usize = 24;
/// `sizeof(EimStack)`: a record with every frame slot.
pub const STACK_SIZE: usize = STACK_HEADER + FRAME_SIZE * MAX_FRAMES;
/// Kernel frames a sample holds at most (`EIM_MAX_KERNEL_FRAMES`).
pub const MAX_KERNEL_FRAMES: usize = 127;
/// `offsetof(EimKernelStack, ips)`.
pub const KERNEL_STACK_HEADER: usize = 8;
/// `sizeof(EimKernelStack)`: what goes ahead of the `EimStack` in an
/// `EimProfileSample`.
pub const KERNEL_STACK_SIZE: usize = KERNEL_STACK_HEADER + 8 * MAX_KERNEL_FRAMES;
/// `offsetof(EimCapture, stack)`.
pub const CAPTURE_HEADER: usize = 120;
/// `sizeof(EimCapture)`.
pub const CAPTURE_SIZE: usize = CAPTURE_HEADER + CAPTURE_STACK;

pub(crate) const CAPTURE_PROGRAM: &str = "eim_unwind_capture";
pub(crate) const CAPTURE_IN: &str = "eim_unwind_capture_in";
pub(crate) const CAPTURE_OUT: &str = "eim_unwind_capture_out";
pub(crate) const ITER_PROGRAM: &str = "eim_stack_iter";
pub(crate) const STACK_TARGET: &str = "eim_stack_target";

/// The most bytes one iteration's output is read to: a process of 16,000
/// threads with every frame slot used. More is refused, not truncated.
pub const MAX_ITER_BYTES: u64 = 16_000 * STACK_SIZE as u64;

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// `EimRegs`' bytes.
pub fn encode_regs(regs: &Regs) -> [u8; REGS_SIZE] {
    let mut out = [0u8; REGS_SIZE];
    let words = [
        regs.pc, regs.sp, regs.fp, regs.lr, regs.rax, regs.r9, regs.r11, regs.r13, regs.r15,
        regs.r22, regs.r28,
    ];
    for (slot, v) in out.chunks_exact_mut(8).zip(words) {
        slot.copy_from_slice(&v.to_le_bytes());
    }
    let flags = if regs.return_address {
        eim_machine::unwind::regs_flag::RETURN_ADDRESS
    } else {
        0
    };
    out[88..92].copy_from_slice(&regs.arch.code().to_le_bytes());
    out[92..96].copy_from_slice(&flags.to_le_bytes());
    out
}

/// `EimCapture`'s bytes (the stack copy zero-padded to its full size).
pub fn encode_capture(capture: &Capture) -> Result<Vec<u8>, RecordError> {
    let len = capture.stack.len();
    if len > CAPTURE_STACK {
        return Err(RecordError::CaptureTooLarge { len });
    }
    let mut out = vec![0u8; CAPTURE_SIZE];
    out[..REGS_SIZE].copy_from_slice(&encode_regs(&capture.regs));
    out[96..100].copy_from_slice(&capture.pid.to_le_bytes());
    out[100..104].copy_from_slice(&capture.tid.to_le_bytes());
    out[104..112].copy_from_slice(&capture.stack_base.to_le_bytes());
    out[112..116].copy_from_slice(&(len as u32).to_le_bytes());
    out[CAPTURE_HEADER..CAPTURE_HEADER + len].copy_from_slice(&capture.stack);
    Ok(out)
}

/// Decodes one `EimStack` record at the start of `bytes`, which holds at
/// least its header and its `count` frames (the programs send only those;
/// the capture's output map holds all 128), and says how many bytes it
/// took: the header and its frames.
pub fn decode_stack(bytes: &[u8]) -> Result<(Stack, usize), RecordError> {
    if bytes.len() < STACK_HEADER {
        return Err(RecordError::Short {
            len: bytes.len(),
            need: STACK_HEADER,
        });
    }
    let (pid, tid, stop, detail, count) = (
        u32_at(bytes, 0),
        u32_at(bytes, 4),
        u32_at(bytes, 8),
        u32_at(bytes, 12),
        u32_at(bytes, 16),
    );
    let frames = usize::try_from(count)
        .ok()
        .filter(|n| *n <= MAX_FRAMES)
        .ok_or(RecordError::TooManyFrames { count })?;
    let need = STACK_HEADER + frames * FRAME_SIZE;
    if bytes.len() < need {
        return Err(RecordError::Short {
            len: bytes.len(),
            need,
        });
    }
    let stop =
        StopReason::from_codes(stop, detail).ok_or(RecordError::UnknownStop { stop, detail })?;
    let frames = bytes[STACK_HEADER..need]
        .chunks_exact(FRAME_SIZE)
        .map(|f| Frame {
            pc: u64_at(f, 0),
            file_id: u64_at(f, 8),
            address: u64_at(f, 16),
            flags: u32_at(f, 24),
        })
        .collect();
    Ok((
        Stack {
            pid,
            tid,
            frames,
            stop,
        },
        need,
    ))
}

/// A sample's kernel stack (`EimKernelStack`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelStack {
    /// Return addresses, innermost first (the interrupted PC first); none
    /// when the sample interrupted user code.
    pub ips: Vec<u64>,
    /// `bpf_get_stack`'s errno when it failed; 0 otherwise.
    pub error: u32,
}

/// Decodes one `EimProfileSample` record: the kernel stack, then the
/// `EimStack` after it (trimmed after its last frame, as the program
/// sends it).
pub fn decode_profile_sample(bytes: &[u8]) -> Result<(KernelStack, Stack), RecordError> {
    if bytes.len() < KERNEL_STACK_SIZE {
        return Err(RecordError::ShortSample {
            len: bytes.len(),
            need: KERNEL_STACK_SIZE,
        });
    }
    let count = u32_at(bytes, 0);
    let frames = usize::try_from(count)
        .ok()
        .filter(|n| *n <= MAX_KERNEL_FRAMES)
        .ok_or(RecordError::TooManyKernelFrames {
            count,
            max: MAX_KERNEL_FRAMES,
        })?;
    let ips = bytes[KERNEL_STACK_HEADER..KERNEL_STACK_HEADER + 8 * frames]
        .chunks_exact(8)
        .map(|ip| u64_at(ip, 0))
        .collect();
    let kernel = KernelStack {
        ips,
        error: u32_at(bytes, 4),
    };
    let (stack, _) = decode_stack(&bytes[KERNEL_STACK_SIZE..])?;
    Ok((kernel, stack))
}

/// Every record of a stream of `EimStack`s written end to end (the task
/// iterator's output); at most `limit` of them.
pub fn decode_stacks(mut bytes: &[u8], limit: usize) -> Result<Vec<Stack>, RecordError> {
    let mut stacks = Vec::new();
    while !bytes.is_empty() && stacks.len() < limit {
        let (stack, used) = decode_stack(bytes)?;
        stacks.push(stack);
        bytes = &bytes[used..];
    }
    Ok(stacks)
}

/// The fd of map `name` of `ebpf`, still held by it.
pub(crate) fn map_fd<'a>(ebpf: &'a Ebpf, name: &str) -> Result<BorrowedFd<'a>, KernelError> {
    match ebpf.map(name) {
        Some(
            Map::Array(m)
            | Map::HashMap(m)
            | Map::PerCpuArray(m)
            | Map::RingBuf(m)
            | Map::PerCpuHashMap(m),
        ) => Ok(m.fd().as_fd()),
        _ => Err(KernelError::Missing(format!("map {name}"))),
    }
}

/// Loads the capture program of a freshly loaded lookup object.
pub(crate) fn load_capture(ebpf: &mut Ebpf) -> Result<(), KernelError> {
    let program: &mut RawTracePoint = ebpf
        .program_mut(CAPTURE_PROGRAM)
        .ok_or_else(|| KernelError::Missing(format!("program {CAPTURE_PROGRAM}")))?
        .try_into()?;
    // On first use only: verifying it costs a start about a second.
    if program.fd().is_err() {
        program.load()?;
    }
    Ok(())
}

/// Runs the capture program of `ebpf` over `capture` (`BPF_PROG_TEST_RUN`).
pub(crate) fn run_capture(ebpf: &mut Ebpf, capture: &Capture) -> Result<Stack, KernelError> {
    load_capture(ebpf)?;
    let ebpf = &*ebpf;
    let input = encode_capture(capture)?;
    sys::update_elem(
        map_fd(ebpf, CAPTURE_IN)?,
        &0u32.to_le_bytes(),
        &input,
        sys::BPF_ANY,
    )?;
    let program: &RawTracePoint = ebpf
        .program(CAPTURE_PROGRAM)
        .ok_or_else(|| KernelError::Missing(format!("program {CAPTURE_PROGRAM}")))?
        .try_into()?;
    let run = program.test_run(RawTracePointRunOptions::new())?;
    if run.return_value != 0 {
        return Err(KernelError::Missing(format!(
            "entry 0 of {CAPTURE_IN} or {CAPTURE_OUT} (program returned {})",
            run.return_value
        )));
    }
    let bytes = sys::lookup_elem(map_fd(ebpf, CAPTURE_OUT)?, &0u32.to_le_bytes(), STACK_SIZE)?
        .ok_or_else(|| KernelError::Missing(format!("entry 0 of {CAPTURE_OUT}")))?;
    Ok(decode_stack(&bytes)?.0)
}

/// Walks every thread of process `pid` with the task iterator of `ebpf`
/// (loaded on first use: it needs the kernel's BTF), one stack per thread.
pub(crate) fn task_stacks(ebpf: &mut Ebpf, pid: u32) -> Result<Vec<Stack>, KernelError> {
    let failed = |what: &'static str| {
        move |e: &(dyn std::error::Error + 'static)| KernelError::StackIterator {
            pid,
            what,
            why: Causes(e).to_string(),
        }
    };
    let mut target = [0u8; 8];
    target[..4].copy_from_slice(&pid.to_le_bytes());
    sys::update_elem(
        map_fd(ebpf, STACK_TARGET)?,
        &0u32.to_le_bytes(),
        &target,
        sys::BPF_ANY,
    )?;
    let program: &mut Iter = ebpf
        .program_mut(ITER_PROGRAM)
        .ok_or_else(|| KernelError::Missing(format!("program {ITER_PROGRAM}")))?
        .try_into()?;
    if program.fd().is_err() {
        let btf = Btf::from_sys_fs().map_err(|e| failed("reading the kernel's BTF")(&e))?;
        program.load("task", &btf)?;
    }
    let link = program.attach()?;
    let link = program.take_link(link)?;
    let file = link
        .into_file()
        .map_err(|e| failed("creating the iterator")(&e))?;
    let mut bytes = Vec::new();
    file.take(MAX_ITER_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| failed("reading the iterator")(&e))?;
    if bytes.len() as u64 > MAX_ITER_BYTES {
        return Err(KernelError::StackIterator {
            pid,
            what: "reading the iterator",
            why: format!("more than {MAX_ITER_BYTES} bytes of stacks"),
        });
    }
    Ok(decode_stacks(&bytes, usize::MAX)?)
}

impl KernelMaps {
    /// Runs the unwinder over `capture` in the kernel (the capture program,
    /// `BPF_PROG_TEST_RUN`): the stack it walks over these maps, reading
    /// memory from the capture only.
    pub fn unwind_capture(&mut self, capture: &Capture) -> Result<Stack, KernelError> {
        run_capture(self.ebpf_mut(), capture)
    }

    /// The user stack of every thread of process `pid`, walked in the
    /// kernel by the task iterator from the registers each thread entered
    /// the kernel with, reading the process's memory
    /// (`bpf_copy_from_user_task`). A thread without user registers (a
    /// kernel thread) has an empty stack that stops with `NoRegs`. Threads
    /// that start or end meanwhile may be missing or present.
    pub fn task_stacks(&mut self, pid: u32) -> Result<Vec<Stack>, KernelError> {
        task_stacks(self.ebpf_mut(), pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eim_machine::unwind::{frame_flag, regs_flag, Arch};

    const HEADER: &str = include_str!("../../bpf/unwind.h");

    fn define(name: &str) -> u64 {
        crate::c_header::define(HEADER, "bpf/unwind.h", name)
    }

    fn asserted(line: &str) {
        assert!(HEADER.contains(line), "bpf/unwind.h lacks {line}");
    }

    #[test]
    fn the_numbers_agree_with_unwind_h() {
        assert_eq!(define("EIM_MAX_FRAMES"), MAX_FRAMES as u64);
        assert_eq!(define("EIM_CAPTURE_STACK"), CAPTURE_STACK as u64);
        assert_eq!(define("EIM_ARCH_X86_64"), u64::from(Arch::X86_64.code()));
        assert_eq!(define("EIM_ARCH_ARM64"), u64::from(Arch::Arm64.code()));
        assert_eq!(
            define("EIM_REGS_RETURN_ADDRESS"),
            u64::from(regs_flag::RETURN_ADDRESS)
        );
        assert_eq!(
            define("EIM_FRAME_RETURN_ADDRESS"),
            u64::from(frame_flag::RETURN_ADDRESS)
        );
        assert_eq!(define("EIM_FRAME_SIGNAL"), u64::from(frame_flag::SIGNAL));
        let stops = [
            ("EIM_STOP_END", StopReason::End),
            ("EIM_STOP_UNKNOWN_MAPPING", StopReason::UnknownMapping),
            ("EIM_STOP_NO_DELTA", StopReason::NoDelta(3)),
            ("EIM_STOP_INVALID", StopReason::Invalid),
            ("EIM_STOP_BUDGET", StopReason::Budget),
            ("EIM_STOP_READ_ERROR", StopReason::ReadError),
            ("EIM_STOP_UNSUPPORTED", StopReason::Unsupported),
            ("EIM_STOP_LR_MID_TRACE", StopReason::LrMidTrace),
            ("EIM_STOP_ZERO_PC", StopReason::ZeroPc),
            ("EIM_STOP_NO_REGS", StopReason::NoRegs),
        ];
        for (name, stop) in stops {
            assert_eq!(define(name), u64::from(stop.code()), "{name}");
            assert_eq!(
                StopReason::from_codes(stop.code(), stop.detail()),
                Some(stop)
            );
        }
        // Every EIM_STOP_ in the header is one of the above.
        let in_header = HEADER
            .lines()
            .filter(|l| l.trim_start().starts_with("#define EIM_STOP_"))
            .count();
        assert_eq!(in_header, stops.len());
        assert_eq!(StopReason::from_codes(stops.len() as u32, 0), None);

        asserted(&format!("EIM_ASSERT_SIZE(EimRegs, {REGS_SIZE});"));
        asserted("EIM_ASSERT_OFFSET(EimRegs, arch, 88);");
        asserted(&format!("EIM_ASSERT_SIZE(EimFrame, {FRAME_SIZE});"));
        asserted(&format!(
            "EIM_ASSERT_OFFSET(EimStack, frames, {STACK_HEADER});"
        ));
        asserted("EIM_ASSERT_SIZE(EimStack, 24 + 32 * EIM_MAX_FRAMES);");
        assert_eq!(STACK_SIZE, 24 + 32 * define("EIM_MAX_FRAMES") as usize);
        asserted("EIM_ASSERT_OFFSET(EimCapture, pid, 96);");
        asserted("EIM_ASSERT_OFFSET(EimCapture, stack_base, 104);");
        asserted(&format!(
            "EIM_ASSERT_OFFSET(EimCapture, stack, {CAPTURE_HEADER});"
        ));
        assert_eq!(define("EIM_MAX_KERNEL_FRAMES"), MAX_KERNEL_FRAMES as u64);
        asserted(&format!(
            "EIM_ASSERT_OFFSET(EimKernelStack, ips, {KERNEL_STACK_HEADER});"
        ));
        asserted("EIM_ASSERT_SIZE(EimKernelStack, 8 + 8 * EIM_MAX_KERNEL_FRAMES);");
        asserted(&format!(
            "EIM_ASSERT_OFFSET(EimProfileSample, stack, {KERNEL_STACK_SIZE});"
        ));
    }

    fn record(pid: u32, stop: u32, detail: u32, frames: &[[u64; 3]]) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [pid, pid + 1, stop, detail, frames.len() as u32, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for (i, [pc, file, addr]) in frames.iter().enumerate() {
            for v in [pc, file, addr] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&(i as u32).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        b
    }

    #[test]
    fn stacks_decode_field_by_field_and_end_to_end() {
        let mut bytes = record(7, 2, 5, &[[0x10, 3, 0x4], [0x20, 4, 0x8]]);
        bytes.extend(record(9, 0, 0, &[]));
        let stacks = decode_stacks(&bytes, 10).unwrap();
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[0].pid, 7);
        assert_eq!(stacks[0].tid, 8);
        assert_eq!(stacks[0].stop, StopReason::NoDelta(5));
        assert_eq!(
            stacks[0].frames[1],
            Frame {
                pc: 0x20,
                file_id: 4,
                address: 0x8,
                flags: 1
            }
        );
        assert_eq!(stacks[1].stop, StopReason::End);
        assert!(stacks[1].frames.is_empty());
        assert_eq!(decode_stacks(&bytes, 1).unwrap().len(), 1);
    }

    #[test]
    fn bad_records_are_errors() {
        let good = record(1, 0, 0, &[[1, 2, 3]]);
        assert_eq!(
            decode_stack(&good[..good.len() - 1]),
            Err(RecordError::Short {
                len: good.len() - 1,
                need: good.len()
            })
        );
        let mut many = good.clone();
        many[16..20].copy_from_slice(&129u32.to_le_bytes());
        assert_eq!(
            decode_stack(&many),
            Err(RecordError::TooManyFrames { count: 129 })
        );
        let mut unknown = good;
        unknown[8..12].copy_from_slice(&10u32.to_le_bytes());
        assert!(matches!(
            decode_stack(&unknown),
            Err(RecordError::UnknownStop { stop: 10, .. })
        ));
    }

    fn kernel_stack(count: u32, error: u32, ips: &[u64]) -> Vec<u8> {
        let mut b = vec![0u8; KERNEL_STACK_SIZE];
        b[0..4].copy_from_slice(&count.to_le_bytes());
        b[4..8].copy_from_slice(&error.to_le_bytes());
        for (slot, ip) in b[KERNEL_STACK_HEADER..].chunks_exact_mut(8).zip(ips) {
            slot.copy_from_slice(&ip.to_le_bytes());
        }
        b
    }

    #[test]
    fn profile_samples_decode_the_kernel_stack_then_the_user_one() {
        let ips = [0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020];
        let mut bytes = kernel_stack(2, 0, &ips);
        bytes.extend(record(7, 0, 0, &[[0x10, 3, 0x4]]));
        let (kernel, stack) = decode_profile_sample(&bytes).unwrap();
        assert_eq!(kernel.ips, ips, "only `count` of the slots");
        assert_eq!(kernel.error, 0);
        assert_eq!((stack.pid, stack.frames.len()), (7, 1));

        let mut failed = kernel_stack(0, 14, &[]);
        failed.extend(record(8, 0, 0, &[]));
        let (kernel, stack) = decode_profile_sample(&failed).unwrap();
        assert_eq!(
            kernel,
            KernelStack {
                ips: vec![],
                error: 14
            }
        );
        assert_eq!(stack.pid, 8);

        assert_eq!(
            decode_profile_sample(&bytes[..KERNEL_STACK_SIZE - 1]),
            Err(RecordError::ShortSample {
                len: KERNEL_STACK_SIZE - 1,
                need: KERNEL_STACK_SIZE
            })
        );
        let mut many = bytes.clone();
        many[0..4].copy_from_slice(&128u32.to_le_bytes());
        assert_eq!(
            decode_profile_sample(&many),
            Err(RecordError::TooManyKernelFrames {
                count: 128,
                max: MAX_KERNEL_FRAMES
            })
        );
        // The user stack after it is checked as any EimStack is.
        assert!(matches!(
            decode_profile_sample(&bytes[..KERNEL_STACK_SIZE + 4]),
            Err(RecordError::Short { .. })
        ));
    }

    #[test]
    fn captures_encode_at_the_header_offsets() {
        let mut regs = Regs::zero(Arch::Arm64);
        regs.pc = 0x1111;
        regs.r28 = 0x2828;
        regs.return_address = true;
        let capture = Capture {
            regs,
            pid: 5,
            tid: 6,
            stack_base: 0x7000,
            stack: vec![0xab; 16],
        };
        let b = encode_capture(&capture).unwrap();
        assert_eq!(b.len(), CAPTURE_SIZE);
        assert_eq!(u64_at(&b, 0), 0x1111);
        assert_eq!(u64_at(&b, 80), 0x2828);
        assert_eq!(u32_at(&b, 88), 2);
        assert_eq!(u32_at(&b, 92), 1);
        assert_eq!((u32_at(&b, 96), u32_at(&b, 100)), (5, 6));
        assert_eq!(u64_at(&b, 104), 0x7000);
        assert_eq!(u32_at(&b, 112), 16);
        assert_eq!(b[CAPTURE_HEADER + 15], 0xab);
        assert_eq!(b[CAPTURE_HEADER + 16], 0);
        let too_big = Capture {
            stack: vec![0; CAPTURE_STACK + 1],
            ..capture
        };
        assert!(matches!(
            encode_capture(&too_big),
            Err(RecordError::CaptureTooLarge { .. })
        ));
    }
}
