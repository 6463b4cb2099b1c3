/* SPDX-License-Identifier: Apache-2.0 */
/*
 * eim_maps.h: eim's kernel ABI on the C side.
 *
 * This is the one C definition of the maps eim writes and the native
 * unwinder reads: the structs stored in them, the constants that give their
 * values meaning, and the BTF map definitions. The Rust side
 * (core/src/abi.rs) is authoritative; every size and offset below is
 * checked at compile time against the numbers asserted there, so a drift on
 * either side breaks a build instead of silently corrupting lookups.
 *
 * Layouts are the SEED revision's (spec/UPSTREAM_FACTS.md 4.1): natural
 * alignment, nothing packed, host (little-endian) byte order. Struct and
 * field names follow upstream's C naming so the BPF code reads like the
 * unwinder it models; the Rust names are the snake_case equivalents.
 *
 * The map definitions are *definitions*: include this header in exactly one
 * translation unit of a BPF object.
 *
 * Build: clang -target bpf -O2 -g -I/usr/include/x86_64-linux-gnu -c x.bpf.c
 * (Debian keeps asm/types.h under the multiarch include directory.)
 */
#ifndef EIM_MAPS_H
#define EIM_MAPS_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* ---------------------------------------------------------------------- */
/* Constants (Rust: abi::PAGE_BITS ... abi::program)                       */
/* ---------------------------------------------------------------------- */

/* A stack-delta page is a 64 KiB window of ELF virtual address space. */
#define STACK_DELTA_PAGE_BITS 16
#define STACK_DELTA_PAGE_SIZE (1ULL << STACK_DELTA_PAGE_BITS)
#define STACK_DELTA_PAGE_MASK (STACK_DELTA_PAGE_SIZE - 1)

/*
 * Size classes ("mapID"): class N holds inner arrays of exactly 2^N deltas,
 * one outer map exe_id_to_N_stack_deltas per class.
 */
#define STACK_DELTA_BUCKET_SMALLEST 8
#define STACK_DELTA_BUCKET_LARGEST 23
#define STACK_DELTA_BUCKET_COUNT \
	(STACK_DELTA_BUCKET_LARGEST - STACK_DELTA_BUCKET_SMALLEST + 1)

/* Bit 15 of StackDelta.unwindInfo: the low bits are a command, not a slot. */
#define STACK_DELTA_COMMAND_FLAG 0x8000
/* Bit 7 of UnwindInfo.mergeOpcode: the merged neighbour's param is 8 lower. */
#define MERGEOPCODE_NEGATIVE 0x80

/* UnwindInfo.opcode / fpOpcode: the base of the CFA or frame-pointer rule. */
#define UNWIND_OPCODE_COMMAND 0 /* param holds an UNWIND_COMMAND_* */
#define UNWIND_OPCODE_BASE_CFA 1
#define UNWIND_OPCODE_BASE_SP 2
#define UNWIND_OPCODE_BASE_FP 3
#define UNWIND_OPCODE_BASE_LR 4
#define UNWIND_OPCODE_BASE_REG 5
#define UNWIND_OPCODE_FLAG_DEREF 0x80 /* dereference the computed address */

/* Commands (UnwindInfo.param when opcode is UNWIND_OPCODE_COMMAND). */
#define UNWIND_COMMAND_INVALID 0
#define UNWIND_COMMAND_STOP 1
#define UNWIND_COMMAND_PLT 2
#define UNWIND_COMMAND_SIGNAL 3
#define UNWIND_COMMAND_FRAME_POINTER 4

/* Commands as stored directly in StackDelta.unwindInfo (no slot used). */
#define STACK_DELTA_COMMAND(cmd) (STACK_DELTA_COMMAND_FLAG | (cmd))
#define STACK_DELTA_INVALID STACK_DELTA_COMMAND(UNWIND_COMMAND_INVALID)
#define STACK_DELTA_STOP STACK_DELTA_COMMAND(UNWIND_COMMAND_STOP)
#define STACK_DELTA_PLT STACK_DELTA_COMMAND(UNWIND_COMMAND_PLT)
#define STACK_DELTA_SIGNAL STACK_DELTA_COMMAND(UNWIND_COMMAND_SIGNAL)
#define STACK_DELTA_FRAME_POINTER STACK_DELTA_COMMAND(UNWIND_COMMAND_FRAME_POINTER)

