//! The metrics port under abuse from local clients (issue 12): a huge
//! declared body, thousands of idle connections, garbage request lines, a
//! megabyte of header, a shortage of descriptors. Each case runs a real
//! `eim watch` (simulated maps, one `sleep` process watched), does the
//! abuse on 127.0.0.1, then checks that the same `watch` still serves
//! correct metrics, stayed small, and stops cleanly on SIGINT.
//!
//! No root needed: the simulated backend and our own child suffice.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{eim_bin, rss_bytes};

/// Longest any one step of these tests may take.
const DEADLINE: Duration = Duration::from_secs(10);
/// The bound on the RSS of an abused `watch`.
const RSS_LIMIT: u64 = 64 << 20;

/// A child process killed (and reaped) when dropped, so no failed test
/// leaves one behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sleep 300`, once its libc is mapped (what `watch` then loads).
fn sleeper() -> Reaped {
    let child = Command::new("sleep")
        .arg("300")
        .stdin(Stdio::null())
        .spawn()
        .expect("sleep starts");
    let sleep = Reaped(child);
    let maps = format!("/proc/{}/maps", sleep.0.id());
    let started = Instant::now();
    while !std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("libc.so.6")) {
        assert!(started.elapsed() < DEADLINE, "sleep never mapped libc");
        std::thread::sleep(Duration::from_millis(10));
    }
    sleep
}

/// A running `eim watch --metrics-addr 127.0.0.1:0` of one `sleep`.
struct Watch {
    child: Reaped,
    addr: SocketAddr,
    /// Kept so the sleep outlives the watch.
    _sleep: Reaped,
    /// What the watch wrote on stderr after its address line.
    stderr: mpsc::Receiver<String>,
}

impl Watch {
    fn start() -> Self {
        Self::start_with("200ms", |_| {})
    }

