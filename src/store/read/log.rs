//! [`LogReader`]: reading the delta log and durable consumers' cursors.

use std::sync::Arc;

use bytes::Bytes;
use redb::{ReadTransaction, ReadableTable};

use super::super::codec::{self, DeltaKind, PrevRef};
use super::super::dict::LoadDict;
use super::super::schema::{CursorName, ScopeId, Seq, CURSORS, LOG};
use super::super::{Shared, StoreError};
use crate::object::{ObjectKey, ResourceVersion};

use super::{saved_last_seq, txn_loader};

/// One entry of the delta log, with the bytes a handler needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its seq.
    pub seq: Seq,
    /// Its scope.
    pub scope: ScopeId,
    /// What happened (`Added`, `Updated`, `Deleted` or `Sync`).
    pub kind: DeltaKind,
    /// The object's key.
    pub key: ObjectKey,
    /// The RV of this version (of the deletion, for deletes with a known final state).
    pub rv: ResourceVersion,
    /// The new state (for deletes: the final state, when known).
    pub object: Option<Bytes>,
    /// The previous state (updates and deletes), while it is retained.
    pub old: Option<Bytes>,
    /// A delete found by a relist: `object` is `None` and `old` is the last known state.
    pub final_state_unknown: bool,
}

/// What a tolerant read of the log found at one seq: an entry, or one that does not decode.
#[derive(Debug)]
pub(crate) enum LogEntry {
    /// An entry that decoded.
    Record(LogRecord),
    /// An entry that did not (a damaged row).
    Damaged(DamagedEntry),
}

impl LogEntry {
    pub(crate) fn seq(&self) -> Seq {
        match self {
            LogEntry::Record(r) => r.seq,
            LogEntry::Damaged(d) => d.seq,
        }
    }
}

/// A log entry that does not decode.
#[derive(Debug)]
pub(crate) struct DamagedEntry {
    pub(crate) seq: Seq,
    /// Its object, when its header decodes (it is then of the scope read); `None`: it may be
    /// of any scope.
    pub(crate) key: Option<ObjectKey>,
    /// The entry without its previous state (`old: None`), when only that is damaged.
    pub(crate) partial: Option<LogRecord>,
    /// Why it does not decode.
    pub(crate) error: StoreError,
}

/// A reader of the delta log.
#[derive(Clone)]
pub struct LogReader {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader").finish_non_exhaustive()
    }
}

impl LogReader {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn begin(&self) -> Result<super::super::ReadTxn, StoreError> {
        let s = &self.shared;
        s.db()?.begin_read().map_err(|e| s.storage(e))
    }

    /// Up to `limit` entries with seq greater than `after`, in order; only those of `scope` when
    /// given.
    pub fn read_after(&self, after: Seq, limit: usize, scope: Option<ScopeId>) -> Result<Vec<LogRecord>, StoreError> {
        Ok(self.scan_after(&*self.begin()?, after, limit, scope, true)?.0)
    }

    /// Like [`read_after`](Self::read_after) for one scope, and also says how far it looked:
    /// a consumer of one scope advances its cursor past other scopes' entries too.
    pub fn read_scope_after(
        &self,
        after: Seq,
        limit: usize,
        scope: ScopeId,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        self.scan_after(&*self.begin()?, after, limit, Some(scope), true)
    }

    /// Up to `limit` entries after `after` (of `scope` only, when given), and the last seq
    /// looked at; the objects' bytes only when `bytes`. The first damaged entry is an error.
    fn scan_after(
        &self,
        txn: &ReadTransaction,
        after: Seq,
        limit: usize,
        scope: Option<ScopeId>,
        bytes: bool,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        let (entries, scanned) = self.scan_entries(txn, after, limit, scope, bytes)?;
        let records = entries
            .into_iter()
            .map(|e| match e {
                LogEntry::Record(r) => Ok(r),
                LogEntry::Damaged(d) => Err(d.error),
            })
            .collect::<Result<_, _>>()?;
        Ok((records, scanned))
    }

