//! Relist: staging the listed objects and diffing them against the store.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{ReadableTable, WriteTransaction};

use super::super::codec::{self, Compression, DataRef, DeltaKind, ObjectHeader};
use super::super::schema::{keys, ScopeId, Seq, OBJECTS, RELIST};
use super::super::StoreError;
use super::{Failure, RelistSummary, Step, Tables, WriterThread};
use crate::object::{RawObject, ResourceVersion};

impl WriterThread {
    pub(super) fn stage(&self, txn: &WriteTransaction, scope: ScopeId, objs: Vec<RawObject>) -> Step<()> {
        self.load_scope(txn, scope)?;
        for o in &objs {
            o.key().validate().map_err(|e| Failure::Refused(e.into()))?;
        }
        let mut relist = txn.open_table(RELIST).map_err(|e| self.st(e))?;
        for o in objs {
            let header = ObjectHeader {
                meta: o.meta.clone(),
                data: DataRef::Inline,
                compression: Compression::None,
            };
            let row = codec::encode_object(&header, Some(&o.bytes)).map_err(StoreError::from)?;
            relist
                .insert(keys::object(scope, &o.key()).as_slice(), row.as_slice())
                .map_err(|e| self.st(e))?;
        }
        Ok(())
    }

    pub(super) fn clear_staged(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<()> {
        let mut relist = txn.open_table(RELIST).map_err(|e| self.st(e))?;
        let (start, end) = keys::scope_range(scope);
        relist
            .retain_in::<&[u8], _>(start.as_slice()..end.as_slice(), |_, _| false)
            .map_err(|e| self.st(e))?;
        Ok(())
    }

    pub(super) fn finish_relist(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        rv: ResourceVersion,
        reason: &str,
    ) -> Step<RelistSummary> {
        let mut record = self.load_scope(txn, scope)?;
        let indexers = self.shared.indexes.for_scope(scope);
        let (start, end) = keys::scope_range(scope);
        let range = start.as_slice()..end.as_slice();
        // Stored objects' RVs, to diff against; keys only, so memory stays proportional to the
        // number of keys, not their bytes.
        // `None`: a damaged row, replaced by what was listed (or deleted) whatever its RV.
        let mut stored: HashMap<Vec<u8>, Option<ResourceVersion>> = HashMap::new();
        {
            let objects = txn.open_table(OBJECTS).map_err(|e| self.st(e))?;
            for row in objects.range::<&[u8]>(range.clone()).map_err(|e| self.st(e))? {
                let (k, v) = row.map_err(|e| self.st(e))?;
                let rv = codec::decode_object(v.value())
                    .ok()
                    .map(|(h, _)| h.meta.resource_version);
                stored.insert(k.value().to_vec(), rv);
            }
        }
        let mut summary = RelistSummary::default();
        // Loads the scope's dictionary for `apply_delta` (relisted objects do not train one).
        self.scope_dict(txn, scope, &[])?;
        let relist = txn.open_table(RELIST).map_err(|e| self.st(e))?;
        let mut t = Tables::open(self, txn)?;
        for row in relist.range::<&[u8]>(range.clone()).map_err(|e| self.st(e))? {
            let (k, v) = row.map_err(|e| self.st(e))?;
            let (h, inline) = codec::decode_object(v.value()).map_err(StoreError::from)?;
            match stored.remove(k.value()) {
                Some(Some(old_rv)) if old_rv == h.meta.resource_version => summary.unchanged += 1,
                seen => {
                    let obj = RawObject::from_parts(h.meta, bytes::Bytes::copy_from_slice(inline));
                    self.apply_delta(
                        &mut t,
                        scope,
                        &indexers,
                        &mut record,
                        DeltaKind::Replaced,
                        &obj,
                        false,
                        None,
                    )?;
                    if seen.is_some() {
                        summary.updated += 1;
                    } else {
                        summary.added += 1;
                    }
                }
            }
        }
        drop(relist);
        // What was stored but not listed was deleted while we were not watching.
        let mut gone: Vec<Vec<u8>> = stored.into_keys().collect();
        gone.sort();
        for k in gone {
            self.delete_stored(&mut t, scope, &indexers, &mut record, &k)?;
            summary.deleted += 1;
        }
        summary.seq = Seq(t.next_seq.saturating_sub(1));
        drop(t);
        self.clear_staged(txn, scope)?;
        if record.synced {
            record.relist_count += 1;
        }
        record.rv = Some(rv);
        record.synced = true;
        record.last_relist_reason = Some(reason.to_owned());
        record.last_relist_at_ms = Some(now_ms());
        self.save_scope(txn, scope, &record)?;
        // The relist listed the whole shard range: nothing added by a change is left to fetch.
        self.shard_fetched(txn, scope)?;
        Ok(summary)
    }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
