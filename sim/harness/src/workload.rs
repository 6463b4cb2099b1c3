//! Workload actions, their text form, and the seeded generator.
//!
//! An action is one step of the simulation: a process starts and maps a set
//! of files, a process exits, the clock jumps, a cleanup pass or a leftover
//! retry runs, or a file changes on disk. Each step also carries the seed of
//! its backend faults, so a step means the same thing wherever it appears in
//! a trace (which is what lets a failing trace be shrunk and replayed).
//!
//! Actions are generated from the seed alone, never from the outcomes of
//! earlier steps, so the trace of a seed is fixed before anything runs.

use std::fmt;
use std::str::FromStr;

use crate::pool::Mode;
use crate::rng::SimRng;

/// How a process lets go of its files when it exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStyle {
    /// `remove_or_dec_ref`: the last reference unloads at once.
    Release,
    /// `dec_ref`: unused files stay until a cleanup pass finds them old.
    Defer,
}

/// How a process takes its references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadStyle {
    /// `add_or_inc_ref` per file.
    Each,
    /// One `load_many` for all its files.
    Batch,
}

/// A file a starting process maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub file: usize,
    /// Loaded as synthetic data (`add_synth_interval_data`, like the vDSO)
    /// instead of extracted.
    pub synth: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Start {
        pid: u32,
        exit: ExitStyle,
        load: LoadStyle,
        files: Vec<Mapping>,
    },
    Exit {
        pid: u32,
    },
    /// The clock moves forward.
    Advance {
        secs: u64,
    },
    /// `cleanup_unused` with this age.
    Cleanup {
        age: u64,
    },
    /// `retry_leftovers`.
    Retry,
    /// A file changes on disk.
    File {
        file: usize,
        mode: Mode,
    },
    /// The daemon dies at its `ops`-th next op (0: the next one), a batch
    /// part way; at the end of the step in which it died, a new manager
    /// starts over the same maps (a warm restart: reconcile).
    Crash {
        ops: u64,
    },
}

/// One step: an action and the seed of its faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub action: Action,
    pub faults: u64,
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Present => "present",
        Mode::Gone => "gone",
        Mode::Corrupt => "corrupt",
        Mode::VanishesOnRead => "vanishes",
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Start {
                pid,
                exit,
                load,
                files,
            } => {
                let exit = match exit {
                    ExitStyle::Release => "release",
                    ExitStyle::Defer => "defer",
                };
                let load = match load {
                    LoadStyle::Each => "each",
                    LoadStyle::Batch => "batch",
                };
                write!(f, "start {pid} {exit} {load}")?;
                for m in files {
                    let prefix = if m.synth { "s" } else { "" };
                    write!(f, " {prefix}{}", m.file)?;
                }
                Ok(())
            }
            Action::Exit { pid } => write!(f, "exit {pid}"),
            Action::Advance { secs } => write!(f, "advance {secs}"),
            Action::Cleanup { age } => write!(f, "cleanup {age}"),
            Action::Retry => write!(f, "retry"),
            Action::File { file, mode } => write!(f, "file {file} {}", mode_name(*mode)),
            Action::Crash { ops } => write!(f, "crash {ops}"),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} @{:016x}", self.action, self.faults)
    }
}

/// A line of a trace that is not a step.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a step: {0:?}")]
pub struct ParseError(pub String);

impl FromStr for Step {
    type Err = ParseError;

    fn from_str(line: &str) -> Result<Self, ParseError> {
        let bad = || ParseError(line.to_string());
        let (action, faults) = match line.rsplit_once(" @") {
            Some((a, f)) => (a, u64::from_str_radix(f.trim(), 16).map_err(|_| bad())?),
            None => (line, 0),
        };
        let words: Vec<&str> = action.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, ParseError> {
            words.get(i).and_then(|w| w.parse().ok()).ok_or_else(bad)
        };
        let action = match words.first().copied() {
            Some("start") => {
                let exit = match words.get(2).copied() {
                    Some("release") => ExitStyle::Release,
                    Some("defer") => ExitStyle::Defer,
                    _ => return Err(bad()),
                };
                let load = match words.get(3).copied() {
                    Some("each") => LoadStyle::Each,
                    Some("batch") => LoadStyle::Batch,
                    _ => return Err(bad()),
                };
                let files = words[4..]
                    .iter()
                    .map(|w| {
                        let (synth, n) = match w.strip_prefix('s') {
                            Some(n) => (true, n),
                            None => (false, *w),
                        };
                        n.parse().map(|file| Mapping { file, synth })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| bad())?;
                Action::Start {
                    pid: u32::try_from(num(1)?).map_err(|_| bad())?,
                    exit,
                    load,
                    files,
                }
            }
            Some("exit") => Action::Exit {
                pid: u32::try_from(num(1)?).map_err(|_| bad())?,
            },
            Some("advance") => Action::Advance { secs: num(1)? },
            Some("cleanup") => Action::Cleanup { age: num(1)? },
            Some("retry") if words.len() == 1 => Action::Retry,
            Some("crash") => Action::Crash { ops: num(1)? },
            Some("file") => {
                let mode = match words.get(2).copied() {
                    Some("present") => Mode::Present,
                    Some("gone") => Mode::Gone,
                    Some("corrupt") => Mode::Corrupt,
                    Some("vanishes") => Mode::VanishesOnRead,
                    _ => return Err(bad()),
                };
                Action::File {
                    file: num(1)? as usize,
                    mode,
                }
            }
            _ => return Err(bad()),
        };
        Ok(Step { action, faults })
    }
}

/// Relative weights of the actions a generator draws.
#[derive(Clone, Copy, Debug)]
pub struct Weights {
    pub start: u32,
    pub exit: u32,
    pub advance: u32,
    pub cleanup: u32,
    pub retry: u32,
    pub file: u32,
    /// Last, so that a zero weight leaves the draws of older profiles as
    /// they were.
    pub crash: u32,
}

/// What a profile asks of the generator.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub weights: Weights,
    /// No start while this many processes live; no exit below `min_live`.
    pub max_live: usize,
    pub min_live: usize,
    /// Files per process.
    pub files: (u64, u64),
    /// Chance that a process loads its files with one `load_many`.
    pub batch: f64,
    /// Chance that a mapping is synthetic data (`add_synth_interval_data`).
    pub synth: f64,
    /// Chance that a process exits with `dec_ref` (delayed unload).
    pub defer: f64,
}

