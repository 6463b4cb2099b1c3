//! Files a user names on the command line, and the processes a lookup
//! names: whatever they are, every command fails at once, small and with a
//! short message, or works (issue 12's rows on FIFOs, devices, sparse files,
//! xz bombs, unreadable processes, non-UTF-8 names, `--interval 0s` and
//! `inspect`'s exit code).
//!
//! Each case runs the built `eim` under [`run_bounded`]: killed (and the
//! test failed) after its time limit, its peak RSS read from `wait4`.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{eim_bin, root_or_skip};

/// What the issue allows a bad input to cost.
const TIME_LIMIT: Duration = Duration::from_secs(5);
const RSS_LIMIT_KIB: u64 = 200 * 1024;

/// At most this much of a child's stdout or stderr is kept.
const OUTPUT_CAP: u64 = 16 << 20;

/// How a bounded run of `eim` ended.
#[derive(Debug)]
struct Run {
    /// The exit code (`None`: killed by a signal).
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    elapsed: Duration,
    /// The child's peak resident set size as `wait4` reports it
    /// (`ru_maxrss`, KiB). An upper bound: Linux folds in the high-water
    /// mark of the memory the child had before its `exec`, the copy of
    /// this test process; so an assertion on it can fail spuriously, never
    /// pass wrongly.
    max_rss_kib: u64,
    /// The exact peak, from `/usr/bin/time` (it forks `eim` from its own
    /// small process), when the run went through it.
    time_kib: Option<u64>,
}

impl Run {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Asserts the run failed with exit code 1 within the time and
    /// memory, saying `needle` on stderr in under 1 KB.
    fn assert_small_failure(&self, what: &str, needle: &str) {
        let stderr = self.stderr();
        assert_eq!(self.code, Some(1), "{what}: exit code; stderr: {stderr}");
        assert!(
            stderr.contains(needle),
            "{what}: {needle:?} not in {stderr}"
        );
        assert!(
            self.stderr.len() < 1024,
            "{what}: {} bytes of stderr",
            self.stderr.len()
        );
        assert!(self.elapsed < TIME_LIMIT, "{what}: took {:?}", self.elapsed);
        let peak = self.time_kib.unwrap_or(self.max_rss_kib);
        assert!(peak < RSS_LIMIT_KIB, "{what}: peak RSS {peak} KiB");
        eprintln!(
            "{what}: failed in {:?}, peak RSS {} (wait4's bound {} KiB): {}",
            self.elapsed,
            self.time_kib
                .map_or("unmeasured".to_string(), |k| format!("{k} KiB")),
            self.max_rss_kib,
            stderr.trim_end()
        );
    }
}

