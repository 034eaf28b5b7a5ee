//! The migration driver: applies the numbered steps of `migrations/` oldest to newest, in one
//! transaction, on open. A database from a newer schema is refused.

use super::schema::{META, META_CREATED_BY, META_SCHEMA_VERSION};
use super::{Shared, StoreError};

#[path = "../../migrations/m0001_initial.rs"]
mod m0001_initial;
#[path = "../../migrations/m0002_dicts.rs"]
mod m0002_dicts;
#[path = "../../migrations/m0003_retention_backfill.rs"]
mod m0003_retention_backfill;
#[path = "../../migrations/m0004_scoped_cursors.rs"]
mod m0004_scoped_cursors;
#[path = "../../migrations/m0005_scope_shards.rs"]
mod m0005_scope_shards;

/// What a step may need besides the transaction.
struct Context {
    /// The store clock's "now" (unix milliseconds), the same for every step of one run.
    now_ms: u64,
}

type Step = fn(&redb::WriteTransaction, &Context) -> Result<(), redb::Error>;

/// Every step, in order; step `i` upgrades schema `i` to `i + 1`.
const STEPS: &[Step] = &[
    |txn, _| m0001_initial::up(txn),
    |txn, _| m0002_dicts::up(txn),
    |txn, cx| m0003_retention_backfill::up(txn, cx.now_ms),
    |txn, _| m0004_scoped_cursors::up(txn),
    |txn, _| m0005_scope_shards::up(txn),
];

/// The schema version after every step ran.
pub(crate) const LATEST: u32 = STEPS.len() as u32;

pub(crate) fn read_version(shared: &Shared) -> Result<u32, StoreError> {
    let txn = shared.db()?.begin_read().map_err(|e| shared.storage(e))?;
    let table = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(shared.storage(e)),
    };
    let Some(v) = table.get(META_SCHEMA_VERSION).map_err(|e| shared.storage(e))? else {
        return Ok(0);
    };
    let bytes = v.value();
    let arr: [u8; 4] = bytes.try_into().map_err(|_| StoreError::Corrupted {
        path: shared.path.clone(),
        detail: format!("schema version has {} bytes, expected 4", bytes.len()),
    })?;
    Ok(u32::from_be_bytes(arr))
}

/// Brings the database to [`LATEST`].
pub(crate) fn run(shared: &Shared) -> Result<(), StoreError> {
    run_steps(shared, STEPS)
}