    /// [`scan_after`](Self::scan_after), returning damaged entries in their place instead of
    /// failing on them; only a storage error fails.
    fn scan_entries(
        &self,
        txn: &ReadTransaction,
        after: Seq,
        limit: usize,
        scope: Option<ScopeId>,
        bytes: bool,
    ) -> Result<(Vec<LogEntry>, Seq), StoreError> {
        let s = &self.shared;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, txn);
        let mut scanned = after;
        let mut out = Vec::new();
        for row in log.range(after.0.saturating_add(1)..).map_err(|e| s.storage(e))? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = row.map_err(|e| s.storage(e))?;
            scanned = Seq(k.value());
            if let Some(e) = decode_entry(s, &log, k.value(), v.value(), scope, bytes, &load)? {
                out.push(e);
            }
        }
        Ok((out, scanned))
    }

    /// Like [`read_scope_after`](Self::read_scope_after), but fails with
    /// [`StoreError::LogCompacted`] when entries right after `after` were already compacted, so
    /// a consumer never skips them silently. The check and the read share one view.
    pub fn read_scope_after_contiguous(
        &self,
        after: Seq,
        limit: usize,
        scope: ScopeId,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        self.read_scope_after_contiguous_with(after, limit, scope, true)
    }

    /// Like [`read_scope_after_contiguous`](Self::read_scope_after_contiguous), reading only
    /// the entries' headers: the records carry kinds, keys and RVs, never `object` or `old`,
    /// and no object is read or decompressed. What a consumer that needs only keys reads (the
    /// controller's queue).
    ///
    /// ```
    /// # use durable_informer::object::ScopeSpec;
    /// # use durable_informer::store::{DurableStore, Seq, StoreConfig};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    /// let scope = db.writer().register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps")).unwrap();
    /// let (records, _) = db.log().read_scope_keys_after_contiguous(Seq(0), 100, scope).unwrap();
    /// assert!(records.iter().all(|r| r.object.is_none() && r.old.is_none()));
    /// ```
    pub fn read_scope_keys_after_contiguous(
        &self,
        after: Seq,
        limit: usize,
        scope: ScopeId,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        self.read_scope_after_contiguous_with(after, limit, scope, false)
    }

    /// [`read_scope_after_contiguous`](Self::read_scope_after_contiguous) with the states
    /// (`bytes`) or [`read_scope_keys_after_contiguous`](Self::read_scope_keys_after_contiguous)
    /// without.
    pub(crate) fn read_scope_after_contiguous_with(
        &self,
        after: Seq,
        limit: usize,
        scope: ScopeId,
        bytes: bool,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        let txn = self.contiguous(after)?;
        self.scan_after(&txn, after, limit, Some(scope), bytes)
    }

    /// [`read_scope_after_contiguous`](Self::read_scope_after_contiguous), with damaged entries
    /// in their place instead of an error: what a durable handler reads, so that one damaged
    /// row does not hold its cursor for ever. Each damaged entry is counted
    /// (`durable_informer_damaged_rows_skipped_total`).
    pub(crate) fn read_scope_entries_after_contiguous(
        &self,
        after: Seq,
        limit: usize,
        scope: ScopeId,
    ) -> Result<(Vec<LogEntry>, Seq), StoreError> {
        let txn = self.contiguous(after)?;
        let (entries, scanned) = self.scan_entries(&txn, after, limit, Some(scope), true)?;
        for _ in entries.iter().filter(|e| matches!(e, LogEntry::Damaged(_))) {
            crate::store::metrics::damaged_row_skipped(&self.shared.path);
        }
        Ok((entries, scanned))
    }

    /// A read transaction in which the entries right after `after` were not compacted, or
    /// [`StoreError::LogCompacted`].
    fn contiguous(&self, after: Seq) -> Result<super::super::ReadTxn, StoreError> {
        let s = &self.shared;
        let txn = self.begin()?;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        // Seqs in the file are dense and increasing (invariant 4), so a first entry beyond `after + 1`
        // (or an empty log whose last handed-out seq is beyond `after`) means compaction.
        let first = match log.first().map_err(|e| s.storage(e))? {
            Some((k, _)) => k.value(),
            None => saved_last_seq(s, &txn)?.saturating_add(1),
        };
        if first > after.0.saturating_add(1) {
            return Err(StoreError::LogCompacted {
                after: after.0,
                first_retained: first,
            });
        }
        drop(log);
        Ok(txn)
    }

    /// The log entry at `seq`, with its states (`None` once compacted, or when it belongs to
    /// another scope than `scope`).
    pub fn record(&self, seq: Seq, scope: ScopeId) -> Result<Option<LogRecord>, StoreError> {
        let s = &self.shared;
        let txn = self.begin()?;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, &txn);
        let Some(row) = log.get(seq.0).map_err(|e| s.storage(e))? else {
            return Ok(None);
        };
        match decode_entry(s, &log, seq.0, row.value(), Some(scope), true, &load)? {
            None => Ok(None),
            Some(LogEntry::Record(r)) => Ok(Some(r)),
            Some(LogEntry::Damaged(d)) => Err(d.error),
        }
    }

    /// The first and last seq in the log (`None` when empty).
    pub fn bounds(&self) -> Result<Option<(Seq, Seq)>, StoreError> {
        let s = &self.shared;
        let txn = self.begin()?;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let first = log.first().map_err(|e| s.storage(e))?.map(|(k, _)| k.value());
        let last = log.last().map_err(|e| s.storage(e))?.map(|(k, _)| k.value());
        Ok(first.zip(last).map(|(a, b)| (Seq(a), Seq(b))))
    }

    /// The cursor of the durable consumer `name` of `scope`.
    pub fn cursor(&self, scope: ScopeId, name: impl Into<CursorName>) -> Result<Option<Seq>, StoreError> {
        let name = name.into();
        let s = &self.shared;
        let txn = self.begin()?;
        let cursors = txn.open_table(CURSORS).map_err(|e| s.storage(e))?;
        Ok(cursors
            .get((scope.0, name.as_str()))
            .map_err(|e| s.storage(e))?
            .map(|v| Seq(v.value())))
    }
}