/// Kills the child's process group and reaps the child unless it was
/// reaped: a failing test never leaves an `eim` behind.
struct Reaper {
    pid: libc::pid_t,
    reaped: bool,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: the pid is our unreaped child, so neither it nor its
            // process group id is reused.
            unsafe {
                libc::kill(-self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Runs `cmd` (stdin empty, outputs captured), killing it and failing the
/// test after `timeout`.
fn run_bounded(mut cmd: Command, timeout: Duration) -> Run {
    // Its own process group, so a timeout kills what it started too.
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    // Reaped with wait4 (std's wait gives no rusage), or by the Reaper.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().expect("spawn eim");
    let mut reaper = Reaper {
        pid: child.id() as libc::pid_t,
        reaped: false,
    };
    let collect = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(OUTPUT_CAP).read_to_end(&mut out);
            }
            out
        })
    };
    let stdout = collect(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = collect(child.stderr.take().map(|p| Box::new(p) as _));
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers to locals; the pid is our child.
        let r = unsafe { libc::wait4(reaper.pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == reaper.pid {
            reaper.reaped = true;
            break (status, usage);
        }
        assert!(
            started.elapsed() < timeout,
            "{cmd:?} still running after {timeout:?}: killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = started.elapsed();
    Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
        elapsed,
        max_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        time_kib: None,
    }
}

/// `eim ARGS...` in `dir`, bounded by [`TIME_LIMIT`] (twice: a debug build
/// on a busy machine must not make a slow pass look like a hang; the cases
/// assert the limit themselves).
fn eim_in(dir: &Path, args: &[&OsStr]) -> Run {
    const TIME: &str = "/usr/bin/time";
    if !Path::new(TIME).exists() {
        let mut cmd = Command::new(eim_bin());
        cmd.current_dir(dir).args(args);
        return run_bounded(cmd, 2 * TIME_LIMIT);
    }
    let report = tempfile::NamedTempFile::new().expect("temp file");
    let mut cmd = Command::new(TIME);
    cmd.current_dir(dir)
        .args([os("-q"), os("-f"), os("%M"), os("-o")])
        .arg(report.path())
        .arg(eim_bin())
        .args(args);
    let mut run = run_bounded(cmd, 2 * TIME_LIMIT);
    let text = std::fs::read_to_string(report.path()).expect("time's report");
    let kib = text.lines().last().and_then(|l| l.trim().parse().ok());
    run.time_kib = Some(kib.unwrap_or_else(|| panic!("time's report: {text:?}")));
    run
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Every command that reads a file the user names, with `FILE` where the
/// file goes (`lookup` also takes an address).
const FILE_COMMANDS: &[&[&str]] = &[
    &["inspect", "FILE"],
    &["deltas", "FILE"],
    &["fileid", "FILE"],
    &["tables", "FILE"],
    &["lookup", "FILE", "0x1000"],
    &["loaders", "FILE"],
];

fn with_file<'a>(command: &[&'a str], file: &'a OsStr) -> Vec<&'a OsStr> {
    command
        .iter()
        .map(|&a| if a == "FILE" { file } else { OsStr::new(a) })
        .collect()
}

/// Row "`eim inspect FIFO` (also `deltas`, `fileid`, `tables`, `lookup`,
/// `loaders`) hangs forever in `open()`": each fails at once, naming the
/// file and what it is. Nobody ever opens the FIFO for writing, so a
/// blocking open would hang until the run is killed.
#[test]
fn fifo_as_input_fails_at_once_for_every_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    mkfifo(&dir.path().join("fifo"));
    for command in FILE_COMMANDS {
        let run = eim_in(dir.path(), &with_file(command, os("fifo")));
        run.assert_small_failure(&format!("eim {command:?}"), "not a regular file: a FIFO");
        assert!(
            run.stderr().contains("fifo:"),
            "names the file: {}",
            run.stderr()
        );
    }
}

/// The rest of what is not a regular file: a device, a directory and a
/// socket are refused at once by every command.
#[test]
fn devices_sockets_and_directories_are_refused_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    std::fs::create_dir(dir.path().join("dir")).expect("mkdir");
    for (file, says) in [
        ("/dev/zero", "not a regular file: a character device"),
        ("/dev/null", "not a regular file: a character device"),
        ("dir", "not a regular file: a directory"),
        // open() itself refuses a socket (ENXIO), before any fstat.
        ("socket", "socket:"),
    ] {
        for command in FILE_COMMANDS {
            let run = eim_in(dir.path(), &with_file(command, os(file)));
            run.assert_small_failure(&format!("eim {command:?} on {file}"), says);
        }
    }
}

/// Row "`eim tables /dev/zero`: RSS 1.26 GB and growing".
#[test]
fn tables_on_dev_zero_fails_fast_and_small() {
    let run = eim_in(Path::new("/"), &[os("tables"), os("/dev/zero")]);
    run.assert_small_failure(
        "eim tables /dev/zero",
        "/dev/zero: not a regular file: a character device",
    );
}

/// Row "`eim tables` on a 4 GiB sparse file: 4.2 GB": refused by its size
/// before a byte is read; allowed by a larger `--max-size`, its line of
/// zeros fails at 16 KiB.
#[test]
fn tables_on_a_4_gib_sparse_file_fails_fast_and_small() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sparse = dir.path().join("sparse");
    let mut f = std::fs::File::create(&sparse).expect("create");
    f.write_all(b"# file: /x\n").expect("write");
    f.set_len(4 << 30).expect("a 4 GiB sparse file");
    drop(f);
    let run = eim_in(dir.path(), &[os("tables"), os("sparse")]);
    run.assert_small_failure(
        "eim tables on 4 GiB",
        "sparse: 4294967296 bytes, larger than the limit of 2147483648 bytes",
    );
    let run = eim_in(
        dir.path(),
        &[
            os("tables"),
            os("--max-size"),
            os("8589934592"),
            os("sparse"),
        ],
    );
    run.assert_small_failure(
        "eim tables --max-size 8G on 4 GiB",
        "sparse: line 2 is longer than 16384 bytes",
    );
}

