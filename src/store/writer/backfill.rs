//! Index backfill in bounded transactions.
//!
//! When an index is added to a scope that already holds objects, its rows are computed over
//! those objects `backfill_step` at a time, each step its own transaction between batches. The
//! progress (the last object key done) is a row of `index_backfill`, so a crash resumes it.
//!
//! Why the index is exact once the last step ran: from the moment its function is registered,
//! every write maintains its rows (`apply_delta` uses every registered function), so objects
//! behind the backfill cursor stay right, and objects ahead of it are (re)computed from their
//! current state when the cursor reaches them. The one gap is a restart: writes between opening
//! the database and registering the function again do not maintain the rows, so resuming first
//! repairs every key the log shows was written since the last step (ahead of the cursor too: a
//! deleted object's rows there would never be visited by a step).

use redb::{ReadableTable, WriteTransaction};

use super::super::codec::{self, BackfillProgress};
use super::super::index::Indexer;
use super::super::rules;
use super::super::schema::{keys, IndexName, ScopeId, DICTS, INDEX_BACKFILL, LOG, OBJECTS};
use super::{Ack, Failure, Step, StoreError, Tables, WriterThread};
use crate::object::ObjectKey;

impl WriterThread {
    /// Starts (or resumes) the backfill of `name` over `scope`, running its first step in this
    /// transaction. Returns whether the index is complete; if not, the caller waits for the
    /// background steps.
    pub(super) fn ensure_index(&self, txn: &WriteTransaction, scope: ScopeId, name: &IndexName) -> Step<bool> {
        let record = self.load_scope(txn, scope)?;
        let Some(ix) = self.shared.indexes.get(scope, name) else {
            return Err(Failure::Refused(StoreError::UnknownIndex {
                scope,
                name: name.0.clone(),
            }));
        };
        if record.indexes.contains(&name.0) {
            return Ok(true);
        }
        if self.upkeep.backfills.borrow().contains_key(&(scope, name.clone())) {
            // Running already: wait for it.
            return Ok(false);
        }
        let progress = match self.load_progress(txn, scope, name)? {
            None => BackfillProgress {
                after: None,
                seq: self.next_seq.get().saturating_sub(1),
            },
            Some(p) => self.repair_since(txn, scope, &ix, p)?,
        };
        self.save_progress(txn, scope, name, &progress)?;
        self.backfill_step(txn, scope, &ix)
    }

    fn load_progress(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        name: &IndexName,
    ) -> Step<Option<BackfillProgress>> {
        let table = txn.open_table(INDEX_BACKFILL).map_err(|e| self.st(e))?;
        let row = table.get((scope.0, name.0.as_str())).map_err(|e| self.st(e))?;
        Ok(match row {
            Some(v) => Some(codec::decode_backfill(v.value()).map_err(StoreError::from)?),
            None => None,
        })
    }

    fn save_progress(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        name: &IndexName,
        progress: &BackfillProgress,
    ) -> Step<()> {
        let mut table = txn.open_table(INDEX_BACKFILL).map_err(|e| self.st(e))?;
        let row = codec::encode_backfill(progress).map_err(StoreError::from)?;
        table
            .insert((scope.0, name.0.as_str()), row.as_slice())
            .map_err(|e| self.st(e))?;
        Ok(())
    }

    /// A backfill found in the database that this writer did not run: recompute the rows of
    /// every key written since its last step (those writes may have run before the function
    /// was registered again). Behind the cursor that keeps rows exact; ahead of it, it removes
    /// the rows of objects deleted meanwhile, which no later step would visit (steps only visit
    /// objects that exist). Starts over when the log no longer shows every such write, or shows
    /// too many.
    fn repair_since(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        ix: &Indexer,
        mut progress: BackfillProgress,
    ) -> Step<BackfillProgress> {
        let last = self.next_seq.get().saturating_sub(1);
        if last <= progress.seq {
            return Ok(progress);
        }
        let touched = {
            let log = txn.open_table(LOG).map_err(|e| self.st(e))?;
            rules::keys_written_since(&log, scope, progress.seq, last).map_err(|e| self.st(e))?
        };
        let Some(touched) = touched else {
            tracing::info!(%scope, index = %ix.name, "index backfill starts over: the log no longer shows every write since it stopped");
            return Ok(BackfillProgress { after: None, seq: last });
        };
        let rows = self.index_values(txn, scope, ix, touched)?;
        let mut t = Tables::open(self, txn)?;
        for (key, values) in rows {
            self.set_index_values(&mut t, scope, &ix.name, &key, &values)?;
        }
        progress.seq = last;
        Ok(progress)
    }

    /// The index values of `keys` from their current objects (none for a key with no object).
    fn index_values(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        ix: &Indexer,
        wanted: impl IntoIterator<Item = ObjectKey>,
    ) -> Step<Vec<(ObjectKey, Vec<String>)>> {
        let objects = txn.open_table(OBJECTS).map_err(|e| self.st(e))?;
        let log = txn.open_table(LOG).map_err(|e| self.st(e))?;
        let mut out = Vec::new();
        for key in wanted {
            let values = match objects
                .get(keys::object(scope, &key).as_slice())
                .map_err(|e| self.st(e))?
            {
                Some(v) => {
                    let (h, inline) = codec::decode_object(v.value()).map_err(StoreError::from)?;
                    let json = self.stored_json(txn, &log, &h, inline)?;
                    ix.values_caught(&h.meta, &json)?
                }
                None => Vec::new(),
            };
            out.push((key, values));
        }
        Ok(out)
    }

