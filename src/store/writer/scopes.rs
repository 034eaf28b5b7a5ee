//! Scope records, cursors, the cluster identity, scope resets, and the scopes' lifecycle: when
//! each was last used, dropping one, and dropping those unused for a configured period.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redb::{ReadableTable, WriteTransaction};

use super::super::codec::{self, ScopeRecord};
use super::super::schema::{
    keys, ScopeId, Seq, CURSORS, INDEX, INDEX_BACKFILL, INDEX_REV, META, META_CLUSTER_IDENTITY, META_SCOPE_ID_HIGH,
    OBJECTS, RELIST, SCOPES, SCOPE_NAMES, SCOPE_USE, SHARDS,
};
use super::super::StoreError;
use super::{Failure, ScopeRegistration, Step, WriterThread};
use crate::object::ScopeSpec;

/// Longest time between two records of "still in use" for the scopes this process registered.
const TOUCH_EVERY: Duration = Duration::from_secs(600);

/// The writer's side of the scopes' lifecycle.
pub(in crate::store) struct ScopeLife {
    /// `StoreConfig::drop_unused_scopes_after`.
    unused_after: Option<Duration>,
    /// Scopes registered through this store since it was opened: in use, never dropped.
    in_use: RefCell<BTreeSet<u32>>,
    /// When last use is next recorded (and unused scopes looked for).
    next_due: Cell<Instant>,
}

impl ScopeLife {
    pub(in crate::store) fn new(unused_after: Option<Duration>) -> Self {
        Self {
            unused_after,
            in_use: RefCell::default(),
            // The first look is right after open: a scope unused for the period is dropped
            // before an informer of this process could register it again.
            next_due: Cell::new(Instant::now()),
        }
    }

    fn every(&self) -> Duration {
        self.unused_after
            .map_or(TOUCH_EVERY, |d| (d / 10).clamp(Duration::from_secs(1), TOUCH_EVERY))
    }

    /// How long until the next look.
    pub(in crate::store) fn due_in(&self) -> Duration {
        self.next_due.get().saturating_duration_since(Instant::now())
    }
}

impl WriterThread {
    pub(super) fn register_scope(&self, txn: &WriteTransaction, spec: &str) -> Step<ScopeRegistration> {
        let mut names = txn.open_table(SCOPE_NAMES).map_err(|e| self.st(e))?;
        let found = names.get(spec).map_err(|e| self.st(e))?.map(|v| v.value());
        let mut left_behind = Vec::new();
        let id = if let Some(id) = found {
            id
        } else {
            let mut scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
            let after_last = scopes.last().map_err(|e| self.st(e))?.map_or(1, |(k, _)| k.value() + 1);
            // Never the id of a dropped scope: its log entries would read as the new one's.
            let next = after_last.max(self.scope_id_high(txn)? + 1);
            left_behind = self.scopes_like(&scopes, spec)?;
            let record = ScopeRecord {
                spec: spec.to_owned(),
                ..ScopeRecord::default()
            };
            let encoded = codec::encode_scope(&record).map_err(StoreError::from)?;
            scopes.insert(next, encoded.as_slice()).map_err(|e| self.st(e))?;
            names.insert(spec, next).map_err(|e| self.st(e))?;
            next
        };
        let mut used = txn.open_table(SCOPE_USE).map_err(|e| self.st(e))?;
        used.insert(id, self.shared.config.now_ms()).map_err(|e| self.st(e))?;
        self.upkeep.scopes.in_use.borrow_mut().insert(id);
        for (old, record) in &left_behind {
            tracing::warn!(
                new = spec,
                %old,
                old_spec = %record.spec,
                objects = record.object_count,
                "a new scope of a resource another scope of the database holds: unless an informer still uses the old one, it stays in the file until dropped (durable-informer scopes drop, or StoreConfig::drop_unused_scopes_after)"
            );
        }
        Ok(ScopeRegistration {
            scope: ScopeId(id),
            created: found.is_none(),
            left_behind,
        })
    }

    /// The scopes of the same group, resource and namespace as `spec` (any version or
    /// selectors) that this process has not registered.
    fn scopes_like(
        &self,
        scopes: &impl ReadableTable<u32, &'static [u8]>,
        spec: &str,
    ) -> Step<Vec<(ScopeId, ScopeRecord)>> {
        let Some(wanted) = ScopeSpec::from_canonical(spec) else {
            return Ok(Vec::new());
        };
        let in_use = self.upkeep.scopes.in_use.borrow();
        let mut out = Vec::new();
        for row in scopes.iter().map_err(|e| self.st(e))? {
            let (k, v) = row.map_err(|e| self.st(e))?;
            if in_use.contains(&k.value()) {
                continue;
            }
            // A record that does not decode is `check`'s to report, not this one's.
            let Ok(record) = codec::decode_scope(v.value()) else {
                continue;
            };
            let Some(other) = ScopeSpec::from_canonical(&record.spec) else {
                continue;
            };
            if (&other.group, &other.resource, &other.namespace) == (&wanted.group, &wanted.resource, &wanted.namespace)
            {
                out.push((ScopeId(k.value()), record));
            }
        }
        Ok(out)
    }

    /// The highest scope id ever handed out (0 for none), dropped scopes included.
    fn scope_id_high(&self, txn: &WriteTransaction) -> Step<u32> {
        let meta = txn.open_table(META).map_err(|e| self.st(e))?;
        let high = meta.get(META_SCOPE_ID_HIGH).map_err(|e| self.st(e))?;
        Ok(high
            .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
            .map_or(0, u32::from_be_bytes))
    }

