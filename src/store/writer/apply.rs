//! Applying a batch: objects, the log and index rows, in the group's transaction.

use std::cell::Cell;
use std::sync::Arc;

use bytes::Bytes;
use redb::{ReadableTable, WriteTransaction};

use super::super::changes::Change;
use super::super::codec::{self, Compression, DataRef, DeltaKind, LogHeader, PrevRef, ScopeRecord};
use super::super::dict::{self, EncDict};
use super::super::index::Indexer;
use super::super::schema::{keys, IndexName, ScopeId, Seq, INDEX, INDEX_REV, LOG, OBJECTS};
use super::super::StoreError;
use super::{Batch, Failure, Garbage, Step, WriterThread};
use crate::object::{ObjectKey, RawObject, ResourceVersion};

impl WriterThread {
    pub(super) fn apply_batch(&self, txn: &WriteTransaction, mut batch: Batch) -> Step<u64> {
        let mut record = self.load_scope(txn, batch.scope)?;
        // Refuse before writing anything, so the rest of the group still commits.
        for d in &batch.deltas {
            d.object.key().validate().map_err(|e| Failure::Refused(e.into()))?;
        }
        if let Some(required) = &batch.requires_rv {
            // "At least `required`": equal (any RV, opaque ones too), or known newer.
            if !record
                .rv
                .as_ref()
                .is_some_and(|p| p == required || required.is_older_than(p))
            {
                return Err(Failure::Refused(StoreError::PredecessorMissing {
                    scope: batch.scope,
                    persisted: record.rv.clone(),
                    required: required.clone(),
                }));
            }
        }
        if let (Some(persisted), Some(offered)) = (&record.rv, &batch.rv) {
            // Invariant 2: the persisted RV never moves backwards outside a relist.
            if offered.is_older_than(persisted) {
                return Err(Failure::Refused(StoreError::RvRegression {
                    scope: batch.scope,
                    persisted: persisted.clone(),
                    offered: offered.clone(),
                }));
            }
        }
        let indexers = self.shared.indexes.for_scope(batch.scope);
        // Compress everything first (on two threads for large batches), so the redb work below
        // runs uninterrupted.
        let carried: Vec<&Bytes> = batch
            .deltas
            .iter()
            .filter(|d| d.kind != DeltaKind::Sync)
            .map(|d| &d.object.bytes)
            .collect();
        let (dict, before) = self.scope_dict(txn, batch.scope, &carried)?;
        let precompressed = match (batch.packed.take(), &dict) {
            (Some(p), Some(d)) if before == 0 && Arc::ptr_eq(&p.dict, d) && p.blobs.len() == carried.len() => {
                let tag = Compression::Dict {
                    scope: d.scope,
                    dict: d.id,
                };
                Some(p.blobs.into_iter().map(|b| (b, tag)).collect::<Vec<_>>())
            }
            _ => None,
        };
        let packed = match precompressed {
            Some(p) => p,
            None => {
                let (plain, with_dict) = carried.split_at(before);
                let mut packed = dict::pack_all(self.dict.compression, None, plain).map_err(StoreError::from)?;
                packed.extend(
                    dict::pack_all(self.dict.compression, dict.as_deref(), with_dict).map_err(StoreError::from)?,
                );
                packed
            }
        };
        let mut next_blob = packed.iter().cloned();
        drop(carried);
        let mut tables = Tables::open(self, txn)?;
        let mut appended = 0;
        for d in &batch.deltas {
            let blob = if d.kind == DeltaKind::Sync {
                None
            } else {
                next_blob.next()
            };
            if self.apply_delta(
                &mut tables,
                batch.scope,
                &indexers,
                &mut record,
                d.kind,
                &d.object,
                false,
                blob,
            )? {
                appended += 1;
            }
        }
        drop(next_blob);
        // Freed off this thread: the objects were allocated on the submitting threads.
        self.commit
            .garbage
            .borrow_mut()
            .push(Garbage::Batch(std::mem::take(&mut batch.deltas), packed));
        if let Some(rv) = batch.rv {
            record.rv = Some(rv);
        }
        record.synced |= batch.mark_synced;
        drop(tables);
        self.save_scope(txn, batch.scope, &record)?;
        Ok(appended)
    }

