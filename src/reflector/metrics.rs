//! The reflector's metric families (a section of [`crate::metrics`]).

use std::sync::OnceLock;

#[cfg(feature = "metrics")]
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
#[cfg(feature = "metrics")]
use std::fmt::Write as _;

use super::ListReason;
use crate::metrics::prom::{exponential_buckets, Counter, Family, Histogram};
use crate::metrics::seconds_histogram;
#[cfg(feature = "metrics")]
use crate::metrics::{add_section, encode_family};

/// Labels: resource.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
pub struct ResourceLabels {
    /// The resource.
    pub resource: String,
}

/// Labels: resource and event type.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
pub struct EventLabels {
    /// The resource.
    pub resource: String,
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`, `SKIPPED`.
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
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
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

#[cfg(feature = "metrics")]
impl EncodeLabelValue for ListReasonLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl From<&ListReason> for ListReasonLabel {
    fn from(r: &ListReason) -> Self {
        match r {
            ListReason::Initial => Self::Initial,
            ListReason::Gone(_) => Self::Gone,
            ListReason::TooLargeRv { .. } => Self::TooLargeRv,
            ListReason::AheadOfServer { .. } => Self::RvRegression,
            ListReason::SkippedEvent(_) => Self::SkippedEvent,
        }
    }
}

/// Labels: resource and relist reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
#[cfg_attr(feature = "metrics", derive(EncodeLabelSet))]
pub struct ReasonLabels {
    /// The resource.
    pub resource: String,
    /// Why the list ran.
    pub reason: ListReasonLabel,
}

/// The reflector's families.
#[derive(Debug)]
pub struct ReflectorMetrics {
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
    /// Store errors met (each retried after the backoff, unless permanent).
    pub store_errors: Family<ResourceLabels, Counter>,
}

fn size_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// The reflectors' metrics, process-wide.
pub fn global() -> &'static ReflectorMetrics {
    static METRICS: OnceLock<ReflectorMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        #[cfg(feature = "metrics")]
        add_section("reflector", encode);
        ReflectorMetrics {
            events: Family::default(),
            commit_latency: Family::new_with_constructor(seconds_histogram as fn() -> Histogram),
            batch_size: Family::new_with_constructor(size_histogram as fn() -> Histogram),
            lists: Family::default(),
            list_requests: Family::default(),
            watch_requests: Family::default(),
            store_errors: Family::default(),
        }
    })
}

#[cfg(feature = "metrics")]
fn encode(e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    let m = global();
    encode_family(
        e,
        "durable_informer_events",
        "Watch events persisted, by type",
        &m.events,
    )?;
    encode_family(
        e,
        "durable_informer_commit_latency_seconds",
        "Batch handed to the writer until durable",
        &m.commit_latency,
    )?;
    encode_family(e, "durable_informer_batch_size", "Deltas per batch", &m.batch_size)?;
    encode_family(e, "durable_informer_lists", "Full lists by reason", &m.lists)?;
    encode_family(
        e,
        "durable_informer_list_requests",
        "LIST requests (pages and probes)",
        &m.list_requests,
    )?;
    encode_family(
        e,
        "durable_informer_watch_requests",
        "WATCH requests",
        &m.watch_requests,
    )?;
    encode_family(
        e,
        "durable_informer_reflector_store_errors",
        "Store errors a reflector met (retried after the backoff unless permanent)",
        &m.store_errors,
    )
}
