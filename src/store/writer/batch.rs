//! What callers hand the writer (batches of deltas) and what it answers (commits, relist and
//! compaction reports).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::super::codec::DeltaKind;
use super::super::dict::EncDict;
use super::super::schema::{ScopeId, Seq};
use crate::object::{RawObject, ResourceVersion};

/// One change to apply.
#[derive(Debug, Clone)]
pub struct Delta {
    /// What happened. `Added`/`Updated`/`Replaced` are stored as an add or an update depending on
    /// whether the key exists; a `Deleted` of an unknown key and an upsert with the stored RV are
    /// dropped, so redelivered events are harmless.
    pub kind: DeltaKind,
    /// The object (for deletes, its final state).
    pub object: RawObject,
}

/// Deltas for one scope, committed atomically together with the scope's new RV.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The scope.
    pub scope: ScopeId,
    /// The changes, in order.
    pub deltas: Vec<Delta>,
    /// The scope's RV after this batch (from the last event or a bookmark). `None` keeps it.
    pub rv: Option<ResourceVersion>,
    /// Marks the scope synced (the end of an initial list).
    pub mark_synced: bool,
    /// Refuse unless the persisted RV is at least this (equal to it, or an integer RV above
    /// it): set to the RV the previous pipelined batch reaches, so a batch never commits
    /// after its predecessor failed (which would skip the predecessor's events).
    pub requires_rv: Option<ResourceVersion>,
    /// The carried objects already compressed by [`Writer::submit`] on the caller's thread.
    pub(crate) packed: Option<Packed>,
    /// Commit without waiting for the disk (see [`Writer::flush`]): for a bulk load whose
    /// caller makes the end durable itself and redoes the whole load after a crash.
    pub(crate) relaxed: bool,
    /// Commit without waiting for the disk, with a durable commit following within the
    /// store's [`StoreConfig::fsync_delay`](crate::store::StoreConfig::fsync_delay).
    pub(crate) defer_fsync: bool,
}

/// Objects of a batch compressed before it reached the writer thread, with the committed
/// dictionary they used. The writer takes them only if that is the dictionary it would use
/// itself (the same `Arc`), so a blob never names a dictionary that is not in the file.
#[derive(Clone)]
pub(crate) struct Packed {
    pub(super) dict: Arc<EncDict>,
    /// One per delta that carries bytes (every kind but `Sync`), in order.
    pub(super) blobs: Vec<Bytes>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("scope", &self.dict.scope)
            .field("dict", &self.dict.id)
            .field("blobs", &self.blobs.len())
            .finish()
    }
}

/// Each scope's newest committed dictionary, published by the writer thread for
/// [`Writer::submit`]: dictionary rows are never rewritten, so one published stays valid.
pub(crate) type PublishedDicts = Arc<std::sync::RwLock<HashMap<u32, Arc<EncDict>>>>;

impl Batch {
    /// An empty batch for `scope`.
    #[must_use]
    pub fn new(scope: ScopeId) -> Self {
        Self {
            scope,
            deltas: Vec::new(),
            rv: None,
            mark_synced: false,
            requires_rv: None,
            packed: None,
            relaxed: false,
            defer_fsync: false,
        }
    }

    /// Lets the writer acknowledge this batch once committed, before the disk has it (when the
    /// store has an [`fsync_delay`](crate::store::StoreConfig::fsync_delay)): a durable commit
    /// follows within that delay ([`Writer::durable`](crate::store::Writer::durable) tells when).
    /// A crash, or a failed fsync, before then loses the batch, so the caller must be able to
    /// redo it: reflectors re-watch from the persisted resourceVersion, and each batch
    /// [`requires`](Self::requires) its predecessor, so none commits after a lost one.
    ///
    /// ```
    /// use durable_informer::store::{Batch, ScopeId};
    /// let batch = Batch::new(ScopeId(1)).rv("7").deferred_fsync();
    /// # let _ = batch;
    /// ```
    #[must_use]
    pub fn deferred_fsync(mut self) -> Self {
        self.defer_fsync = true;
        self
    }

    /// Applies only if the scope's persisted RV is `rv` or, both being integers, newer (see
    /// [`Batch::requires_rv`]); opaque RVs must match exactly.
    #[must_use]
    pub fn requires(mut self, rv: impl Into<ResourceVersion>) -> Self {
        self.requires_rv = Some(rv.into());
        self
    }

    /// Appends a delta.
    #[must_use]
    pub fn delta(mut self, kind: DeltaKind, object: RawObject) -> Self {
        self.deltas.push(Delta { kind, object });
        self
    }

    /// Sets the RV the scope reaches with this batch.
    #[must_use]
    pub fn rv(mut self, rv: impl Into<ResourceVersion>) -> Self {
        self.rv = Some(rv.into());
        self
    }

    /// Marks the scope synced.
    #[must_use]
    pub fn synced(mut self) -> Self {
        self.mark_synced = true;
        self
    }

    pub(super) fn bytes(&self) -> usize {
        self.deltas.iter().map(|d| d.object.bytes.len()).sum()
    }
}

/// What a commit made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The last log seq in the database after the commit.
    pub seq: Seq,
    /// How many log entries this command appended.
    pub entries: u64,
}

/// The outcome of a relist diff.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelistSummary {
    /// Listed objects the store did not have.
    pub added: u64,
    /// Listed objects whose RV differed.
    pub updated: u64,
    /// Stored objects the list did not contain (delivered as deletes, final state unknown).
    pub deleted: u64,
    /// Listed objects equal to what was stored (no event).
    pub unchanged: u64,
    /// The last log seq after the commit.
    pub seq: Seq,
}

/// The outcome of a log compaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Entries removed.
    pub removed: u64,
    /// Object rows whose bytes moved from the log into the row.
    pub inlined: u64,
    /// The first seq still in the log (0 when empty).
    pub first_retained: Seq,
}
