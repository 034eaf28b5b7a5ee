//! Schema v5: `scope_shards`, the shard range of each sharded scope (KEP-5866 hash ranges)
//! and the ranges a change of range added but has not fetched yet.
//!
//! Scopes of an older database have no row: they hold every object, as before.
//!
//! A migration is frozen once released: later schema changes add a new numbered file instead of
//! editing this one.

use crate::store::schema::SHARDS;

/// Creates the table.
pub(crate) fn up(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    txn.open_table(SHARDS)?;
    Ok(())
}
