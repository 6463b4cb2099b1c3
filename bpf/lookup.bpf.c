// SPDX-License-Identifier: Apache-2.0
/*
 * lookup.bpf.c: the native unwinder's stack-delta lookup (SEED
 * get_stack_delta, spec/UPSTREAM_FACTS.md 4.3, then the unwind-info read of
 * 4.5), run by user space with BPF_PROG_TEST_RUN to ask the kernel what it
 * resolves for (file id, address). It answers exactly as the simulated
 * reader (sim/src/reader.rs) does; the error codes are in lookup.h.
 *
 * Build: bpf/build.sh (the compiled object is committed).
 */
#include "eim_maps.h"
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_core_read.h>
#include "lookup.h"
#include "unwind.h"

/*
 * The kernel types the live walks read, relocated by CO-RE against the
 * running kernel's BTF: only the fields used. pt_regs___eim is the
 * kernel's struct pt_regs (x86-64 names); the uapi one, with other field
 * names, is the perf context's.
 */
struct task_struct {
	int pid;
	int tgid;
	void *mm;
} __attribute__((preserve_access_index));

struct pt_regs___eim {
	unsigned long r15;
	unsigned long r13;
	unsigned long bp;
	unsigned long r11;
	unsigned long r9;
	unsigned long ax;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

struct seq_file;
struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
} __attribute__((preserve_access_index));

#include "unwinder.h"

/* The profiler's capacities (Rust: eim_bpf::unwind). */
#define EIM_PROFILE_MAX_PIDS 4096
#define EIM_PROFILE_RING_BYTES (4 << 20)

/* One entry: the answer of the last run. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, EimLookupResult);
	__uint(max_entries, 1);
} eim_lookup_result SEC(".maps");

static __always_inline int finish(EimLookupResult *r, __u32 code)
{
	__u32 zero = 0;
	r->code = code;
	bpf_map_update_elem(&eim_lookup_result, &zero, r, BPF_ANY);
	return (int)code;
}

SEC("raw_tracepoint/eim_lookup")
int eim_lookup(struct bpf_raw_tracepoint_args *ctx)
{
	EimLookupResult r;
	__builtin_memset(&r, 0, sizeof(r));

	__u64 file_id = ctx->args[0];
	__u64 address = ctx->args[1];

	/* Interpreter ranges: read for the ABI agreement test only. */
	OffsetRange *offsets = bpf_map_lookup_elem(&interpreter_offsets, &file_id);
	if (offsets) {
		r.offsets = *offsets;
		r.have |= EIM_LOOKUP_HAVE_OFFSETS;
	}

	return finish(&r, eim_get_stack_delta(file_id, address, &r));
}

/*
 * The unwinder run on captured memory (BPF_PROG_TEST_RUN): the one entry
 * of eim_unwind_capture_in is the input, the one of eim_unwind_capture_out
 * the answer. Over the same maps as the live walks, only the memory differs.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, EimCapture);
	__uint(max_entries, 1);
} eim_unwind_capture_in SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, EimStack);
	__uint(max_entries, 1);
} eim_unwind_capture_out SEC(".maps");

SEC("raw_tracepoint/eim_unwind_capture")
int eim_unwind_capture(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0;
	(void)ctx;
	EimCapture *in = bpf_map_lookup_elem(&eim_unwind_capture_in, &zero);
	EimStack *out = bpf_map_lookup_elem(&eim_unwind_capture_out, &zero);
	if (!in || !out)
		return 1;
	struct eim_walk w;
	__builtin_memset(&w, 0, sizeof(w));
	w.regs = in->regs;
	w.out = out;
	w.capture = in;
	w.pid = in->pid;
	out->pid = in->pid;
	out->tid = in->tid;
	out->pad = 0;
	eim_walk_capture(&w);
	return 0;
}

/* One EimStack per CPU to walk into: too big for the BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, EimStack);
	__uint(max_entries, 1);
} eim_unwind_scratch SEC(".maps");

/* The bytes of a walked stack that are worth sending: header and frames. */
static __always_inline __u32 eim_stack_bytes(const EimStack *stack)
{
	__u32 count = stack->count;
	if (count > EIM_MAX_FRAMES)
		count = EIM_MAX_FRAMES;
	return sizeof(EimStack) - sizeof(EimFrame) * (EIM_MAX_FRAMES - count);
}

/* x86-64 user registers saved at the kernel entry of a task. */
static __always_inline void eim_regs_from_task(EimRegs *regs, struct task_struct *task)
{
	struct pt_regs___eim *r = (struct pt_regs___eim *)bpf_task_pt_regs(task);
	regs->pc = r->ip;
	regs->sp = r->sp;
	regs->fp = r->bp;
	regs->rax = r->ax;
	regs->r9 = r->r9;
	regs->r11 = r->r11;
	regs->r13 = r->r13;
	regs->r15 = r->r15;
	regs->arch = EIM_ARCH_X86_64;
	/* In a syscall the PC is where it returns to (spec 4.4). */
	regs->flags = r->orig_ax != (unsigned long)-1 ? EIM_REGS_RETURN_ADDRESS : 0;
}

