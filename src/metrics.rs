//! Metric families (Prometheus text exposition through `prometheus-client`).
//!
//! Each module owns its families and adds them here as a section when it first uses them;
//! this module imports none of them, so it sits at the bottom of the crate, and a scrape
//! shows what the process has used. The families, process-wide:
//! the reflector's (`durable_informer_*`, labelled by resource and, where it matters, the
//! event type or the relist reason), the informers' handler lag (label `handler`), every named
//! [`WorkQueue`](crate::queue::WorkQueue) under client-go's `workqueue_*` names (labels `name`
//! and `controller`, as controller-runtime's), each
//! [`Controller`](crate::controller::Controller)'s reconciles (`durable_informer_reconcile_*`,
//! label `controller`, as controller-runtime's `controller_runtime_reconcile_*`, with
//! `durable_informer_reconcile_panics_total` and `durable_informer_active_workers`), leader
//! election (`durable_informer_leader_is_leader` and `_transitions_total`, label `lease`) and each
//! database's file size (label `database`, the file's name).
//!
//! [`register`] adds them all to your own registry, next to your metrics; [`encode`] renders
//! them alone, for a process without a registry of its own.
//!
//! This module needs the `metrics` feature (default). Without it the crate does not depend on
//! `prometheus-client` and records nothing: an application that exports metrics its own way
//! turns default features off.
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

#[cfg(feature = "metrics")]
use std::collections::BTreeMap;
#[cfg(feature = "metrics")]
use std::fmt::Write as _;
#[cfg(feature = "metrics")]
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Duration;

#[cfg(feature = "metrics")]
use prometheus_client::collector::Collector;
#[cfg(feature = "metrics")]
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
#[cfg(feature = "metrics")]
use prometheus_client::registry::Registry;

use self::prom::{exponential_buckets, Counter, Family, Gauge, Histogram};
#[cfg(feature = "metrics")]
use crate::util::Locked;

/// The metric types every module records into: prometheus-client's, or (without the `metrics`
/// feature) stand-ins that keep nothing.
#[cfg(feature = "metrics")]
pub(crate) mod prom {
    pub(crate) use prometheus_client::metrics::counter::Counter;
    pub(crate) use prometheus_client::metrics::family::Family;
    pub(crate) use prometheus_client::metrics::gauge::Gauge;
    pub(crate) use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
}
#[cfg(not(feature = "metrics"))]
#[path = "metrics_off.rs"]
pub(crate) mod prom;

/// Encodes one module's families into a scrape.
#[cfg(feature = "metrics")]
pub(crate) type Section = fn(&mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error>;

/// The sections added so far, by name (the module's), in exposition order.
#[cfg(feature = "metrics")]
static SECTIONS: Mutex<BTreeMap<&'static str, Section>> = Mutex::new(BTreeMap::new());

/// Adds a module's families to every registry [`register`] filled, from the next scrape on.
#[cfg(feature = "metrics")]
pub(crate) fn add_section(name: &'static str, section: Section) {
    SECTIONS.locked().insert(name, section);
}

/// Encodes `family` as `name` (the full name, `_total` added to counters by the encoder).
#[cfg(feature = "metrics")]
pub(crate) fn encode_family(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    family: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    family.encode(encoder.encode_descriptor(name, help, None, family.metric_type())?)
}

/// Every section, at each scrape.
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct Sections;

#[cfg(feature = "metrics")]
impl Collector for Sections {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let sections: Vec<Section> = SECTIONS.locked().values().copied().collect();
        for section in sections {
            section(&mut encoder)?;
        }
        Ok(())
    }
}

/// A histogram of seconds, 100 µs to ~13 s.
pub(crate) fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// A histogram of seconds, 1 ms to ~9 min: reconciles that call other APIs can take minutes.
fn long_seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// Labels: controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
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
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
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

#[cfg(feature = "metrics")]
impl EncodeLabelValue for ReconcileResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels: controller and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
pub struct ReconcileLabels {
    /// The controller's name.
    pub controller: String,
    /// How the reconcile ended.
    pub result: ReconcileResult,
}

/// The controllers' reconcile families.
#[derive(Debug)]
pub struct Metrics {
    /// Reconciles, by controller and result.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Reconciles that returned an error or panicked, by controller.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// Time per reconcile, seconds, by controller (1 ms to ~9 min).
    pub reconcile_time: Family<ControllerLabels, Histogram>,
    /// Reconciles and delete hooks that panicked, by controller.
    pub reconcile_panics: Family<ControllerLabels, Counter>,
    /// Reconciles and delete hooks running now, by controller.
    pub active_workers: Family<ControllerLabels, Gauge>,
}

/// One worker of a controller busy, counted in `active_workers` until dropped; see
/// [`Metrics::busy`].
#[derive(Debug)]
pub struct Busy(Gauge);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    fn new() -> Self {
        Self {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(long_seconds_histogram as fn() -> Histogram),
            reconcile_panics: Family::default(),
            active_workers: Family::default(),
        }
    }

    /// Counts one worker of `controller` busy (a reconcile or a delete hook) until the guard
    /// is dropped.
    #[must_use]
    pub fn busy(&self, controller: &str) -> Busy {
        let g = self
            .active_workers
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .clone();
        g.inc();
        Busy(g)
    }

    /// Records a panic of `controller`'s delete hook (a reconcile's panic is recorded by
    /// [`observe_reconcile`](Self::observe_reconcile)).
    pub fn observe_panic(&self, controller: &str) {
        self.reconcile_panics
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .inc();
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
        if result == ReconcileResult::Panic {
            self.reconcile_panics.get_or_create(&labels).inc();
        }
        self.reconcile_time.get_or_create(&labels).observe(took.as_secs_f64());
    }
}

/// The controllers' reconcile metrics, process-wide.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        #[cfg(feature = "metrics")]
        add_section("controller", encode_reconciles);
        Metrics::new()
    })
}

#[cfg(feature = "metrics")]
fn encode_reconciles(encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    let m = global();
    encode_family(
        encoder,
        "durable_informer_reconcile",
        "Reconciles by controller and result",
        &m.reconciles,
    )?;
    encode_family(
        encoder,
        "durable_informer_reconcile_errors",
        "Reconciles that failed or panicked",
        &m.reconcile_errors,
    )?;
    encode_family(
        encoder,
        "durable_informer_reconcile_time_seconds",
        "Time per reconcile",
        &m.reconcile_time,
    )?;
    encode_family(
        encoder,
        "durable_informer_reconcile_panics",
        "Reconciles and delete hooks that panicked",
        &m.reconcile_panics,
    )?;
    encode_family(
        encoder,
        "durable_informer_active_workers",
        "Reconciles and delete hooks running now",
        &m.active_workers,
    )
}

/// Adds every metric of the crate to `registry`: the informers' under `durable_informer_`,
/// the named workqueues' under client-go's `workqueue_` names. Call it once per registry; a
/// family appears once its module first ran (an informer, a named queue, a controller).
#[cfg(feature = "metrics")]
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(Sections));
}

/// The Prometheus text exposition of every metric, from a registry of the crate's own.
///
/// ```
/// use durable_informer::metrics::{global, ReconcileResult};
/// global().observe_reconcile("encoded", ReconcileResult::Error, std::time::Duration::from_millis(1));
/// let text = durable_informer::metrics::encode();
/// assert!(text.contains(r#"durable_informer_reconcile_errors_total{controller="encoded"} 1"#));
/// ```
#[cfg(feature = "metrics")]
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