    /// Deletes the stored object under the encoded object key `k` as a relist does: what the
    /// handlers get as its final state is the stored one.
    pub(super) fn delete_stored(
        &self,
        t: &mut Tables<'_>,
        scope: ScopeId,
        indexers: &[Indexer],
        record: &mut ScopeRecord,
        k: &[u8],
    ) -> Step<bool> {
        let (_, key) = keys::decode_object(k).map_err(StoreError::from)?;
        let meta = crate::object::ObjectMeta {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            ..Default::default()
        };
        let obj = RawObject::from_parts(meta, Bytes::new());
        self.apply_delta(t, scope, indexers, record, DeltaKind::Deleted, &obj, true, None)
    }

    /// Applies one delta to the object, index and log tables. Returns whether a log entry was
    /// appended.
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
    pub(super) fn apply_delta(
        &self,
        t: &mut Tables<'_>,
        scope: ScopeId,
        indexers: &[Indexer],
        record: &mut ScopeRecord,
        kind: DeltaKind,
        obj: &RawObject,
        final_state_unknown: bool,
        packed: Option<(Bytes, Compression)>,
    ) -> Step<bool> {
        let pack = |packed: Option<(Bytes, Compression)>| -> Step<(Bytes, Compression)> {
            match packed {
                Some(p) => Ok(p),
                None => {
                    let dict = self.scope_dict_cached(scope);
                    Ok(dict::pack(self.dict.compression, dict.as_deref(), &obj.bytes).map_err(StoreError::from)?)
                }
            }
        };
        let key = obj.key();
        let okey = keys::object(scope, &key);
        // The existing row is read once; its inline bytes (only present after compaction) are
        // copied once, because the row is overwritten below. A row that does not decode is
        // replaced (or removed) all the same: the change is logged with no previous state.
        let mut damaged = false;
        let existing = match t.objects.get(okey.as_slice()).map_err(|e| self.st(e))? {
            Some(v) => match codec::decode_object(v.value()) {
                Ok((h, inline)) => {
                    let inline = if h.data == DataRef::Inline {
                        inline.to_vec()
                    } else {
                        Vec::new()
                    };
                    Some((h, inline))
                }
                Err(e) => {
                    damaged = kind != DeltaKind::Sync;
                    if damaged {
                        self.damaged_previous(scope, &key, &e);
                    }
                    None
                }
            },
            None => None,
        };
        let (prev, prev_inline): (PrevRef, &[u8]) = match &existing {
            None => (PrevRef::None, &[]),
            Some((h, inline)) => match h.data {
                DataRef::Log(s) => (PrevRef::Log(s), &[]),
                DataRef::Inline => (PrevRef::Inline(h.compression), inline.as_slice()),
            },
        };
        let seq = t.next_seq;
        match kind {
            DeltaKind::Deleted => {
                // A damaged row's own metadata is unknown: the delete's (its key, at least).
                let old_meta = match &existing {
                    Some((old, _)) => &old.meta,
                    None if damaged => &obj.meta,
                    None => return Ok(false),
                };
                let (data, compression) = if final_state_unknown {
                    (Bytes::new(), Compression::None)
                } else {
                    pack(packed)?
                };
                let rv = if final_state_unknown {
                    old_meta.resource_version.clone()
                } else {
                    obj.meta.resource_version.clone()
                };
                if self.publisher.wants(scope) {
                    // Before the rows below: readers of a group without an fsync hear of it
                    // now (see `publish`).
                    let meta = if final_state_unknown { old_meta } else { &obj.meta };
                    self.publisher.change(
                        scope,
                        Change {
                            seq: Seq(seq),
                            kind: DeltaKind::Deleted,
                            key: key.clone(),
                            meta: Arc::new(meta.clone()),
                            new: (!final_state_unknown).then(|| Bytes::copy_from_slice(&obj.bytes)),
                            values: Arc::from(Vec::new()),
                            final_state_unknown,
                            packed: None,
                        },
                    );
                }
                self.append_log(
                    t,
                    scope,
                    DeltaKind::Deleted,
                    &key,
                    rv,
                    &data,
                    !final_state_unknown,
                    compression,
                    prev,
                    prev_inline,
                    final_state_unknown,
                )?;
                t.objects.remove(okey.as_slice()).map_err(|e| self.st(e))?;
                for ix in indexers {
                    self.set_index_values(t, scope, &ix.name, &key, &[])?;
                }
                record.object_count = record.object_count.saturating_sub(1);
                Ok(true)
            }
            DeltaKind::Sync => {
                let Some((h, _)) = &existing else { return Ok(false) };
                self.append_log(
                    t,
                    scope,
                    DeltaKind::Sync,
                    &key,
                    h.meta.resource_version.clone(),
                    &[],
                    false,
                    Compression::None,
                    prev,
                    prev_inline,
                    false,
                )?;
                Ok(true)
            }
            DeltaKind::Added | DeltaKind::Updated | DeltaKind::Replaced => {
                if let Some((h, _)) = &existing {
                    if h.meta.resource_version == obj.meta.resource_version && !obj.meta.resource_version.is_empty() {
                        return Ok(false);
                    }
                }
                let stored_kind = if existing.is_some() || damaged {
                    DeltaKind::Updated
                } else {
                    DeltaKind::Added
                };
                let (data, compression) = pack(packed)?;
                let values: Vec<(&IndexName, Vec<String>)> = indexers
                    .iter()
                    // A panic of the user's function fails the whole group (nothing of it is
                    // kept or shown); the writer lives on.
                    .map(|ix| ix.values_caught(&obj.meta, &obj.bytes).map(|v| (&ix.name, v)))
                    .collect::<Result<_, _>>()?;
                if self.publisher.wants(scope) {
                    // A copy: the received bytes may be a slice of a larger buffer (a watch
                    // line, a list page) that readers would otherwise keep alive. Before the
                    // rows below: readers of a group without an fsync hear of it now.
                    self.publisher.change(
                        scope,
                        Change {
                            seq: Seq(seq),
                            kind: stored_kind,
                            key: key.clone(),
                            meta: Arc::new(obj.meta.clone()),
                            new: Some(Bytes::copy_from_slice(&obj.bytes)),
                            values: values.iter().map(|(n, v)| ((*n).clone(), v.clone())).collect(),
                            final_state_unknown: false,
                            packed: EncDict::packed(
                                self.scope_dict_cached(scope).as_deref(),
                                &data,
                                compression,
                                obj.bytes.len(),
                            ),
                        },
                    );
                }
                self.append_log(
                    t,
                    scope,
                    stored_kind,
                    &key,
                    obj.meta.resource_version.clone(),
                    &data,
                    true,
                    compression,
                    prev,
                    prev_inline,
                    false,
                )?;
                let row =
                    codec::encode_object_parts(&obj.meta, DataRef::Log(seq), compression).map_err(StoreError::from)?;
                t.objects
                    .insert(okey.as_slice(), row.as_slice())
                    .map_err(|e| self.st(e))?;
                for (name, values) in &values {
                    self.set_index_values(t, scope, name, &key, values)?;
                }
                if existing.is_none() && !damaged {
                    record.object_count += 1;
                }
                Ok(true)
            }
        }
    }