/* OffsetRange.program_index values (SEED numbering). */
#define PROG_UNWIND_STOP 0
#define PROG_UNWIND_NATIVE 1
#define PROG_UNWIND_HOTSPOT 2
#define PROG_UNWIND_PERL 3
#define PROG_UNWIND_PYTHON 4
#define PROG_UNWIND_PHP 5
#define PROG_UNWIND_RUBY 6
#define PROG_UNWIND_V8 7
#define PROG_UNWIND_DOTNET 8
#define PROG_UNWIND_GO_LABELS 9

/*
 * Capacities (Rust: abi::capacity). Upstream compiles smaller page and
 * outer maps (40000 and 4096 entries) and resizes them at load time to
 * 2^16 with the default map scale factor; eim declares the run-time sizes
 * directly so that an object loaded as is already has them.
 */
#define UNWIND_INFO_MAX_ENTRIES 16384
#define INTERPRETER_OFFSETS_MAX_ENTRIES 32
#define STACK_DELTA_PAGE_MAX_ENTRIES 65536
#define STACK_DELTA_OUTER_MAX_ENTRIES 65536
#define PROCESS_MAPPINGS_MAX_ENTRIES 32768
/* Mappings one eim_process_mappings entry holds (Rust: abi::MAX_PROCESS_MAPPINGS). */
#define EIM_MAX_PROCESS_MAPPINGS 512

/* ---------------------------------------------------------------------- */
/* Structs                                                                 */
/* ---------------------------------------------------------------------- */

/* One element of an inner delta array (Rust: abi::StackDelta). */
typedef struct StackDelta {
	__u16 addrLow;    /* low 16 bits of the address where the rule starts */
	__u16 unwindInfo; /* unwind_info_array index, or 0x8000 | command */
} StackDelta;

/* Key of stack_delta_page_to_info (Rust: abi::StackDeltaPageKey). */
typedef struct StackDeltaPageKey {
	__u64 fileID; /* host file id */
	__u64 page;   /* page-aligned ELF virtual address */
} StackDeltaPageKey;

/*
 * Value of stack_delta_page_to_info (Rust: abi::StackDeltaPageInfo): the
 * slice [firstDelta, firstDelta + numDeltas) of the file's inner array
 * that covers the page, and the size class that holds that array.
 */
typedef struct StackDeltaPageInfo {
	__u32 firstDelta;
	__u16 numDeltas;
	__u16 mapID;
} StackDeltaPageInfo;

/*
 * One unwind_info_array slot, SEED layout (Rust: abi::UnwindInfo). The pad
 * byte is named so that its value is part of the ABI: writers store 0.
 */
typedef struct UnwindInfo {
	__u8 opcode;      /* UNWIND_OPCODE_*, possibly | UNWIND_OPCODE_FLAG_DEREF */
	__u8 fpOpcode;    /* same encoding, for the frame-pointer rule */
	__u8 mergeOpcode; /* 0, or distance to a merged neighbour | MERGEOPCODE_NEGATIVE */
	__u8 pad;
	__s32 param;
	__s32 fpParam;
} UnwindInfo;

/*
 * Value of interpreter_offsets (Rust: abi::OffsetRange): up to two code
 * ranges, bounds compared inclusively, and the program to tail-call.
 */
typedef struct OffsetRange {
	__u64 lower_offset1;
	__u64 upper_offset1;
	__u64 lower_offset2;
	__u64 upper_offset2;
	__u16 program_index; /* PROG_UNWIND_* */
	__u8 pad[6];
} OffsetRange;

