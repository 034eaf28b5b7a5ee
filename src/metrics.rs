//! Metric families (Prometheus text exposition through `prometheus-client`).
//!
//! The crate fills one set of families, process-wide: the reflector and the dispatcher
//! (`durable_informer_*`, labelled by resource and, where it matters, the event type, the
//! relist reason or the handler), every named [`WorkQueue`](crate::queue::WorkQueue) under
//! client-go's `workqueue_*` names (label `name`), each [`Controller`](crate::controller::Controller)'s
//! reconciles (`durable_informer_reconcile_*`, label `controller`, as controller-runtime's
//! `controller_runtime_reconcile_*`) and each database's file size (label `database`).
//!
//! [`register`] adds them all to your own registry, next to your metrics; [`encode`] renders
//! them alone, for a process without a registry of its own.
//!
//! ```
//! use prometheus_client::registry::Registry;
//!
//! let mut registry = Registry::default();
//! durable_informer::metrics::register(&mut registry);
//! // (what a controller's worker records after each reconcile)
//! durable_informer::metrics::global().observe_reconcile(
//!     "docs",
//!     durable_informer::metrics::ReconcileResult::Success,
//!     std::time::Duration::from_millis(3),
//! );
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry)?;
//! assert!(text.contains(r#"durable_informer_reconcile_total{controller="docs",result="success"} 1"#));
//! # Ok::<(), std::fmt::Error>(())
//! ```

use crate::util::Locked;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use std::fmt::Write as _;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::queue::QueueMetrics;

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

/// Why a full list ran: the `reason` label of `durable_informer_lists`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ListReasonLabel {
    /// `initial`: the scope held no synced state.
    Initial,
    /// `gone`: the watch expired (410 Gone).
    Gone,
    /// `too_large_rv`: the server refused the persisted RV as too large (a cluster rebuilt or
    /// restored).
    TooLargeRv,
    /// `rv_regression`: the server's RV went backwards.
    RvRegression,
    /// `skipped_event`: a watch line that may have carried a change could not be read.
    SkippedEvent,
}

impl ListReasonLabel {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "initial",
            Self::Gone => "gone",
            Self::TooLargeRv => "too_large_rv",
            Self::RvRegression => "rv_regression",
            Self::SkippedEvent => "skipped_event",
        }
    }
}

impl EncodeLabelValue for ListReasonLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl From<&crate::reflector::ListReason> for ListReasonLabel {
    fn from(r: &crate::reflector::ListReason) -> Self {
        use crate::reflector::ListReason as R;
        match r {
            R::Initial => Self::Initial,
            R::Gone(_) => Self::Gone,
            R::TooLargeRv { .. } => Self::TooLargeRv,
            R::AheadOfServer { .. } => Self::RvRegression,
            R::SkippedEvent(_) => Self::SkippedEvent,
        }
    }
}

/// Labels: resource and relist reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The resource.
    pub resource: String,
    /// Why the list ran.
    pub reason: ListReasonLabel,
}

/// Labels: resource and handler.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerLabels {
    /// The resource.
    pub resource: String,
    /// The handler's name (`volatile` for unnamed ones).
    pub handler: String,
}

/// Labels: database file.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseLabels {
    /// The database file's path.
    pub database: String,
}

/// Labels: controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The controller's name ([`Controller::name`](crate::controller::Controller::name)).
    pub controller: String,
}

/// How a reconcile ended: the `result` label (controller-runtime's values, plus `panic`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReconcileResult {
    /// `success`: `Ok(Action::await_change())`.
    Success,
    /// `requeue`: `Ok(Action::requeue_rate_limited())`.
    Requeue,
    /// `requeue_after`: `Ok(Action::requeue(delay))`.
    RequeueAfter,
    /// `error`: `Err(..)`.
    Error,
    /// `panic`: the reconcile panicked.
    Panic,
}

impl ReconcileResult {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Requeue => "requeue",
            Self::RequeueAfter => "requeue_after",
            Self::Error => "error",
            Self::Panic => "panic",
        }
    }
}

impl EncodeLabelValue for ReconcileResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels: controller and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// The controller's name.
    pub controller: String,
    /// How the reconcile ended.
    pub result: ReconcileResult,
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
    /// Database file size in bytes, per file: the store's writer updates it after commits (at
    /// most once a second while busy, and when it goes idle).
    pub db_size: Family<DatabaseLabels, Gauge>,
    /// Reconciles, by controller and result.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Reconciles that returned an error or panicked, by controller.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// Time per reconcile, seconds, by controller.
    pub reconcile_time: Family<ControllerLabels, Histogram>,
    /// The named workqueues, read at each scrape.
    queues: Mutex<Vec<QueueProbe>>,
}

/// Reads one queue's metrics; `None` once the queue is gone.
type QueueProbe = Box<dyn Fn() -> Option<QueueMetrics> + Send + Sync>;

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

fn size_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

impl Metrics {
    fn new() -> Self {
        Self {
            events: Family::default(),
            commit_latency: Family::new_with_constructor(seconds_histogram as fn() -> Histogram),
            batch_size: Family::new_with_constructor(size_histogram as fn() -> Histogram),
            lists: Family::default(),
            list_requests: Family::default(),
            watch_requests: Family::default(),
            handler_lag: Family::default(),
            db_size: Family::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(seconds_histogram as fn() -> Histogram),
            queues: Mutex::new(Vec::new()),
        }
    }

