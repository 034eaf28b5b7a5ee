//! Exponential backoff with jitter for re-watches and relists after errors.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// Backoff settings: client-go's reflector uses 800 ms doubling to 30 s, reset after 2 minutes
/// without failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// A failure after this long without one starts again from `initial`.
    pub reset_after: Duration,
    /// Relative jitter (0.0–1.0) added on top of each delay.
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(120),
            jitter: 0.2,
        }
    }
}

/// The backoff state.
#[derive(Debug)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    next: Duration,
    last_failure: Option<Instant>,
}

impl Backoff {
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Self {
            config,
            next: config.initial,
            last_failure: None,
        }
    }

    /// The delay before the next attempt after a failure; `hint` (Retry-After) wins when longer.
    pub(crate) fn delay(&mut self, hint: Option<Duration>) -> Duration {
        let now = Instant::now();
        if self
            .last_failure
            .is_some_and(|t| now.duration_since(t) > self.config.reset_after)
        {
            self.next = self.config.initial;
        }
        self.last_failure = Some(now);
        let base = self.next;
        self.next = (self.next * 2).min(self.config.max);
        let jitter = if self.config.jitter > 0.0 {
            base.mul_f64(rand::rng().random_range(0.0..self.config.jitter))
        } else {
            Duration::ZERO
        };
        (base + jitter).max(hint.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_to_the_cap_honours_hints_and_resets() {
        let mut b = Backoff::new(BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        });
        let got: Vec<u64> = (0..8).map(|_| b.delay(None).as_millis() as u64).collect();
        assert_eq!(got, vec![800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        assert_eq!(b.delay(Some(Duration::from_secs(45))), Duration::from_secs(45));
        tokio::time::advance(Duration::from_secs(121)).await;
        assert_eq!(b.delay(None), Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stays_within_bounds() {
        let mut b = Backoff::new(BackoffConfig::default());
        let d = b.delay(None);
        assert!(
            d >= Duration::from_millis(800) && d < Duration::from_millis(960),
            "{d:?}"
        );
    }
}