/// The LZMA2 chunk headers of `data` (a raw LZMA2 stream): each chunk's
/// control byte and the bytes after it, up to the end marker.
fn lzma2_chunks(data: &[u8]) -> Vec<(u8, &[u8])> {
    let mut chunks = Vec::new();
    let mut at = 0;
    loop {
        let control = data[at];
        let len = match control {
            0x00 => break,
            0x01 | 0x02 => 2 + (usize::from(data[at + 1]) << 8 | usize::from(data[at + 2])) + 1,
            0x80.. => {
                let packed = (usize::from(data[at + 3]) << 8 | usize::from(data[at + 4])) + 1;
                let props = usize::from(control >= 0xc0);
                4 + props + packed
            }
            _ => panic!("LZMA2 control byte {control:#x}"),
        };
        chunks.push((control, &data[at + 1..at + 1 + len]));
        at += 1 + len;
    }
    chunks
}

/// xz's variable-length integers.
fn xz_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// The uncompressed bytes per repeated unit of an [`xz_bomb`].
const BOMB_UNIT: usize = 2 << 20;

/// An xz file (one stream, one block, no check) that inflates to `header`
/// and then `units` times [`BOMB_UNIT`] bytes of `pattern` repeated, in a
/// few hundred bytes per unit: the LZMA chunks that encode one unit are
/// written `units` times. They decode the same wherever they stand because
/// each repetition starts with a state reset, the literal and position
/// contexts are off (lc = lp = pb = 0) and the matches reach back only
/// into the same unit (the dictionary was empty when it was encoded).
/// Made in well under a second, where compressing 3 GiB takes minutes.
fn xz_bomb(header: &[u8], pattern: &[u8], units: u64) -> Vec<u8> {
    use lzma_rust2::{Lzma2Options, Lzma2Writer};
    assert_eq!(BOMB_UNIT % pattern.len(), 0, "whole patterns per unit");
    assert!(header.len() <= 1 << 16, "one stored chunk");
    const DICT: u32 = 4 << 20;
    const DICT_BYTE: u8 = 20; // (2 | 0) << (20 / 2 + 11) = 4 MiB
    let mut options = Lzma2Options::with_preset(1);
    options.lzma_options.dict_size = DICT;
    options.lzma_options.lc = 0;
    options.lzma_options.lp = 0;
    options.lzma_options.pb = 0;
    let mut w = Lzma2Writer::new(Vec::new(), options);
    w.write_all(&pattern.repeat(BOMB_UNIT / pattern.len()))
        .expect("encode");
    let encoded = w.finish().expect("finish");
    let chunks = lzma2_chunks(&encoded);
    assert!(
        chunks[0].0 >= 0xe0,
        "the unit starts with a dictionary reset"
    );

    let mut lzma2 = Vec::new();
    if !header.is_empty() {
        // A stored chunk with a dictionary reset.
        let n = header.len() - 1;
        lzma2.extend([0x01, (n >> 8) as u8, n as u8]);
        lzma2.extend(header);
    }
    for unit in 0..units {
        for (i, (control, rest)) in chunks.iter().enumerate() {
            if i > 0 {
                lzma2.push(*control);
                lzma2.extend(*rest);
                continue;
            }
            // The first chunk: a dictionary reset only if nothing came
            // before; new properties only the first time.
            let size_bits = control & 0x1f;
            let (mode, props) = match (unit, header.is_empty()) {
                (0, true) => (3, true),
                (0, false) => (2, true),
                _ => (1, false),
            };
            lzma2.push(0x80 | mode << 5 | size_bits);
            lzma2.extend(&rest[..4]);
            if props {
                lzma2.push(rest[4]);
            }
            lzma2.extend(&rest[5..]);
        }
    }
    lzma2.push(0x00);

    let flags = [0u8, 0]; // check type None
    let mut out = vec![0xfd, b'7', b'z', b'X', b'Z', 0];
    out.extend(flags);
    out.extend(crc32fast::hash(&flags).to_le_bytes());
    // Block header: size, flags (one filter, no sizes), LZMA2 and its
    // dictionary byte, padding, CRC32.
    let mut block = vec![0u8, 0x00, 0x21, 0x01, DICT_BYTE];
    pad4(&mut block);
    block[0] = ((block.len() + 4) / 4 - 1) as u8;
    let crc = crc32fast::hash(&block);
    block.extend(crc.to_le_bytes());
    let unpadded = (block.len() + lzma2.len()) as u64;
    block.extend(&lzma2);
    pad4(&mut block);
    out.extend(&block);
    let mut index = vec![0x00];
    xz_varint(&mut index, 1);
    xz_varint(&mut index, unpadded);
    xz_varint(&mut index, header.len() as u64 + units * BOMB_UNIT as u64);
    pad4(&mut index);
    let crc = crc32fast::hash(&index);
    index.extend(crc.to_le_bytes());
    out.extend(&index);
    let mut footer = ((index.len() / 4 - 1) as u32).to_le_bytes().to_vec();
    footer.extend(flags);
    out.extend(crc32fast::hash(&footer).to_le_bytes());
    out.extend(footer);
    out.extend(b"YZ");
    out
}