/*
 * One executable file mapping of a process (Rust: abi::ProcessMapping):
 * [start, end) maps file_id from file_offset; pc there is the ELF virtual
 * address pc - bias.
 */
typedef struct ProcessMapping {
	__u64 start;
	__u64 end;
	__u64 file_offset;
	__u64 bias;
	__u64 file_id;
} ProcessMapping;

/*
 * Value of eim_process_mappings (Rust: abi::ProcessMappings): count
 * mappings sorted by start, not overlapping, then zeros.
 */
typedef struct ProcessMappings {
	__u32 count;
	__u32 pad;
	ProcessMapping mappings[EIM_MAX_PROCESS_MAPPINGS];
} ProcessMappings;

/*
 * The layouts core/src/abi.rs asserts. A change here is an ABI break:
 * change both sides and the agreement test together.
 */
#define EIM_ASSERT_OFFSET(type, field, off) \
	_Static_assert(__builtin_offsetof(type, field) == (off), \
		       #type "." #field " must be at offset " #off)
#define EIM_ASSERT_SIZE(type, size) \
	_Static_assert(sizeof(type) == (size), #type " must be " #size " bytes")

EIM_ASSERT_SIZE(StackDelta, 4);
EIM_ASSERT_OFFSET(StackDelta, addrLow, 0);
EIM_ASSERT_OFFSET(StackDelta, unwindInfo, 2);

EIM_ASSERT_SIZE(StackDeltaPageKey, 16);
EIM_ASSERT_OFFSET(StackDeltaPageKey, fileID, 0);
EIM_ASSERT_OFFSET(StackDeltaPageKey, page, 8);

EIM_ASSERT_SIZE(StackDeltaPageInfo, 8);
EIM_ASSERT_OFFSET(StackDeltaPageInfo, firstDelta, 0);
EIM_ASSERT_OFFSET(StackDeltaPageInfo, numDeltas, 4);
EIM_ASSERT_OFFSET(StackDeltaPageInfo, mapID, 6);

EIM_ASSERT_SIZE(UnwindInfo, 12);
EIM_ASSERT_OFFSET(UnwindInfo, opcode, 0);
EIM_ASSERT_OFFSET(UnwindInfo, fpOpcode, 1);
EIM_ASSERT_OFFSET(UnwindInfo, mergeOpcode, 2);
EIM_ASSERT_OFFSET(UnwindInfo, pad, 3);
EIM_ASSERT_OFFSET(UnwindInfo, param, 4);
EIM_ASSERT_OFFSET(UnwindInfo, fpParam, 8);

EIM_ASSERT_SIZE(OffsetRange, 40);
EIM_ASSERT_OFFSET(OffsetRange, lower_offset1, 0);
EIM_ASSERT_OFFSET(OffsetRange, upper_offset1, 8);
EIM_ASSERT_OFFSET(OffsetRange, lower_offset2, 16);
EIM_ASSERT_OFFSET(OffsetRange, upper_offset2, 24);
EIM_ASSERT_OFFSET(OffsetRange, program_index, 32);
EIM_ASSERT_OFFSET(OffsetRange, pad, 34);

EIM_ASSERT_SIZE(ProcessMapping, 40);
EIM_ASSERT_OFFSET(ProcessMapping, bias, 24);
EIM_ASSERT_OFFSET(ProcessMapping, file_id, 32);
EIM_ASSERT_SIZE(ProcessMappings, 8 + 40 * EIM_MAX_PROCESS_MAPPINGS);
EIM_ASSERT_OFFSET(ProcessMappings, mappings, 8);

/* The command flag must not collide with any valid slot index. */
_Static_assert(UNWIND_INFO_MAX_ENTRIES <= STACK_DELTA_COMMAND_FLAG,
	       "unwind_info_array indices must stay below the command flag");

/* ---------------------------------------------------------------------- */
/* Maps                                                                    */
/* ---------------------------------------------------------------------- */

/* (file id, page) -> the slice of the file's delta array for that page. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, StackDeltaPageKey);
	__type(value, StackDeltaPageInfo);
	__uint(max_entries, STACK_DELTA_PAGE_MAX_ENTRIES);
} stack_delta_page_to_info SEC(".maps");

/* Slot -> unwind rule, shared (de-duplicated) by every file. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, UnwindInfo);
	__uint(max_entries, UNWIND_INFO_MAX_ENTRIES);
} unwind_info_array SEC(".maps");

/* File id -> interpreter code ranges and the program that unwinds them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, OffsetRange);
	__uint(max_entries, INTERPRETER_OFFSETS_MAX_ENTRIES);
} interpreter_offsets SEC(".maps");

/*
 * pid (the process, not a thread) -> its executable file mappings, written
 * whole by the host side whenever they change (one update replaces the
 * value atomically for readers). Not preallocated: an entry is 20 KiB. A
 * HASH and not upstream's LPM trie because sleepable programs (the task
 * iterator of `eim stack`) may not use LPM tries.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, ProcessMappings);
	__uint(max_entries, PROCESS_MAPPINGS_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} eim_process_mappings SEC(".maps");

/*
 * exe_id_to_N_stack_deltas: file id -> the file's delta array, an ARRAY of
 * exactly 2^N StackDeltas (user space passes the inner map's fd).
 *
 * The inner template gives its key and value by size, not by type: with
 * clang 14, __type(value, StackDelta) inside the inner definition is
 * emitted as a BTF forward declaration, which aya rejects (clang 19 does
 * not have this problem). See notes/KERNEL_FINDINGS.md.
 *
 * The inner arrays are BPF_F_MMAPABLE (and so must the template be, the
 * kernel compares their flags): user space fills a new array through a
 * shared mapping, one memcpy, instead of one UPDATE_BATCH whose kernel
 * side copies and checks every element (8 s of a 14-million-delta host,
 * 0.5 us an element). Readers see the same ARRAY, key 4, value 4,
 * 2^N entries: the flag changes how the array is allocated, not its bytes.
 *
 * One macro stamps out the 16 classes so that they cannot drift apart.
 */
#define EIM_STACK_DELTA_OUTER_MAP(N)                                         \
	struct {                                                             \
		__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);                     \
		__uint(key_size, sizeof(__u64));                             \
		__uint(max_entries, STACK_DELTA_OUTER_MAX_ENTRIES);          \
		__array(values, struct {                                     \
			__uint(type, BPF_MAP_TYPE_ARRAY);                    \
			__uint(key_size, 4);                                 \
			__uint(value_size, sizeof(StackDelta));              \
			__uint(max_entries, 1 << (N));                       \
			__uint(map_flags, BPF_F_MMAPABLE);                   \
		});                                                          \
	} exe_id_to_##N##_stack_deltas SEC(".maps")

EIM_STACK_DELTA_OUTER_MAP(8);
EIM_STACK_DELTA_OUTER_MAP(9);
EIM_STACK_DELTA_OUTER_MAP(10);
EIM_STACK_DELTA_OUTER_MAP(11);
EIM_STACK_DELTA_OUTER_MAP(12);
EIM_STACK_DELTA_OUTER_MAP(13);
EIM_STACK_DELTA_OUTER_MAP(14);
EIM_STACK_DELTA_OUTER_MAP(15);
EIM_STACK_DELTA_OUTER_MAP(16);
EIM_STACK_DELTA_OUTER_MAP(17);
EIM_STACK_DELTA_OUTER_MAP(18);
EIM_STACK_DELTA_OUTER_MAP(19);
EIM_STACK_DELTA_OUTER_MAP(20);
EIM_STACK_DELTA_OUTER_MAP(21);
EIM_STACK_DELTA_OUTER_MAP(22);
EIM_STACK_DELTA_OUTER_MAP(23);

/* The 16 lines above must cover exactly the classes of abi.rs. */
_Static_assert(STACK_DELTA_BUCKET_COUNT == 16,
	       "one exe_id_to_N_stack_deltas map per size class 8..23");

#endif /* EIM_MAPS_H */
