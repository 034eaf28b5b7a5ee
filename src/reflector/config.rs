//! The reflector's settings.

use std::time::Duration;

use super::transform::Transform;
use super::BackoffConfig;
use crate::selector::ShardSelector;

/// Reflector settings. `Default` gives client-go's behaviour.
#[derive(Debug, Clone)]
pub struct ReflectorConfig {
    /// LIST page size (default 500).
    pub page_size: u32,
    /// Try a streaming list (`sendInitialEvents`) first, falling back to a paginated LIST on
    /// 422 or any error (default true).
    pub streaming_list: bool,
    /// `timeoutSeconds` of each watch, picked at random in this range (default 5–10 minutes).
    pub watch_timeout: (Duration, Duration),
    /// A watch that delivers nothing (not even a bookmark) for longer than its timeout plus this
    /// is considered stalled and reopened (default 30 s).
    pub stall_grace: Duration,
    /// Backoff after errors.
    pub backoff: BackoffConfig,
    /// Transforms before persisting.
    pub transform: Transform,
    /// Most deltas per batch handed to the writer (default 1000).
    pub max_batch: usize,
    /// Wipe the database instead of failing when it belongs to another cluster (default false).
    pub reset_on_cluster_change: bool,
    /// A fallback for servers that do not tell their watch cache's revision, and for
    /// filtered scopes.
    ///
    /// After a resume the scope counts as synced when its committed RV reaches the watch
    /// cache's revision of the resource (an RV=0 LIST that matches no object): exact, and no
    /// quiet period applies unless the server filters the watch (a label or field selector,
    /// a shard): the watch cache sends no bookmark at the RV of an event it filtered out, so
    /// when the resource's last change before the revision is not ours, only the next change
    /// would reach it. A server that gives no such revision (watch cache off, non-integer
    /// RVs) leaves the cluster-wide RV of the one-object probe as the target, which an event
    /// or bookmark must reach — or, with this set, the resumed watch delivering its backlog and
    /// staying quiet this long (default 2 s). On a busy cluster the cluster-wide RV moves with
    /// other resources, so without this such a server would make a resume wait for a bookmark
    /// (minutes on a real server). `None` disables it.
    ///
    /// This rule is ours, not the API server's: it assumes the server delivers the backlog
    /// promptly. A server whose watch cache lags (kubernetes#107133) may stay quiet longer and
    /// then send old changes, so `synced` can come early; nothing is lost (those events are
    /// applied when they arrive), only the signal is optimistic.
    pub resume_quiet_period: Option<Duration>,
    /// Keep only this shard of the resource (KEP-5866 hash ranges; default `None`: every
    /// object). Every LIST and WATCH carries it as `shardSelector`, so a server that supports
    /// it (v1.36+, `ShardedListAndWatch` gate) sends only the shard; the reflector filters
    /// every list page and watch event by the same hash as well, so on an older server (which
    /// ignores the parameter) the store still holds only the shard. The range is persisted
    /// with the scope: a start with another range drops the objects no longer owned (delete
    /// events for handlers) and fetches only the added ranges (see `README.md`, *Sharding*).
    pub sharding: Option<ShardSelector>,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            page_size: 500,
            streaming_list: true,
            watch_timeout: (Duration::from_secs(300), Duration::from_secs(600)),
            stall_grace: Duration::from_secs(30),
            backoff: BackoffConfig::default(),
            transform: Transform::default(),
            max_batch: 1000,
            reset_on_cluster_change: false,
            resume_quiet_period: Some(Duration::from_secs(2)),
            sharding: None,
        }
    }
}
