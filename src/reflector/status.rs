//! What the reflector reports about itself.

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
    /// The last durably committed RV.
    pub committed_rv: Option<ResourceVersion>,
    /// Full lists made (initial + relists).
    pub lists: u64,
    /// Relists (after the first list) and why the last one ran.
    pub relists: u64,
    /// Why the last list ran.
    pub last_list_reason: Option<String>,
    /// Watches opened.
    pub watches: u64,
    /// Events persisted.
    pub events: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// A callback for every error the reflector meets (it also logs them and keeps the last one in
/// its status).
pub type ErrorHook = Arc<dyn Fn(&ReflectorError) + Send + Sync>;