    /// Removes a scope: its record, objects, indexes, staged relist, cursors, shard and use
    /// records. Its log entries stay until retention removes them (the log is dense), and so do
    /// the dictionaries they are compressed with; its id is never handed out again.
    pub(super) fn drop_scope(&self, txn: &WriteTransaction, scope: ScopeId) -> Step<()> {
        if self.upkeep.scopes.in_use.borrow().contains(&scope.0) {
            return Err(Failure::Refused(StoreError::ScopeInUse(scope)));
        }
        let record = self.load_scope(txn, scope)?;
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
        self.remove_scope_rows(txn, CURSORS, scope)?;
        self.remove_scope_rows(txn, INDEX_BACKFILL, scope)?;
        let mut shards = txn.open_table(SHARDS).map_err(|e| self.st(e))?;
        shards.remove(scope.0).map_err(|e| self.st(e))?;
        let mut used = txn.open_table(SCOPE_USE).map_err(|e| self.st(e))?;
        used.remove(scope.0).map_err(|e| self.st(e))?;
        let mut names = txn.open_table(SCOPE_NAMES).map_err(|e| self.st(e))?;
        names.remove(record.spec.as_str()).map_err(|e| self.st(e))?;
        let mut scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
        scopes.remove(scope.0).map_err(|e| self.st(e))?;
        let high = self.scope_id_high(txn)?.max(scope.0);
        let mut meta = txn.open_table(META).map_err(|e| self.st(e))?;
        meta.insert(META_SCOPE_ID_HIGH, high.to_be_bytes().as_slice())
            .map_err(|e| self.st(e))?;
        self.publisher.reset(scope);
        tracing::info!(
            %scope,
            spec = %record.spec,
            objects = record.object_count,
            "dropped scope (its log entries stay until retention removes them)"
        );
        Ok(())
    }

    /// Removes every `(scope, name)` row of `scope` from `table`.
    fn remove_scope_rows<V: redb::Value + 'static>(
        &self,
        txn: &WriteTransaction,
        table: redb::TableDefinition<(u32, &str), V>,
        scope: ScopeId,
    ) -> Step<()> {
        let mut t = txn.open_table(table).map_err(|e| self.st(e))?;
        let mut names = Vec::new();
        for row in t.range((scope.0, "")..).map_err(|e| self.st(e))? {
            let (k, _) = row.map_err(|e| self.st(e))?;
            let (s, name) = k.value();
            if s != scope.0 {
                break;
            }
            names.push(name.to_owned());
        }
        for name in names {
            t.remove((scope.0, name.as_str())).map_err(|e| self.st(e))?;
        }
        Ok(())
    }

    /// Whether it is time to record use of this process's scopes (and drop unused ones).
    pub(super) fn scope_life_due(&self) -> bool {
        self.upkeep.scopes.due_in().is_zero()
    }

    /// Records that this process's scopes are still in use and, with
    /// `StoreConfig::drop_unused_scopes_after`, drops the scopes unused for longer, each in a
    /// transaction of its own. A scope with no use recorded (written before use was) starts
    /// its period now.
    pub(super) fn scope_life_step(&self) {
        let life = &self.upkeep.scopes;
        life.next_due.set(Instant::now() + life.every());
        let now = self.shared.config.now_ms();
        let stale = self.maintenance(|txn| {
            let ids: Vec<u32> = {
                let scopes = txn.open_table(SCOPES).map_err(|e| self.st(e))?;
                scopes
                    .iter()
                    .map_err(|e| self.st(e))?
                    .map(|r| r.map(|(k, _)| k.value()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| self.st(e))?
            };
            let mut used = txn.open_table(SCOPE_USE).map_err(|e| self.st(e))?;
            let mut stale = Vec::new();
            for id in ids {
                let last = used.get(id).map_err(|e| self.st(e))?.map(|v| v.value());
                if life.in_use.borrow().contains(&id) || last.is_none() {
                    used.insert(id, now).map_err(|e| self.st(e))?;
                } else if let (Some(last), Some(after)) = (last, life.unused_after) {
                    let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
                    if now.saturating_sub(last) > after_ms {
                        stale.push((ScopeId(id), last));
                    }
                }
            }
            Ok(stale)
        });
        let stale = match stale {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "recording the scopes' last use failed");
                return;
            }
        };
        for (scope, last) in stale {
            if let Err(e) = self.structural_maintenance(|txn| self.drop_scope(txn, scope)) {
                tracing::warn!(%scope, error = %e, "dropping an unused scope failed");
            } else {
                crate::store::metrics::scope_dropped(&self.shared.path);
                tracing::warn!(%scope, last_used_ms = last, "dropped a scope unused for longer than drop_unused_scopes_after");
            }
        }
    }

    /// The store is closing: its scopes were in use until now.
    pub(super) fn scope_life_close(&self) {
        if self.upkeep.scopes.in_use.borrow().is_empty() || self.commit.poisoned.get() {
            return;
        }
        let now = self.shared.config.now_ms();
        let ids: Vec<u32> = self.upkeep.scopes.in_use.borrow().iter().copied().collect();
        let done = self.maintenance(|txn| {
            let mut used = txn.open_table(SCOPE_USE).map_err(|e| self.st(e))?;
            for id in ids {
                used.insert(id, now).map_err(|e| self.st(e))?;
            }
            Ok(())
        });
        if let Err(e) = done {
            tracing::warn!(error = %e, "recording the scopes' last use at close failed");
        }
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

    pub(super) fn set_cursor(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        name: &str,
        seq: Seq,
        seen: Option<u64>,
    ) -> Step<()> {
        // A cursor read before a rollback may name seqs handed out again since, which the
        // consumer has not seen: refused (checked here, on the thread that rolls back).
        if seen.is_some_and(|n| n != self.publisher.rollbacks()) {
            return Err(Failure::Refused(StoreError::CursorRolledBack { cursor: seq }));
        }
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
