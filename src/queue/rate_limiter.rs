//! Rate limiters: how long an item should wait before it is retried.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::lock;

/// Decides how long an item waits before it is requeued by
/// [`WorkQueue::add_rate_limited`](super::WorkQueue::add_rate_limited).
///
/// Implementations are shared between threads and keep their history behind interior
/// mutability. Calling [`when`](Self::when) counts as one retry of `item`.
pub trait RateLimiter<T>: Send + Sync {
    /// Records a retry of `item` and returns how long it should wait before being queued.
    fn when(&self, item: &T) -> Duration;
    /// Clears `item`'s history: the next [`when`](Self::when) treats it as a first failure.
    fn forget(&self, item: &T);
    /// How many times `item` has been retried since it was last forgotten.
    fn num_requeues(&self, item: &T) -> u32;
}

/// A boxed or shared limiter is a limiter.
macro_rules! forward_rate_limiter {
    ($($ptr:ident),*) => {$(
        impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for $ptr<R> {
            fn when(&self, item: &T) -> Duration {
                (**self).when(item)
            }
            fn forget(&self, item: &T) {
                (**self).forget(item);
            }
            fn num_requeues(&self, item: &T) -> u32 {
                (**self).num_requeues(item)
            }
        }
    )*};
}

forward_rate_limiter!(Box, Arc);

/// Per-item exponential backoff: `base * 2^failures`, capped at `max`.
///
/// The first [`when`](RateLimiter::when) of an item returns `base`, then `2 * base`, `4 * base`, …
/// The arithmetic saturates at `max`; it never overflows however many failures accumulate.
///
/// ```
/// use std::time::Duration;
/// use durable_informer::queue::{ItemExponentialFailureRateLimiter, RateLimiter};
///
/// let limiter = ItemExponentialFailureRateLimiter::new(Duration::from_millis(5), Duration::from_secs(1000));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(10));
/// limiter.forget(&"a");
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
/// ```
pub struct ItemExponentialFailureRateLimiter<T> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<T, u32>>,
}

impl<T> ItemExponentialFailureRateLimiter<T> {
    /// A limiter starting at `base` and never exceeding `max`.
    #[must_use]
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Default for ItemExponentialFailureRateLimiter<T> {
    /// client-go's defaults: 5 ms base, 1000 s cap.
    fn default() -> Self {
        Self::new(Duration::from_millis(5), Duration::from_secs(1000))
    }
}

impl<T> fmt::Debug for ItemExponentialFailureRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemExponentialFailureRateLimiter")
            .field("base", &self.base)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

/// `base * 2^exponent`, or `max` if that is larger or not representable.
fn exponential_backoff(base: Duration, max: Duration, exponent: u32) -> Duration {
    2_u32
        .checked_pow(exponent)
        .and_then(|factor| base.checked_mul(factor))
        .map_or(max, |backoff| backoff.min(max))
}

impl<T: Eq + Hash + Clone + Send + Sync> RateLimiter<T> for ItemExponentialFailureRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        let mut failures = lock(&self.failures);
        let exponent = if let Some(count) = failures.get_mut(item) {
            let exponent = *count;
            *count = count.saturating_add(1);
            exponent
        } else {
            failures.insert(item.clone(), 1);
            0
        };
        exponential_backoff(self.base, self.max, exponent)
    }

    fn forget(&self, item: &T) {
        lock(&self.failures).remove(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        lock(&self.failures).get(item).copied().unwrap_or(0)
    }
}

/// Per-item two-speed limiter: `fast` for the first `max_fast_attempts` retries, `slow` after.
///
/// ```
/// use std::time::Duration;
/// use durable_informer::queue::{ItemFastSlowRateLimiter, RateLimiter};
///
/// let limiter = ItemFastSlowRateLimiter::new(Duration::from_millis(5), Duration::from_secs(10), 2);
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"a"), Duration::from_secs(10));
/// ```
pub struct ItemFastSlowRateLimiter<T> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
    attempts: Mutex<HashMap<T, u32>>,
}

