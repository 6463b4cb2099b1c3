//! Hostile-host cases (issue 12): what a local user, a container or an
//! unlucky operator can do to a running `eim`, each reproduced against the
//! built binary, with the outcome eim promises (docs/THREAT_MODEL.md).
//!
//! Cases that need root (the kernel backend, other users' processes) print
//! `SKIPPED` loudly without it, and fail instead under `EIM_REQUIRE_BPF=1`
//! (tests/run and CI set it). Every case is bounded in count and time.

mod support;

mod debuglink;
mod files;
mod http;
mod logging;
mod output;
mod sandbox;
mod signals;
mod truncation;
