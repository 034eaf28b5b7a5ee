//! Scope records, cursors, the cluster identity and scope resets.

use redb::{ReadableTable, WriteTransaction};

use super::super::codec::{self, ScopeRecord};
use super::super::schema::{
    keys, ScopeId, Seq, CURSORS, INDEX, INDEX_REV, META, META_CLUSTER_IDENTITY, OBJECTS, RELIST, SCOPES, SCOPE_NAMES,
};
use super::super::StoreError;
use super::{Failure, Step, WriterThread};

impl WriterThread {
    pub(super) fn register_scope(&self, txn: &WriteTransaction, spec: &str) -> Step<ScopeId> {
        let mut names = txn.open_table(SCOPE_NAMES).map_err(|e| self.st(e))?;
        if let Some(id) = names.get(spec).map_err(|e| self.st(e))? {
            return Ok(ScopeId(id.value()));
        }
        let mut scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
        let next = scopes.last().map_err(|e| self.st(e))?.map_or(1, |(k, _)| k.value() + 1);
        let record = ScopeRecord {
            spec: spec.to_owned(),
            ..ScopeRecord::default()
        };
        let encoded = codec::encode_scope(&record).map_err(StoreError::from)?;
        scopes.insert(next, encoded.as_slice()).map_err(|e| self.st(e))?;
        names.insert(spec, next).map_err(|e| self.st(e))?;
        Ok(ScopeId(next))
    }

    pub(super) fn load_scope(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<ScopeRecord> {
        let scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
        let Some(v) = scopes.get(scope.0).map_err(|e| self.st(e))? else {
            return Err(Failure::Refused(StoreError::UnknownScope(scope)));
        };
        Ok(codec::decode_scope(v.value()).map_err(StoreError::from)?)
    }

    pub(super) fn save_scope(&self, txn: &WriteTransaction, scope: ScopeId, record: &ScopeRecord) -> Step<()> {
        let mut scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
        let encoded = codec::encode_scope(record).map_err(StoreError::from)?;
        scopes.insert(scope.0, encoded.as_slice()).map_err(|e| self.st(e))?;
        Ok(())
    }

    pub(super) fn set_cursor(&self, txn: &WriteTransaction, scope: ScopeId, name: &str, seq: Seq) -> Step<()> {
        // A cursor past the log would skip entries handed out after it (a rolled-back seq is
        // handed out again): refused. The group is durable, so the cursor and everything up
        // to it reach the disk together.
        let last = Seq(self.next_seq.get().saturating_sub(1));
        if seq > last {
            return Err(Failure::Refused(StoreError::CursorPastLog { cursor: seq, last }));
        }
        let mut cursors = txn.open_table(CURSORS).map_err(|e| self.st(e))?;
        cursors.insert((scope.0, name), seq.0).map_err(|e| self.st(e))?;
        Ok(())
    }

    pub(super) fn delete_cursor(&self, txn: &WriteTransaction, scope: ScopeId, name: &str) -> Step<()> {
        let mut cursors = txn.open_table(CURSORS).map_err(|e| self.st(e))?;
        cursors.remove((scope.0, name)).map_err(|e| self.st(e))?;
        Ok(())
    }

    pub(super) fn identity(&self, txn: &WriteTransaction, identity: &str, reset: bool) -> Step<bool> {
        let stored = {
            let meta = txn.open_table(META).map_err(|e| self.st(e))?;
            let v = meta.get(META_CLUSTER_IDENTITY).map_err(|e| self.st(e))?;
            v.map(|v| String::from_utf8_lossy(v.value()).into_owned())
        };
        match stored {
            Some(s) if same_cluster(&s, identity) => return Ok(false),
            Some(s) if !reset => {
                return Err(Failure::Refused(StoreError::ClusterMismatch {
                    stored: s,
                    found: identity.to_owned(),
                }))
            }
            _ => {}
        }
        let wiped = if stored.is_some() {
            // Another cluster's data must not leak into this one: wipe every scope's state.
            let ids: Vec<u32> = {
                let scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
                scopes
                    .iter()
                    .map_err(|e| self.st(e))?
                    .map(|r| r.map(|(k, _)| k.value()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| self.st(e))?
            };
            for id in ids {
                self.reset_scope(txn, ScopeId(id))?;
            }
            true
        } else {
            false
        };
        let mut meta = txn.open_table(META).map_err(|e| self.st(e))?;
        meta.insert(META_CLUSTER_IDENTITY, identity.as_bytes())
            .map_err(|e| self.st(e))?;
        Ok(wiped)
    }

    pub(super) fn reset_scope(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<()> {
        let mut record = self.load_scope(txn, scope)?;
        let (start, end) = keys::scope_range(scope);
        let range = start.as_slice()..end.as_slice();
        for table in [OBJECTS, INDEX_REV, RELIST] {
            let mut t = txn.open_table(table).map_err(|e| self.st(e))?;
            t.retain_in::<&[u8], _>(range.clone(), |_, _| false)
                .map_err(|e| self.st(e))?;
        }
        let mut index = txn.open_table(INDEX).map_err(|e| self.st(e))?;
        index
            .retain_in::<&[u8], _>(range, |_, _| false)
            .map_err(|e| self.st(e))?;
        self.publisher.reset(scope);
        // Nothing is held, so nothing added by a shard change is left to fetch (the next
        // list fetches the whole range).
        self.shard_fetched(txn, scope)?;
        record.rv = None;
        record.synced = false;
        record.object_count = 0;
        self.save_scope(txn, scope, &record)
    }
}

/// Whether two cluster identities (`<kube-system UID>@<server URL>`, see `KubeSource`) name one
/// cluster: equal strings, or the same non-empty UID whatever the URLs (a source built from a
/// client alone knows no URL; one cluster may sit behind two addresses).
fn same_cluster(stored: &str, found: &str) -> bool {
    if stored == found {
        return true;
    }
    let uid = |id: &'_ str| id.split_once('@').map(|(uid, _)| uid.to_owned());
    match (uid(stored), uid(found)) {
        (Some(a), Some(b)) => !a.is_empty() && a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::same_cluster;

    #[test]
    fn one_uid_is_one_cluster_whatever_the_url() {
        assert!(same_cluster("u1@https://a", "u1@https://a"));
        assert!(same_cluster("u1@https://a", "u1@"));
        assert!(same_cluster("u1@", "u1@https://b"));
        assert!(!same_cluster("u1@https://a", "u2@https://a"));
        // URL-only identities (no access to kube-system) must match exactly.
        assert!(!same_cluster("@https://a", "@https://b"));
        assert!(!same_cluster("@https://a", "u1@https://a"));
        assert!(same_cluster("@https://a", "@https://a"));
        // Identities of other sources (replay, tests) compare as strings.
        assert!(!same_cluster("replay", "other"));
    }
}