/* The task iterator's filter: the process whose threads are walked. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, EimStackTarget);
	__uint(max_entries, 1);
} eim_stack_target SEC(".maps");

/*
 * `eim stack`: every thread of the target process, walked from the
 * registers it entered the kernel with, reading its memory with
 * bpf_copy_from_user_task (so sleepable: it may fault pages in). One
 * EimStack record (header and frames only) per thread, end to end.
 */
SEC("iter.s/task")
int eim_stack_iter(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	__u32 zero = 0;
	if (!task)
		return 0;
	EimStackTarget *target = bpf_map_lookup_elem(&eim_stack_target, &zero);
	if (!target || (__u32)task->tgid != target->pid)
		return 0;
	EimStack *out = bpf_map_lookup_elem(&eim_unwind_scratch, &zero);
	if (!out)
		return 0;
	out->pid = task->tgid;
	out->tid = task->pid;
	out->pad = 0;
	if (!task->mm) {
		/* A kernel thread, or a thread past exit: no user registers. */
		out->count = 0;
		out->stop = EIM_STOP_NO_REGS;
		out->detail = 0;
	} else {
		struct eim_walk w;
		__builtin_memset(&w, 0, sizeof(w));
		eim_regs_from_task(&w.regs, task);
		w.out = out;
		w.task = task;
		w.pid = out->pid;
		eim_walk_task(&w);
	}
	bpf_seq_write(ctx->meta->seq, out, eim_stack_bytes(out));
	return 0;
}

/* `eim profile`: which processes are sampled (pid -> any value), unless
 * EIM_PROFILE_ALL is set. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, EIM_PROFILE_MAX_PIDS);
} eim_profile_pids SEC(".maps");

/* The one entry of eim_profile_config: EIM_PROFILE_* bits. */
#define EIM_PROFILE_ALL 1    /* every process, not only eim_profile_pids' */
#define EIM_PROFILE_KERNEL 2 /* each sample's kernel stack too */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} eim_profile_config SEC(".maps");

/*
 * One sample per CPU to build: too big for the BPF stack. Not
 * eim_unwind_scratch: the sleepable task iterator may be interrupted by a
 * sample on its CPU midway through its walk.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, EimProfileSample);
	__uint(max_entries, 1);
} eim_profile_scratch SEC(".maps");

/*
 * The sampled stacks, one record each: an EimStack (header and frames),
 * with EIM_PROFILE_KERNEL an EimProfileSample (the same, after the kernel
 * stack).
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EIM_PROFILE_RING_BYTES);
} eim_profile_stacks SEC(".maps");

/* Stacks that did not fit in the ring, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} eim_profile_lost SEC(".maps");

/*
 * A sample (cpu-clock): the user stack of the interrupted thread, if its
 * process is sampled. From the sample's registers when it interrupted user
 * code; from the registers saved at kernel entry when it interrupted the
 * kernel (a syscall, a fault) on behalf of a user thread. With
 * EIM_PROFILE_KERNEL, the kernel stack at the sample goes ahead of it in
 * the record (none when the sample interrupted user code).
 */
SEC("perf_event")
int eim_profile_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 zero = 0;
	if (tgid == 0)
		return 0;
	__u32 *config = bpf_map_lookup_elem(&eim_profile_config, &zero);
	__u32 flags = config ? *config : 0;
	if (!(flags & EIM_PROFILE_ALL) && !bpf_map_lookup_elem(&eim_profile_pids, &tgid))
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	if (!task->mm)
		return 0; /* a kernel thread has no user stack */
	EimProfileSample *sample = bpf_map_lookup_elem(&eim_profile_scratch, &zero);
	if (!sample)
		return 0;
	EimStack *out = &sample->stack;
	struct eim_walk w;
	__builtin_memset(&w, 0, sizeof(w));
	if ((ctx->regs.cs & 3) == 3) {
		w.regs.pc = ctx->regs.rip;
		w.regs.sp = ctx->regs.rsp;
		w.regs.fp = ctx->regs.rbp;
		w.regs.rax = ctx->regs.rax;
		w.regs.r9 = ctx->regs.r9;
		w.regs.r11 = ctx->regs.r11;
		w.regs.r13 = ctx->regs.r13;
		w.regs.r15 = ctx->regs.r15;
		w.regs.arch = EIM_ARCH_X86_64;
	} else {
		eim_regs_from_task(&w.regs, task);
	}
	out->pid = tgid;
	out->tid = (__u32)id;
	w.out = out;
	w.pid = tgid;
	eim_walk_current(&w);
	long sent;
	if (flags & EIM_PROFILE_KERNEL) {
		/* Flags 0: the kernel stack, from the sample's registers. */
		long got = bpf_get_stack(ctx, sample->kernel.ips, sizeof(sample->kernel.ips), 0);
		sample->kernel.count = got > 0 ? (__u32)(got / sizeof(__u64)) : 0;
		sample->kernel.error = got < 0 ? (__u32)-got : 0;
		sent = bpf_ringbuf_output(&eim_profile_stacks, sample,
					  sizeof(EimKernelStack) + eim_stack_bytes(out), 0);
	} else {
		sent = bpf_ringbuf_output(&eim_profile_stacks, out, eim_stack_bytes(out), 0);
	}
	if (sent) {
		__u64 *lost = bpf_map_lookup_elem(&eim_profile_lost, &zero);
		if (lost)
			*lost += 1;
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
