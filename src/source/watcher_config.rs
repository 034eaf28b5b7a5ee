//! kube-runtime's `watcher::Config`, mapped onto a source's selectors and the reflector's
//! settings, so a kube-rs user passes the value they already build.

use std::time::Duration;

use kube::runtime::watcher;

use crate::reflector::ReflectorConfig;

/// The reflector settings of a kube `watcher::Config`, field by field:
///
/// | `watcher::Config` | here |
/// |---|---|
/// | `label_selector`, `field_selector` | not in `ReflectorConfig`: the source's (use [`InformerBuilder::watcher_config`](crate::informer::InformerBuilder::watcher_config), which sets both) |
/// | `page_size: Some(n)` | `page_size = n`; `None` (unbounded) → `u32::MAX` |
/// | `timeout: Some(s)` | `watch_timeout = (s, s)` seconds; `None` keeps the default (5–10 min, at random) |
/// | `initial_list_strategy` | `StreamingList` → `streaming_list = true` (with our fallback to a paginated LIST on 422), `ListWatch` → `false` |
/// | `list_semantic` | ignored: a durable informer does not list at start (it resumes), and its relists must not go back in time, so it never lists at `resourceVersion=0` |
/// | `bookmarks` | ignored: bookmarks are always requested, as the persisted resourceVersion and the sync of a resume depend on them |
///
/// Every other reflector setting keeps its default.
///
/// ```
/// use durable_informer::reflector::ReflectorConfig;
/// use kube::runtime::watcher;
///
/// let wc = watcher::Config::default().page_size(100).timeout(60).streaming_lists();
/// let rc = ReflectorConfig::from(&wc);
/// assert_eq!(rc.page_size, 100);
/// assert!(rc.streaming_list);
/// assert_eq!(rc.watch_timeout.0.as_secs(), 60);
/// ```
impl From<&watcher::Config> for ReflectorConfig {
    fn from(wc: &watcher::Config) -> Self {
        let mut rc = ReflectorConfig::default();
        apply(&mut rc, wc);
        rc
    }
}

impl From<watcher::Config> for ReflectorConfig {
    fn from(wc: watcher::Config) -> Self {
        Self::from(&wc)
    }
}

/// Sets `rc`'s fields that `wc` has a say on (see the `From` impl), leaving the others.
pub(crate) fn apply(rc: &mut ReflectorConfig, wc: &watcher::Config) {
    rc.page_size = wc.page_size.unwrap_or(u32::MAX).max(1);
    if let Some(t) = wc.timeout {
        let t = Duration::from_secs(u64::from(t.max(1)));
        rc.watch_timeout = (t, t);
    }
    rc.streaming_list = matches!(wc.initial_list_strategy, watcher::InitialListStrategy::StreamingList);
}
