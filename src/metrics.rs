//! Metric families (Prometheus text exposition through `prometheus-client`).
//!
//! One process-wide registry, filled by the reflector and the dispatcher; [`encode`] renders
//! it for a `/metrics` endpoint. Labels are the resource (`pods`, `deployments.apps`) and,
//! where it matters, the event type, the relist reason or the handler.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels: resource.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The resource.
    pub resource: String,
}

/// Labels: resource and event type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The resource.
    pub resource: String,
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`.
    pub kind: String,
}

/// Labels: resource and relist reason class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The resource.
    pub resource: String,
    /// `initial`, `gone`, `too_large_rv`, `rv_regression`, `other`.
    pub reason: String,
}

/// Labels: resource and handler.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerLabels {
    /// The resource.
    pub resource: String,
    /// The handler's name (`volatile` for unnamed ones).
    pub handler: String,
}

/// Every metric family of the crate.
pub struct Metrics {
    /// Watch events persisted, by type.
    pub events: Family<EventLabels, Counter>,
    /// Time from handing a batch to the writer to its durable acknowledgement, seconds.
    pub commit_latency: Family<ResourceLabels, Histogram>,
    /// Deltas per batch handed to the writer.
    pub batch_size: Family<ResourceLabels, Histogram>,
    /// Full lists, by reason.
    pub lists: Family<ReasonLabels, Counter>,
    /// LIST requests (pages and probes).
    pub list_requests: Family<ResourceLabels, Counter>,
    /// WATCH requests.
    pub watch_requests: Family<ResourceLabels, Counter>,
    /// Log entries a handler still has to read: the last committed seq minus its cursor,
    /// updated as either moves (also while the handler is stuck in a callback).
    pub handler_lag: Family<HandlerLabels, Gauge>,
    /// Database file size in bytes: the store's writer updates it after commits (at most once
    /// a second while busy, and when it goes idle). With several databases in one process it
    /// shows the last one written.
    pub db_size: Gauge,
    registry: Registry,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

fn size_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("durable_informer");
        let events = Family::<EventLabels, Counter>::default();
        let commit_latency =
            Family::<ResourceLabels, Histogram>::new_with_constructor(seconds_histogram as fn() -> Histogram);
        let batch_size = Family::<ResourceLabels, Histogram>::new_with_constructor(size_histogram as fn() -> Histogram);
        let lists = Family::<ReasonLabels, Counter>::default();
        let list_requests = Family::<ResourceLabels, Counter>::default();
        let watch_requests = Family::<ResourceLabels, Counter>::default();
        let handler_lag = Family::<HandlerLabels, Gauge>::default();
        let db_size = Gauge::default();
        registry.register("events", "Watch events persisted, by type", events.clone());
        registry.register(
            "commit_latency_seconds",
            "Batch handed to the writer until durable",
            commit_latency.clone(),
        );
        registry.register("batch_size", "Deltas per batch", batch_size.clone());
        registry.register("lists", "Full lists by reason", lists.clone());
        registry.register(
            "list_requests",
            "LIST requests (pages and probes)",
            list_requests.clone(),
        );
        registry.register("watch_requests", "WATCH requests", watch_requests.clone());
        registry.register(
            "handler_lag_entries",
            "Log entries a handler has not read yet",
            handler_lag.clone(),
        );
        registry.register("database_bytes", "Database file size", db_size.clone());
        Self {
            events,
            commit_latency,
            batch_size,
            lists,
            list_requests,
            watch_requests,
            handler_lag,
            db_size,
            registry,
        }
    }

    /// Records the size of the database file.
    pub fn observe_db_size(&self, path: &std::path::Path) {
        if let Ok(m) = std::fs::metadata(path) {
            self.db_size.set(i64::try_from(m.len()).unwrap_or(i64::MAX));
        }
    }
}

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// The Prometheus text exposition of every metric.
///
/// ```
/// let text = durable_informer::metrics::encode();
/// assert!(text.contains("durable_informer_database_bytes"));
/// ```
#[must_use]
pub fn encode() -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &global().registry);
    out
}
