/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events.h: what the host-events program (events.bpf.c) reports, shared
 * with Rust (bpf-backend/src/events.rs mirrors every number below; a test
 * there parses this file and fails if the two disagree).
 *
 * One record per event in the ring buffer eim_host_events; a record that
 * does not fit is counted in eim_host_events_lost instead (a per-CPU
 * array of one u64), which user space reads to detect an overflow.
 */
#ifndef EIM_EVENTS_H
#define EIM_EVENTS_H

/* EimHostEvent.kind */
#define EIM_EVENT_EXEC 1     /* pid exec'd: its mappings are all new */
#define EIM_EVENT_EXIT 2     /* pid's thread-group leader exited */
#define EIM_EVENT_FORK 3     /* pid is a new process (not a thread), of parent */
#define EIM_EVENT_MMAP 4     /* pid mapped a file executable at addr, len bytes */
#define EIM_EVENT_MPROTECT 5 /* pid made addr, len bytes executable */

/* The ring buffer's size in bytes (a power of two, a multiple of the page). */
#define EIM_EVENTS_RING_BYTES (1 << 20)

typedef struct EimHostEvent {
	__u32 kind;
	__u32 pid;    /* the process (thread-group id) */
	__u32 parent; /* EIM_EVENT_FORK: the parent process; else 0 */
	__u32 pad;
	__u64 addr;   /* EIM_EVENT_MMAP, EIM_EVENT_MPROTECT; else 0 */
	__u64 len;
	__u64 at_ns;  /* when, on CLOCK_MONOTONIC (bpf_ktime_get_ns) */
} EimHostEvent;

_Static_assert(sizeof(EimHostEvent) == 40, "EimHostEvent is 40 bytes");

#endif
