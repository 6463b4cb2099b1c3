// SPDX-License-Identifier: Apache-2.0
/*
 * events.bpf.c: the host events eim's watch follows instead of polling
 * /proc (process exec, fork and exit; new executable file mappings), into
 * one ring buffer (events.h).
 *
 * Hook points, chosen to work on every kernel from 5.8 (the ring buffer's)
 * on, with BTF:
 *
 * - exec: the tracepoint sched/sched_process_exec. Its context is not
 *   read: the pid is the current task's thread-group id.
 * - exit: sched/sched_process_exit fires for every exiting thread; only the
 *   thread-group leader's is reported (pid == tid). A leader that exits
 *   before its other threads leaves a process user space still finds in
 *   /proc, and keeps.
 * - fork: the BTF tracepoint sched_process_fork (tp_btf), whose arguments
 *   are the parent and child task_structs; a child that is its own
 *   thread-group leader is a process (a new thread is not reported). The
 *   plain tracepoint's record changed its layout across kernels (the comm
 *   fields became __data_loc in 6.x), and only the task_structs (read
 *   through CO-RE, relocated by the loader against the running kernel's
 *   BTF) tell a thread from a process.
 * - new executable mappings: the syscall tracepoints of mmap and mprotect,
 *   whose records have had one layout since they exist. The enter side
 *   keeps, per thread, what an mmap of a file with PROT_EXEC (or an
 *   mprotect adding PROT_EXEC) asked; the exit side reports it only if the
 *   call succeeded, with the address the kernel chose: by then the mapping
 *   is in /proc/PID/maps. (mmap's kernel functions were renamed and split
 *   across versions; fentry on them would tie eim to one kernel.)
 *
 * A record that does not fit in the ring buffer is counted in
 * eim_host_events_lost; user space then resyncs from /proc.
 *
 * Build: bpf/build.sh (the compiled object is committed).
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "events.h"

/* From <sys/mman.h>: the kernel's uapi values, the same on every arch eim
 * supports. */
#define EIM_PROT_EXEC 0x4
#define EIM_MAP_ANONYMOUS 0x20

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EIM_EVENTS_RING_BYTES);
} eim_host_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} eim_host_events_lost SEC(".maps");

/* What an mmap or mprotect asked, from its enter to its exit, per thread.
 * LRU: a thread killed inside the call never reaches its exit. */
struct pending {
	__u64 addr;
	__u64 len;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, __u32);
	__type(value, struct pending);
	__uint(max_entries, 8192);
} eim_pending_maps SEC(".maps");

/* The syscall tracepoints' records (tracefs events/syscalls/.../format). */
struct sys_enter_mmap_args {
	__u64 common;
	__s32 syscall_nr;
	__u32 pad;
	__u64 addr;
	__u64 len;
	__u64 prot;
	__u64 flags;
	__u64 fd;
	__u64 off;
};

struct sys_enter_mprotect_args {
	__u64 common;
	__s32 syscall_nr;
	__u32 pad;
	__u64 start;
	__u64 len;
	__u64 prot;
};

struct sys_exit_args {
	__u64 common;
	__s32 syscall_nr;
	__u32 pad;
	__s64 ret;
};

/* Only the fields read, relocated against the kernel's BTF. */
struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

static __always_inline void report(__u32 kind, __u32 pid, __u32 parent, __u64 addr, __u64 len)
{
	EimHostEvent *e = bpf_ringbuf_reserve(&eim_host_events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *lost = bpf_map_lookup_elem(&eim_host_events_lost, &zero);
		if (lost)
			*lost += 1;
		return;
	}
	e->kind = kind;
	e->pid = pid;
	e->parent = parent;
	e->pad = 0;
	e->addr = addr;
	e->len = len;
	e->at_ns = bpf_ktime_get_ns();
	bpf_ringbuf_submit(e, 0);
}

static __always_inline __u32 current_pid(void)
{
	return (__u32)(bpf_get_current_pid_tgid() >> 32);
}

SEC("tracepoint/sched/sched_process_exec")
int eim_on_exec(void *ctx)
{
	(void)ctx;
	report(EIM_EVENT_EXEC, current_pid(), 0, 0, 0);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int eim_on_exit(void *ctx)
{
	(void)ctx;
	__u64 id = bpf_get_current_pid_tgid();
	if ((__u32)(id >> 32) == (__u32)id)
		report(EIM_EVENT_EXIT, (__u32)(id >> 32), 0, 0, 0);
	return 0;
}

/* ctx[0] is the parent, ctx[1] the child (the tracepoint's arguments). */
SEC("tp_btf/sched_process_fork")
int eim_on_fork(__u64 *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx[0];
	struct task_struct *child = (struct task_struct *)ctx[1];
	int pid = child->pid;
	int tgid = child->tgid;
	if (pid == tgid)
		report(EIM_EVENT_FORK, (__u32)tgid, (__u32)parent->tgid, 0, 0);
	return 0;
}

static __always_inline void remember(__u64 addr, __u64 len)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pending p = { .addr = addr, .len = len };
	bpf_map_update_elem(&eim_pending_maps, &tid, &p, BPF_ANY);
}

/* The pending call of this thread, removed; 0 if there is none. */
static __always_inline int recall(struct pending *out)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct pending *p = bpf_map_lookup_elem(&eim_pending_maps, &tid);
	if (!p)
		return 0;
	*out = *p;
	bpf_map_delete_elem(&eim_pending_maps, &tid);
	return 1;
}

SEC("tracepoint/syscalls/sys_enter_mmap")
int eim_on_mmap_enter(struct sys_enter_mmap_args *ctx)
{
	if (!(ctx->prot & EIM_PROT_EXEC) || (ctx->flags & EIM_MAP_ANONYMOUS))
		return 0;
	if ((__s32)ctx->fd < 0)
		return 0;
	remember(ctx->addr, ctx->len);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_mmap")
int eim_on_mmap_exit(struct sys_exit_args *ctx)
{
	struct pending p;
	if (!recall(&p))
		return 0;
	/* An error is -4095..-1; an address is never in that range. */
	if (ctx->ret < 0 && ctx->ret >= -4095)
		return 0;
	report(EIM_EVENT_MMAP, current_pid(), 0, (__u64)ctx->ret, p.len);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_mprotect")
int eim_on_mprotect_enter(struct sys_enter_mprotect_args *ctx)
{
	if (ctx->prot & EIM_PROT_EXEC)
		remember(ctx->start, ctx->len);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_mprotect")
int eim_on_mprotect_exit(struct sys_exit_args *ctx)
{
	struct pending p;
	if (!recall(&p) || ctx->ret != 0)
		return 0;
	report(EIM_EVENT_MPROTECT, current_pid(), 0, p.addr, p.len);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
