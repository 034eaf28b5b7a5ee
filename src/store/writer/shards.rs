//! Shard ranges: changing a scope's range (dropping what it no longer owns) and recording what
//! is left to fetch, in the transaction of the change.

use redb::{ReadableTable, WriteTransaction};

use super::super::codec::{self, ShardRecord};
use super::super::rules::in_shard;
use super::super::schema::{keys, ScopeId, Seq, OBJECTS, SHARDS};
use super::super::StoreError;
use super::{RelistSummary, Step, Tables, WriterThread};

impl WriterThread {
    pub(super) fn load_shard(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<ShardRecord> {
        let shards = txn.open_table(SHARDS).map_err(|e| self.st(e))?;
        let row = shards.get(scope.0).map_err(|e| self.st(e))?;
        Ok(match row {
            Some(v) => codec::decode_shard(v.value()).map_err(StoreError::from)?,
            None => ShardRecord::default(),
        })
    }

    pub(super) fn save_shard(&self, txn: &WriteTransaction, scope: ScopeId, record: &ShardRecord) -> Step<()> {
        let mut shards = txn.open_table(SHARDS).map_err(|e| self.st(e))?;
        if *record == ShardRecord::default() {
            shards.remove(scope.0).map_err(|e| self.st(e))?;
        } else {
            let row = codec::encode_shard(record).map_err(StoreError::from)?;
            shards.insert(scope.0, row.as_slice()).map_err(|e| self.st(e))?;
        }
        Ok(())
    }

    /// Gives the scope the shard `record`: every stored object outside `record.range` is
    /// deleted (a log entry each, published on the change stream, so caches and handlers hear
    /// of it, with index rows updated) and the record saved, all in this transaction, so no state mixes two ranges.
    pub(super) fn change_shard(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        record: &ShardRecord,
    ) -> Step<RelistSummary> {
        let mut scope_record = self.load_scope(txn, scope)?;
        let mut summary = RelistSummary::default();
        if let Some(range) = &record.range {
            let (start, end) = keys::scope_range(scope);
            // Keys only: memory stays proportional to what leaves, not to the objects' bytes.
            let mut leaving = Vec::new();
            {
                let objects = txn.open_table(OBJECTS).map_err(|e| self.st(e))?;
                for row in objects
                    .range::<&[u8]>(start.as_slice()..end.as_slice())
                    .map_err(|e| self.st(e))?
                {
                    let (k, v) = row.map_err(|e| self.st(e))?;
                    let (h, _) = codec::decode_object(v.value()).map_err(StoreError::from)?;
                    if in_shard(range, &h.meta) {
                        summary.unchanged += 1;
                    } else {
                        leaving.push(k.value().to_vec());
                    }
                }
            }
            let indexers = self.shared.indexes.for_scope(scope);
            let mut t = Tables::open(self, txn)?;
            for k in leaving {
                // As a relist's deletes: the final state is the stored one (the object still
                // exists on the server, in another shard).
                self.delete_stored(&mut t, scope, &indexers, &mut scope_record, &k)?;
                summary.deleted += 1;
            }
        }
        summary.seq = Seq(self.next_seq.get().saturating_sub(1));
        self.save_scope(txn, scope, &scope_record)?;
        self.save_shard(txn, scope, record)?;
        Ok(summary)
    }

    /// The ranges a change added are fetched: forget them.
    pub(super) fn shard_fetched(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<()> {
        let mut record = self.load_shard(txn, scope)?;
        if record.pending.take().is_some() {
            self.save_shard(txn, scope, &record)?;
        }
        Ok(())
    }
}
