//! The replayable text form of a run: its setup (profile, seed, fault rate)
//! and its steps, one per line. `#` starts a comment line.
//!
//! ```text
//! # eim-sim trace v1
//! profile capacity
//! seed 12
//! fault-rate 0.01
//! start 1 release each 3 s7 @9c0e5f1d2a3b4c5d
//! exit 1 @0000000000000001
//! ```

use std::fmt;
use std::str::FromStr;

use crate::profile::Profile;
use crate::workload::Step;

/// A run to replay.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub profile: Profile,
    pub seed: u64,
    pub fault_rate: f64,
    /// Comment lines written before the setup (why the trace was saved).
    pub notes: Vec<String>,
    pub steps: Vec<Step>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("the trace names no {0}")]
    Missing(&'static str),
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# eim-sim trace v1")?;
        for note in &self.notes {
            writeln!(f, "# {note}")?;
        }
        writeln!(f, "profile {}", self.profile)?;
        writeln!(f, "seed {}", self.seed)?;
        writeln!(f, "fault-rate {}", self.fault_rate)?;
        for step in &self.steps {
            writeln!(f, "{step}")?;
        }
        Ok(())
    }
}

impl FromStr for Trace {
    type Err = TraceError;

    fn from_str(text: &str) -> Result<Self, TraceError> {
        let (mut profile, mut seed, mut fault_rate) = (None, None, None);
        let mut steps = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            let bad = |message: String| TraceError::Line {
                line: n + 1,
                message,
            };
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "profile" => profile = Some(value.parse().map_err(|e| bad(format!("{e}")))?),
                "seed" => {
                    seed = Some(
                        value
                            .parse()
                            .map_err(|_| bad(format!("bad seed {value:?}")))?,
                    )
                }
                "fault-rate" => {
                    fault_rate = Some(
                        value
                            .parse()
                            .map_err(|_| bad(format!("bad fault rate {value:?}")))?,
                    )
                }
                _ => steps.push(line.parse().map_err(|e| bad(format!("{e}")))?),
            }
        }
        Ok(Trace {
            profile: profile.ok_or(TraceError::Missing("profile"))?,
            seed: seed.ok_or(TraceError::Missing("seed"))?,
            fault_rate: fault_rate.ok_or(TraceError::Missing("fault-rate"))?,
            notes: Vec::new(),
            steps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_reads_back_from_its_text() {
        let text = "# why\nprofile faults\nseed 7\nfault-rate 0.5\nstart 1 defer batch 2 s3 @00000000000000ff\nretry @1\n";
        let t: Trace = text.parse().unwrap();
        assert_eq!(t.profile, Profile::Faults);
        assert_eq!((t.seed, t.fault_rate, t.steps.len()), (7, 0.5, 2));
        assert_eq!(t.steps[1].faults, 1);
        let again: Trace = t.to_string().parse().unwrap();
        assert_eq!(again, t);
        assert_eq!(
            "seed 1\nfault-rate 0".parse::<Trace>(),
            Err(TraceError::Missing("profile"))
        );
        assert!(matches!(
            "profile churn\nseed x".parse::<Trace>(),
            Err(TraceError::Line { line: 2, .. })
        ));
    }
}
