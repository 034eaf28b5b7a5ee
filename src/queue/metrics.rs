//! Plain counters and histograms describing a queue, and their export under client-go's
//! `workqueue_*` names (a section of [`crate::metrics`]).

#[cfg(feature = "metrics")]
use std::collections::BTreeMap;
#[cfg(feature = "metrics")]
use std::sync::Mutex;
use std::time::Duration;

#[cfg(feature = "metrics")]
use prometheus_client::encoding::DescriptorEncoder;
#[cfg(feature = "metrics")]
use prometheus_client::metrics::MetricType;

#[cfg(feature = "metrics")]
use crate::metrics::add_section;
#[cfg(feature = "metrics")]
use crate::util::Locked;

/// Upper bounds of [`DurationHistogram`] buckets: 10 ns to 10 s, factor 10, as client-go's
/// workqueue metrics.
const BUCKET_BOUNDS: [Duration; 10] = [
    Duration::from_nanos(10),
    Duration::from_nanos(100),
    Duration::from_micros(1),
    Duration::from_micros(10),
    Duration::from_micros(100),
    Duration::from_millis(1),
    Duration::from_millis(10),
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(10),
];

/// A histogram of durations with fixed exponential buckets (10 ns … 10 s, factor 10).
///
/// Shaped for a Prometheus histogram: cumulative bucket counts, a total count and a sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurationHistogram {
    /// Observations per bucket, not cumulative; index `BUCKET_BOUNDS.len()` is `+Inf`.
    counts: [u64; BUCKET_BOUNDS.len() + 1],
    count: u64,
    sum: Duration,
}

impl DurationHistogram {
    /// Records one observation.
    pub(crate) fn observe(&mut self, value: Duration) {
        let bucket = BUCKET_BOUNDS.partition_point(|bound| *bound < value);
        self.counts[bucket] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
    }

    /// Number of observations.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of all observations (saturating).
    #[must_use]
    pub fn sum(&self) -> Duration {
        self.sum
    }

    /// `(upper bound, cumulative count)` per finite bucket, ascending; observations above the last
    /// bound are only in [`count`](Self::count) (the `+Inf` bucket).
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, u64)> + '_ {
        BUCKET_BOUNDS
            .iter()
            .zip(self.counts.iter())
            .scan(0_u64, |cumulative, (bound, count)| {
                *cumulative += count;
                Some((*bound, *cumulative))
            })
    }
}

/// A snapshot of a queue's metrics, taken by [`WorkQueue::metrics`](super::WorkQueue::metrics).
///
/// Counters count from the queue's creation; gauges describe the moment of the snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueMetrics {
    /// The queue's name, if it was given one.
    pub name: Option<String>,
    /// Gauge: items queued and ready to be handed out (as [`len`](super::WorkQueue::len)).
    pub depth: usize,
    /// Gauge: items handed out and not yet done.
    pub processing: usize,
    /// Gauge: items waiting for a delayed add.
    pub waiting: usize,
    /// Counter: adds that were not absorbed by deduplication (including re-adds of processing
    /// items and delayed items becoming ready).
    pub adds: u64,
    /// Counter: calls to [`add_rate_limited`](super::WorkQueue::add_rate_limited) before shutdown.
    pub retries: u64,
    /// Time from an item's add to the `get` that handed it out.
    pub queue_latency: DurationHistogram,
    /// Time from `get` to `done`.
    pub work_duration: DurationHistogram,
    /// Gauge: sum over processing items of the time since they were handed out; a value growing
    /// faster than wall time suggests stuck workers.
    pub unfinished_work: Duration,
    /// Gauge: time since the longest-processing item was handed out, zero when idle.
    pub longest_running_processor: Duration,
}

/// Reads one queue's metrics; `None` once the queue is gone.
pub(crate) type QueueProbe = Box<dyn Fn() -> Option<QueueMetrics> + Send + Sync>;

