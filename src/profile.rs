//! `eim profile`: user stacks sampled by the BPF unwinder (the perf-event
//! program of `bpf/lookup.bpf.c`, [`crate::bpf::sampler::Profiler`]) while
//! the host's files are kept loaded, and with `--kernel` the kernel stacks
//! above them, aggregated here as folded stacks (the input of flame-graph
//! tools) and as a pprof profile.
//!
//! [`Aggregate`] is what a run collects; [`Names`] turns a sampled frame
//! into a function name while the process still runs (its files are opened
//! through `/proc/PID/map_files`, once per file), and a kernel address
//! into the kernel function holding it ([`kallsyms`]).

pub mod binaries;
pub mod folded;
pub mod kallsyms;
pub mod pprof;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use eim_machine::unwind::{frame_flag, Frame, Stack, StopReason};

use crate::host::procs::ExecMapping;
use crate::stack::symbols::{FileSymbols, Symbolizer};

pub use binaries::{Binaries, MappedFile};
pub use kallsyms::Kallsyms;

/// The most distinct stacks kept; further new ones are counted together
/// (a host of many processes must not grow the profile without bound).
pub const MAX_STACKS: usize = 200_000;

/// The name of a frame the unwinder found in no followed mapping.
pub const UNKNOWN: &str = "[unknown]";

/// The name of a kernel frame no symbol names (the kernel hid its
/// addresses, or none is at or below it).
pub const KERNEL: &str = "[kernel]";

/// The file pprof's kernel mapping names, as perf's does.
pub const KERNEL_FILE: &str = "[kernel.kallsyms]";

/// x86-64's kernel half: the kernel mapping when no symbol bounds it.
const KERNEL_HALF: (u64, u64) = (0xffff_8000_0000_0000, u64::MAX);

/// A frame's place in the source, where debug information gives it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceLine {
    pub file: String,
    pub line: u32,
}

/// One sampled frame, named.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamedFrame {
    /// `function` (as gdb names it, [`crate::stack::symbols`]),
    /// `file+0xADDRESS` without one, or [`UNKNOWN`]: what folded stacks
    /// print and pprof's function name.
    pub name: String,
    /// The symbol as the file spells it (mangled), when the symbolizer
    /// gives one that differs from `name`: pprof's `system_name`. `None`:
    /// `name` is the file's own spelling.
    pub system_name: Option<String>,
    /// The source file and line, when the symbolizer gives them.
    pub source: Option<SourceLine>,
    /// The mapping of a file holding the frame's PC, if the process maps one
    /// there.
    pub mapping: Option<Arc<MappedFile>>,
    /// The PC in the process (the runtime address pprof's locations hold).
    pub pc: u64,
    /// The ELF address in the file (the PC for a frame in no followed
    /// mapping).
    pub address: u64,
}

/// What names frames: the symbols of each file, each process's mappings
/// and each process's name.
#[derive(Default)]
pub struct Names {
    symbolizer: Symbolizer,
    binaries: Binaries,
    /// By host file id: the file's symbols and its path (`None`: the file
    /// could not be read; its frames are named by file and address).
    files: HashMap<u64, Option<(Arc<FileSymbols>, String)>>,
    /// By pid: the name, and the batch of samples it was read for.
    comms: HashMap<u32, (String, u64)>,
    batch: u64,
    /// The kernel's function symbols and its pprof mapping (set for
    /// `--kernel`).
    kernel: Option<(Kallsyms, Arc<MappedFile>)>,
}

impl Names {
    pub fn new() -> Self {
        Self::default()
    }

    /// Names kernel frames with `symbols` (an empty table names each
    /// [`KERNEL`]).
    pub fn set_kernel(&mut self, symbols: Kallsyms) {
        let (start, limit) = symbols.range().unwrap_or(KERNEL_HALF);
        let mapping = MappedFile {
            start,
            limit,
            offset: 0,
            path: KERNEL_FILE.into(),
            build_id: None,
            main: false,
        };
        self.kernel = Some((symbols, Arc::new(mapping)));
    }