impl<T> ItemFastSlowRateLimiter<T> {
    /// A limiter answering `fast` for an item's first `max_fast_attempts` retries, then `slow`.
    #[must_use]
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        Self {
            fast,
            slow,
            max_fast_attempts,
            attempts: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> fmt::Debug for ItemFastSlowRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemFastSlowRateLimiter")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .finish_non_exhaustive()
    }
}

impl<T: Eq + Hash + Clone + Send + Sync> RateLimiter<T> for ItemFastSlowRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        let mut attempts = lock(&self.attempts);
        let count = if let Some(count) = attempts.get_mut(item) {
            *count = count.saturating_add(1);
            *count
        } else {
            attempts.insert(item.clone(), 1);
            1
        };
        if count <= self.max_fast_attempts {
            self.fast
        } else {
            self.slow
        }
    }

    fn forget(&self, item: &T) {
        lock(&self.attempts).remove(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        lock(&self.attempts).get(item).copied().unwrap_or(0)
    }
}

/// A token bucket shared by all items: `burst` retries pass at once, then one per `1 / qps`.
///
/// Each [`when`](RateLimiter::when) reserves a token, even one that is only available in the
/// future, and returns the wait until that token (as golang.org/x/time/rate's `Reserve`). It
/// keeps no per-item history: [`forget`](RateLimiter::forget) does nothing and
/// [`num_requeues`](RateLimiter::num_requeues) is always 0. Because the bucket is shared, one item
/// failing in a loop delays every other item's retries too; that is its purpose, an overall cap
/// on retry traffic.
///
/// ```
/// use std::time::Duration;
/// use durable_informer::queue::{BucketRateLimiter, RateLimiter};
///
/// let limiter = BucketRateLimiter::new(10.0, 2);
/// assert_eq!(RateLimiter::<&str>::when(&limiter, &"a"), Duration::ZERO);
/// assert_eq!(RateLimiter::<&str>::when(&limiter, &"b"), Duration::ZERO);
/// // The third reservation waits for one token, 100 ms at 10 qps (give or take elapsed time).
/// assert!(RateLimiter::<&str>::when(&limiter, &"c") > Duration::from_millis(90));
/// ```
#[derive(Debug)]
pub struct BucketRateLimiter {
    /// Time to earn one token.
    interval: Duration,
    /// Time to earn a full bucket: `interval * burst`.
    capacity: Duration,
    state: Mutex<Bucket>,
}

/// Generic cell rate algorithm state: `earliest_full` is when the bucket would be full again if
/// nothing else were reserved; a reservation moves it forward by one interval.
#[derive(Debug)]
struct Bucket {
    origin: Instant,
    /// Offset from `origin`.
    earliest_full: Duration,
}

/// Refill interval standing for "never": about a century, small enough to add up without
/// saturating so that reservations still queue up behind each other.
const NEVER: Duration = Duration::from_secs(100 * 365 * 86_400);

impl BucketRateLimiter {
    /// A bucket of `burst` tokens refilled at `qps` tokens per second, initially full.
    ///
    /// An infinite `qps` never limits; a `qps` that is zero, negative or NaN never refills, so
    /// after the burst every retry waits (practically) forever.
    #[must_use]
    pub fn new(qps: f64, burst: u32) -> Self {
        let interval = if qps.is_infinite() && qps > 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(1.0 / qps).map_or(NEVER, |interval| interval.min(NEVER))
        };
        Self {
            interval,
            capacity: interval.saturating_mul(burst),
            state: Mutex::new(Bucket {
                origin: Instant::now(),
                earliest_full: Duration::ZERO,
            }),
        }
    }
}

impl Default for BucketRateLimiter {
    /// client-go's defaults: 10 qps, burst 100.
    fn default() -> Self {
        Self::new(10.0, 100)
    }
}