/// The named queues, read at each scrape.
#[cfg(feature = "metrics")]
static QUEUES: Mutex<Vec<QueueProbe>> = Mutex::new(Vec::new());

/// Reports a named queue's metrics at each scrape, while `probe` finds it.
#[cfg(feature = "metrics")]
pub(crate) fn add_queue(probe: QueueProbe) {
    let mut queues = QUEUES.locked();
    queues.retain(|p| p().is_some());
    queues.push(probe);
    add_section("queue", encode);
}

/// Without the `metrics` feature nothing is scraped.
#[cfg(not(feature = "metrics"))]
pub(crate) fn add_queue(_probe: QueueProbe) {}

#[cfg(feature = "metrics")]
impl DurationHistogram {
    fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.sum = self.sum.saturating_add(other.sum);
    }
}

#[cfg(feature = "metrics")]
impl QueueMetrics {
    /// Adds `other` (a queue of the same name) into `self`: one series per name, as two
    /// series with equal labels would make the exposition invalid.
    fn merge(&mut self, other: &Self) {
        self.depth += other.depth;
        self.processing += other.processing;
        self.waiting += other.waiting;
        self.adds += other.adds;
        self.retries += other.retries;
        self.queue_latency.merge(&other.queue_latency);
        self.work_duration.merge(&other.work_duration);
        self.unfinished_work += other.unfinished_work;
        self.longest_running_processor = self.longest_running_processor.max(other.longest_running_processor);
    }
}

#[cfg(feature = "metrics")]
type Labels = [(&'static str, String); 2];

/// client-go's workqueue metrics, read from the live named queues at each scrape, labelled
/// `name` and `controller` (both the queue's name, as controller-runtime does).
#[cfg(feature = "metrics")]
fn encode(encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    {
        let mut by_name: BTreeMap<String, QueueMetrics> = BTreeMap::new();
        for m in QUEUES.locked().iter().filter_map(|p| p()) {
            let Some(name) = m.name.clone() else { continue };
            by_name.entry(name).and_modify(|q| q.merge(&m)).or_insert(m);
        }
        let named: Vec<(Labels, &QueueMetrics)> = by_name
            .iter()
            .map(|(n, m)| ([("name", n.clone()), ("controller", n.clone())], m))
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
                         value: &dyn Fn(&QueueMetrics) -> &DurationHistogram| {
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
        gauge(encoder, "workqueue_depth", "Current depth of workqueue", &|q| {
            q.depth as f64
        })?;
        counter(
            encoder,
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            &|q| q.adds,
        )?;
        counter(
            encoder,
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            &|q| q.retries,
        )?;
        histogram(
            encoder,
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            &|q| &q.queue_latency,
        )?;
        histogram(
            encoder,
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            &|q| &q.work_duration,
        )?;
        gauge(
            encoder,
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            &|q| q.unfinished_work.as_secs_f64(),
        )?;
        gauge(
            encoder,
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            &|q| q.longest_running_processor.as_secs_f64(),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_counts_into_cumulative_buckets() {
        let mut histogram = DurationHistogram::default();
        for millis in [0, 1, 5, 50, 20_000] {
            histogram.observe(Duration::from_millis(millis));
        }
        assert_eq!(histogram.count(), 5);
        assert_eq!(histogram.sum(), Duration::from_millis(20_056));
        let buckets: Vec<_> = histogram.buckets().collect();
        assert_eq!(buckets.len(), 10);
        assert_eq!(buckets[0], (Duration::from_nanos(10), 1)); // the zero
        assert_eq!(buckets[5], (Duration::from_millis(1), 2)); // bounds are inclusive
        assert_eq!(buckets[6], (Duration::from_millis(10), 3));
        assert_eq!(buckets[7], (Duration::from_millis(100), 4));
        assert_eq!(buckets[9], (Duration::from_secs(10), 4)); // 20 s is only in +Inf
    }
}
