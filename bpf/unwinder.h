/* SPDX-License-Identifier: Apache-2.0 */
/*
 * unwinder.h: eim's native unwinder over its maps (interface: unwind.h).
 *
 * The parts that read no target memory live here: the PC -> mapping
 * bisection of eim_process_mappings, get_stack_delta (the one copy in C:
 * the lookup program and the walks all call it) and the register-address
 * arithmetic. The walk itself reads the target's memory, and each program
 * may call only some of the helpers that do so, so unwinder_walk.h is a
 * template stamped out once per kind of read (EIM_WALK_KIND = capture,
 * task or current): no program carries a branch on a run-time mode, and
 * the verifier never sees a helper its program type may not call.
 *
 * Include after eim_maps.h, lookup.h and unwind.h, in the one object that
 * defines the maps (lookup.bpf.c).
 */
#ifndef EIM_UNWINDER_H
#define EIM_UNWINDER_H

/* Binary-search steps of get_stack_delta: enough for 65535 deltas a page. */
#define EIM_DELTA_SEARCH_STEPS 16
/* Bisection steps over one process's mappings: 10 cover 1023 >= 512. */
#define EIM_MAPPING_SEARCH_STEPS 10
_Static_assert(EIM_MAX_PROCESS_MAPPINGS < (1 << EIM_MAPPING_SEARCH_STEPS),
	       "the mapping bisection must reach every mapping");
/* The frames index is masked with this: the budget must be a power of 2. */
_Static_assert((EIM_MAX_FRAMES & (EIM_MAX_FRAMES - 1)) == 0,
	       "EIM_MAX_FRAMES must be a power of two");

/*
 * arm64 return addresses may carry pointer-authentication bits above the
 * 48-bit user address space; they are cleared before use. (Upstream reads
 * the mask from its system config; eim assumes 48-bit user addresses.)
 */
#define EIM_ARM64_ADDRESS_MASK 0x0000ffffffffffffULL