    /// Counts and reports a stored row of `key` that does not decode, met while a change
    /// replaces or removes it.
    fn damaged_previous(&self, scope: ScopeId, key: &ObjectKey, e: &codec::CodecError) {
        self.shared
            .damaged_rows
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::store::metrics::damaged_row_skipped(&self.shared.path);
        tracing::error!(%scope, %key, error = %e, "the stored version of an object does not decode: its change is logged without a previous state");
    }

    #[allow(clippy::too_many_arguments)] // mirrors the log header's fields
    pub(super) fn append_log(
        &self,
        t: &mut Tables<'_>,
        scope: ScopeId,
        kind: DeltaKind,
        key: &ObjectKey,
        rv: ResourceVersion,
        data: &[u8],
        has_data: bool,
        compression: Compression,
        prev: PrevRef,
        prev_inline: &[u8],
        final_state_unknown: bool,
    ) -> Step<()> {
        let header = LogHeader {
            scope: scope.0,
            kind,
            key: key.clone(),
            rv,
            data_len: u32::try_from(data.len()).map_err(|_| StoreError::Aborted("object larger than 4 GiB".into()))?,
            has_data,
            compression,
            prev,
            final_state_unknown,
        };
        let row = codec::encode_log(&header, data, prev_inline).map_err(StoreError::from)?;
        // Invariant 4: seqs are dense; `next_seq` is always last + 1.
        t.log.insert(t.next_seq, row.as_slice()).map_err(|e| self.st(e))?;
        t.next_seq += 1;
        Ok(())
    }

