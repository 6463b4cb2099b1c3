//! The metrics server: hyper's HTTP/1 on a current-thread tokio runtime
//! that runs on a thread of its own, so nothing a client does can block a
//! `watch` step, and its failure never ends the `watch`.
//!
//! Every resource a client can make it hold is bounded: [`Limits`] caps the
//! connections (see [`super::slots`]), the bytes buffered for one, the time
//! to send a request head (also the idle time between two requests) and a
//! connection's whole life (a client that never reads its answers). The
//! accept loop outlives every error: out of descriptors (EMFILE) it backs
//! off and tries again.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

use super::slots::{Slot, Slots};
use super::{routes, Metrics};

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}: {cause}")]
pub struct ServeError {
    pub addr: SocketAddr,
    pub cause: io::Error,
}

/// What one server may hold at once.
#[derive(Clone, Debug)]
pub(super) struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Bytes buffered per connection, the request head included (hyper's
    /// minimum is 8 KiB).
    pub max_buf: usize,
    /// Time to send a complete request head, from the connection's start or
    /// from the end of the previous answer.
    pub header_timeout: Duration,
    /// A connection's whole life, whatever it does.
    pub lifetime: Duration,
    /// The pause after an accept error such as EMFILE.
    pub accept_backoff: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 64,
            max_buf: 16 * 1024,
            header_timeout: Duration::from_secs(5),
            lifetime: Duration::from_secs(30),
            accept_backoff: Duration::from_millis(100),
        }
    }
}

/// One warning per this much time for a repeated failure.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Where connections come from: a TCP listener, or in tests one that fails
/// on demand.
pub(super) trait Listener: Send + Sync + 'static {
    fn accept(&self) -> impl Future<Output = io::Result<TcpStream>> + Send;
}

impl Listener for TcpListener {
    async fn accept(&self) -> io::Result<TcpStream> {
        TcpListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// An HTTP server answering `GET /metrics` and `GET /healthz`; stopped when
/// dropped.
#[derive(Debug)]
pub struct MetricsServer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Serves `metrics` on `addr` (port 0 picks a free port: see [`Self::addr`]).
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<Self, ServeError> {
        let error = |cause| ServeError { addr, cause };
        let rt = runtime().map_err(error)?;
        let listener = rt.block_on(async { bind(addr) }).map_err(error)?;
        let bound = listener.local_addr().map_err(error)?;
        let server = Self::run(rt, listener, bound, metrics, Limits::default())?;
        tracing::info!(%bound, "serving metrics at /metrics");
        Ok(server)
    }

    /// Serves on `listener` from a new thread that drives `rt`.
    pub(super) fn run<L: Listener>(
        rt: Runtime,
        listener: L,
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        limits: Limits,
    ) -> Result<Self, ServeError> {
        let (stop, stopped) = oneshot::channel::<()>();
        rt.spawn(supervise(Arc::new(listener), metrics, limits));
        let thread = std::thread::Builder::new()
            .name("eim-metrics".into())
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || {
                // Serving needs no privilege (the socket is bound), and a
                // thread's capabilities are its own (crate::sandbox).
                crate::sandbox::drop_all_in_this_thread();
                // Returns when the server is dropped; dropping the runtime
                // then closes every connection.
                let _ = rt.block_on(stopped);
            })
            .map_err(|cause| ServeError { addr, cause })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
            addr,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A panic of the server thread has been reported on stderr
            // already; the caller goes on.
            let _ = thread.join();
        }
    }
}

/// Connections the kernel queues until they are accepted. tokio's default
/// (128) overflows in a burst of connections, and a dropped SYN costs its
/// client a one-second retry.
const BACKLOG: u32 = 1024;

/// A listener on `addr`; needs the runtime's context.
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // A restarted eim rebinds at once, despite connections in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// The stack of the server's thread and of any blocking thread its
/// runtime starts (it starts none today): it parses requests and renders
/// text, in frames of a few KiB.
const THREAD_STACK_BYTES: usize = 1 << 20;

pub(super) fn runtime() -> io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .thread_stack_size(THREAD_STACK_BYTES)
        .max_blocking_threads(1)
        .build()
}

/// Runs the accept loop again if it ever ends (a panic would be a bug, but
/// must not leave `watch` without metrics for the rest of its life).
async fn supervise<L: Listener>(listener: Arc<L>, metrics: Arc<Metrics>, limits: Limits) {
    let limits = Arc::new(limits);
    let slots = Slots::new(limits.connections);
    loop {
        let run = tokio::spawn(accept_loop(
            listener.clone(),
            metrics.clone(),
            limits.clone(),
            slots.clone(),
        ));
        if let Err(e) = run.await {
            tracing::error!("metrics: the accept loop failed ({e}); restarting it");
        }
        tokio::time::sleep(limits.accept_backoff).await;
    }
}

/// Accept errors that concern one connection only (it went away before it
/// was accepted): the next accept may succeed at once.
fn one_connection_only(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

async fn accept_loop<L: Listener>(
    listener: Arc<L>,
    metrics: Arc<Metrics>,
    limits: Arc<Limits>,
    slots: Arc<Slots>,
) {
    let mut accept_errors = Reports::new(REPORT_EVERY);
    let mut refused = Reports::new(REPORT_EVERY);
    loop {
        let stream = match listener.accept().await {
            Ok(stream) => stream,
            Err(e) if one_connection_only(&e) => {
                tracing::debug!("metrics: accepting a connection: {e}");
                continue;
            }
            Err(e) => {
                if let Some(left_out) = accept_errors.due(Instant::now()) {
                    tracing::warn!(
                        "metrics: accepting a connection: {e} ({left_out} more since the last \
                         warning); retrying every {:?}",
                        limits.accept_backoff
                    );
                }
                tokio::time::sleep(limits.accept_backoff).await;
                continue;
            }
        };
        let Some(slot) = slots.admit().await else {
            if let Some(left_out) = refused.due(Instant::now()) {
                tracing::warn!(
                    "metrics: {} connections are being answered; closing a new one \
                     ({left_out} more since the last warning)",
                    limits.connections
                );
            }
            continue;
        };
        let slot = Arc::new(slot);
        let task = tokio::spawn(serve(stream, slot.clone(), metrics.clone(), limits.clone()));
        slot.waiting_for_head(task.abort_handle());
    }
}

/// Answers the requests of one connection until it closes or a limit ends
/// it; `slot` is released with the task.
async fn serve(stream: TcpStream, slot: Arc<Slot>, metrics: Arc<Metrics>, limits: Arc<Limits>) {
    let service = service_fn(move |request| {
        slot.head_received();
        let response = routes::respond(&request, &metrics);
        // The body is dropped unread with the request.
        drop(request);
        async move { Ok::<_, Infallible>(response) }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_buf)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.lifetime, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("metrics: connection: {e}"),
        Err(_) => tracing::debug!("metrics: connection closed after {:?}", limits.lifetime),
    }
}

/// At most one report per period of a repeated event, counting the ones
/// left out.
#[derive(Debug)]
struct Reports {
    every: Duration,
    last: Option<Instant>,
    left_out: u64,
}

impl Reports {
    fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            left_out: 0,
        }
    }

    /// `Some(events left out since the last report)` when this one is to be
    /// reported.
    fn due(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.left_out += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.left_out))
            }
        }
    }
}

#[cfg(test)]
mod tests;
