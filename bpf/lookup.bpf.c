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
#include "lookup.h"

/* One entry: the answer of the last run. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, EimLookupResult);
	__uint(max_entries, 1);
} eim_lookup_result SEC(".maps");

#define MAX_SEARCH_STEPS 16

/* The outer map of a size class; NULL for a class outside 8..23. */
static __always_inline void *outer_lookup(__u16 map_id, __u64 *file_id)
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

	/* 1. The page entry. */
	StackDeltaPageKey key;
	__builtin_memset(&key, 0, sizeof(key));
	key.fileID = file_id;
	key.page = address & ~STACK_DELTA_PAGE_MASK;
	r.page = key.page;
	StackDeltaPageInfo *info = bpf_map_lookup_elem(&stack_delta_page_to_info, &key);
	if (!info)
		return finish(&r, EIM_LOOKUP_ERR_TEXT_SECTION);
	StackDeltaPageInfo page = *info;
	r.page_info = page;
	r.have |= EIM_LOOKUP_HAVE_PAGE;

	/* 2. The outer map of the page's size class, 3. the file's array. */
	void *inner = outer_lookup(page.mapID, &file_id);
	if (page.mapID < STACK_DELTA_BUCKET_SMALLEST ||
	    page.mapID > STACK_DELTA_BUCKET_LARGEST)
		return finish(&r, EIM_LOOKUP_ERR_OUTER_MAP);
	if (!inner)
		return finish(&r, EIM_LOOKUP_ERR_INNER_MAP);

	/* 4. Bounded binary search for the first delta past the address. */
	__u16 page_offset = address & STACK_DELTA_PAGE_MASK;
	__u32 idx = page.firstDelta;
	if (page.numDeltas != 0) {
		__u32 lo = page.firstDelta;
		__u32 hi = lo + page.numDeltas;
		__u32 i;
		for (i = 0; i < MAX_SEARCH_STEPS; i++) {
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
		r.steps = i < MAX_SEARCH_STEPS ? i + 1 : MAX_SEARCH_STEPS;
		if (i >= MAX_SEARCH_STEPS || hi == 0)
			return finish(&r, EIM_LOOKUP_ERR_ITERATIONS);
		idx = hi;
	}

	/* 5. The delta in force: the one before, possibly in an earlier page. */
	idx -= 1;
	r.index = idx;
	StackDelta *found = bpf_map_lookup_elem(inner, &idx);
	if (!found)
		return finish(&r, EIM_LOOKUP_ERR_RANGE);
	StackDelta delta = *found;
	r.delta = delta;
	r.have |= EIM_LOOKUP_HAVE_DELTA;

	__s32 addr_diff = (__s32)page_offset - (__s32)delta.addrLow;
	if (idx < page.firstDelta)
		addr_diff += STACK_DELTA_PAGE_SIZE;
	r.addr_diff = addr_diff;

	/* 6. Commands. */
	if (delta.unwindInfo == STACK_DELTA_INVALID)
		return finish(&r, EIM_LOOKUP_ERR_STACK_DELTA_INVALID);
	if (delta.unwindInfo & STACK_DELTA_COMMAND_FLAG) {
		r.command = delta.unwindInfo & ~STACK_DELTA_COMMAND_FLAG;
		r.kind = delta.unwindInfo == STACK_DELTA_STOP ? EIM_LOOKUP_KIND_STOP
							      : EIM_LOOKUP_KIND_COMMAND;
		return finish(&r, EIM_LOOKUP_OK);
	}

	/* 7. The rule in its slot, with the merge adjustment. */
	__u32 slot = delta.unwindInfo;
	r.slot = delta.unwindInfo;
	UnwindInfo *ui = bpf_map_lookup_elem(&unwind_info_array, &slot);
	if (!ui)
		return finish(&r, EIM_LOOKUP_ERR_BAD_UNWIND_INFO_INDEX);
	UnwindInfo rule = *ui;
	r.raw_info = rule;
	r.have |= EIM_LOOKUP_HAVE_SLOT;
	__u8 merge = rule.mergeOpcode;
	if (merge != 0 && addr_diff >= (__s32)(merge & ~MERGEOPCODE_NEGATIVE))
		rule.param += (merge & MERGEOPCODE_NEGATIVE) ? -8 : 8;
	rule.mergeOpcode = 0;
	r.info = rule;
	r.kind = EIM_LOOKUP_KIND_RULE;
	return finish(&r, EIM_LOOKUP_OK);
}

char LICENSE[] SEC("license") = "GPL";
