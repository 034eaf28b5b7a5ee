//! Time travel: the state of a scope at a past resourceVersion, and the history of one key,
//! from the delta log while it is retained.
//!
//! ## Limits
//!
//! * Only what the log retains is reachable: after compaction (see
//!   [`StoreConfig::retention_entries`](crate::store::StoreConfig::retention_entries)), a
//!   resourceVersion older than the scope's oldest retained entry gives
//!   [`ReplayError::HistoryCompacted`].
//! * Log order is taken as time, and an entry's resourceVersion as its time (integer RVs). A
//!   relist breaks RV order (its deletes carry the deleted object's last RV): around a relist
//!   the state is that of the log position of the first entry newer than the RV asked for.
//! * [`state_at`] starts from the current objects and undoes the newer entries: it holds the
//!   scope's objects plus the entries newer than the RV asked for in memory.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::ReplayError;
use crate::object::{extract_meta, ObjectKey, ResourceVersion};
use crate::store::{DeltaKind, DurableStore, LogRecord, ScopeId, Seq, StoredObject};

/// The retained log entries of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// The entries, oldest first (resyncs included).
    pub entries: Vec<LogRecord>,
    /// False when the log was compacted: older entries of the key may be gone.
    pub complete: bool,
}

const PAGE: usize = 4096;

/// Whether entries were ever removed from the log.
fn compacted(db: &DurableStore, scope: ScopeId) -> Result<bool, ReplayError> {
    let position = db.store(scope).snapshot()?.position()?;
    Ok(match db.log().bounds()? {
        Some((first, _)) => first.0 > 1,
        None => position.0 > 0,
    })
}

/// Calls `f` for every retained log entry of `scope` up to seq `until`, in order.
fn scan(
    db: &DurableStore,
    scope: ScopeId,
    until: Seq,
    mut f: impl FnMut(LogRecord) -> Result<(), ReplayError>,
) -> Result<(), ReplayError> {
    let log = db.log();
    let mut after = Seq(0);
    while after < until {
        let (records, scanned) = log.read_scope_after(after, PAGE, scope)?;
        if scanned == after {
            break;
        }
        after = scanned;
        for r in records {
            if r.seq > until {
                return Ok(());
            }
            f(r)?;
        }
    }
    Ok(())
}

/// Every retained log entry of one key, oldest first. Blocking; reads the scope's whole log.
///
/// ```no_run
/// use durable_informer::replay::history;
/// use durable_informer::object::ObjectKey;
/// use durable_informer::store::{DurableStore, StoreConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let db = DurableStore::open(StoreConfig::new("cache.redb"))?;
/// let (scope, _) = db.scopes()?.into_iter().next().ok_or("no scope")?;
/// for e in history(&db, scope, &ObjectKey::namespaced("default", "web-0"))?.entries {
///     println!("{} {:?} at {}", e.seq, e.kind, e.rv);
/// }
/// # Ok(()) }
/// ```
pub fn history(db: &DurableStore, scope: ScopeId, key: &ObjectKey) -> Result<History, ReplayError> {
    let complete = !compacted(db, scope)?;
    let until = db.store(scope).snapshot()?.position()?;
    let mut entries = Vec::new();
    scan(db, scope, until, |r| {
        if &r.key == key {
            entries.push(r);
        }
        Ok(())
    })?;
    Ok(History { entries, complete })
}

/// The objects of `scope` as they were at resourceVersion `rv` (every entry with an RV not
/// newer than `rv` applied, none after), in key order. Blocking.
///
/// Fails with [`ReplayError::HistoryCompacted`] when the log no longer reaches back to `rv`.
/// See the module docs for the limits.
pub fn state_at(db: &DurableStore, scope: ScopeId, rv: &ResourceVersion) -> Result<Vec<StoredObject>, ReplayError> {
    let is_compacted = compacted(db, scope)?;
    let snapshot = db.store(scope).snapshot()?;
    let until = snapshot.position()?;
    let mut state: BTreeMap<ObjectKey, Bytes> = snapshot.list()?.into_iter().map(|o| (o.key, o.bytes)).collect();
    drop(snapshot);
    let mut first: Option<(Seq, ResourceVersion)> = None;
    let mut newer: Vec<LogRecord> = Vec::new();
    scan(db, scope, until, |r| {
        if first.is_none() {
            first = Some((r.seq, r.rv.clone()));
        }
        if !newer.is_empty() || (r.kind != DeltaKind::Sync && rv.is_older_than(&r.rv)) {
            newer.push(r);
        }
        Ok(())
    })?;
    let compacted_error = || ReplayError::HistoryCompacted {
        first_retained_rv: first.as_ref().map(|f| f.1.clone()).unwrap_or_default(),
    };
    if is_compacted && !newer.is_empty() && newer.first().map(|n| n.seq) == first.as_ref().map(|f| f.0) {
        // Everything retained is newer than `rv`: what came before it is gone.
        return Err(compacted_error());
    }
    for r in newer.into_iter().rev() {
        match r.kind {
            DeltaKind::Sync => {}
            DeltaKind::Added => {
                state.remove(&r.key);
            }
            DeltaKind::Updated | DeltaKind::Replaced | DeltaKind::Deleted => match r.old {
                Some(old) => {
                    state.insert(r.key, old);
                }
                None => return Err(compacted_error()),
            },
        }
    }
    let mut out = Vec::with_capacity(state.len());
    for (key, bytes) in state {
        let meta = extract_meta(&bytes).map_err(crate::store::StoreError::from)?;
        out.push(StoredObject { key, meta, bytes });
    }
    Ok(out)
}
