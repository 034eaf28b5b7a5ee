//! Without the `metrics` feature: stand-ins for the prometheus-client types the modules record
//! into, with the methods they call. Nothing is kept, so the recording code stays the same in
//! both builds and costs nothing here.

use std::fmt;
use std::marker::PhantomData;

/// A counter that counts nothing.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counter;

impl Counter {
    pub(crate) fn inc(&self) -> u64 {
        0
    }
}

/// A gauge that holds nothing.
#[derive(Debug, Default, Clone)]
pub(crate) struct Gauge;

impl Gauge {
    pub(crate) fn inc(&self) -> i64 {
        0
    }

    pub(crate) fn dec(&self) -> i64 {
        0
    }

    pub(crate) fn set(&self, _value: i64) -> i64 {
        0
    }
}

/// A histogram that records nothing.
#[derive(Debug, Clone)]
pub(crate) struct Histogram;

impl Histogram {
    pub(crate) fn new(_buckets: impl IntoIterator<Item = f64>) -> Self {
        Self
    }

    pub(crate) fn observe(&self, _value: f64) {}
}

pub(crate) fn exponential_buckets(_start: f64, _factor: f64, _length: u16) -> std::iter::Empty<f64> {
    std::iter::empty()
}

/// A family of one metric shared by every label set.
pub(crate) struct Family<S, M> {
    metric: M,
    _labels: PhantomData<fn(&S)>,
}

impl<S, M: fmt::Debug> fmt::Debug for Family<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Family").field("metric", &self.metric).finish()
    }
}

impl<S, M: Default> Default for Family<S, M> {
    fn default() -> Self {
        Self::new_with_constructor(M::default)
    }
}

impl<S, M> Family<S, M> {
    pub(crate) fn new_with_constructor(make: fn() -> M) -> Self {
        Self {
            metric: make(),
            _labels: PhantomData,
        }
    }

    pub(crate) fn get_or_create(&self, _labels: &S) -> M
    where
        M: Clone,
    {
        self.metric.clone()
    }

    pub(crate) fn remove(&self, _labels: &S) -> bool {
        false
    }
}