impl<T> RateLimiter<T> for BucketRateLimiter {
    fn when(&self, _item: &T) -> Duration {
        let mut bucket = lock(&self.state);
        let now = Instant::now().saturating_duration_since(bucket.origin);
        let earliest_full = bucket.earliest_full.max(now).saturating_add(self.interval);
        bucket.earliest_full = earliest_full;
        earliest_full.saturating_sub(now).saturating_sub(self.capacity)
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> u32 {
        0
    }
}

/// Combines limiters: waits for the longest of their answers.
///
/// Every limiter records each retry; [`forget`](RateLimiter::forget) forgets in all of them and
/// [`num_requeues`](RateLimiter::num_requeues) is the largest count.
pub struct MaxOfRateLimiter<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T> MaxOfRateLimiter<T> {
    /// Combines `limiters`; with none, every answer is zero.
    #[must_use]
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        Self { limiters }
    }
}

impl<T> fmt::Debug for MaxOfRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOfRateLimiter")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

impl<T> RateLimiter<T> for MaxOfRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        self.limiters
            .iter()
            .map(|limiter| limiter.when(item))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, item: &T) {
        for limiter in &self.limiters {
            limiter.forget(item);
        }
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

/// client-go's `DefaultControllerRateLimiter`: the larger of per-item exponential backoff
/// (5 ms doubling up to 1000 s) and an overall token bucket (10 qps, burst 100).
#[must_use]
pub fn default_controller_rate_limiter<T>() -> MaxOfRateLimiter<T>
where
    T: Eq + Hash + Clone + Send + Sync + 'static,
{
    MaxOfRateLimiter::new(vec![
        Box::new(ItemExponentialFailureRateLimiter::<T>::default()),
        Box::new(BucketRateLimiter::default()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn exponential_doubles_per_item_and_forget_resets() {
        let limiter = ItemExponentialFailureRateLimiter::new(MS, Duration::from_secs(1));
        // (item, expected delay, expected requeues afterwards)
        let table = [
            ("a", 1, 1),
            ("a", 2, 2),
            ("a", 4, 3),
            ("b", 1, 1),
            ("a", 8, 4),
            ("a", 16, 5),
        ];
        for (step, (item, delay_ms, requeues)) in table.into_iter().enumerate() {
            assert_eq!(limiter.when(&item), MS * delay_ms, "step {step}");
            assert_eq!(limiter.num_requeues(&item), requeues, "step {step}");
        }
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), MS);
        assert_eq!(limiter.num_requeues(&"b"), 1, "forget is per item");
        assert_eq!(limiter.when(&"b"), MS * 2);
    }

    #[test]
    fn exponential_defaults_are_client_gos() {
        let limiter = ItemExponentialFailureRateLimiter::default();
        let delays: Vec<_> = (0..5).map(|_| limiter.when(&1)).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80].map(|ms| MS * ms));
    }

    #[test]
    fn exponential_reaches_the_cap_and_never_overflows() {
        let limiter = ItemExponentialFailureRateLimiter::new(MS * 5, Duration::from_secs(1000));
        let delays: Vec<_> = (0..200).map(|_| limiter.when(&"x")).collect();
        // 5 ms * 2^17 = 655.36 s, 2^18 would be 1310.72 s.
        assert_eq!(delays[17], Duration::from_millis(655_360));
        assert!(delays[18..].iter().all(|delay| *delay == Duration::from_secs(1000)));
        assert_eq!(limiter.num_requeues(&"x"), 200);

        let huge = ItemExponentialFailureRateLimiter::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.when(&"y"), Duration::MAX);
        assert_eq!(huge.when(&"y"), Duration::MAX);
        assert_eq!(exponential_backoff(MS, Duration::MAX, u32::MAX), Duration::MAX);
    }

    #[test]
    fn fast_slow_switches_after_max_fast_attempts() {
        let limiter = ItemFastSlowRateLimiter::new(MS * 5, Duration::from_secs(3), 3);
        let delays: Vec<_> = (0..5).map(|_| limiter.when(&"a")).collect();
        let slow = Duration::from_secs(3);
        assert_eq!(delays, [MS * 5, MS * 5, MS * 5, slow, slow]);
        assert_eq!(limiter.num_requeues(&"a"), 5);
        assert_eq!(limiter.when(&"b"), MS * 5, "attempts are per item");
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), MS * 5);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_a_burst_then_spaces_by_the_rate() {
        let limiter = BucketRateLimiter::new(10.0, 100);
        for i in 0..100 {
            assert_eq!(RateLimiter::<u32>::when(&limiter, &i), Duration::ZERO, "{i}");
        }
        for n in 1..=5 {
            assert_eq!(RateLimiter::<u32>::when(&limiter, &0), MS * 100 * n);
        }
        // Reservations are not forgotten: forget is a no-op for a shared bucket.
        RateLimiter::<u32>::forget(&limiter, &0);
        assert_eq!(RateLimiter::<u32>::num_requeues(&limiter, &0), 0);
        assert_eq!(RateLimiter::<u32>::when(&limiter, &0), MS * 600);

        // After the backlog (600 ms) plus one second, ten tokens have been earned.
        tokio::time::advance(MS * 1600).await;
        for i in 0..10 {
            assert_eq!(RateLimiter::<u32>::when(&limiter, &i), Duration::ZERO, "{i}");
        }
        assert_eq!(RateLimiter::<u32>::when(&limiter, &0), MS * 100);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_refills_no_more_than_the_burst() {
        let limiter = BucketRateLimiter::new(10.0, 3);
        tokio::time::advance(Duration::from_secs(3600)).await;
        let delays: Vec<_> = (0..5).map(|i| RateLimiter::<u32>::when(&limiter, &i)).collect();
        assert_eq!(delays, [0, 0, 0, 100, 200].map(|ms| MS * ms));
    }

    #[test]
    fn bucket_with_degenerate_rates_does_not_panic() {
        let unlimited = BucketRateLimiter::new(f64::INFINITY, 0);
        assert_eq!(RateLimiter::<u8>::when(&unlimited, &0), Duration::ZERO);
        for qps in [0.0, -1.0, f64::NAN] {
            let never = BucketRateLimiter::new(qps, 1);
            assert_eq!(RateLimiter::<u8>::when(&never, &0), Duration::ZERO);
            assert!(RateLimiter::<u8>::when(&never, &0) > Duration::from_secs(86_400 * 365));
        }
    }

    #[test]
    fn max_of_takes_the_longest_and_forgets_everywhere() {
        let limiter = MaxOfRateLimiter::new(vec![
            Box::new(ItemFastSlowRateLimiter::new(MS * 5, MS * 300, 3)),
            Box::new(ItemExponentialFailureRateLimiter::new(MS, Duration::from_secs(1))),
        ]);
        let delays: Vec<_> = (0..10).map(|_| limiter.when(&"a")).collect();
        // fast/slow: 5,5,5,300,…; exponential: 1,2,4,…,512
        let expected = [5, 5, 5, 300, 300, 300, 300, 300, 300, 512].map(|ms| MS * ms);
        assert_eq!(delays, expected);
        assert_eq!(limiter.num_requeues(&"a"), 10);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), MS * 5);
        assert_eq!(MaxOfRateLimiter::<u8>::new(Vec::new()).when(&0), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn default_controller_limiter_is_max_of_exponential_and_bucket() {
        let limiter = default_controller_rate_limiter::<u32>();
        // Per-item exponential while the bucket has tokens.
        let delays: Vec<_> = (0..3).map(|_| limiter.when(&7)).collect();
        assert_eq!(delays, [5, 10, 20].map(|ms| MS * ms));
        // 97 more distinct items drain the bucket (100 tokens in all) at 5 ms each.
        for i in 100..197 {
            assert_eq!(limiter.when(&i), MS * 5);
        }
        // Then the bucket dominates a fresh item's 5 ms.
        assert_eq!(limiter.when(&1000), MS * 100);
        assert_eq!(limiter.num_requeues(&7), 3);
    }
}
