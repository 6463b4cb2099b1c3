//! eim: executable-info manager for eBPF native unwinding.
//!
//! For a profiler whose eBPF program unwinds native stacks with the
//! OpenTelemetry eBPF profiler's tables: eim keeps the unwind tables (stack
//! deltas) of every executable the host's processes map in the kernel maps
//! that program reads, shares them between the processes that map a file,
//! and removes them when the last one exits. The profiler reports its
//! processes' mappings and exits to an [`ExecutableInfoManager`]
//! ([`ExecutableInfoManager::add_or_inc_ref`],
//! [`ExecutableInfoManager::remove_or_dec_ref`]); eim extracts, encodes and
//! writes. `examples/profiler.rs` is such a profiler, on aya, over pinned
//! maps; the `eim` binary (`eim watch`) is one for a whole host.
//!
//! This crate is a facade over five crates that users should not have to
//! know about:
//!
//! * [`eim_machine`], [`eim_analysis`] and [`eim_core`], re-exported here
//!   at the top level: the kernel map ABI, stack deltas, the encoder and
//!   the pure state machine; the analysis of ELF files; the thread-safe
//!   [`ExecutableInfoManager`];
//! * [`eim_bpf`], re-exported as [`bpf`]: the real kernel maps
//!   ([`bpf::KernelMaps`]), pinned by name if asked, and the aya it uses;
//! * [`eim_sim`], re-exported as [`sim`]: an in-memory kernel with the real
//!   maps' semantics ([`sim::SimMaps`]), so the manager runs (and can be
//!   tested and demonstrated) without privileges.
//!
//! Files are read here, not in the core: [`ElfFileRef`] (a lazily opened
//! ELF file, read on demand and never mapped, and its debug-file search)
//! and [`ElfProvider`] (the stack-delta provider over it, which also runs
//! the interpreter loaders: [`files::loaders`]). [`host`] is `eim watch`'s
//! whole-host loop (processes from `/proc`, their mappings opened as they
//! map them: [`host::procs`], [`host::open`]), [`report`] its summary and
//! [`metrics_http`] its Prometheus endpoint.
//!
//! Depending on `eim` alone keeps one version of each in a user's build and
//! lets the split between the crates change without breaking users.
//!
//! The manager over the simulated kernel, with a file whose deltas are
//! given rather than read from an ELF file:
//!
//! ```
//! use eim::deltas::{hint, info, IntervalData, StackDelta};
//! use eim::provider::MemoryProvider;
//! use eim::sim::{SimConfig, SimMaps};
//! use eim::{ExecutableInfoManager, FileId, Tracers};
//!
//! let mut data = IntervalData::new();
//! data.add(StackDelta::new(0x1000, hint::KEEP, info::STOP));
//! data.add(StackDelta::new(0x1040, hint::GAP, info::INVALID));
//! let provider = MemoryProvider::new();
//! provider.insert(FileId(7), data);
//!
//! let maps = SimMaps::new(SimConfig::default()).expect("maps");
//! let manager = ExecutableInfoManager::new(provider, maps, Tracers::none());
//! manager.add_or_inc_ref(FileId(7), &FileId(7)).expect("loaded");
//! manager.add_or_inc_ref(FileId(7), &FileId(7)).expect("second reference");
//! assert_eq!(manager.with_backend(|maps| maps.table_count()), 1);
//!
//! manager.remove_or_dec_ref(FileId(7)).expect("released");
//! manager.remove_or_dec_ref(FileId(7)).expect("released and unloaded");
//! assert!(manager.with_backend(|maps| maps.holds_no_file_data()));
//! ```

pub use eim_analysis::{elf, interp, tsd, DtvInfo, InterpreterData, LibcInfo, TsdInfo};
pub use eim_bpf as bpf;
pub use eim_core::*;
pub use eim_machine::{
    abi, deltas, driver, encode, fallible, machine, ops, process_maps, text, text_input, tracking,
    unwind, FileId,
};
pub use eim_sim as sim;

pub mod address;
pub mod daemon;
pub mod files;
pub mod findings;
pub mod host;
pub mod map_view;
pub mod metrics_http;
pub mod profile;
pub mod report;
pub mod sandbox;
pub mod stack;

pub use files::elf_file::ElfFileRef;
pub use files::elf_provider::ElfProvider;
