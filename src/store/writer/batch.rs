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
    /// When the disk must have it (see [`Durability`]).
    pub durability: Durability,
}

/// When a commit must be on disk, relative to its acknowledgement: the one word for what the
/// store calls durable, deferred or relaxed. A group commit is as durable as its most durable
/// command (anything but a batch is [`Immediate`](Self::Immediate)).
///
/// Whatever the durability, a crash leaves the database at some committed state (invariant
/// 1): only how recent a state differs. Readers above the store (the informer's cache, its
/// handlers) are shown a commit without an fsync as soon as the writer decides it, and told of
/// a [`Rollback`](crate::store::Item::Rollback) should it be lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub enum Durability {
    /// On disk only with the next durable commit ([`Writer::flush`], or any durable group): a
    /// bulk load whose caller makes its end durable itself and redoes the load after a crash.
    Relaxed,
    /// Acknowledged once committed; a durable commit follows within the store's
    /// [`fsync_delay`](crate::store::StoreConfig::fsync_delay) (with no delay it is
    /// [`Immediate`](Self::Immediate)). The caller must be able to redo it: a reflector
    /// re-watches from the persisted resourceVersion.
    Deferred,
    /// On disk before it is acknowledged (unless the store itself does not fsync, see
    /// [`StoreConfig::durable`](crate::store::StoreConfig::durable)).
    #[default]
    Immediate,
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
            durability: Durability::Immediate,
        }
    }

    /// [`Durability::Deferred`]: the writer acknowledges this batch once committed, before the
    /// disk has it (when the store has an
    /// [`fsync_delay`](crate::store::StoreConfig::fsync_delay)): a durable commit
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
    pub fn deferred_fsync(self) -> Self {
        self.durability(Durability::Deferred)
    }

    /// Sets when the disk must have this batch (default [`Durability::Immediate`]).
    ///
    /// ```
    /// use durable_informer::store::{Batch, Durability, ScopeId};
    /// let bulk = Batch::new(ScopeId(1)).durability(Durability::Relaxed);
    /// assert_eq!(bulk.durability, Durability::Relaxed);
    /// ```
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
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