/// Applies `steps[found..]` and records the version `steps.len()`, all in one transaction: a
/// failing step leaves the database at the version it had.
fn run_steps(shared: &Shared, steps: &[Step]) -> Result<(), StoreError> {
    let latest = u32::try_from(steps.len()).unwrap_or(u32::MAX);
    let found = read_version(shared)?;
    if found > latest {
        return Err(StoreError::NewerSchema {
            path: shared.path.clone(),
            found,
            supported: latest,
        });
    }
    if found == latest {
        return Ok(());
    }
    let cx = Context {
        now_ms: shared.config.now_ms(),
    };
    let txn = shared.db()?.begin_write().map_err(|e| shared.storage(e))?;
    for step in &steps[found as usize..] {
        step(&txn, &cx).map_err(|e| shared.storage(e))?;
    }
    {
        let mut meta = txn.open_table(META).map_err(|e| shared.storage(e))?;
        meta.insert(META_SCHEMA_VERSION, latest.to_be_bytes().as_slice())
            .map_err(|e| shared.storage(e))?;
        if found == 0 {
            meta.insert(META_CREATED_BY, env!("CARGO_PKG_VERSION").as_bytes())
                .map_err(|e| shared.storage(e))?;
        }
    }
    txn.commit().map_err(|e| shared.storage(e))?;
    tracing::info!(path = %shared.path.display(), from = found, to = latest, "database schema migrated");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, RwLock};

    use super::*;
    use crate::store::schema::{COMMIT_TIMES, CURSORS, CURSORS_V1, LOG, SCOPES};
    use crate::store::StoreConfig;

    fn shared(path: &std::path::Path) -> Shared {
        let config = StoreConfig::new(path);
        let fence = Arc::default();
        let db = crate::store::open_database(&config, &fence).unwrap();
        Shared {
            db: RwLock::new(Some(Arc::new(crate::store::DbHandle::Rw(db)))),
            path: path.to_owned(),
            indexes: Default::default(),
            dicts: Default::default(),
            config,
            damaged_rows: Default::default(),
            memory: Arc::new(crate::store::MemoryBudget::new(usize::MAX)),
            fence,
        }
    }

    const PROBE: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("probe");

    #[test]
    fn a_failing_step_leaves_the_database_at_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(&dir.path().join("db.redb"));
        let failing: &[Step] = &[
            |txn, cx| m0001_initial::up(txn).and_then(|()| m0003_retention_backfill::up(txn, cx.now_ms)),
            |txn, _| {
                txn.open_table(PROBE)?;
                Err(redb::Error::TransactionInProgress)
            },
        ];
        assert!(run_steps(&shared, failing).is_err());
        assert_eq!(read_version(&shared).unwrap(), 0);
        let txn = shared.db().unwrap().begin_read().unwrap();
        // Neither the first step's tables nor the second's exist: one transaction.
        assert!(txn.open_table(META).is_err());
        assert!(txn.open_table(PROBE).is_err());
    }

    #[test]
    fn steps_run_oldest_to_newest_and_date_the_existing_log_once() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(&dir.path().join("db.redb"));
        // A v2 database holding three log entries.
        run_steps(&shared, &STEPS[..2]).unwrap();
        {
            let txn = shared.db().unwrap().begin_write().unwrap();
            {
                let mut log = txn.open_table(LOG).unwrap();
                for seq in 7..10u64 {
                    log.insert(seq, b"x".as_slice()).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        assert_eq!(read_version(&shared).unwrap(), 2);
        run(&shared).unwrap();
        assert_eq!(read_version(&shared).unwrap(), LATEST);
        let txn = shared.db().unwrap().begin_read().unwrap();
        let times = txn.open_table(COMMIT_TIMES).unwrap();
        let rows: Vec<u64> = redb::ReadableTable::iter(&times)
            .unwrap()
            .map(|r| r.unwrap().0.value())
            .collect();
        assert_eq!(rows, vec![7]);
    }

    /// A v3 database with `scopes` scope rows and two name-only cursors, migrated to the latest
    /// schema; returns the cursor rows after the upgrade.
    fn migrate_v3_cursors(scopes: u32) -> Vec<((u32, String), u64)> {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(&dir.path().join("db.redb"));
        run_steps(&shared, &STEPS[..3]).unwrap();
        {
            let txn = shared.db().unwrap().begin_write().unwrap();
            {
                let mut table = txn.open_table(SCOPES).unwrap();
                for id in 1..=scopes {
                    table.insert(id + 6, b"record".as_slice()).unwrap();
                }
                let mut old = txn.open_table(CURSORS_V1).unwrap();
                old.insert("pods-handler", 41).unwrap();
                old.insert("cms-handler", 17).unwrap();
            }
            txn.commit().unwrap();
        }
        run(&shared).unwrap();
        assert_eq!(read_version(&shared).unwrap(), LATEST);
        let txn = shared.db().unwrap().begin_read().unwrap();
        assert!(
            matches!(txn.open_table(CURSORS_V1), Err(redb::TableError::TableDoesNotExist(_))),
            "the name-only table is gone"
        );
        let cursors = txn.open_table(CURSORS).unwrap();
        redb::ReadableTable::iter(&cursors)
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                let (scope, name) = k.value();
                ((scope, name.to_owned()), v.value())
            })
            .collect()
    }

    #[test]
    fn name_only_cursors_move_to_the_single_scope() {
        assert_eq!(
            migrate_v3_cursors(1),
            vec![
                ((7, "cms-handler".to_owned()), 17),
                ((7, "pods-handler".to_owned()), 41)
            ]
        );
    }

    #[test]
    fn name_only_cursors_are_dropped_when_no_single_scope_owns_them() {
        // Which scope a name served is unknown: the handlers restart with synthetic adds
        // rather than resume from a position that may belong to another informer.
        assert_eq!(migrate_v3_cursors(2), vec![]);
        assert_eq!(migrate_v3_cursors(0), vec![]);
    }
}
