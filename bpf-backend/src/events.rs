//! Host events from the kernel (`bpf/events.bpf.c`): process exec, fork
//! and exit, and new executable file mappings, read from one ring buffer,
//! so that `eim watch` reads `/proc` only for the processes named.
//!
//! [`HostEvents::attach`] loads the committed object and attaches its
//! programs: tracepoints (which need tracefs: [`crate::tracefs`] mounts it
//! at `/sys/kernel/tracing` when nothing is mounted there) and one BTF
//! tracepoint for forks (which needs the kernel's BTF). A record that did
//! not fit in the ring is counted by the kernel side ([`HostEvents::lost`]):
//! the caller then resyncs from `/proc`.

use std::os::fd::AsFd;
use std::time::Duration;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::{BtfTracePoint, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use eim_core::error::Causes;

/// The compiled events program (`bpf/build.sh`).
pub static EVENTS_OBJECT: &[u8] = include_bytes!("../../bpf/events.bpf.o");

const RING: &str = "eim_host_events";
const LOST: &str = "eim_host_events_lost";

/// `EimHostEvent.kind` (`bpf/events.h`).
pub mod kind {
    pub const EXEC: u32 = 1;
    pub const EXIT: u32 = 2;
    pub const FORK: u32 = 3;
    pub const MMAP: u32 = 4;
    pub const MPROTECT: u32 = 5;
}

/// The ring's size (`EIM_EVENTS_RING_BYTES`): 1 MiB, 26,000 records.
pub const DEFAULT_RING_BYTES: u32 = 1 << 20;

/// The size of one record.
pub const EVENT_SIZE: usize = 40;

pub use eim_machine::tracking::{HostEvent, Stamped};

/// Decodes one record; `None` for a record of another size or kind, or a
/// pid that is no pid (the kernel wrote it, but eim trusts no input).
pub fn decode(record: &[u8]) -> Option<Stamped> {
    let record: &[u8; EVENT_SIZE] = record.try_into().ok()?;
    let u32_at = |at: usize| {
        u32::from_le_bytes([record[at], record[at + 1], record[at + 2], record[at + 3]])
    };
    let u64_at = |at: usize| {
        let mut b = [0; 8];
        b.copy_from_slice(&record[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let pid = i32::try_from(u32_at(4)).ok().filter(|p| *p > 0)?;
    let (addr, len) = (u64_at(16), u64_at(24));
    let at = Duration::from_nanos(u64_at(32));
    let event = match u32_at(0) {
        kind::EXEC => HostEvent::Exec { pid },
        kind::EXIT => HostEvent::Exit { pid },
        kind::FORK => HostEvent::Fork {
            pid,
            parent: i32::try_from(u32_at(8)).ok()?,
        },
        kind::MMAP => HostEvent::Map { pid, addr, len },
        kind::MPROTECT => HostEvent::Protect { pid, addr, len },
        _ => return None,
    };
    Some(Stamped { event, at })
}
/// Why the events program could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("tracefs: {0}")]
    Tracefs(crate::tracefs::TracefsError),
    #[error("reading the kernel's BTF (/sys/kernel/btf/vmlinux): {0}")]
    Btf(String),
    #[error("loading the events program: {0}")]
    Load(String),
    #[error("program {program}: {why}")]
    Program { program: &'static str, why: String },
    #[error("map {0} is missing from the events object")]
    MissingMap(&'static str),
}

// By hand, not `#[from]`: the message prints the cause, so `source()`
// returns none (eim's convention: each cause said once).
impl From<crate::tracefs::TracefsError> for EventsError {
    fn from(e: crate::tracefs::TracefsError) -> Self {
        Self::Tracefs(e)
    }
}

/// The tracepoints attached, by program: (program, category, name).
const TRACEPOINTS: [(&str, &str, &str); 6] = [
    ("eim_on_exec", "sched", "sched_process_exec"),
    ("eim_on_exit", "sched", "sched_process_exit"),
    ("eim_on_mmap_enter", "syscalls", "sys_enter_mmap"),
    ("eim_on_mmap_exit", "syscalls", "sys_exit_mmap"),
    ("eim_on_mprotect_enter", "syscalls", "sys_enter_mprotect"),
    ("eim_on_mprotect_exit", "syscalls", "sys_exit_mprotect"),
];
const FORK_PROGRAM: &str = "eim_on_fork";

/// The attached events program and its ring buffer. Dropped, it detaches.
pub struct HostEvents {
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    /// Keeps the programs loaded and attached (aya detaches on drop).
    _ebpf: Ebpf,
    /// Where tracefs was mounted for the tracepoints, if eim mounted it.
    pub mounted_tracefs: Option<std::path::PathBuf>,
}

fn program_error(program: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> EventsError {
    move |e| EventsError::Program {
        program,
        why: Causes(&e).to_string(),
    }
}

/// An aya error's chain, each cause once (aya's errors print their source
/// and return it too).
fn load_error(e: impl std::error::Error + 'static) -> EventsError {
    EventsError::Load(Causes(&e).to_string())
}

impl HostEvents {
    /// Loads and attaches the events program (root, or CAP_BPF +
    /// CAP_PERFMON, and CAP_SYS_ADMIN to mount tracefs).
    pub fn attach() -> Result<Self, EventsError> {
        Self::attach_with(DEFAULT_RING_BYTES)
    }

    /// [`HostEvents::attach`] with a ring of `ring_bytes` (a power of two,
    /// at least a page): tests make it small to overflow it.
    pub fn attach_with(ring_bytes: u32) -> Result<Self, EventsError> {
        let mounted_tracefs = crate::tracefs::ensure()?;
        let btf = Btf::from_sys_fs().map_err(|e| EventsError::Btf(Causes(&e).to_string()))?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries(RING, ring_bytes)
            .load(EVENTS_OBJECT)
            .map_err(load_error)?;
        for (program, category, name) in TRACEPOINTS {
            let p: &mut TracePoint = ebpf
                .program_mut(program)
                .ok_or(EventsError::Program {
                    program,
                    why: "missing from the events object".into(),
                })?
                .try_into()
                .map_err(program_error(program))?;
            p.load().map_err(program_error(program))?;
            p.attach(category, name).map_err(program_error(program))?;
        }
        let fork: &mut BtfTracePoint = ebpf
            .program_mut(FORK_PROGRAM)
            .ok_or(EventsError::Program {
                program: FORK_PROGRAM,
                why: "missing from the events object".into(),
            })?
            .try_into()
            .map_err(program_error(FORK_PROGRAM))?;
        fork.load("sched_process_fork", &btf)
            .map_err(program_error(FORK_PROGRAM))?;
        fork.attach().map_err(program_error(FORK_PROGRAM))?;
        let ring = RingBuf::try_from(ebpf.take_map(RING).ok_or(EventsError::MissingMap(RING))?)
            .map_err(load_error)?;
        let lost = PerCpuArray::try_from(ebpf.take_map(LOST).ok_or(EventsError::MissingMap(LOST))?)
            .map_err(load_error)?;
        Ok(Self {
            ring,
            lost,
            _ebpf: ebpf,
            mounted_tracefs,
        })
    }

    /// Waits up to `timeout` for events to read; `false` on timeout. An
    /// interrupted wait (a signal) is `true`: the caller looks again.
    pub fn wait(&self, timeout: Duration) -> std::io::Result<bool> {
        crate::sys::wait_readable(self.ring.as_fd(), timeout)
    }

    /// Reads at most `max` records into `out`; returns how many records were
    /// read (records that do not decode are counted, not kept).
    pub fn drain(&mut self, max: usize, out: &mut Vec<Stamped>) -> usize {
        let mut read = 0;
        while read < max {
            let Some(item) = self.ring.next() else { break };
            read += 1;
            if let Some(event) = decode(&item) {
                out.push(event);
            }
        }
        read
    }

    /// Records the kernel side could not write since the attach (a full
    /// ring), summed over the CPUs.
    pub fn lost(&self) -> Result<u64, EventsError> {
        let values = self
            .lost
            .get(&0, 0)
            .map_err(|e| EventsError::Load(format!("reading {LOST}: {}", Causes(&e))))?;
        Ok(values.iter().fold(0u64, |sum, v| sum.saturating_add(*v)))
    }
}

#[cfg(test)]
mod tests;
