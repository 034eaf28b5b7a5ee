//! What the reflector reports about itself.

use std::fmt;
use std::sync::Arc;

use super::ReflectorError;
use crate::object::ResourceVersion;
use crate::store::Seq;

/// Where the reflector is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Not started.
    #[default]
    Starting,
    /// Listing (initial list or relist).
    Listing,
    /// Probing the server's RV before resuming.
    Probing,
    /// Watching.
    Watching,
    /// Waiting after an error.
    Backoff,
    /// Stopped.
    Stopped,
}

/// What the reflector reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReflectorStatus {
    /// The phase.
    pub phase: Phase,
    /// The store holds a complete, current view (initial list done, or resume caught up).
    pub synced: bool,
    /// The writer's log position when the scope first became synced: every log entry of the
    /// scope up to it belongs to the synced view, every later one is a change after it.
    pub synced_seq: Option<Seq>,
    /// The store was restored from disk at start (no initial LIST was needed).
    pub restored: bool,
    /// The RV of the last batch the writer acknowledged: committed, and on disk within
    /// `StoreConfig::fsync_delay` (watch batches are deferred). After commits are lost before
    /// reaching the disk, the RV the file holds (the reflector re-watches from there).
    pub committed_rv: Option<ResourceVersion>,
    /// Full lists made (initial + relists).
    pub lists: u64,
    /// Relists (after the first list) and why the last one ran.
    pub relists: u64,
    /// Why the last list ran.
    pub last_list_reason: Option<ListReason>,
    /// Watches opened.
    pub watches: u64,
    /// Events persisted.
    pub events: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// Who filtered the shard in the last paginated LIST of a sharded reflector (`None`
    /// before one, or when unsharded; a streaming list does not tell).
    pub shard_mode: Option<ShardMode>,
    /// Objects fetched by the last change of shard range (the added ranges, listed at the
    /// persisted resourceVersion), after the reflector's own filter.
    pub shard_fetched: Option<u64>,
}

/// Who filtered a sharded reflector's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardMode {
    /// The server honoured `shardSelector` (the list carried `metadata.shardInfo`).
    Server,
    /// The server ignored it (before Kubernetes v1.36, or the feature gate off): the whole
    /// collection came, and the reflector kept its shard.
    Client,
}

/// A callback for every error the reflector meets (it also logs them and keeps the last one in
/// its status).
pub type ErrorHook = Arc<dyn Fn(&ReflectorError) + Send + Sync>;

/// Why the reflector listed.
///
/// ```
/// use durable_informer::reflector::ListReason;
///
/// let r = ListReason::Gone("too old resource version: 5 (90)".into());
/// assert_eq!(r.class(), "gone");
/// assert!(r.to_string().starts_with("410 Gone"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListReason {
    /// The scope held no synced state.
    Initial,
    /// The watch expired (410 Gone); the server's message.
    Gone(String),
    /// The server refused the persisted RV as newer than anything it has (504): a cluster
    /// rebuilt or restored.
    TooLargeRv {
        /// The persisted RV the watch asked for.
        persisted: ResourceVersion,
        /// The server's message.
        message: String,
    },
    /// The persisted RV is ahead of the server's (etcd restored from an older backup).
    AheadOfServer {
        /// The persisted RV.
        persisted: ResourceVersion,
        /// The server's current RV.
        server: ResourceVersion,
    },
    /// A watch line that may have carried a change (malformed JSON, an event without its
    /// object, a line over the size cap) could not be read twice at the same place: only a
    /// list can tell what it changed. The decoder's message.
    SkippedEvent(String),
}

impl ListReason {
    /// The value of the `reason` metric label: `initial`, `gone`, `too_large_rv`,
    /// `rv_regression` or `skipped_event`.
    #[must_use]
    pub fn class(&self) -> &'static str {
        match self {
            ListReason::Initial => "initial",
            ListReason::Gone(_) => "gone",
            ListReason::TooLargeRv { .. } => "too_large_rv",
            ListReason::AheadOfServer { .. } => "rv_regression",
            ListReason::SkippedEvent(_) => "skipped_event",
        }
    }

    /// Routine (the first list, or a watch that expired) rather than a sign of trouble.
    #[must_use]
    pub fn is_routine(&self) -> bool {
        matches!(self, ListReason::Initial | ListReason::Gone(_))
    }
}

impl fmt::Display for ListReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListReason::Initial => f.write_str("initial list"),
            ListReason::Gone(message) => write!(f, "410 Gone: {message}"),
            ListReason::TooLargeRv { persisted, message } => write!(
                f,
                "504 too large resourceVersion {persisted} (cluster rebuilt or restored?): {message}"
            ),
            ListReason::AheadOfServer { persisted, server } => write!(
                f,
                "persisted resourceVersion {persisted} is ahead of the server's {server} (cluster restored from a backup?)"
            ),
            ListReason::SkippedEvent(message) => write!(f, "a watch event was skipped: {message}"),
        }
    }
}