/// Draws the steps of one run.
#[derive(Debug)]
pub struct Generator {
    rng: SimRng,
    shape: Shape,
    /// Weights of the pool's files.
    file_weights: Vec<u32>,
    live: Vec<u32>,
    next_pid: u32,
}

impl Generator {
    pub fn new(rng: SimRng, shape: Shape, file_weights: Vec<u32>) -> Self {
        Self {
            rng,
            shape,
            file_weights,
            live: Vec::new(),
            next_pid: 1,
        }
    }

    fn file(&mut self) -> usize {
        self.rng.weighted(&self.file_weights)
    }

    pub fn next_step(&mut self) -> Step {
        let w = self.shape.weights;
        let can_start = self.live.len() < self.shape.max_live && !self.file_weights.is_empty();
        let can_exit = self.live.len() > self.shape.min_live;
        let weights = [
            if can_start { w.start } else { 0 },
            if can_exit { w.exit } else { 0 },
            w.advance,
            w.cleanup,
            w.retry,
            if self.file_weights.is_empty() {
                0
            } else {
                w.file
            },
            w.crash,
        ];
        let action = match self.rng.weighted(&weights) {
            0 => {
                let pid = self.next_pid;
                self.next_pid += 1;
                self.live.push(pid);
                let n = self.rng.range(self.shape.files.0, self.shape.files.1);
                let files = (0..n)
                    .map(|_| Mapping {
                        file: self.file(),
                        synth: self.rng.chance(self.shape.synth),
                    })
                    .collect();
                let exit = if self.rng.chance(self.shape.defer) {
                    ExitStyle::Defer
                } else {
                    ExitStyle::Release
                };
                let load = if self.rng.chance(self.shape.batch) {
                    LoadStyle::Batch
                } else {
                    LoadStyle::Each
                };
                Action::Start {
                    pid,
                    exit,
                    load,
                    files,
                }
            }
            1 => {
                let at = self.rng.index(self.live.len());
                Action::Exit {
                    pid: self.live.swap_remove(at),
                }
            }
            2 => {
                // Small steps, and jumps past the deferral TTL (90 s) and
                // past the cleanup ages.
                let secs = match self.rng.weighted(&[6, 3, 1]) {
                    0 => self.rng.range(0, 10),
                    1 => self.rng.range(60, 200),
                    _ => self.rng.range(200, 4000),
                };
                Action::Advance { secs }
            }
            3 => Action::Cleanup {
                age: [0, 30, 60, 120][self.rng.index(4)],
            },
            4 => Action::Retry,
            6 => Action::Crash {
                // Mostly inside the next plan or two; sometimes later.
                ops: match self.rng.weighted(&[6, 3, 1]) {
                    0 => self.rng.range(0, 4),
                    1 => self.rng.range(4, 16),
                    _ => self.rng.range(16, 64),
                },
            },
            _ => {
                let file = self.file();
                let mode = match self.rng.weighted(&[5, 2, 2, 3]) {
                    0 => Mode::Present,
                    1 => Mode::Gone,
                    2 => Mode::Corrupt,
                    _ => Mode::VanishesOnRead,
                };
                Action::File { file, mode }
            }
        };
        Step {
            action,
            faults: self.rng.next_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;

    #[test]
    fn every_action_reads_back_from_its_text() {
        let shape = Shape {
            weights: Weights {
                start: 3,
                exit: 3,
                advance: 1,
                cleanup: 1,
                retry: 1,
                file: 1,
                crash: 1,
            },
            max_live: 5,
            min_live: 0,
            files: (0, 4),
            batch: 0.5,
            synth: 0.2,
            defer: 0.5,
        };
        let mut g = Generator::new(SimRng::new(9, Stream::Workload), shape, vec![1; 12]);
        let mut kinds = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let step = g.next_step();
            let text = step.to_string();
            kinds.insert(text.split(' ').next().map(str::to_string));
            assert_eq!(text.parse::<Step>(), Ok(step), "{text}");
        }
        assert_eq!(kinds.len(), 7, "{kinds:?}");
        assert!("bogus 1".parse::<Step>().is_err());
        assert!("start 1 release each x".parse::<Step>().is_err());
        assert!("exit 1 @zz".parse::<Step>().is_err());
    }
}