    /// The kernel frame at `pc`, named as perf names it (the function, no
    /// offset). `leaf`: `pc` is where the sample interrupted the kernel;
    /// any other is a return address, named by the call before it.
    pub fn kernel_frame(&self, pc: u64, leaf: bool) -> NamedFrame {
        let probe = if leaf { pc } else { pc.saturating_sub(1) };
        let (name, mapping) = match &self.kernel {
            Some((symbols, mapping)) => (symbols.name(probe), Some(mapping.clone())),
            None => (None, None),
        };
        NamedFrame {
            name: name.unwrap_or(KERNEL).to_owned(),
            system_name: None,
            source: None,
            mapping,
            pc,
            address: pc,
        }
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
        let found = self.binaries.find(pid, f.pc, self.batch);
        let mut named = NamedFrame {
            name: UNKNOWN.into(),
            system_name: None,
            source: None,
            mapping: found.as_ref().map(|(_, file)| file.clone()),
            pc: f.pc,
            address: f.pc,
        };
        if f.file_id == 0 {
            return named;
        }
        named.address = f.address;
        let symbols = match self.files.get(&f.file_id) {
            Some(symbols) => symbols.clone(),
            // The file is read through the first process seen mapping it.
            None => {
                let Some((mapping, _)) = &found else {
                    named.name = format!("{:016x}+{:#x}", f.file_id, f.address);
                    return named;
                };
                let symbols = load(&mut self.symbolizer, pid, mapping);
                self.files.insert(f.file_id, symbols.clone());
                symbols
            }
        };
        let Some((symbols, path)) = symbols else {
            named.name = format!("{:016x}+{:#x}", f.file_id, f.address);
            return named;
        };
        // A return address may be the byte after a call that ends its
        // function: the call belongs to the function of the byte before.
        let probe = if f.flags & frame_flag::RETURN_ADDRESS != 0 {
            f.address.saturating_sub(1)
        } else {
            f.address
        };
        match symbols.symbolize(probe) {
            Some(found) => {
                let function = found.function;
                if function.system_name != function.name {
                    named.system_name = Some(function.system_name);
                }
                if let (Some(file), Some(line)) = (function.file, function.line) {
                    named.source = Some(SourceLine { file, line });
                }
                named.name = function.name;
            }
            None => named.name = format!("{}+{:#x}", base_name(&path), f.address),
        }
        named
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The symbols and path of the file process `pid` maps at `mapping`.
fn load(
    symbolizer: &mut Symbolizer,
    pid: u32,
    mapping: &ExecMapping,
) -> Option<(Arc<FileSymbols>, String)> {
    match symbolizer.file(pid as i32, mapping) {
        Ok(symbols) => Some((symbols, mapping.path.to_string_lossy().into_owned())),
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
    /// Adds one sampled stack: the user stack `stack` and the kernel
    /// stack `kernel` (innermost first; empty for a sample in user code)
    /// above it, as perf shows them: the user stack's innermost frame (the
    /// syscall's caller) continues into the kernel's outermost (its entry).
    pub fn add(&mut self, stack: &Stack, kernel: &[u64], names: &mut Names) {
        self.samples += 1;
        *self.stops.entry(stack.stop.name()).or_default() += 1;
        let comm = names.comm(stack.pid);
        let user = stack.frames.iter().rev().map(|f| names.frame(stack.pid, f));
        let mut frames: Vec<NamedFrame> = user.collect();
        frames.extend(
            kernel
                .iter()
                .enumerate()
                .rev()
                .map(|(i, pc)| names.kernel_frame(*pc, i == 0)),
        );
        let key = StackKey {
            comm,
            frames,
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
    fn kernel_frames_continue_the_user_stack_named_by_the_function_holding_them() {
        let mut names = Names::new();
        let symbols = Kallsyms::parse(
            "ffffffff81000000 T entry_SYSCALL_64\n\
             ffffffff81000100 T do_syscall_64\n\
             ffffffff81000200 T __x64_sys_read\n\
             ffffffff81000300 T read_iter_zero\n"
                .as_bytes(),
        )
        .expect("a slice");
        names.set_kernel(symbols);
        // No such process: its user frames are in no file.
        let pid = u32::MAX;
        let user = |pc| Frame {
            pc,
            file_id: 0,
            address: pc,
            flags: 0,
        };
        let stack = Stack {
            pid,
            tid: pid,
            frames: vec![user(0x1000), user(0x2000)],
            stop: StopReason::UnknownMapping,
        };
        // Innermost first: interrupted in read_iter_zero; the return
        // address 0x...0200 is the byte after a call in do_syscall_64.
        let kernel = [
            0xffff_ffff_8100_0310,
            0xffff_ffff_8100_0200,
            0xffff_ffff_8100_0110,
            0xffff_ffff_8100_0010,
        ];
        let mut a = Aggregate::default();
        a.add(&stack, &kernel, &mut names);
        a.add(&stack, &[], &mut names);
        let keys: Vec<&StackKey> = a.stacks.keys().collect();
        let printed: Vec<Vec<&str>> = keys
            .iter()
            .map(|k| k.frames.iter().map(|f| f.name.as_str()).collect())
            .collect();
        assert!(printed.contains(&vec![UNKNOWN, UNKNOWN]), "{printed:?}");
        assert!(
            printed.contains(&vec![
                UNKNOWN,
                UNKNOWN,
                "entry_SYSCALL_64",
                "do_syscall_64",
                "do_syscall_64",
                "read_iter_zero"
            ]),
            "{printed:?}"
        );
        let with_kernel = keys.iter().find(|k| k.frames.len() == 6).expect("6 frames");
        assert_eq!(with_kernel.frames[1].pc, 0x1000, "the user leaf");
        assert_eq!(with_kernel.frames[5].pc, kernel[0], "the kernel leaf");
        let mapping = with_kernel.frames[5].mapping.as_deref().expect("mapped");
        assert_eq!(mapping.path, KERNEL_FILE);
        assert!((mapping.start..mapping.limit).contains(&kernel[3]));

        // Without symbols (hidden addresses): `[kernel]` frames.
        let mut hidden = Names::new();
        let restricted = Kallsyms::parse("0000000000000000 T _stext\n".as_bytes()).expect("slice");
        assert!(restricted.restricted());
        hidden.set_kernel(restricted);
        let f = hidden.kernel_frame(kernel[0], true);
        assert_eq!((f.name.as_str(), f.pc), (KERNEL, kernel[0]));
        let mapping = f.mapping.expect("the kernel half");
        assert!((mapping.start..mapping.limit).contains(&kernel[0]));
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
