//! Fuzzes the encoder and, through it, the whole load path.
//!
//! Property 1: `encode::draft` never panics, whatever the deltas. Its
//! errors must name a real defect of the input.
//!
//! Property 2: whatever `draft` accepts loads. A fresh `KernelBook` plans it,
//! a fault-free `SimMaps` applies the plan, and then the simulated BPF
//! reader answers, at every delta address, one byte before and after it, and
//! at the edges of every page, exactly what a direct search of the deltas
//! answers (lookup equivalence, DESIGN §5.3).
//!
//! The input is not a raw delta list: deltas are built from small gaps and
//! a few rule shapes so that most inputs are sorted, page-bounded and
//! merge-rich, i.e. get past validation into the interesting code. A rare
//! corruption byte produces the invalid inputs on purpose.
//!
//! `expect`/`assert` here mark the properties themselves: a panic in this
//! file means eim-core or eim-sim broke a promise, not that the input was
//! bad. Nothing input-driven is unwrapped otherwise.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use eim_machine::abi::{command, opcode, UnwindInfo, PAGE_BITS, PAGE_SIZE};
use eim_machine::deltas::{IntervalData, StackDelta};
use eim_machine::driver;
use eim_machine::encode::{self, Draft, EncodeError};
use eim_machine::machine::{Capacities, KernelBook};
use eim_machine::FileId;
use eim_sim::{expected, SimConfig, SimMaps, SimReader};

/// At most this many deltas: a few thousand keep one run in the
/// millisecond range while still spanning several size classes (8..=12).
const MAX_DELTAS: usize = 4096;

/// The page budget `draft` is given. Small enough that the probe loop over
/// pages stays cheap, large enough that `Far` gaps can exceed it.
const MAX_PAGES: u64 = 1024;

#[derive(Arbitrary, Debug)]
struct Input {
    file_id: u64,
    base: Base,
    /// `corruption < 240` leaves the list alone (about 94% of inputs);
    /// otherwise one defect is planted at `at` to reach the error paths.
    corruption: u8,
    at: u16,
    steps: Vec<Step>,
}

/// Address of the first delta.
#[derive(Arbitrary, Debug)]
enum Base {
    /// A typical ELF text address.
    Low(u32),
    /// Anywhere, including near `u64::MAX` where additions wrap.
    Any(u64),
}

#[derive(Arbitrary, Debug)]
struct Step {
    gap: Gap,
    hints: u8,
    rule: RuleIn,
}

/// Distance from the previous delta (the first step's gap is ignored).
#[derive(Arbitrary, Debug)]
enum Gap {
    /// 1 or 2 bytes: the distances at which neighbours are merged.
    Tiny(bool),
    /// Up to 64 KiB: inside a page or into the next one.
    Near(u16),
    /// Up to 256 pages: empty pages in between, and the page budget.
    Far(u32),
}

impl Gap {
    fn bytes(&self) -> u64 {
        match *self {
            Gap::Tiny(two) => 1 + u64::from(two),
            // Never 0: a zero gap is a duplicate address, planted only by
            // the corruption step so that most inputs stay sorted.
            Gap::Near(n) => u64::from(n).max(1),
            Gap::Far(n) => u64::from(n % (256 << PAGE_BITS)).max(1),
        }
    }
}

/// The rule of a delta.
#[derive(Arbitrary, Debug)]
enum RuleIn {
    /// One of the five defined commands.
    Known(u8),
    /// A command with any param: upstream truncates it to 16 bits, so e.g.
    /// 0x10001 is stored as STOP.
    Command(i32),
    /// CFA = SP + 8k.
    Sp(i8),
    /// CFA = FP + 8k with a frame-pointer rule.
    Fp(i8, i8),
    /// The previous rule after a push (param + 8) or a pop (param - 8):
    /// what the encoder merges when the gap is 1 or 2.
    Push,
    Pop,
    /// The previous rule again (a repeat that extraction would fold away).
    Same,
    /// Any opcode, param and frame-pointer rule. The merge opcode and pad
    /// byte stay 0: only the corruption step sets them.
    Raw {
        opcode: u8,
        fp_opcode: u8,
        param: i32,
        fp_param: i32,
    },
}

fn rule(r: &RuleIn, prev: UnwindInfo) -> UnwindInfo {
    let cmd = |param| UnwindInfo {
        opcode: opcode::COMMAND,
        param,
        ..UnwindInfo::default()
    };
    match *r {
        RuleIn::Known(k) => cmd(i32::from(k) % (command::FRAME_POINTER + 1)),
        RuleIn::Command(param) => cmd(param),
        RuleIn::Sp(k) => UnwindInfo {
            opcode: opcode::BASE_SP,
            param: 8 * i32::from(k),
            ..UnwindInfo::default()
        },
        RuleIn::Fp(k, fp) => UnwindInfo {
            opcode: opcode::BASE_FP,
            param: 8 * i32::from(k),
            fp_opcode: opcode::BASE_CFA,
            fp_param: 8 * i32::from(fp),
            ..UnwindInfo::default()
        },
        RuleIn::Push => UnwindInfo {
            param: prev.param.wrapping_add(8),
            ..prev
        },
        RuleIn::Pop => UnwindInfo {
            param: prev.param.wrapping_sub(8),
            ..prev
        },
        RuleIn::Same => prev,
        RuleIn::Raw {
            opcode,
            fp_opcode,
            param,
            fp_param,
        } => UnwindInfo {
            opcode,
            fp_opcode,
            param,
            fp_param,
            ..UnwindInfo::default()
        },
    }
}

