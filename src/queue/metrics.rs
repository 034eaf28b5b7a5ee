//! Plain counters and histograms describing a queue; exporting them is someone else's job.

use std::time::Duration;

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
