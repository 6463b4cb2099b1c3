//! [`Profiler`]: the native unwinder sampling user stacks (the
//! `eim_profile_sample` program of the lookup object, attached to a
//! cpu-clock perf event on every online CPU), over the maps of a
//! [`KernelMaps`], and, if asked, each sample's kernel stack
//! (`bpf_get_stack`). Stacks arrive through the ring buffer
//! `eim_profile_stacks` (an `EimStack` record each, or an
//! `EimProfileSample`, the kernel stack ahead of it); a stack that did not
//! fit is counted per CPU in `eim_profile_lost`.
//!
//! The profiler holds its own descriptors of the ring and the counter
//! (opened by map id) and the perf links, so it does not borrow the maps
//! once started: the owner keeps applying map ops (new processes, new
//! files) while it samples. Dropped (or [`Profiler::stop`]), it detaches.

use std::os::fd::AsFd;
use std::time::Duration;

use aya::maps::{Map, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{
    PerfEventConfig, PerfEventLink, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::PerfEvent;
use aya::util::online_cpus;
use aya::Ebpf;
use eim_core::error::Causes;
use eim_machine::unwind::Stack;

use crate::error::KernelError;
use crate::maps::KernelMaps;
use crate::sys;
use crate::unwind::{decode_profile_sample, decode_stack, map_fd, STACK_HEADER};

const PROGRAM: &str = "eim_profile_sample";
const PIDS: &str = "eim_profile_pids";
const CONFIG: &str = "eim_profile_config";
const RING: &str = "eim_profile_stacks";
const LOST: &str = "eim_profile_lost";

/// The ring's size (`EIM_PROFILE_RING_BYTES`).
pub const RING_BYTES: usize = 4 << 20;

/// Processes the filter holds at most (`EIM_PROFILE_MAX_PIDS`).
pub const MAX_PIDS: usize = 4096;

/// `EIM_PROFILE_ALL`: every process, not only those of `eim_profile_pids`.
const CONFIG_ALL: u32 = 1;
/// `EIM_PROFILE_KERNEL`: each sample's kernel stack too.
const CONFIG_KERNEL: u32 = 2;

/// How the profiler samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Samples per second on each CPU.
    pub hz: u64,
    /// Whether each sample carries the kernel stack it interrupted.
    pub kernel: bool,
}

/// One sampled stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The user stack.
    pub stack: Stack,
    /// The kernel stack, innermost first: empty unless [`Sampling::kernel`]
    /// and the sample interrupted the kernel (a syscall, a fault).
    pub kernel: Vec<u64>,
}

/// Which processes are sampled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileTarget {
    /// Every user process.
    All,
    /// These processes (at most [`MAX_PIDS`]), every thread of each.
    Pids(Vec<u32>),
}

/// Why the profiler could not start or read.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("listing the online CPUs ({path}): {cause}")]
    Cpus {
        path: &'static str,
        cause: std::io::Error,
    },
    #[error("attaching {PROGRAM} to the cpu-clock of CPU {cpu}: {why}")]
    Attach { cpu: u32, why: String },
    #[error("{count} processes to profile, more than the {MAX_PIDS} the filter holds")]
    TooManyPids { count: usize },
    #[error("map {map}: {why}")]
    Map { map: &'static str, why: String },
    #[error("waiting for stacks on {RING}: {0}")]
    Wait(std::io::Error),
}

/// A running profiler. Dropped, it detaches from every CPU.
pub struct Profiler {
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    /// The lost count when this profiler started: the counter outlives it.
    lost_before: u64,
    /// Records that did not decode (the kernel wrote them; eim trusts no
    /// input).
    undecoded: u64,
    /// Whether records carry the kernel stack ahead of the user one.
    kernel: bool,
    /// Samples whose kernel stack could not be read, and the last errno.
    kernel_failed: (u64, u32),
    _links: Vec<PerfEventLink>,
}