/// The bomb builder is checked with another decoder than eim's (lzma-rs):
/// a small bomb inflates to exactly its header and patterns.
#[test]
fn the_xz_bomb_builder_makes_what_another_decoder_reads() {
    let pattern = b"#0123456789abcdef\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n";
    assert_eq!(pattern.len(), 32);
    let bomb = xz_bomb(b"# file: /x\n", pattern, 3);
    let mut inflated = Vec::new();
    lzma_rs::xz_decompress(&mut bomb.as_slice(), &mut inflated).expect("a valid xz file");
    let mut want = b"# file: /x\n".to_vec();
    want.extend(pattern.repeat(3 * BOMB_UNIT / pattern.len()));
    assert!(inflated == want, "{} bytes inflated", inflated.len());
    let zeros = xz_bomb(b"", &[0], 2);
    inflated.clear();
    lzma_rs::xz_decompress(&mut zeros.as_slice(), &mut inflated).expect("a valid xz file");
    assert!(inflated.len() == 2 * BOMB_UNIT && inflated.iter().all(|&b| b == 0));
}

/// Row "`eim tables` on an xz file that inflates to 3 GiB of zeros: 11.6
/// GB, then a 6.4 GB error message": the zeros fail at their first bytes.
#[test]
fn tables_on_an_xz_bomb_of_3_gib_of_zeros_fails_fast_and_small() {
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let bomb = xz_bomb(b"", &[0], (3 << 30) / BOMB_UNIT as u64);
    eprintln!(
        "xz bomb: {} bytes for 3 GiB of zeros, made in {:?}",
        bomb.len(),
        started.elapsed()
    );
    std::fs::write(dir.path().join("zeros.xz"), &bomb).expect("write");
    let run = eim_in(dir.path(), &[os("tables"), os("zeros.xz")]);
    run.assert_small_failure(
        "eim tables on 3 GiB of xz zeros",
        "zeros.xz: not a deltas file (it does not start with a '# file:' line)",
    );
}

/// The same bomb made of valid lines (comments): nothing but the size limit
/// stops it, counted after decompression; the compressed file is far
/// below the limit.
#[test]
fn tables_on_an_xz_bomb_of_valid_lines_stops_at_the_size_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut line = vec![b'#'];
    line.resize(1023, b' ');
    line.push(b'\n');
    let bomb = xz_bomb(b"# file: /x\n", &line, (3 << 30) / BOMB_UNIT as u64);
    std::fs::write(dir.path().join("lines.xz"), &bomb).expect("write");
    let limit = 16u64 << 20;
    assert!((bomb.len() as u64) < limit);
    let run = eim_in(
        dir.path(),
        &[
            os("tables"),
            os("--max-size"),
            os(&limit.to_string()),
            os("lines.xz"),
        ],
    );
    run.assert_small_failure(
        "eim tables on 3 GiB of xz lines",
        "lines.xz: inflates to more than the limit of 16777216 bytes",
    );
}

