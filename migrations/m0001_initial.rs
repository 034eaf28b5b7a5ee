//! Schema v1: the tables of `src/store/schema.rs` as first released.
//!
//! A migration is frozen once released: later schema changes add a new numbered file instead of
//! editing this one.

use crate::store::schema::{CURSORS_V1 as CURSORS, INDEX, INDEX_REV, LOG, META, OBJECTS, RELIST, SCOPES, SCOPE_NAMES};

/// Creates every v1 table (opening a table in a write transaction creates it).
pub(crate) fn up(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    txn.open_table(META)?;
    txn.open_table(SCOPES)?;
    txn.open_table(SCOPE_NAMES)?;
    txn.open_table(OBJECTS)?;
    txn.open_table(LOG)?;
    txn.open_table(INDEX)?;
    txn.open_table(INDEX_REV)?;
    txn.open_table(RELIST)?;
    txn.open_table(CURSORS)?;
    Ok(())
}
