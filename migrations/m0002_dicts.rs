//! Schema v2: the `dicts` table of per-scope zstd dictionaries.
//!
//! Rows of a v1 database need no rewrite: their compression tags (`None`, `Zstd`) keep their
//! encoding, and the dictionary tag is a new variant only v2 rows use.
//!
//! A migration is frozen once released: later schema changes add a new numbered file instead of
//! editing this one.

use crate::store::schema::DICTS;

/// Creates the `dicts` table (opening a table in a write transaction creates it).
pub(crate) fn up(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    txn.open_table(DICTS)?;
    Ok(())
}