/// The error for a bad line of 10 MB (plain, or xz-compressed) quotes at
/// most 80 bytes of it: the issue saw a 6.4 GB error message.
#[test]
fn a_10_mb_bad_line_gives_an_error_under_1_kb() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ten_mb = vec![b'z'; 10 << 20];
    let cases: [(&str, Vec<u8>, &str); 4] = [
        (
            "row",
            [&b"# file: /x\n"[..], &ten_mb, b" 1 2 3 4 5 6\n"].concat(),
            "row: line 2 is longer than 16384 bytes: \"zzzz",
        ),
        (
            "first",
            ten_mb.clone(),
            "first: not a deltas file (it does not start with a '# file:' line)",
        ),
        (
            "path",
            [&b"# file: "[..], &ten_mb, b"\n"].concat(),
            "path: line 1 is longer than 16384 bytes: \"# file: zzzz",
        ),
        (
            "token",
            [&b"# file: /x\n"[..], &ten_mb[..10_000], b" 1 2 3 4 5 6\n"].concat(),
            "token: line 2: bad address \"zzzz",
        ),
    ];
    for (name, bytes, says) in cases {
        std::fs::write(dir.path().join(name), &bytes).expect("write");
        let run = eim_in(dir.path(), &[os("tables"), os(name)]);
        run.assert_small_failure(&format!("eim tables {name}"), says);
    }
    // The same long row, xz-compressed.
    let row = [&b"# file: /x\n"[..], &ten_mb, b" 1 2 3 4 5 6\n"].concat();
    let mut packed = Vec::new();
    let options = lzma_rust2::XzOptions::with_preset(1);
    let mut w = lzma_rust2::XzWriter::new(&mut packed, options).expect("xz writer");
    w.write_all(&row).expect("compress");
    w.finish().expect("finish");
    std::fs::write(dir.path().join("row.xz"), &packed).expect("write");
    let run = eim_in(dir.path(), &[os("tables"), os("row.xz")]);
    run.assert_small_failure(
        "eim tables row.xz",
        "row.xz: line 2 is longer than 16384 bytes",
    );
}

/// `eim` as user and group `nobody`, with no supplementary groups.
fn as_nobody(args: &[&str]) -> Run {
    let spawn_from = |bin: &Path| {
        let mut cmd = Command::new(bin);
        cmd.args(args);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    };
    // The built binary may sit where nobody cannot reach it: then a copy.
    let bin = eim_bin();
    let check = spawn_from(&bin).arg("--version").output();
    if matches!(&check, Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied) {
        let dir = tempfile::tempdir().expect("temp dir");
        let copy = dir.path().join("eim");
        std::fs::copy(&bin, &copy).expect("copy eim");
        use std::os::unix::fs::PermissionsExt as _;
        for p in [dir.path(), &copy] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        return run_bounded(spawn_from(&copy), 2 * TIME_LIMIT);
    }
    run_bounded(spawn_from(&bin), 2 * TIME_LIMIT)
}

/// Row "`eim lookup --pid 1 ...` as a process whose maps it may not read:
/// says `process 1 does not exist`".
#[test]
fn lookup_of_an_unreadable_process_says_permission_denied() {
    if !root_or_skip("lookup_of_an_unreadable_process_says_permission_denied") {
        return;
    }
    let run = as_nobody(&["lookup", "--pid", "1", "0x1000"]);
    let stderr = run.stderr();
    run.assert_small_failure(
        "eim lookup --pid 1 as nobody",
        "process 1: permission denied reading /proc/1/maps: it needs CAP_SYS_PTRACE",
    );
    assert!(stderr.contains("(uid 0)"), "{stderr}");
    assert!(!stderr.contains("does not exist"), "{stderr}");
    // A scan counts such a process and goes on; its log says the same.
    let run = as_nobody(&["-vv", "scan", "--pid", "1", "--json"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr());
    let summary: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON summary");
    let denied = summary.pointer("/counters/permission_denied");
    assert_eq!(denied.and_then(|v| v.as_u64()), Some(1), "{summary}");
    assert!(
        run.stderr()
            .contains("process 1: permission denied reading /proc/1/maps: it needs CAP_SYS_PTRACE"),
        "{}",
        run.stderr()
    );
    // A process that does not exist still says so.
    let run = eim_in(
        Path::new("/"),
        &[os("lookup"), os("--pid"), os("4194305"), os("0x1000")],
    );
    run.assert_small_failure("eim lookup --pid 4194305", "process 4194305 does not exist");
}

/// The entry point of an ELF file (an address inside its code).
fn elf_entry(path: &Path) -> u64 {
    let bytes = std::fs::read(path).expect("read ELF");
    u64::from_le_bytes(bytes[24..32].try_into().expect("e_entry"))
}

/// Row "non-UTF-8 file name to `eim lookup`: `invalid UTF-8 was detected in
/// one or more arguments`": every command takes a file named with byte
/// 0xff and says the same about it as about a copy with a plain name.
#[test]
fn non_utf8_file_names_work_for_every_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let odd = OsStr::from_bytes(b"true-\xff");
    std::fs::copy("/bin/true", dir.path().join(odd)).expect("copy");
    std::fs::copy("/bin/true", dir.path().join("true-plain")).expect("copy");
    let entry = format!("{:#x}", elf_entry(Path::new("/bin/true")));
    for command in FILE_COMMANDS {
        let command: Vec<&str> = command
            .iter()
            .map(|&a| if a == "0x1000" { entry.as_str() } else { a })
            .collect();
        let odd_run = eim_in(dir.path(), &with_file(&command, odd));
        let plain_run = eim_in(dir.path(), &with_file(&command, os("true-plain")));
        for run in [&odd_run, &plain_run] {
            assert_eq!(run.code, Some(0), "eim {command:?}: {}", run.stderr());
        }
        let odd_out = odd_run.stdout().replace("true-\u{fffd}", "NAME");
        let plain_out = plain_run.stdout().replace("true-plain", "NAME");
        assert!(odd_out.contains("NAME"), "eim {command:?}: {odd_out}");
        assert_eq!(odd_out, plain_out, "eim {command:?}");
    }
}

