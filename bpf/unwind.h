/* SPDX-License-Identifier: Apache-2.0 */
/*
 * unwind.h: the interface of eim's native unwinder (unwinder.h and its
 * programs in lookup.bpf.c), shared with Rust: core/src/unwind.rs mirrors
 * every number and layout below, and a test parses this file and fails if
 * the two disagree.
 *
 * The unwinder walks a user stack frame by frame with eim's maps: the PC is
 * mapped to (file id, ELF address) through eim_process_mappings, the rule
 * is found with get_stack_delta (spec/UPSTREAM_FACTS.md 4.3, with the
 * return-address-minus-one fixup of 4.4 for every frame but the first) and
 * applied as SEED's unwind_one_frame does (4.5), up to EIM_MAX_FRAMES.
 */
#ifndef EIM_UNWIND_H
#define EIM_UNWIND_H

/* Frames one stack records at most (the frame budget). */
#define EIM_MAX_FRAMES 128

/* EimRegs.arch: which rules apply. */
#define EIM_ARCH_X86_64 1
#define EIM_ARCH_ARM64 2

/* EimRegs.flags */
/* The first frame's PC is a return address (the thread is in a syscall):
 * its lookup uses pc - 1 like a caller's. */
#define EIM_REGS_RETURN_ADDRESS 1

/*
 * The registers the rules read and write. x86-64 uses pc, sp, fp (rbp),
 * rax, r9, r11, r13, r15; arm64 pc, sp, fp (x29), lr (x30), r22, r28.
 * Unused ones are 0.
 */
typedef struct EimRegs {
	__u64 pc;
	__u64 sp;
	__u64 fp;
	__u64 lr;
	__u64 rax;
	__u64 r9;
	__u64 r11;
	__u64 r13;
	__u64 r15;
	__u64 r22;
	__u64 r28;
	__u32 arch;  /* EIM_ARCH_* */
	__u32 flags; /* EIM_REGS_* */
} EimRegs;

/* Why a stack ends (EimStack.stop). */
#define EIM_STOP_END 0            /* a STOP delta: the outermost frame */
#define EIM_STOP_UNKNOWN_MAPPING 1 /* PC in no followed file mapping (or pid unknown) */
#define EIM_STOP_NO_DELTA 2       /* get_stack_delta failed; detail = EIM_LOOKUP_ERR_* */
#define EIM_STOP_INVALID 3        /* an INVALID delta (no CFI there) */
#define EIM_STOP_BUDGET 4         /* EIM_MAX_FRAMES frames recorded */
#define EIM_STOP_READ_ERROR 5     /* reading the target's memory failed, or CFA 0 */
#define EIM_STOP_UNSUPPORTED 6    /* a command the architecture has no rule for */
#define EIM_STOP_LR_MID_TRACE 7   /* arm64: LR rule in a non-leaf frame */
#define EIM_STOP_ZERO_PC 8        /* the next PC is 0 */
#define EIM_STOP_NO_REGS 9        /* no user registers (kernel thread) */

/* EimFrame.flags */
#define EIM_FRAME_RETURN_ADDRESS 1 /* looked up at pc - 1 */
#define EIM_FRAME_SIGNAL 2         /* unwound through a signal frame */

/*
 * One frame: its PC, and where the PC was found (0 and 0 for the frame
 * the stack stopped at with UNKNOWN_MAPPING).
 */
typedef struct EimFrame {
	__u64 pc;
	__u64 file_id;
	__u64 address; /* ELF virtual address: pc - bias */
	__u32 flags;   /* EIM_FRAME_* */
	__u32 pad;
} EimFrame;

/*
 * One unwound stack: frames[0] is the innermost. The frame the unwinder
 * stopped at is recorded (its PC is known) unless stop is NO_REGS or
 * ZERO_PC.
 */
typedef struct EimStack {
	__u32 pid;    /* process (tgid) */
	__u32 tid;    /* thread */
	__u32 stop;   /* EIM_STOP_* */
	__u32 detail; /* NO_DELTA: the EIM_LOOKUP_ERR_* code; else 0 */
	__u32 count;  /* frames recorded */
	__u32 pad;
	EimFrame frames[EIM_MAX_FRAMES];
} EimStack;

/*
 * The differential test's input (the unwind_capture program, run with
 * BPF_PROG_TEST_RUN): registers and a copy of the target's memory from
 * stack_base. Reads outside [stack_base, stack_base + stack_len) fail.
 */
#define EIM_CAPTURE_STACK 32768
typedef struct EimCapture {
	EimRegs regs;
	__u32 pid;
	__u32 tid;
	__u64 stack_base;
	__u32 stack_len;
	__u32 pad;
	__u8 stack[EIM_CAPTURE_STACK];
} EimCapture;

/* The task iterator's filter (eim_stack_target, one entry): the process. */
typedef struct EimStackTarget {
	__u32 pid;
	__u32 pad;
} EimStackTarget;

/*
 * `eim profile --kernel`: the kernel stack of a sample (bpf_get_stack),
 * innermost first, sent ahead of its user stack as one ring record
 * (EimProfileSample, trimmed after the user stack's last frame). Without
 * the kernel bit of eim_profile_config, the record is the EimStack alone.
 * 127 frames: the kernel's default kernel.perf_event_max_stack, which
 * bounds bpf_get_stack anyway.
 */
#define EIM_MAX_KERNEL_FRAMES 127
typedef struct EimKernelStack {
	__u32 count; /* addresses in ips */
	__u32 error; /* bpf_get_stack's errno when it failed (count 0); else 0 */
	__u64 ips[EIM_MAX_KERNEL_FRAMES];
} EimKernelStack;

typedef struct EimProfileSample {
	EimKernelStack kernel;
	EimStack stack;
} EimProfileSample;

EIM_ASSERT_SIZE(EimRegs, 96);
EIM_ASSERT_OFFSET(EimRegs, arch, 88);
EIM_ASSERT_SIZE(EimFrame, 32);
EIM_ASSERT_OFFSET(EimStack, frames, 24);
EIM_ASSERT_SIZE(EimStack, 24 + 32 * EIM_MAX_FRAMES);
EIM_ASSERT_OFFSET(EimCapture, pid, 96);
EIM_ASSERT_OFFSET(EimCapture, stack_base, 104);
EIM_ASSERT_OFFSET(EimCapture, stack, 120);
EIM_ASSERT_OFFSET(EimKernelStack, ips, 8);
EIM_ASSERT_SIZE(EimKernelStack, 8 + 8 * EIM_MAX_KERNEL_FRAMES);
EIM_ASSERT_OFFSET(EimProfileSample, stack, 1024);

#endif /* EIM_UNWIND_H */
