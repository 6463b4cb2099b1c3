//! The latency from `exec` of a never-loaded file to its table published in
//! the pinned maps, measured from outside eim (issue 18; run by
//! `tools/bench-events`, which starts the `eim watch` it measures).
//!
//! Each run copies `SOURCE` to a file of its own (bytes appended after its
//! end, which no loader reads, so its file id is new), starts it with
//! `ARG` (e.g. a `sleep` copy and `30`), and looks up the copy's first page
//! key in the pinned `stack_delta_page_to_info` every 0.2 ms until it is
//! there: what a profiler's unwinder would find. The copy is then killed
//! and removed. The same probe measures both modes of the watch, so their
//! figures compare.
//!
//! ```text
//! event_latency PIN_DIR SOURCE FIRST_PAGE_HEX RUNS WORK_DIR [ARG [GAP_MS]]
//! ```
//!
//! Runs are GAP_MS (default 1000: the polling interval the benchmark uses)
//! apart at most, 20 ms at least, at random.
//!
//! `FIRST_PAGE_HEX` is the first page address of `SOURCE`'s table (the
//! first column after `# pages:` in `eim tables SOURCE`). Prints one line
//! per run (`run I ms X` or `run I missed`) and a last line
//! `runs N seen S missed M p50_ms A p99_ms B max_ms C`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use eim::abi::{map_name, StackDeltaPageInfo, StackDeltaPageKey, Wire as _};
use eim::bpf::sys::{lookup_elem, obj_get};
use eim::ElfFileRef;

/// A run that has not seen its table in this long counts as missed: far
/// beyond any interval the benchmark uses.
const GIVE_UP: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_micros(200);
/// Bounds the work a mistyped argument can ask for.
const MAX_RUNS: usize = 100_000;

/// The started copy, killed and reaped however the run ends.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn unique_copy(from: &Path, dir: &Path, run: usize) -> anyhow::Result<PathBuf> {
    let to = dir.join(format!("eim-latency-{}-{run}", std::process::id()));
    std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&to)
        .with_context(|| format!("opening {}", to.display()))?;
    writeln!(f, "eim-latency {run} {nanos}")
        .with_context(|| format!("appending to {}", to.display()))?;
    Ok(to)
}

/// Milliseconds from starting the copy to its first page key in the pinned
/// map, or `None` if it never came.
fn one_run(
    pages: std::os::fd::BorrowedFd<'_>,
    source: &Path,
    first_page: u64,
    dir: &Path,
    arg: &str,
    run: usize,
) -> anyhow::Result<Option<f64>> {
    let path = unique_copy(source, dir, run)?;
    let result = (|| {
        let id = ElfFileRef::new(&path)
            .file_id()
            .map_err(|e| anyhow::anyhow!("the file id of {}: {}", path.display(), e.message))?
            .host();
        let key = StackDeltaPageKey {
            file_id: id.0,
            page: first_page,
        }
        .to_bytes();
        let started = Instant::now();
        let _child = Started(
            Command::new(&path)
                .arg(arg)
                .stdin(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", path.display()))?,
        );
        while started.elapsed() < GIVE_UP {
            let found = lookup_elem(pages, &key, StackDeltaPageInfo::SIZE)
                .with_context(|| format!("looking up file {id} in {}", map_name::PAGES))?;
            if found.is_some() {
                return Ok(Some(started.elapsed().as_secs_f64() * 1e3));
            }
            std::thread::sleep(POLL);
        }
        Ok(None)
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// Enough randomness for pauses, without a dependency.
struct XorShift(u64);

impl XorShift {
    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [pin_dir, source, page, runs, dir, rest @ ..] = args.as_slice() else {
        bail!("usage: event_latency PIN_DIR SOURCE FIRST_PAGE_HEX RUNS WORK_DIR [ARG [GAP_MS]]");
    };
    let arg = rest.first().map_or("30", String::as_str);
    let first_page = u64::from_str_radix(page.trim_start_matches("0x"), 16)
        .with_context(|| format!("the first page {page:?} in hex"))?;
    let runs: usize = runs
        .parse()
        .with_context(|| format!("the run count {runs:?}"))?;
    if runs == 0 || runs > MAX_RUNS {
        bail!("the run count must be 1 to {MAX_RUNS}");
    }
    let pages_path = Path::new(pin_dir).join(map_name::PAGES);
    let pages =
        obj_get(&pages_path).with_context(|| format!("opening {}", pages_path.display()))?;
    let gap = Duration::from_millis(match rest.get(1) {
        Some(ms) => ms
            .parse()
            .with_context(|| format!("the gap {ms:?} in ms"))?,
        None => 1000,
    });
    let mut random = XorShift(u64::from(std::process::id()) | 1 << 40);
    let mut seen = Vec::with_capacity(runs);
    let mut missed = 0usize;
    let mut out = std::io::stdout().lock();
    for run in 0..runs {
        match one_run(
            std::os::fd::AsFd::as_fd(&pages),
            Path::new(source),
            first_page,
            Path::new(dir),
            arg,
            run,
        )? {
            Some(ms) => {
                writeln!(out, "run {run} ms {ms:.3}")?;
                seen.push(ms);
            }
            None => {
                writeln!(out, "run {run} missed")?;
                missed += 1;
            }
        }
        // A pause of random length: a polling watch's steps keep their own
        // phase, and runs started right after a detection (which follows a
        // step) would all wait a whole interval. It also lets the released
        // file's unload pass, so runs do not queue behind each other's work.
        std::thread::sleep(Duration::from_millis(20) + gap.mul_f64(random.next_unit()));
    }
    seen.sort_by(f64::total_cmp);
    writeln!(
        out,
        "runs {runs} seen {} missed {missed} p50_ms {:.2} p99_ms {:.2} max_ms {:.2}",
        seen.len(),
        percentile(&seen, 50.0),
        percentile(&seen, 99.0),
        seen.last().copied().unwrap_or(f64::NAN),
    )?;
    Ok(())
}