    /// One step every `interval`, with `adjust` applied to the command
    /// before it starts.
    fn start_with(interval: &str, adjust: impl FnOnce(&mut Command)) -> Self {
        let sleep = sleeper();
        let mut cmd = Command::new(eim_bin());
        cmd.args(["watch", "--json", "--interval", interval])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(["--pid", &sleep.0.id().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        adjust(&mut cmd);
        let mut child = Reaped(cmd.spawn().expect("eim watch starts"));
        let stderr = child.0.stderr.take().expect("stderr");
        // A thread reads stderr to its end, so the watch never blocks on a
        // full pipe and the address can be waited for with a deadline.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let addr = loop {
            let line = rx
                .recv_timeout(DEADLINE)
                .expect("eim watch prints its metrics address");
            if let Some(rest) = line.trim().strip_prefix("eim: metrics at http://") {
                break rest
                    .trim_end_matches("/metrics")
                    .parse()
                    .expect("a socket address");
            }
        };
        let watch = Self {
            child,
            addr,
            _sleep: sleep,
            stderr: rx,
        };
        // Until the first step is done the gauges are zero.
        let started = Instant::now();
        while watch.loaded() == Some(0) || watch.loaded().is_none() {
            assert!(started.elapsed() < DEADLINE, "watch never loaded the sleep");
            std::thread::sleep(Duration::from_millis(50));
        }
        watch
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn assert_running(&mut self) {
        let status = self.child.0.try_wait().expect("waitpid");
        assert!(status.is_none(), "eim watch died: {status:?}");
    }

    fn rss(&self) -> u64 {
        rss_bytes(self.pid()).expect("VmRSS of eim watch")
    }

    /// The `eim_num_exe_id_loaded_to_ebpf` gauge, if a scrape answers.
    fn loaded(&self) -> Option<u64> {
        let m = scrape(self.addr)?;
        m.get("eim_num_exe_id_loaded_to_ebpf").map(|v| *v as u64)
    }

    /// Asserts that a scrape gets the metrics of one watched process with
    /// `loaded` files loaded, retrying for a while (a scraper would retry).
    fn assert_serves(&mut self, loaded: u64) {
        let started = Instant::now();
        loop {
            self.assert_running();
            if let Some(m) = scrape(self.addr) {
                assert_eq!(m.get("eim_processes_tracked"), Some(&1.0), "{m:?}");
                assert_eq!(
                    m.get("eim_num_exe_id_loaded_to_ebpf"),
                    Some(&(loaded as f64)),
                    "{m:?}"
                );
                for name in [
                    "eim_unwind_info_array_size",
                    "eim_hashmap_num_stack_delta_pages",
                    "eim_stack_delta_provider_success_total",
                    "eim_files_failed",
                ] {
                    assert!(m.contains_key(name), "{name} missing: {m:?}");
                }
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no correct scrape within 5 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// After an abuse: still serving `loaded` files, its RSS grown by less
    /// than `growth` bytes since `rss_before`, and a clean stop.
    fn assert_unharmed(mut self, loaded: u64, rss_before: u64, growth: u64) {
        self.assert_serves(loaded);
        let rss_after = self.rss();
        assert!(
            rss_after < rss_before + growth,
            "RSS grew from {rss_before} to {rss_after}"
        );
        self.stop_cleanly();
    }

    /// SIGINT: the watch ends normally, exit 0, with its JSON summary.
    fn stop_cleanly(mut self) {
        self.assert_running();
        // SAFETY: kill(2) on our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, libc::SIGINT) }, 0);
        let mut stdout = self.child.0.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = stdout.read_to_string(&mut out);
            let _ = tx.send(out);
        });
        let out = rx.recv_timeout(DEADLINE).expect("watch stops within 10 s");
        let status = self.child.0.wait().expect("watch exits");
        let stderr: Vec<String> = self.stderr.try_iter().collect();
        assert!(status.success(), "{status}; stderr: {stderr:?}");
        let json: serde_json::Value = serde_json::from_str(&out).expect("JSON summary");
        assert_eq!(json["processes"]["tracked"], 1, "{out}");
    }
}

/// One request; the answer's status and body if the server answered
/// within the deadline.
fn request(addr: SocketAddr, raw: &[u8]) -> Option<(u16, String)> {
    let answer = exchange(addr, raw, DEADLINE);
    let status = answer.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Sends `raw` (as much as the server reads) and reads until the server
/// closes or `within` passes.
fn exchange(addr: SocketAddr, raw: &[u8], within: Duration) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, within) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(within));
    let _ = s.set_write_timeout(Some(within));
    // The server may answer and close before reading all of an abusive
    // request: a failed write is expected then.
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /metrics`, parsed into name -> value (comments left out).
fn scrape(addr: SocketAddr) -> Option<BTreeMap<String, f64>> {
    let (status, body) = request(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: eim\r\nConnection: close\r\n\r\n",
    )?;
    if status != 200 || !body.ends_with("# EOF\n") {
        return None;
    }
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Whether the server closes `s` within `within` (EOF or reset) without
/// sending anything.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let _ = s.set_read_timeout(Some(within));
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// Raises this test process's limit on descriptors to at least 4,096 if it
/// may, else its soft limit to its hard limit (thousands of sockets are
/// opened here), and returns the new soft limit.
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with valid pointers to locals.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        // Root may raise the hard limit too; others take what they have.
        let wanted = libc::rlimit {
            rlim_cur: lim.rlim_max.max(4096),
            rlim_max: lim.rlim_max.max(4096),
        };
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            ..lim
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
            libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
        }
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
    }
    lim.rlim_cur
}

#[test]
fn an_oversized_content_length_is_answered_without_reading_the_body() {
    let mut watch = Watch::start();
    let loaded = watch.loaded().expect("scrape");
    let rss_before = watch.rss();
    let started = Instant::now();
    let answer = exchange(
        watch.addr,
        b"POST /metrics HTTP/1.1\r\nHost: eim\r\nContent-Length: 99999999999\r\n\r\nabc",
        DEADLINE,
    );
    let waited = started.elapsed();
    // What the issue saw: the body's length allocated, an abort.
    std::thread::sleep(Duration::from_millis(300));
    watch.assert_running();
    watch.assert_serves(loaded);
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer:?}");
    assert!(
        waited < Duration::from_secs(5),
        "the server waited for the body"
    );
    // The same with a chunked body that never ends, and a GET with a body.
    for raw in [
        &b"POST /metrics HTTP/1.1\r\nHost: eim\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\nabc"[..],
        &b"GET /metrics HTTP/1.1\r\nHost: eim\r\nContent-Length: 99999999999\r\n\r\nabc"[..],
    ] {
        let answer = exchange(watch.addr, raw, DEADLINE);
        assert!(answer.starts_with("HTTP/1.1 "), "{answer:?}");
        assert!(answer.contains("connection: close\r\n"), "{answer:?}");
    }
    watch.assert_unharmed(loaded, rss_before, 16 << 20);
}

#[test]
fn two_thousand_idle_connections_neither_starve_scrapes_nor_bloat_watch() {
    let limit = raise_nofile();
    assert!(limit > 2_100, "RLIMIT_NOFILE hard limit {limit} < 2,100");
    let mut watch = Watch::start();
    let loaded = watch.loaded().expect("scrape");
    let rss_before = watch.rss();
    let started = Instant::now();
    let idle: Vec<TcpStream> = (0..2_000)
        .filter_map(|_| TcpStream::connect_timeout(&watch.addr, Duration::from_secs(2)).ok())
        .collect();
    eprintln!(
        "http: {} idle connections opened in {:?}",
        idle.len(),
        started.elapsed()
    );
    assert!(idle.len() >= 1_900, "only {} connected", idle.len());
    // With every idle connection still open, a scrape gets through at once.
    watch.assert_serves(loaded);
    let rss = watch.rss();
    eprintln!("http: eim watch VmRSS {rss_before} bytes before, {rss} with 2,000 idle connections");
    assert!(rss < RSS_LIMIT, "VmRSS {rss} bytes");
    // eim holds a bounded number of them: the rest were closed.
    let fds = std::fs::read_dir(format!("/proc/{}/fd", watch.pid()))
        .expect("fd list")
        .count();
    eprintln!("http: eim watch holds {fds} descriptors");
    assert!(fds < 200, "{fds} descriptors open in eim watch");
    drop(idle);
    watch.assert_serves(loaded);
    watch.stop_cleanly();
}

#[test]
fn metrics_are_served_with_a_query_string_and_health_at_healthz() {
    let watch = Watch::start();
    let loaded = watch.loaded().expect("scrape");
    for target in [
        "/metrics?a=b",
        "/metrics?module=eim&target=x%20y",
        "/metrics?",
    ] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: eim\r\nConnection: close\r\n\r\n");
        let (status, body) = request(watch.addr, raw.as_bytes()).expect("answer");
        assert_eq!(status, 200, "{target}: {body}");
        assert!(
            body.contains(&format!("\neim_num_exe_id_loaded_to_ebpf {loaded}\n")),
            "{target}: {body}"
        );
    }
    let health = request(
        watch.addr,
        b"GET /healthz HTTP/1.1\r\nHost: eim\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(health, Some((200, "ok\n".to_string())));
    let missing = request(
        watch.addr,
        b"GET /nothing HTTP/1.1\r\nHost: eim\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(missing.map(|(status, _)| status), Some(404));
    watch.stop_cleanly();
}

#[test]
fn garbage_requests_get_an_error_or_a_close_and_watch_keeps_serving() {
    let mut watch = Watch::start();
    let loaded = watch.loaded().expect("scrape");
    let rss_before = watch.rss();
    let mut long_line = b"GET /".to_vec();
    long_line.resize(100 * 1024, b'a');
    long_line.extend_from_slice(b" HTTP/1.1\r\nHost: eim\r\n\r\n");
    let junk: Vec<u8> = (0u32..64 * 1024)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let cases: [(&str, &[u8]); 7] = [
        ("binary junk", &junk),
        ("GET without a version", b"GET /metrics\r\n\r\n"),
        ("a 100 KB request line", &long_line),
        (
            "an unknown version",
            b"GET /metrics HTTP/7.1\r\nHost: eim\r\n\r\n",
        ),
        ("NUL bytes", b"\0\0\0\0\0\0\0\0\r\n\r\n"),
        (
            "a bad header line",
            b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        ),
        ("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    ];
    for (what, raw) in cases {
        let started = Instant::now();
        let answer = exchange(watch.addr, raw, DEADLINE);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: the server kept the connection {:?}",
            started.elapsed()
        );
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
            "{what}: {answer:?}"
        );
        watch.assert_running();
    }
    watch.assert_unharmed(loaded, rss_before, 16 << 20);
}

#[test]
fn a_one_megabyte_header_is_refused_without_growing_watch() {
    let watch = Watch::start();
    let loaded = watch.loaded().expect("scrape");
    let rss_before = watch.rss();
    let mut raw = b"GET /metrics HTTP/1.1\r\nHost: eim\r\nX-Big: ".to_vec();
    raw.resize(raw.len() + (1 << 20), b'a');
    raw.extend_from_slice(b"\r\n\r\n");
    // Many at once, so a server that buffered them would show it.
    let senders: Vec<_> = (0..8)
        .map(|_| {
            let raw = raw.clone();
            let addr = watch.addr;
            std::thread::spawn(move || exchange(addr, &raw, DEADLINE))
        })
        .collect();
    for sender in senders {
        let answer = sender.join().expect("sender");
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer:?}"
        );
    }
    watch.assert_unharmed(loaded, rss_before, 4 << 20);
}

#[test]
fn a_silent_connection_is_dropped_by_the_header_timeout() {
    let mut watch = Watch::start();
    let mut silent = TcpStream::connect(watch.addr).expect("connect");
    let started = Instant::now();
    assert!(closed_within(&mut silent, DEADLINE), "never closed");
    let after = started.elapsed();
    assert!(
        (Duration::from_secs(4)..Duration::from_secs(8)).contains(&after),
        "closed after {after:?}, not by the 5 s header timeout"
    );
    watch.assert_running();
    watch.stop_cleanly();
}

#[test]
fn running_out_of_descriptors_kills_neither_the_listener_nor_the_polling_watch() {
    out_of_descriptors(&["--no-events"]);
}

/// The same with host events (where the privileges allow them; else the
/// watch polls and says so): the resyncs, every 100 ms here, meet EMFILE.
#[test]
fn running_out_of_descriptors_kills_neither_the_listener_nor_the_event_watch() {
    out_of_descriptors(&["--resync-every", "100ms"]);
}

fn out_of_descriptors(mode: &'static [&'static str]) {
    let limit = raise_nofile();
    assert!(limit > 500, "RLIMIT_NOFILE hard limit {limit}");
    // So few descriptors that the idle connections below exhaust them
    // before the bound on connections (64) is reached: the accept loop
    // meets EMFILE, and so do the steps (listing /proc needs descriptors).
    let mut watch = Watch::start_with("100ms", |cmd| {
        cmd.args(mode);
        // SAFETY: setrlimit is async-signal-safe; the closure runs in the
        // child between fork and exec and touches nothing else.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 40,
                    rlim_max: 40,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    });
    let loaded = watch.loaded().expect("scrape");
    let idle: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect_timeout(&watch.addr, Duration::from_secs(2)).ok())
        .collect();
    let failed = |watch: &Watch| {
        watch
            .stderr
            .try_iter()
            .filter(|l| l.contains("step failed") && l.contains("trying again"))
            .count()
    };
    // Until a step meets EMFILE (a fixed pause could end first on a loaded
    // machine).
    let mut failures = 0;
    let met = eim_test_support::wait_for(Duration::from_secs(30), || {
        failures += failed(&watch);
        failures > 0
    });
    watch.assert_running();
    let fds = std::fs::read_dir(format!("/proc/{}/fd", watch.pid()))
        .expect("fd list")
        .count();
    assert!(
        fds >= 38,
        "only {fds} descriptors open: EMFILE was not reached"
    );
    // The steps failed meanwhile, and the watch went on.
    assert!(met, "no step met EMFILE");
    drop(idle);
    watch.assert_serves(loaded);
    // Descriptors are back: steps succeed again (none fails for a second).
    let _ = failed(&watch);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(failed(&watch), 0, "steps still fail with descriptors back");
    watch.assert_running();
    watch.stop_cleanly();
}

#[test]
fn a_metrics_port_taken_by_someone_else_does_not_stop_watch() {
    // A local user can bind the port first; eim must still load tables.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = squatter.local_addr().expect("address");
    let sleep = sleeper();
    let out = Command::new(eim_bin())
        .args(["watch", "--json", "--interval", "10ms", "--steps", "2"])
        .args(["--metrics-addr", &addr.to_string()])
        .args(["--pid", &sleep.0.id().to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("eim watch runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(
        stderr.contains(&format!("cannot serve metrics on {addr}: "))
            && stderr.contains("watching without metrics"),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert!(json["files"]["loaded"].as_u64() > Some(0), "{json}");
}
