/* SPDX-License-Identifier: Apache-2.0 */
/*
 * unwinder_walk.h: the stack walk, a template included by unwinder.h once
 * per kind of memory read, with EIM_WALK_KIND set to the kind (capture,
 * task, current). It defines eim_walk_<kind>(struct eim_walk *), which
 * reads memory through eim_read_<kind> only. No include guard on purpose.
 *
 * The frame step is SEED's unwind_one_frame (spec 4.5) with HEAD's
 * return-address lookup at pc - 1 (4.4); the stop reasons are unwind.h's.
 */
#ifndef EIM_WALK_KIND
#error "define EIM_WALK_KIND before including unwinder_walk.h"
#endif

#define EIM_CAT2(a, b) a##_##b
#define EIM_CAT(a, b) EIM_CAT2(a, b)
#define EIM_W(name) EIM_CAT(name, EIM_WALK_KIND)
#define EIM_READ EIM_W(eim_read)

/*
 * unwind_register_address: the address a rule names, from the CFA and
 * the registers; 0 when the rule names none or a dereference fails.
 */
static __always_inline __u64 EIM_W(eim_rule_address)(struct eim_walk *w, __u64 cfa,
						      __u8 opcode, __s32 param)
{
	__s64 pre = param;
	__u64 post = 0;
	if (opcode & UNWIND_OPCODE_FLAG_DEREF) {
		pre = param & ~7;
		post = (__u64)(param & 7) * 8;
	}
	__u64 base;
	switch (opcode & ~UNWIND_OPCODE_FLAG_DEREF) {
	case UNWIND_OPCODE_BASE_CFA:
		base = cfa;
		break;
	case UNWIND_OPCODE_BASE_SP:
		base = w->regs.sp;
		break;
	case UNWIND_OPCODE_BASE_FP:
		base = w->regs.fp;
		break;
	case UNWIND_OPCODE_BASE_LR:
		if (w->regs.arch != EIM_ARCH_ARM64)
			return 0;
		return w->regs.lr;
	case UNWIND_OPCODE_BASE_REG:
		if (w->regs.arch != EIM_ARCH_X86_64)
			return 0;
		return eim_x86_reg(&w->regs, param);
	default:
		return 0;
	}
	__u64 addr = base + pre;
	if (!(opcode & UNWIND_OPCODE_FLAG_DEREF))
		return addr;
	__u64 value;
	if (EIM_READ(w, addr, &value))
		return 0;
	return value + post;
}

/* The SIGNAL command: the registers the kernel saved in the signal frame. */
static __always_inline long EIM_W(eim_signal)(struct eim_walk *w)
{
	__u64 sp = w->regs.sp;
	EimRegs *r = &w->regs;
	if (r->arch == EIM_ARCH_X86_64) {
		/* 18 u64 of uc_mcontext from sp + 40: r8 ... rip. */
		__u64 at = sp + 40;
		if (EIM_READ(w, at + 13 * 8, &r->rax) || EIM_READ(w, at + 1 * 8, &r->r9) ||
		    EIM_READ(w, at + 3 * 8, &r->r11) || EIM_READ(w, at + 5 * 8, &r->r13) ||
		    EIM_READ(w, at + 7 * 8, &r->r15) || EIM_READ(w, at + 10 * 8, &r->fp) ||
		    EIM_READ(w, at + 15 * 8, &r->sp) || EIM_READ(w, at + 16 * 8, &r->pc))
			return eim_stop(w, EIM_STOP_READ_ERROR, 0);
	} else {
		/* 34 u64 of the sigcontext from sp + 312: x0 ... x30, sp, pc. */
		__u64 at = sp + 312;
		__u64 pc, lr;
		if (EIM_READ(w, at + 32 * 8, &pc) || EIM_READ(w, at + 31 * 8, &r->sp) ||
		    EIM_READ(w, at + 29 * 8, &r->fp) || EIM_READ(w, at + 30 * 8, &lr) ||
		    EIM_READ(w, at + 22 * 8, &r->r22) || EIM_READ(w, at + 28 * 8, &r->r28))
			return eim_stop(w, EIM_STOP_READ_ERROR, 0);
		r->pc = eim_normalize_pac(pc);
		r->lr = eim_normalize_pac(lr);
	}
	/* The interrupted PC is no return address, and LR is its own again. */
	w->out->pad = EIM_WALK_SIGNAL;
	return 0;
}

