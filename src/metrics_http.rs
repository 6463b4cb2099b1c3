//! The metrics of a watching host over HTTP, in the Prometheus text
//! exposition format (OpenMetrics text, as `prometheus-client` writes it,
//! which Prometheus scrapes natively).
//!
//! Exposed: upstream's five manager metrics (gauges for what is loaded,
//! counters for the provider), and eim's own: extraction and kernel time,
//! extraction calls, deferred, failed and unsupported files, processes
//! tracked. The
//! server ([`MetricsServer`]) is in `server`, what it answers in `routes`,
//! its bound on connections in `slots`.

mod routes;
mod server;
mod slots;

pub use server::{MetricsServer, ServeError};

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::report::summary::Summary;

/// The metrics, registered once and updated after every step.
pub struct Metrics {
    registry: Registry,
    loaded: Gauge,
    unwind_infos: Gauge,
    pages: Gauge,
    provider_success: Counter,
    provider_errors: Counter,
    extractions: Counter,
    extraction_seconds: Counter<f64, AtomicU64>,
    kernel_seconds: Counter<f64, AtomicU64>,
    deferred: Gauge,
    failed: Gauge,
    unsupported: Gauge,
    processes: Gauge,
    kernel_bytes: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::default();
    registry.register(name, help, g.clone());
    g
}

fn counter<N, A>(registry: &mut Registry, name: &str, help: &str) -> Counter<N, A>
where
    Counter<N, A>: prometheus_client::registry::Metric + Clone + Default,
{
    let c = Counter::<N, A>::default();
    registry.register(name, help, c.clone());
    c
}

/// Sets a counter to a total that only grows (the summary carries totals).
fn advance_u64(c: &Counter, total: u64) {
    let now = c.get();
    if total > now {
        c.inc_by(total - now);
    }
}

fn advance_f64(c: &Counter<f64, AtomicU64>, total: f64) {
    let now = c.get();
    if total > now {
        c.inc_by(total - now);
    }
}

fn set(g: &Gauge, v: u64) {
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("eim");
        Self {
            loaded: gauge(
                &mut r,
                "num_exe_id_loaded_to_ebpf",
                "Files whose stack deltas are in the kernel maps (upstream NumExeIDLoadedToEBPF, 43)",
            ),
            unwind_infos: gauge(
                &mut r,
                "unwind_info_array_size",
                "unwind_info_array slots in use (upstream UnwindInfoArraySize, 133)",
            ),
            pages: gauge(
                &mut r,
                "hashmap_num_stack_delta_pages",
                "stack_delta_page_to_info entries (upstream HashmapNumStackDeltaPages, 134)",
            ),
            provider_success: counter(
                &mut r,
                "stack_delta_provider_success",
                "Successful extractions (upstream StackDeltaProviderSuccess, 271)",
            ),
            provider_errors: counter(
                &mut r,
                "stack_delta_provider_extraction_error",
                "Failed extractions, vanished files excluded (upstream StackDeltaProviderExtractionError, 204)",
            ),
            extractions: counter(
                &mut r,
                "extractions",
                "Extraction calls, successful or not",
            ),
            extraction_seconds: counter(
                &mut r,
                "extraction_seconds",
                "Time spent extracting stack deltas",
            ),
            kernel_seconds: counter(
                &mut r,
                "kernel_seconds",
                "Time spent applying map operations to the backend",
            ),
            deferred: gauge(&mut r, "files_deferred", "Files waiting out their deferral"),
            failed: gauge(&mut r, "files_failed", "Files that could not be loaded"),
            unsupported: gauge(
                &mut r,
                "files_unsupported",
                "Files eim does not extract (not ELF, 32-bit, big-endian, another machine)",
            ),
            processes: gauge(&mut r, "processes_tracked", "Processes holding references"),
            kernel_bytes: gauge(
                &mut r,
                "kernel_bytes",
                "Kernel memory of delta tables, page entries and unwind infos",
            ),
            registry: r,
        }
    }

    /// Takes the values of `s`.
    pub fn update(&self, s: &Summary) {
        let metric = |name: &str| {
            s.metrics
                .iter()
                .find(|m| m.name == name)
                .map_or(0, |m| m.value)
        };
        set(&self.loaded, metric("NumExeIDLoadedToEBPF"));
        set(&self.unwind_infos, metric("UnwindInfoArraySize"));
        set(&self.pages, metric("HashmapNumStackDeltaPages"));
        advance_u64(&self.provider_success, metric("StackDeltaProviderSuccess"));
        advance_u64(
            &self.provider_errors,
            metric("StackDeltaProviderExtractionError"),
        );
        advance_u64(&self.extractions, s.extraction.extractions);
        advance_f64(&self.extraction_seconds, s.seconds.extraction);
        advance_f64(&self.kernel_seconds, s.seconds.kernel);
        set(&self.deferred, s.files.deferred as u64);
        set(&self.failed, s.files.failed as u64);
        set(&self.unsupported, s.files.unsupported as u64);
        set(&self.processes, s.processes.tracked as u64);
        set(&self.kernel_bytes, s.kernel.bytes.total);
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
