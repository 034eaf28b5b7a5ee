//! Schema v3: `commit_times` (when log entries were committed, for retention by age) and
//! `index_backfill` (progress of index backfills that run in bounded steps).
//!
//! Log entries of an older database carry no commit time: they are all treated as committed
//! when this migration ran (one row at the first retained seq), so age-based retention counts
//! their age from the upgrade, never removes them earlier than it would have, and keeps the
//! table at one row instead of one per old entry.
//!
//! A migration is frozen once released: later schema changes add a new numbered file instead of
//! editing this one.

use redb::ReadableTable;

use crate::store::schema::{COMMIT_TIMES, INDEX_BACKFILL, LOG};

/// Creates both tables and dates the existing log entries at `now_ms`.
pub(crate) fn up(txn: &redb::WriteTransaction, now_ms: u64) -> Result<(), redb::Error> {
    txn.open_table(INDEX_BACKFILL)?;
    let mut times = txn.open_table(COMMIT_TIMES)?;
    let log = txn.open_table(LOG)?;
    if let Some((first, _)) = log.first()? {
        times.insert(first.value(), now_ms)?;
    }
    Ok(())
}