/* The FRAME_POINTER command: the (fp, pc) pair at fp. */
static __always_inline long EIM_W(eim_frame_pointer)(struct eim_walk *w)
{
	__u64 fp = w->regs.fp;
	__u64 next_fp, pc;
	if (EIM_READ(w, fp, &next_fp) || EIM_READ(w, fp + 8, &pc))
		return eim_stop(w, EIM_STOP_READ_ERROR, 0);
	w->regs.fp = next_fp;
	w->regs.pc = pc;
	w->regs.sp = fp + 16;
	eim_mark_caller(w);
	return 0;
}

/* An unwind_info_array rule: the x86-64 tail of spec 4.5. */
static __always_inline long EIM_W(eim_rule_x86)(struct eim_walk *w, const UnwindInfo *rule)
{
	__u64 cfa = EIM_W(eim_rule_address)(w, 0, rule->opcode, rule->param);
	__u64 fpa = EIM_W(eim_rule_address)(w, cfa, rule->fpOpcode, rule->fpParam);
	if (fpa != 0) {
		/* Unchecked, as upstream: a failed read leaves fp 0 (errata O3). */
		__u64 fp;
		EIM_READ(w, fpa, &fp);
		w->regs.fp = fp;
	} else if (rule->opcode == UNWIND_OPCODE_BASE_FP) {
		w->regs.fp = 0;
	}
	__u64 pc;
	if (cfa == 0 || EIM_READ(w, cfa - 8, &pc))
		return eim_stop(w, EIM_STOP_READ_ERROR, 0);
	w->regs.pc = pc;
	w->regs.sp = cfa;
	eim_mark_caller(w);
	return 0;
}

/* An unwind_info_array rule: the arm64 tail of spec 4.5. */
static __always_inline long EIM_W(eim_rule_arm64)(struct eim_walk *w, const UnwindInfo *rule)
{
	__u64 cfa = EIM_W(eim_rule_address)(w, 0, rule->opcode, rule->param);
	__u64 ra = EIM_W(eim_rule_address)(w, cfa, rule->fpOpcode, rule->fpParam);
	__u64 pc = 0;
	if (ra != 0) {
		if (rule->fpOpcode == UNWIND_OPCODE_BASE_LR) {
			if (w->out->pad & EIM_WALK_LR_INVALID)
				return eim_stop(w, EIM_STOP_LR_MID_TRACE, 0);
			pc = ra;
		} else if (EIM_READ(w, ra, &pc)) {
			ra = 0;
		}
		pc = eim_normalize_pac(pc);
	}
	if (ra == 0)
		return eim_stop(w, EIM_STOP_READ_ERROR, 0);
	if (rule->fpParam == 8 && rule->fpOpcode != UNWIND_OPCODE_BASE_LR) {
		/* Unchecked, as upstream: a failed read leaves fp 0 (errata O3). */
		__u64 fp;
		EIM_READ(w, ra - 8, &fp);
		w->regs.fp = fp;
	}
	w->regs.pc = pc;
	w->regs.sp = cfa;
	eim_mark_caller(w);
	return 0;
}

/*
 * One frame (a bpf_loop iteration): record it, look its rule up and apply
 * it. Returns 1 to end the loop (w->done set, out->stop says why).
 */