/// Decodes one log row into a record with the bytes a handler needs (`None` when it belongs to
/// another scope than `scope`), or the damage found. Only a storage error fails.
fn decode_entry<T: ReadableTable<u64, &'static [u8]>>(
    s: &Shared,
    log: &T,
    seq: u64,
    value: &[u8],
    scope: Option<ScopeId>,
    bytes: bool,
    load: LoadDict<'_>,
) -> Result<Option<LogEntry>, StoreError> {
    let damaged = |key: Option<&ObjectKey>, partial: Option<LogRecord>, error: StoreError| {
        Ok(Some(LogEntry::Damaged(DamagedEntry {
            seq: Seq(seq),
            key: key.cloned(),
            partial,
            error,
        })))
    };
    let unpack = |c, b: &[u8]| s.dicts.unpack(c, b, load);
    let (h, data, prev_inline) = match codec::decode_log(value) {
        Ok(d) => d,
        Err(e) => return damaged(None, None, e.into()),
    };
    if scope.is_some_and(|sc| sc.0 != h.scope) {
        return Ok(None);
    }
    // A keys-only reader (the controller's queue) skips reading and decompressing the states.
    let object = match (h.has_data && bytes).then(|| unpack(h.compression, data)).transpose() {
        Ok(o) => o,
        Err(e) => return damaged(Some(&h.key), None, e),
    };
    let old = match h.prev {
        _ if !bytes => Ok(None),
        PrevRef::None => Ok(None),
        PrevRef::Inline(c) => unpack(c, prev_inline).map(Some),
        PrevRef::Log(p) => match log.get(p).map_err(|e| s.storage(e))? {
            Some(row) => codec::decode_log(row.value())
                .map_err(StoreError::from)
                .and_then(|(ph, pdata, _)| ph.has_data.then(|| unpack(ph.compression, pdata)).transpose()),
            None => Ok(None),
        },
    };
    let (old, old_error) = match old {
        Ok(old) => (old, None),
        Err(e) => (None, Some(e)),
    };
    let (object, old) = match h.kind {
        // A sync carries no bytes: its state is the previous (= current) one.
        DeltaKind::Sync => (old.clone(), old),
        _ => (object, old),
    };
    let key = old_error.as_ref().map(|_| h.key.clone());
    let record = LogRecord {
        seq: Seq(seq),
        scope: ScopeId(h.scope),
        kind: h.kind,
        key: h.key,
        rv: h.rv,
        object,
        old,
        final_state_unknown: h.final_state_unknown,
    };
    match old_error {
        Some(e) => damaged(key.as_ref(), Some(record), e),
        None => Ok(Some(LogEntry::Record(record))),
    }
}
