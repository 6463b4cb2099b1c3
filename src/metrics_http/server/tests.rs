//! The server over real loopback sockets, with small limits so that each
//! case takes well under a second or two.

use std::io::{Read, Write};
use std::net::TcpStream as StdStream;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// Longest any single read in these tests may wait.
const DEADLINE: Duration = Duration::from_secs(5);

fn quick() -> Limits {
    Limits {
        connections: 4,
        max_buf: 8 * 1024,
        header_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(60),
        accept_backoff: Duration::from_millis(5),
    }
}

fn serve_on<L: Listener>(
    rt: Runtime,
    listener: L,
    addr: SocketAddr,
    limits: Limits,
) -> (MetricsServer, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    metrics.processes.set(3);
    let server =
        MetricsServer::run(rt, listener, addr, metrics.clone(), limits).expect("server starts");
    (server, metrics)
}

fn start(limits: Limits) -> (MetricsServer, Arc<Metrics>) {
    let rt = runtime().expect("runtime");
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("address");
    serve_on(rt, listener, addr, limits)
}

fn connect(server: &MetricsServer) -> StdStream {
    let s = StdStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    s
}

/// Sends `raw` and reads until the server closes (or `DEADLINE`).
fn exchange(server: &MetricsServer, raw: &[u8]) -> String {
    let mut s = connect(server);
    // The server may answer and close before reading everything (a head
    // too large): a failed write is part of what is tested.
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(server: &MetricsServer, target: &str) -> String {
    exchange(
        server,
        format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

fn serves_metrics(server: &MetricsServer) -> bool {
    let answer = get(server, "/metrics");
    answer.starts_with("HTTP/1.1 200") && answer.contains("\neim_processes_tracked 3\n")
}

/// Whether the server closes `s` within `within` (EOF or reset).
fn closed_within(s: &mut StdStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn routes_over_tcp() {
    let (server, metrics) = start(quick());
    for target in ["/metrics", "/metrics?a=b", "/metrics?a=b&c=%20d"] {
        let answer = get(&server, target);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n"),
            "{target}: {answer}"
        );
        assert!(
            answer.contains("content-type: application/openmetrics-text"),
            "{answer}"
        );
        assert!(answer.contains("\neim_processes_tracked 3\n"), "{answer}");
    }
    metrics.processes.set(11);
    assert!(get(&server, "/metrics?x").contains("\neim_processes_tracked 11\n"));
    let health = get(&server, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
    assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
    assert!(get(&server, "/").starts_with("HTTP/1.1 404"));
    let post = exchange(
        &server,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
}

#[test]
fn a_huge_declared_body_is_neither_read_nor_waited_for() {
    let (server, _) = start(quick());
    let started = Instant::now();
    let answer = exchange(
        &server,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\nabc",
    );
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    // read_to_end returned: the server closed the connection itself.
    assert!(started.elapsed() < DEADLINE, "closed by the read timeout");
    assert!(serves_metrics(&server));
}

#[test]
fn a_head_larger_than_the_buffer_is_refused() {
    let (server, _) = start(quick());
    let mut raw = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    raw.resize(raw.len() + 1024 * 1024, b'a');
    raw.extend_from_slice(b"\r\n\r\n");
    let answer = exchange(&server, &raw);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    assert!(serves_metrics(&server));
}

#[test]
fn a_silent_or_idle_connection_is_closed_after_the_header_timeout() {
    let (server, _) = start(Limits {
        header_timeout: Duration::from_millis(300),
        ..quick()
    });
    let mut silent = connect(&server);
    assert!(!closed_within(&mut silent, Duration::from_millis(100)));
    assert!(closed_within(&mut silent, Duration::from_secs(3)));

    // Kept alive after an answer, then idle: the same timeout.
    let mut kept = connect(&server);
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("request");
    let mut buf = [0u8; 512];
    let n = kept.read(&mut buf).expect("answer");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(closed_within(&mut kept, Duration::from_secs(3)));
}

#[test]
fn a_newcomer_at_the_bound_pushes_out_the_oldest_silent_connection() {
    let limits = quick();
    let (server, _) = start(limits.clone());
    let mut silent: Vec<StdStream> = (0..limits.connections).map(|_| connect(&server)).collect();
    // Let the server accept them all before the newcomer.
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    assert!(serves_metrics(&server));
    // The header timeout is 30 s: only the bound can have closed one.
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(closed_within(&mut silent[0], Duration::from_secs(2)));
    assert!(!closed_within(&mut silent[1], Duration::from_millis(100)));
}

#[test]
fn more_silent_connections_than_slots_keep_the_server_bounded_and_serving() {
    let limits = quick();
    let (server, _) = start(limits.clone());
    let mut silent: Vec<StdStream> = (0..50).map(|_| connect(&server)).collect();
    assert!(serves_metrics(&server));
    let open = silent
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_millis(20)))
        .filter(|closed| !closed)
        .count();
    assert!(open <= limits.connections, "{open} silent connections kept");
}

/// A listener that fails with given errors before each real accept.
struct Flaky {
    inner: TcpListener,
    errors: std::sync::Mutex<Vec<io::Error>>,
    returned: Arc<AtomicUsize>,
}

impl Listener for Flaky {
    async fn accept(&self) -> io::Result<TcpStream> {
        let next = self
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        if let Some(e) = next {
            self.returned.fetch_add(1, Ordering::SeqCst);
            return Err(e);
        }
        Listener::accept(&self.inner).await
    }
}

#[test]
fn the_accept_loop_outlives_accept_errors() {
    let rt = runtime().expect("runtime");
    let inner = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = inner.local_addr().expect("address");
    let mut errors = Vec::new();
    for _ in 0..10 {
        errors.push(io::Error::from_raw_os_error(libc::EMFILE));
        errors.push(io::Error::from_raw_os_error(libc::ENFILE));
        errors.push(io::Error::from_raw_os_error(libc::ECONNABORTED));
        errors.push(io::Error::from_raw_os_error(libc::ENOBUFS));
    }
    let count = errors.len();
    let returned = Arc::new(AtomicUsize::new(0));
    let flaky = Flaky {
        inner,
        errors: std::sync::Mutex::new(errors),
        returned: returned.clone(),
    };
    let (server, _) = serve_on(rt, flaky, addr, quick());
    assert!(serves_metrics(&server));
    assert_eq!(returned.load(Ordering::SeqCst), count);
    assert!(serves_metrics(&server));
}

/// A listener whose first accept panics, as a bug in the loop would.
struct PanicsOnce {
    inner: TcpListener,
    panicked: std::sync::atomic::AtomicBool,
}

impl Listener for PanicsOnce {
    async fn accept(&self) -> io::Result<TcpStream> {
        if !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("a bug in the accept loop (expected by this test)");
        }
        Listener::accept(&self.inner).await
    }
}

#[test]
fn the_accept_loop_is_restarted_after_a_panic() {
    let rt = runtime().expect("runtime");
    let inner = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = inner.local_addr().expect("address");
    let listener = PanicsOnce {
        inner,
        panicked: false.into(),
    };
    let (server, _) = serve_on(rt, listener, addr, quick());
    assert!(serves_metrics(&server));
}

#[test]
fn reports_are_rate_limited_and_count_what_they_left_out() {
    let mut r = Reports::new(Duration::from_secs(10));
    let t0 = Instant::now();
    assert_eq!(r.due(t0), Some(0));
    assert_eq!(r.due(t0 + Duration::from_secs(1)), None);
    assert_eq!(r.due(t0 + Duration::from_secs(9)), None);
    assert_eq!(r.due(t0 + Duration::from_secs(10)), Some(2));
    assert_eq!(r.due(t0 + Duration::from_secs(11)), None);
    assert_eq!(r.due(t0 + Duration::from_secs(30)), Some(1));
}

#[test]
fn dropping_the_server_closes_its_port() {
    let (server, _) = start(quick());
    let addr = server.addr();
    let mut open = connect(&server);
    drop(server);
    assert!(closed_within(&mut open, Duration::from_secs(2)));
    assert!(StdStream::connect(addr).is_err());
}