/// Row "`eim watch --interval 0s`: busy loop, 80% of a core": an interval
/// below 10 ms is refused by the argument parser (exit 2); 10 ms runs.
#[test]
fn watch_interval_below_10ms_is_refused() {
    // Watching only a pid that cannot exist keeps each step trivial.
    let watch = |interval: &str| {
        eim_in(
            Path::new("/"),
            &[
                os("watch"),
                os("--pid"),
                os("4194305"),
                os("--steps"),
                os("2"),
                os("--interval"),
                os(interval),
            ],
        )
    };
    for interval in ["0s", "5ms", "9ms"] {
        let run = watch(interval);
        assert_eq!(run.code, Some(2), "--interval {interval}: {}", run.stderr());
        assert!(
            run.stderr()
                .contains(&format!("{interval} is shorter than the minimum of 10ms")),
            "{}",
            run.stderr()
        );
        assert!(run.elapsed < TIME_LIMIT, "{:?}", run.elapsed);
    }
    let run = watch("10ms");
    assert_eq!(run.code, Some(0), "--interval 10ms: {}", run.stderr());
}

/// `/bin/true` with its first `.eh_frame` record's length made to run past
/// the section: the file opens, its stack deltas cannot be extracted.
pub(crate) fn with_broken_eh_frame(to: &Path) {
    use object::read::elf::ElfFile64;
    use object::{Object as _, ObjectSection as _};
    let mut bytes = std::fs::read("/bin/true").expect("read /bin/true");
    let offset = {
        let elf = ElfFile64::<object::Endianness>::parse(&*bytes).expect("ELF");
        let section = elf.section_by_name(".eh_frame").expect(".eh_frame");
        section.file_range().expect("in the file").0 as usize
    };
    bytes[offset..offset + 4].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    std::fs::write(to, bytes).expect("write");
}

/// Row "`eim inspect` on a file that fails: exit 0, the failure only as a
/// `# error` line": exit 1 as `eim deltas` does, the failure named on
/// stderr, and every file's report still printed.
#[test]
fn inspect_exits_non_zero_when_a_file_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    with_broken_eh_frame(&dir.path().join("broken"));
    std::fs::copy("/bin/true", dir.path().join("good")).expect("copy");
    let deltas = eim_in(dir.path(), &[os("deltas"), os("broken")]);
    deltas.assert_small_failure(
        "eim deltas broken",
        "broken: failed to extract stack deltas",
    );
    for json in [false, true] {
        let mut args = vec![os("inspect")];
        if json {
            args.push(os("--json"));
        }
        args.extend([os("broken"), os("good")]);
        let run = eim_in(dir.path(), &args);
        run.assert_small_failure(
            &format!("eim inspect (json {json})"),
            "broken: failed to extract stack deltas",
        );
        let stdout = run.stdout();
        if json {
            let reports: Vec<serde_json::Value> = stdout
                .lines()
                .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
                .collect();
            assert_eq!(reports.len(), 2, "{stdout}");
            assert!(reports[0]["deltas_error"].is_string(), "{stdout}");
            assert!(
                reports[1]["deltas"].as_u64().is_some_and(|n| n > 0),
                "{stdout}"
            );
        } else {
            assert!(stdout.contains("# file: broken\n"), "{stdout}");
            assert!(stdout.contains("deltas: # error: "), "{stdout}");
            assert!(stdout.contains("# file: good\n"), "{stdout}");
        }
    }
    let good = eim_in(dir.path(), &[os("inspect"), os("good")]);
    assert_eq!(good.code, Some(0), "{}", good.stderr());
}