fn map_error(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> ProfileError {
    move |e| ProfileError::Map {
        map,
        why: Causes(&e).to_string(),
    }
}

/// A descriptor of its own for map `name` of `ebpf` (by its id).
fn reopen(ebpf: &Ebpf, name: &'static str) -> Result<MapData, ProfileError> {
    let data = match ebpf.map(name) {
        Some(Map::RingBuf(m) | Map::PerCpuArray(m)) => m,
        _ => return Err(KernelError::Missing(format!("map {name}")).into()),
    };
    let id = data.info().map_err(map_error(name))?.id();
    MapData::from_id(id).map_err(map_error(name))
}

/// Sets the pid filter (the old entries removed, then `target`'s) and the
/// configuration bits.
fn set_target(ebpf: &Ebpf, target: &ProfileTarget, kernel: bool) -> Result<(), ProfileError> {
    let pids = map_fd(ebpf, PIDS)?;
    // Bounded: the map holds at most MAX_PIDS keys.
    for _ in 0..=MAX_PIDS {
        let Some(key) = sys::first_key(pids, 4).map_err(KernelError::from)? else {
            break;
        };
        sys::delete_elem(pids, &key).map_err(KernelError::from)?;
    }
    let mut config = match target {
        ProfileTarget::All => CONFIG_ALL,
        ProfileTarget::Pids(list) => {
            if list.len() > MAX_PIDS {
                return Err(ProfileError::TooManyPids { count: list.len() });
            }
            for pid in list {
                sys::update_elem(pids, &pid.to_le_bytes(), &[1], sys::BPF_ANY)
                    .map_err(KernelError::from)?;
            }
            0
        }
    };
    if kernel {
        config |= CONFIG_KERNEL;
    }
    sys::update_elem(
        map_fd(ebpf, CONFIG)?,
        &0u32.to_le_bytes(),
        &config.to_le_bytes(),
        sys::BPF_ANY,
    )
    .map_err(KernelError::from)?;
    Ok(())
}

impl Profiler {
    /// Samples `target`'s user stacks (and kernel stacks, if asked)
    /// `sampling.hz` times a second on every online CPU (the program is
    /// loaded on first use). Needs root (CAP_BPF and CAP_PERFMON).
    pub fn start(
        maps: &mut KernelMaps,
        target: &ProfileTarget,
        sampling: Sampling,
    ) -> Result<Self, ProfileError> {
        let hz = sampling.hz;
        set_target(maps.ebpf(), target, sampling.kernel)?;
        let ebpf = maps.ebpf();
        let mut ring =
            RingBuf::try_from(Map::RingBuf(reopen(ebpf, RING)?)).map_err(map_error(RING))?;
        let lost = PerCpuArray::try_from(Map::PerCpuArray(reopen(ebpf, LOST)?))
            .map_err(map_error(LOST))?;
        // What an earlier profiler left unread is not this one's: dropped
        // before any sample of this one can arrive. Bounded by what the
        // ring can hold, should another profiler still be writing.
        for _ in 0..RING_BYTES / STACK_HEADER {
            if ring.next().is_none() {
                break;
            }
        }
        let ebpf = maps.ebpf_mut();
        let program: &mut PerfEvent = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| KernelError::Missing(format!("program {PROGRAM}")))?
            .try_into()
            .map_err(KernelError::from)?;
        if program.fd().is_err() {
            program.load().map_err(KernelError::from)?;
        }
        let cpus = online_cpus().map_err(|(path, cause)| ProfileError::Cpus { path, cause })?;
        let mut links = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let attach_error = |e: aya::programs::ProgramError| ProfileError::Attach {
                cpu,
                why: Causes(&e).to_string(),
            };
            let id = program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(hz),
                    false,
                )
                .map_err(attach_error)?;
            // Owned by the profiler: detached when it is dropped.
            links.push(program.take_link(id).map_err(attach_error)?);
        }
        let mut profiler = Self {
            ring,
            lost,
            lost_before: 0,
            undecoded: 0,
            kernel: sampling.kernel,
            kernel_failed: (0, 0),
            _links: links,
        };
        profiler.lost_before = profiler.lost_total()?;
        Ok(profiler)
    }

    /// Waits up to `timeout` for stacks, then returns those in the ring (at
    /// most `max`). Empty on timeout.
    pub fn poll(&mut self, timeout: Duration, max: usize) -> Result<Vec<Sample>, ProfileError> {
        crate::sys::wait_readable(self.ring.as_fd(), timeout).map_err(ProfileError::Wait)?;
        let mut samples = Vec::new();
        while samples.len() < max {
            let Some(item) = self.ring.next() else { break };
            let decoded = if self.kernel {
                decode_profile_sample(&item).map(|(kernel, stack)| {
                    if kernel.error != 0 {
                        self.kernel_failed.0 += 1;
                        self.kernel_failed.1 = kernel.error;
                    }
                    Sample {
                        stack,
                        kernel: kernel.ips,
                    }
                })
            } else {
                decode_stack(&item).map(|(stack, _)| Sample {
                    stack,
                    kernel: Vec::new(),
                })
            };
            match decoded {
                Ok(sample) => samples.push(sample),
                Err(_) => self.undecoded += 1,
            }
        }
        Ok(samples)
    }

    fn lost_total(&self) -> Result<u64, ProfileError> {
        let values = self.lost.get(&0, 0).map_err(map_error(LOST))?;
        Ok(values.iter().fold(0u64, |sum, v| sum.saturating_add(*v)))
    }

    /// Stacks the kernel could not send since this profiler started (the
    /// ring was full), summed over the CPUs.
    pub fn lost(&self) -> Result<u64, ProfileError> {
        Ok(self.lost_total()?.saturating_sub(self.lost_before))
    }

    /// Records read that did not decode as a stack.
    pub fn undecoded(&self) -> u64 {
        self.undecoded
    }

    /// Samples whose kernel stack the kernel could not give, and the errno
    /// of the last of them (`bpf_get_stack`'s).
    pub fn kernel_failed(&self) -> (u64, u32) {
        self.kernel_failed
    }

    /// Detaches from every CPU (as dropping does).
    pub fn stop(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capacities_agree_with_lookup_bpf_c() {
        const SOURCE: &str = include_str!("../../bpf/lookup.bpf.c");
        let file = "bpf/lookup.bpf.c";
        assert_eq!(
            crate::c_header::define(SOURCE, file, "EIM_PROFILE_MAX_PIDS"),
            MAX_PIDS as u64
        );
        let ring = crate::c_header::define_text(SOURCE, file, "EIM_PROFILE_RING_BYTES");
        assert_eq!(ring, "(4 << 20)");
        assert_eq!(RING_BYTES, 4 << 20);
        assert_eq!(
            crate::c_header::define(SOURCE, file, "EIM_PROFILE_ALL"),
            u64::from(CONFIG_ALL)
        );
        assert_eq!(
            crate::c_header::define(SOURCE, file, "EIM_PROFILE_KERNEL"),
            u64::from(CONFIG_KERNEL)
        );
    }
}