    fn stored_json(
        &self,
        txn: &WriteTransaction,
        log: &redb::Table<'_, u64, &'static [u8]>,
        header: &codec::ObjectHeader,
        inline: &[u8],
    ) -> Step<bytes::Bytes> {
        let load = |s: u32, d: u32| {
            let dicts = txn.open_table(DICTS).map_err(|e| self.st(e))?;
            super::super::read::dict_row(&self.shared, &dicts, s, d)
        };
        Ok(super::super::read::object_bytes(
            &self.shared,
            log,
            header,
            inline,
            &load,
        )?)
    }

    /// Indexes the next `backfill_step` objects after the cursor. When none is left, drops the
    /// progress row and adds the index to the scope record (queries answer from then on).
    /// Returns whether the backfill is complete.
    fn backfill_step(&self, txn: &WriteTransaction, scope: ScopeId, ix: &Indexer) -> Step<bool> {
        let name = &ix.name;
        let Some(mut progress) = self.load_progress(txn, scope, name)? else {
            // Finished by an earlier step.
            return Ok(true);
        };
        let (scope_start, scope_end) = keys::scope_range(scope);
        let start = match &progress.after {
            // The smallest key greater than `after`: its encoding plus one NUL byte.
            Some(k) => {
                let mut v = keys::object(scope, k);
                v.push(0);
                v
            }
            None => scope_start,
        };
        let mut rows = Vec::new();
        let exhausted;
        {
            let objects = txn.open_table(OBJECTS).map_err(|e| self.st(e))?;
            let log = txn.open_table(LOG).map_err(|e| self.st(e))?;
            let mut range = objects
                .range::<&[u8]>(start.as_slice()..scope_end.as_slice())
                .map_err(|e| self.st(e))?;
            for row in range.by_ref().take(self.upkeep.backfill_step) {
                let (k, v) = row.map_err(|e| self.st(e))?;
                let (h, inline) = codec::decode_object(v.value()).map_err(StoreError::from)?;
                let json = self.stored_json(txn, &log, &h, inline)?;
                let (_, key) = keys::decode_object(k.value()).map_err(StoreError::from)?;
                let values = ix.values_caught(&h.meta, &json)?;
                rows.push((key, values));
            }
            exhausted = range.next().is_none();
        }
        let last_key = rows.last().map(|(k, _)| k.clone());
        {
            let mut t = Tables::open(self, txn)?;
            for (key, values) in rows {
                self.set_index_values(&mut t, scope, name, &key, &values)?;
            }
        }
        if exhausted {
            let mut table = txn.open_table(INDEX_BACKFILL).map_err(|e| self.st(e))?;
            table.remove((scope.0, name.0.as_str())).map_err(|e| self.st(e))?;
            drop(table);
            let mut record = self.load_scope(txn, scope)?;
            if !record.indexes.contains(&name.0) {
                record.indexes.push(name.0.clone());
                record.indexes.sort();
            }
            self.save_scope(txn, scope, &record)?;
            tracing::debug!(%scope, index = %name, "index backfill complete");
            return Ok(true);
        }
        progress.after = last_key.or(progress.after);
        progress.seq = self.next_seq.get().saturating_sub(1);
        self.save_progress(txn, scope, name, &progress)?;
        Ok(false)
    }

    pub(super) fn defer_backfill(&self, ack: Ack<()>, scope: ScopeId, name: IndexName) {
        self.upkeep
            .backfills
            .borrow_mut()
            .entry((scope, name))
            .or_default()
            .push(ack);
    }

    pub(super) fn has_backfill_work(&self) -> bool {
        !self.upkeep.backfills.borrow().is_empty()
    }

    /// Runs one backfill transaction of the first running backfill; answers its callers when
    /// it completes or fails.
    pub(super) fn backfill_job_step(&self) {
        let Some((scope, name)) = self.upkeep.backfills.borrow().keys().next().cloned() else {
            return;
        };
        let result = match self.shared.indexes.get(scope, &name) {
            Some(ix) => self.structural_maintenance(|txn| self.backfill_step(txn, scope, &ix)),
            // Functions are never unregistered; reported rather than assumed.
            None => Err(StoreError::UnknownIndex {
                scope,
                name: name.0.clone(),
            }),
        };
        let finished = match result {
            Ok(false) => return,
            Ok(true) => Ok(()),
            Err(e) => {
                tracing::warn!(%scope, index = %name, error = %e, "index backfill stopped; ensure_index resumes it");
                Err(e)
            }
        };
        let acks = self
            .upkeep
            .backfills
            .borrow_mut()
            .remove(&(scope, name))
            .unwrap_or_default();
        for ack in acks {
            drop(ack.send(finished.as_ref().copied().map_err(StoreError::to_aborted)));
        }
    }

    /// Fails every backfill caller (the store is closing; the progress stays persisted).
    pub(super) fn abandon_backfills(&self, e: &StoreError) {
        for (_, acks) in std::mem::take(&mut *self.upkeep.backfills.borrow_mut()) {
            for ack in acks {
                drop(ack.send(Err(e.to_aborted())));
            }
        }
    }
}
