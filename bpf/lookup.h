/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lookup.h: the interface of the lookup program (lookup.bpf.c), shared with
 * Rust (bpf-backend/src/lookup.rs mirrors every number below; a test there
 * parses this file and fails if the two disagree).
 *
 * Input: the raw-tracepoint context's u64 arguments, as BPF_PROG_TEST_RUN
 * passes them: args[0] = file id, args[1] = address (an ELF virtual
 * address, pc - bias).
 *
 * Output: the return value is an EIM_LOOKUP_* code; the one entry of
 * eim_lookup_result holds the details (struct EimLookupResult).
 */
#ifndef EIM_LOOKUP_H
#define EIM_LOOKUP_H

/* Return codes: success, then one per sim LookupError variant. */
#define EIM_LOOKUP_OK 0
#define EIM_LOOKUP_ERR_TEXT_SECTION 1        /* ERR_NATIVE_LOOKUP_TEXT_SECTION */
#define EIM_LOOKUP_ERR_OUTER_MAP 2           /* ERR_NATIVE_LOOKUP_STACK_DELTA_OUTER_MAP */
#define EIM_LOOKUP_ERR_INNER_MAP 3           /* ERR_NATIVE_LOOKUP_STACK_DELTA_INNER_MAP */
#define EIM_LOOKUP_ERR_ITERATIONS 4          /* ERR_NATIVE_EXCEEDED_DELTA_LOOKUP_ITERATIONS */
#define EIM_LOOKUP_ERR_RANGE 5               /* ERR_NATIVE_LOOKUP_RANGE */
#define EIM_LOOKUP_ERR_STACK_DELTA_INVALID 6 /* ERR_NATIVE_STACK_DELTA_INVALID */
#define EIM_LOOKUP_ERR_BAD_UNWIND_INFO_INDEX 7 /* ERR_NATIVE_BAD_UNWIND_INFO_INDEX */

/* EimLookupResult.kind on success. */
#define EIM_LOOKUP_KIND_NONE 0
#define EIM_LOOKUP_KIND_STOP 1
#define EIM_LOOKUP_KIND_COMMAND 2
#define EIM_LOOKUP_KIND_RULE 3

/* EimLookupResult.have: which raw reads succeeded (ABI agreement). */
#define EIM_LOOKUP_HAVE_PAGE 1
#define EIM_LOOKUP_HAVE_DELTA 2
#define EIM_LOOKUP_HAVE_SLOT 4
#define EIM_LOOKUP_HAVE_OFFSETS 8

/*
 * The detailed answer. Every field is written on every run (zero when the
 * lookup stopped before reaching it).
 */
typedef struct EimLookupResult {
	__u32 code;        /* EIM_LOOKUP_*, also the return value */
	__u32 kind;        /* EIM_LOOKUP_KIND_* */
	__u32 have;        /* EIM_LOOKUP_HAVE_* */
	__u32 index;       /* delta index in force (or the failing index: RANGE) */
	__s32 addr_diff;   /* page_offset - addrLow (+0x10000 once) */
	__u32 steps;       /* binary-search iterations taken */
	__u64 page;        /* the page looked up */
	StackDeltaPageInfo page_info; /* raw page entry */
	StackDelta delta;  /* raw delta at index */
	__u16 command;     /* low 15 bits of a command delta */
	__u16 slot;        /* unwind slot (BAD_UNWIND_INFO_INDEX: the bad one) */
	UnwindInfo raw_info; /* unwind_info_array[slot] as stored */
	UnwindInfo info;   /* merge-adjusted: param +-8, mergeOpcode cleared */
	OffsetRange offsets; /* interpreter_offsets[file id], raw */
} EimLookupResult;

EIM_ASSERT_SIZE(EimLookupResult, 112);
EIM_ASSERT_OFFSET(EimLookupResult, page, 24);
EIM_ASSERT_OFFSET(EimLookupResult, page_info, 32);
EIM_ASSERT_OFFSET(EimLookupResult, delta, 40);
EIM_ASSERT_OFFSET(EimLookupResult, command, 44);
EIM_ASSERT_OFFSET(EimLookupResult, slot, 46);
EIM_ASSERT_OFFSET(EimLookupResult, raw_info, 48);
EIM_ASSERT_OFFSET(EimLookupResult, info, 60);
EIM_ASSERT_OFFSET(EimLookupResult, offsets, 72);

#endif /* EIM_LOOKUP_H */
