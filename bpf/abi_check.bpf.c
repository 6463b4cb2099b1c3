// SPDX-License-Identifier: Apache-2.0
/*
 * abi_check.bpf.c: the smallest BPF object built from eim_maps.h.
 *
 * Compiling it proves the header builds for the BPF target and that its
 * _Static_asserts hold there (they are evaluated with the BPF target's
 * alignment rules, which is what the kernel and the unwinder see). Loading
 * the object creates every eim map from its BTF definition. The program
 * itself does nothing; the real lookup program comes with the kernel
 * backend.
 */
#include "eim_maps.h"
#include "unwind.h"

SEC("raw_tracepoint/eim_abi")
int eim_abi(void *ctx)
{
	(void)ctx;
	return 0;
}

/*
 * The license the kernel checks before allowing GPL-only helpers. This
 * program calls none; the string is here so that every eim object declares
 * the same one (see README.md).
 */
char LICENSE[] SEC("license") = "GPL";
