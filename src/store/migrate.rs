//! The migration driver: applies the numbered steps of `migrations/` oldest to newest, in one
//! transaction, on open. A database from a newer schema is refused.

use redb::ReadableDatabase;

use super::schema::{META, META_CREATED_BY, META_SCHEMA_VERSION};
use super::{Shared, StoreError};

#[path = "../../migrations/m0001_initial.rs"]
mod m0001_initial;
#[path = "../../migrations/m0002_dicts.rs"]
mod m0002_dicts;

type Step = fn(&redb::WriteTransaction) -> Result<(), redb::Error>;

/// Every step, in order; step `i` upgrades schema `i` to `i + 1`.
const STEPS: &[Step] = &[m0001_initial::up, m0002_dicts::up];

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
    let found = read_version(shared)?;
    if found > LATEST {
        return Err(StoreError::NewerSchema {
            path: shared.path.clone(),
            found,
            supported: LATEST,
        });
    }
    if found == LATEST {
        return Ok(());
    }
    let txn = shared.db()?.begin_write().map_err(|e| shared.storage(e))?;
    for step in &STEPS[found as usize..] {
        step(&txn).map_err(|e| shared.storage(e))?;
    }
    {
        let mut meta = txn.open_table(META).map_err(|e| shared.storage(e))?;
        meta.insert(META_SCHEMA_VERSION, LATEST.to_be_bytes().as_slice())
            .map_err(|e| shared.storage(e))?;
        if found == 0 {
            meta.insert(META_CREATED_BY, env!("CARGO_PKG_VERSION").as_bytes())
                .map_err(|e| shared.storage(e))?;
        }
    }
    txn.commit().map_err(|e| shared.storage(e))?;
    tracing::info!(path = %shared.path.display(), from = found, to = LATEST, "database schema migrated");
    Ok(())
}