    /// Adds every family to `registry` (the families are shared, not copied).
    fn register_into(&'static self, registry: &mut Registry) {
        let ours = registry.sub_registry_with_prefix("durable_informer");
        ours.register("events", "Watch events persisted, by type", self.events.clone());
        ours.register(
            "commit_latency_seconds",
            "Batch handed to the writer until durable",
            self.commit_latency.clone(),
        );
        ours.register("batch_size", "Deltas per batch", self.batch_size.clone());
        ours.register("lists", "Full lists by reason", self.lists.clone());
        ours.register(
            "list_requests",
            "LIST requests (pages and probes)",
            self.list_requests.clone(),
        );
        ours.register("watch_requests", "WATCH requests", self.watch_requests.clone());
        ours.register(
            "handler_lag_entries",
            "Log entries a handler has not read yet",
            self.handler_lag.clone(),
        );
        ours.register("database_bytes", "Database file size", self.db_size.clone());
        ours.register(
            "reconcile",
            "Reconciles by controller and result",
            self.reconciles.clone(),
        );
        ours.register(
            "reconcile_errors",
            "Reconciles that failed or panicked",
            self.reconcile_errors.clone(),
        );
        ours.register(
            "reconcile_time_seconds",
            "Time per reconcile",
            self.reconcile_time.clone(),
        );
        registry.register_collector(Box::new(QueueCollector(self)));
    }

    /// Records the size of the database file at `path`.
    pub fn observe_db_size(&self, path: &std::path::Path) {
        if let Ok(m) = std::fs::metadata(path) {
            self.db_size
                .get_or_create(&DatabaseLabels {
                    database: path.display().to_string(),
                })
                .set(i64::try_from(m.len()).unwrap_or(i64::MAX));
        }
    }

    /// Records one reconcile of `controller`.
    pub fn observe_reconcile(&self, controller: &str, result: ReconcileResult, took: Duration) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_owned(),
                result,
            })
            .inc();
        if matches!(result, ReconcileResult::Error | ReconcileResult::Panic) {
            self.reconcile_errors.get_or_create(&labels).inc();
        }
        self.reconcile_time.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// Reports a named queue's metrics at each scrape, while `probe` finds it.
    pub(crate) fn add_queue(&self, probe: QueueProbe) {
        let mut queues = self.queues.locked();
        queues.retain(|p| p().is_some());
        queues.push(probe);
    }
}

/// client-go's workqueue metrics, read from the live queues at each scrape.
struct QueueCollector(&'static Metrics);

impl std::fmt::Debug for QueueCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueueCollector")
    }
}

impl Collector for QueueCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshots: Vec<QueueMetrics> = {
            let queues = self.0.queues.locked();
            queues.iter().filter_map(|p| p()).collect()
        };
        let named: Vec<(Vec<(String, String)>, &QueueMetrics)> = snapshots
            .iter()
            .filter_map(|m| m.name.clone().map(|n| (vec![("name".to_owned(), n)], m)))
            .collect();
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: &dyn Fn(&QueueMetrics) -> f64| {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, q) in &named {
                m.encode_family(labels)?.encode_gauge(&value(q))?;
            }
            Ok::<(), std::fmt::Error>(())
        };
        let counter =
            |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: &dyn Fn(&QueueMetrics) -> u64| {
                let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                for (labels, q) in &named {
                    m.encode_family(labels)?
                        .encode_counter::<Vec<(String, String)>, u64, f64>(&value(q), None)?;
                }
                Ok::<(), std::fmt::Error>(())
            };
        let histogram = |encoder: &mut DescriptorEncoder,
                         name: &str,
                         help: &str,
                         value: &dyn Fn(&QueueMetrics) -> &crate::queue::DurationHistogram| {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (labels, q) in &named {
                let h = value(q);
                let buckets: Vec<(f64, u64)> = h.buckets().map(|(b, c)| (b.as_secs_f64(), c)).collect();
                m.encode_family(labels)?.encode_histogram::<Vec<(String, String)>>(
                    h.sum().as_secs_f64(),
                    h.count(),
                    &buckets,
                    None,
                )?;
            }
            Ok::<(), std::fmt::Error>(())
        };
        #[allow(clippy::cast_precision_loss)] // queue depths are far below 2^52
        gauge(&mut encoder, "workqueue_depth", "Current depth of workqueue", &|q| {
            q.depth as f64
        })?;
        counter(
            &mut encoder,
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            &|q| q.adds,
        )?;
        counter(
            &mut encoder,
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            &|q| q.retries,
        )?;
        histogram(
            &mut encoder,
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            &|q| &q.queue_latency,
        )?;
        histogram(
            &mut encoder,
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            &|q| &q.work_duration,
        )?;
        gauge(
            &mut encoder,
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            &|q| q.unfinished_work.as_secs_f64(),
        )?;
        gauge(
            &mut encoder,
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            &|q| q.longest_running_processor.as_secs_f64(),
        )?;
        Ok(())
    }
}

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Adds every metric of the crate to `registry`: the informers' under `durable_informer_`,
/// the named workqueues' under client-go's `workqueue_` names. Call it once per registry.
pub fn register(registry: &mut Registry) {
    global().register_into(registry);
}

/// The Prometheus text exposition of every metric, from a registry of the crate's own.
///
/// ```
/// use durable_informer::metrics::{global, ReconcileResult};
/// global().observe_reconcile("encoded", ReconcileResult::Error, std::time::Duration::from_millis(1));
/// let text = durable_informer::metrics::encode();
/// assert!(text.contains(r#"durable_informer_reconcile_errors_total{controller="encoded"} 1"#));
/// ```
#[must_use]
pub fn encode() -> String {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let registry = REGISTRY.get_or_init(|| {
        let mut r = Registry::default();
        register(&mut r);
        r
    });
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}
