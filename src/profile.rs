//! `eim profile`: user stacks sampled by the BPF unwinder (the perf-event
//! program of `bpf/lookup.bpf.c`, [`crate::bpf::sampler::Profiler`]) while
//! the host's files are kept loaded, aggregated here as folded stacks (the
//! input of flame-graph tools) and as a pprof profile.
//!
//! [`Aggregate`] is what a run collects; [`Names`] turns a sampled frame
//! into a function name while the process still runs (its files are opened
//! through `/proc/PID/map_files`, once per file).

pub mod folded;
pub mod pprof;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use eim_machine::unwind::{frame_flag, Frame, Stack, StopReason};

use crate::host::procs::{self, ExecMapping};
use crate::stack::symbols::{FileSymbols, Symbolizer};

/// The most distinct stacks kept; further new ones are counted together
/// (a host of many processes must not grow the profile without bound).
pub const MAX_STACKS: usize = 200_000;

/// The name of a frame the unwinder found in no followed mapping.
pub const UNKNOWN: &str = "[unknown]";

/// One sampled frame, named.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamedFrame {
    /// `function` (from the file's symbols), `file+0xADDRESS` without one,
    /// or [`UNKNOWN`].
    pub name: String,
    /// The mapped file's path, if known.
    pub file: Option<String>,
    pub address: u64,
}

/// What names frames: the symbols of each file, and each process's name.
#[derive(Default)]
pub struct Names {
    symbolizer: Symbolizer,
    /// By host file id: the file's symbols and its path (`None`: the file
    /// could not be read; its frames are named by file and address).
    files: HashMap<u64, Option<(Arc<FileSymbols>, String)>>,
    /// By pid: the name, and the batch of samples it was read for.
    comms: HashMap<u32, (String, u64)>,
    batch: u64,
}

impl Names {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a new batch of samples. A name read for an earlier batch is
    /// read again, because exec renames a process: a sample taken between
    /// fork and exec would otherwise name every later one after the parent.
    pub fn next_batch(&mut self) {
        self.batch = self.batch.wrapping_add(1);
    }

    /// The name of process `pid`: as `/proc` gives it in this batch, the
    /// last name read once the process has gone, `pid N` if it never had one.
    pub fn comm(&mut self, pid: u32) -> String {
        let batch = self.batch;
        let fresh = |old: Option<String>| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim_end().to_owned())
                .ok()
                .or(old)
                .unwrap_or_else(|| format!("pid {pid}"))
        };
        match self.comms.get_mut(&pid) {
            Some((name, read)) if *read == batch => name.clone(),
            Some((name, read)) => {
                *name = fresh(Some(std::mem::take(name)));
                *read = batch;
                name.clone()
            }
            None => {
                let name = fresh(None);
                self.comms.insert(pid, (name.clone(), batch));
                name
            }
        }
    }

    /// Frame `f` of process `pid`, named.
    pub fn frame(&mut self, pid: u32, f: &Frame) -> NamedFrame {
        if f.file_id == 0 {
            return NamedFrame {
                name: UNKNOWN.into(),
                file: None,
                address: f.pc,
            };
        }
        let file = self
            .files
            .entry(f.file_id)
            .or_insert_with(|| load(&mut self.symbolizer, pid, f.pc))
            .clone();
        let Some((symbols, path)) = file else {
            return NamedFrame {
                name: format!("{:016x}+{:#x}", f.file_id, f.address),
                file: None,
                address: f.address,
            };
        };
        // A return address may be the byte after a call that ends its
        // function: the call belongs to the function of the byte before.
        let probe = if f.flags & frame_flag::RETURN_ADDRESS != 0 {
            f.address.saturating_sub(1)
        } else {
            f.address
        };
        let name = match symbols.symbol_at(probe) {
            Some((name, _)) => name.to_owned(),
            None => format!("{}+{:#x}", base_name(&path), f.address),
        };
        NamedFrame {
            name,
            file: Some(path),
            address: f.address,
        }
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The symbols of the file process `pid` maps at `pc`.
fn load(symbolizer: &mut Symbolizer, pid: u32, pc: u64) -> Option<(Arc<FileSymbols>, String)> {
    // The vDSO too: `[vdso]`, its symbols from its image in memory.
    let mappings: Vec<ExecMapping> = procs::exec_mappings(pid as i32).ok()?.into_loadable();
    let m = mappings.iter().find(|m| m.contains(pc))?;
    match symbolizer.file(pid as i32, m) {
        Ok(symbols) => Some((symbols, m.path.to_string_lossy().into_owned())),
        Err(e) => {
            tracing::debug!("{e}");
            None
        }
    }
}

/// A stack as aggregated: the process's name, then its frames outermost
/// first, and why the walk stopped.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub comm: String,
    pub frames: Vec<NamedFrame>,
    /// [`StopReason::name`] of a walk that did not reach the outermost
    /// frame; `None` for one that did.
    pub incomplete: Option<&'static str>,
}

/// The samples of a run.
#[derive(Clone, Debug, Default)]
pub struct Aggregate {
    pub stacks: BTreeMap<StackKey, u64>,
    pub samples: u64,
    /// Samples whose stack was new when [`MAX_STACKS`] were already kept.
    pub dropped: u64,
    /// Samples by how their walk stopped.
    pub stops: BTreeMap<&'static str, u64>,
}

impl Aggregate {
    /// Adds one sampled stack.
    pub fn add(&mut self, stack: &Stack, names: &mut Names) {
        self.samples += 1;
        *self.stops.entry(stack.stop.name()).or_default() += 1;
        let key = StackKey {
            comm: names.comm(stack.pid),
            frames: stack
                .frames
                .iter()
                .rev()
                .map(|f| names.frame(stack.pid, f))
                .collect(),
            incomplete: (stack.stop != StopReason::End).then(|| stack.stop.name()),
        };
        if let Some(n) = self.stacks.get_mut(&key) {
            *n += 1;
        } else if self.stacks.len() < MAX_STACKS {
            self.stacks.insert(key, 1);
        } else {
            self.dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether process `pid`'s name becomes `name` within 10 s.
    fn comm_becomes(pid: u32, name: &str) -> bool {
        (0..1000).any(|_| {
            let now = std::fs::read_to_string(format!("/proc/{pid}/comm"));
            if now.is_ok_and(|c| c.trim_end() == name) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        })
    }

    #[test]
    fn a_process_renamed_by_exec_is_named_anew_in_the_next_batch() {
        use std::io::Write as _;
        // A shell that execs `sleep` once told to: the exec renames it.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read go; exec sleep 30"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sh runs");
        let pid = child.id();
        // The child is the test's fork until it has exec'd sh.
        assert!(
            comm_becomes(pid, "sh"),
            "the child did not exec sh within 10 s"
        );
        let mut names = Names::new();
        assert_eq!(names.comm(pid), "sh");
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(b"go\n").expect("tell sh to exec");
        let renamed = comm_becomes(pid, "sleep");
        assert!(renamed, "sh did not exec sleep within 10 s");
        assert_eq!(names.comm(pid), "sh", "one batch reads a name once");
        names.next_batch();
        assert_eq!(names.comm(pid), "sleep");
        child.kill().expect("kill");
        child.wait().expect("reap");
        names.next_batch();
        assert_eq!(
            names.comm(pid),
            "sleep",
            "a gone process keeps its last name"
        );
        assert_eq!(names.comm(u32::MAX), format!("pid {}", u32::MAX));
    }
}
