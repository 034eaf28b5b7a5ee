//! Schema v4: durable cursors keyed by (scope, name) in `scope_cursors`, replacing `cursors`
//! (keyed by name only, so two informers of one database with the same handler name
//! overwrote each other's cursor).
//!
//! Old rows move only when the database has exactly one scope: then every cursor belonged to
//! it. With several scopes (or none) nothing tells which scope a name served, and the stored
//! value may be another informer's position, ahead of what the handler really handled. Such
//! rows are dropped: the handler then starts like a new durable handler, with a synthetic add
//! of every stored object, then live events. That redelivers the current state (at least
//! once) instead of resuming from a position that may skip events; what it cannot give back
//! are deletes that happened between the handler's real position and the upgrade.
//!
//! A migration is frozen once released: later schema changes add a new numbered file instead of
//! editing this one.

use redb::{ReadableTable, ReadableTableMetadata};

use crate::store::schema::{CURSORS, CURSORS_V1, SCOPES};

/// Creates `scope_cursors`, moves the old rows into it when one scope owns them, and deletes
/// `cursors`.
pub(crate) fn up(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    let only_scope = {
        let scopes = txn.open_table(SCOPES)?;
        if scopes.len()? == 1 {
            scopes.first()?.map(|(id, _)| id.value())
        } else {
            None
        }
    };
    let old_rows: Vec<(String, u64)> = {
        let old = txn.open_table(CURSORS_V1)?;
        old.iter()?
            .map(|row| row.map(|(name, seq)| (name.value().to_owned(), seq.value())))
            .collect::<Result<_, _>>()?
    };
    {
        let mut cursors = txn.open_table(CURSORS)?;
        for (name, seq) in &old_rows {
            match only_scope {
                Some(scope) => {
                    cursors.insert((scope, name.as_str()), *seq)?;
                }
                None => tracing::warn!(
                    handler = %name,
                    cursor = seq,
                    "schema v4: dropped a durable cursor that no single scope owns; the handler restarts with synthetic adds of the store"
                ),
            }
        }
    }
    txn.delete_table(CURSORS_V1)?;
    Ok(())
}