fn build(input: &Input) -> Vec<StackDelta> {
    let mut address = match input.base {
        Base::Low(a) => u64::from(a),
        Base::Any(a) => a,
    };
    let mut prev = UnwindInfo::default();
    let mut deltas = Vec::with_capacity(input.steps.len().min(MAX_DELTAS));
    for (i, step) in input.steps.iter().take(MAX_DELTAS).enumerate() {
        if i > 0 {
            // Wrapping on purpose: past u64::MAX the list becomes unsorted,
            // which `draft` must reject rather than overflow on.
            address = address.wrapping_add(step.gap.bytes());
        }
        prev = rule(&step.rule, prev);
        deltas.push(StackDelta::new(address, step.hints, prev));
    }
    if input.corruption >= 240 && !deltas.is_empty() {
        let i = usize::from(input.at) % deltas.len();
        match input.corruption % 4 {
            0 => deltas[i].info.merge_opcode = input.corruption,
            1 => deltas[i].info.pad = input.corruption,
            2 if i > 0 => deltas[i].address = deltas[i - 1].address,
            _ if i > 0 => deltas.swap(i - 1, i),
            _ => {}
        }
    }
    deltas
}

/// An error must point at something actually wrong with the input.
fn check_error(deltas: &[StackDelta], err: &EncodeError) {
    match *err {
        EncodeError::Unsorted { index, address } => {
            assert!(index > 0 && index < deltas.len(), "{err}");
            assert_eq!(deltas[index].address, address, "{err}");
            assert!(address <= deltas[index - 1].address, "{err}");
        }
        EncodeError::Reserved { index, address } => {
            let d = deltas.get(index).expect("Reserved names an existing delta");
            assert_eq!(d.address, address, "{err}");
            assert!(d.info.merge_opcode != 0 || d.info.pad != 0, "{err}");
        }
        EncodeError::TooManyPages { pages, max } => {
            assert_eq!(max, MAX_PAGES, "{err}");
            assert!(pages > max, "{err}");
        }
        // Unreachable with at most 4096 deltas (65535 per page, 2^23 - 1
        // per file), so reaching them is itself a bug.
        EncodeError::TooManyDeltas { .. } | EncodeError::PageOverflow { .. } => {
            panic!("{err} with only {} deltas", deltas.len())
        }
    }
}

/// Addresses worth asking the reader about: every delta, its neighbours,
/// and the first and last byte of every page the table covers plus the
/// page after it (empty pages fall back to an earlier page's last delta;
/// the page after must have no entry).
fn probes(deltas: &[StackDelta], draft: &Draft) -> Vec<u64> {
    let mut out = Vec::with_capacity(3 * deltas.len() + 2 * draft.per_page.len() + 2);
    for d in deltas {
        out.push(d.address);
        out.extend(d.address.checked_sub(1));
        out.extend(d.address.checked_add(1));
    }
    for p in 0..=draft.per_page.len() as u64 {
        let Some(start) = draft.first_page.checked_add(p << PAGE_BITS) else {
            break;
        };
        out.push(start);
        out.push(start | (PAGE_SIZE - 1));
    }
    out
}

fuzz_target!(|input: Input| {
    let deltas = build(&input);
    let data = IntervalData::from_deltas(deltas.clone());
    let draft = match encode::draft(&data, MAX_PAGES) {
        Ok(Some(draft)) => draft,
        Ok(None) => {
            assert!(deltas.is_empty(), "draft is None only for no deltas");
            return;
        }
        Err(err) => {
            check_error(&deltas, &err);
            return;
        }
    };

    // Load it the way the manager does: plan with the book, apply the ops in
    // order, commit. A fresh book and fault-free maps have room for
    // anything `draft` accepted (<= 4096 rules, <= 1024 pages), so every
    // failure below is a bug.
    let file_id = FileId(input.file_id);
    let mut book = KernelBook::new(Capacities::default());
    let plan = book
        .plan_load(file_id, &data, None)
        .expect("a fresh book plans whatever draft accepted");
    assert_eq!(
        plan.files[0].map_ref.map_id, draft.map_id,
        "plan and draft agree on the class"
    );
    assert_eq!(
        plan.files[0].map_ref.num_pages as usize,
        draft.per_page.len(),
        "plan and draft agree on the page span"
    );
    assert_eq!(
        u64::from(plan.files[0].map_ref.page_entries),
        draft.page_entries(),
        "plan and draft agree on the page entries"
    );
    let mut sim = SimMaps::new(SimConfig::default()).expect("the default map set builds");
    driver::execute(&mut sim, &plan.ops).expect("fault-free maps apply a fresh plan");
    book.commit_load(plan);
    assert_eq!(
        sim.pages().len() as u64,
        draft.page_entries(),
        "one entry per page of the span, dead pages excepted"
    );
    for key in sim.pages().keys() {
        assert!(
            !draft.is_dead(key.page),
            "dead page {:#x} written",
            key.page
        );
    }

    let reader = SimReader::new(&sim);
    for address in probes(&deltas, &draft) {
        assert_eq!(
            reader.answer(file_id, address),
            expected(&data, address),
            "address {address:#x}: the reader says {:?}",
            reader.lookup(file_id, address)
        );
    }
});