    /// Makes the index rows of `key` equal `values`, dropping stale ones through the reverse map.
    pub(super) fn set_index_values(
        &self,
        t: &mut Tables<'_>,
        scope: ScopeId,
        index: &IndexName,
        key: &ObjectKey,
        values: &[String],
    ) -> Step<()> {
        let rkey = keys::index_rev(scope, index, key);
        let old: Vec<String> = match t.index_rev.get(rkey.as_slice()).map_err(|e| self.st(e))? {
            Some(v) => codec::decode_values(v.value()).map_err(StoreError::from)?,
            None => Vec::new(),
        };
        if old == values {
            return Ok(());
        }
        for v in old.iter().filter(|v| !values.contains(v)) {
            let k = keys::index(scope, index, &v.as_str().into(), key);
            t.index.remove(k.as_slice()).map_err(|e| self.st(e))?;
        }
        for v in values.iter().filter(|v| !old.contains(v)) {
            let k = keys::index(scope, index, &v.as_str().into(), key);
            t.index.insert(k.as_slice(), ()).map_err(|e| self.st(e))?;
        }
        if values.is_empty() {
            t.index_rev.remove(rkey.as_slice()).map_err(|e| self.st(e))?;
        } else {
            let enc = codec::encode_values(values).map_err(StoreError::from)?;
            t.index_rev
                .insert(rkey.as_slice(), enc.as_slice())
                .map_err(|e| self.st(e))?;
        }
        Ok(())
    }
}

/// The tables a delta touches, opened once per command.
pub(super) struct Tables<'t> {
    pub(super) objects: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(super) log: redb::Table<'t, u64, &'static [u8]>,
    pub(super) index: redb::Table<'t, &'static [u8], ()>,
    pub(super) index_rev: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(super) next_seq: u64,
    pub(super) seq_cell: &'t Cell<u64>,
}

impl<'t> Tables<'t> {
    pub(super) fn open(w: &'t WriterThread, txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            objects: txn.open_table(OBJECTS).map_err(|e| w.st(e))?,
            log: txn.open_table(LOG).map_err(|e| w.st(e))?,
            index: txn.open_table(INDEX).map_err(|e| w.st(e))?,
            index_rev: txn.open_table(INDEX_REV).map_err(|e| w.st(e))?,
            next_seq: w.next_seq.get(),
            seq_cell: &w.next_seq,
        })
    }
}

impl Drop for Tables<'_> {
    fn drop(&mut self) {
        // Seqs only move forward within a group, even when compaction empties the log
        // (invariant 4); only a rolled-back group hands its seqs out again.
        debug_assert!(self.next_seq >= self.seq_cell.get(), "log seqs moved back");
        self.seq_cell.set(self.next_seq);
    }
}