static long EIM_W(eim_step)(__u64 index, void *ctx)
{
	struct eim_walk *w = ctx;
	EimStack *out = w->out;
	__u64 pc = w->regs.pc;
	(void)index;

	if (pc == 0)
		return eim_stop(w, EIM_STOP_ZERO_PC, 0);
	__u32 count = out->count;
	if (count >= EIM_MAX_FRAMES)
		return eim_stop(w, EIM_STOP_BUDGET, 0);
	EimFrame *frame = &out->frames[count & (EIM_MAX_FRAMES - 1)];
	out->count = count + 1;
	frame->pc = pc;
	frame->file_id = 0;
	frame->address = 0;
	frame->pad = 0;
	__u32 walk = out->pad;
	frame->flags = walk & (EIM_WALK_RETURN_ADDRESS | EIM_WALK_SIGNAL);

	ProcessMapping mapping;
	if (eim_find_mapping(w->pid, pc, &mapping))
		return eim_stop(w, EIM_STOP_UNKNOWN_MAPPING, 0);
	__u64 address = pc - mapping.bias;
	frame->file_id = mapping.file_id;
	frame->address = address;

	EimLookupResult r;
	__builtin_memset(&r, 0, sizeof(r));
	__u32 code = eim_get_stack_delta(mapping.file_id,
					 address - (walk & EIM_WALK_RETURN_ADDRESS), &r);
	if (code == EIM_LOOKUP_ERR_STACK_DELTA_INVALID)
		return eim_stop(w, EIM_STOP_INVALID, 0);
	if (code != EIM_LOOKUP_OK)
		return eim_stop(w, EIM_STOP_NO_DELTA, code);

	long ended;
	if (r.kind == EIM_LOOKUP_KIND_STOP)
		return eim_stop(w, EIM_STOP_END, 0);
	if (r.kind == EIM_LOOKUP_KIND_COMMAND) {
		__u16 command = r.command;
		if (command == UNWIND_COMMAND_SIGNAL) {
			ended = EIM_W(eim_signal)(w);
		} else if (command == UNWIND_COMMAND_FRAME_POINTER) {
			ended = EIM_W(eim_frame_pointer)(w);
		} else if (command == UNWIND_COMMAND_PLT &&
			   w->regs.arch == EIM_ARCH_X86_64) {
			/* The PLT stub pushed nothing, or (past its jmp) one slot. */
			__u64 cfa = w->regs.sp + 8 + ((pc & 15) >= 11 ? 8 : 0);
			__u64 next;
			if (EIM_READ(w, cfa - 8, &next))
				return eim_stop(w, EIM_STOP_READ_ERROR, 0);
			w->regs.pc = next;
			w->regs.sp = cfa;
			eim_mark_caller(w);
			ended = 0;
		} else {
			return eim_stop(w, EIM_STOP_UNSUPPORTED, 0);
		}
	} else if (w->regs.arch == EIM_ARCH_ARM64) {
		ended = EIM_W(eim_rule_arm64)(w, &r.info);
	} else {
		ended = EIM_W(eim_rule_x86)(w, &r.info);
	}
	if (ended)
		return 1;
	if (w->regs.pc == 0)
		return eim_stop(w, EIM_STOP_ZERO_PC, 0);
	return 0;
}

/*
 * Walks from w->regs into w->out (whose pid, tid are the caller's), up to
 * EIM_MAX_FRAMES frames: the verifier checks one iteration, not 128.
 */
static __always_inline void EIM_W(eim_walk)(struct eim_walk *w)
{
	EimStack *out = w->out;
	out->count = 0;
	out->stop = EIM_WALK_RUNNING;
	out->detail = 0;
	out->pad = w->regs.flags & EIM_REGS_RETURN_ADDRESS ? EIM_WALK_RETURN_ADDRESS : 0;
	if (w->regs.arch != EIM_ARCH_X86_64 && w->regs.arch != EIM_ARCH_ARM64)
		eim_stop(w, EIM_STOP_UNSUPPORTED, 0);
	else
		bpf_loop(EIM_MAX_FRAMES + 1, EIM_W(eim_step), w, 0);
	if (out->stop == EIM_WALK_RUNNING)
		eim_stop(w, EIM_STOP_BUDGET, 0);
	out->pad = 0;
}

#undef EIM_READ
#undef EIM_W
#undef EIM_CAT
#undef EIM_CAT2
