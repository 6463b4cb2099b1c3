//! The metrics of a watching host over HTTP, in the Prometheus text
//! exposition format (OpenMetrics text, as `prometheus-client` writes it,
//! which Prometheus scrapes natively).
//!
//! Exposed: upstream's five manager metrics (gauges for what is loaded,
//! counters for the provider), and eim's own: extraction and kernel time,
//! extraction calls, deferred, failed and unsupported files, processes
//! tracked; with host events, events per kind, lost events, resyncs and
//! their corrections, the latency from an event to its tables, and the CPU
//! time per pass. The
//! server ([`MetricsServer`]) is in `server`, what it answers in `routes`,
//! its bound on connections in `slots`.

mod routes;
mod server;
mod slots;

pub use server::{MetricsServer, ServeError};

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::findings::EventStats;
use crate::report::summary::Summary;

/// The label of the events counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

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
    collisions: Counter,
    processes: Gauge,
    kernel_bytes: Gauge,
    events: Family<KindLabel, Counter>,
    events_lost: Counter,
    resyncs: Counter,
    resync_corrections: Counter,
    event_latency: Histogram,
    step_cpu: Histogram,
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
            collisions: counter(
                &mut r,
                "file_id_collisions",
                "Files found presenting another file's id with other bytes (each once per id): not loaded, or, trusted, replacing an untrusted owner",
            ),
            processes: gauge(&mut r, "processes_tracked", "Processes holding references"),
            kernel_bytes: gauge(
                &mut r,
                "kernel_bytes",
                "Kernel memory of delta tables, page entries and unwind infos",
            ),
            events: {
                let f = Family::<KindLabel, Counter>::default();
                r.register(
                    "events",
                    "Host events followed (exec, exit, fork, mmap, mprotect)",
                    f.clone(),
                );
                f
            },
            events_lost: counter(
                &mut r,
                "events_lost",
                "Host events the kernel could not deliver (a full ring); each loss forces a resync",
            ),
            resyncs: counter(&mut r, "resyncs", "Full walks of /proc after the first (periodic, or after a loss)"),
            resync_corrections: counter(
                &mut r,
                "resync_corrections",
                "What resyncs found that events had not reported (should stay 0)",
            ),
            event_latency: {
                let h = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
                r.register(
                    "event_to_load_seconds",
                    "From a host event to the end of the pass that read its process (its tables published)",
                    h.clone(),
                );
                h
            },
            step_cpu: {
                let h = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
                r.register(
                    "step_cpu_seconds",
                    "CPU time eim spent per pass (a step, a followed batch of events, a resync)",
                    h.clone(),
                );
                h
            },
            registry: r,
        }
    }

    /// Takes the event path's totals.
    pub fn update_events(&self, stats: &EventStats) {
        for (kind, n) in &stats.events {
            advance_u64(
                &self.events.get_or_create(&KindLabel {
                    kind: (*kind).to_string(),
                }),
                *n,
            );
        }
        advance_u64(&self.events_lost, stats.lost);
        advance_u64(&self.resyncs, stats.resyncs);
        advance_u64(&self.resync_corrections, stats.corrections);
    }

    pub fn observe_event_latency(&self, d: std::time::Duration) {
        self.event_latency.observe(d.as_secs_f64());
    }

    pub fn observe_step_cpu(&self, d: std::time::Duration) {
        self.step_cpu.observe(d.as_secs_f64());
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
        advance_u64(&self.collisions, s.counters.collisions);
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
