//! Host tracking by events: what the kernel reports about processes, and
//! what a batch of reports asks the host side to do.
//!
//! The host side keeps a process table (which process holds which files);
//! polling rebuilds it from `/proc` for every process each interval, events
//! name the processes that changed. [`coalesce`] turns a batch of events,
//! in the order they came, into the processes to read again and those that
//! are gone: reading a process shows its mappings *now*, so any number of
//! events about one process cost one read, and their order within a batch
//! matters only between an exit and what follows it. Events may come late,
//! twice or not at all (a full ring): the host side resyncs from `/proc`
//! now and then, and at once after a loss, and counts what that corrected.

use std::collections::BTreeSet;

/// What happened on the host, as the kernel reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostEvent {
    /// The process exec'd: every mapping it had is gone, new ones come.
    Exec { pid: i32 },
    /// The process's thread-group leader exited.
    Exit { pid: i32 },
    /// A new process (not a thread), a copy of `parent`'s mappings.
    Fork { pid: i32, parent: i32 },
    /// A file mapped executable at `addr`, `len` bytes.
    Map { pid: i32, addr: u64, len: u64 },
    /// `addr`, `len` bytes made executable.
    Protect { pid: i32, addr: u64, len: u64 },
}

impl HostEvent {
    /// The process the event is about.
    pub fn pid(&self) -> i32 {
        match *self {
            Self::Exec { pid }
            | Self::Exit { pid }
            | Self::Fork { pid, .. }
            | Self::Map { pid, .. }
            | Self::Protect { pid, .. } => pid,
        }
    }

    /// The event's kind, as metrics and logs name it.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Exec { .. } => "exec",
            Self::Exit { .. } => "exit",
            Self::Fork { .. } => "fork",
            Self::Map { .. } => "mmap",
            Self::Protect { .. } => "mprotect",
        }
    }
}

/// An event and when it happened (`CLOCK_MONOTONIC`), for the latency
/// from an event to the tables it caused being published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamped {
    pub event: HostEvent,
    pub at: std::time::Duration,
}

/// What a batch of events asks of the host side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Processes to read again (their mappings changed, or they are new).
    pub refresh: BTreeSet<i32>,
    /// Processes gone: release what they hold.
    pub exited: BTreeSet<i32>,
}

impl Work {
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.refresh.is_empty() && self.exited.is_empty()
    }
}

/// The work of `events`, in their order: the last word on a pid wins. An
/// exit after other events of its pid leaves only the exit (the process is
/// gone: reading it would find nothing); anything after an exit is a new
/// process under the reused pid, read again, whose reading also releases
/// the old one (the host side tells the two apart by start time).
pub fn coalesce(events: &[HostEvent]) -> Work {
    let mut work = Work::default();
    for event in events {
        let pid = event.pid();
        match event {
            HostEvent::Exit { .. } => {
                work.refresh.remove(&pid);
                work.exited.insert(pid);
            }
            _ => {
                work.exited.remove(&pid);
                work.refresh.insert(pid);
            }
        }
    }
    work
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_one_process_cost_one_read_and_an_exit_ends_them() {
        let events = [
            HostEvent::Fork { pid: 5, parent: 1 },
            HostEvent::Exec { pid: 5 },
            HostEvent::Map {
                pid: 5,
                addr: 0x1000,
                len: 0x1000,
            },
            HostEvent::Map {
                pid: 6,
                addr: 0x1000,
                len: 0x1000,
            },
            HostEvent::Exit { pid: 7 },
            HostEvent::Protect {
                pid: 5,
                addr: 0x2000,
                len: 0x1000,
            },
        ];
        let work = coalesce(&events);
        assert_eq!(work.refresh, BTreeSet::from([5, 6]));
        assert_eq!(work.exited, BTreeSet::from([7]));

        // A short-lived process: gone before it can be read.
        let work = coalesce(&[
            HostEvent::Exec { pid: 8 },
            HostEvent::Map {
                pid: 8,
                addr: 0,
                len: 1,
            },
            HostEvent::Exit { pid: 8 },
        ]);
        assert_eq!(
            work,
            Work {
                refresh: BTreeSet::new(),
                exited: BTreeSet::from([8])
            }
        );
        // The pid reused after the exit: read again.
        let work = coalesce(&[
            HostEvent::Exit { pid: 8 },
            HostEvent::Fork { pid: 8, parent: 1 },
        ]);
        assert_eq!(work.refresh, BTreeSet::from([8]));
        assert!(work.exited.is_empty());
        assert!(coalesce(&[]).is_empty());
    }
}