/* The outer map of a size class; NULL for a class outside 8..23. */
static __always_inline void *eim_outer_lookup(__u16 map_id, __u64 *file_id)
{
	switch (map_id) {
#define EIM_CASE(N) \
	case N: \
		return bpf_map_lookup_elem(&exe_id_to_##N##_stack_deltas, file_id)
	EIM_CASE(8);
	EIM_CASE(9);
	EIM_CASE(10);
	EIM_CASE(11);
	EIM_CASE(12);
	EIM_CASE(13);
	EIM_CASE(14);
	EIM_CASE(15);
	EIM_CASE(16);
	EIM_CASE(17);
	EIM_CASE(18);
	EIM_CASE(19);
	EIM_CASE(20);
	EIM_CASE(21);
	EIM_CASE(22);
	EIM_CASE(23);
#undef EIM_CASE
	default:
		return (void *)0;
	}
}

/*
 * SEED get_stack_delta (spec 4.3) for `address` (already minus one for a
 * return address, 4.4) of `file_id`, then the unwind-slot read and the
 * merge adjustment of 4.5. Fills `r` (which the caller zeroed) as far as
 * it got and returns the EIM_LOOKUP_* code; r->code is left to the caller.
 *
 * A global function: the verifier checks it once, on its own, instead of
 * once per path of every caller (inlined into the frame step, its search
 * loop times the step's branches exceeded the 1M-instruction limit).
 */
__noinline __u32 eim_get_stack_delta(__u64 file_id, __u64 address, EimLookupResult *r)
{
	if (!r)
		return EIM_LOOKUP_ERR_TEXT_SECTION;
	/* 1. The page entry. */
	StackDeltaPageKey key;
	__builtin_memset(&key, 0, sizeof(key));
	key.fileID = file_id;
	key.page = address & ~STACK_DELTA_PAGE_MASK;
	r->page = key.page;
	StackDeltaPageInfo *info = bpf_map_lookup_elem(&stack_delta_page_to_info, &key);
	if (!info)
		return EIM_LOOKUP_ERR_TEXT_SECTION;
	StackDeltaPageInfo page = *info;
	r->page_info = page;
	r->have |= EIM_LOOKUP_HAVE_PAGE;

	/* 2. The outer map of the page's size class, 3. the file's array. */
	void *inner = eim_outer_lookup(page.mapID, &file_id);
	if (page.mapID < STACK_DELTA_BUCKET_SMALLEST ||
	    page.mapID > STACK_DELTA_BUCKET_LARGEST)
		return EIM_LOOKUP_ERR_OUTER_MAP;
	if (!inner)
		return EIM_LOOKUP_ERR_INNER_MAP;

	/* 4. Bounded binary search for the first delta past the address. */
	__u16 page_offset = address & STACK_DELTA_PAGE_MASK;
	__u32 idx = page.firstDelta;
	if (page.numDeltas != 0) {
		__u32 lo = page.firstDelta;
		__u32 hi = lo + page.numDeltas;
		__u32 i;
		for (i = 0; i < EIM_DELTA_SEARCH_STEPS; i++) {
			__u32 pivot = (lo + hi) >> 1;
			StackDelta *d = bpf_map_lookup_elem(inner, &pivot);
			if (!d) {
				hi = 0;
				break;
			}
			if (page_offset >= d->addrLow)
				lo = pivot + 1;
			else
				hi = pivot;
			if (lo >= hi)
				break;
		}
		r->steps = i < EIM_DELTA_SEARCH_STEPS ? i + 1 : EIM_DELTA_SEARCH_STEPS;
		if (i >= EIM_DELTA_SEARCH_STEPS || hi == 0)
			return EIM_LOOKUP_ERR_ITERATIONS;
		idx = hi;
	}

	/* 5. The delta in force: the one before, possibly in an earlier page. */
	idx -= 1;
	r->index = idx;
	StackDelta *found = bpf_map_lookup_elem(inner, &idx);
	if (!found)
		return EIM_LOOKUP_ERR_RANGE;
	StackDelta delta = *found;
	r->delta = delta;
	r->have |= EIM_LOOKUP_HAVE_DELTA;

	__s32 addr_diff = (__s32)page_offset - (__s32)delta.addrLow;
	if (idx < page.firstDelta)
		addr_diff += STACK_DELTA_PAGE_SIZE;
	r->addr_diff = addr_diff;

	/* 6. Commands. */
	if (delta.unwindInfo == STACK_DELTA_INVALID)
		return EIM_LOOKUP_ERR_STACK_DELTA_INVALID;
	if (delta.unwindInfo & STACK_DELTA_COMMAND_FLAG) {
		r->command = delta.unwindInfo & ~STACK_DELTA_COMMAND_FLAG;
		r->kind = delta.unwindInfo == STACK_DELTA_STOP ? EIM_LOOKUP_KIND_STOP
							       : EIM_LOOKUP_KIND_COMMAND;
		return EIM_LOOKUP_OK;
	}

	/* 7. The rule in its slot, with the merge adjustment. */
	__u32 slot = delta.unwindInfo;
	r->slot = delta.unwindInfo;
	UnwindInfo *ui = bpf_map_lookup_elem(&unwind_info_array, &slot);
	if (!ui)
		return EIM_LOOKUP_ERR_BAD_UNWIND_INFO_INDEX;
	UnwindInfo rule = *ui;
	r->raw_info = rule;
	r->have |= EIM_LOOKUP_HAVE_SLOT;
	__u8 merge = rule.mergeOpcode;
	if (merge != 0 && addr_diff >= (__s32)(merge & ~MERGEOPCODE_NEGATIVE))
		rule.param += (merge & MERGEOPCODE_NEGATIVE) ? -8 : 8;
	rule.mergeOpcode = 0;
	r->info = rule;
	r->kind = EIM_LOOKUP_KIND_RULE;
	return EIM_LOOKUP_OK;
}

/*
 * The mapping of process `pid` that holds `pc`, copied to `out`; -1 when
 * the process is unknown or no mapping holds it. The mappings are sorted
 * and disjoint, so a bisection finds the only candidate. Global for the
 * same reason as eim_get_stack_delta.
 */
__noinline int eim_find_mapping(__u32 pid, __u64 pc, ProcessMapping *out)
{
	if (!out)
		return -1;
	ProcessMappings *pm = bpf_map_lookup_elem(&eim_process_mappings, &pid);
	if (!pm)
		return -1;
	__u32 lo = 0;
	__u32 hi = pm->count;
	if (hi > EIM_MAX_PROCESS_MAPPINGS)
		hi = EIM_MAX_PROCESS_MAPPINGS;
	for (int i = 0; i < EIM_MAPPING_SEARCH_STEPS; i++) {
		if (lo >= hi)
			break;
		__u32 mid = ((lo + hi) >> 1) & (EIM_MAX_PROCESS_MAPPINGS - 1);
		ProcessMapping *m = &pm->mappings[mid];
		if (pc < m->start) {
			hi = mid;
		} else if (pc >= m->end) {
			lo = mid + 1;
		} else {
			*out = *m;
			return 0;
		}
	}
	return -1;
}

/*
 * One walk's state, handed to every bpf_loop iteration. Only the member
 * of the walk's kind among `capture` and `task` is set.
 *
 * The walk's flags (EIM_WALK_*) and whether it stopped live in the output
 * record (out->pad, out->stop), not here: map memory is not tracked by
 * the verifier, so a flag set on one path and clear on another does not
 * make it check the next iteration twice (held here, the flags made the
 * capture walk cost 236,000 verified instructions). out->pad is 0 again
 * when the walk ends.
 */
struct eim_walk {
	EimRegs regs;
	EimStack *out;
	const EimCapture *capture;
	struct task_struct *task;
	__u32 pid;
	__u32 pad;
};

/* out->pad during a walk. The first two are the frame's EIM_FRAME_* bits. */
#define EIM_WALK_RETURN_ADDRESS 1 /* look the next PC up at pc - 1 */
#define EIM_WALK_SIGNAL 2         /* the next frame is past a signal frame */
#define EIM_WALK_LR_INVALID 4     /* arm64: LR is not this frame's return address */
_Static_assert(EIM_WALK_RETURN_ADDRESS == EIM_FRAME_RETURN_ADDRESS &&
		       EIM_WALK_SIGNAL == EIM_FRAME_SIGNAL,
	       "a frame's flags are the walk's flags when it was reached");
/* out->stop until the walk stops: no EIM_STOP_* code. */
#define EIM_WALK_RUNNING 0xffffffffU

static __always_inline long eim_stop(struct eim_walk *w, __u32 stop, __u32 detail)
{
	w->out->stop = stop;
	w->out->detail = detail;
	return 1;
}

/* A caller's frame was reached: its PC is a return address, LR is spent. */
static __always_inline void eim_mark_caller(struct eim_walk *w)
{
	w->out->pad = EIM_WALK_RETURN_ADDRESS | EIM_WALK_LR_INVALID;
}

/* The x86-64 BASE_REG base: a register plus (param & ~15) / 2. */
static __always_inline __u64 eim_x86_reg(const EimRegs *regs, __s32 param)
{
	__s64 offset = (__s64)(param & ~15) >> 1;
	switch (param & 15) {
	case 0:
		return regs->rax + offset;
	case 9:
		return regs->r9 + offset;
	case 11:
		return regs->r11 + offset;
	case 15:
		return regs->r15 + offset;
	default:
		return 0;
	}
}

/* arm64: a code pointer without its pointer-authentication bits. */
static __always_inline __u64 eim_normalize_pac(__u64 ptr)
{
	return ptr & EIM_ARM64_ADDRESS_MASK;
}

/* The walks, one per kind of memory read (see unwinder_walk.h). */

/* capture: reads come from the EimCapture copy; outside it they fail. */
static __always_inline int eim_read_capture(struct eim_walk *w, __u64 addr, __u64 *value)
{
	const EimCapture *c = w->capture;
	__u64 len = c->stack_len;
	__u64 off = addr - c->stack_base;
	*value = 0;
	if (len > EIM_CAPTURE_STACK)
		len = EIM_CAPTURE_STACK;
	if (addr < c->stack_base || len < 8 || off > len - 8)
		return -1;
	if (off > EIM_CAPTURE_STACK - 8)
		return -1;
	return bpf_probe_read_kernel(value, 8, &c->stack[off]) ? -1 : 0;
}
#define EIM_WALK_KIND capture
#include "unwinder_walk.h"
#undef EIM_WALK_KIND

/* task: another process's memory, from a sleepable program. */
static __always_inline int eim_read_task(struct eim_walk *w, __u64 addr, __u64 *value)
{
	if (bpf_copy_from_user_task(value, 8, (const void *)addr, w->task, 0)) {
		*value = 0;
		return -1;
	}
	return 0;
}
#define EIM_WALK_KIND task
#include "unwinder_walk.h"
#undef EIM_WALK_KIND

/* current: the interrupted process's own memory, without faulting. */
static __always_inline int eim_read_current(struct eim_walk *w, __u64 addr, __u64 *value)
{
	(void)w;
	return bpf_probe_read_user(value, 8, (const void *)addr) ? -1 : 0;
}
#define EIM_WALK_KIND current
#include "unwinder_walk.h"
#undef EIM_WALK_KIND

#endif /* EIM_UNWINDER_H */
