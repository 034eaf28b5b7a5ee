//! The migration driver: applies the numbered steps of `migrations/` oldest to newest, in one
//! transaction, on open. A database from a newer schema is refused.

use redb::ReadableDatabase;

use super::schema::{META, META_CREATED_BY, META_SCHEMA_VERSION};
use super::{Shared, StoreError};

#[path = "../../migrations/m0001_initial.rs"]
mod m0001_initial;
#[path = "../../migrations/m0002_dicts.rs"]
mod m0002_dicts;
#[path = "../../migrations/m0003_retention_backfill.rs"]
mod m0003_retention_backfill;

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
];

/// The schema version after every step ran.
pub(crate) const LATEST: u32 = STEPS.len() as u32;

fn read_version(shared: &Shared) -> Result<u32, StoreError> {
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
