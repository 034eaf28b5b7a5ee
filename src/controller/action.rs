//! kube-runtime's own [`Action`], read back by the controller, and the one this crate adds: a
//! retry through the workqueue's rate limiter (client-go's `AddRateLimited`).

use std::sync::Arc;
use std::time::Duration;

pub use kube::runtime::controller::Action;

/// The delay that marks [`requeue_rate_limited`]: an odd value nobody picks by hand, which
/// kube-runtime's own `Controller` would read as a plain 5-minute requeue.
const RATE_LIMITED: Duration = Duration::new(300, 1);

/// An [`Action`] asking for the next reconcile after the workqueue rate limiter's delay for this
/// object: per-object exponential backoff (5 ms doubling to 1000 s) under an overall 10 qps,
/// client-go's `AddRateLimited`. A later success resets the object's backoff.
///
/// It is an ordinary kube `Action` (a requeue after 300 s and 1 ns, which is how kube-runtime's
/// own `Controller` would read it), so reconcilers and error policies keep kube's types.
///
/// ```
/// use durable_informer::controller::{requeue_rate_limited, Action};
/// assert_ne!(requeue_rate_limited(), Action::await_change());
/// ```
#[must_use]
pub fn requeue_rate_limited() -> Action {
    Action::requeue(RATE_LIMITED)
}

/// The error policy client-go's controllers follow: every failure is retried through the
/// workqueue's rate limiter ([`requeue_rate_limited`]).
///
/// ```
/// use std::sync::Arc;
/// use durable_informer::controller::{default_error_policy, requeue_rate_limited};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// let a = default_error_policy(Arc::new(ConfigMap::default()), &"boom", Arc::new(()));
/// assert_eq!(a, requeue_rate_limited());
/// ```
pub fn default_error_policy<K, E: ?Sized, Ctx>(_obj: Arc<K>, _error: &E, _ctx: Arc<Ctx>) -> Action {
    requeue_rate_limited()
}

/// What the controller does after an [`Action`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    AwaitChange,
    After(Duration),
    RateLimited,
}

impl Next {
    /// Reads `action` back. kube's `Action` keeps its delay private and prints it only through
    /// `Debug` (`Action { requeue_after: Some(5s) }`), so that is what is read; a form this
    /// cannot read (a kube release that prints it differently) is retried through the rate
    /// limiter rather than dropped, and `debug_form_is_read_back_exactly` fails first.
    pub(crate) fn of(action: &Action) -> Self {
        if *action == Action::await_change() {
            return Next::AwaitChange;
        }
        match parse_debug(&format!("{action:?}")) {
            Some(RATE_LIMITED) => Next::RateLimited,
            Some(d) => Next::After(d),
            None => {
                tracing::warn!(?action, "unreadable Action; retrying through the rate limiter");
                Next::RateLimited
            }
        }
    }
}

/// `Action { requeue_after: Some(<Duration as Debug>) }` → the duration.
fn parse_debug(s: &str) -> Option<Duration> {
    let inner = s.strip_prefix("Action { requeue_after: Some(")?.strip_suffix(") }")?;
    parse_duration_debug(inner)
}

/// Parses `Duration`'s `Debug` form: a decimal number and one of `s`, `ms`, `µs`, `ns`; exact
/// (the standard library prints every significant digit).
fn parse_duration_debug(s: &str) -> Option<Duration> {
    let (num, scale) = [("ns", 1_u128), ("µs", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000)]
        .into_iter()
        .find_map(|(unit, scale)| s.strip_suffix(unit).map(|n| (n, scale)))?;
    let (int, frac) = match num.split_once('.') {
        Some((_, "")) => return None,
        Some(parts) => parts,
        None => (num, ""),
    };
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = u32::try_from(frac.len()).ok()?;
    let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    let pow = 10_u128.checked_pow(digits)?;
    let nanos = int
        .parse::<u128>()
        .ok()?
        .checked_mul(scale)?
        .checked_add(frac_value.checked_mul(scale)? / pow)?;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_form_is_read_back_exactly() {
        let cases = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999),
            Duration::from_nanos(1_001),
            Duration::from_micros(5),
            Duration::from_millis(5),
            Duration::from_millis(1500),
            Duration::from_secs(300),
            Duration::new(300, 1),
            Duration::new(12, 345_678_901),
            Duration::from_secs(3600 * 24 * 365),
            Duration::new(u64::MAX, 999_999_999),
        ];
        for d in cases {
            let read = Next::of(&Action::requeue(d));
            let want = if d == RATE_LIMITED {
                Next::RateLimited
            } else {
                Next::After(d)
            };
            assert_eq!(read, want, "{d:?}");
        }
        assert_eq!(Next::of(&Action::await_change()), Next::AwaitChange);
        assert_eq!(Next::of(&requeue_rate_limited()), Next::RateLimited);
    }

    #[test]
    fn malformed_forms_are_not_read() {
        for s in ["", "5", "s", "1.s", "x5s", "5 s", "-1s", "1.5.5s", "5h"] {
            assert_eq!(parse_duration_debug(s), None, "{s}");
        }
        assert_eq!(parse_debug("Action { requeue_after: None }"), None);
    }
}
